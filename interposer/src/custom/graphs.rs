//! The explicit graph API: nodes whose parameters hold what only the worker can lay out,
//! node arrays, and the union-typed node parameters of `cudaGraphAddNode`.
//!
//! * Kernel nodes: the runtime's host stub (or `cudaKernel_t`) becomes the registered
//!   kernel's server function, and the arguments are packed by its parameter layout, as a
//!   launch's are; the worker makes the node with the packed buffer (`Service::GraphNode`).
//!   The client keeps a copy of what it set, to answer `GetParams`.
//! * Host nodes: the function stays on the client (a registered callback); the server's
//!   node runs a trampoline that asks the client to run it on every replay.
//! * Memcpy nodes: a graph replayed on the server cannot touch the program's memory, so a
//!   side there is the server's mirror of it (`crate::mirror::for_server`: pinned memory
//!   whole, pageable memory by its pages), brought up to date before every launch and read
//!   back at the next wait; `cudaMemcpyDefault` is resolved here.
//! * Node arrays come from the worker (`Service::GraphList`), which makes every node in them
//!   known to the session (capture makes nodes the program never named).
//!
//! Every `unsafe fn` here has the safety contract of the CUDA function it implements.
#![allow(clippy::missing_safety_doc, clippy::too_many_arguments)]

use std::ffi::c_void;
use std::sync::Arc;

use chidori_cuda::calls::{cudart as calls, driver as dcalls};
use chidori_cuda::desc::{CallDesc, Ctx, Form, Wire};
use chidori_protocol::messages::{Api, GraphList, GraphNode, NodeParams, NodeTarget, Service, ServiceReply};

use crate::conn::{self, Conn};
use crate::modules;
use crate::registry;
use crate::state::{self, Memory};

/// cudaSuccess, and the driver's CUDA_SUCCESS: these functions serve both APIs.
const SUCCESS: u32 = chidori_cuda::consts::cudaError::cudaSuccess;
const _: () = assert!(SUCCESS == chidori_cuda::consts::cudaError_enum::CUDA_SUCCESS);
/// What a call answers when the server cannot be reached (cudaErrorNoDevice,
/// CUDA_ERROR_NO_DEVICE) or answered a service with another reply (cudaErrorInvalidValue,
/// CUDA_ERROR_INVALID_VALUE): the same values in both APIs.
const NO_SERVER: u32 = chidori_cuda::consts::cudaError::cudaErrorNoDevice;
const UNEXPECTED_REPLY: u32 = chidori_cuda::consts::cudaError::cudaErrorInvalidValue;
const _: () = assert!(NO_SERVER == chidori_cuda::consts::cudaError_enum::CUDA_ERROR_NO_DEVICE);
const _: () = assert!(UNEXPECTED_REPLY == chidori_cuda::consts::cudaError_enum::CUDA_ERROR_INVALID_VALUE);

/// What the program set on a node the client made, to answer the node's `GetParams`.
#[derive(Clone)]
pub enum NodeRecord {
    /// The function, kernel and context as the program named them (a runtime host stub in
    /// `func`; a driver record's `func`, `kern` and `ctx` as given: a statically linked
    /// runtime names both a function and its CUkernel, and maps what GetParams gives back to
    /// its kernel by them), the launch shape, and the packed arguments with a pointer per
    /// parameter into them (the `kernelParams` GetParams hands out).
    Kernel {
        func: u64,
        kern: u64,
        ctx: u64,
        grid: [u32; 3],
        block: [u32; 3],
        shared_mem: u32,
        args: Arc<KernelArgs>,
    },
    Host {
        f: u64,
        user: u64,
    },
    /// The record as the program passed it (its own layout), with the address the server gave.
    MemAlloc {
        record: Vec<u8>,
        address: u64,
    },
    /// A conditional node's body graphs: the array its parameters point the program at.
    Conditional {
        bodies: Arc<[u64]>,
    },
    /// A batch of stream memory operations: the context as the program named it, a copy of
    /// its operations (the array GetParams points the program at, as the driver points at
    /// the node's own), the flags.
    BatchMemOp {
        ctx: u64,
        ops: Arc<[u8]>,
        flags: u32,
    },
}

/// Packed kernel arguments and a pointer per parameter into them.
pub struct KernelArgs {
    packed: Box<[u8]>,
    pointers: Box<[*mut c_void]>,
}

// SAFETY: the pointers address `packed`, which the record owns and nobody writes.
unsafe impl Send for KernelArgs {}
// SAFETY: as above.
unsafe impl Sync for KernelArgs {}

impl KernelArgs {
    fn new(packed: Vec<u8>, layout: &[(u32, u32)]) -> Arc<KernelArgs> {
        let mut packed = packed.into_boxed_slice();
        let base = packed.as_mut_ptr();
        let pointers = layout.iter().map(|(offset, _)| base.wrapping_add(*offset as usize).cast::<c_void>()).collect();
        Arc::new(KernelArgs { packed, pointers })
    }
}

/// cudaGraphDestroy, cudaGraphExecDestroy and the driver's: a graph or instance the server
/// handed out and the program has not destroyed cannot be refused, so its destroy goes
/// without waiting (torch destroys both when a captured graph is reset: a round trip each
/// at 70 ms). Any other handle (a made-up one, one destroyed already, NULL) waits for the
/// server's answer.
pub unsafe fn destroy_raw(ctx: &Ctx, args: &[u64]) -> u64 {
    let call = ctx.form(Form::Call);
    crate::guard::ffi(ctx.name, crate::runtime::unavailable(call), || {
        let handle = args.first().copied().unwrap_or(0);
        let kind = match call.params.first() {
            Some(Wire::Handle { kind, .. }) => *kind,
            _ => return crate::runtime::unavailable(call),
        };
        let live = handle != 0 && state::CLIENT.ahead.graphs.destroyed(kind, handle);
        let desc = if live { ctx.form(Form::Async) } else { call };
        // SAFETY: the caller's arguments, as the descriptor says (forwarded contract).
        unsafe { crate::runtime::call(desc, args) }
    })
}

/// Instantiation flags whose instance CUDA makes from any graph a host launches:
/// auto-free on launch and node priorities (the runtime's `#define`s have the driver's
/// values; torch passes both). Uploading and device launch have
/// conditions of their own.
const PLAIN_INSTANCE_FLAGS: u64 =
    (chidori_cuda::consts::CUgraphInstantiate_flags_enum::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH
        | chidori_cuda::consts::CUgraphInstantiate_flags_enum::CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY)
        as u64;

/// cudaGraphInstantiateWithFlags, cuGraphInstantiateWithFlags (`raw_args`: the instance's
/// out-pointer, the graph, the flags): the first instance of a live graph the server handed
/// out, with plain flags and no capture active, is named by the client and made without
/// waiting (torch instantiates every graph it captures: a round trip each at 70 ms). Its
/// instantiation failing on the server (a graph CUDA cannot instantiate) surfaces at the
/// next call that waits, as a launch's failure does. A second instance of the same graph
/// (refused where the graph allocates), other flags, a graph the client does not know,
/// and the driver's without a current context wait for the server's answer.
pub unsafe fn instantiate_raw(ctx: &Ctx, args: &[u64]) -> u64 {
    let call = ctx.form(Form::Call);
    crate::guard::ffi(ctx.name, crate::runtime::unavailable(call), || {
        let (out, graph, flags) = match args {
            [out, graph, flags, ..] => (*out, *graph, *flags),
            _ => return crate::runtime::unavailable(call),
        };
        let context = ctx.library != "driver" || crate::custom::context::current().is_some();
        let named = out != 0
            && flags & !PLAIN_INSTANCE_FLAGS == 0
            && context
            && !crate::custom::capture::any_active()
            && state::CLIENT.ahead.graphs.first_instance(graph);
        if !named {
            // SAFETY: the caller's arguments, as the descriptor says (forwarded contract).
            return unsafe { crate::runtime::call(call, args) };
        }
        // SAFETY: the caller's out-pointer (non-null) gets the client's name before the call
        // is sent; the graph and flags are values.
        unsafe { crate::runtime::call(ctx.form(Form::Async), args) }
    })
}

