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
    pub fn covers(&self, stream: &StreamKey) -> bool {
        let default = matches!(stream.handle, 0 | LEGACY_STREAM | PER_THREAD);
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

use chidori_protocol::desc::{LEGACY_STREAM, PER_THREAD_STREAM as PER_THREAD};

/// The key of `handle` (already resolved for a `_ptsz` entry point: NULL there is
/// [`PER_THREAD`]) used on `thread` while `device` and `context` are current.
pub fn stream(handle: u64, device: i32, context: Option<u64>, thread: u32) -> StreamKey {
    match handle {
        0 | LEGACY_STREAM => StreamKey { handle, device, context, thread: 0 },
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

/// Bytes the client copied into device memory, recorded while the device was known idle
/// with nothing else sent since: device memory holds exactly them until another message goes
/// out. Disjoint ranges, newest last.
struct Written {
    ranges: Vec<(u64, Vec<u8>)>,
    total: usize,
}

/// A copy in is recorded up to this size (a prompt's token ids, a mask: not a model's
/// weights), and at most [`WRITTEN_MAX`] bytes of them (the oldest go first).
pub const WRITE_RECORDED_MAX: usize = 64 << 10;
const WRITTEN_MAX: usize = 1 << 20;

impl Written {
    fn clear(&mut self) {
        self.ranges.clear();
        self.total = 0;
    }

    /// `[dst, dst + len)` now holds `bytes` (None: bytes not recorded).
    fn write(&mut self, dst: u64, len: u64, bytes: Option<&[u8]>) {
        let end = dst.saturating_add(len);
        // Within one recorded range: patched in place.
        if let Some(bytes) = bytes.filter(|b| b.len() as u64 == len)
            && let Some((at, held)) =
                self.ranges.iter_mut().find(|(at, b)| *at <= dst && end <= at.saturating_add(b.len() as u64))
        {
            let from = (dst - *at) as usize;
            held[from..from + bytes.len()].copy_from_slice(bytes);
            return;
        }
        let before = self.ranges.len();
        self.ranges.retain(|(at, b)| *at >= end || at.saturating_add(b.len() as u64) <= dst);
        if self.ranges.len() != before {
            self.total = self.ranges.iter().map(|(_, b)| b.len()).sum();
        }
        let Some(bytes) = bytes.filter(|b| b.len() as u64 == len && b.len() <= WRITE_RECORDED_MAX) else { return };
        while self.total + bytes.len() > WRITTEN_MAX && !self.ranges.is_empty() {
            let (_, oldest) = self.ranges.remove(0);
            self.total -= oldest.len();
        }
        self.total += bytes.len();
        self.ranges.push((dst, bytes.to_vec()));
    }

    fn read(&self, src: u64, len: u64) -> Option<&[u8]> {
        let (at, bytes) = self.ranges.iter().find(|(at, b)| *at <= src && src < at.saturating_add(b.len() as u64))?;
        let from = usize::try_from(src - at).ok()?;
        bytes.get(from..from.checked_add(usize::try_from(len).ok()?)?)
    }
}

struct State {
    known: Option<Known>,
    written: Written,
}

/// The one scope last found idle, what was sent to it since, and what the client wrote
/// into device memory since.
pub struct Idle {
    state: Mutex<State>,
}

impl Idle {
    pub const fn new() -> Self {
        Idle { state: Mutex::new(State { known: None, written: Written { ranges: Vec::new(), total: 0 } }) }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A call that waited until `scope` was idle succeeded. `before`: the connection's
    /// message count when it was sent; `sent`: the messages it sent; `after`: the count when
    /// its reply came. Learned only if no other message went out in between (it could have
    /// given the scope new work after the server found it idle). A stream drained within
    /// the scope known idle, with nothing else sent since, leaves that scope idle (and what
    /// the client wrote, written).
    pub fn learn(&self, scope: Scope, before: u64, sent: u64, after: u64) {
        let mut state = self.state();
        let continued = match state.known {
            Some(k) if before.checked_add(sent) == Some(after) && k.mark == before && k.scope.includes(&scope) => {
                let copies = k.copies.filter(|c| !scope.covers_pending(c));
                Some(Known { mark: after, copies, ..k })
            }
            _ => None,
        };
        if continued.is_none() {
            state.written.clear();
        }
        state.known = continued.or_else(|| {
            (before.checked_add(sent) == Some(after)).then_some(Known { scope, mark: after, copies: None })
        });
    }

    /// Host bytes were copied into device memory on `stream` in the messages `before` to
    /// `after` (the copies are sent without waiting), at `dst` for `len` bytes, with
    /// `bytes` where the caller can give them (at most [`WRITE_RECORDED_MAX`]). A scope
    /// known idle just before that covers the stream stays known, its synchronize then
    /// [`Answer::Forward`]; where that scope is a device or context, the bytes are recorded
    /// for [`Self::read`].
    pub fn copied_in(
        &self,
        stream: StreamKey,
        (before, sent, after): (u64, u64, u64),
        dst: u64,
        len: u64,
        bytes: Option<&[u8]>,
    ) {
        let mut state = self.state();
        let extended = state.known.filter(|k| {
            k.mark == before
                && before.checked_add(sent) == Some(after)
                && k.scope.covers(&stream)
                && k.copies.is_none_or(|c| c == stream)
        });
        state.known = extended.map(|k| Known { mark: after, copies: Some(stream), ..k });
        match extended {
            Some(k) if !matches!(k.scope, Scope::Stream(_)) => state.written.write(dst, len, bytes),
            _ => state.written.clear(),
        }
    }

    /// The bytes at `[src, src + len)` of device memory, where the client wrote them itself
    /// while the whole device (or context) was known idle and nothing else went out since,
    /// `now` being the connection's message count.
    pub fn read(&self, src: u64, len: u64, now: u64) -> Option<Vec<u8>> {
        let state = self.state();
        let k = state.known?;
        if k.mark != now || matches!(k.scope, Scope::Stream(_)) {
            return None;
        }
        state.written.read(src, len).map(<[u8]>::to_vec)
    }

    /// How a synchronize of `scope` is answered now, `now` being the connection's message
    /// count; None: it is asked.
    pub fn answer(&self, scope: Scope, now: u64) -> Option<Answer> {
        let k = self.state().known?;
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
        let mut state = self.state();
        state.known = match state.known {
            Some(k) if k.mark == before && before.checked_add(1) == Some(after) && k.scope.includes(&scope) => {
                Some(Known { mark: after, copies: k.copies.filter(|c| !scope.covers_pending(c)), ..k })
            }
            _ => None,
        };
        if state.known.is_none() {
            state.written.clear();
        }
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
        idle.copied_in(legacy, (11, 1, 12), 0, 0, None);
        idle.copied_in(legacy, (12, 2, 14), 0, 0, None);
        assert_eq!(idle.answer(Scope::Stream(legacy), 14), FORWARD);
        assert_eq!(idle.answer(device, 14), FORWARD);
        idle.forwarded(Scope::Stream(legacy), 14, 15);
        assert_eq!(idle.answer(device, 15), IDLE, "the forwarded synchronize drained the copies");
        // A copy on another stream of the device, then one on a second stream: not followed.
        let per_thread = stream(PER_THREAD, 0, Some(5), 2);
        idle.copied_in(per_thread, (15, 1, 16), 0, 0, None);
        assert_eq!(idle.answer(Scope::Stream(legacy), 16), FORWARD, "asked of another stream: forwarded");
        idle.copied_in(legacy, (16, 1, 17), 0, 0, None);
        assert_eq!(idle.answer(device, 17), None, "copies on two streams");
        // A copy after another message, or on a stream the scope does not cover.
        idle.learn(device, 20, 1, 21);
        idle.copied_in(legacy, (22, 1, 23), 0, 0, None);
        assert_eq!(idle.answer(device, 23), None);
        idle.learn(device, 30, 1, 31);
        idle.copied_in(stream(0x41d1_0000_0000_0009, 0, None, 1), (31, 1, 32), 0, 0, None);
        assert_eq!(idle.answer(device, 32), None);
        // A created stream known idle takes copies too.
        let made = stream(0x41d1_0000_0000_0009, 0, None, 1);
        idle.learn(Scope::Stream(made), 40, 1, 41);
        idle.copied_in(made, (41, 1, 42), 0, 0, None);
        assert_eq!(idle.answer(Scope::Stream(made), 42), FORWARD);
        idle.forwarded(Scope::Stream(made), 42, 43);
        assert_eq!(idle.answer(Scope::Stream(made), 43), IDLE);
        // A forwarded synchronize with another message before it teaches nothing: nobody
        // waited for it, so the scope is no longer known.
        idle.copied_in(made, (43, 1, 44), 0, 0, None);
        idle.forwarded(Scope::Stream(made), 45, 46);
        assert_eq!(idle.answer(Scope::Stream(made), 46), None);
    }

    #[test]
    fn bytes_copied_in_while_the_device_was_idle_are_read_back_from_the_client() {
        let idle = Idle::new();
        let legacy = stream(0, 0, Some(5), 1);
        let device = Scope::Device(0, Some(5));
        idle.learn(device, 10, 1, 11);
        let ids: Vec<u8> = (0..64).collect();
        idle.copied_in(legacy, (11, 1, 12), 0x1000, 64, Some(&ids));
        idle.forwarded(Scope::Stream(legacy), 12, 13);
        idle.copied_in(legacy, (13, 1, 14), 0x2000, 8, Some(&[1; 8]));
        assert_eq!(idle.read(0x1000, 64, 14).as_deref(), Some(&ids[..]));
        assert_eq!(idle.read(0x1008, 4, 14).as_deref(), Some(&ids[8..12]), "a part of one copy");
        assert_eq!(idle.read(0x2000, 8, 14).as_deref(), Some(&[1u8; 8][..]));
        assert_eq!(idle.read(0x1000, 65, 14), None, "past what was copied");
        assert_eq!(idle.read(0x0ff8, 16, 14), None, "before it");
        assert_eq!(idle.read(0x1000, 64, 15), None, "something else went out since");
        // A read-back answered by the server (nothing else sent) keeps them.
        idle.learn(Scope::Stream(legacy), 14, 1, 15);
        assert_eq!(idle.read(0x2000, 8, 15).as_deref(), Some(&[1u8; 8][..]));
        // A copy whose bytes were not given (too large, in chunks) over part of a recorded one.
        idle.copied_in(legacy, (15, 1, 16), 0x1020, 16, None);
        assert_eq!(idle.read(0x1000, 8, 16), None, "overwritten in part");
        assert_eq!(idle.read(0x2000, 8, 16).as_deref(), Some(&[1u8; 8][..]));
        // A copy within a recorded range patches it.
        idle.copied_in(legacy, (16, 1, 17), 0x2002, 2, Some(&[9; 2]));
        assert_eq!(idle.read(0x2000, 8, 17).as_deref(), Some(&[1u8, 1, 9, 9, 1, 1, 1, 1][..]));
        // A later copy over a recorded range replaces it.
        idle.copied_in(legacy, (17, 1, 18), 0x1ffc, 12, Some(&[2; 12]));
        assert_eq!(idle.read(0x2000, 8, 18).as_deref(), Some(&[2u8; 8][..]));
        // Any other message: nothing is known any more, even once a drain follows it.
        idle.learn(device, 19, 1, 20);
        assert_eq!(idle.read(0x2000, 8, 20), None);
        // Only while a device (or context), not a stream, was known idle.
        idle.learn(Scope::Stream(legacy), 30, 1, 31);
        idle.copied_in(legacy, (31, 1, 32), 0x3000, 8, Some(&[3; 8]));
        assert_eq!(idle.answer(Scope::Stream(legacy), 32), FORWARD);
        assert_eq!(idle.read(0x3000, 8, 32), None);
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
