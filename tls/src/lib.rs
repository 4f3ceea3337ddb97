//! Transport security for Chidori, shared by the client (`libchidori.so`, `chidori run`)
//! and the server (`chidori session`).
//!
//! * [`Secure`]: one TLS connection (rustls, the `ring` provider) used by a reader thread
//!   and by writers at once. The TLS state sits behind a mutex that is never held while
//!   waiting for the socket, so a reader and a writer blocked on a full network in
//!   opposite directions cannot wait on each other.
//! * [`pin`]: the server's certificate is pinned by its SHA-256 fingerprint, given
//!   explicitly or remembered on first use in a `known_servers` file (like SSH's
//!   `known_hosts`).
//! * [`token`]: the shared secret a client presents in its Hello; compared in constant
//!   time.
//!
//! Before TLS starts, the supervisor may answer in plain text (a Refuse frame: the server
//! is busy, or wants TLS where the client sent none); [`client_handshake`] recognizes such
//! an answer and returns it as [`HandshakeError::Refused`].

pub mod pin;
pub mod token;

use std::io::{IoSlice, Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use chidori_protocol::frame::{Frame, FrameError, MAGIC};
pub use rustls;
use rustls::Connection;

/// Plaintext a writer encrypts before it pushes the records out: bounds rustls's send
/// buffer (and so the memory of a large frame in flight).
const SEND_BUFFER: usize = 1 << 20;

/// Ciphertext the reader takes from the socket at once.
const READ_CHUNK: usize = 256 << 10;

/// The largest TLS record's plaintext: slices up to this size are sent as one record.
const RECORD: usize = 16 << 10;

/// How long a writer waits for a full socket to take bytes before giving up.
const WRITE_STALL: Duration = Duration::from_secs(30);

/// The crypto provider: rustls with `ring` (no OpenSSL, no C toolchain beyond ring's).
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A TLS connection shared by one reader and any number of writers (writers are
/// serialized by the caller, which already holds a lock per socket for frame order).
pub struct Secure {
    conn: Mutex<Connection>,
}

impl Secure {
    /// Wrap a connection whose handshake is complete.
    pub fn new(conn: impl Into<Connection>) -> Arc<Secure> {
        let mut conn = conn.into();
        conn.set_buffer_limit(Some(SEND_BUFFER));
        Arc::new(Secure { conn: Mutex::new(conn) })
    }

    fn lock(&self) -> MutexGuard<'_, Connection> {
        self.conn.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Encrypt `slices` and write them to `sock` (blocking or not: a full socket is waited
    /// for with the TLS state unlocked). Callers serialize their writes.
    pub fn send(&self, sock: &impl AsRawFd, slices: &[IoSlice<'_>]) -> std::io::Result<()> {
        let fd = sock.as_raw_fd();
        let mut conn = self.lock();
        // Small slices (a frame's header and archive) go out together, as one record.
        let mut small = [0u8; RECORD];
        let mut used = 0;
        for slice in slices {
            if used + slice.len() <= RECORD {
                small[used..used + slice.len()].copy_from_slice(slice);
                used += slice.len();
                continue;
            }
            conn = self.encrypt(conn, fd, &small[..used])?;
            used = 0;
            conn = self.encrypt(conn, fd, slice)?;
        }
        conn = self.encrypt(conn, fd, &small[..used])?;
        drop(self.push(conn, fd)?);
        Ok(())
    }

    /// Encrypt `bytes`, pushing records out whenever the send buffer is full.
    fn encrypt<'a>(
        &'a self,
        mut conn: MutexGuard<'a, Connection>,
        fd: RawFd,
        mut bytes: &[u8],
    ) -> std::io::Result<MutexGuard<'a, Connection>> {
        while !bytes.is_empty() {
            let n = conn.writer().write(bytes)?;
            bytes = &bytes[n..];
            if !bytes.is_empty() {
                conn = self.push(conn, fd)?;
            }
        }
        Ok(conn)
    }

    /// Send a TLS close_notify (best effort).
    pub fn close(&self, sock: &impl AsRawFd) {
        let mut conn = self.lock();
        conn.send_close_notify();
        drop(self.push(conn, sock.as_raw_fd()));
    }

    /// Write every queued record to `fd`, unlocking while the socket is full.
    fn push<'a>(
        &'a self,
        mut conn: MutexGuard<'a, Connection>,
        fd: RawFd,
    ) -> std::io::Result<MutexGuard<'a, Connection>> {
        while conn.wants_write() {
            match conn.write_tls(&mut DontWait(fd)) {
                Ok(0) => return Err(std::io::Error::new(std::io::ErrorKind::WriteZero, "connection closed")),
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    drop(conn);
                    wait_writable(fd)?;
                    conn = self.lock();
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(conn)
    }

    /// The reading half over `sock` (a clone of the socket, blocking or not). One reader
    /// per connection.
    pub fn reader<S: Read>(self: &Arc<Self>, sock: S) -> SecureReader<S> {
        SecureReader { secure: self.clone(), sock, raw: vec![0; READ_CHUNK], raw_at: 0, raw_end: 0 }
    }
}

/// Writes with `MSG_DONTWAIT`, so a blocking socket never blocks while the TLS state is
/// locked.
struct DontWait(RawFd);

impl Write for DontWait {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.write_vectored(&[IoSlice::new(buf)])
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> std::io::Result<usize> {
        let iov = bufs.len().min(64);
        // SAFETY: a zeroed msghdr is valid; it points at `bufs`, whose IoSlices are
        // ABI-compatible with iovec and stay alive during the call.
        let n = unsafe {
            let mut msg: libc::msghdr = std::mem::zeroed();
            msg.msg_iov = bufs.as_ptr() as *mut libc::iovec;
            msg.msg_iovlen = iov as _;
            libc::sendmsg(self.0, &msg, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL)
        };
        if n < 0 { Err(std::io::Error::last_os_error()) } else { Ok(n as usize) }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn wait_writable(fd: RawFd) -> std::io::Result<()> {
    let mut pfd = libc::pollfd { fd, events: libc::POLLOUT, revents: 0 };
    loop {
        // SAFETY: one valid pollfd; the timeout bounds the wait.
        let rc = unsafe { libc::poll(&mut pfd, 1, WRITE_STALL.as_millis() as i32) };
        match rc {
            0 => return Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "the peer accepts no data")),
            n if n > 0 => return Ok(()),
            _ => {
                let e = std::io::Error::last_os_error();
                if e.kind() != std::io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        }
    }
}

/// The reading half of a [`Secure`] connection: ciphertext is read from the socket with
/// the TLS state unlocked, then decrypted under the lock straight into the caller's buffer.
pub struct SecureReader<S> {
    secure: Arc<Secure>,
    sock: S,
    raw: Vec<u8>,
    raw_at: usize,
    raw_end: usize,
}

impl<S: Read> Read for SecureReader<S> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        loop {
            {
                let mut conn = self.secure.lock();
                loop {
                    match conn.reader().read(buf) {
                        // Ok(0): the peer's close_notify.
                        Ok(n) => return Ok(n),
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                        Err(e) => return Err(e),
                    }
                    if self.raw_at == self.raw_end {
                        break;
                    }
                    let mut pending = &self.raw[self.raw_at..self.raw_end];
                    let n = conn.read_tls(&mut pending)?;
                    self.raw_at += n;
                    conn.process_new_packets().map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
                }
            }
            // Nothing decrypted is left: read ciphertext, unlocked. It may block, or report
            // WouldBlock / TimedOut.
            self.raw_at = 0;
            self.raw_end = 0;
            let n = self.sock.read(&mut self.raw)?;
            if n == 0 {
                return Ok(0);
            }
            self.raw_end = n;
        }
    }
}

/// Why a client's TLS handshake did not complete.
#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    /// The server answered in plain text before TLS (the supervisor refusing: busy, or a
    /// server without TLS): the frame it sent.
    #[error("the server answered without TLS")]
    Refused(Frame),
    /// The certificate is not the one pinned for this server.
    #[error("{0}")]
    Pin(pin::Mismatch),
    #[error("TLS handshake: {0}")]
    Tls(std::io::Error),
    #[error("{0}")]
    Frame(FrameError),
}

