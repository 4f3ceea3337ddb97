//! What the GPU prints: a kernel's `printf` goes into a device buffer that the driver writes
//! to the process's standard output at its flush points (synchronizations, blocking copies,
//! launches, module loads). In a session worker that output belongs to the program on the
//! client, so the worker's standard output is a pipe ([`capture`]) and what arrived in it
//! goes to the client before each reply ([`take`]): the program prints it in order with its
//! own output, as natively.
//!
//! A thread empties the pipe as it fills (a driver writing more than the pipe holds during a
//! synchronization must not block); it and [`take`] read under one lock, and [`take`]
//! drains the pipe itself after flushing the C streams, so nothing written before it is
//! left behind.

use std::os::fd::RawFd;
use std::sync::{Mutex, OnceLock};

/// Most bytes kept between two replies; beyond, the oldest are dropped and counted.
const LIMIT: usize = 64 << 20;

struct Capture {
    read: RawFd,
    pending: Mutex<Pending>,
}

#[derive(Default)]
struct Pending {
    bytes: Vec<u8>,
    dropped: u64,
}

static CAPTURE: OnceLock<Capture> = OnceLock::new();

/// Make file descriptor 1 of this process a pipe whose contents [`take`] returns. Once per
/// process; Err: why not (the output then stays on the server).
pub fn capture() -> Result<(), String> {
    if CAPTURE.get().is_some() {
        return Ok(());
    }
    let read = redirect(1)?;
    if CAPTURE.set(Capture { read, pending: Mutex::new(Pending::default()) }).is_err() {
        return Ok(());
    }
    std::thread::Builder::new()
        .name("chidori-stdout".into())
        .spawn(|| {
            let Some(c) = CAPTURE.get() else { return };
            loop {
                let mut poll = libc::pollfd { fd: c.read, events: libc::POLLIN, revents: 0 };
                // SAFETY: one pollfd of this frame.
                let n = unsafe { libc::poll(&mut poll, 1, -1) };
                if n < 0 && std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
                    return;
                }
                if poll.revents & (libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0
                    && poll.revents & libc::POLLIN == 0
                {
                    return;
                }
                drain(c, &mut c.pending.lock().unwrap_or_else(|p| p.into_inner()));
            }
        })
        .map(|_| ())
        .map_err(|e| format!("cannot start the thread that reads the GPU's output: {e}"))
}

/// Point `fd` at the write end of a new pipe; the read end (non-blocking) is returned.
fn redirect(fd: RawFd) -> Result<RawFd, String> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: an array of two descriptors for pipe2 to fill.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } != 0 {
        return Err(format!("pipe: {}", std::io::Error::last_os_error()));
    }
    let [read, write] = fds;
    // SAFETY: plain descriptor calls on descriptors this function owns; `fd` is replaced
    // by a copy of the write end (writes to it must block, not fail, when the pipe is
    // full: the write end is made blocking again).
    unsafe {
        // A larger pipe holds a whole device printf buffer (1 MiB by default); best effort.
        libc::fcntl(write, libc::F_SETPIPE_SZ, 1 << 20);
        let flags = libc::fcntl(write, libc::F_GETFL);
        libc::fcntl(write, libc::F_SETFL, flags & !libc::O_NONBLOCK);
        if libc::dup2(write, fd) < 0 {
            let e = std::io::Error::last_os_error();
            libc::close(read);
            libc::close(write);
            return Err(format!("dup2: {e}"));
        }
        libc::close(write);
    }
    Ok(read)
}

/// Read what the pipe holds now into `pending`.
fn drain(c: &Capture, pending: &mut Pending) {
    // Not zeroed: this runs before every reply, and the pipe is usually empty.
    let mut chunk = [std::mem::MaybeUninit::<u8>::uninit(); 64 << 10];
    loop {
        // SAFETY: reads into a buffer of this frame, at most its length.
        let n = unsafe { libc::read(c.read, chunk.as_mut_ptr().cast(), chunk.len()) };
        if n <= 0 {
            if n < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return;
        }
        // SAFETY: read() initialized the first `n` bytes.
        pending.bytes.extend_from_slice(unsafe { std::slice::from_raw_parts(chunk.as_ptr().cast::<u8>(), n as usize) });
        if pending.bytes.len() > LIMIT {
            let over = pending.bytes.len() - LIMIT;
            pending.bytes.drain(..over);
            pending.dropped += over as u64;
        }
    }
}

/// What the process wrote to its standard output since the last call (the C streams
/// flushed first); empty when nothing was, or when output is not captured.
pub fn take() -> Vec<u8> {
    let Some(c) = CAPTURE.get() else { return Vec::new() };
    // SAFETY: fflush(NULL) flushes every C output stream of the process.
    unsafe { libc::fflush(std::ptr::null_mut()) };
    let mut pending = c.pending.lock().unwrap_or_else(|p| p.into_inner());
    drain(c, &mut pending);
    let dropped = std::mem::take(&mut pending.dropped);
    let mut bytes = std::mem::take(&mut pending.bytes);
    if dropped > 0 {
        let note = format!("[chidori: {dropped} bytes of the GPU's output were dropped]\n");
        bytes.splice(0..0, note.into_bytes());
    }
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_is_written_to_a_redirected_descriptor_is_taken_once_and_in_order() {
        // A descriptor of its own, not the test's standard output.
        // SAFETY: opening /dev/null for writing.
        let fd = unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_WRONLY) };
        assert!(fd >= 0);
        let read = redirect(fd).expect("redirect");
        let c = Capture { read, pending: Mutex::new(Pending::default()) };
        let write = |s: &[u8]| {
            // SAFETY: writes from a live slice to the redirected descriptor.
            assert_eq!(unsafe { libc::write(fd, s.as_ptr().cast(), s.len()) }, s.len() as isize);
        };
        let take = |c: &Capture| {
            let mut p = c.pending.lock().unwrap();
            drain(c, &mut p);
            std::mem::take(&mut p.bytes)
        };
        assert!(take(&c).is_empty());
        write(b"thread 0: 1.5\n");
        write(b"thread 1: 2.5\n");
        assert_eq!(take(&c), b"thread 0: 1.5\nthread 1: 2.5\n");
        assert!(take(&c).is_empty(), "taken once");
        // More than a default pipe holds, read while being written.
        let big = vec![b'x'; 200 << 10];
        let mut got = Vec::new();
        for chunk in big.chunks(32 << 10) {
            write(chunk);
            got.extend(take(&c));
        }
        assert_eq!(got.len(), big.len());
        // SAFETY: closing descriptors this test opened.
        unsafe {
            libc::close(fd);
            libc::close(read);
        }
    }
}
