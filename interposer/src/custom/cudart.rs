//! Hand-written runtime functions: nvcc's registration and launch API.
//!
//! Every `unsafe fn` here has the safety contract of the CUDA function of the same name:
//! pointer arguments must be what that function's documentation requires.
#![allow(non_snake_case, clippy::missing_safety_doc)]

use std::cell::RefCell;
use std::ffi::c_void;
use std::sync::Arc;

use chidori_cuda::calls::cudart as calls;
use chidori_cuda::desc::{Ctx, Form};
use chidori_cuda::types::dim3;
use chidori_protocol::messages::PropValue;

use crate::conn::{self, Conn};
use crate::custom::memory::{self, CopyForms};
use crate::registry;
use crate::state::{self, Memory};

const SUCCESS: u32 = chidori_cuda::consts::cudaError::cudaSuccess;
const INVALID_VALUE: u32 = chidori_cuda::consts::cudaError::cudaErrorInvalidValue;
const MEMORY_ALLOCATION: u32 = chidori_cuda::consts::cudaError::cudaErrorMemoryAllocation;
const INVALID_MEMCPY_DIRECTION: u32 = chidori_cuda::consts::cudaError::cudaErrorInvalidMemcpyDirection;
const MISSING_CONFIGURATION: u32 = chidori_cuda::consts::cudaError::cudaErrorMissingConfiguration;
const INVALID_DEVICE_FUNCTION: u32 = chidori_cuda::consts::cudaError::cudaErrorInvalidDeviceFunction;
const NO_DEVICE: u32 = chidori_cuda::consts::cudaError::cudaErrorNoDevice;
const INVALID_DEVICE: u32 = chidori_cuda::consts::cudaError::cudaErrorInvalidDevice;
const HOST_MEMORY_ALREADY_REGISTERED: u32 = chidori_cuda::consts::cudaError::cudaErrorHostMemoryAlreadyRegistered;
const HOST_MEMORY_NOT_REGISTERED: u32 = chidori_cuda::consts::cudaError::cudaErrorHostMemoryNotRegistered;

/// The connection, or the runtime's "no device" (the reason was logged once).
fn connection() -> Result<Arc<Conn>, u32> {
    conn::get().map_err(|_| NO_DEVICE)
}

/// Run a hand-written runtime function: FFI guard, trace, and the thread's last error.
fn runtime(name: &'static str, body: impl FnOnce() -> Result<u32, u32>) -> u32 {
    crate::guard::ffi(name, INVALID_VALUE, || {
        crate::trace::local(name);
        let status = body().unwrap_or_else(|e| e);
        state::set_last_error(status);
        status
    })
}

/// # Safety
/// `p` must be null or writable for a `T`.
unsafe fn put<T>(p: *mut c_void, v: T) -> Result<(), u32> {
    if p.is_null() {
        return Err(INVALID_VALUE);
    }
    // SAFETY: per the contract.
    unsafe { std::ptr::write_unaligned(p as *mut T, v) };
    Ok(())
}

/// # Safety
/// `fatCubin` is nvcc's fat binary wrapper.
pub unsafe fn __cudaRegisterFatBinary(fatCubin: *mut c_void) -> *mut c_void {
    crate::guard::ffi("__cudaRegisterFatBinary", std::ptr::null_mut(), || registry::register_fatbin(fatCubin))
}

/// # Safety
/// `fatCubinHandle` is a handle from `__cudaRegisterFatBinary`.
pub unsafe fn __cudaRegisterFatBinaryEnd(fatCubinHandle: *mut c_void) {
    crate::guard::ffi("__cudaRegisterFatBinaryEnd", (), || registry::finish_fatbin(fatCubinHandle))
}

/// A no-op: registered modules stay until the process exits (and this runs from `atexit`,
/// possibly after the connection is gone).
///
/// # Safety
/// Any value is accepted.
pub unsafe fn __cudaUnregisterFatBinary(fatCubinHandle: *mut c_void) {
    let _ = fatCubinHandle;
}

