//! `cargo xtask headers`: fetch the locked NVIDIA wheels with `pip download --no-deps`, check
//! their sha256, and extract their `include/` trees (plus the SONAME, version nodes and
//! exported functions of the real libraries inside) into a cache outside the tracked tree.
//!
//! Layout of the cache (default `target/cuda-headers`, override `CHIDORI_HEADER_CACHE`):
//! `<cuda>/include/…` (all wheels of that version merged), `<cuda>/libraries.json` and a
//! `<cuda>/.complete` stamp holding the hash of the lock entries it was built from.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use object::{Object, ObjectSymbol};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::libraries::Libraries;
use crate::lock::{CudaVersion, Lock, Wheel};

/// A real NVIDIA shared library found in a wheel.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RealLibrary {
    pub file: String,
    pub soname: Option<String>,
    /// Version definitions other than the base one (the node consumers bind to).
    pub version_nodes: Vec<String>,
    /// Exported function symbols, sorted; `name@node` where versioned.
    pub exports: Vec<String>,
}

pub fn cache_dir(root: &Path) -> PathBuf {
    match std::env::var_os("CHIDORI_HEADER_CACHE") {
        Some(dir) => PathBuf::from(dir),
        None => root.join("target/cuda-headers"),
    }
}

fn wheel_dir(root: &Path) -> PathBuf {
    match std::env::var_os("CHIDORI_WHEEL_CACHE") {
        Some(dir) => PathBuf::from(dir),
        None => root.join("target/cuda-wheels"),
    }
}

pub fn include_dir(root: &Path, cuda: &str) -> PathBuf {
    cache_dir(root).join(cuda).join("include")
}

/// Which wheels to fetch: everything, or only the small runtime wheels (`cuda.h`,
/// `cuda_runtime_api.h`, …) that the C probes in CI compile against.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Selection {
    All,
    RuntimeOnly,
}

fn selected(wheel: &Wheel, selection: Selection) -> bool {
    match selection {
        Selection::All => true,
        Selection::RuntimeOnly => wheel.name.starts_with("nvidia-cuda-runtime"),
    }
}

fn stamp_of(cuda: &CudaVersion, selection: Selection) -> String {
    let mut hasher = Sha256::new();
    for wheel in cuda.wheels.iter().filter(|w| selected(w, selection)) {
        hasher.update(wheel.sha256.as_bytes());
    }
    format!("{:x}", hasher.finalize())
}

/// True when the cache for `cuda` holds at least `selection`.
pub fn is_complete(root: &Path, cuda: &CudaVersion, selection: Selection) -> bool {
    let dir = cache_dir(root).join(&cuda.version);
    let Ok(stamp) = std::fs::read_to_string(dir.join(".complete")) else { return false };
    stamp.lines().any(|line| line == stamp_of(cuda, selection) || line == stamp_of(cuda, Selection::All))
}

pub fn fetch(root: &Path, versions: &[String], selection: Selection, keep_wheels: bool) -> Result<()> {
    let lock = Lock::load(root)?;
    let libraries = Libraries::load(root)?;
    for version in versions {
        let cuda = lock.version(version)?;
        if is_complete(root, cuda, selection) {
            eprintln!("headers: CUDA {version} already in {}", cache_dir(root).join(version).display());
            continue;
        }
        let out = cache_dir(root).join(version);
        if out.exists() {
            std::fs::remove_dir_all(&out).with_context(|| format!("clearing {}", out.display()))?;
        }
        std::fs::create_dir_all(out.join("include"))?;
        let mut real = BTreeMap::new();
        for wheel in cuda.wheels.iter().filter(|w| selected(w, selection)) {
            let path = download(root, wheel)?;
            extract(&path, &out.join("include"), &libraries, &mut real)
                .with_context(|| format!("extracting {}", path.display()))?;
            if !keep_wheels && wheel.size > 64 << 20 {
                // Large wheels are only needed once: their headers are now in the cache.
                std::fs::remove_file(&path).ok();
            }
        }
        let json = serde_json::to_string_pretty(&real.into_values().collect::<Vec<_>>())?;
        std::fs::write(out.join("libraries.json"), json)?;
        std::fs::write(out.join(".complete"), stamp_of(cuda, selection) + "\n")?;
        eprintln!("headers: CUDA {version} ready in {}", out.display());
    }
    Ok(())
}

/// NVIDIA's own `file` (such as `libcudart.so.13`) from the runtime wheel of `cuda`, extracted
/// into the cache (`<cuda>/lib/`) on first use: the end-to-end tests run the real runtime
/// against Chidori's driver.
pub fn runtime_library(root: &Path, cuda: &str, file: &str) -> Result<PathBuf> {
    let lock = Lock::load(root)?;
    let entry = lock.version(cuda)?;
    for wheel in entry.wheels.iter().filter(|w| selected(w, Selection::RuntimeOnly)) {
        if let Some(out) = wheel_library(root, cuda, wheel, file)? {
            return Ok(out);
        }
    }
    bail!("no {file} in the CUDA {cuda} runtime wheels of headers/cuda.lock.toml")
}

