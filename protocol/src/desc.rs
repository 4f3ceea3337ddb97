//! Call descriptors: the per-function wire schema that `cargo xtask gen` emits as static
//! tables (`chidori_cuda::calls`). A call travels as its id, the raw scalars of its
//! by-value parameters and the bytes of its input buffers; the reply carries the return
//! value, the scalars written through output pointers and the output buffers.

/// Index of a function in `chidori_cuda::calls::FUNCTIONS`; the same for every ABI variant.
pub type CallId = u32;

/// Index of a handle kind in `chidori_cuda::handles::KINDS`.
pub type HandleKind = u16;

/// The top 16 bits of a handle value the client sees, which say who named it.
pub const HANDLE_TAG_MASK: u64 = 0xffff_0000_0000_0000;
/// Names the client gives handles it creates without waiting.
///
/// Both tags lie above every user-space address (never a library's pointer) and below
/// 2^63: a handle stays positive as a signed 64-bit integer, as Python bindings need (CuPy
/// and cuda-python hold handles as `intptr_t` and refuse a negative one as `size_t`).
pub const CLIENT_NAME_TAG: u64 = 0x41d0 << 48;
/// Ids the worker gives handles the libraries hand out.
pub const WORKER_ID_TAG: u64 = 0x41d1 << 48;

/// The call classes of DESIGN §4.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Class {
    /// Answered in the client from cached state; no round trip.
    Local,
    /// Sent without waiting for a reply; errors surface at the next synchronizing call.
    Async,
    /// Sent and waited for.
    Sync,
    /// Hand-written.
    Custom,
}

/// A wire form of a custom function: one of the call descriptors its hand-written code picks
/// from per call (`wire.NAME` in the specs). The generator refuses a spec form this enum does
/// not name, so client and worker compare forms as values, never as strings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Form {
    /// The call as the program made it (after the client's own bookkeeping).
    Call,
    /// Sent without waiting.
    Async,
    /// A result or scalar that is a device address (device pointer mode).
    Device,
    /// A result received into a host buffer; also a host function that stays on the client
    /// (`cudaLaunchHostFunc`): the worker runs a stand-in that calls back.
    Host,
    /// cuDNN variant-pack data pointers with host scalars inline
    /// ([`crate::messages::HOST_VALUE_RECORD`]).
    HostValues,
    /// An attribute whose elements are descriptors (handles, checked and mapped).
    Descriptors,
    /// A new handle the client names itself.
    Named,
    /// A pool of handles made ahead (refilled in one round trip).
    Refill,
    /// Copies by direction: host to device, device to host, device to device.
    H2d,
    D2h,
    D2d,
    /// Copies between arrays and host or device memory.
    H2a,
    A2h,
    D2a,
    A2d,
    /// An attribute whose elements are library handles (cuDNN's CUDNN_TYPE_HANDLE): checked
    /// and mapped like handle arguments.
    Handles,
    /// A table in the library's own host memory, handed back by pointer (cuRAND's Sobol'
    /// tables): the first parameter's output buffer is the table's size, and the worker
    /// replaces the pointer the library wrote there with the bytes it points at.
    Table,
    /// A list of the GPU's processes (NVML's): the worker keeps the entries of the session's
    /// own worker process, under the program's PID.
    Processes,
}

