//! The stage-1 IR: what the CUDA headers of one version declare for one library, as JSON
//! lines (one item per line, sorted, so a header update reads as a small diff).
//!
//! Files: `generated/ir/<cuda>/<library>.jsonl`. The first line is the [`Meta`] record.
//! Types are strings in a small Rust-like grammar: primitives (`i32`, `u64`, `usize`, `f32`,
//! `i8` for C `char`, `void`), named types, `*const T`, `*mut T`, `[T; N]` and
//! `fn(A, B) -> R`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Item {
    Meta(Meta),
    Fn(Function),
    Record(Record),
    Enum(Enum),
    Typedef(Typedef),
    Opaque(Opaque),
    Const(Const),
    Pfn(Pfn),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Meta {
    pub cuda: String,
    pub library: String,
    /// `clang_version()` of the libclang that bindgen used.
    pub libclang: String,
    pub bindgen: String,
    /// Header files (relative to the include directory) and the sha256 of each.
    pub headers: BTreeMap<String, String>,
    /// SONAME of the real library (from the wheel, or the spec for the driver).
    pub soname: String,
    /// Version nodes the real library defines; empty when it is unversioned.
    pub version_nodes: Vec<String>,
    /// Functions the real library exports (`name` or `name@node`), where a wheel carries it.
    pub real_exports: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Param {
    pub name: String,
    pub ty: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Function {
    pub name: String,
    pub ret: String,
    pub params: Vec<Param>,
    #[serde(default, skip_serializing_if = "is_false")]
    pub variadic: bool,
}

impl Function {
    /// Same types in the same order (parameter names may differ between declarations).
    pub fn same_signature(&self, other: &Function) -> bool {
        self.ret == other.ret
            && self.variadic == other.variadic
            && self.params.len() == other.params.len()
            && self.params.iter().zip(&other.params).all(|(a, b)| a.ty == b.ty)
    }
}

fn is_false(b: &bool) -> bool {
    !*b
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Field {
    pub name: String,
    pub ty: String,
    pub offset: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    pub name: String,
    pub union: bool,
    pub size: u64,
    pub align: u64,
    pub fields: Vec<Field>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Variant {
    pub name: String,
    pub value: i64,
    /// First sentence of the header's comment, used for `*GetErrorString`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub doc: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Enum {
    pub name: String,
    /// The integer type bindgen chose (`u32`, `i32`, …).
    pub repr: String,
    pub variants: Vec<Variant>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Typedef {
    pub name: String,
    pub ty: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Opaque {
    pub name: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Const {
    pub name: String,
    pub ty: String,
    pub value: i64,
}

/// One `PFN_<base>_v<version>[_ptds|_ptsz]` typedef of `cudaTypedefs.h`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pfn {
    pub base: String,
    pub version: u32,
    /// "", "ptds" or "ptsz".
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub per_thread: String,
    pub ret: String,
    pub params: Vec<String>,
}

/// Everything stage 1 knows about one library at one CUDA version.
#[derive(Debug, Clone, Default)]
pub struct LibraryIr {
    pub meta: Option<Meta>,
    pub functions: BTreeMap<String, Function>,
    pub records: BTreeMap<String, Record>,
    pub enums: BTreeMap<String, Enum>,
    pub typedefs: BTreeMap<String, Typedef>,
    pub opaques: BTreeMap<String, Opaque>,
    pub consts: BTreeMap<String, Const>,
    pub pfns: Vec<Pfn>,
}

impl LibraryIr {
    pub fn meta(&self) -> &Meta {
        self.meta.as_ref().expect("IR without meta line")
    }

    pub fn insert(&mut self, item: Item) -> Result<()> {
        match item {
            Item::Meta(m) => self.meta = Some(m),
            Item::Fn(f) => {
                if let Some(old) = self.functions.get(&f.name) {
                    if !old.same_signature(&f) {
                        bail!("function {} declared twice with different signatures:\n  {old:?}\n  {f:?}", f.name);
                    }
                    // Keep the first declaration's parameter names.
                    return Ok(());
                }
                self.functions.insert(f.name.clone(), f);
            }
            Item::Record(r) => {
                self.records.insert(r.name.clone(), r);
            }
            Item::Enum(e) => {
                self.enums.insert(e.name.clone(), e);
            }
            Item::Typedef(t) => {
                self.typedefs.insert(t.name.clone(), t);
            }
            Item::Opaque(o) => {
                if !self.records.contains_key(&o.name) {
                    self.opaques.insert(o.name.clone(), o);
                }
            }
            Item::Const(c) => {
                self.consts.insert(c.name.clone(), c);
            }
            Item::Pfn(p) => {
                if !self.pfns.contains(&p) {
                    self.pfns.push(p);
                }
            }
        }
        Ok(())
    }

    /// Serialize as sorted JSON lines, meta first.
    pub fn to_jsonl(&self) -> Result<String> {
        let mut out = String::new();
        let mut line = |item: Item| -> Result<()> {
            writeln!(out, "{}", serde_json::to_string(&item)?)?;
            Ok(())
        };
        line(Item::Meta(self.meta().clone()))?;
        for f in self.functions.values() {
            line(Item::Fn(f.clone()))?;
        }
        for r in self.records.values() {
            line(Item::Record(r.clone()))?;
        }
        for o in self.opaques.values() {
            line(Item::Opaque(o.clone()))?;
        }
        for e in self.enums.values() {
            line(Item::Enum(e.clone()))?;
        }
        for t in self.typedefs.values() {
            line(Item::Typedef(t.clone()))?;
        }
        for c in self.consts.values() {
            line(Item::Const(c.clone()))?;
        }
        let mut pfns = self.pfns.clone();
        pfns.sort_by(|a, b| (&a.base, a.version, &a.per_thread).cmp(&(&b.base, b.version, &b.per_thread)));
        for p in pfns {
            line(Item::Pfn(p))?;
        }
        Ok(out)
    }

    pub fn from_jsonl(text: &str, origin: &Path) -> Result<LibraryIr> {
        let mut ir = LibraryIr::default();
        for (n, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let item: Item =
                serde_json::from_str(line).with_context(|| format!("{}:{}: bad IR line", origin.display(), n + 1))?;
            ir.insert(item)?;
        }
        if ir.meta.is_none() {
            bail!("{}: no meta line", origin.display());
        }
        Ok(ir)
    }

    /// Follow typedefs to the type they name (stops at records, enums, opaques, primitives).
    pub fn resolve<'a>(&'a self, mut ty: &'a str) -> &'a str {
        for _ in 0..32 {
            match self.typedefs.get(ty) {
                Some(t) => ty = &t.ty,
                None => break,
            }
        }
        ty
    }
}

pub fn ir_dir(root: &Path) -> PathBuf {
    root.join("generated/ir")
}

pub fn ir_path(root: &Path, cuda: &str, library: &str) -> PathBuf {
    ir_dir(root).join(cuda).join(format!("{library}.jsonl"))
}

/// All committed IR: cuda version → library → IR.
pub type AllIr = BTreeMap<String, BTreeMap<String, LibraryIr>>;

pub fn load_all(root: &Path) -> Result<AllIr> {
    let mut all = AllIr::new();
    let dir = ir_dir(root);
    let mut versions: Vec<_> = std::fs::read_dir(&dir)
        .with_context(|| format!("reading {} (run `cargo xtask ir --all`)", dir.display()))?
        .filter_map(|e| e.ok())
        .filter(|e| e.path().is_dir())
        .collect();
    versions.sort_by_key(|e| e.file_name());
    for version in versions {
        let cuda = version.file_name().to_string_lossy().into_owned();
        let mut libs = BTreeMap::new();
        let mut files: Vec<_> = std::fs::read_dir(version.path())?.filter_map(|e| e.ok()).collect();
        files.sort_by_key(|e| e.file_name());
        for file in files {
            let path = file.path();
            if path.extension().and_then(|e| e.to_str()) != Some("jsonl") {
                continue;
            }
            let text = std::fs::read_to_string(&path)?;
            let ir = LibraryIr::from_jsonl(&text, &path)?;
            libs.insert(ir.meta().library.clone(), ir);
        }
        all.insert(cuda, libs);
    }
    Ok(all)
}

/// Parse a type string of the IR grammar.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Ty {
    Void,
    Prim(&'static str),
    Named(String),
    Ptr { mutable: bool, to: Box<Ty> },
    Array { of: Box<Ty>, len: u64 },
    Fn { params: Vec<Ty>, ret: Box<Ty> },
}

pub const PRIMS: &[&str] =
    &["bool", "i8", "u8", "i16", "u16", "i32", "u32", "i64", "u64", "i128", "u128", "isize", "usize", "f32", "f64"];

impl Ty {
    pub fn parse(s: &str) -> Result<Ty> {
        let s = s.trim();
        if s == "void" {
            return Ok(Ty::Void);
        }
        if let Some(rest) = s.strip_prefix("*const ") {
            return Ok(Ty::Ptr { mutable: false, to: Box::new(Ty::parse(rest)?) });
        }
        if let Some(rest) = s.strip_prefix("*mut ") {
            return Ok(Ty::Ptr { mutable: true, to: Box::new(Ty::parse(rest)?) });
        }
        if let Some(inner) = s.strip_prefix('[').and_then(|r| r.strip_suffix(']')) {
            let (of, len) = inner.rsplit_once(';').with_context(|| format!("bad array type {s}"))?;
            return Ok(Ty::Array { of: Box::new(Ty::parse(of)?), len: len.trim().parse()? });
        }
        if let Some(rest) = s.strip_prefix("fn(") {
            let (args, ret) = split_fn(rest).with_context(|| format!("bad fn type {s}"))?;
            let params = if args.trim().is_empty() {
                Vec::new()
            } else {
                split_top(args).into_iter().map(Ty::parse).collect::<Result<_>>()?
            };
            return Ok(Ty::Fn { params, ret: Box::new(Ty::parse(ret)?) });
        }
        if let Some(p) = PRIMS.iter().find(|p| **p == s) {
            return Ok(Ty::Prim(p));
        }
        if s.is_empty() || !s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            bail!("bad type {s:?}");
        }
        Ok(Ty::Named(s.to_owned()))
    }
}

impl std::fmt::Display for Ty {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Ty::Void => f.write_str("void"),
            Ty::Prim(p) => f.write_str(p),
            Ty::Named(n) => f.write_str(n),
            Ty::Ptr { mutable: true, to } => write!(f, "*mut {to}"),
            Ty::Ptr { mutable: false, to } => write!(f, "*const {to}"),
            Ty::Array { of, len } => write!(f, "[{of}; {len}]"),
            Ty::Fn { params, ret } => {
                f.write_str("fn(")?;
                for (i, p) in params.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{p}")?;
                }
                write!(f, ") -> {ret}")
            }
        }
    }
}

/// Split `A, B) -> R` at the parenthesis that closes the parameter list.
fn split_fn(rest: &str) -> Option<(&str, &str)> {
    let mut depth = 0i32;
    for (i, c) in rest.char_indices() {
        match c {
            '(' | '[' => depth += 1,
            ']' => depth -= 1,
            ')' if depth == 0 => {
                let ret = rest[i + 1..].trim().strip_prefix("->")?;
                return Some((&rest[..i], ret));
            }
            ')' => depth -= 1,
            _ => {}
        }
    }
    None
}

fn split_top(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut depth = 0i32;
    let mut start = 0;
    for (i, c) in s.char_indices() {
        match c {
            '(' | '[' => depth += 1,
            ')' | ']' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

#[cfg(test)]
mod tests {
    use super::Ty;

    #[test]
    fn type_grammar_round_trips() {
        for s in [
            "void",
            "i32",
            "*mut *mut void",
            "*const [u8; 16]",
            "[[i32; 3]; 2]",
            "fn(*mut void, u32) -> void",
            "fn() -> cudaError",
            "*mut fn(fn(i32) -> i32, *const i8) -> u64",
        ] {
            assert_eq!(Ty::parse(s).unwrap().to_string(), s);
        }
        assert!(Ty::parse("*mut").is_err());
        assert!(Ty::parse("a b").is_err());
    }
}
