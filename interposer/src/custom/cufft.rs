//! cuFFT plans created ahead of the program. torch creates a plan (`cufftCreate`, one round
//! trip) for each new transform shape before making it; a plan not yet made is as good as
//! one created when asked, so from the second create in a row a few more are created in the
//! same round trip (a plan is an `int`, too narrow for a name the client gives, as streams
//! and events have). The first create of a process makes as many as the last run of the
//! same command created (at most [`crate::ahead::BATCH_MAX`], learned per server identity),
//! so a program that creates a few plans waits once. What was set on each plan is followed
//! from its create (`crate::runtime::cufft_plans`).
#![allow(clippy::missing_safety_doc)]

use std::ffi::c_void;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};

use sha2::{Digest, Sha256};

use chidori_protocol::desc::{CallDesc, Ctx, Form};

use crate::ahead::BATCH_MAX;
use crate::ahead::learned::Space;
use crate::state::CLIENT;

pub unsafe fn create(ctx: &Ctx, handle: *mut c_void) -> u32 {
    let desc = ctx.form(Form::Call);
    let args = [handle as u64];
    // SAFETY: the caller's out-pointer of one cufftHandle (an int).
    let status = unsafe { create_ahead(desc, &args) };
    if status as u64 == crate::runtime::success(desc) && !handle.is_null() {
        // SAFETY: the caller's out-pointer, written by the create that succeeded.
        crate::runtime::cufft_plans::created(u64::from(unsafe { std::ptr::read_unaligned(handle as *const u32) }));
        created_one();
    }
    status
}

/// Plans this process created (past [`BATCH_MAX`] no longer counted).
static CREATED: AtomicUsize = AtomicUsize::new(0);

/// The learned store's key of this command's plan creates.
fn creates_key() -> &'static [u8] {
    static KEY: OnceLock<Vec<u8>> = OnceLock::new();
    KEY.get_or_init(|| {
        let mut key = b"cufftCreate\0".to_vec();
        key.extend_from_slice(&Sha256::digest(crate::state::command_line())[..16]);
        key
    })
}

/// A plan was created: learn how many this command creates, up to [`BATCH_MAX`].
fn created_one() {
    let n = CREATED.fetch_add(1, Ordering::Relaxed) + 1;
    if !(2..=BATCH_MAX).contains(&n) {
        return;
    }
    let Ok(conn) = crate::conn::get() else { return };
    crate::learned::with(&conn, |l| {
        let known = l.get(Space::Creates, creates_key()).and_then(|v| v.first().copied()).unwrap_or(0);
        if usize::from(known) < n {
            l.learn(Space::Creates, creates_key(), &[n as u8]);
        }
    });
}

/// How many plans the last run of this command created (its first create makes them all).
fn learned_creates() -> usize {
    let Ok(conn) = crate::conn::get() else { return 1 };
    let n = crate::learned::with(&conn, |l| l.get(Space::Creates, creates_key()).and_then(|v| v.first().copied()));
    n.flatten().map_or(1, |n| usize::from(n).clamp(1, BATCH_MAX))
}

/// Create a plan through `desc` with `args` (the out-pointer): from the pool where it holds
/// one made ahead for the current context, else asked, and from the second miss on the
/// current device in a row with a few more made in the same round trip (2, 4, then 8 at
/// most) for the next creates; the process's first with as many as the last run of the
/// command created. Nothing is made ahead while a capture is active or where the
/// context is not known. Plans made ahead and never asked for stay on the server until the
/// session ends (at most 7); a context reset or destroy drops them
/// (`crate::custom::streams::forget`).
///
/// # Safety
/// `args` are the caller's, as `desc` takes them.
unsafe fn create_ahead(desc: &'static CallDesc, args: &[u64]) -> u32 {
    let pool = &CLIENT.ahead.cufft_pool;
    let unavailable = crate::runtime::unavailable(desc) as u32;
    crate::guard::ffi(desc.name, unavailable, || {
        let out = args.first().copied().unwrap_or(0);
        if out == 0 || crate::custom::capture::any_active() {
            // SAFETY: the caller's arguments (a null out-pointer is the server's to refuse).
            return unsafe { crate::runtime::call(desc, args) } as u32;
        }
        let context = crate::custom::context::cached_current();
        if let Some(ctx) = context
            && let Some(made) = pool.take(&ctx)
        {
            crate::trace::local(desc.name);
            // SAFETY: the caller's out-pointer, checked non-null, of one cufftHandle (an int).
            unsafe { std::ptr::write_unaligned(out as *mut u32, made as u32) };
            return desc.codes.success as u32;
        }
        let mut wanted = pool.missed(crate::state::current_device());
        if CREATED.load(Ordering::Relaxed) == 0 {
            wanted = wanted.max(learned_creates());
        }
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
            pool.add(ctx, made);
        }
        status as u32
    })
}
