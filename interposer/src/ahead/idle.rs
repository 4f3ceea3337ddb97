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
    /// Every stream of a runtime device (cudaDeviceSynchronize), with the driver context
    /// current at the call (whose default streams it covers).
    Device(i32, Option<u64>),
    /// Every stream of a driver context (cuCtxSynchronize).
    Context(u64),
}

impl Scope {
    /// Whether draining `self` drains `stream` too: the same stream, or a default stream of
    /// the same device and context (a created stream's device or context is not known here).
    fn covers(&self, stream: &StreamKey) -> bool {
        let default = matches!(stream.handle, 0 | 1 | PER_THREAD);
        match *self {
            Scope::Stream(s) => s == *stream,
            Scope::Device(device, context) => default && stream.device == device && stream.context == context,
            Scope::Context(context) => default && stream.context == Some(context),
        }
    }

    /// Whether draining `self` drains everything `other` waits for.
    fn includes(&self, other: &Scope) -> bool {
        match other {
            Scope::Stream(s) => self.covers(s),
            _ => self == other,
        }
    }
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

/// How a synchronize of a scope known idle is answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    /// Nothing was sent since the scope was drained: it returns at once natively.
    Idle,
    /// Only copies of host bytes into device memory were sent since (the bytes travelled
    /// with them, so the program may reuse its buffer): the client answers, and sends the
    /// synchronize without waiting so that the server still runs everything after it once
    /// the copies are done, as the program's later calls expect.
    Forward,
}

/// The scope last found idle: the connection's message count then (`mark`), and the
/// stream given host-to-device copies since, if any.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Known {
    scope: Scope,
    mark: u64,
    copies: Option<StreamKey>,
}

/// The one scope last found idle, and what was sent to it since.
pub struct Idle {
    last: Mutex<Option<Known>>,
}

impl Idle {
    pub const fn new() -> Self {
        Idle { last: Mutex::new(None) }
    }

    fn known(&self) -> std::sync::MutexGuard<'_, Option<Known>> {
        self.last.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A call that waited until `scope` was idle succeeded. `before`: the connection's
    /// message count when it was sent; `sent`: the messages it sent; `after`: the count when
    /// its reply came. Learned only if no other message went out in between (it could have
    /// given the scope new work after the server found it idle). A stream drained within
    /// the scope known idle, with nothing else sent since, leaves that scope idle.
    pub fn learn(&self, scope: Scope, before: u64, sent: u64, after: u64) {
        let mut last = self.known();
        if before.checked_add(sent) != Some(after) {
            *last = None;
            return;
        }
        *last = Some(match *last {
            Some(k) if k.mark == before && k.scope.includes(&scope) => {
                let copies = k.copies.filter(|c| !scope.covers_pending(c));
                Known { mark: after, copies, ..k }
            }
            _ => Known { scope, mark: after, copies: None },
        });
    }

    /// Host bytes were copied into device memory on `stream` in the messages `before` to
    /// `after` (the copies are sent without waiting). A scope known idle just before that
    /// covers the stream stays known, its synchronize then [`Answer::Forward`].
    pub fn copied_in(&self, stream: StreamKey, before: u64, sent: u64, after: u64) {
        let mut last = self.known();
        let Some(k) = *last else { return };
        let extends = k.mark == before
            && before.checked_add(sent) == Some(after)
            && k.scope.covers(&stream)
            && k.copies.is_none_or(|c| c == stream);
        *last = extends.then_some(Known { mark: after, copies: Some(stream), ..k });
    }

    /// How a synchronize of `scope` is answered now, `now` being the connection's message
    /// count; None: it is asked.
    pub fn answer(&self, scope: Scope, now: u64) -> Option<Answer> {
        let k = (*self.known())?;
        if k.mark != now || !k.scope.includes(&scope) {
            return None;
        }
        Some(if k.copies.is_some() { Answer::Forward } else { Answer::Idle })
    }

    /// A synchronize of `scope` answered with [`Answer::Forward`] went out as the message
    /// `before` (the count was `after` once it was sent): what it drains holds no copies.
    /// It proves nothing by itself (nobody waited for it): what was known stays known only
    /// if nothing else went out around it.
    pub fn forwarded(&self, scope: Scope, before: u64, after: u64) {
        let mut last = self.known();
        *last = match *last {
            Some(k) if k.mark == before && before.checked_add(1) == Some(after) && k.scope.includes(&scope) => {
                Some(Known { mark: after, copies: k.copies.filter(|c| !scope.covers_pending(c)), ..k })
            }
            _ => None,
        };
    }
}

