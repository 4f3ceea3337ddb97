//! The session's typed handle tables. A handle the client sees is never the server's own
//! value (a library's pointer would tell the client where the worker's heap lies): it is a
//! name, either one the client chose itself (handles it creates without waiting) or an id
//! the worker gave when the library handed the handle out. Every handle a call passes in is
//! looked up by its kind: a wrong, stale or foreign value is an error reply, never a
//! dereference.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use chidori_cuda::handles::{ACCEPTS, KINDS};
use chidori_protocol::desc::{HANDLE_TAG_MASK as TAG_MASK, HandleKind};

/// The tag in the top 16 bits of every id the worker gives. The client's own names carry
/// another (`CLIENT_NAME_TAG`), and a user-space pointer has none.
pub use chidori_protocol::desc::WORKER_ID_TAG as ID_TAG;

pub struct Handles {
    /// (kind, the client's value) → the library's handle.
    names: HashMap<(HandleKind, u64), u64>,
    /// (kind, the library's handle) → the client's value for it, so that a handle the
    /// library hands out again (the current context, a node of a capture) keeps its name.
    values: HashMap<(HandleKind, u64), u64>,
    /// Handles named off the executors (the next id's counter is there too).
    landing: Arc<Landing>,
    stream_kind: Option<HandleKind>,
    /// Handles named before the library was asked for them: (kind, the client's value) →
    /// what finds them. A module's kernels become functions when first used, as a
    /// program's own lazy module loading makes them (loading every kernel of a library
    /// up front took most of a module load's time).
    pending: HashMap<(HandleKind, u64), Pending>,
    /// Finds a pending handle: the library's handle, or (status, message).
    finder: Option<Finder>,
    /// (kind, the library's handle) → references taken beyond the first by a retaining call
    /// (`cuMemRetainAllocationHandle` hands out the handle it was made as, one reference
    /// more): as many releases as references leave the name in place; the last takes it.
    references: HashMap<(HandleKind, u64), u32>,
}

/// A handle the library has not been asked for yet: a kernel of a loaded library, and the
/// context its function is to be found in (the one the library was loaded in).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Pending {
    pub kernel: u64,
    pub context: u64,
}

/// Handles named where the table's lock may not be taken: a module loaded on the session's
/// loader thread names its library, module and kernels here, and the table takes them in
/// when it next looks a handle up. The loader never takes the table's lock, since an
/// executor holds it while it waits for a load: a call that passes a name the client gave
/// a module load (`Service::LoadModuleNamed`) before the load is done waits for it
/// ([`Landing::expect`]); one whose load failed gets the load's status.
#[derive(Default)]
pub struct Landing {
    state: Mutex<Arrivals>,
    landed: Condvar,
    /// Whether `state.arrived` holds anything (read without the lock on every lookup).
    news: AtomicBool,
    /// The next id's counter (ids are unique across kinds).
    next: AtomicU64,
}

#[derive(Default)]
struct Arrivals {
    arrived: Vec<(HandleKind, u64, Entry)>,
    /// Names whose load is not done.
    awaited: HashSet<u64>,
    /// Names whose load failed: the status and message every call passing one gets.
    failed: HashMap<u64, (i64, String)>,
}

/// What a name landing stands for.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Entry {
    Real(u64),
    Pending(Pending),
}

/// How long a call waits for the load of a name it passes (a load whose image is asked of
/// the client takes that transfer's time too).
const LOAD_WAIT: Duration = Duration::from_secs(300);

impl Landing {
    /// A new id of the worker's (what [`Handles::insert`] gives).
    pub fn next_id(&self) -> u64 {
        ID_TAG | (self.next.fetch_add(1, Ordering::Relaxed) & !TAG_MASK)
    }