/// Run a client's handshake on a blocking socket (give it a read timeout): TLS with the
/// server's certificate checked against `pins`. A plaintext answer from the supervisor
/// comes back as [`HandshakeError::Refused`].
pub fn client_handshake(
    sock: &mut std::net::TcpStream,
    server: &str,
    pins: &pin::Pins,
) -> Result<Arc<Secure>, HandshakeError> {
    let (config, verdict) = pins.client_config(server);
    let name = server.rsplit_once(':').map(|(h, _)| h).unwrap_or(server).trim_matches(['[', ']']).to_owned();
    let name = rustls::pki_types::ServerName::try_from(name)
        .unwrap_or_else(|_| rustls::pki_types::ServerName::try_from("chidori.invalid").expect("a valid name"));
    let mut conn =
        rustls::ClientConnection::new(config, name).map_err(|e| HandshakeError::Tls(std::io::Error::other(e)))?;
    while conn.wants_write() {
        conn.write_tls(sock).map_err(HandshakeError::Tls)?;
    }
    // The first bytes of the answer: a TLS record, or a plaintext Chidori frame.
    let mut first = [0u8; 4];
    loop {
        match sock.peek(&mut first) {
            Ok(0) => {
                return Err(HandshakeError::Tls(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "the server closed the connection",
                )));
            }
            Ok(n) if n >= 4 => break,
            Ok(_) => std::thread::sleep(Duration::from_millis(2)),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(HandshakeError::Tls(e)),
        }
    }
    if u32::from_le_bytes(first) == MAGIC {
        return Err(match read_plain_frame(sock) {
            Ok(frame) => HandshakeError::Refused(frame),
            Err(e) => HandshakeError::Frame(e),
        });
    }
    while conn.is_handshaking() {
        if let Err(e) = conn.complete_io(sock) {
            if let Some(mismatch) = verdict.mismatch() {
                return Err(HandshakeError::Pin(pin::Mismatch { server: server.to_owned(), ..mismatch }));
            }
            return Err(HandshakeError::Tls(e));
        }
    }
    pins.confirm(server, &verdict).map_err(|e| HandshakeError::Tls(std::io::Error::other(e)))?;
    Ok(Secure::new(conn))
}

