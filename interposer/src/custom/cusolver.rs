//! Hand-written cuSOLVER functions: a host workspace that only a size query can size, and
//! the 64-bit API's factorizations sent without waiting where they have no host workspace.
#![allow(non_snake_case, clippy::missing_safety_doc, clippy::too_many_arguments)]

use std::ffi::c_void;

use chidori_cuda::calls::cusolver as calls;
use chidori_cuda::desc::{Ctx, Dir, Form, Wire};

use crate::state::CLIENT;

/// `cusolverSpXcsrpermHost`: `pBuffer` is a host workspace whose size no parameter gives
/// (the caller sized it with `cusolverSpXcsrperm_bufferSizeHost`). The client asks that
/// query itself with the same inputs (one more round trip), then sends the call with the
/// size in place of the workspace's address: the worker passes a workspace of its own of
/// that size. What the library leaves in the workspace is not copied back (it is scratch).
pub unsafe fn xcsrperm_host(
    ctx: &Ctx,
    handle: *mut c_void,
    m: i32,
    n: i32,
    nnzA: i32,
    descrA: *mut c_void,
    csrRowPtrA: *mut c_void,
    csrColIndA: *mut c_void,
    p: *mut c_void,
    q: *mut c_void,
    map: *mut c_void,
    pBuffer: *mut c_void,
) -> u32 {
    let invalid = ctx.codes.invalid_value as u32;
    crate::guard::ffi("cusolverSpXcsrpermHost", invalid, || {
        let Some(&form) = ctx.forms.first() else { return invalid };
        if pBuffer.is_null() {
            return invalid;
        }
        let mut bytes: usize = 0;
        let inputs = [
            handle as u64,
            m as u32 as u64,
            n as u32 as u64,
            nnzA as u32 as u64,
            descrA as u64,
            csrRowPtrA as u64,
            csrColIndA as u64,
            p as u64,
            q as u64,
        ];
        let mut query = inputs.to_vec();
        query.push(&mut bytes as *mut usize as u64);
        // SAFETY: the caller's arrays, of the lengths the query's spec gives; `bytes`
        // receives one size_t.
        let s = unsafe { crate::runtime::call(&calls::cusolverSpXcsrperm_bufferSizeHost, &query) as u32 };
        if s != 0 {
            return s;
        }
        let mut args = inputs.to_vec();
        args.push(map as u64);
        args.push(bytes as u64);
        // SAFETY: the caller's arrays, read and written as the spec says; the workspace
        // travels as its size only.
        unsafe { crate::runtime::call(form, &args) as u32 }
    })
}

// ---- cuSolverSP's low-level preview API, CPU path ----

/// What the client knows of a low-level info object (`csrqrInfoHost_t`, …) from the calls
/// made with it: the matrix's order (and rows), the workspace its BufferInfoHost asked for,
/// and the factors' sizes its NnzHost gave (LU).
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub struct SpInfo {
    rows: u64,
    cols: u64,
    workspace: u64,
    nnz_l: u64,
    nnz_u: u64,
}

fn sp_info(info: u64) -> SpInfo {
    CLIENT.sp_infos.get(&info).unwrap_or_default()
}

fn set_sp_info(info: u64, f: impl FnOnce(&mut SpInfo)) {
    let mut guard = CLIENT.sp_infos.lock();
    f(guard.get_or_insert_with(Default::default).entry(info).or_default());
}

