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

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Mutex, OnceLock};

use chidori_cuda::calls::cudnn as calls;
use chidori_protocol::desc::CallDesc;
use chidori_protocol::messages::{HOST_VALUE_FLAG, HOST_VALUE_MAX, HOST_VALUE_RECORD};

/// CUDNN_STATUS_BAD_PARAM of cuDNN 8 and of cuDNN 9.
const BAD_PARAM_V8: u32 = 3;
const BAD_PARAM_V9: u32 = 2000;
/// CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS and CUDNN_TYPE_VOID_PTR (same in cuDNN 8 and 9).
const VARIANT_PACK_DATA_POINTERS: u32 = 1001;
const TYPE_VOID_PTR: u32 = 6;

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

#[allow(clippy::too_many_arguments)]
fn set_attribute(
    (desc, descriptors, hostvalues): (&'static CallDesc, &'static CallDesc, &'static CallDesc),
    descriptor: *mut c_void,
    name: u32,
    ty: u32,
    count: i64,
    elements: *mut c_void,
    bad_param: u32,
) -> u32 {
    crate::guard::ffi("cudnnBackendSetAttribute", bad_param, || {
        forget_answers(descriptor as u64);
        let forward = |elements: u64| {
            let args = [descriptor as u64, u64::from(name), u64::from(ty), count as u64, elements];
            // SAFETY: `elements` holds `count` elements of the attribute type (the caller's
            // array or our copy of it).
            unsafe { crate::runtime::call(desc, &args) as u32 }
        };
        if elements.is_null() || count <= 0 {
            return forward(elements as u64);
        }
        if ty == TYPE_BACKEND_DESCRIPTOR {
            let args = [descriptor as u64, u64::from(name), u64::from(ty), count as u64, elements as u64];
            // SAFETY: `count` descriptors at `elements` (the API contract).
            return unsafe { crate::runtime::call(descriptors, &args) as u32 };
        }
        if name != VARIANT_PACK_DATA_POINTERS || ty != TYPE_VOID_PTR {
            return forward(elements as u64);
        }
        let Ok(len) = usize::try_from(count) else { return bad_param };
        // SAFETY: cudnnBackendSetAttribute's contract: `count` pointers at `elements`.
        let pointers = unsafe { std::slice::from_raw_parts(elements as *const u64, len) };
        let Some(records) = host_value_records(pointers) else { return forward(elements as u64) };
        let args = [descriptor as u64, u64::from(name), u64::from(ty), count as u64, records.as_ptr() as u64];
        // SAFETY: `count` records of HOST_VALUE_RECORD bytes, ours.
        unsafe { crate::runtime::call(hostvalues, &args) as u32 }
    })
}

macro_rules! set_attribute_variant {
    ($name:ident, $desc:ident, $descriptors:ident, $hostvalues:ident, $bad_param:expr) => {
        pub unsafe fn $name(
            descriptor: *mut c_void,
            attributeName: u32,
            attributeType: u32,
            elementCount: i64,
            arrayOfElements: *mut c_void,
        ) -> u32 {
            let forms = (&calls::$desc, &calls::$descriptors, &calls::$hostvalues);
            let (n, t) = (attributeName, attributeType);
            set_attribute(forms, descriptor, n, t, elementCount, arrayOfElements, $bad_param)
        }
    };
}

set_attribute_variant!(
    cudnnBackendSetAttribute__cu118,
    cudnnBackendSetAttribute__cu118__call,
    cudnnBackendSetAttribute__cu118__descriptors,
    cudnnBackendSetAttribute__cu118__hostvalues,
    BAD_PARAM_V8
);
set_attribute_variant!(
    cudnnBackendSetAttribute__cu126,
    cudnnBackendSetAttribute__cu126__call,
    cudnnBackendSetAttribute__cu126__descriptors,
    cudnnBackendSetAttribute__cu126__hostvalues,
    BAD_PARAM_V9
);

/// The descriptor types of cuDNN 8.9 (POINTWISE ..= OPERATION_RNG; the values are the same
/// in cuDNN 9): the client names these. A newer type is created with a reply, so a server
/// library without it says so at once.
const NAMED_TYPES: std::ops::RangeInclusive<u32> = 0..=33;

/// Whether a finalize of a descriptor of type `ty` waits for its status: ENGINE, ENGINECFG,
/// ENGINEHEUR, EXECUTION_PLAN, INTERMEDIATE_INFO, KNOB_INFO, LAYOUT_INFO and
/// OPERATIONGRAPH, whose failure a caller acts on (the frontend moves to the next engine).
fn finalize_waits(ty: u32) -> bool {
    matches!(ty, 2..=6 | 8 | 9 | 15)
}

/// The type of each descriptor the client named, until it is destroyed.
static TYPES: Mutex<Option<HashMap<u64, u32>>> = Mutex::new(None);

fn types() -> std::sync::MutexGuard<'static, Option<HashMap<u64, u32>>> {
    TYPES.lock().unwrap_or_else(|p| p.into_inner())
}

