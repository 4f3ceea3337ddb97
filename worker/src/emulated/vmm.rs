//! The driver's virtual memory management, emulated: reserved address ranges, physical
//! allocations (handles with a reference count: `cuMemRetainAllocationHandle` takes one),
//! mapped into a range one piece at a time. A mapped piece is an allocation at its address
//! while mapped (a copy must stay inside one piece here, unlike on a GPU); its bytes go back
//! to its handle when unmapped, so mapping it again shows them, and go when the handle's last
//! reference does.

use std::collections::{BTreeMap, HashMap};

use chidori_cuda::consts::{CUmemAllocationType_enum, CUmemLocationType_enum, cudaError_enum as status};

use super::{ALIGN, Emulated, put_u32, put_u64};

const SUCCESS: u64 = status::CUDA_SUCCESS as u64;
const INVALID_VALUE: u64 = status::CUDA_ERROR_INVALID_VALUE as u64;
const OUT_OF_MEMORY: u64 = status::CUDA_ERROR_OUT_OF_MEMORY as u64;
const INVALID_HANDLE: u64 = status::CUDA_ERROR_INVALID_HANDLE as u64;

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
    /// The bytes while unmapped; None while mapped (they are an allocation then).
    bytes: Option<Vec<u8>>,
    /// The program's references: cuMemCreate's and each retain's.
    references: u32,
}

impl Vmm {
    /// Whether a piece of a physical allocation is mapped at `addr` (its bytes are the
    /// allocation there only while mapped, so no one else may take them).
    pub(super) fn maps(&self, addr: u64) -> bool {
        self.mapped.contains_key(&addr)
    }
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
                let handle = s.handle();
                s.used += len;
                s.vmm.physical.insert(handle, Physical { len, bytes: Some(vec![0; n]), references: 1 });
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
                    Some(p) if !inside || !free || offset != 0 || p.len != len || p.bytes.is_none() => INVALID_VALUE,
                    Some(p) => {
                        let bytes = p.bytes.take().unwrap_or_default();
                        s.vmm.mapped.insert(addr, handle);
                        s.allocations.insert(addr, bytes);
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
                    let bytes = s.allocations.remove(&at).unwrap_or_default();
                    match s.vmm.physical.get_mut(&handle) {
                        Some(p) if p.references > 0 => p.bytes = Some(bytes),
                        // The handle was released while mapped: the memory goes now.
                        Some(p) => {
                            let gone = p.len;
                            s.vmm.physical.remove(&handle);
                            s.used = s.used.saturating_sub(gone);
                        }
                        None => {}
                    }
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
                if p.references == 0 && p.bytes.is_some() {
                    let gone = p.len;
                    s.vmm.physical.remove(&handle);
                    s.used = s.used.saturating_sub(gone);
                }
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
                if !s.vmm.physical.contains_key(&arg(1)) {
                    return Some(INVALID_HANDLE);
                }
                // SAFETY: the caller's CUmemAllocationProp: type, handle types, location.
                unsafe {
                    put_u32(arg(0), CUmemAllocationType_enum::CU_MEM_ALLOCATION_TYPE_PINNED);
                    put_u32(arg(0) + 4, 0);
                    put_u32(arg(0) + 8, CUmemLocationType_enum::CU_MEM_LOCATION_TYPE_DEVICE);
                    put_u32(arg(0) + 12, 0);
                }
                SUCCESS
            }
            _ => return None,
        };
        Some(status)
    }
}