fn records() -> &'static state::Table<u64, NodeRecord> {
    &state::CLIENT.graph_nodes
}

/// Run a hand-written graph function: FFI guard, trace, and (for the runtime) the last error.
fn run(ctx: &Ctx, body: impl FnOnce(&Conn) -> Result<u32, u32>) -> u32 {
    crate::guard::ffi(ctx.name, ctx.codes.invalid_value as u32, || {
        crate::trace::local(ctx.name);
        let status = match conn::get() {
            Ok(conn) => body(&conn).unwrap_or_else(|e| e),
            Err(_) => ctx.codes.unavailable as u32,
        };
        tracing::debug!("{} -> {status}", ctx.name);
        if ctx.library == "cudart" {
            state::set_last_error(status);
        }
        status
    })
}

fn invalid(ctx: &Ctx) -> u32 {
    ctx.codes.invalid_value as u32
}

fn not_supported(ctx: &Ctx, what: &str) -> u32 {
    crate::log::once_owned(&format!("{}: {what}", ctx.name), || {
        tracing::warn!("{}: {what} is not supported by Chidori", ctx.name)
    });
    ctx.codes.not_supported as u32
}

fn api(ctx: &Ctx) -> Api {
    if ctx.library == "cudart" { Api::Runtime } else { Api::Driver }
}

/// # Safety
/// As [`crate::runtime::call_on`].
unsafe fn call(conn: &Conn, desc: &'static CallDesc, args: &[u64]) -> u32 {
    // SAFETY: per the contract.
    unsafe { crate::runtime::call_on(conn, desc, args) as u32 }
}

/// # Safety
/// `p` must be readable for `n` elements of T (or null with `n` 0).
unsafe fn slice<'a, T: Copy>(p: *const c_void, n: usize) -> &'a [T] {
    if p.is_null() || n == 0 {
        return &[];
    }
    // SAFETY: per the contract.
    unsafe { std::slice::from_raw_parts(p as *const T, n) }
}

/// # Safety
/// `p` must be null or writable for a T.
unsafe fn put<T>(p: *mut c_void, v: T) {
    if !p.is_null() {
        // SAFETY: per the contract.
        unsafe { std::ptr::write_unaligned(p as *mut T, v) };
    }
}

/// # Safety
/// `p` must be readable at `offset` for a T.
unsafe fn get<T: Copy>(p: *const c_void, offset: usize) -> T {
    // SAFETY: per the contract.
    unsafe { std::ptr::read_unaligned((p as *const u8).add(offset) as *const T) }
}

/// Ask the worker to make or change a node; the node it made (`Add`) is written to `out`.
fn graph_node(conn: &Conn, request: GraphNode, bulk: &[u8], out: *mut c_void) -> Result<(u64, Vec<u64>, u64), u32> {
    let start = std::time::Instant::now();
    let reply = conn.service(&Service::GraphNode(request), &[bulk]).map_err(|_| NO_SERVER)?;
    crate::trace::bytes("(graph node)", 1, bulk.len() as u64, 0, start.elapsed());
    match reply {
        ServiceReply::Node { node, graphs, address } => {
            // SAFETY: the caller's node handle, when it asked for one.
            unsafe { put(out, node) };
            Ok((node, graphs, address))
        }
        ServiceReply::Error { status, message } => {
            crate::log::once_owned(&message, || tracing::warn!("{message}"));
            Err(status as u32)
        }
        _ => Err(UNEXPECTED_REPLY),
    }
}

/// The target of a node call: a new node after `deps` (edges with data are added after it),
/// or an existing node of a graph or of an executable graph.
#[derive(Clone, Copy)]
enum Target {
    Add { out: *mut c_void, graph: u64, deps: *const c_void, count: usize, edges: *const c_void },
    Set { node: u64 },
    ExecSet { exec: u64, node: u64 },
}

impl Target {
    /// The dependencies, unless edge data that is not all default goes with them (then the
    /// edges are added after the node, with their data).
    fn plain_deps(&self) -> Result<(Vec<u64>, bool), u32> {
        let Target::Add { deps, count, edges, .. } = *self else { return Ok((Vec::new(), false)) };
        // SAFETY: the caller's arrays of `count` nodes and edge data.
        let (nodes, data) = unsafe { (slice::<u64>(deps, count).to_vec(), slice::<u64>(edges, count)) };
        if data.iter().any(|e| *e != 0) {
            return Ok((Vec::new(), true));
        }
        Ok((nodes, false))
    }

    fn node_target(&self, deps: Vec<u64>) -> NodeTarget {
        match *self {
            Target::Add { graph, .. } => NodeTarget::Add { graph, dependencies: deps, edge_data: Vec::new() },
            Target::Set { node } => NodeTarget::Set { node },
            Target::ExecSet { exec, node } => NodeTarget::ExecSet { exec, node },
        }
    }
}

/// After a node was added without its dependencies: add them with their edge data.
fn add_edges(conn: &Conn, ctx: &Ctx, target: Target, node: u64) -> u32 {
    let Target::Add { graph, deps, count, edges, .. } = target else { return 0 };
    let to = vec![node; count];
    let desc: &'static CallDesc = if ctx.library == "cudart" {
        &calls::cudaGraphAddDependencies__cu130
    } else {
        &dcalls::cuGraphAddDependencies_v2
    };
    // SAFETY: the caller's arrays of `count` nodes and edge data; `to` as many.
    unsafe { call(conn, desc, &[graph, deps as u64, to.as_ptr() as u64, edges as u64, count as u64]) }
}

// ---- Kernel nodes ----

/// Where a kernel node's function and arguments come from.
#[derive(Clone, Copy)]
enum KernelFunc {
    /// A runtime host stub or `cudaKernel_t`.
    Runtime(u64),
    /// A driver function (or a CUkernel, turned into the current context's function where
    /// `func` is NULL), and the record's context (0 where it has none).
    Driver { func: u64, kern: u64, ctx: u64 },
}

/// A kernel node's parameters, as the runtime's and the driver's records share them:
/// func@0, grid@8, block@20, shared memory@32, kernelParams@40, extra@48.
struct KernelParams {
    grid: [u32; 3],
    block: [u32; 3],
    shared_mem: u32,
    args: u64,
    extra: u64,
}

/// # Safety
/// `p` is a cudaKernelNodeParams or CUDA_KERNEL_NODE_PARAMS.
unsafe fn kernel_params(p: *const c_void) -> KernelParams {
    // SAFETY: per the contract.
    unsafe {
        KernelParams {
            grid: get(p, 8),
            block: get(p, 20),
            shared_mem: get(p, 32),
            args: get::<u64>(p, 40),
            extra: get::<u64>(p, 48),
        }
    }
}

