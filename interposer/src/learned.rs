//! The client's side of answers learned in earlier sessions (`crate::ahead::learned` is the
//! store): the store of the connected server's identity, and the checks of answers given
//! from it. The worker still makes every call whose answer the client gave; its answer is
//! compared when it comes, on a thread of its own, and a different one ends the session
//! naming the call and drops the whole store (`docs/ahead.md`).

use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::ahead::learned::Learned;
use crate::conn::{Conn, Outcome, Slot};

static LEARNED: Mutex<Option<Learned>> = Mutex::new(None);
/// Checks whose server answer has not come yet.
static CHECKING: (Mutex<usize>, Condvar) = (Mutex::new(0), Condvar::new());

/// Whether `CHIDORI_LEARNED=0` turned off what earlier sessions learned (read once).
pub fn off() -> bool {
    static OFF: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *OFF.get_or_init(|| std::env::var(chidori_protocol::env::LEARNED).is_ok_and(|v| v == "0"))
}

/// With the store of the connected server's identity (opened on first use; None where
/// `CHIDORI_LEARNED=0`).
pub fn with<T>(conn: &Conn, f: impl FnOnce(&mut Learned) -> T) -> Option<T> {
    if off() {
        return None;
    }
    let mut slot = LEARNED.lock().unwrap_or_else(|p| p.into_inner());
    let store = slot.get_or_insert_with(|| {
        Learned::open(crate::ahead::learned::dir().as_deref(), &crate::ahead::learned::identity(&conn.welcome))
    });
    Some(f(store))
}

/// Check the server's answer to a call whose answer the program was given from the store:
/// `differs` says, from the outcome, how it differs (None: it does not). `keep` lives until
/// then (the buffer the reply's outputs are written into).
pub fn check<K: Send + 'static>(
    conn: Arc<Conn>,
    call: &'static str,
    slot: Arc<Slot>,
    keep: K,
    differs: impl FnOnce(&Outcome, &K) -> Option<String> + Send + 'static,
) {
    check_all(conn, call, vec![slot], keep, move |outcomes, keep| differs(&outcomes[0], keep));
}

/// [`check`] of several calls answered together: `differs` gets every outcome, in order.
pub fn check_all<K: Send + 'static>(
    conn: Arc<Conn>,
    call: &'static str,
    slots: Vec<Arc<Slot>>,
    keep: K,
    differs: impl FnOnce(&[Outcome], &K) -> Option<String> + Send + 'static,
) {
    // Answers given from earlier sessions are checked before the session ends.
    static AT_EXIT: std::sync::Once = std::sync::Once::new();
    AT_EXIT.call_once(|| crate::conn::at_exit("learned answers checked", || settle(Duration::from_secs(10))));
    let job: Job = Box::new(move || {
        let outcomes: Vec<Outcome> = slots.iter().map(|s| s.wait()).collect();
        // A session that ended meanwhile says so itself.
        if outcomes.iter().all(Result::is_ok)
            && let Some(how) = differs(&outcomes, &keep)
        {
            with(&conn, Learned::forget_all);
            conn.end_session(format!(
                "{call}: the server answered differently ({how}) than in an earlier session on this GPU and \
                 libraries, whose answer this program was given; every learned answer is dropped: run the \
                 program again"
            ));
        }
    });
    enqueue(job);
}

/// A check waiting for its replies, then comparing them.
type Job = Box<dyn FnOnce() + Send>;

/// The thread that runs the checks of this process (of its fork generation: a forked child
/// has none of its parent's threads), one after another: each waits for replies, which come
/// in the order their calls were sent, so one thread keeps up with any number of answers
/// given from the store (cuDNN's graph builds give hundreds).
static CHECKER: Mutex<Option<(u64, std::sync::mpsc::Sender<Job>)>> = Mutex::new(None);

/// Hand `job` to the checker, counted until it ran; dropped where no thread can run it.
fn enqueue(job: Job) {
    let mut checker = CHECKER.lock().unwrap_or_else(|p| p.into_inner());
    let forks = crate::conn::forks();
    if checker.as_ref().is_none_or(|(f, _)| *f != forks) {
        let (tx, rx) = std::sync::mpsc::channel::<Job>();
        let spawned = std::thread::Builder::new().name("chidori-check".into()).spawn(move || {
            for job in rx {
                // A check that panicked is one not made; the next ones still are.
                let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
                checked();
            }
        });
        if spawned.is_err() {
            return;
        }
        // A forked child waits for none of its parent's checks.
        *CHECKING.0.lock().unwrap_or_else(|p| p.into_inner()) = 0;
        *checker = Some((forks, tx));
    }
    let Some((_, tx)) = checker.as_ref() else { return };
    *CHECKING.0.lock().unwrap_or_else(|p| p.into_inner()) += 1;
    if tx.send(job).is_err() {
        checked();
    }
}

/// One check fewer to wait for.
fn checked() {
    let mut pending = CHECKING.0.lock().unwrap_or_else(|p| p.into_inner());
    *pending = pending.saturating_sub(1);
    CHECKING.1.notify_all();
}

/// Wait (at most `limit`) until every answer given from the store was checked: at exit, so
/// a different answer is reported before the program ends.
pub fn settle(limit: Duration) {
    let deadline = Instant::now() + limit;
    let mut pending = CHECKING.0.lock().unwrap_or_else(|p| p.into_inner());
    while *pending > 0 {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        pending = CHECKING.1.wait_timeout(pending, left).unwrap_or_else(|p| p.into_inner()).0;
    }
}
