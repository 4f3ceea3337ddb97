//! Finding and loading the real NVIDIA libraries at run time (no link-time CUDA
//! dependency). Search order: directories from `--cuda-lib-dir`/`CHIDORI_CUDA_LIB_DIRS`,
//! the `nvidia/*/lib` directories of Python environments (where pip puts the CUDA wheels:
//! the active venv or conda environment, the one the `chidori` binary was installed into,
//! the system's and the user's), CUDA toolkit directories, then the loader's own search
//! (LD_LIBRARY_PATH, ld.so.cache).

use std::ffi::{CStr, CString, c_void};
use std::path::{Path, PathBuf};

/// A library opened with dlopen; never closed (its functions may be running on any thread).
pub struct Library {
    handle: *mut c_void,
    pub path: String,
}

// SAFETY: a dlopen handle may be used from any thread.
unsafe impl Send for Library {}
// SAFETY: dlsym on a handle is thread-safe.
unsafe impl Sync for Library {}

impl Library {
    /// Address of `symbol`, or None.
    pub fn symbol(&self, symbol: &str) -> Option<*const c_void> {
        let name = CString::new(symbol).ok()?;
        // SAFETY: handle is a live dlopen handle; name is NUL-terminated.
        let p = unsafe { libc::dlsym(self.handle, name.as_ptr()) };
        (!p.is_null()).then_some(p as *const c_void)
    }

    /// The function `name` as the function pointer type `F`.
    ///
    /// # Safety
    /// `F` must be the C signature of `name` in this library.
    pub unsafe fn function<F: Copy>(&self, name: &str) -> Result<F, String> {
        const { assert!(size_of::<F>() == size_of::<*const c_void>()) };
        let p = self.symbol(name).ok_or_else(|| format!("{} lacks {name}", self.path))?;
        // SAFETY: `F` is a function pointer type of a data pointer's size (asserted above)
        // and the signature of `name` per the contract.
        Ok(unsafe { std::mem::transmute_copy::<*const c_void, F>(&p) })
    }
}

fn dlopen(path: &str) -> Result<Library, String> {
    let c = CString::new(path).map_err(|e| e.to_string())?;
    // SAFETY: c is NUL-terminated; RTLD_NOW|RTLD_LOCAL keeps the library's symbols private.
    let handle = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if handle.is_null() {
        // SAFETY: dlerror returns a NUL-terminated message or null.
        let err = unsafe { libc::dlerror() };
        let msg = if err.is_null() {
            "unknown error".to_owned()
        } else {
            // SAFETY: non-null dlerror result is a valid C string.
            unsafe { CStr::from_ptr(err) }.to_string_lossy().into_owned()
        };
        return Err(msg);
    }
    Ok(Library { handle, path: path.to_owned() })
}

/// Load the libraries in `lib`'s directory whose names start with `prefix` (not the `.alt`
/// variants), for a library that later opens them by bare name (NVRTC its builtins): once
/// loaded from here, that lookup finds them whatever the loader's search path.
pub fn load_beside(lib: &Library, prefix: &str) -> Vec<Library> {
    let Some(dir) = Path::new(&lib.path).parent() else { return Vec::new() };
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut loaded = Vec::new();
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with(prefix)
            && !name.contains(".alt.")
            && let Ok(l) = dlopen(&e.path().to_string_lossy())
        {
            loaded.push(l);
        }
    }
    loaded
}

/// Directories searched for CUDA libraries, in order (see the module docs).
pub fn search_dirs(extra: &[PathBuf]) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = extra.to_vec();
    if let Some(env) = std::env::var_os(chidori_protocol::env::CUDA_LIB_DIRS) {
        dirs.extend(std::env::split_paths(&env));
    }
    let mut patterns = vec![
        "/usr/local/lib/python3*/dist-packages/nvidia/*/lib".to_owned(),
        "/usr/local/lib/python3*/site-packages/nvidia/*/lib".to_owned(),
        "/usr/lib/python3/dist-packages/nvidia/*/lib".to_owned(),
        "/usr/lib/python3*/site-packages/nvidia/*/lib".to_owned(),
        "/opt/*/.venv/lib/python3*/site-packages/nvidia/*/lib".to_owned(),
        "/opt/conda/lib/python3*/site-packages/nvidia/*/lib".to_owned(),
    ];
    // The environment `chidori` was installed into (`pip install chidori` in a venv where
    // torch's CUDA wheels are: PREFIX/bin/chidori; `pip install --target DIR`: DIR/bin/chidori
    // beside DIR/nvidia), ahead of the system's.
    let exe = std::env::current_exe().ok();
    if let Some(prefix) = exe.as_deref().and_then(Path::parent).and_then(Path::parent) {
        patterns.splice(0..0, installed_env_patterns(prefix));
    }
    for var in ["VIRTUAL_ENV", "CONDA_PREFIX"] {
        if let Some(prefix) = std::env::var_os(var) {
            patterns.insert(0, format!("{}/lib/python3*/site-packages/nvidia/*/lib", Path::new(&prefix).display()));
        }
    }
    if let Some(home) = std::env::var_os("HOME") {
        patterns.push(format!("{}/.local/lib/python3*/site-packages/nvidia/*/lib", Path::new(&home).display()));
    }
    for p in patterns {
        dirs.extend(glob(&p));
    }
    if let Some(cuda) = std::env::var_os("CUDA_HOME").or_else(|| std::env::var_os("CUDA_PATH")) {
        dirs.push(Path::new(&cuda).join("lib64"));
    }
    dirs.push(PathBuf::from("/usr/local/cuda/lib64"));
    let mut toolkits = glob("/usr/local/cuda-*/lib64");
    toolkits.sort();
    toolkits.reverse();
    dirs.extend(toolkits);
    dirs.push(PathBuf::from("/usr/local/nvidia/lib64"));
    dirs
}

