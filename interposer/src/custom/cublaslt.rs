//! Hand-written cuBLASLt functions. Matmul descriptors, matrix layouts and preferences are
//! named by the client (specs/cublaslt.toml: `client_named`), so creating, configuring and
//! destroying them is sent without waiting. The client also records what each descriptor
//! says, which lets it
//! * keep each matmul (and matrix transform) descriptor's pointer mode
//!   (`CUBLASLT_MATMUL_DESC_POINTER_MODE`), which decides whether `cublasLtMatmul`'s (and
//!   `cublasLtMatrixTransform`'s) alpha and beta travel as values or pass as device
//!   addresses (`crate::scalars`), and its scale type, which gives their width (a float
//!   alpha is read as 4 bytes, not as the widest 16);
//! * answer `cublasLtMatmulAlgoGetHeuristic` for a problem it has asked about before: the
//!   heuristic is a pure function of the descriptors (torch asks before every matmul). An
//!   answer from an earlier session on the same server identity is given too, and checked
//!   against the server's answer to the same call when it comes (`crate::ahead::learned`).
#![allow(non_snake_case, clippy::missing_safety_doc)]

use std::collections::{BTreeMap, HashMap};
use std::ffi::c_void;
use std::sync::Arc;

use chidori_protocol::desc::{CallDesc, Ctx, Form, Wire};

use crate::ahead::learned::{Learned, Space};
use crate::conn::Conn;
use crate::state::CLIENT;

const SUCCESS: u32 = chidori_cuda::consts::cublasStatus_t::CUBLAS_STATUS_SUCCESS;
const INVALID_VALUE: u32 = chidori_cuda::consts::cublasStatus_t::CUBLAS_STATUS_INVALID_VALUE;
const DESC_POINTER_MODE: u32 = chidori_cuda::consts::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_POINTER_MODE;
const DESC_SCALE_TYPE: u32 = chidori_cuda::consts::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_SCALE_TYPE;
const TRANSFORM_POINTER_MODE: u32 =
    chidori_cuda::consts::cublasLtMatrixTransformDescAttributes_t::CUBLASLT_MATRIX_TRANSFORM_DESC_POINTER_MODE;
const TRANSFORM_SCALE_TYPE: u32 =
    chidori_cuda::consts::cublasLtMatrixTransformDescAttributes_t::CUBLASLT_MATRIX_TRANSFORM_DESC_SCALE_TYPE;
/// Matmul descriptor attributes that hold device addresses (bias, epilogue auxiliary,
/// scale and amax pointers). A heuristic depends on their alignment, not their value.
const DESC_POINTERS: &[u32] = {
    use chidori_cuda::consts::cublasLtMatmulDescAttributes_t as a;
    &[
        a::CUBLASLT_MATMUL_DESC_BIAS_POINTER,
        a::CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
        a::CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
        a::CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
        a::CUBLASLT_MATMUL_DESC_C_SCALE_POINTER,
        a::CUBLASLT_MATMUL_DESC_D_SCALE_POINTER,
        a::CUBLASLT_MATMUL_DESC_AMAX_D_POINTER,
        a::CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_SCALE_POINTER,
        a::CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_AMAX_POINTER,
        a::CUBLASLT_MATMUL_DESC_D_OUT_SCALE_POINTER,
    ]
};
/// Bytes of a cublasLtMatmulHeuristicResult_t before its reserved words: the algorithm (64),
/// the workspace size (8), the state (4) and the waves count (4).
const RESULT_MEANINGFUL: usize = 80;
/// Heuristic answers kept (distinct problems; torch has a few dozen per model).
pub(crate) const HEURISTIC_CACHE_LIMIT: usize = 4096;

#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum DescKind {
    Matmul,
    Layout,
    Preference,
    /// A matrix transform's descriptor: like a matmul's, it says how alpha and beta travel.
    Transform,
}

