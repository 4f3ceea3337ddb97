//! Hand-written cuDNN functions. A variant pack's data pointers (the tensors of one graph
//! execution) are device addresses, except for pass-by-value tensors: there the pointer is
//! the address of a host scalar the library reads (torch's SDPA passes `&scale`). Such a
//! pointer means nothing on the server, so the client sends the scalar's bytes in its place
//! (the `hostvalues` wire form), and the worker keeps them beside the pack: no round trip,
//! and nothing kept past the pack's life.
//!
//! Backend descriptors are named by the client: torch's cuDNN frontend creates some ten
//! per graph it builds (tensors, operations, the graph, heuristics, engine configurations,
//! the plan) and a variant pack per execution, so a create costs no round trip. Names
//! travel as handle arguments and inside attribute arrays of descriptors
//! (`handles(cudnnBackendDescriptor_t)[…]` in the spec); the worker maps both. A finalize
//! whose status steers the caller (an engine, a configuration, the graph, a plan: the
//! frontend tries the next candidate when one fails) waits; the rest (tensors, operations,
//! variant packs) are sent without waiting, and a failure surfaces at the next waiting cuDNN
//! call: the graph's finalize at the latest, which fails natively too when a part of it did.
#![allow(non_snake_case, clippy::missing_safety_doc)]

use std::ffi::c_void;
use std::sync::{Arc, OnceLock};

use chidori_cuda::calls::cudnn as calls;
use chidori_protocol::desc::{CallDesc, Ctx, Form};
use chidori_protocol::messages::{HOST_VALUE_FLAG, HOST_VALUE_MAX, HOST_VALUE_RECORD};

use crate::ahead::cudnn::{Answer, FillQuery, PLAN_MAX, Plan, Query, Replay, Twin, UNWRITTEN, filled_by, slot};
use crate::ahead::learned::Space;
use crate::ahead::rnn::{DIM_MAX, Question, TensorNd, Weights};
use crate::state::CLIENT;

/// CUDNN_STATUS_BAD_PARAM and _NOT_SUPPORTED of cuDNN 8 and of cuDNN 9, which renumbered
/// its statuses: cuDNN 8's are those of CUDA 11.8's headers (`consts::v11_8`, the version of
/// [`V8`]'s forms), cuDNN 9's those of the newest headers (the top level of `consts`; 12.6,
/// the version of [`V9`]'s forms, has the same). [`forms`] tells the versions apart by them.
const BAD_PARAM_V8: u32 = chidori_cuda::consts::v11_8::cudnnStatus_t::CUDNN_STATUS_BAD_PARAM;
const BAD_PARAM_V9: u32 = chidori_cuda::consts::cudnnStatus_t::CUDNN_STATUS_BAD_PARAM;
const NOT_SUPPORTED_V8: u32 = chidori_cuda::consts::v11_8::cudnnStatus_t::CUDNN_STATUS_NOT_SUPPORTED;
const NOT_SUPPORTED_V9: u32 = chidori_cuda::consts::cudnnStatus_t::CUDNN_STATUS_NOT_SUPPORTED;
const _: () = assert!(BAD_PARAM_V8 != BAD_PARAM_V9 && NOT_SUPPORTED_V8 != NOT_SUPPORTED_V9);
const TYPE_HANDLE: u32 = chidori_cuda::consts::cudnnBackendAttributeType_t::CUDNN_TYPE_HANDLE;
const VARIANT_PACK_DATA_POINTERS: u32 =
    chidori_cuda::consts::cudnnBackendAttributeName_t::CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS;
const TYPE_VOID_PTR: u32 = chidori_cuda::consts::cudnnBackendAttributeType_t::CUDNN_TYPE_VOID_PTR;

/// Read up to [`HOST_VALUE_MAX`] bytes at `addr` without faulting: never past the end of
/// its page (a naturally aligned scalar never crosses one), and only if the page is
/// readable in this process. None for unreadable memory (a device address the client
/// reserved). The bytes past the scalar are whatever follows it; the library reads only
/// what the tensor's type needs.
fn read_host_scalar(addr: u64) -> Option<Vec<u8>> {
    let to_page_end = 4096 - (addr % 4096) as usize;
    let n = HOST_VALUE_MAX.min(to_page_end);
    let mut buf = vec![0u8; n];
    let local = libc::iovec { iov_base: buf.as_mut_ptr() as *mut c_void, iov_len: n };
    let remote = libc::iovec { iov_base: addr as *mut c_void, iov_len: n };
    // SAFETY: process_vm_readv on our own pid copies into `buf` (n bytes, owned) and
    // reports EFAULT instead of faulting when `addr` is not readable.
    let got = unsafe { libc::process_vm_readv(libc::getpid(), &local, 1, &remote, 1, 0) };
    (got == n as isize).then_some(buf)
}

/// The `hostvalues` records of a variant pack's data pointers, or None when every pointer
/// is NULL or a device address (the plain form carries them).
fn host_value_records(pointers: &[u64]) -> Option<Vec<u8>> {
    let mut records = vec![0u8; pointers.len() * HOST_VALUE_RECORD];
    let mut any = false;
    for (&p, r) in pointers.iter().zip(records.chunks_exact_mut(HOST_VALUE_RECORD)) {
        r[..8].copy_from_slice(&p.to_le_bytes());
        if p == 0 || crate::state::is_device(p) {
            continue;
        }
        let Some(bytes) = read_host_scalar(p) else { continue };
        r[8..16].copy_from_slice(&HOST_VALUE_FLAG.to_le_bytes());
        r[16..16 + bytes.len()].copy_from_slice(&bytes);
        any = true;
    }
    any.then_some(records)
}

/// The calls of one cuDNN major version that the hand-written functions make.
pub struct Forms {
    set: &'static CallDesc,
    set_descriptors: &'static CallDesc,
    set_hostvalues: &'static CallDesc,
    set_handles: &'static CallDesc,
    get: &'static CallDesc,
    fill: &'static CallDesc,
    refill: &'static CallDesc,
    create: &'static CallDesc,
    create_named: &'static CallDesc,
    finalize: &'static CallDesc,
    finalize_async: &'static CallDesc,
    destroy: &'static CallDesc,
    get_tensor_nd: &'static CallDesc,
    rnn_weight_params: &'static CallDesc,
    /// The descriptor types the client names: those of the version's headers (a server
    /// library without one fails the create; the failure comes back at the next waiting call).
    named: std::ops::RangeInclusive<u32>,
    bad_param: u32,
    not_supported: u32,
}

/// cuDNN 8 (descriptor types up to CUDNN_BACKEND_OPERATION_RNG_DESCRIPTOR).
static V8: Forms = Forms {
    set: &calls::cudnnBackendSetAttribute__cu118__call,
    set_descriptors: &calls::cudnnBackendSetAttribute__cu118__descriptors,
    set_hostvalues: &calls::cudnnBackendSetAttribute__cu118__hostvalues,
    set_handles: &calls::cudnnBackendSetAttribute__cu118__handles,
    get: &calls::cudnnBackendGetAttribute__cu118__call,
    fill: &calls::cudnnBackendGetAttribute__cu118__descriptors,
    refill: &calls::cudnnBackendGetAttribute__cu118__refill,
    create: &calls::cudnnBackendCreateDescriptor__cu118__call,
    create_named: &calls::cudnnBackendCreateDescriptor__cu118__named,
    finalize: &calls::cudnnBackendFinalize__cu118__call,
    finalize_async: &calls::cudnnBackendFinalize__cu118__async,
    destroy: &calls::cudnnBackendDestroyDescriptor__cu118__call,
    get_tensor_nd: &calls::cudnnGetTensorNdDescriptor__cu118__call,
    rnn_weight_params: &calls::cudnnGetRNNWeightParams__cu118__call,
    named: 0..=33,
    bad_param: BAD_PARAM_V8,
    not_supported: NOT_SUPPORTED_V8,
};

/// cuDNN 9 (descriptor types up to CUDNN_BACKEND_OPERATION_SDPA_FWD_DESCRIPTOR, which
/// torch's attention uses).
static V9: Forms = Forms {
    set: &calls::cudnnBackendSetAttribute__cu126__call,
    set_descriptors: &calls::cudnnBackendSetAttribute__cu126__descriptors,
    set_hostvalues: &calls::cudnnBackendSetAttribute__cu126__hostvalues,
    set_handles: &calls::cudnnBackendSetAttribute__cu126__handles,
    get: &calls::cudnnBackendGetAttribute__cu126__call,
    fill: &calls::cudnnBackendGetAttribute__cu126__descriptors,
    refill: &calls::cudnnBackendGetAttribute__cu126__refill,
    create: &calls::cudnnBackendCreateDescriptor__cu126__call,
    create_named: &calls::cudnnBackendCreateDescriptor__cu126__named,
    finalize: &calls::cudnnBackendFinalize__cu126__call,
    finalize_async: &calls::cudnnBackendFinalize__cu126__async,
    destroy: &calls::cudnnBackendDestroyDescriptor__cu126__call,
    get_tensor_nd: &calls::cudnnGetTensorNdDescriptor__cu126__call,
    rnn_weight_params: &calls::cudnnGetRNNWeightParams__cu126__call,
    named: 0..=41,
    bad_param: BAD_PARAM_V9,
    not_supported: NOT_SUPPORTED_V9,
};

