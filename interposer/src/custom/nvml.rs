//! NVML initialization and device count, answered on the client (the worker initializes
//! NVML itself before the first NVML call it forwards). `torch.cuda.device_count()` asks
//! NVML before CUDA: this keeps it free of round trips.
#![allow(non_snake_case, clippy::missing_safety_doc)]

use std::ffi::c_void;

use chidori_cuda::desc::Ctx;

const SUCCESS: u32 = chidori_cuda::consts::nvmlReturn_enum::NVML_SUCCESS;
const INVALID_ARGUMENT: u32 = chidori_cuda::consts::nvmlReturn_enum::NVML_ERROR_INVALID_ARGUMENT;
const DRIVER_NOT_LOADED: u32 = chidori_cuda::consts::nvmlReturn_enum::NVML_ERROR_DRIVER_NOT_LOADED;
const NOT_SUPPORTED: u32 = chidori_cuda::consts::nvmlReturn_enum::NVML_ERROR_NOT_SUPPORTED;

fn init(name: &'static str) -> u32 {
    crate::guard::ffi(name, DRIVER_NOT_LOADED, || {
        crate::trace::local(name);
        // Without a server there is no NVIDIA driver to talk to.
        if crate::conn::get().is_ok() { SUCCESS } else { DRIVER_NOT_LOADED }
    })
}

/// nvmlInternalGetExportTable: NVML's private table, which a local nvidia-smi asks for
/// first. Not answered (NVIDIA does not publish what its functions do); the log says where
/// the server's nvidia-smi is.
pub unsafe fn nvmlInternalGetExportTable(table: *mut c_void, _id: *mut c_void) -> u32 {
    crate::guard::ffi("nvmlInternalGetExportTable", NOT_SUPPORTED, || {
        crate::log::once("nvml-export-table", || {
            tracing::warn!(
                "a program asked NVML for its private export table (nvidia-smi does), which Chidori's NVML does \
                 not have: under `chidori run`, the `nvidia-smi` found on PATH is the server's"
            )
        });
        if !table.is_null() {
            // SAFETY: the caller's pointer to the table pointer, checked non-null.
            unsafe { std::ptr::write_unaligned(table as *mut usize, 0) };
        }
        NOT_SUPPORTED
    })
}

fn count(name: &'static str, out: *mut c_void) -> u32 {
    crate::guard::ffi(name, DRIVER_NOT_LOADED, || {
        crate::trace::local(name);
        if out.is_null() {
            return INVALID_ARGUMENT;
        }
        let Ok(conn) = crate::conn::get() else { return DRIVER_NOT_LOADED };
        // NVML ignores CUDA_VISIBLE_DEVICES: it counts the GPUs the server exposes.
        let n = conn.profile.nvml_devices;
        // SAFETY: the caller's unsigned int, checked non-null.
        unsafe { std::ptr::write_unaligned(out as *mut u32, n) };
        SUCCESS
    })
}

/// nvmlInit and nvmlInit_v2.
pub unsafe fn init_library(ctx: &Ctx) -> u32 {
    init(ctx.name)
}

pub unsafe fn nvmlInitWithFlags(_flags: u32) -> u32 {
    init("nvmlInitWithFlags")
}

/// The worker's NVML stays initialized until the session ends.
pub unsafe fn nvmlShutdown() -> u32 {
    crate::guard::ffi("nvmlShutdown", SUCCESS, || {
        crate::trace::local("nvmlShutdown");
        SUCCESS
    })
}

/// nvmlDeviceGetCount and its `_v2`.
pub unsafe fn device_count(ctx: &Ctx, out: *mut c_void) -> u32 {
    count(ctx.name, out)
}
