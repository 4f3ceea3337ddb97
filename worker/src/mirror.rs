//! The worker's side of pinned-memory mirrors (`chidori_protocol::mirror`): host memory at
//! the client's addresses, registered with CUDA so kernels and libraries handed a client
//! pinned pointer read and write it there.
//!
//! Each mirror keeps a shadow copy of the contents the client last saw, so a pull returns
//! only the bytes the GPU changed (the client may have changed other bytes of the same
//! range meanwhile).
//!
//! A *direct* mirror is memory the session already has at the client's address and the
//! worker can reach from the CPU: a module's `__managed__` variable (the client keeps its
//! copy of the variable at the variable's device address). Nothing is mapped for it; writes
//! and pulls go to the variable itself.
//!
//! A *stand-in* (pageable memory a graph's copy or a library's host array names, see
//! `chidori_protocol::mirror::STAND_IN_KEYS`) lies wherever the worker maps it, never at the
//! client's address (which may be the worker's own heap or stack): the calls that name it
//! are given its address here instead ([`Mirrors::translate`]). Stand-ins may cover the same
//! client pages; each is its own registration and stays until the client drops it, so a
//! graph node that names one is never left with a replaced registration.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};

use chidori_protocol::messages::MirrorChanges;
use chidori_protocol::mirror::{self, ARENA_BASE, ARENA_LEN, MAX_MIRROR, MAX_MIRRORED};

use crate::backend::Backend;

/// Whether this process reserved the arena (then mirrors inside it replace part of the
/// reservation instead of asking for fresh address space).
static ARENA: AtomicBool = AtomicBool::new(false);

/// Reserve the arena; call before CUDA is initialized, so the driver's own reservations
/// avoid it. Without it, mirrors still work where the address happens to be free.
pub fn reserve_arena() -> bool {
    let ok = mirror::reserve(ARENA_BASE, ARENA_LEN);
    if !ok {
        tracing::warn!("could not reserve the pinned-memory arena at {ARENA_BASE:#x}; mirrors there may fail");
    }
    ARENA.store(ok, Ordering::Relaxed);
    ok
}

/// A pull reads and encodes a mirror this much at a time; its changes cost at most about
/// half again as much encoded (a bitmap, or packed runs no more than one in 24 bytes).
const WINDOW: u64 = 1 << 20;

struct Mirror {
    /// The client's range (a stand-in: its key, and its address in `client`).
    base: u64,
    len: u64,
    /// The client's address of the range, which calls name.
    client: u64,
    /// Where the contents lie in this process: `base`, except for stand-ins.
    at: u64,
    /// The pages mapped for it.
    page_base: u64,
    page_len: u64,
    /// The contents as the client last saw them.
    shadow: Vec<u8>,
    /// The session's own host-accessible memory, reached through the backend.
    direct: bool,
}

impl Mirror {
    /// `len` bytes of the mirror's contents now, from `offset`.
    fn read_at(&self, backend: &dyn Backend, offset: u64, len: u64) -> Result<Vec<u8>, String> {
        if self.direct {
            let mut now = vec![0u8; len as usize];
            backend.read_host_accessible(self.base + offset, &mut now)?;
            return Ok(now);
        }
        // SAFETY: [at + offset, at + offset + len) lies in the pages this mirror mapped
        // read-write (callers keep offset + len within the mirror's length).
        Ok(unsafe { std::slice::from_raw_parts((self.at + offset) as *const u8, len as usize) }.to_vec())
    }

    /// Write runs of the client's bytes (checked against the mirror's length): those the
    /// client changed since it last saw the mirror ([`mirror::client_changes`]; a byte of
    /// the same chunk the GPU wrote since stays, and goes back at the next pull).
    fn write(&mut self, backend: &dyn Backend, runs: &[(u64, u64)], bytes: &[u8]) -> Result<(), String> {
        let writes = mirror::client_changes(runs, bytes, &self.shadow);
        if self.direct {
            for &(offset, n, at) in &writes {
                backend.write_host_accessible(self.base + offset, &bytes[at..at + n as usize])?;
            }
        } else {
            // SAFETY: as in `read`; the session's mirror table is behind one lock.
            let target = unsafe { std::slice::from_raw_parts_mut(self.at as *mut u8, self.len as usize) };
            for &(offset, n, at) in &writes {
                let (o, n) = (offset as usize, n as usize);
                target[o..o + n].copy_from_slice(&bytes[at..at + n]);
            }
        }
        mirror::apply_runs(runs, bytes, &mut self.shadow);
        Ok(())
    }
}

