//! Allocation windows on the real GPU: the driver's virtual memory management (address
//! space reserved once, device memory created and mapped into it at the address the client
//! chose). See [`crate::windows`] for what the session checks before it calls these.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Mutex;

use super::symbol_as;
use crate::backend::Window;
use crate::loader::Library;

type Status = i32;

/// CUmemLocation: where memory lives (a device, by ordinal).
#[repr(C)]
#[derive(Clone, Copy)]
struct Location {
    kind: u32,
    id: i32,
}

/// CUmemAllocationProp (CUDA 11.2 to 13): pinned device memory, no shareable handle.
#[repr(C)]
struct AllocationProp {
    kind: u32,
    requested_handle_types: u32,
    location: Location,
    win32_handle_meta_data: *mut c_void,
    /// allocFlags: compression type, GPUDirect RDMA capable, usage, reserved.
    alloc_flags: [u8; 8],
}

/// CUmemAccessDesc.
#[repr(C)]
struct AccessDesc {
    location: Location,
    flags: u32,
}

const ALLOCATION_PINNED: u32 = chidori_cuda::consts::CUmemAllocationType_enum::CU_MEM_ALLOCATION_TYPE_PINNED;
const LOCATION_DEVICE: u32 = chidori_cuda::consts::CUmemLocationType_enum::CU_MEM_LOCATION_TYPE_DEVICE;
const ACCESS_READ_WRITE: u32 = chidori_cuda::consts::CUmemAccess_flags_enum::CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
const GRANULARITY_MINIMUM: u32 =
    chidori_cuda::consts::CUmemAllocationGranularity_flags_enum::CU_MEM_ALLOC_GRANULARITY_MINIMUM;

fn prop(device: i32) -> AllocationProp {
    AllocationProp {
        kind: ALLOCATION_PINNED,
        requested_handle_types: 0,
        location: Location { kind: LOCATION_DEVICE, id: device },
        win32_handle_meta_data: std::ptr::null_mut(),
        alloc_flags: [0; 8],
    }
}

fn check(status: Status, what: &str) -> Result<(), (i64, String)> {
    if status == 0 { Ok(()) } else { Err((i64::from(status), format!("{what} failed with status {status}"))) }
}

fn function<F: Copy>(driver: &Library, name: &str) -> Result<F, (i64, String)> {
    symbol_as(driver, name).map_err(|e| (NOT_SUPPORTED, format!("the server's driver has no {name}: {e}")))
}

/// The driver's CUdevice of an ordinal.
fn device_handle(driver: &Library, ordinal: i32) -> Result<i32, (i64, String)> {
    let device_get: unsafe extern "C" fn(*mut i32, i32) -> Status = function(driver, "cuDeviceGet")?;
    let mut dev = 0i32;
    // SAFETY: a local out-value; the driver checks the ordinal.
    check(unsafe { device_get(&mut dev, ordinal) }, "cuDeviceGet")?;
    Ok(dev)
}

/// Each device's primary context, retained once for the worker's life (the worker is one
/// session's): the free memory is asked and the device synchronized in it.
static PRIMARY: Mutex<Option<HashMap<i32, u64>>> = Mutex::new(None);

/// Run `f` with `device`'s primary context current on this thread, then put back what was.
fn in_primary<T>(
    driver: &Library,
    device: i32,
    f: impl FnOnce() -> Result<T, (i64, String)>,
) -> Result<T, (i64, String)> {
    let get_current: unsafe extern "C" fn(*mut u64) -> Status = function(driver, "cuCtxGetCurrent")?;
    let set_current: unsafe extern "C" fn(u64) -> Status = function(driver, "cuCtxSetCurrent")?;
    let primary = {
        let mut known = PRIMARY.lock().unwrap_or_else(|p| p.into_inner());
        let known = known.get_or_insert_with(HashMap::new);
        match known.get(&device) {
            Some(&ctx) => ctx,
            None => {
                let retain: unsafe extern "C" fn(*mut u64, i32) -> Status =
                    function(driver, "cuDevicePrimaryCtxRetain")?;
                let dev = device_handle(driver, device)?;
                let mut ctx = 0u64;
                // SAFETY: a local out-value and a device the driver gave.
                check(unsafe { retain(&mut ctx, dev) }, "cuDevicePrimaryCtxRetain")?;
                known.insert(device, ctx);
                ctx
            }
        }
    };
    let mut saved = 0u64;
    // SAFETY: a local out-value, then a context the driver gave.
    unsafe {
        check(get_current(&mut saved), "cuCtxGetCurrent")?;
        check(set_current(primary), "cuCtxSetCurrent")?;
    }
    let out = f();
    // SAFETY: the context current before (possibly none).
    unsafe { set_current(saved) };
    out
}

