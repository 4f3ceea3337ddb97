//! Per-function call counts, round trips, bytes each way and time spent waiting.
//!
//! Counted always; read two ways: `chidori run --trace` writes the table when the program
//! exits (to stderr, or to the file CHIDORI_TRACE names), and the program itself can ask
//! at any time through [`chidori_stats_json`] (Python: `chidori.stats()`). While tracing,
//! each waited round trip is also counted at the program's own line that made it
//! ([`crate::origin`]).

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

/// Whether this process traces (`chidori run --trace`, CHIDORI_TRACE set): only then is
/// each waited round trip placed in the program's source.
pub fn tracing() -> bool {
    destination().is_some()
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
    let ns = waited.map_or(0, |start| start.elapsed().as_nanos() as u64);
    with(desc.name, |c| {
        c.calls.fetch_add(1, Ordering::Relaxed);
        c.round_trips.fetch_add(u64::from(waited.is_some()), Ordering::Relaxed);
        c.sent.fetch_add(sent as u64, Ordering::Relaxed);
        c.received.fetch_add(received as u64, Ordering::Relaxed);
        c.wait_ns.fetch_add(ns, Ordering::Relaxed);
    });
    if waited.is_some() && tracing() {
        crate::origin::waited(desc.name, 1, ns);
    }
}

/// Record a call answered without the network.
pub fn local(name: &'static str) {
    with(name, |c| {
        c.calls.fetch_add(1, Ordering::Relaxed);
    });
}

/// Record bytes moved by hand-written code (module uploads, chunked copies).
pub fn bytes(name: &'static str, round_trips: u64, sent: u64, received: u64, wait: std::time::Duration) {
    with(name, |c| {
        c.calls.fetch_add(1, Ordering::Relaxed);
        c.round_trips.fetch_add(round_trips, Ordering::Relaxed);
        c.sent.fetch_add(sent, Ordering::Relaxed);
        c.received.fetch_add(received, Ordering::Relaxed);
        c.wait_ns.fetch_add(wait.as_nanos() as u64, Ordering::Relaxed);
    });
    if round_trips > 0 && tracing() {
        crate::origin::waited(name, round_trips, wait.as_nanos() as u64);
    }
}

/// Seconds between the tables a file destination gets while the program runs.
const INTERIM_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// Held while a table is written; true once the exit's table has been.
static WRITTEN_AT_EXIT: std::sync::Mutex<bool> = std::sync::Mutex::new(false);

pub fn register_exit_report() {
    static ONCE: Once = Once::new();
    if destination().is_none() {
        return;
    }
    ONCE.call_once(|| {
        // SAFETY: registering a plain extern "C" function with no arguments.
        unsafe { libc::atexit(report) };
        if destination() != Some("-") {
            // A program killed before it exits (a timeout) leaves the last of these: the
            // table of at most INTERIM_EVERY ago, marked as such.
            let _ = std::thread::Builder::new().name("chidori-trace".into()).spawn(|| {
                let started = Instant::now();
                loop {
                    std::thread::sleep(INTERIM_EVERY);
                    let done = WRITTEN_AT_EXIT.lock().unwrap_or_else(|p| p.into_inner());
                    if *done {
                        return;
                    }
                    let secs = started.elapsed().as_secs();
                    write(&format!(
                        "chidori trace: so far ({secs} s after the first call; the program still ran)\n{}",
                        table()
                    ));
                }
            });
        }
    });
}

extern "C" fn report() {
    let _ = std::panic::catch_unwind(|| {
        // A child forked while the interim thread held the lock never sees it released (the
        // thread is not in the child): after a second, the table is written without it.
        for _ in 0..200 {
            match WRITTEN_AT_EXIT.try_lock() {
                Ok(mut done) => {
                    *done = true;
                    write(&table());
                    return;
                }
                Err(std::sync::TryLockError::Poisoned(p)) => {
                    *p.into_inner() = true;
                    write(&table());
                    return;
                }
                Err(std::sync::TryLockError::WouldBlock) => std::thread::sleep(std::time::Duration::from_millis(5)),
            }
        }
        write(&table());
    });
}

/// The table of every function's counts, then the waits by where the program made them.
fn table() -> String {
    let (rows, total) = snapshot();
    let mut out = String::from("chidori trace: function, calls, round trips, bytes sent, bytes received, ms waiting\n");
    for (name, row) in rows.iter().map(|(name, row)| (*name, row)).chain([("TOTAL", &total)]) {
        out.push_str(&format!(
            "{name:<44} {:>9} {:>9} {:>13} {:>13} {:>10.1}\n",
            row.calls,
            row.round_trips,
            row.sent,
            row.received,
            row.ms_waiting()
        ));
    }
    out.push_str(&crate::origin::report(40));
    out
}

fn write(out: &str) {
    match destination() {
        Some("-") | None => eprint!("{out}"),
        Some(path) => {
            let _ = std::fs::write(path, out);
        }
    }
}

/// One row of the table: a function's counts, summed over its variants.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Row {
    pub calls: u64,
    pub round_trips: u64,
    pub sent: u64,
    pub received: u64,
    pub wait_ns: u64,
}

impl Row {
    fn add(&mut self, other: &Row) {
        self.calls += other.calls;
        self.round_trips += other.round_trips;
        self.sent += other.sent;
        self.received += other.received;
        self.wait_ns += other.wait_ns;
    }

    fn ms_waiting(&self) -> f64 {
        self.wait_ns as f64 / 1e6
    }
}

