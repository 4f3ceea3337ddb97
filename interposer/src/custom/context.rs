//! Primary-context state, cached on the client once the server reports the context active
//! (torch's `hasPrimaryContext` asks before many operations). Resets and flag changes go
//! to the server and drop the cache.
#![allow(non_snake_case, clippy::missing_safety_doc)]

use std::cell::Cell;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};

use chidori_cuda::calls::{cudart, driver};
use chidori_protocol::desc::{CallDesc, Ctx, Form};

use crate::state::CLIENT;

/// CUDA_SUCCESS and CUDA_ERROR_INVALID_VALUE; cudaSuccess and cudaErrorInvalidValue, for the
/// runtime's calls here, are the same numbers.
const SUCCESS: u32 = chidori_cuda::consts::cudaError_enum::CUDA_SUCCESS;
const INVALID_VALUE: u32 = chidori_cuda::consts::cudaError_enum::CUDA_ERROR_INVALID_VALUE;
const _: () = assert!(
    SUCCESS == chidori_cuda::consts::cudaError::cudaSuccess
        && INVALID_VALUE == chidori_cuda::consts::cudaError::cudaErrorInvalidValue
);

/// Bumped by every call that may change which context a thread has current.
static GENERATION: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// (generation, device, context) of this thread's last cuCtxGetCurrent answer.
    static CURRENT: Cell<(u64, i32, u64)> = const { Cell::new((0, 0, 0)) };
    /// The fork count under which this thread made a call that may change its current
    /// context (a forked child's session starts its threads anew).
    static TOUCHED: Cell<Option<u64>> = const { Cell::new(None) };
}

/// Whether the calling thread never made a call that may change its current context. Its
/// executor on the server then has its device's primary context current: the worker makes
/// it current as the thread starts, and cudaSetDevice makes the new device's current.
fn untouched() -> bool {
    TOUCHED.with(Cell::get) != Some(crate::conn::forks())
}

/// Each device's primary context with the generation it was seen in, as the server
/// answered an untouched thread: another untouched thread's answer while no context call
/// intervened.
static PRIMARY: std::sync::Mutex<Vec<(i32, u64, u64)>> = std::sync::Mutex::new(Vec::new());

fn primary_seen(device: i32, generation: u64) -> Option<u64> {
    let seen = PRIMARY.lock().unwrap_or_else(|p| p.into_inner());
    seen.iter().find(|&&(d, g, _)| d == device && g == generation).map(|&(_, _, ctx)| ctx)
}

fn see_primary(device: i32, generation: u64, ctx: u64) {
    let mut seen = PRIMARY.lock().unwrap_or_else(|p| p.into_inner());
    seen.retain(|&(d, g, _)| d != device && g == generation);
    seen.push((device, generation, ctx));
}

fn forget() {
    CLIENT.primary.clear();
    GENERATION.fetch_add(1, Ordering::Relaxed);
}

/// Forward a call that changes primary contexts, then drop the cache.
fn changing(name: &'static str, desc: &'static CallDesc, args: &[u64], runtime: bool) -> u32 {
    crate::guard::ffi(name, INVALID_VALUE, || {
        TOUCHED.with(|t| t.set(Some(crate::conn::forks())));
        forget();
        // SAFETY: values only.
        let s = unsafe { crate::runtime::call(desc, args) } as u32;
        forget();
        if runtime {
            crate::state::set_last_error(s);
        }
        s
    })
}

/// Calls that change the current or primary context, sent as they are (`raw_args`):
/// cuCtxSetCurrent, cuCtxPushCurrent_v2, cuCtxPopCurrent_v2, cuDevicePrimaryCtxSetFlags(_v2)
/// and cudaSetDeviceFlags; the client's caches go.
pub unsafe fn changing_raw(ctx: &Ctx, args: &[u64]) -> u64 {
    u64::from(changing(ctx.name, ctx.form(Form::Call), args, ctx.library == "cudart"))
}

pub unsafe fn cuDevicePrimaryCtxGetState(dev: i32, flags: *mut c_void, active: *mut c_void) -> u32 {
    crate::guard::ffi("cuDevicePrimaryCtxGetState", INVALID_VALUE, || {
        crate::trace::local("cuDevicePrimaryCtxGetState");
        if flags.is_null() || active.is_null() {
            return INVALID_VALUE;
        }
        let cached = CLIENT.primary.get(&dev);
        if let Some(f) = cached {
            // SAFETY: the caller's unsigned int and int, checked non-null.
            unsafe {
                std::ptr::write_unaligned(flags as *mut u32, f);
                std::ptr::write_unaligned(active as *mut i32, 1);
            }
            return SUCCESS;
        }
        let args = [dev as u32 as u64, flags as u64, active as u64];
        // SAFETY: the caller's out-pointers, checked non-null.
        let s = unsafe { crate::runtime::call(&driver::cuDevicePrimaryCtxGetState__call, &args) } as u32;
        // SAFETY: written by the reply.
        let (f, a) =
            unsafe { (std::ptr::read_unaligned(flags as *const u32), std::ptr::read_unaligned(active as *const i32)) };
        if s == SUCCESS && a == 1 {
            CLIENT.primary.insert(dev, f);
        }
        s
    })
}

/// cuDevicePrimaryCtxReset and its `_v2`: the server's streams of that device go.
pub unsafe fn primary_reset(ctx: &Ctx, dev: i32) -> u32 {
    crate::custom::streams::forget();
    crate::custom::export::context_ends(None, Some(dev));
    let s = changing(ctx.name, ctx.form(Form::Call), &[dev as u32 as u64], false);
    if s == SUCCESS {
        crate::custom::placed::device_reset(dev);
    }
    s
}

