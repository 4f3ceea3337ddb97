//! Round trips of every wire kind through [`encode`] and [`decode`], and one refusal per
//! kind of malformed argument.

use std::collections::HashMap;

use proptest::prelude::*;

use super::*;
use crate::desc::{Class, Codes, Ret};

/// The program's memory (addresses → bytes), the handles its BLAS calls put in device
/// pointer mode, and the names it gave.
#[derive(Default)]
struct FakeClient {
    memory: HashMap<u64, Vec<u8>>,
    device_mode: Vec<u64>,
    /// Scalar widths the client knows per handle (cuBLASLt scale types).
    scalar_sizes: HashMap<u64, u64>,
    /// Handles whose later scalars (beta) follow their own mode (cuSPARSELt's plans).
    later_device: HashMap<u64, bool>,
    next_name: u64,
    /// Element counts custom code told, per parameter.
    told: HashMap<usize, u64>,
}

impl Client for FakeClient {
    fn c_str_len(&mut self, addr: u64) -> u64 {
        let s = &self.memory[&addr];
        s.iter().position(|&b| b == 0).expect("a test string has its NUL") as u64 + 1
    }

    fn scalar_mode(&mut self, mode: u64) -> ScalarMode {
        ScalarMode {
            device: self.device_mode.contains(&mode),
            bytes: self.scalar_sizes.get(&mode).copied(),
            later_device: self.later_device.get(&mode).copied(),
        }
    }

    fn new_name(&mut self) -> u64 {
        self.next_name += 1;
        crate::desc::CLIENT_NAME_TAG | self.next_name
    }

    fn word(&mut self, addr: u64, bytes: u64) -> Option<u64> {
        word_at(self.memory.get(&addr)?, bytes)
    }

    fn told(&mut self, param: usize) -> Option<u64> {
        self.told.get(&param).copied()
    }
}

impl FakeClient {
    /// Place `bytes` in the program's memory; its address.
    fn put(&mut self, bytes: Vec<u8>) -> u64 {
        let addr = 0x1000 * (self.memory.len() as u64 + 1);
        self.memory.insert(addr, bytes);
        addr
    }

    /// The bulk section of an encoded call: the inputs' bytes back to back.
    fn bulk(&self, encoded: &Encoded) -> Vec<u8> {
        encoded.inputs.iter().flat_map(|s| self.memory[&s.addr][..s.len].to_vec()).collect()
    }
}

/// The session: handles are their value with the top bit set (the library's), values below
/// [`FOREIGN`] only; device memory is `[DEVICE, DEVICE + 1 MiB)`.
#[derive(Default)]
struct FakeTables {
    named: Vec<u64>,
}

const FOREIGN: u64 = 1 << 40;
const DEVICE: u64 = 0x7f00_0000_0000;
/// Client addresses of session memory that lies at DEVICE + 512 KiB.
const ELSEWHERE: u64 = 0x5000_0000_0000;

impl Tables for FakeTables {
    fn resolve(&mut self, _kind: HandleKind, value: u64) -> Option<u64> {
        (value < FOREIGN).then_some(value | 1 << 63)
    }

    fn name_free(&mut self, _kind: HandleKind, value: u64) -> bool {
        !self.named.contains(&value)
    }

    fn device(&mut self, _param: usize, addr: u64, bytes: Option<u64>) -> Result<u64, String> {
        let end = addr.checked_add(bytes.unwrap_or(1)).ok_or("past the address space")?;
        if addr >= DEVICE && end <= DEVICE + (1 << 20) {
            Ok(addr)
        } else if addr >= ELSEWHERE && end <= ELSEWHERE + 4096 {
            // Memory of the session's that lies elsewhere than the client names it.
            Ok(addr - ELSEWHERE + DEVICE + (1 << 19))
        } else {
            Err(format!("{addr:#x} is not ours"))
        }
    }
}

fn desc(params: Vec<Wire>) -> &'static CallDesc {
    Box::leak(Box::new(CallDesc {
        wire: 0,
        call: 0,
        name: "test",
        form: None,
        library: "test",
        versions: &["13.0"],
        class: Class::Sync,
        params: Box::leak(params.into_boxed_slice()),
        ret: Ret::Status,
        codes: Codes { success: 0, not_supported: 801, unavailable: 999, invalid_handle: 400, invalid_value: 1 },
        only_waits: false,
    }))
}

fn leak(len: Len) -> &'static Len {
    Box::leak(Box::new(len))
}

/// One parameter (or two: a count before its array) of a generated call: its wire kind(s),
/// the argument words, and what the decoder must give back.
#[derive(Debug, Clone)]
enum Piece {
    Val(u64),
    Device(u64),
    Handle(u64),
    Null,
    Scratch(u32),
    SizedScratch(u64),
    Record(Vec<u8>),
    OutHandle { named: bool },
    Str(Option<Vec<u8>>),
    Scalar { dir: Dir, value: Vec<u8>, device: Option<u64> },
    Handles(Option<Vec<u64>>),
    Buf { dir: Dir, elem: u32, data: Option<Vec<u8>> },
}

fn dir() -> impl Strategy<Value = Dir> {
    prop_oneof![Just(Dir::In), Just(Dir::Out), Just(Dir::InOut)]
}

