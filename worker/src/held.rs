//! Records the program holds for a library, kept by the worker (`Wire::NewRecordHandle`).
//!
//! cuSPARSELt's handle, descriptors and plans are 1 KiB records that the program declares
//! and the library fills with its own pointers. The worker keeps the library's record in
//! memory of its own (its address is the "library's handle" in the session's table) and
//! the program's record holds only the id. The library may keep pointers from one record
//! into another (a plan into its matmul descriptor, a descriptor into its handle), so a
//! record is freed only once nothing made from it lives: destroying one that others were
//! made from takes it out of the table at once and frees it with the last of them.
//!
//! Some kinds have no destroy at all (cuSPARSELt's matmul descriptors: natively a stack
//! record the program drops). Of those the worker keeps the [`NEVER_DESTROYED_KEPT`] used
//! most recently that nothing was made from since; an older one is retired as if
//! destroyed, and a later call with it is refused as a stale handle.

use std::collections::HashMap;

use chidori_protocol::desc::HandleKind;

/// Records of never-destroyed kinds kept per session (2 MiB of cuSPARSELt 0.8's 512-byte
/// matmul descriptors; 52 MiB where the records are sized for 0.6's 13 KiB).
pub const NEVER_DESTROYED_KEPT: usize = 4096;

struct Held {
    /// The library's record, zeroed when made, 16-byte aligned.
    storage: Box<[u128]>,
    kind: HandleKind,
    /// Records this one was made from (inputs of its initializer), each counted in their
    /// `users` while this one is kept.
    made_from: Vec<u64>,
    /// Kept records made from this one.
    users: u32,
    /// In the session's table (not destroyed or retired).
    live: bool,
    /// The last use, in calls of the session (for retiring never-destroyed kinds).
    used: u64,
}

#[derive(Default)]
pub struct Records {
    held: HashMap<u64, Held>,
    clock: u64,
}

impl Records {
    /// A zeroed record of `bytes` for an initializer to fill; [`Records::keep`] it after
    /// the call succeeds (dropped otherwise). Its address is `storage.as_ptr()`.
    pub fn fresh(bytes: usize) -> Box<[u128]> {
        vec![0u128; bytes.div_ceil(16).max(1)].into_boxed_slice()
    }

    /// Keep the record an initializer filled, made from the records at `made_from` (the
    /// addresses of the records the call took; others are ignored). Its address.
    pub fn keep(&mut self, storage: Box<[u128]>, kind: HandleKind, made_from: &[u64]) -> u64 {
        let addr = storage.as_ptr() as u64;
        let mut parents = Vec::new();
        for &p in made_from {
            if p != addr
                && !parents.contains(&p)
                && let Some(parent) = self.held.get_mut(&p)
            {
                parent.users += 1;
                parents.push(p);
            }
        }
        self.clock += 1;
        self.held.insert(addr, Held { storage, kind, made_from: parents, users: 0, live: true, used: self.clock });
        addr
    }

    /// A call used the record at `addr`.
    pub fn touch(&mut self, addr: u64) {
        self.clock += 1;
        if let Some(h) = self.held.get_mut(&addr) {
            h.used = self.clock;
        }
    }

    /// The record at `addr` was destroyed (its handle left the table): freed now, or with
    /// the last record made from it.
    pub fn release(&mut self, addr: u64) {
        if let Some(h) = self.held.get_mut(&addr) {
            h.live = false;
        }
        self.free_unused(addr);
    }

    /// Retire the least recently used records of `kinds` (never destroyed by any call)
    /// beyond `keep` live ones, of those nothing live was made from: (kind, address) of
    /// each, for the caller to take out of the session's table.
    pub fn retire(&mut self, kinds: &[HandleKind], keep: usize) -> Vec<(HandleKind, u64)> {
        let live = |h: &Held| h.live && kinds.contains(&h.kind);
        let count = self.held.values().filter(|h| live(h)).count();
        if count <= keep {
            return Vec::new();
        }
        let mut idle: Vec<(u64, u64)> =
            self.held.iter().filter(|(_, h)| live(h) && h.users == 0).map(|(a, h)| (h.used, *a)).collect();
        idle.sort_unstable();
        let mut retired = Vec::new();
        for (_, addr) in idle.into_iter().take(count - keep) {
            if let Some(h) = self.held.get(&addr) {
                retired.push((h.kind, addr));
            }
            self.release(addr);
        }
        retired
    }

    /// Records kept (live, or waiting for what was made from them).
    pub fn len(&self) -> usize {
        self.held.len()
    }

    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    /// Free the record at `addr` if it is destroyed and nothing kept was made from it,
    /// then whatever that leaves unused.
    fn free_unused(&mut self, addr: u64) {
        let mut pending = vec![addr];
        while let Some(a) = pending.pop() {
            let unused = self.held.get(&a).is_some_and(|h| !h.live && h.users == 0);
            if !unused {
                continue;
            }
            let Some(h) = self.held.remove(&a) else { continue };
            drop(h.storage);
            for p in h.made_from {
                if let Some(parent) = self.held.get_mut(&p) {
                    parent.users = parent.users.saturating_sub(1);
                    pending.push(p);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn make(r: &mut Records, kind: HandleKind, from: &[u64]) -> u64 {
        r.keep(Records::fresh(1024), kind, from)
    }

    #[test]
    fn records_are_zeroed_aligned_and_as_large_as_asked() {
        let s = Records::fresh(1024);
        assert_eq!(s.len() * 16, 1024);
        assert!(s.iter().all(|w| *w == 0));
        assert_eq!(s.as_ptr() as usize % 16, 0);
        assert_eq!(Records::fresh(1).len(), 1);
    }

    #[test]
    fn a_record_others_were_made_from_lives_until_they_go() {
        let mut r = Records::default();
        let handle = make(&mut r, 1, &[]);
        let matrix = make(&mut r, 2, &[handle]);
        let plan = make(&mut r, 3, &[handle, matrix, 0xdead]);
        r.release(matrix);
        assert_eq!(r.len(), 3, "the plan was made from the matrix descriptor");
        r.release(handle);
        assert_eq!(r.len(), 3);
        r.release(plan);
        assert!(r.is_empty(), "the plan's release frees what it held up");
    }

    #[test]
    fn never_destroyed_records_beyond_the_bound_retire_least_recently_used_first() {
        let mut r = Records::default();
        let descs: Vec<u64> = (0..4).map(|_| make(&mut r, 7, &[])).collect();
        let plan = make(&mut r, 8, &[descs[0]]);
        r.touch(descs[1]);
        // descs[0] has a plan made from it; of the rest descs[2] was used least recently.
        let retired = r.retire(&[7], 2);
        assert_eq!(retired, vec![(7, descs[2]), (7, descs[3])]);
        assert_eq!(r.len(), 3);
        assert!(r.retire(&[7], 2).is_empty());
        r.release(plan);
        assert_eq!(r.len(), 2, "a live descriptor stays when its plan goes");
    }
}
