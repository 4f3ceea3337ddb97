//! Hand-written cuBLAS functions: the client records each handle's pointer mode, which
//! decides whether scalars travel as values or pass as device addresses (`crate::scalars`).
#![allow(non_snake_case, clippy::missing_safety_doc)]

use std::ffi::c_void;

use chidori_cuda::calls::cublas as calls;

/// CUBLAS_STATUS_SUCCESS, CUBLAS_STATUS_INVALID_VALUE.
const SUCCESS: u32 = 0;
const INVALID_VALUE: u32 = 7;
/// CUBLAS_POINTER_MODE_DEVICE.
const POINTER_MODE_DEVICE: u32 = 1;

pub unsafe fn cublasCreate_v2(handle: *mut c_void) -> u32 {
    crate::guard::ffi("cublasCreate_v2", INVALID_VALUE, || {
        if handle.is_null() {
            return INVALID_VALUE;
        }
        // SAFETY: the caller's cublasHandle_t*, checked non-null.
        let s = unsafe { crate::runtime::call(&calls::cublasCreate_v2__call, &[handle as u64]) } as u32;
        if s == SUCCESS {
            // SAFETY: written by the reply.
            let h = unsafe { std::ptr::read_unaligned(handle as *const u64) };
            // A handle value may be reused after a destroy: it starts in host mode.
            crate::scalars::set_device_mode(h, false);
        }
        s
    })
}

pub unsafe fn cublasSetPointerMode_v2(handle: *mut c_void, mode: u32) -> u32 {
    crate::guard::ffi("cublasSetPointerMode_v2", INVALID_VALUE, || {
        // SAFETY: values only.
        let s =
            unsafe { crate::runtime::call(&calls::cublasSetPointerMode_v2__call, &[handle as u64, u64::from(mode)]) }
                as u32;
        // Sent without waiting: the mode applies to the calls after it either way.
        crate::scalars::set_device_mode(handle as u64, mode == POINTER_MODE_DEVICE);
        s
    })
}
