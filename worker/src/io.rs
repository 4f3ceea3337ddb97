//! Blocking frame I/O on the worker's connection (plain TCP or TLS).
//!
//! A frame's memory is reserved as its bytes arrive, not as its header announces: a header
//! that declares 256 MiB and sends nothing costs a few KiB. A frame that has started must
//! keep coming: one that makes no progress for the stall limit ends the session.

use std::io::{IoSlice, Read};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chidori_protocol::frame::{self, Frame, FrameError, HEADER_LEN, Header};
use chidori_protocol::resume::{Gap, Replay};
use chidori_protocol::rkyv::util::AlignedVec;
use chidori_tls::Secure;

#[derive(Debug)]
pub enum ReadError {
    /// The peer closed the connection.
    Closed,
    /// No frame within the socket's read timeout.
    Timeout,
    /// A frame started and then stopped arriving.
    Stalled {
        what: &'static str,
        after: Duration,
    },
    Io(std::io::Error),
    Frame(FrameError),
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadError::Closed => f.write_str("connection closed"),
            ReadError::Timeout => f.write_str("timed out"),
            ReadError::Stalled { what, after } => {
                write!(f, "the client stopped sending in the middle of a frame's {what} for {} s", after.as_secs())
            }
            ReadError::Io(e) => write!(f, "{e}"),
            ReadError::Frame(e) => write!(f, "{e}"),
        }
    }
}

/// Bytes reserved at a time while a frame's archive or bulk arrives (then doubling, up to
/// the declared size).
const FIRST_CHUNK: usize = 64 << 10;

fn is_timeout(e: &std::io::Error) -> bool {
    matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut)
}

/// Read one frame. A timeout before its first byte is [`ReadError::Timeout`]; once a frame
/// has started, the rest must follow, each read making progress within `stall`.
pub fn read_frame(r: &mut impl Read, stall: Duration) -> Result<Frame, ReadError> {
    let mut head = [0u8; HEADER_LEN];
    let mut got = 0;
    let mut progress = Instant::now();
    while got < HEADER_LEN {
        match r.read(&mut head[got..]) {
            Ok(0) if got == 0 => return Err(ReadError::Closed),
            Ok(0) => return Err(ReadError::Frame(FrameError::Truncated("header"))),
            Ok(n) => {
                got += n;
                progress = Instant::now();
            }
            Err(e) if got == 0 && is_timeout(&e) => return Err(ReadError::Timeout),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) if is_timeout(&e) => check_stall(progress, stall, "header")?,
            Err(e) => return Err(ReadError::Io(e)),
        }
    }
    let header = Header::decode(&head).map_err(ReadError::Frame)?;
    let mut archive = AlignedVec::new();
    read_growing(r, &mut archive, header.archive_len as usize, stall, "archive")?;
    let mut bulk = Vec::new();
    read_bulk(r, &mut bulk, header.bulk_len as usize, stall)?;
    Ok(Frame { header, archive, bulk })
}

/// Read `total` bytes of a frame's bulk into `into`, which std's `read_to_end` grows as
/// the bytes arrive (doubling) and fills without zeroing first: bulk is most of what a
/// session reads (every host-to-device copy), so it is read once, not zeroed and read.
fn read_bulk(r: &mut impl Read, into: &mut Vec<u8>, total: usize, stall: Duration) -> Result<(), ReadError> {
    let mut progress = Instant::now();
    while into.len() < total {
        let before = into.len();
        let left = (total - before) as u64;
        let result = r.by_ref().take(left).read_to_end(into);
        if into.len() > before {
            progress = Instant::now();
        }
        match result {
            Ok(_) if into.len() < total => return Err(ReadError::Frame(FrameError::Truncated("bulk"))),
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) if is_timeout(&e) => check_stall(progress, stall, "bulk")?,
            Err(e) => return Err(ReadError::Io(e)),
        }
    }
    Ok(())
}

fn check_stall(progress: Instant, stall: Duration, what: &'static str) -> Result<(), ReadError> {
    let after = progress.elapsed();
    if after >= stall { Err(ReadError::Stalled { what, after }) } else { Ok(()) }
}

