//! TLS 1.3 records after the handshake, sealed and opened here with the keys rustls agreed
//! (RFC 8446 §5). rustls's kernel-connection API, made for kernel TLS, hands over the
//! traffic keys and sequence numbers once the handshake is done and keeps computing the
//! next keys for a key update; the bytes themselves never pass through rustls's buffers.
//!
//! Why: rustls's buffered connection copies a received record three times (socket bytes
//! into its deframer in 4 KiB steps, the decrypted record into its plaintext queue, the
//! queue to the caller) and allocates one buffer per record sent. On the development
//! machine its buffered path encrypted at 1.2–3.5 GB/s and decrypted at 3.4 GB/s where
//! the same AES-256-GCM sealing records in one buffer ran at 6.2 and opening them in place
//! at 8.9 (one core each, in memory; ring's AEAD alone: 8.7). A bulk lane is bound by
//! that, not by its TCP stream.
//!
//! What is kept from TLS 1.3: the record format (outer type application_data, version
//! 0x0303, inner content type, padding allowed on receipt), the per-record nonce (the IV
//! XOR the sequence number), the record header as associated data, key updates in both
//! directions (sent before a key reaches its suite's confidentiality limit, and whenever
//! the peer asks), close_notify, and session tickets handed to rustls. Anything else after
//! the handshake (a renegotiation attempt, an unknown handshake message, a record that
//! fails authentication, one over the size limit) ends the connection with an error.

use std::io::IoSlice;
use std::sync::Mutex;

use ring::aead::{self, Aad, LessSafeKey, Nonce, UnboundKey};
use rustls::ConnectionTrafficSecrets;
use rustls::client::ClientConnectionData;
use rustls::kernel::KernelConnection;
use rustls::server::ServerConnectionData;

/// The largest plaintext of a record (2^14).
pub const MAX_PLAINTEXT: usize = 16 << 10;

/// The largest ciphertext a peer may send in one record (2^14 + 256).
const MAX_CIPHERTEXT: usize = MAX_PLAINTEXT + 256;

/// The record header: outer type, legacy version, length.
pub const HEADER: usize = 5;

/// The AEAD tag every suite here appends.
const TAG: usize = 16;

const APPLICATION_DATA: u8 = 23;
const HANDSHAKE: u8 = 22;
const ALERT: u8 = 21;

const KEY_UPDATE: u8 = 24;
const NEW_SESSION_TICKET: u8 = 4;
const CLOSE_NOTIFY: u8 = 0;

fn invalid(what: String) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, what)
}

/// One direction's key, IV and record sequence number.
pub struct Keys {
    key: LessSafeKey,
    iv: [u8; 12],
    pub(crate) seq: u64,
}

impl Keys {
    pub fn new(seq: u64, secrets: ConnectionTrafficSecrets) -> std::io::Result<Keys> {
        let (alg, key, iv) = match &secrets {
            ConnectionTrafficSecrets::Aes128Gcm { key, iv } => (&aead::AES_128_GCM, key, iv),
            ConnectionTrafficSecrets::Aes256Gcm { key, iv } => (&aead::AES_256_GCM, key, iv),
            ConnectionTrafficSecrets::Chacha20Poly1305 { key, iv } => (&aead::CHACHA20_POLY1305, key, iv),
            _ => return Err(invalid("the TLS peer agreed a cipher suite this side cannot run".into())),
        };
        let key = UnboundKey::new(alg, key.as_ref()).map_err(|_| invalid("a TLS key of the wrong length".into()))?;
        let iv: [u8; 12] = iv.as_ref().try_into().map_err(|_| invalid("a TLS IV of the wrong length".into()))?;
        Ok(Keys { key: LessSafeKey::new(key), iv, seq })
    }

    /// The next record's nonce (RFC 8446 §5.3); a sequence number is never used twice.
    fn next_nonce(&mut self) -> std::io::Result<Nonce> {
        let mut nonce = self.iv;
        for (n, s) in nonce[4..].iter_mut().zip(self.seq.to_be_bytes()) {
            *n ^= s;
        }
        self.seq = self.seq.checked_add(1).ok_or_else(|| invalid("TLS record sequence numbers ran out".into()))?;
        Ok(Nonce::assume_unique_for_key(nonce))
    }
}

/// What rustls keeps after the handshake: the next traffic secrets, and session tickets.
pub enum Kernel {
    Client(KernelConnection<ClientConnectionData>),
    Server(KernelConnection<ServerConnectionData>),
}

impl Kernel {
    pub(crate) fn update_tx(&mut self) -> Result<(u64, ConnectionTrafficSecrets), rustls::Error> {
        match self {
            Kernel::Client(k) => k.update_tx_secret(),
            Kernel::Server(k) => k.update_tx_secret(),
        }
    }

