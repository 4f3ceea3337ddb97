//! cuSPARSE's generic-API buffer sizes answered by the client when the same question was
//! answered before (issue 19: torch asks `cusparseSpMM_bufferSize` and
//! `cusparseSpMV_bufferSize` before each sparse product, of descriptors it creates anew each
//! time: one round trip each at 70 ms, three in the torch suite's sparse case).
//!
//! A buffer size depends on the problem (the call's values: operations, types, algorithm),
//! the library and the GPU, and on what the descriptors it passes describe: shapes, index and
//! value types, layouts, and the alignment of their arrays. The client names the descriptors
//! (their creates do not wait) and follows each from its create: a fingerprint of the create's
//! values, its device addresses by their alignment, and of every later call that passes it
//! and may change it (a `Set`, a preprocess, a computation), in order. A query whose
//! descriptors all have fingerprints is keyed by the call, its values and those fingerprints,
//! not the descriptors' names; the server's successful answer is kept, and the same question
//! in this process is answered by the client. Kept for later sessions on the same server
//! identity too (`crate::learned`): given at once there, and checked against the server's
//! answer to the same call, which the client still sends.
//!
//! Not followed: the legacy API (its size queries read index arrays on the GPU) and the
//! generic API's solver and SpGEMM objects (their state is the library's own); calls that
//! pass those are sent as before.

use chidori_cuda::handles::kind;
use chidori_protocol::desc::{CallDesc, Wire};

use super::Prepared;
use super::kept::{Action, Part, alignment, combine};
use crate::ahead::learned::Space;
use crate::state::CLIENT;

/// Answers kept (distinct questions: a few per sparse shape).
pub(crate) const ANSWERS_MAX: usize = 4096;
/// Descriptors followed (the oldest names go first: the client's names grow).
const PRINTS_MAX: usize = 1 << 16;

/// The descriptors a buffer size may depend on: the generic API's matrices and vectors.
fn followed(k: u16) -> bool {
    k == kind::cusparseSpMatDescr
        || k == kind::cusparseDnMatDescr
        || k == kind::cusparseDnVecDescr
        || k == kind::cusparseSpVecDescr
}

/// What a cuSPARSE call is to the sizes followed here (found once per descriptor:
/// `crate::runtime::facts`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Role {
    /// Passes no followed descriptor, or only reads one (a getter), or is no cuSPARSE call.
    #[default]
    Keeps,
    /// A generic-API buffer size query about followed descriptors only.
    Query,
    /// Creates the descriptor its named output is: what it describes from now on.
    Creates,
    /// Ends the descriptors it passes to be destroyed.
    Destroys,
    /// May change what the descriptors it passes describe: each takes the call into its
    /// fingerprint.
    Changes,
}

pub(crate) fn role(desc: &CallDesc) -> Role {
    let handles = || {
        desc.params.iter().filter_map(|w| match *w {
            Wire::Handle { kind: k, destroy } => Some((k, destroy)),
            _ => None,
        })
    };
    let creates = desc.params.iter().any(|w| matches!(*w, Wire::OutHandle { kind: k, named: true } if followed(k)));
    let passes = handles().any(|(k, _)| followed(k));
    if creates {
        Role::Creates
    } else if !passes {
        Role::Keeps
    } else if handles().any(|(k, destroy)| destroy && followed(k)) {
        Role::Destroys
    } else if desc.name.ends_with("_bufferSize")
        && desc.waits()
        && handles().all(|(k, _)| followed(k) || k == kind::cusparseContext)
        && desc.params.iter().all(|w| !matches!(w, Wire::OutHandle { .. } | Wire::Device))
    {
        Role::Query
    } else if desc.name.contains("Get") {
        Role::Keeps
    } else {
        Role::Changes
    }
}

/// The fingerprint of a call's content: its wire id, every value, device addresses by their
/// alignment, the lengths and bytes of its inputs, the fingerprints of the descriptors it
/// passes (skipping `skip`); the library's context and scalars' addresses left out. None
/// where it passes a descriptor without one.
fn content(desc: &CallDesc, prepared: &Prepared, skip: Option<usize>) -> Option<u64> {
    let args = &prepared.call.args;
    super::kept::content(desc.wire, desc, args, prepared, skip, None, |wire, a| match *wire {
        // A size query reads no array; an array's address differs from process to process.
        Wire::Device => Part::Hash(alignment(a)),
        Wire::Handle { kind: k, .. } if k == kind::cusparseContext => Part::Leave,
        Wire::Handle { kind: k, .. } if followed(k) => {
            CLIENT.sparse_prints.get(&a).flatten().map_or(Part::Refuse, Part::Hash)
        }
        // alpha and beta: their bytes (host scalars) are among the inputs hashed.
        Wire::Scalar { .. } => Part::Leave,
        _ => Part::Usual,
    })
}

