//! Size queries of cuDNN's legacy API answered by the client when the same question was
//! answered before about descriptors set the same way (issue 19: torch's batch norm asks
//! its workspace and reserve sizes at every call, of descriptors it creates and sets anew
//! each time: one round trip each at 70 ms).
//!
//! The client follows what each legacy descriptor (a `cudnn*Struct` handle) says: a
//! fingerprint of every `cudnnSet*` call made on it, in order. A size query
//! (`cudnnGet…Size`, `…Sizes`, `…SizeInBytes`, `…MaxCount`, the dropout sizes) whose
//! descriptors all have fingerprints is keyed by the call and those fingerprints; the
//! server's successful answer is kept, and the same question is answered locally. Any other
//! cuDNN call that passes a descriptor may change it (`cudnnGetRNNWeightParams` fills the
//! descriptors it is given), so it drops their fingerprints, as does a destroy: only a
//! question about descriptors set the same way since their last such call is answered.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::{Mutex, MutexGuard};

use chidori_cuda::handles::{KINDS, kind};
use chidori_protocol::desc::{CallDesc, Dir, Wire};

use crate::ahead::Answers;
use crate::runtime::Prepared;

/// Answers kept (distinct questions; torch asks a few per layer shape).
const ANSWERS_MAX: usize = 4096;

/// The outputs of a size query: (parameter, bytes) each, and the status.
type Answer = (u64, Vec<(usize, Vec<u8>)>);

static ANSWERS: Answers<u64, Answer> = Answers::new(ANSWERS_MAX);
static FINGERPRINTS: Mutex<Option<HashMap<u64, u64>>> = Mutex::new(None);

fn fingerprints() -> MutexGuard<'static, Option<HashMap<u64, u64>>> {
    FINGERPRINTS.lock().unwrap_or_else(|p| p.into_inner())
}

/// What the hook decided for a call about to be sent.
pub enum Action {
    /// Answered here: the status to return (the outputs are written).
    Answered(u64),
    /// A size query to ask the server: learn its answer under this key.
    Learn(u64),
    Send,
}

fn legacy(kind: u16) -> bool {
    KINDS.get(usize::from(kind)).is_some_and(|n| n.starts_with("cudnn") && n.ends_with("Struct"))
}

fn is_query(name: &str) -> bool {
    let base = name.trim_end_matches("_v8").trim_end_matches("_v9");
    (base.starts_with("cudnnGet")
        && (base.ends_with("Size")
            || base.ends_with("Sizes")
            || base.ends_with("SizeInBytes")
            || base.ends_with("MaxCount")))
        || matches!(base, "cudnnDropoutGetStatesSize" | "cudnnDropoutGetReserveSpaceSize")
}

/// The fingerprint of a call's content: its wire id, every value, the lengths and bytes of
/// its inputs, and the fingerprints of the legacy descriptors it passes (skipping `skip`).
fn content(desc: &CallDesc, args: &[u64], prepared: &Prepared, skip: Option<usize>) -> Option<u64> {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    desc.wire.hash(&mut h);
    let prints = fingerprints();
    for (i, wire) in desc.params.iter().enumerate() {
        if Some(i) == skip {
            continue;
        }
        let a = args.get(i).copied().unwrap_or(0);
        match *wire {
            Wire::Val { .. } => a.hash(&mut h),
            Wire::Handle { kind: k, .. } if k == kind::cudnnContext => {}
            Wire::Handle { kind: k, .. } if legacy(k) => match a {
                0 => 0u64.hash(&mut h),
                _ => prints.as_ref()?.get(&a)?.hash(&mut h),
            },
            Wire::Buf { dir: Dir::Out, .. } | Wire::Null => prepared.call.lens.get(i).hash(&mut h),
            Wire::Buf { dir: Dir::In, .. } => prepared.call.lens.get(i).hash(&mut h),
            // A handle of another kind, a scalar, a string: not a question this answers.
            _ => return None,
        }
    }
    for b in &prepared.bulk {
        b.as_ref().hash(&mut h);
    }
    Some(h.finish())
}

