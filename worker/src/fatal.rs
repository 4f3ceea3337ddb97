//! What a session worker was doing when a library killed it: a fault (SIGSEGV, SIGBUS,
//! SIGILL, SIGFPE) or an abort inside CUDA ends the worker, and the supervisor can only say
//! "signal 11". Each executor names the call it runs ([`running`], a guard); a handler installed by
//! [`install`] writes that name and the signal to the server's log, then lets the signal do
//! what it did before (Rust's stack-overflow report, or the default: the process ends).
//!
//! The handler only reads atomics and thread-locals set with `const` and calls write(2):
//! async-signal-safe.

use std::cell::Cell;
use std::sync::Once;
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};

thread_local! {
    /// The call this thread runs (a `&'static str` as its parts), or none.
    static CURRENT: Cell<(*const u8, usize)> = const { Cell::new((std::ptr::null(), 0)) };
}

/// The call any executor started last: named where the fault is outside a call (a thread of
/// the library's own, or the library's teardown at exit).
static LAST: AtomicPtr<u8> = AtomicPtr::new(std::ptr::null_mut());
static LAST_LEN: AtomicUsize = AtomicUsize::new(0);

const SIGNALS: [libc::c_int; 5] = [libc::SIGSEGV, libc::SIGBUS, libc::SIGILL, libc::SIGFPE, libc::SIGABRT];

/// The actions in place before ours (indexed as [`SIGNALS`]), restored by the handler.
static mut PREVIOUS: [std::mem::MaybeUninit<libc::sigaction>; 5] = [const { std::mem::MaybeUninit::uninit() }; 5];

/// While alive, this thread runs the call it names (see [`running`]).
#[must_use = "the call is named while the guard lives"]
pub struct Running(());

impl Drop for Running {
    fn drop(&mut self) {
        CURRENT.with(|c| c.set((std::ptr::null(), 0)));
    }
}

/// This thread now runs `name`, until the guard drops.
pub fn running(name: &'static str) -> Running {
    CURRENT.with(|c| c.set((name.as_ptr(), name.len())));
    // Two stores: a reader between them may pair a name with another's length, so the
    // handler bounds what it writes (names are ASCII; a short read is harmless).
    LAST.store(name.as_ptr() as *mut u8, Ordering::Relaxed);
    LAST_LEN.store(name.len(), Ordering::Relaxed);
    Running(())
}

/// Install the handler for the process (a session worker); once.
pub fn install() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        for (i, &signal) in SIGNALS.iter().enumerate() {
            // SAFETY: a zeroed sigaction is a valid value to fill; the handler has the
            // SA_SIGINFO signature; PREVIOUS is written here only, before any handler runs
            // for this signal (ours is installed by this very call).
            unsafe {
                let mut action: libc::sigaction = std::mem::zeroed();
                action.sa_sigaction = handler as *const () as usize;
                action.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
                libc::sigemptyset(&mut action.sa_mask);
                let previous = (&raw mut PREVIOUS[i]).cast::<libc::sigaction>();
                if libc::sigaction(signal, &action, previous) != 0 {
                    // Ours is not in place; the previous action stays what it was.
                    libc::sigaction(signal, std::ptr::null(), previous);
                }
            }
        }
    });
}

