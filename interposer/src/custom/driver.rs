//! Hand-written driver API functions.
//!
//! Every `unsafe fn` here has the safety contract of the CUDA function of the same name:
//! pointer arguments must be what that function's documentation requires.
#![allow(non_snake_case, clippy::missing_safety_doc)]

use std::ffi::{CStr, c_char, c_void};

const INVALID_VALUE: u32 = chidori_cuda::consts::cudaError_enum::CUDA_ERROR_INVALID_VALUE;

/// Newest CUDA version whose status table describes the driver's codes (they only grow).
const TABLE_VERSION: &str = "13.1";

fn lookup(error: u32, name: bool, out: *mut c_void) -> u32 {
    crate::guard::ffi("cuGetErrorName", INVALID_VALUE, || {
        // SAFETY: `out` is the caller's `const char**` or NULL.
        match unsafe { crate::runtime::write_status_text(TABLE_VERSION, "driver", i64::from(error), name, out) } {
            Some(true) => SUCCESS,
            _ => INVALID_VALUE,
        }
    })
}

/// # Safety
/// `pStr` must be null or point to writable `const char*` storage.
pub unsafe fn cuGetErrorName(error: u32, pStr: *mut c_void) -> u32 {
    lookup(error, true, pStr)
}

/// # Safety
/// `pStr` must be null or point to writable `const char*` storage.
pub unsafe fn cuGetErrorString(error: u32, pStr: *mut c_void) -> u32 {
    lookup(error, false, pStr)
}

// ---- Devices, answered from the handshake's profile ----

use std::sync::Arc;

use chidori_cuda::calls::driver as calls;

use crate::conn::{self, Conn};
use crate::custom::memory;
use crate::state::{self, Memory};

const SUCCESS: u32 = chidori_cuda::consts::cudaError_enum::CUDA_SUCCESS;
const OUT_OF_MEMORY: u32 = chidori_cuda::consts::cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY;
const NO_DEVICE: u32 = chidori_cuda::consts::cudaError_enum::CUDA_ERROR_NO_DEVICE;
const INVALID_DEVICE: u32 = chidori_cuda::consts::cudaError_enum::CUDA_ERROR_INVALID_DEVICE;
const HOST_MEMORY_ALREADY_REGISTERED: u32 =
    chidori_cuda::consts::cudaError_enum::CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
const HOST_MEMORY_NOT_REGISTERED: u32 = chidori_cuda::consts::cudaError_enum::CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;

fn connection() -> Result<Arc<Conn>, u32> {
    conn::get().map_err(|_| NO_DEVICE)
}

fn driver(name: &'static str, body: impl FnOnce() -> Result<u32, u32>) -> u32 {
    crate::guard::ffi(name, INVALID_VALUE, || {
        crate::trace::local(name);
        body().unwrap_or_else(|e| e)
    })
}

/// # Safety
/// `p` must be null or writable for a `T`.
unsafe fn put<T>(p: *mut c_void, v: T) -> Result<u32, u32> {
    if p.is_null() {
        return Err(INVALID_VALUE);
    }
    // SAFETY: per the contract.
    unsafe { std::ptr::write_unaligned(p as *mut T, v) };
    Ok(SUCCESS)
}

pub unsafe fn cuDeviceGetCount(count: *mut c_void) -> u32 {
    driver("cuDeviceGetCount", || {
        let n = connection().map(|c| c.profile.devices.len() as i32);
        // SAFETY: the caller's int.
        unsafe { put(count, *n.as_ref().unwrap_or(&0)) }?;
        n.map(|_| SUCCESS)
    })
}

pub unsafe fn cuDeviceGet(device: *mut c_void, ordinal: i32) -> u32 {
    driver("cuDeviceGet", || {
        connection()?.profile.device(ordinal).ok_or(INVALID_DEVICE)?;
        // SAFETY: the caller's CUdevice (int).
        unsafe { put(device, ordinal) }
    })
}

pub unsafe fn cuDeviceGetName(name: *mut c_void, len: i32, dev: i32) -> u32 {
    driver("cuDeviceGetName", || {
        let conn = connection()?;
        let d = conn.profile.device(dev).ok_or(INVALID_DEVICE)?;
        if name.is_null() || len <= 0 {
            return Err(INVALID_VALUE);
        }
        let n = d.name.len().min(len as usize - 1);
        // SAFETY: the caller's buffer of `len` bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(d.name.as_ptr(), name as *mut u8, n);
            *(name as *mut u8).add(n) = 0;
        }
        Ok(SUCCESS)
    })
}

pub unsafe fn cuDeviceGetAttribute(pi: *mut c_void, attrib: u32, dev: i32) -> u32 {
    driver("cuDeviceGetAttribute", || {
        let conn = connection()?;
        let d = conn.profile.device(dev).ok_or(INVALID_DEVICE)?;
        let v = *d.attributes.get(&(attrib as i32)).ok_or(INVALID_VALUE)?;
        // SAFETY: the caller's int.
        unsafe { put(pi, v) }
    })
}

pub unsafe fn cuDeviceTotalMem_v2(bytes: *mut c_void, dev: i32) -> u32 {
    driver("cuDeviceTotalMem_v2", || {
        let conn = connection()?;
        let d = conn.profile.device(dev).ok_or(INVALID_DEVICE)?;
        // SAFETY: the caller's size_t.
        unsafe { put(bytes, d.total_mem as usize) }
    })
}

/// Write device `dev`'s UUID (from the handshake's profile) to `out`.
///
/// # Safety
/// `out` is NULL or valid for 16 bytes of writes (put checks NULL).
pub(super) unsafe fn uuid(out: *mut c_void, dev: i32) -> u32 {
    driver("cuDeviceGetUuid", || {
        let conn = connection()?;
        let d = conn.profile.device(dev).ok_or(INVALID_DEVICE)?;
        // SAFETY: the caller's CUuuid (16 bytes).
        unsafe { put(out, d.uuid) }
    })
}

/// cuDeviceGetUuid and its `_v2`: the device's UUID from the handshake's profile.
pub unsafe fn device_uuid(_: &Ctx, out: *mut c_void, dev: i32) -> u32 {
    // SAFETY: the caller's CUuuid, as CUDA's contract says.
    unsafe { uuid(out, dev) }
}

pub unsafe fn cuDriverGetVersion(driverVersion: *mut c_void) -> u32 {
    driver("cuDriverGetVersion", || {
        let v = connection()?.profile.driver_version;
        // SAFETY: the caller's int.
        unsafe { put(driverVersion, v) }
    })
}

pub unsafe fn cuDeviceComputeCapability(major: *mut c_void, minor: *mut c_void, dev: i32) -> u32 {
    driver("cuDeviceComputeCapability", || {
        let conn = connection()?;
        let d = conn.profile.device(dev).ok_or(INVALID_DEVICE)?;
        use chidori_cuda::consts::CUdevice_attribute_enum as attr;
        let value = |a: u32| d.attributes.get(&(a as i32)).copied().unwrap_or(0);
        let (a, b) = (
            value(attr::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR),
            value(attr::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR),
        );
        // SAFETY: the caller's ints.
        unsafe {
            put(major, a)?;
            put(minor, b)
        }
    })
}

// ---- Memory ----