fn kernel_node(ctx: &Ctx, target: Target, func: KernelFunc, p: *const c_void) -> u32 {
    run(ctx, |conn| {
        if p.is_null() {
            return Err(invalid(ctx));
        }
        // SAFETY: the caller's kernel node parameters.
        let kp = unsafe { kernel_params(p) };
        // What the program named, as it named it.
        let named = match func {
            KernelFunc::Runtime(f) => (f, 0, 0),
            KernelFunc::Driver { func, kern, ctx } => (func, kern, ctx),
        };
        let (function, packed) = match func {
            KernelFunc::Runtime(f) => {
                let kernel = registry::kernel_by_host_fun(f as usize)
                    .or_else(|| registry::kernel_by_handle(f as usize))
                    .ok_or(chidori_cuda::consts::cudaError::cudaErrorInvalidDeviceFunction)?;
                let function = modules::resolve(conn, kernel)
                    .map_err(|_| chidori_cuda::consts::cudaError::cudaErrorInvalidDeviceFunction)?;
                // SAFETY: kernelParams holds a pointer per parameter (the node's contract).
                let packed = unsafe { modules::pack(&function.params, kp.args as *const *const u8) };
                (function, packed)
            }
            KernelFunc::Driver { func, kern, .. } => {
                tracing::debug!("{}: function {func:#x}, kernel {kern:#x}", ctx.name);
                let handle = if func == 0 && kern != 0 {
                    let mut f = 0u64;
                    // SAFETY: a local out-value and the program's kernel handle.
                    let s = unsafe { call(conn, &dcalls::cuKernelGetFunction, &[&mut f as *mut u64 as u64, kern]) };
                    if s != SUCCESS {
                        return Err(s);
                    }
                    f
                } else {
                    func
                };
                super::driver::driver_params(conn, handle, kp.args as *mut c_void, kp.extra as *mut c_void)?
            }
        };
        modules::prepare_mirrors(conn, &function.params, &packed);
        let (deps, later) = target.plain_deps()?;
        let request = GraphNode {
            target: target.node_target(deps),
            params: NodeParams::Kernel {
                function: function.handle,
                grid: kp.grid,
                block: kp.block,
                shared_mem: kp.shared_mem,
            },
            api: api(ctx),
        };
        let out = if let Target::Add { out, .. } = target { out } else { std::ptr::null_mut() };
        let (node, _, _) = graph_node(conn, request, &packed, out)?;
        let node = match target {
            Target::Add { .. } => node,
            Target::Set { node } | Target::ExecSet { node, .. } => node,
        };
        let args = KernelArgs::new(packed, &function.params);
        let record = NodeRecord::Kernel {
            func: named.0,
            kern: named.1,
            ctx: named.2,
            grid: kp.grid,
            block: kp.block,
            shared_mem: kp.shared_mem,
            args,
        };
        if !matches!(target, Target::ExecSet { .. }) {
            records().insert(node, record);
        }
        if later {
            return Ok(add_edges(conn, ctx, target, node));
        }
        Ok(SUCCESS)
    })
}

/// Write a kernel node's parameters from the client's record (`driver`: a
/// CUDA_KERNEL_NODE_PARAMS, 72 bytes in v2, 56 in v1).
fn kernel_get(ctx: &Ctx, node: u64, out: *mut c_void, driver: Option<bool>) -> u32 {
    run(ctx, |_| {
        if out.is_null() {
            return Err(invalid(ctx));
        }
        let Some(NodeRecord::Kernel { func, kern, ctx: context, grid, block, shared_mem, args }) = records().get(&node)
        else {
            return Err(not_supported(ctx, "the parameters of a kernel node this process did not make"));
        };
        tracing::debug!("{}: the node's record holds function {func:#x}, kernel {kern:#x}", ctx.name);
        // A record without a `kern` field gets the kernel in `func` where no function was named.
        let (func, kern) = if driver == Some(true) || func != 0 { (func, kern) } else { (kern, 0) };
        // SAFETY: the caller's record of the version's size; the argument pointers live as
        // long as the client's record of the node.
        unsafe {
            let o = out as *mut u8;
            std::ptr::write_unaligned(o as *mut u64, func);
            std::ptr::write_unaligned(o.add(8) as *mut [u32; 3], grid);
            std::ptr::write_unaligned(o.add(20) as *mut [u32; 3], block);
            std::ptr::write_unaligned(o.add(32) as *mut u32, shared_mem);
            std::ptr::write_unaligned(o.add(40) as *mut u64, args.pointers.as_ptr() as u64);
            std::ptr::write_unaligned(o.add(48) as *mut u64, 0);
            if driver == Some(true) {
                std::ptr::write_unaligned(o.add(56) as *mut u64, kern);
                std::ptr::write_unaligned(o.add(64) as *mut u64, context);
            }
        }
        let _ = &args.packed;
        Ok(SUCCESS)
    })
}

/// Kernel nodes of both APIs, Add, Set and Exec Set (`raw_args`): the runtime's record names
/// its function (host stub or `cudaKernel_t`) first, the driver's its function, kernel and
/// context ([`driver_func`]).
pub unsafe fn kernel_node_raw(ctx: &Ctx, args: &[u64]) -> u64 {
    let (target, rest) = match target(ctx, args) {
        Ok(t) => t,
        Err(e) => return u64::from(e),
    };
    let p = rest.first().copied().unwrap_or(0) as *mut c_void;
    let func = if ctx.library == "driver" {
        // SAFETY: the caller's record.
        unsafe { driver_func(ctx, p) }
    } else {
        // SAFETY: the caller's record (checked non-null in kernel_node).
        KernelFunc::Runtime(if p.is_null() { 0 } else { unsafe { get::<u64>(p, 0) } })
    };
    u64::from(kernel_node(ctx, target, func, p))
}

pub unsafe fn kernel_node_get_params(ctx: &Ctx, node: *mut c_void, out: *mut c_void) -> u32 {
    kernel_get(ctx, node as u64, out, None)
}

/// The driver's function and kernel of a CUDA_KERNEL_NODE_PARAMS (v1 has no kernel).
///
/// # Safety
/// `p` is null or the caller's record of the export's version.
unsafe fn driver_func(ctx: &Ctx, p: *const c_void) -> KernelFunc {
    if p.is_null() {
        return KernelFunc::Driver { func: 0, kern: 0, ctx: 0 };
    }
    // CUDA_KERNEL_NODE_PARAMS_v2 (72 bytes) has the kernel at 56 and the context at 64; v1
    // ends at 56.
    if !ctx.name.ends_with("_v2") {
        // SAFETY: per the contract.
        return KernelFunc::Driver { func: unsafe { get(p, 0) }, kern: 0, ctx: 0 };
    }
    // SAFETY: per the contract.
    unsafe { KernelFunc::Driver { func: get(p, 0), kern: get(p, 56), ctx: get(p, 64) } }
}

pub unsafe fn cu_kernel_node_get_params(ctx: &Ctx, node: *mut c_void, out: *mut c_void) -> u32 {
    kernel_get(ctx, node as u64, out, Some(true))
}

pub unsafe fn cu_kernel_node_get_params_v1(ctx: &Ctx, node: *mut c_void, out: *mut c_void) -> u32 {
    kernel_get(ctx, node as u64, out, Some(false))
}

// ---- Host nodes ----

type HostFn = unsafe extern "C" fn(*mut c_void);

fn host_node(ctx: &Ctx, target: Target, f: u64, user: u64) -> u32 {
    run(ctx, |conn| {
        if f == 0 {
            return Err(invalid(ctx));
        }
        // The function runs on every replay: its registration lives as long as the process.
        let (fu, uu) = (f as usize, user as usize);
        let id = conn.register_callback(
            Arc::new(move |_status| {
                // SAFETY: the program's host function and its data, called as CUDA would.
                unsafe { std::mem::transmute::<usize, HostFn>(fu)(uu as *mut c_void) }
            }),
            0,
            true,
        );
        let (deps, later) = target.plain_deps()?;
        let request = GraphNode { target: target.node_target(deps), params: NodeParams::Host { id }, api: api(ctx) };
        let out = if let Target::Add { out, .. } = target { out } else { std::ptr::null_mut() };
        let node = match graph_node(conn, request, &[], out) {
            Ok((node, _, _)) => node,
            Err(e) => {
                conn.drop_callback(id);
                return Err(e);
            }
        };
        let node = match target {
            Target::Add { .. } => node,
            Target::Set { node } | Target::ExecSet { node, .. } => node,
        };
        if !matches!(target, Target::ExecSet { .. }) {
            records().insert(node, NodeRecord::Host { f, user });
        }
        if later {
            return Ok(add_edges(conn, ctx, target, node));
        }
        Ok(SUCCESS)
    })
}