    /// Calls passing any of `names` wait until [`Landing::arrive`] names them.
    pub fn expect(&self, names: &[u64]) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.awaited.extend(names.iter().copied());
    }

    /// Names land: `entries` are handles from now on, `failed` names get their status and
    /// message; calls waiting for any of `done` go on.
    pub fn arrive(&self, entries: Vec<(HandleKind, u64, Entry)>, failed: Vec<(u64, (i64, String))>, done: &[u64]) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.arrived.extend(entries);
        state.failed.extend(failed);
        for name in done {
            state.awaited.remove(name);
        }
        self.news.store(true, Ordering::Release);
        drop(state);
        self.landed.notify_all();
    }

    /// Whether a module load is to give `name`, or failed to.
    fn claims(&self, name: u64) -> bool {
        let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.awaited.contains(&name) || state.failed.contains_key(&name)
    }

    /// Wait until `name`'s load is done. False: it was never awaited, or the wait ran out.
    fn wait_for(&self, name: u64) -> bool {
        let deadline = Instant::now() + LOAD_WAIT;
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if !state.awaited.contains(&name) {
            return false;
        }
        while state.awaited.contains(&name) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            state = self.landed.wait_timeout(state, left).unwrap_or_else(|p| p.into_inner()).0;
        }
        true
    }

    fn failure(&self, name: u64) -> Option<(i64, String)> {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).failed.get(&name).cloned()
    }
}

/// What a pending handle without a finder is answered with.
const NOT_FOUND: i64 = chidori_cuda::consts::cudaError_enum::CUDA_ERROR_NOT_FOUND as i64;

/// What finds a pending handle (the backend's function of a kernel in a context).
pub type Finder = Arc<dyn Fn(Pending) -> Result<u64, (i64, String)> + Send + Sync>;

impl Default for Handles {
    fn default() -> Self {
        Self::new()
    }
}

impl Handles {
    pub fn new() -> Handles {
        let stream_kind = KINDS.iter().position(|k| *k == "CUstream_st").map(|i| i as HandleKind);
        let landing = Landing::default();
        landing.next.store(1, Ordering::Relaxed);
        Handles {
            names: HashMap::new(),
            values: HashMap::new(),
            landing: Arc::new(landing),
            stream_kind,
            pending: HashMap::new(),
            finder: None,
            references: HashMap::new(),
        }
    }

    /// Tables whose pending handles `finder` finds.
    pub fn with_finder(finder: Finder) -> Handles {
        Handles { finder: Some(finder), ..Handles::new() }
    }

    /// Where names made off the executors land (see [`Landing`]).
    pub fn landing(&self) -> Arc<Landing> {
        self.landing.clone()
    }

    /// Take in the names that landed.
    fn land(&mut self) {
        if !self.landing.news.load(Ordering::Acquire) {
            return;
        }
        let arrived = {
            let mut state = self.landing.state.lock().unwrap_or_else(|p| p.into_inner());
            self.landing.news.store(false, Ordering::Release);
            std::mem::take(&mut state.arrived)
        };
        for (kind, name, entry) in arrived {
            match entry {
                Entry::Real(real) => {
                    self.names.insert((kind, name), real);
                    if real != 0 {
                        self.values.entry((kind, real)).or_insert(name);
                    }
                }
                Entry::Pending(p) => {
                    self.pending.insert((kind, name), p);
                }
            }
        }
    }

    /// Name `name` as what `value` (a handle of `kind` of this session) stands for: the
    /// same library handle, or the same pending one. False: `value` is neither.
    pub fn alias(&mut self, kind: HandleKind, name: u64, value: u64) -> bool {
        self.land();
        if let Some(&real) = self.names.get(&(kind, value)) {
            self.names.insert((kind, name), real);
            return true;
        }
        if let Some(&p) = self.pending.get(&(kind, value)) {
            self.pending.insert((kind, name), p);
            return true;
        }
        false
    }
    /// Values that stand for themselves: NULL (the library decides what it means: "default"
    /// for some handles, an error it reports for others) and the stream sentinels
    /// cudaStreamLegacy (1) and cudaStreamPerThread (2).
    fn is_literal(&self, kind: HandleKind, value: u64) -> bool {
        (value == 0 && !chidori_cuda::handles::NEVER_NULL.contains(&kind))
            || (Some(kind) == self.stream_kind && (value == 1 || value == 2))
    }

