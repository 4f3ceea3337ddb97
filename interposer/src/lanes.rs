//! Bulk lanes: further connections to the session that carry the frames of large copies,
//! so that a copy is bound by several TCP streams (and, with TLS, as many cores encrypting)
//! instead of one. Over loopback on the H200's hosts one stream carried 2.4–4.6 GB/s and
//! four 7.7–14.9 (`gpu/bench/wire.cu`).
//!
//! A lane is opened like a reconnection (the plaintext preamble naming the session, TLS
//! where there is a token, the Welcome's lane secret) when the first large copy goes out.
//! Each chunk's call frame goes to a lane's writer thread, while the session's connection
//! gets a small [`Kind::Lane`] frame in its place, in the call order: the worker takes the
//! lane's next frame there, so calls run in the order they were issued whichever connection
//! carried them, and the reply comes back on the lane (its reader thread delivers it like
//! the I/O thread does). The lock that hands out lanes is held while a frame's marker and
//! its lane job are queued, so each lane's frames are in the order of their markers.
//!
//! Lanes are not resumed: a session that survives a dropped connection (the default off
//! loopback) sends everything on its one connection.

use std::io::IoSlice;
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::Duration;

use chidori_protocol::env;
use chidori_protocol::frame::{self, Header, Kind};
use chidori_protocol::messages::ResumeRequest;
use chidori_protocol::read::read_frame_reusing;

use crate::conn::{Conn, Retry, Tls};

/// Lanes opened when the program does not say (CHIDORI_LANES): four carry what four TCP
/// streams carry on the H200's loopback (10–14 GB/s); over TLS, with rustls's buffered
/// connection, each lane decrypted about 1.1 GB/s on the worker, and eight carried 6.4–9.8
/// GB/s where four carried 3.8–5.4 (`bench/2026-12-04-h200-session18.md`, calls 6 and 7).
/// `chidori_tls`'s own records carry 1.6–1.9× as much per connection
/// (`bench/2026-12-04-tls-records-local.md`); eight stay the TLS default until the H200
/// says fewer do as well.
const DEFAULT_LANES: u8 = 4;
const DEFAULT_LANES_TLS: u8 = 8;

/// Bulk bytes of a reply reserved before they arrive (the largest chunk is 8 MiB).
const RESERVE: usize = 16 << 20;

/// A batch of copy chunks this large or larger goes over the lanes.
pub const MIN_BYTES: u64 = 16 << 20;

/// A frame for a lane's writer: header and archive, and the bulk as the caller's memory
/// (valid until [`Lanes::drain`] returns, the caller's promise).
struct Job {
    head: Vec<u8>,
    bulk: Vec<(usize, usize)>,
}

struct Lane {
    /// The number the server knows it by (1 to the Welcome's `lanes`).
    number: u8,
    jobs: mpsc::Sender<Job>,
}

/// Frames queued on the lanes and not yet written; a lane's failure.
#[derive(Default)]
struct Queued {
    count: usize,
    failed: Option<String>,
}

pub struct Lanes {
    lanes: Vec<Lane>,
    /// The next lane to use, under the lock that keeps markers and lane frames in order.
    next: Mutex<usize>,
    queued: Arc<(Mutex<Queued>, Condvar)>,
}

/// The connection's lanes, opened on first use (None: the session has none).
pub fn of(conn: &Conn) -> Option<&Lanes> {
    conn.lanes.get_or_init(|| open(conn)).as_ref()
}

/// Whether `bytes` of copy chunks go over lanes: a large batch, more than one chunk, and
/// the lanes open.
pub fn for_batch(conn: &Conn, chunks: usize, bytes: u64) -> Option<&Lanes> {
    if chunks < 2 || bytes < MIN_BYTES || conn.is_resumable() || conn.welcome.lanes == 0 {
        return None;
    }
    of(conn)
}

fn wanted(offered: u8, secure: bool) -> u8 {
    let default = if secure { DEFAULT_LANES_TLS } else { DEFAULT_LANES };
    let asked = std::env::var(env::LANES).ok().and_then(|v| v.trim().parse::<u8>().ok()).unwrap_or(default);
    asked.min(offered)
}

fn open(conn: &Conn) -> Option<Lanes> {
    let count = wanted(conn.welcome.lanes, conn.is_secure());
    if count == 0 {
        return None;
    }
    let me = crate::conn::existing()?;
    let queued: Arc<(Mutex<Queued>, Condvar)> = Arc::default();
    // All at once: each costs a few round trips, which a far server makes long.
    let opened: Vec<_> = std::thread::scope(|scope| {
        let joins: Vec<_> = (1..=count).map(|lane| scope.spawn(move || (lane, open_one(conn, lane)))).collect();
        joins.into_iter().filter_map(|j| j.join().ok()).collect()
    });
    let mut lanes = Vec::with_capacity(count as usize);
    for (lane, result) in opened {
        // Copies still work without a lane, on the session's connection: said, not an error.
        match result.and_then(|(stream, tls)| start(&me, lane, stream, tls, queued.clone())) {
            Ok(l) => lanes.push(l),
            Err(e) => tracing::warn!("cannot open bulk lane {lane} to Chidori server {}: {e}", conn.server),
        }
    }
    tracing::debug!("{} bulk lanes open to Chidori server {}", lanes.len(), conn.server);
    (!lanes.is_empty()).then(|| Lanes { lanes, next: Mutex::new(0), queued })
}

