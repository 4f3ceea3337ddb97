//! The client runtime: how a generated export reaches the server.
//!
//! Until a transport exists (the next issue), every forwarded call answers the library's
//! "unavailable" status (no device / not initialized), logged once per process.

use std::ffi::c_char;

use chidori_cuda::status;
use chidori_protocol::desc::{CallDesc, Ret};

/// The raw return value a call answers when it cannot reach a server.
fn unavailable(desc: &CallDesc) -> u64 {
    match desc.ret {
        Ret::Status => desc.codes.unavailable as u64,
        Ret::Val { .. } | Ret::Void => 0,
    }
}

/// Forward one call described by `desc` with its raw arguments; returns the raw result.
///
/// # Safety
/// `args` must hold the raw values of the caller's arguments as the generated export
/// converted them; pointers among them are dereferenced as `desc` describes.
pub unsafe fn call(desc: &'static CallDesc, args: &[u64]) -> u64 {
    let _ = args;
    crate::guard::ffi(desc.name, unavailable(desc), || {
        crate::log::once("no-transport", || {
            tracing::warn!(
                "no Chidori server connection: CUDA calls answer \"no device\" (start the program with `chidori run -s HOST`)"
            )
        });
        unavailable(desc)
    })
}

/// `*GetErrorName`: the status's name, from the generated table of the caller's version.
pub fn error_name(version: &str, library: &str, value: i64) -> *const c_char {
    crate::guard::ffi("error_name", UNRECOGNIZED.as_ptr(), || {
        match status::table(version, library).and_then(|t| status::find(t, value)) {
            Some(s) => s.name.as_ptr().cast(),
            None => UNRECOGNIZED.as_ptr(),
        }
    })
}

/// `*GetErrorString`: the status's one-sentence description.
pub fn error_string(version: &str, library: &str, value: i64) -> *const c_char {
    crate::guard::ffi("error_string", UNRECOGNIZED.as_ptr(), || {
        match status::table(version, library).and_then(|t| status::find(t, value)) {
            Some(s) => s.message.as_ptr().cast(),
            None => UNRECOGNIZED.as_ptr(),
        }
    })
}

static UNRECOGNIZED: &std::ffi::CStr = c"unrecognized error code";

#[cfg(test)]
mod tests {
    use std::ffi::CStr;

    #[test]
    fn error_names_come_from_the_callers_version() {
        // SAFETY: error_name returns pointers to NUL-terminated static strings.
        let name = unsafe { CStr::from_ptr(super::error_name("13.0", "cudart", 2)) };
        assert_eq!(name.to_str().unwrap(), "cudaErrorMemoryAllocation");
        let name = unsafe { CStr::from_ptr(super::error_name("12.6", "cudnn", 3000)) };
        assert_eq!(name.to_str().unwrap(), "CUDNN_STATUS_NOT_SUPPORTED");
        let name = unsafe { CStr::from_ptr(super::error_name("12.1", "cudnn", 9)) };
        assert_eq!(name.to_str().unwrap(), "CUDNN_STATUS_NOT_SUPPORTED");
        let unknown = unsafe { CStr::from_ptr(super::error_name("13.0", "cudart", 123_456)) };
        assert_eq!(unknown.to_str().unwrap(), "unrecognized error code");
    }
}
