//! Sessions that survive a dropped connection, on the worker's side
//! ([`chidori_protocol::resume`] describes the protocol).
//!
//! The supervisor hands a reconnecting client's socket to the session's worker over a Unix
//! socket ([`send_fd`], [`recv_fd`]). A thread of the worker ([`spawn_acceptor`]) checks
//! the new connection (TLS, token, the session's secret) before it touches the running
//! one, so a stranger who guesses a session id cannot break it; a verified connection
//! replaces the current one: [`Resumable`], the session's reader, continues on it where
//! the old one stopped, and the [`Writer`] sends the client what it missed.

use std::io::{IoSlice, Read};
use std::net::TcpStream;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use chidori_protocol::frame::{Header, Kind};
use chidori_protocol::messages::{self, Refuse, RefuseReason, ResumeRequest};
use chidori_protocol::resume::ACK_EVERY;

use crate::auth::Security;
use crate::io::{Sink, Writer, read_frame};

/// Pass `fd` over the Unix socket `to` (SCM_RIGHTS).
pub fn send_fd(to: &UnixStream, fd: RawFd) -> std::io::Result<()> {
    let byte = [1u8];
    let mut space = [0u8; 64];
    // SAFETY: the message points at a one-byte buffer and a control buffer large enough for
    // one descriptor (CMSG_SPACE of one int is 24 bytes here), both alive for the call; the
    // CMSG_* helpers compute positions inside that buffer.
    unsafe {
        let mut iov = libc::iovec { iov_base: byte.as_ptr() as *mut libc::c_void, iov_len: 1 };
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = space.as_mut_ptr().cast();
        msg.msg_controllen = libc::CMSG_SPACE(size_of::<RawFd>() as u32) as _;
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = libc::CMSG_LEN(size_of::<RawFd>() as u32) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<RawFd>(), fd);
        if libc::sendmsg(to.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) < 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Receive one descriptor from the Unix socket `from` (blocking). Ok(None): the other end
/// closed.
pub fn recv_fd(from: &UnixStream) -> std::io::Result<Option<OwnedFd>> {
    let mut byte = [0u8];
    let mut space = [0u8; 64];
    loop {
        // SAFETY: as in send_fd; a descriptor the kernel passed is owned by nothing else in
        // this process (MSG_CMSG_CLOEXEC keeps it from leaking into children).
        unsafe {
            let mut iov = libc::iovec { iov_base: byte.as_mut_ptr().cast(), iov_len: 1 };
            let mut msg: libc::msghdr = std::mem::zeroed();
            msg.msg_iov = &mut iov;
            msg.msg_iovlen = 1;
            msg.msg_control = space.as_mut_ptr().cast();
            msg.msg_controllen = space.len() as _;
            let n = libc::recvmsg(from.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC);
            if n < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            if n == 0 {
                return Ok(None);
            }
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            if cmsg.is_null() || (*cmsg).cmsg_level != libc::SOL_SOCKET || (*cmsg).cmsg_type != libc::SCM_RIGHTS {
                continue;
            }
            let fd = std::ptr::read_unaligned(libc::CMSG_DATA(cmsg).cast::<RawFd>());
            return Ok(Some(OwnedFd::from_raw_fd(fd)));
        }
    }
}

/// A checked new connection for the session.
pub struct NewLink {
    reader: Box<dyn Read + Send>,
    sink: Sink,
    /// Bytes of the session's stream the client received.
    peer_received: u64,
}

/// What the acceptor needs to check a reconnecting client or a bulk lane.
pub struct Acceptor {
    pub control: UnixStream,
    pub security: Option<Security>,
    /// The resume secret (empty: the session does not survive a dropped connection).
    pub secret: Vec<u8>,
    /// The lane secret, and where lanes go (None: the session has no lanes).
    pub lanes: Option<(Vec<u8>, Arc<crate::lanes::Lanes>)>,
    pub heartbeat: Duration,
}

/// What a checked connection is for.
enum Checked {
    Resume(NewLink),
    Lane(u8, NewLink),
}

/// Check every connection the supervisor passes for this session; hand each verified
/// reconnection to the reader (breaking the current connection, which the client has given
/// up on), and attach each verified lane.
pub fn spawn_acceptor(acceptor: Acceptor, writer: Arc<Writer>) -> mpsc::Receiver<NewLink> {
    let (tx, rx) = mpsc::channel();
    let spawned = std::thread::Builder::new().name("chidori-resume".into()).spawn(move || {
        loop {
            let fd = match recv_fd(&acceptor.control) {
                Ok(Some(fd)) => fd,
                Ok(None) => return,
                Err(e) => {
                    tracing::warn!("receiving a reconnecting client's connection: {e}");
                    return;
                }
            };
            let stream = TcpStream::from(fd);
            let peer = stream.peer_addr().map(|a| a.to_string()).unwrap_or_else(|_| "?".into());
            match verify(stream, &acceptor) {
                Ok(Checked::Resume(link)) => {
                    tracing::info!("client reconnected from {peer}: resuming the session");
                    writer.link_down();
                    if tx.send(link).is_err() {
                        return;
                    }
                }
                Ok(Checked::Lane(lane, mut link)) => {
                    let answer = Header::new(Kind::Resumed, 0, 0, 0);
                    let Ok(head) = chidori_protocol::frame::assemble(answer, &[], 0) else { continue };
                    if let Err(e) = link.sink.write_all_vectored(&mut [IoSlice::new(&head)]) {
                        tracing::warn!("answering bulk lane {lane} from {peer} failed: {e}");
                        continue;
                    }
                    if let Some((_, lanes)) = &acceptor.lanes {
                        tracing::debug!("bulk lane {lane} opened from {peer}");
                        let stall = crate::session::frame_stall(acceptor.heartbeat);
                        let attached = lanes.attach(lane, link.reader, link.sink, stall);
                        crate::session::outputs_for_lanes(attached);
                    }
                }
                Err(e) => tracing::warn!("refused a connection to the session from {peer}: {e}"),
            }
        }
    });
    if let Err(e) = spawned {
        tracing::warn!("cannot start the thread that takes reconnecting clients: {e}");
    }
    rx
}

/// Whether `a` equals `b`, in time that does not depend on where they differ.
fn same_secret(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && !a.is_empty() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn verify(mut stream: TcpStream, acceptor: &Acceptor) -> Result<Checked, String> {
    let timeout = crate::session::HANDSHAKE_TIMEOUT;
    stream.set_nodelay(true).ok();
    stream.set_read_timeout(Some(timeout)).map_err(|e| e.to_string())?;
    stream.set_write_timeout(Some(timeout)).map_err(|e| e.to_string())?;
    let clone = |s: &TcpStream| s.try_clone().map_err(|e| e.to_string());
    let (mut reader, mut sink): (Box<dyn Read + Send>, Sink) = match &acceptor.security {
        Some(security) => {
            let secure = chidori_tls::server_handshake(&mut stream, security.tls.clone())
                .map_err(|e| format!("TLS handshake: {e}"))?;
            (Box::new(secure.reader(clone(&stream)?)), Sink::Tls { sock: clone(&stream)?, secure })
        }
        None => (Box::new(clone(&stream)?), Sink::Plain(clone(&stream)?)),
    };
    let frame = read_frame(&mut reader, timeout).map_err(|e| format!("reading its resume request: {e}"))?;
    if frame.header.kind != Kind::Resume {
        return Err(format!("sent {:?} instead of a resume request", frame.header.kind));
    }
    let request: ResumeRequest = messages::decode(&frame, "resume request").map_err(|e| e.to_string())?;
    let token_ok = acceptor.security.as_ref().is_none_or(|s| chidori_tls::token::matches(&s.token, &request.token));
    let secret = match (request.lane, &acceptor.lanes) {
        (0, _) => &acceptor.secret[..],
        (lane, Some((secret, _))) if lane <= crate::lanes::OFFERED => &secret[..],
        _ => &[],
    };
    if !token_ok || !same_secret(secret, &request.secret) {
        let refuse = Refuse {
            reason: RefuseReason::Gone,
            message: "this is not the session's client (wrong token or session secret)".to_owned(),
        };
        let head = Header::new(Kind::Refuse, 0, 0, 0);
        let archive = messages::encode(&refuse);
        if let Ok(h) = chidori_protocol::frame::assemble(head, &archive, 0) {
            let _ = sink.write_all_vectored(&mut [IoSlice::new(&h), IoSlice::new(&archive)]);
        }
        return Err("wrong token or session secret".to_owned());
    }
    stream.set_write_timeout(None).map_err(|e| e.to_string())?;
    stream.set_read_timeout(Some(acceptor.heartbeat)).map_err(|e| e.to_string())?;
    let link = NewLink { reader, sink, peer_received: request.received };
    Ok(match request.lane {
        0 => Checked::Resume(link),
        lane => Checked::Lane(lane, link),
    })
}

/// What a resumable session's reader keeps.
struct Resume {
    links: mpsc::Receiver<NewLink>,
    grace: Duration,
    /// Consecutive read timeouts (heartbeats) with no byte from the client.
    silent: u32,
}

/// The session's reader: the current connection's bytes, counted; in a resumable session
/// a broken connection is replaced by the client's next one (within the grace period)
/// without the frames above noticing.
pub struct Resumable {
    current: Box<dyn Read + Send>,
    writer: Arc<Writer>,
    resume: Option<Resume>,
    received: u64,
    acked: u64,
}

/// Heartbeats without a byte from the client after which a resumable session's
/// connection counts as broken (the client answers every heartbeat).
const SILENT_HEARTBEATS: u32 = 3;

impl Resumable {
    /// A reader that ends with its connection.
    pub fn plain(current: Box<dyn Read + Send>, writer: Arc<Writer>) -> Resumable {
        Resumable { current, writer, resume: None, received: 0, acked: 0 }
    }

    /// A reader that survives a dropped connection: new ones come from `links`.
    pub fn surviving(
        current: Box<dyn Read + Send>,
        writer: Arc<Writer>,
        links: mpsc::Receiver<NewLink>,
        grace: Duration,
    ) -> Resumable {
        Resumable { current, writer, resume: Some(Resume { links, grace, silent: 0 }), received: 0, acked: 0 }
    }

    pub fn is_resumable(&self) -> bool {
        self.resume.is_some()
    }

    /// Acknowledge what was received (at heartbeats, and every [`ACK_EVERY`] bytes).
    pub fn acknowledge(&mut self) {
        if self.resume.is_some() && self.received > self.acked {
            self.acked = self.received;
            self.writer.send_control(Header::new(Kind::Ack, 0, 0, self.received));
        }
    }

    /// Wait for the client's next connection and continue on it.
    fn reconnect(&mut self, why: &str) -> std::io::Result<()> {
        let Some(resume) = self.resume.as_mut() else { return Err(std::io::Error::other(why.to_owned())) };
        self.writer.link_down();
        let grace = resume.grace;
        tracing::warn!(
            "the connection to the client broke ({why}): waiting up to {} s for it to reconnect",
            grace.as_secs()
        );
        let deadline = Instant::now() + grace;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let mut link = resume.links.recv_timeout(left).map_err(|_| {
                std::io::Error::new(
                    std::io::ErrorKind::ConnectionAborted,
                    format!(
                        "the connection to the client broke ({why}) and it did not reconnect within {} s",
                        grace.as_secs()
                    ),
                )
            })?;
            let answer = Header::new(Kind::Resumed, 0, 0, self.received);
            let Ok(head) = chidori_protocol::frame::assemble(answer, &[], 0) else { continue };
            if let Err(e) = link.sink.write_all_vectored(&mut [IoSlice::new(&head)]) {
                tracing::warn!("answering a reconnected client failed: {e}");
                continue;
            }
            self.writer
                .install(link.sink, link.peer_received)
                .map_err(|gap| std::io::Error::new(std::io::ErrorKind::InvalidData, gap.to_string()))?;
            self.current = link.reader;
            resume.silent = 0;
            tracing::info!("session resumed: the client had {} bytes, this side {}", link.peer_received, self.received);
            return Ok(());
        }
    }
}

impl Read for Resumable {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        loop {
            let resumable = self.resume.is_some();
            match self.current.read(buf) {
                Ok(0) if resumable => self.reconnect("the connection was closed")?,
                Ok(n) => {
                    self.received += n as u64;
                    if let Some(r) = self.resume.as_mut() {
                        r.silent = 0;
                    }
                    if self.received - self.acked >= ACK_EVERY {
                        self.acknowledge();
                    }
                    return Ok(n);
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                    let Some(r) = self.resume.as_mut() else { return Err(e) };
                    r.silent += 1;
                    if r.silent > SILENT_HEARTBEATS {
                        let why = format!("no bytes from the client for {SILENT_HEARTBEATS} heartbeats");
                        self.reconnect(&why)?;
                        continue;
                    }
                    return Err(e);
                }
                Err(e) if resumable => self.reconnect(&e.to_string())?,
                Err(e) => return Err(e),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptors_pass_between_processes_sockets() {
        let (a, b) = UnixStream::pair().unwrap();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (served, _) = listener.accept().unwrap();
        send_fd(&a, served.as_raw_fd()).unwrap();
        drop(served);
        let got = TcpStream::from(recv_fd(&b).unwrap().expect("a descriptor"));
        std::io::Write::write_all(&mut &got, b"hi").unwrap();
        let mut buf = [0u8; 2];
        (&client).read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"hi");
        drop(a);
        assert!(recv_fd(&b).unwrap().is_none(), "the other end closed");
    }

    #[test]
    fn secrets_compare_whole() {
        assert!(same_secret(b"abc", b"abc"));
        assert!(!same_secret(b"abc", b"abd"));
        assert!(!same_secret(b"abc", b"ab"));
        assert!(!same_secret(b"", b""));
    }
}