/// # Safety
/// Arguments as nvcc passes them: `deviceFun` a NUL-terminated name literal.
#[allow(clippy::too_many_arguments)]
pub unsafe fn __cudaRegisterFunction(
    fatCubinHandle: *mut c_void,
    hostFun: *mut c_void,
    deviceFun: *mut c_void,
    deviceName: *mut c_void,
    thread_limit: i32,
    tid: *mut c_void,
    bid: *mut c_void,
    bDim: *mut c_void,
    gDim: *mut c_void,
    wSize: *mut c_void,
) {
    let _ = (deviceName, thread_limit, tid, bid, bDim, gDim, wSize);
    crate::guard::ffi("__cudaRegisterFunction", (), || {
        // SAFETY: nvcc passes the kernel's mangled name literal.
        unsafe { registry::register_kernel(fatCubinHandle, hostFun as usize, deviceFun.cast()) }
    })
}

/// # Safety
/// Arguments as nvcc passes them: `deviceAddress` a NUL-terminated name literal.
#[allow(clippy::too_many_arguments)]
pub unsafe fn __cudaRegisterVar(
    fatCubinHandle: *mut c_void,
    hostVar: *mut c_void,
    deviceAddress: *mut c_void,
    deviceName: *mut c_void,
    ext: i32,
    size: usize,
    constant: i32,
    global: i32,
) {
    let _ = (deviceName, ext, global);
    crate::guard::ffi("__cudaRegisterVar", (), || {
        // SAFETY: nvcc passes the variable's name literal.
        unsafe {
            registry::register_variable(
                fatCubinHandle,
                hostVar as usize,
                deviceAddress.cast(),
                size,
                constant != 0,
                false,
            )
        }
    })
}

/// # Safety
/// Arguments as nvcc passes them.
#[allow(clippy::too_many_arguments)]
pub unsafe fn __cudaRegisterManagedVar(
    fatCubinHandle: *mut c_void,
    hostVarPtrAddress: *mut c_void,
    deviceAddress: *mut c_void,
    deviceName: *mut c_void,
    ext: i32,
    size: usize,
    constant: i32,
    global: i32,
) {
    let _ = (deviceName, ext, global);
    crate::guard::ffi("__cudaRegisterManagedVar", (), || {
        // SAFETY: nvcc passes the variable's name literal.
        unsafe {
            registry::register_variable(
                fatCubinHandle,
                hostVarPtrAddress as usize,
                deviceAddress.cast(),
                size,
                constant != 0,
                true,
            )
        }
    })
}

/// # Safety
/// Any value is accepted.
pub unsafe fn __cudaRegisterHostVar(
    fatCubinHandle: *mut c_void,
    deviceName: *mut c_void,
    hostVar: *mut c_void,
    size: usize,
) {
    let _ = (fatCubinHandle, deviceName, hostVar, size);
}

/// nvcc's code calls this before the host first touches a `__managed__` variable of the
/// module: load the module and point the host's pointer of each such variable at the
/// program's copy (see [`crate::modules::init_managed`]). 1: done; 0: failed.
///
/// # Safety
/// `fatCubinHandle` is a handle from `__cudaRegisterFatBinary` (anything else finds no
/// variables).
pub unsafe fn __cudaInitModule(fatCubinHandle: *mut c_void) -> i8 {
    crate::guard::ffi("__cudaInitModule", 0, || i8::from(crate::modules::init_managed(fatCubinHandle.cast()).is_ok()))
}

struct LaunchConfig {
    grid: dim3,
    block: dim3,
    shared_mem: usize,
    stream: *mut c_void,
}

thread_local! {
    /// `kern<<<…>>>` pushes, the host stub pops (a per-thread LIFO, as in cudart).
    static CONFIGS: RefCell<Vec<LaunchConfig>> = const { RefCell::new(Vec::new()) };
}

/// # Safety
/// Any value is accepted.
pub unsafe fn __cudaPushCallConfiguration(gridDim: dim3, blockDim: dim3, sharedMem: usize, stream: *mut c_void) -> u32 {
    crate::guard::ffi("__cudaPushCallConfiguration", 1, || {
        let pushed = CONFIGS.try_with(|c| {
            c.borrow_mut().push(LaunchConfig { grid: gridDim, block: blockDim, shared_mem: sharedMem, stream })
        });
        // The thread's state is gone only while it exits.
        if pushed.is_ok() { 0 } else { 1 }
    })
}

