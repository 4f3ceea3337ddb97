//! Stream capture, tracked on the client.
//!
//! Capture itself happens on the server: every stream-ordered call travels in order and the
//! server's driver records it. The client remembers which streams it began capturing so
//! that, while none is, capture status (which torch asks before many operations) is
//! answered without a round trip, and so that a copy between the program's memory and a
//! capturing stream names the server's mirror of that memory (`crate::mirror::for_server`),
//! not a staging buffer the graph would keep the address of (DESIGN §5, notes §7.2).
//!
//! While a capture is active, a stream's capture status, id and graph, once the worker
//! has said them, answer later questions about that stream (torch's allocator asks on every
//! allocation: 1,071 round trips in one decode warm-up on the H200) until something may
//! change them: a capture begun or ended, a stream waiting on an event (it may join a
//! capture), capture dependencies updated, or any call failing (an illegal call invalidates
//! the capture it ran in). A question about the frontier (the dependency nodes) is always
//! the worker's: every captured call moves it. What is followed lives in
//! [`crate::ahead::capture`]; this module answers the program from it.
#![allow(non_snake_case, clippy::missing_safety_doc)]

use std::ffi::c_void;

use chidori_cuda::calls::cudart;
use chidori_protocol::desc::{CallDesc, Ctx, Form, PER_THREAD_STREAM, stream_meant};
use chidori_protocol::messages::{self, GraphList};

use crate::ahead::capture::{Answer, Captures, StreamKey};
use crate::conn::{self, Asked};

fn captures() -> &'static Captures {
    &crate::state::CLIENT.ahead.captures
}

/// Whether any capture may be active in this process.
pub fn any_active() -> bool {
    captures().any_active()
}

/// The key of a stream's answer: the per-thread default stream is each thread's own.
fn key(stream: u64) -> StreamKey {
    (stream, if stream == PER_THREAD_STREAM { crate::runtime::thread_id() } else { 0 })
}

fn learned_answer(stream: u64) -> Option<Answer> {
    captures().answer(key(stream))
}

const ACTIVE: u32 = chidori_cuda::consts::cudaStreamCaptureStatus::cudaStreamCaptureStatusActive;
const NONE: u32 = chidori_cuda::consts::cudaStreamCaptureStatus::cudaStreamCaptureStatusNone;
const SUCCESS: u32 = chidori_cuda::consts::cudaError::cudaSuccess;
const INVALID_VALUE: u32 = chidori_cuda::consts::cudaError::cudaErrorInvalidValue;
const NO_DEVICE: u32 = chidori_cuda::consts::cudaError::cudaErrorNoDevice;
pub const CAPTURE_UNSUPPORTED: u32 = chidori_cuda::consts::cudaError::cudaErrorStreamCaptureUnsupported;

fn call(desc: &'static CallDesc, args: &[u64], no_device: u32) -> Result<u32, u32> {
    let conn = conn::get().map_err(|_| no_device)?;
    // SAFETY: handles by value and the caller's out-pointers, as the descriptor says.
    Ok(unsafe { crate::runtime::call_on(&conn, desc, args) } as u32)
}

/// The modes a capture begins in (global, thread-local, relaxed).
const MODES: u64 = 3;

/// Whether a begin on `stream` (as [`per_thread`] resolved it) with `args` can be told to
/// succeed on the client: no capture is active in the process (a stream that joined one
/// cannot begin another), the stream is not the legacy default stream (which cannot
/// capture), the mode is one CUDA has, and for the driver a context is current. What it
/// cannot see (a stream handle of no one's) fails on the server and surfaces at the next
/// call that waits, as a launch's failure does.
fn begins_surely(args: &[u64], stream: u64, runtime: bool) -> bool {
    const LEGACY: u64 = 1;
    !any_active()
        && stream != 0
        && stream != LEGACY
        && args.get(1).is_none_or(|&mode| mode < MODES)
        && (runtime || crate::custom::context::current().is_some())
}

