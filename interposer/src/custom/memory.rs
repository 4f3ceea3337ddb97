//! Memory operations shared by the runtime and driver APIs: pinned host allocations,
//! copies in chunks, pointer classification.

use std::ffi::c_void;

use chidori_protocol::desc::CallDesc;

use crate::conn::Conn;
use crate::runtime;
use crate::state::{self, Memory};

/// Bytes per call of a large copy (several such calls are in flight at once).
pub const CHUNK: u64 = 8 << 20;

/// The per-attribute calls of `cudaMemRangeGetAttributes` / `cuMemRangeGetAttributes`, sent
/// in one round trip: (data[i], dataSizes[i], attributes[i], devPtr, count) each. None where
/// an array is NULL or there are no attributes (both APIs' invalid value).
///
/// # Safety
/// `data`, `data_sizes` and `attributes` are NULL or hold `count` elements each (the API
/// contract).
pub unsafe fn range_attribute_calls(
    data: *mut c_void,
    data_sizes: *mut c_void,
    attributes: *mut c_void,
    count: usize,
    dev_ptr: u64,
    len: usize,
) -> Option<Vec<Vec<u64>>> {
    if data.is_null() || data_sizes.is_null() || attributes.is_null() || count == 0 {
        return None;
    }
    let calls = (0..count)
        .map(|i| {
            // SAFETY: `i < count`, per the contract.
            unsafe {
                vec![
                    *(data as *const u64).add(i),
                    *(data_sizes as *const u64).add(i),
                    u64::from(*(attributes as *const u32).add(i)),
                    dev_ptr,
                    len as u64,
                ]
            }
        })
        .collect();
    Some(calls)
}

/// Allocate pinned host memory on the client (page-aligned, recorded as pinned), in the
/// arena both sides reserve, so the server can mirror it at the same address if the GPU is
/// ever handed a pointer into it.
pub fn host_alloc(size: usize, flags: u32) -> Option<*mut c_void> {
    client_alloc(size, Memory::Pinned { flags })
}

/// Allocate managed memory (cudaMallocManaged): client memory like pinned memory, in the
/// arena, which the server mirrors at the same address for the GPU.
pub fn managed_alloc(size: usize) -> Option<*mut c_void> {
    client_alloc(size, Memory::Managed)
}

fn client_alloc(size: usize, memory: Memory) -> Option<*mut c_void> {
    if size == 0 {
        return Some(std::ptr::null_mut());
    }
    let p = match arena::alloc(size as u64) {
        Some(p) => p as *mut c_void,
        None => {
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
            crate::mirror::note_outside_arena();
            p
        }
    };
    state::add(p as u64, size as u64, memory);
    Some(p)
}

/// Free memory from [`host_alloc`]. False if `p` is not such memory (then nothing is
/// touched: `p` is only looked up in the interval map).
pub fn host_free(p: *mut c_void) -> bool {
    client_free(p, |m| matches!(m, Memory::Pinned { .. }))
}

/// Free managed memory from [`managed_alloc`] (cudaFree, cuMemFree): after the device
/// has finished the work queued before (as cudaFree waits natively), so no kernel still
/// reads the server's mirror when it goes. `wait` is the API's device synchronize
/// (cudaDeviceSynchronize, cuCtxSynchronize): its status is the answer.
pub fn managed_free(conn: &Conn, wait: &'static CallDesc, p: u64) -> u32 {
    // SAFETY: a synchronize takes no arguments.
    let s = unsafe { runtime::call_on(conn, wait, &[]) } as u32;
    client_free(p as *mut c_void, |m| matches!(m, Memory::Managed));
    s
}

/// Whether `p` starts a managed allocation.
pub fn is_managed_base(p: u64) -> bool {
    state::find(p).is_some_and(|r| r.base == p && matches!(r.memory, Memory::Managed))
}

fn client_free(p: *mut c_void, kind: impl Fn(Memory) -> bool) -> bool {
    if p.is_null() {
        return true;
    }
    match state::find(p as u64) {
        Some(r) if r.base == p as u64 && kind(r.memory) => {
            crate::mirror::forget(r.base);
            state::remove(r.base);
            if !arena::free(r.base, r.len) {
                // SAFETY: the mapping created by host_alloc with this base and length.
                unsafe { libc::munmap(r.base as *mut c_void, r.len as usize) };
            }
            true
        }
        _ => false,
    }
}

/// The client's half of the pinned-memory arena (`chidori_protocol::mirror`): address space
/// reserved on first use, handed out first fit by page.
mod arena {
    use std::collections::BTreeMap;
    use std::sync::Mutex;

