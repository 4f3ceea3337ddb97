//! Stage 2, first half: merge the IR of all CUDA versions with the specs into one model of
//! what to export, under which SONAME and version node, and how each function travels.
//!
//! A function can look the same in every version and still differ in ABI (a struct it
//! writes grew, or the library's status codes were renumbered). Its *variant key* is the
//! signature with typedefs resolved, the layout of every record it reads or writes, and
//! the status codes it answers with; versions with the same key share one implementation.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use anyhow::{Context, Result, bail};

use crate::ir::{AllIr, Function, LibraryIr, Param, Record, Ty};
use crate::libraries::{Libraries, Library};
use crate::spec::{self, Class, FnSpec, LenExpr, ParamSpec, SpecFile};

/// Every type definition of one CUDA version, all libraries merged.
#[derive(Default)]
pub struct TypeEnv {
    pub typedefs: BTreeMap<String, String>,
    pub records: BTreeMap<String, Record>,
    pub enums: BTreeMap<String, crate::ir::Enum>,
    pub opaques: BTreeSet<String>,
    /// `void *` typedefs whose values are handles (`[handle.X] typedef = true`).
    pub handle_typedefs: BTreeSet<String>,
    /// Records the program holds for a library, passed by pointer as handles
    /// (`[handle.X] record = true`).
    pub record_handles: BTreeSet<String>,
    /// Enum value by variant name.
    pub values: BTreeMap<String, i64>,
}

impl TypeEnv {
    pub fn build(libs: &BTreeMap<String, LibraryIr>) -> TypeEnv {
        let mut env = TypeEnv::default();
        for ir in libs.values() {
            for t in ir.typedefs.values() {
                env.typedefs.insert(t.name.clone(), t.ty.clone());
            }
            for r in ir.records.values() {
                env.records.insert(r.name.clone(), r.clone());
            }
            for e in ir.enums.values() {
                for v in &e.variants {
                    env.values.insert(v.name.clone(), v.value);
                }
                env.enums.insert(e.name.clone(), e.clone());
            }
            for o in ir.opaques.keys() {
                env.opaques.insert(o.clone());
            }
        }
        for r in env.records.keys() {
            env.opaques.remove(r);
        }
        env.place_anonymous_members();
        env
    }

    /// bindgen asserts no offset for an anonymous union or struct member (C cannot name it
    /// in `offsetof`), so the IR has none: it lies after the field before it, at its own
    /// alignment, as C lays it out. Without an offset a struct map would leave it out, and a
    /// record translated between CUDA versions would lose it (CUdevResource's SM count).
    /// Left unknown where the field before it has no offset or the member would not fit.
    fn place_anonymous_members(&mut self) {
        let unplaced = |r: &Record| {
            !r.union && r.fields.iter().any(|f| f.offset == u64::MAX && f.name.starts_with("__bindgen_anon"))
        };
        let names: Vec<String> = self.records.values().filter(|r| unplaced(r)).map(|r| r.name.clone()).collect();
        for name in names {
            let r = &self.records[&name];
            let mut placed = Vec::new();
            let mut end = Some(0u64);
            for (i, f) in r.fields.iter().enumerate() {
                let ty = Ty::parse(&f.ty).ok();
                let size = ty.as_ref().and_then(|t| self.size_of(t));
                let offset = if f.offset == u64::MAX && f.name.starts_with("__bindgen_anon") {
                    let align = ty.as_ref().and_then(|t| self.align_of(t)).filter(|a| a.is_power_of_two());
                    let at = end.zip(align).map(|(e, a)| e.div_ceil(a) * a);
                    let fits = at.zip(size).is_some_and(|(o, s)| o + s <= r.size);
                    if fits {
                        placed.extend(at.map(|o| (i, o)));
                    }
                    at.filter(|_| fits)
                } else {
                    (f.offset != u64::MAX).then_some(f.offset)
                };
                end = offset.zip(size).map(|(o, s)| o + s);
            }
            if let Some(r) = self.records.get_mut(&name) {
                for (i, offset) in placed {
                    r.fields[i].offset = offset;
                }
            }
        }
    }

    /// Alignment of a type as C lays it out (records: as libclang computed it).
    pub fn align_of(&self, ty: &Ty) -> Option<u64> {
        match self.resolve(ty) {
            Ty::Void => None,
            Ty::Prim(p) => Some(prim_size(p)),
            Ty::Ptr { .. } | Ty::Fn { .. } => Some(8),
            Ty::Array { of, .. } => self.align_of(&of),
            Ty::Named(n) => match self.records.get(&n) {
                Some(r) => Some(r.align).filter(|a| *a > 0),
                None => self.enums.get(&n).map(|e| prim_size(prim_of(&e.repr))),
            },
        }
    }

    /// Follow typedefs until a non-typedef name.
    pub fn resolve_name<'a>(&'a self, mut name: &'a str) -> &'a str {
        for _ in 0..64 {
            match self.typedefs.get(name) {
                Some(t) if Ty::parse(t).map(|ty| matches!(ty, Ty::Named(_))).unwrap_or(false) => name = t,
                _ => break,
            }
        }
        name
    }

    /// The type with every typedef replaced by what it names.
    pub fn resolve(&self, ty: &Ty) -> Ty {
        self.resolve_depth(ty, 0)
    }

    fn resolve_depth(&self, ty: &Ty, depth: u32) -> Ty {
        if depth > 64 {
            return ty.clone();
        }
        match ty {
            Ty::Named(n) => match self.typedefs.get(n).and_then(|t| Ty::parse(t).ok()) {
                Some(inner) => self.resolve_depth(&inner, depth + 1),
                None => ty.clone(),
            },
            Ty::Ptr { mutable, to } => Ty::Ptr { mutable: *mutable, to: Box::new(self.resolve_depth(to, depth + 1)) },
            Ty::Array { of, len } => Ty::Array { of: Box::new(self.resolve_depth(of, depth + 1)), len: *len },
            Ty::Fn { params, ret } => Ty::Fn {
                params: params.iter().map(|p| self.resolve_depth(p, depth + 1)).collect(),
                ret: Box::new(self.resolve_depth(ret, depth + 1)),
            },
            other => other.clone(),
        }
    }

    pub fn size_of(&self, ty: &Ty) -> Option<u64> {
        match self.resolve(ty) {
            Ty::Void => None,
            Ty::Prim(p) => Some(prim_size(p)),
            Ty::Ptr { .. } | Ty::Fn { .. } => Some(8),
            Ty::Array { of, len } => self.size_of(&of).map(|s| s * len),
            Ty::Named(n) => {
                if let Some(r) = self.records.get(&n) {
                    Some(r.size)
                } else {
                    self.enums.get(&n).map(|e| prim_size(prim_of(&e.repr)))
                }
            }
        }
    }

    /// What a value of this type is, for classification.
    pub fn kind(&self, ty: &Ty) -> Kind {
        // A handle typedef names the kind before resolving hides it.
        match ty {
            Ty::Named(n) if self.handle_typedefs.contains(n) => return Kind::Handle { kind: handle_kind(n) },
            Ty::Named(n) if self.record_handles.contains(n) => {
                return Kind::RecordHandle { kind: handle_kind(n), bytes: self.size_of(ty).unwrap_or(0) };
            }
            Ty::Ptr { mutable, to } if matches!(&**to, Ty::Named(n) if self.record_handles.contains(n)) => {
                return Kind::Pointer { mutable: *mutable, pointee: Box::new(self.kind(to)) };
            }
            Ty::Ptr { mutable, to } if matches!(&**to, Ty::Named(n) if self.handle_typedefs.contains(n)) => {
                return Kind::Pointer { mutable: *mutable, pointee: Box::new(self.kind(to)) };
            }
            _ => {}
        }
        match self.resolve(ty) {
            Ty::Void => Kind::Void,
            Ty::Prim(p) => Kind::Scalar { bytes: prim_size(p) as u8, float: p.starts_with('f') },
            Ty::Fn { .. } => Kind::FnPtr,
            Ty::Array { .. } => Kind::Other,
            Ty::Named(n) => {
                if let Some(e) = self.enums.get(&n) {
                    Kind::Scalar { bytes: prim_size(prim_of(&e.repr)) as u8, float: false }
                } else if let Some(r) = self.records.get(&n) {
                    Kind::Record { name: n.clone(), size: r.size, plain: self.is_plain(&n, 0) }
                } else if self.opaques.contains(&n) {
                    Kind::OpaqueValue
                } else {
                    Kind::Other
                }
            }
            Ty::Ptr { mutable, to } => {
                let pointee = match &*to {
                    Ty::Named(n) if self.opaques.contains(n) || n.contains("Opaque") => {
                        return Kind::Handle { kind: handle_kind(n) };
                    }
                    other => other.clone(),
                };
                Kind::Pointer { mutable, pointee: Box::new(self.kind(&pointee)) }
            }
        }
    }