/// Reserve `size` bytes (rounded up to the granularity) of address space on `device`, on a
/// device whose driver manages virtual memory, and make and free one granule in it: a GPU
/// that cannot (a virtual GPU without it) refuses the window here, and the client's
/// allocations wait, rather than failing later where the program was told they succeeded.
pub fn reserve(driver: &Library, device: i32, size: u64) -> Result<Window, (i64, String)> {
    let attribute: unsafe extern "C" fn(*mut i32, u32, i32) -> Status = function(driver, "cuDeviceGetAttribute")?;
    let dev = device_handle(driver, device)?;
    let mut supported = 0i32;
    // SAFETY: a local out-value and a device the driver gave.
    check(unsafe { attribute(&mut supported, VMM_SUPPORTED, dev) }, "cuDeviceGetAttribute")?;
    if supported == 0 {
        return Err((NOT_SUPPORTED, format!("device {device} has no virtual memory management")));
    }
    let granularity_of: unsafe extern "C" fn(*mut usize, *const AllocationProp, u32) -> Status =
        function(driver, "cuMemGetAllocationGranularity")?;
    let address_reserve: unsafe extern "C" fn(*mut u64, usize, usize, u64, u64) -> Status =
        function(driver, "cuMemAddressReserve")?;
    let mem_get_info: unsafe extern "C" fn(*mut usize, *mut usize) -> Status = function(driver, "cuMemGetInfo_v2")?;
    let p = prop(device);
    let mut granularity = 0usize;
    // SAFETY: a local out-value and a filled property record.
    check(unsafe { granularity_of(&mut granularity, &p, GRANULARITY_MINIMUM) }, "cuMemGetAllocationGranularity")?;
    let granularity = (granularity as u64).max(1);
    let size = size.div_ceil(granularity).saturating_mul(granularity);
    let len = usize::try_from(size).map_err(|_| (INVALID_VALUE, format!("a window of {size} bytes")))?;
    let free = in_primary(driver, device, || {
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: local out-values; the device's primary context is current.
        check(unsafe { mem_get_info(&mut free, &mut total) }, "cuMemGetInfo")?;
        Ok(free as u64)
    })?;
    let mut base = 0u64;
    // SAFETY: a local out-value; no fixed address asked.
    check(unsafe { address_reserve(&mut base, len, granularity as usize, 0, 0) }, "cuMemAddressReserve")?;
    let tried = map(driver, device, base, granularity).and_then(|()| unmap_range(driver, base, granularity));
    if let Err((status, message)) = tried {
        let address_free: unsafe extern "C" fn(u64, usize) -> Status = function(driver, "cuMemAddressFree")?;
        // SAFETY: the range reserved above, nothing mapped in it.
        unsafe { address_free(base, len) };
        return Err((status, format!("device {device} cannot make memory in a reserved range: {message}")));
    }
    Ok(Window { base, size, granularity, free })
}

const INVALID_VALUE: i64 = chidori_cuda::consts::cudaError_enum::CUDA_ERROR_INVALID_VALUE as i64;
const NOT_SUPPORTED: i64 = chidori_cuda::consts::cudaError_enum::CUDA_ERROR_NOT_SUPPORTED as i64;
const VMM_SUPPORTED: u32 =
    chidori_cuda::consts::CUdevice_attribute_enum::CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED;

/// Create `size` bytes of device memory on `device` and map them at `address` (inside a
/// reserved window), readable and writable from that device.
pub fn map(driver: &Library, device: i32, address: u64, size: u64) -> Result<(), (i64, String)> {
    let create: unsafe extern "C" fn(*mut u64, usize, *const AllocationProp, u64) -> Status =
        function(driver, "cuMemCreate")?;
    let map: unsafe extern "C" fn(u64, usize, usize, u64, u64) -> Status = function(driver, "cuMemMap")?;
    let set_access: unsafe extern "C" fn(u64, usize, *const AccessDesc, usize) -> Status =
        function(driver, "cuMemSetAccess")?;
    let unmap: unsafe extern "C" fn(u64, usize) -> Status = function(driver, "cuMemUnmap")?;
    let release: unsafe extern "C" fn(u64) -> Status = function(driver, "cuMemRelease")?;
    let len = usize::try_from(size).map_err(|_| (INVALID_VALUE, format!("an allocation of {size} bytes")))?;
    let p = prop(device);
    let access = AccessDesc { location: p.location, flags: ACCESS_READ_WRITE };
    let mut handle = 0u64;
    // SAFETY: a local out-value and a filled property record.
    check(unsafe { create(&mut handle, len, &p, 0) }, "cuMemCreate")?;
    // SAFETY: the range lies in the session's window and overlaps no mapping (checked by
    // the session); the handle was just made, of the same size.
    let mapped = check(unsafe { map(address, len, 0, handle, 0) }, "cuMemMap").and_then(|()| {
        // SAFETY: the range just mapped; one access record.
        let r = check(unsafe { set_access(address, len, &access, 1) }, "cuMemSetAccess");
        if r.is_err() {
            // SAFETY: mapped just above.
            unsafe { unmap(address, len) };
        }
        r
    });
    // The mapping holds the memory from here on: its unmap frees it.
    // SAFETY: the handle made above, released once.
    unsafe { release(handle) };
    mapped
}

/// Synchronize `device` (cudaFree's wait for the work queued before it), then unmap the
/// allocation at `address`, which frees its memory. After a reset of the device's primary
/// context (`reset`) there is nothing to wait for, and the context retained before is
/// retained again at the next use.
pub fn unmap(driver: &Library, device: i32, address: u64, size: u64, reset: bool) -> Result<(), (i64, String)> {
    let synchronize: unsafe extern "C" fn() -> Status = function(driver, "cuCtxSynchronize")?;
    if reset {
        if let Some(known) = PRIMARY.lock().unwrap_or_else(|p| p.into_inner()).as_mut() {
            known.remove(&device);
        }
    } else {
        // SAFETY: no arguments; the device's primary context is current.
        in_primary(driver, device, || check(unsafe { synchronize() }, "cuCtxSynchronize"))?;
    }
    unmap_range(driver, address, size)
}

/// Unmap what map() made at `address`, which frees its memory.
fn unmap_range(driver: &Library, address: u64, size: u64) -> Result<(), (i64, String)> {
    let unmap: unsafe extern "C" fn(u64, usize) -> Status = function(driver, "cuMemUnmap")?;
    let len = usize::try_from(size).map_err(|_| (INVALID_VALUE, format!("an allocation of {size} bytes")))?;
    // SAFETY: a mapping map() made (checked by the session), unmapped once.
    check(unsafe { unmap(address, len) }, "cuMemUnmap")
}
