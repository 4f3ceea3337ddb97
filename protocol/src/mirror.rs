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
//! section, at most [`PUSH_BUDGET`] a frame. Back come exactly the bytes the GPU changed,
//! which for a kernel that rewrote an array of numbers may be a byte or two in every word:
//! changes closer than [`MERGE_GAP`] form one *span*, sent either as its runs or, where
//! those are many, as a bitmap of the bytes that changed and only those bytes
//! ([`Changes`]); a frame carries at most [`PULL_BUDGET`].

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
/// Changed bytes fewer than this apart belong to one span of a pull ([`changed_spans`]).
pub const MERGE_GAP: usize = 16;

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

/// A stretch of changed bytes: no two changes in it are [`MERGE_GAP`] or more bytes apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    pub start: usize,
    pub len: usize,
    /// Exact runs of changed bytes in it, and changed bytes.
    pub runs: usize,
    pub changed: usize,
}

impl Span {
    /// Whether a bitmap of its bytes travels cheaper than its runs: a bit a byte against a
    /// packed run (about three bytes) each.
    fn masked(&self) -> bool {
        self.changed < self.len && self.len.div_ceil(8) < 3 * self.runs
    }
}

/// The spans where `now` differs from `before` (same length), in order: one pass, eight
/// bytes at a time.
pub fn changed_spans(before: &[u8], now: &[u8]) -> Vec<Span> {
    let n = before.len().min(now.len());
    let mut spans: Vec<Span> = Vec::new();
    // Whether the byte before the ones looked at changed (a run continues then).
    let mut previous = false;
    let mut i = 0;
    while i < n {
        // Bit k: byte i + k changed.
        let (bits, width) = if i + 8 <= n {
            let x = word(before, i) ^ word(now, i);
            if x != 0 && all_nonzero(x) {
                // All eight changed, and maybe the words after: one stretch.
                let mut j = i + 8;
                while j + 8 <= n && all_nonzero(word(before, j) ^ word(now, j)) {
                    j += 8;
                }
                add_stretch(&mut spans, i, j - i, usize::from(!previous), j - i);
                previous = true;
                i = j;
                continue;
            }
            (nonzero_bytes(x), 8)
        } else {
            (changed_bits(&before[i..n], &now[i..n]), n - i)
        };
        if bits != 0 {
            let (first, last) = (bits.trailing_zeros() as usize, 7 - bits.leading_zeros() as usize);
            // Bytes that start a run: changed, and the byte before did not.
            let starts = bits & !((bits << 1) | u8::from(previous));
            add_stretch(
                &mut spans,
                i + first,
                last + 1 - first,
                starts.count_ones() as usize,
                bits.count_ones() as usize,
            );
        }
        previous = bits >> (width - 1) & 1 == 1;
        i += width;
    }
    spans
}

/// Add `len` bytes from `start` (first and last changed, `runs` runs and `changed` bytes
/// changed in them) to the last span, or start a span.
fn add_stretch(spans: &mut Vec<Span>, start: usize, len: usize, runs: usize, changed: usize) {
    match spans.last_mut() {
        Some(s) if start - (s.start + s.len) < MERGE_GAP => {
            s.len = start + len - s.start;
            s.runs += runs;
            s.changed += changed;
        }
        _ => spans.push(Span { start, len, runs: runs.max(1), changed }),
    }
}

/// Eight bytes at `at` as one word (little-endian: byte `k` is bits `8k..8k + 8`).
fn word(bytes: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(w)
}

const LOW: u64 = 0x7f7f_7f7f_7f7f_7f7f;

/// The top bit of each byte of `x`: set where the byte is not zero (its low seven bits
/// carry into it, or it was set).
fn top_bits(x: u64) -> u64 {
    (((x & LOW) + LOW) | x) & !LOW
}

/// Whether no byte of `x` is zero.
fn all_nonzero(x: u64) -> bool {
    top_bits(x) == !LOW
}

