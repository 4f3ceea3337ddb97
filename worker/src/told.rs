//! Input arrays whose length only the caller's data gives (`in[told]` in the specs,
//! [`chidori_protocol::desc::Len::Told`]): the client works the lengths out and sends that
//! much; before the library reads the arrays, the worker works out from the library itself
//! how much it will read and refuses a call whose arrays are shorter. A function with such
//! an array and no check here is refused: the decoder alone cannot say what is enough.

use chidori_cuda::calls::VARIANTS;
use chidori_protocol::desc::{CallDesc, Wire};
use chidori_protocol::messages::NULL_LEN;

use crate::backend::Backend;

/// CUDNN_DIM_MAX: no tensor descriptor has more dimensions.
const DIM_MAX: usize = 8;

/// Whether `desc` has an input array of a told length.
pub fn has_told(desc: &CallDesc) -> bool {
    desc.params.iter().any(Wire::told)
}

/// Check the told arrays of a decoded call: `raw` the arguments as the library gets them
/// (handles mapped, arrays at the worker's copies), `lens` the bytes sent per parameter.
/// Err: why the call may not reach the library.
///
/// # Safety
/// `raw[i]` of a told array that is not [`NULL_LEN`] must address `lens[i]` readable bytes.
pub unsafe fn check(backend: &dyn Backend, desc: &'static CallDesc, raw: &[u64], lens: &[u64]) -> Result<(), String> {
    let check =
        checker(desc.name).ok_or("an array whose length only its data gives, which this server cannot check")?;
    // SAFETY: forwarded contract.
    unsafe { check(backend, desc, raw, lens) }
}