/// A begin sent without waiting: the client names the capture's id and graph itself
/// (`Service::CaptureNamed`, right behind the begin on the same thread), so the capture's
/// status, id and graph are known at once (torch asks for the id right after it begins).
fn begin_unwaited(conn: &conn::Conn, desc: &'static CallDesc, args: &[u64], stream: u64) -> Result<u32, u32> {
    // Begun (and its answer kept) before it is sent: a failure on the server may come back
    // before this thread goes on, and it must find the capture to end what was kept.
    let before = captures().epoch();
    let (id, graph) = (crate::state::next_handle_name(), crate::state::next_handle_name());
    captures().began(stream);
    captures().learn(key(stream), before + 1, (ACTIVE, id, graph));
    // SAFETY: a begin's arguments are values (a stream, a mode).
    let status = unsafe { crate::runtime::call_on(conn, desc, args) } as u32;
    if status != SUCCESS || conn.post_service(&messages::Service::CaptureNamed { stream, id, graph }, &[]).is_err() {
        captures().ended(stream);
    }
    Ok(status)
}

/// A capture's begin, with the new capture's status, id and graph asked in the same round
/// trip: torch asks for the id right after it begins (`cudaStreamGetCaptureInfo`), and the
/// begin changes what the client knew of captures, so that question waited a round trip of
/// its own. The begin's status is the server's, as it was. Where the client can tell the
/// begin succeeds (`unwaited`: the form without a reply) it waits for nothing
/// ([`begin_unwaited`]).
fn begin(
    name: &'static str,
    desc: &'static CallDesc,
    unwaited: Option<&'static CallDesc>,
    args: &[u64],
    ptsz: bool,
    runtime: bool,
) -> u32 {
    guarded(name, runtime, || {
        let no_device = no_device(runtime);
        let conn = conn::get().map_err(|_| no_device)?;
        let stream = stream_meant(args[0], ptsz);
        if let Some(unwaited) = unwaited.filter(|_| begins_surely(args, stream, runtime)) {
            return begin_unwaited(&conn, unwaited, args, stream);
        }
        let before = captures().epoch();
        let question = messages::Service::GraphList(GraphList::Capture { stream });
        // SAFETY: a begin's arguments are values (a stream, a mode).
        let (status, asked) = unsafe { crate::runtime::call_asking(&conn, desc, args, Some(&question)) };
        let status = status as u32;
        if status != SUCCESS {
            captures().changed();
            return Ok(status);
        }
        captures().began(stream);
        // Kept only where nothing else changed captures meanwhile (the begin's own change
        // is the one epoch step).
        if let Some(Ok(messages::ServiceReply::Nodes { capture: Some(answer), .. })) = asked.map(Asked::answer) {
            captures().learn(key(stream), before + 1, answer);
        }
        Ok(status)
    })
}

/// A capture's end, with the nodes of the graph it made asked in the same round trip
/// (`GraphList::Ended`, which the worker answers only for an end that succeeded): torch
/// asks for the graph's node count right after the end, a round trip of its own before.
fn end(name: &'static str, desc: &'static CallDesc, args: &[u64], ptsz: bool, runtime: bool) -> u32 {
    guarded(name, runtime, || {
        let conn = conn::get().map_err(|_| no_device(runtime))?;
        let stream = stream_meant(args[0], ptsz);
        let sent_before = conn.sent_so_far();
        // Without a graph out-pointer there is no graph for the program to ask about.
        let question = (args[1] != 0).then_some(messages::Service::GraphList(GraphList::Ended { stream }));
        // SAFETY: a stream by value and the caller's graph out-pointer, which the reply fills.
        let (status, asked) = unsafe { crate::runtime::call_asking(&conn, desc, args, question.as_ref()) };
        let status = status as u32;
        // Ended, successfully or invalidated; a stream that was not capturing is no change.
        captures().ended(stream);
        if status == SUCCESS && args[1] != 0 {
            // SAFETY: the caller's graph out-pointer, checked non-null, filled by the reply.
            let graph = unsafe { std::ptr::read_unaligned(args[1] as *const u64) };
            if let Some(Ok(messages::ServiceReply::Nodes { nodes, peers, edge_data, .. })) = asked.map(Asked::answer) {
                let listed = crate::custom::graphs::Listed { nodes, peers, edge_data, capture: None };
                crate::custom::graphs::capture_ended(graph, listed, sent_before + 2);
            }
        }
        Ok(status)
    })
}

fn is_capturing(name: &'static str, desc: &'static CallDesc, stream: u64, out: *mut c_void, runtime: bool) -> u32 {
    guarded(name, runtime, || {
        if out.is_null() {
            crate::trace::local(name);
            return Err(INVALID_VALUE);
        }
        let known =
            if any_active() { learned_answer(stream_meant(stream, desc.name.ends_with("_ptsz"))) } else { None };
        if !any_active() || known.is_some() {
            crate::trace::local(name);
            let status = known.map_or(NONE, |(status, _, _)| status);
            // SAFETY: the caller's capture-status enum, checked non-null.
            unsafe { std::ptr::write_unaligned(out as *mut u32, status) };
            return Ok(SUCCESS);
        }
        call(desc, &[stream, out as u64], no_device(runtime))
    })
}

