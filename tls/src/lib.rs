//! Transport security for Chidori, shared by the client (`libchidori.so`, `chidori run`)
//! and the server (`chidori session`).
//!
//! * [`Secure`]: one TLS 1.3 connection used by a reader thread and by writers at once.
//!   rustls (the `ring` provider) runs the handshake; after it, [`records`] seals and opens
//!   the records with the keys rustls agreed, sending and receiving independently, so a
//!   reader and a writer never wait on each other and bulk bytes are copied once each way.
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
pub mod records;
pub mod token;

use std::io::{IoSlice, Read};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chidori_protocol::frame::{Frame, FrameError, MAGIC};
use chidori_protocol::sock::send_all;
pub use rustls;
use rustls::client::UnbufferedClientConnection;
use rustls::server::UnbufferedServerConnection;
use rustls::unbuffered::{ConnectionState, EncodeError, UnbufferedStatus};

use records::{Kernel, Keys, Opened, Sender, lock};

/// Records a writer seals before it writes them out (and so the memory of a large frame
/// in flight).
const FLUSH_AT: usize = 256 << 10;

/// Ciphertext the reader takes from the socket at once (a whole record always fits).
const READ_BUFFER: usize = 512 << 10;

/// A read asking at least this much is opened in the caller's buffer (a bulk copy's chunk);
/// smaller ones go through the reader's own.
const DIRECT_AT: usize = 64 << 10;

/// The most handshake bytes buffered before the handshake is given up.
const HANDSHAKE_BUFFER: usize = 1 << 20;

/// The crypto provider: rustls with `ring` (no OpenSSL, no C toolchain beyond ring's),
/// offering AES-128-GCM first. Every byte of a bulk copy is sealed on one side and opened
/// on the other, and AES-128 does 10 rounds where AES-256 does 14: with the same GHASH,
/// ring seals about an eighth faster (`bench/2026-12-04-tls-records-local.md`). Both are
/// TLS 1.3's own suites; the peer's choice among the three is still honoured.
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    use rustls::crypto::ring::cipher_suite::{
        TLS13_AES_128_GCM_SHA256, TLS13_AES_256_GCM_SHA384, TLS13_CHACHA20_POLY1305_SHA256,
    };
    let mut provider = rustls::crypto::ring::default_provider();
    provider.cipher_suites = vec![TLS13_AES_128_GCM_SHA256, TLS13_AES_256_GCM_SHA384, TLS13_CHACHA20_POLY1305_SHA256];
    Arc::new(provider)
}

/// The TLS versions both sides accept: 1.3 only (its record layer is [`records`]).
pub static VERSIONS: &[&rustls::SupportedProtocolVersion] = &[&rustls::version::TLS13];

/// A TLS connection after its handshake, shared by one reader and any number of writers
/// (writers are serialized by the caller, which already holds a lock per socket for frame
/// order).
pub struct Secure {
    /// What rustls keeps: the next keys of a key update, session tickets.
    kernel: Mutex<Kernel>,
    /// The peer asked for a key update of the sending direction.
    update: AtomicBool,
    send: Mutex<Sender>,
    /// The receiving direction until [`Secure::reader`] takes it: its keys, ciphertext read
    /// past the handshake, and application data rustls opened during it.
    receive: Mutex<Option<Received>>,
}

/// The receiving direction as the handshake left it: keys, ciphertext past the handshake,
/// plaintext rustls opened during it.
type Received = (Keys, Vec<u8>, Vec<u8>);

