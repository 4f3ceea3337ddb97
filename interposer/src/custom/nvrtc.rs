//! NVRTC with programs kept on the client. Creating a program, adding name expressions and
//! reading the log, PTX, CUBIN or lowered names need no server; `nvrtcCompileProgram`
//! sends the whole program in one request and keeps what the server's NVRTC produced.
//! NVRTC needs no GPU, but the client loads no NVIDIA library: the server compiles, and
//! the result is loaded there like any module (`cuModuleLoadData`).
#![allow(non_snake_case, clippy::missing_safety_doc)]

use std::collections::HashMap;
use std::ffi::{CStr, CString, c_char, c_void};
use std::sync::{MutexGuard, OnceLock};
use std::time::Instant;

use chidori_cuda::calls::nvrtc as calls;
use chidori_cuda::desc::Ctx;
use chidori_protocol::messages::{CompileRequest, CompileResult, Service, ServiceReply};

const SUCCESS: u32 = chidori_cuda::consts::nvrtcResult::NVRTC_SUCCESS;
const INVALID_INPUT: u32 = chidori_cuda::consts::nvrtcResult::NVRTC_ERROR_INVALID_INPUT;
const INVALID_PROGRAM: u32 = chidori_cuda::consts::nvrtcResult::NVRTC_ERROR_INVALID_PROGRAM;
const NO_NAME_EXPRESSIONS_AFTER_COMPILATION: u32 =
    chidori_cuda::consts::nvrtcResult::NVRTC_ERROR_NO_NAME_EXPRESSIONS_AFTER_COMPILATION;
const NO_LOWERED_NAMES_BEFORE_COMPILATION: u32 =
    chidori_cuda::consts::nvrtcResult::NVRTC_ERROR_NO_LOWERED_NAMES_BEFORE_COMPILATION;
const NAME_EXPRESSION_NOT_VALID: u32 = chidori_cuda::consts::nvrtcResult::NVRTC_ERROR_NAME_EXPRESSION_NOT_VALID;
const INTERNAL_ERROR: u32 = chidori_cuda::consts::nvrtcResult::NVRTC_ERROR_INTERNAL_ERROR;
const NO_PCH_CREATE_ATTEMPTED: u32 = chidori_cuda::consts::nvrtcResult::NVRTC_ERROR_NO_PCH_CREATE_ATTEMPTED;

pub struct Program {
    request: CompileRequest,
    /// The last compile's result, with the lowered names as C strings the caller may hold
    /// until the program is destroyed.
    compiled: Option<(CompileResult, Vec<(String, CString)>)>,
}

/// Programs by handle (a client handle name: a value the application hands back is looked
/// up, never dereferenced).
fn programs() -> MutexGuard<'static, Option<HashMap<u64, Program>>> {
    crate::state::CLIENT.nvrtc_programs.lock()
}

fn local(name: &'static str, body: impl FnOnce() -> u32) -> u32 {
    crate::guard::ffi(name, INTERNAL_ERROR, || {
        crate::trace::local(name);
        body()
    })
}