fn piece() -> impl Strategy<Value = Piece> {
    let bytes = |n: std::ops::Range<usize>| proptest::collection::vec(any::<u8>(), n);
    prop_oneof![
        any::<u64>().prop_map(Piece::Val),
        (0u64..1 << 20).prop_map(|at| Piece::Device(DEVICE + at)),
        (0u64..FOREIGN).prop_map(Piece::Handle),
        Just(Piece::Null),
        (1u32..64).prop_map(Piece::Scratch),
        (0u64..1 << 20).prop_map(Piece::SizedScratch),
        bytes(1..64).prop_map(Piece::Record),
        any::<bool>().prop_map(|named| Piece::OutHandle { named }),
        proptest::option::of(proptest::collection::vec(1u8..=255, 0..40)).prop_map(|s| Piece::Str(s.map(|mut s| {
            s.push(0);
            s
        }))),
        (dir(), prop_oneof![Just(2usize), Just(4), Just(8), Just(16)], proptest::option::of(0u64..1 << 16))
            .prop_flat_map(move |(dir, n, device)| bytes(n..n + 1).prop_map(move |value| Piece::Scalar {
                dir,
                value,
                device: device.map(|d| DEVICE + d),
            })),
        proptest::option::of(proptest::collection::vec(0u64..FOREIGN, 0..8)).prop_map(Piece::Handles),
        (dir(), prop_oneof![Just(1u32), Just(4), Just(12)], proptest::option::of(0usize..8)).prop_flat_map(
            move |(dir, elem, n)| {
                proptest::option::of(bytes({
                    let len = n.unwrap_or(0) * elem as usize;
                    len..len + 1
                }))
                .prop_map(move |data| Piece::Buf { dir, elem, data: n.and(data) })
            }
        ),
    ]
}

/// The descriptor, arguments and client memory of a call made of `pieces`, and the
/// arguments the decoder must give back (None: not compared, an output of a new handle).
fn build(pieces: &[Piece], client: &mut FakeClient) -> (&'static CallDesc, Vec<u64>, Vec<Arg<'static>>) {
    let (mut params, mut args, mut want) = (Vec::new(), Vec::new(), Vec::new());
    let leak_bytes = |b: &[u8]| -> &'static [u8] { Box::leak(b.to_vec().into_boxed_slice()) };
    for p in pieces {
        match p {
            Piece::Val(v) => {
                params.push(Wire::Val { bytes: 8, float: false });
                args.push(*v);
                want.push(Arg::Val(*v));
            }
            Piece::Device(a) => {
                params.push(Wire::Device);
                args.push(*a);
                want.push(Arg::Device(*a));
            }
            Piece::Handle(h) => {
                params.push(Wire::Handle { kind: 3, destroy: false });
                args.push(*h);
                want.push(Arg::Handle { kind: 3, value: *h, real: *h | 1 << 63, destroy: false });
            }
            Piece::Null => {
                params.push(Wire::Null);
                args.push(0);
                want.push(Arg::Val(0));
            }
            Piece::Scratch(n) => {
                params.push(Wire::Scratch { bytes: *n });
                args.push(0);
                want.push(Arg::Scratch(*n as usize));
            }
            Piece::SizedScratch(n) => {
                params.push(Wire::SizedScratch);
                args.push(*n);
                want.push(Arg::Scratch(*n as usize));
            }
            Piece::Record(r) => {
                params.push(Wire::ByValRecord { bytes: r.len() as u32 });
                args.push(client.put(r.clone()));
                want.push(Arg::Record(leak_bytes(r)));
            }
            Piece::OutHandle { named } => {
                // A NULL new handle is refused; the negative tests cover it.
                params.push(Wire::OutHandle { kind: 5, named: *named });
                args.push(client.put(vec![0; 8]));
                want.push(Arg::NewHandle { kind: 5, named: *named });
            }
            Piece::Str(s) => {
                params.push(Wire::Str);
                args.push(s.as_ref().map_or(0, |s| client.put(s.clone())));
                want.push(Arg::Str(s.as_deref().map(leak_bytes)));
            }
            Piece::Scalar { dir, value, device } => {
                // The pointer mode: a handle parameter before the scalar.
                let mode = params.len() as u8;
                let handle = 0x100 + mode as u64;
                params.push(Wire::Handle { kind: 1, destroy: false });
                args.push(handle);
                want.push(Arg::Handle { kind: 1, value: handle, real: handle | 1 << 63, destroy: false });
                params.push(Wire::Scalar { dir: *dir, bytes: value.len() as u32, mode, size: None });
                match device {
                    Some(d) => {
                        client.device_mode.push(handle);
                        args.push(*d);
                        want.push(Arg::ScalarDevice(*d));
                    }
                    None => {
                        args.push(client.put(value.clone()));
                        let input = (*dir != Dir::Out).then(|| leak_bytes(value));
                        want.push(Arg::Scalar { dir: *dir, bytes: value.len(), input });
                    }
                }
            }
            Piece::Handles(list) => {
                let count = params.len() as u8;
                let n = list.as_ref().map_or(0, |l| l.len()) as u64;
                params.push(Wire::Val { bytes: 4, float: false });
                args.push(n);
                want.push(Arg::Val(n));
                params.push(Wire::Handles { kind: 2, len: leak(Len::Param(count)) });
                match list {
                    Some(l) => {
                        args.push(client.put(l.iter().flat_map(|h| h.to_le_bytes()).collect()));
                        want.push(Arg::Handles(Some(l.iter().flat_map(|h| (h | 1 << 63).to_le_bytes()).collect())));
                    }
                    None => {
                        args.push(0);
                        want.push(Arg::Handles(None));
                    }
                }
            }
            Piece::Buf { dir, elem, data } => {
                let count = params.len() as u8;
                let n = data.as_ref().map_or(0, |d| d.len() as u64 / u64::from(*elem));
                params.push(Wire::Val { bytes: 8, float: false });
                args.push(n);
                want.push(Arg::Val(n));
                params.push(Wire::Buf {
                    dir: *dir,
                    elem: *elem,
                    len: Some(leak(Len::Param(count))),
                    record: None,
                    optional: false,
                });
                match data {
                    Some(d) => {
                        args.push(client.put(d.clone()));
                        let input = (*dir != Dir::Out).then(|| leak_bytes(d));
                        want.push(Arg::Buf(BufArg::Present { len: d.len() as u64, input }));
                    }
                    None => {
                        args.push(0);
                        want.push(Arg::Buf(BufArg::Absent));
                    }
                }
            }
        }
    }
    (desc(params), args, want)
}