/// # Safety
/// The pointers must be null or writable: `stream` points at a `cudaStream_t`.
pub unsafe fn __cudaPopCallConfiguration(
    gridDim: *mut c_void,
    blockDim: *mut c_void,
    sharedMem: *mut c_void,
    stream: *mut c_void,
) -> u32 {
    crate::guard::ffi("__cudaPopCallConfiguration", MISSING_CONFIGURATION, || {
        let Some(config) = CONFIGS.try_with(|c| c.borrow_mut().pop()).ok().flatten() else {
            return MISSING_CONFIGURATION;
        };
        // SAFETY: nvcc's stub passes the addresses of its locals; null ones are skipped.
        unsafe {
            if !gridDim.is_null() {
                *(gridDim as *mut dim3) = config.grid;
            }
            if !blockDim.is_null() {
                *(blockDim as *mut dim3) = config.block;
            }
            if !sharedMem.is_null() {
                *(sharedMem as *mut usize) = config.shared_mem;
            }
            if !stream.is_null() {
                *(stream as *mut *mut c_void) = config.stream;
            }
        }
        0
    })
}

/// # Safety
/// `kernelPtr` must be null or writable.
pub unsafe fn __cudaGetKernel(kernelPtr: *mut c_void, entryFuncAddr: *mut c_void) -> u32 {
    crate::guard::ffi("__cudaGetKernel", INVALID_DEVICE_FUNCTION, || {
        if kernelPtr.is_null() {
            return INVALID_VALUE;
        }
        match registry::kernel_by_host_fun(entryFuncAddr as usize) {
            Some(kernel) => {
                // SAFETY: checked non-null; the kernel record is leaked and lives forever.
                unsafe { *(kernelPtr as *mut *const registry::Kernel) = kernel };
                0
            }
            None => INVALID_DEVICE_FUNCTION,
        }
    })
}

// ---- Devices, answered from the handshake's profile ----

pub unsafe fn cudaGetDeviceCount(count: *mut c_void) -> u32 {
    runtime("cudaGetDeviceCount", || {
        let n = match conn::get() {
            Ok(c) => c.profile.devices.len() as i32,
            Err(_) => {
                // SAFETY: the caller's int.
                let _ = unsafe { put(count, 0i32) };
                return Err(NO_DEVICE);
            }
        };
        // SAFETY: the caller's int.
        unsafe { put(count, n) }?;
        Ok(SUCCESS)
    })
}

pub unsafe fn cudaGetDevice(device: *mut c_void) -> u32 {
    // SAFETY: the caller's int.
    runtime("cudaGetDevice", || unsafe { put(device, state::current_device()) }.map(|_| SUCCESS))
}

pub unsafe fn cudaSetDevice(device: i32) -> u32 {
    runtime("cudaSetDevice", || {
        let conn = connection()?;
        if conn.profile.device(device).is_none() {
            return Err(INVALID_DEVICE);
        }
        state::set_current_device(device);
        // The server's executor for this thread follows (in order with later calls).
        // SAFETY: a value argument.
        Ok(unsafe { crate::runtime::call_on(&conn, &calls::cudaSetDevice__call, &[device as u64]) } as u32)
    })
}

fn device_props(version: &'static str, prop: *mut c_void, device: i32) -> u32 {
    runtime("cudaGetDeviceProperties", || {
        let conn = connection()?;
        let d = conn.profile.device(device).ok_or(INVALID_DEVICE)?;
        if prop.is_null() {
            return Err(INVALID_VALUE);
        }
        // SAFETY: the caller's cudaDeviceProp of its own version's layout.
        if unsafe { state::device_props(version, d, prop as *mut u8) } { Ok(SUCCESS) } else { Err(INVALID_VALUE) }
    })
}

/// cudaGetDeviceProperties and libcudart.so.12's cudaGetDeviceProperties_v2 (12.x headers
/// map the plain name to it): the record in the layout of the caller's CUDA version.
pub unsafe fn get_device_properties(ctx: &Ctx, prop: *mut c_void, device: i32) -> u32 {
    device_props(ctx.version, prop, device)
}

pub unsafe fn cudaDeviceGetAttribute(value: *mut c_void, attr: u32, device: i32) -> u32 {
    runtime("cudaDeviceGetAttribute", || {
        let conn = connection()?;
        let d = conn.profile.device(device).ok_or(INVALID_DEVICE)?;
        let v = *d.attributes.get(&(attr as i32)).ok_or(INVALID_VALUE)?;
        // SAFETY: the caller's int.
        unsafe { put(value, v) }?;
        Ok(SUCCESS)
    })
}

