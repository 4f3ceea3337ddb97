//! nvJitLink (specs/nvjitlink.toml): links live on the client, as NVRTC programs do
//! (custom/nvrtc.rs). Options and inputs stay here (a file input is read here: it is on the
//! program's machine), `nvJitLinkComplete` sends the whole link in one `Service::JitLink`
//! request, and its answer (the linked CUBIN or PTX and both logs) answers every later
//! question without a round trip.
//!
//! Every `unsafe fn` here has the safety contract of the nvJitLink function it implements.
#![allow(clippy::missing_safety_doc)]

use std::collections::HashMap;
use std::ffi::{c_char, c_void};
use std::sync::MutexGuard;
use std::time::Instant;

use chidori_cuda::desc::Ctx;
use chidori_protocol::messages::{JitLinkRequest, JitLinkResult, Service, ServiceReply};

use super::nvrtc::{string, strings};

// The statuses are the same since 12.0. NVJITLINK_INPUT_ANY: the type follows from the
// input (for a file, its extension).
use chidori_cuda::consts::nvJitLinkInputType::NVJITLINK_INPUT_ANY as INPUT_ANY;
use chidori_cuda::consts::nvJitLinkResult::{
    NVJITLINK_ERROR_INTERNAL as INTERNAL, NVJITLINK_ERROR_INVALID_INPUT as INVALID_INPUT,
    NVJITLINK_ERROR_MISSING_ARCH as MISSING_ARCH,
};

#[derive(Default)]
pub struct Link {
    request: JitLinkRequest,
    /// The server's answer, once completed.
    done: Option<JitLinkResult>,
}

fn links() -> MutexGuard<'static, Option<HashMap<u64, Link>>> {
    crate::state::CLIENT.jit_links.lock()
}

fn with_link<T>(handle: *mut c_void, f: impl FnOnce(&mut Link) -> T) -> Option<T> {
    links().get_or_insert_with(HashMap::new).get_mut(&(handle as u64)).map(f)
}

fn local(ctx: &Ctx, body: impl FnOnce() -> u32) -> u32 {
    crate::guard::ffi(ctx.name, INTERNAL, || {
        crate::trace::local(ctx.name);
        body()
    })
}

/// nvJitLinkCreate: a link the client names. `-arch=sm_NN` is required, as nvJitLink
/// checks at once; the other options are the server's linker's to judge at completion.
pub unsafe fn create(ctx: &Ctx, handle: *mut c_void, num_options: u32, options: *mut c_void) -> u32 {
    local(ctx, || {
        if handle.is_null() {
            return INVALID_INPUT;
        }
        // SAFETY: `numOptions` option strings per the API.
        let Some(options) = (unsafe { strings(options as *const *const c_char, num_options as usize) }) else {
            return INVALID_INPUT;
        };
        if !options.iter().any(|o| o.starts_with("-arch=")) {
            return MISSING_ARCH;
        }
        let name = crate::state::next_handle_name();
        let link = Link { request: JitLinkRequest { options, inputs: Vec::new() }, done: None };
        links().get_or_insert_with(HashMap::new).insert(name, link);
        // SAFETY: the caller's nvJitLinkHandle*, non-null.
        unsafe { std::ptr::write_unaligned(handle as *mut u64, name) };
        0
    })
}

/// nvJitLinkDestroy: the link and what it produced go; the caller's handle becomes NULL.
pub unsafe fn destroy(ctx: &Ctx, handle: *mut c_void) -> u32 {
    local(ctx, || {
        if handle.is_null() {
            return INVALID_INPUT;
        }
        // SAFETY: the caller's nvJitLinkHandle*, non-null.
        let name = unsafe { std::ptr::read_unaligned(handle as *const u64) };
        if links().get_or_insert_with(HashMap::new).remove(&name).is_none() {
            return INVALID_INPUT;
        }
        // SAFETY: as above.
        unsafe { std::ptr::write_unaligned(handle as *mut u64, 0) };
        0
    })
}

