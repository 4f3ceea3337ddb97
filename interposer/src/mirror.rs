//! The client's side of pinned-memory mirrors (`chidori_protocol::mirror`).
//!
//! When a kernel launch or a library call hands the GPU a pointer into the program's pinned
//! memory, the server's mirror of that range is brought up to date first (only the chunks
//! whose contents changed since the server last had them travel, sent without waiting).
//! After the GPU may have written a mirror, the next waiting call also asks for the bytes it
//! changed and writes them into the program's memory before returning: a program sees the
//! GPU's writes at the synchronization that would show them natively.
//!
//! [`Tracker`] is the bookkeeping (chunk hashes, what to send), free of connections and
//! FFI; the functions below it use it on the live connection.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use chidori_protocol::frame::{Header, Kind};
use chidori_protocol::messages::{self, Service, ServiceReply};
use chidori_protocol::mirror::in_arena;

use crate::conn::Conn;
use crate::state::{self, Memory};

/// Bytes per hashed chunk: a changed byte sends its chunk.
const CHUNK: usize = 256;

fn hash(bytes: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(bytes)
}

/// The chunk hashes of each mirrored range, as the server last had it.
#[derive(Default)]
pub struct Tracker {
    ranges: BTreeMap<u64, Vec<u64>>,
}

/// What one range needs sent: (offset, length) runs of whole changed chunks.
#[derive(Debug, PartialEq, Eq)]
pub struct Update {
    /// The server has no mirror of it yet.
    pub new: bool,
    pub runs: Vec<(u64, u64)>,
}

impl Tracker {
    /// Compare `bytes` (the range at `base`, as the program has it now) with what the
    /// server has, and record that the server will have them.
    pub fn update(&mut self, base: u64, bytes: &[u8]) -> Update {
        let chunks = bytes.len().div_ceil(CHUNK);
        let mut new = false;
        let hashes = self.ranges.entry(base).or_insert_with(|| {
            new = true;
            // A fresh mirror is zero-filled.
            bytes.chunks(CHUNK).map(|c| hash(&vec![0u8; c.len()])).collect()
        });
        if hashes.len() != chunks {
            // The program freed the range and allocated another of another size here.
            *hashes = bytes.chunks(CHUNK).map(|c| hash(&vec![0u8; c.len()])).collect();
            new = true;
        }
        let mut runs: Vec<(u64, u64)> = Vec::new();
        for (i, (chunk, known)) in bytes.chunks(CHUNK).zip(hashes.iter_mut()).enumerate() {
            let h = hash(chunk);
            if h == *known {
                continue;
            }
            *known = h;
            let offset = (i * CHUNK) as u64;
            match runs.last_mut() {
                Some((o, l)) if *o + *l == offset => *l += chunk.len() as u64,
                _ => runs.push((offset, chunk.len() as u64)),
            }
        }
        Update { new, runs }
    }

    /// The mirrored range `(base, length)` that holds all of `[addr, addr + len)`, if any;
    /// `range_len` gives the length the program's pinned range at a base has now.
    pub fn covering(&self, addr: u64, len: u64, range_len: impl Fn(u64) -> Option<u64>) -> Option<(u64, u64)> {
        let (&base, _) = self.ranges.range(..=addr).next_back()?;
        let total = range_len(base)?;
        (addr.checked_add(len)? <= base + total).then_some((base, total))
    }

    /// The server's bytes at `addr` were written into the mirrored range `(base, total)`:
    /// rehash the chunks they touch.
    pub fn landed(&mut self, (base, total): (u64, u64), addr: u64, len: u64) {
        let Some(hashes) = self.ranges.get_mut(&base) else { return };
        let first = ((addr - base) as usize) / CHUNK;
        let last = ((addr + len - base) as usize).div_ceil(CHUNK);
        for (i, known) in hashes.iter_mut().enumerate().take(last).skip(first) {
            let start = base + (i * CHUNK) as u64;
            let n = CHUNK.min((base + total - start) as usize);
            // SAFETY: the chunk lies inside the mirrored range, the program's pinned memory.
            let chunk = unsafe { std::slice::from_raw_parts(start as *const u8, n) };
            *known = hash(chunk);
        }
    }

    pub fn forget(&mut self, base: u64) -> bool {
        self.ranges.remove(&base).is_some()
    }

    pub fn bases(&self) -> Vec<u64> {
        self.ranges.keys().copied().collect()
    }
}

static TRACKER: Mutex<Option<Tracker>> = Mutex::new(None);
/// A launch or call handed the GPU a mirrored range since the last pull.
static PULL: AtomicBool = AtomicBool::new(false);
/// The program has pinned or managed memory outside the arena: memory it registered
/// (cudaHostRegister), `__managed__` variables (at their device addresses), allocations
/// made when the arena could not be reserved.
static OUTSIDE_ARENA: AtomicBool = AtomicBool::new(false);