/// Before a cuDNN call is sent: answer a size query known, follow what the program sets in
/// its descriptors, and forget descriptors a call may change.
pub(crate) fn before(desc: &'static CallDesc, args: &[u64], prepared: &Prepared) -> Action {
    let name = desc.name;
    let first_legacy = matches!(desc.params.first(), Some(Wire::Handle { kind: k, .. }) if legacy(*k));
    if is_query(name) && desc.waits() {
        let outputs_only_bufs = desc.params.iter().all(|w| !matches!(w, Wire::OutHandle { .. } | Wire::Scalar { .. }));
        let Some(key) = content(desc, args, prepared, None).filter(|_| outputs_only_bufs) else { return Action::Send };
        if let Some((status, outs)) = ANSWERS.get(&key) {
            for (param, bytes) in &outs {
                let Some(target) = prepared.outs.iter().find(|o| o.param == *param && o.len == bytes.len()) else {
                    return Action::Learn(key);
                };
                // SAFETY: the caller's output of `len` bytes, as for the server's answer.
                unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), target.ptr as *mut u8, bytes.len()) };
            }
            crate::trace::local(name);
            return Action::Answered(status);
        }
        return Action::Learn(key);
    }
    let handle = args.first().copied().unwrap_or(0);
    if first_legacy && name.starts_with("cudnnSet") && handle != 0 {
        let previous = fingerprints().as_ref().and_then(|m| m.get(&handle).copied()).unwrap_or(0);
        match content(desc, args, prepared, Some(0)) {
            Some(call) => {
                let mut h = std::collections::hash_map::DefaultHasher::new();
                (previous, call).hash(&mut h);
                fingerprints().get_or_insert_with(HashMap::new).insert(handle, h.finish());
            }
            None => forget(handle),
        }
        return Action::Send;
    }
    // Anything else may change the descriptors it passes.
    forget_passed(desc, args);
    Action::Send
}

/// A cuDNN call sent by a path that does not ask [`before`] (several calls in one round
/// trip): the descriptors it passes may change, so their fingerprints go.
pub fn forget_passed(desc: &CallDesc, args: &[u64]) {
    for (wire, a) in desc.params.iter().zip(args) {
        if matches!(wire, Wire::Handle { kind: k, .. } if legacy(*k)) && *a != 0 {
            forget(*a);
        }
    }
}

fn forget(handle: u64) {
    if let Some(m) = fingerprints().as_mut() {
        m.remove(&handle);
    }
}

/// After the server answered a size query: keep a success.
pub(crate) fn learn(key: u64, status: u64, desc: &CallDesc, prepared: &Prepared) {
    if status != desc.codes.success as u64 {
        return;
    }
    let outs = prepared
        .outs
        .iter()
        .map(|o| {
            // SAFETY: the caller's output of `len` bytes, just written by the reply.
            (o.param, unsafe { std::slice::from_raw_parts(o.ptr as *const u8, o.len) }.to_vec())
        })
        .collect();
    ANSWERS.learn(key, (status, outs));
}

#[cfg(test)]
mod tests {
    #[test]
    fn size_queries_are_told_by_their_names() {
        for q in [
            "cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize",
            "cudnnGetBatchNormalizationTrainingExReserveSpaceSize",
            "cudnnGetRNNTempSpaceSizes",
            "cudnnGetTensorSizeInBytes",
            "cudnnGetConvolutionForwardAlgorithmMaxCount",
            "cudnnDropoutGetStatesSize",
            "cudnnGetCTCLossWorkspaceSize_v8",
        ] {
            assert!(super::is_query(q), "{q}");
        }
        for q in
            ["cudnnGetTensorNdDescriptor", "cudnnGetRNNWeightParams", "cudnnGetVersion", "cudnnSetTensorNdDescriptor"]
        {
            assert!(!super::is_query(q), "{q}");
        }
    }
}
