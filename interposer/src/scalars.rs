//! Pointer modes of BLAS handles: whether a call's scalars (alpha, beta, a reduction's
//! result) are host values, which travel with the call, or device addresses, which pass
//! through. cuBLAS keeps the mode per handle (`cublasSetPointerMode_v2`), cuBLASLt per
//! matmul descriptor (`CUBLASLT_MATMUL_DESC_POINTER_MODE`); both default to host.

use std::collections::HashSet;
use std::sync::Mutex;

/// Handles (cublasHandle_t, cublasLtMatmulDesc_t) in device pointer mode.
static DEVICE_MODE: Mutex<Option<HashSet<u64>>> = Mutex::new(None);

/// Whether scalars of calls on `handle` are device addresses.
pub fn device_mode(handle: u64) -> bool {
    DEVICE_MODE.lock().unwrap_or_else(|p| p.into_inner()).as_ref().is_some_and(|s| s.contains(&handle))
}

/// Record the mode of `handle` (a new handle starts in host mode: call with false).
pub fn set_device_mode(handle: u64, device: bool) {
    let mut set = DEVICE_MODE.lock().unwrap_or_else(|p| p.into_inner());
    let set = set.get_or_insert_with(HashSet::new);
    if device {
        set.insert(handle);
    } else {
        set.remove(&handle);
    }
}

/// A library's handle creation (`cublasCreate_v2`, `cusparseCreate`): forwarded; the new
/// handle starts in host mode (a handle value can be reused after a destroy).
pub fn create_handle(
    name: &'static str,
    desc: &'static chidori_protocol::desc::CallDesc,
    handle: *mut std::ffi::c_void,
    invalid_value: u32,
) -> u32 {
    crate::guard::ffi(name, invalid_value, || {
        if handle.is_null() {
            return invalid_value;
        }
        // SAFETY: the caller's handle pointer, checked non-null.
        let s = unsafe { crate::runtime::call(desc, &[handle as u64]) } as u32;
        if s == 0 {
            // SAFETY: written by the reply.
            let h = unsafe { std::ptr::read_unaligned(handle as *const u64) };
            set_device_mode(h, false);
        }
        s
    })
}

/// A library's `Set*PointerMode`: forwarded (without waiting), and recorded for the calls
/// after it. `device` is the library's DEVICE mode value.
pub fn set_pointer_mode(
    name: &'static str,
    desc: &'static chidori_protocol::desc::CallDesc,
    handle: *mut std::ffi::c_void,
    mode: u32,
    device: u32,
    invalid_value: u32,
) -> u32 {
    crate::guard::ffi(name, invalid_value, || {
        // SAFETY: values only.
        let s = unsafe { crate::runtime::call(desc, &[handle as u64, u64::from(mode)]) } as u32;
        set_device_mode(handle as u64, mode == device);
        s
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_start_in_host_mode_and_switch() {
        assert!(!device_mode(0x1234));
        set_device_mode(0x1234, true);
        assert!(device_mode(0x1234));
        assert!(!device_mode(0x1235));
        set_device_mode(0x1234, false);
        assert!(!device_mode(0x1234));
    }
}
