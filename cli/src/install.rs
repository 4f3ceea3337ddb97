//! Where the files of an installation are, relative to the running `chidori` binary: the
//! client libraries `chidori run` preloads and the device profiles of the emulated backend.
//!
//! Two layouts hold them:
//!
//! * the release directory of `cargo xtask dist`: `bin/chidori`, `lib/` (libchidori.so and
//!   the shims), `share/chidori/profiles/`;
//! * the Python package pip installs from the wheel (`cargo xtask wheel`), whose files live
//!   inside the package, `chidori/lib/` and `chidori/profiles/`, with the binary in the
//!   scripts directory of the install scheme:
//!   * a venv, a `--user` or a system install: `PREFIX/bin/chidori` and
//!     `PREFIX/lib/python3.X/site-packages/chidori` (`lib64` where the distribution puts
//!     platform packages there, `dist-packages` for Debian's system Python);
//!   * `pip install --target DIR`: `DIR/bin/chidori` and `DIR/chidori`.
//!
//! `python/chidori/_find.py` makes the same search from the package's side.

use std::path::{Path, PathBuf};

use anyhow::{Result, bail};
use chidori_protocol::env;

/// The core library every shim links against: a directory holding it is a library
/// directory.
const CORE_LIBRARY: &str = "libchidori.so";

/// The directories where the Python package `chidori` may be, for the binary at `exe`, in
/// the order they are searched (newest Python first where several are installed).
pub fn package_dirs(exe: &Path) -> Vec<PathBuf> {
    let Some(bin) = exe.parent() else { return Vec::new() };
    let Some(prefix) = bin.parent() else { return Vec::new() };
    let mut dirs = Vec::new();
    for lib in ["lib", "lib64"] {
        let mut pythons: Vec<(Vec<u32>, PathBuf)> = std::fs::read_dir(prefix.join(lib))
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|entry| {
                let name = entry.file_name().to_string_lossy().into_owned();
                let version = name.strip_prefix("python")?;
                let numbers: Option<Vec<u32>> = version.split('.').map(|n| n.parse().ok()).collect();
                Some((numbers?, entry.path()))
            })
            .collect();
        pythons.sort_by(|a, b| b.0.cmp(&a.0));
        for (_, python) in pythons {
            for packages in ["site-packages", "dist-packages"] {
                dirs.push(python.join(packages).join("chidori"));
            }
        }
    }
    dirs.push(prefix.join("chidori"));
    dirs
}

/// Directories that may hold the client libraries, in search order: the dist layout's
/// `lib/` beside `bin/`, then the installed package's.
pub fn lib_dir_candidates(exe: &Path) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(prefix) = exe.parent().and_then(Path::parent) {
        dirs.push(prefix.join("lib"));
    }
    dirs.extend(package_dirs(exe).into_iter().map(|package| package.join("lib")));
    dirs
}

/// The first directory of [`lib_dir_candidates`] that holds libchidori.so; the error says
/// where it looked and what to do.
pub fn find_lib_dir(exe: &Path) -> Result<PathBuf> {
    let candidates = lib_dir_candidates(exe);
    if let Some(dir) = candidates.iter().find(|dir| dir.join(CORE_LIBRARY).is_file()) {
        return Ok(dir.clone());
    }
    bail!(
        "Chidori's client libraries ({CORE_LIBRARY} and the shims) were not found beside {}; searched:\n  {}\n\
         Reinstall (`pip install chidori`, or `cargo xtask dist` for target/dist), or point at \
         them with --lib-dir DIR or {}=DIR",
        exe.display(),
        candidates.iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join("\n  "),
        env::LIB_DIR
    )
}

/// Where the device profile `name` (`nvidia-h200.json`) may be, in search order.
pub fn profile_candidates(exe: &Path, name: &str) -> Vec<PathBuf> {
    let mut files = Vec::new();
    if let Some(prefix) = exe.parent().and_then(Path::parent) {
        files.push(prefix.join("share/chidori/profiles").join(name));
    }
    files.extend(package_dirs(exe).into_iter().map(|package| package.join("profiles").join(name)));
    files
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A scratch directory for one test.
    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("chidori-install-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// Create `files` (paths relative to `root`) and return where `bin/chidori` finds its
    /// libraries.
    fn check(name: &str, files: &[&str], expected: Option<&str>) {
        let root = scratch(name);
        for file in files {
            let path = root.join(file);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, b"").unwrap();
        }
        let found = find_lib_dir(&root.join("bin/chidori"));
        match expected {
            Some(expected) => assert_eq!(found.unwrap(), root.join(expected), "{name}"),
            None => {
                let message = format!("{:#}", found.unwrap_err());
                assert!(message.contains(&root.join("lib").display().to_string()), "{message}");
                assert!(message.contains("--lib-dir") && message.contains(env::LIB_DIR), "{message}");
            }
        }
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn every_install_layout_finds_its_libraries() {
        check("dist", &["bin/chidori", "lib/libchidori.so"], Some("lib"));
        check(
            "venv",
            &["bin/chidori", "lib/python3.11/site-packages/chidori/lib/libchidori.so"],
            Some("lib/python3.11/site-packages/chidori/lib"),
        );
        check(
            "lib64",
            &["bin/chidori", "lib64/python3.12/site-packages/chidori/lib/libchidori.so"],
            Some("lib64/python3.12/site-packages/chidori/lib"),
        );
        check(
            "debian",
            &["bin/chidori", "lib/python3.11/dist-packages/chidori/lib/libchidori.so"],
            Some("lib/python3.11/dist-packages/chidori/lib"),
        );
        check("target", &["bin/chidori", "chidori/lib/libchidori.so"], Some("chidori/lib"));
        // A prefix's lib/ that holds other libraries but not Chidori's is not the dist layout.
        check(
            "prefix-lib",
            &["bin/chidori", "lib/libz.so.1", "lib/python3.9/site-packages/chidori/lib/libchidori.so"],
            Some("lib/python3.9/site-packages/chidori/lib"),
        );
        check("nothing", &["bin/chidori"], None);
    }

    #[test]
    fn the_newest_python_comes_first() {
        check(
            "pythons",
            &[
                "bin/chidori",
                "lib/python3.9/site-packages/chidori/lib/libchidori.so",
                "lib/python3.12/site-packages/chidori/lib/libchidori.so",
                "lib/python3.10/site-packages/chidori/lib/libchidori.so",
            ],
            Some("lib/python3.12/site-packages/chidori/lib"),
        );
    }

    #[test]
    fn profiles_are_searched_in_both_layouts() {
        let exe = Path::new("/opt/x/bin/chidori");
        let candidates = profile_candidates(exe, "nvidia-h200.json");
        assert_eq!(candidates[0], Path::new("/opt/x/share/chidori/profiles/nvidia-h200.json"));
        assert_eq!(candidates.last().unwrap(), Path::new("/opt/x/chidori/profiles/nvidia-h200.json"));
    }
}