/// Bit `k` set where byte `k` of `x` is not zero: each byte's top bit moved to its lowest,
/// and one multiplication gathers the eight into the top byte (bit `8k` lands on `56 + k`;
/// no two products share a bit, so nothing carries).
fn nonzero_bytes(x: u64) -> u8 {
    ((top_bits(x) >> 7).wrapping_mul(0x0102_0408_1020_4080) >> 56) as u8
}

/// Bit `k` set where byte `k` of the up to eight bytes differs.
fn changed_bits(before: &[u8], now: &[u8]) -> u8 {
    if before.len() == 8 {
        return nonzero_bytes(word(before, 0) ^ word(now, 0));
    }
    before.iter().zip(now).enumerate().fold(0u8, |bits, (k, (a, b))| bits | u8::from(a != b) << k)
}

/// Changes to one mirror as a pull sends them (the fields of `messages::MirrorChanges`):
/// spans packed two varints each, the gap since the previous span's end and the length
/// shifted left by one, its low bit set for a *masked* span; for each masked span, in
/// order, a bitmap of its bytes (least significant bit first, whole bytes, unused bits
/// clear) where a set bit is a changed byte; and the changed bytes, in order. An unmasked
/// span's bytes all changed. Bytes that did not change never travel: the program may have
/// written one since.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Changes {
    pub runs: Vec<u8>,
    pub mask: Vec<u8>,
    pub bytes: Vec<u8>,
    /// Where the last span ended.
    end: u64,
}

/// A span of [`Changes`] read back: `offset` from the mirror's base, and whether a bitmap
/// says which of its bytes are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChangedSpan {
    pub offset: u64,
    pub len: u64,
    pub masked: bool,
}

impl Changes {
    /// The encoded size so far.
    pub fn size(&self) -> usize {
        self.runs.len() + self.mask.len() + self.bytes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.runs.is_empty()
    }

    /// Add what changed between `before` and `now`, which lie at `offset` in the mirror
    /// (after every span added so far).
    pub fn add(&mut self, offset: u64, before: &[u8], now: &[u8]) {
        for span in changed_spans(before, now) {
            let (b, n) = (&before[span.start..span.start + span.len], &now[span.start..span.start + span.len]);
            let at = offset + span.start as u64;
            if span.masked() {
                self.pack(at, span.len as u64, true);
                self.add_masked(b, n, span.changed);
            } else if span.runs == 1 {
                self.pack(at, span.len as u64, false);
                self.bytes.extend_from_slice(n);
            } else {
                for (o, len) in changed_runs(b, n) {
                    self.pack(at + o, len, false);
                    self.bytes.extend_from_slice(&n[o as usize..(o + len) as usize]);
                }
            }
        }
    }

    /// A masked span's bitmap and changed bytes (`changed` of them), `before` and `now` its
    /// bytes: written in place into room made first, eight bytes at a time.
    fn add_masked(&mut self, before: &[u8], now: &[u8], changed: usize) {
        let (mask_at, bytes_at) = (self.mask.len(), self.bytes.len());
        self.mask.resize(mask_at + now.len().div_ceil(8), 0);
        // Eight spare bytes: a group's changed bytes are written as a whole word.
        self.bytes.resize(bytes_at + changed + 8, 0);
        let (mask, out) = (&mut self.mask[mask_at..], &mut self.bytes[bytes_at..]);
        let mut at = 0usize;
        let groups = before.chunks(8).zip(now.chunks(8));
        for ((group_b, group_n), bits_out) in groups.zip(mask.iter_mut()) {
            let bits = changed_bits(group_b, group_n);
            // `changed` counts the span's changed bytes, so there is always room; were it
            // short, the groups after would stay unmarked, never marked without their bytes.
            let Some(dst) = out.get_mut(at..at + 8) else { break };
            *bits_out = bits;
            if bits == 0xff {
                dst.copy_from_slice(group_n);
            } else {
                let mut rest = bits;
                for slot in dst.iter_mut() {
                    if rest == 0 {
                        break;
                    }
                    *slot = group_n[rest.trailing_zeros() as usize];
                    rest &= rest - 1;
                }
            }
            at += bits.count_ones() as usize;
        }
        self.bytes.truncate(bytes_at + at);
    }