    /// A record without pointers or handles anywhere inside: its bytes mean the same in
    /// another process.
    pub fn is_plain(&self, name: &str, depth: u32) -> bool {
        let Some(r) = self.records.get(name) else { return false };
        if depth > 16 {
            return false;
        }
        r.fields.iter().all(|f| match Ty::parse(&f.ty).map(|t| self.resolve(&t)) {
            Ok(t) => self.plain_ty(&t, depth),
            Err(_) => false,
        })
    }

    fn plain_ty(&self, ty: &Ty, depth: u32) -> bool {
        match ty {
            Ty::Prim(_) => true,
            Ty::Array { of, .. } => self.plain_ty(of, depth),
            Ty::Named(n) => self.enums.contains_key(n) || self.is_plain(n, depth + 1),
            _ => false,
        }
    }

    /// Layout fingerprint of a record (reserved fields are padding: their names and split
    /// change between releases without changing the ABI).
    pub fn layout_key(&self, name: &str, depth: u32, out: &mut String) {
        let Some(r) = self.records.get(name) else {
            out.push_str(name);
            return;
        };
        out.push_str(&format!("{}{{{}:", name, r.size));
        for f in &r.fields {
            if f.name.starts_with("reserved") || f.name.starts_with("_") {
                continue;
            }
            out.push_str(&format!("{}@{}:", f.name, f.offset));
            if depth < 8
                && let Ok(ty) = Ty::parse(&f.ty)
            {
                self.type_key(&ty, depth + 1, out);
            }
            out.push(';');
        }
        out.push('}');
    }

    fn type_key(&self, ty: &Ty, depth: u32, out: &mut String) {
        match self.resolve(ty) {
            Ty::Named(n) if self.records.contains_key(&n) => self.layout_key(&n, depth, out),
            Ty::Named(n) if self.enums.contains_key(&n) => out.push_str(&self.enums[&n].repr),
            Ty::Ptr { to, .. } => {
                out.push('*');
                if depth < 8 {
                    self.type_key(&to, depth + 1, out);
                }
            }
            Ty::Array { of, len } => {
                out.push_str(&format!("[{len}]"));
                self.type_key(&of, depth, out);
            }
            other => out.push_str(&other.to_string()),
        }
    }
}

/// A pointer to a record held as a handle: its kind and bytes.
fn record_handle(kind: &Kind) -> Option<(String, u64)> {
    match kind {
        Kind::Pointer { pointee, .. } => match &**pointee {
            Kind::RecordHandle { kind, bytes } => Some((kind.clone(), *bytes)),
            _ => None,
        },
        _ => None,
    }
}

pub fn handle_kind(opaque: &str) -> String {
    opaque.to_owned()
}

pub fn prim_of(repr: &str) -> &'static str {
    crate::ir::PRIMS.iter().copied().find(|p| *p == repr).unwrap_or("u32")
}