/// # Safety
/// `p` is null or a host node's parameters (function, user data).
/// The target of a node call from its arguments as words (`raw_args`), by the call's name:
/// `…Exec…SetParams…` names an executable graph's node (exec, node), `…Add…` a new node
/// after dependencies (out, graph, dependencies, count), other calls a graph's node; with
/// the arguments after those.
fn target<'a>(ctx: &Ctx, args: &'a [u64]) -> Result<(Target, &'a [u64]), u32> {
    let word = |i: usize| args.get(i).copied().ok_or(invalid(ctx));
    let name = ctx.name;
    Ok(if name.contains("Exec") {
        (Target::ExecSet { exec: word(0)?, node: word(1)? }, &args[2..])
    } else if name.contains("Add") {
        let (out, deps) = (word(0)? as *mut c_void, word(2)? as *const c_void);
        (Target::Add { out, graph: word(1)?, deps, count: word(3)? as usize, edges: std::ptr::null() }, &args[4..])
    } else {
        (Target::Set { node: word(0)? }, &args[1..])
    })
}

unsafe fn host_params(p: *const c_void) -> (u64, u64) {
    // SAFETY: per the contract.
    if p.is_null() { (0, 0) } else { unsafe { (get(p, 0), get(p, 8)) } }
}

fn host_get(ctx: &Ctx, node: u64, out: *mut c_void) -> u32 {
    run(ctx, |_| {
        if out.is_null() {
            return Err(invalid(ctx));
        }
        let Some(NodeRecord::Host { f, user }) = records().get(&node) else {
            return Err(not_supported(ctx, "the parameters of a host node this process did not make"));
        };
        // SAFETY: the caller's record: function, user data.
        unsafe {
            put(out, f);
            put((out as *mut u8).add(8).cast(), user);
        }
        Ok(SUCCESS)
    })
}

/// cudaGraphAddHostNode, cuGraphAddHostNode and their Set and Exec Set calls (`raw_args`).
pub unsafe fn host_node_raw(ctx: &Ctx, args: &[u64]) -> u64 {
    let (target, rest) = match target(ctx, args) {
        Ok(t) => t,
        Err(e) => return u64::from(e),
    };
    // SAFETY: the caller's record.
    let (f, user) = unsafe { host_params(rest.first().copied().unwrap_or(0) as *const c_void) };
    u64::from(host_node(ctx, target, f, user))
}

pub unsafe fn host_node_get_params(ctx: &Ctx, node: *mut c_void, out: *mut c_void) -> u32 {
    host_get(ctx, node as u64, out)
}

// ---- Memory allocation nodes ----

/// cudaMemAllocNodeParams / CUDA_MEM_ALLOC_NODE_PARAMS (120 bytes): the pool properties
/// (type@0, handle types@4, location@8, max size@24), the access descriptors@88 and their
/// count@96, the size@104 and the address the node allocates@112.
fn mem_alloc_node(ctx: &Ctx, target: Target, p: *mut c_void) -> u32 {
    run(ctx, |conn| {
        if p.is_null() {
            return Err(invalid(ctx));
        }
        // SAFETY: the caller's 120-byte record and its array of access descriptors.
        let (record, params) = unsafe {
            let record = std::slice::from_raw_parts(p as *const u8, 120).to_vec();
            let handle_types: u32 = get(p, 4);
            if handle_types != 0 {
                return Err(not_supported(ctx, "a graph allocation with shareable handles (CUDA IPC)"));
            }
            let count: usize = get(p, 96);
            let descs = slice::<[u32; 3]>(get::<*const c_void>(p, 88), count.min(1 << 16));
            let access = descs.iter().map(|d| (d[0], d[1] as i32, d[2])).collect();
            let params = NodeParams::MemAlloc {
                alloc_type: get(p, 0),
                location: (get(p, 8), get(p, 12)),
                max_size: get(p, 24),
                access,
                bytesize: get(p, 104),
            };
            (record, params)
        };
        let (deps, later) = target.plain_deps()?;
        let Target::Add { out, .. } = target else { return Err(invalid(ctx)) };
        let request = GraphNode { target: target.node_target(deps), params, api: api(ctx) };
        let (node, _, address) = graph_node(conn, request, &[], out)?;
        // SAFETY: the caller's record: the address the node allocates.
        unsafe { put((p as *mut u8).add(112).cast(), address) };
        let size = u64::from_le_bytes(record[104..112].try_into().unwrap_or([0; 8]));
        if address != 0 {
            state::add(address, size, Memory::Device { device: state::current_device() });
            state::graph_allocation(address);
        }
        records().insert(node, NodeRecord::MemAlloc { record, address });
        if later {
            return Ok(add_edges(conn, ctx, target, node));
        }
        Ok(SUCCESS)
    })
}

fn mem_alloc_get(ctx: &Ctx, node: u64, out: *mut c_void) -> u32 {
    run(ctx, |_| {
        if out.is_null() {
            return Err(invalid(ctx));
        }
        let Some(NodeRecord::MemAlloc { record, address }) = records().get(&node) else {
            return Err(not_supported(ctx, "the parameters of an allocation node this process did not make"));
        };
        // SAFETY: the caller's 120-byte record. The access descriptors are the program's
        // own array, as it passed them.
        unsafe {
            std::ptr::copy_nonoverlapping(record.as_ptr(), out as *mut u8, 120);
            put((out as *mut u8).add(112).cast(), address);
        }
        Ok(SUCCESS)
    })
}

pub unsafe fn add_mem_alloc_node(
    ctx: &Ctx,
    out: *mut c_void,
    graph: *mut c_void,
    deps: *mut c_void,
    count: usize,
    p: *mut c_void,
) -> u32 {
    mem_alloc_node(ctx, Target::Add { out, graph: graph as u64, deps, count, edges: std::ptr::null() }, p)
}

pub unsafe fn mem_alloc_node_get_params(ctx: &Ctx, node: *mut c_void, out: *mut c_void) -> u32 {
    mem_alloc_get(ctx, node as u64, out)
}

// ---- Batch memory operation nodes ----

/// A `CUstreamBatchMemOpParams`: a union of 48 bytes, its operation in the first word.
const MEM_OP_BYTES: usize = 48;
/// The most operations one node carries here (the driver documents no limit; this bounds
/// one request: 3 MiB of operations).
const MEM_OPS_MAX: usize = 1 << 16;

/// The word of memory a stream memory operation waits on, writes or reduces into: its
/// address and width (None: a flush or a barrier, which name none, or an operation this
/// client does not know, which the worker refuses). A wait's and a write's address is at 8
/// (their width in the operation), an atomic reduction's at 16 after its data type at 12.
fn mem_op_word(op: &[u8]) -> Option<(u64, u64)> {
    use chidori_cuda::consts::CUstreamAtomicReductionDataType_enum::CU_STREAM_ATOMIC_REDUCTION_UNSIGNED_32 as U32;
    use chidori_cuda::consts::CUstreamBatchMemOpType_enum as t;
    let word = |at: usize, len: usize| -> Option<u64> {
        let mut w = [0u8; 8];
        w[..len].copy_from_slice(op.get(at..at + len)?);
        Some(u64::from_le_bytes(w))
    };
    let operation = word(0, 4)? as u32;
    let (at, len) = match operation {
        t::CU_STREAM_MEM_OP_WAIT_VALUE_32 | t::CU_STREAM_MEM_OP_WRITE_VALUE_32 => (8, 4),
        t::CU_STREAM_MEM_OP_WAIT_VALUE_64 | t::CU_STREAM_MEM_OP_WRITE_VALUE_64 => (8, 8),
        t::CU_STREAM_MEM_OP_ATOMIC_REDUCTION => (16, if word(12, 4)? as u32 == U32 { 4 } else { 8 }),
        _ => return None,
    };
    Some((word(at, 8)?, len))
}