/// Where pip puts the NVIDIA wheels of the environment whose scripts directory is
/// `PREFIX/bin`: its site-packages (`lib64` on some distributions), or `PREFIX/nvidia` for
/// `pip install --target PREFIX`.
fn installed_env_patterns(prefix: &Path) -> Vec<String> {
    let prefix = prefix.display();
    vec![
        format!("{prefix}/lib/python3*/site-packages/nvidia/*/lib"),
        format!("{prefix}/lib64/python3*/site-packages/nvidia/*/lib"),
        format!("{prefix}/nvidia/*/lib"),
    ]
}

/// A minimal glob: `*` matches within one path component.
fn glob(pattern: &str) -> Vec<PathBuf> {
    let mut current = vec![PathBuf::from("/")];
    for part in pattern.split('/').filter(|p| !p.is_empty()) {
        let mut next = Vec::new();
        for dir in &current {
            if part.contains('*') {
                let (pre, post) = part.split_once('*').unwrap_or((part, ""));
                if let Ok(entries) = std::fs::read_dir(dir) {
                    let mut names: Vec<_> = entries.filter_map(|e| e.ok()).map(|e| e.file_name()).collect();
                    names.sort();
                    for name in names {
                        let n = name.to_string_lossy();
                        if n.starts_with(pre) && n.ends_with(post) && n.len() >= pre.len() + post.len() {
                            next.push(dir.join(&*n));
                        }
                    }
                }
            } else {
                let p = dir.join(part);
                if p.exists() {
                    next.push(p);
                }
            }
        }
        current = next;
    }
    current.into_iter().filter(|p| p.is_dir()).collect()
}

/// Load the first of `sonames` found in `dirs`, else by bare SONAME through the loader.
/// The error lists what was tried.
pub fn load(sonames: &[&str], dirs: &[PathBuf]) -> Result<Library, String> {
    let mut tried = Vec::new();
    for soname in sonames {
        for dir in dirs {
            let path = dir.join(soname);
            if path.exists() {
                match dlopen(&path.to_string_lossy()) {
                    Ok(lib) => return Ok(lib),
                    Err(e) => tried.push(format!("{}: {e}", path.display())),
                }
            }
        }
    }
    for soname in sonames {
        match dlopen(soname) {
            Ok(lib) => return Ok(lib),
            Err(e) => tried.push(e),
        }
    }
    Err(format!(
        "none of {} found (searched {} directories and the loader path; pass --cuda-lib-dir or set {}): {}",
        sonames.join(", "),
        dirs.len(),
        chidori_protocol::env::CUDA_LIB_DIRS,
        tried.join("; ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_installed_environments_nvidia_wheels_are_found() {
        let prefix = std::env::temp_dir().join(format!("chidori-loader-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&prefix);
        let venv = prefix.join("venv");
        let target = prefix.join("target");
        for dir in [
            venv.join("lib/python3.11/site-packages/nvidia/cublas/lib"),
            venv.join("lib/python3.11/site-packages/nvidia/cudnn/lib"),
            target.join("nvidia/cuda_runtime/lib"),
        ] {
            std::fs::create_dir_all(dir).unwrap();
        }
        let found =
            |prefix: &Path| -> Vec<PathBuf> { installed_env_patterns(prefix).iter().flat_map(|p| glob(p)).collect() };
        assert_eq!(
            found(&venv),
            [
                venv.join("lib/python3.11/site-packages/nvidia/cublas/lib"),
                venv.join("lib/python3.11/site-packages/nvidia/cudnn/lib")
            ]
        );
        assert_eq!(found(&target), [target.join("nvidia/cuda_runtime/lib")]);
        std::fs::remove_dir_all(&prefix).unwrap();
    }
}