pub unsafe fn cuMemAlloc_v2(dptr: *mut c_void, bytesize: usize) -> u32 {
    driver("cuMemAlloc_v2", || {
        let conn = connection()?;
        // SAFETY: the caller's CUdeviceptr*, a size.
        let s = unsafe { crate::runtime::call_on(&conn, &calls::cuMemAlloc_v2__call, &[dptr as u64, bytesize as u64]) }
            as u32;
        if s == SUCCESS && !dptr.is_null() {
            // SAFETY: written by the reply.
            let base = unsafe { std::ptr::read_unaligned(dptr as *const u64) };
            state::add(base, bytesize as u64, Memory::Device { device: state::current_device() });
            crate::custom::placed::noted(base, bytesize as u64);
        }
        Ok(s)
    })
}

pub unsafe fn cuMemFree_v2(dptr: u64) -> u32 {
    driver("cuMemFree_v2", || free(&calls::cuMemFree_v2__call, &[dptr]))
}

/// cuMemFreeAsync and its `_ptsz` form: as cuMemFree, in the stream's order.
pub unsafe fn mem_free_async(ctx: &Ctx, dptr: u64, stream: *mut c_void) -> u32 {
    driver(ctx.name, || free(ctx.form(Form::Call), &[dptr, ctx.stream(stream as u64)]))
}

/// Free `args[0]` by `desc`: managed and placed memory here, device memory on the server;
/// what was freed leaves the interval map.
fn free(desc: &'static chidori_protocol::desc::CallDesc, args: &[u64]) -> Result<u32, u32> {
    let conn = connection()?;
    let dptr = args[0];
    if memory::is_managed_base(dptr) {
        return Ok(memory::managed_free(&conn, &calls::cuCtxSynchronize__call, dptr));
    }
    if let Some(s) = crate::custom::placed::free(&conn, dptr) {
        return Ok(s);
    }
    // SAFETY: a device address and possibly a stream handle, by value.
    let s = unsafe { crate::runtime::call_on(&conn, desc, args) } as u32;
    if s == SUCCESS && dptr != 0 {
        state::freed(dptr);
        crate::custom::placed::forgotten(dptr);
    }
    Ok(s)
}

/// Managed memory: client memory the server mirrors for the GPU (see `cudaMallocManaged`).
/// `flags`: CU_MEM_ATTACH_GLOBAL or CU_MEM_ATTACH_HOST.
pub unsafe fn cuMemAllocManaged(dptr: *mut c_void, bytesize: usize, flags: u32) -> u32 {
    use chidori_cuda::consts::CUmemAttach_flags_enum::{CU_MEM_ATTACH_GLOBAL, CU_MEM_ATTACH_HOST};
    driver("cuMemAllocManaged", || {
        if dptr.is_null() || bytesize == 0 || !(flags == CU_MEM_ATTACH_GLOBAL || flags == CU_MEM_ATTACH_HOST) {
            return Err(INVALID_VALUE);
        }
        let p = memory::managed_alloc(bytesize).ok_or(OUT_OF_MEMORY)?;
        // SAFETY: the caller's CUdeviceptr*.
        unsafe { put(dptr, p as u64) }
    })
}

pub unsafe fn cuMemAllocHost_v2(pp: *mut c_void, bytesize: usize) -> u32 {
    // SAFETY: same contract.
    unsafe { cuMemHostAlloc(pp, bytesize, 0) }
}

pub unsafe fn cuMemHostAlloc(pp: *mut c_void, bytesize: usize, Flags: u32) -> u32 {
    driver("cuMemHostAlloc", || {
        if pp.is_null() {
            return Err(INVALID_VALUE);
        }
        let p = memory::host_alloc(bytesize, Flags).ok_or(OUT_OF_MEMORY)?;
        // SAFETY: the caller's void**.
        unsafe { put(pp, p) }
    })
}

pub unsafe fn cuMemFreeHost(p: *mut c_void) -> u32 {
    driver("cuMemFreeHost", || if memory::host_free(p) { Ok(SUCCESS) } else { Err(INVALID_VALUE) })
}

pub unsafe fn cuMemHostRegister_v2(p: *mut c_void, bytesize: usize, Flags: u32) -> u32 {
    driver("cuMemHostRegister_v2", || {
        if p.is_null() || bytesize == 0 {
            return Err(INVALID_VALUE);
        }
        if state::find(p as u64).is_some() {
            return Err(HOST_MEMORY_ALREADY_REGISTERED);
        }
        state::add(p as u64, bytesize as u64, Memory::Registered { flags: Flags });
        crate::mirror::note_outside_arena();
        Ok(SUCCESS)
    })
}

pub unsafe fn cuMemHostUnregister(p: *mut c_void) -> u32 {
    driver("cuMemHostUnregister", || match state::find(p as u64) {
        Some(r) if r.base == p as u64 && matches!(r.memory, Memory::Registered { .. }) => {
            crate::mirror::forget(r.base);
            state::remove(r.base);
            Ok(SUCCESS)
        }
        _ => Err(HOST_MEMORY_NOT_REGISTERED),
    })
}

/// Pinned memory's device address is its host address (see cudaHostGetDevicePointer).
pub unsafe fn cuMemHostGetDevicePointer_v2(pdptr: *mut c_void, p: *mut c_void, Flags: u32) -> u32 {
    driver("cuMemHostGetDevicePointer_v2", || {
        if pdptr.is_null() || Flags != 0 || !state::is_pinned(p as u64) {
            return Err(INVALID_VALUE);
        }
        // SAFETY: the caller's CUdeviceptr*.
        unsafe { put(pdptr, p as u64) }
    })
}

pub unsafe fn cuMemHostGetFlags(pFlags: *mut c_void, p: *mut c_void) -> u32 {
    driver("cuMemHostGetFlags", || match state::find(p as u64).map(|r| r.memory) {
        // SAFETY: the caller's unsigned int.
        Some(Memory::Pinned { flags } | Memory::Registered { flags }) => unsafe { put(pFlags, flags) },
        _ => Err(INVALID_VALUE),
    })
}

/// Answered from the interval map: Triton asks this for every pointer argument of every
/// launch, so it must cost no round trip.
pub unsafe fn cuPointerGetAttribute(data: *mut c_void, attribute: u32, ptr: u64) -> u32 {
    driver("cuPointerGetAttribute", || {
        let range = state::find(ptr).ok_or(INVALID_VALUE)?;
        let managed = matches!(range.memory, Memory::Managed);
        let device = match range.memory {
            Memory::Device { device } => Some(device),
            // Managed memory is device memory at the host's address.
            Memory::Managed => Some(state::current_device()),
            _ => None,
        };
        use chidori_cuda::consts::CUmemorytype_enum::{CU_MEMORYTYPE_DEVICE, CU_MEMORYTYPE_HOST};
        use chidori_cuda::consts::CUpointer_attribute_enum as a;
        // SAFETY (all arms): `data` is the caller's storage of the attribute's type.
        unsafe {
            match attribute {
                a::CU_POINTER_ATTRIBUTE_MEMORY_TYPE => {
                    put(data, if device.is_some() { CU_MEMORYTYPE_DEVICE } else { CU_MEMORYTYPE_HOST })
                }
                // Every range CUDA knows is mapped for the device at its own address (unified
                // addressing: page-locked host memory too); both pointers for host and
                // managed memory.
                a::CU_POINTER_ATTRIBUTE_DEVICE_POINTER => put(data, ptr),
                a::CU_POINTER_ATTRIBUTE_HOST_POINTER => put(data, if device.is_some() && !managed { 0 } else { ptr }),
                a::CU_POINTER_ATTRIBUTE_IS_MANAGED => put(data, u32::from(managed)),
                a::CU_POINTER_ATTRIBUTE_MAPPED => put(data, 1u32),
                a::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL => put(data, device.unwrap_or(state::current_device())),
                a::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR => put(data, range.base),
                a::CU_POINTER_ATTRIBUTE_RANGE_SIZE => put(data, range.len as usize),
                _ => Err(INVALID_VALUE),
            }
        }
    })
}

