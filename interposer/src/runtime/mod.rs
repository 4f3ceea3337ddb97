//! The client runtime: how a call described by a generated `CallDesc` reaches the server.
//!
//! Arguments arrive as raw u64 values (the generated exports convert them). Values,
//! handles and device addresses travel as they are; host buffers travel as bulk bytes read
//! from the caller's memory; outputs are written back by the I/O thread when the reply
//! lands. Calls of class `async` do not wait: a failure comes back as a deferred status that
//! the next waiting call of the same library reports, as CUDA reports sticky errors.

pub(crate) mod cudnn_sizes;
pub(crate) mod cufft_plans;
pub(crate) mod kept;
pub(crate) mod solver_sizes;
pub(crate) mod sparse_sizes;
pub(crate) mod sparselt_sizes;

use std::borrow::Cow;
use std::ffi::{CStr, c_char, c_void};
use std::sync::Arc;
use std::time::Instant;

use chidori_cuda::status;
use chidori_protocol::codec;
use chidori_protocol::desc::{CallDesc, Dir, Ret, Wire};
use chidori_protocol::frame::{self, Header, Kind};
use chidori_protocol::messages::{self, COMPRESS_MAX, COMPRESS_MIN, COMPRESSED_FLAG, CONTENT_FLAG, Call};

use crate::ahead::learned::Space;
use crate::conn::{self, Asked, Conn, OutTarget, Slot};

/// The raw return value a call answers when it cannot reach a server.
pub fn unavailable(desc: &CallDesc) -> u64 {
    match desc.ret {
        Ret::Status => desc.codes.unavailable as u64,
        Ret::Val { .. } | Ret::Void => 0,
    }
}

pub fn success(desc: &CallDesc) -> u64 {
    match desc.ret {
        Ret::Status => desc.codes.success as u64,
        Ret::Val { .. } | Ret::Void => 0,
    }
}

pub use crate::conn::thread_id;

/// A call ready to send: the archive, the input bytes, and where outputs go.
pub(crate) struct Prepared<'a> {
    pub(crate) call: Call,
    pub(crate) bulk: Vec<Cow<'a, [u8]>>,
    pub(crate) outs: Vec<OutTarget>,
    /// The call's header flags: [`frame::OUTPUTS_COMPRESSED`] where a large output may
    /// come back compressed (a slow link).
    pub(crate) flags: u8,
}

impl Prepared<'_> {
    /// The header of the call's frame.
    pub(crate) fn header(&self, desc: &CallDesc, seq: u64) -> Header {
        Header { flags: self.flags, ..Header::new(Kind::Call, desc.wire, thread_id(), seq) }
    }
}

/// What the encoder asks of this client: string lengths in the program's memory, the
/// pointer mode recorded for a BLAS handle, names for new handles.
struct ThisClient;

impl codec::Client for ThisClient {
    fn c_str_len(&mut self, addr: u64) -> u64 {
        // SAFETY: the encoder asks only for non-null `Str` arguments, NUL-terminated C strings
        // per the API contract of the function being forwarded.
        unsafe { CStr::from_ptr(addr as *const c_char) }.to_bytes_with_nul().len() as u64
    }

    fn scalar_mode(&mut self, mode: u64) -> codec::ScalarMode {
        crate::scalars::mode(mode)
    }

    fn new_name(&mut self) -> u64 {
        crate::state::next_handle_name()
    }

    fn word(&mut self, addr: u64, bytes: u64) -> Option<u64> {
        // SAFETY: the encoder asks only for a non-null pointer parameter the API reads as a
        // length (`unsigned int *count`), of the integer width the descriptor gives.
        unsafe {
            match bytes {
                4 => Some(u64::from(std::ptr::read_unaligned(addr as *const u32))),
                8 => Some(std::ptr::read_unaligned(addr as *const u64)),
                _ => None,
            }
        }
    }

    fn told(&mut self, param: usize) -> Option<u64> {
        TOLD.with_borrow(|told| told.iter().find(|&&(p, _)| p == param).map(|&(_, n)| n))
    }
}

