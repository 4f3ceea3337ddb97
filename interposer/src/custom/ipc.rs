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
    crate::custom::placed::stop_placing();
    if crate::custom::placed::placed(address) {
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
/// out-pointer, the handle's address, the flags), and the pools' `cudaMemPoolImportPointer`
/// and `cuMemPoolImportPointer` (the out-pointer, the pool, the export data).
///
/// # Safety
/// The caller's arguments, as the call takes them.
pub unsafe fn open_memory_raw(ctx: &Ctx, args: &[u64]) -> u64 {
    let desc = ctx.form(Form::Call);
    // A process that opens may export next (torch's workers send tensors back).
    crate::custom::placed::stop_placing();
    // SAFETY: the caller's arguments.
    let status = unsafe { crate::runtime::call(desc, args) };
    let out = args.first().copied().unwrap_or(0);
    if status != success(desc) || out == 0 {
        return status;
    }
    // SAFETY: the caller's out-pointer, written by the open that succeeded.
    let base = unsafe { std::ptr::read_unaligned(out as *const u64) };
    // A pool's pointer goes with a free, not a close: not counted.
    let counted = !ctx.name.contains("ImportPointer");
    if counted && let Some(count) = lock_opens().get_mut(&base) {
        // Open already: the same memory, recorded (and reserved here) at its first open.
        *count += 1;
        return status;
    }
    // The open answers the base only: the mapping's size is asked once.
    let (mut start, mut len) = (0u64, 0u64);
    let range = [&raw mut start as u64, &raw mut len as u64, base];
    // SAFETY: two locals for the outputs, a device address by value.
    let asked = unsafe { crate::runtime::call(&chidori_cuda::calls::driver::cuMemGetAddressRange_v2__call, &range) };
    if asked == 0 && start == base && len > 0 {
        if counted {
            lock_opens().insert(base, 1);
        }
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
        let mut opens = lock_opens();
        match opens.get_mut(&base) {
            Some(count) if *count > 1 => *count -= 1,
            _ => {
                opens.remove(&base);
                state::remove(base);
            }
        }
    }
    status
}

/// Opens of each base not yet closed: an open of a handle the process holds open already
/// answers the same address, and the memory stays until its last close.
fn lock_opens() -> std::sync::MutexGuard<'static, std::collections::BTreeMap<u64, u32>> {
    static OPENS: std::sync::Mutex<std::collections::BTreeMap<u64, u32>> =
        std::sync::Mutex::new(std::collections::BTreeMap::new());
    OPENS.lock().unwrap_or_else(|p| p.into_inner())
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
        CLIENT.ahead.events.created(event, true);
    }
    status
}

/// `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR` (the runtime's pool handle type has the same
/// number): the one shareable handle that travels.
const POSIX_FD: u64 =
    chidori_cuda::consts::CUmemAllocationHandleType_enum::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR as u64;

/// What a stand-in descriptor holds first: it names a descriptor the server keeps.
const STAND_IN_MAGIC: &[u8; 16] = b"chidori ipc fd\0\0";

/// Refused with the library's NOT_SUPPORTED, its reason said once.
fn not_posix(ctx: &Ctx, kind: u64) -> u64 {
    static SAID: std::sync::Once = std::sync::Once::new();
    SAID.call_once(|| {
        tracing::warn!(
            "{}: shareable handle type {kind}: only POSIX file descriptors are shared between sessions",
            ctx.name
        )
    });
    ctx.codes.not_supported as u64
}

