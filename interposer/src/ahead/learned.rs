//! Answers learned in earlier sessions with the same server GPU and libraries: kept on disk,
//! keyed by the server's identity (its GPUs, driver and library versions), so that a second
//! run of a program answers what it asked the first time without waiting. The worker still
//! makes every such call; the client compares its answer when it comes
//! (`crate::custom::cublaslt`), and a different one ends the session naming the call and
//! drops the whole store (`docs/ahead.md`).
//!
//! The file holds records back to back: a namespace byte, the key's and the value's lengths
//! (u32, little-endian), the key, the value. A record cut short (a process killed while
//! appending) ends the file's valid part; appending goes on after the last whole record.
//! A store that reaches [`MAX_BYTES`] is compacted to half of it, keeping the answers this
//! process used and then the newest, and the file is written anew (another process appending
//! to it meanwhile loses those records: only a head start).

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};

/// Bytes of records one store keeps; past it, the store is compacted to half.
pub const MAX_BYTES: usize = 16 << 20;

/// What is learned, by kind of question.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Space {
    /// cublasLtMatmulAlgoGetHeuristic: (status, count, results) by the problem's descriptors.
    LtHeuristic = 1,
    /// cuDNN's legacy size queries: (status, outputs) by the call and its descriptors'
    /// fingerprints (`crate::runtime::cudnn_sizes`).
    CudnnSize = 2,
    /// A function attribute as a process first sees it (before it sets it): its value, by
    /// the module's content, the function's name and the attribute (`crate::custom::kernels`).
    FuncAttribute = 3,
    /// What cuDNN's backend answered of a descriptor that does not change (a finalize that
    /// steers its caller, a question, a fill): the status, `*elementCount` and the array
    /// (`crate::ahead::cudnn::Answer`), by what the descriptor holds and the call
    /// (`crate::custom::cudnn`).
    CudnnBackend = 4,
    /// An occupancy answer as a process first sees it (before it sets the function's
    /// attributes or cache preference): active blocks per multiprocessor, by the module's
    /// content, the function's name, the block size, the dynamic shared memory and the
    /// flags (`crate::custom::kernels`).
    Occupancy = 5,
    /// A version or property (the specs' `constant`): the status and the outputs, by the
    /// call and its values (`crate::runtime::learned_constant`).
    Constant = 6,
    /// Where `cudnnGetRNNWeightParams` finds a matrix and a bias: offsets into the weight
    /// space and the descriptors' shapes, by the RNN descriptor's fingerprint and the
    /// question (`crate::ahead::rnn`).
    RnnWeights = 7,
    /// A cuFFT plan made: the status and work sizes, by the call and what was set on the
    /// plan (`crate::runtime::cufft_plans`).
    CufftPlan = 8,
    /// A cuSOLVER workspace size: the status and the sizes, by the call and what was set on
    /// the objects it passes (`crate::runtime::solver_sizes`).
    SolverSize = 9,
    /// How many objects of a kind the last run of a command created, up to
    /// [`crate::ahead::BATCH_MAX`]: the first create of a process makes that many at once
    /// (`crate::custom::cufft`), by the kind and the command line.
    Creates = 10,
    /// A cuSPARSE generic-API buffer size: the status and the size, by the call and what its
    /// descriptors describe (`crate::runtime::sparse_sizes`).
    SparseSize = 11,
}

/// What answers depend on: the server's GPUs, its driver and its libraries' versions, from
/// the Welcome.
pub fn identity(w: &chidori_protocol::messages::Welcome) -> Vec<u8> {
    let mut identity = format!("{}|{}|{:?}", w.backend, w.driver_version, w.libraries).into_bytes();
    for d in &w.devices {
        identity.extend_from_slice(d.name.as_bytes());
        identity.extend_from_slice(&d.uuid);
    }
    identity
}

/// Where learned answers are kept: `$XDG_CACHE_HOME/chidori/answers` (or `~/.cache/…`);
/// None where `CHIDORI_LEARNED=0` or there is no home.
pub fn dir() -> Option<PathBuf> {
    if std::env::var(chidori_protocol::env::LEARNED).is_ok_and(|v| v == "0") {
        return None;
    }
    Some(chidori_protocol::env::cache_dir()?.join("answers"))
}

/// The file of `identity`'s store in `dir`, with `suffix` (another kind of record).
pub fn file(dir: &Path, identity: &[u8], suffix: &str) -> PathBuf {
    use sha2::{Digest, Sha256};
    let name: String = Sha256::digest(identity)[..12].iter().map(|b| format!("{b:02x}")).collect();
    dir.join(format!("{name}{suffix}"))
}

/// The store of one server identity.
pub struct Learned {
    path: Option<PathBuf>,
    map: HashMap<(u8, Vec<u8>), Kept>,
    bytes: usize,
    /// Order of learning (the file's order): the newest has the largest.
    next: u64,
}

/// One answer kept: its value, when it was learned, whether this process used it.
struct Kept {
    value: Vec<u8>,
    order: u64,
    used: bool,
}

