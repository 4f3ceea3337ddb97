//! NVML initialization and device count, answered on the client (the worker initializes
//! NVML itself before the first NVML call it forwards). `torch.cuda.device_count()` asks
//! NVML before CUDA: this keeps it free of round trips. Process lists go as their own wire
//! form (the worker keeps the program's own process), and process names are this machine's.
#![allow(non_snake_case, clippy::missing_safety_doc)]

use std::ffi::c_void;

use chidori_cuda::desc::Ctx;
use chidori_protocol::desc::{Dir, Form, Wire};

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
/// size in the low 24 bits), such as nvmlDeviceGetGpuFabricInfoV (`raw_args`). A program
/// built against an older NVML holds a shorter record than the newest headers' the call is
/// described by: it travels as a copy of the bytes the version word says, the rest zero,
/// and only those come back.
pub unsafe fn versioned_raw(ctx: &Ctx, args: &[u64]) -> u64 {
    let desc = ctx.form(Form::Call);
    let record = desc.params.iter().enumerate().find_map(|(i, w)| match w {
        Wire::Buf { dir, record: Some(r), .. } => Some((i, *dir, *r)),
        _ => None,
    });
    let full = record.and_then(|(_, _, r)| chidori_cuda::structs::get(ctx.version, r)).map_or(0, |m| m.size as usize);
    let Some((i, dir, _)) = record.filter(|_| full >= 4) else {
        // SAFETY: the caller's arguments, as the call is described.
        return unsafe { crate::runtime::call(desc, args) };
    };
    let p = args.get(i).copied().unwrap_or(0) as *mut u8;
    if p.is_null() {
        return u64::from(INVALID_ARGUMENT);
    }
    crate::guard::ffi(ctx.name, u64::from(INVALID_ARGUMENT), || {
        // SAFETY: the program's record, whose first word says how many bytes it holds.
        let said = unsafe { std::ptr::read_unaligned(p as *const u32) } as usize & 0x00ff_ffff;
        let n = said.clamp(4, full);
        let mut copy = vec![0u8; full];
        // SAFETY: the program's record holds `n` bytes (no more than it says).
        unsafe { std::ptr::copy_nonoverlapping(p, copy.as_mut_ptr(), n) };
        let mut args = args.to_vec();
        args[i] = copy.as_mut_ptr() as u64;
        // SAFETY: the caller's arguments, the record in `copy`.
        let status = unsafe { crate::runtime::call(desc, &args) };
        if dir != Dir::In {
            // SAFETY: as above; only the bytes the program's record holds go back.
            unsafe { std::ptr::copy_nonoverlapping(copy.as_ptr(), p, n) };
        }
        status
    })
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
