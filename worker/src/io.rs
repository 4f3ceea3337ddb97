//! Blocking frame I/O on the worker's socket.

use std::io::{IoSlice, Read, Write};
use std::sync::Mutex;

use chidori_protocol::frame::{self, Frame, FrameError, HEADER_LEN, Header};
use chidori_protocol::rkyv::util::AlignedVec;

#[derive(Debug)]
pub enum ReadError {
    /// The peer closed the connection.
    Closed,
    /// No frame within the socket's read timeout.
    Timeout,
    Io(std::io::Error),
    Frame(FrameError),
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadError::Closed => f.write_str("connection closed"),
            ReadError::Timeout => f.write_str("timed out"),
            ReadError::Io(e) => write!(f, "{e}"),
            ReadError::Frame(e) => write!(f, "{e}"),
        }
    }
}

/// Read one frame. A timeout before its first byte is [`ReadError::Timeout`]; once a frame
/// has started, the rest must follow.
pub fn read_frame(r: &mut impl Read) -> Result<Frame, ReadError> {
    let mut head = [0u8; HEADER_LEN];
    let mut got = 0;
    while got < HEADER_LEN {
        match r.read(&mut head[got..]) {
            Ok(0) if got == 0 => return Err(ReadError::Closed),
            Ok(0) => return Err(ReadError::Frame(FrameError::Truncated("header"))),
            Ok(n) => got += n,
            Err(e) if got == 0 && matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                return Err(ReadError::Timeout);
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            Err(e) => return Err(ReadError::Io(e)),
        }
    }
    let header = Header::decode(&head).map_err(ReadError::Frame)?;
    let mut archive = AlignedVec::with_capacity(header.archive_len as usize);
    archive.resize(header.archive_len as usize, 0);
    read_all(r, &mut archive, "archive")?;
    let mut bulk = vec![0u8; header.bulk_len as usize];
    read_all(r, &mut bulk, "bulk")?;
    Ok(Frame { header, archive, bulk })
}

fn read_all(r: &mut impl Read, buf: &mut [u8], what: &'static str) -> Result<(), ReadError> {
    let mut at = 0;
    while at < buf.len() {
        match r.read(&mut buf[at..]) {
            Ok(0) => return Err(ReadError::Frame(FrameError::Truncated(what))),
            Ok(n) => at += n,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::Interrupted | std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(e) => return Err(ReadError::Io(e)),
        }
    }
    Ok(())
}

/// The socket's write half, shared by the reader (heartbeats) and the executors (replies).
pub struct Writer<W: Write> {
    inner: Mutex<W>,
}

impl<W: Write> Writer<W> {
    pub fn new(w: W) -> Self {
        Writer { inner: Mutex::new(w) }
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
        let mut w = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        write_all_vectored(&mut *w, &mut slices)?;
        w.flush()
    }
}

pub fn write_all_vectored(w: &mut impl Write, mut slices: &mut [IoSlice<'_>]) -> std::io::Result<()> {
    IoSlice::advance_slices(&mut slices, 0);
    while !slices.is_empty() {
        match w.write_vectored(slices) {
            Ok(0) => return Err(std::io::Error::new(std::io::ErrorKind::WriteZero, "connection closed")),
            Ok(n) => IoSlice::advance_slices(&mut slices, n),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
