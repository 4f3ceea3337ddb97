//! Reading frames: from a blocking socket (plain TCP, TLS, or any `Read`) with
//! [`read_frame`], which the worker reads its session with and the client and `chidori run`
//! read the server's answer to their hello with; and from a non-blocking one with
//! [`Incremental`], which the client's I/O thread reads the server with.
//!
//! A frame's memory is reserved as its bytes arrive, not as its header announces: a header
//! that declares 256 MiB and sends nothing costs a few KiB. A frame that has started must
//! keep coming: one that makes no progress for the stall limit is an error.

use std::io::Read;
use std::time::{Duration, Instant};

use rkyv::util::AlignedVec;

use crate::frame::{Frame, FrameError, HEADER_LEN, Header};

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
                write!(f, "the peer stopped sending in the middle of a frame's {what} for {} s", after.as_secs())
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
    read_frame_reusing(r, stall, 0, &mut Vec::new())
}

/// [`read_frame`] from a peer trusted to send what its headers declare (an authenticated
/// bulk lane): the bulk goes into `spare`, a buffer of an earlier frame whose bytes it
/// overwrites, where it fits whole (memory already in place is not faulted in again; a
/// buffer that does not fit is left in `spare`, never grown or dropped), else up to
/// `reserve` bytes of it are reserved at once, so a large copy's bytes are read into place
/// without the buffer growing (and moving) as they arrive.
pub fn read_frame_reusing(
    r: &mut impl Read,
    stall: Duration,
    reserve: usize,
    spare: &mut Vec<u8>,
) -> Result<Frame, ReadError> {
    let mut head = [0u8; HEADER_LEN];
    let mut got = 0;
    let mut silent = Silence::default();
    while got < HEADER_LEN {
        match r.read(&mut head[got..]) {
            Ok(0) if got == 0 => return Err(ReadError::Closed),
            Ok(0) => return Err(ReadError::Frame(FrameError::Truncated("header"))),
            Ok(n) => {
                got += n;
                silent.progress();
            }
            Err(e) if got == 0 && is_timeout(&e) => return Err(ReadError::Timeout),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) if is_timeout(&e) => silent.check(stall, "header")?,
            Err(e) => return Err(ReadError::Io(e)),
        }
    }
    let header = Header::decode(&head).map_err(ReadError::Frame)?;
    let mut archive = AlignedVec::new();
    read_growing(r, &mut archive, header.archive_len as usize, stall, "archive")?;
    let len = header.bulk_len as usize;
    let mut bulk = if len > 0 && spare.capacity() >= len {
        // Its length kept: those bytes are written, and are not zeroed again (read_bulk).
        std::mem::take(spare)
    } else {
        Vec::with_capacity(len.min(reserve))
    };
    read_bulk(r, &mut bulk, header.bulk_len as usize, stall)?;
    Ok(Frame { header, archive, bulk })
}

/// Read `total` bytes of a frame's bulk into `into`. Memory reserved for all of it (a
/// trusted peer's frame, [`read_frame_reusing`]) is read into whole: each read is offered
/// every byte still to come, so a TLS reader opens records in place there (no copy) and a
/// socket hands over what it holds; only what never held bytes is zeroed first, once per
/// buffer. Otherwise std's `read_to_end` grows `into` as the bytes arrive (doubling) and
/// fills it without zeroing: bulk is most of what a session reads (every host-to-device
/// copy), so it is read once, not zeroed and read.
fn read_bulk(r: &mut impl Read, into: &mut Vec<u8>, total: usize, stall: Duration) -> Result<(), ReadError> {
    if total > 0 && into.capacity() >= total {
        into.resize(total, 0);
        return read_into(r, into, "bulk", stall);
    }
    into.clear();
    let mut silent = Silence::default();
    while into.len() < total {
        let before = into.len();
        let left = (total - before) as u64;
        let result = r.by_ref().take(left).read_to_end(into);
        if into.len() > before {
            silent.progress();
        }
        match result {
            Ok(_) if into.len() < total => return Err(ReadError::Frame(FrameError::Truncated("bulk"))),
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) if is_timeout(&e) => silent.check(stall, "bulk")?,
            Err(e) => return Err(ReadError::Io(e)),
        }
    }
    Ok(())
}