thread_local! {
    /// The lengths custom code told for the call this thread is sending ([`with_told`]).
    static TOLD: std::cell::RefCell<Vec<(usize, u64)>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Run `send` with the element counts of the input arrays whose length only the caller's
/// data gives (`in[told]` in the specs): (parameter, count), for the calls it encodes on
/// this thread.
pub(crate) fn with_told<T>(counts: &[(usize, u64)], send: impl FnOnce() -> T) -> T {
    struct Reset;
    impl Drop for Reset {
        fn drop(&mut self) {
            TOLD.with_borrow_mut(Vec::clear);
        }
    }
    TOLD.with_borrow_mut(|told| {
        told.clear();
        told.extend_from_slice(counts);
    });
    let _reset = Reset;
    send()
}

/// Marshal raw arguments by the descriptor ([`codec::encode`]), reading the inputs from the
/// program's memory and writing the names of handles the client names.
///
/// # Safety
/// Pointer arguments must be valid for the lengths the descriptor computes from the other
/// arguments (the contract of the CUDA function being called).
unsafe fn prepare<'a>(conn: &Conn, desc: &CallDesc, args: &[u64]) -> Prepared<'a> {
    crate::state::CLIENT.ahead.captures.sending(desc.name);
    let encoded = codec::encode(desc, args, &mut ThisClient);
    for &(at, name) in &encoded.names {
        // SAFETY: the caller's non-null pointer to a handle.
        unsafe { std::ptr::write_unaligned(at as *mut u64, name) };
    }
    let mut call = encoded.call;
    let bulk = encoded
        .inputs
        .iter()
        .map(|s| match desc.params.get(s.param) {
            // SAFETY: the caller's host scalar (host pointer mode).
            Some(Wire::Scalar { .. }) => unsafe { host_scalar(s.addr, s.len) },
            Some(&Wire::Buf { dir: Dir::In, record: None, .. }) if s.len as u64 >= crate::content::MIN_CHUNK => {
                // SAFETY: as below.
                let bytes = unsafe { std::slice::from_raw_parts(s.addr as *const u8, s.len) };
                // A large input the server kept from an earlier run travels as its hash.
                match crate::content::plan(bytes) {
                    crate::content::Plan::Hash(hash) => {
                        call.lens[s.param] |= CONTENT_FLAG;
                        Cow::Owned(hash.to_vec())
                    }
                    crate::content::Plan::Bytes(_) => match if compressing(conn) { compressed(bytes) } else { None } {
                        Some(packed) => {
                            call.lens[s.param] |= COMPRESSED_FLAG;
                            Cow::Owned(packed)
                        }
                        None => Cow::Borrowed(bytes),
                    },
                }
            }
            Some(&Wire::Buf { dir: Dir::In, record: None, .. })
                if s.len as u64 >= COMPRESS_MIN && compressing(conn) =>
            {
                // SAFETY: as below.
                let bytes = unsafe { std::slice::from_raw_parts(s.addr as *const u8, s.len) };
                match compressed(bytes) {
                    Some(packed) => {
                        call.lens[s.param] |= COMPRESSED_FLAG;
                        Cow::Owned(packed)
                    }
                    None => Cow::Borrowed(bytes),
                }
            }
            // SAFETY: the caller's input of that many bytes, per the API contract (the
            // encoder names no span larger than one call may carry).
            _ => Cow::Borrowed(unsafe { std::slice::from_raw_parts(s.addr as *const u8, s.len) }),
        })
        .collect();
    let outs: Vec<OutTarget> =
        encoded.outputs.iter().map(|s| OutTarget { param: s.param, ptr: s.addr as usize, len: s.len }).collect();
    let large_output = outs.iter().any(|o| (COMPRESS_MIN..=COMPRESS_MAX).contains(&(o.len as u64)));
    let flags = if large_output && compressing(conn) { frame::OUTPUTS_COMPRESSED } else { 0 };
    Prepared { call, bulk, outs, flags }
}

/// Whether this connection's large inputs and outputs go compressed ([`chidori_protocol::env::COMPRESS`]).
fn compressing(conn: &Conn) -> bool {
    static ASKED: std::sync::OnceLock<Option<bool>> = std::sync::OnceLock::new();
    let asked = ASKED.get_or_init(|| match std::env::var(chidori_protocol::env::COMPRESS).as_deref() {
        Ok("1") => Some(true),
        Ok("0") => Some(false),
        _ => None,
    });
    asked.unwrap_or_else(|| conn.is_wan())
}

/// `bytes` as an input travels compressed: the frame's byte count, then a zstd frame
/// ([`chidori_protocol::pack::compress`]); None where that does not pay.
pub(crate) fn compressed(bytes: &[u8]) -> Option<Vec<u8>> {
    let packed = chidori_protocol::pack::compress(bytes)?;
    let mut out = Vec::with_capacity(8 + packed.len());
    out.extend_from_slice(&(packed.len() as u64).to_le_bytes());
    out.extend_from_slice(&packed);
    Some(out)
}

/// The bytes of a host scalar at `addr` for a parameter of `bytes` bytes. A scalar travels
/// as its type's size, an untyped one (`const void *alpha`) as the size its type parameter
/// gives ([`codec::scalar_bytes`]). Where no parameter gives it (cublasLtMatmul's, in its
/// descriptor; cublasGemmEx's for a compute type outside its enumeration) it travels as up
/// to 16 bytes, the
/// largest scalar type, but may be a 4-byte float at the end of the last mapped page: the
/// bytes are read only up to the end of the scalar's page (a naturally aligned scalar never
/// crosses one) and the rest are zeros.
///
/// # Safety
/// `addr` must point at a readable scalar of the caller's type.
unsafe fn host_scalar<'a>(addr: u64, bytes: usize) -> Cow<'a, [u8]> {
    let to_page_end = 4096 - (addr % 4096) as usize;
    if bytes <= to_page_end {
        // SAFETY: the whole range lies in the scalar's own page, or is the scalar itself.
        return Cow::Borrowed(unsafe { std::slice::from_raw_parts(addr as *const u8, bytes) });
    }
    let mut owned = vec![0u8; bytes];
    // SAFETY: the bytes up to the end of the scalar's page are in that page.
    owned[..to_page_end].copy_from_slice(unsafe { std::slice::from_raw_parts(addr as *const u8, to_page_end) });
    Cow::Owned(owned)
}

/// Forward one call described by `desc` with its raw arguments; returns the raw result.
///
/// # Safety
/// As [`prepare`].
pub unsafe fn call(desc: &'static CallDesc, args: &[u64]) -> u64 {
    crate::guard::ffi(desc.name, unavailable(desc), || {
        let conn = match conn::get() {
            Ok(c) => c,
            Err(_) => return unavailable(desc),
        };
        // SAFETY: forwarded contract.
        let ret = unsafe { call_on(&conn, desc, args) };
        note_status(desc, ret);
        ret
    })
}

/// A library is handed device pointers: those into the program's pinned memory (valid on a
/// GPU, which maps pinned memory at its host address) need the server's mirror. `named`:
/// the bytes the call reads and writes, where its caller knows them (a copy's two sides),
/// in place of its device pointers' whole ranges.
fn mirror_devices(conn: &Conn, desc: &CallDesc, args: &[u64], named: Option<&[(u64, u64)]>) {
    // A kernel may be waiting for the program to write mirrored memory (a flag it sets
    // before it synchronizes, as NVIDIA's UnifiedMemoryPerf does): the write goes first.
    let f = facts(desc);
    if crate::mirror::pending() && f.waits_for_gpu {
        crate::mirror::before_wait(conn);
    }
    match named {
        Some(windows) => crate::mirror::prepare(conn, windows.iter().map(|&(a, n)| (a, Some(n))), f.reach),
        None => {
            let devices = desc.params.iter().zip(args).filter(|(w, _)| matches!(w, Wire::Device));
            crate::mirror::prepare(conn, devices.map(|(_, &a)| (a, None)), f.reach)
        }
    };
    if f.graph_launch {
        if crate::mirror::active() {
            crate::mirror::prepare_graph(conn);
        }
        // The graph's event-record nodes record again on the server, unseen.
        crate::state::CLIENT.ahead.events.forget_all();
    }
}

/// Hints about managed memory (advise, prefetch, attach to a stream) for a range the client
/// holds: there is nothing to move (the bytes travel when the GPU is handed pointers), so
/// they succeed here. Other ranges go to the server, which answers for them.
fn managed_hint(desc: &CallDesc, args: &[u64]) -> Option<u64> {
    let name = chidori_protocol::desc::strip_suffixes(desc.name, &["_ptsz", "_v2"]);
    // The position of the address (the driver's CUdeviceptr travels as a plain value).
    let at = match name {
        "cudaMemAdvise" | "cudaMemPrefetchAsync" | "cuMemAdvise" | "cuMemPrefetchAsync" => 0,
        "cudaStreamAttachMemAsync" | "cuStreamAttachMemAsync" => 1,
        _ => return None,
    };
    let &ptr = args.get(at)?;
    crate::state::find(ptr).filter(|r| matches!(r.memory, crate::state::Memory::Managed)).map(|_| success(desc))
}

/// Whether a waiting call's return shows the GPU work before it done, so that what the GPU
/// wrote into mirrored memory is there to pull (a pull at any other waiting call may come
/// before the GPU wrote, and would leave nothing to pull at the synchronization after it):
/// the synchronizations, host copies the program waits for, the runtime's or the driver's
/// (which return once earlier work of their stream is done), and a stream or event found
/// complete.
fn settles(desc: &CallDesc, ret: u64) -> bool {
    let f = facts(desc);
    f.waits_for_gpu && (!f.query || ret == success(desc))
}

/// What the sending path does differently for a descriptor, found once per descriptor (by
/// name: comparing names on every call showed in the executor's profile before).
#[derive(Clone, Copy, Default)]
struct Facts {
    /// A graph launch (`cudaGraphLaunch`, `cuGraphLaunch` and their forms).
    graph_launch: bool,
    /// Its answers may be kept for the process (specs' `constant`, inputs all values).
    constant: bool,
    /// What a cuFFT call does to the plan it names ([`cufft_plans::Role`]).
    cufft: cufft_plans::Role,
    /// Which legacy cuDNN descriptors a cuDNN call may change ([`cudnn_sizes::Changes`]).
    cudnn: cudnn_sizes::Changes,
    /// What a cuSOLVER call is to the workspace sizes followed ([`solver_sizes::Role`]).
    solver: solver_sizes::Role,
    /// What a cuSPARSE call is to the buffer sizes followed ([`sparse_sizes::Role`]).
    sparse: sparse_sizes::Role,
    /// It hands out new graphs or instances (a create, an end of capture, a clone, an
    /// instantiate; not a getter's graph, which the program does not own).
    hands_out_graphs: bool,
    /// It waits for earlier GPU work or asks whether it is done: a synchronization, a host
    /// copy, a stream or event query ([`Facts::query`]).
    waits_for_gpu: bool,
    query: bool,
    /// What the GPU may reach from its pointers: a library's kernels may follow pointers
    /// stored in memory; the runtime's and the driver's own calls (copies, memsets) touch
    /// the bytes they name (their kernel launches prepare on their own).
    reach: crate::mirror::Reach,
}

impl Facts {
    fn of(d: &CallDesc) -> Facts {
        let by_value = d.params.iter().all(|w| {
            matches!(
                w,
                Wire::Val { .. }
                    | Wire::Null
                    | Wire::Handle { destroy: false, .. }
                    | Wire::Buf { dir: Dir::Out, record: None, .. }
                    | Wire::Scalar { dir: Dir::Out, .. }
            )
        });
        let name = chidori_protocol::desc::strip_suffixes(d.name, &["_v2"]);
        let query = matches!(
            chidori_protocol::desc::strip_suffixes(d.name, &["_ptsz"]),
            "cudaStreamQuery" | "cudaEventQuery" | "cuStreamQuery" | "cuEventQuery"
        );
        Facts {
            graph_launch: d.name.starts_with("cudaGraphLaunch") || d.name.starts_with("cuGraphLaunch"),
            constant: d.waits() && by_value && chidori_cuda::checks::constant(name),
            cufft: if d.library == "cufft" { cufft_plans::role(d.name) } else { cufft_plans::Role::None },
            cudnn: if d.library == "cudnn" { cudnn_sizes::changes(d.name) } else { cudnn_sizes::Changes::Nothing },
            solver: if d.library == "cusolver" { solver_sizes::role(d) } else { solver_sizes::Role::Keeps },
            sparse: if d.library == "cusparse" { sparse_sizes::role(d) } else { sparse_sizes::Role::Keeps },
            hands_out_graphs: !d.name.contains("Get")
                && d.params
                    .iter()
                    .any(|w| matches!(w, Wire::OutHandle { kind, .. } if crate::ahead::graphs::is_graph_kind(*kind))),
            waits_for_gpu: d.only_waits || d.host_copy() || query,
            query,
            reach: if matches!(d.library, "cudart" | "driver") {
                crate::mirror::Reach::Named
            } else {
                crate::mirror::Reach::Stored
            },
        }
    }
}

/// Which legacy descriptors the cuDNN call `desc` may change, found once per descriptor.
pub(crate) fn cudnn_changes(desc: &CallDesc) -> cudnn_sizes::Changes {
    facts(desc).cudnn
}

fn facts(desc: &CallDesc) -> Facts {
    static ALL: std::sync::OnceLock<Vec<Facts>> = std::sync::OnceLock::new();
    let all = ALL.get_or_init(|| chidori_cuda::calls::VARIANTS.iter().map(|d| Facts::of(d)).collect());
    match (all.get(desc.wire as usize), chidori_cuda::calls::VARIANTS.get(desc.wire as usize)) {
        (Some(f), Some(d)) if std::ptr::eq(*d, desc) => *f,
        // A descriptor built elsewhere (a test's).
        _ => Facts::of(desc),
    }
}

/// The key of a call whose answer does not change while the process runs (specs'
/// `constant`), where its inputs are all values: the descriptor and the arguments, an
/// output pointer only as NULL or not. None for every other call.
fn constant_key(desc: &CallDesc, args: &[u64]) -> Option<crate::state::ConstantKey> {
    if !facts(desc).constant {
        return None;
    }
    let values = desc
        .params
        .iter()
        .zip(args)
        .map(|(w, &a)| match w {
            Wire::Buf { .. } | Wire::Scalar { .. } => u64::from(a != 0),
            _ => a,
        })
        .collect();
    Some((desc.wire, values))
}

/// The key of a constant across processes: the function (its name, not this client's wire
/// number) and its values.
fn learned_constant_key(desc: &CallDesc, (_, values): &crate::state::ConstantKey) -> Vec<u8> {
    let mut key = format!("{}|{:?}|", desc.name, desc.form).into_bytes();
    values.iter().for_each(|v| key.extend_from_slice(&v.to_le_bytes()));
    key
}

/// A constant's answer as kept: the status, then each output's length (u32) and bytes.
fn encode_constant(ret: u64, outs: &[Vec<u8>]) -> Vec<u8> {
    let mut bytes = ret.to_le_bytes().to_vec();
    for out in outs {
        bytes.extend_from_slice(&u32::try_from(out.len()).unwrap_or(u32::MAX).to_le_bytes());
        bytes.extend_from_slice(out);
    }
    bytes
}

/// What [`encode_constant`] kept; None if it cannot be read.
fn decode_constant(mut bytes: &[u8]) -> Option<(u64, Vec<Vec<u8>>)> {
    let (ret, rest) = bytes.split_first_chunk::<8>()?;
    let ret = u64::from_le_bytes(*ret);
    bytes = rest;
    let mut outs = Vec::new();
    while !bytes.is_empty() {
        let (len, rest) = bytes.split_first_chunk::<4>()?;
        let len = usize::try_from(u32::from_le_bytes(*len)).ok()?;
        outs.push(rest.get(..len)?.to_vec());
        bytes = &rest[len..];
    }
    Some((ret, outs))
}

/// Whether `ret` is the library's answer (a success, or a value: 0 is what a call answers
/// without a server), to keep for a constant.
fn answered(desc: &CallDesc, ret: u64) -> bool {
    match desc.ret {
        Ret::Status => ret == success(desc),
        Ret::Val { .. } => ret != unavailable(desc),
        Ret::Void => true,
    }
}

/// A constant an earlier process on this server was given (`Space::Constant`): its answer
/// and outputs, now the process's too; the call still goes, without waiting, into buffers
/// of the client's own, and its answer is compared when it comes (another one ends the
/// session: `crate::learned`). None: not learned, or learned for outputs of other sizes.
///
/// # Safety
/// `args` are the caller's arguments of this call, `outs` its outputs.
unsafe fn learned_constant(
    desc: &'static CallDesc,
    args: &[u64],
    key: &crate::state::ConstantKey,
    outs: &[OutTarget],
) -> Option<(u64, Vec<Vec<u8>>)> {
    let conn = conn::get().ok()?;
    let lkey = learned_constant_key(desc, key);
    let kept = crate::learned::with(&conn, |l| l.get(Space::Constant, &lkey).map(<[u8]>::to_vec))??;
    let (ret, learned) = decode_constant(&kept)?;
    let fits = learned.len() == outs.len()
        && outs.iter().zip(&learned).all(|(t, b)| {
            (t.ptr == 0 && b.is_empty()) || (b.len() == t.len && args.get(t.param) == Some(&(t.ptr as u64)))
        });
    if !fits {
        return None;
    }
    // The reply lands in these (moved into the check, which keeps them until it has).
    let mut own: Vec<Vec<u8>> = outs.iter().map(|t| vec![0u8; if t.ptr == 0 { 0 } else { t.len }]).collect();
    let mut own_args = args.to_vec();
    for (t, buffer) in outs.iter().zip(&mut own) {
        if t.ptr != 0 {
            own_args[t.param] = buffer.as_mut_ptr() as u64;
        }
    }
    // SAFETY: the caller's values and our buffers of the outputs' lengths, kept by the
    // check until the reply has landed.
    let slot = unsafe { send_checked(&conn, desc, &own_args) }?;
    crate::state::CLIENT.ahead.constants.learn(key.clone(), (ret, learned.clone()));
    let expected = learned.clone();
    crate::learned::check(conn.clone(), desc.name, slot, (own, ret, expected), |outcome, (own, ret, expected)| {
        match outcome {
            Ok(r) if r != ret => Some(format!("answer {r}, not {ret}")),
            Ok(_) if own != expected => Some("another value".to_owned()),
            _ => None,
        }
    });
    Some((ret, learned))
}

/// Send a call on `conn` and, unless it is async, wait for its reply.
///
/// # Safety
/// As [`prepare`].
pub unsafe fn call_on(conn: &Conn, desc: &'static CallDesc, args: &[u64]) -> u64 {
    // SAFETY: forwarded contract.
    unsafe { call_asking(conn, desc, args, None) }.0
}

/// [`call_on`] for a call that reads and writes only the bytes `named` (address, length)
/// of the memory its pointers lead into: where that is the program's mirrored memory, only
/// those bytes are brought up to date first (a copy of a piece of a large mapped buffer).
///
/// # Safety
/// As [`prepare`].
pub unsafe fn call_on_named(conn: &Conn, desc: &'static CallDesc, args: &[u64], named: &[(u64, u64)]) -> u64 {
    // SAFETY: forwarded contract.
    unsafe { call_full(conn, desc, args, None, Some(named)) }.0
}

/// [`call_on`], with `question` sent right behind the call where the call goes to the
/// server: the server answers it after running the call, in the call's round trip (a
/// capture's begin and its status, its end and the graph's nodes). The question's answer
/// is the caller's to take; None where the call was answered without the server.
///
/// # Safety
/// As [`prepare`].
pub unsafe fn call_asking(
    conn: &Conn,
    desc: &'static CallDesc,
    args: &[u64],
    question: Option<&messages::Service>,
) -> (u64, Option<Asked>) {
    // SAFETY: forwarded contract.
    unsafe { call_full(conn, desc, args, question, None) }
}

/// [`call_asking`], with the bytes the call names where known ([`call_on_named`]).
///
/// # Safety
/// As [`prepare`].
unsafe fn call_full(
    conn: &Conn,
    desc: &'static CallDesc,
    args: &[u64],
    question: Option<&messages::Service>,
    named: Option<&[(u64, u64)]>,
) -> (u64, Option<Asked>) {
    if crate::state::managed_live()
        && let Some(ret) = managed_hint(desc, args)
    {
        crate::trace::local(desc.name);
        return (ret, None);
    }
    mirror_devices(conn, desc, args, named);
    // SAFETY: forwarded contract.
    let prepared = unsafe { prepare(conn, desc, args) };
    // A version or property asked before in this process, or by an earlier one on this
    // server: the same answer.
    let constant = constant_key(desc, args);
    if let Some(key) = &constant
        && let Some((ret, outs)) = crate::state::CLIENT.ahead.constants.get(key).or_else(|| {
            // SAFETY: the caller's arguments, as the descriptor says (forwarded contract).
            unsafe { learned_constant(desc, args, key, &prepared.outs) }
        })
    {
        for (target, bytes) in prepared.outs.iter().zip(&outs) {
            if target.ptr != 0 && bytes.len() == target.len {
                // SAFETY: the caller's output of `target.len` bytes, as the descriptor says
                // (the same call filled it before).
                unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), target.ptr as *mut u8, bytes.len()) };
            }
        }
        crate::trace::local(desc.name);
        return (ret, None);
    }
    // Size queries about descriptors set as before (cuDNN's legacy API, cuSPARSE's generic
    // API and cuSPARSELt's records, cuFFT's plans, cuSOLVER's workspaces) are answered here.
    let action = match desc.library {
        "cudnn" => cudnn_sizes::before(desc, args, &prepared),
        "cusparse" => sparse_sizes::before(desc, args, &prepared),
        "cusparselt" => sparselt_sizes::before(desc, &prepared),
        "cufft" => cufft_plans::before(desc, args, &prepared),
        "cusolver" => solver_sizes::before(desc, args, &prepared),
        _ => kept::Action::Send,
    };
    let learn = match action {
        kept::Action::Answered(ret) => return (ret, None),
        kept::Action::Learn(key) => Some(key),
        kept::Action::Send => None,
    };
    let seq = conn.next_seq();
    let waits = desc.waits();
    let slot = waits.then(|| conn.expect(seq, prepared.outs.clone()));
    let archive = messages::encode(&prepared.call);
    let header = prepared.header(desc, seq);
    let sent_bytes: usize = prepared.bulk.iter().map(|b| b.len()).sum::<usize>() + archive.len();
    let bulk: Vec<&[u8]> = prepared.bulk.iter().map(|b| b.as_ref()).collect();
    // Only a waiting call's time is traced (and read: the clock is not free on a hot path).
    let start = waits.then(Instant::now);
    let sent = if waits { conn.send(header, &archive, &bulk) } else { conn.post(header, &archive, &bulk) };
    if sent.is_err() {
        conn.forget(seq);
        return (unavailable(desc), None);
    }
    let asked = question.and_then(|q| conn.ask_ahead(q).ok());
    let Some(slot) = slot else {
        crate::trace::record(desc, sent_bytes, 0, None);
        // A graph or instance the client named is the program's from now on, as one the
        // server handed out.
        if facts(desc).hands_out_graphs {
            crate::state::CLIENT.ahead.graphs.handed_out(desc, args);
        }
        return (success(desc), asked);
    };
    let ret = match slot.wait() {
        Ok(r) => r,
        Err(_) => return (unavailable(desc), asked),
    };
    if let Some(key) = constant
        && answered(desc, ret)
    {
        let outs: Vec<Vec<u8>> = prepared
            .outs
            .iter()
            .map(|t| {
                if t.ptr == 0 {
                    return Vec::new();
                }
                // SAFETY: the caller's output of `t.len` bytes, which the reply just filled.
                unsafe { std::slice::from_raw_parts(t.ptr as *const u8, t.len) }.to_vec()
            })
            .collect();
        let value = encode_constant(ret, &outs);
        crate::learned::with(conn, |l| l.learn(Space::Constant, &learned_constant_key(desc, &key), &value));
        crate::state::CLIENT.ahead.constants.learn(key, (ret, outs));
    }
    if let Some(key) = learn {
        match desc.library {
            "cudnn" => cudnn_sizes::learn(key, ret, desc, &prepared),
            "cufft" => cufft_plans::learn(key, ret, desc, &prepared),
            "cusolver" => solver_sizes::learn(key, ret, desc, &prepared),
            "cusparse" => sparse_sizes::learn(key, ret, desc, &prepared),
            _ => sparselt_sizes::learn(key, ret, desc, &prepared),
        }
    }
    // Bytes of earlier asynchronous copies into pinned memory have landed before any
    // waiting call returns, and after a synchronization so have the GPU's writes into
    // mirrored memory.
    crate::state::wait_deferred();
    if crate::mirror::pending() && settles(desc, ret) {
        crate::mirror::pull(conn);
    }
    crate::trace::record(desc, sent_bytes, slot.received() as usize, start);
    // Each round trip in order (CHIDORI_LOG=chidori::waits=trace): what a workload waits for.
    tracing::trace!(target: "chidori::waits", "{} -> {ret}", desc.name);
    if ret == desc.codes.success as u64 && facts(desc).hands_out_graphs {
        crate::state::CLIENT.ahead.graphs.handed_out(desc, args);
    }
    // A deferred failure of an earlier asynchronous call surfaces here.
    if desc.ret == Ret::Status
        && ret == desc.codes.success as u64
        && let Some(status) = conn.take_deferred(desc.library)
    {
        return (status as u64, asked);
    }
    (ret, asked)
}

