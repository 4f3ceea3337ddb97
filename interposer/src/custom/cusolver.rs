//! Hand-written cuSOLVER functions: a host workspace that only a size query can size.
#![allow(non_snake_case, clippy::missing_safety_doc, clippy::too_many_arguments)]

use std::ffi::c_void;

use chidori_cuda::calls::cusolver as calls;
use chidori_cuda::desc::Ctx;

/// `cusolverSpXcsrpermHost`: `pBuffer` is a host workspace whose size no parameter gives
/// (the caller sized it with `cusolverSpXcsrperm_bufferSizeHost`). The client asks that
/// query itself with the same inputs (one more round trip), then sends the call with the
/// size in place of the workspace's address: the worker passes a workspace of its own of
/// that size. What the library leaves in the workspace is not copied back (it is scratch).
pub unsafe fn xcsrperm_host(
    ctx: &Ctx,
    handle: *mut c_void,
    m: i32,
    n: i32,
    nnzA: i32,
    descrA: *mut c_void,
    csrRowPtrA: *mut c_void,
    csrColIndA: *mut c_void,
    p: *mut c_void,
    q: *mut c_void,
    map: *mut c_void,
    pBuffer: *mut c_void,
) -> u32 {
    let invalid = ctx.codes.invalid_value as u32;
    crate::guard::ffi("cusolverSpXcsrpermHost", invalid, || {
        let Some(&form) = ctx.forms.first() else { return invalid };
        if pBuffer.is_null() {
            return invalid;
        }
        let mut bytes: usize = 0;
        let inputs = [
            handle as u64,
            m as u32 as u64,
            n as u32 as u64,
            nnzA as u32 as u64,
            descrA as u64,
            csrRowPtrA as u64,
            csrColIndA as u64,
            p as u64,
            q as u64,
        ];
        let mut query = inputs.to_vec();
        query.push(&mut bytes as *mut usize as u64);
        // SAFETY: the caller's arrays, of the lengths the query's spec gives; `bytes`
        // receives one size_t.
        let s = unsafe { crate::runtime::call(&calls::cusolverSpXcsrperm_bufferSizeHost, &query) as u32 };
        if s != 0 {
            return s;
        }
        let mut args = inputs.to_vec();
        args.push(map as u64);
        args.push(bytes as u64);
        // SAFETY: the caller's arrays, read and written as the spec says; the workspace
        // travels as its size only.
        unsafe { crate::runtime::call(form, &args) as u32 }
    })
}