    /// Whether `value` may be passed as a handle of `kind`.
    pub fn check(&mut self, kind: HandleKind, value: u64) -> bool {
        self.resolve(kind, value).is_some()
    }

    /// Whether `value` names a live handle of `kind` itself (not of a kind it accepts),
    /// found or pending.
    pub fn owns(&mut self, kind: HandleKind, value: u64) -> bool {
        self.land();
        self.names.contains_key(&(kind, value)) || self.pending.contains_key(&(kind, value))
    }

    /// The library's handle for `value` passed as a `kind`: a handle of the kind, or of a
    /// kind it accepts, or a literal; a pending one is found now. None: not a handle of
    /// this session, or one the library could not find (see [`Handles::find`]).
    /// A name whose module load is not done yet is waited for here.
    pub fn resolve(&mut self, kind: HandleKind, value: u64) -> Option<u64> {
        if self.is_literal(kind, value) {
            return Some(value);
        }
        self.land();
        if let Some(real) = self.resolve_now(kind, value) {
            return Some(real);
        }
        if self.landing.wait_for(value) {
            self.land();
            return self.resolve_now(kind, value);
        }
        None
    }

    fn resolve_now(&mut self, kind: HandleKind, value: u64) -> Option<u64> {
        let kinds = std::iter::once(kind).chain(ACCEPTS.iter().filter(|&&(k, _)| k == kind).map(|&(_, other)| other));
        for k in kinds {
            if let Some(real) = self.names.get(&(k, value)) {
                return Some(*real);
            }
            if let Ok(Some(real)) = self.find(k, value) {
                return Some(real);
            }
        }
        None
    }

    /// Find `value` of `kind` if it is pending: Ok(Some(the library's handle)), kept from
    /// now on; Ok(None): not pending; Err: the library's status and message (it stays
    /// pending, to be tried again).
    /// A name whose module load failed: Err with the load's status.
    pub fn find(&mut self, kind: HandleKind, value: u64) -> Result<Option<u64>, (i64, String)> {
        self.land();
        let Some(&pending) = self.pending.get(&(kind, value)) else {
            return match self.landing.failure(value) {
                Some(failed) => Err(failed),
                None => Ok(None),
            };
        };
        let Some(finder) = &self.finder else {
            return Err((NOT_FOUND, format!("{value:#x}: no way to find a pending {}", Self::name(kind))));
        };
        let real = finder(pending)?;
        self.pending.remove(&(kind, value));
        self.names.insert((kind, value), real);
        self.values.entry((kind, real)).or_insert(value);
        Ok(Some(real))
    }

    /// Whether `name` is free to name a new handle of `kind` (never one of the worker's ids,
    /// nor a name a module load is to give or failed to give).
    pub fn name_free(&mut self, kind: HandleKind, name: u64) -> bool {
        name != 0 && name & TAG_MASK != ID_TAG && !self.owns(kind, name) && !self.landing.claims(name)
    }

    /// Record the client's `name` for the library's handle `real`.
    pub fn insert_named(&mut self, kind: HandleKind, name: u64, real: u64) {
        self.names.insert((kind, name), real);
        if real != 0 {
            self.values.insert((kind, real), name);
        }
    }

    /// The client's value for the library's handle `real` of `kind`, handed out now: its
    /// name if it has one, else a new id. Literals stay what they are.
    pub fn insert(&mut self, kind: HandleKind, real: u64) -> u64 {
        if self.is_literal(kind, real) {
            return real;
        }
        self.land();
        if let Some(&value) = self.values.get(&(kind, real)) {
            return value;
        }
        let id = self.landing.next_id();
        self.names.insert((kind, id), real);
        self.values.insert((kind, real), id);
        id
    }

