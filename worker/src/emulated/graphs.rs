//! The emulated backend's graphs: nodes with dependencies, made by stream capture or call
//! by call, instantiated into operations in dependency order that replay in host memory.
//! Plain data, no FFI: the backend turns calls into these and runs what they return.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use chidori_cuda::consts::{cudaError, cudaGraphExecUpdateResult};

use super::{INVALID_VALUE, SUCCESS};
use crate::backend::HostFn;

/// cudaGraphNodeType values (CUgraphNodeType's are the same numbers).
pub mod kind {
    use chidori_cuda::consts::cudaGraphNodeType as t;
    pub const MEMCPY: u32 = t::cudaGraphNodeTypeMemcpy;
    pub const MEMSET: u32 = t::cudaGraphNodeTypeMemset;
    pub const HOST: u32 = t::cudaGraphNodeTypeHost;
    pub const GRAPH: u32 = t::cudaGraphNodeTypeGraph;
    pub const EMPTY: u32 = t::cudaGraphNodeTypeEmpty;
    pub const WAIT_EVENT: u32 = t::cudaGraphNodeTypeWaitEvent;
    pub const EVENT_RECORD: u32 = t::cudaGraphNodeTypeEventRecord;
    pub const MEM_ALLOC: u32 = t::cudaGraphNodeTypeMemAlloc;
    pub const MEM_FREE: u32 = t::cudaGraphNodeTypeMemFree;
    /// The driver's only (the runtime has no batch memory operation nodes).
    pub const BATCH_MEM_OP: u32 = chidori_cuda::consts::CUgraphNodeType_enum::CU_GRAPH_NODE_TYPE_BATCH_MEM_OP;
    const _: () = {
        use chidori_cuda::consts::CUgraphNodeType_enum as driver;
        assert!(MEMCPY == driver::CU_GRAPH_NODE_TYPE_MEMCPY && MEMSET == driver::CU_GRAPH_NODE_TYPE_MEMSET);
        assert!(HOST == driver::CU_GRAPH_NODE_TYPE_HOST && GRAPH == driver::CU_GRAPH_NODE_TYPE_GRAPH);
        assert!(EMPTY == driver::CU_GRAPH_NODE_TYPE_EMPTY && WAIT_EVENT == driver::CU_GRAPH_NODE_TYPE_WAIT_EVENT);
        assert!(EVENT_RECORD == driver::CU_GRAPH_NODE_TYPE_EVENT_RECORD);
        assert!(MEM_ALLOC == driver::CU_GRAPH_NODE_TYPE_MEM_ALLOC && MEM_FREE == driver::CU_GRAPH_NODE_TYPE_MEM_FREE);
    };
}

/// cudaErrorGraphExecUpdateFailure (the driver's code is the same number).
pub const UPDATE_FAILURE: u64 = cudaError::cudaErrorGraphExecUpdateFailure as u64;
const _: () =
    assert!(UPDATE_FAILURE == chidori_cuda::consts::cudaError_enum::CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE as u64);

/// cudaGraphExecUpdateResult: a different topology, or a node of another type.
pub const UPDATE_TOPOLOGY_CHANGED: u32 = cudaGraphExecUpdateResult::cudaGraphExecUpdateErrorTopologyChanged;
pub const UPDATE_NODE_TYPE_CHANGED: u32 = cudaGraphExecUpdateResult::cudaGraphExecUpdateErrorNodeTypeChanged;

/// Pitched memory: the address of the first byte, the bytes per row and per slice.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Region {
    pub addr: u64,
    pub pitch: u64,
    pub slice: u64,
}

/// What a node does when its graph runs.
#[derive(Clone)]
pub enum Op {
    Copy {
        dst: u64,
        src: u64,
        len: u64,
    },
    /// `height` rows of `width` elements of `elem` bytes (1, 2 or 4), `pitch` bytes apart.
    Memset {
        dst: u64,
        pitch: u64,
        value: u32,
        elem: u32,
        width: u64,
        height: u64,
    },
    /// `width` bytes by `height` rows by `depth` slices.
    Region {
        dst: Region,
        src: Region,
        width: u64,
        height: u64,
        depth: u64,
    },
    /// The client's host function (the session's trampoline), on every replay.
    Host(Arc<HostFn>),
    /// Words written by stream memory operations: (address, value, bytes: 4 or 8). Waits,
    /// flushes, barriers and reductions are nothing the emulation does.
    Words(Vec<(u64, u64, u8)>),
    /// Empty, event and memory-free nodes: nothing the emulation does.
    Nothing,
    /// An embedded graph (a clone made when the node was).
    Child(u64),
}

