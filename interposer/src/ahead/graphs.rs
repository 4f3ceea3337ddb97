//! Graphs and instances the server handed out and the program has not destroyed: their
//! destroys cannot be refused, so they go without waiting (`crate::custom::graphs`).

use chidori_protocol::desc::{CallDesc, Wire};

use crate::state::CLIENT;

/// Graphs and instances followed: past this many, those followed are forgotten (their
/// destroys wait).
const LIVES_MAX: usize = 1 << 16;

/// Whether `kind` is a graph's or an instance's.
pub fn is_graph_kind(kind: u16) -> bool {
    use chidori_cuda::handles::kind::{CUgraph_st, CUgraphExec_st};
    kind == CUgraph_st || kind == CUgraphExec_st
}

/// A call that hands out graphs or instances succeeded: each the server named (written
/// through the call's out-pointers, `args`) is live until the program destroys it.
pub fn handed_out(desc: &CallDesc, args: &[u64]) {
    let mut lives = CLIENT.graph_lives.lock();
    let lives = lives.get_or_insert_with(std::collections::HashMap::new);
    if lives.len() >= LIVES_MAX {
        lives.clear();
    }
    for (i, wire) in desc.params.iter().enumerate() {
        let (Wire::OutHandle { kind, .. }, Some(&out)) = (wire, args.get(i)) else { continue };
        if !is_graph_kind(*kind) || out == 0 {
            continue;
        }
        // SAFETY: the caller's out-pointer for a handle, which the call's reply just filled.
        let handle = unsafe { std::ptr::read_unaligned(out as *const u64) };
        if handle != 0 {
            lives.insert((*kind, handle), ());
        }
    }
}

/// The program destroys `handle` of `kind`: whether it was live (followed no further).
pub fn destroyed(kind: u16, handle: u64) -> bool {
    CLIENT.graph_lives.remove(&(kind, handle)).is_some()
}
