//! nvJitLink links for clients. A client keeps its nvJitLink handles itself and sends one
//! request per link (options and inputs); this runs the server's nvJitLink on it and returns
//! everything the client may ask afterwards (CUBIN, PTX, both logs), so only the link costs
//! a round trip.

use std::ffi::{CString, c_char, c_int, c_void};

use chidori_protocol::messages::{JitLinkRequest, JitLinkResult};

use crate::loader::Library;

/// NVJITLINK_SUCCESS, NVJITLINK_ERROR_INVALID_INPUT and NVJITLINK_ERROR_INTERNAL.
const SUCCESS: c_int = chidori_cuda::consts::nvJitLinkResult::NVJITLINK_SUCCESS as c_int;
pub const INVALID_INPUT: i64 = chidori_cuda::consts::nvJitLinkResult::NVJITLINK_ERROR_INVALID_INPUT as i64;
pub const INTERNAL: i64 = chidori_cuda::consts::nvJitLinkResult::NVJITLINK_ERROR_INTERNAL as i64;

type Handle = *mut c_void;
type Size = unsafe extern "C" fn(Handle, *mut usize) -> c_int;
type Get = unsafe extern "C" fn(Handle, *mut c_char) -> c_int;

/// The nvJitLink functions a link uses, by their unversioned exports.
struct Api {
    create: unsafe extern "C" fn(*mut Handle, u32, *const *const c_char) -> c_int,
    add_data: unsafe extern "C" fn(Handle, c_int, *const c_void, usize, *const c_char) -> c_int,
    complete: unsafe extern "C" fn(Handle) -> c_int,
    cubin_size: Size,
    cubin: Get,
    ptx_size: Size,
    ptx: Get,
    error_log_size: Size,
    error_log: Get,
    info_log_size: Size,
    info_log: Get,
    destroy: unsafe extern "C" fn(*mut Handle) -> c_int,
}

impl Api {
    fn load(lib: &Library) -> Result<Api, String> {
        fn get<F: Copy>(lib: &Library, name: &str) -> Result<F, String> {
            // SAFETY: `F` is the C signature of `name` (the nvJitLink API, unchanged since 12.0).
            unsafe { lib.function(name) }
        }
        Ok(Api {
            create: get(lib, "nvJitLinkCreate")?,
            add_data: get(lib, "nvJitLinkAddData")?,
            complete: get(lib, "nvJitLinkComplete")?,
            cubin_size: get(lib, "nvJitLinkGetLinkedCubinSize")?,
            cubin: get(lib, "nvJitLinkGetLinkedCubin")?,
            ptx_size: get(lib, "nvJitLinkGetLinkedPtxSize")?,
            ptx: get(lib, "nvJitLinkGetLinkedPtx")?,
            error_log_size: get(lib, "nvJitLinkGetErrorLogSize")?,
            error_log: get(lib, "nvJitLinkGetErrorLog")?,
            info_log_size: get(lib, "nvJitLinkGetInfoLogSize")?,
            info_log: get(lib, "nvJitLinkGetInfoLog")?,
            destroy: get(lib, "nvJitLinkDestroy")?,
        })
    }
}

/// Link `req` with the nvJitLink in `lib`. Err: nvJitLink lacks a function (a message).
pub fn link(lib: &Library, req: &JitLinkRequest) -> Result<JitLinkResult, String> {
    let api = Api::load(lib)?;
    Ok(run(&api, req))
}