proptest! {
    #[test]
    fn every_kind_round_trips(pieces in proptest::collection::vec(piece(), 0..12)) {
        let mut client = FakeClient::default();
        let (desc, args, want) = build(&pieces, &mut client);
        let encoded = encode(desc, &args, &mut client);
        let bulk = client.bulk(&encoded);
        let got = decode(desc, &encoded.call.args, &encoded.call.lens, &bulk, &mut FakeTables::default()).unwrap();
        prop_assert_eq!(&got, &want);
        // Outputs land where the program asked, with their lengths.
        for out in &encoded.outputs {
            let arg = args[out.param];
            prop_assert_eq!(out.addr, arg);
        }
        // Named handles: the program's pointer gets the name, and the archive carries it.
        for &(at, name) in &encoded.names {
            let param = args.iter().position(|&a| a == at).unwrap();
            prop_assert_eq!(encoded.call.args[param], name);
        }
    }

    #[test]
    fn hostile_arguments_never_panic(pieces in proptest::collection::vec(piece(), 0..8),
                                     args in proptest::collection::vec(any::<u64>(), 0..24),
                                     lens in proptest::collection::vec(prop_oneof![any::<u64>(), 0u64..64, Just(NULL_LEN), Just(DEVICE_LEN)], 0..24),
                                     bulk in proptest::collection::vec(any::<u8>(), 0..256)) {
        let mut client = FakeClient::default();
        let (desc, _, _) = build(&pieces, &mut client);
        let n = desc.params.len();
        let (args, lens) = (&args[..args.len().min(n)], &lens[..lens.len().min(n)]);
        let _ = decode(desc, args, lens, &bulk, &mut FakeTables::default());
    }
}

/// Decode `args` and `lens` (and `bulk`) of a call of `params`: the error.
fn refused(params: Vec<Wire>, args: &[u64], lens: &[u64], bulk: &[u8]) -> DecodeError {
    let desc = desc(params);
    decode(desc, args, lens, bulk, &mut FakeTables { named: vec![0x77] }).expect_err("the decoder accepted it")
}

static COUNT: Len = Len::Param(0);

#[test]
fn the_wrong_number_of_arguments_ends_the_session() {
    let e = refused(vec![Wire::Val { bytes: 4, float: false }], &[1, 2], &[0, 0], &[]);
    assert_eq!(e, DecodeError::Arity { params: 1, args: 2, lens: 2 });
    assert_eq!(e.refusal(), Refusal::Fatal);
}

#[test]
fn a_device_address_outside_the_session_is_an_invalid_value() {
    let e = refused(vec![Wire::Device], &[0x1234], &[0], &[]);
    assert!(matches!(e, DecodeError::Device { param: 0, .. }), "{e}");
    assert_eq!(e.refusal(), Refusal::InvalidValue);
}

#[test]
fn a_foreign_handle_is_an_invalid_handle() {
    let e = refused(vec![Wire::Handle { kind: 2, destroy: true }], &[FOREIGN], &[0], &[]);
    assert_eq!(e, DecodeError::Handle { param: 0, kind: 2, value: FOREIGN, element: None });
    assert_eq!(e.refusal(), Refusal::InvalidHandle);
}

#[test]
fn a_record_of_the_wrong_size_or_cut_short_ends_the_session() {
    let e = refused(vec![Wire::ByValRecord { bytes: 16 }], &[0x1000], &[8], &[0; 8]);
    assert_eq!(e, DecodeError::Length { param: 0, got: 8, expected: 16 });
    assert_eq!(e.refusal(), Refusal::Fatal);
    let e = refused(vec![Wire::ByValRecord { bytes: 16 }], &[0x1000], &[16], &[0; 15]);
    assert_eq!(e, DecodeError::Truncated { param: 0 });
    assert_eq!(e.refusal(), Refusal::Fatal);
}

#[test]
fn new_handles_need_a_pointer_and_a_fresh_name() {
    let e = refused(vec![Wire::OutHandle { kind: 5, named: false }], &[0], &[NULL_LEN], &[]);
    assert!(matches!(e, DecodeError::Null { param: 0, .. }), "{e}");
    assert_eq!(e.refusal(), Refusal::InvalidValueQuietly);
    let e = refused(vec![Wire::OutHandle { kind: 5, named: true }], &[0x77], &[8], &[]);
    assert_eq!(e, DecodeError::NameTaken { param: 0, kind: 5, value: 0x77 });
    assert_eq!(e.refusal(), Refusal::InvalidHandle);
}

#[test]
fn strings_end_with_their_nul() {
    let e = refused(vec![Wire::Str], &[0x1000], &[3], b"abc");
    assert_eq!(e, DecodeError::Unterminated { param: 0 });
    assert_eq!(e.refusal(), Refusal::Fatal);
    let e = refused(vec![Wire::Str], &[0x1000], &[u64::MAX - 7], b"abc\0");
    assert_eq!(e, DecodeError::Truncated { param: 0 });
}

