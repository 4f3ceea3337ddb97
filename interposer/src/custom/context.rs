//! Primary-context state, cached on the client once the server reports the context active
//! (torch's `hasPrimaryContext` asks before many operations). Resets and flag changes go
//! to the server and drop the cache.
#![allow(non_snake_case, clippy::missing_safety_doc)]

use std::cell::Cell;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use chidori_cuda::calls::{cudart, driver};
use chidori_protocol::desc::{CallDesc, Ctx, Form};

use crate::conn::{Conn, Slot};
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
static PRIMARY: Mutex<Vec<(i32, u64, u64)>> = Mutex::new(Vec::new());

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

/// Questions every program asks once, sent as its connection is made, before its first
/// call: what the program does between connecting and asking hides their round trip, and
/// at worst the three share one (torch asks them right after connecting). They run on the
/// connecting thread's fresh executor, where device 0's primary context is current: its
/// state, that context (every untouched thread's on device 0), and device 0's stream
/// priorities. An answer holds while no context call was made since (the generation).
struct Early {
    forks: u64,
    generation: u64,
    primary: Answer,
    current: Answer,
    priorities: Answer,
}

static EARLY: Mutex<Option<Early>> = Mutex::new(None);

/// A call sent ahead into output bytes of its own.
enum Answer {
    None,
    /// Sent: its slot, and the address of its 16 output bytes (leaked, since the reply
    /// may land at any time).
    Asked(Arc<Slot>, usize),
    /// The raw status and the output bytes.
    Came(u64, [u8; 16]),
}

impl Answer {
    /// Send `desc` with the arguments `args` makes of the output bytes' address.
    fn ask(conn: &Conn, desc: &'static CallDesc, args: impl FnOnce(u64) -> Vec<u64>) -> Answer {
        let bytes: &'static mut [u8; 16] = Box::leak(Box::new([0u8; 16]));
        let at = bytes.as_mut_ptr() as u64;
        // SAFETY: every output of these calls points into the 16 leaked bytes (4 or 8 each),
        // valid for as long as the process lives.
        match unsafe { crate::runtime::send_checked(conn, desc, &args(at)) } {
            Some(slot) => Answer::Asked(slot, at as usize),
            None => Answer::None,
        }
    }

    /// Whether the answer is here (or there is none to wait for).
    fn came(&self) -> bool {
        match self {
            Answer::Asked(slot, _) => slot.ready_within(std::time::Duration::ZERO),
            _ => true,
        }
    }

    /// The status and the output bytes, waited for where they have not come (never longer
    /// than the call itself would have taken). None: no answer (a lost connection).
    fn take(&mut self) -> Option<(u64, [u8; 16])> {
        if let Answer::Asked(slot, at) = self {
            *self = match slot.wait() {
                // SAFETY: the slot completed: the reply's outputs have landed in the 16
                // bytes at `at`, which nothing writes any more.
                Ok(ret) => Answer::Came(ret, unsafe { std::ptr::read(*at as *const [u8; 16]) }),
                Err(_) => Answer::None,
            };
        }
        match self {
            Answer::Came(ret, bytes) => Some((*ret, *bytes)),
            _ => None,
        }
    }
}

fn word<const N: usize>(bytes: &[u8; 16], at: usize) -> [u8; N] {
    let mut out = [0u8; N];
    out.copy_from_slice(&bytes[at..at + N]);
    out
}

/// Send the questions of [`Early`] on a new connection (`super::connected`).
pub(super) fn ask_early(conn: &Conn) {
    let early = Early {
        forks: crate::conn::forks(),
        generation: GENERATION.load(Ordering::Relaxed),
        primary: Answer::ask(conn, &driver::cuDevicePrimaryCtxGetState__call, |at| vec![0, at, at + 4]),
        current: Answer::ask(conn, &driver::cuCtxGetCurrent__call, |at| vec![at]),
        priorities: Answer::ask(conn, &cudart::cudaDeviceGetStreamPriorityRange__call, |at| vec![at, at + 4]),
    };
    *EARLY.lock().unwrap_or_else(|p| p.into_inner()) = Some(early);
}