impl Form {
    /// Every form, in declaration order.
    pub const ALL: &'static [Form] = &[
        Form::Call,
        Form::Async,
        Form::Device,
        Form::Host,
        Form::HostValues,
        Form::Descriptors,
        Form::Named,
        Form::Refill,
        Form::H2d,
        Form::D2h,
        Form::D2d,
        Form::H2a,
        Form::A2h,
        Form::D2a,
        Form::A2d,
        Form::Handles,
        Form::Table,
        Form::Processes,
    ];

    /// The form's name in the specs (`wire.h2d`).
    pub fn name(self) -> &'static str {
        match self {
            Form::Call => "call",
            Form::Async => "async",
            Form::Device => "device",
            Form::Host => "host",
            Form::HostValues => "hostvalues",
            Form::Descriptors => "descriptors",
            Form::Named => "named",
            Form::Refill => "refill",
            Form::H2d => "h2d",
            Form::D2h => "d2h",
            Form::D2d => "d2d",
            Form::H2a => "h2a",
            Form::A2h => "a2h",
            Form::D2a => "d2a",
            Form::A2d => "a2d",
            Form::Handles => "handles",
            Form::Table => "table",
            Form::Processes => "processes",
        }
    }

    /// The form a spec names `name`, if there is one.
    pub fn from_name(name: &str) -> Option<Form> {
        Form::ALL.iter().copied().find(|f| f.name() == name)
    }

    /// The name of the form's variant of this enum (`HostValues`), for generated code.
    pub fn variant(self) -> &'static str {
        match self {
            Form::Call => "Call",
            Form::Async => "Async",
            Form::Device => "Device",
            Form::Host => "Host",
            Form::HostValues => "HostValues",
            Form::Descriptors => "Descriptors",
            Form::Named => "Named",
            Form::Refill => "Refill",
            Form::H2d => "H2d",
            Form::D2h => "D2h",
            Form::D2d => "D2d",
            Form::H2a => "H2a",
            Form::A2h => "A2h",
            Form::D2a => "D2a",
            Form::A2d => "A2d",
            Form::Handles => "Handles",
            Form::Table => "Table",
            Form::Processes => "Processes",
        }
    }
}

/// Direction of a host buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dir {
    In,
    Out,
    InOut,
}

/// A buffer length in elements, as an expression over the raw parameter values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Len {
    Lit(u64),
    Param(u8),
    Add(&'static Len, &'static Len),
    /// None (no length) where it would be negative.
    Sub(&'static Len, &'static Len),
    Mul(&'static Len, &'static Len),
    /// `a / b`, rounded down; None where `b` is 0.
    Div(&'static Len, &'static Len),
    /// Element size by the enum value of parameter `.0` (None outside the table).
    Table(u8, &'static [u32]),
    /// The integer parameter `.0` points at, as the caller passed it: a length the caller
    /// gives by pointer and the library overwrites (NVML's `unsigned int *count`). That
    /// parameter is a one-element `inout` buffer of 4 or 8 bytes.
    Deref(u8),
    /// A length only the caller's data gives (cuDNN's v7 CTC loss: label arrays as long as
    /// a descriptor's batch and the sum of the label lengths). The client's custom code
    /// works it out and tells the encoder ([`crate::codec::Client::told`]); the decoder
    /// takes the length sent, and the worker checks it against what the library will read
    /// before the call (a check of the function's own: none, and the call is refused).
    /// Only a whole input array's length, never part of an expression.
    Told,
}

impl Len {
    /// Evaluate over the raw parameter values; None on overflow, a bad index, a length
    /// behind a pointer ([`Len::Deref`]: see [`Len::eval_with`]) or one told ([`Len::Told`]).
    pub fn eval(&self, args: &[u64]) -> Option<u64> {
        self.eval_with(args, &mut |_| None)
    }

    /// Evaluate, with `deref(p)` giving the integer parameter `p` points at.
    pub fn eval_with(&self, args: &[u64], deref: &mut dyn FnMut(u8) -> Option<u64>) -> Option<u64> {
        match *self {
            Len::Lit(n) => Some(n),
            Len::Param(i) => args.get(usize::from(i)).copied(),
            Len::Add(a, b) => a.eval_with(args, deref)?.checked_add(b.eval_with(args, deref)?),
            Len::Sub(a, b) => a.eval_with(args, deref)?.checked_sub(b.eval_with(args, deref)?),
            Len::Mul(a, b) => a.eval_with(args, deref)?.checked_mul(b.eval_with(args, deref)?),
            Len::Div(a, b) => a.eval_with(args, deref)?.checked_div(b.eval_with(args, deref)?),
            Len::Table(i, sizes) => {
                let v = usize::try_from(*args.get(usize::from(i))?).ok()?;
                sizes.get(v).map(|s| u64::from(*s))
            }
            Len::Deref(p) => deref(p),
            Len::Told => None,
        }
    }