/// Memory a frame part is read into, extended at its end.
trait Growing {
    fn extend_zeroed(&mut self, n: usize) -> &mut [u8];
}

impl Growing for Vec<u8> {
    fn extend_zeroed(&mut self, n: usize) -> &mut [u8] {
        let at = self.len();
        self.resize(at + n, 0);
        &mut self[at..]
    }
}

impl Growing for AlignedVec {
    fn extend_zeroed(&mut self, n: usize) -> &mut [u8] {
        let at = self.len();
        self.resize(at + n, 0);
        &mut self[at..]
    }
}

/// Read `total` bytes onto the end of `into`, reserving only what arrives (chunks
/// doubling from [`FIRST_CHUNK`]).
fn read_growing(
    r: &mut impl Read,
    into: &mut impl Growing,
    total: usize,
    stall: Duration,
    what: &'static str,
) -> Result<(), ReadError> {
    let mut done = 0usize;
    let mut progress = Instant::now();
    while done < total {
        let n = (total - done).min(done.max(FIRST_CHUNK));
        let chunk = into.extend_zeroed(n);
        let mut at = 0;
        while at < n {
            match r.read(&mut chunk[at..]) {
                Ok(0) => return Err(ReadError::Frame(FrameError::Truncated(what))),
                Ok(k) => {
                    at += k;
                    progress = Instant::now();
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) if is_timeout(&e) => check_stall(progress, stall, what)?,
                Err(e) => return Err(ReadError::Io(e)),
            }
        }
        done += n;
    }
    Ok(())
}

/// Where replies go: the socket itself, TLS over it, or (for tests and the fuzz target)
/// nowhere.
pub enum Sink {
    Plain(std::net::TcpStream),
    Tls {
        sock: std::net::TcpStream,
        secure: Arc<Secure>,
    },
    /// Counts what would have been written, and keeps the last frame (at most 64 KiB of it).
    Discard(u64, Vec<u8>),
}

impl Sink {
    pub fn write_all_vectored(&mut self, slices: &mut [IoSlice<'_>]) -> std::io::Result<()> {
        match self {
            Sink::Plain(s) => chidori_protocol::sock::send_all(s.as_raw_fd(), slices),
            Sink::Tls { sock, secure } => secure.send(&sock.as_raw_fd(), slices),
            Sink::Discard(n, last) => {
                *n += slices.iter().map(|s| s.len() as u64).sum::<u64>();
                last.clear();
                for s in slices.iter() {
                    let room = (64usize << 10).saturating_sub(last.len());
                    last.extend_from_slice(&s[..s.len().min(room)]);
                }
                Ok(())
            }
        }
    }

    /// A second handle on the socket, to break the connection from another thread.
    fn breaker(&self) -> Option<std::net::TcpStream> {
        match self {
            Sink::Plain(s) | Sink::Tls { sock: s, .. } => s.try_clone().ok(),
            Sink::Discard(..) => None,
        }
    }
}

/// The writing side: the sink, and in a resumable session what was written and not yet
/// acknowledged.
struct Out {
    sink: Sink,
    replay: Option<Replay>,
}

/// The connection's write half, shared by the reader (heartbeats, acknowledgements) and
/// the executors (replies). In a resumable session ([`chidori_protocol::resume`]) every
/// byte is kept until the client acknowledges it; while the connection is down, writes
/// are only kept, and a new connection gets them again ([`Writer::install`]).
pub struct Writer {
    inner: Mutex<Out>,
    /// Control frames (Pong, Ack) the reader could not write at once because a writer held
    /// the lock: that writer sends them when it is done. The reader never waits for the
    /// lock: a writer blocked on a full network waits for the peer, who may be waiting for
    /// this side to read.
    deferred: Mutex<Vec<[u8; HEADER_LEN]>>,
    /// The connection is up (a resumable session's writes are only kept while it is not).
    up: AtomicBool,
    /// A second handle on the current socket: shutting it down wakes a reader or writer
    /// blocked on a dead connection.
    breaker: Mutex<Option<std::net::TcpStream>>,
    /// The stream offset the client acknowledged (resumable sessions).
    peer_acked: AtomicU64,
}

impl Writer {
    pub fn new(sink: Sink) -> Self {
        let breaker = sink.breaker();
        Writer {
            inner: Mutex::new(Out { sink, replay: None }),
            deferred: Mutex::new(Vec::new()),
            up: AtomicBool::new(true),
            breaker: Mutex::new(breaker),
            peer_acked: AtomicU64::new(0),
        }
    }

