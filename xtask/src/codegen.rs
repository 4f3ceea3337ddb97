//! `cargo xtask gen`: stage 2 (IR + specs → generated/), in Write or Check mode.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use sha2::{Digest, Sha256};

use crate::emit::{self, Output};
use crate::ir;
use crate::libraries::Libraries;
use crate::model::Model;

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Write,
    Check,
}

/// Directories whose every file is generated (stale files there are removed in Write mode
/// and reported in Check mode).
const MANAGED: &[&str] = &["generated/cuda/src", "generated/client", "generated/worker/src", "generated/shims"];

pub fn build_model(root: &Path) -> Result<Model> {
    let all = ir::load_all(root)?;
    let libraries = Libraries::load(root)?;
    Model::build(root, &all, &libraries)
}

/// Everything stage 2 produces (for `only_version`, just that version's files).
pub fn outputs(root: &Path, only_version: Option<&str>) -> Result<Vec<Output>> {
    let model = build_model(root)?;
    if let Some(v) = only_version
        && !model.versions.iter().any(|m| m == v)
    {
        bail!("no IR for CUDA {v} in generated/ir (known: {})", model.versions.join(", "));
    }
    let mut out = emit::emit(&model, only_version)?;
    if only_version.is_none() {
        out.push(("generated/manifest.toml".into(), manifest(root)?));
    }
    Ok(out)
}

/// Hashes of every stage-2 input, so a reviewer sees what a regeneration was based on.
fn manifest(root: &Path) -> Result<String> {
    let mut inputs: Vec<PathBuf> = Vec::new();
    for dir in ["generated/ir", "specs"] {
        collect(&root.join(dir), &mut inputs)?;
    }
    inputs.sort();
    let mut s = String::new();
    let _ = writeln!(s, "# {}", emit::PREAMBLE_ALL);
    let _ = writeln!(s, "# sha256 of every input of stage 2 (the IR and the specs).");
    let _ = writeln!(s, "[inputs]");
    for path in inputs {
        let rel = path.strip_prefix(root)?.to_string_lossy().replace('\\', "/");
        let hash = format!("{:x}", Sha256::digest(std::fs::read(&path)?));
        let _ = writeln!(s, "\"{rel}\" = \"{hash}\"");
    }
    Ok(s)
}

fn collect(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    if !dir.exists() {
        return Ok(());
    }
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            collect(&path, out)?;
        } else {
            out.push(path);
        }
    }
    Ok(())
}

pub fn run(root: &Path, only_version: Option<&str>, mode: Mode) -> Result<()> {
    let outputs = outputs(root, only_version)?;
    let mut stale = Vec::new();
    let mut produced = BTreeSet::new();
    for (rel, text) in &outputs {
        produced.insert(root.join(rel));
        let path = root.join(rel);
        let current = std::fs::read_to_string(&path).ok();
        if current.as_deref() == Some(text.as_str()) {
            continue;
        }
        match mode {
            Mode::Write => {
                std::fs::create_dir_all(path.parent().context("no parent")?)?;
                std::fs::write(&path, text)?;
            }
            Mode::Check => stale.push(describe(rel, current.as_deref(), text)),
        }
    }
    // Files in managed directories that nothing produces any more.
    if only_version.is_none() {
        for dir in MANAGED {
            let mut files = Vec::new();
            collect(&root.join(dir), &mut files)?;
            for f in files {
                if !produced.contains(&f) {
                    match mode {
                        Mode::Write => std::fs::remove_file(&f)?,
                        Mode::Check => stale.push(format!("{}: no longer generated", f.strip_prefix(root)?.display())),
                    }
                }
            }
        }
    }
    if !stale.is_empty() {
        let cmd = match only_version {
            Some(v) => format!("cargo xtask gen --cuda {v}"),
            None => "cargo xtask gen --all".to_owned(),
        };
        bail!(
            "generated code is stale ({} files); run `{cmd}` and commit the result:\n{}",
            stale.len(),
            stale.join("\n")
        );
    }
    Ok(())
}

/// The first differing line of a stale file.
fn describe(rel: &str, current: Option<&str>, wanted: &str) -> String {
    let Some(current) = current else { return format!("{rel}: missing") };
    for (n, (a, b)) in current.lines().zip(wanted.lines()).enumerate() {
        if a != b {
            return format!("{rel}:{}:\n  - {a}\n  + {b}", n + 1);
        }
    }
    format!("{rel}: differs in length ({} vs {} lines)", current.lines().count(), wanted.lines().count())
}
