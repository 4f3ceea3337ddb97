//! Pointer modes of BLAS handles: whether a call's scalars (alpha, beta, a reduction's
//! result) are host values, which travel with the call, or device addresses, which pass
//! through. cuBLAS keeps the mode per handle (`cublasSetPointerMode_v2`), cuBLASLt per
//! matmul descriptor (`CUBLASLT_MATMUL_DESC_POINTER_MODE`); both default to host.

use crate::state::CLIENT;

/// Whether scalars of calls on `handle` are device addresses.
pub fn device_mode(handle: u64) -> bool {
    CLIENT.device_modes.contains(&handle)
}

/// Record the mode of `handle` (a new handle starts in host mode: call with false).
pub fn set_device_mode(handle: u64, device: bool) {
    if device {
        CLIENT.device_modes.insert(handle, ());
    } else {
        CLIENT.device_modes.remove(&handle);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_start_in_host_mode_and_switch() {
        assert!(!device_mode(0x1234));
        set_device_mode(0x1234, true);
        assert!(device_mode(0x1234));
        assert!(!device_mode(0x1235));
        set_device_mode(0x1234, false);
        assert!(!device_mode(0x1234));
    }
}