    /// Keep every byte written from now on until the client acknowledges it: the session
    /// survives a dropped connection.
    pub fn keep_for_resume(&self) {
        lock(&self.inner).replay = Some(Replay::default());
    }

    /// Write one frame (header, archive, bulk parts) with vectored writes.
    pub fn send(&self, header: Header, archive: &[u8], bulk: &[&[u8]]) -> std::io::Result<()> {
        let total: usize = bulk.iter().map(|b| b.len()).sum();
        let head = frame::assemble(header, archive, total).map_err(std::io::Error::other)?;
        let mut slices: Vec<IoSlice<'_>> = Vec::with_capacity(2 + bulk.len());
        slices.push(IoSlice::new(&head));
        slices.push(IoSlice::new(archive));
        for b in bulk {
            slices.push(IoSlice::new(b));
        }
        let result = self.write_locked(&mut lock(&self.inner), &mut slices);
        self.send_deferred();
        result
    }

    /// Write a frame without archive or bulk (Ping, Pong, Ack) from the reading thread:
    /// now if no writer holds the connection, else by the writer that does, after its frame.
    pub fn send_control(&self, header: Header) {
        let Ok(head) = frame::assemble(header, &[], 0) else { return };
        lock(&self.deferred).push(head);
        if let Ok(mut out) = self.inner.try_lock() {
            let heads = std::mem::take(&mut *lock(&self.deferred));
            for head in heads {
                let _ = self.write_locked(&mut out, &mut [IoSlice::new(&head)]);
            }
        }
    }

    fn send_deferred(&self) {
        if lock(&self.deferred).is_empty() {
            return;
        }
        let mut out = lock(&self.inner);
        let heads = std::mem::take(&mut *lock(&self.deferred));
        for head in heads {
            let _ = self.write_locked(&mut out, &mut [IoSlice::new(&head)]);
        }
    }