/// Read one whole frame from a blocking reader with the shared reader
/// (`chidori_protocol::read`); the socket's read timeout, if any, bounds each wait.
pub fn read_plain_frame(r: &mut impl Read) -> Result<Frame, FrameError> {
    use chidori_protocol::read::{ReadError, read_frame};
    read_frame(r, Duration::ZERO).map_err(|e| match e {
        ReadError::Frame(f) => f,
        ReadError::Closed => FrameError::Truncated("header (the server closed the connection)"),
        ReadError::Timeout => FrameError::Truncated("header (no answer in time)"),
        ReadError::Stalled { what, .. } => FrameError::Truncated(what),
        ReadError::Io(_) => FrameError::Truncated("frame (the connection failed)"),
    })
}

/// Run a server's handshake on a blocking socket with a read timeout.
pub fn server_handshake(
    sock: &mut std::net::TcpStream,
    config: Arc<rustls::ServerConfig>,
) -> std::io::Result<Arc<Secure>> {
    let mut conn = rustls::ServerConnection::new(config).map_err(std::io::Error::other)?;
    while conn.is_handshaking() {
        conn.complete_io(sock)?;
    }
    Ok(Secure::new(conn))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dont_wait_writes_and_reads_back() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let a = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (mut b, _) = listener.accept().unwrap();
        let n = DontWait(a.as_raw_fd()).write_vectored(&[IoSlice::new(b"ab"), IoSlice::new(b"cd")]).unwrap();
        assert_eq!(n, 4);
        let mut got = [0u8; 4];
        b.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"abcd");
    }
}