extern "C" fn handler(signal: libc::c_int, info: *mut libc::siginfo_t, _context: *mut libc::c_void) {
    let mut line = Line::default();
    line.push(b"chidori worker: fatal signal ");
    line.push(name_of(signal));
    if signal != libc::SIGABRT && !info.is_null() {
        line.push(b" at address 0x");
        // SAFETY: the kernel's siginfo for a fault carries the faulting address.
        line.hex(unsafe { (*info).si_addr() } as u64);
    }
    let (ptr, len) = CURRENT.with(|c| c.get());
    if !ptr.is_null() {
        line.push(b" while running ");
        // SAFETY: a `&'static str`'s parts, stored together by this thread.
        line.push(unsafe { std::slice::from_raw_parts(ptr, len) });
    } else {
        let (ptr, len) = (LAST.load(Ordering::Relaxed), LAST_LEN.load(Ordering::Relaxed));
        if !ptr.is_null() {
            line.push(b" outside a call (a library's own thread, or exit); the last call started was ");
            // SAFETY: a `&'static str`'s address; the length is at most its own or another
            // name's (see `running`): bounded by the shorter reading below.
            let name = unsafe { std::slice::from_raw_parts(ptr, len.min(96)) };
            line.push(name.split(|b| !b.is_ascii_graphic()).next().unwrap_or_default());
        }
    }
    line.push(b"\n");
    // SAFETY: write(2) of our own buffer to stderr (the server's log); then the action that
    // was in place before ours. A fault re-executes when the handler returns, reaching that
    // action; a signal sent (raise, abort, kill: si_code <= 0) does not come back, so it is
    // sent again with the default action (pending until this handler returns).
    unsafe {
        libc::write(2, line.buf.as_ptr().cast(), line.len);
        let sent = info.is_null() || (*info).si_code <= 0;
        if sent {
            libc::signal(signal, libc::SIG_DFL);
            libc::raise(signal);
        } else if let Some(i) = SIGNALS.iter().position(|&s| s == signal) {
            libc::sigaction(signal, (&raw const PREVIOUS[i]).cast::<libc::sigaction>(), std::ptr::null_mut());
        }
    }
}

fn name_of(signal: libc::c_int) -> &'static [u8] {
    match signal {
        libc::SIGSEGV => b"SIGSEGV",
        libc::SIGBUS => b"SIGBUS",
        libc::SIGILL => b"SIGILL",
        libc::SIGFPE => b"SIGFPE",
        libc::SIGABRT => b"SIGABRT",
        _ => b"?",
    }
}

/// A fixed buffer (no allocation in a signal handler).
struct Line {
    buf: [u8; 256],
    len: usize,
}

impl Default for Line {
    fn default() -> Line {
        Line { buf: [0; 256], len: 0 }
    }
}

impl Line {
    fn push(&mut self, bytes: &[u8]) {
        let n = bytes.len().min(self.buf.len() - self.len);
        self.buf[self.len..self.len + n].copy_from_slice(&bytes[..n]);
        self.len += n;
    }

    fn hex(&mut self, value: u64) {
        let digits = b"0123456789abcdef";
        let mut out = [0u8; 16];
        let mut n = 0;
        let mut v = value;
        loop {
            out[15 - n] = digits[(v & 15) as usize];
            n += 1;
            v >>= 4;
            if v == 0 {
                break;
            }
        }
        self.push(&out[16 - n..]);
    }
}

#[cfg(test)]
mod tests {
    use super::Line;

    /// A child process that names a call and then takes a fault reports both on stderr,
    /// and still dies by the signal.
    #[test]
    fn a_fault_names_the_call() {
        let mut fds = [0; 2];
        // SAFETY: a pipe into our array; fork, where the child only installs the handler,
        // stores a name and raises (no locks held by other threads are needed: `install`'s
        // Once is fresh in the child's copy of this test's memory or already done).
        unsafe {
            assert_eq!(libc::pipe(fds.as_mut_ptr()), 0);
            let pid = libc::fork();
            assert!(pid >= 0);
            if pid == 0 {
                libc::dup2(fds[1], 2);
                super::install();
                let _call = super::running("cuTestFault");
                libc::raise(libc::SIGSEGV);
                libc::_exit(0);
            }
            libc::close(fds[1]);
            let mut out = Vec::new();
            let mut buf = [0u8; 512];
            loop {
                let n = libc::read(fds[0], buf.as_mut_ptr().cast(), buf.len());
                if n <= 0 {
                    break;
                }
                out.extend_from_slice(&buf[..n as usize]);
            }
            let mut status = 0;
            libc::waitpid(pid, &mut status, 0);
            let text = String::from_utf8_lossy(&out);
            assert!(text.contains("fatal signal SIGSEGV"), "{text}");
            assert!(text.contains("while running cuTestFault"), "{text}");
            assert!(libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGSEGV, "status {status:#x}");
        }
    }

    #[test]
    fn lines_are_bounded_and_hex_is_plain() {
        let mut line = Line::default();
        line.hex(0xdead_beef);
        assert_eq!(&line.buf[..line.len], b"deadbeef");
        line.push(&[b'x'; 300]);
        assert_eq!(line.len, 256);
    }
}
