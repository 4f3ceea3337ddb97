//! Bulk lanes on the worker's side: further connections of one session that carry the
//! frames of large copies, so that a copy is bound by several TCP streams (and as many
//! cores for TLS), not one.
//!
//! The client opens a lane like a reconnection ([`crate::resume`]): the supervisor passes
//! it to the session's worker, whose acceptor checks it (TLS, token, the Welcome's lane
//! secret) and attaches it here. On the session's connection a [`Kind::Lane`] frame stands
//! in for a call, in the call order: the reader takes the lane's next frame in its place,
//! so calls keep the order the client issued them in, whichever connection carried them.
//! Each lane has a thread that reads its frames ahead and one that writes the replies to
//! the calls it carried, so an executor never waits for a lane's socket.

use std::collections::HashMap;
use std::io::{IoSlice, Read};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use chidori_protocol::frame::{self, Frame, Header};

use chidori_protocol::read::read_frame_reusing;

use crate::backend::Backend;
use crate::io::{ReadError, Sink};

/// Lanes a session may open (the client opens as many as it wants, up to this: 4 by
/// default, 8 over TLS, where each lane's records are sealed and opened by one core).
pub const OFFERED: u8 = 16;

/// Bulk bytes a lane's frame may have reserved before they arrive (a lane is
/// authenticated; the largest copy chunk is 8 MiB).
const RESERVE: usize = 16 << 20;

/// Output bytes a reply owns.
pub type Part = Box<dyn AsRef<[u8]> + Send>;

/// A reply owned, for a lane's writer thread: the header and archive, then the bulk.
struct Outgoing {
    head: Vec<u8>,
    bulk: Vec<Part>,
}

/// Buffers of one length, made once (pinned for the GPU's copies where the backend can) and
/// never freed: at most `limit` are made. With `adopt`, buffers of that length made
/// elsewhere are kept too while there is room (a lane's reader allocates its own once the
/// pool's are all out: eight lanes read ahead more than twelve frames).
pub struct Reused<T> {
    free: Vec<Vec<T>>,
    /// Addresses of the buffers made, and whether each is pinned.
    made: Vec<(u64, bool)>,
    limit: usize,
    len: usize,
    adopt: bool,
}

impl<T: Copy + Default> Reused<T> {
    pub const fn new(limit: usize, len: usize, adopt: bool) -> Self {
        Reused { free: Vec::new(), made: Vec::new(), limit, len, adopt }
    }

    /// A buffer of at least `len` elements' capacity (it may hold an earlier user's bytes),
    /// or None once `limit` are out.
    pub fn take(&mut self, backend: &dyn Backend) -> Option<Vec<T>> {
        if let Some(b) = self.free.pop() {
            return Some(b);
        }
        if self.made.len() >= self.limit {
            return None;
        }
        let b = vec![T::default(); self.len];
        let pinned = backend.pin_staging(b.as_ptr() as u64, (self.len * size_of::<T>()) as u64);
        self.made.push((b.as_ptr() as u64, pinned));
        Some(b)
    }

    /// A buffer back: one this pool made always; another of its length, where the pool
    /// adopts, once it has made all it may (until then it makes its own, pinned) and while
    /// there is room.
    pub fn give(&mut self, b: Vec<T>) {
        let ours = self.made.iter().any(|&(a, _)| a == b.as_ptr() as u64);
        let adopted =
            self.adopt && b.capacity() == self.len && self.made.len() >= self.limit && self.free.len() < self.limit;
        if ours || adopted {
            self.free.push(b);
        }
    }

    /// Let the pool make up to `limit` buffers (never fewer than it may already).
    pub fn allow(&mut self, limit: usize) {
        self.limit = self.limit.max(limit);
    }

    /// Whether the buffer at `addr` is one of the pinned ones.
    pub fn is_pinned(&self, addr: u64) -> bool {
        self.made.iter().any(|&(a, pinned)| pinned && a == addr)
    }
}

