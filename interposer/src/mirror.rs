//! The client's side of pinned-memory mirrors (`chidori_protocol::mirror`).
//!
//! When a kernel launch or a library call hands the GPU a pointer into the program's pinned
//! memory, the server's mirror of that range is brought up to date first (only the chunks
//! whose contents changed since the server last had them travel, sent without waiting).
//! After the GPU may have written a mirror, the next waiting call also asks for the bytes it
//! changed and writes them into the program's memory before returning: a program sees the
//! GPU's writes at the synchronization that would show them natively.
//!
//! A graph replays on the server, so a copy node (made call by call or captured) whose one
//! side is the program's memory copies that memory's mirror instead ([`for_server`], which
//! cuBLASXt's host matrices use too): pinned
//! memory is mirrored as for kernels; pageable memory (a stack variable, a `malloc`ed buffer)
//! is mirrored by whole pages, a *stand-in*, named by a key rather than its address (the
//! server places it where it likes and gives the calls that name the program's address its
//! own; `chidori_protocol::mirror::STAND_IN_KEYS`). Every mirror is brought up to date before each
//! graph launch, and what the GPU wrote comes back at the next waiting call, or before a host
//! function of the program runs (the server sends it with the request to run it).
//!
//! [`Tracker`] is the bookkeeping (chunk hashes, what to send, stand-in pages), free of
//! connections and FFI; the functions below it use it on the live connection.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use chidori_protocol::messages::{MirrorChanges, Service, ServiceReply};
use chidori_protocol::mirror::{PUSH_BUDGET, PUSH_MAX_RUNS, STAND_IN_KEYS, in_arena, is_stand_in};

use crate::conn::Conn;
use crate::state::{self, Memory};

/// Bytes per hashed chunk: a changed byte sends its chunk.
const CHUNK: usize = 256;

fn hash(bytes: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(bytes)
}

/// Bytes from which hashing is shared among threads (a launch rehashes every mapped and
/// managed range, tens of MiB: one core reads memory far slower than several).
const SHARED_HASHING: usize = 8 << 20;

/// The hash of each `CHUNK` of `bytes`, in order; a large span on several threads (one
/// that cannot be started is hashed here).
fn hash_chunks(bytes: &[u8]) -> Vec<u64> {
    let serial = |b: &[u8]| b.chunks(CHUNK).map(hash).collect::<Vec<u64>>();
    if bytes.len() < SHARED_HASHING {
        return serial(bytes);
    }
    // Asked once: the answer reads the process's CPU set and cgroup quota.
    static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let cores = *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let threads = cores.min(8).min(bytes.len() / (SHARED_HASHING / 2));
    if threads < 2 {
        return serial(bytes);
    }
    let per = bytes.len().div_ceil(CHUNK).div_ceil(threads) * CHUNK;
    std::thread::scope(|scope| {
        let parts: Vec<_> = bytes
            .chunks(per)
            .map(|part| (part, std::thread::Builder::new().spawn_scoped(scope, move || serial(part)).ok()))
            .collect();
        let mut all = Vec::with_capacity(bytes.len().div_ceil(CHUNK));
        for (part, thread) in parts {
            match thread.map(|t| t.join()) {
                Some(Ok(hashes)) => all.extend(hashes),
                _ => all.extend(serial(part)),
            }
        }
        all
    })
}

/// The hashes of a fresh, zero-filled mirror of `len` bytes.
fn zero_hashes(len: usize) -> Vec<u64> {
    let whole = hash(&[0u8; CHUNK]);
    let mut hashes = vec![whole; len / CHUNK];
    if !len.is_multiple_of(CHUNK) {
        hashes.push(hash(&vec![0u8; len % CHUNK]));
    }
    hashes
}

/// The chunk hashes of each mirrored range, as the server last had it.
#[derive(Default)]
pub struct Tracker {
    /// By key: a pinned range's base address, or a stand-in's key.
    ranges: BTreeMap<u64, Vec<u64>>,
    /// Pages of pageable memory that graphs copy, mirrored like pinned memory, by key.
    stand_ins: BTreeMap<u64, StandIn>,
    /// Stand-in keys handed out.
    made: u64,
}

