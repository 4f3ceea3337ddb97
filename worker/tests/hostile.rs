//! Hostile calls against a session without a socket ([`Harness`], the emulated backend):
//! every generated descriptor with NULL pointers, random and mutated arguments, frames in
//! pieces. None may panic or raise a signal; refusals carry the library's status.
//!
//! The long run: `CHIDORI_FUZZ_CASES=1000000 cargo test --release -p chidori-worker --test
//! hostile random_calls -- --nocapture` (the default is a few thousand, for CI).

use std::panic::AssertUnwindSafe;

use chidori_cuda::calls::VARIANTS;
use chidori_protocol::desc::{CallDesc, DEVICE_LEN, Form, Wire};
use chidori_protocol::frame::{self, Frame, Header, Kind};
use chidori_protocol::messages::{self, Call, NULL_LEN, Reply};
use chidori_worker::fuzz;
use chidori_worker::session::Harness;

/// Cases of the random run: `CHIDORI_FUZZ_CASES`, else `default`.
fn cases(default: u64) -> u64 {
    std::env::var("CHIDORI_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// xorshift64*: a seeded generator, so a failing case can be run again.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

fn frame_of(desc: &CallDesc, args: Vec<u64>, lens: Vec<u64>, bulk: &[u8]) -> Frame {
    let call = Call { args, lens };
    let bytes = frame::to_vec(Header::new(Kind::Call, desc.wire, 1, 1), &messages::encode(&call), &[bulk]).unwrap();
    Frame::decode(&bytes).unwrap().0
}

/// Run a frame; a panic is a failure naming the descriptor.
fn survive(harness: &Harness, desc: &CallDesc, frame: &Frame) -> Result<(), String> {
    match std::panic::catch_unwind(AssertUnwindSafe(|| harness.run(frame))) {
        Ok(_) => Ok(()),
        Err(_) => Err(format!("{} (wire {}, form {:?}) panicked", desc.name, desc.wire, desc.form)),
    }
}

#[test]
fn every_descriptor_survives_null_pointers() {
    let harness = fuzz::emulated_harness();
    let (_, base) = malloc(&harness, 1 << 20);
    let mut failures = Vec::new();
    for desc in VARIANTS {
        // Small counts (so lengths evaluate), then large ones; every host pointer NULL, and
        // device addresses NULL, made up, or the session's own (so the call gets past the
        // device checks to the NULLs).
        for value in [0u64, 1, 7, u64::MAX, 0x7e00_dead_0000] {
            for device in [0, value, base] {
                let args = desc.params.iter().map(|w| if *w == Wire::Device { device } else { value }).collect();
                let lens = desc
                    .params
                    .iter()
                    .map(|w| match w {
                        Wire::Buf { .. }
                        | Wire::Handles { .. }
                        | Wire::Scalar { .. }
                        | Wire::Str
                        | Wire::OutHandle { .. } => NULL_LEN,
                        _ => 0,
                    })
                    .collect();
                if let Err(e) = survive(&harness, desc, &frame_of(desc, args, lens, &[])) {
                    failures.push(e);
                }
            }
        }
    }
    assert!(failures.is_empty(), "{} descriptors failed:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn random_calls_never_crash_the_worker() {
    let total = cases(4000);
    let mut rng = Rng(0x5eed_c41d_0123_4567);
    let mut harness = fuzz::emulated_harness();
    let started = std::time::Instant::now();
    // Outcomes: refused as malformed (would end the session), answered with a status.
    let (mut refused, mut answered, mut succeeded) = (0u64, 0u64, 0u64);
    for case in 0..total {
        // A fresh session now and then: state (handles, memory) accumulates within one.
        if case % 20_000 == 19_999 {
            harness = fuzz::emulated_harness();
        }
        let len = (rng.next() % 160) as usize + 2;
        let data = rng.bytes(len);
        let Some(frame) = fuzz::call_frame(&harness, &data) else { continue };
        let desc = VARIANTS[frame.header.call as usize];
        let before = harness.replied();
        match std::panic::catch_unwind(AssertUnwindSafe(|| harness.run(&frame))) {
            Err(_) => panic!("case {case}: {} (wire {}) panicked; input {data:02x?}", desc.name, desc.wire),
            Ok(Err(_)) => refused += 1,
            Ok(Ok(())) => {
                answered += 1;
                let status = harness.last_reply().filter(|_| harness.replied() > before).and_then(|r| {
                    (r.header.kind == Kind::Reply).then(|| messages::decode::<Reply>(&r, "reply").ok()).flatten()
                });
                if status.is_some_and(|r| r.ret as i64 == desc.codes.success) || harness.replied() == before {
                    succeeded += 1;
                }
            }
        }
    }
    eprintln!(
        "{total} random calls in {:.1} s, no crash: {refused} refused as malformed, {answered} answered \
         ({succeeded} of them successfully)",
        started.elapsed().as_secs_f64()
    );
}

#[test]
fn frames_in_pieces_never_crash_the_reader() {
    let mut rng = Rng(0xf00d_1234_abcd_ef01);
    for _ in 0..cases(4000) {
        let len = (rng.next() % 300) as usize;
        let mut data = rng.bytes(len);
        // Half of them start with a valid header, so the archive and bulk paths run too.
        if rng.next().is_multiple_of(2) {
            let mut h = Header::new(Kind::Call, 1, 1, 1);
            h.archive_len = (rng.next() % 64) as u32;
            h.bulk_len = (rng.next() % (1 << 28)) as u32;
            let mut framed = h.encode().to_vec();
            framed.append(&mut data);
            data = framed;
        }
        fuzz::frame_reader(&data);
        chidori_protocol::fuzz::server_messages(&data);
        chidori_protocol::fuzz::client_messages(&data);
        fuzz::raw_frame(&data);
    }
}

fn newest(name: &str, form: Option<Form>) -> &'static CallDesc {
    VARIANTS.iter().rev().find(|d| d.name == name && d.form == form).copied().unwrap_or_else(|| panic!("{name}"))
}

fn ret_of(harness: &Harness, desc: &CallDesc, args: Vec<u64>, lens: Vec<u64>, bulk: &[u8]) -> i64 {
    harness.run(&frame_of(desc, args, lens, bulk)).unwrap();
    let reply = harness.last_reply().expect("a reply");
    assert_eq!(reply.header.kind, Kind::Reply);
    messages::decode::<Reply>(&reply, "reply").unwrap().ret as i64
}

/// Allocate `bytes` with cudaMalloc: the device address.
fn malloc(harness: &Harness, bytes: u64) -> (i64, u64) {
    let desc = newest("cudaMalloc", Some(Form::Call));
    harness.run(&frame_of(desc, vec![0, bytes], vec![8, 0], &[])).unwrap();
    let reply = harness.last_reply().unwrap();
    let r: Reply = messages::decode(&reply, "reply").unwrap();
    let address = reply.bulk.get(..8).map(|b| u64::from_le_bytes(b.try_into().unwrap())).unwrap_or(0);
    (r.ret as i64, address)
}

/// A 2D copy's host rows travel packed: a host pitch larger than the width (which would
/// have the library write past the worker's `width × height` buffer) is taken as the width.
#[test]
fn a_packed_host_side_keeps_its_pitch() {
    let harness = fuzz::emulated_harness();
    let (_, base) = malloc(&harness, 1 << 16);
    let d2h = newest("cudaMemcpy2D", Some(Form::D2h));
    let h2d = newest("cudaMemcpy2D", Some(Form::H2d));
    // 2 rows of 4 bytes, the host pitch claimed as 1 MiB; the device pitch 64.
    let rows: Vec<u8> = (1..=8).collect();
    let up = vec![base, 64, 0, 1 << 20, 4, 2, 1];
    harness.run(&frame_of(h2d, up, vec![0, 0, 8, 0, 0, 0, 0], &rows)).unwrap();
    let down = vec![0, 1 << 20, base, 64, 4, 2, 2];
    assert_eq!(ret_of(&harness, d2h, down, vec![8, 0, 0, 0, 0, 0, 0], &[]), d2h.codes.success);
    let reply = harness.last_reply().unwrap();
    assert!(reply.bulk.ends_with(&rows), "{:?}", reply.bulk);
}

#[test]
fn device_addresses_must_be_the_sessions_own() {
    let harness = fuzz::emulated_harness();
    let d2h = newest("cudaMemcpy", Some(Form::D2h));
    let invalid = d2h.codes.invalid_value;
    let copy = |src: u64, n: u64| ret_of(&harness, d2h, vec![0, src, n, 2], vec![n, 0, 0, 0], &[]);
    // A made-up address, and one a handle's value would be (worker heap).
    assert_eq!(copy(0x7e00_dead_0000, 16), invalid);
    let heap = Box::new(0u64);
    assert_eq!(copy(&*heap as *const u64 as u64, 8), invalid, "a pointer into the worker's heap");
    let (status, base) = malloc(&harness, 4096);
    assert_eq!(status, 0);
    assert_eq!(copy(base, 4096), 0, "inside the allocation");
    assert_eq!(copy(base + 4000, 96), 0);
    assert_eq!(copy(base + 4000, 97), invalid, "one byte past its end");
    // A driver copy between device addresses, and a device-mode scalar, likewise.
    let dtod = newest("cuMemcpyDtoD_v2", None);
    harness.run(&frame_of(dtod, vec![base, 0x1000, 16], vec![0, 0, 0], &[])).unwrap();
    let err = harness.last_reply().unwrap();
    assert_eq!(err.header.kind, Kind::AsyncError, "an async call's refusal comes back as an AsyncError");
    let e: messages::AsyncError = messages::decode(&err, "async error").unwrap();
    assert_eq!(e.status, dtod.codes.invalid_value);
    // A batched stream memory operation's word: a write into a made-up address is refused
    // before the driver; one into the session's memory gets past the check (the emulated
    // driver then answers what it answers, not a refusal of the address).
    let batch = newest("cuStreamBatchMemOp_v2", None);
    let write = |address: u64| {
        let mut op = vec![0u8; 48];
        op[..4].copy_from_slice(&2u32.to_le_bytes());
        op[8..16].copy_from_slice(&address.to_le_bytes());
        harness.run(&frame_of(batch, vec![0, 1, 0, 0], vec![0, 0, 48, 0], &op)).unwrap();
        match harness.last_reply() {
            Some(r) if r.header.kind == Kind::AsyncError => {
                messages::decode::<messages::AsyncError>(&r, "async error").unwrap().status
            }
            _ => 0,
        }
    };
    assert_eq!(write(0x7e00_dead_0000), batch.codes.invalid_value, "a word outside the session");
    assert_eq!(write(base + 4094), batch.codes.invalid_value, "a word across the allocation's end");
    assert_ne!(write(base + 4092), batch.codes.invalid_value, "the session's own word");
    // A single stream write names its word by its size; a free, an advice, a reserved
    // range's free and a managed attachment name their address.
    let single = newest("cuStreamWriteValue32_v2", None);
    let write32 = |address: u64| ret_of(&harness, single, vec![0, address, 7, 0], vec![0, 0, 0, 0], &[]);
    assert_eq!(write32(0x7e00_dead_0000), single.codes.invalid_value, "a word outside the session");
    assert_eq!(write32(base + 4094), single.codes.invalid_value, "a word across the allocation's end");
    assert_ne!(write32(base + 4092), single.codes.invalid_value, "the session's own word");
    let forms = [
        ("cuMemFreeAsync", Some(Form::Call)),
        ("cuMemAdvise", None),
        ("cuMemAddressFree", None),
        ("cuStreamAttachMemAsync", None),
    ];
    for (name, form) in forms {
        let desc = newest(name, form);
        let at = desc.params.iter().position(|w| matches!(w, Wire::Device)).expect(name);
        let mut args = vec![0u64; desc.params.len()];
        args[at] = &*heap as *const u64 as u64;
        harness.run(&frame_of(desc, args, vec![0; desc.params.len()], &[])).unwrap();
        let reply = harness.last_reply().unwrap();
        let status = if reply.header.kind == Kind::AsyncError {
            messages::decode::<messages::AsyncError>(&reply, "async error").unwrap().status
        } else {
            messages::decode::<Reply>(&reply, "reply").unwrap().ret as i64
        };
        assert_eq!(status, desc.codes.invalid_value, "{name} of a pointer into the worker's heap");
    }
    let _ = DEVICE_LEN;
}

/// A handle reaches the client as a session id, never the library's pointer; the id works
/// where the handle is taken, a value next to it does not, and a destroyed one is stale.
#[test]
fn handles_reach_the_client_as_session_ids() {
    let harness = fuzz::emulated_harness();
    let create = newest("cudaStreamCreate", Some(Form::Call));
    assert_eq!(ret_of(&harness, create, vec![0], vec![8], &[]), 0);
    let reply = harness.last_reply().unwrap();
    let stream = u64::from_le_bytes(reply.bulk[..8].try_into().unwrap());
    assert_eq!(
        stream & chidori_protocol::desc::HANDLE_TAG_MASK,
        chidori_protocol::desc::WORKER_ID_TAG,
        "{stream:#x} is a session id"
    );
    assert!((stream as i64) > 0, "{stream:#x} is positive as an intptr_t (Python bindings refuse a negative handle)");
    let sync = newest("cudaStreamSynchronize", Some(Form::Call));
    assert_eq!(ret_of(&harness, sync, vec![stream], vec![0], &[]), 0);
    assert_eq!(ret_of(&harness, sync, vec![stream + 1], vec![0], &[]), sync.codes.invalid_handle);
    assert_eq!(ret_of(&harness, sync, vec![1], vec![0], &[]), 0, "the legacy stream is no handle to map");
    let destroy = newest("cudaStreamDestroy", None);
    assert_eq!(ret_of(&harness, destroy, vec![stream], vec![0], &[]), 0);
    assert_eq!(ret_of(&harness, sync, vec![stream], vec![0], &[]), sync.codes.invalid_handle, "stale");
    // A create sent without waiting carries the client's name for the stream; a second
    // create of the same name, or one of a worker id's form, names nothing new.
    let named = newest("cudaStreamCreate", Some(Form::Async));
    let name = chidori_protocol::desc::CLIENT_NAME_TAG | 77;
    harness.run(&frame_of(named, vec![name], vec![8], &[])).unwrap();
    assert_eq!(ret_of(&harness, sync, vec![name], vec![0], &[]), 0, "the client's name maps to its stream");
    let _ = harness.run(&frame_of(named, vec![name], vec![8], &[]));
    let _ = harness.run(&frame_of(named, vec![stream | 1], vec![8], &[]));
    assert_eq!(ret_of(&harness, sync, vec![stream | 1], vec![0], &[]), sync.codes.invalid_handle);
    assert_eq!(ret_of(&harness, destroy, vec![name], vec![0], &[]), 0);
    assert_eq!(ret_of(&harness, create, vec![0], vec![8], &[]), 0);
    let again = u64::from_le_bytes(harness.last_reply().unwrap().bulk[..8].try_into().unwrap());
    assert_ne!(again, stream, "an id is never given twice");
}

/// A host function travels as the client's number for it: 0 (no function) is refused before
/// the library would call it; a numbered one runs, and its request to the client (sent from
/// the library's thread) is not taken for the call's answer.
#[test]
fn a_host_function_must_be_named() {
    let harness = fuzz::emulated_harness();
    for name in ["cudaLaunchHostFunc", "cudaStreamAddCallback"] {
        let desc = newest(name, Some(Form::Host));
        let lens = vec![0; desc.params.len()];
        let mut args = vec![0; desc.params.len()];
        harness.run(&frame_of(desc, args.clone(), lens.clone(), &[])).unwrap();
        let reply: Reply = messages::decode(&harness.last_reply().expect("a reply"), "reply").unwrap();
        assert_eq!(reply.ret as i64, desc.codes.invalid_value, "{name}: {:?}", reply.error);
        assert!(reply.error.unwrap_or_default().contains("no host function"), "{name}");
        args[1] = 5;
        harness.run(&frame_of(desc, args, lens, &[])).unwrap();
        let reply: Reply = messages::decode(&harness.last_reply().expect("a reply"), "reply").unwrap();
        assert_eq!(reply.ret as i64, desc.codes.success, "{name}: {:?}", reply.error);
    }
}

/// An NVML record's version names the struct the library writes: one naming a larger struct
/// than the record sent is refused before the library sees it.
#[test]
fn nvml_versions_naming_larger_records_are_refused() {
    let harness = fuzz::emulated_harness();
    let desc = newest("nvmlDeviceGetGpuFabricInfoV", Some(Form::Call));
    let Some(Wire::Buf { record: Some(record), .. }) = desc.params.get(1) else { panic!("{desc:?}") };
    let size = chidori_cuda::structs::get(desc.versions.last().unwrap(), record).unwrap().size;
    // A device of the session (the emulated backend has no NVML to ask for one).
    let device = harness.adopt_handle(chidori_cuda::handles::kind::nvmlDevice_st, 0x5000);
    // The status, and the reason the worker gave.
    let call = |version: u32| {
        let mut bytes = vec![0u8; size as usize];
        bytes[..4].copy_from_slice(&version.to_le_bytes());
        harness.run(&frame_of(desc, vec![device, 0], vec![0, u64::from(size)], &bytes)).unwrap();
        let reply: Reply = messages::decode(&harness.last_reply().expect("a reply"), "reply").unwrap();
        (reply.ret as i64, reply.error.unwrap_or_default())
    };
    let (ret, why) = call((size + 4) | (3 << 24));
    assert_eq!(ret, desc.codes.invalid_value, "a version naming a larger struct: {why}");
    assert!(why.contains("larger than"), "{why}");
    let (_, why) = call(size | (3 << 24));
    assert!(!why.contains("larger than"), "the version of the struct sent passes: {why}");
}

/// NULL is never a library context or a descriptor marked `never_null`: refused with the
/// library's code before the library (which would dereference it) sees it; NULL streams
/// (the default stream) still pass.
#[test]
fn null_contexts_are_refused_before_the_library() {
    let harness = fuzz::emulated_harness();
    for name in ["cusolverDnSetStream", "cusparseDestroy", "nvmlDeviceGetUtilizationRates", "cublasSetStream_v2"] {
        let desc = newest(name, None);
        let lens = desc.params.iter().map(|w| if matches!(w, Wire::Handle { .. }) { 0 } else { NULL_LEN }).collect();
        harness.run(&frame_of(desc, vec![0; desc.params.len()], lens, &[])).unwrap();
        let (status, why) = answer(&harness);
        assert_eq!(status, desc.codes.invalid_handle, "{name}: {why}");
        assert!(why.contains("0x0 is not a"), "{name}: {why}");
    }
    // A record the library reads unchecked is refused as NULL too (`in[1]` in the spec), and
    // passes when present.
    for name in ["cudaStreamSetAttribute", "nvmlDeviceQueryDrainState"] {
        let desc = newest(name, None);
        let status = |present: bool| {
            let mut bulk = Vec::new();
            let lens = desc
                .params
                .iter()
                .map(|w| match *w {
                    Wire::Buf { dir: chidori_protocol::desc::Dir::Out, elem, .. } => u64::from(elem),
                    Wire::Buf { elem, .. } if present => {
                        bulk.extend(std::iter::repeat_n(0u8, elem as usize));
                        u64::from(elem)
                    }
                    Wire::Buf { .. } => NULL_LEN,
                    _ => 0,
                })
                .collect();
            let args = desc.params.iter().map(|w| if matches!(w, Wire::Val { .. }) { 1 } else { 0 }).collect();
            ret_of(&harness, desc, args, lens, &bulk)
        };
        assert_eq!(status(false), desc.codes.invalid_value, "{name} with NULL");
        assert_ne!(status(true), desc.codes.invalid_value, "{name} with its record");
    }
    // A function that does not use its context takes NULL for it (`null_ok`: JAX asks
    // cuBLAS's version with NULL, and falls back to the CPU if refused).
    let version = newest("cublasGetVersion_v2", None);
    harness.run(&frame_of(version, vec![0, 0], vec![0, 4], &[])).unwrap();
    let (status, why) = answer(&harness);
    assert_ne!(status, version.codes.invalid_handle, "cublasGetVersion_v2(NULL): {why}");
    assert!(why.contains("not emulated"), "cublasGetVersion_v2(NULL) reaches the library: {why}");
    // NCCL's destroy and abort do nothing with NULL (cleanup code calls them regardless).
    for name in ["ncclCommDestroy", "ncclCommAbort"] {
        let desc = newest(name, None);
        harness.run(&frame_of(desc, vec![0], vec![0], &[])).unwrap();
        let (status, why) = answer(&harness);
        assert_eq!((status, why.as_str()), (desc.codes.success, ""), "{name}(NULL)");
    }
    // A handle parameter the spec says is never NULL (`required`), of a kind that may be.
    let derive = newest("cudnnDeriveBNTensorDescriptor", None);
    assert_eq!(ret_of(&harness, derive, vec![0, 0, 1], vec![0; 3], &[]), derive.codes.invalid_value);
    let reply: Reply = messages::decode(&harness.last_reply().expect("a reply"), "reply").unwrap();
    assert!(reply.error.as_deref().unwrap_or_default().contains("may not be NULL"), "{:?}", reply.error);
    let sync = newest("cudaStreamQuery", None);
    assert_eq!(ret_of(&harness, sync, vec![0], vec![0], &[]), sync.codes.success, "the default stream");
    // A parameter set a solver takes as NULL (its defaults: torch's QR passes NULL) reaches
    // the library; the functions on the set itself refuse NULL.
    let context = harness.adopt_handle(chidori_cuda::handles::kind::cusolverDnContext, 0x6000);
    let qr = newest("cusolverDnXgeqrf_bufferSize", None);
    let mut args = vec![0; qr.params.len()];
    args[0] = context;
    let lens = qr.params.iter().map(|w| if matches!(w, Wire::Buf { .. }) { 8 } else { 0 }).collect();
    harness.run(&frame_of(qr, args, lens, &[])).unwrap();
    let (_, why) = answer(&harness);
    assert!(!why.contains("0x0 is not a"), "{why}");
    let destroy = newest("cusolverDnDestroyParams", None);
    harness.run(&frame_of(destroy, vec![0], vec![0], &[])).unwrap();
    let (status, why) = answer(&harness);
    assert_eq!(status, destroy.codes.invalid_value, "{why}");
    assert!(why.contains("may not be NULL"), "{why}");
}

/// The status and the reason of the last call's answer: its reply, or the asynchronous error
/// of a call sent without waiting.
fn answer(harness: &Harness) -> (i64, String) {
    let frame = harness.last_reply().expect("a reply");
    let (status, why) = match frame.header.kind {
        Kind::Reply => {
            let reply: Reply = messages::decode(&frame, "reply").unwrap();
            (reply.ret as i64, reply.error)
        }
        _ => {
            let error: messages::AsyncError = messages::decode(&frame, "async error").unwrap();
            (error.status, error.message)
        }
    };
    (status, why.unwrap_or_default())
}

#[test]
fn allocations_beyond_the_quota_are_out_of_memory() {
    let harness = Harness::new(fuzz::emulated_harness_backend(), Some(1 << 20));
    assert_eq!(malloc(&harness, 600 << 10).0, 0);
    assert_eq!(malloc(&harness, 600 << 10).0, 2, "cudaErrorMemoryAllocation past the quota");
    assert_eq!(malloc(&harness, 400 << 10).0, 0, "what is left still fits");
    // A NULL where the address would go is refused, not allocated for no one.
    let desc = newest("cudaMalloc", Some(Form::Call));
    assert_eq!(ret_of(&harness, desc, vec![0, 16], vec![NULL_LEN, 0], &[]), desc.codes.invalid_value);
}

/// The NULL-pointer run against the real libraries, on a GPU machine:
/// `CHIDORI_HOSTILE_REAL=1 hostile real_libraries_survive_null_pointers --exact --nocapture`.
/// Each descriptor runs (every pointer NULL, counts 0, 1 and 7, device addresses NULL or
/// the session's) in a child process; a child that dies by a signal names the descriptor
/// it was at, and the next child goes on after it. A descriptor that leaves the context
/// broken (a small allocation after it fails) is named too, and a fresh child goes on, so
/// the descriptors after it still reach their libraries. Without the variable (CI, no GPU)
/// the test only says how to run it; with `CHIDORI_HOSTILE_BACKEND=emulated` as well it runs
/// against the emulated backend (0.6 s on the development machine).
#[test]
fn real_libraries_survive_null_pointers() {
    use std::io::Write as _;
    const FROM: &str = "CHIDORI_HOSTILE_FROM";
    let Some(progress) = std::env::var_os("CHIDORI_HOSTILE_REAL") else {
        eprintln!(
            "set CHIDORI_HOSTILE_REAL=1 on a GPU machine to run the NULL-pointer calls against the real libraries"
        );
        return;
    };
    let progress =
        std::path::PathBuf::from(if progress == "1" { "/tmp/chidori-hostile-progress".into() } else { progress });
    if let Ok(from) = std::env::var(FROM) {
        // The child: run descriptors from `from` on, writing where it is before each.
        let from: usize = from.parse().unwrap();
        // CHIDORI_HOSTILE_BACKEND=emulated: the same run against the emulated backend (to
        // try the machinery on a machine without a GPU).
        let backend: std::sync::Arc<dyn chidori_worker::backend::Backend> =
            if std::env::var("CHIDORI_HOSTILE_BACKEND").is_ok_and(|b| b == "emulated") {
                fuzz::emulated_harness_backend()
            } else {
                std::sync::Arc::new(chidori_worker::real::Real::new(&[]).expect("the real backend"))
            };
        backend.thread_init();
        let harness = Harness::new(backend, Some(1 << 30));
        let (_, base) = malloc(&harness, 1 << 20);
        for (index, desc) in VARIANTS.iter().enumerate().skip(from) {
            std::fs::write(&progress, index.to_string()).unwrap();
            for value in [0u64, 1, 7] {
                for device in [0, base] {
                    let args = desc.params.iter().map(|w| if *w == Wire::Device { device } else { value }).collect();
                    let lens = desc
                        .params
                        .iter()
                        .map(|w| match w {
                            Wire::Buf { .. }
                            | Wire::Handles { .. }
                            | Wire::Scalar { .. }
                            | Wire::Str
                            | Wire::OutHandle { .. } => NULL_LEN,
                            Wire::ByValRecord { bytes } => u64::from(*bytes),
                            _ => 0,
                        })
                        .collect();
                    let records: usize = desc
                        .params
                        .iter()
                        .map(|w| if let Wire::ByValRecord { bytes } = w { *bytes as usize } else { 0 })
                        .sum();
                    let _ = harness.run(&frame_of(desc, args, lens, &vec![0u8; records]));
                }
            }
            // A descriptor that left the context broken (a sticky error: every later call
            // would fail before reaching its library) is named, and the next child goes on
            // with a fresh context.
            let (status, _) = malloc(&harness, 16);
            if status != 0 {
                std::fs::write(&progress, format!("broke {index} {status}")).unwrap();
                std::process::exit(3);
            }
        }
        std::fs::write(&progress, "done").unwrap();
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let stuck = std::time::Duration::from_secs(
        std::env::var("CHIDORI_HOSTILE_STUCK").ok().and_then(|s| s.parse().ok()).unwrap_or(60),
    );
    let mut from = 0usize;
    let mut died = Vec::new();
    let mut broke = 0usize;
    while from < VARIANTS.len() {
        let _ = std::fs::remove_file(&progress);
        let mut child = std::process::Command::new(&exe)
            .args(["real_libraries_survive_null_pointers", "--exact", "--nocapture", "--test-threads", "1"])
            .env(FROM, from.to_string())
            .stdout(std::process::Stdio::null())
            // What a child says goes to a file beside the progress file (the reason a child
            // that could not start gives, a library's own complaints).
            .stderr(std::fs::File::create(progress.with_extension("stderr")).unwrap())
            .spawn()
            .unwrap();
        // A child that makes no progress for a while (CHIDORI_HOSTILE_STUCK seconds, a minute
        // unless set) is stuck in a call: it is killed and named like one that died.
        let mut last = (String::new(), std::time::Instant::now());
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            let now = std::fs::read_to_string(&progress).unwrap_or_default();
            if now != last.0 {
                last = (now, std::time::Instant::now());
            } else if last.1.elapsed() > stuck {
                let _ = child.kill();
                break child.wait().unwrap();
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        };
        let at = std::fs::read_to_string(&progress).unwrap_or_default();
        if at == "done" {
            break;
        }
        if let Some(rest) = at.strip_prefix("broke ") {
            let (index, status) = rest.split_once(' ').unwrap_or((rest, "?"));
            let index: usize = index.parse().unwrap();
            let desc = VARIANTS[index];
            eprintln!(
                "broke the context at {index}: {} ({}, form {:?}), status {status}",
                desc.name, desc.library, desc.form
            );
            broke += 1;
            from = index + 1;
            continue;
        }
        let Ok(index) = at.parse::<usize>() else {
            let said = std::fs::read_to_string(progress.with_extension("stderr")).unwrap_or_default();
            let said: Vec<&str> = said.lines().filter(|l| !l.trim().is_empty()).take(6).collect();
            panic!("the child ended ({status}) before its first call:\n{}", said.join("\n"));
        };
        let desc = VARIANTS[index];
        died.push(format!("{} ({}, form {:?}): {status}", desc.name, desc.library, desc.form));
        let _ = std::io::stderr().flush();
        eprintln!("died at {index}: {}", died.last().unwrap());
        // A panic of the worker's own code says where (a library's signal says nothing).
        let said = std::fs::read_to_string(progress.with_extension("stderr")).unwrap_or_default();
        if let Some(at) = said.lines().position(|l| l.contains("panicked at")) {
            eprintln!("  {}", said.lines().skip(at).take(2).collect::<Vec<_>>().join("\n  "));
        }
        from = index + 1;
    }
    eprintln!(
        "real libraries, NULL pointers: {} descriptors run, {} killed the worker, {broke} left the context broken",
        VARIANTS.len(),
        died.len()
    );
    assert!(died.is_empty(), "{} descriptors killed the worker:\n{}", died.len(), died.join("\n"));
}

/// CUDA IPC within one server: an exported handle opens in another session of the same
/// server (the memory is then that session's, until closed), not in a session of another
/// server, and not once the exporting session has ended.
#[test]
fn ipc_handles_open_only_in_sessions_of_the_server_that_exported_them() {
    let dir = |name: &str| {
        let d = std::env::temp_dir().join(format!("chidori-ipc-hostile-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    };
    let (ours, theirs) = (dir("ours"), dir("theirs"));
    let session = |d: &std::path::Path| Harness::sharing(fuzz::emulated_harness_backend(), None, Some(d.to_path_buf()));
    let (exporter, opener, stranger, late) = (session(&ours), session(&ours), session(&theirs), session(&ours));
    let (_, base) = malloc(&exporter, 4096);
    let h2d = newest("cudaMemcpy", Some(Form::H2d));
    let pattern: Vec<u8> = (0..16).collect();
    assert_eq!(ret_of(&exporter, h2d, vec![base, 0, 16, 1], vec![0, 16, 0, 0], &pattern), 0);
    let get = newest("cudaIpcGetMemHandle", Some(Form::Call));
    assert_eq!(ret_of(&exporter, get, vec![0, base], vec![64, 0], &[]), 0);
    let handle = exporter.last_reply().unwrap().bulk[..64].to_vec();
    // Its own memory only: an address of no session's is refused before the library.
    assert_eq!(ret_of(&exporter, get, vec![0, 0x7e00_dead_0000], vec![64, 0], &[]), get.codes.invalid_value);

    let open = newest("cudaIpcOpenMemHandle", Some(Form::Call));
    let opened = |h: &Harness| {
        let status = ret_of(h, open, vec![0, 0, 1], vec![8, 64, 0], &handle);
        (status, h.last_reply().unwrap().bulk.get(..8).map(|b| u64::from_le_bytes(b.try_into().unwrap())))
    };
    assert_eq!(opened(&stranger).0, open.codes.invalid_value, "exported on another server");
    let (status, address) = opened(&opener);
    assert_eq!(status, 0);
    let address = address.unwrap();
    let d2h = newest("cudaMemcpy", Some(Form::D2h));
    assert_eq!(ret_of(&opener, d2h, vec![0, address, 16, 2], vec![16, 0, 0, 0], &[]), 0);
    assert!(opener.last_reply().unwrap().bulk.ends_with(&pattern), "the exporter's bytes");

    let close = newest("cudaIpcCloseMemHandle", Some(Form::Call));
    let (_, own) = malloc(&opener, 4096);
    assert_eq!(ret_of(&opener, close, vec![own], vec![0], &[]), close.codes.invalid_value, "not opened");
    assert_eq!(ret_of(&opener, close, vec![address], vec![0], &[]), 0);
    assert_eq!(
        ret_of(&opener, d2h, vec![0, address, 16, 2], vec![16, 0, 0, 0], &[]),
        d2h.codes.invalid_value,
        "closed: no longer the session's"
    );
    drop(exporter);
    assert_eq!(opened(&late).0, open.codes.invalid_value, "the exporting session ended");
    let _ = (std::fs::remove_dir_all(ours), std::fs::remove_dir_all(theirs));
}

/// A copy whose host side is the worker's own buffer (the frame's bytes) cannot join a
/// capture, whichever form carries it: the runtime's `h2d` or the driver's `call` (which
/// statically linked runtimes copy with). The graph would keep the buffer's address.
#[test]
fn host_copies_on_a_capturing_stream_are_refused_in_every_form() {
    let harness = fuzz::emulated_harness();
    let (_, base) = malloc(&harness, 4096);
    let create = newest("cudaStreamCreate", Some(Form::Call));
    assert_eq!(ret_of(&harness, create, vec![0], vec![8], &[]), 0);
    let stream = u64::from_le_bytes(harness.last_reply().unwrap().bulk[..8].try_into().unwrap());
    let begin = newest("cudaStreamBeginCapture", Some(Form::Call));
    // cudaStreamCaptureModeRelaxed: the test's own calls do not end the capture.
    assert_eq!(ret_of(&harness, begin, vec![stream, 2], vec![0, 0], &[]), 0);
    let bytes = [7u8; 64];
    let status = |desc: &CallDesc, args: Vec<u64>, lens: Vec<u64>| {
        harness.run(&frame_of(desc, args, lens, &bytes)).unwrap();
        let reply = harness.last_reply().unwrap();
        if reply.header.kind == Kind::AsyncError {
            messages::decode::<messages::AsyncError>(&reply, "async error").unwrap().status
        } else {
            messages::decode::<Reply>(&reply, "reply").unwrap().ret as i64
        }
    };
    use chidori_cuda::consts::{cudaError, cudaError_enum};
    let driver = newest("cuMemcpyHtoDAsync_v2", Some(Form::Call));
    let refused = status(driver, vec![base, 0, 64, stream], vec![0, 64, 0, 0]);
    assert_eq!(refused, i64::from(cudaError_enum::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED));
    let runtime = newest("cudaMemcpyAsync", Some(Form::H2d));
    let refused = status(runtime, vec![base, 0, 64, 1, stream], vec![0, 64, 0, 0, 0]);
    assert_eq!(refused, i64::from(cudaError::cudaErrorStreamCaptureUnsupported));
}
