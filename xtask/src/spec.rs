//! `specs/<library>.toml`: what a header cannot say about a function.
//!
//! ```toml
//! [function.cudaMemcpyAsync]
//! class = "custom"                 # local | async | sync | custom   (default: inferred, sync)
//! reason = "the copy direction decides which pointer is host memory"
//!
//! [function.cudaEventRecord]
//! class = "async"                  # no outputs: sent without waiting for a reply
//!
//! [function.cuMemcpyHtoD_v2]
//! params = { srcHost = "in[ByteCount]" }   # a host buffer of ByteCount elements
//!
//! [function.cudaStreamGetCaptureInfo]
//! params = { "?edgeData_out" = "null" }   # `?`: a parameter only some versions have
//!
//! [function.cudaStreamDestroy]
//! params = { stream = "destroy" }  # the handle is released by this call
//!
//! [function.cudaGetErrorName]
//! class = "local"
//! impl = "error_name"              # generated from the status enum (also: error_string)
//!
//! [function.cudaMemcpy]
//! class = "custom"                 # the hand-written code picks a wire form per call:
//! wire.h2d.params = { dst = "device", src = "in[count]" }
//! wire.d2h.params = { dst = "out[count]", src = "device" }
//! wire.d2h.fixed = { kind = "cudaMemcpyDeviceToHost" }   # the worker passes this value
//!                                  # (`dpitch = "= width"`: the value of another parameter)
//!
//! [function.curandGenerateNormal]
//! class = "custom"
//! impl = "curand::generate"        # `module::function` under crate::custom, given the context
//! raw_args = true                  # ... and the arguments as words: one function for several
//!
//! [function.cudaStreamSynchronize]
//! only_waits = true                # blocks for earlier work only: later calls may start
//! constant = true                  # the same answer for the same values while a process runs
//!
//! [function.cudaGraphGetNodes]
//! null_asks_count = true           # a NULL output array asks for the count, whatever it says
//!
//! [function.cudaMallocManaged]
//! unsupported = "managed memory is dereferenced by the CPU; it cannot live on the server"
//!
//! [[rule]]                         # conventions of a library, for functions and pointer
//! functions = '^cublas[SDCZ]'      # parameters their own spec does not describe (regexes)
//! params = '^(A|B|C|x|y)$'
//! kind = "device"                  # the parameter kind (below)
//! class = "async"                  # applied where the call has no outputs
//!
//! [handle.cublasLtContext]        # a handle kind that also takes handles of other kinds
//! accepts = ["cublasContext"]
//! client_named = true              # new handles are named by the client: creates need no reply
//!
//! [handle.cudnnBackendDescriptor_t] # a `void *` typedef whose values are handles
//! typedef = true
//!
//! [handle.cusolverDnContext]       # NULL is never one: refused before the library sees it
//! never_null = true
//!
//! [handle.cusparseLtHandle_t]      # a record the program holds, which the library fills
//! record = true                    # with pointers: the worker keeps it, the program an id
//!
//! [function.cudaStreamSetAttribute]
//! allow = { attr = ["cudaLaunchAttributePriority"] }  # the worker refuses other values
//! required = ["xDesc"]             # a handle parameter never NULL (its kind may be)
//! null_ok = ["handle"]             # a handle parameter that may be NULL (its kind may not),
//!                                  # or an output handle the API takes NULL for
//! extent = { dst = "count", devPtr = "N * 4", addr = "8", dst2 = "dpitch, width, height" }
//!                                  # the bytes a device parameter spans (checked whole;
//!                                  # a 64-bit one without a wire spec is `device` by it)
//! unchecked = { addr = "a placement hint: the driver maps nothing there" }
//!                                  # a CUdeviceptr the worker passes unchecked; every other
//!                                  # one is `device` or has an extent, or the generator stops
//! addresses = { dptrs = "sizes", workArea = "" }  # host arrays of device addresses (sizes)
//!
//! [record.cudaResourceDesc]        # what the worker checks in every input record of a type
//! handles = { "res.array.array" = "cudaArray if resType == cudaResourceTypeArray" }
//! written = { errNode_out = "CUgraphNode_st" }  # handles the call writes (named on the way back)
//! allow = { resType = ["cudaResourceTypeArray", "cudaResourceTypeLinear"] }
//!                                  # "?FIELD": only in versions that have it; "NULL": a null pointer
//! spans = true                     # the worker checks each span of memory it names (records.rs)
//! span_start = true                # ... only where each starts (a texture's memory may run past)
//! unchecked = { "accessPolicyWindow.base_ptr" = "a hint: the driver reads nothing there" }
//!                                  # every pointer field of a record sent to the server is one
//!                                  # of these (a handle, allowed, spans, unchecked) or the
//!                                  # generator stops
//!
//! [undeclared]                    # why real exports no header declares answer NOT_SUPPORTED
//! 'cudaGL.*' = "graphics interop: the OpenGL objects live on the client's machine"
//!
//! [hidden.__cudaRegisterFatBinary] # exported but declared in no public header
//! ret = "*mut *mut void"
//! params = [["fatCubin", "*mut void"]]
//! class = "custom"
//! ```
//!
//! Parameter kinds: `in` (value, or a single element behind a const pointer), `out`
//! (a single element written by the callee), `inout`, `device` (a device address passed by
//! value), `value` (a pointer sent as an opaque 64-bit token, never dereferenced), `str` (NUL-terminated input string), `null` (must be NULL; ignored), `scratch` (an
//! output of a call sent without waiting: the worker passes a buffer of its own),
//! `sized_scratch` (a host workspace only an earlier query sizes: custom code sends its byte
//! count in the argument word; the worker passes a buffer of that size), `out?` (one
//! output the API lets be NULL: NULL stays NULL; plain `out` at NULL gets a buffer; `inout?`
//! likewise for a value read and written), `destroy`
//! (a handle released by the call), `named` (a handle the call creates, named by the client so
//! the call needs no reply; for one wire form of a custom function), and buffers `in[expr]`, `out[expr]`, `inout[expr]`
//! whose length in elements of the pointee type (bytes for `void`) is an expression over
//! other parameters: names, integer literals, `+`, `-`, `*`, `/` (rounded down), parentheses
//! and `*p`, the integer parameter `p` points at (a count passed by pointer, `inout`). `scalar@h`,
//! `scalar_out@h` and `scalar_inout@h`: a BLAS scalar (alpha, beta, a dot product's result), a host value or a
//! device address depending on the pointer mode the client recorded for parameter `h`;
//! `scalar[n]@h` (and the other two) for n of them (rotm's five-element parameter array).
//! `handles(kind)[expr]`: an input array of `expr` handles of `kind` (a `void *` array such
//! as cuDNN's descriptor attributes), each checked and mapped like a handle argument.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result, bail};
use serde::Deserialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Class {
    /// Answered in the client from cached state; no round trip.
    Local,
    /// Sent without waiting; errors become sticky and surface at the next synchronizing call.
    Async,
    /// Sent and waited for.
    Sync,
    /// Hand-written in the interposer.
    Custom,
}

