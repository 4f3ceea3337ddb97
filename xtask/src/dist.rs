//! `cargo xtask dist`: release artifacts in `target/dist`.
//!
//! * `bin/chidori`: the command-line tool.
//! * `lib/libchidori.so`: the client core.
//! * `lib/<SONAME>` for every replaced library: a shim assembled from
//!   `generated/shims/<SONAME>.S` with its version script, linked against libchidori.so
//!   (`-z defs`, so a shim entry that jumps to a missing core symbol fails the build).
//! * `lib/libcuda.so` → `libcuda.so.1`, for programs (Triton's launchers) linked with `-lcuda`.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

pub fn run(root: &Path, profile: &str) -> Result<PathBuf> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let status = Command::new(&cargo)
        .current_dir(root)
        .args(["build", "--profile", profile, "-p", "chidori-interposer", "-p", "chidori"])
        .status()
        .context("running cargo build")?;
    if !status.success() {
        bail!("cargo build failed");
    }
    let target_dir = match std::env::var_os("CARGO_TARGET_DIR") {
        Some(d) => PathBuf::from(d),
        None => root.join("target"),
    };
    let built = target_dir.join(if profile == "dev" { "debug" } else { profile });
    let dist = target_dir.join("dist");
    let lib = dist.join("lib");
    let bin = dist.join("bin");
    if dist.exists() {
        std::fs::remove_dir_all(&dist)?;
    }
    std::fs::create_dir_all(&lib)?;
    std::fs::create_dir_all(&bin)?;
    std::fs::copy(built.join("libchidori.so"), lib.join("libchidori.so"))?;
    std::fs::copy(built.join("chidori"), bin.join("chidori"))?;
    // Line tables make 40 MB of the 60; the release artifacts ship without them
    // (CHIDORI_DIST_DEBUG=1 keeps them for debugging on the GPU machine).
    if std::env::var_os("CHIDORI_DIST_DEBUG").is_none() {
        let stripped =
            Command::new("strip").arg("--strip-debug").arg(bin.join("chidori")).arg(lib.join("libchidori.so")).status();
        if !matches!(stripped, Ok(s) if s.success()) {
            eprintln!("dist: `strip` is not available; keeping debug information");
        }
    }
    build_shims(root, &lib)?;
    std::os::unix::fs::symlink("libcuda.so.1", lib.join("libcuda.so"))?;
    // The Python package (server-side decode; `chidori run --optimize` loads it).
    copy_tree(&root.join("python/chidori"), &dist.join("python/chidori"))?;
    // The recorded device profile the emulated backend answers from by default.
    let profiles = dist.join("share/chidori/profiles");
    std::fs::create_dir_all(&profiles)?;
    std::fs::copy(root.join("worker/profiles/nvidia-h200.json"), profiles.join("nvidia-h200.json"))?;
    eprintln!("dist: {}", dist.display());
    Ok(dist)
}

/// Copy a directory of plain files, without Python's caches.
fn copy_tree(from: &Path, to: &Path) -> Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from).with_context(|| format!("reading {}", from.display()))? {
        let entry = entry?;
        let name = entry.file_name();
        if name == "__pycache__" {
            continue;
        }
        if entry.file_type()?.is_dir() {
            copy_tree(&entry.path(), &to.join(&name))?;
        } else {
            std::fs::copy(entry.path(), to.join(&name))?;
        }
    }
    Ok(())
}

/// Assemble and link every shim of generated/shims into `lib` (which holds libchidori.so).
pub fn build_shims(root: &Path, lib: &Path) -> Result<()> {
    let shims = root.join("generated/shims");
    let index = std::fs::read_to_string(shims.join("index.txt"))?;
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_owned());
    for line in index.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty()) {
        let soname = line.split_whitespace().next().context("empty index line")?;
        let out = lib.join(soname);
        let status = Command::new(&cc)
            .args(["-shared", "-nostdlib", "-o"])
            .arg(&out)
            .arg(shims.join(format!("{soname}.S")))
            .arg(format!("-Wl,-soname,{soname}"))
            .arg(format!("-Wl,--version-script,{}", shims.join(format!("{soname}.map")).display()))
            .arg(format!("-L{}", lib.display()))
            // DT_RPATH (not RUNPATH): searched before LD_LIBRARY_PATH, so a shim always loads
            // its own sibling libchidori.so.
            .args([
                "-lchidori",
                "-Wl,-rpath,$ORIGIN",
                "-Wl,--disable-new-dtags",
                "-Wl,-z,defs",
                "-Wl,--hash-style=both",
            ])
            .status()
            .with_context(|| format!("running {cc} (a C compiler is needed to assemble the shims)"))?;
        if !status.success() {
            bail!("linking {soname} failed");
        }
    }
    Ok(())
}
