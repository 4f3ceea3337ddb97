//! Fat binaries: finding one in memory, picking the entries the server's GPU needs, and
//! (for drivers without cuKernelGetParamInfo) reading kernel parameter layouts from a
//! cubin's `.nv.info` sections. Entries may be raw, LZ4 (flag 0x2000) or zstd (0x8000).
//! Format notes: ../shared/notes/cuda-internals.md §3.

use std::collections::HashMap;

pub const FATBIN_MAGIC: u32 = 0xBA55_ED50;
const HEADER_LEN: usize = 16;
const KIND_PTX: u16 = 1;
const KIND_ELF: u16 = 2;
const FLAG_LZ4: u64 = 0x2000;
const FLAG_ZSTD: u64 = 0x8000;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FatbinError {
    #[error("not a fat binary (magic {0:#x})")]
    Magic(u32),
    #[error("truncated fat binary")]
    Truncated,
    #[error("entry compressed with flags {0:#x}: cannot decompress: {1}")]
    Decompress(u64, String),
}

/// One entry of a fat binary.
#[derive(Debug, Clone, Copy)]
pub struct Entry<'a> {
    pub kind: u16,
    pub arch: u32,
    pub flags: u64,
    /// Header and payload, as stored.
    pub raw: &'a [u8],
    /// The payload alone (possibly compressed).
    pub payload: &'a [u8],
    pub compressed_size: u32,
    pub uncompressed_size: u64,
}

impl Entry<'_> {
    pub fn is_elf(&self) -> bool {
        self.kind == KIND_ELF
    }

    pub fn is_ptx(&self) -> bool {
        self.kind == KIND_PTX
    }

    /// The payload decompressed (or as stored when not compressed).
    pub fn decompressed(&self) -> Result<Vec<u8>, FatbinError> {
        let data = if self.compressed_size > 0 {
            self.payload.get(..self.compressed_size as usize).ok_or(FatbinError::Truncated)?
        } else {
            self.payload
        };
        if self.flags & FLAG_LZ4 != 0 {
            lz4_flex::block::decompress(data, self.uncompressed_size as usize)
                .map_err(|e| FatbinError::Decompress(self.flags, e.to_string()))
        } else if self.flags & FLAG_ZSTD != 0 {
            zstd::bulk::decompress(data, self.uncompressed_size as usize)
                .map_err(|e| FatbinError::Decompress(self.flags, e.to_string()))
        } else {
            Ok(data.to_vec())
        }
    }
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// Total length (header included) of the fat binary starting at `b`.
pub fn total_len(b: &[u8]) -> Result<usize, FatbinError> {
    let magic = u32_at(b, 0).ok_or(FatbinError::Truncated)?;
    if magic != FATBIN_MAGIC {
        return Err(FatbinError::Magic(magic));
    }
    let header = u16_at(b, 6).ok_or(FatbinError::Truncated)? as usize;
    let size = u64_at(b, 8).ok_or(FatbinError::Truncated)? as usize;
    Ok(header.max(HEADER_LEN) + size)
}

/// The entries of one fat binary.
pub fn entries(b: &[u8]) -> Result<Vec<Entry<'_>>, FatbinError> {
    let total = total_len(b)?;
    let b = b.get(..total).ok_or(FatbinError::Truncated)?;
    let mut at = u16_at(b, 6).ok_or(FatbinError::Truncated)? as usize;
    let mut out = Vec::new();
    while at < total {
        let kind = u16_at(b, at).ok_or(FatbinError::Truncated)?;
        let header = u32_at(b, at + 4).ok_or(FatbinError::Truncated)? as usize;
        let size = u64_at(b, at + 8).ok_or(FatbinError::Truncated)? as usize;
        if header < 0x40 {
            return Err(FatbinError::Truncated);
        }
        let end = at.checked_add(header).and_then(|x| x.checked_add(size)).ok_or(FatbinError::Truncated)?;
        let raw = b.get(at..end).ok_or(FatbinError::Truncated)?;
        out.push(Entry {
            kind,
            arch: u32_at(raw, 0x1c).ok_or(FatbinError::Truncated)?,
            flags: u64_at(raw, 0x28).ok_or(FatbinError::Truncated)?,
            payload: &raw[header..],
            raw,
            compressed_size: u32_at(raw, 0x10).ok_or(FatbinError::Truncated)?,
            uncompressed_size: u64_at(raw, 0x38).ok_or(FatbinError::Truncated)?,
        });
        at = end;
    }
    Ok(out)
}

