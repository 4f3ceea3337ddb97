//! Hand-written CUPTI functions: the status texts, answered from the generated table (the
//! rest of CUPTI, profiling in the program's process, is not supported).
//!
//! Every `unsafe fn` here has the safety contract of the CUPTI function of the same name.
#![allow(non_snake_case, clippy::missing_safety_doc)]

use std::ffi::c_void;

use chidori_cuda::consts::CUptiResult as result;

const SUCCESS: u32 = result::CUPTI_SUCCESS;
const INVALID_PARAMETER: u32 = result::CUPTI_ERROR_INVALID_PARAMETER;

/// Newest CUDA version whose status table describes CUPTI's codes (they only grow).
const TABLE_VERSION: &str = "13.1";

/// The text of `status` into the caller's `const char*`: its description, or its name
/// where the header has none. An unknown code is an invalid parameter, its text NULL, as
/// CUPTI's own answers it.
fn text(name: &'static str, status: u32, out: *mut c_void) -> u32 {
    crate::guard::ffi(name, INVALID_PARAMETER, || {
        // SAFETY: `out` is the caller's `const char**` or NULL.
        match unsafe { crate::runtime::write_status_text(TABLE_VERSION, "cupti", i64::from(status), false, out) } {
            Some(true) => SUCCESS,
            _ => INVALID_PARAMETER,
        }
    })
}

pub unsafe fn cuptiGetResultString(result: u32, str_: *mut c_void) -> u32 {
    text("cuptiGetResultString", result, str_)
}

pub unsafe fn cuptiGetErrorMessage(result: u32, str_: *mut c_void) -> u32 {
    text("cuptiGetErrorMessage", result, str_)
}

#[cfg(test)]
mod tests {
    use std::ffi::{CStr, c_char};

    #[test]
    fn status_texts_come_from_the_table() {
        let mut out: *const c_char = std::ptr::null();
        let slot = (&mut out as *mut *const c_char).cast();
        // SAFETY: `slot` is a valid `const char*` slot.
        assert_eq!(unsafe { super::cuptiGetResultString(super::result::CUPTI_ERROR_NOT_SUPPORTED, slot) }, 0);
        assert!(!out.is_null());
        // SAFETY: a NUL-terminated static from the table.
        let text = unsafe { CStr::from_ptr(out) }.to_string_lossy().into_owned();
        assert!(!text.is_empty(), "{text}");
        // SAFETY: as above.
        assert_eq!(unsafe { super::cuptiGetErrorMessage(0xdead, slot) }, super::INVALID_PARAMETER);
        assert!(out.is_null());
        // SAFETY: a NULL slot is refused, never written.
        assert_eq!(unsafe { super::cuptiGetResultString(0, std::ptr::null_mut()) }, super::INVALID_PARAMETER);
    }
}
