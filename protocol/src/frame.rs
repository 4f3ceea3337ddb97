//! The fixed frame header and frame assembly/decoding.

use rkyv::util::AlignedVec;

use crate::PROTOCOL_VERSION;

/// "CHDR" little-endian: the first four bytes of every frame.
pub const MAGIC: u32 = u32::from_le_bytes(*b"CHDR");

/// Largest archive a frame may carry. Archives hold scalars and lengths; data travels in bulk.
pub const MAX_ARCHIVE: u32 = 16 << 20;

/// Largest bulk section of one frame. Larger copies are split into several calls.
pub const MAX_BULK: u64 = 256 << 20;

pub const HEADER_LEN: usize = 32;

/// Message kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Kind {
    /// Client → server, first frame: [`crate::messages::Hello`].
    Hello = 1,
    /// Server → client: [`crate::messages::Welcome`].
    Welcome = 2,
    /// Server → client, then close: [`crate::messages::Refuse`].
    Refuse = 3,
    /// Client → server: [`crate::messages::Call`] + input bytes.
    Call = 4,
    /// Server → client: [`crate::messages::Reply`] + output bytes.
    Reply = 5,
    /// Either way; answered by [`Kind::Pong`]. No archive.
    Ping = 6,
    Pong = 7,
    /// Server → client: an asynchronous call failed ([`crate::messages::AsyncError`]).
    AsyncError = 8,
    /// Server → client: run host callback `call`-th ([`crate::messages::HostCallback`]).
    HostCallback = 9,
    /// Client → server: the host callback returned.
    HostCallbackDone = 10,
    /// Either way, then close: [`crate::messages::Goodbye`].
    Goodbye = 11,
    /// Client → server: a kernel launch ([`crate::messages::Launch`] + packed parameters).
    /// No reply; a failure comes back as an AsyncError.
    Launch = 12,
    /// Client → server: a Chidori request ([`crate::messages::Service`]), answered by
    /// [`Kind::ServiceReply`].
    Service = 13,
    ServiceReply = 14,
    /// Server → client, while a long request runs: [`crate::messages::Progress`] + bytes,
    /// with the request's `seq`.
    Progress = 15,
    /// Either way, in a resumable session: `seq` is the bytes of the stream received so far
    /// (the sender may forget them). No archive.
    Ack = 16,
    /// Client → server, reconnecting a resumable session ([`crate::resume`]): first a
    /// plaintext preamble whose `seq` is the session id (no archive), read by the
    /// supervisor; then, inside TLS where there is TLS, one with a
    /// [`crate::messages::ResumeRequest`].
    Resume = 17,
    /// Server → client: the session is resumed; `seq` is the bytes it received. No archive.
    Resumed = 18,
    /// Server → client, before a reply: what the GPU printed (a kernel's `printf`), for the
    /// program's standard output. The bytes are the bulk; no archive.
    Output = 19,
    /// Client → server, in the call order: the next call of thread `thread` (sequence
    /// number `seq`) is the next frame on bulk lane `call` ([`crate::messages::ResumeRequest`]
    /// with a lane), read from there in its place. No archive.
    Lane = 20,
    /// Server → client: the image of a module the client loaded by name
    /// (`Service::LoadModuleNamed`) is not in the server's module cache; the client sends it
    /// ([`Kind::ModuleImage`]). Archive: [`crate::messages::ModuleImage`].
    NeedModule = 21,
    /// Client → server, answering [`Kind::NeedModule`], outside the call order: the image is
    /// the bulk (none where the client cannot tell it); one no load waits for any more is
    /// dropped. Archive: [`crate::messages::ModuleImage`].
    ModuleImage = 22,
}

impl Kind {
    pub fn from_u8(v: u8) -> Option<Kind> {
        Some(match v {
            1 => Kind::Hello,
            2 => Kind::Welcome,
            3 => Kind::Refuse,
            4 => Kind::Call,
            5 => Kind::Reply,
            6 => Kind::Ping,
            7 => Kind::Pong,
            8 => Kind::AsyncError,
            9 => Kind::HostCallback,
            10 => Kind::HostCallbackDone,
            11 => Kind::Goodbye,
            12 => Kind::Launch,
            13 => Kind::Service,
            14 => Kind::ServiceReply,
            15 => Kind::Progress,
            16 => Kind::Ack,
            17 => Kind::Resume,
            18 => Kind::Resumed,
            19 => Kind::Output,
            20 => Kind::Lane,
            21 => Kind::NeedModule,
            22 => Kind::ModuleImage,
            _ => return None,
        })
    }
}

/// The fixed header, little-endian on the wire:
/// `magic u32 | version u16 | kind u8 | flags u8 | call u32 | thread u32 | seq u64 | archive u32 | bulk u32`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub version: u16,
    pub kind: Kind,
    /// Bits of [`OUTPUTS_COMPRESSED`]; others are zero.
    pub flags: u8,
    /// Wire id of the call descriptor (Call, Reply, AsyncError), else 0.
    pub call: u32,
    /// The client thread the frame belongs to.
    pub thread: u32,
    /// Client-assigned sequence number; a Reply repeats its Call's.
    pub seq: u64,
    pub archive_len: u32,
    pub bulk_len: u32,
}

