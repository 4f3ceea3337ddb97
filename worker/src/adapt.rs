//! Calls of one CUDA version made with another version's library. A client sends the
//! variant its own headers declare; a few runtime functions kept their name across versions
//! while their parameters changed (CUDA 13 added edge data to 12.x's graph calls and a
//! `cudaMemLocation` to the managed-memory hints; 12.0 changed 11.8's instantiation and
//! update), so the server's library may take other arguments than the client sent. Where
//! the meaning carries over, the arguments are rewritten here; where it does not, the call
//! is refused with the reason (never passed to a function of another signature).

use chidori_cuda::calls::VARIANTS;
use chidori_protocol::desc::CallDesc;
use chidori_worker_gen::signature;

use crate::backend::Backend;

/// The variant of `desc`'s function that the headers of `version` declare: `desc` itself
/// where it names that version (None: no variant does).
pub fn variant_of(desc: &'static CallDesc, version: &str) -> Option<&'static CallDesc> {
    if desc.versions.contains(&version) {
        return Some(desc);
    }
    VARIANTS.iter().copied().find(|v| v.call == desc.call && v.versions.contains(&version))
}

/// Execute `desc` on `backend` with `args`: as it is where the backend's library declares it
/// alike, else rewritten for the variant the library declares ([`call`]).
///
/// # Safety
/// As [`Backend::invoke`].
pub unsafe fn invoke(backend: &dyn Backend, desc: &'static CallDesc, args: &[u64]) -> Result<u64, String> {
    let server = backend.server_variant(desc).unwrap_or(desc);
    if std::ptr::eq(server, desc) || signature(server.wire) == signature(desc.wire) {
        // SAFETY: forwarded contract.
        return unsafe { backend.invoke(desc, args) };
    }
    // SAFETY: forwarded contract; `call` lays out `server`'s arguments.
    unsafe { call(desc, server, args, |a| backend.invoke(server, a)) }
}

/// `cudaCpuDeviceId`: the device ordinal 11.8 and 12.x name the host by (a macro of the
/// runtime's header, not an enum, so not among the generated constants).
const CPU_DEVICE: i32 = -1;
const LOCATION_DEVICE: i32 = chidori_cuda::consts::cudaMemLocationType::cudaMemLocationTypeDevice as i32;
const LOCATION_HOST: i32 = chidori_cuda::consts::cudaMemLocationType::cudaMemLocationTypeHost as i32;

/// Call `to` (the server's variant) for a call the client made as `from`, with `from`'s
/// raw arguments rewritten by `call`; Err names what does not carry over.
///
/// # Safety
/// `args` are `from`'s raw arguments as the worker laid them out (addresses of its buffers
/// for pointers); `call` calls the server's function with `to`'s arguments.
pub unsafe fn call(
    from: &CallDesc,
    to: &CallDesc,
    args: &[u64],
    call: impl FnOnce(&[u64]) -> Result<u64, String>,
) -> Result<u64, String> {
    let (old, new) = (from.params.len(), to.params.len());
    let name = chidori_protocol::desc::strip_suffixes(from.name, &["_ptsz", "_ptds"]);
    let refuse = |why: &str| {
        Err(format!(
            "{} of CUDA {} cannot be made with the server's CUDA {}: {why}",
            from.name,
            from.versions.last().copied().unwrap_or("?"),
            to.versions.last().copied().unwrap_or("?"),
        ))
    };
    let arg = |i: usize| args.get(i).copied().unwrap_or(0);
    match (name, old, new) {
        // 12.x (graph, from, to, count) and 13.x (graph, from, to, edgeData, count);
        // 12.x (stream, dependencies, count, flags) and 13.x (..., dependencyData, count, flags).
        ("cudaGraphAddDependencies" | "cudaGraphRemoveDependencies", 4, 5) => {
            call(&[arg(0), arg(1), arg(2), 0, arg(3)])
        }
        ("cudaStreamUpdateCaptureDependencies", 4, 5) => call(&[arg(0), arg(1), 0, arg(2), arg(3)]),
        ("cudaGraphAddDependencies" | "cudaGraphRemoveDependencies", 5, 4) if arg(3) == 0 => {
            call(&[arg(0), arg(1), arg(2), arg(4)])
        }
        ("cudaStreamUpdateCaptureDependencies", 5, 4) if arg(2) == 0 => call(&[arg(0), arg(1), arg(3), arg(4)]),
        ("cudaGraphAddDependencies" | "cudaGraphRemoveDependencies" | "cudaStreamUpdateCaptureDependencies", 5, 4) => {
            refuse("edge data needs CUDA 12.3 or later on the server")
        }
        // 11.8 (stream, status, id) and 13.x (..., graph, dependencies, edgeData, count),
        // whose further outputs may be NULL.
        ("cudaStreamGetCaptureInfo", 3, 7) => call(&[arg(0), arg(1), arg(2), 0, 0, 0, 0]),
        // 12.x (ptr, count, dstDevice, stream) and 13.x (ptr, count, location, flags, stream);
        // 12.x (ptr, count, advice, device) and 13.x (ptr, count, advice, location).
        ("cudaMemPrefetchAsync", 4, 5) => {
            let location = location_of(arg(2) as i32);
            call(&[arg(0), arg(1), location.as_ptr() as u64, 0, arg(3)])
        }
        ("cudaMemAdvise", 4, 4) if is_device_form(from) => {
            let location = location_of(arg(3) as i32);
            call(&[arg(0), arg(1), arg(2), location.as_ptr() as u64])
        }
        ("cudaMemPrefetchAsync", 5, 4) if arg(3) == 0 => match device_of(arg(2)) {
            Some(device) => call(&[arg(0), arg(1), device as u32 as u64, arg(4)]),
            None => refuse("only a device or the host can be named to a CUDA 12 runtime"),
        },
        ("cudaMemAdvise", 4, 4) => match device_of(arg(3)) {
            Some(device) => call(&[arg(0), arg(1), arg(2), device as u32 as u64]),
            None => refuse("only a device or the host can be named to a CUDA 12 runtime"),
        },
        ("cudaMemPrefetchAsync", 5, 4) => refuse("prefetch flags need CUDA 13 on the server"),
        // 11.8 (exec, graph, errorNode, log, logSize) and 12.x (exec, graph, flags): 11.8's
        // error node and log stay empty.
        ("cudaGraphInstantiate", 5, 3) => call(&[arg(0), arg(1), 0]),
        ("cudaGraphInstantiate", 3, 5) if arg(2) == 0 => call(&[arg(0), arg(1), 0, 0, 0]),
        ("cudaGraphInstantiate", 3, 5) => refuse("instantiation flags need CUDA 12 on the server"),
        // 11.8 (exec, graph, errorNode, result) and 12.x (exec, graph, resultInfo).
        ("cudaGraphExecUpdate", 4, 3) => {
            // cudaGraphExecUpdateResultInfo: result (an enum), errorNode, errorFromNode.
            let mut info = [0u64; 3];
            let r = call(&[arg(0), arg(1), info.as_mut_ptr() as u64])?;
            // SAFETY: 11.8's outputs are the worker's buffers of an enum and a node handle
            // (or NULL where the client passed none).
            unsafe {
                if arg(3) != 0 {
                    std::ptr::write_unaligned(arg(3) as *mut u32, info[0] as u32);
                }
                if arg(2) != 0 {
                    std::ptr::write_unaligned(arg(2) as *mut u64, info[1]);
                }
            }
            Ok(r)
        }
        _ => refuse("its parameters differ between the two versions"),
    }
}

/// Whether `desc` is 12.x's form of cudaMemAdvise (a device ordinal where 13.x has a
/// location): its last parameter travels as a plain value, 13.x's as a record.
fn is_device_form(desc: &CallDesc) -> bool {
    matches!(desc.params.last(), Some(chidori_protocol::desc::Wire::Val { .. }))
}

/// A `cudaMemLocation` for 12.x's device ordinal (`cudaCpuDeviceId`: the host).
fn location_of(device: i32) -> Box<[i32; 2]> {
    Box::new(if device == CPU_DEVICE { [LOCATION_HOST, 0] } else { [LOCATION_DEVICE, device] })
}

/// 12.x's device ordinal for a `cudaMemLocation` at `addr` (a device, or the host as
/// `cudaCpuDeviceId`); None for a NUMA node or an unknown type.
fn device_of(addr: u64) -> Option<i32> {
    if addr == 0 {
        return None;
    }
    // SAFETY: a by-value record travels as the address of the worker's copy of its bytes.
    let [kind, id] = unsafe { std::ptr::read_unaligned(addr as *const [i32; 2]) };
    match kind {
        LOCATION_DEVICE => Some(id),
        LOCATION_HOST => Some(CPU_DEVICE),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn variant(name: &str, version: &str) -> &'static CallDesc {
        VARIANTS
            .iter()
            .copied()
            .find(|d| d.name == name && d.form.is_none() && d.versions.contains(&version))
            .unwrap_or_else(|| panic!("{name} of {version}"))
    }

    #[test]
    fn twelve_s_calls_reach_thirteen_s_functions_with_their_meaning() {
        let (from, to) = (variant("cudaGraphAddDependencies", "12.8"), variant("cudaGraphAddDependencies", "13.0"));
        assert_eq!(variant_of(from, "13.0").map(|d| d.wire), Some(to.wire));
        let mut seen = Vec::new();
        // SAFETY: no pointer is dereferenced.
        let r = unsafe {
            call(from, to, &[10, 11, 12, 3], |a| {
                seen.extend_from_slice(a);
                Ok(0)
            })
        };
        assert_eq!((r, seen), (Ok(0), vec![10, 11, 12, 0, 3]));

        let (from, to) = (variant("cudaMemPrefetchAsync", "12.8"), variant("cudaMemPrefetchAsync", "13.0"));
        for (device, location) in [(2u64, [1, 2]), (u64::from(u32::MAX), [2, 0])] {
            let mut got = None;
            // SAFETY: the location the adapter passes is read while it lives.
            let r = unsafe {
                call(from, to, &[0x1000, 64, device, 5], |a| {
                    got = Some((a.len(), std::ptr::read_unaligned(a[2] as *const [i32; 2]), a[3], a[4]));
                    Ok(0)
                })
            };
            assert_eq!((r, got), (Ok(0), Some((5, location, 0, 5))), "device {device}");
        }
        let (from, to) = (variant("cudaMemAdvise", "12.8"), variant("cudaMemAdvise", "13.0"));
        let mut got = None;
        // SAFETY: as above.
        let r = unsafe {
            call(from, to, &[0x1000, 64, 3, 0], |a| {
                got = Some(std::ptr::read_unaligned(a[3] as *const [i32; 2]));
                Ok(0)
            })
        };
        assert_eq!((r, got), (Ok(0), Some([1, 0])));
    }

    #[test]
    fn what_does_not_carry_over_is_refused_with_the_reason() {
        let (from, to) = (variant("cudaGraphAddDependencies", "13.0"), variant("cudaGraphAddDependencies", "12.8"));
        // SAFETY: the callback is never reached.
        let r = unsafe { call(from, to, &[1, 2, 3, 0x5000, 1], |_| panic!("called")) };
        assert!(r.unwrap_err().contains("edge data needs CUDA 12.3"));
        // Without edge data, 13.x's call is 12.x's.
        let mut seen = Vec::new();
        // SAFETY: no pointer is dereferenced.
        let r = unsafe {
            call(from, to, &[1, 2, 3, 0, 1], |a| {
                seen.extend_from_slice(a);
                Ok(0)
            })
        };
        assert_eq!((r, seen), (Ok(0), vec![1, 2, 3, 1]));
        let (from, to) = (variant("cufftXtSetDistribution", "12.1"), variant("cufftXtSetDistribution", "11.8"));
        // SAFETY: the callback is never reached.
        let r = unsafe { call(from, to, &[0; 8], |_| panic!("called")) };
        assert!(r.unwrap_err().contains("parameters differ"), "unknown pairs are refused");
    }
}
