//! NVRTC compiles for clients. A client keeps its NVRTC programs itself and sends one
//! request per compile (source, headers, options, name expressions); this runs the server's
//! NVRTC on it and returns everything the client may ask afterwards (log, PTX, CUBIN, LTO,
//! OptiX and NVVM IR, lowered names, the precompiled header's status), so only the compile
//! costs a round trip.

use std::ffi::{CStr, CString, c_char, c_int, c_void};

use chidori_protocol::messages::{CompileRequest, CompileResult};

use crate::loader::Library;

/// NVRTC_SUCCESS and NVRTC_ERROR_INVALID_INPUT (the same in every version).
const SUCCESS: c_int = chidori_cuda::consts::nvrtcResult::NVRTC_SUCCESS as c_int;
pub const INVALID_INPUT: i64 = chidori_cuda::consts::nvrtcResult::NVRTC_ERROR_INVALID_INPUT as i64;

type Program = *mut c_void;

/// The NVRTC functions a compile uses.
struct Api {
    create: unsafe extern "C" fn(
        *mut Program,
        *const c_char,
        *const c_char,
        c_int,
        *const *const c_char,
        *const *const c_char,
    ) -> c_int,
    add_name: unsafe extern "C" fn(Program, *const c_char) -> c_int,
    compile: unsafe extern "C" fn(Program, c_int, *const *const c_char) -> c_int,
    log_size: unsafe extern "C" fn(Program, *mut usize) -> c_int,
    log: unsafe extern "C" fn(Program, *mut c_char) -> c_int,
    ptx_size: unsafe extern "C" fn(Program, *mut usize) -> c_int,
    ptx: unsafe extern "C" fn(Program, *mut c_char) -> c_int,
    cubin_size: unsafe extern "C" fn(Program, *mut usize) -> c_int,
    cubin: unsafe extern "C" fn(Program, *mut c_char) -> c_int,
    lowered: unsafe extern "C" fn(Program, *const c_char, *mut *const c_char) -> c_int,
    destroy: unsafe extern "C" fn(*mut Program) -> c_int,
    /// Outputs only some NVRTC releases have: LTO IR (12.0+), OptiX IR (12.0+), NVVM IR
    /// (12.x, gone in 13), each as (size, copy).
    ltoir: Option<(SizeFn, CopyFn)>,
    optixir: Option<(SizeFn, CopyFn)>,
    nvvm: Option<(SizeFn, CopyFn)>,
    pch_status: Option<unsafe extern "C" fn(Program) -> c_int>,
    pch_heap: Option<unsafe extern "C" fn(Program, *mut usize) -> c_int>,
}

type SizeFn = unsafe extern "C" fn(Program, *mut usize) -> c_int;
type CopyFn = unsafe extern "C" fn(Program, *mut c_char) -> c_int;

impl Api {
    fn load(lib: &Library) -> Result<Api, String> {
        fn get<F: Copy>(lib: &Library, name: &str) -> Result<F, String> {
            // SAFETY: `F` is the C signature of `name` (the NVRTC API, unchanged since 11.2).
            unsafe { lib.function(name) }
        }
        Ok(Api {
            create: get(lib, "nvrtcCreateProgram")?,
            add_name: get(lib, "nvrtcAddNameExpression")?,
            compile: get(lib, "nvrtcCompileProgram")?,
            log_size: get(lib, "nvrtcGetProgramLogSize")?,
            log: get(lib, "nvrtcGetProgramLog")?,
            ptx_size: get(lib, "nvrtcGetPTXSize")?,
            ptx: get(lib, "nvrtcGetPTX")?,
            cubin_size: get(lib, "nvrtcGetCUBINSize")?,
            cubin: get(lib, "nvrtcGetCUBIN")?,
            lowered: get(lib, "nvrtcGetLoweredName")?,
            destroy: get(lib, "nvrtcDestroyProgram")?,
            ltoir: get(lib, "nvrtcGetLTOIRSize").and_then(|s| Ok((s, get(lib, "nvrtcGetLTOIR")?))).ok(),
            optixir: get(lib, "nvrtcGetOptiXIRSize").and_then(|s| Ok((s, get(lib, "nvrtcGetOptiXIR")?))).ok(),
            nvvm: get(lib, "nvrtcGetNVVMSize").and_then(|s| Ok((s, get(lib, "nvrtcGetNVVM")?))).ok(),
            pch_status: get(lib, "nvrtcGetPCHCreateStatus").ok(),
            pch_heap: get(lib, "nvrtcGetPCHHeapSizeRequired").ok(),
        })
    }
}