impl DescKind {
    /// Whether the descriptor decides how scalars travel (a pointer mode and a scale type),
    /// and the attributes that say them: (pointer mode, scale type).
    fn scalar_attributes(self) -> Option<(u32, u32)> {
        match self {
            DescKind::Matmul => Some((DESC_POINTER_MODE, DESC_SCALE_TYPE)),
            DescKind::Transform => Some((TRANSFORM_POINTER_MODE, TRANSFORM_SCALE_TYPE)),
            DescKind::Layout | DescKind::Preference => None,
        }
    }
}

/// What a descriptor says: how it was created and its attributes (last value wins).
pub struct Record {
    kind: DescKind,
    create: Vec<u64>,
    attrs: BTreeMap<u32, Vec<u8>>,
}

/// Heuristic answers by problem: (status, algorithms returned, result bytes).
pub(crate) type Answer = (u32, i32, Vec<u8>);

fn records() -> std::sync::MutexGuard<'static, Option<HashMap<u64, Record>>> {
    CLIENT.cublaslt_records.lock()
}

/// Create a descriptor of `kind`: `args[0]` is the caller's handle pointer, which the
/// generic call fills with the client's name for it.
fn create(name: &'static str, desc: &'static CallDesc, kind: DescKind, args: &[u64]) -> u32 {
    crate::guard::ffi(name, INVALID_VALUE, || {
        let Some(&out) = args.first().filter(|p| **p != 0) else { return INVALID_VALUE };
        // SAFETY: the caller's descriptor pointer (checked non-null) and values.
        let s = unsafe { crate::runtime::call(desc, args) } as u32;
        if s == SUCCESS {
            // SAFETY: written with the descriptor's name before the call was sent.
            let handle = unsafe { std::ptr::read_unaligned(out as *const u64) };
            let record = Record { kind, create: args[1..].to_vec(), attrs: BTreeMap::new() };
            records().get_or_insert_with(HashMap::new).insert(handle, record);
            // cublasLtMatmulDescCreate(desc, computeType, scaleType),
            // cublasLtMatrixTransformDescCreate(desc, scaleType): host pointer mode.
            let scale_type = match kind {
                DescKind::Matmul => args.get(2),
                DescKind::Transform => args.get(1),
                DescKind::Layout | DescKind::Preference => None,
            };
            if kind.scalar_attributes().is_some() {
                crate::scalars::set_device_mode(handle, false);
                crate::scalars::set_size(handle, scale_type.and_then(|&t| crate::scalars::data_type_bytes(t)));
            }
        }
        s
    })
}

fn set_attribute(name: &'static str, desc: &'static CallDesc, handle: u64, attr: u32, buf: u64, size: usize) -> u32 {
    crate::guard::ffi(name, INVALID_VALUE, || {
        if buf == 0 && size != 0 {
            return INVALID_VALUE;
        }
        // SAFETY: the caller's attribute value of `size` bytes.
        let s = unsafe { crate::runtime::call(desc, &[handle, u64::from(attr), buf, size as u64]) } as u32;
        if s != SUCCESS {
            return s;
        }
        // SAFETY: as above.
        let value =
            if size == 0 { Vec::new() } else { unsafe { std::slice::from_raw_parts(buf as *const u8, size) }.to_vec() };
        let mut guard = records();
        if let Some(r) = guard.as_mut().and_then(|m| m.get_mut(&handle)) {
            let word = value.first_chunk::<4>().map(|w| u32::from_le_bytes(*w));
            if let (Some((pointer_mode, scale_type)), Some(word)) = (r.kind.scalar_attributes(), word) {
                if attr == pointer_mode {
                    // cublasLtPointerMode_t is a 32-bit enum; every mode but HOST (0) puts
                    // alpha on the device.
                    crate::scalars::set_device_mode(handle, word != 0);
                }
                if attr == scale_type {
                    crate::scalars::set_size(handle, crate::scalars::data_type_bytes(u64::from(word)));
                }
            }
            r.attrs.insert(attr, value);
        }
        s
    })
}

