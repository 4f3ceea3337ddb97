//! The driver's virtual memory management, emulated: reserved address ranges, physical
//! allocations (handles with a reference count: `cuMemRetainAllocationHandle` takes one),
//! mapped into a range one piece at a time. A mapped piece is an allocation at its address
//! while mapped (a copy must stay inside one piece here, unlike on a GPU); its bytes go back
//! to its handle when unmapped, so mapping it again shows them, and go when the handle's last
//! reference does.
//!
//! A physical allocation exported as a file descriptor (`cuMemExportToShareableHandle`) moves
//! into a shared memory object (a memfd), as does one imported from such a descriptor
//! (`cuMemImportFromShareableHandle`): each mapped piece of it is then a region of
//! `State::shared` over that object's mapping, so the processes sharing it see each other's
//! writes, and its bytes stay in the object when unmapped.

use std::collections::{BTreeMap, HashMap};
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd};
use std::sync::Arc;

use chidori_cuda::consts::{
    CUmemAllocationHandleType_enum as handle_type, CUmemAllocationType_enum, CUmemLocationType_enum,
    cudaError_enum as status,
};

use super::{ALIGN, Emulated, SharedRegion, State, put_u32, put_u64};

const SUCCESS: u64 = status::CUDA_SUCCESS as u64;
const INVALID_VALUE: u64 = status::CUDA_ERROR_INVALID_VALUE as u64;
const OUT_OF_MEMORY: u64 = status::CUDA_ERROR_OUT_OF_MEMORY as u64;
const INVALID_HANDLE: u64 = status::CUDA_ERROR_INVALID_HANDLE as u64;
const NOT_SUPPORTED: u64 = status::CUDA_ERROR_NOT_SUPPORTED as u64;
/// CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR: the one shareable handle the emulation makes.
const POSIX_FD: u32 = handle_type::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
/// Where the names of the shared memory objects of exported allocations start (`memfd_create`
/// takes them; /proc shows a memfd's as `/memfd:<name> (deleted)`).
const MEMFD_PREFIX: &str = "chidori-emu-vmm-";

/// The granularity the emulated device answers, minimum and recommended alike.
pub const GRANULARITY: u64 = 2 << 20;

#[derive(Default)]
pub struct Vmm {
    /// Reserved ranges: base → length.
    reserved: BTreeMap<u64, u64>,
    /// Physical allocations by handle.
    physical: HashMap<u64, Physical>,
    /// Mapped pieces: address → handle (the bytes are an allocation at the address).
    mapped: BTreeMap<u64, u64>,
}

struct Physical {
    len: u64,
    backing: Backing,
    /// The program's references: cuMemCreate's (or the import's) and each retain's.
    references: u32,
    /// How many pieces of it are mapped (at most one while its bytes are owned).
    maps: u32,
    /// The handle types (CUmemAllocationHandleType bits) cuMemCreate was asked for; an
    /// import's are the POSIX file descriptor's.
    handle_types: u32,
    /// Whether the memory counts in this device's use: an import's counts in the exporter's.
    counted: bool,
}

/// Where a physical allocation's bytes are.
enum Backing {
    /// In this worker: the bytes while unmapped; None while mapped (they are an allocation
    /// at the mapped address then).
    Owned(Option<Vec<u8>>),
    /// In a shared memory object, exported or imported: each mapped piece is a region of
    /// `State::shared` over the same mapping.
    Shared(Arc<Mapping>),
}

impl Backing {
    /// Whether the bytes are owned and mapped: they are mapped once at a time (they move to
    /// the address), where shared memory is mapped as often as asked.
    fn taken(&self) -> bool {
        matches!(self, Backing::Owned(None))
    }
}

/// A shared memory object (a memfd) mapped into this worker, read-write and shared: the bytes
/// of a physical allocation exported or imported as a file descriptor, and of each mapped
/// piece of it. The mapping goes (and the descriptor is closed) when the allocation and every
/// piece of it are gone; the object itself, when the last process lets it go.
pub(super) struct Mapping {
    /// The mapping's address (a number: a raw pointer would keep the state from being Send).
    ptr: usize,
    len: u64,
    /// The object, open: each export hands out a new descriptor of it.
    fd: OwnedFd,
}

