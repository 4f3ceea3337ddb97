//! cuSOLVER's dense workspace queries answered by the client when the same question was
//! answered before (issue 19: torch asks `cusolverDn…_bufferSize` before every
//! factorization, one round trip each at 70 ms: 8 of the torch suite's linalg case).
//!
//! A workspace size depends on the problem (the call's values), the library and the GPU,
//! and on the objects the call passes: the library's context (its deterministic mode), a
//! `cusolverDnParams` (its algorithm options) or a Jacobi solver's `syevjInfo`/`gesvdjInfo`
//! (tolerance, sweeps, sorting). The client follows each such object from its create: a
//! fingerprint of every `Set` call made on it, in order (but a context's stream). A query
//! whose objects all have fingerprints is keyed by the call, its values (device addresses
//! by their alignment) and those fingerprints, not the objects' names; the server's successful
//! answer is kept, and the same question in this process is answered by the client. Kept
//! for later sessions on the same server identity too (`crate::learned`): given at once
//! there, and checked against the server's answer to the same call. Like cuDNN's sizes,
//! a question does not say which GPU a context was made on.

use std::collections::HashMap;

use chidori_cuda::handles::kind;
use chidori_protocol::desc::{CallDesc, Wire};

use super::Prepared;
use super::kept::{Action, Part, alignment, combine};
use crate::ahead::learned::Space;
use crate::state::CLIENT;

/// Answers kept (distinct questions: a few per matrix shape).
pub(crate) const ANSWERS_MAX: usize = 4096;
/// Objects followed: past this, no question about a set object is answered (a name given
/// out again after the map was emptied would look as created).
const OBJECTS_MAX: usize = 1 << 16;
/// The fingerprint of an object as created: nothing set yet.
const CREATED: u64 = 1;

/// Objects a workspace size may depend on.
fn followed(k: u16) -> bool {
    k == kind::cusolverDnContext || k == kind::cusolverDnParams || k == kind::syevjInfo || k == kind::gesvdjInfo
}

/// What a cuSOLVER call is to the sizes followed here (found once per descriptor:
/// `crate::runtime::facts`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Role {
    /// Changes nothing a size depends on (a computation, a getter, a stream set), or is no
    /// cuSOLVER call.
    #[default]
    Keeps,
    /// A dense workspace query (`cusolverDn…_bufferSize`) whose outputs are plain buffers.
    Query,
    /// Ends the first object it passes.
    Destroys,
    /// Sets something on the first object it passes: added to its fingerprint.
    Sets,
}

pub(crate) fn role(desc: &CallDesc) -> Role {
    let name = desc.name;
    let outputs_only_bufs = desc.params.iter().all(|w| !matches!(w, Wire::OutHandle { .. } | Wire::Scalar { .. }));
    if name.starts_with("cusolverDn") && name.ends_with("_bufferSize") && desc.waits() && outputs_only_bufs {
        Role::Query
    } else if name.contains("Destroy") {
        Role::Destroys
    } else if name.contains("Set") && name != "cusolverDnSetStream" {
        Role::Sets
    } else {
        Role::Keeps
    }
}

/// What each followed object says: `Some(fingerprint)` of the Sets made on it since its
/// create, `None` once a Set the client cannot fingerprint was made on it. An object absent
/// is as created (its destroy removes it). `overflowed`: past [`OBJECTS_MAX`] objects no
/// object that was set is known.
pub struct Objects {
    says: HashMap<u64, Option<u64>>,
    overflowed: bool,
}

fn with_objects<T>(f: impl FnOnce(&mut Objects) -> T) -> T {
    let mut guard = CLIENT.solver_prints.lock().unwrap_or_else(|p| p.into_inner());
    let objects = guard.get_or_insert_with(|| Objects { says: HashMap::new(), overflowed: false });
    f(objects)
}