/// Whether `stream` is capturing right now (a round trip, only while some capture is active).
pub fn stream_capturing(stream: u64, ptsz: bool) -> bool {
    if !any_active() {
        return false;
    }
    let desc = if ptsz { &cudart::cudaStreamIsCapturing_ptsz__call } else { &cudart::cudaStreamIsCapturing__call };
    let mut status = 0u32;
    matches!(call(desc, &[stream, &mut status as *mut u32 as u64], NO_DEVICE), Ok(SUCCESS)) && status == ACTIVE
}

/// A stream-ordered allocation succeeded, its address at `out`, on `stream` (as the per-thread
/// forms resolved it): made on a capturing stream, it is the graph's, allocated at the same
/// address at each launch ([`crate::state::graph_allocation`]).
pub fn note_allocation(out: *mut c_void, stream: u64) {
    // The runtime's and the driver's per-thread stream handles are both 2.
    if out.is_null() || !stream_capturing(stream, false) {
        return;
    }
    // SAFETY: the caller's out-pointer, which the reply just wrote.
    let base = unsafe { std::ptr::read_unaligned(out as *const u64) };
    if base != 0 {
        crate::state::graph_allocation(base);
    }
}

/// cudaErrorNoDevice or CUDA_ERROR_NO_DEVICE: no server, no device.
fn no_device(runtime: bool) -> u32 {
    if runtime { NO_DEVICE } else { chidori_cuda::consts::cudaError_enum::CUDA_ERROR_NO_DEVICE }
}

/// `body` behind the FFI guard, its status the runtime's last error. What it sends the
/// trace counts; an answer of the client's own, `body` counts itself.
fn guarded(name: &'static str, runtime: bool, body: impl FnOnce() -> Result<u32, u32>) -> u32 {
    crate::guard::ffi(name, 1, || {
        let status = body().unwrap_or_else(|e| e);
        if runtime {
            crate::state::set_last_error(status);
        }
        status
    })
}

thread_local! {
    /// This thread's stream-capture mode as its executor on the server has it, with the
    /// count of forks it was set under (a forked child's session starts its threads anew).
    static MODE: std::cell::Cell<(u64, u32)> = const { std::cell::Cell::new((0, MODE_GLOBAL)) };
}

/// The mode a thread starts with (cudaStreamCaptureModeGlobal; the driver's value is the same).
const MODE_GLOBAL: u32 = chidori_cuda::consts::cudaStreamCaptureMode::cudaStreamCaptureModeGlobal;
/// The highest capture mode (cudaStreamCaptureModeRelaxed; the driver's values are the same).
const MODE_MAX: u32 = chidori_cuda::consts::cudaStreamCaptureMode::cudaStreamCaptureModeRelaxed;

/// The calling thread's capture mode on the server. Each client thread's calls run on an
/// executor thread of their own, started for it in global mode (the worker swaps in relaxed
/// only around its own calls and swaps back), so the client knows the mode from the start.
fn thread_mode() -> u32 {
    let forks = conn::forks();
    MODE.with(|m| match m.get() {
        (at, mode) if at == forks => mode,
        _ => MODE_GLOBAL,
    })
}

/// Whether the calling thread's capture mode is relaxed (it exchanged one in): its
/// allocations are legal while another stream captures.
pub fn thread_relaxed() -> bool {
    thread_mode() == MODE_MAX
}

