//! BLAS-style handles whose pointer mode the client records (`crate::scalars`): their
//! creation and `Set*PointerMode`, shared by cuBLAS and cuSPARSE.

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
            crate::scalars::set_device_mode(h, false);
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
        crate::scalars::set_device_mode(handle as u64, mode == device);
        s
    })
}