/// CUDA_BATCH_MEM_OP_NODE_PARAMS (v1 and v2 alike, 32 bytes): the context@0, the count@8,
/// the operations@16, the flags@24. A word in the program's pinned, registered or managed
/// memory becomes memory the server mirrors, as a memcpy node's side does; device memory
/// and anything else go as named (the worker refuses memory not the session's).
fn batch_mem_op_node(ctx: &Ctx, target: Target, p: *const c_void) -> u32 {
    run(ctx, |conn| {
        if p.is_null() {
            return Err(invalid(ctx));
        }
        // SAFETY: the caller's record, then its array of `count` operations.
        let (op_ctx, ops, flags) = unsafe {
            let (count, array) = (get::<u32>(p, 8) as usize, get::<*const c_void>(p, 16));
            if count > MEM_OPS_MAX || (count > 0 && array.is_null()) {
                return Err(invalid(ctx));
            }
            (get::<u64>(p, 0), slice::<u8>(array, count * MEM_OP_BYTES).to_vec(), get::<u32>(p, 24))
        };
        for (addr, len) in ops.chunks_exact(MEM_OP_BYTES).filter_map(mem_op_word) {
            let on_client = state::find(addr).is_some_and(|r| !matches!(r.memory, Memory::Device { .. }));
            if on_client && let Err(why) = crate::mirror::for_server(conn, addr, len, crate::mirror::GRAPHS) {
                let what = format!(
                    "a batch memory operation node on the program's memory: the graph replays on the server, which needs that memory mirrored: {why}"
                );
                return Err(not_supported(ctx, &what));
            }
        }
        let (deps, later) = target.plain_deps()?;
        let count = (ops.len() / MEM_OP_BYTES) as u32;
        let params = NodeParams::BatchMemOp { ctx: op_ctx, count, flags };
        let request = GraphNode { target: target.node_target(deps), params, api: api(ctx) };
        let out = if let Target::Add { out, .. } = target { out } else { std::ptr::null_mut() };
        let (made, _, _) = graph_node(conn, request, &ops, out)?;
        let node = match target {
            Target::Add { .. } => made,
            Target::Set { node } | Target::ExecSet { node, .. } => node,
        };
        if !matches!(target, Target::ExecSet { .. }) {
            records().insert(node, NodeRecord::BatchMemOp { ctx: op_ctx, ops: ops.into(), flags });
        }
        if later {
            return Ok(add_edges(conn, ctx, target, node));
        }
        Ok(SUCCESS)
    })
}

pub unsafe fn batch_mem_op_node_raw(ctx: &Ctx, args: &[u64]) -> u64 {
    let (target, rest) = match target(ctx, args) {
        Ok(t) => t,
        Err(e) => return u64::from(e),
    };
    u64::from(batch_mem_op_node(ctx, target, rest.first().copied().unwrap_or(0) as *const c_void))
}

/// cuGraphBatchMemOpNodeGetParams: what the program set, the operations in the client's
/// copy (valid until the node's parameters change, as the driver's array is).
pub unsafe fn batch_mem_op_node_get_params(ctx: &Ctx, node: *mut c_void, out: *mut c_void) -> u32 {
    run(ctx, |_| {
        if out.is_null() {
            return Err(invalid(ctx));
        }
        let Some(NodeRecord::BatchMemOp { ctx: op_ctx, ops, flags }) = records().get(&(node as u64)) else {
            return Err(not_supported(
                ctx,
                "the parameters of a batch memory operation node this process did not make",
            ));
        };
        let out = out as *mut u8;
        // SAFETY: the caller's 32-byte record; the array stays in the node's record.
        unsafe {
            put(out.cast(), op_ctx);
            put(out.add(8).cast(), (ops.len() / MEM_OP_BYTES) as u32);
            put(out.add(16).cast(), ops.as_ptr());
            put(out.add(24).cast(), flags);
        }
        Ok(SUCCESS)
    })
}

// ---- Memcpy nodes: a side in the program's memory is its mirror on the server ----

const D2D: u32 = chidori_cuda::consts::cudaMemcpyKind::cudaMemcpyDeviceToDevice;

/// The status of a node whose copy cannot be made: the library's, or NOT_SUPPORTED with
/// the reason logged.
fn unmirrored(ctx: &Ctx, e: super::arrays::Unmirrored) -> u32 {
    match e {
        super::arrays::Unmirrored::Status(s) => s,
        super::arrays::Unmirrored::Why(why) => {
            let what = format!(
                "a memcpy node: the graph replays on the server, which needs the program's memory mirrored: {why}"
            );
            not_supported(ctx, &what)
        }
    }
}

fn memcpy_node(ctx: &Ctx, target: Target, p: *const c_void, desc: &'static CallDesc) -> u32 {
    run(ctx, |conn| {
        if p.is_null() {
            return Err(invalid(ctx));
        }
        // SAFETY: the caller's cudaMemcpy3DParms.
        let record = unsafe { super::arrays::node_copy_record(conn, p) }.map_err(|e| unmirrored(ctx, e))?;
        send_copy_node(conn, ctx, target, desc, record.as_ptr() as u64, None)
    })
}

/// Send a memcpy node's Add, Set or Exec Set (`desc`) with its checked record; the driver's
/// Add and Exec Set take the copy's context last (`copy_ctx`).
fn send_copy_node(
    conn: &Conn,
    ctx: &Ctx,
    target: Target,
    desc: &'static CallDesc,
    record: u64,
    copy_ctx: Option<u64>,
) -> Result<u32, u32> {
    let (deps, later) = target.plain_deps()?;
    let mut args = match target {
        Target::Add { out, graph, count, .. } => {
            vec![out as u64, graph, deps.as_ptr() as u64, if later { 0 } else { count as u64 }, record]
        }
        Target::Set { node } => vec![node, record],
        Target::ExecSet { exec, node } => vec![exec, node, record],
    };
    if !matches!(target, Target::Set { .. }) {
        args.extend(copy_ctx);
    }
    // SAFETY: the record lives across the call; the caller's arrays and out-pointer.
    let s = unsafe { call(conn, desc, &args) };
    if let Target::Add { out, .. } = target
        && s == SUCCESS
        && later
    {
        // SAFETY: the caller's out-pointer, just written.
        return Ok(add_edges(conn, ctx, target, unsafe { std::ptr::read_unaligned(out as *const u64) }));
    }
    Ok(s)
}

/// A driver memcpy node (Add, Set, Exec Set): the copy resolved by [`node_copy_3d`].
fn cu_memcpy_node(ctx: &Ctx, target: Target, copy: *const c_void, copy_ctx: u64) -> u32 {
    run(ctx, |conn| {
        // SAFETY: the caller's record.
        let record = unsafe { super::arrays::node_copy_3d(conn, copy) }.map_err(|e| unmirrored(ctx, e))?;
        let desc = match target {
            Target::Add { .. } => &dcalls::cuGraphAddMemcpyNode__call,
            Target::Set { .. } => &dcalls::cuGraphMemcpyNodeSetParams__call,
            Target::ExecSet { .. } => &dcalls::cuGraphExecMemcpyNodeSetParams__call,
        };
        send_copy_node(conn, ctx, target, desc, record.as_ptr() as u64, Some(copy_ctx))
    })
}