/// cudaThreadExchangeStreamCaptureMode, cuThreadExchangeStreamCaptureMode: swap the calling
/// thread's capture mode. torch's allocator swaps in RELAXED around every cudaMalloc while
/// a graph captures and restores what it got back. The client knows each thread's mode
/// ([`thread_mode`]): it answers with it and sends the exchange without waiting (the
/// server's thread still changes mode, in order with its other calls). A mode that is no
/// mode is the server's to refuse.
pub unsafe fn exchange_mode(ctx: &Ctx, mode: *mut c_void) -> u32 {
    let desc = ctx.form(Form::Call);
    crate::guard::ffi(ctx.name, crate::runtime::unavailable(desc) as u32, || {
        let success = desc.codes.success as u32;
        if mode.is_null() {
            // The mode to set is read from the pointer: there is none.
            let invalid = desc.codes.invalid_value as u64;
            crate::runtime::note_status(desc, invalid);
            return invalid as u32;
        }
        // SAFETY: the caller's cudaStreamCaptureMode*, checked non-null.
        let wanted = unsafe { std::ptr::read_unaligned(mode as *const u32) };
        if wanted <= MODE_MAX {
            let current = thread_mode();
            let mut value = wanted;
            // SAFETY: the async form reads one enum from `value`, sent before this returns.
            let s = unsafe { crate::runtime::call(ctx.form(Form::Async), &[&raw mut value as u64]) } as u32;
            if s == success {
                // SAFETY: as above.
                unsafe { std::ptr::write_unaligned(mode as *mut u32, current) };
                MODE.with(|m| m.set((conn::forks(), wanted)));
            }
            return s;
        }
        // SAFETY: the caller's pointer, which the call reads and writes.
        unsafe { crate::runtime::call(desc, &[mode as u64]) as u32 }
    })
}

/// cudaStreamBeginCapture, cuStreamBeginCapture_v2 and their `_ptsz` forms.
pub unsafe fn begin_capture(ctx: &Ctx, stream: *mut c_void, mode: u32) -> u32 {
    let args = [stream as u64, u64::from(mode)];
    let unwaited = Some(ctx.form(Form::Async));
    begin(ctx.base_name(), ctx.form(Form::Call), unwaited, &args, ctx.per_thread(), ctx.library == "cudart")
}

/// cuStreamBeginCapture (no mode: global) and its `_ptsz` form.
pub unsafe fn begin_capture_without_mode(ctx: &Ctx, stream: *mut c_void) -> u32 {
    let unwaited = Some(ctx.form(Form::Async));
    begin(ctx.base_name(), ctx.form(Form::Call), unwaited, &[stream as u64], ctx.per_thread(), ctx.library == "cudart")
}

/// cudaStreamEndCapture, cuStreamEndCapture and their `_ptsz` forms.
pub unsafe fn end_capture(ctx: &Ctx, stream: *mut c_void, graph: *mut c_void) -> u32 {
    let args = [stream as u64, graph as u64];
    end(ctx.base_name(), ctx.form(Form::Call), &args, ctx.per_thread(), ctx.library == "cudart")
}

/// cudaStreamIsCapturing, cuStreamIsCapturing and their `_ptsz` forms.
pub unsafe fn stream_is_capturing(ctx: &Ctx, stream: *mut c_void, status: *mut c_void) -> u32 {
    is_capturing(ctx.base_name(), ctx.form(Form::Call), stream as u64, status, ctx.library == "cudart")
}

thread_local! {
    /// The last capture frontier this thread was handed (nodes, edge data): CUDA's arrays
    /// stay valid until the next call that captures into or asks about the stream.
    static FRONTIER: std::cell::RefCell<(Vec<u64>, Vec<u64>)> = const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
}

/// The capture status, id, graph and frontier of `stream`, asked of the worker (which makes
/// the frontier's nodes known to the session); the arrays are kept by this thread.
/// `out`: status, id, graph, dependency array, edge data array, count (each may be null).
fn frontier(stream: u64, out: [*mut c_void; 6], no_device: u32) -> Result<u32, u32> {
    let asks_frontier = !(out[3].is_null() && out[4].is_null() && out[5].is_null());
    if !asks_frontier && let Some((status, id, graph)) = learned_answer(stream) {
        for (p, v) in [(out[1], id), (out[2], graph)] {
            if !p.is_null() {
                // SAFETY: the caller's 8-byte out-pointers, non-null.
                unsafe { std::ptr::write_unaligned(p as *mut u64, v) };
            }
        }
        // SAFETY: the caller's status, checked non-null by every caller.
        unsafe { std::ptr::write_unaligned(out[0] as *mut u32, status) };
        return Ok(SUCCESS);
    }
    let epoch = captures().epoch();
    let conn = conn::get().map_err(|_| no_device)?;
    let listed = crate::custom::graphs::list(&conn, GraphList::Capture { stream })?;
    if let Some(answer) = listed.capture {
        captures().learn(key(stream), epoch, answer);
    }
    let (status, id, graph) = listed.capture.unwrap_or((NONE, 0, 0));
    let n = listed.nodes.len();
    // No edge data from the worker: every edge's is the default (zero).
    let mut edges = listed.edge_data;
    edges.resize(n, 0);
    // Arrays handed out earlier stay where they are unless this call asks for new ones.
    let (deps_at, edges_at) = if out[3].is_null() && out[4].is_null() {
        (0, 0)
    } else {
        FRONTIER.with(|f| {
            let mut f = f.borrow_mut();
            *f = (listed.nodes, edges);
            (f.0.as_ptr() as u64, f.1.as_ptr() as u64)
        })
    };
    let values = [u64::from(status), id, graph, deps_at, edges_at, n as u64];
    for (i, (p, v)) in out.iter().zip(values).enumerate() {
        if p.is_null() {
            continue;
        }
        // SAFETY: the caller's out-pointers: a 4-byte status, the rest 8 bytes each.
        unsafe {
            if i == 0 {
                std::ptr::write_unaligned(*p as *mut u32, v as u32);
            } else {
                std::ptr::write_unaligned(*p as *mut u64, v);
            }
        }
    }
    Ok(SUCCESS)
}

