//! The session's typed handle tables. A handle the client sees is never the server's own
//! value (a library's pointer would tell the client where the worker's heap lies): it is a
//! name, either one the client chose itself (handles it creates without waiting) or an id
//! the worker gave when the library handed the handle out. Every handle a call passes in is
//! looked up by its kind: a wrong, stale or foreign value is an error reply, never a
//! dereference.

use std::collections::HashMap;
use std::sync::Arc;

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
    /// The next id's counter (ids are unique across kinds).
    next: u64,
    stream_kind: Option<HandleKind>,
    /// Handles named before the library was asked for them: (kind, the client's value) →
    /// what finds them. A module's kernels become functions when first used, as a
    /// program's own lazy module loading makes them (loading every kernel of a library
    /// up front took most of a module load's time).
    pending: HashMap<(HandleKind, u64), Pending>,
    /// Finds a pending handle: the library's handle, or (status, message).
    finder: Option<Finder>,
}

/// A handle the library has not been asked for yet: a kernel of a loaded library, and the
/// context its function is to be found in (the one the library was loaded in).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Pending {
    pub kernel: u64,
    pub context: u64,
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
        Handles {
            names: HashMap::new(),
            values: HashMap::new(),
            next: 1,
            stream_kind,
            pending: HashMap::new(),
            finder: None,
        }
    }

    /// Tables whose pending handles `finder` finds.
    pub fn with_finder(finder: Finder) -> Handles {
        Handles { finder: Some(finder), ..Handles::new() }
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
    pub fn owns(&self, kind: HandleKind, value: u64) -> bool {
        self.names.contains_key(&(kind, value)) || self.pending.contains_key(&(kind, value))
    }

    /// The library's handle for `value` passed as a `kind`: a handle of the kind, or of a
    /// kind it accepts, or a literal; a pending one is found now. None: not a handle of
    /// this session, or one the library could not find (see [`Handles::find`]).
    pub fn resolve(&mut self, kind: HandleKind, value: u64) -> Option<u64> {
        if self.is_literal(kind, value) {
            return Some(value);
        }
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
    pub fn find(&mut self, kind: HandleKind, value: u64) -> Result<Option<u64>, (i64, String)> {
        let Some(&pending) = self.pending.get(&(kind, value)) else { return Ok(None) };
        let Some(finder) = &self.finder else {
            return Err((NOT_FOUND, format!("{value:#x}: no way to find a pending {}", Self::name(kind))));
        };
        let real = finder(pending)?;
        self.pending.remove(&(kind, value));
        self.names.insert((kind, value), real);
        self.values.entry((kind, real)).or_insert(value);
        Ok(Some(real))
    }

    /// Name a handle the library will be asked for when first used (see [`Pending`]).
    pub fn insert_pending(&mut self, kind: HandleKind, pending: Pending) -> u64 {
        let id = self.next_id();
        self.pending.insert((kind, id), pending);
        id
    }

    fn next_id(&mut self) -> u64 {
        let id = ID_TAG | (self.next & !TAG_MASK);
        self.next += 1;
        id
    }

    /// Whether `name` is free to name a new handle of `kind` (never one of the worker's ids).
    pub fn name_free(&self, kind: HandleKind, name: u64) -> bool {
        name != 0 && name & TAG_MASK != ID_TAG && !self.owns(kind, name)
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
        if let Some(&value) = self.values.get(&(kind, real)) {
            return value;
        }
        let id = self.next_id();
        self.names.insert((kind, id), real);
        self.values.insert((kind, real), id);
        id
    }

    /// The client's value for the library's handle `real` of `kind`, if it has one.
    pub fn known(&self, kind: HandleKind, real: u64) -> Option<u64> {
        if self.is_literal(kind, real) {
            return Some(real);
        }
        self.values.get(&(kind, real)).copied()
    }

    pub fn remove(&mut self, kind: HandleKind, value: u64) {
        self.pending.remove(&(kind, value));
        if let Some(real) = self.names.remove(&(kind, value))
            && self.values.get(&(kind, real)) == Some(&value)
        {
            self.values.remove(&(kind, real));
        }
    }

    /// The `n`-th live handle of `kind` as the client names it (modulo their number), for
    /// fuzzing.
    pub fn pick(&self, kind: HandleKind, n: u64) -> Option<u64> {
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
        let id = h.insert_pending(func, Pending { kernel: 0x5000, context: 0x77 });
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
        let other = h.insert_pending(func, Pending { kernel: 0x9000, context: 0x77 });
        h.remove(func, other);
        assert!(!h.owns(func, other) && h.resolve(func, other).is_none(), "a removed pending handle is gone");
        let mut plain = Handles::new();
        let p = plain.insert_pending(func, Pending { kernel: 1, context: 2 });
        assert!(plain.find(func, p).is_err() && plain.resolve(func, p).is_none(), "no finder: never found");
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
