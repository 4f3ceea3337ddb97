//! The argument codec: how the parameters of a call described by a [`CallDesc`] travel.
//!
//! One encoder/decoder pair for both sides. The client's [`encode`] turns the raw argument
//! words of a call into the [`Call`] archive (arguments and one length per parameter) and
//! the host memory it sends after it (inputs) or receives into (outputs); it never reads
//! host memory itself, the caller does, from the [`Span`]s it is given. The worker's
//! [`decode`] parses that back into one [`Arg`] per parameter: every length checked against
//! the descriptor, the arguments and [`MAX_BUFFER`], every bulk byte accounted for, every
//! handle checked against the session's tables and every device address against its
//! memory (through [`Tables`]). A malformed argument is a [`DecodeError`] whose
//! [`DecodeError::refusal`] says how the worker answers: with the library's invalid-value or
//! invalid-handle status, or by ending the session. Nothing in here panics on hostile input.
//!
//! The wire form per kind of parameter ([`Wire`]):
//!
//! | kind | argument word | length | bulk |
//! | --- | --- | --- | --- |
//! | `Val`, `Device`, `Handle` | the value | 0 | — |
//! | `Null`, `Scratch` | ignored | 0 | — |
//! | `SizedScratch` | the workspace's bytes | 0 | — |
//! | `ByValRecord` | the client's address | `bytes` | the record |
//! | `OutHandle` | the client's address, or the name it gave (`named`) | 8, or [`NULL_LEN`] | — |
//! | `RecordHandle` | the id the program's record holds (0 at NULL) | 0 | — |
//! | `NewRecordHandle` | the client's address, or the name it gave (`named`) | 8, or [`NULL_LEN`] | — |
//! | `Str` | the client's address | bytes with the NUL, or [`NULL_LEN`] | the string |
//! | `Scalar` (host mode) | the client's address | its bytes ([`scalar_bytes`]), or [`NULL_LEN`] | the value, unless `Out` |
//! | `Scalar` (device mode) | a device address | [`DEVICE_LEN`], or [`device_len`] of its width | — |
//! | `Handles` | the client's address | 8 × count, or [`NULL_LEN`] | the handles |
//! | `Buf` | the client's address | elem × count, or [`NULL_LEN`] | the elements, unless `Out` |
//! | `Buf` of a [`Len::Told`] length | the client's address | elem × what the client told, or [`NULL_LEN`] | the elements |
//!
//! A count behind a pointer ([`Len::Deref`]: NVML's `unsigned int *count`) is read by the
//! client ([`Client::word`]); the decoder checks such an array's length against the count's
//! own bytes once every parameter is decoded (the count may come after the array).

use crate::desc::{CallDesc, DEVICE_LEN, Dir, HandleKind, Len, Wire, device_len, device_width, word_at};
use crate::messages::{COMPRESS_MAX, COMPRESSED_FLAG, CONTENT_FLAG, Call, NULL_LEN};

/// Largest host buffer one call may move (a frame's bulk section is no larger).
pub const MAX_BUFFER: u64 = crate::frame::MAX_BULK;

/// What the encoder asks of the client.
pub trait Client {
    /// Bytes of the NUL-terminated string at `addr`, the NUL included.
    fn c_str_len(&mut self, addr: u64) -> u64;
    /// How the scalars of a call whose pointer-mode argument (a library handle) is `mode`
    /// travel: one lookup per scalar, on every BLAS call.
    fn scalar_mode(&mut self, mode: u64) -> ScalarMode;
    /// A new name for a handle the client names itself.
    fn new_name(&mut self) -> u64;
    /// The integer of `bytes` (4 or 8, little-endian) at the non-null `addr` in the
    /// program's memory: a length the caller passes by pointer ([`Len::Deref`]).
    fn word(&mut self, addr: u64, bytes: u64) -> Option<u64>;
    /// The elements of input array `param` whose length only the caller's data gives
    /// ([`Len::Told`]), as the client's custom code worked it out for this call. None (the
    /// default): the array travels as 0 bytes and the worker refuses the call.
    fn told(&mut self, _param: usize) -> Option<u64> {
        None
    }
}