pub fn prim_size(p: &str) -> u64 {
    match p {
        "bool" | "i8" | "u8" => 1,
        "i16" | "u16" => 2,
        "i32" | "u32" | "f32" => 4,
        "i128" | "u128" => 16,
        _ => 8,
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Kind {
    Void,
    Scalar {
        bytes: u8,
        float: bool,
    },
    Handle {
        kind: String,
    },
    /// A record the program holds as a handle (`[handle.X] record = true`) of `bytes`.
    RecordHandle {
        kind: String,
        bytes: u64,
    },
    Pointer {
        mutable: bool,
        pointee: Box<Kind>,
    },
    Record {
        name: String,
        size: u64,
        plain: bool,
    },
    FnPtr,
    OpaqueValue,
    Other,
}

/// How one parameter travels.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Wire {
    /// Integer, enum or float by value (its bytes travel as a u64).
    Val { bytes: u8, float: bool },
    /// An opaque handle by value, checked against the session's table of that kind.
    Handle { kind: String, destroy: bool },
    /// A device address by value.
    Device,
    /// A record passed by value.
    ByValRecord { bytes: u64, record: String },
    /// Pointer to one handle the callee creates; `named`: the client names it (spec `named`).
    OutHandle { kind: String, named: bool },
    /// Input array of `len` handles of `kind` (spec `handles(kind)[len]`).
    Handles { kind: String, len: Len },
    /// Pointer to a record the program holds as a handle of `kind` (`[handle.X] record`).
    RecordHandle { kind: String, destroy: bool },
    /// Pointer to a record of `bytes` the call initializes as a new handle (spec `out`).
    NewRecordHandle { kind: String, bytes: u64 },
    /// Host buffer: `len` elements (None: one) of `elem` bytes; `optional`: an input array
    /// the API lets be NULL (spec `in[len]?`).
    Buf { dir: Dir, elem: u64, len: Option<Len>, record: Option<String>, optional: bool },
    /// NUL-terminated input string.
    Str,
    /// Must be NULL; not sent.
    Null,
    /// An output no one reads (spec `scratch`): the worker passes a buffer of `bytes`.
    Scratch { bytes: u64 },
    /// A host workspace sized by an earlier query (spec `sized_scratch`): custom code sends
    /// its byte count in the argument word.
    SizedScratch,
    /// A BLAS scalar: `bytes` by value (In) or written back (Out) while the pointer mode
    /// recorded for parameter `mode` is host, else a device address.
    /// `size`: an untyped scalar's bytes by the arguments (then `bytes` is the most it may be).
    Scalar { dir: Dir, bytes: u64, mode: usize, size: Option<Len> },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dir {
    In,
    Out,
    InOut,
}

/// A length expression over parameter indices.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Len {
    Lit(u64),
    Param(usize),
    Add(Box<Len>, Box<Len>),
    Sub(Box<Len>, Box<Len>),
    Mul(Box<Len>, Box<Len>),
    Div(Box<Len>, Box<Len>),
    /// Element size by the enum value of parameter `.0`: `.1[value]` (None: out of range).
    Table(usize, Vec<u64>),
    /// The integer parameter `.0` points at, as the caller passed it (`*count`).
    Deref(usize),
    /// A length custom code tells (`told`).
    Told,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum RetWire {
    Status,
    Val { bytes: u8, float: bool },
    Void,
}

/// The lowered (ABI) type of a parameter or return value in Rust.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Lowered {
    Unit,
    Prim(&'static str),
    Ptr,
    Record(String),
}

#[derive(Debug, Clone)]
pub enum Disposition {
    /// Forwarded by generated code.
    Forward { class: Class, params: Vec<Wire>, ret: RetWire },
    /// Answered locally by generated code (`error_name`, `error_string`).
    GeneratedLocal { implementation: String },
    /// Hand-written in the interposer (class local or custom); `implementation` names the
    /// function (`module::function` under `crate::custom`) that receives the call's context,
    /// and with `raw` the arguments packed as words (`FnSpec::raw_args`).
    Custom { class: Class, implementation: Option<String>, raw: bool },
    /// Not forwarded; answers the library's NOT_SUPPORTED status.
    Unsupported { reason: String },
}

impl Disposition {
    pub fn is_unsupported(&self) -> bool {
        matches!(self, Disposition::Unsupported { .. })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Codes {
    pub success: i64,
    pub not_supported: i64,
    pub unavailable: i64,
    pub invalid_handle: i64,
    pub invalid_value: i64,
}

#[derive(Debug, Clone)]
pub struct Variant {
    /// Symbol suffix distinguishing this variant ("" when the function has one variant).
    pub tag: String,
    pub versions: Vec<String>,
    /// Declaration at the newest version of the group.
    pub decl: Function,
    pub params: Vec<Lowered>,
    pub ret: Lowered,
    pub ret_is_status: bool,
    pub ret_is_string: bool,
    pub codes: Codes,
    pub disposition: Disposition,
    /// Extra wire forms of a custom function (name, always `Disposition::Forward`).
    pub wire_forms: Vec<(String, Disposition)>,
}

#[derive(Debug, Clone)]
pub struct FnModel {
    pub name: String,
    pub hidden: bool,
    pub variants: Vec<Variant>,
    /// CUDA version → index into `variants`.
    pub by_version: BTreeMap<String, usize>,
}

#[derive(Debug, Clone)]
pub enum Target {
    Core {
        symbol: String,
    },
    Unsupported {
        code: Option<i64>,
        string: bool,
    },
    /// The export asks `chooser` (with the same first argument) which function to jump to,
    /// then jumps with the caller's return address intact: the loader's `dlopen` looks at
    /// who called it (the caller's RUNPATH and `$ORIGIN`).
    Dispatch {
        chooser: String,
    },
}

#[derive(Debug, Clone)]
pub struct Shim {
    pub soname: String,
    /// The version node consumers bind to; None for unversioned libraries.
    pub node: Option<String>,
    pub versions: Vec<String>,
    pub exports: BTreeMap<String, Target>,
}

pub struct LibModel {
    pub lib: Library,
    pub spec: SpecFile,
    pub versions: Vec<String>,
    pub functions: BTreeMap<String, FnModel>,
    pub shims: Vec<Shim>,
    /// Real exports that no header declares and no spec describes (exported as
    /// signature-less NOT_SUPPORTED stubs), per SONAME.
    pub undeclared: BTreeMap<String, BTreeSet<String>>,
}

pub struct Model {
    pub versions: Vec<String>,
    pub envs: BTreeMap<String, TypeEnv>,
    pub libraries: Vec<LibModel>,
    pub procs: Vec<ProcEntry>,
}

/// One row of the `cuGetProcAddress` table.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct ProcEntry {
    pub base: String,
    pub version: u32,
    pub per_thread: bool,
    pub symbol: String,
}

impl Model {
    /// Build from the committed IR and `specs/<library>.toml`.
    pub fn build(root: &Path, all: &AllIr, libraries: &Libraries) -> Result<Model> {
        let mut specs = BTreeMap::new();
        for lib in &libraries.libraries {
            specs.insert(lib.name.clone(), spec::load(root, &lib.name)?);
        }
        Model::build_with_specs(all, libraries, specs)
    }

    pub fn build_with_specs(
        all: &AllIr,
        libraries: &Libraries,
        mut specs: BTreeMap<String, SpecFile>,
    ) -> Result<Model> {
        let versions: Vec<String> = all.keys().cloned().collect();
        let handle_typedefs: BTreeSet<String> =
            specs.values().flat_map(|s| s.handle.iter().filter(|(_, h)| h.typedef).map(|(k, _)| k.clone())).collect();
        let record_handles: BTreeSet<String> =
            specs.values().flat_map(|s| s.handle.iter().filter(|(_, h)| h.record).map(|(k, _)| k.clone())).collect();
        let mut envs = BTreeMap::new();
        for (v, libs) in all {
            let mut env = TypeEnv::build(libs);
            env.handle_typedefs = handle_typedefs.clone();
            env.record_handles = record_handles.clone();
            envs.insert(v.clone(), env);
        }
        let mut libs = Vec::new();
        for lib in &libraries.libraries {
            let spec = specs.remove(&lib.name).unwrap_or_default();
            libs.push(build_library(lib, spec, all, &envs).with_context(|| format!("library {}", lib.name))?);
        }
        let procs = build_procs(all, &envs)?;
        Ok(Model { versions, envs, libraries: libs, procs })
    }
}

fn version_key(v: &str) -> (u32, u32) {
    let mut it = v.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    (it.next().unwrap_or(0), it.next().unwrap_or(0))
}

/// The spec of function `name`: its own, else its base function's. Per-thread-default-stream
/// twins (`cudaMemcpy_ptds`, `cuMemcpyHtoD_v2_ptds`) share their base function's spec, and a
/// versioned name (`__nvJitLinkCreate_13_0`) its stable name's.
pub fn function_spec<'a>(lib: &Library, spec: &'a SpecFile, name: &str) -> Option<&'a FnSpec> {
    spec.function.get(name).or_else(|| {
        let twin = name.strip_suffix("_ptds").or_else(|| name.strip_suffix("_ptsz")).map(str::to_owned);
        spec.function.get(&twin.or_else(|| lib.stable_name(name))?)
    })
}

/// The version a versioned name ends with (`__nvJitLinkCreate_13_1` → (13, 1)).
fn name_version(name: &str) -> (u32, u32) {
    let mut parts = name.rsplit('_').map(|p| p.parse::<u32>().unwrap_or(0));
    let minor = parts.next().unwrap_or(0);
    (parts.next().unwrap_or(0), minor)
}

fn build_library(lib: &Library, spec: SpecFile, all: &AllIr, envs: &BTreeMap<String, TypeEnv>) -> Result<LibModel> {
    let mut versions: Vec<String> =
        all.iter().filter(|(_, l)| l.contains_key(&lib.name)).map(|(v, _)| v.clone()).collect();
    versions.sort_by_key(|v| version_key(v));

    // Every function name with its declaration per version.
    let mut decls: BTreeMap<String, BTreeMap<String, (Function, bool)>> = BTreeMap::new();
    for v in &versions {
        let ir = &all[v][&lib.name];
        for f in ir.functions.values() {
            decls.entry(f.name.clone()).or_default().insert(v.clone(), (f.clone(), false));
        }
        for (name, hidden) in &spec.hidden {
            // Where no real library was inspected (libcuda.so.1 is not in the wheels), a
            // hidden function is taken to be exported by every version.
            let exports = &ir.meta().real_exports;
            let exported = exports.is_empty() || exports.iter().any(|e| e.split('@').next() == Some(name.as_str()));
            if exported {
                let f = Function {
                    name: name.clone(),
                    ret: hidden.ret.clone(),
                    params: hidden.params.iter().map(|(n, t)| Param { name: n.clone(), ty: t.clone() }).collect(),
                    variadic: false,
                };
                // A header declaration wins where there is one.
                decls.entry(name.clone()).or_default().entry(v.clone()).or_insert((f, true));
            }
        }
    }
    for name in spec.function.keys() {
        let versioned = || decls.keys().any(|d| lib.stable_name(d).as_deref() == Some(name.as_str()));
        if !decls.contains_key(name) && !versioned() {
            bail!("specs/{}.toml names function {name}, which no header of any version declares", lib.name);
        }
    }
    for (name, hidden) in &spec.hidden {
        if !decls.contains_key(name) {
            bail!("specs/{}.toml: hidden function {name} is exported by no real library of any version", lib.name);
        }
        for (_, t) in &hidden.params {
            Ty::parse(t)?;
        }
    }

    let rules = LibRules {
        rules: spec.rule.iter().map(CompiledRule::new).collect::<Result<Vec<_>>>()?,
        sizes: spec.size.clone(),
    };
    let mut functions = BTreeMap::new();
    for (name, per_version) in &decls {
        let fspec = function_spec(lib, &spec, name).cloned().unwrap_or_default();
        let hidden_spec = spec.hidden.get(name);
        let mut groups: Vec<(String, Vec<String>)> = Vec::new();
        for (v, (f, _)) in per_version {
            let env = &envs[v];
            let mut key = variant_key(env, lib, f, v, all)?;
            if fspec.per_soname {
                key.push_str(&all[v][&lib.name].meta().soname);
            }
            match groups.iter_mut().find(|(k, _)| *k == key) {
                Some((_, vs)) => vs.push(v.clone()),
                None => groups.push((key, vec![v.clone()])),
            }
        }
        let single = groups.len() == 1;
        let mut variants = Vec::new();
        let mut by_version = BTreeMap::new();
        for (_, mut vs) in groups {
            vs.sort_by_key(|v| version_key(v));
            let newest = vs.last().expect("group has a version").clone();
            let (decl, _) = per_version[&newest].clone();
            let env = &envs[&newest];
            let tag = if single { String::new() } else { format!("cu{}", vs[0].replace('.', "")) };
            let variant = build_variant(lib, &fspec, hidden_spec, env, &decl, &tag, vs.clone(), &rules)
                .with_context(|| format!("{name} at CUDA {newest}"))?;
            for v in &vs {
                by_version.insert(v.clone(), variants.len());
            }
            variants.push(variant);
        }
        variants.sort_by_key(|v| version_key(&v.versions[0]));
        by_version.clear();
        for (i, var) in variants.iter().enumerate() {
            for v in &var.versions {
                by_version.insert(v.clone(), i);
            }
        }
        let hidden = per_version.values().any(|(_, h)| *h);
        functions.insert(name.clone(), FnModel { name: name.clone(), hidden, variants, by_version });
    }

    // Shims: one per SONAME.
    let mut by_soname: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for v in &versions {
        by_soname.entry(all[v][&lib.name].meta().soname.clone()).or_default().push(v.clone());
    }
    let mut shims = Vec::new();
    let mut undeclared = BTreeMap::new();
    for (soname, mut vs) in by_soname {
        vs.sort_by_key(|v| version_key(v));
        let metas: Vec<_> = vs.iter().map(|v| all[v][&lib.name].meta()).collect();
        let nodes: BTreeSet<_> = metas.iter().flat_map(|m| m.version_nodes.iter().cloned()).collect();
        let node = match nodes.len() {
            0 => None,
            1 => {
                let node = nodes.into_iter().next().expect("one node");
                if node != soname {
                    bail!("{soname}: real library defines version node {node}, not its SONAME");
                }
                Some(node)
            }
            _ => bail!("{soname}: real libraries define several version nodes {nodes:?}"),
        };
        let mut exports = BTreeMap::new();
        for (name, f) in &functions {
            // The newest version of this SONAME that has the function decides.
            let Some(v) = vs.iter().rev().find(|v| f.by_version.contains_key(*v)) else { continue };
            let var = &f.variants[f.by_version[v]];
            let target = match &var.disposition {
                Disposition::Unsupported { .. } => unsupported_target(var),
                _ => Target::Core { symbol: core_symbol(&lib.name, name, &var.tag) },
            };
            exports.insert(name.clone(), target);
        }
        // Real exports that no header declares: signature-less NOT_SUPPORTED stubs.
        let newest_codes = codes(&envs[vs.last().expect("versions")], lib)?;
        let mut missing = BTreeSet::new();
        for m in &metas {
            for e in &m.real_exports {
                let name = e.split('@').next().unwrap_or(e);
                if !exports.contains_key(name) {
                    missing.insert(name.to_owned());
                }
            }
        }
        // An unversioned export whose versioned declarations the headers have is the newest
        // of them (`nvJitLinkCreate`: `__nvJitLinkCreate_13_1` for libnvJitLink.so.13).
        let mut aliased = BTreeSet::new();
        for name in &missing {
            let newest = exports
                .iter()
                .filter(|(declared, _)| lib.stable_name(declared).as_deref() == Some(name.as_str()))
                .max_by_key(|(declared, _)| name_version(declared))
                .map(|(_, target)| target.clone());
            if let Some(target) = newest {
                aliased.insert(name.clone());
                exports.insert(name.clone(), target);
            }
        }
        missing.retain(|name| !aliased.contains(name));
        for name in &missing {
            exports.insert(name.clone(), Target::Unsupported { code: Some(newest_codes.not_supported), string: false });
        }
        undeclared.insert(soname.clone(), missing);
        for (name, chooser) in &lib.dispatch {
            exports.insert(name.clone(), Target::Dispatch { chooser: chooser.clone() });
        }
        shims.push(Shim { soname, node, versions: vs, exports });
    }
    Ok(LibModel { lib: lib.clone(), spec, versions, functions, shims, undeclared })
}

fn unsupported_target(var: &Variant) -> Target {
    if var.ret_is_status {
        Target::Unsupported { code: Some(var.codes.not_supported), string: false }
    } else {
        Target::Unsupported { code: None, string: var.ret_is_string }
    }
}

pub fn core_symbol(lib: &str, name: &str, tag: &str) -> String {
    if tag.is_empty() { format!("__chidori_{lib}_{name}") } else { format!("__chidori_{lib}_{name}__{tag}") }
}

fn codes(env: &TypeEnv, lib: &Library) -> Result<Codes> {
    let get = |n: &str| env.values.get(n).copied().with_context(|| format!("status value {n} not found"));
    Ok(Codes {
        success: get(&lib.success)?,
        not_supported: get(&lib.not_supported)?,
        unavailable: get(&lib.unavailable)?,
        invalid_handle: get(&lib.invalid_handle)?,
        invalid_value: get(&lib.invalid_value)?,
    })
}

fn variant_key(env: &TypeEnv, lib: &Library, f: &Function, v: &str, all: &AllIr) -> Result<String> {
    let _ = (v, all);
    let mut key = String::new();
    let mut types: Vec<&str> = f.params.iter().map(|p| p.ty.as_str()).collect();
    types.push(&f.ret);
    for t in types {
        let ty = Ty::parse(t)?;
        env.type_key(&ty, 0, &mut key);
        key.push('|');
    }
    if f.variadic {
        key.push_str("...");
    }
    let c = codes(env, lib)?;
    key.push_str(&format!(
        "#{}/{}/{}/{}/{}",
        c.success, c.not_supported, c.unavailable, c.invalid_handle, c.invalid_value
    ));
    Ok(key)
}

fn is_status(env: &TypeEnv, lib: &Library, ty: &str) -> bool {
    let Ok(t) = Ty::parse(ty) else { return false };
    let declared = env.resolve(&t);
    let status = env.resolve(&Ty::Named(lib.status.clone()));
    declared == status
}

fn lower(env: &TypeEnv, ty: &Ty) -> Result<Lowered> {
    Ok(match env.resolve(ty) {
        Ty::Void => Lowered::Unit,
        Ty::Prim(p) => Lowered::Prim(if p == "bool" { "u8" } else { p }),
        Ty::Ptr { .. } | Ty::Fn { .. } => Lowered::Ptr,
        Ty::Array { .. } => Lowered::Ptr,
        Ty::Named(n) => {
            if let Some(e) = env.enums.get(&n) {
                Lowered::Prim(prim_of(&e.repr))
            } else if env.records.contains_key(&n) {
                Lowered::Record(n)
            } else {
                bail!("cannot lower type {n}")
            }
        }
    })
}

/// A library's rules and size tables.
struct LibRules {
    rules: Vec<CompiledRule>,
    sizes: BTreeMap<String, BTreeMap<String, u64>>,
}

/// A library rule with its regexes compiled.
struct CompiledRule {
    functions: Option<regex::Regex>,
    params: Option<regex::Regex>,
    rule: spec::Rule,
}

impl CompiledRule {
    fn new(rule: &spec::Rule) -> Result<CompiledRule> {
        let re = |r: &Option<String>| r.as_deref().map(regex::Regex::new).transpose();
        Ok(CompiledRule { functions: re(&rule.functions)?, params: re(&rule.params)?, rule: rule.clone() })
    }

    fn matches_function(&self, name: &str) -> bool {
        self.functions.as_ref().is_none_or(|r| r.is_match(name))
    }
}

/// The function's spec with the library's rules filled in: kinds for pointer parameters
/// the spec does not name (the first matching rule wins), and the rules' class.
fn with_rules(env: &TypeEnv, fspec: &FnSpec, decl: &Function, rules: &LibRules) -> Result<(FnSpec, Option<Class>)> {
    let mut out = fspec.clone();
    out.sizes = rules.sizes.clone();
    let rules = &rules.rules;
    let mut class = None;
    for r in rules.iter().filter(|r| r.matches_function(&decl.name)) {
        if class.is_none() {
            class = r.rule.class;
        }
        let (Some(params), Some(kind)) = (&r.params, &r.rule.kind) else { continue };
        for p in &decl.params {
            let ty = Ty::parse(&p.ty)?;
            let pointer = matches!(env.resolve(&ty), Ty::Ptr { .. } | Ty::Array { .. });
            // Handles, and pointers to the handle a Create makes, are inferred, never a rule's.
            let out_handle = match env.kind(&ty) {
                Kind::Handle { .. } => true,
                Kind::Pointer { pointee, .. } => matches!(*pointee, Kind::Handle { .. } | Kind::RecordHandle { .. }),
                _ => false,
            };
            if pointer && !out_handle && params.is_match(&p.name) && !out.params.contains_key(&p.name) {
                out.params.insert(p.name.clone(), kind.clone());
            }
        }
    }
    Ok((out, class))
}

#[allow(clippy::too_many_arguments)]
fn build_variant(
    lib: &Library,
    fspec: &FnSpec,
    hidden: Option<&spec::HiddenFn>,
    env: &TypeEnv,
    decl: &Function,
    tag: &str,
    versions: Vec<String>,
    rules: &LibRules,
) -> Result<Variant> {
    let (fspec, rule_class) = with_rules(env, fspec, decl, rules)?;
    let fspec = &fspec;
    let params = decl.params.iter().map(|p| lower(env, &Ty::parse(&p.ty)?)).collect::<Result<Vec<_>>>()?;
    let ret_ty = Ty::parse(&decl.ret)?;
    let ret = lower(env, &ret_ty)?;
    let ret_is_status = is_status(env, lib, &decl.ret);
    let ret_is_string = matches!(env.resolve(&ret_ty), Ty::Ptr { to, .. } if *to == Ty::Prim("i8"));
    let codes = codes(env, lib)?;
    let disposition = if let Some(h) = hidden {
        match h.class {
            Class::Custom | Class::Local => Disposition::Custom { class: h.class, implementation: None, raw: false },
            other => bail!("hidden functions must be custom or local, not {}", other.as_str()),
        }
    } else {
        let mut d = dispose(lib, fspec, env, decl, ret_is_status)?;
        // A rule's async class applies where nothing comes back but the status.
        if let (Some(Class::Async), None, Disposition::Forward { class, params, ret }) =
            (rule_class, fspec.class, &mut d)
        {
            let outputs = params.iter().any(|w| {
                matches!(
                    w,
                    Wire::OutHandle { .. }
                        | Wire::NewRecordHandle { .. }
                        | Wire::Buf { dir: Dir::Out | Dir::InOut, .. }
                        | Wire::Scalar { dir: Dir::Out | Dir::InOut, .. }
                )
            });
            if !outputs && matches!(ret, RetWire::Status | RetWire::Void) {
                *class = Class::Async;
            }
        }
        d
    };
    let forms = hidden.map(|h| &h.wire).unwrap_or(&fspec.wire);
    let mut wire_forms = Vec::new();
    for (form, w) in forms {
        if !matches!(disposition, Disposition::Custom { .. }) {
            bail!("wire forms are for custom functions; {} is not custom", decl.name);
        }
        if chidori_protocol::desc::Form::from_name(form).is_none() {
            bail!(
                "{}: wire.{form} is no wire form chidori_protocol::desc::Form names (add it there, then to both sides)",
                decl.name
            );
        }
        // The function's parameter specs (its own and its rules'), the form's over them.
        let mut params = fspec.params.clone();
        params.extend(w.params.iter().map(|(k, v)| (k.clone(), v.clone())));
        let d = classify_call(lib, env, decl, ret_is_status, w.class, &params, &fspec.extent, true, &fspec.sizes)
            .with_context(|| format!("wire form {form}"))?;
        check_device_addresses(decl, fspec, &d).with_context(|| format!("wire form {form}"))?;
        let d = null_asks_count(fspec, d);
        if let Disposition::Unsupported { reason } = d {
            bail!("wire form {form} of {} cannot be classified: {reason}", decl.name);
        }
        wire_forms.push((form.clone(), d));
    }
    Ok(Variant {
        tag: tag.to_owned(),
        versions,
        decl: decl.clone(),
        params,
        ret,
        ret_is_status,
        ret_is_string,
        codes,
        disposition,
        wire_forms,
    })
}

fn dispose(lib: &Library, fspec: &FnSpec, env: &TypeEnv, decl: &Function, ret_is_status: bool) -> Result<Disposition> {
    for name in fspec.params.keys().filter(|n| !n.starts_with('?')) {
        if !decl.params.iter().any(|p| &p.name == name) {
            bail!("spec names parameter {name}, which {} does not have", decl.name);
        }
    }
    if let Some(reason) = &fspec.unsupported {
        return Ok(Disposition::Unsupported { reason: reason.clone() });
    }
    if let Some(class @ (Class::Custom | Class::Local)) = fspec.class {
        // `impl = "module::function"`: the hand-written function that takes the context.
        let implementation = fspec.implementation.clone().filter(|i| i.contains("::"));
        if let Some(i) = &fspec.implementation
            && implementation.is_none()
            && !matches!(i.as_str(), "error_name" | "error_string")
        {
            bail!("{}: impl must name `module::function` under crate::custom, not {i:?}", decl.name);
        }
        if fspec.raw_args && implementation.is_none() {
            bail!("{}: raw_args needs an impl", decl.name);
        }
        if implementation.is_some() || fspec.implementation.is_none() {
            return Ok(Disposition::Custom { class, implementation, raw: fspec.raw_args });
        }
    }
    if let Some(implementation) = &fspec.implementation {
        if !matches!(implementation.as_str(), "error_name" | "error_string") {
            bail!("unknown generated implementation {implementation:?}");
        }
        return Ok(Disposition::GeneratedLocal { implementation: implementation.clone() });
    }
    let d =
        classify_call(lib, env, decl, ret_is_status, fspec.class, &fspec.params, &fspec.extent, false, &fspec.sizes)?;
    check_device_addresses(decl, fspec, &d)?;
    Ok(null_asks_count(fspec, d))
}

/// Every 64-bit device address a forwarded call passes (`CUdeviceptr`) reaches the worker as
/// device memory it checks is the session's (`device`, or an `extent`), or the spec says in
/// `unchecked` why the library may have it as it is: a plain value would let a program name
/// memory it never allocated (the worker's own buffers) to a call that writes or frees it.
fn check_device_addresses(decl: &Function, fspec: &FnSpec, d: &Disposition) -> Result<()> {
    let Disposition::Forward { params, .. } = d else { return Ok(()) };
    for name in fspec.unchecked.keys() {
        if !decl.params.iter().any(|p| &p.name == name) {
            bail!("{}: unchecked names parameter {name}, which it does not have", decl.name);
        }
    }
    for (p, w) in decl.params.iter().zip(params) {
        let address = matches!(p.ty.trim(), "CUdeviceptr" | "CUdeviceptr_v2");
        if address && matches!(w, Wire::Val { .. }) && !fspec.unchecked.contains_key(&p.name) {
            bail!(
                "{}: parameter {} is a device address that would reach the library unchecked: \
                 give it `device` or an `extent`, or say why in `unchecked`",
                decl.name,
                p.name
            );
        }
    }
    Ok(())
}

/// A function whose output arrays may be NULL to ask for the count (`null_asks_count`):
/// its output arrays are optional (the worker passes NULL on, whatever the count).
fn null_asks_count(fspec: &FnSpec, d: Disposition) -> Disposition {
    let Disposition::Forward { class, mut params, ret } = d else { return d };
    if fspec.null_asks_count {
        for w in &mut params {
            if let Wire::Buf { dir: Dir::Out | Dir::InOut, len: Some(_), optional, .. } = w {
                *optional = true;
            }
        }
    }
    Disposition::Forward { class, params, ret }
}

/// Why the CUDA 3.1 ABI's entry points, whose device addresses are 32 bits, are not supported.
const LEGACY_ADDRESS: &str = "the CUDA 3.1 ABI: a 32-bit device pointer cannot hold the server's addresses";

/// Classify a whole call with the given class and parameter specs. `explicit`: a wire form,
/// where every unlisted parameter must still classify by inference. A 64-bit parameter the
/// spec gives an `extent` and no wire names device memory: `device` (the worker checks it is
/// the session's, and names it where the session has it).
#[allow(clippy::too_many_arguments)]
fn classify_call(
    lib: &Library,
    env: &TypeEnv,
    decl: &Function,
    ret_is_status: bool,
    class: Option<Class>,
    params: &BTreeMap<String, String>,
    extent: &BTreeMap<String, String>,
    explicit: bool,
    sizes: &SizeTables,
) -> Result<Disposition> {
    for name in params.keys().filter(|n| !n.starts_with('?')) {
        if !decl.params.iter().any(|p| &p.name == name) {
            bail!("spec names parameter {name}, which {} does not have", decl.name);
        }
    }
    if decl.variadic {
        return Ok(Disposition::Unsupported { reason: "variadic".into() });
    }
    // cuda.h maps every name to its `_v2` form since CUDA 3.2; a legacy entry point's
    // address would be a truncated one of the server's, or one of the worker's own low memory.
    if decl.params.iter().any(|p| p.ty.trim() == "CUdeviceptr_v1") {
        return Ok(Disposition::Unsupported { reason: LEGACY_ADDRESS.into() });
    }
    if !explicit && !lib.forward_by_default && class.is_none() && params.is_empty() {
        let reason = lib.unlisted_reason.as_deref().unwrap_or("this library forwards only what its spec lists");
        return Ok(Disposition::Unsupported { reason: reason.into() });
    }
    let ret = if ret_is_status {
        RetWire::Status
    } else {
        match env.kind(&Ty::parse(&decl.ret)?) {
            Kind::Void => RetWire::Void,
            Kind::Scalar { bytes, float } => RetWire::Val { bytes, float },
            _ => return Ok(Disposition::Unsupported { reason: format!("returns {}: needs a spec", decl.ret) }),
        }
    };
    let mut wires = Vec::new();
    for (i, p) in decl.params.iter().enumerate() {
        // `?name`: a parameter only some versions' declarations have.
        let pspec = match params.get(&p.name).or_else(|| params.get(&format!("?{}", p.name))) {
            Some(s) => Some(spec::parse_param(s).with_context(|| format!("parameter {}", p.name))?),
            // (64-bit addresses: the 32-bit ones of the legacy entry points stay values.)
            None if extent.contains_key(&p.name)
                && matches!(env.kind(&Ty::parse(&p.ty)?), Kind::Pointer { .. } | Kind::Scalar { bytes: 8, .. }) =>
            {
                Some(ParamSpec::Device)
            }
            None => None,
        };
        match classify(lib, env, decl, i, p, pspec.as_ref(), sizes)? {
            Ok(w) => wires.push(w),
            Err(why) => return Ok(Disposition::Unsupported { reason: format!("parameter {}: {why}", p.name) }),
        }
    }
    check_derefs(decl, &wires)?;
    let class = class.unwrap_or(Class::Sync);
    if class == Class::Async {
        // A handle created here may be named by the client (the emitter checks its kind).
        let outputs = wires.iter().any(|w| {
            matches!(w, Wire::Buf { dir: Dir::Out | Dir::InOut, .. } | Wire::Scalar { dir: Dir::Out | Dir::InOut, .. })
        });
        if outputs || !matches!(ret, RetWire::Status | RetWire::Void) {
            bail!("{} is async but has outputs", decl.name);
        }
    }
    Ok(Disposition::Forward { class, params: wires, ret })
}

/// Classify one parameter: Ok(Ok(wire)), or Ok(Err(why it needs a spec)).
fn classify(
    lib: &Library,
    env: &TypeEnv,
    decl: &Function,
    index: usize,
    p: &Param,
    pspec: Option<&ParamSpec>,
    sizes: &SizeTables,
) -> Result<std::result::Result<Wire, String>> {
    let ty = Ty::parse(&p.ty)?;
    let kind = env.kind(&ty);
    let pointee_size = |k: &Kind, ty: &Ty| -> Option<u64> {
        match (k, env.resolve(ty)) {
            (_, Ty::Ptr { to, .. }) => match &*to {
                Ty::Void => Some(1),
                t => env.size_of(t),
            },
            _ => None,
        }
    };
    let record_of = |ty: &Ty| -> Option<String> {
        match env.resolve(ty) {
            Ty::Ptr { to, .. } => match *to {
                Ty::Named(n) if env.records.contains_key(&n) => Some(n),
                _ => None,
            },
            _ => None,
        }
    };
    let len = |e: &LenExpr| -> Result<Len> { lower_len(env, decl, e, sizes) };
    if let Some(s) = pspec {
        let is_ptr = matches!(kind, Kind::Pointer { .. });
        return Ok(Ok(match s {
            ParamSpec::In => match &kind {
                Kind::Pointer { .. } => {
                    let elem = pointee_size(&kind, &ty).context("pointee has no size")?;
                    Wire::Buf { dir: Dir::In, elem, len: None, record: record_of(&ty), optional: false }
                }
                Kind::Scalar { bytes, float } => Wire::Val { bytes: *bytes, float: *float },
                Kind::Handle { kind } => Wire::Handle { kind: kind.clone(), destroy: false },
                other => bail!("{}: `in` does not fit {other:?}", p.name),
            },
            ParamSpec::Out | ParamSpec::Destroy if record_handle(&kind).is_some() => {
                let (kind, bytes) = record_handle(&kind).expect("matched above");
                if bytes == 0 {
                    // The worker makes the record the library fills: it must know its size.
                    bail!("{}: the record {kind} has no size in this version's headers", p.name);
                }
                if matches!(s, ParamSpec::Out) {
                    Wire::NewRecordHandle { kind, bytes }
                } else {
                    Wire::RecordHandle { kind, destroy: true }
                }
            }
            ParamSpec::Out | ParamSpec::OptOut | ParamSpec::InOut | ParamSpec::OptInOut => {
                if !is_ptr && !matches!(kind, Kind::Handle { .. }) {
                    bail!("{}: `out` needs a pointer", p.name);
                }
                if let Kind::Pointer { pointee, .. } = &kind
                    && let (Kind::Handle { kind: h }, ParamSpec::Out) = (&**pointee, s)
                {
                    return Ok(Ok(Wire::OutHandle { kind: h.clone(), named: false }));
                }
                let elem = pointee_size(&kind, &ty).context("pointee has no size")?;
                let dir = if matches!(s, ParamSpec::InOut | ParamSpec::OptInOut) { Dir::InOut } else { Dir::Out };
                let optional = matches!(s, ParamSpec::OptOut | ParamSpec::OptInOut);
                Wire::Buf { dir, elem, len: None, record: record_of(&ty), optional }
            }
            ParamSpec::Device => match kind {
                Kind::Pointer { .. } | Kind::Scalar { bytes: 8, .. } => Wire::Device,
                // A record by value whose pointers are device addresses (cudaPitchedPtr).
                Kind::Record { name, size, .. } => Wire::ByValRecord { bytes: size, record: name },
                other => bail!("{}: `device` does not fit {other:?}", p.name),
            },
            ParamSpec::Value => match kind {
                Kind::Pointer { .. } | Kind::FnPtr | Kind::Handle { .. } | Kind::Scalar { bytes: 8, .. } => {
                    Wire::Val { bytes: 8, float: false }
                }
                other => bail!("{}: `value` needs a pointer, not {other:?}", p.name),
            },
            ParamSpec::Str => Wire::Str,
            ParamSpec::Null => Wire::Null,
            ParamSpec::Scratch => {
                Wire::Scratch { bytes: pointee_size(&kind, &ty).context("`scratch` needs a pointer to a sized type")? }
            }
            ParamSpec::SizedScratch => match kind {
                Kind::Pointer { .. } => Wire::SizedScratch,
                other => bail!("{}: `sized_scratch` needs a pointer, not {other:?}", p.name),
            },
            ParamSpec::Named => match &kind {
                Kind::Pointer { pointee, mutable: true } if matches!(&**pointee, Kind::Handle { .. }) => {
                    let Kind::Handle { kind: h } = &**pointee else { unreachable!("matched above") };
                    Wire::OutHandle { kind: h.clone(), named: true }
                }
                other => bail!("{}: `named` needs a pointer to a handle, not {other:?}", p.name),
            },
            ParamSpec::Destroy => match kind {
                Kind::Handle { kind } => Wire::Handle { kind, destroy: true },
                other => bail!("{}: `destroy` needs a handle, not {other:?}", p.name),
            },
            ParamSpec::Scalar { mode, dir, count, bytes: size_expr } => {
                let Some(mode) = decl.params.iter().position(|q| &q.name == mode) else {
                    return Ok(Err(format!("scalar: no parameter {mode} holds the pointer mode")));
                };
                let size = pointee_size(&kind, &ty).with_context(|| format!("{}: a scalar needs a pointer", p.name))?;
                let untyped = matches!(env.resolve(&ty), Ty::Ptr { to, .. } if *to == Ty::Void);
                let dir = match dir {
                    spec::ScalarDir::In => Dir::In,
                    spec::ScalarDir::Out => Dir::Out,
                    spec::ScalarDir::InOut => Dir::InOut,
                };
                let bytes = match scalar_bytes(dir, untyped, *count, size_expr.is_some(), size) {
                    Ok(bytes) => bytes,
                    Err(why) => return Ok(Err(why.into())),
                };
                let size = match size_expr {
                    Some(e) if untyped => Some(len(e)?),
                    Some(_) => bail!("{}: scalar(size): only an untyped (void *) scalar needs a size", p.name),
                    None => None,
                };
                Wire::Scalar { dir, bytes, mode, size }
            }
            ParamSpec::Handles { kind: h, len: e } => match kind {
                Kind::Pointer { .. } => {
                    let known = env.handle_typedefs.contains(h) || env.opaques.contains(h);
                    if !known {
                        bail!("{}: handles({h}): {h} is no handle type of this library", p.name);
                    }
                    Wire::Handles { kind: handle_kind(h), len: len(e)? }
                }
                other => bail!("{}: `handles` needs a pointer, not {other:?}", p.name),
            },
            ParamSpec::InBuf(e) | ParamSpec::OptInBuf(e) | ParamSpec::OutBuf(e) | ParamSpec::InOutBuf(e) => {
                let elem = match kind {
                    // An address passed by value (a CUdeviceptr, which under unified
                    // addressing may be host memory: cuMemcpy's) names bytes.
                    Kind::Scalar { bytes: 8, float: false } => 1,
                    _ => pointee_size(&kind, &ty).with_context(|| format!("{}: buffer needs a pointer", p.name))?,
                };
                let dir = match s {
                    ParamSpec::InBuf(_) | ParamSpec::OptInBuf(_) => Dir::In,
                    ParamSpec::OutBuf(_) => Dir::Out,
                    _ => Dir::InOut,
                };
                let optional = matches!(s, ParamSpec::OptInBuf(_));
                Wire::Buf { dir, elem, len: Some(len(e)?), record: record_of(&ty), optional }
            }
        }));
    }
    // A handle that is the first parameter of a Destroy/Free/Unload/Release function is
    // released by it; not by a getter or setter of something named so (the graph node of
    // `cuGraphMemFreeNodeGetParams`).
    let accessor = ["GetParams", "SetParams"].iter().any(|w| decl.name.contains(w));
    let releases = index == 0 && !accessor && RELEASING.iter().any(|w| decl.name.contains(w));
    // Another parameter that looks like a length makes a scalar pointer look like an array.
    let counted = decl.params.iter().enumerate().any(|(i, q)| i != index && looks_like_length(&q.name));
    let is_path = PATH_WORDS.iter().any(|w| p.name.contains(w));
    Ok(match kind {
        Kind::Scalar { bytes, float } => Ok(Wire::Val { bytes, float }),
        Kind::Handle { kind } => Ok(Wire::Handle { kind, destroy: releases }),
        Kind::RecordHandle { .. } => Err("a record held as a handle passed by value".into()),
        Kind::Record { name, size, plain: true } => Ok(Wire::ByValRecord { bytes: size, record: name }),
        Kind::Record { .. } => Err("record with pointers passed by value".into()),
        Kind::FnPtr => Err("function pointer: runs on the client".into()),
        Kind::Pointer { mutable, pointee } => match (*pointee, mutable) {
            (Kind::Scalar { bytes: 1, .. }, false) if matches!(env.resolve(&ty), Ty::Ptr { to, .. } if *to == Ty::Prim("i8")) => {
                if is_path {
                    Err("a path names a file on the client".into())
                } else {
                    Ok(Wire::Str)
                }
            }
            (Kind::Handle { kind }, true) => Ok(Wire::OutHandle { kind, named: false }),
            // A record that initializes one is `out` in the spec: the library's `Init` and
            // `SetAttribute` alike take a mutable pointer.
            (Kind::RecordHandle { kind, .. }, _) => Ok(Wire::RecordHandle { kind, destroy: releases }),
            (Kind::Scalar { bytes: 1, .. }, true) => Err("char buffer: how long?".into()),
            (Kind::Scalar { .. }, true) if counted => Err("pointer to scalar beside a length: array?".into()),
            (Kind::Scalar { bytes, .. }, true) if lib.infer_scalar_out => {
                Ok(Wire::Buf { dir: Dir::Out, elem: bytes as u64, len: None, record: None, optional: false })
            }
            (Kind::Record { .. }, true) => Err("pointer to a record: one or an array?".into()),
            (Kind::Record { name, size, plain: true }, false) if !counted => {
                Ok(Wire::Buf { dir: Dir::In, elem: size, len: None, record: Some(name), optional: false })
            }
            (Kind::Void, _) => Err("untyped pointer: host or device memory?".into()),
            (Kind::Pointer { .. }, _) => Err("pointer to pointer: host or device memory?".into()),
            (Kind::Scalar { .. }, true) => Err("pointer to scalar: output or device array?".into()),
            (Kind::Scalar { .. }, false) => Err("pointer to const scalar: one value or an array?".into()),
            (Kind::Record { .. }, _) => Err("record with pointers inside".into()),
            (other, _) => Err(format!("pointer to {other:?}")),
        },
        Kind::Void | Kind::OpaqueValue | Kind::Other => Err(format!("type {}", p.ty)),
    })
}

/// The most bytes a scalar parameter travels as: `pointee` bytes per element of a typed
/// scalar; at most the largest scalar (double complex) for an untyped one, of the size its
/// type parameter gives where the spec names it (`sized`), else (FIXME: a type only a
/// descriptor knows, cusparseAxpby's or cublasLtMatmul's) all 16 bytes of an input, read no
/// further than the end of the scalar's page. An untyped output needs its size named
/// (`scalar_out(size(computeType))@h`: cusparseSpVV's result): how much to write back.
fn scalar_bytes(dir: Dir, untyped: bool, count: u32, sized: bool, pointee: u64) -> Result<u64, &'static str> {
    match (dir, untyped) {
        (_, false) => Ok(pointee * u64::from(count)),
        // An untyped scalar whose size the spec's expression gives (`scalar(5 *
        // size(paramType))`: rotm's five parameters): the expression decides; this bounds it.
        (_, true) if count == 1 && sized => Ok(SIZED_SCALAR_BOUND),
        (Dir::In, true) if count == 1 => Ok(16),
        (_, true) => Err("untyped scalar array or output: how large?"),
    }
}