/// The host arrays of low-level call `name` with arguments `args`, as (parameter, bytes),
/// from its sizes and what `info` recorded (the workspace, the factors' sizes); and the
/// info parameter. None for a function this does not know.
fn sp_host_arrays(name: &str, args: &[u64], info: &dyn Fn(u64) -> SpInfo) -> Option<(usize, Vec<(usize, u64)>)> {
    let rest = name.strip_prefix("cusolverSp")?.strip_suffix("Host")?;
    let elem: u64 = match rest.as_bytes().first()? {
        b'S' => 4,
        b'D' | b'C' => 8,
        b'Z' => 16,
        b'X' => 4,
        _ => return None,
    };
    let a = |i: usize| u64::from(args.get(i).copied().unwrap_or(0) as u32);
    let times = |n: u64, bytes: u64| n.saturating_mul(bytes);
    let ints = |n: u64| times(n, 4);
    let values = |n: u64| times(n, elem);
    let row_starts = |n: u64| ints(n.saturating_add(1));
    // (info parameter, arrays)
    Some(match &rest[1..] {
        "csrqrAnalysis" => (7, vec![(5, row_starts(a(1))), (6, ints(a(3)))]),
        "csrcholAnalysis" | "csrluAnalysis" => (6, vec![(4, row_starts(a(1))), (5, ints(a(2)))]),
        "csrqrBufferInfo" | "csrqrSetup" => (if rest.ends_with("Setup") { 9 } else { 8 }, {
            vec![(5, values(a(3))), (6, row_starts(a(1))), (7, ints(a(3)))]
        }),
        "csrcholBufferInfo" | "csrluBufferInfo" => (7, vec![(4, values(a(2))), (5, row_starts(a(1))), (6, ints(a(2)))]),
        "csrqrFactor" => {
            let w = info(args.get(6).copied().unwrap_or(0)).workspace;
            (6, vec![(4, values(a(1))), (5, values(a(2))), (7, w)])
        }
        "csrqrSolve" => {
            let w = info(args.get(5).copied().unwrap_or(0)).workspace;
            (5, vec![(3, values(a(1))), (4, values(a(2))), (6, w)])
        }
        "csrcholFactor" | "csrluFactor" => {
            let at = if rest.contains("lu") { 9 } else { 8 };
            let w = info(args.get(7).copied().unwrap_or(0)).workspace;
            (7, vec![(4, values(a(2))), (5, row_starts(a(1))), (6, ints(a(2))), (at, w)])
        }
        "csrcholSolve" | "csrluSolve" => {
            let w = info(args.get(4).copied().unwrap_or(0)).workspace;
            (4, vec![(2, values(a(1))), (3, values(a(1))), (5, w)])
        }
        "csrluExtract" => {
            let i = info(args.get(11).copied().unwrap_or(0));
            let n = i.cols;
            let arrays = vec![
                (1, ints(n)),
                (2, ints(n)),
                (4, values(i.nnz_l)),
                (5, row_starts(n)),
                (6, ints(i.nnz_l)),
                (8, values(i.nnz_u)),
                (9, row_starts(n)),
                (10, ints(i.nnz_u)),
                (12, i.workspace),
            ];
            (11, arrays)
        }
        "csrqrZeroPivot" | "csrcholZeroPivot" | "csrluZeroPivot" => (1, Vec::new()),
        "csrluNnz" => (3, Vec::new()),
        _ => return None,
    })
}

/// The CPU path of cuSolverSP's low-level preview API (`cusolverSp<t>csr{qr,chol,lu}…Host`,
/// `cusolverSpXcsr{qr,chol,lu}AnalysisHost`): the guide leaves open what the info object
/// keeps between calls (the matrix given to Setup is not passed to Factor again; the
/// workspace holds the factors from Factor to Solve), so every host array becomes memory the
/// server mirrors (`crate::mirror::around_library_call`, owned by the info object until it
/// is destroyed), whose address on the server the library is given each time, and the library
/// sees the same arrays there, call after call, as natively. The call waits; what the
/// library wrote comes back before it returns. The client records each info object's sizes
/// (the workspace from BufferInfoHost, the factors' from NnzHost) for the calls that do not
/// say them.
pub unsafe fn sp_host(ctx: &Ctx, args: &[u64]) -> u64 {
    let invalid = ctx.codes.invalid_value as u64;
    crate::guard::ffi(ctx.name, invalid, || {
        let desc = ctx.form(Form::Call);
        let Some((info_at, arrays)) = sp_host_arrays(ctx.name, args, &sp_info) else {
            // SAFETY: the program's arguments, as the function defines them.
            return unsafe { crate::runtime::call(desc, args) };
        };
        let info = args.get(info_at).copied().unwrap_or(0);
        let arrays: Vec<(u64, u64)> =
            arrays.into_iter().map(|(param, bytes)| (args.get(param).copied().unwrap_or(0), bytes)).collect();
        // The arrays' mirrors are the info object's until it is destroyed (without one, the
        // call's alone; the library refuses it).
        let owner = if info == 0 { crate::mirror::call_owner() } else { info };
        // SAFETY: the program's arguments; its host arrays are mirrored first.
        let status = crate::mirror::around_library_call(ctx.name, owner, &arrays, || unsafe {
            crate::runtime::call(desc, args)
        });
        if info == 0 {
            crate::mirror::release(owner);
        }
        if status == ctx.codes.success as u64 {
            record_sp_info(ctx.name, args, info);
        }
        status
    })
}

/// `cusolverSpDestroyCsr{qr,chol,lu}InfoHost`: the library lets go of the info object's
/// arrays, so the mirrors no other live info object was given memory in go too (a program
/// that solves with fresh arrays, one info object each, does not fill the server).
pub unsafe fn sp_host_destroy(ctx: &Ctx, args: &[u64]) -> u64 {
    let invalid = ctx.codes.invalid_value as u64;
    crate::guard::ffi(ctx.name, invalid, || {
        let info = args.first().copied().unwrap_or(0);
        // SAFETY: a handle value.
        let status = unsafe { crate::runtime::call(ctx.form(Form::Call), args) };
        if info != 0 {
            CLIENT.sp_infos.remove(&info);
            crate::mirror::release(info);
        }
        status
    })
}