#[test]
fn scalars_are_their_size_not_null_and_device_ones_are_the_sessions() {
    let mode = Wire::Handle { kind: 1, destroy: false };
    let scalar = Wire::Scalar { dir: Dir::In, bytes: 4, mode: 0, size: None };
    let e = refused(vec![mode, scalar], &[1, 0], &[0, NULL_LEN], &[]);
    assert!(matches!(e, DecodeError::Null { param: 1, .. }), "{e}");
    assert_eq!(e.refusal(), Refusal::InvalidValueQuietly);
    let e = refused(vec![mode, scalar], &[1, 0x1000], &[0, 16], &[0; 16]);
    assert_eq!(e, DecodeError::Length { param: 1, got: 16, expected: 4 });
    assert_eq!(e.refusal(), Refusal::Fatal);
    let e = refused(vec![mode, scalar], &[1, 0x1000], &[0, DEVICE_LEN], &[]);
    assert!(matches!(e, DecodeError::Device { param: 1, .. }), "{e}");
    assert_eq!(e.refusal(), Refusal::InvalidValue);
    let e = refused(vec![mode, scalar], &[1, 0], &[0, DEVICE_LEN], &[]);
    assert!(matches!(e, DecodeError::Device { param: 1, .. }), "a NULL device scalar: {e}");
}

#[test]
fn the_library_is_given_the_address_where_the_session_has_the_memory() {
    let desc = desc(vec![Wire::Device, Wire::Device]);
    let tables = &mut FakeTables::default();
    let args = decode(desc, &[DEVICE + 8, ELSEWHERE + 100], &[0, 0], &[], tables).unwrap();
    assert_eq!(args, vec![Arg::Device(DEVICE + 8), Arg::Device(DEVICE + (1 << 19) + 100)]);
    let e = decode(desc, &[DEVICE, ELSEWHERE + 4096], &[0, 0], &[], tables).unwrap_err();
    assert!(matches!(e, DecodeError::Device { param: 1, .. }), "{e}");
}

#[test]
fn a_device_scalar_of_a_told_width_is_checked_for_that_many_bytes() {
    let mode = Wire::Handle { kind: 1, destroy: false };
    let untyped = Wire::Scalar { dir: Dir::In, bytes: 16, mode: 0, size: None };
    let tables = &mut FakeTables::default();
    let desc = desc(vec![mode, untyped]);
    // A float at the last 4 bytes of the session's memory: the widest (16) would overrun it.
    let last = DEVICE + (1 << 20) - 4;
    let e = decode(desc, &[1, last], &[0, DEVICE_LEN], &[], tables).unwrap_err();
    assert!(matches!(e, DecodeError::Device { param: 1, .. }), "{e}");
    assert_eq!(decode(desc, &[1, last], &[0, device_len(4)], &[], tables).unwrap()[1], Arg::ScalarDevice(last));
    // No wider than the parameter may be, whatever the client says.
    let e = decode(desc, &[1, last], &[0, device_len(200)], &[], tables).unwrap_err();
    assert!(matches!(e, DecodeError::Device { param: 1, .. }), "{e}");
    // The encoder tells the width the client knows (a cuBLASLt scale type).
    let mut client = FakeClient { device_mode: vec![1], ..FakeClient::default() };
    client.scalar_sizes.insert(1, 4);
    assert_eq!(encode(desc, &[1, last], &mut client).call.lens[1], device_len(4));
    client.scalar_sizes.clear();
    assert_eq!(encode(desc, &[1, last], &mut client).call.lens[1], DEVICE_LEN);
}

#[test]
fn a_record_handle_travels_as_the_id_its_record_holds() {
    let held = Wire::RecordHandle { kind: 5, destroy: false };
    let new = Wire::NewRecordHandle { kind: 5, bytes: 1024, named: false };
    let desc = desc(vec![held, new]);
    let mut client = FakeClient::default();
    let mut record = vec![0u8; 1024];
    record[..8].copy_from_slice(&0x42u64.to_le_bytes());
    let at = client.put(record);
    let fresh = client.put(vec![0u8; 1024]);
    let encoded = encode(desc, &[at, fresh], &mut client);
    // The id, not the record's address; the new record's first 8 bytes come back.
    assert_eq!(encoded.call.args, vec![0x42, fresh]);
    assert_eq!(encoded.call.lens, vec![0, 8]);
    assert!(encoded.inputs.is_empty());
    assert_eq!(encoded.outputs, vec![Span { param: 1, addr: fresh, len: 8 }]);
    let tables = &mut FakeTables::default();
    let args = decode(desc, &encoded.call.args, &encoded.call.lens, &[], tables).unwrap();
    assert_eq!(args[0], Arg::Handle { kind: 5, value: 0x42, real: 0x42 | 1 << 63, destroy: false });
    assert_eq!(args[1], Arg::NewRecord { kind: 5, bytes: 1024, named: false });
    // NULL records: the held one stays NULL (the library's to refuse), a new one is refused.
    let encoded = encode(desc, &[0, 0], &mut client);
    assert_eq!(encoded.call.args[0], 0);
    assert_eq!(encoded.call.lens[1], NULL_LEN);
    let e = decode(desc, &encoded.call.args, &encoded.call.lens, &[], tables).unwrap_err();
    assert!(matches!(e, DecodeError::Null { param: 1, .. }), "{e}");
    // An id that is no handle of the session is refused as a handle.
    let e = refused(vec![held], &[FOREIGN + 3], &[0], &[]);
    assert_eq!(e, DecodeError::Handle { param: 0, kind: 5, value: FOREIGN + 3, element: None });
    let e = refused(vec![new], &[0x1000], &[16], &[]);
    assert_eq!(e, DecodeError::Length { param: 0, got: 16, expected: 8 });
}