// ---- Copies, in chunks ----

/// A copy between the program's memory and the device on `stream` (`desc`: a
/// cuMemcpyHtoD/DtoH form, `to_device` its direction) while some capture may be active: on a
/// capturing stream it becomes a node of the server's graph, which replays there, so it
/// copies the server's mirror of the program's memory ([`memory::captured`]), sent as a
/// device-to-device copy. None: the stream does not capture (the copy goes the usual way).
fn captured_copy(
    conn: &Conn,
    desc: &chidori_protocol::desc::CallDesc,
    dst: u64,
    src: u64,
    n: u64,
    stream: u64,
    to_device: bool,
) -> Option<u32> {
    if !any_active() {
        return None;
    }
    // NULL from a per-thread entry point is the thread's stream.
    let stream = if desc.name.ends_with("_ptsz") && stream == 0 { 2 } else { stream };
    match memory::captured(conn, Some(stream), (dst, n), (src, n), (to_device, !to_device)) {
        Err(status) => Some(status),
        // SAFETY: device addresses (the program's memory named by its address, which the
        // server gives its mirror's), a count and a stream, by value.
        Ok((true, true)) => {
            Some(unsafe { crate::runtime::call_on(conn, &calls::cuMemcpyDtoDAsync_v2, &[dst, src, n, stream]) } as u32)
        }
        Ok(_) => None,
    }
}

fn copy(
    name: &'static str,
    desc: &'static chidori_protocol::desc::CallDesc,
    dst: u64,
    src: u64,
    n: u64,
    tail: &[u64],
) -> u32 {
    driver(name, || {
        let conn = connection()?;
        let host_source = matches!(
            desc.params.get(1),
            Some(chidori_protocol::desc::Wire::Buf { dir: chidori_protocol::desc::Dir::In, .. })
        );
        if let Some(&stream) = tail.first()
            && n > 0
            && let Some(status) = captured_copy(&conn, desc, dst, src, n, stream, host_source)
        {
            return Ok(status);
        }
        // A source of host bytes (host to device): the GPU reads it when the stream reaches
        // the copy, after every host callback enqueued before it, which may write it (as
        // for the runtime's copies).
        if host_source {
            conn.wait_callbacks(tail.first().copied().unwrap_or(0));
        }
        let chunks: Vec<Vec<u64>> = (0..n.max(1))
            .step_by(memory::CHUNK as usize)
            .map(|off| {
                let mut a = vec![dst + off, src + off, memory::CHUNK.min(n - off)];
                a.extend_from_slice(tail);
                a
            })
            .collect();
        if n == 0 {
            return Ok(SUCCESS);
        }
        if desc.name.starts_with("cuMemcpyDtoHAsync") {
            // Into pageable memory (pinned goes elsewhere): a read-back on a stream.
            // SAFETY: the host destination is the caller's buffer of `n` bytes.
            return Ok(unsafe { super::sync::read_back(&conn, desc, tail.first().copied(), &chunks) } as u32);
        }
        if desc.name.starts_with("cuMemcpyHtoDAsync") {
            // SAFETY: the host source is the caller's buffer of `n` bytes.
            return Ok(unsafe { super::sync::copy_in(&conn, desc, (dst, n), tail.first().copied(), &chunks) } as u32);
        }
        // SAFETY: host pointers are the caller's buffers of `n` bytes (CUDA's contract).
        Ok(unsafe { crate::runtime::call_pipelined(&conn, desc, &chunks) } as u32)
    })
}

/// cuMemcpyHtoD_v2, cuMemcpyDtoH_v2, cuMemcpyHtoDAsync_v2 and their per-thread forms
/// (`raw_args`: dst, src, count[, stream]): the form names the host side.
pub unsafe fn copy_raw(ctx: &Ctx, args: &[u64]) -> u64 {
    let word = |i: usize| args.get(i).copied().unwrap_or(0);
    let tail = args.get(3..).unwrap_or(&[]);
    u64::from(copy(ctx.base_name(), ctx.form(Form::Call), word(0), word(1), word(2), tail))
}

/// cuMemcpy, cuMemcpyAsync and their per-thread forms: on unified addresses, each side is
/// the program's memory or the GPU's as the interval map says, and the copy goes in that
/// direction's wire form, as cudaMemcpy's with cudaMemcpyDefault.
fn unified(ctx: &Ctx, dst: u64, src: u64, n: u64, stream: Option<u64>) -> u32 {
    driver(ctx.name, || {
        let direction = memory::direction(chidori_cuda::consts::cudaMemcpyKind::cudaMemcpyDefault, dst, src)
            .ok_or(INVALID_VALUE)?;
        let conn = connection()?;
        let forms = memory::CopyForms::of(ctx);
        let tail: &[u64] = match &stream {
            Some(s) => std::slice::from_ref(s),
            None => &[],
        };
        // SAFETY: host sides are the caller's buffers of `n` bytes (cuMemcpy's contract).
        Ok(unsafe { memory::copy(&conn, &forms, dst, src, n, direction, tail, stream.is_some()) } as u32)
    })
}

/// cuMemcpy, cuMemcpyAsync and their per-thread forms (`raw_args`: dst, src, count[,
/// stream]).
pub unsafe fn unified_raw(ctx: &Ctx, args: &[u64]) -> u64 {
    let word = |i: usize| args.get(i).copied().unwrap_or(0);
    u64::from(unified(ctx, word(0), word(1), word(2), args.get(3).copied()))
}

fn copy_dtoh_async(desc: &'static chidori_protocol::desc::CallDesc, dst: u64, src: u64, n: u64, stream: u64) -> u32 {
    if !state::is_pinned(dst) {
        // Pageable destination: synchronous, as in CUDA.
        return copy("cuMemcpyDtoHAsync_v2", desc, dst, src, n, &[stream]);
    }
    driver("cuMemcpyDtoHAsync_v2", || {
        let conn = connection()?;
        if n > 0
            && let Some(status) = captured_copy(&conn, desc, dst, src, n, stream, false)
        {
            return Ok(status);
        }
        for off in (0..n).step_by(memory::CHUNK as usize) {
            let a = [dst + off, src + off, memory::CHUNK.min(n - off), stream];
            // SAFETY: the pinned destination stays valid until the program synchronizes.
            if unsafe { crate::runtime::send_deferred(&conn, desc, &a) }.is_none() {
                return Err(NO_DEVICE);
            }
        }
        Ok(SUCCESS)
    })
}