pub unsafe fn cudaDriverGetVersion(driverVersion: *mut c_void) -> u32 {
    runtime("cudaDriverGetVersion", || {
        // "0 if no driver is installed": without a server there is none.
        let v = conn::get().map(|c| c.profile.driver_version).unwrap_or(0);
        // SAFETY: the caller's int.
        unsafe { put(driverVersion, v) }?;
        Ok(SUCCESS)
    })
}

/// cudaRuntimeGetVersion: the version of the runtime the caller was built against.
pub unsafe fn runtime_get_version(ctx: &Ctx, out: *mut c_void) -> u32 {
    let version = runtime_version(ctx) as i32;
    // SAFETY: the caller's int.
    runtime("cudaRuntimeGetVersion", || unsafe { put(out, version) }.map(|_| SUCCESS))
}

pub unsafe fn cudaGetLastError() -> u32 {
    crate::guard::ffi("cudaGetLastError", SUCCESS, state::take_last_error)
}

pub unsafe fn cudaPeekAtLastError() -> u32 {
    crate::guard::ffi("cudaPeekAtLastError", SUCCESS, state::peek_last_error)
}

// ---- Device memory: forwarded, recorded in the interval map ----

fn record_alloc(status: u32, dev_ptr: *mut c_void, len: u64) {
    if status == SUCCESS && !dev_ptr.is_null() {
        // SAFETY: the server just wrote the allocation's address there.
        let base = unsafe { std::ptr::read_unaligned(dev_ptr as *const u64) };
        if base != 0 {
            state::add(base, len, Memory::Device { device: state::current_device() });
            crate::custom::placed::noted(base, len);
        }
    }
}

pub unsafe fn cudaMalloc(devPtr: *mut c_void, size: usize) -> u32 {
    runtime("cudaMalloc", || {
        let conn = connection()?;
        if let Some(s) = crate::custom::placed::malloc(&conn, devPtr, size as u64) {
            return Ok(s);
        }
        // SAFETY: devPtr is the caller's void**, size a value.
        let s =
            unsafe { crate::runtime::call_on(&conn, &calls::cudaMalloc__call, &[devPtr as u64, size as u64]) } as u32;
        record_alloc(s, devPtr, size as u64);
        Ok(s)
    })
}

/// cudaMallocAsync and cudaMallocAsync_ptsz.
pub unsafe fn malloc_async(ctx: &Ctx, dev_ptr: *mut c_void, size: usize, stream: *mut c_void) -> u32 {
    runtime("cudaMallocAsync", || {
        let conn = connection()?;
        // SAFETY: as cudaMalloc.
        let args = [dev_ptr as u64, size as u64, stream as u64];
        let s = unsafe { crate::runtime::call_on(&conn, ctx.form(Form::Call), &args) } as u32;
        record_alloc(s, dev_ptr, size as u64);
        if s == SUCCESS && !dev_ptr.is_null() {
            let stream = ctx.stream(stream as u64) as *mut c_void;
            note_allocation(dev_ptr, stream as u64);
        }
        Ok(s)
    })
}

pub unsafe fn cudaMallocPitch(devPtr: *mut c_void, pitch: *mut c_void, width: usize, height: usize) -> u32 {
    runtime("cudaMallocPitch", || {
        let conn = connection()?;
        // SAFETY: the caller's void** and size_t*.
        let s = unsafe {
            crate::runtime::call_on(
                &conn,
                &calls::cudaMallocPitch__call,
                &[devPtr as u64, pitch as u64, width as u64, height as u64],
            )
        } as u32;
        if s == SUCCESS && !pitch.is_null() {
            // SAFETY: written by the reply.
            let p = unsafe { std::ptr::read_unaligned(pitch as *const u64) };
            record_alloc(s, devPtr, p.saturating_mul(height as u64));
        }
        Ok(s)
    })
}

fn free(desc: &'static chidori_protocol::desc::CallDesc, args: &[u64]) -> u32 {
    runtime("cudaFree", || {
        // Managed memory is the client's: freed here (after the work queued before it, as
        // cudaFree synchronizes).
        let conn = connection()?;
        if memory::is_managed_base(args[0]) {
            return Ok(memory::managed_free(&conn, &calls::cudaDeviceSynchronize__call, args[0]));
        }
        if let Some(s) = crate::custom::placed::free(&conn, args[0]) {
            return Ok(s);
        }
        // SAFETY: a device address and possibly a stream handle, by value.
        let s = unsafe { crate::runtime::call_on(&conn, desc, args) } as u32;
        if s == SUCCESS && args[0] != 0 {
            state::freed(args[0]);
            crate::custom::placed::forgotten(args[0]);
        }
        Ok(s)
    })
}