impl std::fmt::Debug for Op {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Op::Copy { dst, src, len } => write!(f, "Copy({dst:#x} <- {src:#x}, {len})"),
            Op::Memset { dst, value, .. } => write!(f, "Memset({dst:#x}, {value})"),
            Op::Region { dst, src, .. } => write!(f, "Region({:#x} <- {:#x})", dst.addr, src.addr),
            Op::Host(_) => write!(f, "Host"),
            Op::Nothing => write!(f, "Nothing"),
            Op::Words(words) => write!(f, "Words({})", words.len()),
            Op::Child(g) => write!(f, "Child({g:#x})"),
        }
    }
}

#[derive(Clone, Debug)]
pub struct Node {
    pub graph: u64,
    pub kind: u32,
    pub op: Op,
    pub deps: Vec<u64>,
    /// The parameter record the node was made or last set with (for the Get calls).
    pub params: Vec<u8>,
}

/// One node of an executable graph: the graph node it came from, in dependency order.
#[derive(Clone, Debug)]
struct ExecNode {
    source: u64,
    kind: u32,
    op: Op,
}

#[derive(Default)]
pub struct Graphs {
    next: u64,
    /// Graph → its nodes, in the order they were made.
    graphs: HashMap<u64, Vec<u64>>,
    nodes: HashMap<u64, Node>,
    execs: HashMap<u64, Vec<ExecNode>>,
    /// Capturing stream → (graph, the nodes its next operation depends on).
    capturing: HashMap<u64, (u64, Vec<u64>)>,
}

impl Graphs {
    fn handle(&mut self) -> u64 {
        self.next += 16;
        0x6e00_0000 + self.next
    }

    pub fn create(&mut self) -> u64 {
        let g = self.handle();
        self.graphs.insert(g, Vec::new());
        g
    }

    pub fn node(&self, node: u64) -> Option<&Node> {
        self.nodes.get(&node)
    }

    /// A new node of `graph` after `deps` (nodes of the same graph).
    pub fn add(&mut self, graph: u64, deps: &[u64], kind: u32, op: Op, params: Vec<u8>) -> Result<u64, u64> {
        if !self.graphs.contains_key(&graph) {
            return Err(INVALID_VALUE);
        }
        if deps.iter().any(|d| self.nodes.get(d).is_none_or(|n| n.graph != graph)) {
            return Err(INVALID_VALUE);
        }
        let mut unique = Vec::new();
        for d in deps {
            if !unique.contains(d) {
                unique.push(*d);
            }
        }
        let node = self.handle();
        self.nodes.insert(node, Node { graph, kind, op, deps: unique, params });
        self.graphs.get_mut(&graph).ok_or(INVALID_VALUE)?.push(node);
        Ok(node)
    }

    /// A child graph node: `child` is cloned into the node.
    pub fn add_child(&mut self, graph: u64, deps: &[u64], child: u64) -> Result<u64, u64> {
        let copy = self.clone_graph(child)?;
        self.add(graph, deps, kind::GRAPH, Op::Child(copy), Vec::new())
    }

    /// The graph a child graph node embeds.
    pub fn child_graph(&self, node: u64) -> Option<u64> {
        match self.nodes.get(&node)?.op {
            Op::Child(g) => Some(g),
            _ => None,
        }
    }

    pub fn clone_graph(&mut self, graph: u64) -> Result<u64, u64> {
        let nodes = self.graphs.get(&graph).ok_or(INVALID_VALUE)?.clone();
        let copy = self.create();
        let mut map = HashMap::new();
        for n in nodes {
            let node = self.nodes.get(&n).ok_or(INVALID_VALUE)?.clone();
            let op = match node.op {
                Op::Child(g) => Op::Child(self.clone_graph(g)?),
                other => other,
            };
            let deps: Vec<u64> = node.deps.iter().filter_map(|d| map.get(d).copied()).collect();
            let new = self.add(copy, &deps, node.kind, op, node.params)?;
            map.insert(n, new);
        }
        Ok(copy)
    }