/// The most bytes a sized untyped scalar may travel as: five 16-byte values.
const SIZED_SCALAR_BOUND: u64 = 80;

const RELEASING: &[&str] = &["Destroy", "Free", "Unload", "Release"];
const PATH_WORDS: &[&str] = &["file", "File", "path", "Path", "fname"];

fn looks_like_length(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    ["count", "size", "len", "num", "dims"].iter().any(|w| lower.contains(w))
}

/// A length behind a pointer (`out[*count]`) sizes an output or in-out array (the only
/// kind the worker checks after the count's bytes arrive) and reads a one-element input
/// integer of 4 or 8 bytes that the caller fills.
fn check_derefs(decl: &Function, wires: &[Wire]) -> Result<()> {
    fn derefs(len: &Len, out: &mut Vec<usize>) {
        match len {
            Len::Deref(p) => out.push(*p),
            Len::Add(a, b) | Len::Sub(a, b) | Len::Mul(a, b) | Len::Div(a, b) => {
                derefs(a, out);
                derefs(b, out);
            }
            Len::Lit(_) | Len::Param(_) | Len::Table(..) | Len::Told => {}
        }
    }
    fn tells(len: &Len) -> bool {
        match len {
            Len::Told => true,
            Len::Add(a, b) | Len::Sub(a, b) | Len::Mul(a, b) | Len::Div(a, b) => tells(a) || tells(b),
            Len::Lit(_) | Len::Param(_) | Len::Table(..) | Len::Deref(_) => false,
        }
    }
    for (i, wire) in wires.iter().enumerate() {
        let told = match wire {
            Wire::Buf { len: Some(len), .. } | Wire::Handles { len, .. } => tells(len),
            Wire::Scalar { size: Some(len), .. } => tells(len),
            _ => false,
        };
        if told && !matches!(wire, Wire::Buf { dir: Dir::In, len: Some(Len::Told), record: None, .. }) {
            bail!(
                "{}: {}: `told` is the whole length of a plain input array (`in[told]`)",
                decl.name,
                decl.params[i].name
            );
        }
    }
    for (i, wire) in wires.iter().enumerate() {
        let mut sources = Vec::new();
        match wire {
            Wire::Buf { len: Some(len), .. } | Wire::Handles { len, .. } => derefs(len, &mut sources),
            Wire::Scalar { size: Some(len), .. } => derefs(len, &mut sources),
            _ => {}
        }
        if sources.is_empty() {
            continue;
        }
        let name = &decl.params[i].name;
        if !matches!(wire, Wire::Buf { dir: Dir::Out | Dir::InOut, .. }) {
            bail!("{}: {name}: only an `out` or `inout` array may have its length behind a pointer", decl.name);
        }
        for p in sources {
            if !matches!(wires[p], Wire::Buf { dir: Dir::In | Dir::InOut, elem: 4 | 8, len: None, record: None, .. }) {
                bail!(
                    "{}: {name}'s length *{} must point at one 4- or 8-byte integer the caller fills (`inout`)",
                    decl.name,
                    decl.params[p].name
                );
            }
        }
    }
    Ok(())
}

