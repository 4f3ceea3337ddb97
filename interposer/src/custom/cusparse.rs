//! Hand-written cuSPARSE functions: the client records each handle's pointer mode, which
//! decides whether scalars travel as values or pass as device addresses (`crate::scalars`).
#![allow(non_snake_case, clippy::missing_safety_doc)]

use std::ffi::c_void;

use chidori_cuda::calls::cusparse as calls;

const INVALID_VALUE: u32 = chidori_cuda::consts::cusparseStatus_t::CUSPARSE_STATUS_INVALID_VALUE;
const POINTER_MODE_DEVICE: u32 = chidori_cuda::consts::cusparsePointerMode_t::CUSPARSE_POINTER_MODE_DEVICE;

pub unsafe fn cusparseCreate(handle: *mut c_void) -> u32 {
    super::handles::create_handle("cusparseCreate", &calls::cusparseCreate__call, handle, INVALID_VALUE)
}

pub unsafe fn cusparseSetPointerMode(handle: *mut c_void, mode: u32) -> u32 {
    let desc = &calls::cusparseSetPointerMode__call;
    super::handles::set_pointer_mode("cusparseSetPointerMode", desc, handle, mode, POINTER_MODE_DEVICE, INVALID_VALUE)
}