/// A descriptor of this process that stands for the server's: a memory file holding the
/// token the server kept the real one under. The program passes it on as it would the
/// driver's (`SCM_RIGHTS`, inheritance) and closes it when it likes.
fn stand_in(token: u64) -> std::io::Result<i32> {
    // SAFETY: a NUL-terminated name; no flags (the program's own descriptors are inherited
    // across exec too).
    let fd = unsafe { libc::memfd_create(c"chidori-ipc-handle".as_ptr(), 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut bytes = [0u8; 24];
    bytes[..16].copy_from_slice(STAND_IN_MAGIC);
    bytes[16..].copy_from_slice(&token.to_le_bytes());
    // SAFETY: `fd` is the file just made; `bytes` is ours.
    let written = unsafe { libc::pwrite(fd, bytes.as_ptr().cast(), bytes.len(), 0) };
    if written != bytes.len() as isize {
        let error = std::io::Error::last_os_error();
        // SAFETY: the descriptor made above, which nothing else knows.
        unsafe { libc::close(fd) };
        return Err(error);
    }
    Ok(fd)
}

/// The token a stand-in descriptor holds; None for any other descriptor.
fn token_of(fd: i32) -> Option<u64> {
    let mut bytes = [0u8; 24];
    // SAFETY: reads into `bytes`; a descriptor of no file fails without harm.
    let read = unsafe { libc::pread(fd, bytes.as_mut_ptr().cast(), bytes.len(), 0) };
    if read != bytes.len() as isize || &bytes[..16] != STAND_IN_MAGIC {
        return None;
    }
    bytes[16..].first_chunk::<8>().map(|t| u64::from_le_bytes(*t)).filter(|&t| t != 0)
}

/// `cuMemExportToShareableHandle`, `cuMemPoolExportToShareableHandle` and
/// `cudaMemPoolExportToShareableHandle` (`raw_args`: the handle's out-pointer, the
/// allocation or pool, the handle type, the flags). The server keeps the descriptor; the
/// program gets a stand-in ([`stand_in`]).
///
/// # Safety
/// The caller's arguments, as the call takes them.
pub unsafe fn export_fd_raw(ctx: &Ctx, args: &[u64]) -> u64 {
    let desc = ctx.form(Form::Call);
    let kind = args.get(2).copied().unwrap_or(0);
    if kind != POSIX_FD {
        return not_posix(ctx, kind);
    }
    let out = args.first().copied().unwrap_or(0);
    if out == 0 {
        return ctx.codes.invalid_value as u64;
    }
    let mut token = 0u64;
    let mut sent = args.to_vec();
    sent[0] = &raw mut token as u64;
    // SAFETY: the caller's arguments, the output an 8-byte local.
    let status = unsafe { crate::runtime::call(desc, &sent) };
    if status != success(desc) {
        return status;
    }
    if token == 0 {
        tracing::warn!("{}: the server could not keep the descriptor (its log says why)", ctx.name);
        return ctx.codes.invalid_value as u64;
    }
    let fd = match stand_in(token) {
        Ok(fd) => fd,
        Err(e) => {
            tracing::warn!("{}: no descriptor for the program: {e}", ctx.name);
            return ctx.codes.invalid_value as u64;
        }
    };
    // SAFETY: the caller's int*, non-null.
    unsafe { std::ptr::write_unaligned(out as *mut i32, fd) };
    status
}

/// `cuMemImportFromShareableHandle`, `cuMemPoolImportFromShareableHandle` and
/// `cudaMemPoolImportFromShareableHandle` (`raw_args`: the out-pointer, the descriptor as a
/// pointer-sized value, the handle type, the flags where the call takes them): a stand-in
/// descriptor's token goes to the server, which fetches the descriptor it names.
///
/// # Safety
/// The caller's arguments, as the call takes them.
pub unsafe fn import_fd_raw(ctx: &Ctx, args: &[u64]) -> u64 {
    let desc = ctx.form(Form::Call);
    let kind = args.get(2).copied().unwrap_or(0);
    if kind != POSIX_FD {
        return not_posix(ctx, kind);
    }
    let fd = args.get(1).copied().unwrap_or(0) as i32;
    let Some(token) = token_of(fd) else {
        tracing::warn!("{}: descriptor {fd} is not one a process of this program exported through Chidori", ctx.name);
        return ctx.codes.invalid_value as u64;
    };
    let mut sent = args.to_vec();
    sent[1] = token;
    // SAFETY: the caller's arguments, the descriptor replaced by a value.
    unsafe { crate::runtime::call(desc, &sent) }
}