/// Bytes of a record in the file.
fn record_len(key: &[u8], value: &[u8]) -> usize {
    9 + key.len() + value.len()
}

fn record((space, key): &(u8, Vec<u8>), value: &[u8]) -> Option<Vec<u8>> {
    let (klen, vlen) = (u32::try_from(key.len()).ok()?, u32::try_from(value.len()).ok()?);
    let mut r = Vec::with_capacity(record_len(key, value));
    r.push(*space);
    r.extend_from_slice(&klen.to_le_bytes());
    r.extend_from_slice(&vlen.to_le_bytes());
    r.extend_from_slice(key);
    r.extend_from_slice(value);
    Some(r)
}

impl Learned {
    /// The store for `identity` under `dir` (created if missing). Without a directory the
    /// store lives in memory only.
    pub fn open(dir: Option<&Path>, identity: &[u8]) -> Learned {
        let path = dir.and_then(|d| std::fs::create_dir_all(d).ok().map(|_| file(d, identity, "")));
        let mut store = Learned { path, map: HashMap::new(), bytes: 0, next: 0 };
        if let Some(bytes) = store.path.as_ref().and_then(|p| std::fs::read(p).ok()) {
            let whole = store.load(&bytes);
            if whole < bytes.len()
                && let Some(p) = &store.path
            {
                // Drop the torn tail so appends start at a record boundary.
                let _ = std::fs::OpenOptions::new().write(true).open(p).and_then(|f| f.set_len(whole as u64));
            }
        }
        store
    }

    /// Read records; the bytes of whole records.
    fn load(&mut self, bytes: &[u8]) -> usize {
        let mut at = 0;
        while let Some(head) = bytes.get(at..at + 9) {
            let klen = u32::from_le_bytes([head[1], head[2], head[3], head[4]]) as usize;
            let vlen = u32::from_le_bytes([head[5], head[6], head[7], head[8]]) as usize;
            let Some(end) = (at + 9).checked_add(klen).and_then(|k| k.checked_add(vlen)) else { break };
            let Some(body) = bytes.get(at + 9..end) else { break };
            let (key, value) = body.split_at(klen);
            self.insert((head[0], key.to_vec()), value.to_vec());
            at = end;
        }
        at
    }

    /// Keep `value` for `k` as the newest (in memory).
    fn insert(&mut self, k: (u8, Vec<u8>), value: Vec<u8>) {
        let key_len = k.1.len();
        self.bytes += record_len(&k.1, &value);
        let order = self.next;
        self.next += 1;
        if let Some(old) = self.map.insert(k, Kept { value, order, used: false }) {
            // A later record of the same key replaces the earlier one.
            self.bytes -= 9 + key_len + old.value.len();
        }
    }

    /// The answer kept for `key` (marked used: compaction keeps it).
    pub fn get(&mut self, space: Space, key: &[u8]) -> Option<&[u8]> {
        let kept = self.map.get_mut(&(space as u8, key.to_vec()))?;
        kept.used = true;
        Some(&kept.value)
    }

    /// Keep `value` for `key` (on disk too); false where it cannot be kept (larger than
    /// half the store) or was known already.
    pub fn learn(&mut self, space: Space, key: &[u8], value: &[u8]) -> bool {
        let k = (space as u8, key.to_vec());
        let size = record_len(key, value);
        if size > MAX_BYTES / 2 || self.map.get(&k).is_some_and(|v| v.value == value) {
            return false;
        }
        let Some(record) = record(&k, value) else { return false };
        if self.bytes + size > MAX_BYTES {
            self.compact(MAX_BYTES / 2 - size);
        }
        self.insert(k, value.to_vec());
        if let Some(path) = &self.path {
            let written =
                std::fs::OpenOptions::new().create(true).append(true).open(path).and_then(|mut f| f.write_all(&record));
            if let Err(e) = written {
                crate::log::once_owned(&format!("{}", path.display()), || {
                    tracing::warn!("cannot keep learned answers in {}: {e}", path.display())
                });
            }
        }
        true
    }

    /// Keep at most `budget` bytes of records: those this process used, then the newest; the
    /// file is written anew with them, in the order they were learned.
    fn compact(&mut self, budget: usize) {
        let mut entries: Vec<((u8, Vec<u8>), Kept)> = self.map.drain().collect();
        entries.sort_by_key(|(_, k)| (std::cmp::Reverse(k.used), std::cmp::Reverse(k.order)));
        let mut bytes = 0;
        entries.retain(|(key, k)| {
            let size = record_len(&key.1, &k.value);
            let keep = bytes + size <= budget;
            if keep {
                bytes += size;
            }
            keep
        });
        entries.sort_by_key(|(_, k)| k.order);
        tracing::debug!("learned answers compacted to {} records, {bytes} bytes", entries.len());
        if let Some(path) = &self.path {
            let file: Vec<u8> = entries.iter().filter_map(|(key, k)| record(key, &k.value)).flatten().collect();
            let tmp = path.with_extension(format!("compact{}", std::process::id()));
            if std::fs::write(&tmp, &file).and_then(|()| std::fs::rename(&tmp, path)).is_err() {
                let _ = std::fs::remove_file(&tmp);
            }
        }
        self.bytes = bytes;
        self.map = entries.into_iter().collect();
    }

