//! Large uploads sent once: chunks of host-to-device copies named by their SHA-256, so a
//! program run again (the same checkpoint, the same dataset) sends hashes instead of bytes.
//!
//! The client keeps a record of the chunks it sent each server
//! (`$XDG_CACHE_HOME/chidori/servers/<address>.content`, 32-byte hashes, newest last). At the
//! handshake it names them; the server answers which its store still has and keeps those
//! for the session ([`start`]). From then on a chunk whose hash the server kept travels as
//! its hash ([`Plan::Hash`]); any other chunk travels with its bytes, and the server adds
//! it to its store. What this session sent is added to the record at exit ([`save`]).
//!
//! Hashing costs about a second per 2 GB on one core: it is done only where the server
//! keeps content (not on loopback, where the wire is as fast as the hash), and for at most
//! the budget the server gave (what it would store for one session).

use std::collections::HashSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use sha2::{Digest, Sha256};

/// A chunk's name.
pub type Hash = [u8; 32];

/// Inputs of at least this many bytes are sent by content.
pub const MIN_CHUNK: u64 = chidori_protocol::messages::CONTENT_MIN;

/// Hashes a record keeps (2 MiB of them); the oldest go first.
const MAX_RECORD: usize = 1 << 16;

/// Hashes named at the handshake (the newest of the record).
pub const MAX_NAMED: usize = chidori_protocol::messages::MAX_CONTENT_NAMED;

/// How one chunk travels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plan {
    /// The server keeps it: send only the hash.
    Hash(Hash),
    /// Send the bytes (the server stores them); `Some`: record the hash at exit.
    Bytes(Option<Hash>),
}

/// What this session knows of the server's store.
struct Session {
    server: String,
    /// Chunks the server kept for this session.
    kept: HashSet<Hash>,
    /// Bytes this session may still hash (what the server stores per session).
    budget: u64,
    /// Chunks sent with their bytes, or named by hash, to record at exit (in order).
    used: Vec<Hash>,
}

static SESSION: Mutex<Option<Session>> = Mutex::new(None);

/// Chidori's cache directory (`$XDG_CACHE_HOME/chidori`, else `~/.cache/chidori`).
fn cache_base() -> Option<PathBuf> {
    chidori_protocol::env::cache_dir()
}

fn record_path(base: &Path, server: &str) -> PathBuf {
    base.join("servers").join(format!("{}.content", chidori_protocol::env::server_file_name(server)))
}

/// The chunks this machine sent `server` before, newest last (at most [`MAX_NAMED`]).
pub fn recorded(server: &str) -> Vec<Hash> {
    cache_base().map(|base| recorded_in(&base, server)).unwrap_or_default()
}

fn recorded_in(base: &Path, server: &str) -> Vec<Hash> {
    let bytes = std::fs::read(record_path(base, server)).unwrap_or_default();
    let all: Vec<Hash> = bytes.chunks_exact(32).filter_map(|c| c.try_into().ok()).collect();
    // Newest occurrence wins; keep order by last use.
    let mut seen = HashSet::new();
    let mut out: Vec<Hash> = all.iter().rev().filter(|h| seen.insert(**h)).take(MAX_NAMED).copied().collect();
    out.reverse();
    out
}

/// The session starts: of `named` (what the Hello listed), the server kept those marked in
/// `kept`, and will store up to `budget` bytes of new chunks (0: it keeps no content).
pub fn start(server: &str, named: &[Hash], kept: &[bool], budget: u64) {
    let kept = named.iter().zip(kept).filter(|(_, k)| **k).map(|(h, _)| *h).collect();
    *lock() = Some(Session { server: server.to_owned(), kept, budget, used: Vec::new() });
}

fn lock() -> std::sync::MutexGuard<'static, Option<Session>> {
    SESSION.lock().unwrap_or_else(|p| p.into_inner())
}

/// Whether copies are sent by content in this session at all.
pub fn active() -> bool {
    lock().as_ref().is_some_and(|s| s.budget > 0 || !s.kept.is_empty())
}

/// How `chunk`, one piece of a host-to-device copy, travels.
pub fn plan(chunk: &[u8]) -> Plan {
    let mut slot = lock();
    let Some(session) = slot.as_mut() else { return Plan::Bytes(None) };
    let len = chunk.len() as u64;
    if len < MIN_CHUNK || (session.kept.is_empty() && session.budget < len) {
        return Plan::Bytes(None);
    }
    let hash: Hash = Sha256::digest(chunk).into();
    session.used.push(hash);
    if session.kept.contains(&hash) {
        return Plan::Hash(hash);
    }
    if session.budget >= len {
        session.budget -= len;
        return Plan::Bytes(Some(hash));
    }
    session.used.pop();
    Plan::Bytes(None)
}

/// Add what this session sent or named to the record (at exit). Compacts the record when
/// it has grown past its bound.
pub fn save() {
    let Some(session) = lock().take() else { return };
    if let Some(base) = cache_base() {
        save_in(&base, session);
    }
}

fn save_in(base: &Path, session: Session) {
    if session.used.is_empty() {
        return;
    }
    let path = record_path(base, &session.server);
    if let Some(dir) = path.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    let size = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
    let result = if size as usize / 32 + session.used.len() > 2 * MAX_RECORD {
        let mut all = recorded_in(base, &session.server);
        all.extend(&session.used);
        let start = all.len().saturating_sub(MAX_RECORD);
        let tmp = path.with_extension(format!("content.{}", std::process::id()));
        std::fs::write(&tmp, all[start..].concat()).and_then(|()| std::fs::rename(&tmp, &path))
    } else {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|mut f| f.write_all(&session.used.concat()))
    };
    if let Err(e) = result {
        tracing::warn!("cannot record the content sent to the server in {}: {e}", path.display());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn save_to(dir: &Path) {
        let session = lock().take().unwrap();
        save_in(dir, session);
    }

    /// The tests share the process's one session: one test.
    #[test]
    fn chunks_the_server_kept_travel_as_hashes_and_the_record_grows() {
        let dir = std::env::temp_dir().join(format!("chidori-content-client-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let server = "gpu-box:43211";
        assert!(recorded_in(&dir, server).is_empty());
        let (a, b) = (vec![1u8; MIN_CHUNK as usize], vec![2u8; MIN_CHUNK as usize]);
        let (ha, hb): (Hash, Hash) = (Sha256::digest(&a).into(), Sha256::digest(&b).into());

        // First run: nothing kept, budget for one chunk.
        start(server, &[], &[], MIN_CHUNK);
        assert!(active());
        assert_eq!(plan(&a), Plan::Bytes(Some(ha)));
        assert_eq!(plan(&b), Plan::Bytes(None), "past the budget: bytes, not recorded");
        assert_eq!(plan(&[0u8; 100]), Plan::Bytes(None), "small copies are not hashed");
        save_to(&dir);
        assert_eq!(recorded_in(&dir, server), vec![ha]);

        // Second run: the server kept `a`.
        let named = recorded_in(&dir, server);
        start(server, &named, &[true], 0);
        assert_eq!(plan(&a), Plan::Hash(ha));
        assert_eq!(plan(&b), Plan::Bytes(None));
        save_to(&dir);
        assert_eq!(recorded_in(&dir, server), vec![ha], "named again, recorded once");

        // A server that keeps nothing.
        start(server, &named, &[false], 0);
        assert!(!active());
        assert_eq!(plan(&a), Plan::Bytes(None));
        let _ = std::fs::remove_dir_all(&dir);
        assert_ne!(ha, hb);
    }
}