pub fn note_outside_arena() {
    OUTSIDE_ARENA.store(true, Ordering::Relaxed);
}

/// A cheap first test: could `addr` be the program's pinned memory?
#[inline]
fn maybe_pinned(addr: u64) -> bool {
    in_arena(addr) || (OUTSIDE_ARENA.load(Ordering::Relaxed) && addr >= (64 << 10))
}

/// The pinned (or registered, or managed) range containing `addr`, if any.
fn pinned(addr: u64) -> Option<state::Range> {
    if !maybe_pinned(addr) {
        return None;
    }
    state::find(addr)
        .filter(|r| matches!(r.memory, Memory::Pinned { .. } | Memory::Registered { .. } | Memory::Managed))
}

/// [`pinned`]'s (base, length).
fn pinned_range(addr: u64) -> Option<(u64, u64)> {
    pinned(addr).map(|r| (r.base, r.len))
}

/// Whether `addr` lies in pinned memory the server mirrors.
pub fn is_mirrored(addr: u64) -> bool {
    let Some((base, _)) = pinned_range(addr) else { return false };
    TRACKER.lock().unwrap_or_else(|p| p.into_inner()).as_ref().is_some_and(|t| t.ranges.contains_key(&base))
}

/// Before the GPU is handed `addrs` (kernel parameters, a library's device pointers):
/// bring the mirror of every pinned range among them up to date, and, where the program
/// has managed memory, every managed range (the GPU may reach one through a pointer stored
/// in memory). Returns whether any was.
pub fn prepare(conn: &Conn, addrs: impl IntoIterator<Item = u64>) -> bool {
    prepare_with(conn, addrs, false)
}

/// [`prepare`] for a kernel launch: every managed range is brought up to date even when
/// the kernel takes no pointer (it may read one from device memory).
pub fn prepare_launch(conn: &Conn, addrs: impl IntoIterator<Item = u64>) -> bool {
    prepare_with(conn, addrs, true)
}

fn prepare_with(conn: &Conn, addrs: impl IntoIterator<Item = u64>, launch: bool) -> bool {
    let mut any = false;
    let mut handed = launch;
    let managed = state::managed_live();
    for addr in addrs {
        handed = true;
        let Some(range) = pinned(addr) else { continue };
        any = true;
        // Managed ranges are all brought up to date below.
        if !(managed && matches!(range.memory, Memory::Managed)) {
            push(conn, range.base, range.len);
        }
    }
    if handed {
        any |= prepare_managed(conn);
    }
    if any {
        PULL.store(true, Ordering::Release);
    }
    any
}

/// Bring every managed range's mirror up to date (before a launch of a graph, whose kernels
/// hold their pointers). Returns whether there was any.
pub fn prepare_managed(conn: &Conn) -> bool {
    let ranges = state::managed_ranges();
    for &(base, len) in &ranges {
        push(conn, base, len);
    }
    if !ranges.is_empty() {
        PULL.store(true, Ordering::Release);
    }
    !ranges.is_empty()
}

fn push(conn: &Conn, base: u64, len: u64) {
    // SAFETY: [base, base + len) is the program's pinned memory, recorded in the interval
    // map when it was allocated or registered.
    let bytes = unsafe { std::slice::from_raw_parts(base as *const u8, len as usize) };
    let mut tracker = TRACKER.lock().unwrap_or_else(|p| p.into_inner());
    let update = tracker.get_or_insert_with(Tracker::default).update(base, bytes);
    if !update.new && update.runs.is_empty() {
        return;
    }
    if update.new {
        crate::log::once("mirror", || {
            tracing::info!("the GPU reads pinned host memory directly: the server mirrors it (slower than a copy)")
        });
    }
    let parts: Vec<&[u8]> = update.runs.iter().map(|&(o, n)| &bytes[o as usize..(o + n) as usize]).collect();
    let request = Service::MirrorWrite { base, len, runs: update.runs };
    // Sent without waiting, in order before the call that needs it; a failure comes back
    // as the status of the next runtime call.
    let header = Header::new(Kind::Service, 0, crate::conn::thread_id(), conn.next_seq());
    let _ = conn.post(header, &messages::encode(&request), &parts);
    crate::trace::local("(pinned memory mirrored)");
}

