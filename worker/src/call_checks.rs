//! What the generated checks (`chidori_cuda::checks`) and the memory rules say about each
//! call descriptor, looked up once per descriptor. The executor asks for every call; the
//! generated tables are searched by function name, and those searches (string comparisons)
//! were a sixth of the executor's time for small asynchronous calls.

use std::sync::OnceLock;

use chidori_cuda::calls::VARIANTS;
use chidori_protocol::desc::{CallDesc, Dir, RecordChecks, Wire};

use crate::memory::{self, Effect};

/// One descriptor's checks.
pub struct CallChecks {
    /// What the call does to the session's memory.
    pub effect: Effect,
    /// Handle parameters never NULL.
    pub required: Vec<u8>,
    /// Handle parameters that may be NULL although their kind never is (`null_ok`).
    pub null_ok: Vec<u8>,
    /// Restricted parameters: (index, allowed values).
    pub params: Vec<(u8, &'static [u64])>,
    /// Device parameters' extents: (parameter, count parameter, bytes per unit).
    pub extents: Vec<(u8, u8, u64)>,
    /// Pitched extents: (parameter, pitch, width, height).
    pub extents_2d: Vec<(u8, u8, u8, u8)>,
    /// Host arrays of device addresses: (parameter, sizes parameter).
    pub address_arrays: Vec<(u8, Option<u8>)>,
    /// Per parameter, the checks of the record it carries (in the newest layout the
    /// descriptor serves).
    pub records: Vec<Option<&'static RecordChecks>>,
    /// Records that name device memory (`crate::records`): (parameter, record type, whether
    /// the library reads it, whether it writes it).
    pub memory_records: Vec<(usize, &'static str, bool, bool)>,
    /// A capture's end (cudaStreamEndCapture, cuStreamEndCapture and their `_ptsz` forms:
    /// stream, graph out), whose graph the session keeps for `GraphList::Ended`.
    pub capture_end: bool,
    /// A capture's beginning (`cudaStreamBeginCapture*`, `cuStreamBeginCapture*`).
    pub capture_begin: bool,
    /// Input arrays of a length only their data gives (`crate::told`).
    pub told: bool,
    /// Hands out, with one reference more, a handle the program may already hold
    /// (`cuMemRetainAllocationHandle`: `Handles::insert_reference`).
    pub retains: bool,
}

impl CallChecks {
    fn of(desc: &CallDesc) -> CallChecks {
        let name = desc.name;
        let records = desc
            .params
            .iter()
            .map(|wire| match *wire {
                Wire::Buf { record: Some(r), .. } => {
                    desc.versions.last().and_then(|v| chidori_cuda::checks::record(v, r))
                }
                _ => None,
            })
            .collect();
        CallChecks {
            effect: memory::effect(name),
            required: chidori_cuda::checks::required(name).collect(),
            null_ok: chidori_cuda::checks::null_ok(name).collect(),
            params: chidori_cuda::checks::params(name).collect(),
            extents: chidori_cuda::checks::extents(name).collect(),
            extents_2d: chidori_cuda::checks::extents_2d(name).collect(),
            address_arrays: chidori_cuda::checks::address_arrays(name).collect(),
            records,
            memory_records: desc
                .params
                .iter()
                .enumerate()
                .filter_map(|(i, wire)| match *wire {
                    Wire::Buf { dir, record: Some(r), .. } if crate::records::names_memory(r) => {
                        Some((i, r, dir != Dir::Out, dir != Dir::In))
                    }
                    _ => None,
                })
                .collect(),
            capture_end: matches!(
                chidori_protocol::desc::strip_suffixes(name, &["_ptsz"]),
                "cudaStreamEndCapture" | "cuStreamEndCapture"
            ),
            capture_begin: name.starts_with("cudaStreamBeginCapture") || name.starts_with("cuStreamBeginCapture"),
            told: crate::told::has_told(desc),
            retains: name == "cuMemRetainAllocationHandle",
        }
    }
}

/// The checks of `desc` (built for every descriptor on first use).
pub fn of(desc: &CallDesc) -> &'static CallChecks {
    static ALL: OnceLock<Vec<CallChecks>> = OnceLock::new();
    let all = ALL.get_or_init(|| VARIANTS.iter().map(|d| CallChecks::of(d)).collect());
    match all.get(desc.wire as usize) {
        Some(c) if VARIANTS[desc.wire as usize].name == desc.name => c,
        // Every descriptor a frame names is one of VARIANTS; one built elsewhere (a test's)
        // is looked up as it comes, and kept.
        _ => Box::leak(Box::new(CallChecks::of(desc))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An address the specs give an extent reaches the worker as device memory it checks
    /// (and names where the session has it), never as a plain value the library gets
    /// unchecked: cuMemcpyDtoDAsync_v2 once took any address.
    #[test]
    fn every_extent_names_a_checked_device_parameter() {
        let mut loose = Vec::new();
        for desc in VARIANTS {
            for (p, _, _) in chidori_cuda::checks::extents(desc.name) {
                match desc.params.get(usize::from(p)) {
                    Some(Wire::Device | Wire::ByValRecord { .. } | Wire::Buf { .. }) => {}
                    other => loose.push(format!("{} parameter {p}: {other:?}", desc.name)),
                }
            }
        }
        assert!(loose.is_empty(), "{} unchecked:\n{}", loose.len(), loose.join("\n"));
    }

    /// The driver's host copies travel in their custom `call` form, which must count as host
    /// copies as the runtime's own forms do (simpleMultiGPU's static runtime copies so).
    #[test]
    fn host_copies_are_known_in_every_form() {
        use chidori_cuda::calls::{cudart, driver};
        for desc in [
            &driver::cuMemcpyHtoDAsync_v2__call,
            &driver::cuMemcpyDtoH_v2__call,
            &driver::cuMemcpyHtoDAsync_v2_ptsz__call,
            &cudart::cudaMemcpyAsync__h2d,
            &cudart::cudaMemcpy__d2h,
        ] {
            assert!(desc.host_copy(), "{} {:?}", desc.name, desc.form);
        }
        for desc in [&driver::cuMemcpyDtoDAsync_v2, &cudart::cudaMemcpyAsync__d2d, &driver::cuMemsetD8_v2] {
            assert!(!desc.host_copy(), "{} {:?}", desc.name, desc.form);
        }
    }
}