    /// As [`Handles::insert`], for a call that takes a reference to the handle it hands
    /// out: one the client already names gets one more reference under that name.
    pub fn insert_reference(&mut self, kind: HandleKind, real: u64) -> u64 {
        if self.known(kind, real).is_some() && !self.is_literal(kind, real) {
            *self.references.entry((kind, real)).or_insert(0) += 1;
        }
        self.insert(kind, real)
    }

    /// A releasing call succeeded on `value`: with references left the name stays (false),
    /// else it goes as [`Handles::remove`] takes it (true).
    pub fn release(&mut self, kind: HandleKind, value: u64) -> bool {
        self.land();
        if let Some(&real) = self.names.get(&(kind, value))
            && let Some(left) = self.references.get_mut(&(kind, real))
        {
            *left -= 1;
            if *left == 0 {
                self.references.remove(&(kind, real));
            }
            return false;
        }
        self.remove(kind, value);
        true
    }

    /// The client's value for the library's handle `real` of `kind`, if it has one.
    pub fn known(&mut self, kind: HandleKind, real: u64) -> Option<u64> {
        if self.is_literal(kind, real) {
            return Some(real);
        }
        self.land();
        self.values.get(&(kind, real)).copied()
    }

    pub fn remove(&mut self, kind: HandleKind, value: u64) {
        self.land();
        self.pending.remove(&(kind, value));
        if let Some(real) = self.names.remove(&(kind, value))
            && self.values.get(&(kind, real)) == Some(&value)
        {
            self.values.remove(&(kind, real));
            self.references.remove(&(kind, real));
        }
    }

    /// The `n`-th live handle of `kind` as the client names it (modulo their number), for
    /// fuzzing.
    pub fn pick(&mut self, kind: HandleKind, n: u64) -> Option<u64> {
        self.land();
        let mut live: Vec<u64> =
            self.names.keys().chain(self.pending.keys()).filter(|(k, _)| *k == kind).map(|(_, v)| *v).collect();
        if live.is_empty() {
            return None;
        }
        live.sort_unstable();
        live.get((n % live.len() as u64) as usize).copied()
    }

    /// Name of a handle kind, for error messages.
    pub fn name(kind: HandleKind) -> &'static str {
        KINDS.get(usize::from(kind)).copied().unwrap_or("handle")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chidori_protocol::desc::CLIENT_NAME_TAG;

    fn kind(name: &str) -> HandleKind {
        KINDS.iter().position(|k| *k == name).unwrap() as HandleKind
    }

    /// A handle the library will be asked for when first used, named by the worker, as a
    /// module's load lands its kernels.
    fn pending(h: &Handles, kind: HandleKind, pending: Pending) -> u64 {
        let id = h.landing.next_id();
        h.landing.arrive(vec![(kind, id, Entry::Pending(pending))], vec![], &[]);
        id
    }

    #[test]
    fn only_handed_out_handles_pass() {
        let mut h = Handles::new();
        let stream = kind("CUstream_st");
        assert!(h.check(stream, 0) && h.check(stream, 1) && h.check(stream, 2));
        assert!(!h.check(stream, 0xdead_beef));
        let id = h.insert(stream, 0xdead_beef);
        assert_eq!(id & TAG_MASK, ID_TAG, "the client sees an id, not the library's pointer");
        assert!(!h.check(stream, 0xdead_beef), "the library's value itself is no handle of the client");
        assert_eq!(h.resolve(stream, id), Some(0xdead_beef));
        h.remove(stream, id);
        assert!(!h.check(stream, id));
        let other = if stream == 0 { 1 } else { 0 };
        let foreign = h.insert(other, 0x1234);
        assert!(!h.check(stream, foreign), "a handle of another kind is foreign");
    }

