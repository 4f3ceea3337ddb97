//! Mirrors of the client's pinned host memory, for kernels that read it directly.
//!
//! Natively, pinned host memory (`cudaHostAlloc`, `cudaHostRegister`) is mapped into the
//! GPU's address space at its host address: a kernel or library may be handed a pinned
//! pointer and dereference it (MAGMA's batched solvers take arrays of matrix pointers that
//! torch fills in pinned memory; `cudaHostGetDevicePointer` returns the same address). The
//! GPU of a remote session cannot read the client's memory, so the worker keeps a *mirror*:
//! host memory of its own at the same virtual address, registered with CUDA, whose contents
//! the client brings up to date before the GPU may read them and reads back after it may
//! have written them.
//!
//! For the same address to be free in both processes, the client places pinned allocations
//! in an *arena* that both reserve early ([`ARENA_BASE`], [`ARENA_LEN`]): the worker before
//! it initializes CUDA (so the driver's own reservations avoid it), the client before its
//! first pinned allocation.
//!
//! Contents travel as byte runs: `(offset from the mirror's base, length)` pairs. Towards the
//! server (whole changed chunks, few runs) their bytes follow one another in a frame's bulk
//! section, at most [`PUSH_BUDGET`] a frame; back (exactly the bytes the GPU changed, which
//! for a kernel that rewrote an array of floats is a run every few bytes) the runs are
//! packed two varints each ([`pack_run`]) and a frame carries at most [`PULL_BUDGET`].

/// Where both sides reserve address space for pinned memory: 63 TiB, far below the region
/// where Linux places mappings (just under the stack, near 128 TiB) and far above
/// executables and their heaps.
pub const ARENA_BASE: u64 = 0x3f00_0000_0000;
/// 4 TiB of address space; reserved without backing (PROT_NONE, MAP_NORESERVE).
pub const ARENA_LEN: u64 = 4 << 40;
/// Mirrors cover whole pages.
pub const PAGE: u64 = 4096;
/// The largest mirror one session may have, and all of them together.
pub const MAX_MIRROR: u64 = 16 << 30;
pub const MAX_MIRRORED: u64 = 64 << 30;
/// The most bytes (packed runs and contents) one answer to a pull carries; more changed
/// bytes come in further pulls. Half of a frame's archive limit.
pub const PULL_BUDGET: usize = (crate::frame::MAX_ARCHIVE / 2) as usize;
/// The most content bytes one update of a mirror carries in its bulk section, and the most
/// runs; a larger update is sent as several.
pub const PUSH_BUDGET: u64 = 64 << 20;
pub const PUSH_MAX_RUNS: usize = 1 << 18;
/// The longest a packed run can be: two 10-byte varints.
pub const MAX_PACKED_RUN: usize = 20;

/// Mirrors of pageable memory that graphs copy (*stand-ins*) are named on the wire by keys
/// from here up, never by an address: the worker places each where it likes, and calls that
/// name the client's address (a captured copy, a memcpy node, a library's host array) are
/// given the stand-in's address on the worker instead. Two stand-ins may cover the same
/// client page (each its own registration, never replaced while a graph node names it).
pub const STAND_IN_KEYS: u64 = 1 << 63;

/// Whether a mirror's key names a stand-in ([`STAND_IN_KEYS`]).
pub const fn is_stand_in(key: u64) -> bool {
    key >= STAND_IN_KEYS
}

/// Copy `out.len()` bytes of this process's own memory at `addr` into `out`, through the
/// kernel (`process_vm_readv`): false where any of it is not mapped readable, never a fault
/// (a page the program unmapped, a library table shorter than expected).
pub fn read_own(addr: u64, out: &mut [u8]) -> bool {
    let local = libc::iovec { iov_base: out.as_mut_ptr().cast(), iov_len: out.len() };
    let remote = libc::iovec { iov_base: addr as *mut libc::c_void, iov_len: out.len() };
    // SAFETY: reads this process's own memory through the kernel, which answers EFAULT for
    // what is not mapped; `out` is a live buffer of that length.
    let n = unsafe { libc::process_vm_readv(libc::getpid(), &local, 1, &remote, 1, 0) };
    n == out.len() as isize
}

