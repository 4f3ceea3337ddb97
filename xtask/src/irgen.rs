//! Stage 1 (`cargo xtask ir`): run bindgen (libclang) over one library's headers at one
//! CUDA version and reduce its output to the IR of [`crate::ir`].
//!
//! Bindgen's Rust output is parsed back with `syn`: extern blocks give functions, structs and
//! unions give records (their offsets come from bindgen's layout assertions, which libclang
//! computed), `ModuleConsts` enum modules give enums, type aliases give typedefs and the
//! `PFN_*` table of `cudaTypedefs.h`.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result, bail};
use sha2::{Digest, Sha256};
use syn::{Expr, ForeignItem, Item as SynItem, Lit, ReturnType, Type, UnOp};

use crate::headers::{self, RealLibrary};
use crate::ir::{
    self, Const, Enum, Field, Function, Item, LibraryIr, Meta, Opaque, Param, Pfn, Record, Typedef, Variant,
};
use crate::libraries::{Library, Pass};

/// Run every pass of `library` over the cached headers of `cuda`.
/// Returns None when this CUDA version's header set does not carry the library.
pub fn extract(root: &Path, cuda: &str, library: &Library) -> Result<Option<LibraryIr>> {
    let include = headers::include_dir(root, cuda);
    let stub = root.join("headers/stub");
    let Some((mut ir, header_hashes)) =
        declarations(&include, &stub, library).with_context(|| format!("{} at CUDA {cuda}", library.name))?
    else {
        return Ok(None);
    };
    let real = real_library(root, cuda, library)?;
    let (soname, version_nodes, real_exports) = match (&real, &library.soname) {
        (Some(real), _) => (
            real.soname.clone().with_context(|| format!("{} has no SONAME", real.file))?,
            real.version_nodes.clone(),
            {
                let api = regex::Regex::new(&library.exports)?;
                real.exports.iter().filter(|e| headers::is_api_symbol(e) && api.is_match(e)).cloned().collect()
            },
        ),
        (None, Some(soname)) => (soname.clone(), Vec::new(), Vec::new()),
        (None, None) => bail!("CUDA {cuda}: no wheel carries the real {} library", library.name),
    };
    let clang = bindgen::clang_version();
    ir.meta = Some(Meta {
        cuda: cuda.to_owned(),
        library: library.name.clone(),
        libclang: clang.full,
        bindgen: "0.73".into(),
        headers: header_hashes,
        soname,
        version_nodes,
        real_exports,
    });
    Ok(Some(ir))
}

/// The declarations of `library` in the headers under `include` (None when absent), and
/// the sha256 of each of its headers. `stub` holds stand-ins for headers the wheels lack.
pub fn declarations(
    include: &Path,
    stub: &Path,
    library: &Library,
) -> Result<Option<(LibraryIr, BTreeMap<String, String>)>> {
    let header_re = regex::Regex::new(&format!("^(?:{})$", library.headers))?;
    // The library is present when the first of its own headers that a pass includes is.
    let own = library.passes.iter().flat_map(|p| p.include.iter()).find(|h| header_re.is_match(h));
    let present = match own {
        Some(h) => include.join(h).exists(),
        None => include.join(&library.passes[0].include[0]).exists(),
    };
    if !present {
        return Ok(None);
    }
    let mut ir = LibraryIr::default();
    let mut header_hashes = BTreeMap::new();
    for entry in walk(include)? {
        let rel = entry.strip_prefix(include)?.to_string_lossy().replace('\\', "/");
        if header_re.is_match(&rel) {
            let bytes = std::fs::read(&entry)?;
            header_hashes.insert(rel, format!("{:x}", Sha256::digest(&bytes)));
        }
    }
    for pass in &library.passes {
        let output =
            run_bindgen(include, stub, &header_re, pass).with_context(|| format!("bindgen pass {:?}", pass.include))?;
        for item in parse_bindgen(&output)? {
            ir.insert(item)?;
        }
    }
    if library.proc_table {
        // The internal block holds the typedefs of older versions of renamed functions
        // (PFN_cuDevicePrimaryCtxReset_v7000): NVIDIA's runtime asks for those versions.
        let pass = Pass {
            include: vec!["cudaTypedefs.h".into()],
            defines: vec!["__CUDA_API_VERSION_INTERNAL".into()],
            cplusplus: false,
        };
        let typedefs_re = regex::Regex::new("^cudaTypedefs\\.h$")?;
        let output = run_bindgen(include, stub, &typedefs_re, &pass).context("bindgen for cudaTypedefs.h")?;
        for item in parse_bindgen(&output)? {
            if let Item::Pfn(_) = item {
                ir.insert(item)?;
            }
        }
    }
    Ok(Some((ir, header_hashes)))
}

