//! `cudaMalloc` answered without a round trip: the client places a device allocation in a
//! window of address space the server reserved for the session (`crate::ahead::windows`)
//! and tells the server to back it, in order with the program's calls
//! (`Service::WindowMap`). What the program holds is ordinary device memory of its device;
//! the server makes it with the driver's virtual memory management instead of cudaMalloc.
//!
//! Where: a session whose round trip is a WAN's ([`chidori_protocol::env::WINDOW_ALLOC`]),
//! on a server with one GPU (memory so made is accessible from its own device only), for
//! whole granules (every block torch's allocator asks for) and from 4 MiB on rounded up to
//! them, while no stream captures in a mode that makes allocating illegal. Everything else
//! waits for the GPU's answer as before.

use std::ffi::c_void;
use std::sync::{Mutex, OnceLock};

use chidori_protocol::messages::{Service, ServiceReply};

use crate::ahead::windows::{Owned, ROUNDED_MIN, Windows};
use crate::conn::{Asked, Conn};
use crate::state::{self, Memory};

const SUCCESS: u32 = chidori_cuda::consts::cudaError::cudaSuccess;
/// cudaErrorInvalidValue and CUDA_ERROR_INVALID_VALUE are the same number.
const INVALID_VALUE: u32 = chidori_cuda::consts::cudaError::cudaErrorInvalidValue;
const _: () = assert!(INVALID_VALUE == chidori_cuda::consts::cudaError_enum::CUDA_ERROR_INVALID_VALUE);
/// The granule every server GPU's driver asks of such memory (the window says its own; an
/// allocation of another size below [`ROUNDED_MIN`] waits without asking for a window).
const GRANULE: u64 = 2 << 20;

fn windows() -> &'static Windows {
    &state::CLIENT.ahead.windows
}

/// Whether this process places allocations: decided once, at its first allocation that
/// could be placed.
fn on(conn: &Conn) -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| {
        let wanted = match std::env::var(chidori_protocol::env::WINDOW_ALLOC).as_deref() {
            Ok("1") => true,
            Ok("0") => false,
            _ => conn.is_wan_waiting(std::time::Duration::from_secs(1)),
        };
        wanted && conn.welcome.devices.len() == 1
    })
}

