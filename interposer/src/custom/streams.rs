//! Streams and events named by the client. torch fills its stream pools lazily, the first
//! time a program asks for a side stream: 32 `cudaStreamCreateWithPriority` per priority
//! level, 128 round trips in a row, 9 s at 70 ms; and it makes one event per Python event
//! object. A create whose flags are valid names the new handle itself (a tagged counter,
//! `runtime::next_handle_name`) and goes without waiting: the worker maps the name to the
//! stream or event it made, and a create that fails there (out of resources) surfaces at
//! the next call that waits, as a launch's error does. Creates with flags CUDA refuses,
//! interprocess events, the driver's creates on a thread without a current context, and
//! creates while a capture is active (whose status the program may steer by) wait for the
//! server's answer. Frames run in the order the client sent them, across its threads, so a
//! stream named on one thread is there for a launch of another.
//!
//! cuFFT's plans, which are `int`s too narrow for a name, are still made ahead in batches
//! ([`create_ahead`]): from the second create in a row a few more in the same round trip.
#![allow(non_snake_case, clippy::missing_safety_doc)]

use std::hash::Hash;

use chidori_protocol::desc::{CallDesc, Ctx, Form};

use crate::ahead::Pool;
use crate::state::CLIENT;

/// A context was reset or destroyed: its cuFFT plans made ahead are gone (and its events,
/// which the client follows no further).
pub fn forget() {
    CLIENT.ahead.cufft_pool.clear();
    CLIENT.ahead.events.context_ended();
}

/// Stream creation flags CUDA takes: default and non-blocking (the runtime's and the
/// driver's values are the same).
const STREAM_FLAGS: u32 = chidori_cuda::consts::CUstream_flags_enum::CU_STREAM_NON_BLOCKING;

/// Event creation flags a named create takes: blocking synchronization and no timing
/// (interprocess events wait: another process may hold one).
const EVENT_FLAGS: u32 = chidori_cuda::consts::CUevent_flags_enum::CU_EVENT_BLOCKING_SYNC
    | chidori_cuda::consts::CUevent_flags_enum::CU_EVENT_DISABLE_TIMING;

/// Send a create (`args`: its out-pointer first, then its flags where it takes them) named
/// by the client without waiting where `named` allows, else waiting for the server's handle.
///
/// # Safety
/// `args` are the caller's, as the function of `ctx` takes them.
unsafe fn create_named(ctx: &Ctx, args: &[u64], named: bool) -> u64 {
    let out = args.first().copied().unwrap_or(0);
    // The driver's creates need a current context (the runtime makes its primary one): asked
    // once per change of context (then cached); without one the server refuses the create.
    let context = ctx.library != "driver" || crate::custom::context::current().is_some();
    let form =
        if named && context && out != 0 && !crate::custom::capture::any_active() { Form::Async } else { Form::Call };
    // SAFETY: the caller's arguments; a named create's out-pointer (non-null) gets the name
    // before the call is sent.
    unsafe { crate::runtime::call(ctx.form(form), args) }
}

/// cudaStreamCreate, cudaStreamCreateWithFlags, cudaStreamCreateWithPriority, cuStreamCreate
/// and cuStreamCreateWithPriority (`raw_args`: the out-pointer, then the flags and priority
/// where the call takes them).
///
/// # Safety
/// The caller's arguments, as the call takes them.
pub unsafe fn stream_create_raw(ctx: &Ctx, args: &[u64]) -> u64 {
    let flags = args.get(1).copied().unwrap_or(0);
    // SAFETY: the caller's arguments.
    unsafe { create_named(ctx, args, flags & !u64::from(STREAM_FLAGS) == 0) }
}