pub unsafe fn cuMemcpyDtoHAsync_v2(
    dstHost: *mut c_void,
    srcDevice: u64,
    ByteCount: usize,
    hStream: *mut c_void,
) -> u32 {
    copy_dtoh_async(&calls::cuMemcpyDtoHAsync_v2__call, dstHost as u64, srcDevice, ByteCount as u64, hStream as u64)
}

pub unsafe fn cuMemcpyDtoHAsync_v2_ptsz(
    dstHost: *mut c_void,
    srcDevice: u64,
    ByteCount: usize,
    hStream: *mut c_void,
) -> u32 {
    copy_dtoh_async(
        &calls::cuMemcpyDtoHAsync_v2_ptsz__call,
        dstHost as u64,
        srcDevice,
        ByteCount as u64,
        hStream as u64,
    )
}

// ---- Host functions ----

type HostFn = unsafe extern "C" fn(*mut c_void);

fn launch_host_func(
    desc: &'static chidori_protocol::desc::CallDesc,
    stream: *mut c_void,
    f: *mut c_void,
    user: *mut c_void,
) -> u32 {
    driver("cuLaunchHostFunc", || {
        if f.is_null() {
            return Err(INVALID_VALUE);
        }
        let conn = connection()?;
        let (f, user) = (f as usize, user as usize);
        let id = conn.register_callback(
            Arc::new(move |_status| {
                // SAFETY: the program's CUhostFn and its user data, called as the driver would.
                unsafe { std::mem::transmute::<usize, HostFn>(f)(user as *mut c_void) }
            }),
            stream as u64,
            any_active(),
        );
        // SAFETY: values only: the stream, the callback id in place of the function.
        let s = unsafe { crate::runtime::call_on(&conn, desc, &[stream as u64, id, 0]) } as u32;
        if s != SUCCESS {
            conn.drop_callback(id);
        }
        Ok(s)
    })
}

/// cuLaunchHostFunc and its per-thread form.
pub unsafe fn launch_host_function(ctx: &Ctx, stream: *mut c_void, f: *mut c_void, data: *mut c_void) -> u32 {
    launch_host_func(ctx.form(Form::Host), stream, f, data)
}

/// Whether `mode` is a sync mode of cuLaunchHostFunc_v2 and cudaLaunchHostFunc_v2 (CUDA
/// 13.5). Either way the server's CUDA thread waits blocking: the function runs on the
/// client, a network round trip away, where spinning would only hold a server core.
pub(crate) fn host_sync_mode_known(mode: u32) -> bool {
    use chidori_cuda::consts::CUhostTaskSyncMode_enum::{CU_HOST_TASK_BLOCKING, CU_HOST_TASK_SPINWAIT};
    matches!(mode, CU_HOST_TASK_BLOCKING | CU_HOST_TASK_SPINWAIT)
}

/// cuLaunchHostFunc_v2 and its per-thread form (CUDA 13.5).
pub unsafe fn launch_host_function_v2(
    ctx: &Ctx,
    stream: *mut c_void,
    f: *mut c_void,
    data: *mut c_void,
    sync_mode: u32,
) -> u32 {
    if !host_sync_mode_known(sync_mode) {
        return INVALID_VALUE;
    }
    launch_host_func(ctx.form(Form::Host), stream, f, data)
}

// ---- Modules and launches ----

/// cuFuncGetParamCount and cuKernelGetParamCount (CUDA 13.5): how many parameters the
/// function's layout has (a module loaded through the client brought it; others are asked
/// of the server once).
pub unsafe fn get_param_count(ctx: &Ctx, f: *mut c_void, count: *mut c_void) -> u32 {
    driver(ctx.name, || {
        if f.is_null() {
            return Err(ctx.status(ctx.codes.invalid_handle));
        }
        if count.is_null() {
            return Err(INVALID_VALUE);
        }
        let conn = connection()?;
        let params = modules::function_params(&conn, f as u64)?;
        // SAFETY: the caller's size_t.
        unsafe { put(count, params.len()) }
    })
}

use chidori_protocol::messages::Api;

use crate::modules::{self, LaunchShape};

fn module_load(module: *mut c_void, image: *mut c_void) -> u32 {
    driver("cuModuleLoadData", || {
        if module.is_null() || image.is_null() {
            return Err(INVALID_VALUE);
        }
        let conn = connection()?;
        // SAFETY: `image` is a fat binary, cubin or PTX per cuModuleLoadData's contract.
        let bytes = unsafe { modules::image_at(image as *const u8) };
        let loaded = modules::load_image(&conn, bytes)?;
        // SAFETY: the caller's CUmodule*.
        unsafe { put(module, loaded.module) }
    })
}

/// cuModuleGetFunction: a function of a module loaded through the client is known from the
/// load (the worker made every function's handle then); others are asked of the server.
pub unsafe fn module_get_function(ctx: &Ctx, hfunc: *mut c_void, hmod: *mut c_void, name: *mut c_void) -> u32 {
    let body = || {
        if hfunc.is_null() || name.is_null() {
            return Err(INVALID_VALUE);
        }
        // SAFETY: a NUL-terminated function name per cuModuleGetFunction's contract.
        let wanted = unsafe { CStr::from_ptr(name as *const c_char) };
        let known = state::CLIENT
            .modules
            .get(&(hmod as u64))
            .and_then(|m| wanted.to_str().ok().and_then(|n| m.kernels.get(n).map(|f| f.handle)));
        if let Some(handle) = known {
            crate::trace::local(ctx.name);
            // SAFETY: the caller's CUfunction*, checked non-null.
            return unsafe { put(hfunc, handle) };
        }
        let conn = connection()?;
        // SAFETY: the caller's arguments, as the function's contract gives them.
        Ok(unsafe { crate::runtime::call_on(&conn, ctx.form(Form::Call), &[hfunc as u64, hmod as u64, name as u64]) }
            as u32)
    };
    crate::guard::ffi(ctx.name, INVALID_VALUE, || body().unwrap_or_else(|e| e))
}

const FILE_NOT_FOUND: u32 = chidori_cuda::consts::cudaError_enum::CUDA_ERROR_FILE_NOT_FOUND;

/// A cubin, fat binary or PTX file on the client (torch's static Triton launcher loads
/// compiled kernels this way).
pub unsafe fn cuModuleLoad(module: *mut c_void, fname: *mut c_void) -> u32 {
    driver("cuModuleLoad", || {
        if module.is_null() || fname.is_null() {
            return Err(INVALID_VALUE);
        }
        // SAFETY: a NUL-terminated path per cuModuleLoad's contract.
        let path = unsafe { CStr::from_ptr(fname as *const c_char) }.to_string_lossy().into_owned();
        let mut bytes = std::fs::read(&path).map_err(|e| {
            tracing::warn!("cuModuleLoad: cannot read {path}: {e}");
            FILE_NOT_FOUND
        })?;
        // PTX is text the driver reads up to a NUL; ELF cubins and fat binaries are not.
        let binary = bytes.starts_with(b"\x7fELF") || bytes.starts_with(&0xBA55_ED50u32.to_le_bytes());
        if !binary && bytes.last() != Some(&0) {
            bytes.push(0);
        }
        let conn = connection()?;
        let loaded = modules::load_image(&conn, &bytes)?;
        // SAFETY: the caller's CUmodule*.
        unsafe { put(module, loaded.module) }
    })
}

