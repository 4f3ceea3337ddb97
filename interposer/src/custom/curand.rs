//! cuRAND host generators (`curandCreateGeneratorHost`): the generator lives in the worker,
//! whose CPU generates, and each generate call brings its output back as the reply into the
//! program's memory (the `d2h` wire form: an output buffer of the call's count). The client
//! records which generators are host ones; a device generator's generate call writes device
//! memory and is sent without waiting (the `call` form).
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