impl Secure {
    /// Seal `slices` as records and write them to `sock` (blocking or not: a full socket
    /// is waited for). Callers serialize their writes.
    pub fn send(&self, sock: &impl AsRawFd, slices: &[IoSlice<'_>]) -> std::io::Result<()> {
        let fd = sock.as_raw_fd();
        let mut send = lock(&self.send);
        let result = send.seal_all(&self.kernel, &self.update, slices, FLUSH_AT, &mut |bytes| {
            send_all(fd, &mut [IoSlice::new(bytes)])
        });
        if result.is_err() {
            // Records half written: the peer would see a gap; later writes fail at once.
            send.out.clear();
            send.broken = true;
        }
        result
    }

    /// Say close_notify (best effort; the connection is closing).
    pub fn close(&self, sock: &impl AsRawFd) {
        let mut send = lock(&self.send);
        if send.seal_close_notify().is_ok() {
            let _ = send_all(sock.as_raw_fd(), &mut [IoSlice::new(&send.out)]);
        }
        send.out.clear();
    }

    /// The reading half over `sock` (a clone of the connection's socket). There is one:
    /// a second reader fails every read.
    pub fn reader<S: Read>(self: &Arc<Self>, sock: S) -> SecureReader<S> {
        let (keys, pending, early) = match lock(&self.receive).take() {
            Some((keys, pending, early)) => (Some(Box::new(keys)), pending, early),
            None => (None, Vec::new(), Vec::new()),
        };
        let mut buf = vec![0; READ_BUFFER.max(pending.len())];
        buf[..pending.len()].copy_from_slice(&pending);
        SecureReader {
            secure: self.clone(),
            sock,
            keys,
            buf,
            start: 0,
            end: pending.len(),
            plain: 0..0,
            early,
            early_at: 0,
            closed: false,
        }
    }
}

/// The reading half of a [`Secure`] connection: records are opened in place in one
/// buffer and their plaintext copied out once. With a non-blocking socket a read that
/// would block returns `WouldBlock` and keeps a partial record for the next read.
pub struct SecureReader<S> {
    secure: Arc<Secure>,
    sock: S,
    /// Boxed: a key schedule is large, and readers are moved around.
    keys: Option<Box<Keys>>,
    buf: Vec<u8>,
    /// Ciphertext not yet opened: `buf[start..end]`.
    start: usize,
    end: usize,
    /// Plaintext of the last record opened, not yet read.
    plain: std::ops::Range<usize>,
    /// Application data rustls opened during the handshake, read first.
    early: Vec<u8>,
    early_at: usize,
    /// The peer said close_notify.
    closed: bool,
}

impl<S: Read> Read for SecureReader<S> {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        if out.is_empty() {
            return Ok(0);
        }
        if self.early_at < self.early.len() {
            let n = out.len().min(self.early.len() - self.early_at);
            out[..n].copy_from_slice(&self.early[self.early_at..self.early_at + n]);
            self.early_at += n;
            return Ok(n);
        }
        loop {
            if !self.plain.is_empty() {
                let n = out.len().min(self.plain.len());
                out[..n].copy_from_slice(&self.buf[self.plain.start..self.plain.start + n]);
                self.plain.start += n;
                return Ok(n);
            }
            if self.closed {
                return Ok(0);
            }
            let Some(keys) = self.keys.as_mut() else {
                return Err(std::io::Error::other("this TLS connection has another reader"));
            };
            if let Some(len) = records::record_len(&self.buf[self.start..self.end])?
                && self.end - self.start >= len
            {
                let at = self.start;
                self.start += len;
                let to = at + records::HEADER;
                match records::open(keys, &self.secure.kernel, &self.secure.update, &mut self.buf, to, at, len)? {
                    Opened::Data(range) => self.plain = range,
                    Opened::Nothing => {}
                    Opened::Closed => self.closed = true,
                }
                continue;
            }
            // A large read takes the ciphertext into the caller's buffer and opens it there
            // (what is buffered, at most half the buffer's length, goes first): the plaintext
            // is not copied again. A record cut off at the end waits in the buffer for the
            // next read.
            let buffered = self.end - self.start;
            if out.len() >= DIRECT_AT && buffered <= out.len() / 2 {
                out[..buffered].copy_from_slice(&self.buf[self.start..self.end]);
                // At most a cache's worth at once: the records are opened while the bytes
                // the socket wrote are still close.
                let upto = out.len().min(buffered + READ_BUFFER);
                let n = self.sock.read(&mut out[buffered..upto])?;
                if n == 0 {
                    return eof(buffered);
                }
                (self.start, self.end) = (0, 0);
                let secure = &*self.secure;
                let (plain, used, closed) = open_all(keys, secure, &mut out[..buffered + n])?;
                let rest = &out[used..buffered + n];
                if rest.len() > self.buf.len() {
                    self.buf.resize(rest.len(), 0);
                }
                self.buf[..rest.len()].copy_from_slice(rest);
                self.end = rest.len();
                self.closed = closed;
                if plain > 0 {
                    return Ok(plain);
                }
                continue;
            }
            // More ciphertext: a partial record moves to the front when a whole one might
            // not fit after it.
            if self.start == self.end {
                (self.start, self.end) = (0, 0);
            } else if self.buf.len() - self.start < records::HEADER + (32 << 10) {
                self.buf.copy_within(self.start..self.end, 0);
                (self.start, self.end) = (0, self.end - self.start);
            }
            let n = self.sock.read(&mut self.buf[self.end..])?;
            if n == 0 {
                return eof(self.end - self.start);
            }
            self.end += n;
        }
    }
}