/// What the client knows of a handle's scalars.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ScalarMode {
    /// Device pointer mode: the scalars are device addresses.
    pub device: bool,
    /// Bytes of an input scalar whose size no argument gives (cuBLASLt: the matmul
    /// descriptor's scale type). None: the widest the parameter may be is read.
    pub bytes: Option<u64>,
    /// Whether the call's later scalars (beta) are device addresses, where that differs
    /// from the first's (cuSPARSELt: alpha and beta vector scaling are set apart). None:
    /// every scalar of the call follows `device`.
    pub later_device: Option<bool>,
}

/// A range of the program's memory and the parameter it belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    pub param: usize,
    pub addr: u64,
    pub len: usize,
}

/// A call ready to send.
#[derive(Debug, Clone, PartialEq)]
pub struct Encoded {
    /// The archive: argument words (names in place of the program's addresses where the
    /// client names a new handle) and one length per parameter.
    pub call: Call,
    /// Host memory sent after the archive, in parameter order: the bulk section is their
    /// bytes back to back.
    pub inputs: Vec<Span>,
    /// Host memory the reply's outputs land in, in parameter order.
    pub outputs: Vec<Span>,
    /// Handles the client named: (the program's pointer to the handle, the name to write).
    pub names: Vec<(u64, u64)>,
}

/// Elements of a `Buf` or `Handles` parameter: None where the arguments give no length.
fn count_of(len: Option<&'static Len>, args: &[u64]) -> Option<u64> {
    match len {
        Some(expr) => expr.eval(args),
        None => Some(1),
    }
}

/// Bytes of the integer a [`Len::Deref`] of parameter `p` reads: `p` must be a one-element
/// buffer of 4 or 8 bytes the caller fills (`in` or `inout`).
pub fn deref_bytes(desc: &CallDesc, p: u8) -> Option<u64> {
    match desc.params.get(usize::from(p))? {
        &Wire::Buf { dir: Dir::In | Dir::InOut, elem: elem @ (4 | 8), len: None, record: None, .. } => {
            Some(u64::from(elem))
        }
        _ => None,
    }
}

/// Bytes of `count` elements of `elem` bytes, where one call may carry them.
fn bounded(count: u64, elem: u64) -> Option<u64> {
    count.checked_mul(elem).filter(|&b| b <= MAX_BUFFER)
}

/// Bytes a host-mode scalar parameter travels as, for these arguments: its type's, or for
/// an untyped scalar what its type parameter gives (None: a type it has no size for).
pub fn scalar_bytes(wire: &Wire, args: &[u64]) -> Option<u64> {
    match *wire {
        Wire::Scalar { bytes, size: None, .. } => Some(u64::from(bytes)),
        Wire::Scalar { bytes, size: Some(size), .. } => size.eval(args).filter(|&b| b > 0 && b <= u64::from(bytes)),
        _ => None,
    }
}

