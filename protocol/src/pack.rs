//! Buffers that travel compressed ([`crate::messages::COMPRESSED_FLAG`]): a zstd frame at
//! level 1, made only where it is at least 10% smaller (most dense floats gain less:
//! `interposer/benches/zstd_tensors.rs`), and expanded into exactly the bytes expected.
//! The client compresses large inputs, the worker large outputs a call asked for
//! compressed ([`crate::frame::OUTPUTS_COMPRESSED`]).

use crate::messages::{COMPRESS_MAX, COMPRESS_MIN};

/// The first bytes of a buffer compressed to judge whether the whole is worth it.
const SAMPLE: usize = 64 << 10;

/// `bytes` as one zstd frame, where they are between [`COMPRESS_MIN`] and
/// [`COMPRESS_MAX`] long and the frame is at least 10% smaller; None elsewhere (judged on a
/// sample first, so bytes that do not compress cost little).
pub fn compress(bytes: &[u8]) -> Option<Vec<u8>> {
    let len = bytes.len() as u64;
    if !(COMPRESS_MIN..=COMPRESS_MAX).contains(&len) {
        return None;
    }
    let worth = |packed: usize, of: usize| packed * 10 <= of * 9;
    if bytes.len() > SAMPLE && !worth(zstd::bulk::compress(&bytes[..SAMPLE], 1).ok()?.len(), SAMPLE) {
        return None;
    }
    let packed = zstd::bulk::compress(bytes, 1).ok()?;
    worth(packed.len(), bytes.len()).then_some(packed)
}

/// Expand `frame` into `out`, which it must fill exactly; never more than `out.len()`
/// bytes are made, whatever the frame claims.
pub fn expand_into(frame: &[u8], out: &mut [u8]) -> Result<(), String> {
    match zstd::bulk::decompress_to_buffer(frame, out) {
        Ok(n) if n == out.len() => Ok(()),
        Ok(n) => Err(format!("compressed bytes expand to {n}, not {}", out.len())),
        Err(e) => Err(format!("compressed bytes do not expand to {} bytes: {e}", out.len())),
    }
}

/// Expand `frame` into a new buffer of exactly `len` bytes.
pub fn expand(frame: &[u8], len: usize) -> Result<Vec<u8>, String> {
    let mut out = vec![0u8; len];
    expand_into(frame, &mut out)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compressible_bytes_round_trip_and_others_stay_as_they_are() {
        let zeros = vec![0u8; 1 << 20];
        let packed = compress(&zeros).expect("zeros compress");
        assert!(packed.len() < 1024);
        assert_eq!(expand(&packed, zeros.len()).unwrap(), zeros);
        // Too small, too large, incompressible: sent as they are.
        assert!(compress(&[0u8; 1024]).is_none());
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let noise: Vec<u8> = (0..1 << 20)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        assert!(compress(&noise).is_none());
    }

    #[test]
    fn a_frame_never_makes_more_or_fewer_bytes_than_expected() {
        let packed = compress(&vec![3u8; 1 << 20]).unwrap();
        assert!(expand(&packed, (1 << 20) - 1).unwrap_err().contains("do not expand"));
        assert!(expand(&packed, (1 << 20) + 1).unwrap_err().contains("expand to 1048576"));
        assert!(expand(b"not a zstd frame", 16).is_err());
    }
}
