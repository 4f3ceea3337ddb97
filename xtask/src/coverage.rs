//! `cargo xtask coverage`: how each library's exports are implemented, per CUDA version,
//! and which functions stock torch imports still answer NOT_SUPPORTED.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use anyhow::Result;

use crate::model::{Disposition, Model, Target};

#[derive(Default)]
struct Counts {
    exported: usize,
    forwarded: usize,
    generated_local: usize,
    hand_written: usize,
    unsupported: usize,
}

pub fn report(root: &Path, model: &Model) -> Result<String> {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "| library | CUDA | SONAME | exported | forwarded (generated) | local (generated) | hand-written | NOT_SUPPORTED |"
    );
    let _ = writeln!(out, "|---|---|---|---:|---:|---:|---:|---:|");
    for lib in &model.libraries {
        for shim in &lib.shims {
            for v in &shim.versions {
                let mut c = Counts::default();
                for f in lib.functions.values() {
                    let Some(var) = crate::emit::variant_for(f, v) else { continue };
                    c.exported += 1;
                    match &var.disposition {
                        Disposition::Forward { .. } => c.forwarded += 1,
                        Disposition::GeneratedLocal { .. } => c.generated_local += 1,
                        Disposition::Custom { .. } => c.hand_written += 1,
                        Disposition::Unsupported { .. } => c.unsupported += 1,
                    }
                }
                // Exports of the real library that no header declares: signature-less stubs.
                let undeclared = lib.undeclared.get(&shim.soname).map(|s| s.len()).unwrap_or(0);
                let _ = writeln!(
                    out,
                    "| {} | {v} | {} | {} | {} | {} | {} | {} |",
                    lib.lib.name,
                    shim.soname,
                    c.exported + undeclared,
                    c.forwarded,
                    c.generated_local,
                    c.hand_written,
                    c.unsupported + undeclared
                );
            }
        }
    }
    // torch 2.11+cu130 imports still answered by NOT_SUPPORTED stubs.
    let imports = root.join("../shared/data/torch-2.11-cu130-imports.txt");
    if let Ok(text) = std::fs::read_to_string(&imports) {
        let mut by_lib: BTreeMap<String, Vec<String>> = BTreeMap::new();
        let mut total = 0;
        for line in text.lines() {
            let Some((_, sym)) = line.split_once(' ') else { continue };
            total += 1;
            let (name, node) = sym.split_once('@').map(|(n, v)| (n, Some(v))).unwrap_or((sym, None));
            for lib in &model.libraries {
                for shim in &lib.shims {
                    let matches = match node {
                        Some(node) => shim.node.as_deref() == Some(node),
                        None => shim.node.is_none(),
                    };
                    if !matches {
                        continue;
                    }
                    if let Some(Target::Unsupported { .. }) = shim.exports.get(name) {
                        let reason = lib
                            .functions
                            .get(name)
                            .and_then(|f| f.variants.last())
                            .and_then(|v| match &v.disposition {
                                Disposition::Unsupported { reason } => Some(reason.clone()),
                                _ => None,
                            })
                            .or_else(|| lib.spec.undeclared_reason(name).map(str::to_owned))
                            .unwrap_or_else(|| "declared in no header".into());
                        by_lib.entry(lib.lib.name.clone()).or_default().push(format!("{name} ({reason})"));
                    }
                }
            }
        }
        let unsupported: usize = by_lib.values().map(Vec::len).sum();
        let _ = writeln!(out, "\ntorch 2.11+cu130 imports {total} functions; {unsupported} answer NOT_SUPPORTED:");
        for (lib, names) in by_lib {
            let _ = writeln!(out, "\n{lib} ({}):", names.len());
            for n in names {
                let _ = writeln!(out, "  {n}");
            }
        }
    }
    Ok(out)
}

/// Every NOT_SUPPORTED export of `library` at CUDA `cuda`, with its reason: the functions
/// whose variant for that version is unsupported, then the real library's exports that no
/// header declares.
pub fn unsupported(model: &Model, library: &str, cuda: &str) -> Result<String> {
    let Some(lib) = model.libraries.iter().find(|l| l.lib.name == library) else {
        anyhow::bail!("no library {library}");
    };
    let Some(shim) = lib.shims.iter().find(|s| s.versions.iter().any(|v| v == cuda)) else {
        anyhow::bail!("{library} has no SONAME for CUDA {cuda}");
    };
    let mut rows = Vec::new();
    for (name, f) in &lib.functions {
        let Some(var) = crate::emit::variant_for(f, cuda) else { continue };
        if let Disposition::Unsupported { reason } = &var.disposition {
            rows.push(format!("  {name}: {reason}"));
        }
    }
    for name in lib.undeclared.get(&shim.soname).into_iter().flatten() {
        let reason = lib.spec.undeclared_reason(name).unwrap_or("declared in no header");
        rows.push(format!("  {name}: {reason}"));
    }
    let mut out = format!("\n{library} {cuda} ({}): {} NOT_SUPPORTED\n", shim.soname, rows.len());
    for row in rows {
        let _ = writeln!(out, "{row}");
    }
    Ok(out)
}
