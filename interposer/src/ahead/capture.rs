//! Stream captures as the client follows them: which streams this process is capturing,
//! and the capture status, id and graph the worker gave for a stream, kept until something
//! may change them. Pure data: `crate::custom::capture` answers the program's questions
//! from it, the call path (`crate::runtime`, `crate::conn`) reports what may change it.
//!
//! What may change a stream's capture (and so ends every answer kept): a capture begun or
//! ended, a stream waiting on an event (it may join a capture), capture dependencies
//! updated, or any call failing while a capture is active (an illegal call invalidates the
//! capture it ran in).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

/// A stream's capture status, id and graph, as the worker said them.
pub type Answer = (u32, u64, u64);

/// A stream, and for the per-thread default stream the thread whose it is.
pub type StreamKey = (u64, u32);

/// The captures of one process.
pub struct Captures {
    /// Streams whose capture this process began and has not ended, in the order begun.
    streams: Mutex<Vec<u64>>,
    /// `streams`' length, where every call can read it without a lock (each forwarded call
    /// asks).
    active: AtomicUsize,
    /// Bumped by anything that may change a stream's capture state: answers learned before
    /// are not used after.
    epoch: AtomicU64,
    /// (the epoch they were learned in, stream → its answer).
    answers: Mutex<Option<(u64, HashMap<StreamKey, Answer>)>>,
}

impl Default for Captures {
    fn default() -> Self {
        Self::new()
    }
}

impl Captures {
    pub const fn new() -> Self {
        Captures {
            streams: Mutex::new(Vec::new()),
            active: AtomicUsize::new(0),
            epoch: AtomicU64::new(0),
            answers: Mutex::new(None),
        }
    }

    fn streams(&self) -> MutexGuard<'_, Vec<u64>> {
        self.streams.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether any capture may be active in this process.
    pub fn any_active(&self) -> bool {
        self.active.load(Ordering::Acquire) > 0
    }

    /// A capture of `stream` began (the worker said so).
    pub fn began(&self, stream: u64) {
        let mut s = self.streams();
        s.push(stream);
        self.active.store(s.len(), Ordering::Release);
        drop(s);
        self.changed();
    }

    /// A capture call on `stream` ended it, successfully or invalidated (a stream that was
    /// not capturing is no change to the list, but answers still go).
    pub fn ended(&self, stream: u64) {
        let mut s = self.streams();
        if let Some(i) = s.iter().position(|x| *x == stream) {
            s.swap_remove(i);
        }
        self.active.store(s.len(), Ordering::Release);
        drop(s);
        self.changed();
    }

    /// Something may have changed which streams capture, or how.
    pub fn changed(&self) {
        self.epoch.fetch_add(1, Ordering::SeqCst);
    }

    /// A call named `name` is being sent: one that may make a stream join a capture or
    /// move its dependencies ends what was learned.
    pub fn sending(&self, name: &str) {
        if !self.any_active() {
            return;
        }
        let name = chidori_protocol::desc::strip_suffixes(name, &["_ptsz", "_ptds"]);
        if name.starts_with("cudaStreamWaitEvent")
            || name.starts_with("cuStreamWaitEvent")
            || name.contains("UpdateCaptureDependencies")
        {
            self.changed();
        }
    }

    /// A call failed: while a capture is active, that may have invalidated it.
    pub fn failed(&self) {
        if self.any_active() {
            self.changed();
        }
    }

    /// The epoch to learn an answer in: read before the question is sent.
    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::SeqCst)
    }

    /// The answer about `stream`, if the worker gave one and nothing changed since.
    pub fn answer(&self, stream: StreamKey) -> Option<Answer> {
        let epoch = self.epoch();
        let answers = self.answers.lock().unwrap_or_else(|p| p.into_inner());
        answers.as_ref().filter(|(e, _)| *e == epoch).and_then(|(_, m)| m.get(&stream).copied())
    }

    /// Keep the worker's answer about `stream`, asked in `epoch`, unless something changed
    /// since.
    pub fn learn(&self, stream: StreamKey, epoch: u64, answer: Answer) {
        let mut answers = self.answers.lock().unwrap_or_else(|p| p.into_inner());
        if self.epoch() != epoch {
            return;
        }
        let (e, map) = answers.get_or_insert_with(|| (epoch, HashMap::new()));
        if *e != epoch {
            *e = epoch;
            map.clear();
        }
        map.insert(stream, answer);
    }
}

#[cfg(test)]
mod tests {
    use super::Captures;

    const ACTIVE: (u32, u64, u64) = (1, 7, 0x100);

    #[test]
    fn answers_hold_until_something_may_change_a_capture() {
        let c = Captures::new();
        assert!(!c.any_active());
        c.began(5);
        assert!(c.any_active());
        let epoch = c.epoch();
        c.learn((5, 0), epoch, ACTIVE);
        assert_eq!(c.answer((5, 0)), Some(ACTIVE));
        assert_eq!(c.answer((5, 1)), None, "another thread's per-thread stream");
        c.sending("cudaLaunchKernel");
        c.sending("cudaMemcpyAsync_ptsz");
        assert_eq!(c.answer((5, 0)), Some(ACTIVE), "ordinary calls change nothing");
        c.sending("cudaStreamWaitEvent_ptsz");
        assert_eq!(c.answer((5, 0)), None, "a stream may have joined a capture");

        c.learn((5, 0), c.epoch(), ACTIVE);
        c.failed();
        assert_eq!(c.answer((5, 0)), None, "a failure may invalidate the capture");

        c.learn((5, 0), c.epoch(), ACTIVE);
        c.sending("cuStreamUpdateCaptureDependencies_v2");
        assert_eq!(c.answer((5, 0)), None);
    }

    #[test]
    fn an_answer_asked_before_a_change_is_not_kept() {
        let c = Captures::new();
        c.began(5);
        let asked = c.epoch();
        c.began(6);
        c.learn((5, 0), asked, ACTIVE);
        assert_eq!(c.answer((5, 0)), None);
        // Answers learned in an older epoch go when a newer one is learned.
        c.learn((6, 0), c.epoch(), ACTIVE);
        assert_eq!(c.answer((6, 0)), Some(ACTIVE));
    }

    #[test]
    fn captures_end_in_any_order_and_unknown_ends_change_nothing() {
        let c = Captures::new();
        c.began(5);
        c.began(6);
        c.ended(9);
        assert!(c.any_active());
        c.ended(5);
        assert!(c.any_active());
        c.ended(6);
        assert!(!c.any_active());
        // With nothing active, a failure or a wait is no change of epoch.
        let epoch = c.epoch();
        c.failed();
        c.sending("cudaStreamWaitEvent");
        assert_eq!(c.epoch(), epoch);
    }
}