/// Send a call whose reply is processed in the background (an asynchronous copy into
/// pinned memory), waited for at the next synchronization; None where it could not be sent.
///
/// # Safety
/// As [`prepare`]; output buffers must stay valid until the reply has landed.
pub unsafe fn send_deferred(conn: &Conn, desc: &'static CallDesc, args: &[u64]) -> Option<()> {
    mirror_devices(conn, desc, args, None);
    // SAFETY: forwarded contract.
    let slot = unsafe { send_checked(conn, desc, args) }?;
    crate::state::defer(desc, slot);
    Some(())
}

/// Send a call without waiting, its reply to be checked by whoever holds the returned slot
/// (an answer the client gave from an earlier session, [`crate::ahead::learned`]): in order
/// with the thread's other calls, its outputs written where `args` point when it comes.
///
/// # Safety
/// As [`prepare`]; output buffers must stay valid until the slot completes.
pub unsafe fn send_checked(conn: &Conn, desc: &'static CallDesc, args: &[u64]) -> Option<Arc<Slot>> {
    // SAFETY: forwarded contract.
    let prepared = unsafe { prepare(conn, desc, args) };
    let seq = conn.next_seq();
    let slot = conn.expect(seq, prepared.outs.clone());
    let archive = messages::encode(&prepared.call);
    let bulk: Vec<&[u8]> = prepared.bulk.iter().map(|b| b.as_ref()).collect();
    if conn.post(prepared.header(desc, seq), &archive, &bulk).is_err() {
        conn.forget(seq);
        return None;
    }
    Some(slot)
}