/// A 1D copy node: a side in the program's memory is its mirror, and the copy one between
/// addresses the server has (the form fixes the kind).
fn memcpy_1d(ctx: &Ctx, target: Target, dst: u64, src: u64, count: u64, kind: u32, desc: &'static CallDesc) -> u32 {
    run(ctx, |conn| {
        let (dst_dev, src_dev) = super::memory::direction(kind, dst, src)
            .ok_or(chidori_cuda::consts::cudaError::cudaErrorInvalidMemcpyDirection)?;
        for (on_server, side) in [(dst_dev, dst), (src_dev, src)] {
            if !on_server {
                crate::mirror::for_server(conn, side, count, crate::mirror::GRAPHS)
                    .map_err(|why| unmirrored(ctx, super::arrays::Unmirrored::Why(why)))?;
            }
        }
        let kind = u64::from(D2D);
        // SAFETY (all arms): device addresses and handles by value, the caller's arrays.
        let s = unsafe {
            match target {
                Target::Add { out, graph, deps, count: n, .. } => {
                    call(conn, desc, &[out as u64, graph, deps as u64, n as u64, dst, src, count, kind])
                }
                Target::Set { node } => call(conn, desc, &[node, dst, src, count, kind]),
                Target::ExecSet { exec, node } => call(conn, desc, &[exec, node, dst, src, count, kind]),
            }
        };
        Ok(s)
    })
}

/// A symbol's device address (its module loaded), checked against `offset + count`.
fn symbol_at(ctx: &Ctx, symbol: u64, offset: usize, count: usize) -> Result<u64, u32> {
    let conn = conn::get().map_err(|_| ctx.codes.unavailable as u32)?;
    let var = registry::variable_by_host_var(symbol as usize)
        .ok_or(chidori_cuda::consts::cudaError::cudaErrorInvalidSymbol)?;
    let address =
        modules::variable_address(&conn, var).map_err(|_| chidori_cuda::consts::cudaError::cudaErrorInvalidSymbol)?;
    if offset.checked_add(count).is_none_or(|end| end > var.size) {
        return Err(invalid(ctx));
    }
    // The variable is device memory the node copies.
    state::add(address, var.size as u64, Memory::Device { device: state::current_device() });
    Ok(address + offset as u64)
}

/// The 1D copy node form of the runtime for a target.
fn form_1d(target: &Target) -> &'static CallDesc {
    match target {
        Target::Add { .. } => &calls::cudaGraphAddMemcpyNode1D__call,
        Target::Set { .. } => &calls::cudaGraphMemcpyNodeSetParams1D__call,
        Target::ExecSet { .. } => &calls::cudaGraphExecMemcpyNodeSetParams1D__call,
    }
}

fn to_symbol(ctx: &Ctx, target: Target, symbol: u64, src: u64, count: usize, offset: usize, kind: u32) -> u32 {
    match symbol_at(ctx, symbol, offset, count) {
        Ok(dst) => memcpy_1d(ctx, target, dst, src, count as u64, kind, form_1d(&target)),
        Err(e) => run(ctx, |_| Err(e)),
    }
}

fn from_symbol(ctx: &Ctx, target: Target, dst: u64, symbol: u64, count: usize, offset: usize, kind: u32) -> u32 {
    match symbol_at(ctx, symbol, offset, count) {
        Ok(src) => memcpy_1d(ctx, target, dst, src, count as u64, kind, form_1d(&target)),
        Err(e) => run(ctx, |_| Err(e)),
    }
}

/// Every memcpy node call (`raw_args`): cudaGraphAddMemcpyNode (3D), its 1D, to-symbol and
/// from-symbol forms, the driver's cuGraphAddMemcpyNode, and the Set and Exec Set calls of
/// each; the form by the call's name, the target by [`target`].
pub unsafe fn memcpy_node_raw(ctx: &Ctx, args: &[u64]) -> u64 {
    let (target, rest) = match target(ctx, args) {
        Ok(t) => t,
        Err(e) => return u64::from(e),
    };
    let word = |i: usize| rest.get(i).copied().unwrap_or(0);
    let name = ctx.name;
    let status = if name.ends_with("ToSymbol") {
        // (symbol, src, count, offset, kind)
        to_symbol(ctx, target, word(0), word(1), word(2) as usize, word(3) as usize, word(4) as u32)
    } else if name.ends_with("FromSymbol") {
        // (dst, symbol, count, offset, kind)
        from_symbol(ctx, target, word(0), word(1), word(2) as usize, word(3) as usize, word(4) as u32)
    } else if name.ends_with("1D") {
        // (dst, src, count, kind)
        memcpy_1d(ctx, target, word(0), word(1), word(2), word(3) as u32, ctx.form(Form::Call))
    } else if ctx.library == "driver" {
        // (copy parameters[, the copy's context]): Set takes no context.
        cu_memcpy_node(ctx, target, word(0) as *const c_void, word(1))
    } else {
        memcpy_node(ctx, target, word(0) as *const c_void, ctx.form(Form::Call))
    };
    u64::from(status)
}

// ---- Union-typed node parameters: each type goes as its own call ----

/// cudaGraphNodeType / CUgraphNodeType (the same values).
mod ty {
    pub use chidori_cuda::consts::CUgraphNodeType_enum::{
        CU_GRAPH_NODE_TYPE_BATCH_MEM_OP as BATCH_MEM_OP, CU_GRAPH_NODE_TYPE_CONDITIONAL as CONDITIONAL,
        CU_GRAPH_NODE_TYPE_EMPTY as EMPTY, CU_GRAPH_NODE_TYPE_EVENT_RECORD as EVENT_RECORD,
        CU_GRAPH_NODE_TYPE_GRAPH as GRAPH, CU_GRAPH_NODE_TYPE_HOST as HOST, CU_GRAPH_NODE_TYPE_KERNEL as KERNEL,
        CU_GRAPH_NODE_TYPE_MEM_ALLOC as MEM_ALLOC, CU_GRAPH_NODE_TYPE_MEM_FREE as MEM_FREE,
        CU_GRAPH_NODE_TYPE_MEMCPY as MEMCPY, CU_GRAPH_NODE_TYPE_MEMSET as MEMSET,
        CU_GRAPH_NODE_TYPE_WAIT_EVENT as WAIT_EVENT,
    };
}