type Checker = unsafe fn(&dyn Backend, &'static CallDesc, &[u64], &[u64]) -> Result<(), String>;

/// The check of a function's told arrays.
fn checker(name: &str) -> Option<Checker> {
    match name {
        // (handle, probsDesc, ..., labels 3, label lengths 4, input lengths 5, ...).
        "cudnnCTCLoss" | "cudnnGetCTCLossWorkspaceSize" => Some(ctc),
        _ => None,
    }
}

/// cuDNN's v7 CTC loss and its workspace query read one label length and one input length
/// per sequence (the probabilities' descriptor is time x batch x alphabet) and as many
/// labels as the label lengths add up to.
///
/// # Safety
/// As [`check`].
unsafe fn ctc(backend: &dyn Backend, desc: &'static CallDesc, raw: &[u64], lens: &[u64]) -> Result<(), String> {
    let batch = batch_of(backend, desc, raw.get(1).copied().unwrap_or(0))?;
    let sent = |p: usize| lens.get(p).copied().filter(|&l| l != NULL_LEN).unwrap_or(0);
    for (p, what) in [(4, "label lengths"), (5, "input lengths")] {
        if sent(p) < batch.saturating_mul(4) {
            return Err(format!("{what}: {} bytes sent for a batch of {batch}", sent(p)));
        }
    }
    // SAFETY: at least 4 × batch bytes at raw[4] (checked above: no more than was sent).
    let lengths = unsafe { std::slice::from_raw_parts(raw[4] as *const u8, sent(4).min(4 * batch) as usize) };
    let mut labels = 0u64;
    for word in lengths.chunks_exact(4) {
        let n = i32::from_le_bytes([word[0], word[1], word[2], word[3]]);
        labels += u64::try_from(n).map_err(|_| format!("a label length of {n}"))?;
    }
    if sent(3) < labels.saturating_mul(4) {
        return Err(format!("labels: {} bytes sent, the label lengths add up to {labels}", sent(3)));
    }
    Ok(())
}

/// The batch of a CTC loss: the second dimension of its probabilities' descriptor, asked of
/// the library.
fn batch_of(backend: &dyn Backend, desc: &CallDesc, probs: u64) -> Result<u64, String> {
    // cudnnGetTensorNdDescriptor of each cuDNN major version (found once, not per call).
    static ND: std::sync::OnceLock<Vec<&'static CallDesc>> = std::sync::OnceLock::new();
    let all = ND.get_or_init(|| {
        VARIANTS.iter().copied().filter(|v| v.name == "cudnnGetTensorNdDescriptor" && v.form.is_some()).collect()
    });
    let version = desc.versions.last().copied().unwrap_or_default();
    let nd = all
        .iter()
        .copied()
        .find(|v| v.versions.contains(&version))
        .ok_or("no cudnnGetTensorNdDescriptor to ask the probabilities' dimensions")?;
    let (mut data_type, mut count) = (0u32, 0i32);
    let (mut dims, mut strides) = ([0i32; DIM_MAX], [0i32; DIM_MAX]);
    let args = [
        probs,
        DIM_MAX as u64,
        &mut data_type as *mut u32 as u64,
        &mut count as *mut i32 as u64,
        dims.as_mut_ptr() as u64,
        strides.as_mut_ptr() as u64,
    ];
    // SAFETY: the descriptor is the library's (mapped by the decoder); the outputs are the
    // locals above, DIM_MAX dimensions each.
    let status = unsafe { crate::adapt::invoke(backend, nd, &args) }?;
    if status != 0 {
        return Err(format!("the probabilities' descriptor: status {status} asking its dimensions"));
    }
    if count < 2 {
        return Err(format!("the probabilities' descriptor has {count} dimensions, not time x batch x alphabet"));
    }
    u64::try_from(dims[1]).ok().filter(|&b| b > 0).ok_or(format!("the probabilities' batch is {}", dims[1]))
}

#[cfg(test)]
mod tests {
    use chidori_cuda::calls::VARIANTS;
    use chidori_protocol::desc::CallDesc;
    use chidori_protocol::messages::NULL_LEN;

    fn variant(name: &str) -> &'static CallDesc {
        VARIANTS.iter().copied().find(|d| d.name == name && d.versions.contains(&"13.0")).expect(name)
    }

    /// The label arrays of a batch of three, as torch's test of the cuDNN CTC loss makes them,
    /// checked against a descriptor of 50 × `batch` × 15 set on the emulated backend.
    fn checked(batch: i32, lens: [u64; 3], lengths: [i32; 3]) -> Result<(), String> {
        let backend = crate::fuzz::emulated_harness_backend();
        let (dims, strides) = ([50, batch, 15], [45, 15, 1]);
        let set = [77, 0, 3, dims.as_ptr() as u64, strides.as_ptr() as u64];
        // SAFETY: the descriptor's arrays are the locals above.
        let status = unsafe { backend.invoke(variant("cudnnSetTensorNdDescriptor"), &set) };
        assert_eq!(status, Ok(0));
        let (labels, inputs) = (vec![1i32; 75], [50i32; 3]);
        let raw = [1, 77, 0, labels.as_ptr() as u64, lengths.as_ptr() as u64, inputs.as_ptr() as u64, 0, 77, 0];
        let lens = [0, 0, 0, lens[0], lens[1], lens[2], 0, 0, 8];
        // SAFETY: each array is at least as long as its `lens` entry says.
        unsafe { super::check(&*backend, variant("cudnnGetCTCLossWorkspaceSize"), &raw, &lens) }
    }

    #[test]
    fn arrays_as_long_as_the_library_reads_pass_and_shorter_ones_do_not() {
        assert_eq!(checked(3, [300, 12, 12], [30, 25, 20]), Ok(()));
        let err = |r: Result<(), String>| r.expect_err("refused");
        assert!(err(checked(3, [296, 12, 12], [30, 25, 20])).contains("add up to 75"));
        assert!(err(checked(3, [300, 8, 12], [30, 25, 20])).contains("label lengths"));
        assert!(err(checked(3, [300, 12, NULL_LEN], [30, 25, 20])).contains("input lengths"));
        assert!(err(checked(3, [300, 12, 12], [30, -1, 20])).contains("-1"));
        // A batch the descriptor does not have.
        assert!(err(checked(0, [300, 12, 12], [30, 25, 20])).contains("batch is 0"));
        // Fewer sequences than the client sent lengths for: the descriptor's batch counts.
        assert_eq!(checked(2, [300, 12, 12], [30, 25, 20]), Ok(()));
    }

    #[test]
    fn every_told_array_has_a_check() {
        let told: Vec<_> = VARIANTS.iter().filter(|d| super::has_told(d)).collect();
        assert!(told.len() >= 4, "cuDNN 8's and 9's CTC loss and workspace query");
        for desc in told {
            assert!(super::checker(desc.name).is_some(), "{} of {:?}: no check", desc.name, desc.versions);
        }
    }
}