/// Buffers the staging pool makes (8 MiB each; a lane's reader reads into memory of its own
/// beyond that): four lanes' frames read ahead and the one running.
const STAGING: usize = 12;

/// Staging buffers a lane may hold at once: two frames read ahead and one being read. A
/// session with more lanes than [`STAGING`] covers may have this many per lane (eight
/// lanes: 25 buffers, 200 MiB pinned; sixteen: 392 MiB), so that no lane frame lands in
/// pageable memory, whose copies to the GPU are slower and wait for the CPU.
const PER_LANE: usize = 3;

/// Large buffers `lanes` lanes may hold at once: three each, and the one a call is using.
pub fn staging_for(lanes: usize) -> usize {
    PER_LANE * lanes + 1
}

/// Bytes of a staging buffer: the largest copy chunk a client sends.
const POOL_BUFFER: usize = 8 << 20;

/// A session's lanes.
pub struct Lanes {
    /// Frames each lane read, in its order (Err: why the lane ended).
    incoming: Mutex<HashMap<u8, mpsc::Receiver<Result<Frame, String>>>>,
    /// Replies to write on each lane.
    outgoing: Mutex<HashMap<u8, mpsc::SyncSender<Outgoing>>>,
    attached: Condvar,
    /// Bulk buffers of lane frames, read into again (not faulted in anew).
    pool: Arc<Mutex<Reused<u8>>>,
    backend: Arc<dyn Backend>,
}

impl Lanes {
    pub fn new(backend: Arc<dyn Backend>) -> Lanes {
        Lanes {
            incoming: Mutex::default(),
            outgoing: Mutex::default(),
            attached: Condvar::new(),
            pool: Arc::new(Mutex::new(Reused::new(STAGING, POOL_BUFFER, true))),
            backend,
        }
    }

    /// Whether `bulk` is a pinned staging buffer (a copy from it on a stream must be waited
    /// for before the buffer is read into again).
    pub fn is_pinned(&self, bulk: &[u8]) -> bool {
        lock(&self.pool).is_pinned(bulk.as_ptr() as u64)
    }

    /// Start reading and writing lane `lane` (a checked connection). A lane already
    /// attached under that number is replaced. The number of lanes attached now.
    pub fn attach(&self, lane: u8, mut reader: Box<dyn Read + Send>, mut sink: Sink, stall: Duration) -> usize {
        // Two frames read ahead per lane (the socket holds back the rest).
        let (frames_tx, frames_rx) = mpsc::sync_channel(2);
        // Two replies queued per lane: an executor that reads back faster than the lane
        // carries waits, as it did writing to the socket itself (the worker's memory stays
        // bounded on a slow link).
        let (out_tx, out_rx) = mpsc::sync_channel::<Outgoing>(2);
        let (pool, backend) = (self.pool.clone(), self.backend.clone());
        let read = move || {
            loop {
                let mut spare = lock(&pool).take(&*backend).unwrap_or_default();
                let frame = read_frame_reusing(&mut reader, stall, RESERVE, &mut spare);
                // A buffer the frame did not take (a small or empty bulk) goes back.
                if spare.capacity() > 0 {
                    lock(&pool).give(spare);
                }
                let frame = match frame {
                    Ok(f) => Ok(f),
                    // An idle lane is fine: it carries only large copies.
                    Err(ReadError::Timeout) => continue,
                    Err(ReadError::Closed) => Err(format!("bulk lane {lane} was closed")),
                    Err(e) => Err(format!("bulk lane {lane}: {e}")),
                };
                let end = frame.is_err();
                if frames_tx.send(frame).is_err() || end {
                    return;
                }
            }
        };
        let write = move || {
            while let Ok(out) = out_rx.recv() {
                let mut slices: Vec<IoSlice<'_>> = Vec::with_capacity(1 + out.bulk.len());
                slices.push(IoSlice::new(&out.head));
                slices.extend(out.bulk.iter().map(|b| IoSlice::new((**b).as_ref())));
                if let Err(e) = sink.write_all_vectored(&mut slices) {
                    // The client's reader of this lane sees the connection end and says so.
                    tracing::warn!("writing to bulk lane {lane} failed: {e}");
                    return;
                }
            }
        };
        let spawned = std::thread::Builder::new()
            .name(format!("chidori-lane{lane}-in"))
            .spawn(read)
            .and_then(|_| std::thread::Builder::new().name(format!("chidori-lane{lane}-out")).spawn(write));
        if let Err(e) = spawned {
            tracing::warn!("cannot start the threads of bulk lane {lane}: {e}");
            return lock(&self.outgoing).len();
        }
        lock(&self.incoming).insert(lane, frames_rx);
        let attached = {
            let mut outgoing = lock(&self.outgoing);
            outgoing.insert(lane, out_tx);
            outgoing.len()
        };
        lock(&self.pool).allow(staging_for(attached));
        self.attached.notify_all();
        attached
    }