fn destroy(name: &'static str, desc: &'static CallDesc, handle: u64) -> u32 {
    crate::guard::ffi(name, INVALID_VALUE, || {
        if let Some(m) = records().as_mut()
            && m.remove(&handle).is_some_and(|r| r.kind.scalar_attributes().is_some())
        {
            crate::scalars::forget(handle);
        }
        // SAFETY: a value.
        unsafe { crate::runtime::call(desc, &[handle]) as u32 }
    })
}

/// The bytes that identify a heuristic problem, or None where a descriptor is unknown.
fn problem_key(descs: &[u64], requested: i32) -> Option<Vec<u8>> {
    let guard = records();
    let map = guard.as_ref()?;
    let mut key = requested.to_le_bytes().to_vec();
    for handle in descs {
        let r = map.get(handle)?;
        key.push(r.kind as u8);
        for v in &r.create {
            key.extend_from_slice(&v.to_le_bytes());
        }
        for (attr, value) in &r.attrs {
            key.extend_from_slice(&attr.to_le_bytes());
            if r.kind == DescKind::Matmul && DESC_POINTERS.contains(attr) && value.len() == 8 {
                let addr = u64::from_le_bytes(value[..8].try_into().ok()?);
                let class = if addr == 0 { u64::MAX } else { addr % 256 };
                key.extend_from_slice(&class.to_le_bytes());
            } else {
                key.extend_from_slice(&(value.len() as u32).to_le_bytes());
                key.extend_from_slice(value);
            }
        }
        key.push(0xff);
    }
    Some(key)
}

/// Bytes of one heuristic result in this variant's layout.
fn result_size(desc: &CallDesc) -> Option<usize> {
    match desc.params.get(8)? {
        Wire::Buf { elem, .. } => Some(*elem as usize),
        _ => None,
    }
}

#[allow(clippy::too_many_arguments)]
fn heuristic(
    desc: &'static CallDesc,
    handle: u64,
    operation: u64,
    layouts: [u64; 4],
    preference: u64,
    requested: i32,
    results: *mut c_void,
    returned: *mut c_void,
) -> u32 {
    crate::guard::ffi("cublasLtMatmulAlgoGetHeuristic", INVALID_VALUE, || {
        if results.is_null() || returned.is_null() || requested <= 0 {
            // Let the library say what is wrong.
            let args = [handle, operation, layouts[0], layouts[1], layouts[2], layouts[3], preference];
            let mut all = args.to_vec();
            all.extend_from_slice(&[requested as u64, results as u64, returned as u64]);
            // SAFETY: the caller's arguments, unchanged.
            return unsafe { crate::runtime::call(desc, &all) } as u32;
        }
        let Some(elem) = result_size(desc) else { return INVALID_VALUE };
        let descs = [operation, layouts[0], layouts[1], layouts[2], layouts[3], preference];
        let key = problem_key(&descs, requested);
        let give = |(status, n, bytes): &Answer| {
            crate::trace::local("cublasLtMatmulAlgoGetHeuristic");
            // SAFETY: the caller's arrays: `requested` results and one int.
            unsafe {
                std::ptr::copy_nonoverlapping(bytes.as_ptr(), results as *mut u8, bytes.len());
                std::ptr::write_unaligned(returned as *mut i32, *n);
            }
            *status
        };
        if let Some(answer) = key.as_ref().and_then(|k| CLIENT.ahead.heuristics.get(k)) {
            return give(&answer);
        }
        let len = elem * (requested as usize);
        // Answered in an earlier session on this server: given now, checked when the
        // server's answer to the same call comes.
        if let Some(key) = &key
            && let Ok(conn) = crate::conn::get()
            && let Some(answer) = learned(&conn, |l| l.get(Space::LtHeuristic, key).and_then(decode_answer)).flatten()
            && answer.2.len() == len
        {
            let mut check = vec![0u8; len + 4].into_boxed_slice();
            let at = check.as_mut_ptr() as u64;
            let args = [handle, operation, layouts[0], layouts[1], layouts[2], layouts[3], preference];
            let mut all = args.to_vec();
            all.extend_from_slice(&[requested as u64, at, at + len as u64]);
            // SAFETY: `check` holds `requested` results and one int, and lives until the
            // reply has landed (the checking thread owns it).
            if let Some(slot) = unsafe { crate::runtime::send_checked(&conn, desc, &all) } {
                CLIENT.ahead.heuristics.learn(key.clone(), answer.clone());
                verify(conn, slot, check, answer.clone(), elem);
                return give(&answer);
            }
        }
        let args = [
            handle,
            operation,
            layouts[0],
            layouts[1],
            layouts[2],
            layouts[3],
            preference,
            requested as u64,
            results as u64,
            returned as u64,
        ];
        // SAFETY: the caller's arrays of `requested` results and one int.
        let s = unsafe { crate::runtime::call(desc, &args) } as u32;
        if s == SUCCESS
            && let Some(key) = key
        {
            // SAFETY: both written by the reply.
            let n = unsafe { std::ptr::read_unaligned(returned as *const i32) };
            let bytes = unsafe { std::slice::from_raw_parts(results as *const u8, len) }.to_vec();
            let answer = (s, n, bytes);
            if let Ok(conn) = crate::conn::get() {
                learned(&conn, |l| l.learn(Space::LtHeuristic, &key, &encode_answer(&answer)));
            }
            CLIENT.ahead.heuristics.learn(key, answer);
        }
        s
    })
}

