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
//! descriptors it is given): such a descriptor is unknown until its destroy, and questions
//! about it go to the server. Only a question about descriptors set the same way since
//! they were created is answered.
//! Answers are kept for later sessions on the same server identity too (`crate::learned`):
//! given at once there, and checked against the server's answer to the same call.

use std::collections::HashMap;
use std::sync::MutexGuard;

use chidori_cuda::handles::{KINDS, kind};
use chidori_protocol::desc::{CallDesc, Wire};

use super::Prepared;
use super::kept::{Action, Part};
use crate::ahead::learned::Space;
use crate::state::CLIENT;

/// Answers kept (distinct questions; torch asks a few per layer shape).
pub(crate) const ANSWERS_MAX: usize = 4096;

/// What each legacy descriptor says: `Some(fingerprint)` of the Sets made on it since it was
/// created, `None` once a call may have changed it in a way the client does not know (then
/// until its destroy). A descriptor absent here is as created.
fn fingerprints() -> MutexGuard<'static, Option<HashMap<u64, Option<u64>>>> {
    CLIENT.cudnn_fingerprints.lock()
}

fn legacy(kind: u16) -> bool {
    KINDS.get(usize::from(kind)).is_some_and(|n| n.starts_with("cudnn") && n.ends_with("Struct"))
}

fn is_query(name: &str) -> bool {
    let base = chidori_protocol::desc::strip_suffixes(name, &["_v8", "_v9"]);
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
    let prints = fingerprints();
    super::kept::content(desc.wire, desc, args, prepared, skip, None, |wire, a| match *wire {
        Wire::Handle { kind: k, .. } if k == kind::cudnnContext => Part::Leave,
        Wire::Handle { kind: k, .. } if legacy(k) => match prints.as_ref().and_then(|m| m.get(&a)) {
            _ if a == 0 => Part::Hash(0),
            // As created: nothing set yet.
            None => Part::Hash(1),
            Some(Some(fingerprint)) => Part::Hash(*fingerprint),
            Some(None) => Part::Refuse,
        },
        // A device address by its value (a dropout descriptor's states: NULL without
        // dropout, the same in every process).
        Wire::Device => Part::Hash(a),
        // A value, a buffer; another handle, a scalar, a string: not a question this answers.
        _ => Part::Usual,
    })
}

/// Before a cuDNN call is sent: answer a size query known, follow what the program sets in
/// its descriptors, and forget descriptors a call may change.
pub(crate) fn before(desc: &'static CallDesc, args: &[u64], prepared: &Prepared) -> Action {
    let name = desc.name;
    let first_legacy = matches!(desc.params.first(), Some(Wire::Handle { kind: k, .. }) if legacy(*k));
    if is_query(name) && desc.waits() {
        let outputs_only_bufs = desc.params.iter().all(|w| !matches!(w, Wire::OutHandle { .. } | Wire::Scalar { .. }));
        let Some(key) = content(desc, args, prepared, None).filter(|_| outputs_only_bufs) else { return Action::Send };
        return super::kept::answer(
            desc,
            args,
            prepared,
            key,
            &CLIENT.ahead.cudnn_sizes,
            Space::CudnnSize,
            "other sizes",
        );
    }
    let handle = args.first().copied().unwrap_or(0);
    if first_legacy && name.starts_with("cudnnSet") && handle != 0 {
        let previous = fingerprints().as_ref().and_then(|m| m.get(&handle).copied());
        let next = match (previous, content(desc, args, prepared, Some(0))) {
            // As created, or known: this Set is added to what it says.
            (None | Some(Some(_)), Some(call)) => Some(super::kept::combine(previous.flatten().unwrap_or(1), call)),
            // Unknown stays unknown: a Set changes only part of a descriptor.
            _ => None,
        };
        fingerprints().get_or_insert_with(HashMap::new).insert(handle, next);
        return Action::Send;
    }
    if first_legacy && name.starts_with("cudnnDestroy") {
        // A descriptor created later under this name starts as created.
        if let Some(m) = fingerprints().as_mut() {
            m.remove(&handle);
        }
        return Action::Send;
    }
    // Anything else may change the descriptors it passes ([`changes`]).
    forget_passed(desc, args);
    Action::Send
}

