//! Memory operations shared by the runtime and driver APIs: pinned host allocations,
//! copies in chunks, pointer classification.

use std::ffi::c_void;

use chidori_protocol::desc::CallDesc;

use crate::conn::Conn;
use crate::runtime;
use crate::state::{self, Memory};

/// Bytes per call of a large copy (several such calls are in flight at once).
pub const CHUNK: u64 = 8 << 20;

/// Allocate pinned host memory on the client (page-aligned, recorded as pinned).
pub fn host_alloc(size: usize, flags: u32) -> Option<*mut c_void> {
    if size == 0 {
        return Some(std::ptr::null_mut());
    }
    // SAFETY: an anonymous private mapping; no existing memory is touched.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            size,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return None;
    }
    state::add(p as u64, size as u64, Memory::Pinned { flags });
    Some(p)
}

/// Free memory from [`host_alloc`]. False if `p` is not such memory (then nothing is
/// touched: `p` is only looked up in the interval map).
pub fn host_free(p: *mut c_void) -> bool {
    if p.is_null() {
        return true;
    }
    match state::find(p as u64) {
        Some(r) if r.base == p as u64 && matches!(r.memory, Memory::Pinned { .. }) => {
            state::remove(r.base);
            // SAFETY: the mapping created by host_alloc with this base and length.
            unsafe { libc::munmap(r.base as *mut c_void, r.len as usize) };
            true
        }
        _ => false,
    }
}

/// The three wire forms of a copy function.
pub struct CopyForms {
    pub h2d: &'static CallDesc,
    pub d2h: &'static CallDesc,
    pub d2d: &'static CallDesc,
}

/// Where a copy goes, given a cudaMemcpyKind (4 = Default: decided by the interval map).
pub fn direction(kind: u32, dst: u64, src: u64) -> Option<(bool, bool)> {
    Some(match kind {
        0 => (false, false),
        1 => (true, false),
        2 => (false, true),
        3 => (true, true),
        4 => (state::is_device(dst), state::is_device(src)),
        _ => return None,
    })
}

/// Copy `count` bytes. `tail` holds the arguments after (dst, src, count, kind), e.g. the
/// stream. `asynchronous`: cudaMemcpyAsync semantics (a device-to-host copy into pinned
/// memory returns before the bytes land; synchronizing calls wait for them).
///
/// # Safety
/// Host pointers must be valid for `count` bytes, as for cudaMemcpy.
#[allow(clippy::too_many_arguments)]
pub unsafe fn copy(
    conn: &Conn,
    forms: &CopyForms,
    dst: u64,
    src: u64,
    count: u64,
    (dst_dev, src_dev): (bool, bool),
    tail: &[u64],
    asynchronous: bool,
) -> u64 {
    if count == 0 {
        return 0;
    }
    let args = |d: u64, s: u64, n: u64, kind: u64| -> Vec<u64> {
        let mut a = vec![d, s, n, kind];
        a.extend_from_slice(tail);
        a
    };
    let chunks = |kind: u64| -> Vec<Vec<u64>> {
        (0..count).step_by(CHUNK as usize).map(|off| args(dst + off, src + off, CHUNK.min(count - off), kind)).collect()
    };
    match (dst_dev, src_dev) {
        (false, false) => {
            if asynchronous {
                // Stream order: earlier work on the stream may still write the source.
                state::wait_deferred();
            }
            // SAFETY: both are host buffers of `count` bytes per the contract.
            unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, count as usize) };
            0
        }
        // SAFETY (three arms): the forms describe exactly these buffers.
        (true, false) => {
            // The GPU reads the source when the stream reaches the copy: after every host
            // callback enqueued before it, which may write the source.
            conn.wait_callbacks(tail.first().copied().unwrap_or(0));
            unsafe { runtime::call_pipelined(conn, forms.h2d, &chunks(1)) }
        }
        (false, true) => {
            if asynchronous && state::is_pinned(dst) {
                for a in chunks(2) {
                    // SAFETY: pinned destination stays valid until the program synchronizes.
                    if unsafe { runtime::send_deferred(conn, forms.d2h, &a) }.is_none() {
                        return runtime::unavailable(forms.d2h);
                    }
                }
                0
            } else {
                unsafe { runtime::call_pipelined(conn, forms.d2h, &chunks(2)) }
            }
        }
        (true, true) => unsafe { runtime::call_on(conn, forms.d2d, &args(dst, src, count, 3)) },
    }
}
