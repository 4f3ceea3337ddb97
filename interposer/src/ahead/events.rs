//! Events the client knows to be complete: a query of one then returns at once natively
//! (`cudaSuccess`), so the client answers it without a round trip.
//!
//! torch's pinned host allocator records an event where a pinned block was last used and
//! queries it before reusing the block (`CachingHostAllocator::process_events`); by then a
//! synchronize has usually drained the stream the event was recorded on. Each query was a
//! round trip (17 in the torch suite's second run at 70 ms on an H100).
//!
//! An event is complete once a query or a synchronize of it said so, or once a synchronize
//! of a scope covering the stream it was recorded on returned, where the same thread
//! recorded it before (one thread's messages reach the server in order; another thread's
//! record may still be on its way). It stays complete until it is recorded again, which
//! the client sees: [`Events::recorded`]. What the client cannot see drops everything: a
//! graph launch (its event-record nodes record again on the server), a graph loop, a
//! context reset. An event another process may record (made interprocess, or opened from
//! another process's CUDA IPC handle) is never known complete: its records are not all
//! the client's to see.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

use super::idle::{Scope, StreamKey};

/// Events followed at most: past it, what is known is dropped (queries then ask).
const MAX_EVENTS: usize = 1 << 16;

/// An event recorded, not known complete yet: on `stream` by `thread`, the `order`th record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Recorded {
    stream: StreamKey,
    thread: u32,
    order: u64,
}

/// Events recorded and not yet known complete (few: a synchronize looks through them), and
/// events known complete, by the program's handle.
#[derive(Default)]
struct State {
    recorded: HashMap<u64, Recorded>,
    complete: HashSet<u64>,
}

/// What the client knows of each event.
pub struct Events {
    state: Mutex<Option<State>>,
    /// Events the server made for this client and that it has not destroyed.
    live: Mutex<Option<Live>>,
    /// Some live event was shared (until then a completion asks nothing more).
    any_shared: std::sync::atomic::AtomicBool,
}

/// Events the server made for this client and that it has not destroyed: a destroy of one
/// cannot be refused (one recorded and not complete is released once it is), so it goes
/// without waiting. Kept across what drops the rest, but a context's end.
#[derive(Default)]
struct Live {
    made: HashSet<u64>,
    /// Those another process may record too.
    shared: HashSet<u64>,
}

/// Records counted, for their order on a stream.
static RECORDS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

impl Default for Events {
    fn default() -> Self {
        Self::new()
    }
}

impl Events {
    pub const fn new() -> Self {
        Events {
            state: Mutex::new(None),
            live: Mutex::new(None),
            any_shared: std::sync::atomic::AtomicBool::new(false),
        }
    }

    fn with_live<R>(&self, f: impl FnOnce(&mut Live) -> R) -> R {
        let mut guard = self.live.lock().unwrap_or_else(|p| p.into_inner());
        let live = guard.get_or_insert_with(Live::default);
        // Past the bound, which events were made here is forgotten (their destroys wait);
        // which are shared is not (a shared event is never taken as complete).
        if live.made.len() > MAX_EVENTS {
            live.made.clear();
        }
        f(live)
    }

    /// The server made `event` for this client; `shared`: another process may record it
    /// (interprocess, or opened by CUDA IPC), so only the server can say whether it is
    /// complete.
    pub fn created(&self, event: u64, shared: bool) {
        if shared {
            self.any_shared.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        self.with_live(|l| {
            l.made.insert(event);
            if shared {
                l.shared.insert(event);
            }
        });
    }

    /// `event` is destroyed: nothing is known of it any more. Whether it was live (made for
    /// this client and not destroyed before).
    pub fn destroyed(&self, event: u64) -> bool {
        self.unknown(event);
        self.with_live(|l| {
            l.shared.remove(&event);
            l.made.remove(&event)
        })
    }

    /// The context's events are gone (a reset, a destroy): their handles may be given out
    /// again.
    pub fn context_ended(&self) {
        self.forget_all();
        *self.live.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }

    fn with<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        let mut guard = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let state = guard.get_or_insert_with(State::default);
        if state.recorded.len() + state.complete.len() > MAX_EVENTS {
            *state = State::default();
        }
        f(state)
    }

    /// `event` was recorded on `stream` by `thread` (sent, not yet done).
    pub fn recorded(&self, event: u64, stream: StreamKey, thread: u32) {
        let order = RECORDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.with(|s| {
            s.complete.remove(&event);
            s.recorded.insert(event, Recorded { stream, thread, order });
        });
    }