/// The type of a descriptor the client named (None: one the library made, or not one).
fn type_of(descriptor: *mut c_void) -> Option<u32> {
    types().as_ref().and_then(|t| t.get(&(descriptor as u64)).copied())
}

fn create_descriptor(
    call: &'static CallDesc,
    named: &'static CallDesc,
    ty: u32,
    out: *mut c_void,
    bad_param: u32,
) -> u32 {
    crate::guard::ffi("cudnnBackendCreateDescriptor", bad_param, || {
        if out.is_null() {
            return bad_param;
        }
        if !NAMED_TYPES.contains(&ty) {
            tracing::trace!("create: descriptor type {ty} waits");
            // SAFETY: `out` receives one descriptor.
            return unsafe { crate::runtime::call(call, &[u64::from(ty), out as u64]) as u32 };
        }
        // SAFETY: `out` receives one descriptor, the client's name for it.
        let s = unsafe { crate::runtime::call(named, &[u64::from(ty), out as u64]) as u32 };
        if s == 0 {
            // SAFETY: written by the call above (the caller's descriptor pointer, non-null).
            let name = unsafe { std::ptr::read_unaligned(out as *const u64) };
            types().get_or_insert_with(HashMap::new).insert(name, ty);
        }
        s
    })
}

fn finalize(call: &'static CallDesc, deferred: &'static CallDesc, descriptor: *mut c_void, bad_param: u32) -> u32 {
    crate::guard::ffi("cudnnBackendFinalize", bad_param, || {
        forget_answers(descriptor as u64);
        let ty = type_of(descriptor);
        let desc = match ty {
            Some(ty) if !finalize_waits(ty) => deferred,
            _ => call,
        };
        tracing::trace!("finalize: descriptor type {ty:?}, waits: {}", desc.waits());
        // SAFETY: a value.
        unsafe { crate::runtime::call(desc, &[descriptor as u64]) as u32 }
    })
}

fn destroy_descriptor(call: &'static CallDesc, descriptor: *mut c_void, bad_param: u32) -> u32 {
    crate::guard::ffi("cudnnBackendDestroyDescriptor", bad_param, || {
        forget_answers(descriptor as u64);
        if let Some(t) = types().as_mut() {
            t.remove(&(descriptor as u64));
        }
        // SAFETY: a value.
        unsafe { crate::runtime::call(call, &[descriptor as u64]) as u32 }
    })
}

pub unsafe fn cudnnBackendDestroyDescriptor__cu118(descriptor: *mut c_void) -> u32 {
    destroy_descriptor(&calls::cudnnBackendDestroyDescriptor__cu118__call, descriptor, BAD_PARAM_V8)
}

pub unsafe fn cudnnBackendDestroyDescriptor__cu126(descriptor: *mut c_void) -> u32 {
    destroy_descriptor(&calls::cudnnBackendDestroyDescriptor__cu126__call, descriptor, BAD_PARAM_V9)
}

macro_rules! create_variant {
    ($name:ident, $call:ident, $named:ident, $bad_param:expr) => {
        pub unsafe fn $name(ty: u32, descriptor: *mut c_void) -> u32 {
            create_descriptor(&calls::$call, &calls::$named, ty, descriptor, $bad_param)
        }
    };
}

create_variant!(
    cudnnBackendCreateDescriptor__cu118,
    cudnnBackendCreateDescriptor__cu118__call,
    cudnnBackendCreateDescriptor__cu118__named,
    BAD_PARAM_V8
);
create_variant!(
    cudnnBackendCreateDescriptor__cu126,
    cudnnBackendCreateDescriptor__cu126__call,
    cudnnBackendCreateDescriptor__cu126__named,
    BAD_PARAM_V9
);

