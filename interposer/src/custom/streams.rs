//! Streams created ahead of the program. torch fills its stream pools lazily, the first
//! time a program asks for a side stream: 32 `cudaStreamCreateWithPriority` per priority
//! level, 128 round trips in a row, 9 s at 70 ms. A stream the program has not asked for
//! yet is as good as one made when it asks (new, empty, of the flags and priority it was
//! made with, in the context current at the time), so from the second create of one kind
//! in a row the client asks the server for a few more in the same round trip (2, 4, then 8
//! at most) and answers the next creates of that kind from them. Kinds are keyed by the
//! calling thread's current context as well, and nothing is created ahead while a capture
//! is active. Streams made ahead and never asked for stay on the server until the session
//! ends (at most 7 per kind: torch's 32 per level leave 7); a context reset or destroy
//! drops them, as it destroys them. The schedule and the pool are `crate::ahead::Pool`.
//! Events are made ahead the same way (torch makes one per Python event object), by flags;
//! interprocess events are not.
#![allow(non_snake_case, clippy::missing_safety_doc)]

use std::ffi::c_void;

use std::hash::Hash;

use chidori_cuda::calls::cudart;
use chidori_protocol::desc::CallDesc;

use crate::ahead::Pool;
use crate::state::CLIENT;

/// A context was reset or destroyed: its streams are gone, and so are those made ahead
/// (and its events, whose handles the server may give out again).
pub fn forget() {
    CLIENT.ahead.streams.clear();
    CLIENT.ahead.event_pool.clear();
    CLIENT.ahead.cufft_pool.clear();
    CLIENT.ahead.events.context_ended();
}

pub unsafe fn cudaStreamCreateWithPriority(pStream: *mut c_void, flags: u32, priority: i32) -> u32 {
    let desc = &cudart::cudaStreamCreateWithPriority__call;
    let args = [pStream as u64, u64::from(flags), priority as i64 as u64];
    let device = crate::state::current_device();
    // SAFETY: the caller's arguments, as cudaStreamCreateWithPriority takes them.
    unsafe {
        create_ahead(desc, &args, &CLIENT.ahead.streams, |ctx| (ctx, flags, priority), (device, flags, priority), 8)
    }
}

/// cudaEventCreate, cudaEventCreateWithFlags and cuEventCreate (`raw_args`: the out-pointer,
/// then the flags where the call takes them). torch makes one event per Python event object
/// (`torch.cuda.Event`, its record); a fresh event is as good as one made when asked, so
/// events are made ahead as streams are. Interprocess events are not (another process may
/// hold one).
///
/// # Safety
/// The caller's out-pointer, as the call takes it.
pub unsafe fn event_create_raw(ctx: &chidori_protocol::desc::Ctx, args: &[u64]) -> u64 {
    let desc = ctx.form(chidori_protocol::desc::Form::Call);
    let flags = args.get(1).copied().unwrap_or(0) as u32;
    let out = args.first().copied().unwrap_or(0);
    let status = if flags & INTERPROCESS != 0 {
        // SAFETY: the caller's arguments.
        unsafe { crate::runtime::call(desc, args) }
    } else {
        let device = crate::state::current_device();
        // SAFETY: the caller's arguments.
        u64::from(unsafe { create_ahead(desc, args, &CLIENT.ahead.event_pool, |ctx| (ctx, flags), (device, flags), 8) })
    };
    if status == crate::runtime::success(desc) && out != 0 {
        // SAFETY: the caller's out-pointer, written by the create that succeeded.
        CLIENT.ahead.events.created(unsafe { std::ptr::read_unaligned(out as *const u64) });
    }
    status
}

/// CU_EVENT_INTERPROCESS (cudaEventInterprocess, a macro of the runtime's header, is the
/// same value).
const INTERPROCESS: u32 = chidori_cuda::consts::CUevent_flags_enum::CU_EVENT_INTERPROCESS;

/// Create an object through `desc` with `args` (its out-pointer first, the rest the same
/// for every object of its kind): from `pool` where it holds one made ahead for the
/// current context (`key` of the context), else asked, and from the second miss of `miss`
/// in a row with a few more made in the same round trip (2, 4, then 8 at most) for the
/// next creates of that kind. Nothing is made ahead while a capture is active or where the
/// context is not known. The object is a handle of `bytes` bytes (8: a pointer; 4: an int,
/// cuFFT's plans).
///
/// # Safety
/// `args` are the caller's, as `desc` takes them.
pub(crate) unsafe fn create_ahead<K: Eq + Hash + Clone, M: Eq + Hash>(
    desc: &'static CallDesc,
    args: &[u64],
    pool: &Pool<K, M>,
    key: impl Fn(u64) -> K,
    miss: M,
    bytes: usize,
) -> u32 {
    let unavailable = crate::runtime::unavailable(desc) as u32;
    crate::guard::ffi(desc.name, unavailable, || {
        let out = args.first().copied().unwrap_or(0);
        if out == 0 || crate::custom::capture::any_active() {
            // SAFETY: the caller's arguments (a null out-pointer is the server's to refuse).
            return unsafe { crate::runtime::call(desc, args) } as u32;
        }
        let context = crate::custom::context::cached_current();
        if let Some(ctx) = context
            && let Some(made) = pool.take(&key(ctx))
        {
            crate::trace::local(desc.name);
            // SAFETY: the caller's out-pointer, checked non-null, of a handle of `bytes` bytes.
            unsafe {
                match bytes {
                    4 => std::ptr::write_unaligned(out as *mut u32, made as u32),
                    _ => std::ptr::write_unaligned(out as *mut u64, made),
                }
            }
            return desc.codes.success as u32;
        }
        let wanted = pool.missed(miss);
        // Ahead only where the context is known: the objects go to creates in the same one.
        let n = match context.or_else(|| (wanted > 1).then(crate::custom::context::current).flatten()) {
            Some(_) => wanted,
            None => 1,
        };
        if n == 1 {
            // SAFETY: as above.
            return unsafe { crate::runtime::call(desc, args) } as u32;
        }
        let Ok(conn) = crate::conn::get() else { return unavailable };
        let mut extra = vec![0u64; n - 1];
        let mut lists = vec![args.to_vec()];
        lists.extend(extra.iter_mut().map(|slot| {
            let mut a = args.to_vec();
            a[0] = slot as *mut u64 as u64;
            a
        }));
        let calls: Vec<_> = lists.iter().map(|a| (desc, &a[..])).collect();
        // SAFETY: each call's out-pointer is the caller's or a slot of `extra`, alive until
        // every reply has landed.
        let Some((status, statuses)) = (unsafe { crate::runtime::call_with_riders(&conn, &calls, desc.name) }) else {
            return unavailable;
        };
        crate::runtime::note_status(desc, status);
        if status == crate::runtime::success(desc)
            && let Some(ctx) = crate::custom::context::cached_current()
        {
            let made = statuses[1..].iter().zip(&extra).filter(|(s, h)| **s == 0 && **h != 0).map(|(_, h)| *h);
            pool.add(key(ctx), made);
        }
        status as u32
    })
}
