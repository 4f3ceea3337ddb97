//! cuFFT plans made as before answered by the client (issue 19: torch makes a plan for each
//! new transform shape, `cufftXtMakePlanMany` after `cufftCreate`, and waits for the work
//! size it returns: one round trip each at 70 ms, 6 in the torch suite's FFT case).
//!
//! A plan's work size depends on the transform (the values and size arrays the call passes),
//! the library and the GPU, and on what was set on the plan before it was made (its
//! properties, its GPUs, its work-area policy). The client follows each plan from its
//! create: a fingerprint of the calls made on it that may change how it is made (every
//! `cufft…Set…` but its stream and work area). A make-plan call on a plan with a
//! fingerprint is keyed by the call, its values and arrays, and that fingerprint; the
//! server's successful answer is kept (for later sessions on the same server identity too,
//! `crate::learned`), and the same question is answered by the client: the call still goes
//! to the server, without waiting (it makes the plan there), and its answer is compared
//! when it comes. A plan once made, or passed to a call the client does not know, is
//! followed no further.

use std::collections::HashMap;

use chidori_protocol::desc::{CallDesc, Wire};

use super::Prepared;
use super::kept::{Action, Part, combine, decode, give_checked, stored};
use crate::ahead::learned::Space;
use crate::state::CLIENT;

/// Answers kept (distinct transforms).
pub(crate) const ANSWERS_MAX: usize = 4096;
/// Plans followed (the oldest go first).
const PLANS_MAX: usize = 1 << 16;

/// What a call does to the plan it names first (found once per descriptor:
/// `crate::runtime::facts`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Role {
    /// Names no plan first (creates, the one-call plans, estimates, versions), or is no
    /// cuFFT call.
    #[default]
    None,
    /// Makes the plan: a question about how a plan set so is made.
    Make,
    /// Changes nothing that making the plan depends on (streams, work areas, transforms,
    /// sizes asked of a made plan, memory of a plan's GPUs).
    Keeps,
    /// Ends the plan (its handle may be given out again, as created).
    Destroys,
    /// May change how the plan is made: added to its fingerprint.
    Sets,
}

pub(crate) fn role(name: &str) -> Role {
    const NO_PLAN: &[&str] = &["cufftCreate", "cufftPlan", "cufftEstimate", "cufftGetVersion", "cufftGetProperty"];
    const KEEPS: &[&str] = &[
        "cufftSetStream",
        "cufftSetWorkArea",
        "cufftExec",
        "cufftXtExec",
        "cufftGetSize",
        "cufftXtGetSize",
        "cufftXtMalloc",
        "cufftXtFree",
        "cufftXtMemcpy",
    ];
    if NO_PLAN.iter().any(|p| name.starts_with(p)) {
        Role::None
    } else if name.starts_with("cufftMakePlan") || name.starts_with("cufftXtMakePlan") {
        Role::Make
    } else if name == "cufftDestroy" {
        Role::Destroys
    } else if KEEPS.iter().any(|p| name.starts_with(p)) {
        Role::Keeps
    } else {
        Role::Sets
    }
}

/// The fingerprint of a call's content, its first parameter (the plan) left out: its wire
/// id, its values, and the lengths and bytes of its inputs. None where it passes anything
/// else (a handle, a device address, a string).
fn content(desc: &CallDesc, args: &[u64], prepared: &Prepared) -> Option<u64> {
    super::kept::content(desc.wire, desc, args, prepared, Some(0), None, |_, _| Part::Usual)
}

/// What each plan says: `Some(fingerprint)` of the Sets since its create, `None` once it
/// was made or passed somewhere the client does not follow. A plan absent is not followed
/// (made by a one-call `cufftPlan…`, or before the map was last emptied).
fn with_plans<T>(f: impl FnOnce(&mut HashMap<u64, Option<u64>>) -> T) -> T {
    let mut guard = CLIENT.cufft_prints.lock();
    let plans = guard.get_or_insert_with(HashMap::new);
    if plans.len() > PLANS_MAX {
        plans.clear();
    }
    f(plans)
}

