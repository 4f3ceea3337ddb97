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
use std::hash::{Hash, Hasher};
use std::sync::MutexGuard;

use chidori_cuda::handles::{KINDS, kind};
use chidori_protocol::desc::{CallDesc, Dir, Wire};

use super::Prepared;
use crate::ahead::learned::Space;
use crate::state::CLIENT;

/// Answers kept (distinct questions; torch asks a few per layer shape).
pub(crate) const ANSWERS_MAX: usize = 4096;

/// The outputs of a size query: (parameter, bytes) each, and the status.
pub(crate) type Answer = (u64, Vec<(usize, Vec<u8>)>);

/// What each legacy descriptor says: `Some(fingerprint)` of the Sets made on it since it was
/// created, `None` once a call may have changed it in a way the client does not know (then
/// until its destroy). A descriptor absent here is as created.
fn fingerprints() -> MutexGuard<'static, Option<HashMap<u64, Option<u64>>>> {
    CLIENT.cudnn_fingerprints.lock()
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
            Wire::Handle { kind: k, .. } if legacy(k) => match prints.as_ref().and_then(|m| m.get(&a)) {
                _ if a == 0 => 0u64.hash(&mut h),
                // As created: nothing set yet.
                None => 1u64.hash(&mut h),
                Some(Some(fingerprint)) => fingerprint.hash(&mut h),
                Some(None) => return None,
            },
            // A device address by its value (a dropout descriptor's states: NULL without
            // dropout, the same in every process).
            Wire::Device => a.hash(&mut h),
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
        if let Some(answer) = CLIENT.ahead.cudnn_sizes.get(&key) {
            return match give(&answer, prepared) {
                true => {
                    crate::trace::local(name);
                    Action::Answered(answer.0)
                }
                false => Action::Learn(key),
            };
        }
        // Answered in an earlier session on this server: given now, checked when the
        // server's answer to the same call comes.
        if let Ok(conn) = crate::conn::get()
            && let Some(answer) =
                crate::learned::with(&conn, |l| l.get(Space::CudnnSize, &stored(desc, key)).and_then(decode)).flatten()
            // SAFETY: the caller's arguments, as the descriptor says.
            && let Some(status) = unsafe { give_checked(&conn, desc, args, prepared, answer.clone(), "other sizes") }
        {
            CLIENT.ahead.cudnn_sizes.learn(key, answer);
            return Action::Answered(status);
        }
        return Action::Learn(key);
    }
    let handle = args.first().copied().unwrap_or(0);
    if first_legacy && name.starts_with("cudnnSet") && handle != 0 {
        let previous = fingerprints().as_ref().and_then(|m| m.get(&handle).copied());
        let next = match (previous, content(desc, args, prepared, Some(0))) {
            // As created, or known: this Set is added to what it says.
            (None | Some(Some(_)), Some(call)) => {
                let mut h = std::collections::hash_map::DefaultHasher::new();
                (previous.flatten().unwrap_or(1), call).hash(&mut h);
                Some(h.finish())
            }
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
    if status != desc.codes.success as u64 {
        return;
    }
    let answer = (status, outputs(prepared));
    if let Ok(conn) = crate::conn::get() {
        crate::learned::with(&conn, |l| l.learn(Space::CudnnSize, &stored(desc, key), &encode(&answer)));
    }
    CLIENT.ahead.cudnn_sizes.learn(key, answer);
}

/// The outputs the server's reply just wrote, (parameter, bytes) each.
pub(crate) fn outputs(prepared: &Prepared) -> Vec<(usize, Vec<u8>)> {
    prepared
        .outs
        .iter()
        .map(|o| {
            // SAFETY: the caller's output of `len` bytes, just written by the reply.
            (o.param, unsafe { std::slice::from_raw_parts(o.ptr as *const u8, o.len) }.to_vec())
        })
        .collect()
}

/// A question answered from what was learned, the call still made: it goes without
/// waiting, its outputs into buffers of the client's own, compared with `answer` when its
/// reply comes (`differs` names how, in the error that ends the session otherwise); the
/// caller's outputs get `answer`'s. Its status, or None where the answer does not fit the
/// call or the call could not be sent.
///
/// # Safety
/// `args` are the caller's, as `desc` takes them; `prepared` is their preparation.
pub(crate) unsafe fn give_checked(
    conn: &std::sync::Arc<crate::conn::Conn>,
    desc: &'static CallDesc,
    args: &[u64],
    prepared: &Prepared,
    answer: Answer,
    differs: &'static str,
) -> Option<u64> {
    if !fits(&answer, prepared) {
        return None;
    }
    let mut scratch: Vec<Box<[u8]>> = Vec::new();
    let mut check_args = args.to_vec();
    for o in &prepared.outs {
        let mut b = vec![0u8; o.len].into_boxed_slice();
        if let Some(a) = check_args.get_mut(o.param) {
            *a = b.as_mut_ptr() as u64;
        }
        scratch.push(b);
    }
    // SAFETY: the caller's arguments but its outputs, which are `scratch`'s buffers; the
    // checking thread keeps them until the reply has landed.
    let slot = unsafe { super::send_checked(conn, desc, &check_args) }?;
    give(&answer, prepared);
    let params: Vec<usize> = prepared.outs.iter().map(|o| o.param).collect();
    crate::learned::check(conn.clone(), desc.name, slot, scratch, move |outcome, scratch| {
        let got: Vec<(usize, Vec<u8>)> = params.iter().copied().zip(scratch.iter().map(|b| b.to_vec())).collect();
        match outcome {
            Ok(s) if *s != answer.0 => Some(format!("status {s}, not {}", answer.0)),
            _ if got != answer.1 => Some(differs.to_owned()),
            _ => None,
        }
    });
    crate::trace::local(desc.name);
    Some(answer.0)
}

/// Whether `answer` has the outputs this call asks for (the same parameters and lengths).
fn fits(answer: &Answer, prepared: &Prepared) -> bool {
    answer.1.len() == prepared.outs.len()
        && answer.1.iter().all(|(p, b)| prepared.outs.iter().any(|o| o.param == *p && o.len == b.len()))
}

/// Write `answer`'s outputs to the caller; false where they do not fit this call.
pub(crate) fn give(answer: &Answer, prepared: &Prepared) -> bool {
    if !fits(answer, prepared) {
        return false;
    }
    for (param, bytes) in &answer.1 {
        if let Some(target) = prepared.outs.iter().find(|o| o.param == *param) {
            // SAFETY: the caller's output of `len` bytes (checked equal), as for the server's answer.
            unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), target.ptr as *mut u8, bytes.len()) };
        }
    }
    true
}