/// How long a frame's reads have timed out without progress. The clock starts at the first
/// timed-out read after progress, not at every read that makes some: reading the time after
/// each read was a few percent of the server's CPU for small calls (a read timed out only
/// after waiting the socket's timeout, so a stall is reported at most that much late).
#[derive(Default)]
struct Silence(Option<Instant>);

impl Silence {
    fn progress(&mut self) {
        self.0 = None;
    }

    fn check(&mut self, stall: Duration, what: &'static str) -> Result<(), ReadError> {
        let after = self.0.get_or_insert_with(Instant::now).elapsed();
        if after >= stall { Err(ReadError::Stalled { what, after }) } else { Ok(()) }
    }
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

/// Fill `buf` from `r`, a stall (no progress for `stall`) or the end an error.
fn read_into(r: &mut impl Read, buf: &mut [u8], what: &'static str, stall: Duration) -> Result<(), ReadError> {
    let mut at = 0;
    let mut silent = Silence::default();
    while at < buf.len() {
        match r.read(&mut buf[at..]) {
            Ok(0) => return Err(ReadError::Frame(FrameError::Truncated(what))),
            Ok(k) => {
                at += k;
                silent.progress();
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) if is_timeout(&e) => silent.check(stall, what)?,
            Err(e) => return Err(ReadError::Io(e)),
        }
    }
    Ok(())
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
    while done < total {
        let n = (total - done).min(done.max(FIRST_CHUNK));
        read_into(r, into.extend_zeroed(n), what, stall)?;
        done += n;
    }
    Ok(())
}

/// Frames decoded from a non-blocking socket as its bytes arrive: `buf[start..end]` holds
/// bytes received and not yet decoded. The buffer grows (doubling) only as bytes arrive,
/// whatever a header declares.
pub struct Incremental {
    buf: Vec<u8>,
    start: usize,
    end: usize,
}

impl Default for Incremental {
    fn default() -> Self {
        Incremental { buf: vec![0; 1 << 20], start: 0, end: 0 }
    }
}

impl Incremental {
    /// Read what is available: the bytes read, or None when nothing more is there now. A
    /// closed connection is an error (`UnexpectedEof`).
    pub fn fill(&mut self, stream: &mut dyn Read) -> std::io::Result<Option<usize>> {
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
        if self.end == self.buf.len() {
            if self.start > 0 {
                self.buf.copy_within(self.start..self.end, 0);
                self.end -= self.start;
                self.start = 0;
            } else {
                let grown = self.buf.len() * 2;
                self.buf.resize(grown, 0);
            }
        }
        match stream.read(&mut self.buf[self.end..]) {
            Ok(0) => Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "the connection was closed")),
            Ok(n) => {
                self.end += n;
                Ok(Some(n))
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Ok(None),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => Ok(Some(0)),
            Err(e) => Err(e),
        }
    }

    /// The next whole frame received, if one is.
    pub fn next_frame(&mut self) -> Result<Option<Frame>, FrameError> {
        let avail = &self.buf[self.start..self.end];
        let Some(total) = crate::frame::buffered_len(avail)? else { return Ok(None) };
        if avail.len() < total {
            // Keep the frame's start at the buffer's, so that the buffer [`Self::fill`]
            // grows holds it whole once it has arrived.
            if self.start > 0 && self.start + total > self.buf.len() {
                self.buf.copy_within(self.start..self.end, 0);
                self.end -= self.start;
                self.start = 0;
            }
            return Ok(None);
        }
        let (frame, used) = Frame::decode(avail)?;
        self.start += used;
        Ok(Some(frame))
    }