macro_rules! finalize_variant {
    ($name:ident, $call:ident, $deferred:ident, $bad_param:expr) => {
        pub unsafe fn $name(descriptor: *mut c_void) -> u32 {
            finalize(&calls::$call, &calls::$deferred, descriptor, $bad_param)
        }
    };
}

finalize_variant!(
    cudnnBackendFinalize__cu118,
    cudnnBackendFinalize__cu118__call,
    cudnnBackendFinalize__cu118__async,
    BAD_PARAM_V8
);
finalize_variant!(
    cudnnBackendFinalize__cu126,
    cudnnBackendFinalize__cu126__call,
    cudnnBackendFinalize__cu126__async,
    BAD_PARAM_V9
);

/// CUDNN_TYPE_BACKEND_DESCRIPTOR (the same in cuDNN 8 and 9).
const TYPE_BACKEND_DESCRIPTOR: u32 = 15;

/// What one Get answered: the status, `*elementCount`, and the array as the server sent it
/// (`requested` elements of the attribute type's size).
#[derive(Clone)]
struct Answer {
    status: u32,
    count: i64,
    bytes: Vec<u8>,
}

/// A Get's question: (attribute, attribute type, requested elements).
type Query = (u32, u32, i64);

/// Most queries learned per descriptor type, most elements whose answers one fill asks
/// for, and the largest array a learned query may ask for.
const LEARNED_MAX: usize = 8;
const PREFETCH_MAX: usize = 64;
const REQUESTED_MAX: i64 = 64;

/// Answers for descriptors a Get of descriptors filled (torch's frontend fills an engine
/// from each engine configuration, then asks the engine for its notes and index): what the
/// program asked of them is learned per descriptor type, and asked again of the next
/// descriptors of that type in the same round trip as their fill. Only the same question
/// about the same, unchanged descriptor is answered from here: a Get has no side effects,
/// and a filled descriptor changes only by a new fill, a Set, a Finalize or its destroy,
/// each of which drops its answers.
#[derive(Default)]
struct Replay {
    learned: HashMap<u32, Vec<Query>>,
    filled: HashMap<u64, Vec<(Query, Answer)>>,
}

static REPLAY: Mutex<Option<Replay>> = Mutex::new(None);

fn replay<T>(f: impl FnOnce(&mut Replay) -> T) -> T {
    f(REPLAY.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert_with(Replay::default))
}

/// Drop what is known of `descriptor` (it is being changed or destroyed).
fn forget_answers(descriptor: u64) {
    if crate::runtime::is_client_name(descriptor) {
        replay(|r| r.filled.remove(&descriptor));
    }
}

/// Write an answer to the caller as the library would: the status, and on success
/// `*elementCount` and the elements it wrote (at most `requested`).
fn deliver(a: &Answer, requested: i64, count_out: *mut c_void, elements: *mut c_void) -> u32 {
    if a.status == 0 {
        let per = a.bytes.len() / requested.max(1) as usize;
        let n = usize::try_from(a.count).unwrap_or(0).min(requested as usize) * per;
        // SAFETY: the caller's array holds the elements the library writes natively
        // (count <= requested); `bytes` holds `requested` elements.
        unsafe { std::ptr::copy_nonoverlapping(a.bytes.as_ptr(), elements as *mut u8, n) };
        if !count_out.is_null() {
            // SAFETY: the caller's int64_t*, checked non-null.
            unsafe { std::ptr::write_unaligned(count_out as *mut i64, a.count) };
        }
    }
    a.status
}

/// A Get of `query` on `descriptor` into buffers of ours: the call's arguments and the
/// buffers (the count, the array) the reply lands in.
struct Asked {
    descriptor: u64,
    query: Query,
    count: Box<i64>,
    bytes: Vec<u8>,
}

impl Asked {
    fn new(call: &CallDesc, descriptor: u64, query: Query) -> Option<Asked> {
        let head = [descriptor, u64::from(query.0), u64::from(query.1), query.2 as u64];
        Some(Asked { descriptor, query, count: Box::new(0), bytes: vec![0u8; array_len(call, &head)?] })
    }

