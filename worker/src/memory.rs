//! The session's device memory, as the worker saw it made: every device address a call
//! passes is checked against it before the library sees it, so a client can name only
//! memory of its own session (a made-up address, or a handle's value, which is a pointer
//! into the worker's heap, gets the library's invalid-value status, never a copy).
//!
//! What counts: the results of the allocation calls ([`effect`]: `cudaMalloc*`,
//! `cuMemAlloc*`, pools, `cuMemAddressReserve` for `cuMemMap`), module globals the session
//! looked up (`cuModuleGetGlobal`, `cu`/`cudaLibraryGetGlobal`, the runtime's symbols),
//! memory another session of the server exported by CUDA IPC and this one opened
//! ([`crate::ipc`]), the addresses graphs allocate at each launch ([`Origin::Graph`]), and
//! the mirrors of the client's pinned memory (checked by the caller). The quota counts the
//! allocation calls that return addresses; CUDA arrays (`cudaMallocArray`) are not counted.
//! Freed ranges stop counting. A per-session quota bounds what the allocation calls may
//! take.
//!
//! What is not checked: kernel parameters (their bytes are not typed; the GPU's per-process
//! address spaces keep sessions apart), device pointers stored inside host records (a
//! texture's resource descriptor, a graph node's parameters) and inside device arrays.

use std::collections::BTreeMap;

use crate::ipc::Kind;

/// Where a range came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// An allocation call: counts against the quota, and is freed by a free call.
    Allocated,
    /// Address space reserved for `cuMemMap` (not memory by itself: not counted).
    Reserved,
    /// A module's global variable.
    Global,
    /// Memory another session exported, opened through CUDA IPC (not counted: the exporting
    /// session's quota holds it); closed by `cudaIpcCloseMemHandle`, never freed here.
    Opened,
    /// The address a graph's allocation node allocates at each launch (not counted: the
    /// graph's pool holds it). A free of it (in the graph, or outside it once a launch
    /// allocated it) leaves it known: the next launch allocates it at the same address.
    Graph,
}

#[derive(Debug, Default)]
pub struct Memory {
    /// base → (length, origin).
    ranges: BTreeMap<u64, (u64, Origin)>,
    /// Bytes allocated now.
    pub used: u64,
    /// Most bytes the allocation calls may hold at once (None: no quota).
    pub quota: Option<u64>,
    /// Memory opened by CUDA IPC more than once: base → opens not yet closed.
    opens: std::collections::HashMap<u64, u32>,
}

impl Memory {
    pub fn new(quota: Option<u64>) -> Memory {
        Memory { quota, ..Memory::default() }
    }

    /// Whether `[addr, addr + len)` lies inside one known range (`len` 0 counts as 1).
    pub fn contains(&self, addr: u64, len: u64) -> bool {
        let Some((&base, &(size, _))) = self.ranges.range(..=addr).next_back() else { return false };
        let Some(end) = addr.checked_add(len.max(1)) else { return false };
        end <= base.saturating_add(size)
    }

    /// Whether an allocation of `bytes` more stays within the quota.
    pub fn fits(&self, bytes: u64) -> bool {
        self.quota.is_none_or(|q| self.used.saturating_add(bytes) <= q)
    }

    pub fn insert(&mut self, base: u64, len: u64, origin: Origin) {
        if base == 0 || len == 0 {
            return;
        }
        if origin == Origin::Allocated {
            self.used = self.used.saturating_add(len);
        }
        if let Some((old, o)) = self.ranges.insert(base, (len, origin))
            && o == Origin::Allocated
        {
            self.used = self.used.saturating_sub(old);
        }
    }

    /// An address inside the `n`-th known range (modulo their number), for fuzzing.
    pub fn pick(&self, n: u64) -> Option<u64> {
        if self.ranges.is_empty() {
            return None;
        }
        let (&base, &(len, _)) = self.ranges.iter().nth((n % self.ranges.len() as u64) as usize)?;
        Some(base + (n >> 32) % len.max(1))
    }

    /// Where the range starting exactly at `base` came from (None: no range starts there).
    pub fn origin_at(&self, base: u64) -> Option<Origin> {
        self.ranges.get(&base).map(|&(_, origin)| origin)
    }

    /// Memory opened by CUDA IPC at `base` once more (an open of a handle the session holds
    /// open already answers the same address; each open is closed once). `len` matters at the
    /// first open only.
    pub fn opened(&mut self, base: u64, len: u64) {
        if self.origin_at(base) == Some(Origin::Opened) {
            *self.opens.entry(base).or_insert(1) += 1;
        } else {
            self.insert(base, len, Origin::Opened);
            self.opens.insert(base, 1);
        }
    }

    /// One close of the memory opened at `base`: forgotten at its last.
    pub fn closed(&mut self, base: u64) {
        match self.opens.get_mut(&base) {
            Some(count) if *count > 1 => *count -= 1,
            _ => self.remove(base),
        }
    }

