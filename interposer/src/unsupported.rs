//! The target of every NOT_SUPPORTED stub in the shims.

use std::ffi::{CStr, c_char};

/// Called by a shim stub with the function's name; logs it once and returns the library's
/// NOT_SUPPORTED status (or, for functions returning a C string, a message).
///
/// # Safety
/// `name` must be a NUL-terminated string with static lifetime (the shims pass a literal).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __chidori_unsupported(name: *const c_char, code: i64, returns_string: u32) -> i64 {
    crate::guard::ffi("__chidori_unsupported", code, || {
        // SAFETY: the shims pass a pointer to a NUL-terminated literal in their .rodata.
        let name: &'static CStr = unsafe { CStr::from_ptr(name) };
        let name = name.to_str().unwrap_or("<non-UTF-8 name>");
        crate::log::once(name, || {
            tracing::warn!("{name} is not supported by Chidori; it answers NOT_SUPPORTED (status {code})")
        });
        if returns_string != 0 {
            static MESSAGE: &CStr = c"not supported by Chidori";
            MESSAGE.as_ptr() as i64
        } else {
            code
        }
    })
}