/// cudaEventCreate, cudaEventCreateWithFlags and cuEventCreate (`raw_args`: the out-pointer,
/// then the flags where the call takes them).
///
/// # Safety
/// The caller's out-pointer, as the call takes it.
pub unsafe fn event_create_raw(ctx: &Ctx, args: &[u64]) -> u64 {
    let flags = args.get(1).copied().unwrap_or(0);
    let out = args.first().copied().unwrap_or(0);
    // SAFETY: the caller's arguments.
    let status = unsafe { create_named(ctx, args, flags & !u64::from(EVENT_FLAGS) == 0) };
    let desc = ctx.form(Form::Call);
    if status == crate::runtime::success(desc) && out != 0 {
        // SAFETY: the caller's out-pointer, written by the create that succeeded.
        CLIENT.ahead.events.created(unsafe { std::ptr::read_unaligned(out as *const u64) });
    }
    status
}

/// Create an object through `desc` with `args` (its out-pointer first, the rest the same
/// for every object of its kind): from `pool` where it holds one made ahead for the
/// current context (`key` of the context), else asked, and from the second miss of `miss`
/// in a row with a few more made in the same round trip (2, 4, then 8 at most) for the
/// next creates of that kind. Nothing is made ahead while a capture is active or where the
/// context is not known. The object is a handle of `bytes` bytes (8: a pointer; 4: an int,
/// cuFFT's plans). Objects made ahead and never asked for stay on the server until the
/// session ends (at most 7 per kind); a context reset or destroy drops them ([`forget`]).
///
/// # Safety
/// `args` are the caller's, as `desc` takes them.
pub(crate) unsafe fn create_ahead<K: Eq + Hash + Clone, M: Eq + Hash>(
    desc: &'static CallDesc,
    args: &[u64],
    pool: &Pool<K, M>,
    key: impl Fn(u64) -> K,
    miss: M,
    bytes: usize,
) -> u32 {
    let unavailable = crate::runtime::unavailable(desc) as u32;
    crate::guard::ffi(desc.name, unavailable, || {
        let out = args.first().copied().unwrap_or(0);
        if out == 0 || crate::custom::capture::any_active() {
            // SAFETY: the caller's arguments (a null out-pointer is the server's to refuse).
            return unsafe { crate::runtime::call(desc, args) } as u32;
        }
        let context = crate::custom::context::cached_current();
        if let Some(ctx) = context
            && let Some(made) = pool.take(&key(ctx))
        {
            crate::trace::local(desc.name);
            // SAFETY: the caller's out-pointer, checked non-null, of a handle of `bytes` bytes.
            unsafe {
                match bytes {
                    4 => std::ptr::write_unaligned(out as *mut u32, made as u32),
                    _ => std::ptr::write_unaligned(out as *mut u64, made),
                }
            }
            return desc.codes.success as u32;
        }
        let wanted = pool.missed(miss);
        // Ahead only where the context is known: the objects go to creates in the same one.
        let n = match context.or_else(|| (wanted > 1).then(crate::custom::context::current).flatten()) {
            Some(_) => wanted,
            None => 1,
        };
        if n == 1 {
            // SAFETY: as above.
            return unsafe { crate::runtime::call(desc, args) } as u32;
        }
        let Ok(conn) = crate::conn::get() else { return unavailable };
        let mut extra = vec![0u64; n - 1];
        let mut lists = vec![args.to_vec()];
        lists.extend(extra.iter_mut().map(|slot| {
            let mut a = args.to_vec();
            a[0] = slot as *mut u64 as u64;
            a
        }));
        let calls: Vec<_> = lists.iter().map(|a| (desc, &a[..])).collect();
        // SAFETY: each call's out-pointer is the caller's or a slot of `extra`, alive until
        // every reply has landed.
        let Some((status, statuses)) = (unsafe { crate::runtime::call_with_riders(&conn, &calls, desc.name) }) else {
            return unavailable;
        };
        crate::runtime::note_status(desc, status);
        if status == crate::runtime::success(desc)
            && let Some(ctx) = crate::custom::context::cached_current()
        {
            let made = statuses[1..].iter().zip(&extra).filter(|(s, h)| **s == 0 && **h != 0).map(|(_, h)| *h);
            pool.add(key(ctx), made);
        }
        status as u32
    })
}