/// A plan was created (by the server or ahead of the program): as created.
pub fn created(plan: u64) {
    with_plans(|p| p.insert(plan, Some(CREATED)));
}

/// The fingerprint of a plan as created.
const CREATED: u64 = 1;

/// Before a cuFFT call is sent: answer a plan made as before, and follow what is set on
/// each plan.
pub(crate) fn before(desc: &'static CallDesc, args: &[u64], prepared: &Prepared) -> Action {
    let plan = args.first().copied().unwrap_or(0) as u32 as u64;
    match super::facts(desc).cufft {
        Role::None | Role::Keeps => Action::Send,
        Role::Destroys => {
            with_plans(|p| p.remove(&plan));
            Action::Send
        }
        Role::Sets => {
            let call = content(desc, args, prepared);
            with_plans(|p| {
                if let Some(print) = p.get_mut(&plan) {
                    *print = print.zip(call).map(|(before, c)| combine(before, c));
                }
            });
            Action::Send
        }
        Role::Make => {
            // Made (or refused) now: followed no further.
            let print = with_plans(|p| p.get_mut(&plan).and_then(Option::take));
            let outputs_only_bufs =
                desc.params.iter().all(|w| !matches!(w, Wire::OutHandle { .. } | Wire::Scalar { .. }));
            let Some(key) =
                print.zip(content(desc, args, prepared)).filter(|_| outputs_only_bufs).map(|(p, c)| combine(p, c))
            else {
                return Action::Send;
            };
            let Ok(conn) = crate::conn::get() else { return Action::Send };
            let known = CLIENT.ahead.cufft_plans.get(&key).or_else(|| {
                let kept =
                    crate::learned::with(&conn, |l| l.get(Space::CufftPlan, &stored(desc, key)).map(<[u8]>::to_vec));
                let answer = decode(&kept.flatten()?)?;
                CLIENT.ahead.cufft_plans.learn(key, answer.clone());
                Some(answer)
            });
            match known {
                // SAFETY: the caller's arguments, as the descriptor says.
                Some(answer) => match unsafe { give_checked(&conn, desc, args, prepared, answer, "another work size") }
                {
                    Some(status) => Action::Answered(status),
                    None => Action::Learn(key),
                },
                None => Action::Learn(key),
            }
        }
    }
}

/// After the server made a plan: keep a success (for later sessions too).
pub(crate) fn learn(key: u64, status: u64, desc: &CallDesc, prepared: &Prepared) {
    super::kept::learn(key, status, desc, prepared, &CLIENT.ahead.cufft_plans, Space::CufftPlan);
}

#[cfg(test)]
mod tests {
    use super::{Role, role};

    #[test]
    fn calls_are_told_by_what_they_do_to_the_plan() {
        for (name, want) in [
            ("cufftCreate", Role::None),
            ("cufftPlan1d", Role::None),
            ("cufftPlanMany", Role::None),
            ("cufftEstimateMany", Role::None),
            ("cufftGetProperty", Role::None),
            ("cufftXtMakePlanMany", Role::Make),
            ("cufftMakePlan1d", Role::Make),
            ("cufftMakePlanMany64", Role::Make),
            ("cufftSetStream", Role::Keeps),
            ("cufftSetWorkArea", Role::Keeps),
            ("cufftExecC2C", Role::Keeps),
            ("cufftXtExec", Role::Keeps),
            ("cufftGetSize", Role::Keeps),
            ("cufftDestroy", Role::Destroys),
            ("cufftSetAutoAllocation", Role::Sets),
            ("cufftSetPlanPropertyInt64", Role::Sets),
            ("cufftResetPlanProperty", Role::Sets),
            ("cufftXtSetGPUs", Role::Sets),
            ("cufftXtSetWorkAreaPolicy", Role::Sets),
            ("cufftXtSetCallback", Role::Sets),
        ] {
            assert_eq!(role(name), want, "{name}");
        }
    }
}