/// A compile that ended early: its result (boxed: an error path, and a large value).
type Early = Box<CompileResult>;

fn c_string(s: &str) -> Result<CString, Early> {
    CString::new(s).map_err(|_| {
        Box::new(CompileResult {
            status: INVALID_INPUT,
            log: b"a string of the program holds a NUL byte\0".to_vec(),
            ..CompileResult::default()
        })
    })
}

/// Compile `req` with the NVRTC in `lib`. Err: NVRTC lacks a function (a message).
pub fn compile(lib: &Library, req: &CompileRequest) -> Result<CompileResult, String> {
    // NVRTC opens its builtins library by bare name: load the one beside it first.
    static BUILTINS: std::sync::OnceLock<Vec<Library>> = std::sync::OnceLock::new();
    BUILTINS.get_or_init(|| crate::loader::load_beside(lib, "libnvrtc-builtins.so"));
    let api = Api::load(lib)?;
    Ok(run(&api, req).unwrap_or_else(|r| *r))
}

fn run(api: &Api, req: &CompileRequest) -> Result<CompileResult, Early> {
    let source = c_string(&req.source)?;
    let name = req.name.as_deref().map(c_string).transpose()?;
    let contents = req.headers.iter().map(|(_, c)| c_string(c)).collect::<Result<Vec<_>, _>>()?;
    let includes = req.headers.iter().map(|(n, _)| c_string(n)).collect::<Result<Vec<_>, _>>()?;
    let options = req.options.iter().map(|o| c_string(o)).collect::<Result<Vec<_>, _>>()?;
    let names = req.name_expressions.iter().map(|e| c_string(e)).collect::<Result<Vec<_>, _>>()?;
    let ptrs = |v: &[CString]| v.iter().map(|s| s.as_ptr()).collect::<Vec<_>>();
    let (contents_p, includes_p, options_p) = (ptrs(&contents), ptrs(&includes), ptrs(&options));
    let failed = |status: c_int| Box::new(CompileResult { status: i64::from(status), ..CompileResult::default() });
    let mut prog: Program = std::ptr::null_mut();
    // SAFETY (block): every pointer is a live CString or an array of them, with the counts
    // NVRTC's API takes; `prog` is the program created here and destroyed at the end.
    unsafe {
        let s = (api.create)(
            &mut prog,
            source.as_ptr(),
            name.as_ref().map_or(std::ptr::null(), |n| n.as_ptr()),
            contents_p.len() as c_int,
            if contents_p.is_empty() { std::ptr::null() } else { contents_p.as_ptr() },
            if includes_p.is_empty() { std::ptr::null() } else { includes_p.as_ptr() },
        );
        if s != SUCCESS {
            return Err(failed(s));
        }
        let mut result = CompileResult::default();
        for n in &names {
            let s = (api.add_name)(prog, n.as_ptr());
            if s != SUCCESS {
                (api.destroy)(&mut prog);
                return Err(failed(s));
            }
        }
        result.status = i64::from((api.compile)(prog, options_p.len() as c_int, options_p.as_ptr()));
        result.log = read(prog, api.log_size, api.log);
        // Whether a precompiled header was made is asked after any compile (a failed one
        // included: its status says why none was).
        result.pch_status = api.pch_status.map(|f| i64::from(f(prog)));
        result.pch_heap = api.pch_heap.map(|f| {
            let mut n = 0usize;
            let s = f(prog, &mut n);
            (i64::from(s), n as u64)
        });
        if result.status == i64::from(SUCCESS) {
            result.ptx = read(prog, api.ptx_size, api.ptx);
            result.cubin = read(prog, api.cubin_size, api.cubin);
            let optional =
                |pair: Option<(SizeFn, CopyFn)>| pair.map(|(size, get)| read(prog, size, get)).unwrap_or_default();
            result.ltoir = optional(api.ltoir);
            result.optixir = optional(api.optixir);
            result.nvvm = optional(api.nvvm);
            for (expr, n) in req.name_expressions.iter().zip(&names) {
                let mut lowered: *const c_char = std::ptr::null();
                if (api.lowered)(prog, n.as_ptr(), &mut lowered) == SUCCESS && !lowered.is_null() {
                    result.lowered.push((expr.clone(), CStr::from_ptr(lowered).to_string_lossy().into_owned()));
                }
            }
        }
        (api.destroy)(&mut prog);
        Ok(result)
    }
}