/// Write `bytes` into this process's own memory at `addr` through the kernel
/// (`process_vm_writev`): false where any of it is not mapped writable.
pub fn write_own(addr: u64, bytes: &[u8]) -> bool {
    let local = libc::iovec { iov_base: bytes.as_ptr() as *mut libc::c_void, iov_len: bytes.len() };
    let remote = libc::iovec { iov_base: addr as *mut libc::c_void, iov_len: bytes.len() };
    // SAFETY: as in `read_own`: the kernel checks the destination.
    let n = unsafe { libc::process_vm_writev(libc::getpid(), &local, 1, &remote, 1, 0) };
    n == bytes.len() as isize
}

/// Reserve `[base, base + len)` (page-aligned) without access or backing, exactly there:
/// false when any of it is taken (MAP_FIXED_NOREPLACE never replaces a mapping).
pub fn reserve(base: u64, len: u64) -> bool {
    map(base, len, libc::PROT_NONE, libc::MAP_NORESERVE | libc::MAP_FIXED_NOREPLACE)
}

/// Make pages of this process's own reservation readable and writable (zero-filled).
///
/// # Safety
/// `[base, base + len)` must be reserved by this process (by [`reserve`]) and hold nothing
/// anyone uses: MAP_FIXED replaces what is there.
pub unsafe fn commit(base: u64, len: u64) -> bool {
    map(base, len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_FIXED)
}

/// Give committed pages back to the reservation (their memory is released).
///
/// # Safety
/// As [`commit`]: the pages must be this process's and unused.
pub unsafe fn decommit(base: u64, len: u64) -> bool {
    map(base, len, libc::PROT_NONE, libc::MAP_NORESERVE | libc::MAP_FIXED)
}