#[test]
fn a_named_record_gets_its_name_before_the_call_is_sent() {
    let new = Wire::NewRecordHandle { kind: 5, bytes: 1024, named: true };
    let desc = desc(vec![new]);
    let mut client = FakeClient::default();
    let record = client.put(vec![0u8; 1024]);
    let encoded = encode(desc, &[record], &mut client);
    let name = encoded.call.args[0];
    assert_eq!(encoded.names, vec![(record, name)], "the client writes the name into the record");
    assert!(encoded.outputs.is_empty(), "nothing comes back");
    assert_eq!(encoded.call.lens, vec![8]);
    let tables = &mut FakeTables::default();
    assert_eq!(
        decode(desc, &encoded.call.args, &encoded.call.lens, &[], tables).unwrap()[0],
        Arg::NewRecord { kind: 5, bytes: 1024, named: true }
    );
    tables.named.push(name);
    let e = decode(desc, &encoded.call.args, &encoded.call.lens, &[], tables).unwrap_err();
    assert_eq!(e, DecodeError::NameTaken { param: 0, kind: 5, value: name });
}

#[test]
fn later_scalars_may_follow_a_mode_of_their_own() {
    // cuSPARSELt: alpha a device vector (per-channel scaling), beta a host float.
    let plan = Wire::RecordHandle { kind: 5, destroy: false };
    let scalar = Wire::Scalar { dir: Dir::In, bytes: 16, mode: 0, size: None };
    let desc = desc(vec![plan, scalar, scalar]);
    let mut client = FakeClient { device_mode: vec![7], ..FakeClient::default() };
    client.scalar_sizes.insert(7, 4);
    client.later_device.insert(7, false);
    let mut record = vec![0u8; 1024];
    record[..8].copy_from_slice(&7u64.to_le_bytes());
    let plan_at = client.put(record);
    let beta = client.put(1.5f32.to_le_bytes().to_vec());
    let encoded = encode(desc, &[plan_at, DEVICE, beta], &mut client);
    assert_eq!(encoded.call.lens, vec![0, device_len(4), 4]);
    assert_eq!(encoded.inputs, vec![Span { param: 2, addr: beta, len: 4 }]);
    // Without a mode of their own, every scalar follows the first's.
    client.later_device.clear();
    let encoded = encode(desc, &[plan_at, DEVICE, DEVICE + 64], &mut client);
    assert_eq!(encoded.call.lens, vec![0, device_len(4), device_len(4)]);
}

#[test]
fn handle_arrays_are_checked_element_by_element() {
    let count = Wire::Val { bytes: 4, float: false };
    let handles = Wire::Handles { kind: 2, len: &COUNT };
    let bulk: Vec<u8> = [1u64, FOREIGN + 1].iter().flat_map(|h| h.to_le_bytes()).collect();
    let e = refused(vec![count, handles], &[2, 0x1000], &[0, 16], &bulk);
    assert_eq!(e, DecodeError::Handle { param: 1, kind: 2, value: FOREIGN + 1, element: Some(1) });
    assert_eq!(e.refusal(), Refusal::InvalidHandle);
    let e = refused(vec![count, handles], &[u64::MAX / 4, 0x1000], &[0, 16], &bulk);
    assert_eq!(e, DecodeError::TooLarge { param: 1, count: u64::MAX / 4, elem: 8 });
    assert_eq!(e.refusal(), Refusal::InvalidValue);
    let e = refused(vec![count, handles], &[3, 0], &[0, NULL_LEN], &[]);
    assert!(matches!(e, DecodeError::Null { param: 1, .. }), "{e}");
    let e = refused(vec![count, handles], &[1, 0x1000], &[0, 16], &bulk);
    assert_eq!(e, DecodeError::Length { param: 1, got: 16, expected: 8 });
}

#[test]
fn a_workspace_sized_by_its_argument_is_no_larger_than_a_call() {
    let e = refused(vec![Wire::SizedScratch], &[MAX_BUFFER + 1], &[0], &[]);
    assert_eq!(e, DecodeError::TooLarge { param: 0, count: MAX_BUFFER + 1, elem: 1 });
    assert_eq!(e.refusal(), Refusal::InvalidValue);
}

#[test]
fn buffers_are_as_long_as_the_arguments_say_and_no_longer_than_a_call() {
    let count = Wire::Val { bytes: 8, float: false };
    let buf = |dir| Wire::Buf { dir, elem: 4, len: Some(&COUNT), record: None, optional: false };
    let e = refused(vec![count, buf(Dir::In)], &[2, 0x1000], &[0, 4], &[0; 4]);
    assert_eq!(e, DecodeError::Length { param: 1, got: 4, expected: 8 });
    assert_eq!(e.refusal(), Refusal::Fatal);
    let e = refused(vec![count, buf(Dir::Out)], &[MAX_BUFFER, 0x1000], &[0, 0], &[]);
    assert_eq!(e, DecodeError::TooLarge { param: 1, count: MAX_BUFFER, elem: 4 });
    assert_eq!(e.refusal(), Refusal::InvalidValue);
    let e = refused(vec![count, buf(Dir::In)], &[2, 0], &[0, NULL_LEN], &[]);
    assert!(matches!(e, DecodeError::Null { param: 1, .. }), "{e}");
    assert_eq!(e.refusal(), Refusal::InvalidValueQuietly);
    let e = refused(vec![count, buf(Dir::In)], &[2, 0x1000], &[0, 8], &[0; 9]);
    assert_eq!(e, DecodeError::Leftover(1));
    assert_eq!(e.refusal(), Refusal::Fatal);
    // A length expression the arguments cannot evaluate (an index past them).
    static NOWHERE: Len = Len::Param(9);
    let e = refused(
        vec![Wire::Buf { dir: Dir::In, elem: 1, len: Some(&NOWHERE), record: None, optional: false }],
        &[0x1000],
        &[1],
        &[0],
    );
    assert_eq!(e, DecodeError::NoLength { param: 0 });
    assert_eq!(e.refusal(), Refusal::InvalidValue);
}