pub unsafe fn cuModuleLoadData(module: *mut c_void, image: *mut c_void) -> u32 {
    module_load(module, image)
}

/// JIT options tune compilation on the server's driver; the image is what matters.
pub unsafe fn cuModuleLoadDataEx(
    module: *mut c_void,
    image: *mut c_void,
    numOptions: u32,
    options: *mut c_void,
    optionValues: *mut c_void,
) -> u32 {
    let _ = (numOptions, options, optionValues);
    module_load(module, image)
}

pub unsafe fn cuModuleLoadFatBinary(module: *mut c_void, fatCubin: *mut c_void) -> u32 {
    module_load(module, fatCubin)
}

/// Modules stay loaded for the session on the server.
pub unsafe fn cuModuleUnload(hmod: *mut c_void) -> u32 {
    driver("cuModuleUnload", || if hmod.is_null() { Err(INVALID_VALUE) } else { Ok(SUCCESS) })
}

/// CU_LAUNCH_PARAM_END, CU_LAUNCH_PARAM_BUFFER_POINTER, CU_LAUNCH_PARAM_BUFFER_SIZE.
const PARAM_END: usize = 0;
const PARAM_BUFFER_POINTER: usize = 1;
const PARAM_BUFFER_SIZE: usize = 2;

/// The packed parameters of a driver launch: from `kernelParams` (a pointer per parameter)
/// or from `extra` (an already packed buffer).
pub(crate) fn driver_params(
    conn: &Conn,
    f: u64,
    params: *mut c_void,
    extra: *mut c_void,
) -> Result<(modules::Function, Vec<u8>), u32> {
    let layout = modules::function_params(conn, f)?;
    let function = modules::Function { handle: f, params: layout.clone() };
    if !params.is_null() {
        // SAFETY: kernelParams holds a pointer per parameter (launch contract).
        return Ok((function, unsafe { modules::pack(&layout, params as *const *const u8) }));
    }
    if extra.is_null() {
        return Ok((function, unsafe { modules::pack(&layout, std::ptr::null()) }));
    }
    // SAFETY: `extra` is a CU_LAUNCH_PARAM_END-terminated list of (key, value) pointers.
    unsafe {
        let mut p = extra as *const usize;
        let (mut buffer, mut size) = (std::ptr::null::<u8>(), 0usize);
        while *p != PARAM_END {
            match *p {
                PARAM_BUFFER_POINTER => buffer = *p.add(1) as *const u8,
                PARAM_BUFFER_SIZE => size = *(*p.add(1) as *const usize),
                _ => return Err(INVALID_VALUE),
            }
            p = p.add(2);
        }
        if buffer.is_null() {
            return Err(INVALID_VALUE);
        }
        Ok((function, std::slice::from_raw_parts(buffer, size).to_vec()))
    }
}

#[allow(clippy::too_many_arguments)]
fn launch(
    f: *mut c_void,
    grid: [u32; 3],
    block: [u32; 3],
    shared_mem: u32,
    stream: *mut c_void,
    params: *mut c_void,
    extra: *mut c_void,
    attributes: Vec<(u32, Vec<u8>)>,
    cooperative: bool,
) -> u32 {
    driver("cuLaunchKernel", || {
        let conn = connection()?;
        let (function, packed) = driver_params(&conn, f as u64, params, extra)?;
        // Over the opt-in the driver refuses the launch at once (where the attribute cannot
        // be read, the server's launch decides).
        if !super::kernels::dynamic_shared_allowed(&conn, function.handle, shared_mem as usize).unwrap_or(true) {
            return Err(INVALID_VALUE);
        }
        let shape =
            LaunchShape { grid, block, shared_mem, stream: stream as u64, attributes, cooperative, api: Api::Driver };
        modules::launch(&conn, &function, shape, &packed)?;
        Ok(SUCCESS)
    })
}

/// cuLaunchKernel and its `_ptsz` form (where NULL is the thread's own stream).
#[allow(clippy::too_many_arguments)]
pub unsafe fn launch_kernel(
    ctx: &Ctx,
    f: *mut c_void,
    grid_x: u32,
    grid_y: u32,
    grid_z: u32,
    block_x: u32,
    block_y: u32,
    block_z: u32,
    shared: u32,
    stream: *mut c_void,
    params: *mut c_void,
    extra: *mut c_void,
) -> u32 {
    let stream = ctx.stream(stream as u64) as *mut c_void;
    launch(f, [grid_x, grid_y, grid_z], [block_x, block_y, block_z], shared, stream, params, extra, Vec::new(), false)
}

/// cuLaunchCooperativeKernel and its `_ptsz` form.
#[allow(clippy::too_many_arguments)]
pub unsafe fn launch_cooperative_kernel(
    ctx: &Ctx,
    f: *mut c_void,
    grid_x: u32,
    grid_y: u32,
    grid_z: u32,
    block_x: u32,
    block_y: u32,
    block_z: u32,
    shared: u32,
    stream: *mut c_void,
    params: *mut c_void,
) -> u32 {
    let stream = ctx.stream(stream as u64) as *mut c_void;
    let null = std::ptr::null_mut();
    launch(f, [grid_x, grid_y, grid_z], [block_x, block_y, block_z], shared, stream, params, null, Vec::new(), true)
}

/// A CUlaunchConfig's fields: grid, block, shared memory, stream, attributes (id, 64-byte
/// value).
type LaunchConfigFields = ([u32; 3], [u32; 3], u32, *mut c_void, Vec<(u32, Vec<u8>)>);

/// Read a CUlaunchConfig, 56 bytes in every release (gridDimX..Z@0, blockDimX..Z@12,
/// sharedMemBytes@24, hStream@32, attrs@40, numAttrs@48), and its attributes (72 bytes each).
///
/// # Safety
/// `config` must point at a CUlaunchConfig whose attribute array holds `numAttrs` entries.
unsafe fn read_launch_config(config: *mut c_void) -> LaunchConfigFields {
    // SAFETY: per the contract.
    unsafe {
        let c = config as *const u8;
        let u = |at: usize| std::ptr::read_unaligned(c.add(at) as *const u32);
        let stream = std::ptr::read_unaligned(c.add(32) as *const *mut c_void);
        let attrs = std::ptr::read_unaligned(c.add(40) as *const *const u8);
        let n = u(48) as usize;
        let mut out = Vec::with_capacity(n);
        for i in 0..n {
            if attrs.is_null() {
                break;
            }
            let a = attrs.add(i * 72);
            out.push((std::ptr::read_unaligned(a as *const u32), std::slice::from_raw_parts(a.add(8), 64).to_vec()));
        }
        ([u(0), u(4), u(8)], [u(12), u(16), u(20)], u(24), stream, out)
    }
}

/// cuLaunchKernelEx.
fn launch_ex(config: *mut c_void, f: *mut c_void, params: *mut c_void, extra: *mut c_void) -> u32 {
    if config.is_null() {
        return INVALID_VALUE;
    }
    // SAFETY: the caller's CUlaunchConfig.
    let (grid, block, smem, stream, attributes) = unsafe { read_launch_config(config) };
    launch(f, grid, block, smem, stream, params, extra, attributes, false)
}