pub unsafe fn cudaDeviceReset() -> u32 {
    crate::custom::streams::forget();
    let s = changing("cudaDeviceReset", &cudart::cudaDeviceReset__call, &[], true);
    if s == SUCCESS {
        crate::custom::placed::device_reset(crate::state::current_device());
    }
    s
}

/// cuCtxGetCurrent: answered from this thread's cache while no context call intervened
/// and the runtime's current device is the same; on a thread that never changed its
/// context, with the device's primary context another such thread was answered (torch's
/// autograd thread asks as it starts).
pub unsafe fn cuCtxGetCurrent(pctx: *mut c_void) -> u32 {
    crate::guard::ffi("cuCtxGetCurrent", INVALID_VALUE, || {
        crate::trace::local("cuCtxGetCurrent");
        if pctx.is_null() {
            return INVALID_VALUE;
        }
        let generation = GENERATION.load(Ordering::Relaxed);
        let device = crate::state::current_device();
        let (g, d, ctx) = CURRENT.with(Cell::get);
        let untouched = untouched();
        let known = if g == generation && d == device && ctx != 0 {
            Some(ctx)
        } else if untouched {
            primary_seen(device, generation)
        } else {
            None
        };
        if let Some(ctx) = known {
            // SAFETY: the caller's CUcontext*, checked non-null.
            unsafe { std::ptr::write_unaligned(pctx as *mut u64, ctx) };
            CURRENT.with(|c| c.set((generation, device, ctx)));
            return SUCCESS;
        }
        // SAFETY: as above.
        let s = unsafe { crate::runtime::call(&driver::cuCtxGetCurrent__call, &[pctx as u64]) } as u32;
        // SAFETY: written by the reply.
        let ctx = unsafe { std::ptr::read_unaligned(pctx as *const u64) };
        if s == SUCCESS && ctx != 0 {
            CURRENT.with(|c| c.set((generation, device, ctx)));
            if untouched {
                see_primary(device, generation, ctx);
            }
        }
        s
    })
}

/// This thread's current context, where the last cuCtxGetCurrent answer still holds.
pub fn cached_current() -> Option<u64> {
    let generation = GENERATION.load(Ordering::Relaxed);
    let device = crate::state::current_device();
    let (g, d, ctx) = CURRENT.with(Cell::get);
    (g == generation && d == device && ctx != 0).then_some(ctx)
}

/// This thread's current context, asked of the server unless cached.
pub fn current() -> Option<u64> {
    let mut ctx = 0u64;
    // SAFETY: a CUcontext* of this frame.
    let s = unsafe { cuCtxGetCurrent(&mut ctx as *mut u64 as *mut c_void) };
    (s == SUCCESS && ctx != 0).then_some(ctx)
}

pub unsafe fn cuCtxDestroy_v2(ctx: *mut c_void) -> u32 {
    crate::custom::streams::forget();
    if !ctx.is_null() {
        crate::custom::export::context_ends(Some(ctx as u64), None);
    }
    changing("cuCtxDestroy_v2", &driver::cuCtxDestroy_v2__call, &[ctx as u64], false)
}

/// cuCtxCreate_v2: a new context becomes current.
pub unsafe fn cuCtxCreate_v2(pctx: *mut c_void, flags: u32, dev: i32) -> u32 {
    let args = [pctx as u64, u64::from(flags), dev as u32 as u64];
    changing("cuCtxCreate_v2", &driver::cuCtxCreate_v2__call, &args, false)
}

/// cuCtxCreate_v3: with execution-affinity parameters.
pub unsafe fn cuCtxCreate_v3(pctx: *mut c_void, params: *mut c_void, count: i32, flags: u32, dev: i32) -> u32 {
    let args = [pctx as u64, params as u64, count as u32 as u64, u64::from(flags), dev as u32 as u64];
    changing("cuCtxCreate_v3", &driver::cuCtxCreate_v3__call, &args, false)
}

/// CUDA_ERROR_NOT_SUPPORTED.
const DRIVER_NOT_SUPPORTED: u32 = chidori_cuda::consts::cudaError_enum::CUDA_ERROR_NOT_SUPPORTED;

/// cuCtxCreate_v4, CUDA 13's context creation: CUctxCreateParams holds an array of
/// execution-affinity parameters (@0, their count @8) and CUDA-in-graphics parameters
/// (@16). Sent as cuCtxCreate_v3 (with affinity) or cuCtxCreate_v2; CUDA in graphics is
/// graphics interop, which answers not supported.
pub unsafe fn cuCtxCreate_v4(pctx: *mut c_void, params: *mut c_void, flags: u32, dev: i32) -> u32 {
    if params.is_null() {
        // SAFETY: same contract.
        return unsafe { cuCtxCreate_v2(pctx, flags, dev) };
    }
    // SAFETY: the caller's CUctxCreateParams (24 bytes).
    let (affinity, count, cig) = unsafe {
        let p = params as *const u8;
        (
            std::ptr::read_unaligned(p as *const u64),
            std::ptr::read_unaligned(p.add(8) as *const i32),
            std::ptr::read_unaligned(p.add(16) as *const u64),
        )
    };
    if cig != 0 {
        crate::log::once("cuCtxCreate_v4-cig", || {
            tracing::warn!(
                "cuCtxCreate_v4 with CUDA-in-graphics parameters is graphics interop: not supported by Chidori"
            )
        });
        return DRIVER_NOT_SUPPORTED;
    }
    if count > 0 && affinity != 0 {
        // SAFETY: the caller's array of `count` affinity parameters.
        return unsafe { cuCtxCreate_v3(pctx, affinity as *mut c_void, count, flags, dev) };
    }
    // SAFETY: same contract.
    unsafe { cuCtxCreate_v2(pctx, flags, dev) }
}