/// The forms of the caller's cuDNN major version, told apart by its status codes (cuDNN 9
/// renumbered them).
fn forms(ctx: &Ctx) -> &'static Forms {
    if ctx.codes.invalid_value == i64::from(BAD_PARAM_V8) { &V8 } else { &V9 }
}

/// What a Set's elements say of the descriptor's content ([`crate::ahead::cudnn::Contents`]):
/// descriptors as what they hold, handles as "a handle", values as their bytes; None where
/// the client cannot say (pointers, a descriptor whose content is unknown, an array it
/// cannot size).
fn content_of_set(f: &Forms, d: u64, (name, ty, count): (u32, u32, i64), elements: *mut c_void) -> Option<Vec<u8>> {
    if elements.is_null() || count <= 0 {
        return Some(Vec::new());
    }
    let len = usize::try_from(count).ok()?;
    match ty {
        TYPE_BACKEND_DESCRIPTOR => {
            // SAFETY: `count` descriptors at `elements` (the API contract).
            let values = unsafe { std::slice::from_raw_parts(elements as *const u64, len) };
            replay(|r| values.iter().map(|&v| r.contents.element(v)).collect::<Option<Vec<_>>>()).map(|e| e.concat())
        }
        TYPE_HANDLE => Some(b"handle".to_vec()),
        TYPE_VOID_PTR => None,
        _ => {
            let head = [d, u64::from(name), u64::from(ty), count as u64];
            let bytes = elements_len(f.set, &head, 4)?;
            // SAFETY: the caller's array of `count` elements of the attribute type, which is
            // what the Set's wire form reads.
            Some(unsafe { std::slice::from_raw_parts(elements as *const u8, bytes) }.to_vec())
        }
    }
}

fn set_attribute(
    f: &'static Forms,
    descriptor: *mut c_void,
    name: u32,
    ty: u32,
    count: i64,
    elements: *mut c_void,
) -> u32 {
    crate::guard::ffi("cudnnBackendSetAttribute", f.bad_param, || {
        tracing::trace!(
            "set: descriptor {:#x} type {:?}, attribute {name}, type {ty}, {count} elements",
            descriptor as u64,
            type_of(descriptor as u64)
        );
        forget_answers(f, descriptor as u64);
        // What the descriptor holds is followed only for finalizes answered as before (a
        // copy of the elements per Set otherwise wasted).
        let held =
            if finalizes_learned() { content_of_set(f, descriptor as u64, (name, ty, count), elements) } else { None };
        if held.is_none() && finalizes_learned() {
            tracing::debug!(
                "set: attribute {name} of type {ty} leaves what descriptor {:#x} (type {:?}) holds unknown",
                descriptor as u64,
                type_of(descriptor as u64)
            );
        }
        replay(|r| {
            r.fresh.remove(&(descriptor as u64));
            r.contents.set(descriptor as u64, (name, ty, count), held.as_deref());
        });
        let forward = |elements: u64| {
            let args = [descriptor as u64, u64::from(name), u64::from(ty), count as u64, elements];
            // SAFETY: `elements` holds `count` elements of the attribute type (the caller's
            // array or our copy of it).
            unsafe { crate::runtime::call(f.set, &args) as u32 }
        };
        if elements.is_null() || count <= 0 {
            return forward(elements as u64);
        }
        if ty == TYPE_BACKEND_DESCRIPTOR || ty == TYPE_HANDLE {
            let Ok(len) = usize::try_from(count) else { return f.bad_param };
            // SAFETY: `count` descriptors or cudnnHandle_t at `elements` (the API contract).
            let values = unsafe { std::slice::from_raw_parts(elements as *const u64, len) };
            let form = if ty == TYPE_HANDLE {
                // The library holds the worker's handles: a get is answered from here.
                CLIENT.cudnn_set_values.insert(descriptor as u64, (name, values.to_vec()));
                f.set_handles
            } else {
                replay(|r| values.iter().for_each(|v| _ = r.fresh.remove(v)));
                f.set_descriptors
            };
            let args = [descriptor as u64, u64::from(name), u64::from(ty), count as u64, elements as u64];
            // SAFETY: as above; the worker maps each element to its own handle.
            return unsafe { crate::runtime::call(form, &args) as u32 };
        }
        if name != VARIANT_PACK_DATA_POINTERS || ty != TYPE_VOID_PTR {
            return forward(elements as u64);
        }
        let Ok(len) = usize::try_from(count) else { return f.bad_param };
        // SAFETY: cudnnBackendSetAttribute's contract: `count` pointers at `elements`.
        let pointers = unsafe { std::slice::from_raw_parts(elements as *const u64, len) };
        let Some(records) = host_value_records(pointers) else {
            CLIENT.cudnn_set_values.remove(&(descriptor as u64));
            return forward(elements as u64);
        };
        // The library holds the worker's copies of the host scalars: a get of the pointers
        // is answered with the program's own.
        CLIENT.cudnn_set_values.insert(descriptor as u64, (name, pointers.to_vec()));
        let args = [descriptor as u64, u64::from(name), u64::from(ty), count as u64, records.as_ptr() as u64];
        // SAFETY: `count` records of HOST_VALUE_RECORD bytes, ours.
        unsafe { crate::runtime::call(f.set_hostvalues, &args) as u32 }
    })
}

pub unsafe fn backend_set_attribute(
    ctx: &Ctx,
    d: *mut c_void,
    name: u32,
    ty: u32,
    n: i64,
    elements: *mut c_void,
) -> u32 {
    set_attribute(forms(ctx), d, name, ty, n, elements)
}

/// Whether a finalize of a descriptor of type `ty` waits for its status: ENGINE, ENGINECFG,
/// ENGINEHEUR, EXECUTION_PLAN, INTERMEDIATE_INFO, KNOB_INFO, LAYOUT_INFO, OPERATIONGRAPH,
/// KERNEL_CACHE and DEVICEPROP, whose failure a caller acts on (the frontend moves to the
/// next engine). Tensors, operations and variant packs go without waiting.
fn finalize_waits(ty: u32) -> bool {
    matches!(ty, 2..=6 | 8 | 9 | 15 | 34 | 38)
}

/// The type of a descriptor the client named (None: one the library made, or not one).
fn type_of(descriptor: u64) -> Option<u32> {
    CLIENT.cudnn_types.get(&descriptor)
}

fn create_descriptor(f: &'static Forms, ty: u32, out: *mut c_void) -> u32 {
    crate::guard::ffi("cudnnBackendCreateDescriptor", f.bad_param, || {
        if out.is_null() {
            return f.bad_param;
        }
        if !f.named.contains(&ty) {
            tracing::trace!("create: descriptor type {ty} waits");
            // SAFETY: `out` receives one descriptor.
            return unsafe { crate::runtime::call(f.create, &[u64::from(ty), out as u64]) as u32 };
        }
        // SAFETY: `out` receives one descriptor, the client's name for it.
        let s = unsafe { crate::runtime::call(f.create_named, &[u64::from(ty), out as u64]) as u32 };
        if s == 0 {
            // SAFETY: written by the call above (the caller's descriptor pointer, non-null).
            let name = unsafe { std::ptr::read_unaligned(out as *const u64) };
            CLIENT.cudnn_types.insert(name, ty);
            replay(|r| {
                r.fresh.insert(name);
                if finalizes_learned() {
                    r.contents.created(name, ty);
                }
            });
        }
        s
    })
}

pub unsafe fn backend_create_descriptor(ctx: &Ctx, ty: u32, descriptor: *mut c_void) -> u32 {
    create_descriptor(forms(ctx), ty, descriptor)
}

/// A finalize whose status steers the caller waits; what the program asked last time of a
/// descriptor of this type after its finalize (a plan's workspace size, the heuristics'
/// results and everything asked of them) rides along in the same round trip. One of a
/// descriptor holding what one finalized before held is answered as then, without waiting.
fn finalize(f: &'static Forms, descriptor: *mut c_void) -> u32 {
    crate::guard::ffi("cudnnBackendFinalize", f.bad_param, || {
        let d = descriptor as u64;
        forget_answers(f, d);
        let held = replay(|r| {
            r.fresh.remove(&d);
            let held = r.contents.of(d);
            r.contents.finalized(d);
            held
        });
        let ty = type_of(d);
        let waits = ty.is_none_or(finalize_waits);
        tracing::trace!("finalize: descriptor type {ty:?}, waits: {waits}");
        let Some(ty) = ty.filter(|_| waits) else {
            let desc = if waits { f.finalize } else { f.finalize_async };
            // SAFETY: a value.
            return unsafe { crate::runtime::call(desc, &[d]) as u32 };
        };
        let Ok(conn) = crate::conn::get() else { return crate::runtime::unavailable(f.finalize) as u32 };
        let key = held.filter(|_| finalizes_learned()).map(|h| kept_key(h, format_args!("finalize")));
        let status = match key.as_deref().and_then(|k| kept(&conn, k)) {
            Some(answer) => {
                tracing::debug!("finalize: descriptor type {ty}: answered as before ({})", answer.status);
                answer_finalize(f, &conn, d, answer.status)
            }
            None => {
                let mut budget = PLAN_MAX;
                let plan = replay(|r| r.plan(ty, None, 0, &mut budget));
                let mut ahead = Vec::new();
                materialize(&plan, f, &conn, d, &mut ahead);
                if finalizes_learned() {
                    let what = if key.is_some() { "nothing kept for it" } else { "what it holds is unknown" };
                    tracing::debug!("finalize: descriptor type {ty}, {} calls ahead; {what}", ahead.len());
                }
                let (status, own) = batch(f, &conn, f.finalize, &[d], ahead, "cudnnBackendFinalize");
                if let Some(k) = key.as_deref().filter(|_| own) {
                    keep(&conn, k, &Answer { status, count: 0, bytes: Vec::new() });
                }
                status
            }
        };
        if status == 0 {
            replay(|r| _ = r.known.entry(d).or_default());
        }
        status
    })
}