#[test]
fn null_buffers_follow_the_api() {
    let tables = &mut FakeTables::default();
    // A single output at NULL: written into a buffer no one reads.
    let out = desc(vec![Wire::Buf { dir: Dir::Out, elem: 8, len: None, record: None, optional: false }]);
    assert_eq!(decode(out, &[0], &[NULL_LEN], &[], tables), Ok(vec![Arg::Buf(BufArg::Discarded { bytes: Some(8) })]));
    // A single value read and written that the API lets be NULL (`inout?`: a log iterator):
    // NULL stays NULL.
    let opt = desc(vec![Wire::Buf { dir: Dir::InOut, elem: 4, len: None, record: None, optional: true }]);
    assert_eq!(decode(opt, &[0], &[NULL_LEN], &[], tables), Ok(vec![Arg::Buf(BufArg::Absent)]));
    // A single optional input at NULL: passed as NULL.
    let input = desc(vec![Wire::Buf { dir: Dir::In, elem: 8, len: None, record: None, optional: false }]);
    assert_eq!(decode(input, &[0], &[NULL_LEN], &[], tables), Ok(vec![Arg::Buf(BufArg::Absent)]));
    // An input array of `rank` elements at NULL: refused (the library would read it) unless
    // the API lets it be NULL (cuFFT's `inembed`: the basic layout).
    let count = Wire::Val { bytes: 4, float: false };
    let array =
        |optional| desc(vec![count, Wire::Buf { dir: Dir::In, elem: 8, len: Some(&COUNT), record: None, optional }]);
    let e = decode(array(false), &[2, 0], &[0, NULL_LEN], &[], tables).unwrap_err();
    assert!(matches!(e, DecodeError::Null { param: 1, .. }), "{e:?}");
    assert_eq!(
        decode(array(true), &[2, 0], &[0, NULL_LEN], &[], tables),
        Ok(vec![Arg::Val(2), Arg::Buf(BufArg::Absent)])
    );
    // Given, it is the array as usual.
    let encoded = encode(array(true), &[2, 0x1000], &mut FakeClient::default());
    assert_eq!(encoded.inputs, vec![Span { param: 1, addr: 0x1000, len: 16 }]);
}

#[test]
fn oversized_lengths_are_not_read_from_the_program() {
    // The encoder names no span for a count past what a call may carry: the worker refuses
    // the length instead of the client reading gigabytes of its program's memory.
    let count = Wire::Val { bytes: 8, float: false };
    let desc = desc(vec![count, Wire::Buf { dir: Dir::In, elem: 4, len: Some(&COUNT), record: None, optional: false }]);
    let encoded = encode(desc, &[MAX_BUFFER, 0x1000], &mut FakeClient::default());
    assert!(encoded.inputs.is_empty());
    let e = decode(desc, &encoded.call.args, &encoded.call.lens, &[], &mut FakeTables::default()).unwrap_err();
    assert_eq!(e.refusal(), Refusal::InvalidValue);
}

#[test]
fn a_scalar_typed_by_its_handle_is_read_at_that_width() {
    // cublasLtMatmul(handle, desc, alpha, ...): alpha is as wide as the descriptor's scale
    // type, which the client recorded; 16 bytes are the widest.
    let params =
        vec![Wire::Handle { kind: 1, destroy: false }, Wire::Scalar { dir: Dir::In, bytes: 16, mode: 0, size: None }];
    let desc = desc(params);
    let mut client = FakeClient::default();
    let alpha = client.put(2.0f32.to_le_bytes().to_vec());
    client.scalar_sizes.insert(7, 4);
    let encoded = encode(desc, &[7, alpha], &mut client);
    assert_eq!(encoded.inputs, vec![Span { param: 1, addr: alpha, len: 4 }], "only the float is read");
    let bulk = client.bulk(&encoded);
    let got = decode(desc, &encoded.call.args, &encoded.call.lens, &bulk, &mut FakeTables::default()).unwrap();
    // The worker gets the 4 bytes and passes a buffer of the widest size.
    assert_eq!(got[1], Arg::Scalar { dir: Dir::In, bytes: 16, input: Some(&2.0f32.to_le_bytes()[..]) });
    // A handle it knows nothing of: the widest is read.
    let encoded = encode(desc, &[8, alpha], &mut client);
    assert_eq!(encoded.inputs[0].len, 16);
    // A width the handle cannot mean is ignored, and a longer length is refused.
    client.scalar_sizes.insert(9, 32);
    assert_eq!(encode(desc, &[9, alpha], &mut client).inputs[0].len, 16);
    let e = decode(desc, &[7, alpha], &[0, 17], &[0; 17], &mut FakeTables::default()).unwrap_err();
    assert_eq!(e, DecodeError::Length { param: 1, got: 17, expected: 16 });
}