/// Encode a call's raw arguments by its descriptor. A length the arguments do not give, or
/// one larger than a call may carry, travels as 0 with no bytes: the worker refuses it
/// with the library's invalid-value status, and the program's memory is not read.
pub fn encode(desc: &CallDesc, args: &[u64], client: &mut impl Client) -> Encoded {
    let n = desc.params.len();
    let mut call = Call { args: (0..n).map(|i| args.get(i).copied().unwrap_or(0)).collect(), lens: vec![0; n] };
    let (mut inputs, mut outputs, mut names) = (Vec::new(), Vec::new(), Vec::new());
    for (i, wire) in desc.params.iter().enumerate() {
        let a = call.args[i];
        let span = |len: u64| Span { param: i, addr: a, len: len as usize };
        let lens = &mut call.lens;
        match *wire {
            Wire::Val { .. }
            | Wire::Device
            | Wire::Handle { .. }
            | Wire::Null
            | Wire::Scratch { .. }
            | Wire::SizedScratch => {}
            // The id the program's record holds goes as the argument word (NULL stays 0).
            Wire::RecordHandle { .. } => call.args[i] = if a == 0 { 0 } else { client.word(a, 8).unwrap_or(0) },
            Wire::ByValRecord { bytes } => {
                lens[i] = u64::from(bytes);
                inputs.push(span(u64::from(bytes)));
            }
            _ if a == 0 => lens[i] = NULL_LEN,
            // A new record's id lands in its first 8 bytes, as a new handle does at its pointer.
            Wire::NewRecordHandle { named, .. } | Wire::OutHandle { named, .. } => {
                lens[i] = 8;
                if named {
                    // The client names the handle: the caller has it at once, and the
                    // worker maps the name to the library's handle.
                    let name = client.new_name();
                    names.push((a, name));
                    call.args[i] = name;
                } else {
                    outputs.push(span(8));
                }
            }
            Wire::Str => {
                let len = client.c_str_len(a);
                lens[i] = len;
                inputs.push(span(len));
            }
            Wire::Scalar { dir, mode, size, bytes: widest } => {
                // The mode's handle as it travels (a record handle's id, not its address).
                let known = client.scalar_mode(call.args.get(usize::from(mode)).copied().unwrap_or(0));
                // Only where the mode says so is an earlier scalar of the same mode looked for.
                let device = match known.later_device {
                    Some(device)
                        if desc.params[..i].iter().any(|w| matches!(*w, Wire::Scalar { mode: m, .. } if m == mode)) =>
                    {
                        device
                    }
                    _ => known.device,
                };
                if device {
                    // The width the client knows of an untyped scalar (its handle's scale
                    // type) goes along: the worker checks that much device memory.
                    let told = known.bytes.filter(|&b| size.is_none() && b > 0 && b < u64::from(widest));
                    lens[i] = told.map_or(DEVICE_LEN, device_len);
                    continue;
                }
                let told = match (dir, size) {
                    (Dir::In, None) => known.bytes.filter(|&b| b > 0 && b <= u64::from(widest)),
                    _ => None,
                };
                let Some(bytes) = told.or_else(|| scalar_bytes(wire, args)).filter(|&b| b <= MAX_BUFFER) else {
                    continue;
                };
                lens[i] = bytes;
                if dir != Dir::Out {
                    inputs.push(span(bytes));
                }
                if dir != Dir::In {
                    outputs.push(span(bytes));
                }
            }
            Wire::Handles { len, .. } => {
                let Some(bytes) = count_of(Some(len), args).and_then(|c| bounded(c, 8)) else { continue };
                lens[i] = bytes;
                inputs.push(span(bytes));
            }
            Wire::Buf { dir, elem, len, .. } => {
                // One walk of the length: a count behind a pointer is read where it occurs.
                let count = match len {
                    Some(Len::Told) => client.told(i),
                    Some(expr) => expr.eval_with(args, &mut |p| {
                        let bytes = deref_bytes(desc, p)?;
                        let addr = args.get(usize::from(p)).copied().filter(|&a| a != 0)?;
                        client.word(addr, bytes)
                    }),
                    None => Some(1),
                };
                let Some(bytes) = count.and_then(|c| bounded(c, u64::from(elem))) else { continue };
                lens[i] = bytes;
                if dir != Dir::Out {
                    inputs.push(span(bytes));
                }
                if dir != Dir::In {
                    outputs.push(span(bytes));
                }
            }
        }
    }
    Encoded { call, inputs, outputs, names }
}

/// What the decoder asks of the worker's session.
pub trait Tables {
    /// The library's handle that `value` of `kind` stands for in this session.
    fn resolve(&mut self, kind: HandleKind, value: u64) -> Option<u64>;
    /// Whether the client may name a new handle of `kind` `value`.
    fn name_free(&mut self, kind: HandleKind, value: u64) -> bool;
    /// Whether parameter `param` may be NULL although its kind never is a NULL handle
    /// elsewhere (a function that does not use the handle), or is an output handle the API
    /// takes NULL for (the library gets NULL, not a buffer). None by default.
    fn null_ok(&mut self, _param: usize) -> bool {
        false
    }
    /// Check the device address `addr` of parameter `param`: a `Device` parameter (`bytes`
    /// None: its extent is the session's to work out from the arguments) or a scalar in
    /// device pointer mode of `bytes`. Ok: the address the library is given (the session's
    /// may lie elsewhere than the client names it); Err: why it is not the session's memory.
    fn device(&mut self, param: usize, addr: u64, bytes: Option<u64>) -> Result<u64, String>;
}

