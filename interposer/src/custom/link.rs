//! The JIT linker (`cuLinkCreate`, `cuLinkAddData`, `cuLinkAddFile`, `cuLinkComplete`,
//! `cuLinkDestroy`): the client keeps the link's options and inputs, and `cuLinkComplete`
//! is one `Service::Link` request whose answer (the image, the logs, the wall time) the
//! client hands the program as the driver would. Like NVRTC programs (custom/nvrtc.rs),
//! link states never reach the server as objects.
//!
//! Every `unsafe fn` here has the safety contract of the CUDA function it implements.
#![allow(clippy::missing_safety_doc, clippy::too_many_arguments)]

use std::collections::HashMap;
use std::ffi::{CStr, c_char, c_void};

use chidori_cuda::consts::CUjit_option_enum as jit;
use chidori_cuda::consts::cudaError_enum as cu;
use chidori_cuda::desc::Ctx;
use chidori_protocol::messages::{LinkRequest, Service, ServiceReply};

use crate::conn;

/// A link in progress: its options, inputs, where the program wants logs and the wall time,
/// and the image once linked (valid until the state is destroyed).
#[derive(Default)]
pub struct LinkState {
    options: Vec<(u32, u64)>,
    inputs: Vec<(u32, String, Vec<u8>)>,
    /// (buffer, its size's slot in the program's option values) of the info and error logs.
    info_log: Option<(u64, u64)>,
    error_log: Option<(u64, u64)>,
    /// The program's option value slot that receives the wall time (a float).
    wall_time: Option<u64>,
    image: Vec<u8>,
}

fn with_state<T>(handle: u64, f: impl FnOnce(&mut LinkState) -> T) -> Option<T> {
    let mut guard = crate::state::CLIENT.link_states.lock();
    guard.get_or_insert_with(HashMap::new).get_mut(&handle).map(f)
}

fn run(ctx: &Ctx, body: impl FnOnce() -> Result<u32, u32>) -> u32 {
    crate::guard::ffi(ctx.name, cu::CUDA_ERROR_INVALID_VALUE, || {
        crate::trace::local(ctx.name);
        body().unwrap_or_else(|e| e)
    })
}

/// Options of the program's arrays: numbers travel, log buffers and the wall time stay with
/// the client (their slots are the program's).
///
/// # Safety
/// `keys` and `values` hold `n` options.
unsafe fn read_options(state: &mut LinkState, n: u32, keys: *const u32, values: *mut *mut c_void) {
    if keys.is_null() || values.is_null() {
        return;
    }
    for i in 0..n as usize {
        // SAFETY: per the contract.
        let (key, slot) = unsafe { (*keys.add(i), values.add(i)) };
        // SAFETY: as above.
        let value = unsafe { *slot } as u64;
        let size_slot = |size_key: u32| -> u64 {
            (0..n as usize)
                // SAFETY: as above.
                .find(|j| unsafe { *keys.add(*j) } == size_key)
                // SAFETY: as above.
                .map_or(0, |j| unsafe { values.add(j) } as u64)
        };
        match key {
            jit::CU_JIT_INFO_LOG_BUFFER => {
                state.info_log = Some((value, size_slot(jit::CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES)))
            }
            jit::CU_JIT_ERROR_LOG_BUFFER => {
                state.error_log = Some((value, size_slot(jit::CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES)))
            }
            jit::CU_JIT_WALL_TIME => state.wall_time = Some(slot as u64),
            jit::CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES | jit::CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES => {}
            // Symbol and name arrays point into the program's memory: not forwarded.
            jit::CU_JIT_GLOBAL_SYMBOL_NAMES
            | jit::CU_JIT_GLOBAL_SYMBOL_ADDRESSES
            | jit::CU_JIT_GLOBAL_SYMBOL_COUNT
            | jit::CU_JIT_REFERENCED_KERNEL_NAMES
            | jit::CU_JIT_REFERENCED_KERNEL_COUNT
            | jit::CU_JIT_REFERENCED_VARIABLE_NAMES
            | jit::CU_JIT_REFERENCED_VARIABLE_COUNT => {
                crate::log::once("cuLink-symbols", || {
                    tracing::warn!("cuLinkCreate: symbol and name list options are not forwarded by Chidori")
                });
            }
            other => state.options.push((other, value)),
        }
    }
}