    /// Add (`add`) or remove edges `from[i] -> to[i]`, all inside `graph`.
    pub fn edges(&mut self, graph: u64, from: &[u64], to: &[u64], add: bool) -> Result<(), u64> {
        if from.len() != to.len() || !self.graphs.contains_key(&graph) {
            return Err(INVALID_VALUE);
        }
        let inside = |n: &u64| self.nodes.get(n).is_some_and(|n| n.graph == graph);
        if !from.iter().chain(to).all(inside) {
            return Err(INVALID_VALUE);
        }
        for (f, t) in from.iter().zip(to) {
            let node = self.nodes.get_mut(t).ok_or(INVALID_VALUE)?;
            match (add, node.deps.iter().position(|d| d == f)) {
                (true, None) => node.deps.push(*f),
                (false, Some(i)) => {
                    node.deps.remove(i);
                }
                // An edge added twice, or removed where there is none.
                _ => return Err(INVALID_VALUE),
            }
        }
        Ok(())
    }

    pub fn nodes_of(&self, graph: u64) -> Option<Vec<u64>> {
        self.graphs.get(&graph).cloned()
    }

    pub fn roots_of(&self, graph: u64) -> Option<Vec<u64>> {
        let nodes = self.graphs.get(&graph)?;
        Some(nodes.iter().copied().filter(|n| self.nodes.get(n).is_some_and(|n| n.deps.is_empty())).collect())
    }

    /// Every edge of `graph` as (from, to), in the order of the destination nodes.
    pub fn edges_of(&self, graph: u64) -> Option<(Vec<u64>, Vec<u64>)> {
        let mut from = Vec::new();
        let mut to = Vec::new();
        for n in self.graphs.get(&graph)? {
            for d in &self.nodes.get(n)?.deps {
                from.push(*d);
                to.push(*n);
            }
        }
        Some((from, to))
    }

    pub fn dependencies(&self, node: u64) -> Option<Vec<u64>> {
        Some(self.nodes.get(&node)?.deps.clone())
    }

    pub fn dependents(&self, node: u64) -> Option<Vec<u64>> {
        let graph = self.nodes.get(&node)?.graph;
        let all = self.graphs.get(&graph)?;
        Some(all.iter().copied().filter(|n| self.nodes.get(n).is_some_and(|m| m.deps.contains(&node))).collect())
    }

    /// Change what a node does (it keeps its type).
    pub fn set(&mut self, node: u64, kind: u32, op: Op, params: Vec<u8>) -> Result<(), u64> {
        let n = self.nodes.get_mut(&node).ok_or(INVALID_VALUE)?;
        if n.kind != kind {
            return Err(INVALID_VALUE);
        }
        n.op = op;
        n.params = params;
        Ok(())
    }

    pub fn destroy_node(&mut self, node: u64) -> Result<(), u64> {
        let n = self.nodes.remove(&node).ok_or(INVALID_VALUE)?;
        if let Some(list) = self.graphs.get_mut(&n.graph) {
            list.retain(|m| *m != node);
            for m in list.iter() {
                if let Some(other) = self.nodes.get_mut(m) {
                    other.deps.retain(|d| *d != node);
                }
            }
        }
        Ok(())
    }

    pub fn destroy(&mut self, graph: u64) -> Result<(), u64> {
        let nodes = self.graphs.remove(&graph).ok_or(INVALID_VALUE)?;
        for n in nodes {
            if let Some(Node { op: Op::Child(g), .. }) = self.nodes.remove(&n) {
                let _ = self.destroy(g);
            }
        }
        Ok(())
    }

    /// `graph`'s nodes in an order that respects every dependency (the order they were made
    /// where it does); Err on a cycle.
    fn ordered(&self, graph: u64) -> Result<Vec<u64>, u64> {
        let nodes = self.graphs.get(&graph).ok_or(INVALID_VALUE)?;
        let mut done: HashSet<u64> = HashSet::new();
        let mut order = Vec::with_capacity(nodes.len());
        while order.len() < nodes.len() {
            let before = order.len();
            for n in nodes {
                if done.contains(n) {
                    continue;
                }
                let node = self.nodes.get(n).ok_or(INVALID_VALUE)?;
                if node.deps.iter().all(|d| done.contains(d)) {
                    done.insert(*n);
                    order.push(*n);
                }
            }
            if order.len() == before {
                return Err(INVALID_VALUE);
            }
        }
        Ok(order)
    }

    fn exec_nodes(&self, graph: u64) -> Result<Vec<ExecNode>, u64> {
        let mut out = Vec::new();
        for n in self.ordered(graph)? {
            let node = self.nodes.get(&n).ok_or(INVALID_VALUE)?;
            out.push(ExecNode { source: n, kind: node.kind, op: node.op.clone() });
        }
        Ok(out)
    }