    fn pack(&mut self, offset: u64, len: u64, masked: bool) {
        for mut v in [offset - self.end, len << 1 | u64::from(masked)] {
            while v >= 0x80 {
                self.runs.push((v as u8) | 0x80);
                v >>= 7;
            }
            self.runs.push(v as u8);
        }
        self.end = offset + len;
    }
}

/// The spans of changes received for a mirror of `len` bytes, checked: in order, not
/// overlapping, inside the mirror, one bitmap byte for every 8 bytes of each masked span
/// (unused bits clear), and as many changed bytes as the spans and bitmaps say.
pub fn unpack_changes(runs: &[u8], mask: &[u8], bytes: usize, len: u64) -> Result<Vec<ChangedSpan>, String> {
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
    let mut spans = Vec::new();
    let (mut at, mut end, mut mask_at, mut total) = (0usize, 0u64, 0usize, 0u64);
    while at < runs.len() {
        let gap = varint(runs, &mut at)?;
        let word = varint(runs, &mut at)?;
        let (n, masked) = (word >> 1, word & 1 == 1);
        let offset = end.checked_add(gap).ok_or("a run overflows")?;
        end = offset.checked_add(n).ok_or("a run overflows")?;
        if end > len {
            return Err(format!("a span {offset}+{n} outside a mirror of {len} bytes"));
        }
        if masked {
            let groups = usize::try_from(n.div_ceil(8)).map_err(|_| "a span overflows")?;
            let bits = mask.get(mask_at..mask_at + groups).ok_or("the bitmap ends inside a span")?;
            if let Some(&last) = bits.last()
                && n % 8 != 0
                && last >> (n % 8) != 0
            {
                return Err("a bitmap names bytes past its span".into());
            }
            total += bits.iter().map(|b| u64::from(b.count_ones())).sum::<u64>();
            mask_at += groups;
        } else {
            total = total.checked_add(n).ok_or("runs overflow")?;
        }
        spans.push(ChangedSpan { offset, len: n, masked });
    }
    if mask_at != mask.len() {
        return Err(format!("a bitmap of {} bytes for spans that need {mask_at}", mask.len()));
    }
    if total != bytes as u64 {
        return Err(format!("spans of {total} changed bytes with {bytes} bytes of contents"));
    }
    Ok(spans)
}

/// Each span with its bitmap (empty for an unmasked span) and its changed bytes; `spans`
/// as [`unpack_changes`] checked them against `mask` and `bytes`.
pub fn span_parts<'a>(
    spans: &'a [ChangedSpan],
    mask: &'a [u8],
    bytes: &'a [u8],
) -> impl Iterator<Item = (ChangedSpan, &'a [u8], &'a [u8])> + 'a {
    let (mut mask_at, mut at) = (0usize, 0usize);
    spans.iter().map(move |&span| {
        let n = span.len as usize;
        let bits: &[u8] = if span.masked { &mask[mask_at..mask_at + n.div_ceil(8)] } else { &[] };
        mask_at += bits.len();
        let count = if span.masked { bits.iter().map(|b| b.count_ones() as usize).sum() } else { n };
        let data = &bytes[at..at + count];
        at += count;
        (span, bits, data)
    })
}

/// Write one span's changed bytes (one of [`span_parts`]) at `dst`, where the span's
/// first byte lies; the bytes a bitmap does not name are left as they are. Never more
/// than `span.len` bytes, nor more than `data` holds.
///
/// # Safety
/// `dst` must be valid for writes of `span.len` bytes.
pub unsafe fn write_span(span: ChangedSpan, bits: &[u8], data: &[u8], dst: *mut u8) {
    if !span.masked {
        // SAFETY: an unmasked span's data is its `span.len` bytes; the caller's contract.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), dst, data.len().min(span.len as usize)) };
        return;
    }
    let n = span.len as usize;
    let mut at = 0usize;
    for (g, &b) in bits.iter().enumerate() {
        let group = g * 8;
        if group + 8 <= n && at + 8 <= data.len() {
            // A whole group inside the span with eight bytes of data left: at most eight
            // bytes taken, each written inside the group (both checked once here).
            if b == 0xff {
                // SAFETY: 8 bytes inside the span, and 8 of data.
                unsafe { std::ptr::copy_nonoverlapping(data.as_ptr().add(at), dst.add(group), 8) };
                at += 8;
                continue;
            }
            let mut rest = b;
            while rest != 0 {
                let k = rest.trailing_zeros() as usize;
                // SAFETY: byte `k` < 8 of the group, inside the span; `at` is below the
                // eight bytes of data checked (one per set bit).
                unsafe { dst.add(group + k).write(*data.get_unchecked(at)) };
                at += 1;
                rest &= rest - 1;
            }
            continue;
        }
        let mut rest = b;
        while rest != 0 {
            let k = rest.trailing_zeros() as usize;
            if group + k < n && at < data.len() {
                // SAFETY: inside the span (checked), one byte of data.
                unsafe { dst.add(group + k).write(data[at]) };
            }
            at += 1;
            rest &= rest - 1;
        }
    }
}