/// The key of a question in the store of learned answers: this release and the call's name
/// with its in-process key (a hash only this release computes alike). cuFFT's made plans
/// are kept under such keys too.
pub(crate) fn stored(desc: &CallDesc, key: u64) -> Vec<u8> {
    format!("{}|{}|{key:016x}", env!("CARGO_PKG_VERSION"), desc.name).into_bytes()
}

pub(crate) fn encode((status, outs): &Answer) -> Vec<u8> {
    let mut v = status.to_le_bytes().to_vec();
    for (param, bytes) in outs {
        v.extend_from_slice(&(*param as u32).to_le_bytes());
        v.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
        v.extend_from_slice(bytes);
    }
    v
}

pub(crate) fn decode(v: &[u8]) -> Option<Answer> {
    let status = u64::from_le_bytes(v.get(..8)?.try_into().ok()?);
    let mut outs = Vec::new();
    let mut at = 8;
    while at < v.len() {
        let param = u32::from_le_bytes(v.get(at..at + 4)?.try_into().ok()?) as usize;
        let len = u32::from_le_bytes(v.get(at + 4..at + 8)?.try_into().ok()?) as usize;
        outs.push((param, v.get(at + 8..at + 8 + len)?.to_vec()));
        at += 8 + len;
    }
    Some((status, outs))
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
    fn answers_are_kept_as_bytes_and_read_back() {
        let answer = (0u64, vec![(1usize, vec![96u8, 0, 0, 0, 0, 0, 0, 0]), (3, vec![])]);
        assert_eq!(decode(&encode(&answer)), Some(answer.clone()));
        let bytes = encode(&answer);
        assert_eq!(decode(&bytes[..bytes.len() - 9]), None, "cut short");
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