    /// The memory the buffer holds.
    #[cfg(test)]
    fn capacity(&self) -> usize {
        self.buf.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::{self, Kind};

    /// Frames read from `bytes` handed out `piece` bytes at a time, `WouldBlock` in between.
    fn incrementally(bytes: &[u8], piece: usize) -> (Vec<Frame>, Incremental) {
        struct Pieces<'a>(&'a [u8], usize, bool);
        impl Read for Pieces<'_> {
            fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
                self.2 = !self.2;
                if self.2 || self.0.is_empty() {
                    return Err(std::io::ErrorKind::WouldBlock.into());
                }
                let n = buf.len().min(self.1).min(self.0.len());
                buf[..n].copy_from_slice(&self.0[..n]);
                self.0 = &self.0[n..];
                Ok(n)
            }
        }
        let mut source = Pieces(bytes, piece, false);
        let mut inc = Incremental::default();
        let mut frames = Vec::new();
        for _ in 0..4 * (bytes.len() / piece + 2) {
            if inc.fill(&mut source).unwrap().is_some() {
                while let Some(f) = inc.next_frame().unwrap() {
                    frames.push(f);
                }
            }
        }
        (frames, inc)
    }

    #[test]
    fn frames_decode_incrementally_whatever_the_pieces() {
        let one = frame::to_vec(Header::new(Kind::Reply, 1, 2, 3), &[9u8; 100], &[&[7u8; 3_000_000]]).unwrap();
        let two = frame::to_vec(Header::new(Kind::Reply, 1, 2, 4), &[8u8; 16], &[]).unwrap();
        let bytes = [one.as_slice(), two.as_slice(), one.as_slice()].concat();
        for piece in [1 << 20, 65_537, 4_093] {
            let (frames, _) = incrementally(&bytes, piece);
            let seqs: Vec<u64> = frames.iter().map(|f| f.header.seq).collect();
            assert_eq!(seqs, [3, 4, 3], "pieces of {piece}");
            assert_eq!(frames[2].bulk, vec![7u8; 3_000_000]);
        }
    }

    #[test]
    fn a_header_declaring_much_reserves_only_what_arrives() {
        let mut h = Header::new(Kind::Reply, 1, 2, 3);
        h.bulk_len = frame::MAX_BULK as u32;
        let mut bytes = h.encode().to_vec();
        bytes.extend_from_slice(&[1u8; 3000]);
        let (frames, inc) = incrementally(&bytes, 1000);
        assert!(frames.is_empty());
        assert_eq!(inc.capacity(), 1 << 20, "nothing reserved for the declared bulk");
    }

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

    /// A reader that records how much each read asked for.
    struct Asked<'a> {
        bytes: &'a [u8],
        asked: Vec<usize>,
    }

    impl Read for Asked<'_> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            self.asked.push(buf.len());
            let n = buf.len().min(100_000).min(self.bytes.len());
            buf[..n].copy_from_slice(&self.bytes[..n]);
            self.bytes = &self.bytes[n..];
            Ok(n)
        }
    }

    #[test]
    fn a_reused_buffer_is_offered_whole_and_holds_only_the_new_bulk() {
        // A spare buffer longer than the frame's bulk, full of an earlier frame's bytes.
        let mut spare = vec![5u8; 1 << 20];
        let bulk: Vec<u8> = (0..300_000u32).map(|i| i as u8).collect();
        let bytes = frame::to_vec(Header::new(Kind::Call, 1, 2, 3), &[9u8; 10], &[&bulk]).unwrap();
        let mut reader = Asked { bytes: &bytes, asked: Vec::new() };
        let frame = read_frame_reusing(&mut reader, Duration::from_secs(1), 1 << 20, &mut spare).unwrap();
        assert!(frame.bulk == bulk, "the bulk differs");
        assert_eq!(spare.capacity(), 0, "the spare buffer was taken");
        // Each read of the bulk asked for all that was still to come: 300,000, then 200,000
        // and 100,000 after reads of 100,000 each.
        let bulk_reads: Vec<usize> = reader.asked.iter().rev().take(3).rev().copied().collect();
        assert_eq!(bulk_reads, [300_000, 200_000, 100_000], "{:?}", reader.asked);
        // Without a buffer of its own (a peer not trusted), memory grows as bytes arrive.
        let mut reader = Asked { bytes: &bytes, asked: Vec::new() };
        let frame = read_frame_reusing(&mut reader, Duration::from_secs(1), 0, &mut Vec::new()).unwrap();
        assert!(frame.bulk == bulk);
        assert!(reader.asked.iter().all(|&n| n < 300_000), "{:?}", reader.asked);
    }

    #[test]
    fn a_bulk_cut_short_is_truncated() {
        let mut bytes = frame::to_vec(Header::new(Kind::Call, 1, 2, 3), &[9u8; 10], &[&[7u8; 300_000]]).unwrap();
        bytes.truncate(bytes.len() - 1);
        let err = read_frame(&mut bytes.as_slice(), Duration::from_secs(1)).unwrap_err();
        assert!(matches!(err, ReadError::Frame(FrameError::Truncated("bulk"))), "{err}");
    }
}