/// A plain node (memset, child graph, events, empty, memory free) through its own
/// forwarded call; the union's member starts at 16.
fn plain_node(ctx: &Ctx, conn: &Conn, target: Target, kind: u32, p: *const c_void) -> Result<u32, u32> {
    let runtime = ctx.library == "cudart";
    let member = p as u64 + 16;
    // SAFETY: the caller's record: an 8-byte handle or address at the member's start.
    let first: u64 = unsafe { get(p, 16) };
    let (deps, later) = target.plain_deps()?;
    let (out, graph, n) = match target {
        Target::Add { out, graph, count, .. } => (out as u64, graph, if later { 0 } else { count as u64 }),
        _ => (0, 0, 0),
    };
    let d = deps.as_ptr() as u64;
    type Pick = (&'static CallDesc, Vec<u64>);
    let add = |desc: &'static CallDesc, extra: &[u64]| -> Pick {
        let mut a = vec![out, graph, d, n];
        a.extend_from_slice(extra);
        (desc, a)
    };
    let picked: Option<Pick> = match (target, kind) {
        (Target::Add { .. }, ty::EMPTY) => {
            Some(add(if runtime { &calls::cudaGraphAddEmptyNode } else { &dcalls::cuGraphAddEmptyNode }, &[]))
        }
        (Target::Add { .. }, ty::MEMSET) => Some(if runtime {
            add(&calls::cudaGraphAddMemsetNode, &[member])
        } else {
            // SAFETY: CUDA_MEMSET_NODE_PARAMS_v2: the context at 40.
            add(&dcalls::cuGraphAddMemsetNode, &[member, unsafe { get(p, 16 + 40) }])
        }),
        (Target::Add { .. }, ty::GRAPH) => Some(add(
            if runtime { &calls::cudaGraphAddChildGraphNode } else { &dcalls::cuGraphAddChildGraphNode },
            &[first],
        )),
        (Target::Add { .. }, ty::WAIT_EVENT) => Some(add(
            if runtime { &calls::cudaGraphAddEventWaitNode } else { &dcalls::cuGraphAddEventWaitNode },
            &[first],
        )),
        (Target::Add { .. }, ty::EVENT_RECORD) => Some(add(
            if runtime { &calls::cudaGraphAddEventRecordNode } else { &dcalls::cuGraphAddEventRecordNode },
            &[first],
        )),
        (Target::Add { .. }, ty::MEM_FREE) => {
            Some(add(if runtime { &calls::cudaGraphAddMemFreeNode } else { &dcalls::cuGraphAddMemFreeNode }, &[first]))
        }
        (Target::Set { node }, ty::MEMSET) => Some(if runtime {
            (&calls::cudaGraphMemsetNodeSetParams, vec![node, member])
        } else {
            (&dcalls::cuGraphMemsetNodeSetParams, vec![node, member])
        }),
        (Target::Set { node }, ty::WAIT_EVENT) => Some(if runtime {
            (&calls::cudaGraphEventWaitNodeSetEvent, vec![node, first])
        } else {
            (&dcalls::cuGraphEventWaitNodeSetEvent, vec![node, first])
        }),
        (Target::Set { node }, ty::EVENT_RECORD) => Some(if runtime {
            (&calls::cudaGraphEventRecordNodeSetEvent, vec![node, first])
        } else {
            (&dcalls::cuGraphEventRecordNodeSetEvent, vec![node, first])
        }),
        (Target::ExecSet { exec, node }, ty::MEMSET) => Some(if runtime {
            (&calls::cudaGraphExecMemsetNodeSetParams, vec![exec, node, member])
        } else {
            // SAFETY: as above.
            (&dcalls::cuGraphExecMemsetNodeSetParams, vec![exec, node, member, unsafe { get(p, 16 + 40) }])
        }),
        (Target::ExecSet { exec, node }, ty::GRAPH) => Some(if runtime {
            (&calls::cudaGraphExecChildGraphNodeSetParams, vec![exec, node, first])
        } else {
            (&dcalls::cuGraphExecChildGraphNodeSetParams, vec![exec, node, first])
        }),
        (Target::ExecSet { exec, node }, ty::WAIT_EVENT) => Some(if runtime {
            (&calls::cudaGraphExecEventWaitNodeSetEvent, vec![exec, node, first])
        } else {
            (&dcalls::cuGraphExecEventWaitNodeSetEvent, vec![exec, node, first])
        }),
        (Target::ExecSet { exec, node }, ty::EVENT_RECORD) => Some(if runtime {
            (&calls::cudaGraphExecEventRecordNodeSetEvent, vec![exec, node, first])
        } else {
            (&dcalls::cuGraphExecEventRecordNodeSetEvent, vec![exec, node, first])
        }),
        _ => None,
    };
    let Some((desc, args)) = picked else {
        return Err(not_supported(ctx, &format!("node parameters of type {kind} for this call")));
    };
    // SAFETY: the descriptor's parameters: the caller's out-pointer and records, handles.
    let s = unsafe { call(conn, desc, &args) };
    if s == SUCCESS
        && later
        && let Target::Add { out, .. } = target
    {
        // SAFETY: written by the reply.
        return Ok(add_edges(conn, ctx, target, unsafe { std::ptr::read_unaligned(out as *const u64) }));
    }
    Ok(s)
}

/// A conditional node: its body graphs come back from the worker, and the parameters'
/// `phGraph_out` is set to an array of them (CUDA's is its own, living as long as the node;
/// the client's lives as long as its record of the node).
fn conditional_node(ctx: &Ctx, conn: &Conn, target: Target, p: *const c_void) -> Result<u32, u32> {
    let Target::Add { out, .. } = target else {
        return Err(not_supported(ctx, "changing a conditional node"));
    };
    // SAFETY: the caller's record: handle@16, type@24, size@28, phGraph_out@32.
    let (handle, kind, size) = unsafe { (get::<u64>(p, 16), get::<u32>(p, 24), get::<u32>(p, 28)) };
    if size == 0 || size > 64 {
        return Err(invalid(ctx));
    }
    let (deps, later) = target.plain_deps()?;
    let request = GraphNode {
        target: target.node_target(deps),
        params: NodeParams::Conditional { handle, kind, size },
        api: api(ctx),
    };
    let (node, graphs, _) = graph_node(conn, request, &[], out)?;
    if graphs.len() != size as usize {
        return Err(invalid(ctx));
    }
    let bodies: Arc<[u64]> = graphs.into();
    // SAFETY: the caller's record (CUDA writes phGraph_out into it: it is not const).
    unsafe { put((p as *mut u8).add(32).cast(), bodies.as_ptr() as u64) };
    records().insert(node, NodeRecord::Conditional { bodies });
    if later {
        return Ok(add_edges(conn, ctx, target, node));
    }
    Ok(SUCCESS)
}

fn node_params(ctx: &Ctx, target: Target, p: *mut c_void) -> u32 {
    if p.is_null() {
        return run(ctx, |_| Err(invalid(ctx)));
    }
    // SAFETY: the caller's cudaGraphNodeParams / CUgraphNodeParams.
    let kind: u32 = unsafe { get(p, 0) };
    let member = (p as *mut u8).wrapping_add(16).cast::<c_void>();
    let runtime = ctx.library == "cudart";
    match kind {
        ty::KERNEL => {
            // SAFETY: the kernel member's function (and, for the driver, its kernel at 56).
            let func = unsafe {
                if runtime {
                    KernelFunc::Runtime(get(member, 0))
                } else {
                    KernelFunc::Driver { func: get(member, 0), kern: get(member, 56), ctx: get(member, 64) }
                }
            };
            kernel_node(ctx, target, func, member)
        }
        ty::HOST => {
            // SAFETY: the host member.
            let (f, user) = unsafe { host_params(member) };
            host_node(ctx, target, f, user)
        }
        ty::MEM_ALLOC => mem_alloc_node(ctx, target, member),
        ty::MEMCPY if runtime => {
            // cudaMemcpyNodeParams: the copy at 16 of the member.
            let copy = (member as *mut u8).wrapping_add(16).cast::<c_void>();
            let desc = match target {
                Target::Add { .. } => &calls::cudaGraphAddMemcpyNode__call,
                Target::Set { .. } => &calls::cudaGraphMemcpyNodeSetParams__call,
                Target::ExecSet { .. } => &calls::cudaGraphExecMemcpyNodeSetParams__call,
            };
            memcpy_node(ctx, target, copy, desc)
        }
        ty::MEMCPY => {
            // CUDA_MEMCPY_NODE_PARAMS: the context at 8, the copy at 16.
            // SAFETY: the caller's record.
            let (copy_ctx, copy) = unsafe { (get::<u64>(member, 8), (member as *const u8).add(16).cast()) };
            cu_memcpy_node(ctx, target, copy, copy_ctx)
        }
        ty::CONDITIONAL => run(ctx, |conn| conditional_node(ctx, conn, target, p)),
        ty::BATCH_MEM_OP if !runtime => batch_mem_op_node(ctx, target, member),
        other => run(ctx, |conn| plain_node(ctx, conn, target, other, p)),
    }
}

