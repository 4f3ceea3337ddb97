//! Answers made ahead: what lets the client answer a call without a round trip, in one
//! place. Plain Rust, free of FFI and of the connection; the hand-written functions in
//! `crate::custom` use it through a few lines each. `docs/ahead.md` explains what is
//! learned, when an answer is trusted and what drops it.
//!
//! * [`Answers`]: answers the server gave, kept by key, bounded, dropped when what they
//!   describe changes; an answer may be trusted only while nothing was sent since it was
//!   learned (a generation).
//! * [`Pool`]: objects made ahead of the program's creates, with the schedule that decides
//!   how many to make in one round trip.
//! * [`cudnn`]: what torch's cuDNN frontend asks after a graph, heuristics or plan
//!   finalize, learned per descriptor type, made ahead in that finalize's round trip.
//! * [`capture`]: which streams capture, and their capture status as the worker said it
//!   until something may change it.
//! * [`idle`]: streams and devices known idle (a read-back copy or a synchronize drained
//!   them, nothing sent since): their synchronizes return at once.
//! * [`events`]: events known complete (a query said so, or a synchronize drained the
//!   stream they were recorded on): their queries return at once.
//! * [`rnn`]: where an RNN's matrices and biases lie in its weight space, by what its
//!   descriptor says.
//! * [`graphs`]: graphs and instances the server handed out and the program has not
//!   destroyed: their destroys go without waiting.
//! * [`windows`]: device allocations the client places itself in address space the server
//!   reserved: a `cudaMalloc` answered without waiting.

pub mod capture;
pub mod cudnn;
pub mod events;
pub mod graphs;
pub mod idle;
pub mod learned;
pub mod rnn;
pub mod windows;

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;
use std::sync::{Mutex, MutexGuard};

/// Answers the server gave, by key: at most `cap` (the oldest go first).
pub struct Answers<K, V> {
    cap: usize,
    store: Mutex<Option<Store<K, V>>>,
}

struct Store<K, V> {
    map: HashMap<K, (V, Option<u64>)>,
    order: VecDeque<K>,
}

impl<K: Eq + Hash + Clone, V: Clone> Answers<K, V> {
    pub const fn new(cap: usize) -> Self {
        Answers { cap, store: Mutex::new(None) }
    }

    fn lock(&self) -> MutexGuard<'_, Option<Store<K, V>>> {
        self.store.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The answer to `key`, if one was learned (and not tied to a generation).
    pub fn get(&self, key: &K) -> Option<V> {
        let store = self.lock();
        let (v, generation) = store.as_ref()?.map.get(key)?;
        generation.is_none().then(|| v.clone())
    }

    /// The answer to `key` if it was learned at `generation` (nothing sent since).
    pub fn get_at(&self, key: &K, generation: u64) -> Option<V> {
        let store = self.lock();
        let (v, at) = store.as_ref()?.map.get(key)?;
        (*at == Some(generation)).then(|| v.clone())
    }

    /// Keep the server's answer to `key`, trusted until it is forgotten.
    pub fn learn(&self, key: K, value: V) {
        self.insert(key, value, None);
    }

    /// Keep the server's answer to `key`, trusted only at `generation`.
    pub fn learn_at(&self, key: K, value: V, generation: u64) {
        self.insert(key, value, Some(generation));
    }

    fn insert(&self, key: K, value: V, generation: Option<u64>) {
        let mut guard = self.lock();
        let store = guard.get_or_insert_with(|| Store { map: HashMap::new(), order: VecDeque::new() });
        if store.map.insert(key.clone(), (value, generation)).is_none() {
            store.order.push_back(key);
        }
        while store.map.len() > self.cap {
            let Some(old) = store.order.pop_front() else { break };
            store.map.remove(&old);
        }
        if store.order.len() > 2 * self.cap.max(1) {
            let map = &store.map;
            store.order.retain(|k| map.contains_key(k));
        }
    }

    /// Change a learned answer in place (a set call told the client the new value); no
    /// effect where none was learned.
    pub fn update(&self, key: &K, f: impl FnOnce(&mut V)) {
        if let Some((v, _)) = self.lock().as_mut().and_then(|s| s.map.get_mut(key)) {
            f(v);
        }
    }

    /// Drop every answer whose key `pred` accepts (what it describes changed).
    pub fn forget_where(&self, pred: impl Fn(&K) -> bool) {
        if let Some(store) = self.lock().as_mut() {
            store.map.retain(|k, _| !pred(k));
        }
    }

    /// Drop everything (a context reset).
    pub fn clear(&self) {
        *self.lock() = None;
    }