    /// Whether the length depends on a value behind a pointer.
    pub fn derefs(&self) -> bool {
        match *self {
            Len::Lit(_) | Len::Param(_) | Len::Table(..) | Len::Told => false,
            Len::Add(a, b) | Len::Sub(a, b) | Len::Mul(a, b) | Len::Div(a, b) => a.derefs() || b.derefs(),
            Len::Deref(_) => true,
        }
    }
}

impl Wire {
    /// Whether this is an input array whose length the client tells ([`Len::Told`]).
    pub fn told(&self) -> bool {
        matches!(*self, Wire::Buf { len: Some(Len::Told), .. })
    }
}

/// The integer of `bytes` (4 or 8, little-endian) at the start of `buf`; None for other
/// sizes or a shorter buffer.
pub fn word_at(buf: &[u8], bytes: u64) -> Option<u64> {
    match bytes {
        4 => buf.first_chunk::<4>().map(|w| u64::from(u32::from_le_bytes(*w))),
        8 => buf.first_chunk::<8>().map(|w| u64::from_le_bytes(*w)),
        _ => None,
    }
}

/// How one parameter travels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Wire {
    /// Integer, enum or float by value; `bytes` of the raw u64 are significant.
    Val { bytes: u8, float: bool },
    /// An opaque handle by value, checked against the session's table of `kind`.
    Handle { kind: HandleKind, destroy: bool },
    /// A device address by value, passed through unchanged.
    Device,
    /// A plain record passed by value; the raw argument points at a copy of it.
    ByValRecord { bytes: u32 },
    /// Pointer to a handle the callee creates; the worker records it in its table.
    /// `named`: the client names the handle itself (a value it writes before sending; the
    /// worker maps it to the real one), so the call needs no reply.
    OutHandle { kind: HandleKind, named: bool },
    /// Input array of `len` handles of `kind` (8 bytes each), every one checked against the
    /// session's table and mapped to the library's handle, as a [`Wire::Handle`] is.
    Handles { kind: HandleKind, len: &'static Len },
    /// A pointer to a record the program holds for the library (cuSPARSELt's handle,
    /// descriptors and plans: 1 KiB the library fills with its own pointers). The worker
    /// keeps the library's record; the program's holds the handle's id in its first 8
    /// bytes. The client sends that id as the argument word, which is then checked and
    /// mapped as a [`Wire::Handle`] is (to the worker's record).
    RecordHandle { kind: HandleKind, destroy: bool },
    /// A pointer to a record the program holds, which the call initializes: the worker
    /// passes a zeroed record of `bytes` it keeps, and the reply's 8 bytes (the new
    /// handle's id) land at the start of the program's record. `named`: the client names
    /// the handle itself, writing the name into the record before sending (the worker maps
    /// it), so the call needs no reply.
    NewRecordHandle { kind: HandleKind, bytes: u32, named: bool },
    /// Host buffer of `len` (None: one) elements of `elem` bytes. `record` names the struct
    /// for layout translation between the client's and the server's CUDA version.
    /// `optional`: an input array the API lets be NULL whatever its count says (cuFFT's
    /// `inembed`: NULL means the basic layout), or one output it lets be NULL (cuDNN's
    /// `bAddr`, spec `out?`); it then reaches the library as NULL.
    Buf { dir: Dir, elem: u32, len: Option<&'static Len>, record: Option<&'static str>, optional: bool },
    /// NUL-terminated input string.
    Str,
    /// Must be NULL; not sent.
    Null,
    /// An output no one reads (a call sent without waiting whose answer the client already
    /// has): nothing is sent; the worker passes a zeroed buffer of `bytes`.
    Scratch { bytes: u32 },
    /// A host workspace only an earlier size query sizes (no parameter carries its size):
    /// the client's custom code puts the byte count in the argument word, nothing else is
    /// sent, and the worker passes a zeroed buffer of that many bytes (at most
    /// [`crate::codec::MAX_BUFFER`]).
    SizedScratch,
    /// A BLAS scalar (alpha, beta, a reduction's result): while the pointer mode the
    /// client recorded for the handle in parameter `mode` is host, `bytes` travel (In) or
    /// come back (Out) like a one-element buffer; in device mode the argument is a device
    /// address and its length on the wire is [`DEVICE_LEN`]. `size`: an untyped scalar's
    /// (`const void *alpha`) bytes by its type parameter (`alphaType`, `computeType`), at
    /// most `bytes`; an untyped scalar without one travels as all `bytes`.
    Scalar { dir: Dir, bytes: u32, mode: u8, size: Option<&'static Len> },
}

/// A field of a record: where it lies in the layout of one CUDA version, and the values it
/// holds that matter to a check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FieldIs {
    pub offset: u32,
    /// 1, 2, 4 or 8 bytes, little-endian.
    pub size: u8,
    pub values: &'static [u64],
}

