//! The loader's `dlopen` as a Chidori program sees it. The driver's shim exports `dlopen`
//! (`dispatch` in `specs/libraries.toml`): it asks [`__chidori_dlopen_target`] where to go,
//! then jumps there with the program's return address intact, since the C library's
//! `dlopen` searches the *caller's* RUNPATH and expands its `$ORIGIN`.
//!
//! The machine's own video-engine libraries are refused: NVDEC and the JPEG engine
//! (`libnvcuvid`: nvJPEG's hardware backend, which torchvision asks for first), NVENC
//! (`libnvidia-encode`), the optical-flow engine and OptiX. They drive the machine's local
//! GPU directly, with contexts and memory that are the server's under Chidori: on a GPU
//! machine a program then hangs (torchvision's `decode_jpeg(device="cuda")` on an H100). A
//! client without an NVIDIA driver has none of them, and the libraries that use them fall
//! back (nvJPEG answers ARCH_MISMATCH, torchvision decodes with CUDA kernels): a Chidori
//! program sees the same wherever it runs. Every other name, and NULL, goes to the C
//! library's `dlopen` unchanged.

use std::ffi::{CStr, c_char, c_int, c_void};
use std::sync::OnceLock;

/// Libraries of the machine's own GPU engines, by the start of their file name.
const HIDDEN: &[&str] = &["libnvcuvid.so", "libnvidia-encode.so", "libnvidia-opticalflow.so", "libnvoptix.so"];

type Dlopen = unsafe extern "C" fn(*const c_char, c_int) -> *mut c_void;

/// The C library's `dlopen` (in libc from glibc 2.34, in libdl before). Found through
/// `dlmopen` and `dlsym` of those libraries' own handles: a plain reference to `dlopen`
/// from here would be the shim's (preloaded objects come first), and `RTLD_NEXT` finds
/// nothing after a preloaded object's dependency.
fn real() -> Option<Dlopen> {
    static REAL: OnceLock<Option<usize>> = OnceLock::new();
    let found = REAL.get_or_init(|| {
        [c"libc.so.6", c"libdl.so.2"].iter().find_map(|name| {
            // SAFETY: a NUL-terminated name; RTLD_NOLOAD only finds a loaded library.
            let handle = unsafe { libc::dlmopen(libc::LM_ID_BASE, name.as_ptr(), libc::RTLD_NOLOAD | libc::RTLD_LAZY) };
            if handle.is_null() {
                return None;
            }
            // SAFETY: a handle dlmopen gave and a NUL-terminated name.
            let address = unsafe { libc::dlsym(handle, c"dlopen".as_ptr()) };
            (!address.is_null()).then_some(address as usize)
        })
    });
    // SAFETY: the address of the C library's dlopen, whose signature this is.
    found.map(|address| unsafe { std::mem::transmute::<usize, Dlopen>(address) })
}

/// Whether a program's `dlopen` of `name` (a file name or a path) is refused.
fn hidden(name: &[u8]) -> bool {
    let base = name.rsplit(|&b| b == b'/').next().unwrap_or(name);
    HIDDEN.iter().any(|h| base.starts_with(h.as_bytes()))
}

/// Where the shim's `dlopen` jumps for `filename`: the C library's, or [`refuse`].
///
/// # Safety
/// `filename` is NULL or a NUL-terminated string (dlopen's contract).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __chidori_dlopen_target(filename: *const c_char) -> usize {
    let refused = refuse as Dlopen as usize;
    crate::guard::ffi("dlopen", refused, || {
        // SAFETY: the program's NUL-terminated name, or NULL (the program itself).
        let name = (!filename.is_null()).then(|| unsafe { CStr::from_ptr(filename) }.to_bytes());
        if name.is_some_and(hidden) {
            return refused;
        }
        match real() {
            Some(dlopen) => dlopen as usize,
            None => {
                crate::log::once("dlopen-unknown", || {
                    tracing::error!("the C library's dlopen was not found: every dlopen of this program fails")
                });
                refused
            }
        }
    })
}

/// A refused `dlopen`: NULL, with `dlerror` saying why (the C library's `dlopen` of a name
/// no file has leaves its own message there).
///
/// # Safety
/// As [`__chidori_dlopen_target`].
unsafe extern "C" fn refuse(filename: *const c_char, _flags: c_int) -> *mut c_void {
    crate::guard::ffi("dlopen", std::ptr::null_mut(), || {
        // SAFETY: as in __chidori_dlopen_target.
        let name = (!filename.is_null()).then(|| unsafe { CStr::from_ptr(filename) }.to_string_lossy().into_owned());
        let name = name.unwrap_or_default();
        crate::log::once_owned(&format!("dlopen-hidden-{name}"), || {
            tracing::info!(
                "{name}: the machine's own GPU engines are not the server's GPU; a Chidori program finds no such library"
            )
        });
        if let (Some(dlopen), Ok(reason)) =
            (real(), std::ffi::CString::new(format!("{name} (hidden by chidori run: the GPU is the server's)")))
        {
            // SAFETY: the C library's dlopen with a NUL-terminated name no file has.
            unsafe { dlopen(reason.as_ptr(), libc::RTLD_LAZY) };
        }
        std::ptr::null_mut()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_engines_libraries_are_hidden() {
        assert!(hidden(b"libnvcuvid.so.1") && hidden(b"/usr/lib/x86_64-linux-gnu/libnvcuvid.so"));
        assert!(hidden(b"libnvidia-encode.so.1") && hidden(b"libnvoptix.so.1"));
        assert!(!hidden(b"libcuda.so.1") && !hidden(b"libnvjpeg.so.13") && !hidden(b"/opt/libnvcuvid/libfoo.so"));
        assert!(!hidden(b""));
    }

    #[test]
    fn the_c_librarys_dlopen_is_found_and_other_names_go_to_it() {
        let dlopen = real().expect("the C library's dlopen");
        // SAFETY (the three): NUL-terminated names, or NULL.
        assert_eq!(unsafe { __chidori_dlopen_target(c"libm.so.6".as_ptr()) }, dlopen as usize);
        assert_eq!(unsafe { __chidori_dlopen_target(std::ptr::null()) }, dlopen as usize);
        assert_eq!(unsafe { __chidori_dlopen_target(c"libnvcuvid.so.1".as_ptr()) }, refuse as Dlopen as usize);
        // SAFETY: a NUL-terminated name.
        assert!(unsafe { refuse(c"libnvcuvid.so.1".as_ptr(), 0) }.is_null());
        // SAFETY: dlerror's message is NUL-terminated.
        let message = unsafe { CStr::from_ptr(libc::dlerror()) }.to_string_lossy().into_owned();
        assert!(message.contains("hidden by chidori run"), "{message}");
    }
}
