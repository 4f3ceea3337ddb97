//! Blocking frame I/O on the worker's connection (plain TCP or TLS): frames are read with
//! the shared reader (`chidori_protocol::read`: one that stalls mid-frame ends the session)
//! and written here.

use std::io::IoSlice;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use chidori_protocol::frame::{self, Frame, HEADER_LEN, Header, Kind};
pub use chidori_protocol::read::{ReadError, read_frame};
use chidori_protocol::resume::{Gap, Replay};
use chidori_tls::Secure;

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
                let mut frame = Vec::new();
                for s in slices.iter() {
                    let room = (64usize << 10).saturating_sub(frame.len());
                    frame.extend_from_slice(&s[..s.len().min(room)]);
                }
                // A host function to run comes from the library's own thread at any time:
                // the last frame kept is the last answer to a call (a reply, or the
                // asynchronous error of a call sent without waiting).
                let unasked = Frame::decode(&frame).is_ok_and(|(f, _)| f.header.kind == Kind::HostCallback);
                if !unasked {
                    *last = frame;
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
