//! `chidori run --trace`: per-function call counts, round trips, bytes each way and time
//! spent waiting, written when the program exits (to stderr, or to the file CHIDORI_TRACE
//! names).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, Once, OnceLock};
use std::time::Instant;

use chidori_protocol::desc::CallDesc;

#[derive(Default)]
struct Counter {
    calls: AtomicU64,
    round_trips: AtomicU64,
    sent: AtomicU64,
    received: AtomicU64,
    wait_ns: AtomicU64,
}

fn destination() -> Option<&'static str> {
    static DEST: OnceLock<Option<String>> = OnceLock::new();
    DEST.get_or_init(|| std::env::var(chidori_protocol::env::TRACE).ok().filter(|v| !v.is_empty())).as_deref()
}

fn counters() -> &'static Mutex<HashMap<&'static str, Counter>> {
    static C: OnceLock<Mutex<HashMap<&'static str, Counter>>> = OnceLock::new();
    C.get_or_init(|| Mutex::new(HashMap::new()))
}

fn with(name: &'static str, f: impl FnOnce(&Counter)) {
    let mut map = counters().lock().unwrap_or_else(|p| p.into_inner());
    f(map.entry(name).or_default());
}

/// Record one forwarded call.
pub fn record(desc: &CallDesc, waited: bool, sent: usize, received: usize, start: Instant) {
    if destination().is_none() {
        return;
    }
    let ns = if waited { start.elapsed().as_nanos() as u64 } else { 0 };
    with(desc.name, |c| {
        c.calls.fetch_add(1, Ordering::Relaxed);
        c.round_trips.fetch_add(u64::from(waited), Ordering::Relaxed);
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
        let map = counters().lock().unwrap_or_else(|p| p.into_inner());
        let mut rows: Vec<_> = map.iter().collect();
        rows.sort_by(|a, b| {
            b.1.calls.load(Ordering::Relaxed).cmp(&a.1.calls.load(Ordering::Relaxed)).then(a.0.cmp(b.0))
        });
        let mut out =
            String::from("chidori trace: function, calls, round trips, bytes sent, bytes received, ms waiting\n");
        let (mut calls, mut trips, mut sent, mut recv, mut wait) = (0, 0, 0, 0, 0);
        for (name, c) in rows {
            let v = |a: &AtomicU64| a.load(Ordering::Relaxed);
            out.push_str(&format!(
                "{name:<44} {:>9} {:>9} {:>13} {:>13} {:>10.1}\n",
                v(&c.calls),
                v(&c.round_trips),
                v(&c.sent),
                v(&c.received),
                v(&c.wait_ns) as f64 / 1e6
            ));
            calls += v(&c.calls);
            trips += v(&c.round_trips);
            sent += v(&c.sent);
            recv += v(&c.received);
            wait += v(&c.wait_ns);
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