fn open_one(conn: &Conn, lane: u8) -> Result<(TcpStream, Option<Tls>), String> {
    let request = ResumeRequest {
        token: conn.token.clone().unwrap_or_default(),
        secret: conn.welcome.lane_secret.clone(),
        received: 0,
        lane,
    };
    match crate::conn::join(&conn.server, conn.welcome.session, &request) {
        Ok((stream, tls, _)) => Ok((stream, tls)),
        Err(Retry::Again(e) | Retry::Never(e)) => Err(e),
    }
}

/// The lane's writer and reader threads.
fn start(
    conn: &Arc<Conn>,
    lane: u8,
    stream: TcpStream,
    tls: Option<Tls>,
    queued: Arc<(Mutex<Queued>, Condvar)>,
) -> Result<Lane, String> {
    let (secure, reader) = match tls {
        Some((s, r)) => (Some(s), Some(r)),
        None => (None, None),
    };
    let write_stream = stream.try_clone().map_err(|e| e.to_string())?;
    let (tx, rx) = mpsc::channel::<Job>();
    let write = move || {
        while let Ok(job) = rx.recv() {
            let mut slices: Vec<IoSlice<'_>> = Vec::with_capacity(1 + job.bulk.len());
            slices.push(IoSlice::new(&job.head));
            for &(ptr, len) in &job.bulk {
                // SAFETY: the sender's memory, valid until `drain` returns, which waits for
                // this job to be written.
                slices.push(IoSlice::new(unsafe { std::slice::from_raw_parts(ptr as *const u8, len) }));
            }
            let result = match &secure {
                None => chidori_protocol::sock::send_all(write_stream.as_raw_fd(), &mut slices),
                Some(secure) => secure.send(&write_stream, &slices),
            };
            let (lock, cv) = &*queued;
            let mut q = lock.lock().unwrap_or_else(|p| p.into_inner());
            q.count -= 1;
            if let Err(e) = result {
                q.failed.get_or_insert_with(|| format!("writing to bulk lane {lane} failed: {e}"));
            }
            cv.notify_all();
        }
    };
    let me = conn.clone();
    let read = move || {
        let mut plain = &stream;
        let mut reader = reader;
        // The last reply's buffer, read into again (its memory is in place).
        let mut spare = Vec::new();
        loop {
            // The bulk of a reply (a chunk read back) is reserved at once: the lane's peer is
            // the session's server, past its TLS and secret.
            let frame = match reader.as_mut() {
                Some(r) => read_frame_reusing(r, Duration::ZERO, RESERVE, &mut spare),
                None => read_frame_reusing(&mut plain, Duration::ZERO, RESERVE, &mut spare),
            };
            let result = match frame {
                Ok(frame) if frame.header.kind == Kind::Reply || frame.header.kind == Kind::AsyncError => {
                    let delivered = crate::conn::deliver(&me, &frame);
                    if frame.bulk.capacity() > spare.capacity() {
                        spare = frame.bulk;
                    }
                    delivered
                }
                Ok(frame) => Err(format!("unexpected {:?} frame on bulk lane {lane}", frame.header.kind)),
                Err(e) => Err(format!("bulk lane {lane} to Chidori server {} broke: {e}", me.server)),
            };
            if let Err(reason) = result {
                me.lane_lost(reason);
                return;
            }
        }
    };
    std::thread::Builder::new().name(format!("chidori-lane{lane}-out")).spawn(write).map_err(|e| e.to_string())?;
    std::thread::Builder::new().name(format!("chidori-lane{lane}-in")).spawn(read).map_err(|e| e.to_string())?;
    Ok(Lane { number: lane, jobs: tx })
}

impl Lanes {
    /// Send one call frame on the next lane, its marker on the session's connection.
    ///
    /// # Safety
    /// `bulk` must stay valid and unchanged until [`Lanes::drain`] returns.
    pub unsafe fn send(&self, conn: &Conn, header: Header, archive: &[u8], bulk: &[&[u8]]) -> Result<(), String> {
        let total: usize = bulk.iter().map(|b| b.len()).sum();
        let mut head = frame::assemble(header, archive, total).map_err(|e| e.to_string())?.to_vec();
        head.extend_from_slice(archive);
        let job = Job { head, bulk: bulk.iter().map(|b| (b.as_ptr() as usize, b.len())).collect() };
        let mut next = self.next.lock().unwrap_or_else(|p| p.into_inner());
        let lane = &self.lanes[*next % self.lanes.len()];
        *next = next.wrapping_add(1);
        let marker = Header::new(Kind::Lane, u32::from(lane.number), header.thread, header.seq);
        conn.send(marker, &[], &[])?;
        let (lock, _) = &*self.queued;
        lock.lock().unwrap_or_else(|p| p.into_inner()).count += 1;
        if lane.jobs.send(job).is_err() {
            let mut q = lock.lock().unwrap_or_else(|p| p.into_inner());
            q.count -= 1;
            return Err(format!("bulk lane {} has stopped", lane.number));
        }
        Ok(())
    }

    /// Wait until every frame queued on the lanes was written; Err: a lane failed (the
    /// session cannot go on: a frame is missing).
    pub fn drain(&self) -> Result<(), String> {
        let (lock, cv) = &*self.queued;
        let mut q = lock.lock().unwrap_or_else(|p| p.into_inner());
        while q.count > 0 {
            q = cv.wait(q).unwrap_or_else(|p| p.into_inner());
        }
        match &q.failed {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }
}

/// The lanes of a connection, made once.
pub type Slot = OnceLock<Option<Lanes>>;