    /// Forget the range starting at `base` (a free, a last close); its bytes leave the quota.
    /// A graph allocation's address stays known ([`Origin::Graph`]).
    pub fn remove(&mut self, base: u64) {
        let std::collections::btree_map::Entry::Occupied(range) = self.ranges.entry(base) else { return };
        let (len, origin) = *range.get();
        if origin == Origin::Graph {
            return;
        }
        range.remove();
        self.opens.remove(&base);
        if origin == Origin::Allocated {
            self.used = self.used.saturating_sub(len);
        }
    }
}

/// How the size of an allocation is found: argument `Param(i)` in bytes, or a pitched
/// allocation's pitch (an output, known after the call) times its height.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Size {
    Param(usize),
    Pitch {
        pitch: usize,
        width: usize,
        height: usize,
    },
    /// An output (a module global's size).
    Out(usize),
    /// A 3D allocation (`cudaMalloc3D`): the pitch written into the output pitched pointer
    /// (its second word) times the height and depth of the by-value extent `extent`.
    Pitched3D {
        extent: usize,
    },
}

/// What a call does to the session's memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Effect {
    /// Writes a new range's base through output parameter `out`.
    Alloc {
        out: usize,
        size: Size,
        origin: Origin,
    },
    /// Frees the range whose base is argument `ptr`.
    Free {
        ptr: usize,
    },
    /// Writes a CUDA IPC handle through output `out` for the session's allocation or event
    /// named by the next argument: published for the server's other sessions ([`crate::ipc`]).
    Export {
        out: usize,
        kind: Kind,
    },
    /// Opens the CUDA IPC handle in by-value argument `handle`, which a session of this
    /// server exported; memory enters the session as [`Origin::Opened`] (its base written
    /// through output `out`).
    Open {
        out: usize,
        handle: usize,
        kind: Kind,
    },
    /// Closes the opened memory whose base is argument `ptr`.
    Close {
        ptr: usize,
    },
    /// Exports a shareable file descriptor (a VMM allocation's, a memory pool's) through
    /// output `out`; only a POSIX descriptor (argument `kind`) travels: the worker keeps it,
    /// and the client gets the token it is published under instead ([`crate::ipc`]).
    ExportFd {
        out: usize,
        kind: usize,
    },
    /// Imports a shareable file descriptor: argument `token` is the token a session of this
    /// server published it under, replaced by the descriptor fetched from that session.
    ImportFd {
        token: usize,
        kind: usize,
    },
    /// A pool's pointer imported (its pool imported by [`Effect::ImportFd`]): memory of
    /// another session, written through output `out`, the session's until freed.
    ImportPointer {
        out: usize,
    },
    None,
}

/// The effect of the function `name` (per-thread-stream suffixes ignored).
pub fn effect(name: &str) -> Effect {
    let name = chidori_protocol::desc::strip_suffixes(name, &["_ptsz", "_ptds"]);
    let alloc = |size| Effect::Alloc { out: 0, size, origin: Origin::Allocated };
    match name {
        "cudaMalloc"
        | "cudaMallocAsync"
        | "cudaMallocManaged"
        | "cudaMallocFromPoolAsync"
        | "cuMemAlloc"
        | "cuMemAlloc_v2"
        | "cuMemAllocAsync"
        | "cuMemAllocManaged"
        | "cuMemAllocFromPoolAsync" => alloc(Size::Param(1)),
        "cudaMallocPitch" | "cuMemAllocPitch" | "cuMemAllocPitch_v2" => {
            alloc(Size::Pitch { pitch: 1, width: 2, height: 3 })
        }
        "cudaMalloc3D" => alloc(Size::Pitched3D { extent: 1 }),
        "cuMemAddressReserve" => Effect::Alloc { out: 0, size: Size::Param(1), origin: Origin::Reserved },
        "cuModuleGetGlobal"
        | "cuModuleGetGlobal_v2"
        | "cuLibraryGetGlobal"
        | "cuLibraryGetManaged"
        | "cudaLibraryGetGlobal"
        | "cudaLibraryGetManaged" => Effect::Alloc { out: 0, size: Size::Out(1), origin: Origin::Global },
        "cudaFree" | "cudaFreeAsync" | "cuMemFree" | "cuMemFree_v2" | "cuMemFreeAsync" | "cuMemAddressFree" => {
            Effect::Free { ptr: 0 }
        }
        "cudaIpcGetMemHandle" | "cuIpcGetMemHandle" => Effect::Export { out: 0, kind: Kind::Memory },
        "cudaIpcGetEventHandle" | "cuIpcGetEventHandle" => Effect::Export { out: 0, kind: Kind::Event },
        "cudaIpcOpenMemHandle" | "cuIpcOpenMemHandle" | "cuIpcOpenMemHandle_v2" => {
            Effect::Open { out: 0, handle: 1, kind: Kind::Memory }
        }
        "cudaIpcOpenEventHandle" | "cuIpcOpenEventHandle" => Effect::Open { out: 0, handle: 1, kind: Kind::Event },
        "cudaIpcCloseMemHandle" | "cuIpcCloseMemHandle" => Effect::Close { ptr: 0 },
        "cuMemExportToShareableHandle" | "cudaMemPoolExportToShareableHandle" | "cuMemPoolExportToShareableHandle" => {
            Effect::ExportFd { out: 0, kind: 2 }
        }
        "cuMemImportFromShareableHandle"
        | "cudaMemPoolImportFromShareableHandle"
        | "cuMemPoolImportFromShareableHandle" => Effect::ImportFd { token: 1, kind: 2 },
        "cudaMemPoolImportPointer" | "cuMemPoolImportPointer" => Effect::ImportPointer { out: 0 },
        _ => Effect::None,
    }
}