/// After a waiting call: if the GPU may have written mirrored memory since the last pull,
/// fetch the bytes it changed into the program's memory.
pub fn pull(conn: &Conn) {
    if !PULL.load(Ordering::Acquire) {
        return;
    }
    let mut tracker = TRACKER.lock().unwrap_or_else(|p| p.into_inner());
    // Checked again under the lock: another thread may have pulled meanwhile.
    if !PULL.swap(false, Ordering::AcqRel) {
        return;
    }
    let Some(t) = tracker.as_mut() else { return };
    let bases = t.bases();
    let runs = match conn.service(&Service::MirrorPull { bases }, &[]) {
        Ok(ServiceReply::MirrorRuns { runs }) => runs,
        Ok(_) | Err(_) => return,
    };
    let range_len = |base: u64| pinned_range(base).filter(|(b, _)| *b == base).map(|(_, l)| l);
    for (addr, bytes) in runs {
        // Only bytes inside a range the program pinned and the client mirrors are written.
        let Some(range) = t.covering(addr, bytes.len() as u64, range_len) else {
            crate::log::once("mirror-outside", || {
                tracing::warn!("the server sent pinned-memory bytes outside any mirror")
            });
            continue;
        };
        // SAFETY: [addr, addr + len) lies inside the program's pinned range (checked above).
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), addr as *mut u8, bytes.len()) };
        t.landed(range, addr, bytes.len() as u64);
    }
}

/// The program frees or unregisters the range at `base`: the server's mirror goes too.
pub fn forget(base: u64) {
    let known = TRACKER.lock().unwrap_or_else(|p| p.into_inner()).as_mut().is_some_and(|t| t.forget(base));
    if !known {
        return;
    }
    if let Ok(conn) = crate::conn::get() {
        let header = Header::new(Kind::Service, 0, crate::conn::thread_id(), conn.next_seq());
        let _ = conn.post(header, &messages::encode(&Service::MirrorDrop { base }), &[]);
    }
}

/// Pages this process mapped for `__managed__` variables (variables of one module share
/// pages).
static VARIABLE_PAGES: Mutex<BTreeSet<u64>> = Mutex::new(BTreeSet::new());

/// A module's `__managed__` variable of `len` bytes at the device address `base`: the
/// program's copy lives at the same address here (kernels and the host share pointers to
/// it, as natively), as managed memory the server mirrors by the variable itself. Err: the
/// address is taken in this process.
pub fn managed_variable(base: u64, len: u64) -> Result<(), String> {
    if state::find(base).is_some_and(|r| r.base == base && r.len == len && matches!(r.memory, Memory::Managed)) {
        return Ok(());
    }
    let page = chidori_protocol::mirror::PAGE;
    let end = base.checked_add(len.max(1)).ok_or("a variable past the address space")?;
    let mut pages = VARIABLE_PAGES.lock().unwrap_or_else(|p| p.into_inner());
    let mut at = base / page * page;
    while at < end {
        if !pages.contains(&at) {
            let mapped = chidori_protocol::mirror::reserve(at, page)
                // SAFETY: the page was just reserved by this process and holds nothing.
                && unsafe { chidori_protocol::mirror::commit(at, page) };
            if !mapped {
                return Err(format!(
                    "the variable lives at {base:#x} on the server, where this process has memory of its own"
                ));
            }
            pages.insert(at);
        }
        at += page;
    }
    drop(pages);
    state::add(base, len, Memory::Managed);
    note_outside_arena();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_changed_chunks_travel_and_zeros_need_nothing() {
        let mut t = Tracker::default();
        let mut bytes = vec![0u8; 1000];
        // A fresh mirror is zero-filled: nothing to send, but it must be made.
        assert_eq!(t.update(0x1000, &bytes), Update { new: true, runs: vec![] });
        bytes[10] = 1;
        bytes[300] = 2;
        bytes[999] = 3;
        assert_eq!(t.update(0x1000, &bytes), Update { new: false, runs: vec![(0, 512), (768, 232)] });
        assert_eq!(t.update(0x1000, &bytes), Update { new: false, runs: vec![] });
        // The same base with another size is another range.
        let other = vec![5u8; 100];
        assert_eq!(t.update(0x1000, &other), Update { new: true, runs: vec![(0, 100)] });
    }

    #[test]
    fn bytes_outside_every_mirror_are_refused() {
        let mut t = Tracker::default();
        let mut bytes = vec![1u8; 512];
        let base = bytes.as_ptr() as u64;
        t.update(base, &bytes);
        let len = |b: u64| (b == base).then_some(512);
        assert_eq!(t.covering(base + 10, 20, len), Some((base, 512)));
        assert_eq!(t.covering(base + 500, 20, len), None, "past the end");
        assert_eq!(t.covering(base - 1, 1, len), None, "before the start");
        // Bytes that landed are what the server has: nothing to send back.
        bytes[300] = 9;
        t.landed((base, 512), base + 300, 1);
        assert_eq!(t.update(base, &bytes).runs, vec![]);
        assert!(t.forget(base));
        assert_eq!(t.covering(base, 1, len), None);
    }
}