/// Remember a failing status of the runtime API as the thread's last error.
pub fn note_status(desc: &CallDesc, ret: u64) {
    if desc.library == "cudart" && desc.ret == Ret::Status && ret != 0 {
        crate::state::set_last_error(ret as u32);
    }
}

/// `*GetErrorName`: the status's name, from the generated table of the caller's version.
pub fn error_name(version: &str, library: &str, value: i64) -> *const c_char {
    crate::guard::ffi("error_name", UNRECOGNIZED.as_ptr(), || {
        match status::table(version, library).and_then(|t| status::find(t, value)) {
            Some(s) => s.name.as_ptr().cast(),
            None => UNRECOGNIZED.as_ptr(),
        }
    })
}

/// A status's name or description into the caller's `const char*`, as the driver's
/// `cuGetErrorName`/`cuGetErrorString` and CUPTI's `cuptiGetResultString` answer: Some(true)
/// written, Some(false) an unknown code (NULL written), None where `out` is NULL.
///
/// # Safety
/// `out` is NULL or the caller's writable `const char*`.
pub unsafe fn write_status_text(
    version: &str,
    library: &str,
    value: i64,
    name: bool,
    out: *mut c_void,
) -> Option<bool> {
    if out.is_null() {
        return None;
    }
    let found = status::table(version, library).and_then(|t| status::find(t, value));
    let text = found.map_or(std::ptr::null(), |s| if name { s.name.as_ptr() } else { s.message.as_ptr() });
    // SAFETY: `out` is non-null and the caller's; the texts are NUL-terminated statics.
    unsafe { std::ptr::write_unaligned(out as *mut *const u8, text) };
    Some(found.is_some())
}