impl FieldIs {
    /// The field's value in `record`; None when the record is too short.
    pub fn read(&self, record: &[u8]) -> Option<u64> {
        let start = self.offset as usize;
        let bytes = record.get(start..start.checked_add(usize::from(self.size))?)?;
        let mut word = [0u8; 8];
        word.get_mut(..bytes.len())?.copy_from_slice(bytes);
        Some(u64::from_le_bytes(word))
    }

    /// Whether the field of `record` holds one of the values.
    pub fn holds(&self, record: &[u8]) -> bool {
        self.read(record).is_some_and(|v| self.values.contains(&v))
    }
}

/// A handle inside a record (8 bytes at `offset`), of `kind`; where `when` is set, the field
/// is a handle only while that other field holds one of its values (a union's member).
/// `written`: the call writes it (an error node), so what the client sent there is not
/// checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FieldHandle {
    pub offset: u32,
    pub kind: HandleKind,
    pub when: Option<FieldIs>,
    pub written: bool,
}

/// What the worker checks in an input record of one type at one CUDA version: its handles
/// (checked against the session's tables and mapped, as handle arguments are) and fields
/// restricted to some values (specs' `[record.NAME]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordChecks {
    pub size: u32,
    pub handles: &'static [FieldHandle],
    pub allow: &'static [FieldIs],
}

impl RecordChecks {
    /// Check every record of `bytes` (whole records, back to back) and map its handles in
    /// place with `resolve(kind, value)` (None: not a handle of the session).
    pub fn apply(
        &self,
        bytes: &mut [u8],
        mut resolve: impl FnMut(HandleKind, u64) -> Option<u64>,
    ) -> Result<(), RecordRefused> {
        let size = self.size as usize;
        if size == 0 || !bytes.len().is_multiple_of(size) {
            return Err(RecordRefused::Value(format!("{} bytes are no whole records of {size}", bytes.len())));
        }
        for (at, record) in bytes.chunks_exact_mut(size).enumerate() {
            for field in self.allow {
                if !field.holds(record) {
                    let value = field.read(record).unwrap_or(0);
                    let why = format!("record {at}: the field at {} holds {value}, which is not allowed", field.offset);
                    return Err(RecordRefused::Value(why));
                }
            }
            for h in self.handles {
                if h.written || h.when.is_some_and(|w| !w.holds(record)) {
                    continue;
                }
                let start = h.offset as usize;
                let Some(field) = record.get_mut(start..start + 8) else {
                    return Err(RecordRefused::Value(format!("record {at}: no field at {start}")));
                };
                let mut word = [0u8; 8];
                word.copy_from_slice(field);
                let value = u64::from_le_bytes(word);
                let Some(real) = resolve(h.kind, value) else {
                    let why = format!("record {at}: {value:#x} at {start} is not a handle of this session");
                    return Err(RecordRefused::Handle(why));
                };
                field.copy_from_slice(&real.to_le_bytes());
            }
        }
        Ok(())
    }

    /// Map the handles of records that come back (whole records, back to back) in place
    /// with `to_client(kind, value)`; a partial record at the end is left as it is.
    pub fn map_handles(&self, bytes: &mut [u8], mut to_client: impl FnMut(HandleKind, u64) -> u64) {
        let size = self.size as usize;
        if size == 0 {
            return;
        }
        for record in bytes.chunks_exact_mut(size) {
            for h in self.handles {
                if h.when.is_some_and(|w| !w.holds(record)) {
                    continue;
                }
                let start = h.offset as usize;
                let Some(field) = record.get_mut(start..start + 8).and_then(|f| f.first_chunk_mut::<8>()) else {
                    continue;
                };
                *field = to_client(h.kind, u64::from_le_bytes(*field)).to_le_bytes();
            }
        }
    }
}