/// A C string argument. None for NULL.
///
/// # Safety
/// `p` is NULL or a NUL-terminated string.
pub(crate) unsafe fn string(p: *const c_char) -> Option<String> {
    // SAFETY: per the contract.
    (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

/// `n` C strings from an array. None if the array or one of its strings is NULL.
///
/// # Safety
/// `array` is NULL or holds `n` pointers, each NULL or a NUL-terminated string.
pub(crate) unsafe fn strings(array: *const *const c_char, n: usize) -> Option<Vec<String>> {
    if n == 0 {
        return Some(Vec::new());
    }
    if array.is_null() {
        return None;
    }
    // SAFETY: per the contract.
    (0..n).map(|i| unsafe { string(*array.add(i)) }).collect()
}

pub unsafe fn nvrtcCreateProgram(
    prog: *mut c_void,
    src: *mut c_void,
    name: *mut c_void,
    numHeaders: i32,
    headers: *mut c_void,
    includeNames: *mut c_void,
) -> u32 {
    local("nvrtcCreateProgram", || {
        let Ok(n) = usize::try_from(numHeaders) else { return INVALID_INPUT };
        if prog.is_null() {
            return INVALID_INPUT;
        }
        // SAFETY: NVRTC's contract: a source string, an optional name, and `numHeaders`
        // header contents and include names.
        let (source, name, contents, includes) = unsafe {
            (
                string(src as *const c_char),
                string(name as *const c_char),
                strings(headers as *const *const c_char, n),
                strings(includeNames as *const *const c_char, n),
            )
        };
        let (Some(source), Some(contents), Some(includes)) = (source, contents, includes) else {
            return INVALID_INPUT;
        };
        let request = CompileRequest {
            source,
            name,
            headers: includes.into_iter().zip(contents).collect(),
            ..CompileRequest::default()
        };
        let handle = crate::state::next_handle_name();
        programs().get_or_insert_with(HashMap::new).insert(handle, Program { request, compiled: None });
        // SAFETY: the caller's nvrtcProgram*, checked non-null.
        unsafe { std::ptr::write_unaligned(prog as *mut u64, handle) };
        SUCCESS
    })
}

pub unsafe fn nvrtcDestroyProgram(prog: *mut c_void) -> u32 {
    local("nvrtcDestroyProgram", || {
        if prog.is_null() {
            return INVALID_PROGRAM;
        }
        // SAFETY: the caller's nvrtcProgram*, checked non-null.
        let handle = unsafe { std::ptr::read_unaligned(prog as *const u64) };
        if programs().as_mut().and_then(|m| m.remove(&handle)).is_none() {
            return INVALID_PROGRAM;
        }
        // SAFETY: as above.
        unsafe { std::ptr::write_unaligned(prog as *mut u64, 0) };
        SUCCESS
    })
}

pub unsafe fn nvrtcAddNameExpression(prog: *mut c_void, name_expression: *mut c_void) -> u32 {
    local("nvrtcAddNameExpression", || {
        // SAFETY: a C string or NULL.
        let Some(expr) = (unsafe { string(name_expression as *const c_char) }) else { return INVALID_INPUT };
        let mut all = programs();
        let Some(p) = all.as_mut().and_then(|m| m.get_mut(&(prog as u64))) else { return INVALID_PROGRAM };
        if p.compiled.is_some() {
            return NO_NAME_EXPRESSIONS_AFTER_COMPILATION;
        }
        p.request.name_expressions.push(expr);
        SUCCESS
    })
}

pub unsafe fn nvrtcCompileProgram(prog: *mut c_void, numOptions: i32, options: *mut c_void) -> u32 {
    crate::guard::ffi("nvrtcCompileProgram", INTERNAL_ERROR, || {
        let Ok(n) = usize::try_from(numOptions) else { return INVALID_INPUT };
        // SAFETY: `numOptions` option strings.
        let Some(options) = (unsafe { strings(options as *const *const c_char, n) }) else { return INVALID_INPUT };
        let request = {
            let mut all = programs();
            let Some(p) = all.as_mut().and_then(|m| m.get_mut(&(prog as u64))) else { return INVALID_PROGRAM };
            p.request.options = options;
            p.request.clone()
        };
        let start = Instant::now();
        let result = match compile(&request) {
            Ok(r) => r,
            Err(message) => {
                crate::log::once_owned(&message, || tracing::error!("nvrtcCompileProgram: {message}"));
                let mut log = message.into_bytes();
                log.push(0);
                CompileResult { status: i64::from(INTERNAL_ERROR), log, ..CompileResult::default() }
            }
        };
        let received = [&result.log, &result.ptx, &result.cubin, &result.ltoir, &result.optixir, &result.nvvm]
            .iter()
            .map(|b| b.len() as u64)
            .sum();
        crate::trace::bytes("nvrtcCompileProgram", 1, request.source.len() as u64, received, start.elapsed());
        let status = u32::try_from(result.status).unwrap_or(INTERNAL_ERROR);
        let lowered = result
            .lowered
            .iter()
            .filter_map(|(expr, name)| Some((expr.clone(), CString::new(name.as_str()).ok()?)))
            .collect();
        if let Some(p) = programs().as_mut().and_then(|m| m.get_mut(&(prog as u64))) {
            p.compiled = Some((result, lowered));
        }
        status
    })
}

fn compile(request: &CompileRequest) -> Result<CompileResult, String> {
    let conn = crate::conn::get()?;
    let mut request = request.clone();
    let found = local_headers(&request, std::path::Path::new("."));
    request.headers.extend(found);
    match conn.service(&Service::Compile(request), &[])? {
        ServiceReply::Compiled(r) => Ok(r),
        ServiceReply::Error { message, .. } => Err(format!("the server cannot compile: {message}")),
        other => Err(format!("unexpected answer {other:?}")),
    }
}

/// Most bytes of the program's own header files sent with one compile.
const LOCAL_HEADER_BYTES: usize = 32 << 20;

/// The header files the program's source includes from the client's file system, which the
/// server's NVRTC cannot see: `#include "…"` found beside the including file, beside the
/// program's name (NVRTC's current directory, relative to `cwd`) or in an `-I` /
/// `--include-path` directory of the options, and `#include <…>` found in those
/// directories, followed into what they include. Each goes as a header of the program
/// under the name the source wrote, as NVRTC matches them; headers the program supplied
/// itself come first and are not read. NVRTC's own and the server's CUDA headers are the
/// server's, as ever.
fn local_headers(request: &CompileRequest, cwd: &std::path::Path) -> Vec<(String, String)> {
    use std::path::{Path, PathBuf};
    let mut dirs: Vec<PathBuf> = Vec::new();
    let mut options = request.options.iter();
    while let Some(option) = options.next() {
        let dir = match option.as_str() {
            "-I" | "--include-path" => options.next().cloned(),
            o => o.strip_prefix("--include-path=").or_else(|| o.strip_prefix("-I")).map(str::to_owned),
        };
        if let Some(dir) = dir.filter(|d| !d.is_empty()) {
            dirs.push(cwd.join(dir));
        }
    }
    // A CUDA toolkit's include directory (`-I/usr/local/cuda/include`) holds the CUDA headers,
    // which are the server's: the client's, of another version maybe, are not sent.
    dirs.retain(|d| !d.join("cuda.h").is_file() && !d.join("cuda_runtime.h").is_file());
    let base = request.name.as_deref().and_then(|n| Path::new(n).parent()).map_or(cwd.to_path_buf(), |d| cwd.join(d));
    let mut found: Vec<(String, String)> = Vec::new();
    let mut bytes = 0usize;
    // (text, the directory it is in) still to look through.
    let mut pending = vec![(request.source.clone(), base.clone())];
    while let Some((text, here)) = pending.pop() {
        for line in text.lines() {
            let Some(rest) = line.trim_start().strip_prefix('#') else { continue };
            let Some(rest) = rest.trim_start().strip_prefix("include") else { continue };
            let rest = rest.trim_start();
            let (quoted, close) = match rest.chars().next() {
                Some('"') => (true, '"'),
                Some('<') => (false, '>'),
                _ => continue,
            };
            let Some(name) = rest[1..].split(close).next().filter(|n| !n.is_empty()) else { continue };
            let known = |n: &str| request.headers.iter().chain(found.iter()).any(|(h, _)| h == n);
            if known(name) {
                continue;
            }
            let candidates =
                quoted.then(|| [here.clone(), base.clone()]).into_iter().flatten().chain(dirs.iter().cloned());
            let Some(path) = candidates.map(|d| d.join(name)).find(|p| p.is_file()) else { continue };
            let Ok(contents) = std::fs::read_to_string(&path) else { continue };
            if bytes + contents.len() > LOCAL_HEADER_BYTES {
                continue;
            }
            bytes += contents.len();
            let dir = path.parent().map_or(here.clone(), Path::to_path_buf);
            pending.push((contents.clone(), dir));
            found.push((name.to_owned(), contents));
        }
    }
    found
}

/// Which output of a compiled program.
#[derive(Clone, Copy)]
enum Output {
    Log,
    Ptx,
    Cubin,
    LtoIr,
    OptixIr,
    Nvvm,
}

impl Output {
    /// The output an NVRTC getter (or its `…Size` query) of this name reads.
    fn of(name: &str) -> Output {
        let base = name.trim_start_matches("nvrtcGet").trim_end_matches("Size");
        match base {
            "PTX" => Output::Ptx,
            "CUBIN" => Output::Cubin,
            "LTOIR" => Output::LtoIr,
            "OptiXIR" => Output::OptixIr,
            "NVVM" => Output::Nvvm,
            _ => Output::Log,
        }
    }
}

/// The bytes of `what`, or the status for a program that has none.
fn with_output<T>(prog: *mut c_void, what: Output, f: impl FnOnce(&[u8]) -> T) -> Result<T, u32> {
    let all = programs();
    let p = all.as_ref().and_then(|m| m.get(&(prog as u64))).ok_or(INVALID_PROGRAM)?;
    match (&p.compiled, what) {
        // Before a compile the log is the empty string.
        (None, Output::Log) => Ok(f(b"\0")),
        (None, _) => Err(INVALID_PROGRAM),
        (Some((r, _)), Output::Log) if r.log.is_empty() => Ok(f(b"\0")),
        (Some((r, _)), Output::Log) => Ok(f(&r.log)),
        (Some((r, _)), _) if r.status != 0 => Err(INVALID_PROGRAM),
        (Some((r, _)), Output::Ptx) => Ok(f(&r.ptx)),
        (Some((r, _)), Output::Cubin) => Ok(f(&r.cubin)),
        (Some((r, _)), Output::LtoIr) => Ok(f(&r.ltoir)),
        (Some((r, _)), Output::OptixIr) => Ok(f(&r.optixir)),
        (Some((r, _)), Output::Nvvm) => Ok(f(&r.nvvm)),
    }
}

/// A compile's log, PTX, CUBIN, LTO, OptiX or NVVM IR (nvrtcGetProgramLog, nvrtcGetPTX,
/// nvrtcGetCUBIN, nvrtcGetLTOIR, …) and their `…Size` queries, answered from the program on
/// the client: `args` are the program and the caller's size_t* (a size query) or its buffer
/// of that size. An output the options did not ask for has size 0, as NVRTC answers.
pub unsafe fn output(ctx: &Ctx, args: &[u64]) -> u64 {
    let name = ctx.name;
    let what = Output::of(name);
    let (prog, out) = (args[0] as *mut c_void, args[1] as *mut c_void);
    let status = local(name, || {
        if out.is_null() {
            return INVALID_INPUT;
        }
        let written = if name.ends_with("Size") {
            // SAFETY: the caller's size_t*, checked non-null.
            with_output(prog, what, |b| unsafe { std::ptr::write_unaligned(out as *mut usize, b.len()) })
        } else {
            // SAFETY: the caller's buffer of the size the matching *Size call reported.
            with_output(prog, what, |b| unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), out as *mut u8, b.len()) })
        };
        written.map_or_else(|s| s, |()| SUCCESS)
    });
    u64::from(status)
}