/// `*GetErrorString`: the status's one-sentence description. Where the library's header
/// documents no status (cuBLAS, cuSPARSE, cuSPARSELt, NCCL: the table holds only names), the
/// text is the server's library's own, asked once per library.
pub fn error_string(version: &'static str, library: &'static str, function: &'static str, value: i64) -> *const c_char {
    crate::guard::ffi("error_string", UNRECOGNIZED.as_ptr(), || {
        let Some(s) = status::table(version, library).and_then(|t| status::find(t, value)) else {
            return UNRECOGNIZED.as_ptr();
        };
        if s.message != s.name {
            return s.message.as_ptr().cast();
        }
        server_text(version, library, function, value).unwrap_or(s.message.as_ptr().cast())
    })
}

/// Status texts the server's libraries gave, per (CUDA version, library); None where the
/// server could not answer. Never emptied: the program keeps the pointers.
type ServerTexts = std::collections::BTreeMap<
    (&'static str, &'static str),
    Option<std::collections::BTreeMap<i64, std::ffi::CString>>,
>;
static SERVER_TEXTS: std::sync::Mutex<ServerTexts> = std::sync::Mutex::new(std::collections::BTreeMap::new());

fn server_text(version: &'static str, library: &'static str, function: &str, value: i64) -> Option<*const c_char> {
    let mut texts = SERVER_TEXTS.lock().unwrap_or_else(|p| p.into_inner());
    let known = match texts.entry((version, library)) {
        std::collections::btree_map::Entry::Occupied(e) => e.into_mut(),
        // Without a connection yet, the name serves and the server is asked next time.
        std::collections::btree_map::Entry::Vacant(e) => {
            e.insert(ask_texts(&*conn::existing()?, version, library, function))
        }
    };
    known.as_ref()?.get(&value).map(|t| t.as_ptr())
}

