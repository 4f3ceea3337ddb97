//! Hand-written cuBLAS functions: the client records each handle's pointer mode, which
//! decides whether scalars travel as values or pass as device addresses (`crate::scalars`).
#![allow(non_snake_case, clippy::missing_safety_doc)]

use std::ffi::c_void;

use chidori_cuda::calls::cublas as calls;

/// CUBLAS_STATUS_INVALID_VALUE.
const INVALID_VALUE: u32 = 7;
/// CUBLAS_POINTER_MODE_DEVICE.
const POINTER_MODE_DEVICE: u32 = 1;

pub unsafe fn cublasCreate_v2(handle: *mut c_void) -> u32 {
    crate::scalars::create_handle("cublasCreate_v2", &calls::cublasCreate_v2__call, handle, INVALID_VALUE)
}

pub unsafe fn cublasSetPointerMode_v2(handle: *mut c_void, mode: u32) -> u32 {
    let desc = &calls::cublasSetPointerMode_v2__call;
    crate::scalars::set_pointer_mode("cublasSetPointerMode_v2", desc, handle, mode, POINTER_MODE_DEVICE, INVALID_VALUE)
}