/// cuStreamGetCaptureInfo_v2, cudaStreamGetCaptureInfo_v2 (no edge data) and their `_ptsz`
/// forms.
#[allow(clippy::too_many_arguments)]
pub unsafe fn cu_capture_info_v2(
    ctx: &Ctx,
    stream: *mut c_void,
    status: *mut c_void,
    id: *mut c_void,
    graph: *mut c_void,
    deps: *mut c_void,
    count: *mut c_void,
) -> u32 {
    // SAFETY: same contract, without edge data.
    unsafe { cu_capture_info_v3(ctx, stream, status, id, graph, deps, std::ptr::null_mut(), count) }
}

/// cuStreamGetCaptureInfo_v3, cudaStreamGetCaptureInfo_v3 (12.x) and their `_ptsz` forms:
/// answered locally while nothing captures.
#[allow(clippy::too_many_arguments)]
pub unsafe fn cu_capture_info_v3(
    ctx: &Ctx,
    stream: *mut c_void,
    status: *mut c_void,
    id: *mut c_void,
    graph: *mut c_void,
    deps: *mut c_void,
    edges: *mut c_void,
    count: *mut c_void,
) -> u32 {
    let runtime = ctx.library == "cudart";
    let no_device = if runtime { NO_DEVICE } else { chidori_cuda::consts::cudaError_enum::CUDA_ERROR_NO_DEVICE };
    guarded(ctx.base_name(), runtime, || {
        // Answered here, or by a question the trace counts as "(graph nodes)".
        crate::trace::local(ctx.base_name());
        if status.is_null() {
            return Err(INVALID_VALUE);
        }
        let stream = ctx.stream(stream as u64);
        if !any_active() {
            // SAFETY: the caller's out-pointers, each checked non-null.
            unsafe {
                std::ptr::write_unaligned(status as *mut u32, NONE);
                for p in [deps, edges, count] {
                    if !p.is_null() {
                        std::ptr::write_unaligned(p as *mut usize, 0);
                    }
                }
            }
            return Ok(SUCCESS);
        }
        frontier(stream, [status, id, graph, deps, edges, count], no_device)
    })
}

/// cudaStreamBeginCaptureToGraph, cuStreamBeginCaptureToGraph and their `_ptsz` forms.
pub unsafe fn begin_capture_to_graph(
    ctx: &Ctx,
    stream: *mut c_void,
    graph: *mut c_void,
    deps: *mut c_void,
    data: *mut c_void,
    count: usize,
    mode: u32,
) -> u32 {
    let args = [stream as u64, graph as u64, deps as u64, data as u64, count as u64, u64::from(mode)];
    begin(ctx.base_name(), ctx.form(Form::Call), None, &args, ctx.per_thread(), ctx.library == "cudart")
}

/// cudaStreamGetCaptureInfo of 11.8 and 12.x (status and id) and its `_ptsz` form.
pub unsafe fn get_capture_info_3(ctx: &Ctx, stream: *mut c_void, status: *mut c_void, id: *mut c_void) -> u32 {
    let n = std::ptr::null_mut();
    // SAFETY: the same contract, without the graph, dependencies and edge data.
    unsafe { cu_capture_info_v3(ctx, stream, status, id, n, n, n, n) }
}

/// cudaStreamGetCaptureInfo of 13.x (with the graph, dependencies and edge data) and its
/// `_ptsz` form: 12.x's _v3.
pub use cu_capture_info_v3 as get_capture_info_7;