    /// The next frame lane `lane` carried. Waits up to `stall` for the lane to be attached,
    /// then for as long as the lane lives: its reader ends it when a frame stalls or the
    /// connection closes.
    pub fn next_frame(&self, lane: u8, stall: Duration) -> Result<Frame, String> {
        let deadline = Instant::now() + stall;
        let mut incoming = lock(&self.incoming);
        loop {
            if let Some(rx) = incoming.remove(&lane) {
                // Waited for without the lock (another lane may attach meanwhile); only the
                // session's reader takes frames.
                drop(incoming);
                let frame = rx.recv().unwrap_or_else(|_| Err(format!("bulk lane {lane} has ended")));
                lock(&self.incoming).entry(lane).or_insert(rx);
                return frame;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(format!("a call was sent on bulk lane {lane}, which the client never opened"));
            }
            incoming = self.attached.wait_timeout(incoming, left).unwrap_or_else(|p| p.into_inner()).0;
        }
    }

    /// The bulk buffer of a lane frame that was executed, for a lane's reader to fill again.
    pub fn recycle(&self, bulk: Vec<u8>) {
        lock(&self.pool).give(bulk);
    }

    /// Queue a reply for lane `lane`'s writer, its bytes copied (waits while two are queued).
    pub fn send(&self, lane: u8, header: Header, archive: &[u8], bulk: &[&[u8]]) -> std::io::Result<()> {
        self.send_owned(lane, header, archive, bulk.iter().map(|b| Box::new(b.to_vec()) as Part).collect())
    }

