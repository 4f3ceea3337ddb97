//! Writing frames to a plain TCP socket: the one vectored writer of both sides.

use std::io::IoSlice;
use std::os::fd::RawFd;

/// How long a full send buffer may stay full before the peer is taken as gone.
const FULL_FOR_MS: i32 = 30_000;

/// Write every slice to the socket `fd`; on a full send buffer wait (up to 30 s) until it
/// has room. A connection the peer reset is an error, never a SIGPIPE (the write uses
/// MSG_NOSIGNAL: in the interposer the program's signal handlers are the program's own).
pub fn send_all(fd: RawFd, mut slices: &mut [IoSlice<'_>]) -> std::io::Result<()> {
    IoSlice::advance_slices(&mut slices, 0);
    while !slices.is_empty() {
        let iov = slices.len().min(64);
        // SAFETY: a zeroed msghdr is valid; it points at `slices`, whose IoSlices are
        // ABI-compatible with iovec and stay alive during the call.
        let n = unsafe {
            let mut msg: libc::msghdr = std::mem::zeroed();
            msg.msg_iov = slices.as_ptr() as *mut libc::iovec;
            msg.msg_iovlen = iov as _;
            libc::sendmsg(fd, &msg, libc::MSG_NOSIGNAL)
        };
        match n {
            0 => return Err(std::io::Error::new(std::io::ErrorKind::WriteZero, "connection closed")),
            n if n > 0 => IoSlice::advance_slices(&mut slices, n as usize),
            _ => {
                let e = std::io::Error::last_os_error();
                match e.kind() {
                    std::io::ErrorKind::WouldBlock => {
                        let mut pfd = libc::pollfd { fd, events: libc::POLLOUT, revents: 0 };
                        // SAFETY: one valid pollfd; a timeout bounds the wait.
                        let rc = unsafe { libc::poll(&mut pfd, 1, FULL_FOR_MS) };
                        if rc == 0 {
                            return Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "the peer accepts no data"));
                        }
                    }
                    std::io::ErrorKind::Interrupted => {}
                    _ => return Err(e),
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::io::{IoSlice, Read};
    use std::os::fd::AsRawFd;

    #[test]
    fn every_slice_arrives_in_order_and_a_closed_peer_is_an_error() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let writer = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (mut reader, _) = listener.accept().unwrap();
        // More than a socket buffer holds, in many slices: partial writes are continued.
        let big = vec![7u8; 8 << 20];
        let reading = std::thread::spawn(move || {
            let mut got = Vec::new();
            reader.read_to_end(&mut got).unwrap();
            got
        });
        let mut slices: Vec<IoSlice<'_>> = (0..100).map(|_| IoSlice::new(b"ab")).collect();
        slices.push(IoSlice::new(&big));
        super::send_all(writer.as_raw_fd(), &mut slices).unwrap();
        drop(writer);
        let got = reading.join().unwrap();
        assert_eq!(got.len(), 200 + (8 << 20));
        assert!(got[..200].chunks(2).all(|c| c == b"ab"));

        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let writer = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        drop(listener.accept().unwrap());
        drop(listener);
        // The peer is gone: some write fails (reset or broken pipe), without a signal.
        let chunk = vec![1u8; 1 << 20];
        let failed = (0..64).any(|_| super::send_all(writer.as_raw_fd(), &mut [IoSlice::new(&chunk)]).is_err());
        assert!(failed);
    }
}
