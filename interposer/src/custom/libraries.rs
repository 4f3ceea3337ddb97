//! Libraries (`cuLibraryLoadData`, `cudaLibraryLoadData` and their file forms): a library is
//! a module image, loaded on the server the way fat binaries and `cuModuleLoadData` images
//! are (by content hash, cached there), and kept for the session as modules are.
//!
//! Every `unsafe fn` here has the safety contract of the CUDA function it implements.
#![allow(clippy::missing_safety_doc, clippy::too_many_arguments)]

use std::ffi::{CStr, c_char, c_void};

use chidori_cuda::desc::Ctx;

use crate::conn;
use crate::modules;
use crate::state;

/// Run a library call: FFI guard, trace, and (for the runtime) the last error.
fn run(ctx: &Ctx, body: impl FnOnce() -> Result<u32, u32>) -> u32 {
    crate::guard::ffi(ctx.name, ctx.codes.invalid_value as u32, || {
        crate::trace::local(ctx.name);
        let status = body().unwrap_or_else(|e| e);
        if ctx.library == "cudart" {
            state::set_last_error(status);
        }
        status
    })
}

/// Load `image` on the server and write its library handle to `library`.
fn load(ctx: &Ctx, library: *mut c_void, image: &[u8]) -> Result<u32, u32> {
    let conn = conn::get().map_err(|_| ctx.codes.unavailable as u32)?;
    let loaded = modules::load_image(&conn, image)?;
    // SAFETY: the caller's CUlibrary* (checked non-null by the callers).
    unsafe { std::ptr::write_unaligned(library as *mut u64, loaded.library) };
    Ok(0)
}

/// cuLibraryLoadData and cudaLibraryLoadData: JIT and library options tune the server
/// driver's work; the image is what matters (as for cuModuleLoadDataEx).
pub unsafe fn load_data(
    ctx: &Ctx,
    library: *mut c_void,
    code: *mut c_void,
    _jit_options: *mut c_void,
    _jit_values: *mut c_void,
    _num_jit: u32,
    _library_options: *mut c_void,
    _library_values: *mut c_void,
    _num_library: u32,
) -> u32 {
    run(ctx, || {
        if library.is_null() || code.is_null() {
            return Err(ctx.codes.invalid_value as u32);
        }
        // SAFETY: `code` is a fat binary (or its wrapper), cubin or PTX per the function's
        // contract.
        let image = unsafe { modules::image_at(code as *const u8) };
        load(ctx, library, image)
    })
}

/// cuLibraryLoadFromFile and cudaLibraryLoadFromFile: the file is on the client.
pub unsafe fn load_from_file(
    ctx: &Ctx,
    library: *mut c_void,
    file: *mut c_void,
    _jit_options: *mut c_void,
    _jit_values: *mut c_void,
    _num_jit: u32,
    _library_options: *mut c_void,
    _library_values: *mut c_void,
    _num_library: u32,
) -> u32 {
    run(ctx, || {
        if library.is_null() || file.is_null() {
            return Err(ctx.codes.invalid_value as u32);
        }
        // SAFETY: a NUL-terminated path per the function's contract.
        let path = unsafe { CStr::from_ptr(file as *const c_char) }.to_string_lossy().into_owned();
        let mut bytes = std::fs::read(&path).map_err(|e| {
            tracing::warn!("{}: cannot read {path}: {e}", ctx.name);
            // CUDA_ERROR_FILE_NOT_FOUND / cudaErrorFileNotFound.
            301u32
        })?;
        // PTX is text the driver reads up to a NUL; ELF cubins and fat binaries are not.
        let binary = bytes.starts_with(b"\x7fELF") || bytes.starts_with(&0xBA55_ED50u32.to_le_bytes());
        if !binary && bytes.last() != Some(&0) {
            bytes.push(0);
        }
        load(ctx, library, &bytes)
    })
}

/// cuLibraryUnload and cudaLibraryUnload: libraries stay loaded for the session on the
/// server, as modules do (a later load of the same image finds it there).
pub unsafe fn unload(ctx: &Ctx, library: *mut c_void) -> u32 {
    run(ctx, || if library.is_null() { Err(ctx.codes.invalid_value as u32) } else { Ok(0) })
}