/// Header flag of a Call: its large outputs may come back compressed (a Reply `lens` entry
/// with [`crate::messages::COMPRESSED_FLAG`]); the client asks where the link is slow.
pub const OUTPUTS_COMPRESSED: u8 = 1;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FrameError {
    #[error("not a Chidori frame (magic {0:#010x}); is something else listening on this port?")]
    BadMagic(u32),
    #[error(
        "protocol version {got}, this side speaks {PROTOCOL_VERSION}: client and server must be the same Chidori release"
    )]
    Version { got: u16 },
    #[error("unknown message kind {0}")]
    UnknownKind(u8),
    #[error("archive of {0} bytes exceeds the limit of {MAX_ARCHIVE}")]
    ArchiveTooLarge(u32),
    #[error("bulk section of {0} bytes exceeds the limit of {MAX_BULK}")]
    BulkTooLarge(u32),
    #[error("truncated frame: {0}")]
    Truncated(&'static str),
    #[error("invalid {what} archive: {reason}")]
    BadArchive { what: &'static str, reason: String },
}

impl Header {
    pub fn new(kind: Kind, call: u32, thread: u32, seq: u64) -> Header {
        Header { version: PROTOCOL_VERSION, kind, flags: 0, call, thread, seq, archive_len: 0, bulk_len: 0 }
    }

    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        b[4..6].copy_from_slice(&self.version.to_le_bytes());
        b[6] = self.kind as u8;
        b[7] = self.flags;
        b[8..12].copy_from_slice(&self.call.to_le_bytes());
        b[12..16].copy_from_slice(&self.thread.to_le_bytes());
        b[16..24].copy_from_slice(&self.seq.to_le_bytes());
        b[24..28].copy_from_slice(&self.archive_len.to_le_bytes());
        b[28..32].copy_from_slice(&self.bulk_len.to_le_bytes());
        b
    }

    /// Decode and validate a header. The version is checked before the kind so that a peer
    /// of another release gets the version error, not a confusing one.
    pub fn decode(b: &[u8; HEADER_LEN]) -> Result<Header, FrameError> {
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let magic = u32_at(0);
        if magic != MAGIC {
            return Err(FrameError::BadMagic(magic));
        }
        let version = u16::from_le_bytes([b[4], b[5]]);
        if version != PROTOCOL_VERSION {
            return Err(FrameError::Version { got: version });
        }
        let kind = Kind::from_u8(b[6]).ok_or(FrameError::UnknownKind(b[6]))?;
        let archive_len = u32_at(24);
        if archive_len > MAX_ARCHIVE {
            return Err(FrameError::ArchiveTooLarge(archive_len));
        }
        let bulk_len = u32_at(28);
        if u64::from(bulk_len) > MAX_BULK {
            return Err(FrameError::BulkTooLarge(bulk_len));
        }
        Ok(Header {
            version,
            kind,
            flags: b[7],
            call: u32_at(8),
            thread: u32_at(12),
            seq: u64::from_le_bytes(b[16..24].try_into().expect("8 bytes")),
            archive_len,
            bulk_len,
        })
    }
}

/// A received frame: header, the archive copied into aligned memory, and the bulk bytes.
#[derive(Debug)]
pub struct Frame {
    pub header: Header,
    pub archive: AlignedVec,
    pub bulk: Vec<u8>,
}

/// The length of the whole frame that `bytes` begins with, once its header is there (None:
/// fewer bytes than a header): what a reader that buffers more than one frame waits for.
pub fn buffered_len(bytes: &[u8]) -> Result<Option<usize>, FrameError> {
    let Some(head) = bytes.first_chunk::<HEADER_LEN>() else { return Ok(None) };
    let h = Header::decode(head)?;
    Ok(Some(HEADER_LEN + h.archive_len as usize + h.bulk_len as usize))
}

impl Frame {
    /// Decode one complete frame from a byte slice (used by tests and the fuzz target);
    /// returns the frame and the bytes consumed.
    pub fn decode(bytes: &[u8]) -> Result<(Frame, usize), FrameError> {
        let head: &[u8; HEADER_LEN] =
            bytes.get(..HEADER_LEN).and_then(|h| h.try_into().ok()).ok_or(FrameError::Truncated("header"))?;
        let header = Header::decode(head)?;
        let a_end = HEADER_LEN + header.archive_len as usize;
        let b_end = a_end + header.bulk_len as usize;
        let archive_bytes = bytes.get(HEADER_LEN..a_end).ok_or(FrameError::Truncated("archive"))?;
        let bulk = bytes.get(a_end..b_end).ok_or(FrameError::Truncated("bulk"))?.to_vec();
        let mut archive = AlignedVec::with_capacity(archive_bytes.len());
        archive.extend_from_slice(archive_bytes);
        Ok((Frame { header, archive, bulk }, b_end))
    }