/// Map fresh anonymous memory at exactly `base`, or nothing.
fn map(base: u64, len: u64, prot: i32, flags: i32) -> bool {
    // SAFETY: an anonymous private mapping at a fixed address: with MAP_FIXED_NOREPLACE it
    // touches no existing mapping; with MAP_FIXED the callers guarantee the range is theirs.
    let p = unsafe {
        libc::mmap(
            base as *mut libc::c_void,
            len as usize,
            prot,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | flags,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return false;
    }
    if p as u64 != base {
        // An old kernel took the address as a hint only: give the stray mapping back.
        // SAFETY: the mapping just created, of this length.
        unsafe { libc::munmap(p, len as usize) };
        return false;
    }
    true
}

/// Whether `addr` lies in the arena.
pub fn in_arena(addr: u64) -> bool {
    (ARENA_BASE..ARENA_BASE + ARENA_LEN).contains(&addr)
}

/// The pages covering `[base, base + len)`: (first page, length in bytes), or None when the
/// range is empty, overflows or leaves user space.
pub fn pages(base: u64, len: u64) -> Option<(u64, u64)> {
    if len == 0 {
        return None;
    }
    let end = base.checked_add(len)?;
    let first = base / PAGE * PAGE;
    let last = end.checked_add(PAGE - 1)? / PAGE * PAGE;
    // Below 64 KiB is never mappable; above 2^47 is not user space on x86_64.
    if first < (64 << 10) || last > (1 << 47) {
        return None;
    }
    Some((first, last - first))
}

/// Runs `(offset, length)` of exactly the bytes where `now` differs from `before` (same
/// length). Exact, not merged across equal bytes: the runs of a pull are written into the
/// program's memory, where an equal byte between two changed ones may be one the program
/// has written since (another variable on the same page).
pub fn changed_runs(before: &[u8], now: &[u8]) -> Vec<(u64, u64)> {
    debug_assert_eq!(before.len(), now.len());
    let n = before.len().min(now.len());
    let mut runs: Vec<(u64, u64)> = Vec::new();
    let mut i = 0;
    while i < n {
        // Skip equal bytes a word at a time where possible.
        if i + 8 <= n && before[i..i + 8] == now[i..i + 8] {
            i += 8;
            continue;
        }
        if before[i] == now[i] {
            i += 1;
            continue;
        }
        let start = i;
        while i < n && before[i] != now[i] {
            i += 1;
        }
        runs.push((start as u64, (i - start) as u64));
    }
    runs
}

/// Check runs sent for a mirror of `len` bytes with `bulk` bytes of contents: each inside
/// the mirror, in order, not overlapping, and their lengths adding up to `bulk`.
pub fn check_runs(runs: &[(u64, u64)], len: u64, bulk: u64) -> Result<(), String> {
    let mut at = 0u64;
    let mut total = 0u64;
    for &(offset, n) in runs {
        let end = offset.checked_add(n).ok_or("a run overflows")?;
        if offset < at || end > len {
            return Err(format!("run {offset}+{n} outside a mirror of {len} bytes or out of order"));
        }
        at = end;
        total = total.checked_add(n).ok_or("runs overflow")?;
    }
    if total != bulk {
        return Err(format!("runs of {total} bytes with {bulk} bytes of contents"));
    }
    Ok(())
}

/// `runs` cut into batches of at most `budget` content bytes and `max_runs` runs each (a
/// longer run is cut in pieces); always at least one batch, empty when `runs` is.
pub fn batches(runs: &[(u64, u64)], budget: u64, max_runs: usize) -> Vec<Vec<(u64, u64)>> {
    let (budget, max_runs) = (budget.max(1), max_runs.max(1));
    let mut out = vec![Vec::new()];
    let mut used = 0u64;
    for &(mut offset, mut n) in runs {
        while n > 0 {
            if used == budget || out.last().is_some_and(|b| b.len() == max_runs) {
                out.push(Vec::new());
                used = 0;
            }
            let take = n.min(budget - used);
            if let Some(batch) = out.last_mut() {
                batch.push((offset, take));
            }
            used += take;
            offset += take;
            n -= take;
        }
    }
    out
}

/// Append the run `(offset, len)` to `packed`, where `end` is where the previous run ended
/// (0 for the first): the gap and the length, LEB128 each. Returns the new end.
pub fn pack_run(packed: &mut Vec<u8>, end: u64, offset: u64, len: u64) -> u64 {
    for mut v in [offset - end, len] {
        while v >= 0x80 {
            packed.push((v as u8) | 0x80);
            v >>= 7;
        }
        packed.push(v as u8);
    }
    offset + len
}

/// The runs `packed` holds, checked as [`check_runs`] checks them for a mirror of `len`
/// bytes with `bytes` bytes of contents.
pub fn unpack_runs(packed: &[u8], len: u64, bytes: u64) -> Result<Vec<(u64, u64)>, String> {
    fn varint(packed: &[u8], at: &mut usize) -> Result<u64, String> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = *packed.get(*at).ok_or("packed runs end inside a number")?;
            *at += 1;
            v |= u64::from(b & 0x7f)
                .checked_shl(shift)
                .filter(|x| x >> shift == u64::from(b & 0x7f))
                .ok_or("a packed number overflows")?;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err("a packed number overflows".into())
    }
    let mut runs = Vec::new();
    let (mut at, mut end) = (0usize, 0u64);
    while at < packed.len() {
        let gap = varint(packed, &mut at)?;
        let n = varint(packed, &mut at)?;
        let offset = end.checked_add(gap).ok_or("a run overflows")?;
        end = offset.checked_add(n).ok_or("a run overflows")?;
        runs.push((offset, n));
    }
    check_runs(&runs, len, bytes)?;
    Ok(runs)
}