impl Mapping {
    /// Makes a shared memory object named `name`, of the length of `bytes`, with `bytes` in it.
    fn create(name: &str, bytes: &[u8]) -> Result<Mapping, u64> {
        let c_name = std::ffi::CString::new(name).map_err(|_| INVALID_VALUE)?;
        let size = libc::off_t::try_from(bytes.len()).map_err(|_| OUT_OF_MEMORY)?;
        // SAFETY: a NUL-terminated name; the call makes an anonymous file only.
        let raw = unsafe { libc::memfd_create(c_name.as_ptr(), libc::MFD_CLOEXEC) };
        if raw < 0 {
            return Err(OUT_OF_MEMORY);
        }
        // SAFETY: `raw` was just opened, and nothing else owns it.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // Space reserved now (not only a size set), so that no write through the mapping can
        // find the memory short: that would be SIGBUS, not an error.
        // SAFETY: `fd` is the object just made, open read-write.
        if unsafe { libc::posix_fallocate(fd.as_raw_fd(), 0, size) } != 0 {
            return Err(OUT_OF_MEMORY);
        }
        let mapping = Mapping::map(fd, bytes.len()).ok_or(OUT_OF_MEMORY)?;
        // SAFETY: the mapping is `bytes.len()` bytes long, read-write, and no one else has it.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), mapping.ptr as *mut u8, bytes.len()) };
        Ok(mapping)
    }

    /// Maps the shared memory object that the caller's descriptor `fd` is open on, which one
    /// of these emulations exported (another worker's, moved here, or this one's), keeping a
    /// descriptor of its own: the caller's stays the caller's.
    fn import(fd: u64) -> Result<Mapping, u64> {
        let fd = libc::c_int::try_from(fd).map_err(|_| INVALID_VALUE)?;
        // SAFETY: fcntl only checks `fd`, and duplicates it if it is open.
        let raw = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
        if raw < 0 {
            return Err(INVALID_VALUE);
        }
        // SAFETY: `raw` is the duplicate just made, and nothing else owns it.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // Only an exported allocation's object is mapped: a number the program chose never
        // opens another of the worker's files to it.
        let link = std::fs::read_link(format!("/proc/self/fd/{raw}")).map_err(|_| INVALID_VALUE)?;
        if !link.to_string_lossy().starts_with(&format!("/memfd:{MEMFD_PREFIX}")) {
            return Err(INVALID_VALUE);
        }
        // SAFETY: a zeroed `stat` is a valid value for fstat to overwrite.
        let mut stat: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: `fd` is open; `stat` is ours.
        if unsafe { libc::fstat(fd.as_raw_fd(), &mut stat) } != 0 {
            return Err(INVALID_VALUE);
        }
        let len = u64::try_from(stat.st_size).ok().filter(|&len| len > 0 && len % GRANULARITY == 0);
        let len = len.and_then(|len| usize::try_from(len).ok()).ok_or(INVALID_VALUE)?;
        Mapping::map(fd, len).ok_or(OUT_OF_MEMORY)
    }

    /// Maps the first `len` bytes of the object open as `fd`, read-write and shared.
    fn map(fd: OwnedFd, len: usize) -> Option<Mapping> {
        // SAFETY: a new mapping, placed by the kernel, of an open descriptor.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        (ptr != libc::MAP_FAILED).then(|| Mapping { ptr: ptr as usize, len: len as u64, fd })
    }

    /// A new descriptor of the object, which the caller owns.
    fn export(&self) -> Result<libc::c_int, u64> {
        self.fd.try_clone().map(IntoRawFd::into_raw_fd).map_err(|_| OUT_OF_MEMORY)
    }

