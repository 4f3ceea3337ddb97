//! cuSPARSELt's size queries answered by the client when the same question was answered
//! before about records initialized and set the same way (issue 19: torch asks
//! `cusparseLtMatmulGetWorkspace` at every sparse matmul, of descriptors and a plan it
//! initializes anew each time: one round trip each at 70 ms).
//!
//! The client follows what each record the program holds says: a fingerprint of its
//! initializer (the values, and the fingerprints of the records it was made from) and of
//! every attribute set on it since, in order. The records' names are the client's own
//! (`client_named`), known before the initializer is sent. A workspace or compressed-size
//! query whose records all have fingerprints is keyed by the call and those fingerprints;
//! the server's successful answer is kept, and the same question is answered locally. An
//! algorithm search changes its plan in a way the client does not know: that plan has no
//! fingerprint from then on, and questions about it go to the server; so has every record
//! made from one whose attributes are set after it was (the library may read its source
//! again). The library's handle is not part of a question (one per process, the same GPU).
//!
//! Attribute sets are questions too: whether the library takes a value (vector scaling is
//! not available for every type) is its answer, which the program may act on. A set waits
//! the first time it is made on a record in a given state; once the library took it, the
//! same set on a record that says the same is sent without waiting ([`set_question`]).

use std::borrow::Cow;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};

use chidori_cuda::handles::kind;
use chidori_protocol::desc::{CallDesc, Wire};

use super::Prepared;
use super::kept::{Action, Answer, Part, combine, give, outputs};
use crate::state::CLIENT;

/// Answers kept (distinct questions: a few per sparse layer shape).
pub(crate) const ANSWERS_MAX: usize = 4096;
/// Records followed (the oldest names go first: matmul descriptors are never destroyed).
const PRINTS_MAX: usize = 1 << 16;
/// The questions answered: sizes that depend only on what the records say.
const QUERIES: &[&str] =
    &["cusparseLtMatmulGetWorkspace", "cusparseLtSpMMACompressedSize", "cusparseLtSpMMACompressedSize2"];

/// What the client knows of the records it named: fingerprints, and which records each was
/// made from.
#[derive(Default)]
pub struct Prints {
    /// `Some(fingerprint)` of what a record says; `None` once it may have changed in a way
    /// the client does not know (until it is destroyed).
    says: HashMap<u64, Option<u64>>,
    /// Records made from each record (a plan from its matmul descriptor and selection).
    made_from_it: HashMap<u64, Vec<u64>>,
    /// Attribute sets the library took ([`set_question`]s).
    sets: std::collections::HashSet<u64>,
}

impl Prints {
    fn get(&self, record: u64) -> Option<u64> {
        self.says.get(&record).copied().flatten()
    }

    /// The record no longer says what it said, nor does anything made from it.
    fn forget(&mut self, record: u64) {
        let mut pending = vec![record];
        while let Some(r) = pending.pop() {
            if let Some(print) = self.says.get_mut(&r) {
                *print = None;
            }
            pending.extend(self.made_from_it.remove(&r).unwrap_or_default());
        }
    }

    fn remove(&mut self, record: u64) {
        self.says.remove(&record);
        self.made_from_it.remove(&record);
    }
}

/// The fingerprint of a call's content: its wire id, every value, the fingerprints of the
/// records it passes (skipping `skip` and the library's handle), the lengths of its buffers
/// and the bytes of its inputs. None: a record it passes has none.
fn content(desc: &CallDesc, prepared: &Prepared, prints: &Prints, skip: Option<usize>) -> Option<u64> {
    content_with(desc, prepared, prints, skip, None)
}

/// As [`content`], with `inputs` hashed in place of the call's input bytes.
fn content_with(
    desc: &CallDesc,
    prepared: &Prepared,
    prints: &Prints,
    skip: Option<usize>,
    inputs: Option<&[u8]>,
) -> Option<u64> {
    // The function, not the wire form: an attribute set sent without waiting says what the
    // same set that waited said. A record by its id (the argument word after encoding).
    super::kept::content(desc.call, desc, &prepared.call.args, prepared, skip, inputs, |wire, a| match *wire {
        Wire::RecordHandle { kind: k, .. } if k == kind::cusparseLtHandle_t => Part::Leave,
        Wire::RecordHandle { .. } => prints.get(a).map_or(Part::Refuse, Part::Hash),
        // A value, a buffer; a device address, a stream, a scalar: not a question this answers.
        _ => Part::Usual,
    })
}