/// Write the changes into `dst`, the mirror's bytes; `spans` as [`unpack_changes`] checked
/// them for `dst.len()`, `mask` and `bytes`.
pub fn apply_changes(spans: &[ChangedSpan], mask: &[u8], bytes: &[u8], dst: &mut [u8]) {
    for (span, bits, data) in span_parts(spans, mask, bytes) {
        let (at, n) = (span.offset as usize, span.len as usize);
        let Some(target) = dst.get_mut(at..at + n) else { continue };
        // SAFETY: `target` holds the span's `n` bytes.
        unsafe { write_span(span, bits, data, target.as_mut_ptr()) };
    }
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

/// The bytes of a client's update (`runs`, consecutive in `bytes`, as [`check_runs`]
/// checked them for `shadow.len()`) that the client changed since it last saw the mirror
/// (`shadow`), as (offset, length, where in `bytes`). An update carries whole chunks; its
/// other bytes are what the client had, while the mirror may hold newer bytes the GPU wrote
/// there since, which the next pull brings back: only these are written.
pub fn client_changes(runs: &[(u64, u64)], bytes: &[u8], shadow: &[u8]) -> Vec<(u64, u64, usize)> {
    let mut out = Vec::new();
    let mut at = 0usize;
    for &(offset, n) in runs {
        let (o, n) = (offset as usize, n as usize);
        for (sub, len) in changed_runs(&shadow[o..o + n], &bytes[at..at + n]) {
            out.push((offset + sub, len, at + sub as usize));
        }
        at += n;
    }
    out
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

    /// An update's chunk holds the client's stale copy of a byte the GPU wrote since: only
    /// the bytes the client changed are written.
    #[test]
    fn an_update_writes_only_what_the_client_changed() {
        let shadow = vec![1u8; 32];
        let mut update = shadow.clone();
        update[3] = 9;
        update[20..23].fill(8);
        let runs = [(0u64, 16u64), (16, 16)];
        assert_eq!(client_changes(&runs, &update, &shadow), vec![(3, 1, 3), (20, 3, 20)]);
        assert_eq!(client_changes(&[(16, 16)], &update[16..], &shadow), vec![(20, 3, 4)]);
        assert_eq!(client_changes(&runs, &shadow, &shadow), vec![]);
    }

    #[test]
    fn batches_keep_to_their_budget() {
        assert_eq!(batches(&[], 10, 2), vec![Vec::<(u64, u64)>::new()]);
        assert_eq!(batches(&[(0, 25)], 10, 4), vec![vec![(0, 10)], vec![(10, 10)], vec![(20, 5)]]);
        assert_eq!(batches(&[(0, 4), (8, 4), (16, 4)], 100, 2), vec![vec![(0, 4), (8, 4)], vec![(16, 4)]]);
        assert_eq!(batches(&[(0, 6), (8, 6)], 10, 9), vec![vec![(0, 6), (8, 4)], vec![(12, 2)]]);
    }

    /// Changes packed and read back: spans in order, a sparse stretch as a bitmap, a dense
    /// one as its runs.
    #[test]
    fn changes_come_back_as_they_went() {
        let before = vec![0u8; 400];
        let mut now = before.clone();
        // One byte in every four of 0..64: a bitmap is cheaper than 16 runs.
        for i in (0..64).step_by(4) {
            now[i] = 1;
        }
        // Two long runs 10 bytes apart: cheaper as runs.
        now[100..180].fill(2);
        now[190..300].fill(3);
        let mut c = Changes::default();
        c.add(1 << 40, &before, &now);
        let spans = unpack_changes(&c.runs, &c.mask, c.bytes.len(), (1 << 40) + 400).expect("well formed");
        assert_eq!(
            spans,
            vec![
                ChangedSpan { offset: 1 << 40, len: 61, masked: true },
                ChangedSpan { offset: (1 << 40) + 100, len: 80, masked: false },
                ChangedSpan { offset: (1 << 40) + 190, len: 110, masked: false },
            ]
        );
        assert_eq!(c.mask.len(), 8);
        assert_eq!(c.bytes.len(), 16 + 80 + 110);
        let mut rebuilt = vec![0u8; 400];
        let shifted: Vec<ChangedSpan> =
            spans.iter().map(|s| ChangedSpan { offset: s.offset - (1 << 40), ..*s }).collect();
        apply_changes(&shifted, &c.mask, &c.bytes, &mut rebuilt);
        assert_eq!(rebuilt, now);
        // What a pull never writes: bytes in a span that did not change (the program's own
        // writes since stay).
        let mut program = vec![7u8; 400];
        apply_changes(&shifted[..1], &c.mask, &c.bytes[..16], &mut program);
        for (i, &b) in program.iter().enumerate() {
            assert_eq!(b, if i < 64 && i % 4 == 0 { 1 } else { 7 }, "byte {i}");
        }
    }

    #[test]
    fn malformed_changes_are_refused() {
        let mut c = Changes::default();
        let mut now = vec![0u8; 64];
        for i in (0..64).step_by(2) {
            now[i] = 9;
        }
        c.add(0, &[0u8; 64], &now);
        assert_eq!(c.mask.len(), 8);
        let ok = |runs: &[u8], mask: &[u8], bytes: usize, len: u64| unpack_changes(runs, mask, bytes, len).is_ok();
        assert!(ok(&c.runs, &c.mask, c.bytes.len(), 64));
        assert!(!ok(&c.runs, &c.mask, c.bytes.len(), 62), "past the end");
        assert!(!ok(&c.runs, &c.mask, c.bytes.len() - 1, 64), "contents of another size");
        assert!(!ok(&c.runs, &c.mask[..7], c.bytes.len(), 64), "bitmap cut short");
        assert!(!ok(&c.runs, &[c.mask.as_slice(), &[0]].concat(), c.bytes.len(), 64), "bitmap too long");
        let mut flipped = c.mask.clone();
        flipped[7] |= 0x80;
        assert!(!ok(&c.runs, &flipped, c.bytes.len(), 64), "a bit past the span");
        assert!(!ok(&c.runs[..c.runs.len() - 1], &c.mask, c.bytes.len(), 64), "cut short");
        assert!(!ok(&[0xff; 11], &[], 0, u64::MAX), "overlong number");
        assert!(
            !ok(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, 2], &[], 1, u64::MAX),
            "over 64 bits"
        );
        // Out of order cannot be said: a span starts after the previous one ends.
        assert!(ok(&[0, 8, 0, 8], &[], 8, 8), "two adjacent spans");
    }

    #[test]
    fn nonzero_bytes_are_found() {
        assert_eq!(nonzero_bytes(0), 0);
        assert_eq!(nonzero_bytes(u64::MAX), 0xff);
        assert_eq!(nonzero_bytes(0x0100_0000_0000_0080), 0b1000_0001);
        assert_eq!(nonzero_bytes(0x0000_0000_7f00_0001), 0b0000_1001);
        for k in 0..8 {
            assert_eq!(nonzero_bytes(1 << (8 * k)), 1 << k);
            assert_eq!(nonzero_bytes(0x80 << (8 * k)), 1 << k);
            assert!(!all_nonzero(!(0xff << (8 * k))));
        }
        assert!(all_nonzero(0x0101_0101_0101_0101) && all_nonzero(u64::MAX) && !all_nonzero(0));
        // Every pattern of changed bytes, each changed byte one of several values.
        for pattern in 0..=255u8 {
            for value in [1u8, 0x7f, 0x80, 0xff, 0x5a] {
                let x = (0..8).filter(|k| pattern >> k & 1 == 1).fold(0u64, |x, k| x | u64::from(value) << (8 * k));
                assert_eq!(nonzero_bytes(x), pattern, "{x:#x}");
            }
        }
    }

    /// A change larger than a frame: the encoded size is what the fields hold, and one
    /// byte in each word costs about two bits and a byte, not a packed run.
    #[test]
    fn a_byte_in_every_word_costs_a_bitmap() {
        let before = vec![25u8; 1 << 20];
        let mut now = before.clone();
        for i in (0..now.len()).step_by(4) {
            now[i] = 50;
        }
        let mut c = Changes::default();
        c.add(0, &before, &now);
        assert_eq!(c.size(), c.runs.len() + c.mask.len() + c.bytes.len());
        // A bit for each byte and the changed quarter (exact runs: the quarter and two bytes
        // of packed run for each, 3/4 of the array).
        assert!(c.size() <= (1 << 20) * 3 / 8 + 8, "{} bytes", c.size());
        let spans = unpack_changes(&c.runs, &c.mask, c.bytes.len(), 1 << 20).expect("well formed");
        let mut rebuilt = before.clone();
        apply_changes(&spans, &c.mask, &c.bytes, &mut rebuilt);
        assert!(rebuilt == now);
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
                                                      edits in proptest::collection::vec((any::<usize>(), any::<u8>()), 0..300)) {
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
            prop_assert_eq!(&rebuilt, &now);
            // Spans hold the exact runs: as many, as many bytes, each inside one span.
            let spans = changed_spans(&before, &now);
            prop_assert_eq!(spans.iter().map(|s| s.runs).sum::<usize>(), runs.len());
            prop_assert_eq!(spans.iter().map(|s| s.changed as u64).sum::<u64>(), runs.iter().map(|r| r.1).sum::<u64>());
            for &(o, n) in &runs {
                prop_assert!(spans.iter().any(|s| s.start as u64 <= o && o + n <= (s.start + s.len) as u64));
            }
            // Encoded for a pull, in two parts: the same bytes, and only the changed ones are
            // written (a byte the program wrote meanwhile, where nothing changed, stays).
            let cut = before.len() / 3;
            let mut c = Changes::default();
            c.add(0, &before[..cut], &now[..cut]);
            c.add(cut as u64, &before[cut..], &now[cut..]);
            let spans = unpack_changes(&c.runs, &c.mask, c.bytes.len(), before.len() as u64);
            prop_assert!(spans.is_ok(), "{:?}", spans);
            let spans = spans.unwrap_or_default();
            // The program's own bytes: where nothing changed, something else.
            let mut program: Vec<u8> = before.iter().zip(&now).map(|(&b, &n)| if b == n { b ^ 0x5a } else { b }).collect();
            apply_changes(&spans, &c.mask, &c.bytes, &mut program);
            for i in 0..before.len() {
                let want = if before[i] != now[i] { now[i] } else { before[i] ^ 0x5a };
                prop_assert_eq!(program[i], want, "byte {}", i);
            }
            let mut rebuilt = before.clone();
            apply_changes(&spans, &c.mask, &c.bytes, &mut rebuilt);
            prop_assert_eq!(rebuilt, now);
        }

        /// Every malformed encoding is refused or within bounds: never a panic.
        #[test]
        fn any_encoding_is_checked(runs in proptest::collection::vec(any::<u8>(), 0..40),
                                   mask in proptest::collection::vec(any::<u8>(), 0..8),
                                   bytes in 0usize..64, len in 0u64..256) {
            if let Ok(spans) = unpack_changes(&runs, &mask, bytes, len) {
                let mut dst = vec![0u8; len as usize];
                apply_changes(&spans, &mask, &vec![1u8; bytes], &mut dst);
            }
        }
    }
}