/// cuOccupancyMaxActiveClusters (`potential`: cuOccupancyMaxPotentialClusterSize): the
/// configuration travels as a launch's does, and the server's driver answers.
fn cluster_occupancy(ctx: &Ctx, out: *mut c_void, f: *mut c_void, config: *mut c_void, potential: bool) -> u32 {
    driver(ctx.name, || {
        if out.is_null() || config.is_null() {
            return Err(INVALID_VALUE);
        }
        // SAFETY: the caller's CUlaunchConfig.
        let (grid, block, shared_mem, stream, attributes) = unsafe { read_launch_config(config) };
        let launch = chidori_protocol::messages::Launch {
            function: f as u64,
            grid,
            block,
            shared_mem,
            stream: stream as u64,
            attributes,
            cooperative: false,
            api: Api::Driver,
        };
        let conn = connection()?;
        let value = ask_cluster_occupancy(&conn, launch, potential)?;
        // SAFETY: the caller's int, checked non-null.
        unsafe { put(out, value) }
    })
}

/// Ask the server's driver about clusters for `launch` (the runtime's functions too: the
/// statuses these answers carry have the same numbers in both APIs).
pub(super) fn ask_cluster_occupancy(
    conn: &Conn,
    launch: chidori_protocol::messages::Launch,
    potential: bool,
) -> Result<i32, u32> {
    use chidori_protocol::messages::{Service, ServiceReply};
    match conn.service(&Service::ClusterOccupancy { launch, potential }, &[]).map_err(|_| NO_DEVICE)? {
        ServiceReply::Value(v) => i32::try_from(v).map_err(|_| INVALID_VALUE),
        ServiceReply::Error { status, .. } => Err(status as u32),
        _ => Err(INVALID_VALUE),
    }
}

pub unsafe fn max_active_clusters(ctx: &Ctx, num_clusters: *mut c_void, f: *mut c_void, config: *mut c_void) -> u32 {
    cluster_occupancy(ctx, num_clusters, f, config, false)
}

pub unsafe fn max_potential_cluster_size(
    ctx: &Ctx,
    cluster_size: *mut c_void,
    f: *mut c_void,
    config: *mut c_void,
) -> u32 {
    cluster_occupancy(ctx, cluster_size, f, config, true)
}

/// cuLaunchKernelEx and its per-thread variant, in every version: CUlaunchAttributeValue grew
/// members inside its 64 bytes between releases, one ABI.
pub unsafe fn launch_kernel_ex(
    _ctx: &Ctx,
    config: *mut c_void,
    f: *mut c_void,
    kernel_params: *mut c_void,
    extra: *mut c_void,
) -> u32 {
    launch_ex(config, f, kernel_params, extra)
}
pub use super::capture::*;
pub use super::context::{cuCtxDestroy_v2, cuCtxGetCurrent, cuDevicePrimaryCtxGetState};
pub use super::entry::driver::*;
pub use super::kernels::cuFuncSetAttribute;

// ---- Profiler control (see cudaProfilerStart) ----

pub unsafe fn cuProfilerStart() -> u32 {
    driver("cuProfilerStart", || Ok(SUCCESS))
}

pub unsafe fn cuProfilerStop() -> u32 {
    driver("cuProfilerStop", || Ok(SUCCESS))
}

// ---- Allocations that enter the interval map ----

use chidori_protocol::desc::{Ctx, Form};

fn record_device(dptr: *mut c_void, len: u64) {
    // SAFETY: the server just wrote the allocation's address there.
    let base = unsafe { std::ptr::read_unaligned(dptr as *const u64) };
    if base != 0 {
        state::add(base, len, Memory::Device { device: state::current_device() });
    }
}

/// cuLibraryGetManaged and cudaLibraryGetManaged (statuses are the library's, `ctx.codes`):
/// a `__managed__` variable, which the program (or a runtime linked into it) then reads and
/// writes at the address given: the client's copy lives there
/// ([`crate::mirror::managed_variable`]), with the variable's contents.
pub unsafe fn library_get_managed(
    ctx: &Ctx,
    dptr: *mut c_void,
    bytes: *mut c_void,
    library: *mut c_void,
    name: *mut c_void,
) -> u32 {
    driver(ctx.name, || {
        let conn = conn::get().map_err(|_| ctx.codes.unavailable as u32)?;
        // The size is needed even where the program does not ask for it.
        let mut size = 0u64;
        let size_out = if bytes.is_null() { (&raw mut size).cast::<c_void>() } else { bytes };
        let args = [dptr as u64, size_out as u64, library as u64, name as u64];
        // SAFETY: the caller's out-pointers (or a local), a library handle and its C string.
        let s = unsafe { crate::runtime::call_on(&conn, ctx.form(Form::Call), &args) } as u32;
        if s != SUCCESS || dptr.is_null() {
            return Ok(s);
        }
        // SAFETY: the server just wrote the address and size there.
        let (base, len) =
            unsafe { (std::ptr::read_unaligned(dptr as *const u64), std::ptr::read_unaligned(size_out as *const u64)) };
        if let Err(why) = crate::mirror::managed_variable(base, len) {
            // SAFETY: the caller's C string, read for the message only.
            let name =
                if name.is_null() { "?".into() } else { unsafe { CStr::from_ptr(name.cast()) }.to_string_lossy() };
            let message = format!("__managed__ variable {name}: {why}");
            crate::log::once_owned(&message, || tracing::warn!("{message}"));
            return Ok(ctx.codes.not_supported as u32);
        }
        crate::mirror::prepare_reachable(&conn);
        crate::mirror::pull(&conn);
        Ok(s)
    })
}

/// cuMemAllocAsync and its `_ptsz` form.
pub unsafe fn mem_alloc_async(ctx: &Ctx, dptr: *mut c_void, bytesize: usize, stream: *mut c_void) -> u32 {
    driver(ctx.name, || {
        let conn = connection()?;
        let args = [dptr as u64, bytesize as u64, ctx.stream(stream as u64)];
        // SAFETY: the caller's CUdeviceptr*, a size and a stream.
        let s = unsafe { crate::runtime::call_on(&conn, ctx.form(Form::Call), &args) } as u32;
        if s == SUCCESS && !dptr.is_null() {
            record_device(dptr, bytesize as u64);
            note_allocation(dptr, args[2]);
        }
        Ok(s)
    })
}

/// cuMemAllocFromPoolAsync and its `_ptsz` form.
pub unsafe fn mem_alloc_from_pool_async(
    ctx: &Ctx,
    dptr: *mut c_void,
    bytesize: usize,
    pool: *mut c_void,
    stream: *mut c_void,
) -> u32 {
    driver(ctx.name, || {
        let conn = connection()?;
        let args = [dptr as u64, bytesize as u64, pool as u64, ctx.stream(stream as u64)];
        // SAFETY: as cuMemAllocAsync, with a pool handle.
        let s = unsafe { crate::runtime::call_on(&conn, ctx.form(Form::Call), &args) } as u32;
        if s == SUCCESS && !dptr.is_null() {
            record_device(dptr, bytesize as u64);
            note_allocation(dptr, args[3]);
        }
        Ok(s)
    })
}