/// Before a cuSPARSELt call is sent: answer a size query known, and follow what the
/// program initializes, sets and destroys.
pub(crate) fn before(desc: &'static CallDesc, prepared: &Prepared) -> Action {
    let name = desc.name;
    let mut guard = CLIENT.sparselt_prints.lock().unwrap_or_else(|p| p.into_inner());
    let prints = guard.get_or_insert_with(Prints::default);
    if QUERIES.contains(&name) && desc.waits() {
        let Some(key) = content(desc, prepared, prints, None) else { return Action::Send };
        drop(guard);
        if let Some(answer) = CLIENT.ahead.sparselt_sizes.get(&key)
            && give(&answer, prepared)
        {
            crate::trace::local(name);
            return Action::Answered(answer.0);
        }
        return Action::Learn(key);
    }
    let id = |i: usize| prepared.call.args.get(i).copied().unwrap_or(0);
    // An initializer of a record the client named: what the record says from now on.
    if let Some(i) = desc.params.iter().position(|w| matches!(w, Wire::NewRecordHandle { named: true, .. })) {
        let record = id(i);
        let print = content(desc, prepared, prints, Some(i));
        prints.says.insert(record, print);
        for (j, wire) in desc.params.iter().enumerate() {
            if matches!(wire, Wire::RecordHandle { kind: k, .. } if *k != kind::cusparseLtHandle_t) {
                prints.made_from_it.entry(id(j)).or_default().push(record);
            }
        }
        if prints.says.len() > PRINTS_MAX
            && let Some(&oldest) = prints.says.keys().min()
        {
            prints.remove(oldest);
        }
        return Action::Send;
    }
    // `cusparseLt*SetAttribute(handle, record, ...)`: added to what the record says.
    if name.ends_with("SetAttribute") {
        let record = id(1);
        // A device address set (a bias, a scale) changes no size the library answers: only
        // whether it is NULL is part of what the record says.
        let value = prepared.bulk.first().map(|b| asked_value(name, id(2), b.as_ref()));
        let next = match (prints.get(record), content_with(desc, prepared, prints, Some(1), value.as_deref())) {
            (Some(before), Some(call)) => Some(combine(before, call)),
            _ => None,
        };
        prints.forget(record);
        prints.says.insert(record, next);
        return Action::Send;
    }
    // A search picks the plan's algorithm by timing it.
    if name == "cusparseLtMatmulSearch" {
        prints.forget(id(1));
    }
    for (i, wire) in desc.params.iter().enumerate() {
        if matches!(wire, Wire::RecordHandle { destroy: true, .. }) {
            prints.remove(id(i));
        }
    }
    Action::Send
}

/// Matmul descriptor attributes whose values are device addresses: the bias, the sparse
/// matrix and the scales of A, B, C, D and the output.
const POINTER_ATTRIBUTES: &[u32] = {
    use chidori_cuda::consts::cusparseLtMatmulDescAttribute_t as a;
    &[
        a::CUSPARSELT_MATMUL_BIAS_POINTER,
        a::CUSPARSELT_MATMUL_SPARSE_MAT_POINTER,
        a::CUSPARSELT_MATMUL_A_SCALE_POINTER,
        a::CUSPARSELT_MATMUL_B_SCALE_POINTER,
        a::CUSPARSELT_MATMUL_C_SCALE_POINTER,
        a::CUSPARSELT_MATMUL_D_SCALE_POINTER,
        a::CUSPARSELT_MATMUL_D_OUT_SCALE_POINTER,
    ]
};

/// What of the value a set `name(handle, record, attribute, value)` passes a question
/// depends on: its bytes, or for a device address (a bias, a scale) only whether it is NULL.
fn asked_value<'a>(name: &str, attribute: u64, value: &'a [u8]) -> Cow<'a, [u8]> {
    let pointer =
        name.ends_with("MatmulDescSetAttribute") && POINTER_ATTRIBUTES.iter().any(|a| u64::from(*a) == attribute);
    if pointer { Cow::Owned(vec![u8::from(value.iter().all(|b| *b == 0))]) } else { Cow::Borrowed(value) }
}

/// Attribute sets remembered (distinct record states, attributes and values; all are
/// forgotten at once beyond this).
const SETS_MAX: usize = 4096;
/// Attribute values hashed for a key at most (larger ones are always asked).
pub(crate) const SET_BYTES_MAX: usize = 1 << 16;

/// The question an attribute set `name(handle, record, attribute, value)` asks of the
/// library (whether it takes this value for a record that says what `record` says now), and
/// whether the library took it before (then it takes it again: the answer depends only on
/// the record's state, the attribute and the value). None: the record has no fingerprint,
/// or the value is too large to key.
pub(crate) fn set_question(name: &str, record: u64, attribute: u64, value: &[u8]) -> Option<(u64, bool)> {
    if value.len() > SET_BYTES_MAX {
        return None;
    }
    let guard = CLIENT.sparselt_prints.lock().unwrap_or_else(|p| p.into_inner());
    let prints = guard.as_ref()?;
    let print = prints.get(record)?;
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (name, print, attribute, asked_value(name, attribute, value)).hash(&mut h);
    let key = h.finish();
    Some((key, prints.sets.contains(&key)))
}

/// The library took this set (a waited success; a failure may be an earlier call's
/// deferred status, so only successes are kept).
pub(crate) fn set_took(key: u64) {
    let mut guard = CLIENT.sparselt_prints.lock().unwrap_or_else(|p| p.into_inner());
    let prints = guard.get_or_insert_with(Prints::default);
    if prints.sets.len() >= SETS_MAX {
        prints.sets.clear();
    }
    prints.sets.insert(key);
}

/// After the server answered a size query: keep a success.
pub(crate) fn learn(key: u64, status: u64, desc: &CallDesc, prepared: &Prepared) {
    if status != desc.codes.success as u64 {
        return;
    }
    let answer: Answer = (status, outputs(prepared));
    CLIENT.ahead.sparselt_sizes.learn(key, answer);
}

#[cfg(test)]
mod tests {
    use super::Prints;

    #[test]
    fn a_record_set_again_takes_what_was_made_from_it_with_it() {
        let mut p = Prints::default();
        for (record, print) in [(1, 11), (2, 22), (3, 33), (4, 44)] {
            p.says.insert(record, Some(print));
        }
        // A matmul descriptor (1), a selection (2) and a plan (3) made from both.
        p.made_from_it.insert(1, vec![2, 3]);
        p.made_from_it.insert(2, vec![3]);
        p.forget(1);
        assert_eq!((p.get(1), p.get(2), p.get(3)), (None, None, None));
        assert_eq!(p.get(4), Some(44), "an unrelated record keeps its fingerprint");
        p.remove(3);
        assert!(!p.says.contains_key(&3));
    }
}
