//! Graph-replay loops on the server: Chidori's own C API for programs (and the Python
//! package's server-side decode) that want a loop of graph launches to run next to the GPU
//! instead of one round trip per step. See `chidori_protocol::messages::GraphLoop`.
//!
//! ```c
//! uint64_t id = chidori_loop_start(exec, stream, max_steps, check_every, stop_flag, output,
//!                                  bytes_per_step, progress_ms, flags, dst, src, bytes);
//! /* flags: LOOP_TAIL (1) also sends the output slot after the last step (a step that
//!    writes the next slot: its last output); bytes > 0: after the last step, copy `bytes`
//!    from device address `src` to `dst` on the stream (a result the graph built) */
//! while (...) n = chidori_loop_poll(id, buf, cap, timeout_ms, &steps, &stopped, &done, &status);
//! chidori_loop_end(id);
//! ```
//!
//! `exec` and `stream` are the program's `cudaGraphExec_t` and `cudaStream_t`; `stop_flag`
//! and `output` device addresses (0: none). Work the program issued before the start runs
//! before the loop, as on a stream.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use chidori_protocol::messages::{GraphLoop, LoopCopy, Service, ServiceReply};

use chidori_cuda::calls::cudart as calls;

use crate::conn::{Conn, Slot};
use crate::runtime;

/// How a loop ended: (steps launched, steps at which it stopped or 0, status, whether the
/// device was idle at its end).
type Ended = (u32, u32, i64, bool);

pub struct Running {
    conn: Arc<Conn>,
    seq: u64,
    /// The connection's message count before the start, and the device current then.
    sent_before: u64,
    device: i32,
    slot: Arc<Slot>,
    progress: Receiver<(u32, Vec<u8>)>,
    /// Output received and not yet handed to the program.
    buffered: VecDeque<u8>,
    /// Steps whose output has been received.
    steps: u32,
    ended: Option<Ended>,
}

static NEXT: AtomicU64 = AtomicU64::new(1);
/// Loops started whose end has not been received (a loop being polled is out of the table).
static ACTIVE: AtomicUsize = AtomicUsize::new(0);

/// Whether a graph loop may be replaying on the server: started, its end not yet received
/// (the server launches its steps without a message from the client).
pub fn any_running() -> bool {
    ACTIVE.load(Ordering::Acquire) > 0
}

/// `flags` of [`chidori_loop_start`]: also send the output slot after the last step.
pub const LOOP_TAIL: u32 = 1;

/// Start a loop; returns its id, or 0 when it could not start (logged). `flags`:
/// [`LOOP_TAIL`] (other bits must be 0). `copy_bytes` (0: none) are copied from device
/// address `copy_src` to `copy_dst` on the stream after the last step: a program that sends
/// nothing else until [`chidori_loop_poll`] says the loop is done then finds the device
/// idle, and its next synchronize costs no round trip.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn chidori_loop_start(
    exec: u64,
    stream: u64,
    max_steps: u32,
    check_every: u32,
    stop_flag: u64,
    output: u64,
    bytes_per_step: u32,
    progress_ms: u32,
    flags: u32,
    copy_dst: u64,
    copy_src: u64,
    copy_bytes: u64,
) -> u64 {
    crate::guard::ffi("chidori_loop_start", 0, || {
        if flags & !LOOP_TAIL != 0 {
            tracing::warn!("graph loop: unknown flags {flags:#x}");
            return 0;
        }
        let conn = match crate::conn::get() {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!("graph loop: no server: {e}");
                return 0;
            }
        };
        let tail = flags & LOOP_TAIL != 0;
        let then_copy = (copy_bytes > 0).then_some(LoopCopy { dst: copy_dst, src: copy_src, bytes: copy_bytes });
        let request = GraphLoop {
            exec,
            stream,
            max_steps,
            check_every,
            stop_flag,
            output,
            bytes_per_step,
            progress_ms,
            tail,
            then_copy,
        };
        // The graph's mirrored memory, as for a launch (the loop's steps replay it as is).
        crate::mirror::prepare_graph(&conn);
        // Its event-record nodes record again, unseen.
        crate::state::CLIENT.ahead.events.forget_all();
        let (tx, rx) = std::sync::mpsc::channel();
        // Counted before the start goes out: from then on the server may launch unasked.
        ACTIVE.fetch_add(1, Ordering::AcqRel);
        let sent_before = conn.sent_so_far();
        let (seq, slot) = match conn.start_service(&Service::GraphLoop(request), tx) {
            Ok(started) => started,
            Err(e) => {
                ACTIVE.fetch_sub(1, Ordering::AcqRel);
                tracing::warn!("graph loop: {e}");
                return 0;
            }
        };
        crate::trace::local("chidori_loop_start");
        let id = NEXT.fetch_add(1, Ordering::Relaxed);
        let device = crate::state::current_device();
        let running = Running {
            conn,
            seq,
            sent_before,
            device,
            slot,
            progress: rx,
            buffered: VecDeque::new(),
            steps: 0,
            ended: None,
        };
        crate::state::CLIENT.loops.lock().get_or_insert_with(HashMap::new).insert(id, running);
        id
    })
}