/// Which legacy descriptors a cuDNN call may change, of those it passes (a Set of its first
/// descriptor and a size query are followed by [`before`] itself).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum Changes {
    /// None: a question, or a computation (it writes device memory, never a descriptor).
    #[default]
    Nothing,
    /// All but the first: a `cudnnGet…` that fills the descriptors it is given after the
    /// one it asks about (an RNN's matrix and bias shapes, attention weights, folded
    /// convolution descriptors).
    AllButFirst,
    /// Any of them: a Set, a derivation or build, or a function not known here.
    All,
}

/// The legacy API's computations (their `_v8`/`_v9` forms too): they read the descriptors
/// they pass and write device memory only.
const READ_ONLY: &[&str] = &[
    "cudnnActivationBackward",
    "cudnnActivationForward",
    "cudnnAddTensor",
    "cudnnBatchNormalizationBackward",
    "cudnnBatchNormalizationBackwardEx",
    "cudnnBatchNormalizationForwardInference",
    "cudnnBatchNormalizationForwardTraining",
    "cudnnBatchNormalizationForwardTrainingEx",
    "cudnnCTCLoss",
    "cudnnConvolutionBackwardBias",
    "cudnnConvolutionBackwardData",
    "cudnnConvolutionBackwardFilter",
    "cudnnConvolutionBiasActivationForward",
    "cudnnConvolutionForward",
    "cudnnDivisiveNormalizationBackward",
    "cudnnDivisiveNormalizationForward",
    "cudnnDropoutBackward",
    "cudnnDropoutForward",
    "cudnnDropoutGetReserveSpaceSize",
    "cudnnFindConvolutionBackwardDataAlgorithm",
    "cudnnFindConvolutionBackwardDataAlgorithmEx",
    "cudnnFindConvolutionBackwardFilterAlgorithm",
    "cudnnFindConvolutionBackwardFilterAlgorithmEx",
    "cudnnFindConvolutionForwardAlgorithm",
    "cudnnFindConvolutionForwardAlgorithmEx",
    "cudnnFindRNNBackwardDataAlgorithmEx",
    "cudnnFindRNNBackwardWeightsAlgorithmEx",
    "cudnnFindRNNForwardInferenceAlgorithmEx",
    "cudnnFindRNNForwardTrainingAlgorithmEx",
    "cudnnIm2Col",
    "cudnnLRNCrossChannelBackward",
    "cudnnLRNCrossChannelForward",
    "cudnnMultiHeadAttnBackwardData",
    "cudnnMultiHeadAttnBackwardWeights",
    "cudnnMultiHeadAttnForward",
    "cudnnNormalizationBackward",
    "cudnnNormalizationForwardInference",
    "cudnnNormalizationForwardTraining",
    "cudnnOpTensor",
    "cudnnPoolingBackward",
    "cudnnPoolingForward",
    "cudnnRNNBackwardData",
    "cudnnRNNBackwardDataEx",
    "cudnnRNNBackwardWeights",
    "cudnnRNNBackwardWeightsEx",
    "cudnnRNNForward",
    "cudnnRNNForwardInference",
    "cudnnRNNForwardInferenceEx",
    "cudnnRNNForwardTraining",
    "cudnnRNNForwardTrainingEx",
    "cudnnRNNGetClip",
    "cudnnReduceTensor",
    "cudnnReorderFilterAndBias",
    "cudnnScaleTensor",
    "cudnnSetTensor",
    "cudnnSoftmaxBackward",
    "cudnnSoftmaxForward",
    "cudnnSpatialTfGridGeneratorBackward",
    "cudnnSpatialTfGridGeneratorForward",
    "cudnnSpatialTfSamplerBackward",
    "cudnnSpatialTfSamplerForward",
    "cudnnTransformFilter",
    "cudnnTransformTensor",
    "cudnnTransformTensorEx",
];

