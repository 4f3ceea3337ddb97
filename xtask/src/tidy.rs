//! `cargo xtask tidy`: the conventions a reviewer would otherwise repeat, checked.
//!
//! * Every spec entry whose function is hand-written (`class = "custom"`) says why in
//!   `reason`, and every deliberate NOT_SUPPORTED gives its reason (`unsupported = "..."`).
//! * Every Rust file outside `generated/` starts with a `//!` module doc.
//! * Every hand-written `unsafe` block has a `// SAFETY:` comment just before it (or on a
//!   comment line that covers a group: at most [`SAFETY_REACH`] lines above).
//! * Every path dependency of `[workspace.dependencies]` exists.
//! * The interposer's layers depend one way ([`layers`]): `custom/` (hand-written functions)
//!   on `runtime/` on `conn.rs`, with `state.rs` and `ahead/` below; `ahead/` is plain data
//!   and decisions (no connection, no call path, no hand-written function).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::spec::SpecFile;

/// How far above an `unsafe` block its `// SAFETY:` comment may stand.
pub const SAFETY_REACH: usize = 6;

/// One broken convention: where, and what.
#[derive(Debug, PartialEq, Eq)]
pub struct Finding {
    pub place: String,
    pub what: String,
}

pub fn run(root: &Path) -> Result<()> {
    let mut findings = specs(root)?;
    for file in rust_files(root)? {
        let text = std::fs::read_to_string(root.join(&file)).with_context(|| format!("reading {}", file.display()))?;
        findings.extend(source(&file.display().to_string(), &text));
    }
    findings.extend(workspace_dependencies(root)?);
    for file in rust_files(root)? {
        let name = file.display().to_string();
        if let Some(module) = name.strip_prefix("interposer/src/") {
            let text = std::fs::read_to_string(root.join(&file))?;
            findings.extend(layers(module, &text));
        }
    }
    if findings.is_empty() {
        eprintln!("tidy: all conventions hold");
        return Ok(());
    }
    for f in &findings {
        eprintln!("{}: {}", f.place, f.what);
    }
    bail!("tidy: {} findings", findings.len())
}

/// Spec entries: hand-written functions and deliberate NOT_SUPPORTED say why.
pub fn specs(root: &Path) -> Result<Vec<Finding>> {
    let mut out = Vec::new();
    let mut files: Vec<PathBuf> = std::fs::read_dir(root.join("specs"))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "toml") && p.file_name().is_some_and(|n| n != "libraries.toml"))
        .collect();
    files.sort();
    for path in files {
        let text = std::fs::read_to_string(&path)?;
        let spec: SpecFile = toml::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        for (function, f) in &spec.function {
            let place = format!("specs/{name}: {function}");
            if f.class == Some(crate::spec::Class::Custom) && f.reason.as_deref().is_none_or(|r| r.trim().is_empty()) {
                out.push(Finding {
                    place: place.clone(),
                    what: "hand-written (class = \"custom\") without a reason".into(),
                });
            }
            if f.unsupported.as_deref().is_some_and(|r| r.trim().is_empty()) {
                out.push(Finding { place, what: "NOT_SUPPORTED without a reason".into() });
            }
        }
    }
    Ok(out)
}

/// The tracked Rust files outside generated code and generator fixtures.
fn rust_files(root: &Path) -> Result<Vec<PathBuf>> {
    let out =
        Command::new("git").current_dir(root).args(["ls-files", "*.rs"]).output().context("running git ls-files")?;
    if !out.status.success() {
        bail!("git ls-files failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.starts_with("generated/") && !l.starts_with("tests/fixtures/"))
        .map(PathBuf::from)
        .collect())
}

/// Module doc and SAFETY comments of one source file.
pub fn source(place: &str, text: &str) -> Vec<Finding> {
    let mut out = Vec::new();
    let first = text.lines().find(|l| !l.trim().is_empty() && !l.starts_with("#!["));
    if !first.is_some_and(|l| l.starts_with("//!")) {
        out.push(Finding { place: place.to_owned(), what: "no `//!` module doc at the top".into() });
    }
    let lines: Vec<&str> = text.lines().collect();
    // Depth of `quote! { ... }` templates: generated code, not this file's own.
    let mut template = 0i64;
    for (i, line) in lines.iter().enumerate() {
        let code = line.split("//").next().unwrap_or("");
        let opens = code.matches('{').count() as i64;
        let closes = code.matches('}').count() as i64;
        if template > 0 || code.contains("quote! {") || code.contains("quote!{") {
            template = (template + opens - closes).max(0);
            continue;
        }
        if !is_unsafe_block(code) {
            continue;
        }
        let from = i.saturating_sub(SAFETY_REACH);
        if !lines[from..=i].iter().any(|l| l.contains("SAFETY")) {
            out.push(Finding {
                place: format!("{place}:{}", i + 1),
                what: "`unsafe` block without `// SAFETY:`".into(),
            });
        }
    }
    out
}

/// The interposer's layering, for one file of `interposer/src` (`module`: its path there):
/// what its code (not its comments) may not name. Only the crate root and the generated
/// exports sit above `custom/`; `state.rs` names types of `custom/` for the tables it owns.
pub fn layers(module: &str, text: &str) -> Vec<Finding> {
    let forbidden: &[&str] = if module.starts_with("ahead/") {
        &["crate::custom", "crate::runtime", "crate::conn", "crate::state", "crate::learned"]
    } else if module.starts_with("custom/") || module == "lib.rs" || module == "state.rs" {
        &[]
    } else if module.starts_with("runtime/") {
        &["crate::custom"]
    } else {
        // The connection and what it uses (lanes, mirrors, modules, the registry, …).
        &["crate::custom", "crate::runtime"]
    };
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let code = line.split("//").next().unwrap_or("");
        for f in forbidden {
            if code.contains(f) {
                out.push(Finding {
                    place: format!("interposer/src/{module}:{}", i + 1),
                    what: format!("names `{f}`: the interposer's layers depend one way (custom -> runtime -> conn)"),
                });
            }
        }
    }
    out
}