/// nvrtcGetPCHCreateStatus: the compile's answer, kept on the client (before a compile, or
/// from an NVRTC without precompiled headers: none was attempted).
pub unsafe fn pch_create_status(ctx: &Ctx, prog: *mut c_void) -> u32 {
    local(ctx.name, || {
        let all = programs();
        let Some(p) = all.as_ref().and_then(|m| m.get(&(prog as u64))) else { return INVALID_PROGRAM };
        match &p.compiled {
            Some((r, _)) => r.pch_status.and_then(|s| u32::try_from(s).ok()).unwrap_or(NO_PCH_CREATE_ATTEMPTED),
            None => NO_PCH_CREATE_ATTEMPTED,
        }
    })
}

/// nvrtcGetPCHHeapSizeRequired: the compile's answer, kept on the client.
pub unsafe fn pch_heap_size_required(ctx: &Ctx, prog: *mut c_void, size: *mut c_void) -> u32 {
    local(ctx.name, || {
        if size.is_null() {
            return INVALID_INPUT;
        }
        let all = programs();
        let Some(p) = all.as_ref().and_then(|m| m.get(&(prog as u64))) else { return INVALID_PROGRAM };
        let Some((status, bytes)) = p.compiled.as_ref().and_then(|(r, _)| r.pch_heap) else {
            return NO_PCH_CREATE_ATTEMPTED;
        };
        // SAFETY: the caller's size_t*, checked non-null.
        unsafe { std::ptr::write_unaligned(size as *mut usize, bytes as usize) };
        u32::try_from(status).unwrap_or(INTERNAL_ERROR)
    })
}