impl Scope {
    /// Whether draining `self` finishes copies sent on `pending`.
    fn covers_pending(&self, pending: &StreamKey) -> bool {
        match self {
            Scope::Stream(s) => s == pending,
            // A device or context synchronize also drains its created streams.
            _ => true,
        }
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

    const IDLE: Option<Answer> = Some(Answer::Idle);
    const FORWARD: Option<Answer> = Some(Answer::Forward);

    #[test]
    fn a_scope_is_idle_only_while_nothing_was_sent_since_it_was_drained() {
        let idle = Idle::new();
        let s = Scope::Stream(stream(0x41d1_0000_0000_0007, 0, None, 1));
        idle.learn(s, 10, 1, 11);
        assert_eq!(idle.answer(s, 11), IDLE);
        assert_eq!(idle.answer(s, 12), None, "a message went out since");
        assert_eq!(idle.answer(Scope::Device(0, None), 11), None, "a stream drained is not the device");
        // A copy in three chunks, while another thread sent one message in between.
        idle.learn(s, 20, 3, 24);
        assert_eq!(idle.answer(s, 24), None, "another message went out while it waited");
        let device = Scope::Device(0, Some(5));
        idle.learn(device, 30, 1, 31);
        assert_eq!(idle.answer(device, 31), IDLE);
        assert_eq!(idle.answer(Scope::Device(1, Some(5)), 31), None, "another device");
        assert_eq!(idle.answer(Scope::Device(0, Some(6)), 31), None, "another context");
        // A drain that teaches nothing (a message went out meanwhile) drops what was known.
        idle.learn(device, 40, 1, 42);
        assert_eq!(idle.answer(device, 31), None);
    }

    #[test]
    fn a_drained_device_covers_its_default_streams_only() {
        let idle = Idle::new();
        let device = Scope::Device(0, Some(5));
        idle.learn(device, 10, 1, 11);
        assert_eq!(idle.answer(Scope::Stream(stream(0, 0, Some(5), 1)), 11), IDLE);
        assert_eq!(idle.answer(Scope::Stream(stream(PER_THREAD, 0, Some(5), 3)), 11), IDLE);
        assert_eq!(idle.answer(Scope::Stream(stream(0, 0, Some(6), 1)), 11), None, "another context's");
        assert_eq!(idle.answer(Scope::Stream(stream(0x41d1_0000_0000_0009, 0, None, 1)), 11), None, "created");
        // A read-back on a default stream (nothing else sent) leaves the device idle.
        idle.learn(Scope::Stream(stream(0, 0, Some(5), 1)), 11, 2, 13);
        assert_eq!(idle.answer(device, 13), IDLE);
        // One on a created stream teaches only that stream.
        let made = Scope::Stream(stream(0x41d1_0000_0000_0009, 0, None, 1));
        idle.learn(made, 13, 1, 14);
        assert_eq!(idle.answer(made, 14), IDLE);
        assert_eq!(idle.answer(device, 14), None);
    }

    #[test]
    fn copies_in_after_a_drain_are_forwarded_by_the_synchronize_that_follows() {
        let idle = Idle::new();
        let legacy = stream(0, 0, Some(5), 1);
        let device = Scope::Device(0, Some(5));
        idle.learn(device, 10, 1, 11);
        // Two copies (the second in two chunks) on the legacy stream.
        idle.copied_in(legacy, 11, 1, 12);
        idle.copied_in(legacy, 12, 2, 14);
        assert_eq!(idle.answer(Scope::Stream(legacy), 14), FORWARD);
        assert_eq!(idle.answer(device, 14), FORWARD);
        idle.forwarded(Scope::Stream(legacy), 14, 15);
        assert_eq!(idle.answer(device, 15), IDLE, "the forwarded synchronize drained the copies");
        // A copy on another stream of the device, then one on a second stream: not followed.
        let per_thread = stream(PER_THREAD, 0, Some(5), 2);
        idle.copied_in(per_thread, 15, 1, 16);
        assert_eq!(idle.answer(Scope::Stream(legacy), 16), FORWARD, "asked of another stream: forwarded");
        idle.copied_in(legacy, 16, 1, 17);
        assert_eq!(idle.answer(device, 17), None, "copies on two streams");
        // A copy after another message, or on a stream the scope does not cover.
        idle.learn(device, 20, 1, 21);
        idle.copied_in(legacy, 22, 1, 23);
        assert_eq!(idle.answer(device, 23), None);
        idle.learn(device, 30, 1, 31);
        idle.copied_in(stream(0x41d1_0000_0000_0009, 0, None, 1), 31, 1, 32);
        assert_eq!(idle.answer(device, 32), None);
        // A created stream known idle takes copies too.
        let made = stream(0x41d1_0000_0000_0009, 0, None, 1);
        idle.learn(Scope::Stream(made), 40, 1, 41);
        idle.copied_in(made, 41, 1, 42);
        assert_eq!(idle.answer(Scope::Stream(made), 42), FORWARD);
        idle.forwarded(Scope::Stream(made), 42, 43);
        assert_eq!(idle.answer(Scope::Stream(made), 43), IDLE);
        // A forwarded synchronize with another message before it teaches nothing: nobody
        // waited for it, so the scope is no longer known.
        idle.copied_in(made, 43, 1, 44);
        idle.forwarded(Scope::Stream(made), 45, 46);
        assert_eq!(idle.answer(Scope::Stream(made), 46), None);
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