/// Whether finalizes are answered as earlier builds of the same graph were
/// ([`chidori_protocol::env::LEARNED_CUDNN`]): decided once, at the program's first use of
/// the backend API (what descriptors hold is followed from their creation on).
fn finalizes_learned() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| match std::env::var(chidori_protocol::env::LEARNED_CUDNN).as_deref() {
        Ok("1") => true,
        Ok("0") => false,
        // The probe sent at connection answers within one round trip (a program whose first
        // call is cuDNN's waits for it here, once).
        _ => crate::conn::get().is_ok_and(|c| c.is_wan_waiting(std::time::Duration::from_secs(1))),
    })
}

/// The key of what the library answered about a descriptor that held `held`
/// ([`Space::CudnnBackend`]): this release (the hash is its own), what it held, and the call.
fn kept_key(held: u64, call: std::fmt::Arguments) -> Vec<u8> {
    format!("{}|cudnnBackend|{held:016x}|{call}", env!("CARGO_PKG_VERSION")).into_bytes()
}

fn query_key(held: u64, (name, ty, requested, array): Query) -> Vec<u8> {
    kept_key(held, format_args!("get|{name}|{ty}|{requested}|{}", u8::from(array)))
}

fn fill_key(held: u64, (name, requested, ty): FillQuery) -> Vec<u8> {
    kept_key(held, format_args!("fill|{name}|{requested}|{ty}"))
}

/// What an earlier build answered to the call `key` names.
fn kept(conn: &crate::conn::Conn, key: &[u8]) -> Option<Answer> {
    crate::learned::with(conn, |l| l.get(Space::CudnnBackend, key).and_then(Answer::decode)).flatten()
}

/// Keep the library's answer to the call `key` names, for later builds and sessions.
fn keep(conn: &crate::conn::Conn, key: &[u8], answer: &Answer) {
    crate::learned::with(conn, |l| l.learn(Space::CudnnBackend, key, &answer.encode()));
}

/// What descriptor `d` holds where what it answers cannot change until the program changes
/// it (finalized with a wait, or filled), with finalizes learned; None otherwise.
fn held_still(d: u64) -> Option<u64> {
    if !finalizes_learned() {
        return None;
    }
    replay(|r| r.known.contains_key(&d).then(|| r.contents.of(d)).flatten())
}

/// A finalize answered as before: sent without waiting, its status compared when it comes.
fn answer_finalize(f: &'static Forms, conn: &Arc<crate::conn::Conn>, d: u64, status: u32) -> u32 {
    // SAFETY: a value.
    let Some(slot) = (unsafe { crate::runtime::send_checked(conn, f.finalize, &[d]) }) else {
        return crate::runtime::unavailable(f.finalize) as u32;
    };
    crate::learned::check(conn.clone(), "cudnnBackendFinalize", slot, (), move |outcome, _| match outcome {
        Ok(s) if *s as u32 != status => Some(format!("status {s}, not {status}")),
        _ => None,
    });
    crate::trace::local("cudnnBackendFinalize");
    status
}

/// A question answered as before (`answer`): asked without waiting into buffers of ours,
/// the server's answer compared when it comes. False where it cannot be sent.
fn answer_query(f: &'static Forms, conn: &Arc<crate::conn::Conn>, d: u64, query: Query, answer: &Answer) -> bool {
    let Some(mut asked) = Asked::new(f.get, d, query) else { return false };
    // SAFETY: our buffers, of the wire form's lengths for these arguments, kept by the check
    // until the reply has landed.
    let Some(slot) = (unsafe { crate::runtime::send_checked(conn, f.get, &asked.args()) }) else { return false };
    let expected = answer.clone();
    crate::learned::check(conn.clone(), "cudnnBackendGetAttribute", slot, asked, move |outcome, asked| {
        let (attribute, ty) = (query.0, query.1);
        match outcome {
            Ok(s) if *s as u32 != expected.status => {
                Some(format!("attribute {attribute} of type {ty}: status {s}, not {}", expected.status))
            }
            _ if expected.status != 0 => None,
            _ if *asked.count != expected.count => {
                Some(format!("attribute {attribute} of type {ty}: {} elements, not {}", asked.count, expected.count))
            }
            _ if asked.bytes != expected.bytes => Some(format!("attribute {attribute} of type {ty}: other values")),
            _ => None,
        }
    });
    crate::trace::local("cudnnBackendGetAttribute");
    true
}

pub unsafe fn backend_finalize(ctx: &Ctx, descriptor: *mut c_void) -> u32 {
    finalize(forms(ctx), descriptor)
}

fn destroy_descriptor(f: &'static Forms, descriptor: *mut c_void) -> u32 {
    crate::guard::ffi("cudnnBackendDestroyDescriptor", f.bad_param, || {
        let d = descriptor as u64;
        forget_answers(f, d);
        replay(|r| r.fresh.remove(&d));
        CLIENT.cudnn_types.remove(&d);
        CLIENT.cudnn_set_values.remove(&d);
        replay(|r| r.contents.forget(d));
        // SAFETY: a value.
        unsafe { crate::runtime::call(f.destroy, &[d]) as u32 }
    })
}

/// A get of an attribute whose values the library holds as the worker's own (cudnnHandle_t,
/// a variant pack's data pointers where host scalars travelled by value): what the program
/// set, if it set this attribute last. None: ask the library, except for a handle the program
/// never set, which is not supported.
fn set_values(
    f: &Forms,
    d: u64,
    (name, ty, requested): (u32, u32, i64),
    count_out: *mut c_void,
    elements: *mut c_void,
) -> Option<u32> {
    let values = CLIENT.cudnn_set_values.get(&d).filter(|(n, _)| *n == name).map(|(_, v)| v);
    let Some(values) = values else {
        if ty != TYPE_HANDLE {
            return None;
        }
        crate::log::once("cudnn-get-handle", || {
            tracing::warn!(
                "cudnnBackendGetAttribute: a CUDNN_TYPE_HANDLE attribute the program did not set is not supported"
            )
        });
        return Some(f.not_supported);
    };
    crate::trace::local("cudnnBackendGetAttribute");
    if !count_out.is_null() {
        // SAFETY: the caller's int64_t*, checked non-null.
        unsafe { std::ptr::write_unaligned(count_out as *mut i64, values.len() as i64) };
    }
    let n = values.len().min(usize::try_from(requested).unwrap_or(0));
    if n > 0 && !elements.is_null() {
        // SAFETY: the caller's array holds `requested` >= n elements of 8 bytes.
        unsafe { std::ptr::copy_nonoverlapping(values.as_ptr(), elements as *mut u64, n) };
    }
    Some(0)
}

pub unsafe fn backend_destroy_descriptor(ctx: &Ctx, descriptor: *mut c_void) -> u32 {
    destroy_descriptor(forms(ctx), descriptor)
}

const TYPE_BACKEND_DESCRIPTOR: u32 = chidori_cuda::consts::cudnnBackendAttributeType_t::CUDNN_TYPE_BACKEND_DESCRIPTOR;

/// The arguments of a fill: `requested` descriptors at `elements` filled from `source`'s
/// attribute `name`, the count written at `count`.
fn fill_args(source: u64, name: u32, requested: i64, count: *mut i64, elements: u64) -> [u64; 6] {
    [source, u64::from(name), u64::from(TYPE_BACKEND_DESCRIPTOR), requested as u64, count as u64, elements]
}

/// A call made ahead: a question, or a fill into shadows (created before the batch).
enum Ahead {
    Query(Asked),
    Fill { source: u64, query: FillQuery, shadows: Vec<u64>, count: Box<i64> },
}

impl Ahead {
    fn args(&mut self) -> [u64; 6] {
        match self {
            Ahead::Query(a) => a.args(),
            Ahead::Fill { source, query: (name, ..), shadows, count } => {
                fill_args(*source, *name, shadows.len() as i64, &mut **count, shadows.as_ptr() as u64)
            }
        }
    }

    fn desc(&self, f: &Forms) -> &'static CallDesc {
        match self {
            Ahead::Query(_) => f.get,
            Ahead::Fill { .. } => f.fill,
        }
    }
}