/// A session's mirrors, by the client's base address.
#[derive(Default)]
pub struct Mirrors {
    by_base: BTreeMap<u64, Mirror>,
    total: u64,
}

impl Mirrors {
    /// Apply a client's write to the mirror of `[base, base + len)`, making it first.
    /// `direct`: the range is the session's own host-accessible memory (see the module
    /// docs), checked by the caller. `client`: a stand-in's address in the client (`base`
    /// is then its key), else 0.
    #[allow(clippy::too_many_arguments)]
    pub fn write(
        &mut self,
        backend: &dyn Backend,
        base: u64,
        len: u64,
        runs: &[(u64, u64)],
        bytes: &[u8],
        direct: bool,
        client: u64,
    ) -> Result<(), String> {
        mirror::check_runs(runs, len, bytes.len() as u64)?;
        if mirror::is_stand_in(base) != (client != 0) {
            return Err(format!("a mirror key {base:#x} with the client address {client:#x}"));
        }
        if !self.by_base.contains_key(&base) {
            if client != 0 {
                self.create_stand_in(backend, base, client, len)?;
            } else if direct {
                self.create_direct(base, len)?;
            } else {
                self.create(backend, base, len)?;
            }
        }
        let m = self.by_base.get_mut(&base).ok_or("no such mirror")?;
        if m.len != len || (client != 0 && m.client != client) {
            return Err(format!(
                "the mirror {base:#x} has {} bytes at {:#x}, not {len} at {client:#x}",
                m.len, m.client
            ));
        }
        m.write(backend, runs, bytes)
    }

