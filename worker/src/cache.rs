//! The server's on-disk module cache: module images by sha256, so that the second run of a
//! program uploads nothing. Size-bounded; the least recently used images go first.

use std::path::PathBuf;

use sha2::{Digest, Sha256};

pub struct ModuleCache {
    dir: PathBuf,
    max_bytes: u64,
}

pub fn hex(hash: &[u8; 32]) -> String {
    hash.iter().map(|b| format!("{b:02x}")).collect()
}

pub fn sha256(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

/// `$XDG_CACHE_HOME/chidori/modules`, else `~/.cache/chidori/modules`.
pub fn default_dir() -> PathBuf {
    chidori_protocol::env::cache_dir().unwrap_or_else(|| PathBuf::from("/tmp/chidori")).join("modules")
}

impl ModuleCache {
    pub fn new(dir: PathBuf, max_bytes: u64) -> ModuleCache {
        ModuleCache { dir, max_bytes }
    }

    fn path(&self, hash: &[u8; 32]) -> PathBuf {
        self.dir.join(hex(hash))
    }

    /// The image of `hash`, if cached and intact.
    pub fn get(&self, hash: &[u8; 32]) -> Option<Vec<u8>> {
        let path = self.path(hash);
        let bytes = std::fs::read(&path).ok()?;
        if sha256(&bytes) != *hash {
            let _ = std::fs::remove_file(&path);
            return None;
        }
        // Mark it recently used.
        let _ = std::fs::File::options()
            .append(true)
            .open(&path)
            .and_then(|f| f.set_modified(std::time::SystemTime::now()));
        Some(bytes)
    }

    pub fn put(&self, hash: &[u8; 32], bytes: &[u8]) {
        if bytes.len() as u64 > self.max_bytes || std::fs::create_dir_all(&self.dir).is_err() {
            return;
        }
        let tmp = self.dir.join(format!(".{}.{}", hex(hash), std::process::id()));
        if std::fs::write(&tmp, bytes).is_ok() && std::fs::rename(&tmp, self.path(hash)).is_ok() {
            self.evict();
        } else {
            let _ = std::fs::remove_file(&tmp);
        }
    }

    fn evict(&self) {
        evict_oldest(&self.dir, self.max_bytes);
    }
}

/// Remove the least recently modified files of `dir` (not those whose names start with a
/// dot) until the rest take at most `max_bytes`: the bound of the module cache and of the
/// content store.
pub fn evict_oldest(dir: &std::path::Path, max_bytes: u64) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
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
        if total <= max_bytes {
            break;
        }
        if std::fs::remove_file(&path).is_ok() {
            total -= len;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn images_round_trip_and_old_ones_are_evicted() {
        let dir = std::env::temp_dir().join(format!("chidori-cache-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let cache = ModuleCache::new(dir.clone(), 2500);
        let a = vec![1u8; 1000];
        let b = vec![2u8; 1000];
        let c = vec![3u8; 1000];
        cache.put(&sha256(&a), &a);
        std::thread::sleep(std::time::Duration::from_millis(20));
        cache.put(&sha256(&b), &b);
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert_eq!(cache.get(&sha256(&a)).as_deref(), Some(&a[..]));
        std::thread::sleep(std::time::Duration::from_millis(20));
        cache.put(&sha256(&c), &c);
        // b was the least recently used: it went to keep the cache under its bound.
        assert!(cache.get(&sha256(&b)).is_none());
        assert!(cache.get(&sha256(&a)).is_some() && cache.get(&sha256(&c)).is_some());
        // A corrupted file is dropped, never served.
        std::fs::write(dir.join(hex(&sha256(&a))), b"tampered").unwrap();
        assert!(cache.get(&sha256(&a)).is_none());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
