//! Pointer modes of BLAS handles: whether a call's scalars (alpha, beta, a reduction's
//! result) are host values, which travel with the call, or device addresses, which pass
//! through. cuBLAS keeps the mode per handle (`cublasSetPointerMode_v2`), cuBLASLt per
//! matmul descriptor (`CUBLASLT_MATMUL_DESC_POINTER_MODE`); both default to host. A
//! cuBLASLt host scalar is as wide as its descriptor's scale type, which no argument of
//! `cublasLtMatmul` gives: the client keeps it per descriptor.

use chidori_protocol::codec::ScalarMode;

use crate::state::CLIENT;

/// How the scalars of calls on `handle` travel (one lookup: the encoder asks per scalar).
pub fn mode(handle: u64) -> ScalarMode {
    CLIENT.scalar_modes.get(&handle).unwrap_or_default()
}

/// Whether scalars of calls on `handle` are device addresses.
pub fn device_mode(handle: u64) -> bool {
    mode(handle).device
}

/// Record the mode of `handle` (a new handle starts in host mode: call with false).
pub fn set_device_mode(handle: u64, device: bool) {
    CLIENT.scalar_modes.update(handle, |m| m.device = device);
}

/// Record the bytes of `handle`'s host scalars (None: not known, the widest is read).
pub fn set_size(handle: u64, bytes: Option<u64>) {
    CLIENT.scalar_modes.update(handle, |m| m.bytes = bytes);
}

/// Forget `handle` (destroyed).
pub fn forget(handle: u64) {
    CLIENT.scalar_modes.remove(&handle);
}

/// Bytes of one value of a `cudaDataType` (a cuBLASLt scale type); None for a type that is
/// no scale type.
pub fn data_type_bytes(data_type: u64) -> Option<u64> {
    use chidori_cuda::consts::cudaDataType_t as T;
    let t = u32::try_from(data_type).ok()?;
    Some(match t {
        T::CUDA_R_8I | T::CUDA_R_8U => 1,
        T::CUDA_R_16F | T::CUDA_R_16BF | T::CUDA_C_8I | T::CUDA_C_8U => 2,
        T::CUDA_R_32F | T::CUDA_R_32I | T::CUDA_R_32U | T::CUDA_C_16F | T::CUDA_C_16BF => 4,
        T::CUDA_R_64F | T::CUDA_C_32F | T::CUDA_C_32I | T::CUDA_C_32U => 8,
        T::CUDA_C_64F => 16,
        _ => return None,
    })
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

    #[test]
    fn scale_types_have_their_width() {
        use chidori_cuda::consts::cudaDataType_t as T;
        assert_eq!(data_type_bytes(u64::from(T::CUDA_R_32F)), Some(4));
        assert_eq!(data_type_bytes(u64::from(T::CUDA_C_64F)), Some(16));
        assert_eq!(data_type_bytes(u64::from(T::CUDA_R_16F)), Some(2));
        assert_eq!(data_type_bytes(9999), None);
        assert_eq!(mode(0x4321).bytes, None);
        set_size(0x4321, Some(4));
        assert_eq!(mode(0x4321).bytes, Some(4));
        forget(0x4321);
        assert_eq!(mode(0x4321).bytes, None);
    }
}
