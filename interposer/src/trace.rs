//! `chidori run --trace`: per-function call counts, round trips, bytes each way and time
//! spent waiting, written when the program exits (to stderr, or to the file CHIDORI_TRACE
//! names).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Once, OnceLock};
use std::time::Instant;

use chidori_protocol::desc::CallDesc;

/// One function's counts. A slot of a fixed table, claimed by the address and length of the
/// function's name (a `&'static str`): counting takes no lock, since local calls such as
/// cudaGetDevice run millions of times.
struct Counter {
    key: AtomicUsize,
    name: OnceLock<&'static str>,
    calls: AtomicU64,
    round_trips: AtomicU64,
    sent: AtomicU64,
    received: AtomicU64,
    wait_ns: AtomicU64,
}

impl Counter {
    const fn new() -> Counter {
        Counter {
            key: AtomicUsize::new(0),
            name: OnceLock::new(),
            calls: AtomicU64::new(0),
            round_trips: AtomicU64::new(0),
            sent: AtomicU64::new(0),
            received: AtomicU64::new(0),
            wait_ns: AtomicU64::new(0),
        }
    }
}

/// More slots than functions any program calls; a full table drops counts (never blocks).
const SLOTS: usize = 4096;
static TABLE: [Counter; SLOTS] = [const { Counter::new() }; SLOTS];

fn destination() -> Option<&'static str> {
    static DEST: OnceLock<Option<String>> = OnceLock::new();
    DEST.get_or_init(|| std::env::var(chidori_protocol::env::TRACE).ok().filter(|v| !v.is_empty())).as_deref()
}

fn with(name: &'static str, f: impl FnOnce(&Counter)) {
    // Two names may share an address (one a prefix of the other): the length tells them apart.
    // Never 0 (a free slot): a name's address is non-null and below bit 48.
    let key = (name.as_ptr() as usize) ^ (name.len() << 48);
    let start = key.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 52;
    for i in 0..SLOTS {
        let slot = &TABLE[(start + i) % SLOTS];
        let k = slot.key.load(Ordering::Acquire);
        let mine = k == key
            || (k == 0
                && match slot.key.compare_exchange(0, key, Ordering::AcqRel, Ordering::Acquire) {
                    Ok(_) => true,
                    Err(other) => other == key,
                });
        if mine {
            let _ = slot.name.set(name);
            f(slot);
            return;
        }
    }
}

/// Record one forwarded call; `waited`: when the caller started waiting for its reply
/// (None for a call sent without waiting).
pub fn record(desc: &CallDesc, sent: usize, received: usize, waited: Option<Instant>) {
    if destination().is_none() {
        return;
    }
    let ns = waited.map_or(0, |start| start.elapsed().as_nanos() as u64);
    with(desc.name, |c| {
        c.calls.fetch_add(1, Ordering::Relaxed);
        c.round_trips.fetch_add(u64::from(waited.is_some()), Ordering::Relaxed);
        c.sent.fetch_add(sent as u64, Ordering::Relaxed);
        c.received.fetch_add(received as u64, Ordering::Relaxed);
        c.wait_ns.fetch_add(ns, Ordering::Relaxed);
    });
}

/// Record a call answered without the network.
pub fn local(name: &'static str) {
    if destination().is_none() {
        return;
    }
    with(name, |c| {
        c.calls.fetch_add(1, Ordering::Relaxed);
    });
}

/// Record bytes moved by hand-written code (module uploads, chunked copies).
pub fn bytes(name: &'static str, round_trips: u64, sent: u64, received: u64, wait: std::time::Duration) {
    if destination().is_none() {
        return;
    }
    with(name, |c| {
        c.calls.fetch_add(1, Ordering::Relaxed);
        c.round_trips.fetch_add(round_trips, Ordering::Relaxed);
        c.sent.fetch_add(sent, Ordering::Relaxed);
        c.received.fetch_add(received, Ordering::Relaxed);
        c.wait_ns.fetch_add(wait.as_nanos() as u64, Ordering::Relaxed);
    });
}

pub fn register_exit_report() {
    static ONCE: Once = Once::new();
    if destination().is_none() {
        return;
    }
    ONCE.call_once(|| {
        // SAFETY: registering a plain extern "C" function with no arguments.
        unsafe { libc::atexit(report) };
    });
}

extern "C" fn report() {
    let _ = std::panic::catch_unwind(|| {
        // Variants of one function (and equal names at different addresses) share a row.
        let mut merged: BTreeMap<&str, [u64; 5]> = BTreeMap::new();
        for c in TABLE.iter() {
            let Some(name) = c.name.get() else { continue };
            let row = merged.entry(name).or_default();
            for (i, a) in [&c.calls, &c.round_trips, &c.sent, &c.received, &c.wait_ns].iter().enumerate() {
                row[i] += a.load(Ordering::Relaxed);
            }
        }
        let mut rows: Vec<_> = merged.into_iter().collect();
        rows.sort_by(|a, b| b.1[0].cmp(&a.1[0]).then(a.0.cmp(b.0)));
        let mut out =
            String::from("chidori trace: function, calls, round trips, bytes sent, bytes received, ms waiting\n");
        let (mut calls, mut trips, mut sent, mut recv, mut wait) = (0, 0, 0, 0, 0);
        for (name, [c, t, s, r, w]) in rows {
            out.push_str(&format!("{name:<44} {c:>9} {t:>9} {s:>13} {r:>13} {:>10.1}\n", w as f64 / 1e6));
            calls += c;
            trips += t;
            sent += s;
            recv += r;
            wait += w;
        }
        out.push_str(&format!(
            "{:<44} {calls:>9} {trips:>9} {sent:>13} {recv:>13} {:>10.1}\n",
            "TOTAL",
            wait as f64 / 1e6
        ));
        match destination() {
            Some("-") | None => eprint!("{out}"),
            Some(path) => {
                let _ = std::fs::write(path, out);
            }
        }
    });
}