/// One of a program's outputs (empty where the compile made none, such as a CUBIN for a
/// virtual architecture).
///
/// # Safety
/// `prog` is a live NVRTC program; `size` and `get` are its size and copy functions.
unsafe fn read(
    prog: Program,
    size: unsafe extern "C" fn(Program, *mut usize) -> c_int,
    get: unsafe extern "C" fn(Program, *mut c_char) -> c_int,
) -> Vec<u8> {
    let mut n = 0usize;
    // SAFETY: per the contract; `buf` has the size NVRTC reported.
    unsafe {
        if size(prog, &mut n) != SUCCESS || n == 0 {
            return Vec::new();
        }
        let mut buf = vec![0u8; n];
        if get(prog, buf.as_mut_ptr().cast()) != SUCCESS {
            return Vec::new();
        }
        buf
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Needs a libnvrtc (no GPU): `CHIDORI_TEST_NVRTC_DIR=<dir with libnvrtc.so.13>`, e.g.
    /// extracted from the `nvidia-cuda-nvrtc` wheel that `cargo xtask headers` fetches.
    #[test]
    #[ignore = "needs libnvrtc: set CHIDORI_TEST_NVRTC_DIR"]
    fn a_program_compiles_with_headers_options_and_name_expressions() {
        let dir = std::path::PathBuf::from(std::env::var("CHIDORI_TEST_NVRTC_DIR").expect("CHIDORI_TEST_NVRTC_DIR"));
        let lib = crate::loader::load(&["libnvrtc.so.13", "libnvrtc.so.12"], &[dir]).expect("libnvrtc");
        let req = CompileRequest {
            source: "#include \"scale.h\"\ntemplate <typename T> __global__ void k(T *x) { x[threadIdx.x] *= SCALE; }\ntemplate __global__ void k<float>(float *);\n".into(),
            name: Some("k.cu".into()),
            headers: vec![("scale.h".into(), "#define SCALE 2\n".into())],
            options: vec!["--gpu-architecture=sm_90".into()],
            name_expressions: vec!["k<float>".into()],
        };
        let r = compile(&lib, &req).expect("NVRTC has every function");
        assert_eq!(r.status, 0, "log: {}", String::from_utf8_lossy(&r.log));
        assert!(r.ptx.starts_with(b"//") && r.ptx.ends_with(b"\0"), "PTX text, NUL-terminated");
        assert!(r.cubin.starts_with(b"\x7fELF"), "a CUBIN for a real architecture");
        assert_eq!(r.lowered, vec![("k<float>".to_owned(), "_Z1kIfEvPT_".to_owned())]);
        assert!(r.ltoir.is_empty() && r.optixir.is_empty(), "no IR the options did not ask for");
        assert!(r.pch_status.is_some(), "NVRTC 13 says whether a precompiled header was made");
        // LTO IR for nvJitLink (NVIDIA's jitLto sample compiles with -dlto).
        let mut lto = req.clone();
        lto.options.push("-dlto".into());
        let r = compile(&lib, &lto).expect("NVRTC has every function");
        assert_eq!(r.status, 0, "log: {}", String::from_utf8_lossy(&r.log));
        assert!(!r.ltoir.is_empty(), "LTO IR with -dlto");
        let bad = compile(&lib, &CompileRequest { source: "this is not C++".into(), ..req }).unwrap();
        assert_eq!(bad.status, 6, "NVRTC_ERROR_COMPILATION");
        assert!(String::from_utf8_lossy(&bad.log).contains("error"), "the log says why");
    }
}