/// cuMemAllocPitch_v2.
pub unsafe fn mem_alloc_pitch(
    ctx: &Ctx,
    dptr: *mut c_void,
    pitch: *mut c_void,
    width: usize,
    height: usize,
    element_size: u32,
) -> u32 {
    driver(ctx.name, || {
        let conn = connection()?;
        let args = [dptr as u64, pitch as u64, width as u64, height as u64, u64::from(element_size)];
        // SAFETY: the caller's CUdeviceptr* and size_t*; values.
        let s = unsafe { crate::runtime::call_on(&conn, ctx.form(Form::Call), &args) } as u32;
        if s == SUCCESS && !dptr.is_null() && !pitch.is_null() {
            // SAFETY: written by the reply.
            let p = unsafe { std::ptr::read_unaligned(pitch as *const u64) };
            record_device(dptr, p.saturating_mul(height as u64));
        }
        Ok(s)
    })
}

/// cuMemMap: the mapped range is device memory to the interval map.
pub unsafe fn mem_map(ctx: &Ctx, ptr: u64, size: usize, offset: usize, handle: u64, flags: u64) -> u32 {
    driver(ctx.name, || {
        let conn = connection()?;
        // SAFETY: values only.
        let s = unsafe {
            crate::runtime::call_on(&conn, ctx.form(Form::Call), &[ptr, size as u64, offset as u64, handle, flags])
        } as u32;
        if s == SUCCESS {
            state::add(ptr, size as u64, Memory::Device { device: state::current_device() });
        }
        Ok(s)
    })
}

/// cuMemUnmap: the range leaves the interval map, with every mapping inside it (one unmap may
/// undo several maps of adjacent pieces, as NVIDIA's vectorAddMMAP does).
pub unsafe fn mem_unmap(ctx: &Ctx, ptr: u64, size: usize) -> u32 {
    driver(ctx.name, || {
        let conn = connection()?;
        // SAFETY: values only.
        let s = unsafe { crate::runtime::call_on(&conn, ctx.form(Form::Call), &[ptr, size as u64]) } as u32;
        if s == SUCCESS {
            state::remove_within(ptr, size as u64);
        }
        Ok(s)
    })
}

/// cuMemGetAddressRange_v2: the interval map's range of a device allocation it knows, else
/// the server's answer.
pub unsafe fn mem_get_address_range(ctx: &Ctx, pbase: *mut c_void, psize: *mut c_void, dptr: u64) -> u32 {
    driver(ctx.name, || {
        if let Some(r) = state::find(dptr).filter(|r| matches!(r.memory, Memory::Device { .. })) {
            // SAFETY: the caller's CUdeviceptr* and size_t*, each null or writable.
            unsafe {
                if !pbase.is_null() {
                    std::ptr::write_unaligned(pbase as *mut u64, r.base);
                }
                if !psize.is_null() {
                    std::ptr::write_unaligned(psize as *mut u64, r.len);
                }
            }
            return Ok(SUCCESS);
        }
        let conn = connection()?;
        // SAFETY: as above.
        Ok(unsafe { crate::runtime::call_on(&conn, ctx.form(Form::Call), &[pbase as u64, psize as u64, dptr]) } as u32)
    })
}

/// Bytes of a pointer attribute's value (CUpointer_attribute).
fn pointer_attribute_size(attribute: u32) -> usize {
    use chidori_cuda::consts::CUpointer_attribute_enum as a;
    match attribute {
        a::CU_POINTER_ATTRIBUTE_P2P_TOKENS => 16,
        a::CU_POINTER_ATTRIBUTE_CONTEXT
        | a::CU_POINTER_ATTRIBUTE_DEVICE_POINTER
        | a::CU_POINTER_ATTRIBUTE_HOST_POINTER
        | a::CU_POINTER_ATTRIBUTE_BUFFER_ID
        | a::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR
        | a::CU_POINTER_ATTRIBUTE_RANGE_SIZE
        | a::CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES
        | a::CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE
        | a::CU_POINTER_ATTRIBUTE_MAPPING_SIZE
        | a::CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR
        | a::CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID => 8,
        _ => 4,
    }
}

/// cuPointerGetAttributes: cuPointerGetAttribute per attribute; where one has no answer
/// (memory CUDA does not know), its value is zero, as the driver writes it.
pub unsafe fn pointer_get_attributes(
    ctx: &Ctx,
    count: u32,
    attributes: *mut c_void,
    data: *mut c_void,
    ptr: u64,
) -> u32 {
    driver(ctx.name, || {
        if attributes.is_null() || data.is_null() {
            return Err(INVALID_VALUE);
        }
        for i in 0..count as usize {
            // SAFETY: the caller's arrays of `count` attributes and value pointers.
            let (attribute, out) =
                unsafe { (*(attributes as *const u32).add(i), *(data as *const *mut c_void).add(i)) };
            if out.is_null() {
                continue;
            }
            // SAFETY: `out` holds the attribute's value type.
            if unsafe { cuPointerGetAttribute(out, attribute, ptr) } != SUCCESS {
                // SAFETY: as above.
                unsafe { std::ptr::write_bytes(out as *mut u8, 0, pointer_attribute_size(attribute)) };
            }
        }
        Ok(SUCCESS)
    })
}

/// cuMemAllocHost (32-bit size): pinned memory of the client.
pub unsafe fn mem_alloc_host_v1(_ctx: &Ctx, pp: *mut c_void, bytesize: u32) -> u32 {
    // SAFETY: same contract.
    unsafe { cuMemHostAlloc(pp, bytesize as usize, 0) }
}

/// cuMemHostRegister (the CUDA 3.2 entry point, the same signature as _v2).
pub unsafe fn mem_host_register_v1(_ctx: &Ctx, p: *mut c_void, bytesize: usize, flags: u32) -> u32 {
    // SAFETY: same contract.
    unsafe { cuMemHostRegister_v2(p, bytesize, flags) }
}

// ---- Function names: the server's strings, kept for the process ----

fn function_name(ctx: &Ctx, name: *mut c_void, handle: u64, kernel: bool) -> u32 {
    driver(ctx.name, || {
        if name.is_null() || handle == 0 {
            return Err(INVALID_VALUE);
        }
        let known = state::CLIENT.function_names.get(&handle);
        let text = match known {
            Some(t) => t,
            None => {
                let conn = connection()?;
                let request = chidori_protocol::messages::Service::FunctionName { handle, kernel };
                let reply = conn.service(&request, &[]).map_err(|_| NO_DEVICE)?;
                let s = match reply {
                    chidori_protocol::messages::ServiceReply::Name(s) => s,
                    chidori_protocol::messages::ServiceReply::Error { status, .. } => return Err(status as u32),
                    _ => return Err(INVALID_VALUE),
                };
                let owned = std::ffi::CString::new(s).map_err(|_| INVALID_VALUE)?;
                // Handed to the program, which may keep it: it lives as long as the process.
                let text: &'static CStr = Box::leak(owned.into_boxed_c_str());
                state::CLIENT.function_names.insert(handle, text);
                text
            }
        };
        // SAFETY: the caller's const char**.
        unsafe { put(name, text.as_ptr()) }
    })
}