/// cudaFree(NULL) is forwarded too: programs call it to create the context.
pub unsafe fn cudaFree(devPtr: *mut c_void) -> u32 {
    free(&calls::cudaFree__call, &[devPtr as u64])
}

/// cudaFreeAsync and cudaFreeAsync_ptsz.
pub unsafe fn free_async(ctx: &Ctx, devPtr: *mut c_void, hStream: *mut c_void) -> u32 {
    free(ctx.form(Form::Call), &[devPtr as u64, hStream as u64])
}

// ---- Pinned host memory: client memory, recorded as pinned ----

pub unsafe fn cudaMallocHost(ptr: *mut c_void, size: usize) -> u32 {
    // SAFETY: same contract.
    unsafe { cudaHostAlloc(ptr, size, 0) }
}

pub unsafe fn cudaHostAlloc(pHost: *mut c_void, size: usize, flags: u32) -> u32 {
    runtime("cudaHostAlloc", || {
        if pHost.is_null() {
            return Err(INVALID_VALUE);
        }
        let p = memory::host_alloc(size, flags).ok_or(MEMORY_ALLOCATION)?;
        // SAFETY: the caller's void**.
        unsafe { put(pHost, p) }?;
        Ok(SUCCESS)
    })
}

/// Managed memory is client memory the server mirrors for the GPU (`state::Memory::Managed`).
/// `flags`: cudaMemAttachGlobal or cudaMemAttachHost, as natively (macros of the runtime's
/// header, the driver's CU_MEM_ATTACH_GLOBAL and CU_MEM_ATTACH_HOST numbers).
pub unsafe fn cudaMallocManaged(devPtr: *mut c_void, size: usize, flags: u32) -> u32 {
    use chidori_cuda::consts::CUmemAttach_flags_enum::{CU_MEM_ATTACH_GLOBAL, CU_MEM_ATTACH_HOST};
    runtime("cudaMallocManaged", || {
        if devPtr.is_null() || size == 0 || !(flags == CU_MEM_ATTACH_GLOBAL || flags == CU_MEM_ATTACH_HOST) {
            return Err(INVALID_VALUE);
        }
        let p = memory::managed_alloc(size).ok_or(MEMORY_ALLOCATION)?;
        // SAFETY: the caller's void**.
        unsafe { put(devPtr, p) }?;
        Ok(SUCCESS)
    })
}

pub unsafe fn cudaFreeHost(ptr: *mut c_void) -> u32 {
    runtime("cudaFreeHost", || if memory::host_free(ptr) { Ok(SUCCESS) } else { Err(INVALID_VALUE) })
}

pub unsafe fn cudaHostRegister(ptr: *mut c_void, size: usize, flags: u32) -> u32 {
    runtime("cudaHostRegister", || {
        if ptr.is_null() || size == 0 {
            return Err(INVALID_VALUE);
        }
        if state::find(ptr as u64).is_some() || state::find(ptr as u64 + size as u64 - 1).is_some() {
            return Err(HOST_MEMORY_ALREADY_REGISTERED);
        }
        state::add(ptr as u64, size as u64, Memory::Registered { flags });
        crate::mirror::note_outside_arena();
        Ok(SUCCESS)
    })
}

pub unsafe fn cudaHostUnregister(ptr: *mut c_void) -> u32 {
    runtime("cudaHostUnregister", || match state::find(ptr as u64) {
        Some(r) if r.base == ptr as u64 && matches!(r.memory, Memory::Registered { .. }) => {
            crate::mirror::forget(r.base);
            state::remove(r.base);
            Ok(SUCCESS)
        }
        _ => Err(HOST_MEMORY_NOT_REGISTERED),
    })
}

pub unsafe fn cudaHostGetFlags(pFlags: *mut c_void, pHost: *mut c_void) -> u32 {
    runtime("cudaHostGetFlags", || match state::find(pHost as u64).map(|r| r.memory) {
        // SAFETY: the caller's unsigned int.
        Some(Memory::Pinned { flags } | Memory::Registered { flags }) => unsafe { put(pFlags, flags) }.map(|_| SUCCESS),
        _ => Err(INVALID_VALUE),
    })
}