/// Every status text of `library` at `version`, from the server's library (`function` is
/// its error-string function).
fn ask_texts(
    conn: &Conn,
    version: &str,
    library: &str,
    function: &str,
) -> Option<std::collections::BTreeMap<i64, std::ffi::CString>> {
    let table = status::table(version, library)?;
    let values: Vec<i64> = table.iter().map(|s| s.value).collect();
    let request = messages::Service::StatusTexts {
        library: library.to_owned(),
        function: function.to_owned(),
        values: values.clone(),
    };
    match conn.service(&request, &[]) {
        Ok(messages::ServiceReply::Texts(texts)) if texts.len() == values.len() => Some(
            values
                .into_iter()
                .zip(texts)
                .filter(|(_, t)| !t.is_empty())
                .filter_map(|(v, t)| Some((v, std::ffi::CString::new(t).ok()?)))
                .collect(),
        ),
        other => {
            tracing::debug!("{function}: the server gave no status texts ({other:?})");
            None
        }
    }
}

static UNRECOGNIZED: &CStr = c"unrecognized error code";

/// Send the chunks of one large copy, each `(dst, src, count, …)`, back to back and then
/// wait for all their replies (the network stays full, no stop-and-wait per chunk; large
/// copies go over the bulk lanes). Returns the first failing status, or success.
///
/// # Safety
/// As [`prepare`], for every argument list.
pub unsafe fn call_pipelined(conn: &Conn, desc: &'static CallDesc, calls: &[Vec<u64>]) -> u64 {
    let bytes = calls.iter().filter_map(|a| a.get(2)).fold(0u64, |sum, n| sum.saturating_add(*n));
    if let Some(lanes) = crate::lanes::for_batch(conn, calls.len(), bytes) {
        // SAFETY: forwarded contract.
        return unsafe { call_on_lanes(conn, lanes, desc, calls) };
    }
    // SAFETY: forwarded contract.
    unsafe { call_batch(conn, desc, calls) }
}

/// Send several calls of one descriptor back to back and then wait for all their replies
/// (not a copy: on the session's own connection). Returns the first failing status, or
/// success.
///
/// # Safety
/// As [`prepare`], for every argument list.
pub unsafe fn call_batch(conn: &Conn, desc: &'static CallDesc, calls: &[Vec<u64>]) -> u64 {
    if !desc.waits() {
        for args in calls {
            // SAFETY: forwarded contract.
            let r = unsafe { call_on(conn, desc, args) };
            if r != success(desc) {
                return r;
            }
        }
        return success(desc);
    }
    let batch: Vec<(&'static CallDesc, &[u64])> = calls.iter().map(|a| (desc, a.as_slice())).collect();
    // SAFETY: forwarded contract.
    let rets = unsafe { call_all_settling(conn, &batch, desc.name, true) };
    first_status(conn, desc, rets)
}

/// The first failing status of a copy's chunks, else a deferred failure of an earlier call,
/// else success; unavailable when the server could not be reached (`rets` None).
fn first_status(conn: &Conn, desc: &'static CallDesc, rets: Option<Vec<u64>>) -> u64 {
    let Some(rets) = rets else { return unavailable(desc) };
    let first = rets.into_iter().find(|&r| r != success(desc)).unwrap_or(success(desc));
    if first == success(desc)
        && let Some(status) = conn.take_deferred(desc.library)
    {
        return status as u64;
    }
    first
}

/// One call prepared and handed to `send` as a frame.
struct Issued<'a> {
    /// The call's encoding and the caller's buffers it points at: alive as long as this.
    _prepared: Prepared<'a>,
    /// The reply's slot, for a form that waits.
    slot: Option<Arc<Slot>>,
    /// Bytes sent.
    sent: u64,
}

/// Prepare `args` of `desc` and pass its frame to `send` (the session's connection, or a
/// bulk lane); a frame that could not be sent is forgotten.
///
/// # Safety
/// As [`prepare`].
unsafe fn issue<'a>(
    conn: &Conn,
    desc: &'static CallDesc,
    args: &[u64],
    send: impl FnOnce(Header, &[u8], &[&[u8]]) -> Result<(), String>,
) -> Result<Issued<'a>, String> {
    mirror_devices(conn, desc, args, None);
    if desc.library == "cudnn" {
        cudnn_sizes::forget_passed(desc, args);
    }
    // SAFETY: forwarded contract.
    let prepared = unsafe { prepare(conn, desc, args) };
    let seq = conn.next_seq();
    let slot = desc.waits().then(|| conn.expect(seq, prepared.outs.clone()));
    let archive = messages::encode(&prepared.call);
    let sent = archive.len() as u64 + prepared.bulk.iter().map(|b| b.len() as u64).sum::<u64>();
    let bulk: Vec<&[u8]> = prepared.bulk.iter().map(|b| b.as_ref()).collect();
    if let Err(e) = send(prepared.header(desc, seq), &archive, &bulk) {
        conn.forget(seq);
        return Err(e);
    }
    Ok(Issued { _prepared: prepared, slot, sent })
}

/// Wait for the replies of calls sent together: their raw results (None: the server could
/// not be reached); then what follows a wait (deferred copies land, mirrors are pulled) and
/// the trace of one round trip of latency for all of them as `name` (`sent` bytes, and
/// what their replies carried).
/// `settled`: the calls were synchronous copies, which return once earlier work of their
/// stream is done (then mirrors are pulled).
fn finish(
    conn: &Conn,
    slots: Vec<Arc<Slot>>,
    name: &'static str,
    sent: u64,
    start: Instant,
    settled: bool,
) -> Option<Vec<u64>> {
    let calls = slots.len();
    let mut rets = Vec::with_capacity(calls);
    let mut received = 0;
    for slot in slots {
        rets.push(slot.wait().ok()?);
        received += slot.received();
    }
    crate::state::wait_deferred();
    if settled {
        crate::mirror::pull(conn);
    }
    crate::trace::bytes(name, u64::from(calls > 0), sent, received, start.elapsed());
    tracing::trace!(target: "chidori::waits", "{name} -> {calls} calls in one round trip");
    Some(rets)
}

