//! Hand-written cuSPARSELt functions: what the client records to send `cusparseLtMatmul`'s
//! alpha and beta right. They are host floats, or device vectors of per-channel scales
//! where the matmul descriptor enables vector scaling (`CUSPARSELT_MATMUL_ALPHA_VECTOR_
//! SCALING`, `..._BETA_...`, set by `cusparseLtMatmulDescSetAttribute`). A plan takes its
//! descriptor's choice at `cusparseLtMatmulPlanInit`, and the plan's scalar mode
//! (`crate::scalars`) says how the matmul's alpha and beta travel.
//!
//! Records (handle, descriptors, plans) hold their handle's id in their first 8 bytes
//! (specs/cusparselt.toml: `record`; the client's own name for the descriptors and plans,
//! the worker's for the handle), which is what these functions read.
#![allow(clippy::missing_safety_doc)]

use chidori_protocol::desc::{Ctx, Form};

use crate::runtime::sparselt_sizes;
use crate::state::CLIENT;

const SUCCESS: u64 = chidori_cuda::consts::cusparseStatus_t::CUSPARSE_STATUS_SUCCESS as u64;
const ALPHA_VECTOR: u64 =
    chidori_cuda::consts::cusparseLtMatmulDescAttribute_t::CUSPARSELT_MATMUL_ALPHA_VECTOR_SCALING as u64;
const BETA_VECTOR: u64 =
    chidori_cuda::consts::cusparseLtMatmulDescAttribute_t::CUSPARSELT_MATMUL_BETA_VECTOR_SCALING as u64;
/// Matmul descriptors with vector scaling remembered (no call destroys one; the oldest are
/// forgotten beyond this, as the worker retires them).
const VECTOR_DESCRIPTORS_KEPT: usize = 4096;

/// The id the program's record at `addr` holds (0 for NULL).
fn id(addr: u64) -> u64 {
    if addr == 0 {
        return 0;
    }
    // SAFETY: a non-null pointer to the caller's cuSPARSELt record (1 KiB), whose first 8
    // bytes the client wrote when the record was initialized.
    unsafe { std::ptr::read_unaligned(addr as *const u64) }
}

/// cusparseLt{Mat,Matmul,MatmulAlg}SetAttribute(handle, record, attribute, data, dataSize):
/// whether the library takes the value is its answer (vector scaling is not available for
/// every type), so a set waits, unless the library took the same set on a record that said
/// the same (then it goes without waiting: [`crate::runtime::sparselt_sizes::set_question`]).
/// A matmul descriptor's vector-scaling switches are recorded once taken.
pub unsafe fn set_attribute(ctx: &Ctx, args: &[u64]) -> u64 {
    crate::guard::ffi(ctx.name, ctx.codes.invalid_value as u64, || {
        let &[_, record, attribute, data, size, ..] = args else { return ctx.codes.invalid_value as u64 };
        // A value too large to key (or none) always waits.
        let keyable = data != 0 && size as usize <= sparselt_sizes::SET_BYTES_MAX;
        let value: &[u8] = if keyable {
            // SAFETY: the caller's attribute value of `size` bytes (the API contract; the
            // call reads them too).
            unsafe { std::slice::from_raw_parts(data as *const u8, size as usize) }
        } else {
            &[]
        };
        let question = keyable.then(|| sparselt_sizes::set_question(ctx.name, id(record), attribute, value)).flatten();
        let status = match question {
            // SAFETY: the caller's arguments, as the descriptor's form describes them.
            Some((_, true)) => unsafe { crate::runtime::call(ctx.form(Form::Async), args) },
            _ => {
                // SAFETY: as above.
                let status = unsafe { crate::runtime::call(ctx.form(Form::Call), args) };
                if let (Some((key, _)), SUCCESS) = (question, status) {
                    sparselt_sizes::set_took(key);
                }
                status
            }
        };
        if status == SUCCESS && ctx.name.ends_with("MatmulDescSetAttribute") && value.len() >= 4 {
            record_vector_scaling(id(record), attribute, value);
        }
        status
    })
}

/// A matmul descriptor's alpha or beta vector-scaling switch (an int32 flag), as taken.
fn record_vector_scaling(descriptor: u64, attribute: u64, value: &[u8]) {
    if attribute != ALPHA_VECTOR && attribute != BETA_VECTOR {
        return;
    }
    let on = value.iter().take(4).any(|b| *b != 0);
    let mut guard = CLIENT.cusparselt_vectors.lock();
    let map = guard.get_or_insert_with(Default::default);
    let flags = map.entry(descriptor).or_default();
    if attribute == ALPHA_VECTOR {
        flags.0 = on;
    } else {
        flags.1 = on;
    }
    if *flags == (false, false) {
        map.remove(&descriptor);
    }
    // Ids grow: the smallest are the oldest descriptors.
    while map.len() > VECTOR_DESCRIPTORS_KEPT {
        let Some(&oldest) = map.keys().min() else { break };
        map.remove(&oldest);
    }
}

/// cusparseLtMatmulPlanInit(handle, plan, matmulDescr, algSelection): the plan's alpha
/// and beta travel as its descriptor's vector scaling says.
pub unsafe fn plan_init(ctx: &Ctx, args: &[u64]) -> u64 {
    crate::guard::ffi(ctx.name, ctx.codes.invalid_value as u64, || {
        // SAFETY: the caller's arguments, as the descriptor's form describes them.
        let status = unsafe { crate::runtime::call(ctx.form(Form::Call), args) };
        if status != SUCCESS {
            return status;
        }
        let (plan, descriptor) = match args {
            [_, p, d, ..] => (id(*p), id(*d)),
            _ => return status,
        };
        set_plan_modes(plan, CLIENT.cusparselt_vectors.get(&descriptor).unwrap_or_default());
        status
    })
}

/// cusparseLtMatmulPlanDestroy(plan): sent, and the plan's modes forgotten.
pub unsafe fn plan_destroy(ctx: &Ctx, args: &[u64]) -> u64 {
    crate::guard::ffi(ctx.name, ctx.codes.invalid_value as u64, || {
        let plan = id(args.first().copied().unwrap_or(0));
        // SAFETY: the caller's arguments, as the descriptor's form describes them.
        let status = unsafe { crate::runtime::call(ctx.form(Form::Call), args) };
        if status == SUCCESS {
            crate::scalars::forget(plan);
        }
        status
    })
}

/// Record how a plan's alpha and beta travel: (alpha, beta) device vectors or host floats.
fn set_plan_modes(plan: u64, (alpha, beta): (bool, bool)) {
    CLIENT.scalar_modes.update(plan, |m| {
        m.device = alpha;
        m.later_device = (alpha != beta).then_some(beta);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plan_with_an_alpha_vector_sends_beta_as_a_host_float() {
        set_plan_modes(0x5150, (true, false));
        let m = crate::scalars::mode(0x5150);
        assert!(m.device);
        assert_eq!(m.later_device, Some(false));
        set_plan_modes(0x5150, (true, true));
        assert_eq!(crate::scalars::mode(0x5150).later_device, None);
        assert!(crate::scalars::device_mode(0x5150));
        set_plan_modes(0x5150, (false, false));
        assert_eq!(crate::scalars::mode(0x5150), Default::default(), "host floats are the default");
    }

    #[test]
    fn a_null_record_has_no_id() {
        assert_eq!(id(0), 0);
        let record = [7u64, 0, 0];
        assert_eq!(id(record.as_ptr() as u64), 7);
    }
}