/// The program shares device memory with its other processes (CUDA IPC): legacy IPC
/// handles name `cudaMalloc`'s memory only, not the virtual memory a placement maps, so its
/// later allocations wait for the server's.
static SHARING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The program exported or opened a CUDA IPC handle: place nothing from now on.
pub fn stop_placing() {
    SHARING.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// Whether `address` lies in memory placed before (which no IPC handle can name).
pub fn placed(address: u64) -> bool {
    windows().owner(address).is_some()
}

/// Device 0's window asked as the connection was made, with the fork count then.
static EARLY: Mutex<Option<(u64, Asked)>> = Mutex::new(None);

/// Where this process may place allocations (a server with one GPU, placement not turned
/// off), ask for device 0's allocation window as the connection is made, without waiting
/// (`super::connected`). Whether the round trip is a WAN's is not known yet (its probe is
/// on the way), but the program's first allocation comes after it is, and then finds the
/// answer come, or on its way, instead of asking.
pub(super) fn ask_early(conn: &Conn) {
    if std::env::var(chidori_protocol::env::WINDOW_ALLOC).as_deref() == Ok("0") || conn.welcome.devices.len() != 1 {
        return;
    }
    if let Ok(asked) = conn.ask_ahead(&Service::MemoryWindow { device: 0 }) {
        *EARLY.lock().unwrap_or_else(|p| p.into_inner()) = Some((crate::conn::forks(), asked));
    }
}

/// The window of `device`: the answer asked as the session started where there is one,
/// else asked now. The trace counts a round trip where the allocation waited for it.
fn ask_window(conn: &Conn, device: i32) -> Result<ServiceReply, String> {
    let start = std::time::Instant::now();
    let early = match EARLY.lock().unwrap_or_else(|p| p.into_inner()).take() {
        Some((forks, asked)) if device == 0 && forks == crate::conn::forks() => Some(asked),
        _ => None,
    };
    let (reply, waited) = match early {
        Some(asked) => {
            let came = asked.came();
            (asked.answer(), !came)
        }
        None => (conn.service(&Service::MemoryWindow { device }, &[]), true),
    };
    crate::trace::bytes("(allocation window)", u64::from(waited), 0, 0, start.elapsed());
    reply
}

/// cudaMalloc of `size` bytes into `dev_ptr`, placed by the client: Some(status) where it
/// was (or where `dev_ptr` is NULL), None where the allocation must go to the server.
pub fn malloc(conn: &Conn, dev_ptr: *mut c_void, size: u64) -> Option<u32> {
    let sharing = SHARING.load(std::sync::atomic::Ordering::Relaxed);
    if sharing || size == 0 || !(size.is_multiple_of(GRANULE) || size >= ROUNDED_MIN) || !on(conn) {
        return None;
    }
    if super::capture::any_active() && !super::capture::thread_relaxed() {
        return None;
    }
    if dev_ptr.is_null() {
        return Some(INVALID_VALUE);
    }
    let device = state::current_device();
    if !windows().asked(device) {
        match ask_window(conn, device) {
            Ok(ServiceReply::Window { base, size, granularity, free }) => {
                tracing::debug!(
                    "device {device}: allocations placed by the client in {size} bytes at {base:#x} ({free} bytes free)"
                );
                windows().opened(device, base, size, granularity, free)
            }
            Ok(ServiceReply::Error { message, .. }) => {
                tracing::info!("device {device}'s allocations wait for the server: {message}");
                windows().refused(device);
            }
            // A broken connection: the allocation's own call says so.
            _ => return None,
        }
    }
    let (address, part) = windows().place(device, size)?;
    if conn.post_service(&Service::WindowMap { device, address, size: part }, &[]).is_err() {
        windows().release(address);
        return None;
    }
    // SAFETY: the caller's void*, checked non-null.
    unsafe { std::ptr::write_unaligned(dev_ptr as *mut u64, address) };
    // The program's allocation is what it asked for (pointer attributes, address ranges).
    state::add(address, size, Memory::Device { device });
    Some(SUCCESS)
}

/// A free of `address` (cudaFree, cudaFreeAsync, cuMemFree): Some(status) where the
/// address lies in an allocation the client placed, None otherwise. The server frees it as
/// cudaFree does (after the work queued before), which the program waits for, unless there
/// is nothing to wait for ([`free_on_idle`]).
pub fn free(conn: &Conn, address: u64) -> Option<u32> {
    match windows().owner(address)? {
        Owned::Inside => Some(INVALID_VALUE),
        Owned::Base if free_on_idle(conn, address) => {
            windows().release(address);
            state::remove(address);
            Some(SUCCESS)
        }
        Owned::Base => match traced_unmap(conn, address) {
            Ok(ServiceReply::Value(_)) => {
                windows().release(address);
                state::remove(address);
                Some(SUCCESS)
            }
            Ok(ServiceReply::Error { status, .. }) => Some(u32::try_from(status).unwrap_or(INVALID_VALUE)),
            // The connection's failure: the free's own path reports it.
            _ => None,
        },
    }
}

/// Free the placed allocation at `address` without waiting where the current device is
/// known idle with nothing sent since (`crate::ahead::idle`): cudaFree's wait for the work
/// queued before it would find none, and an unmap of memory the session placed cannot
/// fail otherwise. torch synchronizes the device, then empties its cache (a free per
/// cached block) as each CUDA graph capture starts. The unmap queues no work on the
/// device, so it stays known idle. Whether it was sent.
fn free_on_idle(conn: &Conn, address: u64) -> bool {
    use crate::ahead::idle::{Answer, Scope};
    let scope = Scope::Device(state::current_device(), super::context::cached_current());
    let before = conn.sent_so_far();
    if !super::sync::trusted() || state::CLIENT.ahead.idle.answer(scope, before) != Some(Answer::Idle) {
        return false;
    }
    if conn.post_service(&Service::WindowFree { address }, &[]).is_err() {
        return false;
    }
    state::CLIENT.ahead.idle.forwarded(scope, before, conn.sent_so_far());
    crate::trace::bytes("(placed free)", 0, 0, 0, std::time::Duration::ZERO);
    true
}

/// The server's free of a placed allocation, a round trip of its own in the trace.
fn traced_unmap(conn: &Conn, address: u64) -> Result<ServiceReply, String> {
    let start = std::time::Instant::now();
    let reply = conn.service(&Service::WindowUnmap { address }, &[]);
    crate::trace::bytes("(placed free)", 1, 0, 0, start.elapsed());
    reply
}

/// `device`'s primary context was reset (the call succeeded), which frees what the program
/// allocated on it: the server frees the allocations placed there too, in order with what
/// follows.
pub fn device_reset(device: i32) {
    let bases = windows().reset(device);
    if bases.is_empty() {
        return;
    }
    for base in bases {
        state::remove(base);
    }
    if let Ok(conn) = crate::conn::get() {
        // A broken connection ends the session anyway.
        let _ = conn.post_service(&Service::WindowReset { device }, &[]);
    }
}

/// The server made an allocation for the program (one that waited): it counts against
/// what may be placed, until freed ([`forgotten`]).
pub fn noted(base: u64, size: u64) {
    windows().noted(state::current_device(), base, size);
}

/// The server freed an allocation it made for the program.
pub fn forgotten(base: u64) {
    windows().forgotten(base);
}