/// cudaGraphAddNode, cuGraphAddNode (with edge data per dependency from 13.0: six
/// arguments) and their Set and Exec Set calls (`raw_args`).
pub unsafe fn node_raw(ctx: &Ctx, args: &[u64]) -> u64 {
    let word = |i: usize| args.get(i).copied().unwrap_or(0);
    let (target, p) = if ctx.name.contains("Add") && args.len() == 6 {
        let (out, deps, edges) = (word(0) as *mut c_void, word(2) as *const c_void, word(3) as *const c_void);
        (Target::Add { out, graph: word(1), deps, count: word(4) as usize, edges }, word(5))
    } else {
        match target(ctx, args) {
            Ok((t, rest)) => (t, rest.first().copied().unwrap_or(0)),
            Err(e) => return u64::from(e),
        }
    };
    u64::from(node_params(ctx, target, p as *mut c_void))
}

// ---- Node arrays ----

/// The worker's answer to a node list query.
#[derive(Clone)]
pub struct Listed {
    pub nodes: Vec<u64>,
    pub peers: Vec<u64>,
    pub edge_data: Vec<u64>,
    pub capture: Option<(u32, u64, u64)>,
}

/// The nodes of the graph a capture's end just made (asked in the end's round trip), with
/// the fork count and the connection's sent count then: trusted while nothing was sent
/// since (torch asks for the count right after the end; anything sent may change the graph).
static ENDED: std::sync::Mutex<Option<(u64, u64, u64, Listed)>> = std::sync::Mutex::new(None);

/// A capture's end made `graph`, whose nodes are `listed`; `sent`: the connection's sent
/// count right after the end and the question (anything else sent meanwhile, by any
/// thread, and the list is not trusted).
pub fn capture_ended(graph: u64, listed: Listed, sent: u64) {
    *ENDED.lock().unwrap_or_else(|p| p.into_inner()) = Some((graph, conn::forks(), sent, listed));
}

/// `graph`'s nodes as its capture's end found them, where nothing was sent since.
fn ended_nodes(conn: &Conn, graph: u64) -> Option<Listed> {
    let ended = ENDED.lock().unwrap_or_else(|p| p.into_inner());
    let (g, forks, sent, listed) = ended.as_ref()?;
    (*g == graph && *forks == conn::forks() && *sent == conn.sent_so_far()).then(|| listed.clone())
}

pub fn list(conn: &Conn, query: GraphList) -> Result<Listed, u32> {
    let start = std::time::Instant::now();
    let reply = conn.service(&Service::GraphList(query), &[]).map_err(|_| NO_SERVER)?;
    crate::trace::bytes("(graph nodes)", 1, 0, 0, start.elapsed());
    match reply {
        ServiceReply::Nodes { nodes, peers, edge_data, capture } => Ok(Listed { nodes, peers, edge_data, capture }),
        ServiceReply::Error { status, .. } => Err(status as u32),
        _ => Err(UNEXPECTED_REPLY),
    }
}

/// cudaErrorLossyQuery / CUDA_ERROR_LOSSY_QUERY (the same value): edges with data asked
/// without it.
const LOSSY_QUERY: u32 = chidori_cuda::consts::cudaError::cudaErrorLossyQuery;
const _: () = assert!(LOSSY_QUERY == chidori_cuda::consts::cudaError_enum::CUDA_ERROR_LOSSY_QUERY);

/// Fill the caller's arrays (each may be null) with up to `*count` entries; `*count`
/// becomes the number of entries (all of them when the arrays are null).
fn fill(ctx: &Ctx, listed: &Listed, arrays: [*mut c_void; 3], count: *mut c_void) -> Result<u32, u32> {
    if count.is_null() {
        return Err(invalid(ctx));
    }
    let total = listed.nodes.len();
    if arrays.iter().all(|a| a.is_null()) {
        // SAFETY: the caller's size_t.
        unsafe { put(count, total) };
        return Ok(SUCCESS);
    }
    // SAFETY: the caller's size_t, then its arrays of that many elements.
    let capacity: usize = unsafe { get(count, 0) };
    let n = capacity.min(total);
    let lossy = arrays[2].is_null() && listed.edge_data.iter().any(|e| *e != 0);
    let columns = [&listed.nodes, &listed.peers, &listed.edge_data];
    for (array, column) in arrays.iter().zip(columns) {
        if array.is_null() {
            continue;
        }
        for i in 0..capacity {
            let v = if i < n { column.get(i).copied().unwrap_or(0) } else { 0 };
            // SAFETY: the caller's array of `capacity` 8-byte elements.
            unsafe { put((*array as *mut u64).add(i).cast(), v) };
        }
    }
    // SAFETY: as above.
    unsafe { put(count, n) };
    Ok(if lossy { LOSSY_QUERY } else { 0 })
}

fn nodes_query(ctx: &Ctx, query: GraphList, arrays: [*mut c_void; 3], count: *mut c_void) -> u32 {
    run(ctx, |conn| {
        let listed = list(conn, query)?;
        fill(ctx, &listed, arrays, count)
    })
}

fn none() -> *mut c_void {
    std::ptr::null_mut()
}

/// A node's dependencies or dependents: `edges` is None before edge data existed (the
/// call has no array for it, and nothing to lose).
fn node_peers(ctx: &Ctx, query: GraphList, deps: *mut c_void, edges: Option<*mut c_void>, count: *mut c_void) -> u32 {
    run(ctx, |conn| {
        let mut listed = list(conn, query)?;
        let Some(edges) = edges else {
            listed.edge_data.clear();
            return fill(ctx, &listed, [deps, none(), none()], count);
        };
        // Edge data is the second column of a node list.
        listed.peers = std::mem::take(&mut listed.edge_data);
        let lossy = edges.is_null() && listed.peers.iter().any(|e| *e != 0);
        let s = fill(ctx, &listed, [deps, edges, none()], count)?;
        Ok(if lossy && !deps.is_null() { LOSSY_QUERY } else { s })
    })
}

/// Node lists (`raw_args`; the count pointer last): a graph's nodes or root nodes (graph,
/// nodes), its edges (graph, from, to[, edge data]), a node's dependencies or dependents
/// (node, nodes[, edge data]). The edge-data arrays came with CUDA 12.3's forms, one
/// argument longer; before them, edges have no data to lose.
pub unsafe fn list_raw(ctx: &Ctx, args: &[u64]) -> u64 {
    let word = |i: usize| args.get(i).copied().unwrap_or(0);
    let p = |i: usize| word(i) as *mut c_void;
    let (name, n) = (ctx.name, args.len());
    let count = p(n.saturating_sub(1));
    let status = if name.contains("GetRootNodes") {
        nodes_query(ctx, GraphList::RootNodes { graph: word(0) }, [p(1), none(), none()], count)
    } else if name.contains("GetNodes") {
        let graph = word(0);
        run(ctx, |conn| {
            let listed = match ended_nodes(conn, graph) {
                Some(listed) => listed,
                None => list(conn, GraphList::Nodes { graph })?,
            };
            fill(ctx, &listed, [p(1), none(), none()], count)
        })
    } else if name.contains("GetEdges") && n == 4 {
        run(ctx, |conn| {
            let mut listed = list(conn, GraphList::Edges { graph: word(0) })?;
            listed.edge_data.clear();
            fill(ctx, &listed, [p(1), p(2), none()], count)
        })
    } else if name.contains("GetEdges") {
        nodes_query(ctx, GraphList::Edges { graph: word(0) }, [p(1), p(2), p(3)], count)
    } else {
        let node = word(0);
        let query = if name.contains("Dependencies") {
            GraphList::Dependencies { node }
        } else {
            GraphList::Dependents { node }
        };
        node_peers(ctx, query, p(1), (n == 4).then(|| p(2)), count)
    };
    u64::from(status)
}