    /// A region of `State::shared` over the whole mapping: a mapped piece of its allocation.
    fn piece(self: &Arc<Mapping>) -> SharedRegion {
        SharedRegion {
            ptr: self.ptr,
            len: self.len,
            name: String::new(),
            owner: false,
            opens: 0,
            borrows: Some(Arc::clone(self)),
        }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the mapping is this one's own, and the last holder of it is going.
        unsafe { libc::munmap(self.ptr as *mut libc::c_void, self.len as usize) };
    }
}

impl Vmm {
    /// Whether a piece of a physical allocation is mapped at `addr` (its bytes are the
    /// allocation there only while mapped, so no one else may take them).
    pub(super) fn maps(&self, addr: u64) -> bool {
        self.mapped.contains_key(&addr)
    }

    /// Forgets the physical allocation `handle` if nothing holds it any more (no reference,
    /// no mapped piece): the bytes of this device's memory that frees (0 for none).
    fn forget_unused(&mut self, handle: u64) -> u64 {
        match self.physical.get(&handle) {
            Some(p) if p.references == 0 && p.maps == 0 => {}
            _ => return 0,
        }
        self.physical.remove(&handle).filter(|p| p.counted).map_or(0, |p| p.len)
    }
}

/// Moves the physical allocation `handle` into a shared memory object named `name`, if it is
/// not there already (a mapped piece moves with it, into `State::shared`): its mapping.
fn share(s: &mut State, handle: u64, name: &str) -> Result<Arc<Mapping>, u64> {
    let Some(p) = s.vmm.physical.get(&handle) else { return Err(INVALID_HANDLE) };
    let at = match &p.backing {
        Backing::Shared(mapping) => return Ok(Arc::clone(mapping)),
        Backing::Owned(Some(bytes)) => {
            let mapping = Arc::new(Mapping::create(name, bytes)?);
            if let Some(p) = s.vmm.physical.get_mut(&handle) {
                p.backing = Backing::Shared(Arc::clone(&mapping));
            }
            return Ok(mapping);
        }
        // Mapped: its bytes are the allocation at the piece's address.
        Backing::Owned(None) => s.vmm.mapped.iter().find(|&(_, &h)| h == handle).map(|(&at, _)| at),
    };
    let Some((at, bytes)) = at.and_then(|at| Some((at, s.allocations.get(&at)?))) else { return Err(INVALID_VALUE) };
    let mapping = Arc::new(Mapping::create(name, bytes)?);
    s.allocations.remove(&at);
    s.shared.insert(at, mapping.piece());
    if let Some(p) = s.vmm.physical.get_mut(&handle) {
        p.backing = Backing::Shared(Arc::clone(&mapping));
    }
    Ok(mapping)
}