#[test]
fn an_untyped_scalar_is_the_size_of_its_type_parameter() {
    // cublasScalEx(handle, n, alpha, alphaType, ...): a float alpha is 4 bytes, not 16.
    static SIZES: Len = Len::Table(2, &[4, 8, 2, 1, 8, 16]);
    let params = vec![
        Wire::Handle { kind: 1, destroy: false },
        Wire::Scalar { dir: Dir::In, bytes: 16, mode: 0, size: Some(&SIZES) },
        Wire::Val { bytes: 4, float: false },
    ];
    let desc = desc(params);
    let mut client = FakeClient::default();
    let alpha = client.put(1.5f32.to_le_bytes().to_vec());
    let encoded = encode(desc, &[7, alpha, 0], &mut client);
    assert_eq!(encoded.inputs, vec![Span { param: 1, addr: alpha, len: 4 }], "only the float is read");
    let bulk = client.bulk(&encoded);
    let got = decode(desc, &encoded.call.args, &encoded.call.lens, &bulk, &mut FakeTables::default()).unwrap();
    assert_eq!(got[1], Arg::Scalar { dir: Dir::In, bytes: 4, input: Some(&1.5f32.to_le_bytes()[..]) });
    // A double complex (CUDA_C_64F, 5) is all 16.
    let e = decode(desc, &[7, alpha, 5], &[0, 4, 0], &[0; 4], &mut FakeTables::default()).unwrap_err();
    assert_eq!(e, DecodeError::Length { param: 1, got: 4, expected: 16 });
    // A type the table does not know has no size: refused with invalid-value, nothing read.
    let encoded = encode(desc, &[7, alpha, 99], &mut client);
    assert!(encoded.inputs.is_empty());
    let e = decode(desc, &encoded.call.args, &encoded.call.lens, &[], &mut FakeTables::default()).unwrap_err();
    assert_eq!(e, DecodeError::NoLength { param: 1 });
    assert_eq!(e.refusal(), Refusal::InvalidValue);
}

#[test]
fn an_input_sent_by_content_is_its_hash_and_only_plain_inputs_may_be() {
    let count = Wire::Val { bytes: 8, float: false };
    let buf = |dir, record| Wire::Buf { dir, elem: 1, len: Some(&COUNT), record, optional: false };
    let desc = desc(vec![count, buf(Dir::In, None)]);
    let hash = [7u8; 32];
    let args = decode(desc, &[1 << 20, 0x1000], &[0, (1 << 20) | CONTENT_FLAG], &hash, &mut FakeTables::default())
        .expect("a content reference");
    assert_eq!(args[1], Arg::Buf(BufArg::Content { len: 1 << 20, hash }));
    // Anywhere else it breaks the protocol: an output, a record, a wrong length, no hash.
    for (params, lens, bulk) in [
        (vec![count, buf(Dir::Out, None)], [0, 64 | CONTENT_FLAG], &hash[..]),
        (vec![count, buf(Dir::In, Some("cudaMemcpy3DParms"))], [0, 64 | CONTENT_FLAG], &hash[..]),
        (vec![count, buf(Dir::In, None)], [0, 65 | CONTENT_FLAG], &hash[..]),
        (vec![count, buf(Dir::In, None)], [0, 64 | CONTENT_FLAG], &hash[..31]),
    ] {
        let e = refused(params, &[64, 0x1000], &lens, bulk);
        assert_eq!(e.refusal(), Refusal::Fatal, "{e}");
    }
}

#[test]
fn an_input_sent_compressed_is_its_frame_and_only_plain_inputs_may_be() {
    let count = Wire::Val { bytes: 8, float: false };
    let buf = |dir, record| Wire::Buf { dir, elem: 1, len: Some(&COUNT), record, optional: false };
    let desc = desc(vec![count, buf(Dir::In, None)]);
    let frame = [9u8; 10];
    let mut bulk = 10u64.to_le_bytes().to_vec();
    bulk.extend_from_slice(&frame);
    let args = decode(desc, &[64, 0x1000], &[0, 64 | COMPRESSED_FLAG], &bulk, &mut FakeTables::default())
        .expect("a compressed input");
    assert_eq!(args[1], Arg::Buf(BufArg::Compressed { len: 64, frame: &frame[..] }));
    // Anywhere else it breaks the protocol: an output, a record, a wrong length, a frame no
    // smaller than the buffer, a frame past the bulk, sent by content too.
    let mut whole = 64u64.to_le_bytes().to_vec();
    whole.extend_from_slice(&[0u8; 64]);
    for (params, lens, bulk) in [
        (vec![count, buf(Dir::Out, None)], [0, 64 | COMPRESSED_FLAG], &bulk[..]),
        (vec![count, buf(Dir::In, Some("cudaMemcpy3DParms"))], [0, 64 | COMPRESSED_FLAG], &bulk[..]),
        (vec![count, buf(Dir::In, None)], [0, 65 | COMPRESSED_FLAG], &bulk[..]),
        (vec![count, buf(Dir::In, None)], [0, 64 | COMPRESSED_FLAG], &whole[..]),
        (vec![count, buf(Dir::In, None)], [0, 64 | COMPRESSED_FLAG], &bulk[..12]),
        (vec![count, buf(Dir::In, None)], [0, 64 | COMPRESSED_FLAG | CONTENT_FLAG], &bulk[..]),
    ] {
        let e = refused(params, &[64, 0x1000], &lens, bulk);
        assert_eq!(e.refusal(), Refusal::Fatal, "{e}");
    }
    // A few bytes may not stand for more than the worker holds for one input.
    let big = COMPRESS_MAX + 1;
    let e = refused(vec![count, buf(Dir::In, None)], &[big, 0x1000], &[0, big | COMPRESSED_FLAG], &bulk);
    assert_eq!(e, DecodeError::Compressed { param: 1 });
}