/// Why [`RecordChecks::apply`] refused records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecordRefused {
    /// A handle field holds no handle of the session.
    Handle(String),
    /// A restricted field holds another value, or the bytes are no whole records.
    Value(String),
}

/// Length on the wire of a [`Wire::Scalar`] passed as a device address, of a width the
/// client does not know (the worker checks the widest the parameter may be).
pub const DEVICE_LEN: u64 = u64::MAX - 1;

/// Widest scalar whose width a device length can tell.
pub const DEVICE_LEN_MAX_WIDTH: u64 = 255;

/// Length on the wire of a [`Wire::Scalar`] passed as a device address of `bytes` (1 to
/// [`DEVICE_LEN_MAX_WIDTH`]): an untyped scalar whose width the client knows from the
/// handle's scale type, of which the worker checks only that many bytes of device memory
/// (a float alpha in a 4-byte allocation).
pub const fn device_len(bytes: u64) -> u64 {
    DEVICE_LEN - bytes
}

/// Of a scalar's wire length: None where it is no device length, else the width it tells
/// (0: not told, [`DEVICE_LEN`]).
pub fn device_width(len: u64) -> Option<u64> {
    (DEVICE_LEN - DEVICE_LEN_MAX_WIDTH..=DEVICE_LEN).contains(&len).then(|| DEVICE_LEN - len)
}

/// How the return value travels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Ret {
    /// The library's status type.
    Status,
    Val {
        bytes: u8,
        float: bool,
    },
    Void,
}

/// Status values of a library at the CUDA version a variant was generated from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Codes {
    pub success: i64,
    pub not_supported: i64,
    /// Answered while no server is reachable.
    pub unavailable: i64,
    /// Answered by the worker for a handle the session never created.
    pub invalid_handle: i64,
    /// A bad argument: answered by hand-written code for one, and by the worker for an
    /// argument it refuses before the library sees it (a NULL or out-of-range pointer, a
    /// device address outside the session's memory).
    pub invalid_value: i64,
}

/// What a hand-written implementation (`impl = "module::function"` in a spec) learns about
/// the export that called it: one function serves every CUDA version's variant.
#[derive(Debug, Clone, Copy)]
pub struct Ctx {
    /// The exported function's name.
    pub name: &'static str,
    /// The newest CUDA version whose callers use this variant.
    pub version: &'static str,
    pub library: &'static str,
    /// The variant's wire forms ([`Form::Call`], [`Form::H2d`], ...), as the spec declares them.
    pub forms: &'static [&'static CallDesc],
    /// The library's status codes at that version.
    pub codes: Codes,
}

impl Ctx {
    /// The wire form `form`. Panics if the spec declares no such form: a mismatch between a
    /// spec and its implementation, caught by the first test that calls it.
    pub fn form(&self, form: Form) -> &'static CallDesc {
        self.forms
            .iter()
            .find(|d| d.form == Some(form))
            .copied()
            .unwrap_or_else(|| panic!("{} has no wire form {form:?} (specs and custom code disagree)", self.name))
    }

    /// The export's name without its per-thread suffix: what logs and traces call it.
    pub fn base_name(&self) -> &'static str {
        strip_suffixes(self.name, &["_ptsz", "_ptds"])
    }

    /// Whether the export is a per-thread-default-stream entry point (`_ptsz`, `_ptds`).
    pub fn per_thread(&self) -> bool {
        self.name.ends_with("_ptsz") || self.name.ends_with("_ptds")
    }

    /// The stream a call of this export means by `stream` ([`stream_meant`]).
    pub fn stream(&self, stream: u64) -> u64 {
        stream_meant(stream, self.per_thread())
    }

    /// A status code as the export returns it.
    pub fn status(&self, code: i64) -> u32 {
        code as u32
    }
}