fn add(handle: *mut c_void, kind: u32, name: String, bytes: Vec<u8>) -> u32 {
    with_link(handle, |l| l.request.inputs.push((kind, name, bytes))).map_or(INVALID_INPUT, |()| 0)
}

/// nvJitLinkAddData: the input's bytes, kept until the link completes.
pub unsafe fn add_data(
    ctx: &Ctx,
    handle: *mut c_void,
    kind: u32,
    data: *mut c_void,
    size: usize,
    name: *mut c_void,
) -> u32 {
    local(ctx, || {
        if data.is_null() || size == 0 {
            return INVALID_INPUT;
        }
        // SAFETY: the input's `size` bytes and its optional name, per the API.
        let (bytes, name) =
            unsafe { (std::slice::from_raw_parts(data as *const u8, size).to_vec(), string(name as *const c_char)) };
        add(handle, kind, name.unwrap_or_default(), bytes)
    })
}

/// The input type a file's extension names, for NVJITLINK_INPUT_ANY.
fn type_of_file(path: &str) -> u32 {
    use chidori_cuda::consts::nvJitLinkInputType as t;
    match path.rsplit_once('.').map(|(_, ext)| ext) {
        Some("cubin") => t::NVJITLINK_INPUT_CUBIN,
        Some("ptx") => t::NVJITLINK_INPUT_PTX,
        Some("ltoir") => t::NVJITLINK_INPUT_LTOIR,
        Some("fatbin") => t::NVJITLINK_INPUT_FATBIN,
        Some("o") => t::NVJITLINK_INPUT_OBJECT,
        Some("a") => t::NVJITLINK_INPUT_LIBRARY,
        _ => INPUT_ANY,
    }
}

/// nvJitLinkAddFile: the file is on the client; its bytes are the input.
pub unsafe fn add_file(ctx: &Ctx, handle: *mut c_void, kind: u32, file: *mut c_void) -> u32 {
    local(ctx, || {
        // SAFETY: a NUL-terminated path per the API.
        let Some(path) = (unsafe { string(file as *const c_char) }) else { return INVALID_INPUT };
        let bytes = match std::fs::read(&path) {
            Ok(b) if !b.is_empty() => b,
            Ok(_) => return INVALID_INPUT,
            Err(e) => {
                crate::log::once_owned(&format!("nvJitLinkAddFile {path}"), || {
                    tracing::warn!("nvJitLinkAddFile: cannot read {path}: {e}")
                });
                return INVALID_INPUT;
            }
        };
        let kind = if kind == INPUT_ANY { type_of_file(&path) } else { kind };
        add(handle, kind, path, bytes)
    })
}

/// nvJitLinkComplete: the whole link in one request to the server's nvJitLink.
pub unsafe fn complete(ctx: &Ctx, handle: *mut c_void) -> u32 {
    crate::guard::ffi(ctx.name, INTERNAL, || {
        let Some(request) = with_link(handle, |l| l.request.clone()) else { return INVALID_INPUT };
        let start = Instant::now();
        let sent: usize = request.inputs.iter().map(|(_, _, b)| b.len()).sum();
        let result = link(&request).unwrap_or_else(|message| {
            crate::log::once_owned(&message, || tracing::error!("nvJitLinkComplete: {message}"));
            JitLinkResult {
                status: i64::from(INTERNAL),
                error_log: format!("{message}\0").into_bytes(),
                ..JitLinkResult::default()
            }
        });
        let received = result.cubin.len() + result.ptx.len() + result.info_log.len() + result.error_log.len();
        crate::trace::bytes(ctx.name, 1, sent as u64, received as u64, start.elapsed());
        let status = u32::try_from(result.status).unwrap_or(INTERNAL);
        with_link(handle, |l| l.done = Some(result));
        status
    })
}

fn link(request: &JitLinkRequest) -> Result<JitLinkResult, String> {
    let conn = crate::conn::get()?;
    match conn.service(&Service::JitLink(request.clone()), &[])? {
        ServiceReply::JitLinked(r) => Ok(r),
        ServiceReply::Error { message, .. } => Err(format!("the server cannot link: {message}")),
        other => Err(format!("unexpected answer {other:?}")),
    }
}