/// The calls of `plan` for `descriptor`, in order; shadows are created on the way (named,
/// without waiting).
fn materialize(plan: &Plan, f: &'static Forms, conn: &crate::conn::Conn, descriptor: u64, out: &mut Vec<Ahead>) {
    for &q in &plan.queries {
        out.extend(Asked::new(f.get, descriptor, q).map(Ahead::Query));
    }
    for &(query, n, ref nested) in &plan.fills {
        let mut shadows = Vec::with_capacity(n);
        for _ in 0..n {
            let mut name = 0u64;
            // SAFETY: `name` receives the client's name for the new descriptor.
            let s = unsafe {
                crate::runtime::call_on(conn, f.create_named, &[u64::from(query.2), &mut name as *mut u64 as u64])
            };
            if s != 0 || name == 0 {
                break;
            }
            shadows.push(name);
        }
        if shadows.len() != n {
            // Not all were made: the fill cannot be the program's; unmake the rest.
            destroy_all(f, conn, &shadows);
            continue;
        }
        out.push(Ahead::Fill { source: descriptor, query, shadows: shadows.clone(), count: Box::new(UNWRITTEN) });
        for (nested_plan, &s) in nested.iter().zip(&shadows) {
            materialize(nested_plan, f, conn, s, out);
        }
    }
}

fn destroy_all(f: &Forms, conn: &crate::conn::Conn, descriptors: &[u64]) {
    for &d in descriptors {
        // SAFETY: a value; sent without waiting.
        unsafe { crate::runtime::call_on(conn, f.destroy, &[d]) };
    }
}