/// Copy the bytes of `runs` (consecutive in `bytes`) into `dst` at their offsets. The runs
/// must have passed [`check_runs`] for `dst.len()` and `bytes.len()`.
pub fn apply_runs(runs: &[(u64, u64)], bytes: &[u8], dst: &mut [u8]) {
    let mut at = 0usize;
    for &(offset, n) in runs {
        let (offset, n) = (offset as usize, n as usize);
        dst[offset..offset + n].copy_from_slice(&bytes[at..at + n]);
        at += n;
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn runs_name_the_changed_bytes() {
        let before = vec![0u8; 200];
        let mut now = before.clone();
        now[3] = 1;
        now[5] = 1;
        now[150] = 7;
        now[6] = 1;
        // Byte 4 stays as it was: it is not sent (the program may have written it since).
        assert_eq!(changed_runs(&before, &now), vec![(3, 1), (5, 2), (150, 1)]);
        assert_eq!(changed_runs(&before, &before), vec![]);
    }

    #[test]
    fn runs_are_checked() {
        assert!(check_runs(&[(0, 4), (8, 4)], 16, 8).is_ok());
        assert!(check_runs(&[(8, 4), (0, 4)], 16, 8).is_err(), "out of order");
        assert!(check_runs(&[(0, 4), (2, 4)], 16, 8).is_err(), "overlapping");
        assert!(check_runs(&[(12, 8)], 16, 8).is_err(), "past the end");
        assert!(check_runs(&[(0, 4)], 16, 5).is_err(), "bulk of another size");
        assert!(check_runs(&[(u64::MAX, 2)], 16, 2).is_err(), "overflow");
    }

    #[test]
    fn batches_keep_to_their_budget() {
        assert_eq!(batches(&[], 10, 2), vec![Vec::<(u64, u64)>::new()]);
        assert_eq!(batches(&[(0, 25)], 10, 4), vec![vec![(0, 10)], vec![(10, 10)], vec![(20, 5)]]);
        assert_eq!(batches(&[(0, 4), (8, 4), (16, 4)], 100, 2), vec![vec![(0, 4), (8, 4)], vec![(16, 4)]]);
        assert_eq!(batches(&[(0, 6), (8, 6)], 10, 9), vec![vec![(0, 6), (8, 4)], vec![(12, 2)]]);
    }

    #[test]
    fn packed_runs_come_back_as_they_went() {
        let runs = [(0u64, 1u64), (3, 200), (1 << 40, 5)];
        let mut packed = Vec::new();
        let mut end = 0;
        for &(o, n) in &runs {
            end = pack_run(&mut packed, end, o, n);
        }
        assert_eq!(packed.len(), 2 + 3 + 7);
        assert_eq!(unpack_runs(&packed, (1 << 40) + 5, 206), Ok(runs.to_vec()));
        assert!(unpack_runs(&packed, 1 << 40, 206).is_err(), "past the end");
        assert!(unpack_runs(&packed, (1 << 40) + 5, 205).is_err(), "contents of another size");
        assert!(unpack_runs(&packed[..packed.len() - 1], (1 << 40) + 5, 206).is_err(), "cut short");
        assert!(unpack_runs(&[0xff; 11], u64::MAX, 0).is_err(), "overlong number");
        assert!(
            unpack_runs(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, 1], u64::MAX, 1).is_err(),
            "over 64 bits"
        );
    }

    #[test]
    fn pages_cover_the_range_and_refuse_what_is_no_user_memory() {
        assert_eq!(pages(0x10_0010, 10), Some((0x10_0000, 4096)));
        assert_eq!(pages(0x10_0ff0, 32), Some((0x10_0000, 8192)));
        assert_eq!(pages(0x1000, 8), None);
        assert_eq!(pages(1 << 47, 8), None);
        assert_eq!(pages(u64::MAX - 4, 8), None);
        assert_eq!(pages(0x10_0000, 0), None);
    }

    proptest! {
        #[test]
        fn applying_the_runs_reproduces_the_new_bytes(before in proptest::collection::vec(any::<u8>(), 0..600),
                                                      edits in proptest::collection::vec((any::<usize>(), any::<u8>()), 0..40)) {
            let mut now = before.clone();
            for (at, v) in edits {
                if !now.is_empty() {
                    let i = at % now.len();
                    now[i] = v;
                }
            }
            let runs = changed_runs(&before, &now);
            let bytes: Vec<u8> = runs.iter().flat_map(|&(o, n)| now[o as usize..(o + n) as usize].to_vec()).collect();
            prop_assert!(check_runs(&runs, before.len() as u64, bytes.len() as u64).is_ok());
            let mut rebuilt = before.clone();
            apply_runs(&runs, &bytes, &mut rebuilt);
            prop_assert_eq!(rebuilt, now);
        }
    }
}
