//! cuFFT plans created ahead of the program. torch creates a plan (`cufftCreate`, one round
//! trip) for each new transform shape before making it; a plan not yet made is as good as
//! one created when asked, so plans are created ahead as streams are
//! (`crate::custom::streams`): from the second create in a row a few more in the same round
//! trip. What was set on each plan is followed from its create (`crate::runtime::cufft_plans`).
#![allow(clippy::missing_safety_doc)]

use std::ffi::c_void;

use chidori_protocol::desc::{Ctx, Form};

use crate::state::CLIENT;

pub unsafe fn create(ctx: &Ctx, handle: *mut c_void) -> u32 {
    let desc = ctx.form(Form::Call);
    let device = crate::state::current_device();
    let args = [handle as u64];
    // SAFETY: the caller's out-pointer of one cufftHandle (an int).
    let status = unsafe { super::streams::create_ahead(desc, &args, &CLIENT.ahead.cufft_pool, |c| c, device, 4) };
    if status as u64 == crate::runtime::success(desc) && !handle.is_null() {
        // SAFETY: the caller's out-pointer, written by the create that succeeded.
        crate::runtime::cufft_plans::created(u64::from(unsafe { std::ptr::read_unaligned(handle as *const u32) }));
    }
    status
}