/// The legacy default stream's handle (`cudaStreamLegacy`, `CU_STREAM_LEGACY`).
pub const LEGACY_STREAM: u64 = 1;
/// The per-thread default stream's handle (`cudaStreamPerThread`, `CU_STREAM_PER_THREAD`;
/// the headers define both handles as casts, which bindgen does not carry).
pub const PER_THREAD_STREAM: u64 = 2;

/// The stream a call means by `stream`: from a per-thread entry point (`per_thread`), NULL is
/// the calling thread's default stream, not the legacy one.
pub fn stream_meant(stream: u64, per_thread: bool) -> u64 {
    if per_thread && stream == 0 { PER_THREAD_STREAM } else { stream }
}

/// One ABI variant of a function.
#[derive(Debug, Clone, Copy)]
pub struct CallDesc {
    /// Index in `chidori_cuda::calls::VARIANTS`: what a Call frame names.
    pub wire: u32,
    pub call: CallId,
    pub name: &'static str,
    /// The wire form of a custom function ([`Form::H2d`]), or None for a plain forwarded variant.
    pub form: Option<Form>,
    pub library: &'static str,
    /// The CUDA versions whose callers use this variant ("11.8", …).
    pub versions: &'static [&'static str],
    pub class: Class,
    pub params: &'static [Wire],
    pub ret: Ret,
    pub codes: Codes,
    /// The call only waits for earlier work (a synchronize): calls issued after it by other
    /// client threads need not wait for it to return.
    pub only_waits: bool,
}

/// `name` without the `suffixes` at its end, tried in order, each once: plain comparisons,
/// where `trim_end_matches` with a string pattern builds a searcher per call (it showed in
/// the executor's profile).
pub fn strip_suffixes<'a>(mut name: &'a str, suffixes: &[&str]) -> &'a str {
    for suffix in suffixes {
        if let Some(rest) = name.strip_suffix(suffix) {
            name = rest;
        }
    }
    name
}

impl CallDesc {
    /// Whether a reply is awaited.
    pub fn waits(&self) -> bool {
        self.class != Class::Async
    }

    /// Whether the call copies between the GPU and host bytes the frame carries or the reply
    /// takes: the runtime's `h2d`, `d2h`, `a2h` and `h2a` forms, and the driver's host copies
    /// (whose custom form is `call`; statically linked runtimes copy with them).
    pub fn host_copy(&self) -> bool {
        matches!(self.form, Some(Form::H2d | Form::D2h | Form::A2h | Form::H2a))
            || (self.name.starts_with("cuMemcpy")
                && ["HtoD", "DtoH", "HtoA", "AtoH"].iter().any(|side| self.name.contains(side)))
    }
}

#[cfg(test)]
mod tests {
    use super::{CLIENT_NAME_TAG, Form, HANDLE_TAG_MASK, Len, WORKER_ID_TAG};

    #[test]
    fn suffixes_come_off_in_order_once_each() {
        use super::strip_suffixes;
        assert_eq!(strip_suffixes("cuMemPrefetchAsync_v2_ptsz", &["_ptsz", "_v2"]), "cuMemPrefetchAsync");
        assert_eq!(strip_suffixes("cudaMemcpy_ptds", &["_ptsz", "_ptds"]), "cudaMemcpy");
        assert_eq!(strip_suffixes("cudaMemcpy", &["_ptsz", "_ptds"]), "cudaMemcpy");
        assert_eq!(strip_suffixes("f_ptsz_ptsz", &["_ptsz"]), "f_ptsz");
    }

    #[test]
    fn handle_values_are_positive_and_never_user_space_pointers() {
        for tag in [CLIENT_NAME_TAG, WORKER_ID_TAG] {
            assert_eq!(tag & !HANDLE_TAG_MASK, 0);
            let highest = tag | !HANDLE_TAG_MASK;
            assert!((highest as i64) > 0, "{highest:#x}: Python bindings refuse a negative intptr_t");
            assert!(tag > 0x0000_7fff_ffff_ffff, "{tag:#x}: above every x86-64 and AArch64 user-space address");
        }
        assert_ne!(CLIENT_NAME_TAG, WORKER_ID_TAG);
    }