/// The bytes a pitched range spans: `(height - 1) × pitch + width` (None: past the address
/// space).
pub fn span_2d(pitch: u64, width: u64, height: u64) -> Option<u64> {
    if height == 0 || width == 0 {
        return Some(0);
    }
    (height - 1).checked_mul(pitch)?.checked_add(width)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_addresses_inside_known_ranges_pass() {
        let mut m = Memory::new(Some(1000));
        m.insert(0x1000, 256, Origin::Allocated);
        assert!(m.contains(0x1000, 256) && m.contains(0x10ff, 1) && m.contains(0x1080, 0));
        assert!(!m.contains(0x1000, 257), "one byte past the end");
        assert!(!m.contains(0xfff, 1) && !m.contains(0x1100, 1) && !m.contains(u64::MAX, 2));
        assert_eq!(m.used, 256);
        assert!(m.fits(744) && !m.fits(745));
        m.insert(0x9000, 4096, Origin::Reserved);
        assert_eq!(m.used, 256, "a reservation is not memory");
        m.remove(0x1000);
        assert!(!m.contains(0x1000, 1));
        assert_eq!(m.used, 0);
    }

    #[test]
    fn a_graph_allocation_outlives_its_frees_and_is_not_counted() {
        let mut m = Memory::new(Some(100));
        m.insert(0x4000, 4096, Origin::Graph);
        assert_eq!(m.used, 0, "the graph's pool holds it");
        m.remove(0x4000);
        assert!(m.contains(0x4000, 4096), "the next launch allocates it at the same address");
        m.insert(0x4000, 64, Origin::Allocated);
        m.remove(0x4000);
        assert!(!m.contains(0x4000, 1) && m.used == 0, "a plain allocation made there since goes");
    }

    #[test]
    fn memory_opened_twice_stays_until_closed_twice() {
        let mut memory = Memory::new(None);
        memory.opened(0x1000, 64);
        memory.opened(0x1000, 64);
        memory.closed(0x1000);
        assert!(memory.contains(0x1000, 64), "one open is left");
        memory.closed(0x1000);
        assert!(!memory.contains(0x1000, 1));
        assert_eq!(memory.used, 0, "opened memory is the exporter's to count");
        // A pool's imported pointer opened twice and freed: a later open is closed once.
        memory.opened(0x1000, 64);
        memory.opened(0x1000, 64);
        memory.remove(0x1000);
        memory.opened(0x1000, 64);
        memory.closed(0x1000);
        assert!(!memory.contains(0x1000, 1), "no count left over from before the free");
    }

    #[test]
    fn allocation_calls_are_known_by_name() {
        assert!(matches!(effect("cudaMalloc"), Effect::Alloc { out: 0, size: Size::Param(1), .. }));
        assert!(matches!(effect("cuMemAllocAsync_ptsz"), Effect::Alloc { .. }));
        assert_eq!(effect("cudaFreeAsync"), Effect::Free { ptr: 0 });
        assert_eq!(effect("cudaIpcOpenMemHandle"), Effect::Open { out: 0, handle: 1, kind: Kind::Memory });
        assert_eq!(effect("cuIpcCloseMemHandle"), Effect::Close { ptr: 0 });
        assert_eq!(effect("cuMemImportFromShareableHandle"), Effect::ImportFd { token: 1, kind: 2 });
        assert_eq!(effect("cudaMemcpy"), Effect::None);
        // The specs' extents, per-thread twins included.
        let extents = |f| chidori_cuda::checks::extents(f).collect::<Vec<_>>();
        assert_eq!(extents("cuMemsetD32Async_ptsz"), [(0, 2, 4)]);
        assert_eq!(extents("cudaMemcpyAsync_ptsz"), [(0, 2, 1), (1, 2, 1)]);
        let pitched = |f| chidori_cuda::checks::extents_2d(f).collect::<Vec<_>>();
        assert_eq!(pitched("cudaMemcpy2D_ptds"), [(0, 1, 4, 5), (2, 3, 4, 5)]);
        let arrays = |f| chidori_cuda::checks::address_arrays(f).collect::<Vec<_>>();
        assert_eq!(arrays("cuMemPrefetchBatchAsync_ptsz"), [(0, Some(1))]);
        assert_eq!(arrays("cufftXtSetWorkArea"), [(1, None)]);
        assert_eq!(span_2d(512, 100, 3), Some(1124));
        assert_eq!(span_2d(0, 0, u64::MAX), Some(0));
        assert_eq!(span_2d(u64::MAX, 1, 3), None);
    }
}
