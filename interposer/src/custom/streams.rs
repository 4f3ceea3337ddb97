//! Streams and events named by the client. torch fills its stream pools lazily, the first
//! time a program asks for a side stream: 32 `cudaStreamCreateWithPriority` per priority
//! level, 128 round trips in a row, 9 s at 70 ms; and it makes one event per Python event
//! object. A create whose flags are valid names the new handle itself (a tagged counter,
//! `state::next_handle_name`) and goes without waiting: the worker maps the name to the
//! stream or event it made, and a create that fails there (out of resources) surfaces at
//! the next call that waits, as a launch's error does. Creates with flags CUDA refuses,
//! interprocess events, the driver's creates on a thread without a current context, and
//! creates while a capture is active (whose status the program may steer by) wait for the
//! server's answer. Frames run in the order the client sent them, across its threads, so a
//! stream named on one thread is there for a launch of another.
//!
//! cuFFT's plans, which are `int`s too narrow for a name, are made ahead in batches instead
//! (`crate::custom::cufft`).
#![allow(non_snake_case, clippy::missing_safety_doc)]

use chidori_protocol::desc::{Ctx, Form};

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
        let event = unsafe { std::ptr::read_unaligned(out as *const u64) };
        let interprocess = u64::from(chidori_cuda::consts::CUevent_flags_enum::CU_EVENT_INTERPROCESS);
        CLIENT.ahead.events.created(event, flags & interprocess != 0);
    }
    status
}