/// NVIDIA's own `file` from `wheel` (fetched and checked against its sha256 on first use),
/// extracted into the cache under `<dir>/lib/`; None where the wheel has no such file.
fn wheel_library(root: &Path, dir: &str, wheel: &Wheel, file: &str) -> Result<Option<PathBuf>> {
    let out = cache_dir(root).join(dir).join("lib").join(file);
    if out.is_file() {
        return Ok(Some(out));
    }
    let path = download(root, wheel)?;
    let mut zip = zip::ZipArchive::new(std::fs::File::open(&path)?)?;
    let Some(name) = zip.file_names().find(|n| n.ends_with(&format!("/lib/{file}"))).map(str::to_owned) else {
        return Ok(None);
    };
    let mut bytes = Vec::new();
    zip.by_name(&name)?.read_to_end(&mut bytes)?;
    std::fs::create_dir_all(out.parent().unwrap_or(root))?;
    // Written whole under another name first: a concurrent reader never sees half a file.
    let partial = out.with_extension(format!("partial-{}", std::process::id()));
    std::fs::write(&partial, bytes)?;
    std::fs::rename(&partial, &out)?;
    Ok(Some(out))
}

fn download(root: &Path, wheel: &Wheel) -> Result<PathBuf> {
    let dir = wheel_dir(root);
    std::fs::create_dir_all(&dir)?;
    let path = dir.join(&wheel.file);
    if path.exists() && sha256_file(&path)? == wheel.sha256 {
        return Ok(path);
    }
    eprintln!("headers: pip download {}=={} ({} MB)", wheel.name, wheel.version, wheel.size >> 20);
    let mut cmd = Command::new(python());
    cmd.args(["-m", "pip", "download", "--no-deps", "--quiet", "--disable-pip-version-check"])
        .args(["--only-binary=:all:", "--python-version", "3.12", "--dest"])
        .arg(&dir)
        .arg(format!("{}=={}", wheel.name, wheel.version));
    for tag in wheel.platform_tags() {
        if tag != "any" {
            cmd.args(["--platform", &tag]);
        }
    }
    let status = cmd.status().context("running `python3 -m pip download` (is pip installed?)")?;
    if !status.success() {
        bail!("pip download {}=={} failed ({status})", wheel.name, wheel.version);
    }
    if !path.exists() {
        bail!("pip download {}=={} did not produce {}", wheel.name, wheel.version, wheel.file);
    }
    let got = sha256_file(&path)?;
    if got != wheel.sha256 {
        std::fs::remove_file(&path).ok();
        bail!("{}: sha256 {got} does not match the lock ({}); the download was removed", wheel.file, wheel.sha256);
    }
    Ok(path)
}

fn python() -> String {
    std::env::var("PYTHON").unwrap_or_else(|_| "python3".to_owned())
}

fn sha256_file(path: &Path) -> Result<String> {
    let mut file = std::fs::File::open(path)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(format!("{:x}", hasher.finalize()))
}

fn extract(
    wheel: &Path,
    include: &Path,
    libraries: &Libraries,
    real: &mut BTreeMap<String, RealLibrary>,
) -> Result<()> {
    let file = std::fs::File::open(wheel)?;
    let mut zip = zip::ZipArchive::new(file)?;
    let patterns: Vec<regex::Regex> = libraries
        .libraries
        .iter()
        .filter_map(|l| l.real_library.as_deref())
        .map(|re| regex::Regex::new(&format!("^(?:{re})$")))
        .collect::<Result<_, _>>()?;
    for i in 0..zip.len() {
        let mut entry = zip.by_index(i)?;
        let name = entry.name().to_owned();
        if entry.is_dir() {
            continue;
        }
        if let Some((_, rel)) = name.split_once("/include/") {
            if rel.ends_with(".py") || rel.contains("..") {
                continue;
            }
            let dst = include.join(rel);
            std::fs::create_dir_all(dst.parent().unwrap_or(include))?;
            let mut bytes = Vec::with_capacity(entry.size() as usize);
            entry.read_to_end(&mut bytes)?;
            std::fs::write(&dst, bytes)?;
        } else if name.contains("/lib/") {
            let base = name.rsplit('/').next().unwrap_or_default().to_owned();
            if patterns.iter().any(|p| p.is_match(&base)) {
                let mut bytes = Vec::with_capacity(entry.size() as usize);
                entry.read_to_end(&mut bytes)?;
                real.insert(base.clone(), inspect(&base, &bytes).with_context(|| format!("reading ELF {name}"))?);
            }
        }
    }
    Ok(())
}

/// C++ internals (cuSPARSELt exports tens of thousands of mangled names) are no API.
pub fn is_api_symbol(name: &str) -> bool {
    !(name.is_empty() || name.starts_with("_Z") || name.starts_with("_ITM"))
}

/// SONAME, version definitions and exported functions of a shared library.
pub fn inspect(file: &str, bytes: &[u8]) -> Result<RealLibrary> {
    let elf = object::read::elf::ElfFile64::<object::Endianness>::parse(bytes)?;
    let soname = crate::elf::soname(&elf)?;
    let (version_nodes, versions_by_index) = crate::elf::version_definitions(&elf)?;
    let mut exports = Vec::new();
    for symbol in elf.dynamic_symbols() {
        if symbol.is_undefined() || !symbol.is_global() || symbol.kind() != object::SymbolKind::Text {
            continue;
        }
        let name = symbol.name()?;
        if !is_api_symbol(name) {
            continue;
        }
        match versions_by_index.get(symbol.index().0) {
            Some(Some(node)) => exports.push(format!("{name}@{node}")),
            _ => exports.push(name.to_owned()),
        }
    }
    exports.sort();
    exports.dedup();
    Ok(RealLibrary { file: file.to_owned(), soname, version_nodes, exports })
}