    /// Queue a reply whose output bytes it owns for lane `lane`'s writer.
    pub fn send_owned(&self, lane: u8, header: Header, archive: &[u8], bulk: Vec<Part>) -> std::io::Result<()> {
        let total: usize = bulk.iter().map(|b| (**b).as_ref().len()).sum();
        let mut head = frame::assemble(header, archive, total).map_err(std::io::Error::other)?.to_vec();
        head.extend_from_slice(archive);
        let out = Outgoing { head, bulk };
        let tx = lock(&self.outgoing).get(&lane).cloned();
        match tx {
            Some(tx) if tx.send(out).is_ok() => Ok(()),
            _ => Err(std::io::Error::other(format!("bulk lane {lane} has ended"))),
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
    use std::net::{TcpListener, TcpStream};

    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        (a, b)
    }

    #[test]
    fn a_lane_reads_its_frames_in_order_and_writes_replies() {
        let lanes = Lanes::new(crate::fuzz::emulated_harness_backend());
        let (client, served) = pair();
        served.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
        lanes.attach(1, Box::new(served.try_clone().unwrap()), Sink::Plain(served), Duration::from_secs(2));
        for seq in 1..=3u64 {
            let bytes = frame::to_vec(Header::new(Kind::Call, 7, 1, seq), &[], &[&[seq as u8; 1000]]).unwrap();
            std::io::Write::write_all(&mut &client, &bytes).unwrap();
        }
        for seq in 1..=3u64 {
            let f = lanes.next_frame(1, Duration::from_secs(2)).unwrap();
            assert_eq!(f.header.seq, seq);
            assert_eq!(f.bulk, vec![seq as u8; 1000]);
        }
        lanes.send(1, Header::new(Kind::Reply, 7, 1, 3), &[], &[b"abc"]).unwrap();
        client.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let reply = crate::io::read_frame(&mut &client, Duration::from_secs(2)).unwrap();
        assert_eq!((reply.header.kind, reply.header.seq, &reply.bulk[..]), (Kind::Reply, 3, &b"abc"[..]));
        drop(client);
        let end = lanes.next_frame(1, Duration::from_secs(2)).unwrap_err();
        assert!(end.contains("closed"), "{end}");
    }

    #[test]
    fn reused_buffers_are_made_up_to_the_limit_and_kept() {
        let backend = crate::fuzz::emulated_harness_backend();
        let mut outputs: Reused<u64> = Reused::new(2, 16, false);
        let (a, b) = (outputs.take(&*backend).unwrap(), outputs.take(&*backend).unwrap());
        assert!(outputs.take(&*backend).is_none(), "no third past the limit");
        let a_addr = a.as_ptr();
        outputs.give(a);
        outputs.give(vec![0u64; 16]);
        let again = outputs.take(&*backend).unwrap();
        assert_eq!(again.as_ptr(), a_addr, "its own buffer comes back");
        assert!(outputs.take(&*backend).is_none(), "a buffer made elsewhere is not adopted");
        drop((b, again));
        let mut staging: Reused<u8> = Reused::new(1, 8, true);
        let made = staging.take(&*backend).unwrap();
        let elsewhere = vec![0u8; 8];
        let adopted = elsewhere.as_ptr();
        staging.give(elsewhere);
        staging.give(vec![0u8; 4]);
        assert_eq!(staging.take(&*backend).map(|b| b.as_ptr()), Some(adopted), "one of its length is adopted");
        assert!(staging.take(&*backend).is_none(), "the one of another length was not");
        drop(made);
    }

    #[test]
    fn a_staging_pool_makes_its_own_before_it_adopts_and_grows_with_lanes() {
        let backend = crate::fuzz::emulated_harness_backend();
        let mut staging: Reused<u8> = Reused::new(2, 8, true);
        staging.give(vec![0u8; 8]);
        let first = staging.take(&*backend).unwrap();
        assert!(staging.made.iter().any(|&(a, _)| a == first.as_ptr() as u64), "made, not the one given");
        staging.allow(3);
        staging.allow(1);
        let taken: Vec<_> = (0..2).map_while(|_| staging.take(&*backend)).collect();
        assert_eq!((taken.len(), staging.made.len()), (2, 3), "three may be made after allow(3), not fewer");
        assert!(staging.take(&*backend).is_none());
    }

    #[test]
    fn each_lane_attached_lets_the_staging_pool_hold_its_frames() {
        let lanes = Lanes::new(crate::fuzz::emulated_harness_backend());
        let mut ends = Vec::new();
        for lane in 1..=8u8 {
            let (client, served) = pair();
            served.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
            lanes.attach(lane, Box::new(served.try_clone().unwrap()), Sink::Plain(served), Duration::from_secs(2));
            ends.push(client);
        }
        assert_eq!(lock(&lanes.pool).limit, PER_LANE * 8 + 1);
        let (client, served) = pair();
        let attached =
            lanes.attach(8, Box::new(served.try_clone().unwrap()), Sink::Plain(served), Duration::from_secs(2));
        assert_eq!(attached, 8);
        assert_eq!(lock(&lanes.pool).limit, PER_LANE * 8 + 1, "a lane attached again is not counted twice");
        drop((ends, client));
    }

    #[test]
    fn a_lane_never_opened_is_an_error_not_a_hang() {
        let lanes = Lanes::new(crate::fuzz::emulated_harness_backend());
        let e = lanes.next_frame(3, Duration::from_millis(100)).unwrap_err();
        assert!(e.contains("never opened"), "{e}");
        assert!(lanes.send(3, Header::new(Kind::Reply, 0, 0, 0), &[], &[]).is_err());
    }
}