    /// A stand-in `key` for the client's `[client, client + len)`: fresh pages wherever the
    /// system puts them, registered with CUDA.
    fn create_stand_in(&mut self, backend: &dyn Backend, key: u64, client: u64, len: u64) -> Result<(), String> {
        mirror::pages(client, len).ok_or_else(|| format!("{len} bytes at {client:#x} are no user memory"))?;
        if len > MAX_MIRROR || self.total.saturating_add(len) > MAX_MIRRORED {
            return Err(format!(
                "mirroring {len} more bytes of the client's memory would pass the session's limit ({MAX_MIRRORED} bytes, {MAX_MIRROR} each)"
            ));
        }
        let page_len = len.div_ceil(mirror::PAGE) * mirror::PAGE;
        // SAFETY: a fresh anonymous mapping wherever the system chooses; it replaces nothing.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                page_len as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(format!("no memory for {len} bytes of the client's memory"));
        }
        let page_base = p as u64;
        if let Err(e) = backend.map_host(page_base, page_len) {
            release(page_base, page_len, false);
            return Err(e);
        }
        self.total += len;
        let shadow = vec![0; len as usize];
        let m = Mirror { base: key, len, client, at: page_base, page_base, page_len, shadow, direct: false };
        self.by_base.insert(key, m);
        Ok(())
    }

    /// A mirror that is the session's memory itself. Its shadow starts zero-filled, as the
    /// client's record of a new mirror does: the first pull sends the memory's contents.
    fn create_direct(&mut self, base: u64, len: u64) -> Result<(), String> {
        if len > MAX_MIRROR || self.total.saturating_add(len) > MAX_MIRRORED {
            return Err(format!("mirroring {len} more bytes would pass the session's limit ({MAX_MIRRORED} bytes)"));
        }
        let end = base.checked_add(len).ok_or("a range past the address space")?;
        if self.by_base.values().any(|m| base < m.base + m.len && m.base < end) {
            return Err(format!("mirrored ranges overlap at {base:#x}"));
        }
        self.total += len;
        let shadow = vec![0; len as usize];
        let m = Mirror { base, len, client: base, at: base, page_base: base, page_len: 0, shadow, direct: true };
        self.by_base.insert(base, m);
        Ok(())
    }

    fn create(&mut self, backend: &dyn Backend, base: u64, len: u64) -> Result<(), String> {
        let (page_base, page_len) =
            mirror::pages(base, len).ok_or_else(|| format!("{len} bytes at {base:#x} are no user memory"))?;
        if len > MAX_MIRROR || self.total.saturating_add(len) > MAX_MIRRORED {
            return Err(format!(
                "mirroring {len} more bytes of pinned memory would pass the session's limit ({MAX_MIRRORED} bytes, {MAX_MIRROR} each)"
            ));
        }
        let overlaps = self.by_base.values().any(|m| {
            let (start, end) =
                if m.direct { (m.base, m.base + m.len) } else { (m.page_base, m.page_base + m.page_len) };
            page_base < end && start < page_base + page_len
        });
        if overlaps {
            return Err(format!("pinned ranges sharing pages cannot both be mirrored ({base:#x})"));
        }
        let in_arena =
            ARENA.load(Ordering::Relaxed) && mirror::in_arena(page_base) && mirror::in_arena(page_base + page_len - 1);
        // Inside the arena the pages replace part of this process's own reservation (no
        // mirror overlaps, checked above); elsewhere they must be free.
        // SAFETY: see above.
        let mapped = if in_arena {
            unsafe { mirror::commit(page_base, page_len) }
        } else {
            mirror::reserve(page_base, page_len) && unsafe { mirror::commit(page_base, page_len) }
        };
        if !mapped {
            return Err(format!(
                "the server has no free address space at {page_base:#x} to mirror the client's pinned memory"
            ));
        }
        if let Err(e) = backend.map_host(page_base, page_len) {
            release(page_base, page_len, in_arena);
            return Err(e);
        }
        self.total += len;
        let shadow = vec![0; len as usize];
        self.by_base
            .insert(base, Mirror { base, len, client: base, at: base, page_base, page_len, shadow, direct: false });
        Ok(())
    }

    /// The bytes of these mirrors that changed since the client last saw them, from offset
    /// `from` of the first, a window ([`WINDOW`]) at a time until the encoded changes reach
    /// `budget` bytes (the window that reaches it goes whole: an answer holds at most one
    /// window's changes more); the shadows take the bytes sent. Also where the next pull
    /// starts, as (mirror base, offset), when more changed than the budget holds.
    pub fn pull(
        &mut self,
        backend: &dyn Backend,
        bases: &[u64],
        from: u64,
        budget: usize,
    ) -> (Vec<MirrorChanges>, Option<(u64, u64)>) {
        let mut out = Vec::new();
        // Room for one struct's fields in the archive.
        const PER_MIRROR: usize = 64;
        let mut used = 0usize;
        let message =
            |base: u64, c: mirror::Changes| MirrorChanges { base, runs: c.runs, mask: c.mask, bytes: c.bytes };
        for (i, &base) in bases.iter().enumerate() {
            let Some(m) = self.by_base.get_mut(&base) else { continue };
            let mut changes = mirror::Changes::default();
            used += PER_MIRROR;
            let mut at = if i == 0 { from.min(m.len) } else { 0 };
            while at < m.len {
                let window = (m.len - at).min(WINDOW);
                let now = match m.read_at(backend, at, window) {
                    Ok(now) => now,
                    Err(e) => {
                        tracing::warn!("reading the mirror at {base:#x}: {e}");
                        break;
                    }
                };
                if used >= budget {
                    if !changes.is_empty() {
                        out.push(message(base, changes));
                    }
                    return (out, Some((base, at)));
                }
                let shadow = &mut m.shadow[at as usize..(at + window) as usize];
                let size = changes.size();
                changes.add(at, shadow, &now);
                shadow.copy_from_slice(&now);
                used += changes.size() - size;
                at += window;
            }
            if !changes.is_empty() {
                out.push(message(base, changes));
            }
        }
        (out, None)
    }

    /// [`Mirrors::pull`] of every mirror, page after page, each handed to `send` with
    /// whether it is the last (one empty page when nothing changed).
    pub fn pull_all(&mut self, backend: &dyn Backend, mut send: impl FnMut(Vec<MirrorChanges>, bool)) {
        let mut bases: Vec<u64> = self.by_base.keys().copied().collect();
        let mut from = 0;
        loop {
            let (changes, next) = self.pull(backend, &bases, from, mirror::PULL_BUDGET);
            let Some((base, offset)) = next else {
                send(changes, true);
                return;
            };
            send(changes, false);
            let first = bases.iter().position(|&b| b == base).unwrap_or(0);
            bases.drain(..first);
            from = offset;
        }
    }

    /// Whether `[addr, addr + len)` lies inside one mirror at its client's address (`len` 0
    /// counts as 1; stand-ins are reached through [`Mirrors::translate`]).
    pub fn contains(&self, addr: u64, len: u64) -> bool {
        if mirror::is_stand_in(addr) {
            return false;
        }
        let Some((_, m)) = self.by_base.range(..=addr).next_back() else { return false };
        addr.checked_add(len.max(1)).is_some_and(|end| end <= m.base + m.len)
    }

    /// Where `[addr, addr + len)` of the client's memory lies here when a stand-in holds it
    /// whole (`len` 0 counts as 1): the newest such stand-in, the one the client claimed
    /// last for those bytes.
    pub fn translate(&self, addr: u64, len: u64) -> Option<u64> {
        let end = addr.checked_add(len.max(1))?;
        self.by_base
            .range(mirror::STAND_IN_KEYS..)
            .rev()
            .map(|(_, m)| m)
            .find(|m| m.client <= addr && end <= m.client + m.len)
            .map(|m| m.at + (addr - m.client))
    }

    /// The client's address of `addr` when it lies in a stand-in here (a graph node's
    /// parameters read back name the program's memory, as the program gave them).
    pub fn untranslate(&self, addr: u64) -> Option<u64> {
        self.by_base
            .range(mirror::STAND_IN_KEYS..)
            .map(|(_, m)| m)
            .find(|m| m.at <= addr && addr < m.at + m.len)
            .map(|m| m.client + (addr - m.at))
    }

    /// Forget the mirror at `base` (the client freed the memory).
    pub fn remove(&mut self, backend: &dyn Backend, base: u64) {
        if let Some(m) = self.by_base.remove(&base) {
            self.total -= m.len;
            if m.direct {
                return;
            }
            backend.unmap_host(m.page_base);
            let in_arena =
                !mirror::is_stand_in(m.base) && ARENA.load(Ordering::Relaxed) && mirror::in_arena(m.page_base);
            release(m.page_base, m.page_len, in_arena);
        }
    }
}