impl Emulated {
    /// The VMM functions; None for any other.
    ///
    /// # Safety
    /// Out-parameters are worker buffers sized by the call's descriptor.
    pub(super) unsafe fn invoke_vmm(&self, name: &str, a: &[u64]) -> Option<u64> {
        let arg = |i: usize| a.get(i).copied().unwrap_or(0);
        let mut s = self.state();
        let status = match name {
            "cuMemGetAllocationGranularity" => {
                // SAFETY: the caller's size_t.
                unsafe { put_u64(arg(0), GRANULARITY) };
                SUCCESS
            }
            "cuMemAddressReserve" => {
                let len = arg(1);
                if len == 0 || len % GRANULARITY != 0 {
                    return Some(INVALID_VALUE);
                }
                let base = s.next.div_ceil(GRANULARITY) * GRANULARITY;
                let Some(next) = base.checked_add(len).and_then(|end| end.checked_add(ALIGN)) else {
                    return Some(OUT_OF_MEMORY);
                };
                s.next = next;
                s.vmm.reserved.insert(base, len);
                // SAFETY: the caller's CUdeviceptr.
                unsafe { put_u64(arg(0), base) };
                SUCCESS
            }
            "cuMemAddressFree" => match s.vmm.reserved.get(&arg(0)) {
                Some(&len)
                    if len == arg(1) && s.vmm.mapped.range(arg(0)..arg(0).saturating_add(len)).next().is_none() =>
                {
                    s.vmm.reserved.remove(&arg(0));
                    SUCCESS
                }
                _ => INVALID_VALUE,
            },
            "cuMemCreate" => {
                let len = arg(1);
                if len == 0 || len % GRANULARITY != 0 {
                    return Some(INVALID_VALUE);
                }
                if s.used.saturating_add(len) > self.total_mem() {
                    return Some(OUT_OF_MEMORY);
                }
                let Ok(n) = usize::try_from(len) else { return Some(OUT_OF_MEMORY) };
                // The handle types it may be exported as: CUmemAllocationProp's
                // requestedHandleTypes, after its type.
                let handle_types = match arg(2) {
                    0 => 0,
                    // SAFETY: the caller's CUmemAllocationProp, 32 bytes.
                    prop => unsafe { std::ptr::read_unaligned((prop + 4) as *const u32) },
                };
                let handle = s.handle();
                s.used += len;
                let backing = Backing::Owned(Some(vec![0; n]));
                let p = Physical { len, backing, references: 1, maps: 0, handle_types, counted: true };
                s.vmm.physical.insert(handle, p);
                // SAFETY: the caller's CUmemGenericAllocationHandle.
                unsafe { put_u64(arg(0), handle) };
                SUCCESS
            }
            "cuMemMap" => {
                let (addr, len, offset, handle) = (arg(0), arg(1), arg(2), arg(3));
                let end = addr.saturating_add(len);
                let inside =
                    s.vmm.reserved.range(..=addr).next_back().is_some_and(|(&b, &l)| end <= b.saturating_add(l));
                let free = s
                    .vmm
                    .mapped
                    .range(..end)
                    .next_back()
                    .is_none_or(|(&m, &h)| m.saturating_add(s.vmm.physical.get(&h).map_or(0, |p| p.len)) <= addr);
                match s.vmm.physical.get_mut(&handle) {
                    None => INVALID_HANDLE,
                    Some(p) if !inside || !free || offset != 0 || p.len != len || p.backing.taken() => INVALID_VALUE,
                    Some(p) => {
                        p.maps += 1;
                        match &mut p.backing {
                            Backing::Owned(bytes) => {
                                let bytes = bytes.take().unwrap_or_default();
                                s.allocations.insert(addr, bytes);
                            }
                            Backing::Shared(mapping) => {
                                let piece = mapping.piece();
                                s.shared.insert(addr, piece);
                            }
                        }
                        s.vmm.mapped.insert(addr, handle);
                        SUCCESS
                    }
                }
            }
            "cuMemUnmap" => {
                let (addr, len) = (arg(0), arg(1));
                let pieces: Vec<(u64, u64)> =
                    s.vmm.mapped.range(addr..addr.saturating_add(len)).map(|(&m, &h)| (m, h)).collect();
                if pieces.is_empty() {
                    return Some(INVALID_VALUE);
                }
                for (at, handle) in pieces {
                    s.vmm.mapped.remove(&at);
                    // Owned bytes go back to the handle; a piece of shared memory only goes.
                    let bytes = s.allocations.remove(&at);
                    s.shared.remove(&at);
                    if let Some(p) = s.vmm.physical.get_mut(&handle) {
                        p.maps = p.maps.saturating_sub(1);
                        if let (Backing::Owned(slot), Some(bytes)) = (&mut p.backing, bytes) {
                            *slot = Some(bytes);
                        }
                    }
                    // The handle was released while mapped: the memory goes now.
                    let gone = s.vmm.forget_unused(handle);
                    s.used = s.used.saturating_sub(gone);
                }
                SUCCESS
            }
            "cuMemSetAccess" => {
                let (addr, len) = (arg(0), arg(1));
                if s.vmm.mapped.range(addr..addr.saturating_add(len)).next().is_some() {
                    SUCCESS
                } else {
                    INVALID_VALUE
                }
            }
            "cuMemRelease" => {
                let handle = arg(0);
                let Some(p) = s.vmm.physical.get_mut(&handle) else { return Some(INVALID_HANDLE) };
                p.references = p.references.saturating_sub(1);
                let gone = s.vmm.forget_unused(handle);
                s.used = s.used.saturating_sub(gone);
                SUCCESS
            }
            "cuMemRetainAllocationHandle" => {
                let addr = arg(1);
                let found = s.vmm.mapped.range(..=addr).next_back().map(|(&m, &h)| (m, h));
                let Some((at, handle)) = found else { return Some(INVALID_VALUE) };
                match s.vmm.physical.get_mut(&handle) {
                    Some(p) if addr < at.saturating_add(p.len) => {
                        p.references += 1;
                        // SAFETY: the caller's CUmemGenericAllocationHandle.
                        unsafe { put_u64(arg(0), handle) };
                        SUCCESS
                    }
                    _ => INVALID_VALUE,
                }
            }
            "cuMemGetAllocationPropertiesFromHandle" => {
                let Some(p) = s.vmm.physical.get(&arg(1)) else { return Some(INVALID_HANDLE) };
                // SAFETY: the caller's CUmemAllocationProp: type, handle types, location.
                unsafe {
                    put_u32(arg(0), CUmemAllocationType_enum::CU_MEM_ALLOCATION_TYPE_PINNED);
                    put_u32(arg(0) + 4, p.handle_types);
                    put_u32(arg(0) + 8, CUmemLocationType_enum::CU_MEM_LOCATION_TYPE_DEVICE);
                    put_u32(arg(0) + 12, 0);
                }
                SUCCESS
            }
            // (shareableHandle *, handle, handleType, flags): a new descriptor of the shared
            // memory object the allocation moves into (the first time), which the caller owns.
            "cuMemExportToShareableHandle" => {
                let (out, handle, kind, flags) = (arg(0), arg(1), arg(2), arg(3));
                if out == 0 || flags != 0 {
                    return Some(INVALID_VALUE);
                }
                if kind as u32 != POSIX_FD {
                    return Some(NOT_SUPPORTED);
                }
                match s.vmm.physical.get(&handle) {
                    None => return Some(INVALID_HANDLE),
                    // CUDA exports only as the handle types asked for at creation.
                    Some(p) if p.handle_types & POSIX_FD == 0 => return Some(INVALID_VALUE),
                    Some(_) => {}
                }
                let name = format!("{MEMFD_PREFIX}{}-{}-{handle:x}", std::process::id(), self.instance);
                match share(&mut s, handle, &name).and_then(|mapping| mapping.export()) {
                    Ok(fd) => {
                        // SAFETY: the caller's shareable handle: an int, for a descriptor.
                        unsafe { put_u32(out, fd as u32) };
                        SUCCESS
                    }
                    Err(status) => status,
                }
            }
            // (handle *, osHandle, shHandleType): a new allocation of the memory the
            // descriptor (the number itself, the caller's to close) is open on.
            "cuMemImportFromShareableHandle" => {
                let (out, fd, kind) = (arg(0), arg(1), arg(2));
                if out == 0 {
                    return Some(INVALID_VALUE);
                }
                if kind as u32 != POSIX_FD {
                    return Some(NOT_SUPPORTED);
                }
                let mapping = match Mapping::import(fd) {
                    Ok(mapping) => Arc::new(mapping),
                    Err(status) => return Some(status),
                };
                let handle = s.handle();
                let len = mapping.len;
                let backing = Backing::Shared(mapping);
                let p = Physical { len, backing, references: 1, maps: 0, handle_types: POSIX_FD, counted: false };
                s.vmm.physical.insert(handle, p);
                // SAFETY: the caller's CUmemGenericAllocationHandle.
                unsafe { put_u64(out, handle) };
                SUCCESS
            }
            _ => return None,
        };
        Some(status)
    }
}