    fn write_locked(&self, out: &mut Out, slices: &mut [IoSlice<'_>]) -> std::io::Result<()> {
        let Some(replay) = out.replay.as_mut() else { return out.sink.write_all_vectored(slices) };
        replay.acked(self.peer_acked.load(Ordering::Acquire));
        replay.record(slices);
        if !self.up.load(Ordering::Acquire) {
            return Ok(());
        }
        if let Err(e) = out.sink.write_all_vectored(slices) {
            tracing::warn!("writing to the client failed ({e}): the session keeps what it sends until it reconnects");
            self.link_down();
        }
        Ok(())
    }

    /// The client acknowledged the stream up to `offset`.
    pub fn acked(&self, offset: u64) {
        self.peer_acked.fetch_max(offset, Ordering::AcqRel);
    }

    /// The connection is broken: writes are kept only, and a reader or writer blocked on the
    /// socket wakes up.
    pub fn link_down(&self) {
        self.up.store(false, Ordering::Release);
        if let Some(sock) = lock(&self.breaker).as_ref() {
            let _ = sock.shutdown(std::net::Shutdown::Both);
        }
    }

    /// Continue on a new connection whose client received `peer_received` bytes: what it
    /// missed is written first, on a thread of its own (the reader goes on reading, so two
    /// sides sending each other a large backlog cannot both block).
    pub fn install(self: &Arc<Self>, sink: Sink, peer_received: u64) -> Result<(), Gap> {
        let mut out = lock(&self.inner);
        if let Some(replay) = &out.replay {
            // Checked now: a count this side cannot serve ends the session.
            replay.since(peer_received)?;
        }
        *lock(&self.breaker) = sink.breaker();
        out.sink = sink;
        drop(out);
        let writer = self.clone();
        let resend = move || {
            let mut out = lock(&writer.inner);
            let Out { sink, replay } = &mut *out;
            let result = match replay.as_ref().map(|r| r.since(peer_received)) {
                Some(Ok((a, b))) => sink.write_all_vectored(&mut [IoSlice::new(a), IoSlice::new(b)]),
                _ => Ok(()),
            };
            match result {
                Ok(()) => writer.up.store(true, Ordering::Release),
                Err(e) => tracing::warn!("sending the client what it missed failed: {e}"),
            }
            drop(out);
            writer.send_deferred();
        };
        if std::thread::Builder::new().name("chidori-resend".into()).spawn(resend).is_err() {
            tracing::warn!("cannot start a thread to resend what the client missed");
        }
        Ok(())
    }

    /// Whether replies go nowhere (a [`crate::session::Harness`]).
    pub fn is_detached(&self) -> bool {
        matches!(lock(&self.inner).sink, Sink::Discard(..))
    }

    /// Bytes a detached writer would have written, and the last frame it was given.
    pub fn discarded(&self) -> (u64, Vec<u8>) {
        match &lock(&self.inner).sink {
            Sink::Discard(n, last) => (*n, last.clone()),
            _ => (0, Vec::new()),
        }
    }

    /// End TLS cleanly (a close_notify), where there is TLS.
    pub fn close(&self) {
        let out = lock(&self.inner);
        if let Sink::Tls { sock, secure } = &out.sink {
            secure.close(&sock.as_raw_fd());
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use chidori_protocol::frame::Kind;

    /// Hands out its bytes a few at a time, then times out forever.
    struct Trickle {
        bytes: Vec<u8>,
        at: usize,
    }

    impl Read for Trickle {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            if self.at == self.bytes.len() {
                std::thread::sleep(Duration::from_millis(5));
                return Err(std::io::ErrorKind::WouldBlock.into());
            }
            let n = buf.len().min(7).min(self.bytes.len() - self.at);
            buf[..n].copy_from_slice(&self.bytes[self.at..self.at + n]);
            self.at += n;
            Ok(n)
        }
    }

    #[test]
    fn frames_arrive_in_pieces() {
        let bytes = frame::to_vec(Header::new(Kind::Call, 1, 2, 3), &[9u8; 100], &[&[7u8; 200_000]]).unwrap();
        let frame = read_frame(&mut Trickle { bytes, at: 0 }, Duration::from_secs(1)).unwrap();
        assert_eq!(frame.archive.len(), 100);
        assert_eq!(frame.bulk, vec![7u8; 200_000]);
    }

    #[test]
    fn a_stalled_frame_is_an_error_and_reserves_little() {
        let mut h = Header::new(Kind::Call, 1, 2, 3);
        h.bulk_len = frame::MAX_BULK as u32;
        let mut bytes = h.encode().to_vec();
        bytes.extend_from_slice(&[1u8; 1000]);
        let started = Instant::now();
        let err = read_frame(&mut Trickle { bytes, at: 0 }, Duration::from_millis(200)).unwrap_err();
        assert!(matches!(err, ReadError::Stalled { what: "bulk", .. }), "{err}");
        assert!(started.elapsed() < Duration::from_secs(2));
        let mut nothing = Trickle { bytes: Vec::new(), at: 0 };
        assert!(matches!(read_frame(&mut nothing, Duration::from_millis(100)), Err(ReadError::Timeout)));
    }

    #[test]
    fn a_bulk_cut_short_is_truncated() {
        let mut bytes = frame::to_vec(Header::new(Kind::Call, 1, 2, 3), &[9u8; 10], &[&[7u8; 300_000]]).unwrap();
        bytes.truncate(bytes.len() - 1);
        let err = read_frame(&mut bytes.as_slice(), Duration::from_secs(1)).unwrap_err();
        assert!(matches!(err, ReadError::Frame(FrameError::Truncated("bulk"))), "{err}");
    }
}