/// Send the program's waiting call `primary` (the args of `desc`) with the calls made ahead,
/// in one round trip; keep what they answered when the primary succeeded. Returns the
/// primary's status, or a deferred failure of an earlier call, and whether it is the
/// primary's own (an answer to keep).
fn batch(
    f: &'static Forms,
    conn: &crate::conn::Conn,
    desc: &'static CallDesc,
    primary: &[u64],
    mut ahead: Vec<Ahead>,
    name: &'static str,
) -> (u32, bool) {
    let mut args: Vec<[u64; 6]> = ahead.iter_mut().map(Ahead::args).collect();
    let mut calls: Vec<(&'static CallDesc, &[u64])> = vec![(desc, primary)];
    calls.extend(ahead.iter().zip(&mut args).map(|(a, args)| (a.desc(f), &args[..])));
    if ahead.is_empty() {
        tracing::trace!("{name}: nothing to ask ahead");
    } else {
        tracing::trace!("{name}: {} calls ahead", ahead.len());
    }
    // SAFETY: the program's arguments (its contract) and our buffers, alive until every
    // reply has landed.
    let Some((status, rets)) = (unsafe { crate::runtime::call_with_riders(conn, &calls, name) }) else {
        return (crate::runtime::unavailable(desc) as u32, false);
    };
    let status = status as u32;
    let own = status == rets[0] as u32;
    if rets[0] != 0 {
        let shadows: Vec<u64> = ahead
            .iter()
            .flat_map(|a| if let Ahead::Fill { shadows, .. } = a { shadows.clone() } else { vec![] })
            .collect();
        destroy_all(f, conn, &shadows);
        return (status, own);
    }
    let mut dropped = Vec::new();
    replay(|r| {
        for (a, &ret) in ahead.into_iter().zip(&rets[1..]) {
            match a {
                // Only a success is kept: another answer is asked again when the program asks.
                Ahead::Query(asked) if ret == 0 => {
                    let (d, q) = (asked.descriptor, asked.query);
                    r.known.entry(d).or_default().answers.push((q, asked.answer(0), false));
                }
                Ahead::Query(asked) => {
                    let (d, (attribute, ty, requested, _)) = (asked.descriptor, asked.query);
                    tracing::trace!(
                        "ahead: get of {d:#x}, attribute {attribute}, type {ty}, requested {requested} -> {ret}"
                    );
                }
                Ahead::Fill { source, query, shadows, count } => {
                    let n = shadows.len();
                    let twin = Twin { query, status: ret as u32, count: *count, shadows };
                    r.known.entry(source).or_default().twins.push(twin);
                    r.made_ahead_for(source, n, &mut dropped);
                }
            }
        }
    });
    destroy_all(f, conn, &dropped);
    (status, own)
}

/// Drop what is known of `descriptor` (it is being changed or destroyed), and destroy the
/// shadows made for it.
fn forget_answers(f: &'static Forms, descriptor: u64) {
    if !crate::state::is_client_name(descriptor) {
        return;
    }
    let mut shadows = Vec::new();
    replay(|r| r.drop_known(descriptor, &mut shadows));
    if !shadows.is_empty()
        && let Ok(conn) = crate::conn::get()
    {
        destroy_all(f, &conn, &shadows);
    }
}

fn replay<T>(f: impl FnOnce(&mut Replay) -> T) -> T {
    f(CLIENT.ahead.cudnn.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert_with(|| {
        // What earlier processes learned to ask on this server: the first graph build of
        // this one rides like a later one (the answers are still this session's).
        crate::conn::at_exit("cuDNN patterns saved", save_patterns);
        let mut r = Replay::default();
        if let Some(path) = patterns_file()
            && let Ok(bytes) = std::fs::read(&path)
        {
            r.learn_patterns(&bytes);
        }
        r
    }))
}

/// Where the learned cuDNN questions and fills of this server identity are kept.
fn patterns_file() -> Option<std::path::PathBuf> {
    let conn = crate::conn::existing()?;
    let dir = crate::ahead::learned::dir()?;
    Some(crate::ahead::learned::file(&dir, &crate::ahead::learned::identity(&conn.welcome), ".cudnn"))
}

/// Keep what this process learned to ask (at exit), for the next one.
pub fn save_patterns() {
    let guard = CLIENT.ahead.cudnn.lock().unwrap_or_else(|p| p.into_inner());
    let Some(bytes) = guard.as_ref().map(Replay::patterns).filter(|b| !b.is_empty()) else { return };
    drop(guard);
    let Some(path) = patterns_file() else { return };
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    let written = path.parent().map_or(Ok(()), std::fs::create_dir_all).and_then(|()| std::fs::write(&tmp, &bytes));
    if written.and_then(|()| std::fs::rename(&tmp, &path)).is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
}

/// Write an answer to the caller as the library would: the status, and on success
/// `*elementCount` and the elements it wrote (at most `requested`).
fn deliver(a: &Answer, requested: i64, count_out: *mut c_void, elements: *mut c_void) -> u32 {
    if a.status == 0 {
        let per = a.bytes.len() / requested.max(1) as usize;
        let n = usize::try_from(a.count).unwrap_or(0).min(requested.max(0) as usize) * per;
        if n > 0 && !elements.is_null() {
            // SAFETY: the caller's array holds the elements the library writes natively
            // (count <= requested); `bytes` holds `requested` elements.
            unsafe { std::ptr::copy_nonoverlapping(a.bytes.as_ptr(), elements as *mut u8, n) };
        }
        if !count_out.is_null() {
            // SAFETY: the caller's int64_t*, checked non-null.
            unsafe { std::ptr::write_unaligned(count_out as *mut i64, a.count) };
        }
    }
    a.status
}

/// A Get of `query` on `descriptor` into buffers of ours: the call's arguments and the
/// buffers (the count, the array) the reply lands in. A count question passes no array.
struct Asked {
    descriptor: u64,
    query: Query,
    count: Box<i64>,
    bytes: Vec<u8>,
}

impl Asked {
    fn new(call: &CallDesc, descriptor: u64, query: Query) -> Option<Asked> {
        let head = [descriptor, u64::from(query.0), u64::from(query.1), query.2 as u64];
        let len = if query.3 { array_len(call, &head)? } else { 0 };
        Some(Asked { descriptor, query, count: Box::new(0), bytes: vec![0u8; len] })
    }

    fn args(&mut self) -> [u64; 6] {
        let (name, ty, requested, with_array) = self.query;
        let count = &mut *self.count as *mut i64 as u64;
        let array = if with_array && requested > 0 { self.bytes.as_mut_ptr() as u64 } else { 0 };
        [self.descriptor, u64::from(name), u64::from(ty), requested as u64, count, array]
    }

    fn answer(self, status: u32) -> Answer {
        Answer { status, count: *self.count, bytes: self.bytes }
    }
}

/// cudnnBackendGetAttribute with native write semantics: the library writes `*elementCount`
/// elements (at most `requested`), and nothing past them reaches the caller's array. The
/// server's answer lands in a buffer of ours first; forwarding the array both ways would
/// write back bytes past those elements that were read before the round trip, and memory
/// beyond a short array may have changed meanwhile (another thread's heap).
fn get_attribute(
    f: &'static Forms,
    descriptor: *mut c_void,
    (name, ty, requested): (u32, u32, i64),
    count_out: *mut c_void,
    elements: *mut c_void,
) -> u32 {
    crate::guard::ffi("cudnnBackendGetAttribute", f.bad_param, || {
        let d = descriptor as u64;
        let (status, count) = if !elements.is_null() && requested <= 0 {
            // An array without a request: the library says what it means (nothing is
            // written to the array).
            tracing::debug!("get asks the server: attribute {name}, type {ty}, an array of {requested}");
            let mut count: i64 = 0;
            let args = [d, u64::from(name), u64::from(ty), requested as u64, &mut count as *mut i64 as u64, 0];
            // SAFETY: `count` receives one int64; no array travels.
            let s = unsafe { crate::runtime::call(f.get, &args) as u32 };
            if s == 0 && !count_out.is_null() {
                // SAFETY: the caller's int64_t*, checked non-null.
                unsafe { std::ptr::write_unaligned(count_out as *mut i64, count) };
            }
            (s, count)
        } else if let Some(s) = (ty == TYPE_HANDLE || (name == VARIANT_PACK_DATA_POINTERS && ty == TYPE_VOID_PTR))
            .then(|| set_values(f, d, (name, ty, requested), count_out, elements))
            .flatten()
        {
            (s, -1)
        } else if ty == TYPE_BACKEND_DESCRIPTOR && !elements.is_null() {
            (fill(f, d, (name, requested), count_out, elements), -1)
        } else {
            let query = (name, ty, requested, !elements.is_null());
            // Answers are kept for later builds where finalizes are learned (never a
            // pointer: one of this process's).
            let learning = ty != TYPE_VOID_PTR && finalizes_learned();
            // What is known of `d` (None: it may change); of a known one, the answer and
            // whether to keep it, and what `d` holds.
            let known = replay(|r| {
                let held = r.contents.of(d).filter(|_| learning);
                let k = r.known.get_mut(&d)?;
                if let Some((_, a, kept)) = k.answers.iter_mut().find(|(q, ..)| *q == query) {
                    let keep = !std::mem::replace(kept, true);
                    return Some((Some(a.clone()), held.filter(|_| keep)));
                }
                // A question about a descriptor that cannot change: ask it of the next ones.
                if let Some(t) = type_of(d) {
                    r.learn(t, query);
                }
                Some((None, held))
            });
            let held = known.as_ref().and_then(|(_, h)| *h);
            let conn = held.and_then(|_| crate::conn::get().ok());
            let key = held.map(|h| query_key(h, query));
            let store = conn.as_ref().zip(key.as_deref());
            if let Some((Some(a), _)) = known {
                crate::trace::local("cudnnBackendGetAttribute");
                if let Some((c, k)) = store {
                    keep(c, k, &a);
                }
                (deliver(&a, query.2, count_out, elements), a.count)
            } else if let Some(a) = store.and_then(|(c, k)| kept(c, k).filter(|a| answer_query(f, c, d, query, a))) {
                tracing::trace!("get: attribute {name}, type {ty}, requested {requested}: answered as before");
                replay(|r| r.known.get_mut(&d).map(|k| k.answers.push((query, a.clone(), true))));
                (deliver(&a, query.2, count_out, elements), a.count)
            } else {
                // What a run still waits for (`CHIDORI_LOG=chidori::custom::cudnn=debug`).
                tracing::debug!(
                    "get asks the server: descriptor type {:?}, attribute {name}, type {ty}, requested {requested}",
                    type_of(d)
                );
                let Some(mut asked) = Asked::new(f.get, d, query) else { return f.bad_param };
                // SAFETY: our buffers, of the wire form's lengths for these arguments.
                let s = unsafe { crate::runtime::call(f.get, &asked.args()) as u32 };
                let a = asked.answer(s);
                // Only a success is the library's answer here: a failure may be the deferred
                // status of an earlier call, reported by this one.
                if known.is_some() && s == 0 {
                    replay(|r| r.known.get_mut(&d).map(|k| k.answers.push((query, a.clone(), store.is_some()))));
                    if let Some((c, k)) = store {
                        keep(c, k, &a);
                    }
                }
                (deliver(&a, query.2, count_out, elements), a.count)
            }
        };
        tracing::trace!(
            "get: descriptor {d:#x} type {:?}, attribute {name}, type {ty}, requested {requested} -> {status}, {count}",
            type_of(d)
        );
        status
    })
}

/// A Get of descriptors: the library fills descriptors the caller made (names the worker
/// maps; the array is only read). A fill made ahead into shadows answers it when the
/// caller's descriptors are fresh ones of the shadows' type; else it goes to the server
/// with the questions learned for the filled descriptors' type.
fn fill(
    f: &'static Forms,
    source: u64,
    (name, requested): (u32, i64),
    count_out: *mut c_void,
    elements: *mut c_void,
) -> u32 {
    let Ok(len) = usize::try_from(requested) else { return f.bad_param };
    // SAFETY: the caller's array of `requested` descriptors (the API contract).
    let targets = unsafe { std::slice::from_raw_parts(elements as *const u64, len) }.to_vec();
    let target_types: Vec<Option<u32>> = targets.iter().map(|&t| type_of(t)).collect();
    let source_type = type_of(source);
    let same_type = target_types.first().copied().flatten().filter(|t| target_types.iter().all(|x| *x == Some(*t)));
    let Ok(conn) = crate::conn::get() else { return crate::runtime::unavailable(f.fill) as u32 };
    let key = same_type.and_then(|u| held_still(source).map(|h| fill_key(h, (name, requested, u))));
    // The fill made ahead, when it is this one.
    let twin = replay(|r| {
        let u = same_type?;
        if !targets.iter().all(|t| r.fresh.contains(t)) {
            return None;
        }
        let known = r.known.get_mut(&source)?;
        let at = known.twins.iter().position(|t| t.answers((name, requested, u)))?;
        let twin = known.twins.remove(at);
        let nth = known.made((name, requested, u));
        let source_slot = known.slot;
        r.shadows_live = r.shadows_live.saturating_sub(twin.shadows.len());
        let filled = filled_by(twin.status, twin.count, len);
        for &target in &targets {
            r.fresh.remove(&target);
        }
        r.contents.filled(source, (name, requested, u), &targets, filled);
        for (i, (&shadow, &target)) in twin.shadows.iter().zip(&targets).enumerate().take(filled) {
            let mut k = r.known.remove(&shadow).unwrap_or_default();
            k.slot = slot(i);
            r.known.insert(target, k);
        }
        let mut unmade = Vec::new();
        for &shadow in &twin.shadows[filled.min(twin.shadows.len())..] {
            r.drop_known(shadow, &mut unmade);
        }
        if let Some(t) = source_type {
            r.learn_fill((t, source_slot), (name, requested, u), filled as i64, nth);
        }
        Some((twin, unmade))
    });
    if let Some((twin, unmade)) = twin {
        if let Some(k) = &key {
            keep(&conn, k, &Answer { status: twin.status, count: twin.count, bytes: Vec::new() });
        }
        // The program's descriptors are filled by the same call, without waiting.
        let mut scratch = 0i64;
        let args = fill_args(source, name, requested, &mut scratch, elements as u64);
        // SAFETY: the caller's array of `requested` descriptors; nothing comes back.
        unsafe { crate::runtime::call_on(&conn, f.refill, &args) };
        destroy_all(f, &conn, &twin.shadows);
        destroy_all(f, &conn, &unmade);
        crate::trace::local("cudnnBackendGetAttribute");
        tracing::trace!(
            "fill: attribute {name}, {requested} of type {same_type:?}: answered by a fill made ahead (count {})",
            twin.count
        );
        if !count_out.is_null() && twin.count != UNWRITTEN {
            // SAFETY: the caller's int64_t*, checked non-null.
            unsafe { std::ptr::write_unaligned(count_out as *mut i64, twin.count) };
        }
        return twin.status;
    }
    for &t in &targets {
        forget_answers(f, t);
    }
    // What an earlier build answered to the same fill from a source holding the same.
    let kept = key.as_deref().and_then(|k| kept(&conn, k));
    let (plan, learns) = replay(|r| {
        let fresh = targets.iter().all(|t| r.fresh.contains(t));
        let learns = match (r.known.get_mut(&source), same_type) {
            (Some(k), Some(u)) if fresh => Some((k.made((name, requested, u)), k.slot)),
            _ => None,
        };
        for t in &targets {
            r.fresh.remove(t);
        }
        // Only as many descriptors as this fill ever set get a plan (the frontend offers 44
        // knob choices, the library sets one).
        let expected = match (source_type, same_type) {
            (Some(t), Some(u)) => {
                let at = r.known.get(&source).and_then(|k| k.slot);
                let learned = r.learned_fills.get(&(t, at)).map(Vec::as_slice).unwrap_or(&[]);
                learned.iter().find(|l| (l.0.0, l.0.2) == (name, u)).map(|l| l.1.clamp(0, requested) as usize)
            }
            _ => None,
        };
        let mut budget = if kept.is_some() { 0 } else { PLAN_MAX };
        let plans: Vec<(u64, Plan)> = targets
            .iter()
            .take(if kept.is_some() { 0 } else { expected.unwrap_or(len) })
            .zip(&target_types)
            .enumerate()
            .filter_map(|(i, (&t, ty))| Some((t, r.plan((*ty)?, slot(i), 1, &mut budget))))
            .collect();
        (plans, learns)
    });
    let mut count: i64 = UNWRITTEN;
    let status = match kept {
        Some(answer) => {
            tracing::trace!("fill: attribute {name}, {requested} of type {same_type:?}: answered as before");
            count = answer.count;
            answer_fill(f, &conn, source, (name, requested), elements, &answer)
        }
        None => {
            let mut ahead = Vec::new();
            for (t, p) in &plan {
                materialize(p, f, &conn, *t, &mut ahead);
            }
            let primary = fill_args(source, name, requested, &mut count, elements as u64);
            tracing::debug!(
                "fill asks the server: descriptor type {source_type:?}, attribute {name}, {requested} of type {same_type:?}"
            );
            let (status, own) = batch(f, &conn, f.fill, &primary, ahead, "cudnnBackendGetAttribute");
            if let Some(k) = key.as_deref().filter(|_| own) {
                keep(&conn, k, &Answer { status, count, bytes: Vec::new() });
            }
            status
        }
    };
    let filled = filled_by(status, count, len);
    tracing::trace!("fill: attribute {name}, {requested} of type {same_type:?}: count {count}, status {status}");
    replay(|r| {
        r.contents.filled(source, (name, requested, same_type.unwrap_or(0)), &targets, filled);
        // Only what was filled is known; questions asked of the rest are dropped.
        let mut stale = Vec::new();
        for &t in &targets[filled..] {
            r.drop_known(t, &mut stale);
        }
        for (i, &t) in targets.iter().enumerate().take(filled).filter(|(_, t)| crate::state::is_client_name(**t)) {
            r.known.entry(t).or_default().slot = slot(i);
        }
        if let (Some((nth, at)), Some(t), Some(u), 0) = (learns, source_type, same_type, status) {
            r.learn_fill((t, at), (name, requested, u), filled as i64, nth);
        }
        destroy_all(f, &conn, &stale);
    });
    if status == 0 && !count_out.is_null() && count != UNWRITTEN {
        // SAFETY: the caller's int64_t*, checked non-null.
        unsafe { std::ptr::write_unaligned(count_out as *mut i64, count) };
    }
    status
}

/// A fill answered as before: the program's descriptors filled by the same call sent without
/// waiting, its status and count compared when it comes.
fn answer_fill(
    f: &'static Forms,
    conn: &Arc<crate::conn::Conn>,
    source: u64,
    (name, requested): (u32, i64),
    elements: *mut c_void,
    answer: &Answer,
) -> u32 {
    let mut count = Box::new(UNWRITTEN);
    let args = fill_args(source, name, requested, &mut *count, elements as u64);
    // SAFETY: the caller's array of `requested` descriptors (read as the call is sent) and
    // our count, kept by the check until the reply has landed.
    let Some(slot) = (unsafe { crate::runtime::send_checked(conn, f.fill, &args) }) else {
        return crate::runtime::unavailable(f.fill) as u32;
    };
    let (status, expected) = (answer.status, answer.count);
    crate::learned::check(conn.clone(), "cudnnBackendGetAttribute", slot, count, move |outcome, count| match outcome {
        Ok(s) if *s as u32 != status => Some(format!("a fill of attribute {name}: status {s}, not {status}")),
        _ if status == 0 && **count != expected => {
            Some(format!("a fill of attribute {name}: {} descriptors, not {expected}", **count))
        }
        _ => None,
    });
    crate::trace::local("cudnnBackendGetAttribute");
    status
}

/// Bytes of the attribute array for these arguments, by the wire form's length expression.
fn array_len(desc: &CallDesc, head: &[u64; 4]) -> Option<usize> {
    elements_len(desc, head, 5)
}

/// Bytes of the array parameter `at` of `desc` for the arguments `head` (the descriptor,
/// attribute name, type and count), by the wire form's length expression.
fn elements_len(desc: &CallDesc, head: &[u64; 4], at: usize) -> Option<usize> {
    let args = [head[0], head[1], head[2], head[3], 0, 0];
    match desc.params.get(at)? {
        chidori_protocol::desc::Wire::Buf { len: Some(len), elem, .. } => {
            usize::try_from(len.eval(&args)?.checked_mul(u64::from(*elem))?).ok()
        }
        _ => None,
    }
}

pub unsafe fn backend_get_attribute(
    ctx: &Ctx,
    d: *mut c_void,
    name: u32,
    ty: u32,
    requested: i64,
    count: *mut c_void,
    elements: *mut c_void,
) -> u32 {
    get_attribute(forms(ctx), d, (name, ty, requested), count, elements)
}

pub unsafe fn set_stream(ctx: &Ctx, handle: *mut c_void, stream: *mut c_void) -> u32 {
    let (desc, bad_param) = (ctx.form(Form::Call), ctx.status(ctx.codes.invalid_value));
    crate::guard::ffi("cudnnSetStream", bad_param, || {
        // SAFETY: values.
        let s = unsafe { crate::runtime::call(desc, &[handle as u64, stream as u64]) } as u32;
        if u64::from(s) == crate::runtime::success(desc) {
            CLIENT.cudnn_streams.insert(handle as u64, stream as u64);
        }
        s
    })
}

pub unsafe fn get_stream(ctx: &Ctx, handle: *mut c_void, out: *mut c_void) -> u32 {
    let (desc, bad_param) = (ctx.form(Form::Call), ctx.status(ctx.codes.invalid_value));
    crate::guard::ffi("cudnnGetStream", bad_param, || {
        if out.is_null() {
            return bad_param;
        }
        if let Some(s) = CLIENT.cudnn_streams.get(&(handle as u64)) {
            crate::trace::local("cudnnGetStream");
            // SAFETY: the caller's cudaStream_t*, checked non-null.
            unsafe { std::ptr::write_unaligned(out as *mut u64, s) };
            return crate::runtime::success(desc) as u32;
        }
        // SAFETY: `out` receives one stream.
        let s = unsafe { crate::runtime::call(desc, &[handle as u64, out as u64]) } as u32;
        if s == 0 {
            // SAFETY: written by the reply.
            let stream = unsafe { std::ptr::read_unaligned(out as *const u64) };
            CLIENT.cudnn_streams.insert(handle as u64, stream);
        }
        s
    })
}

pub unsafe fn destroy(ctx: &Ctx, handle: *mut c_void) -> u32 {
    let (desc, bad_param) = (ctx.form(Form::Call), ctx.status(ctx.codes.invalid_value));
    crate::guard::ffi("cudnnDestroy", bad_param, || {
        CLIENT.cudnn_streams.remove(&(handle as u64));
        // SAFETY: a value.
        unsafe { crate::runtime::call(desc, &[handle as u64]) as u32 }
    })
}

/// torch's `get_parameters` asks each matrix's and bias's address 100 times in a row, with
/// the same descriptors (a loop around a cuDNN defect): 6,400 round trips for a two-layer
/// LSTM's forward and backward. A call identical to the last one the server answered, with
/// no message sent since, finds the library as that call left it: the descriptors it filled
/// hold what it wrote, so the addresses are answered here. Anything sent in between (by any
/// thread) sends the next call to the server. A forwarded call also asks, in its round trip,
/// the dimensions of the two descriptors it fills: torch reads them right after.
///
/// torch makes a new RNN descriptor for each forward and backward: a question answered
/// before about a descriptor set alike (in this process, or in an earlier one on this
/// server, `crate::ahead::rnn`) is answered here, and the call and its questions are sent
/// without waiting, their answers checked when they come.
///
/// `args`: handle, rnnDesc, pseudoLayer, weightSpaceSize, weightSpace, linLayerID, mDesc,
/// mAddr, bDesc, bAddr (the last two of each triple: the caller's `void **` or null).
unsafe fn weight_params(desc: &'static CallDesc, nd: &'static CallDesc, args: [u64; 10]) -> u32 {
    let unavailable = crate::runtime::unavailable(desc) as u32;
    crate::guard::ffi("cudnnGetRNNWeightParams", unavailable, || {
        let Ok(conn) = crate::conn::get() else { return unavailable };
        let (m_addr, b_addr) = (args[7], args[9]);
        // The output pointers count only as null or not.
        let mut key = [0u64; 9];
        key[..7].copy_from_slice(&args[..7]);
        key[7] = args[8];
        key[8] = u64::from(m_addr != 0) | u64::from(b_addr != 0) << 1;
        if let Some((m, b)) = CLIENT.ahead.rnn_weight_params.get_at(&key, conn.sent_so_far()) {
            crate::trace::local("cudnnGetRNNWeightParams");
            for (out, value) in [(m_addr, m), (b_addr, b)] {
                if out != 0 {
                    // SAFETY: the caller's void** output, non-null; the same call wrote it natively.
                    unsafe { std::ptr::write_unaligned(out as *mut u64, value) };
                }
            }
            return crate::runtime::success(desc) as u32;
        }
        let question = question(&args);
        if let Some(q) = question
            && let Some(status) = answer_known(&conn, (desc, nd), &args, key, q)
        {
            return status;
        }
        // The descriptors it fills (mDesc, bDesc), each asked for all its dimensions.
        let targets: Vec<u64> = [args[6], args[8]].into_iter().filter(|&d| d != 0).collect();
        let mut shapes = Shapes::default();
        let questions: Vec<[u64; 6]> = targets.iter().enumerate().map(|(i, &t)| shapes.ask(i, t)).collect();
        let mut calls: Vec<(&'static CallDesc, &[u64])> = vec![(desc, &args[..])];
        calls.extend(questions.iter().map(|q| (nd, &q[..])));
        let before = conn.sent_so_far();
        // SAFETY: the caller's arguments (its outputs are void** or null); the questions'
        // outputs are `shapes`'s arrays, alive until call_with_riders returns with every reply.
        let Some((status, statuses)) = (unsafe { crate::runtime::call_with_riders(&conn, &calls, desc.name) }) else {
            return unavailable;
        };
        let status = status as u32;
        let sent = conn.sent_so_far();
        // Kept only when these calls were the only messages sent meanwhile: nothing else can
        // have changed the descriptors after them.
        let alone = status == 0 && sent == before + calls.len() as u64;
        CLIENT.ahead.rnn_weight_params.clear();
        CLIENT.ahead.rnn_filled_tensors.clear();
        if alone {
            // SAFETY: written by the reply where non-null.
            let read = |p: u64| if p == 0 { 0 } else { unsafe { std::ptr::read_unaligned(p as *const u64) } };
            let (m, b) = (read(m_addr), read(b_addr));
            CLIENT.ahead.rnn_weight_params.learn_at(key, (m, b), sent);
            let mut filled = [None, None];
            for (i, &t) in targets.iter().enumerate() {
                if let Some(nd) = shapes.shape(i).filter(|_| statuses[i + 1] == 0) {
                    CLIENT.ahead.rnn_filled_tensors.learn_at(t, nd.clone(), sent);
                    filled[usize::from(t != args[6])] = Some(nd);
                }
            }
            if let Some(q) = question {
                let space = args[4];
                let [matrix_nd, bias_nd] = filled;
                let weights = Weights {
                    matrix: crate::ahead::rnn::offset(m, space),
                    bias: crate::ahead::rnn::offset(b, space),
                    matrix_nd,
                    bias_nd,
                };
                if weights.complete_for(q.passed) {
                    crate::learned::with(&conn, |l| l.learn(crate::ahead::rnn::SPACE, &q.stored(), &weights.encode()));
                    CLIENT.ahead.rnn_weights.learn(q, weights);
                }
            }
        }
        status
    })
}

/// The question a `cudnnGetRNNWeightParams` call asks, where its RNN descriptor says what
/// was set on it and the weight space is named (`args` as [`weight_params`]).
fn question(args: &[u64; 10]) -> Option<Question> {
    let rnn = crate::runtime::cudnn_sizes::fingerprint(args[1]).filter(|_| args[1] != 0 && args[4] != 0)?;
    let passed =
        [args[6], args[7], args[8], args[9]].iter().enumerate().fold(0u8, |bits, (i, &a)| bits | u8::from(a != 0) << i);
    // A matrix descriptor shared with the bias would be filled twice: the server's to say.
    if args[6] != 0 && args[6] == args[8] {
        return None;
    }
    Some(Question { rnn, layer: args[2] as u32 as i32, space_size: args[3], lin: args[5] as u32 as i32, passed })
}

/// Where `cudnnGetTensorNdDescriptor` writes what it says of up to two descriptors, each
/// asked for all its dimensions.
#[derive(Default)]
struct Shapes {
    types: [u32; 2],
    counts: [i32; 2],
    dims: [[i32; DIM_MAX]; 2],
    strides: [[i32; DIM_MAX]; 2],
}

impl Shapes {
    /// The arguments of the question about `descriptor`, answered into place `i` (0 or 1):
    /// pointers into `self`, which must stay where it is until the reply has landed.
    fn ask(&mut self, i: usize, descriptor: u64) -> [u64; 6] {
        [
            descriptor,
            DIM_MAX as u64,
            &mut self.types[i] as *mut u32 as u64,
            &mut self.counts[i] as *mut i32 as u64,
            self.dims[i].as_mut_ptr() as u64,
            self.strides[i].as_mut_ptr() as u64,
        ]
    }

    /// What the answer in place `i` said (None: a count no descriptor has).
    fn shape(&self, i: usize) -> Option<TensorNd> {
        let n = usize::try_from(self.counts[i]).ok().filter(|&n| n <= DIM_MAX)?;
        Some(TensorNd {
            data_type: self.types[i],
            dims: self.dims[i][..n].to_vec(),
            strides: self.strides[i][..n].to_vec(),
        })
    }
}

/// Where the server writes what the checked call and its questions answer.
#[derive(Default)]
struct Checked {
    addrs: [u64; 2],
    shapes: Shapes,
}

/// `cudnnGetRNNWeightParams` answered from what was learned about descriptors set alike
/// (`q`): the addresses written, the descriptors' shapes kept for the questions that
/// follow; the call (which fills the server's descriptors as natively) and questions of
/// those shapes sent without waiting, their answers compared when they come. None where
/// nothing complete was learned (or it could not be sent).
fn answer_known(
    conn: &Arc<crate::conn::Conn>,
    (desc, nd): (&'static CallDesc, &'static CallDesc),
    args: &[u64; 10],
    key: [u64; 9],
    q: Question,
) -> Option<u32> {
    let (weights, from_store) = match CLIENT.ahead.rnn_weights.get(&q) {
        Some(w) => (w, false),
        None => (
            crate::learned::with(conn, |l| l.get(crate::ahead::rnn::SPACE, &q.stored()).and_then(Weights::decode))??,
            true,
        ),
    };
    if !weights.complete_for(q.passed) {
        return None;
    }
    let space = args[4];
    let mut checked = Box::<Checked>::default();
    let mut call = *args;
    for (i, at) in [7, 9].into_iter().enumerate() {
        if call[at] != 0 {
            call[at] = &mut checked.addrs[i] as *mut u64 as u64;
        }
    }
    // SAFETY: the caller's arguments but its two outputs, which are `checked`'s words; the
    // checking thread keeps `checked` until every reply has landed.
    let main = unsafe { crate::runtime::send_checked(conn, desc, &call) }?;
    crate::runtime::cudnn_sizes::forget_passed(desc, args);
    let mut slots = vec![main];
    let targets: Vec<(usize, u64)> = [args[6], args[8]].into_iter().enumerate().filter(|&(_, t)| t != 0).collect();
    for &(i, t) in &targets {
        let ask = checked.shapes.ask(i, t);
        // SAFETY: the question's outputs are `checked`'s arrays, kept as above.
        let Some(slot) = (unsafe { crate::runtime::send_checked(conn, nd, &ask) }) else {
            // The connection failed after the call went: its buffers stay until the call's
            // reply or the session's end, and the program learns the session ended.
            crate::learned::check_all(conn.clone(), desc.name, slots, checked, |_, _| None);
            return Some(crate::runtime::unavailable(desc) as u32);
        };
        slots.push(slot);
    }
    let sent = conn.sent_so_far();
    let (m, b) = (crate::ahead::rnn::address(weights.matrix, space), crate::ahead::rnn::address(weights.bias, space));
    for (out, value) in [(args[7], m), (args[9], b)] {
        if out != 0 {
            // SAFETY: the caller's void** output, non-null.
            unsafe { std::ptr::write_unaligned(out as *mut u64, value) };
        }
    }
    CLIENT.ahead.rnn_weight_params.clear();
    CLIENT.ahead.rnn_filled_tensors.clear();
    CLIENT.ahead.rnn_weight_params.learn_at(key, (m, b), sent);
    for (t, shape) in [(args[6], &weights.matrix_nd), (args[8], &weights.bias_nd)] {
        if let (true, Some(shape)) = (t != 0, shape) {
            CLIENT.ahead.rnn_filled_tensors.learn_at(t, shape.clone(), sent);
        }
    }
    if from_store {
        CLIENT.ahead.rnn_weights.learn(q, weights.clone());
    }
    let args = *args;
    crate::learned::check_all(conn.clone(), desc.name, slots, checked, move |outcomes, c| {
        let statuses: Vec<u64> = outcomes.iter().map(|o| *o.as_ref().unwrap_or(&u64::MAX)).collect();
        if statuses.iter().any(|&s| s != 0) {
            return Some(format!("statuses {statuses:?}, not all success"));
        }
        let got = |i: usize, at: usize| (args[at] != 0).then(|| crate::ahead::rnn::offset(c.addrs[i], space)).flatten();
        if got(0, 7) != weights.matrix.filter(|_| args[7] != 0) || got(1, 9) != weights.bias.filter(|_| args[9] != 0) {
            return Some("other addresses".to_owned());
        }
        for &(i, _) in &targets {
            let want = if i == 0 { &weights.matrix_nd } else { &weights.bias_nd };
            if c.shapes.shape(i).as_ref() != want.as_ref() {
                return Some("another shape".to_owned());
            }
        }
        None
    });
    crate::trace::local("cudnnGetRNNWeightParams");
    Some(0)
}

/// `cudnnGetTensorNdDescriptor`: answered by the client for a descriptor the last forwarded
/// `cudnnGetRNNWeightParams` filled, while nothing has been sent since and the caller asks
/// for at least all its dimensions; otherwise the server's.
///
/// `args`: tensorDesc, nbDimsRequested, dataType, nbDims, dimA, strideA.
unsafe fn get_tensor_nd(desc: &'static CallDesc, args: [u64; 6]) -> u32 {
    let unavailable = crate::runtime::unavailable(desc) as u32;
    crate::guard::ffi("cudnnGetTensorNdDescriptor", unavailable, || {
        let Ok(conn) = crate::conn::get() else { return unavailable };
        let requested = args[1] as u32 as i32;
        let known = CLIENT.ahead.rnn_filled_tensors.get_at(&args[0], conn.sent_so_far());
        let outputs_given = args[2] != 0 && args[3] != 0 && args[4] != 0 && args[5] != 0;
        if let Some(t) = known.filter(|t| outputs_given && requested >= t.dims.len() as i32) {
            crate::trace::local("cudnnGetTensorNdDescriptor");
            // SAFETY: the caller's cudnnDataType_t*, int*, and two int arrays of at least
            // `requested` >= t.dims.len() elements, all checked non-null.
            unsafe {
                std::ptr::write_unaligned(args[2] as *mut u32, t.data_type);
                std::ptr::write_unaligned(args[3] as *mut i32, t.dims.len() as i32);
                std::ptr::copy_nonoverlapping(t.dims.as_ptr(), args[4] as *mut i32, t.dims.len());
                std::ptr::copy_nonoverlapping(t.strides.as_ptr(), args[5] as *mut i32, t.strides.len());
            }
            return crate::runtime::success(desc) as u32;
        }
        // SAFETY: the caller's arguments, as the descriptor says.
        unsafe { crate::runtime::call_on(&conn, desc, &args) as u32 }
    })
}

pub unsafe fn get_tensor_nd_descriptor(
    ctx: &Ctx,
    tensorDesc: *mut c_void,
    nbDimsRequested: i32,
    dataType: *mut c_void,
    nbDims: *mut c_void,
    dimA: *mut c_void,
    strideA: *mut c_void,
) -> u32 {
    let args =
        [tensorDesc as u64, nbDimsRequested as u32 as u64, dataType as u64, nbDims as u64, dimA as u64, strideA as u64];
    // SAFETY: the caller's arguments, passed on.
    unsafe { get_tensor_nd(forms(ctx).get_tensor_nd, args) }
}

#[allow(clippy::too_many_arguments)]
pub unsafe fn get_rnn_weight_params(
    ctx: &Ctx,
    handle: *mut c_void,
    rnnDesc: *mut c_void,
    pseudoLayer: i32,
    weightSpaceSize: usize,
    weightSpace: *mut c_void,
    linLayerID: i32,
    mDesc: *mut c_void,
    mAddr: *mut c_void,
    bDesc: *mut c_void,
    bAddr: *mut c_void,
) -> u32 {
    let args = [handle as u64, rnnDesc as u64, pseudoLayer as u32 as u64, weightSpaceSize as u64, weightSpace as u64];
    let rest = [linLayerID as u32 as u64, mDesc as u64, mAddr as u64, bDesc as u64, bAddr as u64];
    // SAFETY: the caller's arguments, passed on.
    unsafe { weight_params(forms(ctx).rnn_weight_params, forms(ctx).get_tensor_nd, concat(args, rest)) }
}

/// cuDNN's v7 CTC loss and its workspace query (`raw_args`: in both, 1 is the
/// probabilities' descriptor and 3, 4, 5 the host labels, label lengths and input lengths).
/// The arrays' lengths are data: the descriptor (time x batch x alphabet) is asked for its
/// batch (once per shape it was set to), the label lengths are added up, and the call goes
/// with those lengths told. A batch or label length the library could not take is its
/// bad-parameter status here.
///
/// # Safety
/// `args` are the caller's arguments of either function (cuDNN's contract).
pub unsafe fn ctc(ctx: &Ctx, args: &[u64]) -> u64 {
    let desc = ctx.form(Form::Call);
    let bad_param = u64::from(forms(ctx).bad_param);
    crate::guard::ffi(ctx.name, crate::runtime::unavailable(desc), || {
        let word = |i: usize| args.get(i).copied().unwrap_or(0);
        // SAFETY: the caller's descriptor.
        let batch = match unsafe { ctc_batch(ctx, word(1)) } {
            Ok(Some(batch)) => batch,
            Ok(None) => return bad_param,
            Err(status) => return u64::from(status),
        };
        if word(4) == 0 || word(5) == 0 {
            return bad_param;
        }
        // SAFETY: the caller's array of one label length per sequence (cuDNN's contract).
        let lengths = unsafe { std::slice::from_raw_parts(word(4) as *const i32, batch) };
        let Some(labels) = lengths.iter().try_fold(0u64, |sum, &n| Some(sum + u64::try_from(n).ok()?)) else {
            return bad_param;
        };
        let told = [(3, labels), (4, batch as u64), (5, batch as u64)];
        // SAFETY: the caller's arguments; its three arrays as long as told.
        crate::runtime::with_told(&told, || unsafe { crate::runtime::call(desc, args) })
    })
}

/// The batch of a CTC loss's probabilities (their descriptor's second dimension): known
/// where a descriptor set alike was asked before, else asked. Ok(None): the descriptor has
/// no batch; Err: the question's status.
unsafe fn ctc_batch(ctx: &Ctx, probs: u64) -> Result<Option<usize>, u32> {
    // Only a descriptor whose every Set the client followed (not one just created or NULL).
    let set = crate::runtime::cudnn_sizes::fingerprint(probs).filter(|&f| f > 1);
    // (Not traced as a call when known: the program asked no such question.)
    if let Some(batch) = set.and_then(|f| CLIENT.ahead.ctc_batches.get(&f)) {
        return Ok(Some(batch));
    }
    let mut shapes = Shapes::default();
    let ask = shapes.ask(0, probs);
    // SAFETY: the question's outputs are `shapes`' arrays, which outlive the call.
    let status = unsafe { get_tensor_nd(forms(ctx).get_tensor_nd, ask) };
    if status != 0 {
        return Err(status);
    }
    let batch = shapes.shape(0).and_then(|s| s.dims.get(1).copied()).and_then(|b| usize::try_from(b).ok());
    let batch = batch.filter(|&b| b > 0);
    if let (Some(f), Some(b)) = (set, batch) {
        CLIENT.ahead.ctc_batches.learn(f, b);
    }
    Ok(batch)
}

fn concat(a: [u64; 5], b: [u64; 5]) -> [u64; 10] {
    let mut all = [0u64; 10];
    all[..5].copy_from_slice(&a);
    all[5..].copy_from_slice(&b);
    all
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_codes_are_those_of_each_forms_cuda_version() {
        let value = |version: &str, name: &str| {
            let table = chidori_cuda::status::table(version, "cudnn").expect("a cuDNN status table");
            table.iter().find(|s| s.name.trim_end_matches('\0') == name).map(|s| s.value)
        };
        assert_eq!(value("11.8", "CUDNN_STATUS_BAD_PARAM"), Some(i64::from(BAD_PARAM_V8)));
        assert_eq!(value("11.8", "CUDNN_STATUS_NOT_SUPPORTED"), Some(i64::from(NOT_SUPPORTED_V8)));
        assert_eq!(value("12.6", "CUDNN_STATUS_BAD_PARAM"), Some(i64::from(BAD_PARAM_V9)));
        assert_eq!(value("12.6", "CUDNN_STATUS_NOT_SUPPORTED"), Some(i64::from(NOT_SUPPORTED_V9)));
    }

    #[test]
    fn host_scalars_are_read_and_unreadable_memory_is_not() {
        let scale = 0.125f32;
        let got = read_host_scalar(&scale as *const f32 as u64).expect("a stack value is readable");
        assert_eq!(&got[..4], &scale.to_le_bytes());
        // The last 4 bytes of a page: read up to the page end only.
        let page = vec![0u8; 3 * 4096];
        let end = (page.as_ptr() as u64).div_ceil(4096) * 4096 + 4096 - 4;
        assert_eq!(read_host_scalar(end).map(|b| b.len()), Some(4));
        // An address in no mapping.
        assert_eq!(read_host_scalar(8), None);
    }

    #[test]
    fn host_scalars_travel_as_records_and_other_pointers_as_they_are() {
        let scale = 0.125f32;
        let host = &scale as *const f32 as u64;
        let records = host_value_records(&[0, host, 8]).expect("one pointer is a host scalar");
        let r: Vec<&[u8]> = records.chunks_exact(HOST_VALUE_RECORD).collect();
        assert_eq!(r.len(), 3);
        assert_eq!(r[0], &[0u8; HOST_VALUE_RECORD][..], "NULL stays NULL");
        assert_eq!(&r[1][8..16], &HOST_VALUE_FLAG.to_le_bytes());
        assert_eq!(&r[1][16..20], &scale.to_le_bytes());
        assert_eq!(&r[2][..16], &[8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0], "unreadable: passed as it is");
        assert_eq!(host_value_records(&[0, 8]), None, "no host scalar: the plain form");
    }

    #[test]
    fn the_hostvalues_wire_form_carries_whole_records() {
        // specs/cudnn.toml spells the record size as a literal: it must be the protocol's.
        for desc in
            [&calls::cudnnBackendSetAttribute__cu118__hostvalues, &calls::cudnnBackendSetAttribute__cu126__hostvalues]
        {
            let args = [0, 1001, 6, 3, 0];
            let Some(chidori_protocol::desc::Wire::Buf { len: Some(len), elem: 1, .. }) = desc.params.get(4) else {
                panic!("{}: the records are a byte buffer", desc.name)
            };
            assert_eq!(len.eval(&args), Some(3 * HOST_VALUE_RECORD as u64), "{}", desc.name);
        }
    }
}