/// One of [`Early`]'s answers: the status and outputs of `which`, where it was asked in
/// this process and, unless `any_generation`, no context call was made since.
fn early(which: fn(&mut Early) -> &mut Answer, any_generation: bool) -> Option<(u64, [u8; 16])> {
    let mut slot = EARLY.lock().unwrap_or_else(|p| p.into_inner());
    let e = slot.as_mut().filter(|e| e.forks == crate::conn::forks())?;
    if !any_generation && e.generation != GENERATION.load(Ordering::Relaxed) {
        return None;
    }
    // The three came back together: the first use takes them all, and the trace counts a
    // round trip where it waited for them (a program asking right after it connected).
    let answers = [&e.primary, &e.current, &e.priorities];
    if answers.iter().any(|a| matches!(a, Answer::Asked(..))) {
        let start = std::time::Instant::now();
        let came = answers.iter().all(|a| a.came());
        for a in [&mut e.primary, &mut e.current, &mut e.priorities] {
            a.take();
        }
        crate::trace::bytes("(asked at connection)", u64::from(!came), 0, 0, start.elapsed());
    }
    which(e).take()
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
        if dev == 0 && CLIENT.primary.get(&0).is_none() {
            // Asked as the connection was made: kept where the context was active (an
            // inactive one may become active by any call).
            if let Some((ret, bytes)) = early(|e| &mut e.primary, false)
                && ret == u64::from(SUCCESS)
                && i32::from_le_bytes(word(&bytes, 4)) == 1
            {
                CLIENT.primary.insert(0, u32::from_le_bytes(word(&bytes, 0)));
            }
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
            primary_seen(device, generation).or_else(|| early_primary_context(device, generation))
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

/// Device 0's primary context as the connection's early question found it current on a
/// fresh executor ([`Early`]), while no context call was made since; seen from now on.
fn early_primary_context(device: i32, generation: u64) -> Option<u64> {
    if device != 0 {
        return None;
    }
    let (ret, bytes) = early(|e| &mut e.current, false)?;
    let ctx = u64::from_le_bytes(word(&bytes, 0));
    (ret == u64::from(SUCCESS) && ctx != 0).then(|| {
        see_primary(0, generation, ctx);
        ctx
    })
}

/// cudaDeviceGetStreamPriorityRange: a device's range never changes. Device 0's was asked
/// as the connection was made ([`Early`]); another device's is asked once.
pub unsafe fn stream_priority_range(ctx: &Ctx, least: *mut c_void, greatest: *mut c_void) -> u32 {
    crate::guard::ffi(ctx.name, INVALID_VALUE, || {
        let device = crate::state::current_device();
        let mut range = CLIENT.stream_priorities.get(&device);
        if range.is_none()
            && device == 0
            && let Some((ret, bytes)) = early(|e| &mut e.priorities, true)
            && ret == u64::from(SUCCESS)
        {
            let r = [i32::from_le_bytes(word(&bytes, 0)), i32::from_le_bytes(word(&bytes, 4))];
            CLIENT.stream_priorities.insert(0, r);
            range = Some(r);
        }
        let range = match range {
            Some(r) => {
                crate::trace::local(ctx.name);
                r
            }
            None => {
                let mut both = [0i32; 2];
                let args = [both.as_mut_ptr() as u64, both.as_mut_ptr().wrapping_add(1) as u64];
                // SAFETY: two ints of this frame.
                let s = unsafe { crate::runtime::call(ctx.form(Form::Call), &args) } as u32;
                if s != SUCCESS {
                    return s;
                }
                CLIENT.stream_priorities.insert(device, both);
                both
            }
        };
        // SAFETY: the caller's ints, each optional (NULL: not wanted).
        unsafe {
            if !least.is_null() {
                std::ptr::write_unaligned(least as *mut i32, range[0]);
            }
            if !greatest.is_null() {
                std::ptr::write_unaligned(greatest as *mut i32, range[1]);
            }
        }
        SUCCESS
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
