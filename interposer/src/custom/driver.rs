//! Hand-written driver API functions.
#![allow(non_snake_case)]

use std::ffi::c_void;

/// CUDA_ERROR_INVALID_VALUE.
const INVALID_VALUE: u32 = 1;

/// Newest CUDA version whose status table describes the driver's codes (they only grow).
const TABLE_VERSION: &str = "13.1";

fn lookup(error: u32, name: bool, out: *mut c_void) -> u32 {
    crate::guard::ffi("cuGetErrorName", INVALID_VALUE, || {
        if out.is_null() {
            return INVALID_VALUE;
        }
        let Some(status) = chidori_cuda::status::table(TABLE_VERSION, "driver")
            .and_then(|t| chidori_cuda::status::find(t, i64::from(error)))
        else {
            // SAFETY: `out` is the caller's `const char**`, checked non-null above.
            unsafe { *(out as *mut *const u8) = std::ptr::null() };
            return INVALID_VALUE;
        };
        let text = if name { status.name } else { status.message };
        // SAFETY: as above; the strings are NUL-terminated statics.
        unsafe { *(out as *mut *const u8) = text.as_ptr() };
        0
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