    pub fn len(&self) -> usize {
        self.lock().as_ref().map_or(0, |s| s.map.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Objects made ahead of the program's creates, by kind `K`: from the second create of one
/// kind `M` in a row the client makes 2, then 4, then at most [`BATCH_MAX`] in one round
/// trip and answers the next creates of that kind from them. (`M` may be coarser than `K`:
/// streams count misses per device and are kept per context, which may not be known yet.)
pub struct Pool<K, M = K> {
    state: Mutex<Option<PoolState<K, M>>>,
}

struct PoolState<K, M> {
    ready: HashMap<K, Vec<u64>>,
    misses: HashMap<M, u32>,
}

/// The most objects one round trip makes.
pub const BATCH_MAX: usize = 8;

impl<K: Eq + Hash + Clone, M: Eq + Hash> Pool<K, M> {
    pub const fn new() -> Self {
        Pool { state: Mutex::new(None) }
    }

    fn lock(&self) -> MutexGuard<'_, Option<PoolState<K, M>>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// An object made ahead for `kind`, the oldest first.
    pub fn take(&self, kind: &K) -> Option<u64> {
        self.lock().as_mut()?.ready.get_mut(kind)?.pop()
    }

    /// The program's create of `miss_kind` found none made ahead: how many to make now
    /// (its own included).
    pub fn missed(&self, miss_kind: M) -> usize {
        let mut guard = self.lock();
        let state = guard.get_or_insert_with(|| PoolState { ready: HashMap::new(), misses: HashMap::new() });
        let m = state.misses.entry(miss_kind).or_insert(0);
        *m += 1;
        batch(*m)
    }

    /// Objects made ahead for `kind`, in the order they were made.
    pub fn add(&self, kind: K, made: impl IntoIterator<Item = u64>) {
        let mut guard = self.lock();
        let state = guard.get_or_insert_with(|| PoolState { ready: HashMap::new(), misses: HashMap::new() });
        let ready = state.ready.entry(kind).or_default();
        let made: Vec<u64> = made.into_iter().collect();
        // Given out from the end: the program's next create gets the oldest.
        ready.extend(made.into_iter().rev());
    }

    /// Forget everything (the objects are gone: a context reset or destroy).
    pub fn clear(&self) {
        *self.lock() = None;
    }
}

impl<K: Eq + Hash + Clone, M: Eq + Hash> Default for Pool<K, M> {
    fn default() -> Self {
        Self::new()
    }
}

/// How many objects to make for the program's `misses`-th create of a kind in a row.
pub fn batch(misses: u32) -> usize {
    if misses < 2 { 1 } else { (1usize << (misses - 1).min(8)).min(BATCH_MAX) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_bounded_forgotten_and_tied_to_their_generation() {
        let a: Answers<u32, &str> = Answers::new(2);
        a.learn(1, "one");
        a.learn(2, "two");
        a.learn(3, "three");
        assert_eq!((a.get(&1), a.get(&2), a.get(&3)), (None, Some("two"), Some("three")), "the oldest went");
        a.forget_where(|k| *k == 2);
        assert_eq!(a.get(&2), None);
        a.update(&3, |v| *v = "drei");
        assert_eq!(a.get(&3), Some("drei"));
        a.learn_at(7, "seven", 41);
        assert_eq!(a.get_at(&7, 41), Some("seven"));
        assert_eq!(a.get_at(&7, 42), None, "something was sent since");
        assert_eq!(a.get(&7), None, "a generation answer is not a lasting one");
        a.clear();
        assert!(a.is_empty());
    }

    #[test]
    fn pools_grow_to_eight_and_give_out_the_oldest_first() {
        let sizes: Vec<usize> = (1..=7).map(batch).collect();
        assert_eq!(sizes, [1, 2, 4, 8, 8, 8, 8]);
        // torch's 32 streams of one priority: the misses and what each made ahead.
        let pool: Pool<u8> = Pool::new();
        let (mut round_trips, mut next) = (0, 100u64);
        for _ in 0..32 {
            if pool.take(&0).is_some() {
                continue;
            }
            round_trips += 1;
            let n = pool.missed(0);
            pool.add(
                0,
                (1..n).map(|_| {
                    next += 1;
                    next
                }),
            );
        }
        assert_eq!(round_trips, 7);
        let mut left = 0;
        while pool.take(&0).is_some() {
            left += 1;
        }
        assert_eq!(left, 7);
        pool.add(1, [5, 6]);
        assert_eq!(pool.take(&1), Some(5), "made first, given out first");
    }
}