/// Which product of a link.
#[derive(Clone, Copy)]
enum Output {
    Cubin,
    Ptx,
    ErrorLog,
    InfoLog,
}

/// Hand `f` a product's bytes, in place: the linked images once completed (an error where
/// the link made none), the logs at any time (an empty log has size 0, as nvJitLink says:
/// programs print a log whose size is not 0).
fn with_output<T>(handle: *mut c_void, which: Output, f: impl FnOnce(&[u8]) -> T) -> Result<T, u32> {
    with_link(handle, |l| {
        let done = l.done.as_ref();
        let bytes: Option<&[u8]> = match which {
            Output::Cubin => done.map(|d| &d.cubin[..]),
            Output::Ptx => done.map(|d| &d.ptx[..]),
            Output::ErrorLog => Some(done.map_or(&[][..], |d| &d.error_log[..])),
            Output::InfoLog => Some(done.map_or(&[][..], |d| &d.info_log[..])),
        };
        match (which, bytes) {
            (Output::ErrorLog | Output::InfoLog, Some(b)) => Ok(f(b)),
            (_, Some(b)) if !b.is_empty() => Ok(f(b)),
            _ => Err(INVALID_INPUT),
        }
    })
    .unwrap_or(Err(INVALID_INPUT))
}

/// A product's size or its bytes into the caller's `out` (a size_t*, or a buffer of that
/// size), by `write`.
unsafe fn answer(
    ctx: &Ctx,
    handle: *mut c_void,
    out: *mut c_void,
    which: Output,
    write: fn(&[u8], *mut c_void),
) -> u32 {
    local(ctx, || {
        if out.is_null() {
            return INVALID_INPUT;
        }
        with_output(handle, which, |bytes| write(bytes, out)).map_or_else(|status| status, |()| 0)
    })
}

/// The products and logs of a link (nvJitLinkGetLinkedCubin, …Ptx, nvJitLinkGetErrorLog,
/// …InfoLog, and their `…Size` queries), answered from the link on the client: `args` are the
/// handle and the caller's size_t* (a size query) or its buffer of that size.
pub unsafe fn output(ctx: &Ctx, args: &[u64]) -> u64 {
    let name = ctx.name;
    let which = if name.contains("Cubin") {
        Output::Cubin
    } else if name.contains("Ptx") {
        Output::Ptx
    } else if name.contains("ErrorLog") {
        Output::ErrorLog
    } else {
        Output::InfoLog
    };
    let (handle, out) = (args[0] as *mut c_void, args[1] as *mut c_void);
    let write: fn(&[u8], *mut c_void) = if name.contains("Size") {
        // SAFETY: the caller's size_t*, non-null (checked by `answer`).
        |b, out| unsafe { std::ptr::write_unaligned(out as *mut usize, b.len()) }
    } else {
        // SAFETY: the caller's buffer holds the size the matching size query gave.
        |b, out| unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), out as *mut u8, b.len()) }
    };
    // SAFETY: the caller's arguments.
    u64::from(unsafe { answer(ctx, handle, out, which, write) })
}

/// nvJitLinkVersion: the version of the headers the program's library came with (the
/// linker that runs is the server's).
pub unsafe fn version(ctx: &Ctx, major: *mut c_void, minor: *mut c_void) -> u32 {
    local(ctx, || {
        if major.is_null() || minor.is_null() {
            return INVALID_INPUT;
        }
        let mut parts = ctx.version.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
        // SAFETY: the caller's unsigned int*, non-null.
        unsafe {
            std::ptr::write_unaligned(major as *mut u32, parts.next().unwrap_or(0));
            std::ptr::write_unaligned(minor as *mut u32, parts.next().unwrap_or(0));
        }
        0
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_of_any_type_is_typed_by_its_extension() {
        assert_eq!(type_of_file("/tmp/k.ptx"), 2);
        assert_eq!(type_of_file("lib.a"), 6);
        assert_eq!(type_of_file("x.ltoir"), 3);
        assert_eq!(type_of_file("noext"), INPUT_ANY);
    }
}
