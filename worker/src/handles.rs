//! The session's typed handle tables. Handles a client sees are the server's own values
//! (so nested structures pass untouched), but every handle a call passes in is checked
//! against the table of its kind: a wrong, stale or foreign value is an error reply, never
//! a dereference.

use std::collections::{HashMap, HashSet};

use chidori_cuda::handles::{ACCEPTS, KINDS};
use chidori_protocol::desc::HandleKind;

pub struct Handles {
    tables: Vec<HashSet<u64>>,
    /// Handles the client named itself: (kind, the client's name) → the library's handle.
    named: HashMap<(HandleKind, u64), u64>,
    stream_kind: Option<HandleKind>,
}

impl Default for Handles {
    fn default() -> Self {
        Self::new()
    }
}

impl Handles {
    pub fn new() -> Handles {
        let stream_kind = KINDS.iter().position(|k| *k == "CUstream_st").map(|i| i as HandleKind);
        Handles { tables: vec![HashSet::new(); KINDS.len()], named: HashMap::new(), stream_kind }
    }

    /// Whether `value` may be passed as a handle of `kind`. NULL is left to the library
    /// (it means "default" for some handles and is an error it reports for others); the
    /// stream sentinels cudaStreamLegacy (1) and cudaStreamPerThread (2) are always valid.
    pub fn check(&self, kind: HandleKind, value: u64) -> bool {
        if value == 0 {
            return true;
        }
        if Some(kind) == self.stream_kind && (value == 1 || value == 2) {
            return true;
        }
        self.owns(kind, value) || ACCEPTS.iter().any(|&(k, other)| k == kind && self.owns(other, value))
    }

    /// Whether `value` is a live handle of `kind` itself (not of a kind it accepts).
    pub fn owns(&self, kind: HandleKind, value: u64) -> bool {
        self.tables.get(usize::from(kind)).is_some_and(|t| t.contains(&value))
    }

    /// The library's handle for `value` passed as a `kind`: a name the client gave, or a
    /// live handle of the kind (or of a kind it accepts). None: not a handle of this session.
    pub fn resolve(&self, kind: HandleKind, value: u64) -> Option<u64> {
        if let Some(real) = self.named.get(&(kind, value)) {
            return Some(*real);
        }
        self.check(kind, value).then_some(value)
    }

    /// Whether `name` is free to name a new handle of `kind`.
    pub fn name_free(&self, kind: HandleKind, name: u64) -> bool {
        name != 0 && !self.named.contains_key(&(kind, name))
    }

    /// Record the client's `name` for the library's handle `real`.
    pub fn insert_named(&mut self, kind: HandleKind, name: u64, real: u64) {
        self.named.insert((kind, name), real);
    }

    pub fn insert(&mut self, kind: HandleKind, value: u64) {
        if value != 0
            && let Some(t) = self.tables.get_mut(usize::from(kind))
        {
            t.insert(value);
        }
    }

    pub fn remove(&mut self, kind: HandleKind, value: u64) {
        if self.named.remove(&(kind, value)).is_some() {
            return;
        }
        if let Some(t) = self.tables.get_mut(usize::from(kind)) {
            t.remove(&value);
        }
    }

    /// The `n`-th live handle of `kind` (modulo their number), for fuzzing.
    pub fn pick(&self, kind: HandleKind, n: u64) -> Option<u64> {
        let table = self.tables.get(usize::from(kind))?;
        if table.is_empty() {
            return None;
        }
        let mut live: Vec<u64> = table.iter().copied().collect();
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

    #[test]
    fn only_created_handles_pass() {
        let mut h = Handles::new();
        let stream = KINDS.iter().position(|k| *k == "CUstream_st").unwrap() as HandleKind;
        assert!(h.check(stream, 0) && h.check(stream, 1) && h.check(stream, 2));
        assert!(!h.check(stream, 0xdead_beef));
        h.insert(stream, 0xdead_beef);
        assert!(h.check(stream, 0xdead_beef));
        h.remove(stream, 0xdead_beef);
        assert!(!h.check(stream, 0xdead_beef));
        let other = if stream == 0 { 1 } else { 0 };
        h.insert(other, 0x1234);
        assert!(!h.check(stream, 0x1234), "a handle of another kind is foreign");
    }

    #[test]
    fn a_cublas_handle_passes_where_cublaslt_takes_one() {
        let pos = |name: &str| KINDS.iter().position(|k| *k == name).unwrap() as HandleKind;
        let (blas, lt) = (pos("cublasContext"), pos("cublasLtContext"));
        let mut h = Handles::new();
        h.insert(blas, 0x5000);
        assert!(h.check(lt, 0x5000), "torch casts its cuBLAS handle to a cuBLASLt handle");
        h.insert(lt, 0x6000);
        assert!(!h.check(blas, 0x6000), "the alias is one-way");
        h.remove(blas, 0x5000);
        assert!(!h.check(lt, 0x5000), "a destroyed cuBLAS handle is stale for cuBLASLt too");
    }

    #[test]
    fn client_names_map_to_library_handles() {
        let mut h = Handles::new();
        let kind = 0;
        assert!(h.name_free(kind, 0xc1d0_0000_0000_0001));
        h.insert_named(kind, 0xc1d0_0000_0000_0001, 0x7f00_1234);
        assert!(!h.name_free(kind, 0xc1d0_0000_0000_0001), "a name is used once");
        assert_eq!(h.resolve(kind, 0xc1d0_0000_0000_0001), Some(0x7f00_1234));
        assert_eq!(h.resolve(kind, 0x7f00_1234), None, "the library's value itself is not a handle the client has");
        h.remove(kind, 0xc1d0_0000_0000_0001);
        assert_eq!(h.resolve(kind, 0xc1d0_0000_0000_0001), None);
    }
}