fn real_library(root: &Path, cuda: &str, library: &Library) -> Result<Option<RealLibrary>> {
    let Some(pattern) = &library.real_library else { return Ok(None) };
    let re = regex::Regex::new(&format!("^(?:{pattern})$"))?;
    let path = headers::cache_dir(root).join(cuda).join("libraries.json");
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let libs: Vec<RealLibrary> = serde_json::from_str(&text)?;
    let mut found: Vec<_> = libs.into_iter().filter(|l| re.is_match(&l.file)).collect();
    // Prefer the file named exactly by its SONAME over longer versioned names.
    found.sort_by_key(|l| (l.soname.as_deref() != Some(l.file.as_str()), l.file.len()));
    Ok(found.into_iter().next())
}

fn walk(dir: &Path) -> Result<Vec<std::path::PathBuf>> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d)? {
            let path = entry?.path();
            if path.is_dir() {
                stack.push(path);
            } else {
                out.push(path);
            }
        }
    }
    out.sort();
    Ok(out)
}

fn run_bindgen(include: &Path, stub: &Path, header_re: &regex::Regex, pass: &Pass) -> Result<String> {
    let mut wrapper = String::new();
    for define in &pass.defines {
        wrapper.push_str(&format!("#define {define}\n"));
    }
    for header in &pass.include {
        wrapper.push_str(&format!("#include <{header}>\n"));
    }
    // bindgen matches allowlist_file against the full path clang reports.
    let file_re = format!("^{}/(?:{})$", regex::escape(&include.to_string_lossy()), strip_anchors(header_re.as_str()));
    let mut builder = bindgen::Builder::default();
    if pass.cplusplus {
        builder = builder.clang_args(["-x", "c++", "-std=c++17"]);
    }
    let builder = builder
        .header_contents("chidori_ir_wrapper.h", &wrapper)
        .clang_arg(format!("-I{}", include.display()))
        .clang_arg(format!("-I{}", stub.display()))
        .clang_arg("-fparse-all-comments")
        .allowlist_file(file_re)
        .default_enum_style(bindgen::EnumVariation::ModuleConsts)
        .layout_tests(true)
        .derive_copy(false)
        .derive_debug(false)
        .derive_default(false)
        .generate_comments(true)
        .generate_inline_functions(false)
        .formatter(bindgen::Formatter::None);
    let bindings = builder.generate().map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(bindings.to_string())
}

fn strip_anchors(re: &str) -> &str {
    let re = re.strip_prefix("^(?:").and_then(|r| r.strip_suffix(")$")).unwrap_or(re);
    re.trim_start_matches('^').trim_end_matches('$')
}