/// One decoded parameter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Arg<'f> {
    /// A value by value (`Val`; `Null` is 0).
    Val(u64),
    /// A device address of the session's memory.
    Device(u64),
    /// A zeroed output of this many bytes that no one reads.
    Scratch(usize),
    /// A handle of the session: the client's value and the library's.
    Handle {
        kind: HandleKind,
        value: u64,
        real: u64,
        destroy: bool,
    },
    /// A record by value, as the client sent it.
    Record(&'f [u8]),
    /// A pointer the library writes a new handle through; `named`: the argument word is the
    /// name the client gave it.
    NewHandle {
        kind: HandleKind,
        named: bool,
    },
    /// A record of `bytes` the library initializes, which the worker keeps: the new
    /// handle's id goes back in 8 bytes, or with `named` the argument word is the name the
    /// client gave it.
    NewRecord {
        kind: HandleKind,
        bytes: usize,
        named: bool,
    },
    /// A host scalar of `bytes` bytes: its value (`In`, `InOut`) or None (`Out`).
    Scalar {
        dir: Dir,
        bytes: usize,
        input: Option<&'f [u8]>,
    },
    /// A scalar in device pointer mode: a device address of the session's memory.
    ScalarDevice(u64),
    /// A NUL-terminated string (its NUL included), or NULL.
    Str(Option<&'f [u8]>),
    /// An array of handles, mapped to the library's (8 bytes each), or NULL with none.
    Handles(Option<Vec<u8>>),
    Buf(BufArg<'f>),
}

/// A decoded host buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BufArg<'f> {
    /// NULL, which the library is given: an empty array, an optional input, or an output
    /// array at NULL that asks for a count only.
    Absent,
    /// NULL where the library writes one value: it writes into a buffer no one reads, of
    /// `bytes` (None: an element too large for a call).
    Discarded { bytes: Option<u64> },
    /// `len` bytes: their value from the frame (`In`, `InOut`), or None (`Out`).
    Present { len: u64, input: Option<&'f [u8]> },
    /// `len` input bytes sent by content ([`CONTENT_FLAG`]): the SHA-256 of bytes the
    /// server keeps for the session.
    Content { len: u64, hash: [u8; 32] },
    /// `len` input bytes sent compressed ([`COMPRESSED_FLAG`]): a zstd frame of fewer bytes
    /// that the worker expands (to exactly `len` bytes, or it refuses the call).
    Compressed { len: u64, frame: &'f [u8] },
}

/// Why the decoder refused a call's arguments.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("{args} arguments and {lens} lengths for {params} parameters")]
    Arity { params: usize, args: usize, lens: usize },
    #[error("parameter {param}: the bulk section is too short")]
    Truncated { param: usize },
    #[error("{0} unexpected bulk bytes")]
    Leftover(usize),
    #[error("parameter {param}: {got} bytes, the descriptor and the arguments say {expected}")]
    Length { param: usize, got: u64, expected: u64 },
    #[error("parameter {param}: the string is not NUL-terminated")]
    Unterminated { param: usize },
    #[error("parameter {param}: the arguments give no length")]
    NoLength { param: usize },
    #[error("parameter {param}: {count} × {elem} bytes are more than one call may carry")]
    TooLarge { param: usize, count: u64, elem: u64 },
    #[error("parameter {param}: {what}")]
    Null { param: usize, what: String },
    #[error("parameter {param}: {value:#x}{} is not a handle of this session", element.map(|e| format!(" (element {e})")).unwrap_or_default())]
    Handle { param: usize, kind: HandleKind, value: u64, element: Option<usize> },
    #[error("parameter {param}: the client named two handles {value:#x}")]
    NameTaken { param: usize, kind: HandleKind, value: u64 },
    #[error("parameter {param}: {why}")]
    Device { param: usize, why: String },
    #[error("parameter {param}: sent by content, which only a plain input buffer may be")]
    Content { param: usize },
    #[error(
        "parameter {param}: sent compressed, which only a plain input buffer of at most 64 MiB may be, in fewer bytes"
    )]
    Compressed { param: usize },
}

/// How the worker answers a [`DecodeError`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The frame breaks the protocol (a client of this release never sends it): the
    /// session ends.
    Fatal,
    /// The library's invalid-value status.
    InvalidValue,
    /// The library's invalid-value status without a log line: a NULL the library would
    /// dereference, which a program testing its error paths passes on purpose.
    InvalidValueQuietly,
    /// The library's invalid-handle status.
    InvalidHandle,
}

impl DecodeError {
    pub fn refusal(&self) -> Refusal {
        match self {
            DecodeError::Arity { .. }
            | DecodeError::Truncated { .. }
            | DecodeError::Leftover(_)
            | DecodeError::Length { .. }
            | DecodeError::Unterminated { .. }
            | DecodeError::Content { .. }
            | DecodeError::Compressed { .. } => Refusal::Fatal,
            DecodeError::NoLength { .. } | DecodeError::TooLarge { .. } | DecodeError::Device { .. } => {
                Refusal::InvalidValue
            }
            DecodeError::Null { .. } => Refusal::InvalidValueQuietly,
            DecodeError::Handle { .. } | DecodeError::NameTaken { .. } => Refusal::InvalidHandle,
        }
    }
}