fn lower_len(env: &TypeEnv, decl: &Function, e: &LenExpr, sizes: &SizeTables) -> Result<Len> {
    let index = |name: &str| -> Result<usize> {
        decl.params.iter().position(|p| p.name == name).with_context(|| format!("no parameter {name}"))
    };
    Ok(match e {
        LenExpr::Lit(n) => Len::Lit(*n),
        LenExpr::Param(name) => Len::Param(index(name)?),
        LenExpr::Deref(name) => Len::Deref(index(name)?),
        LenExpr::Told => Len::Told,
        LenExpr::Add(a, b) => {
            Len::Add(Box::new(lower_len(env, decl, a, sizes)?), Box::new(lower_len(env, decl, b, sizes)?))
        }
        LenExpr::Sub(a, b) => {
            Len::Sub(Box::new(lower_len(env, decl, a, sizes)?), Box::new(lower_len(env, decl, b, sizes)?))
        }
        LenExpr::Mul(a, b) => {
            Len::Mul(Box::new(lower_len(env, decl, a, sizes)?), Box::new(lower_len(env, decl, b, sizes)?))
        }
        LenExpr::Div(a, b) => {
            Len::Div(Box::new(lower_len(env, decl, a, sizes)?), Box::new(lower_len(env, decl, b, sizes)?))
        }
        LenExpr::Size(name, named_table) => {
            let i = index(name)?;
            let ty = env.resolve(&Ty::parse(&decl.params[i].ty)?);
            let Ty::Named(enum_name) = ty else { bail!("size({name}): {name} is not an enum") };
            let e = env.enums.get(&enum_name).with_context(|| format!("size({name}): {enum_name} is not an enum"))?;
            // The table is named by the declared type (a typedef) or the enum itself.
            let declared = decl.params[i].ty.as_str();
            let (table, declared) = match named_table {
                Some(t) => {
                    (sizes.get(t).with_context(|| format!("size({name}, {t}): no [size.{t}] table"))?, t.as_str())
                }
                None => (
                    sizes
                        .get(declared)
                        .or_else(|| sizes.get(&enum_name))
                        .with_context(|| format!("size({name}): no [size.{declared}] table"))?,
                    declared,
                ),
            };
            let default = table.get("default").copied().context("size table without a default")?;
            for key in table.keys().filter(|k| *k != "default") {
                if !e.variants.iter().any(|v| &v.name == key) {
                    bail!("[size.{declared}] names {key}, which is no enumerator of it");
                }
            }
            let max = e.variants.iter().map(|v| v.value).filter(|v| (0..4096).contains(v)).max().unwrap_or(0);
            let mut out = vec![default; max as usize + 1];
            for var in &e.variants {
                if let (Some(size), Ok(v)) = (table.get(&var.name), usize::try_from(var.value))
                    && v < out.len()
                {
                    out[v] = *size;
                }
            }
            Len::Table(i, out)
        }
    })
}