/// The device address of pinned memory is its host address (unified addressing; the
/// server mirrors the memory there when the GPU is handed a pointer into it).
pub unsafe fn cudaHostGetDevicePointer(pDevice: *mut c_void, pHost: *mut c_void, flags: u32) -> u32 {
    runtime("cudaHostGetDevicePointer", || {
        let host = state::find(pHost as u64)
            .is_some_and(|r| matches!(r.memory, Memory::Pinned { .. } | Memory::Registered { .. }));
        if pDevice.is_null() || flags != 0 || !host {
            return Err(INVALID_VALUE);
        }
        // SAFETY: the caller's void**.
        unsafe { put(pDevice, pHost) }?;
        Ok(SUCCESS)
    })
}

/// cudaPointerGetAttributes in the caller's layout (24 bytes before CUDA 13, 88 after).
fn pointer_attributes(version: &str, attributes: *mut c_void, ptr: *mut c_void) -> u32 {
    runtime("cudaPointerGetAttributes", || {
        if attributes.is_null() {
            return Err(INVALID_VALUE);
        }
        let map = chidori_cuda::structs::get(version, "cudaPointerAttributes").ok_or(INVALID_VALUE)?;
        let addr = ptr as u64;
        // Device -2 is cudaInvalidDeviceId (a macro of the runtime's header, not an enum).
        use chidori_cuda::consts::cudaMemoryType as t;
        let (kind, device, device_ptr, host_ptr) = match state::find(addr).map(|r| r.memory) {
            Some(Memory::Device { device }) => (t::cudaMemoryTypeDevice, device, addr, 0),
            // Page-locked host memory is mapped for the device at its own address.
            Some(Memory::Pinned { .. } | Memory::Registered { .. }) => {
                (t::cudaMemoryTypeHost, state::current_device(), addr, addr)
            }
            // Managed memory: one address for both.
            Some(Memory::Managed) => (t::cudaMemoryTypeManaged, state::current_device(), addr, addr),
            None => (t::cudaMemoryTypeUnregistered, -2, 0, 0),
        };
        // SAFETY: the caller's struct of this version's layout.
        unsafe {
            state::write_record(map, attributes as *mut u8, |f| match f.name {
                "type" => Some(PropValue::Int(i64::from(kind))),
                "device" => Some(PropValue::Int(i64::from(device))),
                "devicePointer" => Some(PropValue::Int(device_ptr as i64)),
                "hostPointer" => Some(PropValue::Int(host_ptr as i64)),
                _ => None,
            })
        };
        Ok(SUCCESS)
    })
}

/// In the layout of the caller's CUDA version (24 bytes before 13.0, 88 from it).
pub unsafe fn get_pointer_attributes(ctx: &Ctx, attributes: *mut c_void, ptr: *mut c_void) -> u32 {
    pointer_attributes(ctx.version, attributes, ptr)
}

// ---- Copies ----

fn memcpy(forms: &CopyForms, dst: u64, src: u64, count: u64, kind: u32, tail: &[u64], asynchronous: bool) -> u32 {
    runtime("cudaMemcpy", || {
        let direction = memory::direction(kind, dst, src).ok_or(INVALID_MEMCPY_DIRECTION)?;
        if direction == (false, false) && !asynchronous {
            // A host-to-host copy needs no server, but is ordered after earlier copies.
            state::wait_deferred();
        }
        let conn = connection()?;
        // SAFETY: host pointers are the caller's buffers of `count` bytes (CUDA's contract).
        Ok(unsafe { memory::copy(&conn, forms, dst, src, count, direction, tail, asynchronous) } as u32)
    })
}

/// cudaMemcpy and cudaMemcpy_ptds.
pub unsafe fn memcpy_sync(ctx: &Ctx, dst: *mut c_void, src: *mut c_void, count: usize, kind: u32) -> u32 {
    memcpy(&CopyForms::of(ctx), dst as u64, src as u64, count as u64, kind, &[], false)
}

/// cudaMemcpyAsync and cudaMemcpyAsync_ptsz (whose NULL stream is the thread's own).
pub unsafe fn memcpy_async(
    ctx: &Ctx,
    dst: *mut c_void,
    src: *mut c_void,
    count: usize,
    kind: u32,
    stream: *mut c_void,
) -> u32 {
    let stream = ctx.stream(stream as u64) as *mut c_void;
    memcpy(&CopyForms::of(ctx), dst as u64, src as u64, count as u64, kind, &[stream as u64], true)
}

// ---- Host callbacks: run on the client, in stream order ----