#[test]
fn an_array_sized_by_a_count_behind_a_pointer_round_trips_and_is_checked() {
    static FIRST: Len = Len::Deref(0);
    static LAST: Len = Len::Deref(1);
    let count = Wire::Buf { dir: Dir::InOut, elem: 4, len: None, record: None, optional: false };
    let array =
        |len: &'static Len| Wire::Buf { dir: Dir::InOut, elem: 8, len: Some(len), record: None, optional: false };
    let tables = &mut FakeTables::default();
    // The count before its array (NVML's process lists) and after it (NVML's char buffers).
    for (params, count_at) in [(vec![count, array(&FIRST)], 0), (vec![array(&LAST), count], 1)] {
        let desc = desc(params);
        let mut client = FakeClient::default();
        let mut args = vec![0; 2];
        args[count_at] = client.put(3u32.to_le_bytes().to_vec());
        args[1 - count_at] = client.put((0u8..24).collect());
        let encoded = encode(desc, &args, &mut client);
        let mut lens = vec![4; 2];
        lens[1 - count_at] = 24;
        assert_eq!(encoded.call.lens, lens, "three 8-byte elements and the count");
        assert_eq!(encoded.outputs.len(), 2);
        let bulk = client.bulk(&encoded);
        let got = decode(desc, &encoded.call.args, &encoded.call.lens, &bulk, tables).unwrap();
        assert_eq!(
            got[1 - count_at],
            Arg::Buf(BufArg::Present {
                len: 24,
                input: Some(Box::leak((0u8..24).collect::<Vec<_>>().into_boxed_slice()))
            })
        );
        // A length other than the count's: the client broke the protocol.
        let mut bad = encoded.call.lens.clone();
        bad[1 - count_at] = 16;
        let short: Vec<u8> = if count_at == 0 {
            [&bulk[..4], &bulk[4..20]].concat()
        } else {
            bulk[..16].iter().chain(&bulk[24..]).copied().collect()
        };
        let e = decode(desc, &encoded.call.args, &bad, &short, tables).unwrap_err();
        assert_eq!(e, DecodeError::Length { param: 1 - count_at, got: 16, expected: 24 });
        assert_eq!(e.refusal(), Refusal::Fatal);
        // The array at NULL: a count of 0 asks for the count; any other is refused.
        let mut null_args = args.clone();
        null_args[1 - count_at] = 0;
        let mut null_lens = vec![4; 2];
        null_lens[1 - count_at] = NULL_LEN;
        let e = decode(desc, &null_args, &null_lens, &3u32.to_le_bytes(), tables).unwrap_err();
        assert!(matches!(e, DecodeError::Null { .. }), "{e:?}");
        assert_eq!(e.refusal(), Refusal::InvalidValueQuietly);
        let zero = 0u32.to_le_bytes();
        let got = decode(desc, &null_args, &null_lens, &zero, tables).unwrap();
        assert_eq!(got[1 - count_at], Arg::Buf(BufArg::Absent));
        // The count at NULL: no length, the library's invalid value.
        let mut no_count = args.clone();
        no_count[count_at] = 0;
        let encoded = encode(desc, &no_count, &mut client);
        assert_eq!(encoded.call.lens[count_at], NULL_LEN);
        let e = decode(desc, &encoded.call.args, &encoded.call.lens, &[], tables).unwrap_err();
        assert_eq!(e, DecodeError::NoLength { param: 1 - count_at });
        assert_eq!(e.refusal(), Refusal::InvalidValue);
    }
    // A count past what a call may carry is not read from the program.
    let desc = desc(vec![count, array(&FIRST)]);
    let mut client = FakeClient::default();
    let args = [client.put(u32::MAX.to_le_bytes().to_vec()), 0x9000];
    let encoded = encode(desc, &args, &mut client);
    assert_eq!(encoded.inputs.len(), 1, "only the count");
    let e = decode(desc, &encoded.call.args, &encoded.call.lens, &client.bulk(&encoded), tables).unwrap_err();
    assert_eq!(e, DecodeError::TooLarge { param: 1, count: u64::from(u32::MAX), elem: 8 });
}

#[test]
fn an_array_of_a_told_length_travels_as_told_and_whole() {
    static TOLD: Len = Len::Told;
    let array = Wire::Buf { dir: Dir::In, elem: 4, len: Some(&TOLD), record: None, optional: false };
    let desc = desc(vec![Wire::Val { bytes: 8, float: false }, array]);
    let tables = &mut FakeTables::default();
    let mut client = FakeClient::default();
    let args = [7, client.put((0u8..40).collect())];
    // Untold: nothing is read, and the worker's own check refuses what arrives.
    let encoded = encode(desc, &args, &mut client);
    assert_eq!((encoded.call.lens[1], encoded.inputs.len()), (0, 0));
    // Told 6 elements: 24 of the array's bytes.
    client.told.insert(1, 6);
    let encoded = encode(desc, &args, &mut client);
    assert_eq!(encoded.call.lens[1], 24);
    let bulk = client.bulk(&encoded);
    let got = decode(desc, &encoded.call.args, &encoded.call.lens, &bulk, tables).unwrap();
    let input: &'static [u8] = Box::leak((0u8..24).collect::<Vec<_>>().into_boxed_slice());
    assert_eq!(got[1], Arg::Buf(BufArg::Present { len: 24, input: Some(input) }));
    // A torn element: the client broke the protocol.
    let e = decode(desc, &encoded.call.args, &[0, 22], &bulk[..22], tables).unwrap_err();
    assert_eq!(e, DecodeError::Length { param: 1, got: 22, expected: 20 });
    assert_eq!(e.refusal(), Refusal::Fatal);
    // At NULL: no array (the function's check says whether it may be).
    let got = decode(desc, &[7, 0], &[0, NULL_LEN], &[], tables).unwrap();
    assert_eq!(got[1], Arg::Buf(BufArg::Absent));
    // Longer than a call may carry.
    let e = decode(desc, &[7, 1], &[0, MAX_BUFFER + 4], &[], tables).unwrap_err();
    assert!(matches!(e, DecodeError::Length { param: 1, .. }), "{e:?}");
}