impl Class {
    pub fn as_str(self) -> &'static str {
        match self {
            Class::Local => "local",
            Class::Async => "async",
            Class::Sync => "sync",
            Class::Custom => "custom",
        }
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpecFile {
    #[serde(default)]
    pub function: BTreeMap<String, FnSpec>,
    #[serde(default)]
    pub hidden: BTreeMap<String, HiddenFn>,
    #[serde(default)]
    pub rule: Vec<Rule>,
    /// Element sizes by the value of an enum parameter, for `size(param)` in lengths:
    /// `[size.cudnnBackendAttributeType_t]` maps enumerator names to bytes, `default` the rest.
    #[serde(default)]
    pub size: BTreeMap<String, BTreeMap<String, u64>>,
    /// Handle kinds that also take handles of other kinds: `[handle.cublasLtContext]`
    /// `accepts = ["cublasContext"]`.
    #[serde(default)]
    pub handle: BTreeMap<String, HandleSpec>,
    /// What the worker checks inside input records of a type, wherever they travel.
    #[serde(default)]
    pub record: BTreeMap<String, RecordSpec>,
    /// Why exports of the real library that no header declares answer NOT_SUPPORTED: a regex
    /// over their names → the reason (`cargo xtask coverage` lists it).
    #[serde(default)]
    pub undeclared: BTreeMap<String, String>,
}

impl SpecFile {
    /// The reason the spec gives for the undeclared export `name`.
    pub fn undeclared_reason(&self, name: &str) -> Option<&str> {
        self.undeclared
            .iter()
            .find(|(re, _)| regex::Regex::new(&format!("^(?:{re})$")).is_ok_and(|r| r.is_match(name)))
            .map(|(_, reason)| reason.as_str())
    }
}

/// The checks of a record type: handle fields (checked and mapped like handle arguments,
/// where a condition on another field holds) and fields whose values are restricted.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RecordSpec {
    /// Field path (`res.array.array`) → `KIND` or `KIND if FIELD == VALUE | VALUE ...`.
    #[serde(default)]
    pub handles: BTreeMap<String, String>,
    /// Handle fields the call writes (an error node): not checked in what the client sends,
    /// named for the client in what comes back. Same syntax as `handles`.
    #[serde(default)]
    pub written: BTreeMap<String, String>,
    /// Field path → the enumerators it may hold; the worker refuses a record with another.
    #[serde(default)]
    pub allow: BTreeMap<String, Vec<String>>,
    /// The worker checks each address the record names as the session's memory, span by
    /// span (`worker/src/records.rs` knows how long each is): its pointer fields need no
    /// other word here.
    #[serde(default)]
    pub spans: bool,
    /// With `spans`: only where each span starts must be the session's memory (CUDA takes
    /// a texture's linear memory reaching past its allocation; past it lies the worker's own
    /// address space, which the GPU's per-process address spaces keep apart).
    #[serde(default)]
    pub span_start: bool,
    /// Field path → why the server's library may be given the field's pointer as the client
    /// sent it (never read for what the call allows, written by the library, ...).
    #[serde(default)]
    pub unchecked: BTreeMap<String, String>,
}

