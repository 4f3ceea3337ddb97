//! Graphs and instances the server handed out and the program has not destroyed: their
//! destroys cannot be refused, so they go without waiting (`crate::custom::graphs`).

use std::collections::HashMap;
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

/// The graphs and instances of one process that are live: (kind, handle) → whether the
/// program instantiated it (a graph) since it was handed out.
pub struct Lives {
    live: Mutex<Option<HashMap<(u16, u64), bool>>>,
}

impl Default for Lives {
    fn default() -> Self {
        Self::new()
    }
}

impl Lives {
    pub const fn new() -> Self {
        Lives { live: Mutex::new(None) }
    }

    /// A call that hands out graphs or instances succeeded: each the server named (written
    /// through the call's out-pointers, `args`) is live until the program destroys it.
    pub fn handed_out(&self, desc: &CallDesc, args: &[u64]) {
        let mut live = self.live.lock().unwrap_or_else(|p| p.into_inner());
        let live = live.get_or_insert_with(HashMap::new);
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
                live.insert((*kind, handle), false);
            }
        }
    }

    /// The program destroys `handle` of `kind`: whether it was live (followed no further).
    pub fn destroyed(&self, kind: u16, handle: u64) -> bool {
        let mut live = self.live.lock().unwrap_or_else(|p| p.into_inner());
        live.as_mut().is_some_and(|l| l.remove(&(kind, handle)).is_some())
    }

    /// The program instantiates `graph`: whether it is live and instantiated for the first
    /// time (a graph with allocation nodes may have one instance at a time, so a second
    /// one may be refused).
    pub fn first_instance(&self, graph: u64) -> bool {
        use chidori_cuda::handles::kind::CUgraph_st;
        let mut live = self.live.lock().unwrap_or_else(|p| p.into_inner());
        match live.as_mut().and_then(|l| l.get_mut(&(CUgraph_st, graph))) {
            Some(instantiated) => !std::mem::replace(instantiated, true),
            None => false,
        }
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
        lives.live.lock().unwrap().get_or_insert_with(Default::default).insert((CUgraph_st, 0x10), false);
        assert!(lives.first_instance(0x10));
        assert!(!lives.first_instance(0x10), "a second instance may be refused");
        assert!(lives.destroyed(CUgraph_st, 0x10));
        assert!(!lives.first_instance(0x10), "destroyed");
        assert!(!lives.destroyed(CUgraphExec_st, 0x10));
    }
}