    fn update_rx(&mut self) -> Result<(u64, ConnectionTrafficSecrets), rustls::Error> {
        match self {
            Kernel::Client(k) => k.update_rx_secret(),
            Kernel::Server(k) => k.update_rx_secret(),
        }
    }

    /// Records one key may seal: the suite's confidentiality limit (RFC 8446 §5.5).
    pub fn key_limit(&self) -> u64 {
        let suite = match self {
            Kernel::Client(k) => k.negotiated_cipher_suite(),
            Kernel::Server(k) => k.negotiated_cipher_suite(),
        };
        // Only TLS 1.3 suites are offered (`VERSIONS`).
        #[allow(unreachable_patterns)]
        match suite {
            rustls::SupportedCipherSuite::Tls13(s) => s.common.confidentiality_limit,
            _ => 1 << 23,
        }
    }
}

/// The sending direction: keys, and the records of the frame being sent.
pub struct Sender {
    pub keys: Keys,
    /// Records a key seals before it is updated.
    pub limit: u64,
    /// Records ready to be written.
    pub out: Vec<u8>,
    /// A write failed part-way: the peer would see a gap in the records, so nothing more
    /// is sent.
    pub broken: bool,
}

impl Sender {
    /// Seal `slices` as records of up to [`MAX_PLAINTEXT`] bytes each, taken across slice
    /// boundaries, passing every `flush_at` bytes of records to `write`. A key at its limit,
    /// or one the peer asked to replace (`update`), is updated first.
    pub fn seal_all(
        &mut self,
        kernel: &Mutex<Kernel>,
        update: &std::sync::atomic::AtomicBool,
        slices: &[IoSlice<'_>],
        flush_at: usize,
        write: &mut dyn FnMut(&[u8]) -> std::io::Result<()>,
    ) -> std::io::Result<()> {
        if self.broken {
            return Err(std::io::Error::new(
                std::io::ErrorKind::BrokenPipe,
                "an earlier write on this TLS connection failed part-way",
            ));
        }
        let mut pieces = slices.iter().map(|s| &s[..]).filter(|s| !s.is_empty());
        let mut current: &[u8] = &[];
        loop {
            if current.is_empty() {
                match pieces.next() {
                    Some(p) => current = p,
                    None => break,
                }
            }
            self.update_if_due(kernel, update)?;
            // One record: header, plaintext from as many slices as fit, inner type, tag.
            let start = self.out.len();
            self.out.extend_from_slice(&[0; HEADER]);
            let mut room = MAX_PLAINTEXT;
            loop {
                let n = current.len().min(room);
                self.out.extend_from_slice(&current[..n]);
                current = &current[n..];
                room -= n;
                if room == 0 {
                    break;
                }
                // Room left: this slice is used up.
                match pieces.next() {
                    Some(p) => current = p,
                    None => break,
                }
            }
            self.seal_record(start, APPLICATION_DATA)?;
            if self.out.len() >= flush_at {
                write(&self.out)?;
                self.out.clear();
            }
        }
        if !self.out.is_empty() {
            write(&self.out)?;
            self.out.clear();
        }
        Ok(())
    }

    /// Seal one record of `body` of content type `kind` (an alert, a handshake message).
    pub fn seal_message(&mut self, kind: u8, body: &[u8]) -> std::io::Result<()> {
        let start = self.out.len();
        self.out.extend_from_slice(&[0; HEADER]);
        self.out.extend_from_slice(body);
        self.seal_record(start, kind)
    }

    /// The close_notify alert, sealed into the records to write.
    pub fn seal_close_notify(&mut self) -> std::io::Result<()> {
        self.seal_message(ALERT, &[1, CLOSE_NOTIFY])
    }

    /// Seal the plaintext at `out[start + HEADER..]` in place as one record of `kind`.
    fn seal_record(&mut self, start: usize, kind: u8) -> std::io::Result<()> {
        self.out.push(kind);
        let len = (self.out.len() - start - HEADER + TAG) as u16;
        let [hi, lo] = len.to_be_bytes();
        let header = [APPLICATION_DATA, 3, 3, hi, lo];
        self.out[start..start + HEADER].copy_from_slice(&header);
        let nonce = self.keys.next_nonce()?;
        let tag = self
            .keys
            .key
            .seal_in_place_separate_tag(nonce, Aad::from(header), &mut self.out[start + HEADER..])
            .map_err(|_| invalid("sealing a TLS record failed".into()))?;
        self.out.extend_from_slice(tag.as_ref());
        Ok(())
    }

    /// Send a KeyUpdate (not asking the peer for one) under the old key and take the next.
    fn update_if_due(&mut self, kernel: &Mutex<Kernel>, asked: &std::sync::atomic::AtomicBool) -> std::io::Result<()> {
        let due = self.keys.seq.saturating_add(1) >= self.limit;
        if !due && !asked.swap(false, std::sync::atomic::Ordering::AcqRel) {
            return Ok(());
        }
        self.seal_message(HANDSHAKE, &[KEY_UPDATE, 0, 0, 1, 0])?;
        let (seq, secrets) = lock(kernel).update_tx().map_err(|e| invalid(format!("TLS key update: {e}")))?;
        self.keys = Keys::new(seq, secrets)?;
        Ok(())
    }
}

/// What an opened record held.
pub enum Opened {
    /// Application data at `buf[range]`.
    Data(std::ops::Range<usize>),
    /// A key update, a session ticket: nothing for the reader.
    Nothing,
    /// close_notify: the peer sends no more.
    Closed,
}

/// The length of the whole record at the front of `buf`, once its header has arrived
/// (an error for a record no TLS 1.3 peer sends after the handshake).
pub fn record_len(buf: &[u8]) -> std::io::Result<Option<usize>> {
    if buf.len() < HEADER {
        return Ok(None);
    }
    if buf[0] != APPLICATION_DATA || buf[1] != 3 {
        return Err(invalid(format!(
            "the TLS peer sent a record of type {} (version {}.{}) after the handshake",
            buf[0], buf[1], buf[2]
        )));
    }
    let len = u16::from_be_bytes([buf[3], buf[4]]) as usize;
    if !(TAG + 1..=MAX_CIPHERTEXT).contains(&len) {
        return Err(invalid(format!("the TLS peer sent a record of {len} bytes")));
    }
    Ok(Some(HEADER + len))
}

/// Open the whole record `buf[start..start + len]` with `keys` (`len` from
/// [`record_len`]), its plaintext written from `buf[to]` on (`to` at most `start +
/// HEADER`: in place, or moved towards the front in the same pass, which closes the gaps
/// the headers and tags of earlier records left). A key update from the peer replaces
/// `keys`; one that asks for ours sets `update` for the sender.
pub fn open(
    keys: &mut Keys,
    kernel: &Mutex<Kernel>,
    update: &std::sync::atomic::AtomicBool,
    buf: &mut [u8],
    to: usize,
    start: usize,
    len: usize,
) -> std::io::Result<Opened> {
    let short = || invalid("a short record".into());
    let header: [u8; HEADER] = buf.get(start..start + HEADER).ok_or_else(short)?.try_into().map_err(|_| short())?;
    let shift = (start + HEADER).checked_sub(to).ok_or_else(short)?;
    let in_out = buf.get_mut(to..start + len).ok_or_else(short)?;
    let nonce = keys.next_nonce()?;
    let plain = keys
        .key
        .open_within(nonce, Aad::from(header), in_out, shift..)
        .map_err(|_| invalid("a TLS record failed authentication (bad_record_mac)".into()))?;
    // The inner content type is the last byte that is not padding.
    let Some(end) = plain.iter().rposition(|b| *b != 0) else {
        return Err(invalid("a TLS record without a content type".into()));
    };
    let kind = plain[end];
    let content = &plain[..end];
    match kind {
        APPLICATION_DATA => Ok(Opened::Data(to..to + end)),
        ALERT => match content {
            [_, CLOSE_NOTIFY] => Ok(Opened::Closed),
            [_, desc] => Err(std::io::Error::new(
                std::io::ErrorKind::ConnectionAborted,
                format!("the TLS peer sent alert {desc}"),
            )),
            _ => Err(invalid("a malformed TLS alert".into())),
        },
        HANDSHAKE => {
            let mut messages = content;
            while !messages.is_empty() {
                let [kind, a, b, c, rest @ ..] = messages else {
                    return Err(invalid("a truncated TLS handshake message".into()));
                };
                let n = u32::from_be_bytes([0, *a, *b, *c]) as usize;
                if rest.len() < n {
                    return Err(invalid("a truncated TLS handshake message".into()));
                }
                let (body, after) = rest.split_at(n);
                match (*kind, body, &mut *lock(kernel)) {
                    (KEY_UPDATE, [asked @ (0 | 1)], k) => {
                        if !after.is_empty() {
                            return Err(invalid("a TLS key update not at the end of its record".into()));
                        }
                        let (seq, secrets) = k.update_rx().map_err(|e| invalid(format!("TLS key update: {e}")))?;
                        *keys = Keys::new(seq, secrets)?;
                        if *asked == 1 {
                            update.store(true, std::sync::atomic::Ordering::Release);
                        }
                    }
                    (NEW_SESSION_TICKET, body, Kernel::Client(k)) => {
                        k.handle_new_session_ticket(body).map_err(|e| invalid(format!("a TLS session ticket: {e}")))?;
                    }
                    (kind, _, _) => {
                        return Err(invalid(format!("the TLS peer sent handshake message {kind} after the handshake")));
                    }
                }
                messages = after;
            }
            Ok(Opened::Nothing)
        }
        other => Err(invalid(format!("a TLS record of inner type {other}"))),
    }
}

pub fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