/// The followed descriptors a call passes: (parameter, name).
fn passed(desc: &CallDesc, prepared: &Prepared) -> Vec<(usize, u64)> {
    desc.params
        .iter()
        .enumerate()
        .filter(|(_, w)| matches!(**w, Wire::Handle { kind: k, .. } | Wire::OutHandle { kind: k, .. } if followed(k)))
        .filter_map(|(i, _)| prepared.call.args.get(i).copied().filter(|&a| a != 0).map(|a| (i, a)))
        .collect()
}

/// Before a cuSPARSE call is sent: answer a buffer size known, and follow what each
/// descriptor describes.
pub(crate) fn before(desc: &'static CallDesc, args: &[u64], prepared: &Prepared) -> Action {
    match super::facts(desc).sparse {
        Role::Keeps => Action::Send,
        Role::Query => match content(desc, prepared, None) {
            Some(key) => super::kept::answer(
                desc,
                args,
                prepared,
                key,
                &CLIENT.ahead.sparse_sizes,
                Space::SparseSize,
                "another buffer size",
            ),
            None => Action::Send,
        },
        Role::Creates => {
            for (i, name) in passed(desc, prepared) {
                if matches!(desc.params[i], Wire::OutHandle { .. }) {
                    let print = content(desc, prepared, Some(i));
                    follow(name, print);
                }
            }
            Action::Send
        }
        Role::Destroys => {
            for (_, name) in passed(desc, prepared) {
                CLIENT.sparse_prints.remove(&name);
            }
            Action::Send
        }
        Role::Changes => {
            // Each descriptor passed takes in the call as the others were before it.
            let call = content(desc, prepared, None);
            for (_, name) in passed(desc, prepared) {
                let before = CLIENT.sparse_prints.get(&name).flatten();
                follow(name, before.zip(call).map(|(b, c)| combine(b, c)));
            }
            Action::Send
        }
    }
}

/// `name` describes what `print` says from now on (None: something the client cannot tell).
fn follow(name: u64, print: Option<u64>) {
    let mut guard = CLIENT.sparse_prints.lock();
    let prints = guard.get_or_insert_with(Default::default);
    if prints.len() >= PRINTS_MAX
        && !prints.contains_key(&name)
        && let Some(&oldest) = prints.keys().min()
    {
        prints.remove(&oldest);
    }
    prints.insert(name, print);
}

/// After the server answered a buffer size: keep a success (for later sessions too).
pub(crate) fn learn(key: u64, status: u64, desc: &CallDesc, prepared: &Prepared) {
    super::kept::learn(key, status, desc, prepared, &CLIENT.ahead.sparse_sizes, Space::SparseSize);
}

#[cfg(test)]
mod tests {
    use super::{Role, role};

    #[test]
    fn calls_are_told_by_what_they_do_to_sizes() {
        use chidori_cuda::calls::cusparse as c;
        for (desc, want) in [
            (&c::cusparseSpMM_bufferSize, Role::Query),
            (&c::cusparseSpMV_bufferSize, Role::Query),
            (&c::cusparseSDDMM_bufferSize, Role::Query),
            (&c::cusparseSparseToDense_bufferSize, Role::Query),
            (&c::cusparseCreateCsr, Role::Creates),
            (&c::cusparseCreateConstDnMat, Role::Creates),
            (&c::cusparseCreateDnVec, Role::Creates),
            (&c::cusparseDestroySpMat, Role::Destroys),
            (&c::cusparseDestroyDnMat, Role::Destroys),
            (&c::cusparseCsrSetPointers, Role::Changes),
            (&c::cusparseSpMatSetAttribute, Role::Changes),
            (&c::cusparseSpMM_preprocess, Role::Changes),
            (&c::cusparseSpMM, Role::Changes),
            (&c::cusparseSpMatGetSize, Role::Keeps),
            (&c::cusparseCsrGet, Role::Keeps),
            // Its solver object is the library's state: asked, not followed.
            (&c::cusparseSpSV_bufferSize, Role::Changes),
            (&c::cusparseSetStream, Role::Keeps),
            (&c::cusparseSbsrmv, Role::Keeps),
        ] {
            assert_eq!(role(desc), want, "{}", desc.name);
        }
    }
}
