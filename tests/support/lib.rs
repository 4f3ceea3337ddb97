//! Shared helpers of the end-to-end tests.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

pub fn root() -> PathBuf {
    xtask::project_root()
}

/// The cargo output directory of the running test (target/debug), where libchidori.so is.
pub fn build_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    // target/debug/deps/<test>-<hash> → target/debug
    exe.parent().and_then(Path::parent).expect("target dir layout").to_path_buf()
}

/// Write `text` to `path` as an executable script (a stand-in for a tool).
pub fn script(path: &Path, text: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, text).expect("writing a script");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).expect("making a script executable");
}

/// A fresh scratch directory under target/, unique to this process and `name`.
pub fn scratch(name: &str) -> PathBuf {
    let dir = build_dir().join("chidori-test-scratch").join(format!("{name}-{}", std::process::id()));
    if dir.exists() {
        std::fs::remove_dir_all(&dir).expect("clearing scratch dir");
    }
    std::fs::create_dir_all(&dir).expect("creating scratch dir");
    dir
}

/// libchidori.so plus every shim of generated/shims, linked once per test process.
pub fn shim_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        // Building the chidori-interposer dependency of a test emits its cdylib into deps/
        // (only a direct `cargo build` copies it up): take the newest of the two.
        let candidates = [build_dir().join("deps/libchidori.so"), build_dir().join("libchidori.so")];
        let core = candidates
            .iter()
            .filter_map(|p| Some((std::fs::metadata(p).ok()?.modified().ok()?, p)))
            .max()
            .map(|(_, p)| p.clone())
            .expect("libchidori.so is missing: it is built with the chidori-interposer dependency");
        let dir = scratch("shims");
        std::fs::copy(&core, dir.join("libchidori.so")).expect("copying libchidori.so");
        xtask::dist::build_shims(&root(), &dir).expect("linking the shims");
        dir
    })
}

/// Runtime headers (cuda.h, cuda_runtime_api.h, …) of `cuda`, fetched into the cache if
/// missing (the small nvidia-cuda-runtime wheels only).
pub fn runtime_headers(cuda: &str) -> PathBuf {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _guard = LOCK.lock().unwrap_or_else(|p| p.into_inner());
    let root = root();
    let lock = xtask::lock::Lock::load(&root).expect("headers/cuda.lock.toml");
    let entry = lock.version(cuda).expect("version in lock");
    if !xtask::headers::is_complete(&root, entry, xtask::headers::Selection::RuntimeOnly) {
        xtask::headers::fetch(&root, &[cuda.to_owned()], xtask::headers::Selection::RuntimeOnly, false)
            .expect("fetching runtime headers (needs PyPI)");
    }
    xtask::headers::include_dir(&root, cuda)
}

/// NVIDIA's `file` (`libcudart.so.13`, …) of CUDA `cuda`, from the runtime wheel (fetched
/// with the headers).
pub fn runtime_library(cuda: &str, file: &str) -> PathBuf {
    runtime_headers(cuda);
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _guard = LOCK.lock().unwrap_or_else(|p| p.into_inner());
    xtask::headers::runtime_library(&root(), cuda, file).expect("extracting a runtime library (needs PyPI)")
}

/// Compile a C program with gcc; panics with the compiler's output on failure.
pub fn cc(source: &Path, output: &Path, args: &[&str]) {
    let out = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
        .arg(source)
        .arg("-o")
        .arg(output)
        .args(args)
        .output()
        .expect("running the C compiler");
    assert!(out.status.success(), "compiling {} failed:\n{}", source.display(), String::from_utf8_lossy(&out.stderr));
}

/// Run a command, returning stdout; panics with stderr on failure.
pub fn run(cmd: &mut Command) -> String {
    let out = cmd.output().expect("running command");
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}
