//! Stream, device and context synchronizes, answered by the client where the scope is
//! known idle (`crate::ahead::idle`: a read-back copy or an earlier synchronize drained it)
//! with nothing sent since but copies of host bytes into device memory (then the
//! synchronize still goes to the server, without waiting); otherwise asked, and what they
//! drain is learned. Nothing is answered or learned while a stream captures or a graph loop
//! runs on the server (work no message announces).
//!
//! Event queries and synchronizes are answered by the client where the event is known
//! complete (`crate::ahead::events`): a query or synchronize said so, or a synchronize by
//! the recording thread drained the stream it was recorded on.

use std::ffi::c_void;

use chidori_cuda::desc::{Ctx, Form};
use chidori_protocol::desc::CallDesc;

use crate::ahead::idle::{self, Answer, Scope};
use crate::conn::Conn;
use crate::state::CLIENT;

/// Whether what the client knows of idle scopes holds: no capture (a synchronize of a
/// capturing stream fails) and no graph loop (the server replays without messages).
pub(super) fn trusted() -> bool {
    !super::capture::any_active() && !crate::custom::loops::any_running()
}

/// The key of `stream` as a call names it (`ptsz`: from a per-thread entry point, where
/// NULL is the per-thread default stream).
fn stream_key(stream: u64, ptsz: bool) -> Scope {
    let handle = chidori_protocol::desc::stream_meant(stream, ptsz);
    Scope::Stream(idle::stream(
        handle,
        crate::state::current_device(),
        super::context::cached_current(),
        crate::runtime::thread_id(),
    ))
}

/// A device-to-host copy into pageable memory, in the chunks `calls` of `desc`, waiting for
/// every reply. Such a copy returns once done, and so is every earlier piece of work on its
/// stream (`stream`: None for a copy without one): on success the stream is known idle. A
/// read of bytes the client copied in itself, with the device idle and nothing sent since,
/// is answered from them.
///
/// # Safety
/// As [`crate::runtime::call_pipelined`].
pub unsafe fn read_back(conn: &Conn, desc: &'static CallDesc, stream: Option<u64>, calls: &[Vec<u64>]) -> u64 {
    let before = conn.sent_so_far();
    if let [call] = calls
        && let [dst, src, count, ..] = call[..]
        && let Some(bytes) = local_read(conn, src, count)
    {
        // Bytes the client copied in itself while the device was idle, nothing sent since:
        // the device holds exactly these (the copy's contract: `dst` holds `count` bytes).
        // SAFETY: the caller's host destination of `count` bytes; `bytes` has that length.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), dst as *mut u8, bytes.len()) };
        crate::trace::local(desc.name);
        return crate::runtime::success(desc);
    }
    // SAFETY: forwarded contract.
    let ret = unsafe { crate::runtime::call_pipelined(conn, desc, calls) };
    if let Some(stream) = stream
        && ret == crate::runtime::success(desc)
        && trusted()
    {
        let key = stream_key(stream, desc.name.ends_with("_ptsz"));
        CLIENT.ahead.idle.learn(key, before, calls.len() as u64, conn.sent_so_far());
        CLIENT.ahead.events.drained(key, crate::runtime::thread_id());
    }
    ret
}

/// A copy of host bytes into device memory (`dst`, `count` bytes) on `stream`, in the
/// chunks `calls` of `desc`, sent without waiting. The bytes travel with it, so once sent
/// only the server's stream order is left: where the stream was known idle and the whole
/// destination lies in memory the client knows allocated (the copy cannot be refused), its
/// synchronize is answered by the client and forwarded.
///
/// # Safety
/// As [`crate::runtime::call_pipelined`].
pub unsafe fn copy_in(
    conn: &Conn,
    desc: &'static CallDesc,
    (dst, count): (u64, u64),
    stream: Option<u64>,
    calls: &[Vec<u64>],
) -> u64 {
    let before = conn.sent_so_far();
    // SAFETY: forwarded contract.
    let ret = unsafe { crate::runtime::call_pipelined(conn, desc, calls) };
    if let Some(stream) = stream
        && !desc.waits()
        && ret == crate::runtime::success(desc)
        && trusted()
        && allocated(dst, count)
        && let Scope::Stream(key) = stream_key(stream, desc.name.ends_with("_ptsz"))
    {
        // The bytes as they were sent (a single chunk, small): a read of them while nothing
        // else goes out is answered from here.
        let src = calls.first().and_then(|a| a.get(1)).copied().unwrap_or(0);
        let small = calls.len() == 1 && src != 0 && count <= idle::WRITE_RECORDED_MAX as u64;
        // SAFETY: the copy's host source of `count` bytes (the caller's contract), just sent.
        let bytes = small.then(|| unsafe { std::slice::from_raw_parts(src as *const u8, count as usize) });
        CLIENT.ahead.idle.copied_in(key, (before, calls.len() as u64, conn.sent_so_far()), dst, count, bytes);
    }
    ret
}