/// A fat binary holding only what a GPU of compute capability `sm` (90 for sm_90) needs:
/// the newest cubin it can run (same major version, minor not above), and the newest PTX
/// not above it as a fallback. None when nothing fits (the caller then sends the whole fat
/// binary and lets the driver report it).
pub fn select(b: &[u8], sm: u32) -> Result<Option<Vec<u8>>, FatbinError> {
    let all = entries(b)?;
    let cubin = all.iter().filter(|e| e.is_elf() && e.arch / 10 == sm / 10 && e.arch <= sm).max_by_key(|e| e.arch);
    let ptx = all.iter().filter(|e| e.is_ptx() && e.arch <= sm).max_by_key(|e| e.arch);
    let chosen: Vec<&Entry<'_>> = cubin.into_iter().chain(ptx).collect();
    if chosen.is_empty() {
        return Ok(None);
    }
    let size: usize = chosen.iter().map(|e| e.raw.len()).sum();
    let mut out = Vec::with_capacity(HEADER_LEN + size);
    out.extend_from_slice(&FATBIN_MAGIC.to_le_bytes());
    out.extend_from_slice(&1u16.to_le_bytes());
    out.extend_from_slice(&(HEADER_LEN as u16).to_le_bytes());
    out.extend_from_slice(&(size as u64).to_le_bytes());
    for e in chosen {
        out.extend_from_slice(e.raw);
    }
    Ok(Some(out))
}

/// Kernel parameter layouts from a cubin's `.nv.info.<kernel>` sections
/// (EIATTR_KPARAM_INFO records): kernel name → [(offset, size)] in parameter order.
pub fn kernel_params(cubin: &[u8]) -> HashMap<String, Vec<(u32, u32)>> {
    use object::{Object, ObjectSection};
    let mut out = HashMap::new();
    let Ok(file) = object::File::parse(cubin) else { return out };
    for section in file.sections() {
        let Ok(name) = section.name() else { continue };
        let Some(kernel) = name.strip_prefix(".nv.info.") else { continue };
        let Ok(data) = section.data() else { continue };
        let mut params: Vec<(u16, u32, u32)> = Vec::new();
        let mut at = 0;
        while at + 2 <= data.len() {
            let (format, attribute) = (data[at], data[at + 1]);
            match format {
                // EIFMT_SVAL: u16 length, then the value.
                0x04 => {
                    let Some(len) = u16_at(data, at + 2) else { break };
                    let value = &data[(at + 4).min(data.len())..(at + 4 + len as usize).min(data.len())];
                    // EIATTR_KPARAM_INFO: index u32, ordinal u16, offset u16, packed u32.
                    if attribute == 0x17 && value.len() >= 12 {
                        let ordinal = u16_at(value, 4).unwrap_or(0);
                        let offset = u16_at(value, 6).unwrap_or(0);
                        let packed = u32_at(value, 8).unwrap_or(0);
                        params.push((ordinal, u32::from(offset), packed >> 18));
                    }
                    at += 4 + len as usize;
                }
                // EIFMT_HVAL (inline u16), EIFMT_BVAL and EIFMT_NVAL: four bytes in all.
                _ => at += 4,
            }
        }
        params.sort_by_key(|p| p.0);
        out.insert(kernel.to_owned(), params.into_iter().map(|(_, o, s)| (o, s)).collect());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> Vec<u8> {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/fatbin").join(name);
        std::fs::read(path).unwrap()
    }

    const KERN: &[(u32, u32)] = &[(0, 4), (8, 8), (16, 24), (40, 1), (48, 8)];

    #[test]
    fn zstd_and_lz4_entries_decompress_and_give_parameter_layouts() {
        for name in ["k_zstd.fatbin", "k_lz4.fatbin", "k_multi.fatbin"] {
            let b = fixture(name);
            assert_eq!(total_len(&b).unwrap(), b.len());
            let all = entries(&b).unwrap();
            let cubin = all.iter().find(|e| e.is_elf() && e.arch == 90).expect("an sm_90 cubin");
            let elf = cubin.decompressed().unwrap();
            assert_eq!(&elf[..4], b"\x7fELF", "{name}");
            let params = kernel_params(&elf);
            assert_eq!(params.get("_Z4kerni4S24Pf").or_else(|| params.values().find(|p| p.len() == 5)).unwrap(), KERN);
            let ptx = all.iter().find(|e| e.is_ptx()).expect("PTX");
            let text = ptx.decompressed().unwrap();
            assert!(String::from_utf8_lossy(&text).contains(".entry"), "{name}");
        }
    }

    #[test]
    fn selection_keeps_what_sm_90_runs() {
        let multi = fixture("k_multi.fatbin");
        let picked = select(&multi, 90).unwrap().unwrap();
        let kept = entries(&picked).unwrap();
        assert_eq!(kept.iter().map(|e| (e.kind, e.arch)).collect::<Vec<_>>(), vec![(KIND_ELF, 90), (KIND_PTX, 90)]);
        assert!(picked.len() < multi.len());
        // An sm_86 GPU runs the sm_80 cubin, and no PTX is newer than it allows.
        let for_86 = select(&multi, 86).unwrap().unwrap();
        assert_eq!(
            entries(&for_86).unwrap().iter().map(|e| (e.kind, e.arch)).collect::<Vec<_>>(),
            vec![(KIND_ELF, 80)]
        );
        // Nothing runs on sm_75.
        assert!(select(&multi, 75).unwrap().is_none());
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        assert_eq!(total_len(&[0; 4]).unwrap_err(), FatbinError::Magic(0));
        let mut b = fixture("k_zstd.fatbin");
        b.truncate(40);
        assert!(entries(&b).is_err());
        for cut in 0..200 {
            let b = fixture("k_lz4.fatbin");
            let _ = entries(&b[..cut.min(b.len())]);
        }
    }
}