    use chidori_protocol::mirror::{ARENA_BASE, ARENA_LEN, PAGE, in_arena};

    /// Free extents (start → length); None until reserved, empty map if reserving failed.
    static FREE: Mutex<Option<BTreeMap<u64, u64>>> = Mutex::new(None);

    fn reserve() -> BTreeMap<u64, u64> {
        if chidori_protocol::mirror::reserve(ARENA_BASE, ARENA_LEN) {
            return BTreeMap::from([(ARENA_BASE, ARENA_LEN)]);
        }
        tracing::debug!("the pinned-memory arena is taken in this process; pinned memory comes from mmap");
        BTreeMap::new()
    }

    /// Page-aligned memory in the arena, readable and writable; None when there is no room.
    pub fn alloc(size: u64) -> Option<u64> {
        let len = size.checked_add(PAGE - 1)? / PAGE * PAGE;
        let mut guard = FREE.lock().unwrap_or_else(|p| p.into_inner());
        let free = guard.get_or_insert_with(reserve);
        let (&start, &extent) = free.iter().find(|(_, l)| **l >= len)?;
        free.remove(&start);
        if extent > len {
            free.insert(start + len, extent - len);
        }
        // SAFETY: [start, start + len) is a free extent of this process's own reservation.
        if !unsafe { chidori_protocol::mirror::commit(start, len) } {
            give_back(free, start, len);
            return None;
        }
        Some(start)
    }

    /// Return memory from [`alloc`] to the reservation. False if `base` is not arena memory.
    pub fn free(base: u64, size: u64) -> bool {
        if !in_arena(base) {
            return false;
        }
        let len = size.div_ceil(PAGE) * PAGE;
        // SAFETY: the pages [base, base + len) were handed out by alloc and the program freed
        // them; they become a reservation again and their memory is released.
        unsafe { chidori_protocol::mirror::decommit(base, len) };
        let mut guard = FREE.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(free) = guard.as_mut() {
            give_back(free, base, len);
        }
        true
    }

    /// Insert an extent, merged with its neighbours.
    fn give_back(free: &mut BTreeMap<u64, u64>, mut start: u64, mut len: u64) {
        if let Some((&before, &before_len)) = free.range(..start).next_back()
            && before + before_len == start
        {
            free.remove(&before);
            start = before;
            len += before_len;
        }
        if let Some(after_len) = free.remove(&(start + len)) {
            len += after_len;
        }
        free.insert(start, len);
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn extents_merge_when_given_back() {
            let mut free = BTreeMap::new();
            give_back(&mut free, 0x10000, 0x1000);
            give_back(&mut free, 0x12000, 0x1000);
            assert_eq!(free.len(), 2);
            give_back(&mut free, 0x11000, 0x1000);
            assert_eq!(free.into_iter().collect::<Vec<_>>(), vec![(0x10000, 0x3000)]);
        }

        #[test]
        fn arena_memory_is_usable_and_reused() {
            let a = alloc(10).expect("arena memory");
            assert!(in_arena(a));
            // SAFETY: a page of memory just allocated.
            unsafe { std::ptr::write_bytes(a as *mut u8, 7, 4096) };
            assert!(free(a, 10));
            let b = alloc(4096).expect("arena memory");
            assert_eq!(a, b, "the freed page comes back first");
            // SAFETY: the page is mapped again, zero-filled.
            assert_eq!(unsafe { *(b as *const u8) }, 0);
            assert!(free(b, 4096));
            assert!(!free(0x1000, 1), "not arena memory");
        }
    }
}

/// The three wire forms of a copy function.
pub struct CopyForms {
    pub h2d: &'static CallDesc,
    pub d2h: &'static CallDesc,
    pub d2d: &'static CallDesc,
}

impl CopyForms {
    /// The forms of a hand-written copy export, from its context.
    pub fn of(ctx: &chidori_cuda::desc::Ctx) -> CopyForms {
        use chidori_cuda::desc::Form;
        CopyForms { h2d: ctx.form(Form::H2d), d2h: ctx.form(Form::D2h), d2d: ctx.form(Form::D2d) }
    }
}