// ---- Answers from earlier sessions (`crate::learned`) ----

fn learned<T>(conn: &Conn, f: impl FnOnce(&mut Learned) -> T) -> Option<T> {
    crate::learned::with(conn, f)
}

fn encode_answer((status, n, bytes): &Answer) -> Vec<u8> {
    let mut v = status.to_le_bytes().to_vec();
    v.extend_from_slice(&n.to_le_bytes());
    v.extend_from_slice(bytes);
    v
}

fn decode_answer(v: &[u8]) -> Option<Answer> {
    let status = u32::from_le_bytes(v.get(..4)?.try_into().ok()?);
    let n = i32::from_le_bytes(v.get(4..8)?.try_into().ok()?);
    Some((status, n, v[8..].to_vec()))
}

/// Compare the server's answer (written into `check`: the results, then the count) with the
/// one given: the status, the count, and of each result the algorithm, its workspace, state
/// and waves (not the reserved words after them, which the library need not write).
fn verify(conn: Arc<Conn>, slot: Arc<crate::conn::Slot>, check: Box<[u8]>, given: Answer, elem: usize) {
    crate::learned::check(conn, "cublasLtMatmulAlgoGetHeuristic", slot, check, move |outcome, check| {
        let len = given.2.len();
        let n = i32::from_le_bytes(check.get(len..len + 4)?.try_into().ok()?);
        let meaningful = elem.min(RESULT_MEANINGFUL);
        let results_same = (0..usize::try_from(n).unwrap_or(0)).all(|i| {
            let r = i * elem..(i * elem + meaningful).min(len);
            check.get(r.clone()) == given.2.get(r)
        });
        match outcome {
            Ok(s) if *s as u32 != given.0 => Some(format!("status {s}, not {}", given.0)),
            _ if n != given.1 => Some(format!("{n} algorithms, not {}", given.1)),
            _ if !results_same => Some("other algorithms".to_owned()),
            _ => None,
        }
    });
}

// ---- The exports: one implementation each, for every header version's variant. ----

pub unsafe fn matmul_desc_create(ctx: &Ctx, matmulDesc: *mut c_void, computeType: u32, scaleType: u32) -> u32 {
    let args = [matmulDesc as u64, u64::from(computeType), u64::from(scaleType)];
    create(ctx.name, ctx.form(Form::Call), DescKind::Matmul, &args)
}