/// Every function counted so far, most called first (then by name), and the totals.
/// Variants of one function (and equal names at different addresses) share a row.
pub fn snapshot() -> (Vec<(&'static str, Row)>, Row) {
    let mut merged: BTreeMap<&'static str, Row> = BTreeMap::new();
    for c in TABLE.iter() {
        let Some(name) = c.name.get() else { continue };
        merged.entry(name).or_default().add(&Row {
            calls: c.calls.load(Ordering::Relaxed),
            round_trips: c.round_trips.load(Ordering::Relaxed),
            sent: c.sent.load(Ordering::Relaxed),
            received: c.received.load(Ordering::Relaxed),
            wait_ns: c.wait_ns.load(Ordering::Relaxed),
        });
    }
    let mut rows: Vec<_> = merged.into_iter().collect();
    rows.sort_by(|a, b| b.1.calls.cmp(&a.1.calls).then(a.0.cmp(b.0)));
    let mut total = Row::default();
    for (_, row) in &rows {
        total.add(row);
    }
    (rows, total)
}

/// The counts as JSON: `{"functions": {NAME: COUNTS, ...}, "total": COUNTS, "sources":
/// [...]}`, where COUNTS is `{"calls", "round_trips", "bytes_sent", "bytes_received",
/// "ms_waiting"}` and "sources" lists where waited round trips came from while tracing
/// (see [`crate::origin::json`]; empty otherwise).
pub fn stats_json() -> String {
    fn counts(out: &mut String, row: &Row) {
        out.push_str(&format!(
            "{{\"calls\":{},\"round_trips\":{},\"bytes_sent\":{},\"bytes_received\":{},\"ms_waiting\":{}}}",
            row.calls,
            row.round_trips,
            row.sent,
            row.received,
            row.ms_waiting()
        ));
    }
    let (rows, total) = snapshot();
    let mut out = String::from("{\"functions\":{");
    for (i, (name, row)) in rows.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        json_string(&mut out, name);
        out.push(':');
        counts(&mut out, row);
    }
    out.push_str("},\"total\":");
    counts(&mut out, &total);
    out.push_str(",\"sources\":");
    crate::origin::json(&mut out, json_string);
    out.push('}');
    out
}

/// `text` as a JSON string literal.
fn json_string(out: &mut String, text: &str) {
    out.push('"');
    for ch in text.chars() {
        match ch {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

/// The counts so far as JSON (see [`stats_json`]), for the program itself: Python's
/// `chidori.stats()` finds this function in its own process with ctypes.
///
/// Writes the JSON (UTF-8, no terminating NUL) into `buf` when it fits in `cap` bytes and
/// returns its length either way: a caller passes a null `buf` to learn the length, then a
/// buffer at least that large (the counts may grow in between: compare again). Returns 0
/// on an internal error.
///
/// # Safety
/// `buf` must be null or valid for writes of `cap` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn chidori_stats_json(buf: *mut u8, cap: usize) -> usize {
    crate::guard::ffi("chidori_stats_json", 0, || {
        let json = stats_json();
        if !buf.is_null() && json.len() <= cap {
            // SAFETY: the caller guarantees `buf` is valid for `cap` bytes, and the JSON is
            // no longer than that; a Rust String never overlaps the caller's buffer.
            unsafe { std::ptr::copy_nonoverlapping(json.as_ptr(), buf, json.len()) };
        }
        json.len()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row_of(name: &str) -> Row {
        snapshot().0.into_iter().find(|(n, _)| *n == name).map(|(_, row)| row).unwrap_or_default()
    }

    #[test]
    fn counts_merge_per_name_and_sum_into_the_total() {
        local("testLocalCall");
        local("testLocalCall");
        bytes("testBytes", 1, 100, 20, std::time::Duration::from_millis(3));
        assert_eq!(row_of("testLocalCall"), Row { calls: 2, ..Row::default() });
        assert_eq!(row_of("testBytes"), Row { calls: 1, round_trips: 1, sent: 100, received: 20, wait_ns: 3_000_000 });
        let (rows, total) = snapshot();
        assert!(total.calls >= 3 && total.sent >= 100);
        assert!(rows.windows(2).all(|w| w[0].1.calls >= w[1].1.calls), "most called first: {rows:?}");
    }

    #[test]
    fn json_names_every_function_and_escapes_names() {
        bytes("(test \"quoted\" \\ name)", 2, 5, 7, std::time::Duration::from_micros(1500));
        let json = stats_json();
        assert!(json.starts_with("{\"functions\":{"), "{json}");
        assert!(
            json.contains(
                "\"(test \\\"quoted\\\" \\\\ name)\":{\"calls\":1,\"round_trips\":2,\"bytes_sent\":5,\
                 \"bytes_received\":7,\"ms_waiting\":1.5}"
            ),
            "{json}"
        );
        assert!(json.contains("},\"total\":{\"calls\":") && json.ends_with("]}"), "{json}");
    }

    #[test]
    fn the_export_writes_only_what_fits_and_returns_the_length() {
        local("testExportCall");
        // SAFETY: a null buffer is allowed.
        let needed = unsafe { chidori_stats_json(std::ptr::null_mut(), 0) };
        assert!(needed > 0);
        let mut small = vec![b'x'; 4];
        // SAFETY: `small` is valid for its length.
        let n = unsafe { chidori_stats_json(small.as_mut_ptr(), small.len()) };
        assert!(n >= needed);
        assert_eq!(small, b"xxxx", "nothing is written when the JSON does not fit");
        let mut buf = vec![0u8; n + 4096];
        // SAFETY: `buf` is valid for its length.
        let written = unsafe { chidori_stats_json(buf.as_mut_ptr(), buf.len()) };
        let json = std::str::from_utf8(&buf[..written]).expect("UTF-8");
        assert!(json.contains("\"testExportCall\":{\"calls\":1,"), "{json}");
    }
}