/// A condition on a record's field: (field path, the enumerators it holds).
pub type FieldCondition = (String, Vec<String>);

/// A parsed handle field of a record spec: its kind and the condition under which the field
/// holds a handle.
pub fn parse_record_handle(s: &str) -> Result<(String, Option<FieldCondition>)> {
    let (kind, when) = match s.split_once(" if ") {
        Some((k, w)) => (k.trim(), Some(w)),
        None => (s.trim(), None),
    };
    if kind.is_empty() || !kind.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        bail!("{kind:?} is not a handle kind in {s:?}");
    }
    let when = match when {
        None => None,
        Some(w) => {
            let (field, values) =
                w.split_once("==").with_context(|| format!("a condition is FIELD == VALUE in {s:?}"))?;
            let values: Vec<String> = values.split('|').map(|v| v.trim().to_owned()).collect();
            if field.trim().is_empty() || values.iter().any(String::is_empty) {
                bail!("a condition is FIELD == VALUE | VALUE in {s:?}");
            }
            Some((field.trim().to_owned(), values))
        }
    };
    Ok((kind.to_owned(), when))
}

/// What a handle kind accepts besides its own handles.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HandleSpec {
    /// Other kinds whose handles the library takes in this kind's place.
    #[serde(default)]
    pub accepts: Vec<String>,
    /// The client names new handles of this kind itself and the worker maps them to the
    /// library's, so a create call can be sent without waiting (`class = "async"`). Only
    /// for kinds that never travel inside other structures.
    #[serde(default)]
    pub client_named: bool,
    /// The kind is a `void *` typedef of this name (cuDNN's `cudnnBackendDescriptor_t`),
    /// not a pointer to an opaque struct: parameters of the typedef are handles.
    #[serde(default)]
    pub typedef: bool,
    /// NULL is never a handle of this kind (a library context, a descriptor every call
    /// needs): the worker refuses it before the library, which would dereference it.
    #[serde(default)]
    pub never_null: bool,
    /// The kind is a record the program holds and the library fills with its own pointers
    /// (cuSPARSELt's `cusparseLtHandle_t`: 1 KiB), passed by pointer. The worker keeps the
    /// library's record; the program's holds the handle's id in its first 8 bytes. A
    /// pointer to one is a handle (`destroy` by the usual rule), or with `out` the record
    /// the call initializes.
    #[serde(default)]
    pub record: bool,
}

