//! Logging for the interposer: `tracing` to stderr (never the application's stdout),
//! filtered by `CHIDORI_LOG` (never `RUST_LOG`, which belongs to the application).

use std::collections::HashSet;
use std::sync::{Mutex, Once};

static INIT: Once = Once::new();

/// Install the subscriber on first use. Default level: warn.
pub fn init() {
    INIT.call_once(|| {
        let filter = std::env::var("CHIDORI_LOG").unwrap_or_else(|_| "warn".to_owned());
        let filter = tracing_subscriber::EnvFilter::try_new(&filter)
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
        let color = std::env::var_os("NO_COLOR").is_none() && std::io::IsTerminal::is_terminal(&std::io::stderr());
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_ansi(color)
            .with_writer(std::io::stderr)
            .with_target(false)
            .without_time()
            .try_init();
    });
}

static SEEN: Mutex<Option<HashSet<&'static str>>> = Mutex::new(None);

/// Run `emit` (a log statement) the first time `key` is seen in this process.
pub fn once(key: &'static str, emit: impl FnOnce()) {
    init();
    let first = match SEEN.lock() {
        Ok(mut guard) => guard.get_or_insert_with(HashSet::new).insert(key),
        Err(_) => false,
    };
    if first {
        emit();
    }
}

static SEEN_OWNED: Mutex<Option<HashSet<String>>> = Mutex::new(None);

/// As [`once`], for keys built at run time (server messages).
pub fn once_owned(key: &str, emit: impl FnOnce()) {
    init();
    let first = match SEEN_OWNED.lock() {
        Ok(mut guard) => guard.get_or_insert_with(HashSet::new).insert(key.to_owned()),
        Err(_) => false,
    };
    if first {
        emit();
    }
}
