//! Hand-written cuBLASLt functions: the client records each matmul descriptor's pointer
//! mode (`CUBLASLT_MATMUL_DESC_POINTER_MODE`), which decides whether `cublasLtMatmul`'s
//! alpha and beta travel as values or pass as device addresses (`crate::scalars`).
#![allow(non_snake_case, clippy::missing_safety_doc)]

use std::ffi::c_void;

use chidori_cuda::calls::cublaslt as calls;
use chidori_protocol::desc::CallDesc;

/// CUBLAS_STATUS_SUCCESS, CUBLAS_STATUS_INVALID_VALUE.
const SUCCESS: u32 = 0;
const INVALID_VALUE: u32 = 7;
/// CUBLASLT_MATMUL_DESC_POINTER_MODE (the same value in every supported version).
const DESC_POINTER_MODE: u32 = 2;

fn create(desc: &'static CallDesc, matmulDesc: *mut c_void, computeType: u32, scaleType: u32) -> u32 {
    crate::guard::ffi("cublasLtMatmulDescCreate", INVALID_VALUE, || {
        if matmulDesc.is_null() {
            return INVALID_VALUE;
        }
        let args = [matmulDesc as u64, u64::from(computeType), u64::from(scaleType)];
        // SAFETY: the caller's cublasLtMatmulDesc_t*, checked non-null; values.
        let s = unsafe { crate::runtime::call(desc, &args) } as u32;
        if s == SUCCESS {
            // SAFETY: written by the reply.
            let d = unsafe { std::ptr::read_unaligned(matmulDesc as *const u64) };
            crate::scalars::set_device_mode(d, false);
        }
        s
    })
}

fn set_attribute(desc: &'static CallDesc, matmulDesc: *mut c_void, attr: u32, buf: *mut c_void, size: usize) -> u32 {
    crate::guard::ffi("cublasLtMatmulDescSetAttribute", INVALID_VALUE, || {
        // SAFETY: the caller's attribute value of `size` bytes.
        let s = unsafe { crate::runtime::call(desc, &[matmulDesc as u64, u64::from(attr), buf as u64, size as u64]) }
            as u32;
        if attr == DESC_POINTER_MODE && !buf.is_null() && size >= 4 {
            // SAFETY: as above; cublasLtPointerMode_t is a 32-bit enum. Every mode but
            // HOST (0) puts alpha on the device.
            let mode = unsafe { std::ptr::read_unaligned(buf as *const u32) };
            crate::scalars::set_device_mode(matmulDesc as u64, mode != 0);
        }
        s
    })
}

pub unsafe fn cublasLtMatmulDescCreate__cu118(matmulDesc: *mut c_void, computeType: u32, scaleType: u32) -> u32 {
    create(&calls::cublasLtMatmulDescCreate__cu118__call, matmulDesc, computeType, scaleType)
}

pub unsafe fn cublasLtMatmulDescCreate__cu126(matmulDesc: *mut c_void, computeType: u32, scaleType: u32) -> u32 {
    create(&calls::cublasLtMatmulDescCreate__cu126__call, matmulDesc, computeType, scaleType)
}

pub unsafe fn cublasLtMatmulDescSetAttribute__cu118(
    matmulDesc: *mut c_void,
    attr: u32,
    buf: *mut c_void,
    sizeInBytes: usize,
) -> u32 {
    set_attribute(&calls::cublasLtMatmulDescSetAttribute__cu118__call, matmulDesc, attr, buf, sizeInBytes)
}

pub unsafe fn cublasLtMatmulDescSetAttribute__cu126(
    matmulDesc: *mut c_void,
    attr: u32,
    buf: *mut c_void,
    sizeInBytes: usize,
) -> u32 {
    set_attribute(&calls::cublasLtMatmulDescSetAttribute__cu126__call, matmulDesc, attr, buf, sizeInBytes)
}