/// A library convention: parameter kinds (and a class) for every function it matches.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    /// Regex over function names (default: all).
    pub functions: Option<String>,
    /// Regex over pointer parameter names (default: none).
    pub params: Option<String>,
    pub kind: Option<String>,
    pub class: Option<Class>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FnSpec {
    pub class: Option<Class>,
    #[serde(default)]
    pub params: BTreeMap<String, String>,
    /// A generated local implementation (`error_name`, `error_string`), or the hand-written
    /// `module::function` under `crate::custom` that receives the call's context (called
    /// `module::function_<n>`, n its parameter count, where versions differ in arity).
    #[serde(rename = "impl")]
    pub implementation: Option<String>,
    /// The implementation named by `impl` receives the arguments as the forwarding packs
    /// them (`&[u64]`, after the context) and returns the raw result: one function serves
    /// calls that differ only in their value parameters (cuRAND's generate calls), and the
    /// variants of any arity (no `_<n>` suffix).
    #[serde(default)]
    pub raw_args: bool,
    pub reason: Option<String>,
    /// Deliberately not forwarded: the reason is logged and listed by `cargo xtask coverage`.
    pub unsupported: Option<String>,
    /// One implementation per SONAME even where the ABI is the same (the answer depends on
    /// which library the caller was built against, as for cudaRuntimeGetVersion).
    #[serde(default)]
    pub per_soname: bool,
    /// The call only waits for work issued before it (stream, event, device synchronize):
    /// the worker lets later calls from other client threads start while it blocks.
    #[serde(default)]
    pub only_waits: bool,
    /// The answer depends only on the arguments passed by value and never changes while a
    /// process runs (a library's version and properties): the client asks once per those
    /// values and answers the rest itself.
    #[serde(default)]
    pub constant: bool,
    /// The call's output arrays may be NULL whatever their count says: NULL asks for the
    /// count only (the graph queries, NVML's samples). Elsewhere an array at NULL with
    /// elements is refused (the library would write through it).
    #[serde(default)]
    pub null_asks_count: bool,
    /// Extra wire forms of a custom function: the hand-written code picks one per call
    /// (cudaMemcpy travels as `h2d`, `d2h` or `d2d`). Each gets its own call descriptor.
    #[serde(default)]
    pub wire: BTreeMap<String, WireForm>,
    /// Parameter → the enumerators it may hold: the worker refuses other values (a union
    /// whose meaning a parameter selects, where some members would hold handles).
    #[serde(default)]
    pub allow: BTreeMap<String, Vec<String>>,
    /// Handle parameters that are never NULL although their kind may be elsewhere (the
    /// library dereferences them unchecked): the worker refuses a NULL with the library's
    /// invalid-value code.
    #[serde(default)]
    pub required: Vec<String>,
    /// Handle parameters that may be NULL although their kind is `never_null` (the
    /// function does not use the handle: cublasGetVersion_v2, which JAX asks with NULL):
    /// NULL reaches the library.
    #[serde(default)]
    pub null_ok: Vec<String>,
    /// Device parameter → the bytes it spans, all of which the worker checks are the
    /// session's memory: `"count"` or `"N * 4"` (a parameter, times a unit), `"8"` (a
    /// fixed size), or `"pitch, width, height"` (a pitched range: `(height − 1) × pitch + width` bytes).
    /// Without one a device parameter is checked at its address.
    #[serde(default)]
    pub extent: BTreeMap<String, String>,
    /// 64-bit device address parameter → why it goes to the library unchecked (a placement
    /// hint, a question whose answer names nothing). Every other `CUdeviceptr` parameter of
    /// a forwarded call is `device` or has an `extent`, or the generator stops.
    #[serde(default)]
    pub unchecked: BTreeMap<String, String>,
    /// Host array of device addresses → the parameter holding their sizes in bytes, or ""
    /// where none does: the worker checks every address (batched prefetches and discards,
    /// cuFFT's work areas).
    #[serde(default)]
    pub addresses: BTreeMap<String, String>,
    /// The library's size tables (filled in by the model from the file's `[size]`).
    #[serde(skip)]
    pub sizes: BTreeMap<String, BTreeMap<String, u64>>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WireForm {
    pub class: Option<Class>,
    #[serde(default)]
    pub params: BTreeMap<String, String>,
    /// Parameter → the enumerator the worker passes, whatever the client sent (a copy's
    /// direction is what its form says: `fixed = { kind = "cudaMemcpyHostToDevice" }`), or
    /// `= other`: the value of parameter `other` (a packed host side's pitch is its width).
    #[serde(default)]
    pub fixed: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HiddenFn {
    pub ret: String,
    pub params: Vec<(String, String)>,
    pub class: Class,
    pub reason: Option<String>,
    #[serde(default)]
    pub wire: BTreeMap<String, WireForm>,
}

pub fn load(root: &Path, library: &str) -> Result<SpecFile> {
    let path = root.join("specs").join(format!("{library}.toml"));
    if !path.exists() {
        return Ok(SpecFile::default());
    }
    let text = std::fs::read_to_string(&path)?;
    let file: SpecFile = toml::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    if let Some((name, _)) = file.record.iter().find(|(_, r)| r.span_start && !r.spans) {
        bail!("{}: record {name}: span_start needs spans = true", path.display());
    }
    Ok(file)
}

/// A parsed parameter kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParamSpec {
    In,
    Out,
    InOut,
    Device,
    /// A pointer passed as an opaque 64-bit value (a token the server hands back unread).
    Value,
    Str,
    Null,
    /// `out?`: one output value the API lets be NULL, where NULL means "not asked" and the
    /// library refuses a buffer (cuDNN's bAddr without a bDesc). Plain `out` at NULL gets a
    /// buffer no one reads.
    OptOut,
    /// `inout?`: one value read and written, which the API lets be NULL with a meaning of its
    /// own (a log iterator: NULL dumps every log); NULL stays NULL.
    OptInOut,
    /// An output the worker writes into a buffer of its own and no one reads.
    Scratch,
    /// `sized_scratch`: a host workspace only an earlier size query sizes; custom code sends
    /// the byte count in the argument word and the worker passes a buffer of that size.
    SizedScratch,
    Destroy,
    /// A handle the call creates and the client names (this wire form only; see
    /// `client_named` for a whole kind).
    Named,
    InBuf(LenExpr),
    /// `in[expr]?`: an input array the API lets be NULL (meaning none, or a default layout).
    OptInBuf(LenExpr),
    OutBuf(LenExpr),
    InOutBuf(LenExpr),
    /// `handles(kind)[expr]`: an input array of `expr` handles of `kind`, each checked and
    /// mapped to the library's handle by the worker.
    Handles {
        kind: String,
        len: LenExpr,
    },
    /// A scalar whose pointer mode is recorded for the handle parameter `mode`.
    Scalar {
        mode: String,
        dir: ScalarDir,
        /// Elements (`scalar[n]@h`): one unless the parameter is a small array.
        count: u32,
        /// The bytes of an untyped scalar (`const void *alpha`) by the arguments
        /// (`scalar(size(alphaType))@h`): the type parameter the API documents for it.
        bytes: Option<LenExpr>,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScalarDir {
    In,
    Out,
    InOut,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LenExpr {
    Lit(u64),
    Param(String),
    Add(Box<LenExpr>, Box<LenExpr>),
    /// `a - b`; a length that would be negative is refused where it is evaluated.
    Sub(Box<LenExpr>, Box<LenExpr>),
    Mul(Box<LenExpr>, Box<LenExpr>),
    /// `a / b`, rounded down (a byte count given for an array of larger elements).
    Div(Box<LenExpr>, Box<LenExpr>),
    /// `size(p)`: the element size the spec's table for `p`'s type gives for its enum value;
    /// `size(p, table)`: the same from `[size.table]` (another property of the same enum,
    /// such as how many components a value of a data type has).
    Size(String, Option<String>),
    /// `*p`: the integer parameter `p` points at, as the caller passed it (a count the
    /// caller gives by pointer and the library overwrites: NVML's `unsigned int *count`).
    Deref(String),
    /// `told`: a length only the caller's data gives, which custom code works out and the
    /// worker checks per function (`chidori_protocol::desc::Len::Told`).
    Told,
}

impl LenExpr {
    pub fn params(&self, out: &mut Vec<String>) {
        match self {
            LenExpr::Lit(_) | LenExpr::Told => {}
            LenExpr::Param(p) | LenExpr::Size(p, _) | LenExpr::Deref(p) => out.push(p.clone()),
            LenExpr::Add(a, b) | LenExpr::Sub(a, b) | LenExpr::Mul(a, b) | LenExpr::Div(a, b) => {
                a.params(out);
                b.params(out);
            }
        }
    }
}

pub fn parse_param(s: &str) -> Result<ParamSpec> {
    let s = s.trim();
    let simple = match s {
        "in" => Some(ParamSpec::In),
        "out" => Some(ParamSpec::Out),
        "out?" => Some(ParamSpec::OptOut),
        "inout?" => Some(ParamSpec::OptInOut),
        "inout" => Some(ParamSpec::InOut),
        "device" => Some(ParamSpec::Device),
        "value" => Some(ParamSpec::Value),
        "str" => Some(ParamSpec::Str),
        "null" => Some(ParamSpec::Null),
        "scratch" => Some(ParamSpec::Scratch),
        "sized_scratch" => Some(ParamSpec::SizedScratch),
        "destroy" => Some(ParamSpec::Destroy),
        "named" => Some(ParamSpec::Named),
        _ => None,
    };
    if let Some(p) = simple {
        return Ok(p);
    }
    if let Some((head, mode)) = s.split_once('@') {
        // `scalar(size(alphaType))@h`: an untyped scalar of the size its type parameter gives.
        let (head, bytes) = match head.trim().split_once('(') {
            Some((base, expr)) => {
                let expr = expr.strip_suffix(')').with_context(|| format!("missing ) in {s:?}"))?;
                (base, Some(parse_expr(expr).with_context(|| format!("in {s:?}"))?))
            }
            None => (head, None),
        };
        // `scalar[5]@h`: an array of five scalars that follows the pointer mode as one.
        let (base, count) = match head.trim().split_once('[') {
            Some((base, n)) => {
                let n = n.strip_suffix(']').and_then(|n| n.trim().parse::<u32>().ok()).filter(|&n| n > 0);
                (base, n.with_context(|| format!("a scalar count must be a positive integer in {s:?}"))?)
            }
            None => (head.trim(), 1),
        };
        let dir = match base {
            "scalar" => ScalarDir::In,
            "scalar_out" => ScalarDir::Out,
            "scalar_inout" => ScalarDir::InOut,
            other => bail!("unknown parameter kind {other:?} in {s:?}"),
        };
        if bytes.is_some() && count != 1 {
            bail!("a scalar array has the size of its elements' type, not {s:?}");
        }
        return Ok(ParamSpec::Scalar { mode: mode.trim().to_owned(), dir, count, bytes });
    }
    // `in[expr]?`: an input array that may be NULL.
    let (s, optional) = match s.strip_suffix('?') {
        Some(rest) => (rest.trim_end(), true),
        None => (s, false),
    };
    let (head, rest) = s.split_once('[').with_context(|| format!("unknown parameter kind {s:?}"))?;
    let body = rest.strip_suffix(']').with_context(|| format!("missing ] in {s:?}"))?;
    let expr = parse_expr(body).with_context(|| format!("in {s:?}"))?;
    if optional && head.trim() != "in" {
        bail!("only an input array may be NULL (`in[expr]?`), not {s:?}?");
    }
    if let Some(kind) = head.trim().strip_prefix("handles(").and_then(|k| k.strip_suffix(')')) {
        let kind = kind.trim();
        if kind.is_empty() || !kind.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            bail!("handles(kind): {kind:?} is not a handle kind in {s:?}");
        }
        return Ok(ParamSpec::Handles { kind: kind.to_owned(), len: expr });
    }
    Ok(match head.trim() {
        "in" if optional => ParamSpec::OptInBuf(expr),
        "in" => ParamSpec::InBuf(expr),
        "out" => ParamSpec::OutBuf(expr),
        "inout" => ParamSpec::InOutBuf(expr),
        other => bail!("unknown buffer kind {other:?} in {s:?}"),
    })
}

/// `a + b * (c - 2)`: the usual precedence.
pub fn parse_expr(s: &str) -> Result<LenExpr> {
    let tokens = tokenize(s)?;
    let mut pos = 0;
    let e = sum(&tokens, &mut pos)?;
    if pos != tokens.len() {
        bail!("trailing input in expression {s:?}");
    }
    Ok(e)
}

fn tokenize(s: &str) -> Result<Vec<String>> {
    let mut out = Vec::new();
    let mut chars = s.chars().peekable();
    while let Some(&c) = chars.peek() {
        if c.is_whitespace() {
            chars.next();
        } else if "+-*/(),".contains(c) {
            out.push(c.to_string());
            chars.next();
        } else if c.is_ascii_alphanumeric() || c == '_' {
            let mut word = String::new();
            while let Some(&c) = chars.peek() {
                if c.is_ascii_alphanumeric() || c == '_' {
                    word.push(c);
                    chars.next();
                } else {
                    break;
                }
            }
            out.push(word);
        } else {
            bail!("unexpected {c:?} in expression {s:?}");
        }
    }
    Ok(out)
}

fn sum(t: &[String], pos: &mut usize) -> Result<LenExpr> {
    let mut left = product(t, pos)?;
    loop {
        match t.get(*pos).map(String::as_str) {
            Some("+") => {
                *pos += 1;
                left = LenExpr::Add(Box::new(left), Box::new(product(t, pos)?));
            }
            Some("-") => {
                *pos += 1;
                left = LenExpr::Sub(Box::new(left), Box::new(product(t, pos)?));
            }
            _ => return Ok(left),
        }
    }
}

fn product(t: &[String], pos: &mut usize) -> Result<LenExpr> {
    let mut left = atom(t, pos)?;
    loop {
        match t.get(*pos).map(String::as_str) {
            Some("*") => {
                *pos += 1;
                left = LenExpr::Mul(Box::new(left), Box::new(atom(t, pos)?));
            }
            Some("/") => {
                *pos += 1;
                left = LenExpr::Div(Box::new(left), Box::new(atom(t, pos)?));
            }
            _ => return Ok(left),
        }
    }
}

fn atom(t: &[String], pos: &mut usize) -> Result<LenExpr> {
    let tok = t.get(*pos).context("expression ends early")?;
    *pos += 1;
    if tok == "(" {
        let e = sum(t, pos)?;
        if t.get(*pos).map(String::as_str) != Some(")") {
            bail!("missing )");
        }
        *pos += 1;
        return Ok(e);
    }
    if let Ok(n) = tok.parse::<u64>() {
        return Ok(LenExpr::Lit(n));
    }
    if tok == "size" && t.get(*pos).map(String::as_str) == Some("(") {
        let name = t.get(*pos + 1).context("size( needs a parameter")?.clone();
        let word = |s: &String| s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        match (t.get(*pos + 2).map(String::as_str), t.get(*pos + 3), t.get(*pos + 4).map(String::as_str)) {
            (Some(")"), ..) if word(&name) => {
                *pos += 3;
                return Ok(LenExpr::Size(name, None));
            }
            (Some(","), Some(table), Some(")")) if word(&name) && word(table) => {
                let table = table.clone();
                *pos += 5;
                return Ok(LenExpr::Size(name, Some(table)));
            }
            _ => bail!("size(...) takes a parameter name and, optionally, a table name"),
        }
    }
    if tok == "*" {
        // `*count`: the integer the parameter points at (a length passed by pointer).
        let name = t.get(*pos).filter(|n| n.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_'));
        let name = name.context("`*` before a length names a parameter: `*count`")?.clone();
        *pos += 1;
        return Ok(LenExpr::Deref(name));
    }
    if tok == "told" {
        return Ok(LenExpr::Told);
    }
    if tok.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_') {
        return Ok(LenExpr::Param(tok.clone()));
    }
    bail!("unexpected token {tok:?}")
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_length_behind_a_pointer_parses() {
        assert_eq!(parse_param("inout[*count]").unwrap(), ParamSpec::InOutBuf(LenExpr::Deref("count".into())));
        assert_eq!(
            parse_expr("n * *count").unwrap(),
            LenExpr::Mul(Box::new(LenExpr::Param("n".into())), Box::new(LenExpr::Deref("count".into())))
        );
        assert_eq!(
            parse_expr("size / 4").unwrap(),
            LenExpr::Div(Box::new(LenExpr::Param("size".into())), Box::new(LenExpr::Lit(4)))
        );
        assert!(parse_expr("*").is_err());
        assert!(parse_expr("*3").is_err());
    }

    use super::*;

    #[test]
    fn parameter_kinds_parse() {
        assert_eq!(parse_param("out").unwrap(), ParamSpec::Out);
        assert_eq!(parse_param("out?").unwrap(), ParamSpec::OptOut);
        assert_eq!(parse_param("inout?").unwrap(), ParamSpec::OptInOut);
        assert_eq!(parse_param("in[rank]?").unwrap(), ParamSpec::OptInBuf(LenExpr::Param("rank".into())));
        assert!(parse_param("out[rank]?").is_err(), "only inputs may be NULL");
        assert_eq!(
            parse_param("in[n * elemSize]").unwrap(),
            ParamSpec::InBuf(LenExpr::Mul(
                Box::new(LenExpr::Param("n".into())),
                Box::new(LenExpr::Param("elemSize".into()))
            ))
        );
        assert_eq!(
            parse_param("out[(a + 1) * 4]").unwrap(),
            ParamSpec::OutBuf(LenExpr::Mul(
                Box::new(LenExpr::Add(Box::new(LenExpr::Param("a".into())), Box::new(LenExpr::Lit(1)))),
                Box::new(LenExpr::Lit(4))
            ))
        );
        assert_eq!(
            parse_param("handles(cudnnBackendDescriptor_t)[count]").unwrap(),
            ParamSpec::Handles { kind: "cudnnBackendDescriptor_t".into(), len: LenExpr::Param("count".into()) }
        );
        assert!(parse_param("handles()[count]").is_err());
        assert!(parse_param("handles(a b)[count]").is_err());
        assert_eq!(
            parse_param("scalar_out[5]@handle").unwrap(),
            ParamSpec::Scalar { mode: "handle".into(), dir: ScalarDir::Out, count: 5, bytes: None }
        );
        assert_eq!(
            parse_param("scalar@handle").unwrap(),
            ParamSpec::Scalar { mode: "handle".into(), dir: ScalarDir::In, count: 1, bytes: None }
        );
        assert_eq!(
            parse_param("scalar(size(alphaType))@handle").unwrap(),
            ParamSpec::Scalar {
                mode: "handle".into(),
                dir: ScalarDir::In,
                count: 1,
                bytes: Some(LenExpr::Size("alphaType".into(), None))
            }
        );
        assert_eq!(
            parse_expr("size(computeType) * size(Ctype, lanes)").unwrap(),
            LenExpr::Mul(
                Box::new(LenExpr::Size("computeType".into(), None)),
                Box::new(LenExpr::Size("Ctype".into(), Some("lanes".into())))
            )
        );
        assert!(parse_expr("size(a, b, c)").is_err());
        assert!(parse_expr("size(a,)").is_err());
        assert!(parse_param("scalar(size(t))[2]@handle").is_err());
        assert!(parse_param("scalar[0]@handle").is_err());
        assert!(parse_param("scalar[x]@handle").is_err());
        assert!(parse_param("sideways").is_err());
        assert!(parse_param("in[a +]").is_err());
        assert!(parse_param("in[a - b]").is_ok(), "subtraction (a tensor map's rank - 1 strides)");
        assert!(parse_param("in[a / b]").is_ok(), "division (a byte count of 4-byte elements)");
        assert!(parse_param("in[a %  b]").is_err());
    }

    #[test]
    fn record_handles_parse() {
        assert_eq!(parse_record_handle("cudaArray").unwrap(), ("cudaArray".into(), None));
        assert_eq!(
            parse_record_handle("CUarray_st if srcMemoryType == CU_MEMORYTYPE_ARRAY | X").unwrap(),
            ("CUarray_st".into(), Some(("srcMemoryType".into(), vec!["CU_MEMORYTYPE_ARRAY".into(), "X".into()])))
        );
        assert!(parse_record_handle("a b").is_err());
        assert!(parse_record_handle("k if f").is_err());
        assert!(parse_record_handle("k if f == ").is_err());
    }
}