/// Whether a read of `[src, src + count)` of device memory would be answered by the client
/// now (bytes it copied in itself, nothing sent since): 1, else 0. For the Python package,
/// which reads a prompt where that costs nothing and reads it with its mask in one copy
/// otherwise.
#[unsafe(no_mangle)]
pub extern "C" fn chidori_read_is_local(src: u64, count: u64) -> i32 {
    crate::guard::ffi("chidori_read_is_local", 0, || {
        let Ok(conn) = crate::conn::get() else { return 0 };
        i32::from(local_read(&conn, src, count).is_some())
    })
}

/// The bytes at `[src, src + count)` of device memory where the client copied them in
/// itself while the device was idle, and nothing was sent since (one GPU: no peer wrote).
fn local_read(conn: &Conn, src: u64, count: u64) -> Option<Vec<u8>> {
    (trusted() && conn.profile.devices.len() == 1).then(|| CLIENT.ahead.idle.read(src, count, conn.sent_so_far()))?
}

/// Whether `[dst, dst + count)` lies in one device allocation the client knows.
fn allocated(dst: u64, count: u64) -> bool {
    crate::state::find(dst).is_some_and(|r| {
        matches!(r.memory, crate::state::Memory::Device { .. })
            && dst.checked_add(count).is_some_and(|end| end <= r.base.saturating_add(r.len))
    })
}

/// A graph loop started when the connection had sent `before` messages ended with the
/// device idle (`device` current at its start). The worker synchronizes the device current
/// on its loop thread, which is the program's only where the session has one GPU.
pub fn drained_by_loop(conn: &Conn, device: i32, before: u64) {
    if trusted() && conn.profile.devices.len() == 1 {
        CLIENT.ahead.idle.learn(Scope::Device(device, super::context::cached_current()), before, 1, conn.sent_so_far());
    }
}

fn synchronize(ctx: &Ctx, args: &[u64], scope: Option<Scope>) -> u32 {
    let desc = ctx.form(Form::Call);
    let name = chidori_protocol::desc::strip_suffixes(ctx.name, &["_ptsz"]);
    crate::guard::ffi(name, crate::runtime::unavailable(desc) as u32, || {
        let Ok(conn) = crate::conn::get() else { return crate::runtime::unavailable(desc) as u32 };
        let scope = scope.filter(|_| trusted());
        match scope.and_then(|s| Some((s, CLIENT.ahead.idle.answer(s, conn.sent_so_far())?))) {
            Some((_, Answer::Idle)) => {
                crate::trace::local(name);
                return crate::runtime::success(desc) as u32;
            }
            Some((scope, Answer::Forward)) => {
                let before = conn.sent_so_far();
                // SAFETY: handles by value only.
                let ret = unsafe { crate::runtime::call_on(&conn, ctx.form(Form::Async), args) };
                if ret == crate::runtime::success(desc) {
                    CLIENT.ahead.idle.forwarded(scope, before, conn.sent_so_far());
                }
                return ret as u32;
            }
            None => {}
        }
        let before = conn.sent_so_far();
        // SAFETY: handles by value only.
        let ret = unsafe { crate::runtime::call_on(&conn, desc, args) };
        crate::runtime::note_status(desc, ret);
        if let Some(scope) = scope
            && ret == crate::runtime::success(desc)
        {
            CLIENT.ahead.idle.learn(scope, before, 1, conn.sent_so_far());
            CLIENT.ahead.events.drained(scope, crate::runtime::thread_id());
        }
        ret as u32
    })
}