/// Wait up to `timeout_ms` for output, then copy what arrived (at most `cap` bytes, in
/// order) to `buf`. `steps`: steps whose output arrived so far; once the loop has ended
/// and every byte was handed out, `done` is 1, `steps` the steps launched, `stopped` the
/// step count at which the stop flag was seen (0: it ran to the end) and `status` the
/// first failure (0: none). Returns the bytes written, or -1 for an unknown id.
///
/// # Safety
/// `buf` must be writable for `cap` bytes; the out-pointers writable or null.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn chidori_loop_poll(
    id: u64,
    buf: *mut u8,
    cap: u64,
    timeout_ms: u32,
    steps: *mut u32,
    stopped: *mut u32,
    done: *mut u32,
    status: *mut i64,
) -> i64 {
    crate::guard::ffi("chidori_loop_poll", -1, || {
        // Taken out of the table while this call waits, so other loops can be polled.
        let Some(mut running) = crate::state::CLIENT.loops.lock().as_mut().and_then(|l| l.remove(&id)) else {
            return -1;
        };
        let n = poll(&mut running, buf, cap, timeout_ms);
        let finished = running.ended.filter(|_| running.buffered.is_empty());
        // SAFETY (all four): the caller's out-pointers, each writable or null.
        unsafe {
            put(steps, finished.map_or(running.steps, |e| e.0));
            put(stopped, finished.map_or(0, |e| e.1));
            put(done, u32::from(finished.is_some()));
            put(status, finished.map_or(0, |e| e.2));
        }
        crate::state::CLIENT.loops.lock().get_or_insert_with(HashMap::new).insert(id, running);
        n as i64
    })
}

fn take_progress(running: &mut Running) {
    while let Ok((n, bytes)) = running.progress.try_recv() {
        running.steps = n;
        running.buffered.extend(bytes);
    }
}

/// Wait for output or the end, then hand out what there is. Returns the bytes written.
fn poll(running: &mut Running, buf: *mut u8, cap: u64, timeout_ms: u32) -> usize {
    let deadline = Instant::now() + Duration::from_millis(u64::from(timeout_ms));
    while running.buffered.is_empty() && running.ended.is_none() {
        let left = deadline.saturating_duration_since(Instant::now());
        match running.progress.recv_timeout(left.min(Duration::from_millis(5))) {
            Ok((n, bytes)) => {
                running.steps = n;
                running.buffered.extend(bytes);
            }
            Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => {}
        }
        if running.slot.ready_within(Duration::ZERO) || left.is_zero() {
            break;
        }
    }
    take_progress(running);
    if running.ended.is_none() && running.slot.ready_within(Duration::ZERO) {
        // Progress frames precede the answer on the connection: none is still to come.
        take_progress(running);
        let lost = runtime::unavailable(&calls::cudaGraphLaunch) as i64;
        running.ended = Some(match running.conn.finish_service(running.seq, &running.slot) {
            Ok(ServiceReply::Looped { steps, stopped_at, status, idle }) => {
                (steps, stopped_at.unwrap_or(0), status, idle)
            }
            Ok(ServiceReply::Error { status, message }) => {
                tracing::warn!("graph loop: {message}");
                (0, 0, status, false)
            }
            Ok(_) => (0, 0, lost, false),
            Err(e) => {
                tracing::warn!("graph loop: {e}");
                (0, 0, lost, false)
            }
        });
        // The server launches no more of its steps.
        ACTIVE.fetch_sub(1, Ordering::AcqRel);
        if let Some((_, _, 0, true)) = running.ended {
            // Idle at the loop's end and, if nothing was sent since its start, so it is now.
            super::sync::drained_by_loop(&running.conn, running.device, running.sent_before);
        }
    }
    let n = (cap as usize).min(running.buffered.len());
    if n > 0 && !buf.is_null() {
        let (a, b) = running.buffered.as_slices();
        let first = n.min(a.len());
        // SAFETY: `buf` is writable for `cap` ≥ n bytes (the contract of chidori_loop_poll).
        unsafe {
            std::ptr::copy_nonoverlapping(a.as_ptr(), buf, first);
            std::ptr::copy_nonoverlapping(b.as_ptr(), buf.add(first), n - first);
        }
        running.buffered.drain(..n);
    }
    n
}

/// Forget a loop (after it ended, or to stop waiting for it: the server finishes it anyway).
#[unsafe(no_mangle)]
pub extern "C" fn chidori_loop_end(id: u64) {
    crate::guard::ffi("chidori_loop_end", (), || {
        let removed = crate::state::CLIENT.loops.lock().as_mut().and_then(|l| l.remove(&id));
        if let Some(r) = removed
            && r.ended.is_none()
        {
            // The answer is still to come: wait for it on a thread of its own, so the
            // connection's table of pending requests empties; the loop counts as running
            // until then.
            std::thread::spawn(move || {
                let _ = r.conn.finish_service(r.seq, &r.slot);
                ACTIVE.fetch_sub(1, Ordering::AcqRel);
            });
        }
    })
}

/// # Safety
/// `p` must be writable or null.
unsafe fn put<T>(p: *mut T, v: T) {
    if !p.is_null() {
        // SAFETY: per the contract.
        unsafe { p.write_unaligned(v) };
    }
}
