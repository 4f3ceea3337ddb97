//! cuRAND host generators (`curandCreateGeneratorHost`): the generator lives in the worker,
//! whose CPU generates, and each generate call brings its output back as the reply into the
//! program's memory (the `d2h` wire form: an output buffer of the call's count). The client
//! records which generators are host ones; a device generator's generate call writes device
//! memory and is sent without waiting (the `call` form).
//!
//! The Sobol' tables the library hands back by pointer (direction vectors, scramble
//! constants) come as their bytes (the worker reads the table behind the library's pointer);
//! the client keeps one copy of each for the life of the process, as the library keeps its
//! own, and the program gets a pointer to it.
//!
//! Every `unsafe fn` here has the safety contract of the cuRAND function it implements.
#![allow(clippy::missing_safety_doc)]

use std::ffi::c_void;

use chidori_cuda::desc::{Ctx, Form};

use crate::state::CLIENT;

fn status(ctx: &Ctx, body: impl FnOnce() -> u32) -> u32 {
    crate::guard::ffi(ctx.name, ctx.codes.invalid_value as u32, body)
}

pub unsafe fn create_host(ctx: &Ctx, generator: *mut c_void, rng_type: u32) -> u32 {
    status(ctx, || {
        // SAFETY: the caller's out-pointer, written by the reply.
        let s = unsafe { crate::runtime::call(ctx.form(Form::Call), &[generator as u64, u64::from(rng_type)]) } as u32;
        if s == 0 && !generator.is_null() {
            // SAFETY: just written by the reply.
            let g = unsafe { std::ptr::read_unaligned(generator as *const u64) };
            CLIENT.host_generators.insert(g, ());
        }
        s
    })
}

pub unsafe fn destroy(ctx: &Ctx, generator: *mut c_void) -> u32 {
    status(ctx, || {
        // SAFETY: a handle by value.
        let s = unsafe { crate::runtime::call(ctx.form(Form::Call), &[generator as u64]) } as u32;
        if s == 0 {
            CLIENT.host_generators.remove(&(generator as u64));
        }
        s
    })
}

/// Every generate call (`raw_args`: the generator first, the output pointer second, as the
/// forwarding packs them): into the program's memory for a host generator, else into device
/// memory without waiting.
pub unsafe fn generate(ctx: &Ctx, args: &[u64]) -> u64 {
    crate::guard::ffi(ctx.name, ctx.codes.invalid_value as u64, || {
        let host = args.first().is_some_and(|g| CLIENT.host_generators.contains(g));
        let desc = ctx.form(if host { Form::D2h } else { Form::Call });
        // SAFETY: the output is the caller's buffer of the call's count (host generator) or a
        // device address (device generator), as the form says.
        unsafe { crate::runtime::call(desc, args) }
    })
}

/// curandGetDirectionVectors32/64 (`vectors`, `set`) and curandGetScrambleConstants32/64
/// (`constants`) (`raw_args`): the table's bytes from the server, once, then a pointer to the
/// client's copy.
pub unsafe fn table(ctx: &Ctx, args: &[u64]) -> u64 {
    crate::guard::ffi(ctx.name, ctx.codes.invalid_value as u64, || {
        let out = args.first().copied().unwrap_or(0) as *mut *const u8;
        if out.is_null() {
            return ctx.codes.invalid_value as u64;
        }
        let key = (ctx.name, args.get(1).copied().unwrap_or(0));
        let table = match CLIENT.curand_tables.get(&key) {
            Some(t) => t,
            None => {
                let desc = ctx.form(Form::Table);
                // The output's length, in the pointers the spec counts it in.
                let Some(len) = desc.params.first().and_then(|w| match w {
                    chidori_protocol::desc::Wire::Buf { len: Some(len), elem, .. } => {
                        len.eval(args).map(|n| n * u64::from(*elem))
                    }
                    _ => None,
                }) else {
                    return ctx.codes.not_supported as u64;
                };
                let mut bytes = vec![0u8; len as usize];
                let mut call_args = args.to_vec();
                call_args[0] = bytes.as_mut_ptr() as u64;
                // SAFETY: `bytes` holds the output's length; the set is a value.
                let status = unsafe { crate::runtime::call(desc, &call_args) };
                if status != ctx.codes.success as u64 {
                    return status;
                }
                let leaked: &'static [u8] = Box::leak(bytes.into_boxed_slice());
                CLIENT.curand_tables.insert(key, leaked);
                leaked
            }
        };
        // SAFETY: the caller's pointer to a table pointer, checked non-null.
        unsafe { std::ptr::write_unaligned(out, table.as_ptr()) };
        ctx.codes.success as u64
    })
}
