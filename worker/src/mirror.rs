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

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};

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

struct Mirror {
    /// The client's range.
    base: u64,
    len: u64,
    /// The pages mapped for it.
    page_base: u64,
    page_len: u64,
    /// The contents as the client last saw them.
    shadow: Vec<u8>,
    /// The session's own host-accessible memory, reached through the backend.
    direct: bool,
}

impl Mirror {
    /// The mirror's contents now.
    fn read(&self, backend: &dyn Backend) -> Result<Vec<u8>, String> {
        if self.direct {
            let mut now = vec![0u8; self.len as usize];
            backend.read_host_accessible(self.base, &mut now)?;
            return Ok(now);
        }
        // SAFETY: [base, base + len) lies in the pages this mirror mapped read-write.
        Ok(unsafe { std::slice::from_raw_parts(self.base as *const u8, self.len as usize) }.to_vec())
    }

    /// Write runs of the client's bytes (checked against the mirror's length).
    fn write(&mut self, backend: &dyn Backend, runs: &[(u64, u64)], bytes: &[u8]) -> Result<(), String> {
        if self.direct {
            let mut at = 0usize;
            for &(offset, n) in runs {
                let n = n as usize;
                backend.write_host_accessible(self.base + offset, &bytes[at..at + n])?;
                at += n;
            }
        } else {
            // SAFETY: as in `read`; the session's mirror table is behind one lock.
            let target = unsafe { std::slice::from_raw_parts_mut(self.base as *mut u8, self.len as usize) };
            mirror::apply_runs(runs, bytes, target);
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
    /// docs), checked by the caller.
    pub fn write(
        &mut self,
        backend: &dyn Backend,
        base: u64,
        len: u64,
        runs: &[(u64, u64)],
        bytes: &[u8],
        direct: bool,
    ) -> Result<(), String> {
        mirror::check_runs(runs, len, bytes.len() as u64)?;
        if !self.by_base.contains_key(&base) {
            if direct {
                self.create_direct(base, len)?;
            } else {
                self.create(backend, base, len)?;
            }
        }
        let m = self.by_base.get_mut(&base).ok_or("no such mirror")?;
        if m.len != len {
            return Err(format!("the mirror at {base:#x} has {} bytes, not {len}", m.len));
        }
        m.write(backend, runs, bytes)
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
        self.by_base.insert(base, Mirror { base, len, page_base: base, page_len: 0, shadow, direct: true });
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
        self.by_base
            .insert(base, Mirror { base, len, page_base, page_len, shadow: vec![0; len as usize], direct: false });
        Ok(())
    }

    /// The bytes of these mirrors that changed since the client last saw them, as
    /// (address, bytes); the shadows take the new contents.
    pub fn pull(&mut self, backend: &dyn Backend, bases: &[u64]) -> Vec<(u64, Vec<u8>)> {
        let mut out = Vec::new();
        for base in bases {
            let Some(m) = self.by_base.get_mut(base) else { continue };
            let now = match m.read(backend) {
                Ok(now) => now,
                Err(e) => {
                    tracing::warn!("reading the mirror at {base:#x}: {e}");
                    continue;
                }
            };
            for (offset, n) in mirror::changed_runs(&m.shadow, &now) {
                let (o, n) = (offset as usize, n as usize);
                out.push((m.base + offset, now[o..o + n].to_vec()));
            }
            m.shadow = now;
        }
        out
    }

    /// [`Mirrors::pull`] of every mirror (nothing when there is none).
    pub fn pull_all(&mut self, backend: &dyn Backend) -> Vec<(u64, Vec<u8>)> {
        if self.by_base.is_empty() {
            return Vec::new();
        }
        let bases: Vec<u64> = self.by_base.keys().copied().collect();
        self.pull(backend, &bases)
    }

    /// Whether `[addr, addr + len)` lies inside one mirror (`len` 0 counts as 1).
    pub fn contains(&self, addr: u64, len: u64) -> bool {
        let Some((_, m)) = self.by_base.range(..=addr).next_back() else { return false };
        addr.checked_add(len.max(1)).is_some_and(|end| end <= m.base + m.len)
    }

    /// Forget the mirror at `base` (the client freed the memory).
    pub fn remove(&mut self, backend: &dyn Backend, base: u64) {
        if let Some(m) = self.by_base.remove(&base) {
            self.total -= m.len;
            if m.direct {
                return;
            }
            backend.unmap_host(m.page_base);
            let in_arena = ARENA.load(Ordering::Relaxed) && mirror::in_arena(m.page_base);
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