/// The program's pages `[client, client + len)`, mirrored under a key.
struct StandIn {
    client: u64,
    len: u64,
    /// Who may still use it ([`GRAPHS`], a library call, an info object): a stand-in goes
    /// when its last owner releases it ([`release`]).
    owners: BTreeSet<u64>,
}

/// A stand-in as [`Tracker::add_stand_in`] gives it: its key and the program's pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StandInPages {
    pub key: u64,
    pub client: u64,
    pub len: u64,
}

/// The owner of the stand-ins graph copies name: a graph may be replayed as long as the
/// program lives, so they are never released (the program's unmapping drops them).
pub const GRAPHS: u64 = 0;

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
        self.update_window(base, bytes, 0..bytes.len())
    }

    /// [`Tracker::update`] for the chunks that overlap `window` (offsets into the range)
    /// only: a copy reads or writes its own bytes, and the rest of a large range is not
    /// read. The other chunks keep what the server last had.
    pub fn update_window(&mut self, base: u64, bytes: &[u8], window: std::ops::Range<usize>) -> Update {
        let chunks = bytes.len().div_ceil(CHUNK);
        let mut new = false;
        let hashes = self.ranges.entry(base).or_insert_with(|| {
            new = true;
            // A fresh mirror is zero-filled.
            zero_hashes(bytes.len())
        });
        if hashes.len() != chunks {
            // The program freed the range and allocated another of another size here.
            *hashes = zero_hashes(bytes.len());
            new = true;
        }
        let mut runs: Vec<(u64, u64)> = Vec::new();
        let first = window.start.min(bytes.len()) / CHUNK;
        let last = window.end.min(bytes.len()).div_ceil(CHUNK);
        let now = hash_chunks(&bytes[first * CHUNK..(last * CHUNK).min(bytes.len())]);
        for ((i, known), h) in hashes.iter_mut().enumerate().take(last).skip(first).zip(now) {
            if h == *known {
                continue;
            }
            *known = h;
            let offset = (i * CHUNK) as u64;
            let len = CHUNK.min(bytes.len() - i * CHUNK) as u64;
            match runs.last_mut() {
                Some((o, l)) if *o + *l == offset => *l += len,
                _ => runs.push((offset, len)),
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

    /// The server's bytes of `runs` (offsets from `base`) were written into the mirrored
    /// range `(base, total)` of the program's memory, mirrored under `key` (`base` itself
    /// but for stand-ins): rehash the chunks they touch, each once.
    pub fn landed(&mut self, key: u64, (base, total): (u64, u64), runs: &[(u64, u64)]) {
        let Some(hashes) = self.ranges.get_mut(&key) else { return };
        let mut next = 0usize;
        for &(offset, len) in runs {
            let first = (offset as usize / CHUNK).max(next);
            let last = ((offset + len) as usize).div_ceil(CHUNK).min(hashes.len());
            for (i, known) in hashes.iter_mut().enumerate().take(last).skip(first) {
                let start = base + (i * CHUNK) as u64;
                let n = CHUNK.min((base + total - start) as usize);
                // SAFETY: the chunk lies inside the mirrored range, the program's pinned
                // memory, or a stand-in's page the bytes were just written into (chunks
                // start at the page-aligned base and never cross a page).
                let chunk = unsafe { std::slice::from_raw_parts(start as *const u8, n) };
                *known = hash(chunk);
            }
            next = next.max(last);
        }
    }

    pub fn forget(&mut self, key: u64) -> bool {
        self.stand_ins.remove(&key);
        self.ranges.remove(&key).is_some()
    }

    /// The program's pages of the stand-in `key`, as (address, length).
    pub fn stand_in(&self, key: u64) -> Option<(u64, u64)> {
        self.stand_ins.get(&key).map(|s| (s.client, s.len))
    }

    /// The newest stand-in holding all of `[lo, hi)` (the one the server gives calls that
    /// name those bytes).
    fn holding(&self, lo: u64, hi: u64) -> Option<u64> {
        self.stand_ins.iter().rev().find(|(_, s)| s.client <= lo && hi <= s.client + s.len).map(|(&k, _)| k)
    }

    /// The stand-in that holds `[addr, addr + len)`, claimed by `owner`: the newest that
    /// holds its pages, else a new one over those pages and every stand-in they overlap.
    /// The stand-ins overlapped stay as they are (a graph node may name one: its server
    /// registration is never replaced); calls from now on name the new one, which the
    /// server brings up to date with them before every launch. None: not user memory.
    pub fn add_stand_in(&mut self, addr: u64, len: u64, owner: u64) -> Option<StandInPages> {
        let (mut lo, n) = chidori_protocol::mirror::pages(addr, len.max(1))?;
        let mut hi = lo + n;
        if let Some(key) = self.holding(lo, hi) {
            let s = self.stand_ins.get_mut(&key)?;
            s.owners.insert(owner);
            return Some(StandInPages { key, client: s.client, len: s.len });
        }
        let (first, end) = (lo, hi);
        for s in self.stand_ins.values().filter(|s| s.client < end && first < s.client + s.len) {
            lo = lo.min(s.client);
            hi = hi.max(s.client + s.len);
        }
        let key = STAND_IN_KEYS + self.made;
        self.made += 1;
        self.stand_ins.insert(key, StandIn { client: lo, len: hi - lo, owners: BTreeSet::from([owner]) });
        Some(StandInPages { key, client: lo, len: hi - lo })
    }

    /// `owner` no longer uses its stand-ins: those no other owner holds, to drop.
    pub fn release(&mut self, owner: u64) -> Vec<u64> {
        let mut gone = Vec::new();
        for (&key, s) in self.stand_ins.iter_mut() {
            if s.owners.remove(&owner) && s.owners.is_empty() {
                gone.push(key);
            }
        }
        gone
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
/// The server has mirrored some of the program's memory (a cheap test on every call: a
/// graph launch brings mirrors up to date only then).
static MIRRORED: AtomicBool = AtomicBool::new(false);

/// Whether the server may mirror any of the program's memory (pinned, stand-in or managed).
#[inline]
pub fn active() -> bool {
    MIRRORED.load(Ordering::Relaxed) || state::reachable_live()
}

/// Whether the GPU may have written mirrored memory since the last pull (a cheap test
/// before deciding whether a call's return is a time to pull).
#[inline]
pub fn pending() -> bool {
    PULL.load(Ordering::Relaxed)
}

fn tracker() -> std::sync::MutexGuard<'static, Option<Tracker>> {
    TRACKER.lock().unwrap_or_else(|p| p.into_inner())
}

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

/// Whether `addr` lies in pinned (registered, managed) memory the server mirrors: copies
/// of it on a stream go through the mirror. A stand-in is not: outside the graphs that
/// copy it, pageable memory is copied the plain way (the program's bytes are the truth, and
/// the stand-in catches up at its next push).
pub fn is_mirrored(addr: u64) -> bool {
    let Some(r) = pinned(addr) else { return false };
    tracker().as_ref().is_some_and(|t| t.ranges.contains_key(&r.base))
}

/// What the GPU may reach from a call's pointers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Reach {
    /// The bytes the call names and nothing else (a copy, a memset: the runtime's and the
    /// driver's own calls).
    Named,
    /// Also memory a pointer stored in memory leads to (a library's kernels, given an array
    /// of pointers): every managed or mapped range ([`Memory::reachable`]), where the call
    /// hands the GPU any pointer.
    #[default]
    Stored,
    /// As `Stored`, even with no pointer handed (a kernel may read one from device memory).
    Launch,
}

/// Before the GPU is handed `addrs` (kernel parameters, a library's or the runtime's device
/// pointers, each with the length the call reads or writes where known): bring the mirror
/// of every pinned range among them up to date (only the window, where a length is given),
/// and the reachable ranges as `reach` says. Returns whether any was.
pub fn prepare(conn: &Conn, addrs: impl IntoIterator<Item = (u64, Option<u64>)>, reach: Reach) -> bool {
    let mut any = false;
    let mut handed = reach == Reach::Launch;
    for (addr, len) in addrs {
        handed = true;
        let Some(range) = pinned(addr) else { continue };
        any = true;
        if reach != Reach::Named && range.memory.reachable() {
            // Brought up to date whole below.
            continue;
        }
        match len {
            Some(n) => {
                let from = (addr - range.base) as usize;
                let to = from.saturating_add(usize::try_from(n).unwrap_or(usize::MAX));
                push_window(conn, range.base, range.len, from..to)
            }
            None => push(conn, range.base, range.len),
        };
    }
    if handed && reach != Reach::Named {
        any |= prepare_reachable(conn);
    }
    if any {
        PULL.store(true, Ordering::Release);
    }
    any
}

/// [`prepare`] for a kernel launch with pointer parameters `addrs`.
pub fn prepare_launch(conn: &Conn, addrs: impl IntoIterator<Item = u64>) -> bool {
    prepare(conn, addrs.into_iter().map(|a| (a, None)), Reach::Launch)
}

/// Before a call that waits for the GPU (or asks whether it is done) while the GPU may use
/// mirrored memory: send what the program changed in the pinned, registered and managed
/// memory the server mirrors. Natively the GPU sees such a write at once; a kernel that
/// spins until the program sets a flag there would otherwise never end. Stand-ins wait for
/// the next graph launch (only a graph's copies read them).
pub fn before_wait(conn: &Conn) {
    if !pending() {
        return;
    }
    let bases = match tracker().as_ref() {
        Some(t) => t.bases(),
        None => return,
    };
    for key in bases.into_iter().filter(|&key| !is_stand_in(key)) {
        if let Some(r) = pinned(key).filter(|r| r.base == key) {
            push(conn, r.base, r.len);
        }
    }
}

/// The program's pages of the stand-in `key`.
fn stand_in_of(key: u64) -> Option<(u64, u64)> {
    tracker().as_ref().and_then(|t| t.stand_in(key))
}

/// Bring the mirror of every range the GPU may reach through a stored pointer (managed
/// memory, mapped host memory) up to date: before a launch, of a kernel or of a graph
/// whose kernels hold their pointers. Returns whether there was any.
pub fn prepare_reachable(conn: &Conn) -> bool {
    let ranges = state::reachable_ranges();
    for &(base, len) in &ranges {
        push(conn, base, len);
    }
    if !ranges.is_empty() {
        PULL.store(true, Ordering::Release);
    }
    !ranges.is_empty()
}

/// Before a graph launch: every mirror is brought up to date (the graph's copy and kernel
/// nodes name mirrored memory, and replay reads it as it is now), and the GPU may write them.
pub fn prepare_graph(conn: &Conn) {
    let bases = match tracker().as_ref() {
        Some(t) if !t.ranges.is_empty() => t.bases(),
        _ => Vec::new(),
    };
    for &key in &bases {
        if is_stand_in(key) {
            if let Some((_, len)) = stand_in_of(key) {
                push(conn, key, len);
            }
        } else if let Some(r) = pinned(key).filter(|r| r.base == key) {
            push(conn, r.base, r.len);
        }
    }
    if !bases.is_empty() {
        PULL.store(true, Ordering::Release);
    }
    if state::reachable_live() {
        prepare_reachable(conn);
    }
}

/// A graph's copy (a node, or a copy on a capturing stream) has one side in the program's
/// memory at `[addr, addr + len)`, or a library reads and writes the program's host memory
/// itself ([`around_library_call`]): make that memory one the server mirrors, with its
/// contents now, so calls can name it by its address (the server gives the library its
/// mirror's, which is the same address but for stand-ins). Pinned, registered and managed
/// memory is mirrored whole (until the program frees it); other memory by the pages that
/// hold it, a stand-in claimed by `owner` ([`GRAPHS`] for a graph's). What the server writes
/// there comes back at the next [`pull`].
pub fn for_server(conn: &Conn, addr: u64, len: u64, owner: u64) -> Result<(), String> {
    if let Some(r) = pinned(addr) {
        if addr.checked_add(len).is_none_or(|end| end > r.base + r.len) {
            return Err(format!("{len} bytes at {addr:#x} run past the program's pinned range at {:#x}", r.base));
        }
        push(conn, r.base, r.len);
        PULL.store(true, Ordering::Release);
        return Ok(());
    }
    let added = tracker().get_or_insert_with(Tracker::default).add_stand_in(addr, len, owner);
    let Some(StandInPages { key, len, .. }) = added else {
        return Err(format!("{len} bytes at {addr:#x} are not memory of this program"));
    };
    if !push(conn, key, len) {
        return Err(format!("the program's memory at {addr:#x} cannot be read"));
    }
    PULL.store(true, Ordering::Release);
    Ok(())
}

/// Owners of library calls' stand-ins made per call (above every handle value, which is an
/// info object's owner id).
static CALL_OWNERS: AtomicU64 = AtomicU64::new(1 << 63);

/// A fresh owner for the stand-ins of one library call.
pub fn call_owner() -> u64 {
    CALL_OWNERS.fetch_add(1, Ordering::Relaxed)
}

/// A library call `name` that reads and writes the program's host arrays itself (cuBLASXt's
/// matrices, cuSOLVER's low-level CPU path): every `(address, bytes)` of `arrays` becomes
/// memory the server mirrors, claimed by `owner`; `call` runs (it waits);
/// what the library wrote there comes back before this returns. An array that is not the
/// program's memory (a device address the client did not see allocated) passes as it is:
/// the server checks it as device memory.
pub fn around_library_call(name: &str, owner: u64, arrays: &[(u64, u64)], call: impl FnOnce() -> u64) -> u64 {
    let conn = crate::conn::get().ok();
    let mut mirrored = false;
    if let Some(conn) = &conn {
        for &(addr, bytes) in arrays.iter().filter(|&&(a, b)| a != 0 && b != 0 && !state::is_device(a)) {
            match for_server(conn, addr, bytes, owner) {
                Ok(()) => mirrored = true,
                Err(why) => tracing::debug!("{name}: {addr:#x} stays as it is: {why}"),
            }
        }
    }
    let status = call();
    if let (true, Some(conn)) = (mirrored, &conn) {
        pull(conn);
    }
    status
}

/// `owner` no longer uses its memory (a library call returned and keeps no pointer, an info
/// object was destroyed): the stand-ins no other owner holds go, so a program that hands a
/// library fresh buffers does not fill the server.
pub fn release(owner: u64) {
    let gone = tracker().as_mut().map(|t| t.release(owner)).unwrap_or_default();
    for base in gone {
        forget(base);
    }
}

/// Send the server what changed in the mirror `base` of `len` bytes (a pinned range at that
/// address, or a stand-in's key); false when a stand-in's pages are gone (the stand-in is
/// dropped).
fn push(conn: &Conn, base: u64, len: u64) -> bool {
    push_window(conn, base, len, 0..len as usize)
}

/// [`push`] for the chunks of the range that overlap `window` (offsets into it).
fn push_window(conn: &Conn, base: u64, len: u64, window: std::ops::Range<usize>) -> bool {
    let mut client = 0;
    let copy;
    let bytes: &[u8] = if is_stand_in(base) {
        // The program may have unmapped a stand-in's pages since: read through the kernel.
        let mut b = vec![0u8; len as usize];
        match stand_in_of(base) {
            Some((at, _)) if chidori_protocol::mirror::read_own(at, &mut b) => client = at,
            _ => {
                forget(base);
                return false;
            }
        }
        copy = b;
        &copy
    } else {
        // SAFETY: [base, base + len) is the program's pinned memory, recorded in the
        // interval map when it was allocated or registered.
        unsafe { std::slice::from_raw_parts(base as *const u8, len as usize) }
    };
    let mut tracker = tracker();
    let update = tracker.get_or_insert_with(Tracker::default).update_window(base, bytes, window);
    if !update.new && update.runs.is_empty() {
        return true;
    }
    if update.new {
        MIRRORED.store(true, Ordering::Relaxed);
        crate::log::once("mirror", || {
            tracing::info!("the GPU reads pinned host memory directly: the server mirrors it (slower than a copy)")
        });
    }
    // Sent without waiting, in order before the call that needs it, in frames of bounded
    // size; a failure comes back as the status of the next runtime call.
    for runs in chidori_protocol::mirror::batches(&update.runs, PUSH_BUDGET, PUSH_MAX_RUNS) {
        let parts: Vec<&[u8]> = runs.iter().map(|&(o, n)| &bytes[o as usize..(o + n) as usize]).collect();
        let _ = conn.post_service(&Service::MirrorWrite { base, len, runs, client }, &parts);
    }
    crate::trace::local("(pinned memory mirrored)");
    true
}

/// After a waiting call: if the GPU may have written mirrored memory since the last pull,
/// fetch the bytes it changed into the program's memory (in several pulls when more
/// changed than one answer carries).
pub fn pull(conn: &Conn) {
    if !PULL.load(Ordering::Acquire) {
        return;
    }
    let mut bases = {
        let tracker = tracker();
        // Checked again under the lock: another thread may have pulled meanwhile.
        if !PULL.swap(false, Ordering::AcqRel) {
            return;
        }
        match tracker.as_ref() {
            Some(t) => t.bases(),
            None => return,
        }
    };
    let ask = |bases: &[u64], from: u64| conn.ask_now(&Service::MirrorPull { bases: bases.to_vec(), from }).ok();
    let mut from = 0;
    let mut asked = ask(&bases, from);
    while let Some(answer) = asked.take() {
        let Ok(ServiceReply::MirrorRuns { changes, next }) = answer.answer() else { return };
        // The next page is asked for before this one is written here: the server reads and
        // encodes it meanwhile.
        if let Some((base, offset)) = next {
            // The next pull starts further on; a server that names a point behind this one
            // is not followed (it would never end).
            match bases.iter().position(|&b| b == base) {
                Some(0) if offset > from => from = offset,
                Some(i) if i > 0 => {
                    bases.drain(..i);
                    from = offset;
                }
                _ => {
                    tracing::warn!(
                        "the server's pinned-memory pull named no later point ({base:#x}+{offset}); stopped"
                    );
                    land(changes);
                    return;
                }
            }
            asked = ask(&bases, from);
        }
        land(changes);
    }
}

/// Write what the server's mirrors say the GPU changed into the program's memory (a pull's
/// answer, or what came with a request to run a host function).
pub fn land(changes: Vec<MirrorChanges>) {
    if changes.is_empty() {
        return;
    }
    let mut tracker = tracker();
    let Some(t) = tracker.as_mut() else { return };
    for change in changes {
        let key = change.base;
        let stand_in = t.stand_in(key).filter(|_| is_stand_in(key));
        // Only bytes inside a range the program pinned (or a graph copies) and the client
        // mirrors are written.
        let range = match stand_in {
            Some(pages) => t.ranges.contains_key(&key).then_some(pages),
            None => t.covering(key, 1, |b| pinned(b).filter(|r| r.base == b).map(|r| r.len)).filter(|&(b, _)| b == key),
        };
        let base = range.map_or(0, |(b, _)| b);
        let spans = range.ok_or_else(|| "outside any mirror".to_owned()).and_then(|(_, total)| {
            chidori_protocol::mirror::unpack_changes(&change.runs, &change.mask, change.bytes.len(), total)
        });
        let (range, spans) = match (range, spans) {
            (Some(range), Ok(spans)) => (range, spans),
            (_, Err(e)) => {
                crate::log::once("mirror-outside", || {
                    tracing::warn!("the server sent pinned-memory bytes the client cannot place: {e}")
                });
                continue;
            }
            (None, Ok(_)) => continue,
        };
        for (span, bits, data) in chidori_protocol::mirror::span_parts(&spans, &change.mask, &change.bytes) {
            if stand_in.is_some() {
                // Pages the program may have unmapped since: written through the kernel, a
                // span at a time (a masked span's other bytes as they are now).
                let mut whole = vec![0u8; span.len as usize];
                if span.masked && !chidori_protocol::mirror::read_own(base + span.offset, &mut whole) {
                    continue;
                }
                // SAFETY: `whole` holds the span's bytes.
                unsafe { chidori_protocol::mirror::write_span(span, bits, data, whole.as_mut_ptr()) };
                chidori_protocol::mirror::write_own(base + span.offset, &whole);
            } else {
                // SAFETY: the span lies inside the program's pinned range (unpack_changes
                // checked each span against the range's length).
                unsafe { chidori_protocol::mirror::write_span(span, bits, data, (base + span.offset) as *mut u8) };
            }
        }
        let runs: Vec<(u64, u64)> = spans.iter().map(|s| (s.offset, s.len)).collect();
        t.landed(key, range, &runs);
    }
}

/// The program frees or unregisters the range at `base` (or a stand-in's pages are gone):
/// the server's mirror goes too.
pub fn forget(base: u64) {
    let known = tracker().as_mut().is_some_and(|t| t.forget(base));
    if !known {
        return;
    }
    if let Ok(conn) = crate::conn::get() {
        post_drop(&conn, base);
    }
}

fn post_drop(conn: &Conn, base: u64) {
    let _ = conn.post_service(&Service::MirrorDrop { base }, &[]);
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
    fn hashing_shared_among_threads_gives_the_serial_hashes() {
        let bytes: Vec<u8> = (0..SHARED_HASHING * 2 + 1000).map(|i| (i * 31 + i / 7) as u8).collect();
        let serial: Vec<u64> = bytes.chunks(CHUNK).map(hash).collect();
        assert_eq!(hash_chunks(&bytes), serial);
        assert_eq!(
            hash_chunks(&bytes[..CHUNK + 3]),
            serial[..1].iter().copied().chain([hash(&bytes[CHUNK..CHUNK + 3])]).collect::<Vec<_>>()
        );
        assert_eq!(zero_hashes(2 * CHUNK + 5), vec![hash(&[0; CHUNK]), hash(&[0; CHUNK]), hash(&[0; 5])]);
    }

    #[test]
    fn a_window_sends_its_own_chunks_and_leaves_the_rest_for_later() {
        let mut t = Tracker::default();
        let mut bytes = vec![0u8; 4 * CHUNK];
        bytes[10] = 1;
        bytes[CHUNK + 5] = 2;
        bytes[3 * CHUNK] = 3;
        // A copy of the second chunk's bytes, ending inside the third: chunks 1 and 2 are
        // looked at, and only the changed one travels.
        let window = CHUNK + 1..2 * CHUNK + 7;
        assert_eq!(
            t.update_window(0x1000, &bytes, window.clone()),
            Update { new: true, runs: vec![(CHUNK as u64, CHUNK as u64)] }
        );
        assert_eq!(t.update_window(0x1000, &bytes, window), Update { new: false, runs: vec![] });
        // The chunks outside it still count as the server's zeros: the next whole update
        // sends them.
        let whole = t.update(0x1000, &bytes);
        assert_eq!(whole.runs, vec![(0, CHUNK as u64), (3 * CHUNK as u64, CHUNK as u64)]);
        // A window past the end is cut to the range.
        bytes[4 * CHUNK - 1] = 9;
        let past = t.update_window(0x1000, &bytes, 3 * CHUNK..usize::MAX);
        assert_eq!(past.runs, vec![(3 * CHUNK as u64, CHUNK as u64)]);
    }

    #[test]
    fn stand_ins_are_whole_pages_and_overlap_rather_than_replace() {
        let mut t = Tracker::default();
        let page = chidori_protocol::mirror::PAGE;
        let base = 0x10_0000;
        let pages = |key: u64, client: u64, len: u64| Some(StandInPages { key, client, len });
        let k = STAND_IN_KEYS;
        // A stack variable: its page, under a key.
        assert_eq!(t.add_stand_in(base + 100, 8, GRAPHS), pages(k, base, page));
        assert_eq!(t.stand_in(k), Some((base, page)));
        // Inside it: the same stand-in.
        assert_eq!(t.add_stand_in(base + 200, 16, GRAPHS), pages(k, base, page));
        // Across its end: a new one over both pages; the first stays (a graph node may name
        // it), and bytes inside both are given the newest from now on.
        assert_eq!(t.add_stand_in(base + page - 4, 8, GRAPHS), pages(k + 1, base, 2 * page));
        assert_eq!(t.stand_in(k), Some((base, page)));
        assert_eq!(t.add_stand_in(base + 10, 8, GRAPHS), pages(k + 1, base, 2 * page));
        // Apart: a stand-in of its own; a range overlapping several covers them all.
        assert_eq!(t.add_stand_in(base + 4 * page, 8, GRAPHS), pages(k + 2, base + 4 * page, page));
        assert_eq!(t.add_stand_in(base + page, 3 * page + 1, GRAPHS), pages(k + 3, base, 5 * page));
        // No user memory.
        assert_eq!(t.add_stand_in(0x10, 8, GRAPHS), None);
        // Forgotten (its pages gone): the next newest holds them.
        t.forget(k + 3);
        assert_eq!(t.stand_in(k + 3), None);
        assert_eq!(t.add_stand_in(base + 10, 8, GRAPHS), pages(k + 1, base, 2 * page));
    }

    #[test]
    fn a_library_call_drops_only_the_stand_ins_it_made() {
        let mut t = Tracker::default();
        let page = chidori_protocol::mirror::PAGE;
        let base = 0x20_0000;
        // A graph's stand-in before the call.
        t.add_stand_in(base, 8, GRAPHS);
        // The call's arrays: one far away, one across the graph's: both the call's own.
        let call = 1 << 62;
        let far = t.add_stand_in(base + 10 * page, 3 * page, call).unwrap().key;
        let across = t.add_stand_in(base + page - 8, 2 * page, call).unwrap().key;
        // One inside the graph's: shared.
        t.add_stand_in(base + 8, 8, call);
        assert_eq!(t.release(call), vec![far, across]);
    }

    #[test]
    fn a_stand_in_goes_when_no_owner_uses_it() {
        let mut t = Tracker::default();
        let (matrix, workspace) = (0x40_0000, 0x80_0000);
        // Two info objects share the matrix's stand-in; the workspace is one's.
        let m = t.add_stand_in(matrix, 8, 1).unwrap().key;
        t.add_stand_in(matrix, 8, 2);
        let w = t.add_stand_in(workspace, 8, 1).unwrap().key;
        assert_eq!(t.release(1), vec![w]);
        t.forget(w);
        assert_eq!(t.release(2), vec![m]);
        t.forget(m);
        assert_eq!(t.release(3), Vec::<u64>::new());
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
        t.landed(base, (base, 512), &[(300, 1)]);
        assert_eq!(t.update(base, &bytes).runs, vec![]);
        // Only the chunks a run touched are rehashed: the program's own change to another
        // chunk still travels.
        bytes[10] = 7;
        bytes[400] = 8;
        t.landed(base, (base, 512), &[(400, 1)]);
        assert_eq!(t.update(base, &bytes).runs, vec![(0, 256)]);
        assert!(t.forget(base));
        assert_eq!(t.covering(base, 1, len), None);
    }
}
