//! Hand-written NCCL functions.
#![allow(clippy::missing_safety_doc)]

use chidori_protocol::desc::{Ctx, Form};

/// ncclScalarDevice and ncclScalarHostImmediate.
const SCALAR_DEVICE: u64 = chidori_cuda::consts::ncclScalarResidence_t::ncclScalarDevice as u64;
const SCALAR_HOST_IMMEDIATE: u64 = chidori_cuda::consts::ncclScalarResidence_t::ncclScalarHostImmediate as u64;

/// ncclRedOpCreatePreMulSum(op, scalar, datatype, residence, comm) (`raw_args`): the
/// residence says whether the scalar is a device address or a host value that travels
/// with the call (the library reads it at once).
pub unsafe fn pre_mul_sum(ctx: &Ctx, args: &[u64]) -> u64 {
    let invalid = ctx.codes.invalid_value as u64;
    let form = match args.get(3).copied() {
        Some(SCALAR_DEVICE) => Form::Device,
        Some(SCALAR_HOST_IMMEDIATE) => Form::Call,
        _ => return invalid,
    };
    crate::guard::ffi(ctx.name, invalid, || {
        // SAFETY: the caller's arguments, as the form the residence names describes them.
        unsafe { crate::runtime::call(ctx.form(form), args) }
    })
}