    /// Nothing is known of `event` any more (destroyed, or recorded where the client cannot
    /// follow it: into a capture).
    pub fn unknown(&self, event: u64) {
        self.with(|s| {
            s.complete.remove(&event);
            s.recorded.remove(&event);
        });
    }

    /// The server said `event` is complete (a query or a synchronize of it succeeded): so
    /// is every event the same thread recorded on the same stream before it.
    pub fn complete(&self, event: u64) {
        self.with(|s| {
            if let Some(r) = s.recorded.remove(&event) {
                s.settle(|e| e.stream == r.stream && e.thread == r.thread && e.order < r.order);
            }
            s.complete.insert(event);
        });
    }

    /// A synchronize of `scope` by `thread` returned: the events that thread recorded on a
    /// stream the scope covers are complete.
    pub fn drained(&self, scope: Scope, thread: u32) {
        self.with(|s| s.settle(|e| e.thread == thread && scope.covers(&e.stream)));
    }

    /// Whether `event` is known complete.
    pub fn is_complete(&self, event: u64) -> bool {
        self.with(|s| s.complete.contains(&event))
            && !(self.any_shared.load(std::sync::atomic::Ordering::Relaxed)
                && self.with_live(|l| l.shared.contains(&event)))
    }

    /// Work the client cannot follow may have recorded any event again.
    pub fn forget_all(&self) {
        *self.state.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }
}

impl State {
    /// The recorded events `done` accepts are complete.
    fn settle(&mut self, done: impl Fn(&Recorded) -> bool) {
        let complete = &mut self.complete;
        self.recorded.retain(|&event, r| {
            if done(r) {
                complete.insert(event);
                return false;
            }
            true
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ahead::idle::stream;

    #[test]
    fn events_made_for_the_client_are_live_until_destroyed_or_their_context_ends() {
        let e = Events::new();
        assert!(!e.destroyed(5), "never made");
        e.created(5, false);
        e.created(6, false);
        e.forget_all();
        assert!(e.destroyed(5), "a graph launch forgets states, not which events exist");
        assert!(!e.destroyed(5), "destroyed already");
        e.context_ended();
        assert!(!e.destroyed(6), "gone with its context");
    }

    #[test]
    fn an_event_another_process_may_record_is_never_known_complete() {
        let e = Events::new();
        let s = stream(0x50, 0, None, 1);
        e.created(3, true);
        e.recorded(3, s, 1);
        e.drained(Scope::Stream(s), 1);
        e.complete(3);
        assert!(!e.is_complete(3), "another process may have recorded it since");
        assert!(e.destroyed(3));
        e.recorded(3, s, 1);
        e.complete(3);
        assert!(e.is_complete(3), "a handle given out again is not shared by itself");
    }

    #[test]
    fn an_event_is_complete_once_said_or_drained_by_its_thread_until_recorded_again() {
        let e = Events::new();
        let (s, other) = (stream(0x50, 0, None, 1), stream(0x60, 0, None, 1));
        assert!(!e.is_complete(7), "never seen");
        e.recorded(7, s, 1);
        assert!(!e.is_complete(7));
        // Another stream drained, or this one by another thread: still unknown.
        e.drained(Scope::Stream(other), 1);
        e.drained(Scope::Stream(s), 2);
        assert!(!e.is_complete(7));
        e.drained(Scope::Stream(s), 1);
        assert!(e.is_complete(7));
        // Recorded again: not known until something says so.
        e.recorded(7, s, 1);
        assert!(!e.is_complete(7));
        e.complete(7);
        assert!(e.is_complete(7));
        e.unknown(7);
        assert!(!e.is_complete(7));
        // A device synchronize covers the device's default streams, not created ones.
        let default = stream(0, 3, None, 1);
        e.recorded(8, default, 1);
        e.recorded(9, s, 1);
        e.drained(Scope::Device(3, None), 1);
        assert!(e.is_complete(8) && !e.is_complete(9));
        e.forget_all();
        assert!(!e.is_complete(8));
        // One complete: those recorded before it on its stream by its thread are too.
        e.recorded(1, s, 1);
        e.recorded(2, other, 1);
        e.recorded(3, s, 2);
        e.recorded(4, s, 1);
        e.recorded(5, s, 1);
        e.complete(4);
        assert!(e.is_complete(1) && e.is_complete(4));
        assert!(!e.is_complete(2) && !e.is_complete(3) && !e.is_complete(5));
    }
}
