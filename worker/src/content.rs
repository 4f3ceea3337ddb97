//! The server's store of uploaded content: large host-to-device copies kept on disk by their
//! SHA-256, so that a program run again (the same checkpoint, the same dataset) sends each
//! chunk's hash instead of its bytes.
//!
//! At its handshake a client names the chunks it sent this server before (its own record,
//! `interposer/src/content.rs`); the session pins those the store still has ([`Store::pin`]:
//! an open file stays readable even when eviction unlinks it), and the client sends only
//! the hashes of pinned chunks for the rest of the session. Chunks sent with their bytes
//! are added after the copy ([`Store::put`], on a thread of its own). The key is a
//! cryptographic hash computed by the server from the bytes it received, so one client
//! cannot plant content under another's hash. Size-bounded; the least recently used
//! chunks go first.

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use sha2::{Digest, Sha256};

/// A chunk's name: the SHA-256 of its bytes.
pub type Hash = [u8; 32];

pub fn sha256(bytes: &[u8]) -> Hash {
    Sha256::digest(bytes).into()
}

/// `$XDG_CACHE_HOME/chidori/content`, else `~/.cache/chidori/content`.
pub fn default_dir() -> PathBuf {
    crate::cache::default_dir().with_file_name("content")
}

/// The store: a directory of chunks named by their hash, at most `max_bytes` in all.
#[derive(Clone)]
pub struct Store {
    dir: PathBuf,
    max_bytes: u64,
}

/// Chunks one session may name by hash: open files, readable until the session ends even
/// if the store evicts them meanwhile.
#[derive(Default)]
pub struct Pinned {
    files: HashMap<Hash, (File, u64)>,
}

impl Pinned {
    /// Whether the session may send `hash` without its bytes.
    pub fn has(&self, hash: &Hash) -> bool {
        self.files.contains_key(hash)
    }

    /// The bytes of chunk `hash`, checked against it: None if the session did not pin it,
    /// its length is not `len`, or the file no longer holds those bytes.
    pub fn read(&self, hash: &Hash, len: usize) -> Option<Vec<u8>> {
        let (file, size) = self.files.get(hash)?;
        if *size != len as u64 {
            return None;
        }
        let mut bytes = vec![0u8; len];
        file.read_exact_at(&mut bytes, 0).ok()?;
        (sha256(&bytes) == *hash).then_some(bytes)
    }

    pub fn len(&self) -> usize {
        self.files.len()
    }

    pub fn is_empty(&self) -> bool {
        self.files.is_empty()
    }
}

fn hex(hash: &Hash) -> String {
    hash.iter().map(|b| format!("{b:02x}")).collect()
}

impl Store {
    pub fn new(dir: PathBuf, max_bytes: u64) -> Store {
        Store { dir, max_bytes }
    }

    fn path(&self, hash: &Hash) -> PathBuf {
        self.dir.join(hex(hash))
    }

    /// Pin the chunks of `hashes` the store has (marking them recently used): which are
    /// there, in order, and the pins.
    pub fn pin(&self, hashes: &[Hash]) -> (Vec<bool>, Pinned) {
        let mut pinned = Pinned::default();
        let present = hashes
            .iter()
            .map(|hash| {
                let path = self.path(hash);
                let Ok(file) = File::open(&path) else { return false };
                let Ok(meta) = file.metadata() else { return false };
                touch(&path);
                pinned.files.insert(*hash, (file, meta.len()));
                true
            })
            .collect();
        (present, pinned)
    }

    /// Keep `bytes` (whose hash the caller computed from them) for later sessions.
    pub fn put(&self, hash: &Hash, bytes: &[u8]) {
        if bytes.len() as u64 > self.max_bytes || std::fs::create_dir_all(&self.dir).is_err() {
            return;
        }
        let path = self.path(hash);
        if path.exists() {
            touch(&path);
            return;
        }
        let tmp = self.dir.join(format!(".{}.{}", hex(hash), std::process::id()));
        if std::fs::write(&tmp, bytes).is_ok() && std::fs::rename(&tmp, &path).is_ok() {
            self.evict();
        } else {
            let _ = std::fs::remove_file(&tmp);
        }
    }

    /// Keep `bytes` from a thread of its own (hashing and writing do not hold up the copy).
    pub fn put_later(self: &Arc<Self>, bytes: Vec<u8>) {
        let store = self.clone();
        let _ = std::thread::Builder::new().name("chidori-content".into()).spawn(move || {
            let hash = sha256(&bytes);
            store.put(&hash, &bytes);
        });
    }

    fn evict(&self) {
        let Ok(entries) = std::fs::read_dir(&self.dir) else { return };
        let mut files: Vec<(std::time::SystemTime, u64, PathBuf)> = entries
            .filter_map(|e| e.ok())
            .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
            .filter_map(|e| {
                let m = e.metadata().ok()?;
                Some((m.modified().ok()?, m.len(), e.path()))
            })
            .collect();
        let mut total: u64 = files.iter().map(|f| f.1).sum();
        files.sort();
        for (_, len, path) in files {
            if total <= self.max_bytes {
                break;
            }
            if std::fs::remove_file(&path).is_ok() {
                total -= len;
            }
        }
    }
}

/// Mark a file recently used.
fn touch(path: &Path) {
    let _ = File::options().append(true).open(path).and_then(|f| f.set_modified(std::time::SystemTime::now()));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store(name: &str, max: u64) -> (Store, PathBuf) {
        let dir = std::env::temp_dir().join(format!("chidori-content-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        (Store::new(dir.clone(), max), dir)
    }

    #[test]
    fn chunks_are_found_by_hash_and_pins_outlive_eviction() {
        let (store, dir) = store("pins", 2500);
        let (a, b, c) = (vec![1u8; 1000], vec![2u8; 1000], vec![3u8; 1000]);
        store.put(&sha256(&a), &a);
        std::thread::sleep(std::time::Duration::from_millis(20));
        store.put(&sha256(&b), &b);
        let (present, pinned) = store.pin(&[sha256(&a), sha256(&c), sha256(&b)]);
        assert_eq!(present, [true, false, true]);
        assert!(pinned.has(&sha256(&a)) && !pinned.has(&sha256(&c)));
        std::thread::sleep(std::time::Duration::from_millis(20));
        // Pinning made `a` and `b` recent; adding `c` evicts the older of them, `a`...
        store.put(&sha256(&c), &c);
        assert!(!store.pin(&[sha256(&a)]).0[0], "evicted");
        // ...which the session that pinned it still reads.
        assert_eq!(pinned.read(&sha256(&a), 1000).as_deref(), Some(&a[..]));
        assert!(pinned.read(&sha256(&a), 999).is_none(), "a length that is not the chunk's");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_changed_file_is_never_served() {
        let (store, dir) = store("tamper", 1 << 20);
        let a = vec![7u8; 4096];
        store.put(&sha256(&a), &a);
        std::fs::write(dir.join(hex(&sha256(&a))), vec![8u8; 4096]).unwrap();
        let (present, pinned) = store.pin(&[sha256(&a)]);
        assert!(present[0]);
        assert!(pinned.read(&sha256(&a), 4096).is_none());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
