//! Hand-written cuBLAS functions: the client records each handle's pointer mode, which
//! decides whether scalars travel as values or pass as device addresses (`crate::scalars`).
#![allow(non_snake_case, clippy::missing_safety_doc)]

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Mutex;

use chidori_cuda::calls::cublas as calls;

/// CUBLAS_STATUS_INVALID_VALUE.
const INVALID_VALUE: u32 = 7;
/// CUBLAS_POINTER_MODE_DEVICE.
const POINTER_MODE_DEVICE: u32 = 1;

/// Math mode per handle, as last set (a new handle has CUBLAS_DEFAULT_MATH, 0).
static MATH_MODE: Mutex<Option<HashMap<u64, u32>>> = Mutex::new(None);

fn math_modes() -> std::sync::MutexGuard<'static, Option<HashMap<u64, u32>>> {
    MATH_MODE.lock().unwrap_or_else(|p| p.into_inner())
}

pub unsafe fn cublasCreate_v2(handle: *mut c_void) -> u32 {
    let s = crate::scalars::create_handle("cublasCreate_v2", &calls::cublasCreate_v2__call, handle, INVALID_VALUE);
    if s == 0 && !handle.is_null() {
        // SAFETY: written by the reply.
        let h = unsafe { std::ptr::read_unaligned(handle as *const u64) };
        math_modes().get_or_insert_with(HashMap::new).insert(h, 0);
    }
    s
}

pub unsafe fn cublasSetMathMode(handle: *mut c_void, mode: u32) -> u32 {
    crate::guard::ffi("cublasSetMathMode", INVALID_VALUE, || {
        // SAFETY: values only.
        let s =
            unsafe { crate::runtime::call(&calls::cublasSetMathMode__call, &[handle as u64, u64::from(mode)]) } as u32;
        // Sent without waiting: a mode the library refuses surfaces at the next synchronizing
        // call; until then reads answer what was set, as they would after a success.
        math_modes().get_or_insert_with(HashMap::new).insert(handle as u64, mode);
        s
    })
}

pub unsafe fn cublasGetMathMode(handle: *mut c_void, mode: *mut c_void) -> u32 {
    crate::guard::ffi("cublasGetMathMode", INVALID_VALUE, || {
        crate::trace::local("cublasGetMathMode");
        if mode.is_null() {
            return INVALID_VALUE;
        }
        let known = math_modes().as_ref().and_then(|m| m.get(&(handle as u64)).copied());
        if let Some(m) = known {
            // SAFETY: the caller's cublasMath_t, checked non-null.
            unsafe { std::ptr::write_unaligned(mode as *mut u32, m) };
            return 0;
        }
        // SAFETY: as above.
        unsafe { crate::runtime::call(&calls::cublasGetMathMode__call, &[handle as u64, mode as u64]) as u32 }
    })
}

pub unsafe fn cublasSetPointerMode_v2(handle: *mut c_void, mode: u32) -> u32 {
    let desc = &calls::cublasSetPointerMode_v2__call;
    crate::scalars::set_pointer_mode("cublasSetPointerMode_v2", desc, handle, mode, POINTER_MODE_DEVICE, INVALID_VALUE)
}