pub(crate) fn changes(name: &str) -> Changes {
    let base = chidori_protocol::desc::strip_suffixes(name, &["_v8", "_v9"]);
    match base {
        "cudnnGetRNNWeightParams"
        | "cudnnGetRNNLinLayerMatrixParams"
        | "cudnnGetRNNLinLayerBiasParams"
        | "cudnnGetMultiHeadAttnWeights"
        | "cudnnGetFoldedConvBackwardDataDescriptors" => Changes::AllButFirst,
        _ if base.starts_with("cudnnGet") => Changes::Nothing,
        _ if READ_ONLY.contains(&base) => Changes::Nothing,
        _ => Changes::All,
    }
}

/// A cuDNN call sent by a path that does not ask [`before`] (several calls in one round
/// trip), or one [`before`] does not follow: the descriptors it may change ([`changes`])
/// lose their fingerprints (what a call may change is found once per descriptor: every cuDNN
/// call passes here). torch's RNN backward asks for the weights' places after
/// `cudnnRNNBackwardWeights_v8`, which only reads the RNN descriptor: it keeps its
/// fingerprint, so the question is answered as the forward's was.
pub fn forget_passed(desc: &CallDesc, args: &[u64]) {
    let skip = match super::cudnn_changes(desc) {
        Changes::Nothing => return,
        Changes::AllButFirst => 1,
        Changes::All => 0,
    };
    let mut passed = desc
        .params
        .iter()
        .zip(args)
        .filter(|(wire, a)| matches!(wire, Wire::Handle { kind: k, .. } if legacy(*k)) && **a != 0)
        .skip(skip)
        .peekable();
    // Most cuDNN calls (the graph API's) pass none: no lock for them.
    if passed.peek().is_none() {
        return;
    }
    let mut prints = fingerprints();
    let map = prints.get_or_insert_with(HashMap::new);
    for (_, a) in passed {
        map.insert(*a, None);
    }
}

/// What the legacy descriptor `handle` says: the fingerprint of the Sets made on it since it
/// was created (1 for none; 0 for NULL), or None where a call may have changed it in a way
/// the client does not know.
pub fn fingerprint(handle: u64) -> Option<u64> {
    if handle == 0 {
        return Some(0);
    }
    match fingerprints().as_ref().and_then(|m| m.get(&handle).copied()) {
        None => Some(1),
        Some(known) => known,
    }
}

/// After the server answered a size query: keep a success (for later sessions too).
pub(crate) fn learn(key: u64, status: u64, desc: &CallDesc, prepared: &Prepared) {
    super::kept::learn(key, status, desc, prepared, &CLIENT.ahead.cudnn_sizes, Space::CudnnSize);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn computations_keep_their_descriptors_and_fills_change_theirs() {
        assert_eq!(changes("cudnnRNNBackwardWeights_v8"), Changes::Nothing);
        assert_eq!(changes("cudnnConvolutionForward"), Changes::Nothing);
        assert_eq!(changes("cudnnGetConvolutionForwardAlgorithm_v7"), Changes::Nothing);
        assert_eq!(changes("cudnnGetRNNWeightParams"), Changes::AllButFirst);
        assert_eq!(changes("cudnnSetTensor4dDescriptor"), Changes::All);
        assert_eq!(changes("cudnnRestoreDropoutDescriptor"), Changes::All);
        assert_eq!(changes("cudnnBuildRNNDynamic"), Changes::All);
        assert_eq!(changes("cudnnRNNSetClip_v9"), Changes::All);
        assert_eq!(changes("cudnnDeriveBNTensorDescriptor"), Changes::All);
        // Every name is a function of some cuDNN release (a misspelt one would leave its
        // descriptors forgotten, not wrongly kept, but would say what is not so).
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../generated/ir");
        let ir: String = ["11.8", "13.0"]
            .iter()
            .map(|v| std::fs::read_to_string(root.join(v).join("cudnn.jsonl")).unwrap())
            .collect();
        for name in READ_ONLY {
            let known = ["", "_v8", "_v9"].iter().any(|s| ir.contains(&format!("\"name\":\"{name}{s}\"")));
            assert!(known, "{name} is no cuDNN function");
        }
    }
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
            assert!(is_query(q), "{q}");
        }
        for q in
            ["cudnnGetTensorNdDescriptor", "cudnnGetRNNWeightParams", "cudnnGetVersion", "cudnnSetTensorNdDescriptor"]
        {
            assert!(!is_query(q), "{q}");
        }
    }
}