/// Reduce bindgen's output to IR items.
pub fn parse_bindgen(output: &str) -> Result<Vec<Item>> {
    let file: syn::File = syn::parse_str(output).context("parsing bindgen output")?;
    let layouts = Layouts::scan(output);
    let mut items = Vec::new();
    let mut enum_names = std::collections::HashSet::new();
    for item in &file.items {
        if let SynItem::Mod(m) = item {
            enum_names.insert(m.ident.to_string());
        }
    }
    for item in file.items {
        match item {
            SynItem::ForeignMod(m) => {
                for fi in m.items {
                    if let ForeignItem::Fn(f) = fi {
                        // C++ functions carry their mangled name in #[link_name]; only the
                        // extern "C" API is exported by name.
                        if f.attrs.iter().any(|a| a.path().is_ident("link_name")) {
                            continue;
                        }
                        items.push(Item::Fn(function(&f.sig)?));
                    }
                }
            }
            SynItem::Struct(s) => {
                let name = s.ident.to_string();
                let fields: Vec<_> = match &s.fields {
                    syn::Fields::Named(n) => n.named.iter().collect(),
                    _ => Vec::new(),
                };
                if fields.len() == 1 && fields[0].ident.as_ref().is_some_and(|i| i == "_unused") {
                    items.push(Item::Opaque(Opaque { name }));
                    continue;
                }
                // Without derive(Copy), bindgen spells C unions as structs of
                // __BindgenUnionField members plus a `bindgen_union_field` for the size.
                let is_union = fields.iter().any(|f| f.ident.as_ref().is_some_and(|i| i == "bindgen_union_field"));
                let fields: Vec<_> = fields
                    .into_iter()
                    .filter(|f| f.ident.as_ref().is_none_or(|i| i != "bindgen_union_field"))
                    .collect();
                items.push(Item::Record(record(&name, is_union, fields, &layouts)?));
            }
            SynItem::Union(u) => {
                let name = u.ident.to_string();
                let fields: Vec<_> = u.fields.named.iter().collect();
                items.push(Item::Record(record(&name, true, fields, &layouts)?));
            }
            SynItem::Mod(m) => {
                if let Some(e) = enum_module(&m)? {
                    items.push(Item::Enum(e));
                }
            }
            SynItem::Type(t) => {
                let name = t.ident.to_string();
                if let Some(rest) = name.strip_prefix("PFN_")
                    && let Some(pfn) = pfn(rest, &t.ty)?
                {
                    items.push(Item::Pfn(pfn));
                    continue;
                }
                items.push(Item::Typedef(Typedef { name, ty: normalize(&t.ty)? }));
            }
            SynItem::Use(u) => {
                // ModuleConsts enums alias as `pub use self::cudaError::Type as cudaError_t;`.
                if let Some((target, alias)) = use_alias(&u.tree) {
                    items.push(Item::Typedef(Typedef { name: alias, ty: target }));
                }
            }
            SynItem::Const(c) => {
                let name = c.ident.to_string();
                if name == "_" {
                    continue;
                }
                if let Some(value) = int_value(&c.expr) {
                    items.push(Item::Const(Const { name, ty: normalize(&c.ty)?, value }));
                }
            }
            _ => {}
        }
    }
    Ok(items)
}

/// `self::X::Type as Y` → (X, Y).
fn use_alias(tree: &syn::UseTree) -> Option<(String, String)> {
    let mut path = Vec::new();
    let mut t = tree;
    loop {
        match t {
            syn::UseTree::Path(p) => {
                path.push(p.ident.to_string());
                t = &p.tree;
            }
            syn::UseTree::Rename(r) => {
                path.push(r.ident.to_string());
                let alias = r.rename.to_string();
                let path: Vec<_> = path.into_iter().filter(|s| s != "self").collect();
                return match path.as_slice() {
                    [name, ty] if ty == "Type" => Some((name.clone(), alias)),
                    [name] => Some((name.clone(), alias)),
                    _ => None,
                };
            }
            _ => return None,
        }
    }
}