/// What an event call does to what the client knows of events.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum EventRole {
    /// cudaEventRecord(WithFlags), cuEventRecord(WithFlags): (event, stream, …).
    Record,
    /// cudaEventQuery, cuEventQuery, cudaEventSynchronize, cuEventSynchronize: (event).
    Wait,
    /// cudaEventDestroy, cuEventDestroy: (event).
    Destroy,
}

fn event_role(name: &str) -> Option<EventRole> {
    match chidori_protocol::desc::strip_suffixes(name, &["_ptsz", "_v2"]) {
        "cudaEventRecord" | "cudaEventRecordWithFlags" | "cuEventRecord" | "cuEventRecordWithFlags" => {
            Some(EventRole::Record)
        }
        "cudaEventQuery" | "cuEventQuery" | "cudaEventSynchronize" | "cuEventSynchronize" => Some(EventRole::Wait),
        "cudaEventDestroy" | "cuEventDestroy" => Some(EventRole::Destroy),
        _ => None,
    }
}

/// Event records, queries, synchronizes and destroys of both APIs (`raw_args`: the event
/// first, a record's stream second). A query or synchronize of an event known complete
/// is answered here, and its destroy sent without waiting; the others are forwarded, and
/// what they say is noted (`crate::ahead::events`).
///
/// # Safety
/// Handles by value only.
pub unsafe fn event_raw(ctx: &Ctx, args: &[u64]) -> u64 {
    let desc = ctx.form(Form::Call);
    crate::guard::ffi(ctx.name, crate::runtime::unavailable(desc), || event(ctx, desc, args))
}

fn event(ctx: &Ctx, desc: &'static CallDesc, args: &[u64]) -> u64 {
    let role = event_role(ctx.name);
    let event = args.first().copied().unwrap_or(0);
    match role {
        Some(EventRole::Wait)
            if event != 0 && trusted() && !crate::mirror::pending() && CLIENT.ahead.events.is_complete(event) =>
        {
            crate::trace::local(ctx.name);
            return crate::runtime::success(desc);
        }
        Some(EventRole::Record) => match (args.get(1), trusted()) {
            (Some(&stream), true) => {
                if let Scope::Stream(key) = stream_key(stream, ctx.per_thread()) {
                    CLIENT.ahead.events.recorded(event, key, crate::runtime::thread_id());
                }
            }
            _ => CLIENT.ahead.events.unknown(event),
        },
        // An event the server made for this client (every one it knows complete among
        // them) is one of the session's: its destroy is not refused, and goes without
        // waiting (torch destroys each Python event object's event as it goes). Whatever the
        // answer, nothing is known of the handle after its destroy.
        Some(EventRole::Destroy) if event != 0 && CLIENT.ahead.events.destroyed(event) => {
            // SAFETY: handles by value only.
            return unsafe { crate::runtime::call(ctx.form(Form::Async), args) };
        }
        _ => {}
    }
    // SAFETY: handles by value only.
    let ret = unsafe { crate::runtime::call(desc, args) };
    if role == Some(EventRole::Wait) && event != 0 && ret == crate::runtime::success(desc) && trusted() {
        CLIENT.ahead.events.complete(event);
    }
    ret
}

/// cudaStreamSynchronize, cuStreamSynchronize and their `_ptsz` forms.
pub fn stream_synchronize(ctx: &Ctx, stream: *mut c_void) -> u32 {
    synchronize(ctx, &[stream as u64], Some(stream_key(stream as u64, ctx.per_thread())))
}

/// cudaDeviceSynchronize and cudaThreadSynchronize: every stream of the current device.
pub fn device_synchronize(ctx: &Ctx) -> u32 {
    synchronize(ctx, &[], Some(Scope::Device(crate::state::current_device(), super::context::cached_current())))
}

/// cuCtxSynchronize: every stream of the current context, where the client knows which.
pub fn context_synchronize(ctx: &Ctx) -> u32 {
    synchronize(ctx, &[], super::context::cached_current().map(Scope::Context))
}
