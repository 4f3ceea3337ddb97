//! Hand-written runtime functions: nvcc's registration and launch API.
#![allow(non_snake_case)]

use std::cell::RefCell;
use std::ffi::c_void;

use chidori_cuda::types::dim3;

use crate::registry;

/// cudaErrorInvalidValue / cudaErrorInvalidDeviceFunction / cudaErrorMissingConfiguration /
/// cudaErrorNoDevice (identical in every supported version).
const INVALID_VALUE: u32 = 1;
const INVALID_DEVICE_FUNCTION: u32 = 98;
const MISSING_CONFIGURATION: u32 = 52;
const NO_DEVICE: u32 = 100;

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

/// Loading a module for managed variables needs the server; 0 means failure to nvcc code.
///
/// # Safety
/// Any value is accepted.
pub unsafe fn __cudaInitModule(fatCubinHandle: *mut c_void) -> i8 {
    let _ = fatCubinHandle;
    0
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
        CONFIGS.with(|c| {
            c.borrow_mut().push(LaunchConfig { grid: gridDim, block: blockDim, shared_mem: sharedMem, stream })
        });
        0
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
        let Some(config) = CONFIGS.with(|c| c.borrow_mut().pop()) else { return MISSING_CONFIGURATION };
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

/// # Safety
/// Arguments as nvcc's launch stub passes them.
pub unsafe fn __cudaLaunchKernel(
    kernel: *mut c_void,
    gridDim: dim3,
    blockDim: dim3,
    args: *mut c_void,
    sharedMem: usize,
    stream: *mut c_void,
) -> u32 {
    let _ = (kernel, gridDim, blockDim, args, sharedMem, stream);
    // Kernels need the transport and module upload (a later issue).
    NO_DEVICE
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
    unsafe { __cudaLaunchKernel(kernel, gridDim, blockDim, args, sharedMem, stream) }
}