/// bindgen appends `_` to C names that are Rust keywords (`type` → `type_`); the IR keeps
/// the C name.
fn c_name(rust: &str) -> String {
    const KEYWORDS: &[&str] = &[
        "abstract", "as", "async", "await", "become", "box", "break", "const", "continue", "crate", "do", "dyn",
        "else", "enum", "extern", "false", "final", "fn", "for", "gen", "if", "impl", "in", "let", "loop", "macro",
        "match", "mod", "move", "mut", "override", "priv", "pub", "ref", "return", "self", "static", "struct", "super",
        "trait", "true", "try", "type", "typeof", "unsafe", "unsized", "use", "virtual", "where", "while", "yield",
    ];
    let rust = rust.trim_start_matches("r#");
    match rust.strip_suffix('_') {
        Some(stem) if KEYWORDS.contains(&stem) => stem.to_owned(),
        _ => rust.to_owned(),
    }
}

fn function(sig: &syn::Signature) -> Result<Function> {
    let name = sig.ident.to_string();
    let mut params = Vec::new();
    for (i, input) in sig.inputs.iter().enumerate() {
        let syn::FnArg::Typed(pat) = input else { bail!("{name}: receiver in extern fn") };
        let pname = match &*pat.pat {
            syn::Pat::Ident(id) => c_name(&id.ident.to_string()),
            _ => format!("arg{i}"),
        };
        params.push(Param { name: pname, ty: normalize(&pat.ty).with_context(|| format!("{name}: parameter {i}"))? });
    }
    let ret = match &sig.output {
        ReturnType::Default => "void".to_owned(),
        ReturnType::Type(_, ty) => normalize(ty).with_context(|| format!("{name}: return type"))?,
    };
    Ok(Function { name, ret, params, variadic: sig.variadic.is_some() })
}

fn record(name: &str, union: bool, fields: Vec<&syn::Field>, layouts: &Layouts) -> Result<Record> {
    let (size, align) = layouts.size.get(name).copied().unwrap_or((0, 0));
    let mut out = Vec::new();
    for f in fields {
        let rust_name = f.ident.as_ref().map(|i| i.to_string().trim_start_matches("r#").to_owned()).unwrap_or_default();
        let fname = c_name(&rust_name);
        let offset = match layouts.offsets.get(&(name.to_owned(), rust_name)) {
            Some(o) => *o,
            None if union => 0,
            None => u64::MAX,
        };
        out.push(Field { ty: normalize(&f.ty).with_context(|| format!("{name}.{fname}"))?, name: fname, offset });
    }
    // Fields without a bindgen offset assertion (bitfield units, bindgen padding) are placed
    // after the previous field; they only matter for size bookkeeping.
    Ok(Record { name: name.to_owned(), union, size, align, fields: out })
}

fn enum_module(m: &syn::ItemMod) -> Result<Option<Enum>> {
    let Some((_, content)) = &m.content else { return Ok(None) };
    let mut repr = None;
    let mut variants = Vec::new();
    for item in content {
        match item {
            SynItem::Type(t) if t.ident == "Type" => repr = Some(normalize(&t.ty)?),
            SynItem::Const(c) => {
                if let Some(value) = int_value(&c.expr) {
                    variants.push(Variant { name: c.ident.to_string(), value, doc: doc_sentence(&c.attrs) });
                }
            }
            _ => {}
        }
    }
    Ok(repr.map(|repr| Enum { name: m.ident.to_string(), repr, variants }))
}

fn doc_sentence(attrs: &[syn::Attribute]) -> String {
    let mut text = String::new();
    for attr in attrs {
        if !attr.path().is_ident("doc") {
            continue;
        }
        if let syn::Meta::NameValue(nv) = &attr.meta
            && let Expr::Lit(syn::ExprLit { lit: Lit::Str(s), .. }) = &nv.value
        {
            text.push(' ');
            text.push_str(&s.value());
        }
    }
    let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
    let text = text.trim_start_matches(['<', '!', '*', '/', ' ']);
    let end = text.find(". ").map(|i| i + 1).unwrap_or(text.len());
    let sentence = &text[..end];
    if sentence.len() > 200 {
        format!("{}…", &sentence[..sentence.floor_char_boundary(200)])
    } else {
        sentence.to_owned()
    }
}