/// The end of the peer's bytes with `partial` bytes of a record unread: the stream's end,
/// or an error when a record was cut off.
fn eof(partial: usize) -> std::io::Result<usize> {
    if partial == 0 {
        return Ok(0);
    }
    Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "the connection closed inside a TLS record"))
}

/// Open every whole record at the front of `data`, their plaintext moved to its front in
/// order: (plaintext bytes, ciphertext bytes used, close_notify seen). Records after a
/// close_notify are not opened.
fn open_all(keys: &mut Keys, secure: &Secure, data: &mut [u8]) -> std::io::Result<(usize, usize, bool)> {
    let (mut plain, mut at) = (0, 0);
    while let Some(len) = records::record_len(&data[at..])?
        && data.len() - at >= len
    {
        let opened = records::open(keys, &secure.kernel, &secure.update, data, plain, at, len)?;
        at += len;
        match opened {
            Opened::Data(range) => plain += range.len(),
            Opened::Nothing => {}
            Opened::Closed => return Ok((plain, at, true)),
        }
    }
    Ok((plain, at, false))
}

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
pub fn client_handshake(sock: &mut TcpStream, server: &str, pins: &pin::Pins) -> Result<Arc<Secure>, HandshakeError> {
    let (config, verdict) = pins.client_config(server);
    let name = server.rsplit_once(':').map(|(h, _)| h).unwrap_or(server).trim_matches(['[', ']']).to_owned();
    let name = rustls::pki_types::ServerName::try_from(name)
        .unwrap_or_else(|_| rustls::pki_types::ServerName::try_from("chidori.invalid").expect("a valid name"));
    let conn =
        UnbufferedClientConnection::new(config, name).map_err(|e| HandshakeError::Tls(std::io::Error::other(e)))?;
    let secure = drive(conn, sock, refused_in_plain_text).map_err(|e| match (e, verdict.mismatch()) {
        (HandshakeError::Tls(_), Some(mismatch)) => {
            HandshakeError::Pin(pin::Mismatch { server: server.to_owned(), ..mismatch })
        }
        (e, _) => e,
    })?;
    pins.confirm(server, &verdict).map_err(|e| HandshakeError::Tls(std::io::Error::other(e)))?;
    Ok(secure)
}

/// Before the client reads the server's first TLS bytes: a supervisor that refuses
/// answers in plain text, a frame that starts with Chidori's magic.
fn refused_in_plain_text(sock: &mut TcpStream) -> Result<(), HandshakeError> {
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
    Ok(())
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
pub fn server_handshake(sock: &mut TcpStream, config: Arc<rustls::ServerConfig>) -> std::io::Result<Arc<Secure>> {
    let conn = UnbufferedServerConnection::new(config).map_err(std::io::Error::other)?;
    drive(conn, sock, |_| Ok(())).map_err(|e| match e {
        HandshakeError::Tls(e) => e,
        other => std::io::Error::other(other.to_string()),
    })
}

/// Either side of an unbuffered rustls connection.
trait Side {
    type Data;
    fn process<'c, 'i>(&'c mut self, incoming: &'i mut [u8]) -> UnbufferedStatus<'c, 'i, Self::Data>;
    fn into_kernel(self) -> Result<(rustls::ExtractedSecrets, Kernel), rustls::Error>;
}

impl Side for UnbufferedClientConnection {
    type Data = rustls::client::ClientConnectionData;
    fn process<'c, 'i>(&'c mut self, incoming: &'i mut [u8]) -> UnbufferedStatus<'c, 'i, Self::Data> {
        self.process_tls_records(incoming)
    }
    fn into_kernel(self) -> Result<(rustls::ExtractedSecrets, Kernel), rustls::Error> {
        self.dangerous_into_kernel_connection().map(|(s, k)| (s, Kernel::Client(k)))
    }
}

impl Side for UnbufferedServerConnection {
    type Data = rustls::server::ServerConnectionData;
    fn process<'c, 'i>(&'c mut self, incoming: &'i mut [u8]) -> UnbufferedStatus<'c, 'i, Self::Data> {
        self.process_tls_records(incoming)
    }
    fn into_kernel(self) -> Result<(rustls::ExtractedSecrets, Kernel), rustls::Error> {
        self.dangerous_into_kernel_connection().map(|(s, k)| (s, Kernel::Server(k)))
    }
}

fn tls_error(e: impl std::fmt::Display) -> HandshakeError {
    HandshakeError::Tls(std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string()))
}

