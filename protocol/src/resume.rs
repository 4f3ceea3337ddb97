//! Sessions that survive a dropped connection: what both sides keep so that, after a new
//! connection, each can send again exactly the bytes the other never received.
//!
//! After the handshake (Hello, Welcome) each direction of a resumable session is one byte
//! stream that outlives its TCP connections. The sender keeps what it wrote in a
//! [`Replay`] until the receiver acknowledges it ([`crate::frame::Kind::Ack`]: the header's
//! `seq` is the bytes received so far, sent every [`ACK_EVERY`] bytes and at heartbeats).
//! When the connection breaks, the client connects again and sends a plaintext
//! [`crate::frame::Kind::Resume`] preamble (the header's `seq` is the session id), so the
//! supervisor can hand the socket to the session's worker; inside TLS (where the server
//! has it) it then sends a `Resume` frame with a [`crate::messages::ResumeRequest`]: the
//! token, the session's secret from the Welcome and the bytes it received. The worker
//! answers [`crate::frame::Kind::Resumed`] with the bytes it received, and each side sends
//! its replay from the other's count on. Frames never notice: a frame cut in the middle
//! continues with its next byte.

use std::collections::VecDeque;
use std::io::IoSlice;
use std::time::Duration;

/// A receiver acknowledges at least this often (in bytes received).
pub const ACK_EVERY: u64 = 1 << 20;

/// How long a broken session waits for its client to come back, unless
/// [`crate::env::RESUME_GRACE_SECS`] says otherwise.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(60);

/// Bytes of the session secret handed out in the Welcome.
pub const SECRET_LEN: usize = 32;

/// The grace period: [`crate::env::RESUME_GRACE_SECS`], else [`DEFAULT_GRACE`].
pub fn grace() -> Duration {
    std::env::var(crate::env::RESUME_GRACE_SECS)
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .map_or(DEFAULT_GRACE, |s| Duration::from_secs(s.max(1)))
}

/// What a sender wrote and the receiver has not acknowledged yet, by stream offset.
#[derive(Debug, Default)]
pub struct Replay {
    /// Stream offset of `bytes[0]`: everything before it was acknowledged.
    base: u64,
    bytes: VecDeque<u8>,
}

/// The receiver claims a count this sender cannot serve: a protocol violation.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("the peer received {claimed} bytes, but this side kept bytes {kept_from}..{end}")]
pub struct Gap {
    pub claimed: u64,
    pub kept_from: u64,
    pub end: u64,
}

impl Replay {
    /// Bytes written so far (the stream offset of the next byte).
    pub fn end(&self) -> u64 {
        self.base + self.bytes.len() as u64
    }

    /// Bytes kept (written and not acknowledged).
    pub fn kept(&self) -> u64 {
        self.bytes.len() as u64
    }

    /// Keep `slices`, the next bytes of the stream.
    pub fn record(&mut self, slices: &[IoSlice<'_>]) {
        for s in slices {
            self.bytes.extend(s.iter());
        }
    }

    /// The receiver has every byte before `upto`: forget them. Stale or repeated counts
    /// change nothing; a count past what was written keeps nothing.
    pub fn acked(&mut self, upto: u64) {
        if upto <= self.base {
            return;
        }
        let n = (upto - self.base).min(self.bytes.len() as u64);
        self.bytes.drain(..n as usize);
        self.base += n;
        // Give memory back after a burst (a large copy) has been acknowledged.
        if self.bytes.capacity() > (64 << 20) && self.bytes.capacity() > 4 * self.bytes.len() {
            self.bytes.shrink_to(self.bytes.len() * 2);
        }
    }

    /// What to send again to a receiver that has `from` bytes: every byte after them.
    pub fn since(&self, from: u64) -> Result<(&[u8], &[u8]), Gap> {
        if from < self.base || from > self.end() {
            return Err(Gap { claimed: from, kept_from: self.base, end: self.end() });
        }
        let skip = (from - self.base) as usize;
        let (a, b) = self.bytes.as_slices();
        Ok(if skip <= a.len() { (&a[skip..], b) } else { (&[][..], &b[skip - a.len()..]) })
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn concat((a, b): (&[u8], &[u8])) -> Vec<u8> {
        [a, b].concat()
    }

    #[test]
    fn what_was_not_acknowledged_is_sent_again() {
        let mut r = Replay::default();
        r.record(&[IoSlice::new(b"hello "), IoSlice::new(b"world")]);
        assert_eq!(r.end(), 11);
        assert_eq!(concat(r.since(6).unwrap()), b"world");
        r.acked(6);
        assert_eq!(r.kept(), 5);
        assert_eq!(concat(r.since(6).unwrap()), b"world");
        assert_eq!(concat(r.since(11).unwrap()), b"");
        r.acked(3);
        assert_eq!(r.kept(), 5, "a stale acknowledgement changes nothing");
        assert_eq!(r.since(5), Err(Gap { claimed: 5, kept_from: 6, end: 11 }));
        assert_eq!(r.since(12), Err(Gap { claimed: 12, kept_from: 6, end: 11 }));
        r.acked(100);
        assert_eq!((r.kept(), r.end()), (0, 11));
    }

    proptest! {
        #[test]
        fn any_acknowledged_prefix_leaves_exactly_the_rest(
            writes in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..200), 0..20),
            acks in proptest::collection::vec(0u64..5000, 0..10),
            from in 0u64..5000,
        ) {
            let mut r = Replay::default();
            let mut all = Vec::new();
            let mut acked = 0u64;
            for (i, w) in writes.iter().enumerate() {
                r.record(&[IoSlice::new(w)]);
                all.extend_from_slice(w);
                if let Some(&a) = acks.get(i) {
                    let a = a.min(all.len() as u64);
                    r.acked(a);
                    acked = acked.max(a);
                }
            }
            prop_assert_eq!(r.end(), all.len() as u64);
            match r.since(from) {
                Ok(rest) => {
                    prop_assert!(from >= acked && from <= all.len() as u64);
                    prop_assert_eq!(concat(rest), all[from as usize..].to_vec());
                }
                Err(_) => prop_assert!(from < acked || from > all.len() as u64),
            }
        }
    }
}