pub unsafe fn matrix_layout_create(
    ctx: &Ctx,
    matLayout: *mut c_void,
    r#type: u32,
    rows: u64,
    cols: u64,
    ld: i64,
) -> u32 {
    let args = [matLayout as u64, u64::from(r#type), rows, cols, ld as u64];
    create(ctx.name, ctx.form(Form::Call), DescKind::Layout, &args)
}

pub unsafe fn transform_desc_create(ctx: &Ctx, transformDesc: *mut c_void, scaleType: u32) -> u32 {
    let args = [transformDesc as u64, u64::from(scaleType)];
    create(ctx.name, ctx.form(Form::Call), DescKind::Transform, &args)
}

pub unsafe fn preference_create(ctx: &Ctx, pref: *mut c_void) -> u32 {
    create(ctx.name, ctx.form(Form::Call), DescKind::Preference, &[pref as u64])
}

/// cublasLtMatmulDescSetAttribute, cublasLtMatrixLayoutSetAttribute,
/// cublasLtMatmulPreferenceSetAttribute, cublasLtMatrixTransformDescSetAttribute.
pub unsafe fn descriptor_set_attribute(
    ctx: &Ctx,
    descriptor: *mut c_void,
    attr: u32,
    buf: *mut c_void,
    sizeInBytes: usize,
) -> u32 {
    set_attribute(ctx.name, ctx.form(Form::Call), descriptor as u64, attr, buf as u64, sizeInBytes)
}

/// cublasLtMatmulDescDestroy, cublasLtMatrixLayoutDestroy, cublasLtMatmulPreferenceDestroy,
/// cublasLtMatrixTransformDescDestroy.
pub unsafe fn descriptor_destroy(ctx: &Ctx, descriptor: *mut c_void) -> u32 {
    destroy(ctx.name, ctx.form(Form::Call), descriptor as u64)
}

#[allow(clippy::too_many_arguments)]
pub unsafe fn matmul_algo_get_heuristic(
    ctx: &Ctx,
    lightHandle: *mut c_void,
    operationDesc: *mut c_void,
    Adesc: *mut c_void,
    Bdesc: *mut c_void,
    Cdesc: *mut c_void,
    Ddesc: *mut c_void,
    preference: *mut c_void,
    requestedAlgoCount: i32,
    heuristicResultsArray: *mut c_void,
    returnAlgoCount: *mut c_void,
) -> u32 {
    heuristic(
        ctx.form(Form::Call),
        lightHandle as u64,
        operationDesc as u64,
        [Adesc as u64, Bdesc as u64, Cdesc as u64, Ddesc as u64],
        preference as u64,
        requestedAlgoCount,
        heuristicResultsArray,
        returnAlgoCount,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_problem_has_the_same_key_and_pointers_count_by_alignment() {
        let mut m = HashMap::new();
        let rec = |kind, attrs: &[(u32, Vec<u8>)]| Record {
            kind,
            create: vec![0, 64, 64, 64],
            attrs: attrs.iter().cloned().collect(),
        };
        m.insert(0x41d0_0000_0000_1001, rec(DescKind::Matmul, &[(8, 0x7f00_0000_1000u64.to_le_bytes().to_vec())]));
        m.insert(0x41d0_0000_0000_1002, rec(DescKind::Matmul, &[(8, 0x7f00_0000_2000u64.to_le_bytes().to_vec())]));
        m.insert(0x41d0_0000_0000_1003, rec(DescKind::Matmul, &[(8, 0x7f00_0000_2004u64.to_le_bytes().to_vec())]));
        m.insert(0x41d0_0000_0000_1004, rec(DescKind::Layout, &[]));
        *records() = Some(m);
        let key = |op: u64| problem_key(&[op, 0x41d0_0000_0000_1004], 1).unwrap();
        assert_eq!(key(0x41d0_0000_0000_1001), key(0x41d0_0000_0000_1002), "a bias elsewhere, equally aligned");
        assert_ne!(key(0x41d0_0000_0000_1001), key(0x41d0_0000_0000_1003), "a bias aligned differently");
        assert!(problem_key(&[0x41d0_0000_0000_9999], 1).is_none(), "an unknown descriptor");
        *records() = None;
    }
}
