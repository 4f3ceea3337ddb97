//! Graphs and instances the server handed out and the program has not destroyed: their
//! destroys cannot be refused, so they go without waiting (`crate::custom::graphs`).

use std::collections::HashSet;
use std::sync::Mutex;

use chidori_protocol::desc::{CallDesc, Wire};

/// Graphs and instances followed: past this many, those followed are forgotten (their
/// destroys wait).
const LIVES_MAX: usize = 1 << 16;

/// Whether `kind` is a graph's or an instance's.
pub fn is_graph_kind(kind: u16) -> bool {
    use chidori_cuda::handles::kind::{CUgraph_st, CUgraphExec_st};
    kind == CUgraph_st || kind == CUgraphExec_st
}

/// The graphs and instances of one process that are live: (kind, handle).
pub struct Lives {
    live: Mutex<Option<HashSet<(u16, u64)>>>,
    /// Live graphs instantiated since they were handed out.
    instantiated: Mutex<Option<HashSet<u64>>>,
}

impl Default for Lives {
    fn default() -> Self {
        Self::new()
    }
}

impl Lives {
    pub const fn new() -> Self {
        Lives { live: Mutex::new(None), instantiated: Mutex::new(None) }
    }

    /// A call that hands out graphs or instances succeeded: each the server named (written
    /// through the call's out-pointers, `args`) is live until the program destroys it.
    pub fn handed_out(&self, desc: &CallDesc, args: &[u64]) {
        let mut live = self.live.lock().unwrap_or_else(|p| p.into_inner());
        let live = live.get_or_insert_with(HashSet::new);
        if live.len() >= LIVES_MAX {
            live.clear();
        }
        for (i, wire) in desc.params.iter().enumerate() {
            let (Wire::OutHandle { kind, .. }, Some(&out)) = (wire, args.get(i)) else { continue };
            if !is_graph_kind(*kind) || out == 0 {
                continue;
            }
            // SAFETY: the caller's out-pointer for a handle, which the call's reply just filled.
            let handle = unsafe { std::ptr::read_unaligned(out as *const u64) };
            if handle != 0 {
                live.insert((*kind, handle));
            }
        }
    }

    /// The program destroys `handle` of `kind`: whether it was live (followed no further).
    pub fn destroyed(&self, kind: u16, handle: u64) -> bool {
        if let Some(i) = self.instantiated.lock().unwrap_or_else(|p| p.into_inner()).as_mut() {
            i.remove(&handle);
        }
        self.live.lock().unwrap_or_else(|p| p.into_inner()).as_mut().is_some_and(|l| l.remove(&(kind, handle)))
    }

    /// The program instantiates `graph`: whether it is live and instantiated for the first
    /// time (a graph with allocation nodes may have one instance at a time, so a second
    /// one may be refused).
    pub fn first_instance(&self, graph: u64) -> bool {
        use chidori_cuda::handles::kind::CUgraph_st;
        let live = self.live.lock().unwrap_or_else(|p| p.into_inner());
        if !live.as_ref().is_some_and(|l| l.contains(&(CUgraph_st, graph))) {
            return false;
        }
        let mut instantiated = self.instantiated.lock().unwrap_or_else(|p| p.into_inner());
        let instantiated = instantiated.get_or_insert_with(HashSet::new);
        // Past the bound every instantiation waits (it cannot tell a first from a second).
        instantiated.len() < LIVES_MAX && instantiated.insert(graph)
    }
}

#[cfg(test)]
mod tests {
    use super::Lives;
    use chidori_cuda::handles::kind::{CUgraph_st, CUgraphExec_st};

    #[test]
    fn a_live_graph_is_instantiated_first_once_until_destroyed() {
        let lives = Lives::new();
        assert!(!lives.first_instance(0x10), "a graph never handed out");
        lives.live.lock().unwrap().get_or_insert_with(Default::default).insert((CUgraph_st, 0x10));
        assert!(lives.first_instance(0x10));
        assert!(!lives.first_instance(0x10), "a second instance may be refused");
        assert!(lives.destroyed(CUgraph_st, 0x10));
        assert!(!lives.first_instance(0x10), "destroyed");
        assert!(!lives.destroyed(CUgraphExec_st, 0x10));
    }
}