/// Give pages back: into the arena's reservation, or to the system.
fn release(page_base: u64, page_len: u64, in_arena: bool) {
    if in_arena {
        // SAFETY: the pages are this process's mirror inside its own reservation.
        unsafe { mirror::decommit(page_base, page_len) };
    } else {
        // SAFETY: the pages this mirror mapped.
        unsafe { libc::munmap(page_base as *mut libc::c_void, page_len as usize) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A change larger than one answer holds comes back in pages that, applied in order,
    /// rebuild the mirror exactly, and the next pull finds nothing.
    #[test]
    fn large_changes_come_back_in_pages_that_rebuild_them() {
        let backend = crate::fuzz::emulated_harness_backend();
        assert!(reserve_arena());
        let (base, len) = (ARENA_BASE + (3 << 30), 12u64 << 20);
        let mut mirrors = Mirrors::default();
        mirrors.write(&*backend, base, len, &[], &[], false, 0).expect("a mirror in the arena");
        // What the GPU would do: every float rewritten, so few bytes in a row change.
        // SAFETY: the mirror just mapped these pages read-write.
        let memory = unsafe { std::slice::from_raw_parts_mut(base as *mut f32, (len / 4) as usize) };
        for (i, x) in memory.iter_mut().enumerate() {
            *x = i as f32 * 2.0 + 1.0;
        }
        let mut client = vec![0u8; len as usize];
        let budget = 2 << 20;
        let (mut from, mut pages) = (0, 0);
        loop {
            let (changes, next) = mirrors.pull(&*backend, &[base], from, budget);
            pages += 1;
            let size: usize = changes.iter().map(|c| c.runs.len() + c.mask.len() + c.bytes.len()).sum();
            assert!(size <= budget + WINDOW as usize * 5 / 4, "{size} bytes in a page");
            for c in &changes {
                let spans = mirror::unpack_changes(&c.runs, &c.mask, c.bytes.len(), len).expect("well-formed changes");
                mirror::apply_changes(&spans, &c.mask, &c.bytes, &mut client);
            }
            match next {
                Some((b, offset)) => {
                    assert_eq!(b, base);
                    assert!(offset > from);
                    from = offset;
                }
                None => break,
            }
        }
        assert!(pages > 4, "{pages} pages");
        // SAFETY: as above.
        let now = unsafe { std::slice::from_raw_parts(base as *const u8, len as usize) };
        assert!(client == now, "the pages rebuild the mirror");
        assert_eq!(mirrors.pull(&*backend, &[base], 0, budget), (vec![], None), "nothing changed since");
        let mut frames = 0;
        memory[7] = -1.0;
        mirrors.pull_all(&*backend, |changes, last| {
            frames += 1;
            assert!(last);
            assert_eq!(changes.len(), 1);
        });
        assert_eq!(frames, 1);
        mirrors.remove(&*backend, base);
    }

    /// Stand-ins lie where the worker maps them, even where the client's address is taken
    /// here (this test's own heap); overlapping ones coexist, calls are given the newest
    /// that holds their bytes, and the way back names the client's address.
    #[test]
    fn stand_ins_lie_anywhere_and_overlap() {
        let backend = crate::fuzz::emulated_harness_backend();
        let taken = vec![0u8; 3 * 4096];
        let client = (taken.as_ptr() as u64).div_ceil(mirror::PAGE) * mirror::PAGE;
        let (old, new) = (mirror::STAND_IN_KEYS, mirror::STAND_IN_KEYS + 1);
        let mut mirrors = Mirrors::default();
        let page = mirror::PAGE;
        mirrors.write(&*backend, old, page, &[(0, 4)], &[1, 2, 3, 4], false, client).expect("a stand-in");
        mirrors.write(&*backend, new, 2 * page, &[(page, 2)], &[5, 6], false, client).expect("an overlapping one");
        let (at_old, at_new) = (mirrors.by_base[&old].at, mirrors.by_base[&new].at);
        assert_ne!(at_old, client);
        assert_eq!(mirrors.translate(client + 10, 8), Some(at_new + 10), "the newest that holds them");
        assert_eq!(mirrors.translate(client + page, 2), Some(at_new + page));
        assert_eq!(mirrors.translate(client + 2 * page - 1, 2), None, "past every stand-in");
        assert!(!mirrors.contains(client, 1), "a stand-in is not reached at the client's address");
        assert!(!mirrors.contains(old, 1), "nor at its key");
        assert_eq!(mirrors.untranslate(at_old + 3), Some(client + 3));
        // SAFETY: the stand-ins' pages, mapped read-write by `write`.
        assert_eq!(unsafe { std::slice::from_raw_parts(at_old as *const u8, 4) }, &[1, 2, 3, 4]);
        // SAFETY: as above.
        assert_eq!(unsafe { std::slice::from_raw_parts((at_new + page) as *const u8, 2) }, &[5, 6]);
        assert!(mirrors.write(&*backend, old, page, &[], &[], false, client + page).is_err(), "another address");
        assert!(mirrors.write(&*backend, old + 7, page, &[], &[], false, 0).is_err(), "a stand-in key without one");
        assert!(mirrors.write(&*backend, client, page, &[], &[], false, client).is_err(), "an address with one");
        mirrors.remove(&*backend, new);
        assert_eq!(mirrors.translate(client + 10, 8), Some(at_old + 10), "the older one still holds them");
        mirrors.remove(&*backend, old);
        assert_eq!(mirrors.translate(client, 1), None);
        assert_eq!(mirrors.total, 0);
    }
}