/// The chunks of one large copy (`calls` of `desc`, whose third argument is the byte
/// count) over the bulk lanes, several at once; then, for a waiting form, every reply.
/// Returns the first failing status, or success.
///
/// # Safety
/// As [`prepare`], for every argument list; buffers stay valid until this returns.
unsafe fn call_on_lanes(conn: &Conn, lanes: &crate::lanes::Lanes, desc: &'static CallDesc, calls: &[Vec<u64>]) -> u64 {
    let start = Instant::now();
    let mut slots = Vec::with_capacity(calls.len());
    // Every chunk's encoding (and the caller's memory it points at) lives until the drain.
    let mut issued = Vec::with_capacity(calls.len());
    let mut sent = 0u64;
    let mut failed = false;
    for args in calls {
        // SAFETY: forwarded contract; `issued` keeps the preparation until the lanes wrote it.
        let result =
            unsafe { issue(conn, desc, args, |header, archive, bulk| lanes.send(conn, header, archive, bulk)) };
        match result {
            Ok(mut i) => {
                if !desc.waits() {
                    // Traced per chunk, as each call sent without waiting is.
                    crate::trace::record(desc, i.sent as usize, 0, None);
                }
                sent += i.sent;
                slots.extend(i.slot.take());
                issued.push(i);
            }
            Err(reason) => {
                // The server may wait for a frame that will not come: the session is over.
                conn.lane_lost(reason);
                failed = true;
                break;
            }
        }
    }
    let drained = lanes.drain();
    drop(issued);
    if let Err(reason) = drained {
        conn.lane_lost(reason);
        return unavailable(desc);
    }
    if failed {
        return unavailable(desc);
    }
    if !desc.waits() {
        return success(desc);
    }
    first_status(conn, desc, finish(conn, slots, desc.name, sent, start, true))
}