/// The fingerprint of a call's content: its wire id, every value and device address, the
/// lengths and bytes of its inputs, the fingerprints of the objects it passes (skipping
/// `skip`); the library's context left out. None where it passes anything else, or an
/// object the client lost track of.
fn content(desc: &CallDesc, args: &[u64], prepared: &Prepared, objects: &Objects, skip: Option<usize>) -> Option<u64> {
    super::kept::content(desc.wire, desc, args, prepared, skip, None, |wire, a| match *wire {
        // A device address by its alignment only (as cuBLASLt's heuristics are kept): a
        // size query reads no matrix (callers pass NULL), and a tensor's address differs
        // from process to process.
        Wire::Device => Part::Hash(alignment(a)),
        // NULL: the library's defaults.
        Wire::Handle { kind: k, .. } if followed(k) && a == 0 => Part::Hash(0),
        Wire::Handle { kind: k, .. } if followed(k) => match objects.says.get(&a) {
            None if !objects.overflowed => Part::Hash(CREATED),
            Some(Some(print)) => Part::Hash(*print),
            _ => Part::Refuse,
        },
        _ => Part::Usual,
    })
}

/// The first followed object a call passes, non-NULL: (parameter, value).
fn first_object(desc: &CallDesc, args: &[u64]) -> Option<(usize, u64)> {
    desc.params.iter().enumerate().find_map(|(i, w)| match *w {
        Wire::Handle { kind: k, .. } if followed(k) => args.get(i).copied().filter(|&a| a != 0).map(|a| (i, a)),
        _ => None,
    })
}

/// Before a cuSOLVER call is sent: answer a workspace query known, and follow what is set
/// on each parameter object.
pub(crate) fn before(desc: &'static CallDesc, args: &[u64], prepared: &Prepared) -> Action {
    let role = super::facts(desc).solver;
    if role == Role::Query {
        let Some(key) = with_objects(|o| content(desc, args, prepared, o, None)) else { return Action::Send };
        return super::kept::answer(
            desc,
            args,
            prepared,
            key,
            &CLIENT.ahead.solver_sizes,
            Space::SolverSize,
            "another workspace size",
        );
    }
    if role == Role::Keeps {
        return Action::Send;
    }
    let Some((at, object)) = first_object(desc, args) else { return Action::Send };
    with_objects(|o| {
        if role == Role::Destroys {
            // Its name may be given out again, as created.
            o.says.remove(&object);
            return;
        }
        if o.says.len() >= OBJECTS_MAX && !o.says.contains_key(&object) {
            o.overflowed = true;
            o.says.clear();
        }
        let before = match o.says.get(&object) {
            None if !o.overflowed => Some(CREATED),
            Some(known) => *known,
            None => None,
        };
        let call = content(desc, args, prepared, o, Some(at));
        let next = before.zip(call).map(|(before, call)| combine(before, call));
        o.says.insert(object, next);
    });
    Action::Send
}

/// After the server answered a workspace query: keep a success (for later sessions too).
pub(crate) fn learn(key: u64, status: u64, desc: &CallDesc, prepared: &Prepared) {
    super::kept::learn(key, status, desc, prepared, &CLIENT.ahead.solver_sizes, Space::SolverSize);
}

#[cfg(test)]
mod tests {
    use super::{Role, role};

    #[test]
    fn calls_are_told_by_what_they_do_to_sizes() {
        use chidori_cuda::calls::cusolver as c;
        for (desc, want) in [
            (&c::cusolverDnSgetrf_bufferSize, Role::Query),
            (&c::cusolverDnXpotrf_bufferSize, Role::Query),
            (&c::cusolverDnDestroyParams, Role::Destroys),
            (&c::cusolverDnDestroySyevjInfo, Role::Destroys),
            (&c::cusolverDnSetAdvOptions, Role::Sets),
            (&c::cusolverDnXsyevjSetTolerance, Role::Sets),
            (&c::cusolverDnSetStream, Role::Keeps),
            (&c::cusolverDnSgetrf, Role::Keeps),
        ] {
            assert_eq!(role(desc), want, "{}", desc.name);
        }
    }
}