    #[test]
    fn forms_are_named_as_the_specs_name_them() {
        for &form in Form::ALL {
            assert_eq!(Form::from_name(form.name()), Some(form));
            assert_eq!(format!("{form:?}"), form.variant());
        }
        assert_eq!(Form::from_name("hostvalues"), Some(Form::HostValues));
        assert_eq!(Form::from_name("HostValues"), None);
    }

    #[test]
    fn lengths_evaluate_and_refuse_overflow() {
        static A: Len = Len::Param(0);
        static B: Len = Len::Param(1);
        static FOUR: Len = Len::Lit(4);
        static SUM: Len = Len::Add(&A, &FOUR);
        static PRODUCT: Len = Len::Mul(&SUM, &B);
        assert_eq!(PRODUCT.eval(&[3, 5]), Some(35));
        assert_eq!(PRODUCT.eval(&[3]), None);
        assert_eq!(PRODUCT.eval(&[u64::MAX, 2]), None);
    }

    #[test]
    fn subtraction_refuses_negative_lengths() {
        static RANK: Len = Len::Param(0);
        static ONE: Len = Len::Lit(1);
        static STRIDES: Len = Len::Sub(&RANK, &ONE);
        assert_eq!(STRIDES.eval(&[3]), Some(2));
        assert_eq!(STRIDES.eval(&[0]), None);
    }

    #[test]
    fn record_checks_map_handles_where_the_union_holds_them() {
        use super::{FieldHandle, FieldIs, RecordChecks};
        // A resource descriptor: type at 0 (4 bytes), a handle or a device pointer at 8.
        static ARRAY: FieldIs = FieldIs { offset: 0, size: 4, values: &[0] };
        static CHECKS: RecordChecks = RecordChecks {
            size: 16,
            handles: &[FieldHandle { offset: 8, kind: 3, when: Some(ARRAY), written: false }],
            allow: &[FieldIs { offset: 0, size: 4, values: &[0, 2] }],
        };
        let record = |ty: u32, value: u64| {
            let mut r = vec![0u8; 16];
            r[..4].copy_from_slice(&ty.to_le_bytes());
            r[8..].copy_from_slice(&value.to_le_bytes());
            r
        };
        let resolve = |kind: u16, v: u64| (kind == 3 && v == 0x77).then_some(0x99);
        let mut array = record(0, 0x77);
        CHECKS.apply(&mut array, resolve).unwrap();
        assert_eq!(array, record(0, 0x99), "the handle is mapped in place");
        let mut linear = record(2, 0x7e00_0000_0000);
        CHECKS.apply(&mut linear, resolve).unwrap();
        assert_eq!(linear, record(2, 0x7e00_0000_0000), "a device pointer is left alone");
        assert!(CHECKS.apply(&mut record(0, 0x55), resolve).is_err(), "a foreign handle");
        assert!(CHECKS.apply(&mut record(1, 0), resolve).is_err(), "a type the spec does not allow");
        let mut two = [record(0, 0x77), record(2, 5)].concat();
        CHECKS.apply(&mut two, resolve).unwrap();
        assert!(CHECKS.apply(&mut two[..20], resolve).is_err(), "a torn record");
        // Records that come back: handles named for the client, whatever the type field
        // allows, and a torn record at the end left alone.
        let mut back = [record(0, 0x99), record(1, 0x99), record(0, 0x99)].concat();
        CHECKS.map_handles(&mut back[..40], |kind, v| if kind == 3 { v + 1 } else { v });
        assert_eq!(back, [record(0, 0x9a), record(1, 0x99), record(0, 0x99)].concat());
    }

    #[test]
    fn tables_give_element_sizes_by_enum_value() {
        static SIZES: Len = Len::Table(1, &[8, 4, 1]);
        static COUNT: Len = Len::Param(0);
        static BYTES: Len = Len::Mul(&COUNT, &SIZES);
        assert_eq!(BYTES.eval(&[3, 0]), Some(24));
        assert_eq!(BYTES.eval(&[3, 2]), Some(3));
        // An enum value the table does not know has no length.
        assert_eq!(BYTES.eval(&[3, 7]), None);
    }
}
