//! The server's store of uploaded content: large host-to-device copies kept on disk by their
//! SHA-256, so that a program run again (the same checkpoint, the same dataset) sends each
//! chunk's hash instead of its bytes.
//!
//! At its handshake a client names the chunks it sent this server before (its own record,
//! `interposer/src/content.rs`); the session pins those the store still has ([`Store::pin`]:
//! a hard link of the session's own stays readable when eviction unlinks the chunk), and the client sends only
//! the hashes of pinned chunks for the rest of the session. Chunks sent with their bytes
//! are added after the copy ([`Keeper`], on a thread of its own). The key is a
//! cryptographic hash computed by the server from the bytes it received, so one client
//! cannot plant content under another's hash. Size-bounded; the least recently used
//! chunks go first.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::mpsc::SyncSender;
use std::sync::{Arc, Mutex};

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

/// Chunks one session may name by hash: hard links in a directory of the session's own, so
/// they stay readable until the session ends even if the store evicts them meanwhile (and
/// hold no file descriptors, however many there are). The directory goes with the session.
#[derive(Default)]
pub struct Pinned {
    dir: Option<PathBuf>,
    files: HashMap<Hash, u64>,
}

impl Pinned {
    /// Whether the session may send `hash` without its bytes.
    pub fn has(&self, hash: &Hash) -> bool {
        self.files.contains_key(hash)
    }

    /// The bytes of chunk `hash`, checked against it: None if the session did not pin it,
    /// its length is not `len`, or the file no longer holds those bytes.
    pub fn read(&self, hash: &Hash, len: usize) -> Option<Vec<u8>> {
        if *self.files.get(hash)? != len as u64 {
            return None;
        }
        let bytes = std::fs::read(self.dir.as_ref()?.join(hex(hash))).ok()?;
        (bytes.len() == len && sha256(&bytes) == *hash).then_some(bytes)
    }

    pub fn len(&self) -> usize {
        self.files.len()
    }

    pub fn is_empty(&self) -> bool {
        self.files.is_empty()
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        if let Some(dir) = &self.dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// Where sessions keep their pins, inside the store (dot names: never chunks).
const PINS: &str = ".pins";

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
        if hashes.is_empty() {
            return (Vec::new(), pinned);
        }
        self.remove_stale_pins();
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = self.dir.join(PINS).join(format!("{}-{n}", std::process::id()));
        if std::fs::create_dir_all(&dir).is_err() {
            return (vec![false; hashes.len()], pinned);
        }
        let present = hashes
            .iter()
            .map(|hash| {
                let path = self.path(hash);
                let Ok(meta) = std::fs::metadata(&path) else { return false };
                if std::fs::hard_link(&path, dir.join(hex(hash))).is_err() {
                    return false;
                }
                touch(&path);
                pinned.files.insert(*hash, meta.len());
                true
            })
            .collect();
        pinned.dir = Some(dir);
        (present, pinned)
    }

    /// Pins of sessions whose process is gone (killed before they could remove them).
    fn remove_stale_pins(&self) {
        let Ok(entries) = std::fs::read_dir(self.dir.join(PINS)) else { return };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let pid = name.to_string_lossy().split('-').next().and_then(|p| p.parse::<u32>().ok());
            if pid.is_some_and(|pid| !Path::new(&format!("/proc/{pid}")).exists()) {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
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

    /// Bytes one session may add.
    pub fn session_budget(&self) -> u64 {
        self.max_bytes
    }

    fn evict(&self) {
        crate::cache::evict_oldest(&self.dir, self.max_bytes);
    }
}

/// A session's chunks on their way into the store: hashed and written by a thread of their
/// own, so the copies they came with do not wait. At most [`Keeper::QUEUE`] chunks wait; a
/// session that uploads faster than the disk takes them waits for it (only where the
/// client sends by content: a remote link, slower than a disk).
pub struct Keeper {
    queue: Mutex<Option<SyncSender<Vec<u8>>>>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Keeper {
    const QUEUE: usize = 8;

    pub fn new(store: Arc<Store>) -> Keeper {
        let (queue, chunks) = std::sync::mpsc::sync_channel::<Vec<u8>>(Self::QUEUE);
        let thread = std::thread::Builder::new()
            .name("chidori-content".into())
            .spawn(move || {
                for bytes in chunks {
                    store.put(&sha256(&bytes), &bytes);
                }
            })
            .map_err(|e| tracing::warn!("no thread for the content store ({e}): this session's uploads are not kept"))
            .ok();
        Keeper { queue: Mutex::new(thread.as_ref().map(|_| queue)), thread: Mutex::new(thread) }
    }

    pub fn keep(&self, bytes: Vec<u8>) {
        let queue = self.queue.lock().unwrap_or_else(|p| p.into_inner()).clone();
        if let Some(queue) = queue {
            let _ = queue.send(bytes);
        }
    }

    /// Wait until what the session sent is in the store (a run right after finds it).
    pub fn finish(&self) {
        self.queue.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(thread) = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Keeper {
    fn drop(&mut self) {
        self.finish();
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