pub unsafe fn func_get_name(ctx: &Ctx, name: *mut c_void, hfunc: *mut c_void) -> u32 {
    function_name(ctx, name, hfunc as u64, false)
}

pub unsafe fn kernel_get_name(ctx: &Ctx, name: *mut c_void, hkernel: *mut c_void) -> u32 {
    function_name(ctx, name, hkernel as u64, true)
}

// ---- Occupancy with a block-size-dependent shared memory callback ----

/// CUoccupancyB2DSize: dynamic shared memory for a block size.
type BlockToSmem = unsafe extern "C" fn(i32) -> usize;

/// cudart's search for the block size of the best occupancy (cuda_runtime.h,
/// cudaOccupancyMaxPotentialBlockSizeVariableSMemWithFlags): block sizes from the limit
/// down by a warp, the first of the highest occupancy in threads. The callback runs here;
/// the occupancy of every candidate is asked in one round trip.
#[allow(clippy::too_many_arguments)]
fn potential_block_size(
    ctx: &Ctx,
    min_grid: *mut c_void,
    block: *mut c_void,
    func: u64,
    to_smem: *mut c_void,
    smem: usize,
    limit: i32,
    flags: u32,
) -> u32 {
    driver(ctx.name, || {
        if min_grid.is_null() || block.is_null() {
            return Err(INVALID_VALUE);
        }
        let conn = connection()?;
        let d = conn.profile.device(state::current_device()).ok_or(INVALID_DEVICE)?;
        let attr = |a: i32| d.attributes.get(&a).copied().unwrap_or(0);
        // MAX_THREADS_PER_BLOCK, WARP_SIZE, MULTIPROCESSOR_COUNT, MAX_THREADS_PER_MULTIPROCESSOR.
        let (device_max, warp, sms, occupancy_limit) = (attr(1), attr(10).max(1), attr(16), attr(39));
        // CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK of the function (kept, and learned).
        let max_threads = chidori_cuda::consts::CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK;
        let func_max = super::kernels::attributes_of(&conn, func, &[max_threads])?.first().copied().unwrap_or(0);
        let mut limit = if limit == 0 { device_max } else { limit };
        limit = limit.min(device_max).min(func_max);
        let aligned = (limit + warp - 1) / warp * warp;
        let candidates: Vec<i32> = (1..=aligned / warp).rev().map(|k| (k * warp).min(limit)).collect();
        let smem_of = |size: i32| -> usize {
            if to_smem.is_null() {
                smem
            } else {
                // SAFETY: the program's CUoccupancyB2DSize, called as the driver would.
                unsafe { std::mem::transmute::<*mut c_void, BlockToSmem>(to_smem)(size) }
            }
        };
        let mut blocks = vec![0i32; candidates.len()];
        let arg_lists: Vec<Vec<u64>> = candidates
            .iter()
            .zip(blocks.iter_mut())
            .map(|(size, out)| {
                vec![out as *mut i32 as u64, func, *size as u64, smem_of(*size) as u64, u64::from(flags)]
            })
            .collect();
        let batch: Vec<(&'static chidori_protocol::desc::CallDesc, &[u64])> = arg_lists
            .iter()
            .map(|a| (&calls::cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags, a.as_slice()))
            .collect();
        // SAFETY: each call writes one int into `blocks`.
        let rets =
            unsafe { crate::runtime::call_all(&conn, &batch, "cuOccupancyMaxPotentialBlockSize") }.ok_or(NO_DEVICE)?;
        if let Some(bad) = rets.iter().find(|r| **r != u64::from(SUCCESS)) {
            return Err(*bad as u32);
        }
        let (mut best_threads, mut best_block, mut best_blocks) = (0i32, 0i32, 0i32);
        for (size, n) in candidates.iter().zip(&blocks) {
            let threads = size * n;
            if threads > best_threads {
                (best_threads, best_block, best_blocks) = (threads, *size, *n);
            }
            if best_threads == occupancy_limit {
                break;
            }
        }
        // SAFETY: the caller's ints, checked non-null.
        unsafe {
            put(min_grid, best_blocks * sms)?;
            put(block, best_block)
        }
    })
}

pub unsafe fn max_potential_block_size(
    ctx: &Ctx,
    min_grid: *mut c_void,
    block: *mut c_void,
    func: *mut c_void,
    to_smem: *mut c_void,
    smem: usize,
    limit: i32,
) -> u32 {
    potential_block_size(ctx, min_grid, block, func as u64, to_smem, smem, limit, 0)
}

#[allow(clippy::too_many_arguments)]
pub unsafe fn max_potential_block_size_with_flags(
    ctx: &Ctx,
    min_grid: *mut c_void,
    block: *mut c_void,
    func: *mut c_void,
    to_smem: *mut c_void,
    smem: usize,
    limit: i32,
    flags: u32,
) -> u32 {
    potential_block_size(ctx, min_grid, block, func as u64, to_smem, smem, limit, flags)
}

// ---- Stream callbacks ----

type StreamCallback = unsafe extern "C" fn(*mut c_void, u32, *mut c_void);

/// cuStreamAddCallback and its `_ptsz` form: the callback runs on the client, in stream order.
pub unsafe fn stream_add_callback(
    ctx: &Ctx,
    stream: *mut c_void,
    callback: *mut c_void,
    user: *mut c_void,
    flags: u32,
) -> u32 {
    driver(ctx.name, || {
        if callback.is_null() {
            return Err(INVALID_VALUE);
        }
        let conn = connection()?;
        let stream = ctx.stream(stream as u64);
        let (s, cb, u) = (stream as usize, callback as usize, user as usize);
        let id = conn.register_callback(
            Arc::new(move |status| {
                // SAFETY: the program's CUstreamCallback, called with the driver's arguments.
                unsafe {
                    std::mem::transmute::<usize, StreamCallback>(cb)(s as *mut c_void, status as u32, u as *mut c_void)
                }
            }),
            stream,
            any_active(),
        );
        // SAFETY: values only: the stream, the callback id in place of the function, flags.
        let status =
            unsafe { crate::runtime::call_on(&conn, ctx.form(Form::Host), &[stream, id, 0, u64::from(flags)]) } as u32;
        if status != SUCCESS {
            conn.drop_callback(id);
        }
        Ok(status)
    })
}

pub use crate::custom::context::{cuCtxCreate_v2, cuCtxCreate_v3, cuCtxCreate_v4};

/// cuMemRangeGetAttributes: one cuMemRangeGetAttribute per attribute, in one round trip.
pub unsafe fn mem_range_get_attributes(
    ctx: &Ctx,
    data: *mut c_void,
    data_sizes: *mut c_void,
    attributes: *mut c_void,
    count: usize,
    dev_ptr: u64,
    len: usize,
) -> u32 {
    driver(ctx.name, || {
        // SAFETY: the caller's three arrays of `count` elements, or NULL.
        let Some(arg_lists) =
            (unsafe { memory::range_attribute_calls(data, data_sizes, attributes, count, dev_ptr, len) })
        else {
            return Err(INVALID_VALUE);
        };
        let conn = connection()?;
        // SAFETY: each call writes dataSizes[i] bytes into data[i].
        Ok(unsafe { crate::runtime::call_batch(&conn, &calls::cuMemRangeGetAttribute, &arg_lists) } as u32)
    })
}