/// Functions whose only host input arrays are a graph's edge data, which may be NULL with
/// a nonzero count (default edges): adding and removing dependencies, capturing into a
/// graph, updating a capture's dependencies.
fn edge_data(name: &str) -> bool {
    let name = crate::desc::strip_suffixes(name, &["_ptsz", "_ptds"]);
    name.starts_with("cudaGraph")
        || name.starts_with("cuGraph")
        || ((name.starts_with("cudaStream") || name.starts_with("cuStream")) && name.contains("Capture"))
}

/// The bulk section, taken buffer by buffer.
struct Bulk<'f> {
    bytes: &'f [u8],
    at: usize,
}

impl<'f> Bulk<'f> {
    fn take(&mut self, param: usize, len: u64) -> Result<&'f [u8], DecodeError> {
        let truncated = DecodeError::Truncated { param };
        let len = usize::try_from(len).map_err(|_| truncated.clone())?;
        let end = self.at.checked_add(len).ok_or(truncated.clone())?;
        let s = self.bytes.get(self.at..end).ok_or(truncated)?;
        self.at = end;
        Ok(s)
    }
}

/// Decode the arguments of a call: `args` and `lens` from its archive (with the values its
/// wire form fixes already in place), `bulk` its bulk section.
pub fn decode<'f>(
    desc: &CallDesc,
    args: &[u64],
    lens: &[u64],
    bulk: &'f [u8],
    tables: &mut impl Tables,
) -> Result<Vec<Arg<'f>>, DecodeError> {
    let n = desc.params.len();
    if args.len() != n || lens.len() != n {
        return Err(DecodeError::Arity { params: n, args: args.len(), lens: lens.len() });
    }
    let mut bulk = Bulk { bytes: bulk, at: 0 };
    let mut out = Vec::with_capacity(n);
    // Buffers whose length is behind a pointer parameter, perhaps a later one: (parameter,
    // its length expression, element bytes, the bytes the client declared or None at NULL),
    // checked once every parameter is decoded.
    let mut deferred: Vec<(usize, &'static Len, u64, Option<u64>, bool)> = Vec::new();
    for (i, wire) in desc.params.iter().enumerate() {
        let (a, len) = (args[i], lens[i]);
        let null = |what: String| DecodeError::Null { param: i, what };
        let arg = match *wire {
            Wire::Val { .. } => Arg::Val(a),
            Wire::Null => Arg::Val(0),
            Wire::Scratch { bytes } => Arg::Scratch(bytes as usize),
            Wire::SizedScratch => match usize::try_from(a) {
                Ok(bytes) if a <= MAX_BUFFER => Arg::Scratch(bytes),
                _ => return Err(DecodeError::TooLarge { param: i, count: a, elem: 1 }),
            },
            Wire::Device => {
                Arg::Device(tables.device(i, a, None).map_err(|why| DecodeError::Device { param: i, why })?)
            }
            Wire::Handle { kind, destroy } | Wire::RecordHandle { kind, destroy } => {
                let real = match a {
                    0 if tables.null_ok(i) => Some(0),
                    _ => tables.resolve(kind, a),
                }
                .ok_or(DecodeError::Handle { param: i, kind, value: a, element: None })?;
                Arg::Handle { kind, value: a, real, destroy }
            }
            Wire::NewRecordHandle { kind, bytes, named } => {
                if len == NULL_LEN {
                    return Err(null("NULL where the new record is".into()));
                }
                if len != 8 {
                    return Err(DecodeError::Length { param: i, got: len, expected: 8 });
                }
                if named && !tables.name_free(kind, a) {
                    return Err(DecodeError::NameTaken { param: i, kind, value: a });
                }
                Arg::NewRecord { kind, bytes: bytes as usize, named }
            }
            Wire::ByValRecord { bytes } => {
                if len != u64::from(bytes) {
                    return Err(DecodeError::Length { param: i, got: len, expected: u64::from(bytes) });
                }
                Arg::Record(bulk.take(i, len)?)
            }
            Wire::OutHandle { kind, named } => {
                // A NULL output reaches the library only where its API takes one (`null_ok`:
                // cuCtxPopCurrent's popped context, the graph of a capture into an existing
                // one); no handle is made then.
                if len == NULL_LEN && tables.null_ok(i) {
                    Arg::Val(0)
                } else if len == NULL_LEN {
                    return Err(null("NULL where the new handle is written".into()));
                } else {
                    if named && !tables.name_free(kind, a) {
                        return Err(DecodeError::NameTaken { param: i, kind, value: a });
                    }
                    Arg::NewHandle { kind, named }
                }
            }
            Wire::Scalar { dir, .. } => {
                if len == NULL_LEN {
                    return Err(null("a NULL scalar".into()));
                }
                let Some(bytes) = scalar_bytes(wire, args) else {
                    return Err(DecodeError::NoLength { param: i });
                };
                if let Some(told) = device_width(len) {
                    if a == 0 {
                        return Err(DecodeError::Device {
                            param: i,
                            why: "a NULL scalar in device pointer mode".into(),
                        });
                    }
                    // A width the client told, where no argument gives one: no wider than
                    // the parameter may be.
                    let untyped = matches!(wire, Wire::Scalar { size: None, .. });
                    let bytes = if told > 0 && untyped { told.min(bytes) } else { bytes };
                    Arg::ScalarDevice(
                        tables.device(i, a, Some(bytes)).map_err(|why| DecodeError::Device { param: i, why })?,
                    )
                } else {
                    // An input scalar whose size no argument gives may be shorter than the
                    // widest (the client knew its type): the worker pads it with zeros.
                    let shorter =
                        matches!(wire, Wire::Scalar { dir: Dir::In, size: None, .. }) && len > 0 && len < bytes;
                    if len != bytes && !shorter {
                        return Err(DecodeError::Length { param: i, got: len, expected: bytes });
                    }
                    let input = if dir == Dir::Out { None } else { Some(bulk.take(i, len)?) };
                    Arg::Scalar { dir, bytes: bytes as usize, input }
                }
            }
            Wire::Str => {
                if len == NULL_LEN {
                    Arg::Str(None)
                } else {
                    let s = bulk.take(i, len)?;
                    if s.last() != Some(&0) {
                        return Err(DecodeError::Unterminated { param: i });
                    }
                    Arg::Str(Some(s))
                }
            }
            Wire::Handles { kind, len: count } => {
                let count = count.eval(args).ok_or(DecodeError::NoLength { param: i })?;
                if len == NULL_LEN {
                    if count > 0 {
                        return Err(null(format!("NULL for {count} handles")));
                    }
                    out.push(Arg::Handles(None));
                    continue;
                }
                let expected = bounded(count, 8).ok_or(DecodeError::TooLarge { param: i, count, elem: 8 })?;
                if expected != len {
                    return Err(DecodeError::Length { param: i, got: len, expected });
                }
                let mut mapped = bulk.take(i, len)?.to_vec();
                for (at, chunk) in mapped.chunks_exact_mut(8).enumerate() {
                    let mut word = [0u8; 8];
                    word.copy_from_slice(chunk);
                    let value = u64::from_le_bytes(word);
                    let real = tables.resolve(kind, value).ok_or(DecodeError::Handle {
                        param: i,
                        kind,
                        value,
                        element: Some(at),
                    })?;
                    chunk.copy_from_slice(&real.to_le_bytes());
                }
                Arg::Handles(Some(mapped))
            }
            Wire::Buf { dir, elem, len: Some(expr), optional, .. } if expr.derefs() => {
                let elem = u64::from(elem);
                if len == NULL_LEN {
                    deferred.push((i, expr, elem, None, optional));
                    Arg::Buf(BufArg::Absent)
                } else {
                    // Only plain bytes (the client sends no other form for such a buffer).
                    if len & (CONTENT_FLAG | COMPRESSED_FLAG) != 0 {
                        return Err(DecodeError::Content { param: i });
                    }
                    if len > MAX_BUFFER {
                        return Err(DecodeError::TooLarge { param: i, count: len / elem.max(1), elem });
                    }
                    deferred.push((i, expr, elem, Some(len), optional));
                    let input = if dir == Dir::Out { None } else { Some(bulk.take(i, len)?) };
                    Arg::Buf(BufArg::Present { len, input })
                }
            }
            Wire::Buf { dir, elem, len: count, record, optional } => {
                // A length the client told (only its worker-side check says what the library
                // reads): whole elements, as many as it sent; at NULL, none.
                let told = matches!(count, Some(Len::Told));
                let count = if told { 0 } else { count_of(count, args).ok_or(DecodeError::NoLength { param: i })? };
                let elem = u64::from(elem);
                let expected = bounded(count, elem);
                // The buffer's length must be the one its count gives.
                let exactly = |len: u64| match expected {
                    _ if told => match bounded(len / elem.max(1), elem) {
                        Some(whole) if whole == len => Ok(()),
                        _ => Err(DecodeError::Length { param: i, got: len, expected: len / elem.max(1) * elem }),
                    },
                    None => Err(DecodeError::TooLarge { param: i, count, elem }),
                    Some(expected) if expected != len => Err(DecodeError::Length { param: i, got: len, expected }),
                    Some(_) => Ok(()),
                };
                if len != NULL_LEN && len & CONTENT_FLAG != 0 {
                    let len = len & !CONTENT_FLAG;
                    if dir != Dir::In || record.is_some() {
                        return Err(DecodeError::Content { param: i });
                    }
                    exactly(len)?;
                    let mut hash = [0u8; 32];
                    hash.copy_from_slice(bulk.take(i, 32)?);
                    out.push(Arg::Buf(BufArg::Content { len, hash }));
                    continue;
                }
                if len != NULL_LEN && len & COMPRESSED_FLAG != 0 {
                    let len = len & !COMPRESSED_FLAG;
                    if dir != Dir::In || record.is_some() || len & CONTENT_FLAG != 0 || len > COMPRESS_MAX {
                        return Err(DecodeError::Compressed { param: i });
                    }
                    exactly(len)?;
                    let mut n = [0u8; 8];
                    n.copy_from_slice(bulk.take(i, 8)?);
                    let n = u64::from_le_bytes(n);
                    if n >= len {
                        return Err(DecodeError::Compressed { param: i });
                    }
                    out.push(Arg::Buf(BufArg::Compressed { len, frame: bulk.take(i, n)? }));
                    continue;
                }
                if len == NULL_LEN {
                    let single = matches!(wire, Wire::Buf { len: None, .. });
                    let arg = if count == 0 || optional || (dir == Dir::In && (single || edge_data(desc.name))) {
                        // An empty array, or an optional input (NULL meaning "none", an array
                        // the spec lets be NULL, or for a graph's edge data "the default
                        // edges"), or an output the spec lets be NULL (`out?`: not asked;
                        // `null_asks_count`: an array at NULL asks for the count only,
                        // whatever count the caller named).
                        BufArg::Absent
                    } else if !single {
                        // An array at NULL is read or written by the library: refused.
                        return Err(null(format!("NULL for {count} elements")));
                    } else {
                        // A single value the library writes: it writes into a buffer no one
                        // reads (libraries differ on whether NULL is allowed there; none may
                        // crash the worker).
                        BufArg::Discarded { bytes: expected }
                    };
                    out.push(Arg::Buf(arg));
                    continue;
                }
                exactly(len)?;
                let input = if dir == Dir::Out { None } else { Some(bulk.take(i, len)?) };
                Arg::Buf(BufArg::Present { len, input })
            }
        };
        out.push(arg);
    }
    if bulk.at != bulk.bytes.len() {
        return Err(DecodeError::Leftover(bulk.bytes.len() - bulk.at));
    }
    for (i, expr, elem, len, optional) in deferred {
        let count = expr
            .eval_with(args, &mut |p| match out.get(usize::from(p))? {
                Arg::Buf(BufArg::Present { input: Some(bytes), .. }) => word_at(bytes, deref_bytes(desc, p)?),
                _ => None,
            })
            .ok_or(DecodeError::NoLength { param: i })?;
        match len {
            // An array at NULL is an empty one, or the library would write through NULL,
            // except where the API makes a NULL array ask for the count (`null_asks_count`).
            None if count > 0 && !optional => {
                return Err(DecodeError::Null { param: i, what: format!("NULL for {count} elements") });
            }
            None => {}
            Some(len) => {
                let expected = bounded(count, elem).ok_or(DecodeError::TooLarge { param: i, count, elem })?;
                if expected != len {
                    return Err(DecodeError::Length { param: i, got: len, expected });
                }
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