    pub fn instantiate(&mut self, graph: u64) -> Result<u64, u64> {
        let nodes = self.exec_nodes(graph)?;
        let exec = self.handle();
        self.execs.insert(exec, nodes);
        Ok(exec)
    }

    pub fn destroy_exec(&mut self, exec: u64) -> Result<(), u64> {
        self.execs.remove(&exec).map(|_| ()).ok_or(INVALID_VALUE)
    }

    pub fn is_exec(&self, exec: u64) -> bool {
        self.execs.contains_key(&exec)
    }

    /// Change what `node` (of the graph `exec` was made from) does in `exec` only.
    pub fn exec_set(&mut self, exec: u64, node: u64, kind: u32, op: Op) -> Result<(), u64> {
        let nodes = self.execs.get_mut(&exec).ok_or(INVALID_VALUE)?;
        let n = nodes.iter_mut().find(|n| n.source == node).ok_or(INVALID_VALUE)?;
        if n.kind != kind {
            return Err(INVALID_VALUE);
        }
        n.op = op;
        Ok(())
    }

    /// Give `exec` the parameters of `graph`'s nodes, which must match its nodes pairwise
    /// (same count, same types, in dependency order). Err: (update result, the node).
    pub fn update(&mut self, exec: u64, graph: u64) -> Result<(), (u32, u64)> {
        let new = self.exec_nodes(graph).map_err(|_| (UPDATE_TOPOLOGY_CHANGED, 0))?;
        let old = self.execs.get_mut(&exec).ok_or((UPDATE_TOPOLOGY_CHANGED, 0))?;
        if old.len() != new.len() {
            return Err((UPDATE_TOPOLOGY_CHANGED, 0));
        }
        if let Some(n) = new.iter().zip(old.iter()).find(|(n, o)| n.kind != o.kind) {
            return Err((UPDATE_NODE_TYPE_CHANGED, n.0.source));
        }
        for (o, n) in old.iter_mut().zip(new) {
            o.op = n.op;
        }
        Ok(())
    }

    /// The operations a launch of `exec` runs, child graphs inlined.
    pub fn ops(&self, exec: u64) -> Option<Vec<Op>> {
        let mut out = Vec::new();
        for n in self.execs.get(&exec)? {
            self.flatten(&n.op, &mut out, 0)?;
        }
        Some(out)
    }

    fn flatten(&self, op: &Op, out: &mut Vec<Op>, depth: u32) -> Option<()> {
        match op {
            Op::Child(g) if depth < 16 => {
                for n in self.ordered(*g).ok()? {
                    self.flatten(&self.nodes.get(&n)?.op, out, depth + 1)?;
                }
            }
            Op::Child(_) => return None,
            other => out.push(other.clone()),
        }
        Some(())
    }

    // ---- Capture: a stream's operations become nodes of a graph ----

    /// Begin capturing `stream` into a new graph, or into `into` after its nodes `deps`.
    pub fn begin(&mut self, stream: u64, into: Option<(u64, Vec<u64>)>) -> Result<(), u64> {
        if self.capturing.contains_key(&stream) {
            return Err(INVALID_VALUE);
        }
        let (graph, frontier) = match into {
            Some((g, deps)) if self.graphs.contains_key(&g) => (g, deps),
            Some(_) => return Err(INVALID_VALUE),
            None => (self.create(), Vec::new()),
        };
        self.capturing.insert(stream, (graph, frontier));
        Ok(())
    }

    /// Record `op` on `stream` if it is capturing: Some(status) when it was, None when the
    /// stream runs it now.
    pub fn record(&mut self, stream: u64, kind: u32, op: Op) -> Option<u64> {
        let (graph, frontier) = self.capturing.get(&stream)?.clone();
        Some(match self.add(graph, &frontier, kind, op, Vec::new()) {
            Ok(node) => {
                if let Some(c) = self.capturing.get_mut(&stream) {
                    c.1 = vec![node];
                }
                SUCCESS
            }
            Err(e) => e,
        })
    }

    pub fn capturing(&self, stream: u64) -> Option<(u64, Vec<u64>)> {
        self.capturing.get(&stream).cloned()
    }

    /// Replace (`add` false) or extend the nodes the next captured operation depends on.
    pub fn set_frontier(&mut self, stream: u64, deps: &[u64], add: bool) -> Result<(), u64> {
        let c = self.capturing.get_mut(&stream).ok_or(INVALID_VALUE)?;
        if !add {
            c.1.clear();
        }
        c.1.extend_from_slice(deps);
        Ok(())
    }

