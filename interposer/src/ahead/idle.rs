//! What the client knows to be idle: a stream, or a device, whose work the server has just
//! finished, with nothing sent since. A synchronize of it then returns at once natively,
//! so the client answers it without a round trip.
//!
//! torch reads a value back as a copy into pageable memory followed by a stream
//! synchronize (`.item()`, `.cpu()`, `.tolist()`). The copy returns only once it is done,
//! and so is every earlier piece of work on its stream: the synchronize after it finds the
//! stream idle. Through Chidori each is a round trip, so every read cost two; with this,
//! one. The same holds for a synchronize repeated, or after a device-wide one.
//!
//! An answer is trusted only while the connection has sent nothing since the call that
//! drained the scope (work of any thread, or of a library on the stream it was given,
//! goes out as a message; see [`Answers::get_at`](super::Answers::get_at)), and only for
//! the same scope: a stream (per thread, for the per-thread default stream; per device
//! and context for the default streams), or a device or driver context.

use std::sync::Mutex;

/// What a synchronizing call waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Scope {
    /// A stream, as [`stream`] keys it.
    Stream(StreamKey),
    /// Every stream of a runtime device (cudaDeviceSynchronize).
    Device(i32),
    /// Every stream of a driver context (cuCtxSynchronize).
    Context(u64),
}

/// A stream as the client can tell it apart: a created stream by its handle; a default
/// stream (legacy: 0 or 1; per-thread: 2) also by the device and context current at the
/// call, and the per-thread one by the calling thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct StreamKey {
    handle: u64,
    device: i32,
    context: Option<u64>,
    thread: u32,
}

/// The per-thread default stream's handle (cudaStreamPerThread, CU_STREAM_PER_THREAD).
pub const PER_THREAD: u64 = 2;

/// The key of `handle` (already resolved for a `_ptsz` entry point: NULL there is
/// [`PER_THREAD`]) used on `thread` while `device` and `context` are current.
pub fn stream(handle: u64, device: i32, context: Option<u64>, thread: u32) -> StreamKey {
    match handle {
        0 | 1 => StreamKey { handle, device, context, thread: 0 },
        PER_THREAD => StreamKey { handle, device, context, thread },
        _ => StreamKey { handle, device: 0, context: None, thread: 0 },
    }
}

/// The one scope last found idle and the connection's message count then.
pub struct Idle {
    last: Mutex<Option<(Scope, u64)>>,
}

impl Idle {
    pub const fn new() -> Self {
        Idle { last: Mutex::new(None) }
    }

    /// A call that waited until `scope` was idle succeeded. `before`: the connection's
    /// message count when it was sent; `sent`: the messages it sent; `after`: the count when
    /// its reply came. Learned only if no other message went out in between (it could have
    /// given the scope new work after the server found it idle).
    pub fn learn(&self, scope: Scope, before: u64, sent: u64, after: u64) {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        *last = (before.checked_add(sent) == Some(after)).then_some((scope, after));
    }

    /// Whether `scope` is idle now, `now` being the connection's message count.
    pub fn is_idle(&self, scope: Scope, now: u64) -> bool {
        *self.last.lock().unwrap_or_else(|p| p.into_inner()) == Some((scope, now))
    }
}

impl Default for Idle {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scope_is_idle_only_while_nothing_was_sent_since_it_was_drained() {
        let idle = Idle::new();
        let s = Scope::Stream(stream(0x41d1_0000_0000_0007, 0, None, 1));
        idle.learn(s, 10, 1, 11);
        assert!(idle.is_idle(s, 11));
        assert!(!idle.is_idle(s, 12), "a message went out since");
        assert!(!idle.is_idle(Scope::Device(0), 11), "a stream drained is not the device");
        // A copy in three chunks, while another thread sent one message in between.
        idle.learn(s, 20, 3, 24);
        assert!(!idle.is_idle(s, 24), "another message went out while it waited");
        idle.learn(Scope::Device(0), 30, 1, 31);
        assert!(idle.is_idle(Scope::Device(0), 31));
        assert!(!idle.is_idle(Scope::Device(1), 31), "another device");
        // A drain that teaches nothing (a message went out meanwhile) drops what was known.
        idle.learn(Scope::Device(0), 40, 1, 42);
        assert!(!idle.is_idle(Scope::Device(0), 31));
    }

    #[test]
    fn default_streams_are_told_apart_by_device_context_and_thread() {
        let legacy = stream(0, 0, Some(5), 1);
        assert_eq!(legacy, stream(0, 0, Some(5), 2), "the legacy stream is every thread's");
        assert_ne!(legacy, stream(0, 1, Some(5), 1), "each device has its own");
        assert_ne!(legacy, stream(1, 0, Some(5), 1), "cudaStreamLegacy is not told apart from NULL: ask");
        assert_ne!(stream(PER_THREAD, 0, None, 1), stream(PER_THREAD, 0, None, 2), "per thread");
        let made = stream(0x41d1_0000_0000_0009, 0, None, 1);
        assert_eq!(made, stream(0x41d1_0000_0000_0009, 3, Some(8), 4), "a created stream is itself anywhere");
    }
}