/// After a successful low-level call: what it says of its info object.
fn record_sp_info(name: &str, args: &[u64], info: u64) {
    let a = |i: usize| u64::from(args.get(i).copied().unwrap_or(0) as u32);
    // SAFETY (reads): out-parameters of the call that just returned, written by its reply.
    let read_size = |i: usize| match args.get(i).copied().filter(|&p| p != 0) {
        Some(p) => (unsafe { std::ptr::read_unaligned(p as *const usize) }) as u64,
        None => 0,
    };
    let read_int = |i: usize| match args.get(i).copied().filter(|&p| p != 0) {
        Some(p) => u64::from((unsafe { std::ptr::read_unaligned(p as *const i32) }).max(0) as u32),
        None => 0,
    };
    let Some(rest) = name.strip_prefix("cusolverSp").and_then(|r| r.strip_suffix("Host")).filter(|r| r.len() > 1)
    else {
        return;
    };
    match &rest[1..] {
        "csrqrAnalysis" => set_sp_info(info, |i| (i.rows, i.cols) = (a(1), a(2))),
        "csrcholAnalysis" | "csrluAnalysis" => set_sp_info(info, |i| (i.rows, i.cols) = (a(1), a(1))),
        "csrqrBufferInfo" => set_sp_info(info, |i| i.workspace = read_size(10)),
        "csrcholBufferInfo" | "csrluBufferInfo" => set_sp_info(info, |i| i.workspace = read_size(9)),
        "csrluNnz" => set_sp_info(info, |i| (i.nnz_l, i.nnz_u) = (read_int(1), read_int(2))),
        _ => {}
    }
}

/// The 64-bit API's factorizations (`cusolverDnXpotrf`, `…Xgetrf`, `…Xgeqrf`, …) whose only
/// host output is `bufferOnHost`, of `workspaceInBytesOnHost` bytes (`raw_args`). torch
/// passes no host workspace: then nothing comes back but the status, and the call goes
/// without waiting, as the library's other factorizations do (a failure surfaces at the
/// next cuSOLVER call that waits); with one, it waits for the bytes the library leaves.
pub unsafe fn host_workspace_raw(ctx: &Ctx, args: &[u64]) -> u64 {
    let call = ctx.form(Form::Call);
    let host_bytes = call.params.iter().find_map(|w| match w {
        Wire::Buf { dir: Dir::InOut, len: Some(len), .. } => Some(len.eval(args)),
        _ => None,
    });
    let form = if host_bytes == Some(Some(0)) { Form::Async } else { Form::Call };
    // SAFETY: the caller's arguments, as the function of `ctx` takes them (the async form
    // passes the library no host workspace, of 0 bytes).
    unsafe { crate::runtime::call(ctx.form(form), args) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn low_level_host_arrays_take_their_sizes_from_the_call_and_the_info() {
        let none = |_| SpInfo::default();
        // DcsrqrBufferInfoHost(handle, m 5, n 4, nnz 9, descr, val, rowPtr, colInd, info, …).
        let args = [1, 5, 4, 9, 2, 0xa0, 0xb0, 0xc0, 0x77, 0xd0, 0xe0];
        assert_eq!(
            sp_host_arrays("cusolverSpDcsrqrBufferInfoHost", &args, &none),
            Some((8, vec![(5, 72), (6, 24), (7, 36)]))
        );
        // The workspace of Factor and Solve is what BufferInfoHost asked for this info.
        let info =
            |i| if i == 0x77 { SpInfo { workspace: 4096, cols: 4, ..SpInfo::default() } } else { SpInfo::default() };
        let factor = [1, 5, 4, 9, 0, 0, 0x77, 0xf0];
        assert_eq!(
            sp_host_arrays("cusolverSpDcsrqrFactorHost", &factor, &info),
            Some((6, vec![(4, 40), (5, 32), (7, 4096)]))
        );
        let solve = [1, 4, 0xb, 0xc, 0x77, 0xf0];
        assert_eq!(
            sp_host_arrays("cusolverSpZcsrcholSolveHost", &solve, &info),
            Some((4, vec![(2, 64), (3, 64), (5, 4096)]))
        );
        // A negative size is an empty array's 2^32 - 1 at worst, never a wrap.
        let analysis = [1, u64::MAX, 3, 2, 0xa, 0xb, 0x77];
        assert_eq!(
            sp_host_arrays("cusolverSpXcsrcholAnalysisHost", &analysis, &none).unwrap().1[0].1,
            (1u64 << 32) * 4
        );
        assert_eq!(sp_host_arrays("cusolverSpDcsrlsvluHost", &args, &none), None);
    }
}
