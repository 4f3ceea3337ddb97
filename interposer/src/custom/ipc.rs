//! CUDA IPC: device memory and events that a process of the program's machine shares with
//! another (`cudaIpcGetMemHandle` in one, `cudaIpcOpenMemHandle` in the other; torch's
//! `multiprocessing` passes CUDA tensors so). The handles are the server's: the exporting
//! session's worker makes one, the program carries it to its other process however it likes
//! (shared memory, a pipe), and that process's worker opens it (`worker/src/ipc.rs`). What
//! the client adds: memory opened enters its interval map, so copies and pointer queries see
//! device memory there; and an event another process may record is never taken for complete
//! without asking (`crate::ahead::events`).
#![allow(clippy::missing_safety_doc)]

use chidori_protocol::desc::{Ctx, Form};

use crate::runtime::success;
use crate::state::{self, CLIENT, Memory};

/// `cudaIpcGetMemHandle` and `cuIpcGetMemHandle` (`raw_args`: the handle's out-pointer, the
/// device address). Memory the client placed (`custom::placed`, on a WAN) is virtual memory
/// on the server, which legacy IPC cannot name: refused with the way out; the program's
/// later allocations are not placed.
///
/// # Safety
/// The caller's arguments, as the call takes them.
pub unsafe fn get_memory_handle_raw(ctx: &Ctx, args: &[u64]) -> u64 {
    let desc = ctx.form(Form::Call);
    let address = args.get(1).copied().unwrap_or(0);
    if crate::custom::placed::sharing(address) {
        static SAID: std::sync::Once = std::sync::Once::new();
        SAID.call_once(|| {
            tracing::warn!(
                "{}: {address:#x} was allocated ahead on the server (a WAN session), which CUDA IPC cannot share; \
                 run the program with {}=0",
                ctx.name,
                chidori_protocol::env::WINDOW_ALLOC
            )
        });
        return desc.codes.invalid_value as u64;
    }
    // SAFETY: the caller's arguments.
    unsafe { crate::runtime::call(desc, args) }
}

/// `cudaIpcOpenMemHandle`, `cuIpcOpenMemHandle` and `cuIpcOpenMemHandle_v2` (`raw_args`: the
/// out-pointer, the handle's address, the flags).
///
/// # Safety
/// The caller's arguments, as the call takes them.
pub unsafe fn open_memory_raw(ctx: &Ctx, args: &[u64]) -> u64 {
    let desc = ctx.form(Form::Call);
    // A process that opens may export next (torch's workers send tensors back).
    crate::custom::placed::sharing(0);
    // SAFETY: the caller's arguments.
    let status = unsafe { crate::runtime::call(desc, args) };
    let out = args.first().copied().unwrap_or(0);
    if status != success(desc) || out == 0 {
        return status;
    }
    // SAFETY: the caller's out-pointer, written by the open that succeeded.
    let base = unsafe { std::ptr::read_unaligned(out as *const u64) };
    // The open answers the base only: the mapping's size is asked once.
    let (mut start, mut len) = (0u64, 0u64);
    let range = [&raw mut start as u64, &raw mut len as u64, base];
    // SAFETY: two locals for the outputs, a device address by value.
    let asked = unsafe { crate::runtime::call(&chidori_cuda::calls::driver::cuMemGetAddressRange_v2__call, &range) };
    if asked == 0 && start == base && len > 0 {
        state::add(base, len, Memory::Device { device: state::current_device() });
    } else {
        tracing::warn!("{}: the size of the memory opened at {base:#x} is unknown (status {asked})", ctx.name);
    }
    status
}

/// `cudaIpcCloseMemHandle` and `cuIpcCloseMemHandle` (`raw_args`: the opened base).
///
/// # Safety
/// The caller's arguments, as the call takes them.
pub unsafe fn close_memory_raw(ctx: &Ctx, args: &[u64]) -> u64 {
    let desc = ctx.form(Form::Call);
    // SAFETY: a device address by value.
    let status = unsafe { crate::runtime::call(desc, args) };
    if status == success(desc)
        && let Some(&base) = args.first()
    {
        state::remove(base);
    }
    status
}

/// `cudaIpcOpenEventHandle` and `cuIpcOpenEventHandle` (`raw_args`: the out-pointer, the
/// handle's address).
///
/// # Safety
/// The caller's arguments, as the call takes them.
pub unsafe fn open_event_raw(ctx: &Ctx, args: &[u64]) -> u64 {
    let desc = ctx.form(Form::Call);
    // SAFETY: the caller's arguments.
    let status = unsafe { crate::runtime::call(desc, args) };
    let out = args.first().copied().unwrap_or(0);
    if status == success(desc) && out != 0 {
        // SAFETY: the caller's out-pointer, written by the open that succeeded.
        let event = unsafe { std::ptr::read_unaligned(out as *const u64) };
        CLIENT.ahead.events.created(event);
        CLIENT.ahead.events.shared(event);
    }
    status
}