type SizeTables = BTreeMap<String, BTreeMap<String, u64>>;

/// Map every `PFN_<base>_v<version>` typedef to the exported driver symbol with that
/// signature (the newest suffix among equal signatures).
fn build_procs(all: &AllIr, envs: &BTreeMap<String, TypeEnv>) -> Result<Vec<ProcEntry>> {
    let mut pfns = BTreeMap::new();
    let mut functions: BTreeMap<String, (Function, String)> = BTreeMap::new();
    for (v, libs) in all {
        let Some(driver) = libs.get("driver") else { continue };
        for p in &driver.pfns {
            pfns.insert((p.base.clone(), p.version, p.per_thread.clone()), (p.clone(), v.clone()));
        }
        for f in driver.functions.values() {
            functions.insert(f.name.clone(), (f.clone(), v.clone()));
        }
    }
    let signature = |env: &TypeEnv, ret: &str, params: &[String]| -> Result<String> {
        let mut s = env.resolve(&Ty::parse(ret)?).to_string();
        for p in params {
            s.push('|');
            s.push_str(&env.resolve(&Ty::parse(p)?).to_string());
        }
        Ok(s)
    };
    let mut out = Vec::new();
    // Newest version first within each (base, per-thread) group: a typedef of an older
    // version (cudaTypedefs.h's internal block: `PFN_cuDevicePrimaryCtxReset_v7000`, which
    // NVIDIA's runtime asks for) takes the newest matching variant a newer typedef of the
    // group has not taken (cuDevicePrimaryCtxReset, where v11000 took its _v2).
    let mut used: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    for ((base, version, per_thread), (pfn, v)) in pfns.iter().rev() {
        let env = &envs[v];
        let want = signature(env, &pfn.ret, &pfn.params)?;
        let suffix = if per_thread.is_empty() { String::new() } else { format!("_{per_thread}") };
        let taken = used.entry((base.clone(), per_thread.clone())).or_default();
        let mut matching = Vec::new();
        for n in 1..=9u32 {
            let name = if n == 1 { format!("{base}{suffix}") } else { format!("{base}_v{n}{suffix}") };
            if let Some((f, fv)) = functions.get(&name) {
                let fenv = &envs[fv];
                let params: Vec<String> = f.params.iter().map(|p| p.ty.clone()).collect();
                if signature(fenv, &f.ret, &params)? == want {
                    matching.push(name);
                }
            }
        }
        let best = matching.iter().rev().find(|n| !taken.contains(n)).or(matching.last()).cloned();
        if let Some(symbol) = best {
            taken.push(symbol.clone());
            out.push(ProcEntry { base: base.clone(), version: *version, per_thread: !per_thread.is_empty(), symbol });
        }
    }
    out.sort();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every anonymous member of a struct in the committed IR gets an offset, inside its
    /// record and after the field before it; CUdevResource's union lies at 96 in every
    /// version that has it.
    #[test]
    fn anonymous_members_are_placed() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let all = crate::ir::load_all(&root).expect("committed IR");
        let mut seen = 0;
        for (version, libs) in &all {
            let env = TypeEnv::build(libs);
            for r in env.records.values().filter(|r| !r.union) {
                let mut end = 0;
                for f in &r.fields {
                    if f.name.starts_with("__bindgen_anon") {
                        seen += 1;
                        assert_ne!(f.offset, u64::MAX, "{version} {}.{}", r.name, f.name);
                        let size = env.size_of(&Ty::parse(&f.ty).expect("type")).expect("size");
                        assert!(f.offset >= end && f.offset + size <= r.size, "{version} {}.{}", r.name, f.name);
                    }
                    if f.offset != u64::MAX {
                        end = f.offset + Ty::parse(&f.ty).ok().and_then(|t| env.size_of(&t)).unwrap_or(0);
                    }
                }
            }
            if let Some(r) = env.records.get("CUdevResource_st") {
                let anon = r.fields.iter().find(|f| f.name.starts_with("__bindgen_anon")).expect("its union");
                assert_eq!(anon.offset, 96, "{version}");
            }
        }
        assert!(seen > 0);
    }

    /// A 64-bit device address that would reach the library as a plain value stops the
    /// generator unless the spec says why; `device` and the legacy 32-bit form pass.
    #[test]
    fn a_device_address_travels_checked_or_says_why() {
        let param = |name: &str, ty: &str| Param { name: name.into(), ty: ty.into() };
        let decl = Function {
            name: "cuStreamWriteValue32".into(),
            ret: "CUresult".into(),
            params: vec![param("addr", "CUdeviceptr"), param("value", "u32")],
            variadic: false,
        };
        let val = |bytes| Wire::Val { bytes, float: false };
        let forward = |params| Disposition::Forward { class: Class::Sync, params, ret: RetWire::Status };
        let mut fspec = FnSpec::default();
        let loose = check_device_addresses(&decl, &fspec, &forward(vec![val(8), val(4)]));
        assert!(loose.is_err_and(|e| e.to_string().contains("parameter addr")));
        assert!(check_device_addresses(&decl, &fspec, &forward(vec![Wire::Device, val(4)])).is_ok());
        fspec.unchecked.insert("addr".into(), "a hint".into());
        assert!(check_device_addresses(&decl, &fspec, &forward(vec![val(8), val(4)])).is_ok());
        fspec.unchecked.insert("nothing".into(), "a typo".into());
        assert!(check_device_addresses(&decl, &fspec, &forward(vec![val(8), val(4)])).is_err());
        let legacy = Function { params: vec![param("addr", "CUdeviceptr_v1"), param("value", "u32")], ..decl };
        assert!(check_device_addresses(&legacy, &FnSpec::default(), &forward(vec![val(4), val(4)])).is_ok());
    }

    #[test]
    fn scalar_sizes() {
        assert_eq!(scalar_bytes(Dir::In, false, 1, false, 8), Ok(8));
        assert_eq!(scalar_bytes(Dir::Out, false, 5, false, 4), Ok(20), "rotm's parameter array");
        assert_eq!(scalar_bytes(Dir::In, true, 1, false, 1), Ok(16), "an untyped input: at most 16 bytes");
        assert_eq!(scalar_bytes(Dir::In, true, 1, true, 1), Ok(80), "sized: the expression decides, up to 80");
        assert_eq!(scalar_bytes(Dir::Out, true, 1, true, 1), Ok(80), "an untyped output of a named size");
        assert_eq!(scalar_bytes(Dir::InOut, true, 1, true, 1), Ok(80));
        assert!(scalar_bytes(Dir::Out, true, 1, false, 1).is_err(), "an untyped output of no known size");
        assert!(scalar_bytes(Dir::In, true, 2, true, 1).is_err(), "an untyped array");
    }
}