    #[test]
    fn a_retained_handle_lives_until_its_last_reference_is_released() {
        let mut h = Handles::new();
        let alloc = kind("CUmemGenericAllocationHandle");
        let made = h.insert(alloc, 0x7f00_0000_4000);
        assert_eq!(h.insert_reference(alloc, 0x7f00_0000_4000), made, "retained under its name");
        assert_eq!(h.insert_reference(alloc, 0x7f00_0000_4000), made);
        assert!(!h.release(alloc, made) && !h.release(alloc, made), "two references left after each");
        assert_eq!(h.resolve(alloc, made), Some(0x7f00_0000_4000));
        assert!(h.release(alloc, made), "the last reference takes the name");
        assert!(!h.check(alloc, made));
        let fresh = h.insert_reference(alloc, 0x7f00_0000_5000);
        assert!(h.release(alloc, fresh), "a handle first seen by a retain has one reference");
    }

    #[test]
    fn a_handle_handed_out_twice_keeps_its_id() {
        let mut h = Handles::new();
        let ctx = kind("CUctx_st");
        let first = h.insert(ctx, 0x7f00_0000_1000);
        assert_eq!(h.insert(ctx, 0x7f00_0000_1000), first, "the current context asked twice");
        assert_ne!(h.insert(ctx, 0x7f00_0000_2000), first);
        assert_eq!(h.known(ctx, 0x7f00_0000_1000), Some(first));
        assert_eq!(h.known(ctx, 0x7f00_0000_3000), None, "known: no id is made");
        h.remove(ctx, first);
        assert_eq!(h.known(ctx, 0x7f00_0000_1000), None);
        let again = h.insert(ctx, 0x7f00_0000_1000);
        assert_ne!(again, first, "a destroyed handle's id is not given again");
        assert_eq!(h.insert(kind("CUstream_st"), 1), 1, "the legacy stream stands for itself");
        assert_eq!(h.insert(ctx, 0), 0);
    }

    /// A module's kernel is named at once and found when first used: once, in the context
    /// it was loaded in; a failure is the library's and leaves it pending.
    #[test]
    fn pending_handles_are_found_once_when_first_used() {
        use std::sync::Mutex;
        let func = kind("CUfunc_st");
        let asked: Arc<Mutex<Vec<Pending>>> = Arc::default();
        let fail = Arc::new(Mutex::new(true));
        let (a, f) = (asked.clone(), fail.clone());
        let mut h = Handles::with_finder(Arc::new(move |p: Pending| {
            a.lock().unwrap().push(p);
            if *f.lock().unwrap() { Err((2, "out of memory".into())) } else { Ok(p.kernel + 0x1000) }
        }));
        let id = pending(&h, func, Pending { kernel: 0x5000, context: 0x77 });
        assert_eq!(id & TAG_MASK, ID_TAG);
        assert!(h.owns(func, id) && !h.name_free(func, id));
        assert!(asked.lock().unwrap().is_empty(), "named without asking the library");
        assert_eq!(h.find(func, id), Err((2, "out of memory".into())));
        assert_eq!(h.resolve(func, id), None, "still not found");
        assert!(h.owns(func, id), "a failure leaves it pending");
        *fail.lock().unwrap() = false;
        assert_eq!(h.resolve(func, id), Some(0x6000));
        assert_eq!(h.resolve(func, id), Some(0x6000));
        assert_eq!(asked.lock().unwrap().len(), 3, "found once (after two failures), then kept");
        assert_eq!(asked.lock().unwrap()[2], Pending { kernel: 0x5000, context: 0x77 });
        assert_eq!(h.insert(func, 0x6000), id, "the function handed out again keeps the kernel's name");
        assert_eq!(h.find(func, id), Ok(None), "no longer pending");
        let other = pending(&h, func, Pending { kernel: 0x9000, context: 0x77 });
        h.remove(func, other);
        assert!(!h.owns(func, other) && h.resolve(func, other).is_none(), "a removed pending handle is gone");
        let mut plain = Handles::new();
        let p = pending(&plain, func, Pending { kernel: 1, context: 2 });
        assert!(plain.find(func, p).is_err() && plain.resolve(func, p).is_none(), "no finder: never found");
    }