pub unsafe fn nvrtcGetLoweredName(prog: *mut c_void, name_expression: *mut c_void, lowered_name: *mut c_void) -> u32 {
    local("nvrtcGetLoweredName", || {
        // SAFETY: a C string or NULL.
        let Some(expr) = (unsafe { string(name_expression as *const c_char) }) else { return INVALID_INPUT };
        if lowered_name.is_null() {
            return INVALID_INPUT;
        }
        let all = programs();
        let Some(p) = all.as_ref().and_then(|m| m.get(&(prog as u64))) else { return INVALID_PROGRAM };
        let Some((_, lowered)) = &p.compiled else { return NO_LOWERED_NAMES_BEFORE_COMPILATION };
        let Some((_, name)) = lowered.iter().find(|(e, _)| *e == expr) else { return NAME_EXPRESSION_NOT_VALID };
        // SAFETY: the caller's const char**; the string lives until the program is destroyed.
        unsafe { std::ptr::write_unaligned(lowered_name as *mut *const c_char, name.as_ptr()) };
        SUCCESS
    })
}

/// The server NVRTC's architectures, asked once.
static ARCHS: OnceLock<Vec<i32>> = OnceLock::new();

pub unsafe fn nvrtcGetSupportedArchs(supportedArchs: *mut c_void) -> u32 {
    crate::guard::ffi("nvrtcGetSupportedArchs", INTERNAL_ERROR, || {
        if supportedArchs.is_null() {
            return INVALID_INPUT;
        }
        let archs = match ARCHS.get() {
            Some(a) => {
                crate::trace::local("nvrtcGetSupportedArchs");
                a
            }
            None => {
                let mut n = 0i32;
                // SAFETY: one int out.
                let s =
                    unsafe { crate::runtime::call(&calls::nvrtcGetNumSupportedArchs, &[&mut n as *mut i32 as u64]) };
                if s != 0 {
                    return s as u32;
                }
                let mut all = [0i32; 256];
                // SAFETY: the wire form's buffer of 256 ints.
                let s =
                    unsafe { crate::runtime::call(&calls::nvrtcGetSupportedArchs__call, &[all.as_mut_ptr() as u64]) };
                if s != 0 {
                    return s as u32;
                }
                let n = usize::try_from(n).unwrap_or(0).min(all.len());
                ARCHS.get_or_init(|| all[..n].to_vec())
            }
        };
        // SAFETY: the caller's array of nvrtcGetNumSupportedArchs ints.
        unsafe { std::ptr::copy_nonoverlapping(archs.as_ptr(), supportedArchs as *mut i32, archs.len()) };
        SUCCESS
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn headers_the_source_includes_from_the_clients_files_go_with_the_compile() {
        let dir = std::env::temp_dir().join(format!("chidori-nvrtc-headers-{}", std::process::id()));
        let include = dir.join("include");
        std::fs::create_dir_all(include.join("sub")).unwrap();
        std::fs::write(dir.join("common.h"), "#include \"nested.h\"\n#define A 1\n").unwrap();
        std::fs::write(dir.join("nested.h"), "#define B 2\n").unwrap();
        std::fs::write(include.join("sub/lib.h"), "#define C 3\n").unwrap();
        // A toolkit's include directory on the client: its headers are the server's.
        let toolkit = dir.join("cuda/include");
        std::fs::create_dir_all(&toolkit).unwrap();
        std::fs::write(toolkit.join("cuda.h"), "#define CLIENT_CUDA 1\n").unwrap();
        std::fs::write(toolkit.join("cuda_fp16.h"), "#define CLIENT_FP16 1\n").unwrap();
        let request = CompileRequest {
            source: "#include \"common.h\"\n#include <sub/lib.h>\n#include <cuda_fp16.h>\n#include \"given.h\"\n"
                .to_owned(),
            name: Some("./kernel.cu".to_owned()),
            headers: vec![("given.h".to_owned(), "#define D 4\n".to_owned())],
            options: vec![
                "--gpu-architecture=sm_90".to_owned(),
                "-I".to_owned(),
                "include".to_owned(),
                "--include-path=cuda/include".to_owned(),
            ],
            name_expressions: Vec::new(),
        };
        let mut found = local_headers(&request, &dir);
        found.sort();
        let names: Vec<&str> = found.iter().map(|(n, _)| n.as_str()).collect();
        // Not cuda_fp16.h (NVRTC's own; the client toolkit's copy stays), not the header
        // supplied.
        assert_eq!(names, ["common.h", "nested.h", "sub/lib.h"]);
        assert_eq!(found[1].1, "#define B 2\n");
        let _ = std::fs::remove_dir_all(dir);
    }

    use super::*;

    fn program(src: &str) -> u64 {
        let src = CString::new(src).unwrap();
        let mut prog = 0u64;
        // SAFETY: `prog` and `src` are live locals; the other pointers may be null.
        let s = unsafe {
            nvrtcCreateProgram(
                &mut prog as *mut u64 as *mut c_void,
                src.as_ptr() as *mut c_void,
                std::ptr::null_mut(),
                0,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            )
        };
        assert_eq!(s, SUCCESS);
        prog
    }

    /// The context the export named `name` passes.
    fn ctx(name: &'static str) -> Ctx {
        let codes = chidori_cuda::desc::Codes {
            success: 0,
            not_supported: INTERNAL_ERROR.into(),
            unavailable: INTERNAL_ERROR.into(),
            invalid_handle: INVALID_PROGRAM.into(),
            invalid_value: INVALID_INPUT.into(),
        };
        Ctx { name, version: "13.0", library: "nvrtc", forms: &[], codes }
    }

    /// [`output`] as the export named `name` calls it.
    unsafe fn get(name: &'static str, prog: *mut c_void, out: *mut c_void) -> u32 {
        // SAFETY: the caller's arguments.
        unsafe { output(&ctx(name), &[prog as u64, out as u64]) as u32 }
    }

    #[test]
    fn outputs_follow_nvrtc_semantics_around_a_compile() {
        let prog = program("__global__ void k() {}");
        let p = prog as *mut c_void;
        let expr = CString::new("k").unwrap();
        // SAFETY: every pointer handed to the functions below is a live local of the type
        // the function writes (or a NUL-terminated string); `p` is this test's program.
        unsafe {
            assert_eq!(nvrtcAddNameExpression(p, expr.as_ptr() as *mut c_void), SUCCESS);
            let mut n = 99usize;
            assert_eq!(get("nvrtcGetProgramLogSize", p, &mut n as *mut usize as *mut c_void), SUCCESS);
            assert_eq!(n, 1, "before a compile the log is the empty string");
            assert_eq!(get("nvrtcGetPTXSize", p, &mut n as *mut usize as *mut c_void), INVALID_PROGRAM);
            let mut lowered: *const c_char = std::ptr::null();
            let lp = &mut lowered as *mut *const c_char as *mut c_void;
            assert_eq!(nvrtcGetLoweredName(p, expr.as_ptr() as *mut c_void, lp), NO_LOWERED_NAMES_BEFORE_COMPILATION);
            // What a compile brings back.
            let result = CompileResult {
                status: 0,
                log: b"\0".to_vec(),
                ptx: b"// ptx\0".to_vec(),
                cubin: b"\x7fELF".to_vec(),
                lowered: vec![("k".into(), "_Z1kv".into())],
                ltoir: b"\x7fLTO".to_vec(),
                pch_status: Some(i64::from(NO_PCH_CREATE_ATTEMPTED)),
                ..CompileResult::default()
            };
            let lowered_c = vec![("k".to_owned(), CString::new("_Z1kv").unwrap())];
            programs().as_mut().unwrap().get_mut(&prog).unwrap().compiled = Some((result, lowered_c));
            assert_eq!(get("nvrtcGetPTXSize", p, &mut n as *mut usize as *mut c_void), SUCCESS);
            assert_eq!(n, 7);
            let mut ptx = vec![0u8; n];
            assert_eq!(get("nvrtcGetPTX", p, ptx.as_mut_ptr() as *mut c_void), SUCCESS);
            assert_eq!(ptx, b"// ptx\0");
            // LTO IR (`-dlto`, NVIDIA's jitLto sample) as the compile brought it; no OptiX IR.
            assert_eq!(get("nvrtcGetLTOIRSize", p, &mut n as *mut usize as *mut c_void), SUCCESS);
            assert_eq!(n, 4);
            let mut ltoir = vec![0u8; n];
            assert_eq!(get("nvrtcGetLTOIR", p, ltoir.as_mut_ptr() as *mut c_void), SUCCESS);
            assert_eq!(ltoir, b"\x7fLTO");
            assert_eq!(get("nvrtcGetOptiXIRSize", p, &mut n as *mut usize as *mut c_void), SUCCESS);
            assert_eq!(n, 0, "not asked for: size 0, as NVRTC answers");
            assert_eq!(pch_create_status(&ctx("nvrtcGetPCHCreateStatus"), p), NO_PCH_CREATE_ATTEMPTED);
            let heap = ctx("nvrtcGetPCHHeapSizeRequired");
            assert_eq!(pch_heap_size_required(&heap, p, &mut n as *mut usize as *mut c_void), NO_PCH_CREATE_ATTEMPTED);
            assert_eq!(nvrtcGetLoweredName(p, expr.as_ptr() as *mut c_void, lp), SUCCESS);
            assert_eq!(CStr::from_ptr(lowered).to_str().unwrap(), "_Z1kv");
            let other = CString::new("nope").unwrap();
            assert_eq!(nvrtcGetLoweredName(p, other.as_ptr() as *mut c_void, lp), NAME_EXPRESSION_NOT_VALID);
            assert_eq!(nvrtcAddNameExpression(p, expr.as_ptr() as *mut c_void), NO_NAME_EXPRESSIONS_AFTER_COMPILATION);
            let mut handle = prog;
            assert_eq!(nvrtcDestroyProgram(&mut handle as *mut u64 as *mut c_void), SUCCESS);
            assert_eq!(handle, 0, "destroy clears the caller's handle");
            assert_eq!(get("nvrtcGetProgramLogSize", p, &mut n as *mut usize as *mut c_void), INVALID_PROGRAM);
            let mut bogus = 0x1234u64;
            assert_eq!(nvrtcDestroyProgram(&mut bogus as *mut u64 as *mut c_void), INVALID_PROGRAM);
        }
    }
}