/// cuLinkCreate and cuLinkCreate_v2: a state the client names.
pub unsafe fn create(ctx: &Ctx, n: u32, keys: *mut c_void, values: *mut c_void, out: *mut c_void) -> u32 {
    run(ctx, || {
        if out.is_null() {
            return Err(cu::CUDA_ERROR_INVALID_VALUE);
        }
        let mut state = LinkState::default();
        // SAFETY: the program's option arrays of `n` elements.
        unsafe { read_options(&mut state, n, keys as *const u32, values as *mut *mut c_void) };
        let handle = crate::state::next_handle_name();
        crate::state::CLIENT.link_states.lock().get_or_insert_with(HashMap::new).insert(handle, state);
        // SAFETY: the caller's CUlinkState*.
        unsafe { std::ptr::write_unaligned(out as *mut u64, handle) };
        Ok(cu::CUDA_SUCCESS)
    })
}

fn name_of(name: *mut c_void) -> String {
    if name.is_null() {
        return String::new();
    }
    // SAFETY: a NUL-terminated name per the API.
    unsafe { CStr::from_ptr(name as *const c_char) }.to_string_lossy().into_owned()
}

/// cuLinkAddData and cuLinkAddData_v2. Options of one input (JIT options of a PTX input) are
/// the link's own here: the server's linker sees the link's options.
pub unsafe fn add_data(
    ctx: &Ctx,
    state: *mut c_void,
    kind: u32,
    data: *mut c_void,
    size: usize,
    name: *mut c_void,
    _n: u32,
    _keys: *mut c_void,
    _values: *mut c_void,
) -> u32 {
    run(ctx, || {
        if data.is_null() || size == 0 {
            return Err(cu::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: the input's `size` bytes per the API.
        let bytes = unsafe { std::slice::from_raw_parts(data as *const u8, size) }.to_vec();
        let name = name_of(name);
        with_state(state as u64, |s| s.inputs.push((kind, name, bytes))).ok_or(cu::CUDA_ERROR_INVALID_HANDLE)?;
        Ok(cu::CUDA_SUCCESS)
    })
}

/// cuLinkAddFile and cuLinkAddFile_v2: the file is on the client.
pub unsafe fn add_file(
    ctx: &Ctx,
    state: *mut c_void,
    kind: u32,
    path: *mut c_void,
    _n: u32,
    _keys: *mut c_void,
    _values: *mut c_void,
) -> u32 {
    run(ctx, || {
        let path = name_of(path);
        let bytes = std::fs::read(&path).map_err(|e| {
            tracing::warn!("{}: cannot read {path}: {e}", ctx.name);
            cu::CUDA_ERROR_FILE_NOT_FOUND
        })?;
        with_state(state as u64, |s| s.inputs.push((kind, path, bytes))).ok_or(cu::CUDA_ERROR_INVALID_HANDLE)?;
        Ok(cu::CUDA_SUCCESS)
    })
}

/// Copy a log into the program's buffer (NUL-terminated, cut to its size) and write the
/// bytes used into its size slot.
///
/// # Safety
/// The buffer and slot are the program's, as its options named them.
unsafe fn give_log(target: Option<(u64, u64)>, log: &[u8]) {
    let Some((buffer, size_slot)) = target else { return };
    if buffer == 0 || size_slot == 0 {
        return;
    }
    // SAFETY: per the contract: the slot holds the buffer's size.
    let size = unsafe { *(size_slot as *const usize) };
    if size == 0 {
        return;
    }
    let n = log.len().min(size - 1);
    // SAFETY: the program's buffer of `size` bytes and its size slot.
    unsafe {
        std::ptr::copy_nonoverlapping(log.as_ptr(), buffer as *mut u8, n);
        *(buffer as *mut u8).add(n) = 0;
        *(size_slot as *mut usize) = n + 1;
    }
}

/// cuLinkComplete: one request to the server's linker; the image lives in the state.
pub unsafe fn complete(ctx: &Ctx, state: *mut c_void, image_out: *mut c_void, size_out: *mut c_void) -> u32 {
    run(ctx, || {
        let request =
            with_state(state as u64, |s| LinkRequest { options: s.options.clone(), inputs: s.inputs.clone() })
                .ok_or(cu::CUDA_ERROR_INVALID_HANDLE)?;
        let conn = conn::get().map_err(|_| cu::CUDA_ERROR_NO_DEVICE)?;
        let start = std::time::Instant::now();
        let sent: u64 = request.inputs.iter().map(|(_, _, b)| b.len() as u64).sum();
        let reply = conn.service(&Service::Link(request), &[]).map_err(|_| cu::CUDA_ERROR_NO_DEVICE)?;
        let result = match reply {
            ServiceReply::Linked(r) => r,
            ServiceReply::Error { status, message } => {
                crate::log::once_owned(&message, || tracing::warn!("cuLinkComplete: {message}"));
                return Err(status as u32);
            }
            _ => return Err(cu::CUDA_ERROR_UNKNOWN),
        };
        crate::trace::bytes("(link)", 1, sent, result.image.len() as u64, start.elapsed());
        let (info, error, wall) =
            with_state(state as u64, |s| (s.info_log, s.error_log, s.wall_time)).unwrap_or_default();
        // SAFETY: the buffers and slots the program named in its options.
        unsafe {
            give_log(info, &result.info_log);
            give_log(error, &result.error_log);
            if let Some(slot) = wall {
                *(slot as *mut u64) = u64::from(result.wall_ms.to_bits());
            }
        }
        if result.status != i64::from(cu::CUDA_SUCCESS) {
            return Err(result.status as u32);
        }
        let (at, len) = with_state(state as u64, |s| {
            s.image = result.image;
            (s.image.as_ptr() as u64, s.image.len())
        })
        .ok_or(cu::CUDA_ERROR_INVALID_HANDLE)?;
        // SAFETY: the caller's void** and size_t*; the image lives until cuLinkDestroy.
        unsafe {
            if !image_out.is_null() {
                std::ptr::write_unaligned(image_out as *mut u64, at);
            }
            if !size_out.is_null() {
                std::ptr::write_unaligned(size_out as *mut usize, len);
            }
        }
        Ok(cu::CUDA_SUCCESS)
    })
}

/// cuLinkDestroy: the state and its image go.
pub unsafe fn destroy(ctx: &Ctx, state: *mut c_void) -> u32 {
    run(ctx, || {
        let removed = crate::state::CLIENT.link_states.lock().get_or_insert_with(HashMap::new).remove(&(state as u64));
        if removed.is_some() { Ok(cu::CUDA_SUCCESS) } else { Err(cu::CUDA_ERROR_INVALID_HANDLE) }
    })
}

// ---- Graphs as Graphviz text ----

/// cuGraphDebugDotPrint and cudaGraphDebugDotPrint: the server's driver writes the graph's
/// dot text; the client writes it to the program's path.
pub unsafe fn graph_dot_print(ctx: &Ctx, graph: *mut c_void, path: *mut c_void, flags: u32) -> u32 {
    let status = run(ctx, || {
        if path.is_null() {
            return Err(ctx.codes.invalid_value as u32);
        }
        let conn = conn::get().map_err(|_| ctx.codes.unavailable as u32)?;
        let reply = conn
            .service(&Service::GraphDot { graph: graph as u64, flags }, &[])
            .map_err(|_| ctx.codes.unavailable as u32)?;
        let text = match reply {
            ServiceReply::Name(text) => text,
            ServiceReply::Error { status, .. } => return Err(status as u32),
            _ => return Err(ctx.codes.invalid_value as u32),
        };
        let path = name_of(path);
        // cudaErrorOperatingSystem / CUDA_ERROR_OPERATING_SYSTEM where the file cannot be written.
        std::fs::write(&path, text).map_err(|_| 304u32)?;
        Ok(cu::CUDA_SUCCESS)
    });
    if ctx.library == "cudart" {
        crate::state::set_last_error(status);
    }
    status
}