    /// Drop every answer, on disk too (one turned out different).
    pub fn forget_all(&mut self) {
        self.map.clear();
        self.bytes = 0;
        if let Some(path) = &self.path {
            let _ = std::fs::remove_file(path);
        }
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("chidori-learned-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn answers_survive_a_reopen_per_identity() {
        let d = dir("reopen");
        let mut a = Learned::open(Some(&d), b"gpu A");
        assert!(a.learn(Space::LtHeuristic, b"k1", b"v1"));
        assert!(!a.learn(Space::LtHeuristic, b"k1", b"v1"), "known already");
        assert!(a.learn(Space::LtHeuristic, b"k2", b""));
        let mut b = Learned::open(Some(&d), b"gpu A");
        assert_eq!(b.get(Space::LtHeuristic, b"k1"), Some(&b"v1"[..]));
        assert_eq!(b.get(Space::LtHeuristic, b"k2"), Some(&b""[..]));
        assert_eq!(b.len(), 2);
        // Another server's store is another file.
        assert!(Learned::open(Some(&d), b"gpu B").is_empty());
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_torn_tail_is_dropped_and_appends_go_on() {
        let d = dir("torn");
        let mut a = Learned::open(Some(&d), b"id");
        a.learn(Space::LtHeuristic, b"k1", b"v1");
        let file = std::fs::read_dir(&d).unwrap().next().unwrap().unwrap().path();
        let mut f = std::fs::OpenOptions::new().append(true).open(&file).unwrap();
        f.write_all(&[1, 5, 0, 0, 0, 9]).unwrap();
        drop(f);
        let mut b = Learned::open(Some(&d), b"id");
        assert_eq!(b.len(), 1);
        b.learn(Space::LtHeuristic, b"k3", b"v3");
        let mut c = Learned::open(Some(&d), b"id");
        assert_eq!(c.get(Space::LtHeuristic, b"k3"), Some(&b"v3"[..]));
        assert_eq!(c.len(), 2);
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn the_store_is_bounded_and_forgets_everything_at_once() {
        let d = dir("bound");
        let mut a = Learned::open(Some(&d), b"id");
        let big = vec![0u8; MAX_BYTES / 2];
        assert!(!a.learn(Space::LtHeuristic, b"a", &big), "larger than half the store");
        assert!(a.learn(Space::LtHeuristic, b"a", &big[..1000]));
        a.forget_all();
        assert!(a.is_empty());
        assert!(Learned::open(Some(&d), b"id").is_empty());
        let _ = std::fs::remove_dir_all(&d);
    }

    /// A full store keeps learning: it is compacted to half, keeping what this process used
    /// and then the newest, on disk too.
    #[test]
    fn a_full_store_keeps_what_was_used_and_the_newest() {
        let d = dir("compact");
        let mut a = Learned::open(Some(&d), b"id");
        let value = vec![7u8; 1 << 16];
        let per = record_len(b"k00000", &value);
        let fits = MAX_BYTES / per;
        for i in 0..fits {
            assert!(a.learn(Space::CudnnBackend, format!("k{i:05}").as_bytes(), &value));
        }
        assert_eq!(a.len(), fits, "not full yet");
        assert!(a.get(Space::CudnnBackend, b"k00003").is_some(), "an old one used");
        assert!(a.learn(Space::CudnnBackend, b"new", &value), "learning goes on");
        assert!(a.bytes <= MAX_BYTES / 2 && a.len() > fits / 2 - 2, "{} records, {} bytes", a.len(), a.bytes);
        let b = Learned::open(Some(&d), b"id");
        for l in [&a, &b] {
            assert!(l.map.contains_key(&(Space::CudnnBackend as u8, b"k00003".to_vec())), "used");
            assert!(l.map.contains_key(&(Space::CudnnBackend as u8, b"new".to_vec())), "newest");
            let last = format!("k{:05}", fits - 1);
            assert!(l.map.contains_key(&(Space::CudnnBackend as u8, last.into_bytes())), "newer");
            assert!(!l.map.contains_key(&(Space::CudnnBackend as u8, b"k00004".to_vec())), "old, unused");
        }
        assert_eq!(b.len(), a.len());
        assert_eq!(b.bytes, a.bytes);
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_key_learned_again_counts_once() {
        let mut a = Learned::open(None, b"id");
        assert!(a.learn(Space::LtHeuristic, b"k", b"one"));
        assert!(a.learn(Space::LtHeuristic, b"k", b"three"));
        assert_eq!((a.len(), a.bytes), (1, record_len(b"k", b"three")));
        assert_eq!(a.get(Space::LtHeuristic, b"k"), Some(&b"three"[..]));
    }
}