/// Where a copy goes, given a cudaMemcpyKind (Default: decided by the interval map).
///
/// The program's pinned memory is host memory whatever the kind says (a GPU maps it at its
/// host address, so natively a "device" pointer into it is valid), except where the server
/// mirrors it (the GPU was handed a pointer into it): then the copy runs on the server, in
/// stream order with the GPU's other accesses to the mirror.
pub fn direction(kind: u32, dst: u64, src: u64) -> Option<(bool, bool)> {
    use chidori_cuda::consts::cudaMemcpyKind as k;
    let (dst_claim, src_claim) = match kind {
        k::cudaMemcpyHostToHost => (false, false),
        k::cudaMemcpyHostToDevice => (true, false),
        k::cudaMemcpyDeviceToHost => (false, true),
        k::cudaMemcpyDeviceToDevice => (true, true),
        k::cudaMemcpyDefault => (state::is_device(dst), state::is_device(src)),
        _ => return None,
    };
    let server_side = |claim: bool, p: u64| crate::mirror::is_mirrored(p) || (claim && !state::is_pinned(p));
    Some((server_side(dst_claim, dst), server_side(src_claim, src)))
}

/// A copy on a capturing `stream` (None: a synchronous copy) becomes a node of the server's
/// graph, which replays there: each side in the program's memory (`(address, bytes spanned)`)
/// becomes memory the server mirrors ([`crate::mirror::for_server`]), and the copy one between
/// addresses the server has. Returns the direction to send (the one given while nothing
/// captures); Err: the program's memory cannot be mirrored ([`refused_in_capture`]).
pub fn captured(
    conn: &Conn,
    stream: Option<u64>,
    dst: (u64, u64),
    src: (u64, u64),
    direction: (bool, bool),
) -> Result<(bool, bool), u32> {
    let Some(stream) = stream else { return Ok(direction) };
    if direction == (true, true) || !super::capture::stream_capturing(stream, false) {
        return Ok(direction);
    }
    for (on_server, (side, len)) in [(direction.0, dst), (direction.1, src)] {
        if !on_server {
            crate::mirror::for_server(conn, side, len, crate::mirror::GRAPHS).map_err(refused_in_capture)?;
        }
    }
    Ok((true, true))
}

/// A copy on a capturing stream whose side in the program's memory cannot be mirrored
/// (`why`): logged once, cudaErrorStreamCaptureUnsupported (the driver's code is the same).
pub fn refused_in_capture(why: String) -> u32 {
    let why = format!(
        "a copy on a capturing stream: the graph replays on the server, which needs the program's memory mirrored: {why}"
    );
    crate::log::once_owned(&why, || tracing::warn!("{why}"));
    super::capture::CAPTURE_UNSUPPORTED
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
    let stream = tail.first().copied().filter(|_| asynchronous);
    let (dst_dev, src_dev) = match captured(conn, stream, (dst, count), (src, count), (dst_dev, src_dev)) {
        Ok(direction) => direction,
        Err(status) => return u64::from(status),
    };
    // The runtime's copies pass their kind after the count (its value is the form's); the
    // driver's unified copies (cuMemcpy) have none.
    let with_kind = forms.d2d.params.len() > 3 + tail.len();
    let args = |d: u64, s: u64, n: u64, kind: u64| -> Vec<u64> {
        let mut a = vec![d, s, n];
        if with_kind {
            a.push(kind);
        }
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
        (true, false) => {
            // The GPU reads the source when the stream reaches the copy: after every host
            // callback enqueued before it, which may write the source.
            conn.wait_callbacks(tail.first().copied().unwrap_or(0));
            let stream = tail.first().copied().filter(|_| asynchronous);
            // SAFETY: the source is the caller's host buffer of `count` bytes.
            unsafe { super::sync::copy_in(conn, forms.h2d, (dst, count), stream, &chunks(1)) }
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
                let stream = tail.first().copied().filter(|_| asynchronous);
                // SAFETY: the destination is the caller's host buffer of `count` bytes.
                unsafe { super::sync::read_back(conn, forms.d2h, stream, &chunks(2)) }
            }
        }
        (true, true) => {
            // SAFETY: both sides are device addresses, passed through; the copy reads and
            // writes `count` bytes at each.
            let named = [(dst, count), (src, count)];
            let status = unsafe { runtime::call_on_named(conn, forms.d2d, &args(dst, src, count, 3), &named) };
            if asynchronous || status != runtime::success(forms.d2d) || !crate::mirror::is_mirrored(dst) {
                return status;
            }
            // A synchronous copy into the program's mirrored memory: it returns once the
            // bytes are there, as natively (the wait pulls the mirror).
            let wait = if forms.d2d.library == "cudart" {
                &chidori_cuda::calls::cudart::cudaStreamSynchronize__call
            } else {
                &chidori_cuda::calls::driver::cuStreamSynchronize__call
            };
            // SAFETY: the legacy stream, by value.
            let waited = unsafe { runtime::call_on(conn, wait, &[0]) };
            if waited == runtime::success(wait) { status } else { waited }
        }
    }
}
