//! NVML initialization and device count, answered on the client (the worker initializes
//! NVML itself before the first NVML call it forwards). `torch.cuda.device_count()` asks
//! NVML before CUDA: this keeps it free of round trips. Process lists go as their own wire
//! form (the worker keeps the program's own process), and process names are this machine's.
#![allow(non_snake_case, clippy::missing_safety_doc)]

use std::ffi::c_void;

use chidori_cuda::desc::Ctx;
use chidori_protocol::desc::Form;

const SUCCESS: u32 = chidori_cuda::consts::nvmlReturn_enum::NVML_SUCCESS;
const INVALID_ARGUMENT: u32 = chidori_cuda::consts::nvmlReturn_enum::NVML_ERROR_INVALID_ARGUMENT;
const DRIVER_NOT_LOADED: u32 = chidori_cuda::consts::nvmlReturn_enum::NVML_ERROR_DRIVER_NOT_LOADED;
const NOT_SUPPORTED: u32 = chidori_cuda::consts::nvmlReturn_enum::NVML_ERROR_NOT_SUPPORTED;
const NOT_FOUND: u32 = chidori_cuda::consts::nvmlReturn_enum::NVML_ERROR_NOT_FOUND;

fn init(name: &'static str) -> u32 {
    crate::guard::ffi(name, DRIVER_NOT_LOADED, || {
        crate::trace::local(name);
        // Without a server there is no NVIDIA driver to talk to.
        if crate::conn::get().is_ok() { SUCCESS } else { DRIVER_NOT_LOADED }
    })
}

/// nvmlInternalGetExportTable: NVML's private table, which a local nvidia-smi asks for
/// first. Not answered (NVIDIA does not publish what its functions do); the log says where
/// the server's nvidia-smi is.
pub unsafe fn nvmlInternalGetExportTable(table: *mut c_void, _id: *mut c_void) -> u32 {
    crate::guard::ffi("nvmlInternalGetExportTable", NOT_SUPPORTED, || {
        crate::log::once("nvml-export-table", || {
            tracing::warn!(
                "a program asked NVML for its private export table (nvidia-smi does), which Chidori's NVML does \
                 not have: under `chidori run`, the `nvidia-smi` found on PATH is the server's"
            )
        });
        if !table.is_null() {
            // SAFETY: the caller's pointer to the table pointer, checked non-null.
            unsafe { std::ptr::write_unaligned(table as *mut usize, 0) };
        }
        NOT_SUPPORTED
    })
}

fn count(name: &'static str, out: *mut c_void) -> u32 {
    crate::guard::ffi(name, DRIVER_NOT_LOADED, || {
        crate::trace::local(name);
        if out.is_null() {
            return INVALID_ARGUMENT;
        }
        let Ok(conn) = crate::conn::get() else { return DRIVER_NOT_LOADED };
        // NVML ignores CUDA_VISIBLE_DEVICES: it counts the GPUs the server exposes.
        let n = conn.profile.nvml_devices;
        // SAFETY: the caller's unsigned int, checked non-null.
        unsafe { std::ptr::write_unaligned(out as *mut u32, n) };
        SUCCESS
    })
}

/// nvmlInit and nvmlInit_v2.
pub unsafe fn init_library(ctx: &Ctx) -> u32 {
    init(ctx.name)
}

pub unsafe fn nvmlInitWithFlags(_flags: u32) -> u32 {
    init("nvmlInitWithFlags")
}

/// The worker's NVML stays initialized until the session ends.
pub unsafe fn nvmlShutdown() -> u32 {
    crate::guard::ffi("nvmlShutdown", SUCCESS, || {
        crate::trace::local("nvmlShutdown");
        SUCCESS
    })
}

/// nvmlDeviceGetCount and its `_v2`.
pub unsafe fn device_count(ctx: &Ctx, out: *mut c_void) -> u32 {
    count(ctx.name, out)
}

/// The GPU's process lists (`nvmlDevice*RunningProcesses*`, `nvmlDeviceGetProcessUtilization`):
/// sent as the `processes` form, whose answer the worker has cut to the program's own
/// process (`worker/src/processes.rs`).
pub unsafe fn processes(ctx: &Ctx, args: &[u64]) -> u64 {
    crate::guard::ffi(ctx.name, u64::from(DRIVER_NOT_LOADED), || {
        // SAFETY: the program's arguments, as the API defines them; the descriptor's lengths
        // come from its count.
        unsafe { crate::runtime::call(ctx.form(Form::Processes), args) }
    })
}

/// nvmlSystemGetProcessName: the processes a program is shown are its own, under their PIDs
/// on this machine, so the name is this machine's: the first word of the process's command
/// line (its executable as started), as NVML gives it.
pub unsafe fn process_name(ctx: &Ctx, pid: u32, name: *mut c_void, length: u32) -> u32 {
    crate::guard::ffi(ctx.name, INVALID_ARGUMENT, || {
        crate::trace::local(ctx.name);
        if name.is_null() || length == 0 {
            return INVALID_ARGUMENT;
        }
        let Some(found) = local_process_name(pid) else { return NOT_FOUND };
        let n = found.len().min(length as usize - 1);
        // SAFETY: the caller's buffer of `length` bytes, checked non-null; n + 1 <= length.
        unsafe {
            std::ptr::copy_nonoverlapping(found.as_ptr(), name as *mut u8, n);
            *(name as *mut u8).add(n) = 0;
        }
        SUCCESS
    })
}

/// The first word of `pid`'s command line on this machine, or its short name (a kernel
/// thread has no command line); None where there is no such process.
fn local_process_name(pid: u32) -> Option<Vec<u8>> {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let first = cmdline.split(|&b| b == 0).next().unwrap_or_default();
    if !first.is_empty() {
        return Some(first.to_vec());
    }
    let comm = std::fs::read(format!("/proc/{pid}/comm")).ok()?;
    Some(comm.strip_suffix(b"\n").unwrap_or(&comm).to_vec())
}

/// A call whose record starts with NVML's version word (`NVML_STRUCT_VERSION`: the record's
/// size in its low 24 bits), such as nvmlDeviceGetGpuFabricInfoV (`raw_args`): the record
/// travels and comes back as long as that says ([`super::call_with_own_size`]).
pub unsafe fn versioned_raw(ctx: &Ctx, args: &[u64]) -> u64 {
    // SAFETY: the caller's arguments; a versioned record's first word is its version.
    unsafe { super::call_with_own_size(ctx, args, versioned_size) }
}

/// A versioned record's size: the low 24 bits of its version word.
fn versioned_size(p: *const u8) -> usize {
    // SAFETY: `call_with_own_size` passes a non-null record whose first word is readable.
    (unsafe { std::ptr::read_unaligned(p as *const u32) } & 0x00ff_ffff) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_is_named_by_its_command_line_here() {
        let mine = local_process_name(std::process::id()).expect("this process");
        let exe = std::env::args_os().next().expect("argv[0]");
        assert_eq!(mine, exe.as_encoded_bytes());
        assert_eq!(local_process_name(u32::MAX), None);
    }
}