/// Send waiting calls back to back, in order, then wait for every reply: one round trip of
/// latency for all, traced as one call of `name`. Each call's raw result, or None when the
/// server could not be reached. Reports no deferred status (the caller decides which of
/// the calls is the program's own).
///
/// # Safety
/// As [`prepare`], for every call; output buffers stay valid until this returns.
pub unsafe fn call_all(conn: &Conn, calls: &[(&'static CallDesc, &[u64])], name: &'static str) -> Option<Vec<u64>> {
    // SAFETY: forwarded contract.
    unsafe { call_all_settling(conn, calls, name, false) }
}

/// [`call_all`]; `settled`: the calls are chunks of a copy the program waits for (see
/// [`finish`]).
///
/// # Safety
/// As [`call_all`].
unsafe fn call_all_settling(
    conn: &Conn,
    calls: &[(&'static CallDesc, &[u64])],
    name: &'static str,
    settled: bool,
) -> Option<Vec<u64>> {
    let start = Instant::now();
    let mut slots = Vec::with_capacity(calls.len());
    let mut sent = 0u64;
    for &(desc, args) in calls {
        debug_assert!(desc.waits(), "{} is sent without waiting", desc.name);
        // SAFETY: forwarded contract.
        let i = unsafe { issue(conn, desc, args, |header, archive, bulk| conn.send(header, archive, bulk)) }.ok()?;
        sent += i.sent;
        slots.extend(i.slot);
    }
    finish(conn, slots, name, sent, start, settled)
}

/// [`call_all`] where the first call is the program's own and the others ride with it: the
/// program's status, in which a deferred failure of an earlier asynchronous call surfaces
/// as in [`call_on`], and every call's raw result. None when the server could not be reached.
///
/// # Safety
/// As [`call_all`].
pub unsafe fn call_with_riders(
    conn: &Conn,
    calls: &[(&'static CallDesc, &[u64])],
    name: &'static str,
) -> Option<(u64, Vec<u64>)> {
    let &(desc, _) = calls.first()?;
    // SAFETY: forwarded contract.
    let rets = unsafe { call_all(conn, calls, name) }?;
    let mut status = rets[0];
    if desc.ret == Ret::Status
        && status == desc.codes.success as u64
        && let Some(deferred) = conn.take_deferred(desc.library)
    {
        status = deferred as u64;
    }
    Some((status, rets))
}

#[cfg(test)]
mod tests {
    use std::ffi::CStr;

    /// A constant kept for later processes reads back as it was; a record cut short reads as
    /// nothing, or as fewer outputs than the call has (which `learned_constant` does not
    /// give: the call is asked of the server again).
    #[test]
    fn kept_constants_read_back_whole_or_not_at_all() {
        let outs = vec![b"580.95.05\0".to_vec(), Vec::new(), vec![7, 0, 0, 0]];
        let bytes = super::encode_constant(3, &outs);
        assert_eq!(super::decode_constant(&bytes), Some((3, outs)));
        assert_eq!(super::decode_constant(&super::encode_constant(0, &[])), Some((0, Vec::new())));
        for cut in 1..bytes.len() {
            let read = super::decode_constant(&bytes[..cut]);
            assert!(read.as_ref().is_none_or(|(_, o)| o.len() < 3), "{cut}: {read:?}");
        }
        let key = |form| {
            let mut desc = chidori_cuda::calls::nvml::nvmlSystemGetDriverVersion;
            desc.form = form;
            super::learned_constant_key(&desc, &(desc.wire, vec![1, 80]))
        };
        assert_ne!(key(None), key(Some(chidori_protocol::desc::Form::Call)), "the form is part of the key");
    }

    #[test]
    fn versions_and_properties_are_kept_by_their_values_and_nothing_else_is() {
        use chidori_cuda::calls::{cublas, cudart, nvml};
        let mut value = 0i32;
        let out = &mut value as *mut i32 as u64;
        // (type, int *value): the type is the key, the pointer only as NULL or not.
        let key = super::constant_key(&cublas::cublasGetProperty, &[1, out]);
        assert_eq!(key, Some((cublas::cublasGetProperty.wire, vec![1, 1])));
        assert_eq!(super::constant_key(&cublas::cublasGetProperty, &[1, 0]).map(|k| k.1), Some(vec![1, 0]));
        // The _v2 entry point of a constant function is constant too.
        assert!(super::constant_key(&cublas::cublasGetVersion_v2, &[0x10, out]).is_some());
        // A string out of a length the caller gives: the length is part of the key.
        let key = super::constant_key(&nvml::nvmlSystemGetDriverVersion, &[out, 80]);
        assert_eq!(key.map(|k| k.1), Some(vec![1, 80]));
        // Calls whose answers change are never kept.
        assert_eq!(super::constant_key(&cudart::cudaMalloc__call, &[out, 4096]), None);
        assert_eq!(super::constant_key(&cudart::cudaMemGetInfo, &[out, out]), None);
    }

    #[test]
    fn an_untyped_scalar_at_the_end_of_memory_is_read_without_faulting() {
        // SAFETY: two fresh pages; the second is unmapped at once, so reading past the end
        // of the first would fault.
        let page = unsafe {
            let p = libc::mmap(
                std::ptr::null_mut(),
                8192,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            assert_ne!(p, libc::MAP_FAILED);
            libc::munmap((p as *mut u8).add(4096).cast(), 4096);
            p as *mut u8
        };
        let at = page.wrapping_add(4092);
        // SAFETY: the last four bytes of the mapped page.
        unsafe { std::ptr::write_unaligned(at as *mut f32, 1.5) };
        // SAFETY: a readable 4-byte scalar, read as the 16 an untyped one travels as.
        let bytes = unsafe { super::host_scalar(at as u64, 16) };
        assert_eq!(&bytes[..4], &1.5f32.to_le_bytes());
        assert_eq!(&bytes[4..], &[0u8; 12]);
        // A scalar in the middle of a page is borrowed as it is.
        let mid = page.wrapping_add(100);
        // SAFETY: 16 readable bytes in the middle of the page.
        assert!(matches!(unsafe { super::host_scalar(mid as u64, 16) }, std::borrow::Cow::Borrowed(_)));
        // SAFETY: the page mapped above.
        unsafe { libc::munmap(page.cast(), 4096) };
    }

    #[test]
    fn gemm_ex_scalars_have_the_compute_types_precision_and_ctypes_complexity() {
        use chidori_cuda::calls::cublas::cublasGemmEx as gemm;
        use chidori_cuda::consts::{cublasComputeType_t as compute, cudaDataType_t as data};
        use chidori_protocol::desc::Wire;
        let alpha = gemm.params.iter().position(|w| matches!(w, Wire::Scalar { .. })).unwrap();
        let bytes = |compute_type: u32, c_type: u32| {
            let mut args = [0u64; 19];
            args[15] = u64::from(c_type);
            args[17] = u64::from(compute_type);
            chidori_protocol::codec::scalar_bytes(&gemm.params[alpha], &args)
        };
        assert_eq!(bytes(compute::CUBLAS_COMPUTE_32F, data::CUDA_R_16F), Some(4));
        assert_eq!(bytes(compute::CUBLAS_COMPUTE_32F_FAST_TF32, data::CUDA_R_32F), Some(4));
        assert_eq!(bytes(compute::CUBLAS_COMPUTE_16F, data::CUDA_R_16F), Some(2));
        assert_eq!(bytes(compute::CUBLAS_COMPUTE_64F, data::CUDA_C_64F), Some(16));
        assert_eq!(bytes(compute::CUBLAS_COMPUTE_32F, data::CUDA_C_16F), Some(8));
        assert_eq!(bytes(compute::CUBLAS_COMPUTE_32I, data::CUDA_R_32I), Some(4));
        // A legacy cudaDataType compute type: 8 bytes a component, never fewer than it needs.
        assert_eq!(bytes(data::CUDA_R_64F, data::CUDA_R_64F), Some(8));
        assert_eq!(bytes(data::CUDA_C_64F, data::CUDA_C_64F), Some(16));
    }

    #[test]
    fn status_texts_are_written_where_the_caller_asks() {
        let mut out: *const std::ffi::c_char = std::ptr::null();
        let slot = (&mut out as *mut *const std::ffi::c_char).cast();
        // SAFETY (all): `slot` is a valid `const char*` slot, or NULL.
        assert_eq!(unsafe { super::write_status_text("13.1", "driver", 2, true, slot) }, Some(true));
        // SAFETY: a NUL-terminated static from the table.
        assert_eq!(unsafe { CStr::from_ptr(out) }.to_str().unwrap(), "CUDA_ERROR_OUT_OF_MEMORY");
        assert_eq!(unsafe { super::write_status_text("13.1", "driver", 2, false, slot) }, Some(true));
        // SAFETY: as above.
        assert_ne!(unsafe { CStr::from_ptr(out) }.to_str().unwrap(), "CUDA_ERROR_OUT_OF_MEMORY", "the description");
        assert_eq!(unsafe { super::write_status_text("13.1", "driver", 123_456, true, slot) }, Some(false));
        assert!(out.is_null(), "an unknown code's text is NULL");
        assert_eq!(unsafe { super::write_status_text("13.1", "driver", 2, true, std::ptr::null_mut()) }, None);
    }

    #[test]
    fn error_names_come_from_the_callers_version() {
        // SAFETY: error_name returns pointers to NUL-terminated static strings.
        let name = |version, library, value| unsafe { CStr::from_ptr(super::error_name(version, library, value)) };
        assert_eq!(name("13.0", "cudart", 2).to_str().unwrap(), "cudaErrorMemoryAllocation");
        assert_eq!(name("12.6", "cudnn", 3000).to_str().unwrap(), "CUDNN_STATUS_NOT_SUPPORTED");
        assert_eq!(name("12.1", "cudnn", 9).to_str().unwrap(), "CUDNN_STATUS_NOT_SUPPORTED");
        assert_eq!(name("13.0", "cudart", 123_456).to_str().unwrap(), "unrecognized error code");
    }

    /// The calls whose graphs and instances the client follows to their destroy: those
    /// that make them, never a getter's (a child graph, a node's graph).
    #[test]
    fn only_calls_that_make_graphs_hand_them_out() {
        let mut names: Vec<&str> = chidori_cuda::calls::VARIANTS
            .iter()
            .filter(|d| super::Facts::of(d).hands_out_graphs)
            .map(|d| d.name)
            .collect();
        names.sort_unstable();
        names.dedup();
        let makers = [
            "cudaGraphCreate",
            "cuGraphCreate",
            "cudaStreamEndCapture",
            "cuStreamEndCapture",
            "cudaGraphClone",
            "cuGraphClone",
            "cudaGraphInstantiate",
            "cuGraphInstantiate",
        ];
        for name in &names {
            assert!(makers.iter().any(|m| name.starts_with(m)), "{name} hands out graphs");
        }
        for must in [
            "cudaGraphCreate",
            "cudaStreamEndCapture",
            "cudaGraphClone",
            "cudaGraphInstantiate",
            "cuGraphInstantiateWithFlags",
        ] {
            assert!(names.contains(&must), "{must} is not followed: {names:?}");
        }
    }
}