/// Whether a line (without its comment) opens an `unsafe { ... }` block (not an `unsafe fn`,
/// `unsafe impl`, `unsafe extern` or `#[unsafe(...)]` attribute).
fn is_unsafe_block(code: &str) -> bool {
    let mut rest = code;
    while let Some(at) = rest.find("unsafe") {
        let before = &rest[..at];
        let after = rest[at + "unsafe".len()..].trim_start();
        let word_start = before.chars().last().is_none_or(|c| !c.is_alphanumeric() && c != '_');
        if word_start && after.starts_with('{') && !before.trim_end().ends_with("#[") {
            return true;
        }
        rest = &rest[at + "unsafe".len()..];
    }
    false
}

/// Path dependencies of the workspace that point nowhere.
fn workspace_dependencies(root: &Path) -> Result<Vec<Finding>> {
    let text = std::fs::read_to_string(root.join("Cargo.toml"))?;
    let manifest: toml::Value = toml::from_str(&text)?;
    let mut out = Vec::new();
    let deps = manifest.get("workspace").and_then(|w| w.get("dependencies")).and_then(|d| d.as_table());
    for (name, dep) in deps.into_iter().flatten() {
        if let Some(path) = dep.get("path").and_then(|p| p.as_str())
            && !root.join(path).join("Cargo.toml").is_file()
        {
            out.push(Finding {
                place: format!("Cargo.toml: {name}"),
                what: format!("workspace dependency on {path}, which holds no crate"),
            });
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn whats(place: &str, text: &str) -> Vec<String> {
        source(place, text).into_iter().map(|f| format!("{} {}", f.place, f.what)).collect()
    }

    #[test]
    fn unsafe_blocks_need_a_safety_comment_nearby() {
        let ok = "//! Doc.\nfn f() {\n    // SAFETY: fine.\n    unsafe { g() };\n}\n";
        assert!(whats("a.rs", ok).is_empty());
        let missing = "//! Doc.\nfn f() {\n    unsafe { g() };\n}\n";
        assert_eq!(whats("a.rs", missing), ["a.rs:3 `unsafe` block without `// SAFETY:`"]);
        // Not blocks: functions, impls, attributes, words containing it, comments.
        let others = "//! Doc.\npub unsafe fn f() {}\nunsafe impl Send for X {}\n#[unsafe(no_mangle)]\nfn not_unsafe_x() {}\n// unsafe { }\n";
        assert!(whats("a.rs", others).is_empty(), "{:?}", whats("a.rs", others));
        // Inside a quote! template the code is generated, not this file's.
        let template = "//! Doc.\nfn f() {\n    quote! {\n        fn g() {\n            unsafe { #body }\n        }\n    };\n    unsafe { h() };\n}\n";
        assert_eq!(whats("a.rs", template), ["a.rs:8 `unsafe` block without `// SAFETY:`"]);
    }

    #[test]
    fn the_interposers_layers_depend_one_way() {
        let names = |module: &str, text: &str| layers(module, text).len();
        assert_eq!(names("conn.rs", "crate::custom::capture::changed();\n"), 1);
        assert_eq!(names("conn.rs", "let t = crate::runtime::thread_id();\n"), 1);
        assert_eq!(
            names("conn.rs", "// see crate::custom::cudnn\ncrate::state::CLIENT;\n"),
            0,
            "comments name anything"
        );
        assert_eq!(names("runtime/mod.rs", "crate::custom::x();\ncrate::runtime::y();\n"), 1);
        assert_eq!(names("ahead/idle.rs", "crate::conn::get();\n"), 1);
        assert_eq!(names("custom/cudnn.rs", "crate::runtime::call();\ncrate::conn::get();\n"), 0);
        assert_eq!(names("state.rs", "pub x: Table<u64, crate::custom::graphs::NodeRecord>,\n"), 0);
    }

    #[test]
    fn files_need_a_module_doc() {
        assert_eq!(whats("b.rs", "use x;\n"), ["b.rs no `//!` module doc at the top"]);
        assert!(whats("b.rs", "#![allow(x)]\n//! Doc.\n").is_empty());
    }
}