    /// Bulk bytes of `lengths` consecutive buffers.
    pub fn split_bulk(&self, lengths: impl IntoIterator<Item = u64>) -> Result<Vec<&[u8]>, FrameError> {
        let mut out = Vec::new();
        let mut at = 0usize;
        for len in lengths {
            let len = usize::try_from(len).map_err(|_| FrameError::Truncated("bulk"))?;
            let end = at.checked_add(len).ok_or(FrameError::Truncated("bulk"))?;
            out.push(self.bulk.get(at..end).ok_or(FrameError::Truncated("bulk"))?);
            at = end;
        }
        if at != self.bulk.len() {
            return Err(FrameError::Truncated("bulk length does not match the buffers"));
        }
        Ok(out)
    }
}

/// Assemble a frame: header (lengths filled in), archive, and bulk parts, as separate
/// slices for one vectored write.
pub fn assemble(mut header: Header, archive: &[u8], bulk_len: usize) -> Result<[u8; HEADER_LEN], FrameError> {
    header.archive_len = u32::try_from(archive.len()).map_err(|_| FrameError::ArchiveTooLarge(u32::MAX))?;
    if header.archive_len > MAX_ARCHIVE {
        return Err(FrameError::ArchiveTooLarge(header.archive_len));
    }
    header.bulk_len = u32::try_from(bulk_len).map_err(|_| FrameError::BulkTooLarge(u32::MAX))?;
    if u64::from(header.bulk_len) > MAX_BULK {
        return Err(FrameError::BulkTooLarge(header.bulk_len));
    }
    Ok(header.encode())
}

/// One contiguous frame (for small messages and tests).
pub fn to_vec(header: Header, archive: &[u8], bulk: &[&[u8]]) -> Result<Vec<u8>, FrameError> {
    let total: usize = bulk.iter().map(|b| b.len()).sum();
    let head = assemble(header, archive, total)?;
    let mut out = Vec::with_capacity(HEADER_LEN + archive.len() + total);
    out.extend_from_slice(&head);
    out.extend_from_slice(archive);
    for b in bulk {
        out.extend_from_slice(b);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn kinds() -> impl Strategy<Value = Kind> {
        (1u8..=20).prop_map(|k| Kind::from_u8(k).unwrap())
    }

    proptest! {
        #[test]
        fn headers_round_trip(kind in kinds(), flags: u8, call: u32, thread: u32, seq: u64,
                              archive in 0u32..=MAX_ARCHIVE, bulk in 0u32..=(MAX_BULK as u32)) {
            let h = Header { version: PROTOCOL_VERSION, kind, flags, call, thread, seq, archive_len: archive, bulk_len: bulk };
            prop_assert_eq!(Header::decode(&h.encode()), Ok(h));
        }

        #[test]
        fn frames_round_trip(kind in kinds(), seq: u64, archive in proptest::collection::vec(any::<u8>(), 0..512),
                             bulk in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..300), 0..4)) {
            let parts: Vec<&[u8]> = bulk.iter().map(|b| b.as_slice()).collect();
            let bytes = to_vec(Header::new(kind, 7, 3, seq), &archive, &parts).unwrap();
            let (frame, used) = Frame::decode(&bytes).unwrap();
            prop_assert_eq!(used, bytes.len());
            prop_assert_eq!(&frame.archive[..], &archive[..]);
            let split = frame.split_bulk(bulk.iter().map(|b| b.len() as u64)).unwrap();
            prop_assert_eq!(split, parts);
        }

        #[test]
        fn truncated_frames_are_errors(archive in proptest::collection::vec(any::<u8>(), 1..64), cut in 0usize..1000) {
            let bytes = to_vec(Header::new(Kind::Call, 1, 1, 1), &archive, &[&[1, 2, 3]]).unwrap();
            let cut = cut % bytes.len();
            prop_assert!(Frame::decode(&bytes[..cut]).is_err());
        }

        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = Frame::decode(&bytes);
        }
    }

    #[test]
    fn bad_headers_say_what_is_wrong() {
        let mut b = Header::new(Kind::Ping, 0, 0, 0).encode();
        b[4] = 99;
        assert_eq!(Header::decode(&b), Err(FrameError::Version { got: 99 }));
        let mut b = Header::new(Kind::Ping, 0, 0, 0).encode();
        b[0] = b'X';
        assert!(matches!(Header::decode(&b), Err(FrameError::BadMagic(_))));
        let mut b = Header::new(Kind::Ping, 0, 0, 0).encode();
        b[6] = 200;
        assert_eq!(Header::decode(&b), Err(FrameError::UnknownKind(200)));
        let mut h = Header::new(Kind::Call, 0, 0, 0);
        h.archive_len = MAX_ARCHIVE + 1;
        assert_eq!(Header::decode(&h.encode()), Err(FrameError::ArchiveTooLarge(MAX_ARCHIVE + 1)));
        let mut h = Header::new(Kind::Call, 0, 0, 0);
        h.bulk_len = u32::MAX;
        assert_eq!(Header::decode(&h.encode()), Err(FrameError::BulkTooLarge(u32::MAX)));
    }
}