    fn args(&mut self) -> [u64; 6] {
        let (name, ty, requested) = self.query;
        let count = &mut *self.count as *mut i64 as u64;
        [self.descriptor, u64::from(name), u64::from(ty), requested as u64, count, self.bytes.as_mut_ptr() as u64]
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
#[allow(clippy::too_many_arguments)]
fn get_attribute(
    call: &'static CallDesc,
    descriptors: &'static CallDesc,
    descriptor: *mut c_void,
    name: u32,
    ty: u32,
    requested: i64,
    count_out: *mut c_void,
    elements: *mut c_void,
    bad_param: u32,
) -> u32 {
    crate::guard::ffi("cudnnBackendGetAttribute", bad_param, || {
        let d = descriptor as u64;
        let head = [d, u64::from(name), u64::from(ty), requested as u64];
        let (status, count) = if elements.is_null() || requested <= 0 {
            let mut count: i64 = 0;
            let args = [head[0], head[1], head[2], head[3], &mut count as *mut i64 as u64, elements as u64];
            // SAFETY: `count` receives one int64; the array is NULL or never touched.
            let s = unsafe { crate::runtime::call(call, &args) as u32 };
            if s == 0 && !count_out.is_null() {
                // SAFETY: the caller's int64_t*, checked non-null.
                unsafe { std::ptr::write_unaligned(count_out as *mut i64, count) };
            }
            (s, count)
        } else if ty == TYPE_BACKEND_DESCRIPTOR {
            let s = fill(call, descriptors, head, count_out, elements);
            (s, -1)
        } else {
            let query = (name, ty, requested);
            let known = replay(|r| {
                let answers = r.filled.get(&d)?;
                if let Some((_, a)) = answers.iter().find(|(q, _)| *q == query) {
                    return Some(Some(a.clone()));
                }
                // A question about a filled descriptor: ask it of the next ones of its type.
                if let Some(t) = type_of(descriptor).filter(|_| requested <= REQUESTED_MAX) {
                    let learned = r.learned.entry(t).or_default();
                    if !learned.contains(&query) && learned.len() < LEARNED_MAX {
                        learned.push(query);
                    }
                }
                Some(None)
            });
            if let Some(Some(a)) = known {
                crate::trace::local("cudnnBackendGetAttribute");
                (deliver(&a, requested, count_out, elements), a.count)
            } else {
                let Some(mut asked) = Asked::new(call, d, query) else { return bad_param };
                // SAFETY: our buffers, of the wire form's lengths for these arguments.
                let s = unsafe { crate::runtime::call(call, &asked.args()) as u32 };
                let a = asked.answer(s);
                // Only a success is the library's answer here: a failure may be the deferred
                // status of an earlier call, reported by this one.
                if known.is_some() && s == 0 {
                    replay(|r| r.filled.get_mut(&d).map(|v| v.push((query, a.clone()))));
                }
                (deliver(&a, requested, count_out, elements), a.count)
            }
        };
        tracing::trace!(
            "get: descriptor type {:?}, attribute {name}, type {ty}, requested {requested} -> {status}, {count}",
            type_of(descriptor)
        );
        status
    })
}

/// A Get of descriptors: the library fills descriptors the caller made (names the worker
/// maps; the array is only read). The questions learned for the filled descriptors' types
/// go in the same round trip.
fn fill(
    call: &'static CallDesc,
    descriptors: &'static CallDesc,
    head: [u64; 4],
    count_out: *mut c_void,
    elements: *mut c_void,
) -> u32 {
    let requested = head[3] as usize;
    // SAFETY: the caller's array of `requested` descriptors (the API contract).
    let targets = unsafe { std::slice::from_raw_parts(elements as *const u64, requested) }.to_vec();
    for &t in &targets {
        forget_answers(t);
    }
    let mut asked: Vec<Asked> = replay(|r| {
        let mut asked = Vec::new();
        for &t in targets.iter().take(PREFETCH_MAX).filter(|&&t| crate::runtime::is_client_name(t)) {
            let Some(ty) = type_of(t as *mut c_void) else { continue };
            for &q in r.learned.get(&ty).map(Vec::as_slice).unwrap_or(&[]) {
                asked.extend(Asked::new(call, t, q));
            }
        }
        asked
    });
    let mut count: i64 = 0;
    let primary = [head[0], head[1], head[2], head[3], &mut count as *mut i64 as u64, elements as u64];
    let mut args: Vec<[u64; 6]> = vec![primary];
    args.extend(asked.iter_mut().map(Asked::args));
    let batch: Vec<(&'static CallDesc, &[u64])> =
        args.iter().enumerate().map(|(i, a)| (if i == 0 { descriptors } else { call }, a.as_slice())).collect();
    let Ok(conn) = crate::conn::get() else { return crate::runtime::unavailable(descriptors) as u32 };
    // SAFETY: the caller's array and our buffers, alive until every reply has landed.
    let Some(rets) = (unsafe { crate::runtime::call_all(&conn, &batch, "cudnnBackendGetAttribute") }) else {
        return crate::runtime::unavailable(descriptors) as u32;
    };
    let mut status = rets[0] as u32;
    if status != 0 {
        return status;
    }
    // The fill is the program's call: a deferred failure of an earlier call surfaces here.
    if let Some(deferred) = conn.take_deferred(descriptors.library) {
        status = deferred as u32;
    }
    let filled = usize::try_from(count).unwrap_or(0).min(requested);
    replay(|r| {
        for &t in targets.iter().take(filled).filter(|&&t| crate::runtime::is_client_name(t)) {
            r.filled.insert(t, Vec::new());
        }
        for (a, &ret) in asked.into_iter().zip(&rets[1..]) {
            if let Some(answers) = r.filled.get_mut(&a.descriptor) {
                let query = a.query;
                answers.push((query, a.answer(ret as u32)));
            }
        }
    });
    if status == 0 && !count_out.is_null() {
        // SAFETY: the caller's int64_t*, checked non-null.
        unsafe { std::ptr::write_unaligned(count_out as *mut i64, count) };
    }
    status
}

/// Bytes of the attribute array for these arguments, by the wire form's length expression.
fn array_len(desc: &CallDesc, head: &[u64; 4]) -> Option<usize> {
    let args = [head[0], head[1], head[2], head[3], 0, 0];
    match desc.params.get(5)? {
        chidori_protocol::desc::Wire::Buf { len: Some(len), elem, .. } => {
            usize::try_from(len.eval(&args)?.checked_mul(u64::from(*elem))?).ok()
        }
        _ => None,
    }
}

macro_rules! get_attribute_variant {
    ($name:ident, $call:ident, $descriptors:ident, $bad_param:expr) => {
        pub unsafe fn $name(
            descriptor: *mut c_void,
            attributeName: u32,
            attributeType: u32,
            requestedElementCount: i64,
            elementCount: *mut c_void,
            arrayOfElements: *mut c_void,
        ) -> u32 {
            let (forms, (n, t, r)) =
                ((&calls::$call, &calls::$descriptors), (attributeName, attributeType, requestedElementCount));
            get_attribute(forms.0, forms.1, descriptor, n, t, r, elementCount, arrayOfElements, $bad_param)
        }
    };
}

get_attribute_variant!(
    cudnnBackendGetAttribute__cu118,
    cudnnBackendGetAttribute__cu118__call,
    cudnnBackendGetAttribute__cu118__descriptors,
    BAD_PARAM_V8
);
get_attribute_variant!(
    cudnnBackendGetAttribute__cu126,
    cudnnBackendGetAttribute__cu126__call,
    cudnnBackendGetAttribute__cu126__descriptors,
    BAD_PARAM_V9
);

/// The library's versions, asked once per process.
static VERSION: OnceLock<usize> = OnceLock::new();
static CUDART_VERSION: OnceLock<usize> = OnceLock::new();

fn once(cell: &OnceLock<usize>, desc: &'static CallDesc) -> usize {
    if let Some(v) = cell.get() {
        crate::trace::local(desc.name);
        return *v;
    }
    crate::guard::ffi(desc.name, 0, || {
        // SAFETY: no arguments.
        let v = unsafe { crate::runtime::call(desc, &[]) } as usize;
        // 0 means the server could not be asked; ask again next time.
        if v != 0 {
            let _ = cell.set(v);
        }
        v
    })
}

pub unsafe fn cudnnGetVersion__cu118() -> usize {
    once(&VERSION, &calls::cudnnGetVersion__cu118__call)
}

pub unsafe fn cudnnGetVersion__cu126() -> usize {
    once(&VERSION, &calls::cudnnGetVersion__cu126__call)
}

pub unsafe fn cudnnGetCudartVersion__cu118() -> usize {
    once(&CUDART_VERSION, &calls::cudnnGetCudartVersion__cu118__call)
}

pub unsafe fn cudnnGetCudartVersion__cu126() -> usize {
    once(&CUDART_VERSION, &calls::cudnnGetCudartVersion__cu126__call)
}

/// The stream last set on each handle (a new handle's is asked for once).
static STREAMS: Mutex<Option<HashMap<u64, u64>>> = Mutex::new(None);

fn streams() -> std::sync::MutexGuard<'static, Option<HashMap<u64, u64>>> {
    STREAMS.lock().unwrap_or_else(|p| p.into_inner())
}

fn set_stream(desc: &'static CallDesc, handle: *mut c_void, stream: *mut c_void, bad_param: u32) -> u32 {
    crate::guard::ffi("cudnnSetStream", bad_param, || {
        // SAFETY: values.
        let s = unsafe { crate::runtime::call(desc, &[handle as u64, stream as u64]) } as u32;
        if s == 0 {
            streams().get_or_insert_with(HashMap::new).insert(handle as u64, stream as u64);
        }
        s
    })
}

fn get_stream(desc: &'static CallDesc, handle: *mut c_void, out: *mut c_void, bad_param: u32) -> u32 {
    crate::guard::ffi("cudnnGetStream", bad_param, || {
        if out.is_null() {
            return bad_param;
        }
        if let Some(s) = streams().as_ref().and_then(|m| m.get(&(handle as u64)).copied()) {
            crate::trace::local("cudnnGetStream");
            // SAFETY: the caller's cudaStream_t*, checked non-null.
            unsafe { std::ptr::write_unaligned(out as *mut u64, s) };
            return 0;
        }
        // SAFETY: `out` receives one stream.
        let s = unsafe { crate::runtime::call(desc, &[handle as u64, out as u64]) } as u32;
        if s == 0 {
            // SAFETY: written by the reply.
            let stream = unsafe { std::ptr::read_unaligned(out as *const u64) };
            streams().get_or_insert_with(HashMap::new).insert(handle as u64, stream);
        }
        s
    })
}

fn destroy(desc: &'static CallDesc, handle: *mut c_void, bad_param: u32) -> u32 {
    crate::guard::ffi("cudnnDestroy", bad_param, || {
        if let Some(m) = streams().as_mut() {
            m.remove(&(handle as u64));
        }
        // SAFETY: a value.
        unsafe { crate::runtime::call(desc, &[handle as u64]) as u32 }
    })
}

pub unsafe fn cudnnSetStream__cu118(handle: *mut c_void, streamId: *mut c_void) -> u32 {
    set_stream(&calls::cudnnSetStream__cu118__call, handle, streamId, BAD_PARAM_V8)
}

pub unsafe fn cudnnSetStream__cu126(handle: *mut c_void, streamId: *mut c_void) -> u32 {
    set_stream(&calls::cudnnSetStream__cu126__call, handle, streamId, BAD_PARAM_V9)
}

pub unsafe fn cudnnGetStream__cu118(handle: *mut c_void, streamId: *mut c_void) -> u32 {
    get_stream(&calls::cudnnGetStream__cu118__call, handle, streamId, BAD_PARAM_V8)
}

pub unsafe fn cudnnGetStream__cu126(handle: *mut c_void, streamId: *mut c_void) -> u32 {
    get_stream(&calls::cudnnGetStream__cu126__call, handle, streamId, BAD_PARAM_V9)
}

pub unsafe fn cudnnDestroy__cu118(handle: *mut c_void) -> u32 {
    destroy(&calls::cudnnDestroy__cu118__call, handle, BAD_PARAM_V8)
}

pub unsafe fn cudnnDestroy__cu126(handle: *mut c_void) -> u32 {
    destroy(&calls::cudnnDestroy__cu126__call, handle, BAD_PARAM_V9)
}

#[cfg(test)]
mod tests {
    use super::*;

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