    /// End the capture of `stream`: its graph.
    pub fn end(&mut self, stream: u64) -> Option<u64> {
        self.capturing.remove(&stream).map(|(g, _)| g)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn copy(n: u64) -> Op {
        Op::Copy { dst: n, src: 0, len: 1 }
    }

    fn dsts(ops: &[Op]) -> Vec<u64> {
        ops.iter().filter_map(|o| if let Op::Copy { dst, .. } = o { Some(*dst) } else { None }).collect()
    }

    #[test]
    fn instantiated_graphs_run_in_dependency_order() {
        let mut g = Graphs::default();
        let graph = g.create();
        let a = g.add(graph, &[], kind::MEMCPY, copy(1), vec![]).unwrap();
        let b = g.add(graph, &[], kind::MEMCPY, copy(2), vec![]).unwrap();
        // b before a, added afterwards.
        g.edges(graph, &[b], &[a], true).unwrap();
        let exec = g.instantiate(graph).unwrap();
        assert_eq!(dsts(&g.ops(exec).unwrap()), [2, 1]);
        assert_eq!(g.roots_of(graph).unwrap(), [b]);
        assert_eq!(g.edges_of(graph).unwrap(), (vec![b], vec![a]));
        assert_eq!(g.dependents(b).unwrap(), [a]);
        // A cycle cannot be instantiated.
        g.edges(graph, &[a], &[b], true).unwrap();
        assert_eq!(g.instantiate(graph), Err(INVALID_VALUE));
        assert_eq!(g.edges(graph, &[a], &[b], true), Err(INVALID_VALUE), "an edge twice");
    }

    #[test]
    fn child_graphs_are_cloned_and_inlined() {
        let mut g = Graphs::default();
        let child = g.create();
        g.add(child, &[], kind::MEMCPY, copy(7), vec![]).unwrap();
        let parent = g.create();
        let first = g.add(parent, &[], kind::MEMCPY, copy(1), vec![]).unwrap();
        g.add_child(parent, &[first], child).unwrap();
        // Changing the child after the node was made does not change the node.
        g.add(child, &[], kind::MEMCPY, copy(8), vec![]).unwrap();
        let exec = g.instantiate(parent).unwrap();
        assert_eq!(dsts(&g.ops(exec).unwrap()), [1, 7]);
        assert_eq!(g.nodes_of(parent).unwrap().len(), 2);
    }

    #[test]
    fn exec_update_takes_new_parameters_of_the_same_topology() {
        let mut g = Graphs::default();
        let graph = g.create();
        let a = g.add(graph, &[], kind::MEMCPY, copy(1), vec![]).unwrap();
        let exec = g.instantiate(graph).unwrap();
        g.set(a, kind::MEMCPY, copy(5), vec![]).unwrap();
        assert_eq!(dsts(&g.ops(exec).unwrap()), [1], "an instance keeps its parameters");
        g.update(exec, graph).unwrap();
        assert_eq!(dsts(&g.ops(exec).unwrap()), [5]);
        g.exec_set(exec, a, kind::MEMCPY, copy(6)).unwrap();
        assert_eq!(dsts(&g.ops(exec).unwrap()), [6]);
        let other = g.create();
        g.add(other, &[], kind::MEMSET, Op::Nothing, vec![]).unwrap();
        assert!(matches!(g.update(exec, other), Err((UPDATE_NODE_TYPE_CHANGED, _))));
        g.add(other, &[], kind::MEMSET, Op::Nothing, vec![]).unwrap();
        assert!(matches!(g.update(exec, other), Err((UPDATE_TOPOLOGY_CHANGED, _))));
    }

    #[test]
    fn capture_chains_nodes_after_the_frontier() {
        let mut g = Graphs::default();
        assert_eq!(g.record(9, kind::MEMCPY, copy(1)), None, "not capturing: runs now");
        g.begin(9, None).unwrap();
        assert_eq!(g.record(9, kind::MEMCPY, copy(1)), Some(0));
        assert_eq!(g.record(9, kind::MEMCPY, copy(2)), Some(0));
        let graph = g.end(9).unwrap();
        let nodes = g.nodes_of(graph).unwrap();
        assert_eq!(g.dependencies(nodes[1]).unwrap(), [nodes[0]]);
    }
}