/// `args`: the call's arguments; the function pointer (index 1) is replaced by the id of
/// the registered closure and the user data (index 2) stays on the client.
fn host_function(desc: &'static chidori_protocol::desc::CallDesc, mut args: Vec<u64>, run: conn::CallbackFn) -> u32 {
    runtime("cudaLaunchHostFunc", || {
        let conn = connection()?;
        let id = conn.register_callback(run, args[0], any_active());
        args[1] = id;
        args[2] = 0;
        // SAFETY: values only: the stream, the callback id, flags.
        let s = unsafe { crate::runtime::call_on(&conn, desc, &args) } as u32;
        if s != SUCCESS {
            conn.drop_callback(id);
        }
        Ok(s)
    })
}

type HostFn = unsafe extern "C" fn(*mut c_void);
type StreamCallback = unsafe extern "C" fn(*mut c_void, u32, *mut c_void);

/// cudaLaunchHostFunc and cudaLaunchHostFunc_ptsz.
pub unsafe fn launch_host_func(ctx: &Ctx, stream: *mut c_void, f: *mut c_void, user: *mut c_void) -> u32 {
    let desc = ctx.form(Form::Host);
    if f.is_null() {
        return INVALID_VALUE;
    }
    let (f, user) = (f as usize, user as usize);
    host_function(
        desc,
        vec![stream as u64, 0, 0],
        Arc::new(move |_status| {
            // SAFETY: the program's cudaHostFn_t and its user data, called as CUDA would.
            unsafe { std::mem::transmute::<usize, HostFn>(f)(user as *mut c_void) }
        }),
    )
}

/// cudaLaunchHostFunc_v2 and its per-thread form (CUDA 13.5): cudaLaunchHostFunc with how
/// CUDA's thread waits for the function, one of `cudaHostTaskSyncMode` (the driver's values).
pub unsafe fn launch_host_func_v2(
    ctx: &Ctx,
    stream: *mut c_void,
    f: *mut c_void,
    user: *mut c_void,
    sync_mode: u32,
) -> u32 {
    if !crate::custom::driver::host_sync_mode_known(sync_mode) {
        return INVALID_VALUE;
    }
    // SAFETY: forwarded contract.
    unsafe { launch_host_func(ctx, stream, f, user) }
}

/// cudaStreamAddCallback and cudaStreamAddCallback_ptsz.
pub unsafe fn stream_callback(ctx: &Ctx, stream: *mut c_void, cb: *mut c_void, user: *mut c_void, flags: u32) -> u32 {
    let desc = ctx.form(Form::Host);
    if cb.is_null() {
        return INVALID_VALUE;
    }
    let (s, cb, user) = (stream as usize, cb as usize, user as usize);
    host_function(
        desc,
        vec![s as u64, 0, 0, u64::from(flags)],
        Arc::new(move |status| {
            // SAFETY: the program's cudaStreamCallback_t, called with CUDA's arguments.
            unsafe {
                std::mem::transmute::<usize, StreamCallback>(cb)(s as *mut c_void, status as u32, user as *mut c_void)
            }
        }),
    )
}

/// cudaUserObjectCreate and cuUserObjectCreate (`raw_args`: object_out, ptr, destroy,
/// initialRefcount, flags): the destructor and its pointer stay here, registered as a
/// callback the server's stand-in asks to run when the driver releases the object. Nothing
/// waits for it (it is no stream's work), and it runs once.
pub unsafe fn user_object_create(ctx: &Ctx, args: &[u64]) -> u64 {
    let invalid = ctx.codes.invalid_value as u64;
    let desc = ctx.form(Form::Host);
    let [out, ptr, destroy, refcount, flags] = match args {
        [a, b, c, d, e, ..] => [*a, *b, *c, *d, *e],
        _ => return invalid,
    };
    if out == 0 || destroy == 0 {
        return invalid;
    }
    let (f, user) = (destroy as usize, ptr as usize);
    let run: conn::CallbackFn = Arc::new(move |_status| {
        // SAFETY: the program's destructor (a cudaHostFn_t / CUhostFn) and its pointer,
        // called once as CUDA would.
        unsafe { std::mem::transmute::<usize, HostFn>(f)(user as *mut c_void) }
    });
    crate::guard::ffi(ctx.name, invalid, || {
        let Ok(conn) = conn::get() else { return crate::runtime::unavailable(desc) };
        let id = conn.register_callback(run, 0, true);
        // SAFETY: the caller's handle pointer (checked non-null) and values: the callback's
        // id in ptr's place, no function.
        let s = unsafe { crate::runtime::call(desc, &[out, id, 0, refcount, flags]) };
        if s != desc.codes.success as u64 {
            conn.drop_callback(id);
        }
        s
    })
}