/// Run the handshake of `conn` over `sock` to its end, then take the keys from rustls.
/// `before_first_read` runs once, before the peer's first bytes are read.
fn drive<C: Side>(
    mut conn: C,
    sock: &mut TcpStream,
    mut before_first_read: impl FnMut(&mut TcpStream) -> Result<(), HandshakeError>,
) -> Result<Arc<Secure>, HandshakeError> {
    let mut incoming = vec![0u8; 32 << 10];
    let mut filled = 0;
    let mut outgoing = vec![0u8; 16 << 10];
    let mut queued = 0;
    let mut early = Vec::new();
    let mut first_read = true;
    loop {
        let status = conn.process(&mut incoming[..filled]);
        let mut discard = status.discard;
        let (mut read_more, mut done) = (false, false);
        match status.state.map_err(tls_error)? {
            ConnectionState::EncodeTlsData(mut data) => loop {
                match data.encode(&mut outgoing[queued..]) {
                    Ok(n) => {
                        queued += n;
                        break;
                    }
                    Err(EncodeError::InsufficientSize(s)) => outgoing.resize(queued + s.required_size, 0),
                    Err(e) => return Err(tls_error(e)),
                }
            },
            ConnectionState::TransmitTlsData(data) => {
                send_all(sock.as_raw_fd(), &mut [IoSlice::new(&outgoing[..queued])]).map_err(HandshakeError::Tls)?;
                queued = 0;
                data.done();
            }
            ConnectionState::BlockedHandshake => read_more = true,
            // The peer's first application data came with its last flight.
            ConnectionState::ReadTraffic(mut data) => {
                while let Some(record) = data.next_record() {
                    let record = record.map_err(tls_error)?;
                    discard += record.discard;
                    early.extend_from_slice(record.payload);
                }
            }
            ConnectionState::WriteTraffic(_) => done = true,
            other => return Err(tls_error(format!("the handshake ended in state {other:?}"))),
        }
        incoming.copy_within(discard..filled, 0);
        filled -= discard;
        if done {
            break;
        }
        if read_more {
            if std::mem::take(&mut first_read) {
                before_first_read(sock)?;
            }
            if filled == incoming.len() {
                if incoming.len() >= HANDSHAKE_BUFFER {
                    return Err(tls_error("the peer's handshake messages are too large"));
                }
                incoming.resize(incoming.len() * 2, 0);
            }
            let n = sock.read(&mut incoming[filled..]).map_err(HandshakeError::Tls)?;
            if n == 0 {
                return Err(HandshakeError::Tls(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "the peer closed the connection during the TLS handshake",
                )));
            }
            filled += n;
        }
    }
    let (secrets, kernel) = conn.into_kernel().map_err(tls_error)?;
    let limit = kernel.key_limit();
    let send = Sender {
        keys: Keys::new(secrets.tx.0, secrets.tx.1).map_err(HandshakeError::Tls)?,
        limit,
        out: Vec::new(),
        broken: false,
    };
    let receive = Keys::new(secrets.rx.0, secrets.rx.1).map_err(HandshakeError::Tls)?;
    Ok(Arc::new(Secure {
        kernel: Mutex::new(kernel),
        update: AtomicBool::new(false),
        send: Mutex::new(send),
        receive: Mutex::new(Some((receive, incoming[..filled].to_vec(), early))),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write as _;
    use std::net::TcpListener;

    fn server_config(tickets: usize) -> (Arc<rustls::ServerConfig>, String) {
        let made = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        let der = made.cert.der().clone();
        let fingerprint = pin::fingerprint(&der);
        let key = rustls::pki_types::PrivateKeyDer::Pkcs8(made.signing_key.serialize_der().into());
        let mut config = rustls::ServerConfig::builder_with_provider(provider())
            .with_protocol_versions(VERSIONS)
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![der], key)
            .unwrap();
        config.send_tls13_tickets = tickets;
        config.enable_secret_extraction = true;
        (Arc::new(config), fingerprint)
    }

    fn pins(fingerprint: &str) -> pin::Pins {
        pin::Pins { explicit: Some(fingerprint.to_owned()), file: None }
    }

    /// A client and a server on loopback after their handshakes (the server in a thread).
    fn pair() -> ((Arc<Secure>, TcpStream), (Arc<Secure>, TcpStream)) {
        let (config, fingerprint) = server_config(0);
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let secure = server_handshake(&mut s, config).unwrap();
            (secure, s)
        });
        let mut c = TcpStream::connect(addr).unwrap();
        let client = client_handshake(&mut c, &addr.to_string(), &pins(&fingerprint)).unwrap();
        ((client, c), server.join().unwrap())
    }

    fn pattern(n: usize, seed: u8) -> Vec<u8> {
        (0..n).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
    }

    #[test]
    fn records_carry_bytes_both_ways_across_key_updates() {
        let ((client, c), (server, s)) = pair();
        // A key seals at most 7 records here: dozens of key updates each way.
        lock(&client.send).limit = 7;
        lock(&server.send).limit = 7;
        let big = pattern(3 << 20, 1);
        let back = pattern((1 << 20) + 12_345, 2);
        let reader_c = client.reader(c.try_clone().unwrap());
        let reader_s = server.reader(s.try_clone().unwrap());
        let (big2, back2) = (big.clone(), back.clone());
        let sending = std::thread::spawn(move || {
            // Small slices and large ones, across record boundaries.
            client.send(&c, &[IoSlice::new(b"head"), IoSlice::new(&big2[..100]), IoSlice::new(&big2[100..])]).unwrap();
            client
        });
        let answering = std::thread::spawn(move || server.send(&s, &[IoSlice::new(&back2)]).unwrap());
        let mut got = vec![0u8; 4 + big.len()];
        let mut r = reader_s;
        r.read_exact(&mut got).unwrap();
        assert_eq!(&got[..4], b"head");
        assert!(got[4..] == big[..], "client to server bytes differ");
        let mut got = vec![0u8; back.len()];
        let mut r = reader_c;
        r.read_exact(&mut got).unwrap();
        assert!(got == back, "server to client bytes differ");
        let client = sending.join().unwrap();
        answering.join().unwrap();
        assert!(lock(&client.send).keys.seq < 7, "the key was updated");
    }

    #[test]
    fn a_peer_on_rustls_reads_and_writes_these_records() {
        // The server is rustls's own buffered connection (with session tickets), the client
        // this crate's records: the bytes on the wire are standard TLS 1.3.
        let (config, fingerprint) = server_config(2);
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let data = pattern(2 << 20, 3);
        let data2 = data.clone();
        let server = std::thread::spawn(move || {
            let (s, _) = listener.accept().unwrap();
            let mut tls = rustls::StreamOwned::new(rustls::ServerConnection::new(config).unwrap(), s);
            let mut got = vec![0u8; data2.len()];
            tls.read_exact(&mut got).unwrap();
            assert!(got == data2, "rustls read other bytes");
            // rustls updates its own key, then answers with what it got.
            tls.conn.refresh_traffic_keys().unwrap();
            tls.write_all(&got).unwrap();
            tls.flush().unwrap();
            tls.conn.send_close_notify();
            tls.flush().unwrap();
        });
        let mut c = TcpStream::connect(addr).unwrap();
        let client = client_handshake(&mut c, &addr.to_string(), &pins(&fingerprint)).unwrap();
        lock(&client.send).limit = 5;
        client.send(&c, &[IoSlice::new(&data)]).unwrap();
        let mut reader = client.reader(c.try_clone().unwrap());
        let mut got = vec![0u8; data.len()];
        reader.read_exact(&mut got).unwrap();
        assert!(got == data, "the answer differs");
        // close_notify ends the stream.
        assert_eq!(reader.read(&mut [0u8; 16]).unwrap(), 0);
        server.join().unwrap();
    }

    /// A reader over a socket that flips one bit of the byte at `at`.
    struct Flip<R> {
        inner: R,
        seen: usize,
        at: usize,
    }

    impl<R: Read> Read for Flip<R> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let n = self.inner.read(buf)?;
            if (self.seen..self.seen + n).contains(&self.at) {
                buf[self.at - self.seen] ^= 4;
            }
            self.seen += n;
            Ok(n)
        }
    }

    #[test]
    fn a_changed_byte_fails_authentication_and_a_second_reader_gets_nothing() {
        let ((client, c), (server, s)) = pair();
        client.send(&c, &[IoSlice::new(&pattern(50_000, 4))]).unwrap();
        let mut reader = server.reader(Flip { inner: s.try_clone().unwrap(), seen: 0, at: 20_000 });
        let mut got = vec![0u8; 50_000];
        let e = reader.read_exact(&mut got).unwrap_err();
        assert!(e.to_string().contains("bad_record_mac"), "{e}");
        let e = server.reader(s).read(&mut got).unwrap_err();
        assert!(e.to_string().contains("another reader"), "{e}");
    }

    #[test]
    fn a_plaintext_refusal_comes_back_as_refused() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let refusing = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let header = chidori_protocol::frame::Header::new(chidori_protocol::frame::Kind::Refuse, 0, 0, 0);
            let bytes = chidori_protocol::frame::to_vec(header, b"", &[]).unwrap();
            s.write_all(&bytes).unwrap();
            std::thread::sleep(Duration::from_millis(200));
        });
        let mut c = TcpStream::connect(addr).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let e = client_handshake(&mut c, &addr.to_string(), &pins("sha256:00")).err().unwrap();
        assert!(matches!(e, HandshakeError::Refused(_)), "{e}");
        refusing.join().unwrap();
    }

    #[test]
    fn a_key_update_the_peer_asks_for_is_made_before_the_next_record() {
        let ((client, c), (server, s)) = pair();
        server.send(&s, &[IoSlice::new(b"under the first key")]).unwrap();
        // The client updates its key and asks the server to update its own (update_requested).
        {
            let mut send = lock(&client.send);
            send.seal_message(22, &[24, 0, 0, 1, 1]).unwrap();
            let (seq, secrets) = lock(&client.kernel).update_tx().unwrap();
            send.keys = Keys::new(seq, secrets).unwrap();
            send_all(c.as_raw_fd(), &mut [IoSlice::new(&send.out)]).unwrap();
            send.out.clear();
        }
        client.send(&c, &[IoSlice::new(b"after the client's update")]).unwrap();
        let mut from_client = server.reader(s.try_clone().unwrap());
        let mut got = [0u8; 25];
        from_client.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"after the client's update");
        assert_eq!(lock(&server.send).keys.seq, 1, "one record under the first key");
        server.send(&s, &[IoSlice::new(b"after the server's update")]).unwrap();
        // A key update went first (the old key's second record): the data record is the first
        // under the new key.
        assert_eq!(lock(&server.send).keys.seq, 1);
        let mut from_server = client.reader(c.try_clone().unwrap());
        let mut first = [0u8; 19];
        from_server.read_exact(&mut first).unwrap();
        assert_eq!(&first, b"under the first key");
        from_server.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"after the server's update");
    }

    /// A reader over bytes already in memory.
    struct Bytes(std::io::Cursor<Vec<u8>>);

    impl Read for Bytes {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            self.0.read(buf)
        }
    }

    /// Keys made up for a test (the same for both ends, a new sequence each time).
    fn test_keys() -> Keys {
        let secrets = rustls::ConnectionTrafficSecrets::Aes256Gcm {
            key: rustls::crypto::cipher::AeadKey::from([7u8; 32]),
            iv: rustls::crypto::cipher::Iv::from([9u8; 12]),
        };
        Keys::new(0, secrets).unwrap()
    }

    /// A socket that hands out at most `piece(n)` bytes on its n-th read, and says
    /// `WouldBlock` every third time.
    struct Pieces {
        data: std::io::Cursor<Vec<u8>>,
        reads: usize,
    }

    impl Read for Pieces {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            self.reads += 1;
            if self.reads.is_multiple_of(3) {
                return Err(std::io::ErrorKind::WouldBlock.into());
            }
            let piece = [1, 5, 3_000, 16_410, 70_000, 1 << 20][self.reads % 6];
            let n = buf.len().min(piece);
            self.data.read(&mut buf[..n])
        }
    }

    #[test]
    fn reads_of_any_size_give_the_bytes_in_order_across_key_updates() {
        // Large reads open records in the caller's buffer, small ones in the reader's; the
        // socket cuts records anywhere and sometimes has nothing: every byte comes once, in
        // order, with key updates and a close_notify at the end.
        let ((client, _c), (server, _s)) = pair();
        let data = pattern(5 << 20, 7);
        let wire = {
            let mut send = lock(&client.send);
            send.keys = test_keys();
            send.limit = 11;
            let mut wire = Vec::new();
            for part in data.chunks(300_001) {
                send.seal_all(&client.kernel, &client.update, &[IoSlice::new(part)], usize::MAX, &mut |b| {
                    wire.extend_from_slice(b);
                    Ok(())
                })
                .unwrap();
            }
            send.seal_close_notify().unwrap();
            wire.extend_from_slice(&std::mem::take(&mut send.out));
            wire
        };
        // The reader's keys follow the sender's updates through the same kernel secrets.
        *lock(&server.receive) = Some((test_keys(), Vec::new(), Vec::new()));
        let mut reader = server.reader(Pieces { data: std::io::Cursor::new(wire), reads: 0 });
        let mut got = Vec::with_capacity(data.len());
        let sizes = [1usize, 64 << 10, 100, 1 << 20, (64 << 10) - 1, 3 << 20, 17];
        let mut buf = vec![0u8; 3 << 20];
        for i in 0.. {
            let want = sizes[i % sizes.len()];
            match reader.read(&mut buf[..want]) {
                Ok(0) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                Err(e) => panic!("read {i}: {e}"),
            }
        }
        assert_eq!(got.len(), data.len());
        assert!(got == data, "the bytes differ");
    }

    /// Cases of the seeded random runs: `CHIDORI_FUZZ_CASES`, else `default`.
    fn cases(default: u64) -> u64 {
        std::env::var("CHIDORI_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(default)
    }

    #[test]
    fn malformed_records_from_a_peer_are_errors_not_panics() {
        // What an authenticated peer could send after the handshake: records of every inner
        // content type with random bodies (handshake messages, alerts, key updates, tickets
        // to a server), sealed with the keys the reader holds; what anyone on the path could:
        // random bytes, and sealed records with one byte changed. Each read ends in data,
        // an error or the end; never a panic. `CHIDORI_FUZZ_CASES` sets the count.
        let ((client, _c), (server, _s)) = pair();
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let (mut ended, mut data, mut refused) = (0u64, 0u64, 0u64);
        for case in 0..cases(4_000) {
            let mut wire: Vec<u8> = if case % 5 == 4 {
                (0..(next() % 40_000) as usize).map(|_| next() as u8).collect()
            } else {
                let mut send = lock(&client.send);
                send.keys = test_keys();
                for _ in 0..1 + next() % 3 {
                    let kind = [0u8, 20, 21, 22, 23, 23, 24, 255][(next() % 8) as usize];
                    let mut body: Vec<u8> = (0..(next() % 64) as usize).map(|_| next() as u8).collect();
                    if next() % 2 == 0 {
                        // A handshake message header of a known type with a random length.
                        body.splice(0..0, [[4u8, 24][(next() % 2) as usize], 0, 0, (next() % 4) as u8]);
                    }
                    send.seal_message(kind, &body).unwrap();
                }
                std::mem::take(&mut send.out)
            };
            if case % 5 == 3 && !wire.is_empty() {
                let at = (next() as usize) % wire.len();
                wire[at] ^= 1 << (next() % 8);
            }
            *lock(&server.receive) = Some((test_keys(), Vec::new(), Vec::new()));
            let mut reader = server.reader(Bytes(std::io::Cursor::new(wire)));
            let mut out = vec![0u8; 1 << 16];
            loop {
                match reader.read(&mut out) {
                    Ok(0) => {
                        ended += 1;
                        break;
                    }
                    Ok(_) => data += 1,
                    Err(_) => {
                        refused += 1;
                        break;
                    }
                }
            }
        }
        eprintln!("records: {ended} ended, {data} reads of data, {refused} refused");
        let n = cases(4_000);
        assert!(refused > n / 5 && data > n / 20, "ended {ended}, data {data}, refused {refused}");
    }
}