fn pfn(rest: &str, ty: &Type) -> Result<Option<Pfn>> {
    // PFN_<base>_v<version>[_ptds|_ptsz]
    let (body, per_thread) = if let Some(b) = rest.strip_suffix("_ptds") {
        (b, "ptds")
    } else if let Some(b) = rest.strip_suffix("_ptsz") {
        (b, "ptsz")
    } else {
        (rest, "")
    };
    let Some((base, version)) = body.rsplit_once("_v") else { return Ok(None) };
    let Ok(version) = version.parse::<u32>() else { return Ok(None) };
    let ir::Ty::Fn { params, ret } = ir::Ty::parse(&normalize(ty)?)? else { return Ok(None) };
    Ok(Some(Pfn {
        base: base.to_owned(),
        version,
        per_thread: per_thread.to_owned(),
        ret: ret.to_string(),
        params: params.iter().map(|p| p.to_string()).collect(),
    }))
}

fn int_value(expr: &Expr) -> Option<i64> {
    match expr {
        Expr::Lit(l) => match &l.lit {
            Lit::Int(i) => i.base10_parse::<i128>().ok().map(|v| v as i64),
            _ => None,
        },
        Expr::Unary(u) if matches!(u.op, UnOp::Neg(_)) => int_value(&u.expr).map(|v| -v),
        Expr::Paren(p) => int_value(&p.expr),
        Expr::Cast(c) => int_value(&c.expr),
        Expr::Group(g) => int_value(&g.expr),
        _ => None,
    }
}

