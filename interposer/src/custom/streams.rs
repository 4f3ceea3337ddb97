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
#![allow(non_snake_case, clippy::missing_safety_doc)]

use std::ffi::c_void;

use chidori_cuda::calls::cudart;

use crate::state::CLIENT;

/// A context was reset or destroyed: its streams are gone, and so are those made ahead
/// (and its events, whose handles the server may give out again).
pub fn forget() {
    CLIENT.ahead.streams.clear();
    CLIENT.ahead.events.forget_all();
}

pub unsafe fn cudaStreamCreateWithPriority(pStream: *mut c_void, flags: u32, priority: i32) -> u32 {
    let desc = &cudart::cudaStreamCreateWithPriority__call;
    let unavailable = crate::runtime::unavailable(desc) as u32;
    crate::guard::ffi("cudaStreamCreateWithPriority", unavailable, || {
        let args = [pStream as u64, u64::from(flags), priority as i64 as u64];
        if pStream.is_null() || crate::custom::capture::any_active() {
            // SAFETY: the caller's arguments (a null out-pointer is the server's to refuse).
            return unsafe { crate::runtime::call(desc, &args) } as u32;
        }
        let device = crate::state::current_device();
        let context = crate::custom::context::cached_current();
        if let Some(ctx) = context
            && let Some(stream) = CLIENT.ahead.streams.take(&(ctx, flags, priority))
        {
            crate::trace::local("cudaStreamCreateWithPriority");
            // SAFETY: the caller's cudaStream_t*, checked non-null.
            unsafe { std::ptr::write_unaligned(pStream as *mut u64, stream) };
            return 0;
        }
        let wanted = CLIENT.ahead.streams.missed((device, flags, priority));
        // Ahead only where the context is known: the streams go to creates in the same one.
        let n = match context.or_else(|| (wanted > 1).then(crate::custom::context::current).flatten()) {
            Some(_) => wanted,
            None => 1,
        };
        if n == 1 {
            // SAFETY: as above.
            return unsafe { crate::runtime::call(desc, &args) } as u32;
        }
        let Ok(conn) = crate::conn::get() else { return unavailable };
        let mut extra = vec![0u64; n - 1];
        let mut lists = vec![args];
        lists.extend(extra.iter_mut().map(|slot| [slot as *mut u64 as u64, u64::from(flags), priority as i64 as u64]));
        let calls: Vec<_> = lists.iter().map(|a| (desc, &a[..])).collect();
        // SAFETY: each call's out-pointer is the caller's or a slot of `extra`, alive until
        // every reply has landed.
        let Some((status, statuses)) = (unsafe { crate::runtime::call_with_riders(&conn, &calls, desc.name) }) else {
            return unavailable;
        };
        crate::runtime::note_status(desc, status);
        let status = status as u32;
        if status == 0
            && let Some(ctx) = crate::custom::context::cached_current()
        {
            let made = statuses[1..].iter().zip(&extra).filter(|(s, h)| **s == 0 && **h != 0).map(|(_, h)| *h);
            CLIENT.ahead.streams.add((ctx, flags, priority), made);
        }
        status
    })
}