pub use super::kernels::*;

/// The stream a `_ptsz` entry point means: NULL there is the calling thread's default
/// stream (`cudaStreamPerThread`), not the legacy one.
fn per_thread(stream: *mut c_void) -> *mut c_void {
    chidori_protocol::desc::stream_meant(stream as u64, true) as *mut c_void
}

/// # Safety
/// As [`__cudaLaunchKernel`].
pub unsafe fn __cudaLaunchKernel_ptsz(
    kernel: *mut c_void,
    gridDim: dim3,
    blockDim: dim3,
    args: *mut c_void,
    sharedMem: usize,
    stream: *mut c_void,
) -> u32 {
    // SAFETY: same contract.
    unsafe { __cudaLaunchKernel(kernel, gridDim, blockDim, args, sharedMem, per_thread(stream)) }
}

pub unsafe fn cudaLaunchKernel_ptsz(
    func: *mut c_void,
    gridDim: dim3,
    blockDim: dim3,
    args: *mut c_void,
    sharedMem: usize,
    stream: *mut c_void,
) -> u32 {
    // SAFETY: same contract.
    unsafe { cudaLaunchKernel(func, gridDim, blockDim, args, sharedMem, per_thread(stream)) }
}

pub unsafe fn cudaLaunchCooperativeKernel_ptsz(
    func: *mut c_void,
    gridDim: dim3,
    blockDim: dim3,
    args: *mut c_void,
    sharedMem: usize,
    stream: *mut c_void,
) -> u32 {
    // SAFETY: same contract.
    unsafe { cudaLaunchCooperativeKernel(func, gridDim, blockDim, args, sharedMem, per_thread(stream)) }
}
pub use super::capture::*;
pub use super::context::cudaDeviceReset;
pub use super::entry::cudart::*;

// ---- Profiler control: a profiler attaches to the program's own process, where no GPU
// work runs, so there is nothing to start or stop ----

pub unsafe fn cudaProfilerStart() -> u32 {
    runtime("cudaProfilerStart", || Ok(SUCCESS))
}

pub unsafe fn cudaProfilerStop() -> u32 {
    runtime("cudaProfilerStop", || Ok(SUCCESS))
}

// ---- Pool allocations and managed-range queries ----

/// cudaMallocFromPoolAsync and its `_ptsz` form: the allocation enters the interval map.
pub unsafe fn malloc_from_pool(
    ctx: &Ctx,
    ptr: *mut c_void,
    size: usize,
    pool: *mut c_void,
    stream: *mut c_void,
) -> u32 {
    runtime(ctx.name, || {
        let conn = connection()?;
        let stream = ctx.stream(stream as u64) as *mut c_void;
        let args = [ptr as u64, size as u64, pool as u64, stream as u64];
        // SAFETY: the caller's void**; handles and sizes by value.
        let s = unsafe { crate::runtime::call_on(&conn, ctx.form(Form::Call), &args) } as u32;
        record_alloc(s, ptr, size as u64);
        if s == SUCCESS && !ptr.is_null() {
            note_allocation(ptr, stream as u64);
        }
        Ok(s)
    })
}

/// cudaMemRangeGetAttributes: one cudaMemRangeGetAttribute per attribute, in one round trip.
pub unsafe fn mem_range_get_attributes(
    ctx: &Ctx,
    data: *mut c_void,
    data_sizes: *mut c_void,
    attributes: *mut c_void,
    count: usize,
    dev_ptr: *mut c_void,
    len: usize,
) -> u32 {
    runtime(ctx.name, || {
        // SAFETY: the caller's three arrays of `count` elements, or NULL.
        let Some(calls_args) =
            (unsafe { memory::range_attribute_calls(data, data_sizes, attributes, count, dev_ptr as u64, len) })
        else {
            return Err(INVALID_VALUE);
        };
        let conn = connection()?;
        // SAFETY: each call writes dataSizes[i] bytes into data[i].
        Ok(unsafe { crate::runtime::call_batch(&conn, &calls::cudaMemRangeGetAttribute, &calls_args) } as u32)
    })
}