/// Normalize a bindgen type to the IR grammar.
pub fn normalize(ty: &Type) -> Result<String> {
    Ok(match ty {
        Type::Ptr(p) => {
            let inner = normalize(&p.elem)?;
            if p.mutability.is_some() { format!("*mut {inner}") } else { format!("*const {inner}") }
        }
        Type::Array(a) => {
            let len = match &a.len {
                Expr::Lit(syn::ExprLit { lit: Lit::Int(i), .. }) => i.base10_parse::<u64>()?,
                other => bail!("array length {}", quote::quote!(#other)),
            };
            format!("[{}; {len}]", normalize(&a.elem)?)
        }
        Type::Paren(p) => normalize(&p.elem)?,
        Type::Group(g) => normalize(&g.elem)?,
        Type::BareFn(f) => bare_fn(f)?,
        Type::Tuple(t) if t.elems.is_empty() => "void".to_owned(),
        Type::Path(p) => {
            let segments: Vec<_> = p.path.segments.iter().collect();
            let last = segments.last().context("empty path")?;
            let ident = last.ident.to_string();
            if ident == "Option" {
                // Option<unsafe extern "C" fn(..)>: a nullable function pointer.
                if let syn::PathArguments::AngleBracketed(args) = &last.arguments
                    && let Some(syn::GenericArgument::Type(inner)) = args.args.first()
                {
                    return normalize(inner);
                }
                bail!("Option without type");
            }
            if ident == "Type" && segments.len() >= 2 {
                // ModuleConsts enum: `cudaError::Type`.
                return Ok(segments[segments.len() - 2].ident.to_string());
            }
            if ident == "__BindgenBitfieldUnit" || ident == "__IncompleteArrayField" || ident == "__BindgenUnionField" {
                if let syn::PathArguments::AngleBracketed(args) = &last.arguments
                    && let Some(syn::GenericArgument::Type(inner)) = args.args.first()
                {
                    let inner = normalize(inner)?;
                    return Ok(if ident == "__IncompleteArrayField" { format!("[{inner}; 0]") } else { inner });
                }
                bail!("{ident} without type");
            }
            match ident.as_str() {
                "c_char" | "c_schar" => "i8",
                "c_uchar" => "u8",
                "c_short" => "i16",
                "c_ushort" => "u16",
                "c_int" => "i32",
                "c_uint" => "u32",
                "c_long" | "c_longlong" => "i64",
                "c_ulong" | "c_ulonglong" => "u64",
                "c_float" => "f32",
                "c_double" => "f64",
                "c_void" => "void",
                other => other,
            }
            .to_owned()
        }
        other => bail!("unsupported type {}", quote::quote!(#other)),
    })
}

fn bare_fn(f: &syn::TypeBareFn) -> Result<String> {
    let mut params = Vec::new();
    for input in &f.inputs {
        params.push(normalize(&input.ty)?);
    }
    if f.variadic.is_some() {
        params.push("...".to_owned());
    }
    let ret = match &f.output {
        ReturnType::Default => "void".to_owned(),
        ReturnType::Type(_, ty) => normalize(ty)?,
    };
    Ok(format!("fn({}) -> {ret}", params.join(", ")))
}

/// Sizes, alignments and field offsets from bindgen's layout assertions.
struct Layouts {
    size: BTreeMap<String, (u64, u64)>,
    offsets: BTreeMap<(String, String), u64>,
}

impl Layouts {
    fn scan(output: &str) -> Layouts {
        let size_re = regex::Regex::new(r#""Size of (\w+)"\s*\]\s*\[[^\]]*?-\s*(\d+)usize"#).expect("regex");
        let align_re = regex::Regex::new(r#""Alignment of (\w+)"\s*\]\s*\[[^\]]*?-\s*(\d+)usize"#).expect("regex");
        let offset_re =
            regex::Regex::new(r#""Offset of field: (\w+)::(\w+)"\s*\]\s*\[[^\]]*?-\s*(\d+)usize"#).expect("regex");
        let mut size = BTreeMap::new();
        for c in size_re.captures_iter(output) {
            size.insert(c[1].to_owned(), (c[2].parse().unwrap_or(0), 0));
        }
        for c in align_re.captures_iter(output) {
            if let Some(entry) = size.get_mut(&c[1]) {
                entry.1 = c[2].parse().unwrap_or(0);
            }
        }
        let mut offsets = BTreeMap::new();
        for c in offset_re.captures_iter(output) {
            offsets.insert((c[1].to_owned(), c[2].trim_start_matches("r#").to_owned()), c[3].parse().unwrap_or(0));
        }
        Layouts { size, offsets }
    }
}

/// `cargo xtask ir`: write `generated/ir/<cuda>/<library>.jsonl` for the given versions.
pub fn run(root: &Path, versions: &[String], only: Option<&str>) -> Result<()> {
    let libraries = crate::libraries::Libraries::load(root)?;
    let lock = crate::lock::Lock::load(root)?;
    for cuda in versions {
        let entry = lock.version(cuda)?;
        // The driver's headers (cuda.h, cudaTypedefs.h) are all in the runtime wheel.
        let selection = if only == Some("driver") { headers::Selection::RuntimeOnly } else { headers::Selection::All };
        if !headers::is_complete(root, entry, selection) {
            bail!("headers for CUDA {cuda} are not in the cache: run `cargo xtask headers --cuda {cuda}` first");
        }
        let dir = ir::ir_dir(root).join(cuda);
        std::fs::create_dir_all(&dir)?;
        for library in &libraries.libraries {
            if only.is_some_and(|o| o != library.name) {
                continue;
            }
            match extract(root, cuda, library)? {
                Some(ir) => {
                    let path = ir::ir_path(root, cuda, &library.name);
                    std::fs::write(&path, ir.to_jsonl()?)?;
                    eprintln!(
                        "ir: CUDA {cuda} {:<10} {:>5} functions {:>5} records {:>4} enums {:>4} pfn",
                        library.name,
                        ir.functions.len(),
                        ir.records.len(),
                        ir.enums.len(),
                        ir.pfns.len()
                    );
                }
                None => {
                    let path = ir::ir_path(root, cuda, &library.name);
                    if path.exists() {
                        std::fs::remove_file(path)?;
                    }
                    eprintln!("ir: CUDA {cuda} {:<10} not in this version's header set", library.name);
                }
            }
        }
    }
    Ok(())
}