fn run(api: &Api, req: &JitLinkRequest) -> JitLinkResult {
    let invalid = |what: &str| JitLinkResult {
        status: INVALID_INPUT,
        error_log: format!("{what} holds a NUL byte\0").into_bytes(),
        ..JitLinkResult::default()
    };
    let Ok(options) = req.options.iter().map(|o| CString::new(o.as_str())).collect::<Result<Vec<_>, _>>() else {
        return invalid("an option");
    };
    let Ok(names) = req.inputs.iter().map(|(_, n, _)| CString::new(n.as_str())).collect::<Result<Vec<_>, _>>() else {
        return invalid("an input's name");
    };
    let option_ptrs: Vec<*const c_char> = options.iter().map(|o| o.as_ptr()).collect();
    let mut handle: Handle = std::ptr::null_mut();
    let mut result = JitLinkResult::default();
    // SAFETY (block): every pointer is a live CString, an array of them with its count, or
    // an input's bytes with their length; `handle` is created here and destroyed at the end.
    unsafe {
        let s = (api.create)(&mut handle, option_ptrs.len() as u32, option_ptrs.as_ptr());
        if s != SUCCESS {
            // A failed create (an unknown option) may still leave a handle with its log.
            result.status = i64::from(s);
            if !handle.is_null() {
                result.error_log = read(handle, api.error_log_size, api.error_log);
                (api.destroy)(&mut handle);
            }
            return result;
        }
        for ((kind, _, bytes), name) in req.inputs.iter().zip(&names) {
            let s = (api.add_data)(handle, *kind as c_int, bytes.as_ptr().cast(), bytes.len(), name.as_ptr());
            if s != SUCCESS {
                result.status = i64::from(s);
                break;
            }
        }
        if result.status == i64::from(SUCCESS) {
            result.status = i64::from((api.complete)(handle));
        }
        if result.status == i64::from(SUCCESS) {
            result.cubin = read(handle, api.cubin_size, api.cubin);
            result.ptx = read(handle, api.ptx_size, api.ptx);
        }
        result.error_log = read(handle, api.error_log_size, api.error_log);
        result.info_log = read(handle, api.info_log_size, api.info_log);
        (api.destroy)(&mut handle);
    }
    result
}

/// One of a link's outputs (empty where it has none: no PTX without `-ptx`).
///
/// # Safety
/// `handle` is a live nvJitLink handle; `size` and `get` its size and copy functions.
unsafe fn read(handle: Handle, size: Size, get: Get) -> Vec<u8> {
    let mut n = 0usize;
    // SAFETY: per the contract; `buf` has the size nvJitLink reported.
    unsafe {
        if size(handle, &mut n) != SUCCESS || n == 0 {
            return Vec::new();
        }
        let mut buf = vec![0u8; n];
        if get(handle, buf.as_mut_ptr().cast()) != SUCCESS {
            return Vec::new();
        }
        buf
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A PTX kernel for sm_90, as a compiler writes one.
    const PTX: &str = ".version 8.0\n.target sm_90\n.address_size 64\n\
        .visible .entry k(.param .u64 p)\n{\n.reg .b64 %rd<2>;\n.reg .b32 %r<2>;\n\
        ld.param.u64 %rd1, [p];\ncvta.to.global.u64 %rd1, %rd1;\nmov.u32 %r1, 7;\n\
        st.global.u32 [%rd1], %r1;\nret;\n}\n";

    /// Needs a libnvJitLink (no GPU): `CHIDORI_TEST_NVJITLINK_DIR=<dir with
    /// libnvJitLink.so.13>`, e.g. extracted from the `nvidia-nvjitlink` wheel.
    #[test]
    #[ignore = "needs libnvJitLink: set CHIDORI_TEST_NVJITLINK_DIR"]
    fn a_ptx_input_links_to_a_cubin_and_failures_come_back_with_their_logs() {
        let dir = std::path::PathBuf::from(std::env::var("CHIDORI_TEST_NVJITLINK_DIR").expect("the directory"));
        let lib = crate::loader::load(&["libnvJitLink.so.13", "libnvJitLink.so.12"], &[dir]).expect("libnvJitLink");
        let input = |ptx: &str| vec![(2u32, "k.ptx".to_owned(), ptx.as_bytes().to_vec())];
        let req = JitLinkRequest { options: vec!["-arch=sm_90".into()], inputs: input(PTX) };
        let r = link(&lib, &req).expect("nvJitLink has every function");
        assert_eq!(r.status, 0, "error log: {}", String::from_utf8_lossy(&r.error_log));
        assert!(r.cubin.starts_with(b"\x7fELF"), "a CUBIN");
        assert!(r.ptx.is_empty(), "no PTX without -lto -ptx");
        let no_arch = link(&lib, &JitLinkRequest { options: vec![], inputs: input(PTX) }).unwrap();
        assert_eq!(no_arch.status, 2, "NVJITLINK_ERROR_MISSING_ARCH");
        let bad = link(&lib, &JitLinkRequest { options: req.options.clone(), inputs: input("not PTX") }).unwrap();
        assert_ne!(bad.status, 0);
        assert!(bad.cubin.is_empty());
        let nul = link(&lib, &JitLinkRequest { options: vec!["-arch\0".into()], inputs: input(PTX) }).unwrap();
        assert_eq!(nul.status, INVALID_INPUT, "a NUL inside an option is refused before the library");
    }
}