    /// A name a module load is to give is not free, and a call passing it waits until the
    /// load lands it (from another thread, without the table's lock); a name whose load
    /// failed gets that failure.
    #[test]
    fn names_of_a_load_behind_are_waited_for_and_failures_kept() {
        let func = kind("CUfunc_st");
        let mut h = Handles::new();
        let landing = h.landing();
        let (name, lost) = (CLIENT_NAME_TAG | 5, CLIENT_NAME_TAG | 6);
        assert!(h.name_free(func, name));
        landing.expect(&[name, lost]);
        assert!(!h.name_free(func, name), "awaited");
        let loader = {
            let landing = landing.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(100));
                let id = landing.next_id();
                landing.arrive(vec![(func, name, Entry::Real(0x9000)), (func, id, Entry::Real(0x9100))], vec![], &[]);
                landing.arrive(vec![], vec![(lost, (500, "module has no kernel k".into()))], &[name, lost]);
                id
            })
        };
        let start = Instant::now();
        assert_eq!(h.resolve(func, name), Some(0x9000), "waited for the load");
        assert!(start.elapsed() >= Duration::from_millis(90));
        let id = loader.join().unwrap();
        assert_eq!(id & TAG_MASK, ID_TAG);
        assert_eq!(h.resolve(func, id), Some(0x9100), "an id the loader gave");
        assert_eq!(h.insert(func, 0x9100), id, "its library handle keeps that id");
        assert_eq!(h.resolve(func, lost), None);
        assert_eq!(h.find(func, lost), Err((500, "module has no kernel k".into())));
        assert!(!h.name_free(func, lost), "a failed name is not given again");
        let start = Instant::now();
        assert_eq!(h.resolve(func, CLIENT_NAME_TAG | 7), None, "a name never awaited is not waited for");
        assert!(start.elapsed() < Duration::from_millis(50));
        let mut other = Handles::new();
        assert!(!other.alias(func, CLIENT_NAME_TAG | 8, CLIENT_NAME_TAG | 9), "nothing to alias");
        let p = pending(&other, func, Pending { kernel: 1, context: 2 });
        assert!(other.alias(func, CLIENT_NAME_TAG | 8, p) && other.owns(func, CLIENT_NAME_TAG | 8), "a pending alias");
    }

    #[test]
    fn a_cublas_handle_passes_where_cublaslt_takes_one() {
        let (blas, lt) = (kind("cublasContext"), kind("cublasLtContext"));
        let mut h = Handles::new();
        let b = h.insert(blas, 0x5000);
        assert_eq!(h.resolve(lt, b), Some(0x5000), "torch casts its cuBLAS handle to a cuBLASLt handle");
        let l = h.insert(lt, 0x6000);
        assert!(!h.check(blas, l), "the alias is one-way");
        h.remove(blas, b);
        assert!(!h.check(lt, b), "a destroyed cuBLAS handle is stale for cuBLASLt too");
    }

    #[test]
    fn client_names_map_to_library_handles() {
        let mut h = Handles::new();
        let kind = 0;
        assert!(h.name_free(kind, CLIENT_NAME_TAG | 1));
        h.insert_named(kind, CLIENT_NAME_TAG | 1, 0x7f00_1234);
        assert!(!h.name_free(kind, CLIENT_NAME_TAG | 1), "a name is used once");
        assert!(!h.name_free(kind, ID_TAG | 77), "the worker's ids are not the client's to take");
        assert_eq!(h.resolve(kind, CLIENT_NAME_TAG | 1), Some(0x7f00_1234));
        assert_eq!(h.resolve(kind, 0x7f00_1234), None, "the library's value itself is not a handle the client has");
        assert_eq!(h.insert(kind, 0x7f00_1234), CLIENT_NAME_TAG | 1, "handed back under the client's name");
        h.remove(kind, CLIENT_NAME_TAG | 1);
        assert_eq!(h.resolve(kind, CLIENT_NAME_TAG | 1), None);
    }
}
