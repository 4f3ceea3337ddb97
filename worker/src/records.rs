//! Device memory named inside input records: the pointer sides of 2D and 3D copies
//! (`cudaMemcpy3DParms`, `CUDA_MEMCPY2D`, `CUDA_MEMCPY3D`), memsets
//! (`cudaMemsetParams`, `CUDA_MEMSET_NODE_PARAMS`), the linear and pitched memory of
//! texture and surface objects (`cudaResourceDesc`, `CUDA_RESOURCE_DESC`) and the words
//! batched stream memory operations wait on, write or reduce into
//! (`CUstreamBatchMemOpParams`), and the buffers of hardware decompressions
//! (`CUmemDecompressParams`). The worker checks
//! every span against the session's memory before the library sees the record, as it checks
//! device arguments (a pointer into the worker's own memory is never passed on), and gives
//! the record the address where the session has the memory (a stand-in of the client's
//! pageable memory lies elsewhere than the client names it: `crate::mirror`).
//!
//! Hand-written because the span is arithmetic over several fields (pitch × rows × depth
//! from a position), which a spec cannot say. Offsets of the records' own fields come from
//! the generated layouts of the server's CUDA version; the nested position, pitched-pointer
//! and extent types and the resource unions have had one layout since CUDA 3.
//! Widths counted in array elements (a copy between memory and an array) are checked as
//! bytes: the span checked is never larger than the one used, and the GPU keeps what lies
//! past it inside the session's own address space.

use chidori_cuda::consts::{CUmemorytype_enum, CUresourcetype_enum, CUstreamBatchMemOpType_enum};
use chidori_cuda::structs;

/// A span of device memory a record names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    /// The first byte and how many.
    pub start: u64,
    pub len: u64,
    /// The pointer field the span is counted from: its offset in the record, its value.
    pub field: usize,
    pub base: u64,
}

/// `CUmemorytype` values of the driver's copy records that name device memory (records
/// hold them in 64-bit words here).
const CU_MEMORYTYPE_DEVICE: u64 = CUmemorytype_enum::CU_MEMORYTYPE_DEVICE as u64;
const CU_MEMORYTYPE_UNIFIED: u64 = CUmemorytype_enum::CU_MEMORYTYPE_UNIFIED as u64;

/// Resource types whose union holds device memory: linear and pitch 2D (same values in
/// the runtime's and the driver's enums).
const RESOURCE_LINEAR: u64 = CUresourcetype_enum::CU_RESOURCE_TYPE_LINEAR as u64;
const RESOURCE_PITCH2D: u64 = CUresourcetype_enum::CU_RESOURCE_TYPE_PITCH2D as u64;
const _: () = {
    use chidori_cuda::consts::cudaResourceType as runtime;
    assert!(RESOURCE_LINEAR == runtime::cudaResourceTypeLinear as u64);
    assert!(RESOURCE_PITCH2D == runtime::cudaResourceTypePitch2D as u64);
};

/// `CUstreamBatchMemOpType`: the operations that name a word of device memory, and those
/// that name none (a flush of remote writes, a memory barrier).
const MEM_OP_WAIT_VALUE_32: u64 = CUstreamBatchMemOpType_enum::CU_STREAM_MEM_OP_WAIT_VALUE_32 as u64;
const MEM_OP_WRITE_VALUE_32: u64 = CUstreamBatchMemOpType_enum::CU_STREAM_MEM_OP_WRITE_VALUE_32 as u64;
const MEM_OP_FLUSH_REMOTE_WRITES: u64 = CUstreamBatchMemOpType_enum::CU_STREAM_MEM_OP_FLUSH_REMOTE_WRITES as u64;
const MEM_OP_WAIT_VALUE_64: u64 = CUstreamBatchMemOpType_enum::CU_STREAM_MEM_OP_WAIT_VALUE_64 as u64;
const MEM_OP_WRITE_VALUE_64: u64 = CUstreamBatchMemOpType_enum::CU_STREAM_MEM_OP_WRITE_VALUE_64 as u64;
const MEM_OP_BARRIER: u64 = CUstreamBatchMemOpType_enum::CU_STREAM_MEM_OP_BARRIER as u64;
const MEM_OP_ATOMIC_REDUCTION: u64 = CUstreamBatchMemOpType_enum::CU_STREAM_MEM_OP_ATOMIC_REDUCTION as u64;
/// Where the members of the operation union hold their address (CUDA 11.8 to 13.1; the
/// unit test checks them against every generated layout): a wait's and a write's at 8, an
/// atomic reduction's at 16 after its operator and data type (a `u32` at 12).
const MEM_OP_VALUE_ADDRESS: usize = 8;
const MEM_OP_REDUCTION_DATA_TYPE: usize = 12;
const MEM_OP_REDUCTION_ADDRESS: usize = 16;
/// `CUstreamAtomicReductionDataType`: a 32-bit word (else 64).
const REDUCTION_UNSIGNED_32: u64 =
    chidori_cuda::consts::CUstreamAtomicReductionDataType_enum::CU_STREAM_ATOMIC_REDUCTION_UNSIGNED_32 as u64;

struct Fields<'a> {
    map: &'static structs::StructMap,
    bytes: &'a [u8],
}

impl Fields<'_> {
    fn offset(&self, name: &str) -> Result<usize, String> {
        let f = self.map.fields.iter().find(|f| f.name == name);
        f.map(|f| f.offset as usize).ok_or_else(|| format!("{} has no field {name}", self.map.name))
    }

    /// The little-endian word of `size` bytes (at most 8) at `at`.
    fn word_at(&self, at: usize, size: usize) -> Result<u64, String> {
        let end = at.checked_add(size).ok_or("offset overflow")?;
        let b = self.bytes.get(at..end).ok_or_else(|| format!("{} is shorter than {end} bytes", self.map.name))?;
        let mut w = [0u8; 8];
        w[..size].copy_from_slice(b);
        Ok(u64::from_le_bytes(w))
    }

    /// A field of 8 bytes (or of its own size, up to 8), plus `extra` bytes into it.
    fn word(&self, name: &str, extra: usize) -> Result<u64, String> {
        let f = self.map.fields.iter().find(|f| f.name == name);
        let f = f.ok_or_else(|| format!("{} has no field {name}", self.map.name))?;
        let size = if extra > 0 { 8 } else { (f.size as usize).min(8) };
        self.word_at(f.offset as usize + extra, size)
    }
}

/// The bytes `(depth - 1) × slice + (height - 1) × pitch + width` a box spans (0 when
/// empty); None past the address space.
fn span_3d(pitch: u64, slice: u64, width: u64, height: u64, depth: u64) -> Option<u64> {
    if width == 0 || height == 0 || depth == 0 {
        return Some(0);
    }
    (depth - 1).checked_mul(slice)?.checked_add((height - 1).checked_mul(pitch)?)?.checked_add(width)
}

/// `base + z × slice + y × pitch + x`; None past the address space.
fn at_3d(base: u64, x: u64, y: u64, z: u64, pitch: u64, slice: u64) -> Option<u64> {
    base.checked_add(z.checked_mul(slice)?)?.checked_add(y.checked_mul(pitch)?)?.checked_add(x)
}

/// Add the span of `len` bytes at `start` of memory based at `base`, the pointer field at
/// `field` (NULL with bytes to touch is refused, whatever offset it is given).
fn push(
    spans: &mut Vec<Span>,
    what: &str,
    (field, base): (usize, u64),
    start: Option<u64>,
    len: Option<u64>,
) -> Result<(), String> {
    let (Some(start), Some(len)) = (start, len) else { return Err(format!("{what}: a span past the address space")) };
    if len > 0 {
        if base == 0 {
            return Err(format!("{what}: NULL for {len} bytes"));
        }
        spans.push(Span { start, len, field, base });
    }
    Ok(())
}

/// Whether only where each span of this record type starts must be the session's memory
/// (`span_start` in its spec).
pub fn checks_start_only(record: &str) -> bool {
    chidori_cuda::checks::SPAN_STARTS.binary_search(&record).is_ok()
}

/// Whether records of this type name device memory (the types this module reads).
pub fn names_memory(record: &str) -> bool {
    chidori_cuda::checks::SPANS.binary_search(&record).is_ok()
}

/// The device spans an input record of type `record` names, read from `bytes` in the
/// layout of CUDA `version`. Ok(empty) for records that name none (or a type this module
/// does not know); Err: the record is malformed or names an impossible span.
pub fn device_spans(record: &str, version: &str, bytes: &[u8]) -> Result<Vec<Span>, String> {
    if !names_memory(record) {
        return Ok(Vec::new());
    }
    let map = structs::get(version, record).ok_or_else(|| format!("no layout of {record} at CUDA {version}"))?;
    let f = Fields { map, bytes };
    let mut spans = Vec::new();
    match record {
        "cudaMemcpy3DParms" | "cudaMemcpy3DPeerParms" => {
            // extent: width, height, depth (size_t each); a pitched pointer: ptr, pitch,
            // xsize, ysize; a position: x, y, z.
            let (w, h, d) = (f.word("extent", 0)?, f.word("extent", 8)?, f.word("extent", 16)?);
            for side in ["src", "dst"] {
                if f.word(&format!("{side}Array"), 0)? != 0 {
                    continue;
                }
                let (ptr, pos) = (format!("{side}Ptr"), format!("{side}Pos"));
                let (base, pitch, ysize) = (f.word(&ptr, 0)?, f.word(&ptr, 8)?, f.word(&ptr, 24)?.max(1));
                let slice = pitch.checked_mul(ysize);
                let (x, y, z) = (f.word(&pos, 0)?, f.word(&pos, 8)?, f.word(&pos, 16)?);
                let start = slice.and_then(|s| at_3d(base, x, y, z, pitch, s));
                let len = slice.and_then(|s| span_3d(pitch, s, w, h, d));
                push(&mut spans, &format!("{record}.{side}Ptr"), (f.offset(&ptr)?, base), start, len)?;
            }
        }
        "cudaMemsetParams" | "CUDA_MEMSET_NODE_PARAMS_st" => {
            let (dst, pitch) = (f.word("dst", 0)?, f.word("pitch", 0)?);
            let (elem, w, h) = (f.word("elementSize", 0)?, f.word("width", 0)?, f.word("height", 0)?);
            let len = w.checked_mul(elem).and_then(|row| span_3d(pitch, 0, row, h, 1));
            push(&mut spans, &format!("{record}.dst"), (f.offset("dst")?, dst), Some(dst), len)?;
        }
        "CUDA_MEMCPY2D_st" | "CUDA_MEMCPY3D_st" | "CUDA_MEMCPY3D_PEER_st" => {
            let three = record != "CUDA_MEMCPY2D_st";
            let (w, h) = (f.word("WidthInBytes", 0)?, f.word("Height", 0)?);
            let d = if three { f.word("Depth", 0)? } else { 1 };
            for side in ["src", "dst"] {
                let ty = f.word(&format!("{side}MemoryType"), 0)?;
                if ty != CU_MEMORYTYPE_DEVICE && ty != CU_MEMORYTYPE_UNIFIED {
                    continue;
                }
                let field = format!("{side}Device");
                let base = f.word(&field, 0)?;
                let pitch = f.word(&format!("{side}Pitch"), 0)?;
                let rows = if three { f.word(&format!("{side}Height"), 0)?.max(1) } else { 1 };
                let (x, y) = (f.word(&format!("{side}XInBytes"), 0)?, f.word(&format!("{side}Y"), 0)?);
                let z = if three { f.word(&format!("{side}Z"), 0)? } else { 0 };
                let slice = pitch.checked_mul(rows);
                let start = slice.and_then(|s| at_3d(base, x, y, z, pitch, s));
                let len = slice.and_then(|s| span_3d(pitch, s, w, h, d));
                push(&mut spans, &format!("{record}.{field}"), (f.offset(&field)?, base), start, len)?;
            }
        }
        "cudaResourceDesc" | "CUDA_RESOURCE_DESC_st" => {
            let ty = f.word("resType", 0)?;
            let res = f.offset("res")?;
            // The runtime's channel description (20 bytes) sits between the pointer and the
            // sizes; the driver's format and channel count take 8.
            let sizes = if record == "cudaResourceDesc" { 32 } else { 16 };
            let word = |at: usize| f.word_at(res + at, 8);
            match ty {
                RESOURCE_LINEAR => {
                    let base = word(0)?;
                    let (what, size) = (format!("{record}.linear"), Some(word(sizes)?));
                    push(&mut spans, &what, (res, base), Some(base), size)?;
                }
                RESOURCE_PITCH2D => {
                    let (base, w, h, pitch) = (word(0)?, word(sizes)?, word(sizes + 8)?, word(sizes + 16)?);
                    let what = format!("{record}.pitch2D");
                    push(&mut spans, &what, (res, base), Some(base), span_3d(pitch, 0, w, h, 1))?;
                }
                _ => {}
            }
        }
        "CUstreamBatchMemOpParams_union" => {
            let (at, len) = match f.word("operation", 0)? {
                MEM_OP_WAIT_VALUE_32 | MEM_OP_WRITE_VALUE_32 => (MEM_OP_VALUE_ADDRESS, 4),
                MEM_OP_WAIT_VALUE_64 | MEM_OP_WRITE_VALUE_64 => (MEM_OP_VALUE_ADDRESS, 8),
                MEM_OP_ATOMIC_REDUCTION => {
                    let ty = f.word_at(MEM_OP_REDUCTION_DATA_TYPE, 4)?;
                    (MEM_OP_REDUCTION_ADDRESS, if ty == REDUCTION_UNSIGNED_32 { 4 } else { 8 })
                }
                MEM_OP_FLUSH_REMOTE_WRITES | MEM_OP_BARRIER => return Ok(spans),
                // A later release's operation may name memory where this one cannot tell.
                other => return Err(format!("{record}: operation {other} is not one this server knows")),
            };
            let base = f.word_at(at, 8)?;
            push(&mut spans, &format!("{record}.address"), (at, base), Some(base), Some(len))?;
        }
        "CUmemDecompressParams_st" => {
            // What the decompression writes is known only once it has: the destination is
            // checked for the bytes the program expects (dstNumBytes, optional: at least its
            // first byte), as the driver is told.
            let (src_len, dst_len) = (f.word("srcNumBytes", 0)?, f.word("dstNumBytes", 0)?.max(1));
            for (field, len) in [("src", src_len), ("dst", dst_len), ("dstActBytes", 4)] {
                let base = f.word(field, 0)?;
                push(&mut spans, &format!("{record}.{field}"), (f.offset(field)?, base), Some(base), Some(len))?;
            }
        }
        // A spec said `spans` for a record this module cannot read: refused, not passed.
        other => return Err(format!("{other}: which memory it names is not known to this server")),
    }
    Ok(spans)
}

/// Rename the memory the records in `bytes` name (records of type `record` back to back, each
/// in the layout of CUDA `version`): `place` is given each span and says where its first
/// byte is to be named instead (`Ok(None)`: where it is); the pointer field then names that
/// place, the span's offset from the field kept. Err: a record is malformed or names an
/// impossible span, or `place` refused a span (its reason).
pub fn rename_spans(
    record: &str,
    version: &str,
    bytes: &mut [u8],
    mut place: impl FnMut(&Span) -> Result<Option<u64>, String>,
) -> Result<(), String> {
    let size = structs::get(version, record).map_or(bytes.len(), |m| m.size as usize).max(1);
    for one in bytes.chunks_mut(size) {
        for span in device_spans(record, version, one)? {
            if let Some(at) = place(&span)?
                && let Some(field) = one.get_mut(span.field..span.field + 8)
            {
                field.copy_from_slice(&at.wrapping_sub(span.start - span.base).to_le_bytes());
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(bytes: &mut [u8], at: usize, value: u64) {
        bytes[at..at + 8].copy_from_slice(&value.to_le_bytes());
    }

    /// The (start, bytes) of each span.
    fn plain(spans: Result<Vec<Span>, String>) -> Vec<(u64, u64)> {
        spans.unwrap().iter().map(|s| (s.start, s.len)).collect()
    }

    #[test]
    fn a_3d_copy_names_its_pointer_sides() {
        let map = structs::get("13.0", "cudaMemcpy3DParms").unwrap();
        let mut r = vec![0u8; map.size as usize];
        // srcPtr (32): ptr, pitch 512, xsize, ysize 4; srcPos (8): x 16, y 1, z 0;
        // dstArray (64) set: the destination is an array. extent (128): 100 × 2 × 1.
        put(&mut r, 32, 0x10_0000);
        put(&mut r, 40, 512);
        put(&mut r, 56, 4);
        put(&mut r, 8, 16);
        put(&mut r, 16, 1);
        put(&mut r, 64, 0xabc);
        put(&mut r, 128, 100);
        put(&mut r, 136, 2);
        put(&mut r, 144, 1);
        let spans = device_spans("cudaMemcpy3DParms", "13.0", &r).unwrap();
        assert_eq!(spans, [Span { start: 0x10_0000 + 512 + 16, len: 512 + 100, field: 32, base: 0x10_0000 }]);
        // A pointer side at NULL with a nonzero extent is refused.
        put(&mut r, 32, 0);
        assert!(device_spans("cudaMemcpy3DParms", "13.0", &r).is_err());
        // An extent past the address space is refused.
        put(&mut r, 32, 0x10_0000);
        put(&mut r, 144, u64::MAX);
        assert!(device_spans("cudaMemcpy3DParms", "13.0", &r).is_err());
    }

    /// Each operation of a batch names its word (a NULL one is refused), the flush and the
    /// barrier none, an operation this server does not know is refused; the offsets are
    /// those of every CUDA release's layout.
    #[test]
    fn batched_memory_operations_name_their_words() {
        const R: &str = "CUstreamBatchMemOpParams_union";
        let op = |ty: u32, at: usize, address: u64| {
            let mut r = vec![0u8; 48];
            r[..4].copy_from_slice(&ty.to_le_bytes());
            put(&mut r, at, address);
            r
        };
        assert_eq!(plain(device_spans(R, "13.0", &op(1, 8, 0x40_0000))), [(0x40_0000, 4)]);
        assert_eq!(plain(device_spans(R, "13.0", &op(2, 8, 0x40_0000))), [(0x40_0000, 4)]);
        assert_eq!(plain(device_spans(R, "13.0", &op(4, 8, 0x40_0008))), [(0x40_0008, 8)]);
        assert_eq!(plain(device_spans(R, "12.1", &op(5, 8, 0x40_0008))), [(0x40_0008, 8)]);
        let mut reduce = op(8, 16, 0x40_0010);
        reduce[12..16].copy_from_slice(&14u32.to_le_bytes());
        assert_eq!(plain(device_spans(R, "13.1", &reduce)), [(0x40_0010, 4)]);
        reduce[12..16].copy_from_slice(&22u32.to_le_bytes());
        assert_eq!(plain(device_spans(R, "13.1", &reduce)), [(0x40_0010, 8)]);
        assert_eq!(device_spans(R, "13.0", &op(2, 8, 0x40_0000)).unwrap()[0].field, 8);
        assert!(plain(device_spans(R, "13.0", &op(3, 8, 0x40_0000))).is_empty(), "a flush names no memory");
        assert!(plain(device_spans(R, "13.0", &op(6, 8, 0))).is_empty(), "nor does a barrier");
        assert!(device_spans(R, "13.0", &op(2, 8, 0)).is_err(), "a write to NULL");
        assert!(device_spans(R, "13.0", &op(99, 8, 0x40_0000)).is_err(), "an unknown operation");
        assert!(device_spans(R, "13.0", &[2, 0, 0]).is_err(), "a torn record");
        // The members' layouts, from the headers of every release (the struct maps hold
        // only the union).
        let ir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../generated/ir");
        for version in ["11.8", "12.1", "12.6", "12.8", "13.0", "13.1"] {
            assert_eq!(structs::get(version, R).map(|m| m.size), Some(48), "{version}");
            let text = std::fs::read_to_string(ir.join(version).join("driver.jsonl")).unwrap();
            let record = |member: &str| -> Option<serde_json::Value> {
                let name = format!("{R}_CUstreamMemOp{member}Params_st");
                text.lines()
                    .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
                    .find(|v| v["name"] == name)
            };
            let offset = |v: &serde_json::Value, field: &str| {
                v["fields"].as_array()?.iter().find(|f| f["name"] == field)?["offset"].as_u64().map(|o| o as usize)
            };
            for member in ["WaitValue", "WriteValue"] {
                let v = record(member).unwrap_or_else(|| panic!("{version} {member}"));
                assert_eq!(offset(&v, "address"), Some(MEM_OP_VALUE_ADDRESS), "{version} {member}");
            }
            if let Some(v) = record("AtomicReduction") {
                assert_eq!(offset(&v, "address"), Some(MEM_OP_REDUCTION_ADDRESS), "{version}");
                assert_eq!(offset(&v, "dataType"), Some(MEM_OP_REDUCTION_DATA_TYPE), "{version}");
            }
        }
    }

    /// Each record of an array is renamed where `place` says, the offset from its pointer
    /// field kept; a refusal is the whole array's.
    #[test]
    fn spans_of_every_record_are_renamed_where_placed() {
        const R: &str = "CUstreamBatchMemOpParams_union";
        let mut ops = vec![0u8; 96];
        for (i, address) in [(0usize, 0x40_0000u64), (48, 0x50_0004)] {
            ops[i..i + 4].copy_from_slice(&2u32.to_le_bytes());
            put(&mut ops, i + 8, address);
        }
        let moved = |s: &Span| Ok((s.start >= 0x50_0000).then(|| 0x90_0000 + (s.start - 0x50_0000)));
        rename_spans(R, "13.0", &mut ops, moved).unwrap();
        assert_eq!(plain(device_spans(R, "13.0", &ops[..48])), [(0x40_0000, 4)], "left where it was");
        assert_eq!(plain(device_spans(R, "13.0", &ops[48..])), [(0x90_0004, 4)], "named where placed");
        let refused = rename_spans(R, "13.0", &mut ops, |s| Err(format!("{:#x}", s.start)));
        assert_eq!(refused, Err("0x400000".to_owned()));
    }

    #[test]
    fn a_decompression_names_its_source_destination_and_count() {
        const R: &str = "CUmemDecompressParams_st";
        let map = structs::get("13.0", R).unwrap();
        let f = |n: &str| map.fields.iter().find(|x| x.name == n).unwrap().offset as usize;
        let mut r = vec![0u8; map.size as usize];
        put(&mut r, f("srcNumBytes"), 100);
        put(&mut r, f("src"), 0x50_0000);
        put(&mut r, f("dst"), 0x60_0000);
        put(&mut r, f("dstActBytes"), 0x70_0000);
        assert_eq!(plain(device_spans(R, "13.0", &r)), [(0x50_0000, 100), (0x60_0000, 1), (0x70_0000, 4)]);
        put(&mut r, f("dstNumBytes"), 4096);
        assert_eq!(plain(device_spans(R, "13.0", &r))[1], (0x60_0000, 4096));
        put(&mut r, f("dstActBytes"), 0);
        assert!(device_spans(R, "13.0", &r).is_err(), "the count's word is required");
    }

    #[test]
    fn driver_copies_name_device_sides_only() {
        let map = structs::get("13.0", "CUDA_MEMCPY2D_st").unwrap();
        let f = |n: &str| map.fields.iter().find(|x| x.name == n).unwrap().offset as usize;
        let mut r = vec![0u8; map.size as usize];
        r[f("srcMemoryType")..f("srcMemoryType") + 4].copy_from_slice(&2u32.to_le_bytes());
        put(&mut r, f("srcDevice"), 0x20_0000);
        put(&mut r, f("srcPitch"), 256);
        r[f("dstMemoryType")..f("dstMemoryType") + 4].copy_from_slice(&3u32.to_le_bytes());
        put(&mut r, f("WidthInBytes"), 64);
        put(&mut r, f("Height"), 3);
        assert_eq!(plain(device_spans("CUDA_MEMCPY2D_st", "13.0", &r)), [(0x20_0000, 2 * 256 + 64)]);
        assert_eq!(device_spans("CUDA_MEMCPY2D_st", "13.0", &r).unwrap()[0].field, f("srcDevice"));
    }

    #[test]
    fn a_chained_device_resource_is_refused_where_the_record_can_chain() {
        for (version, name) in [
            ("13.1", "CUdevResource_st"),
            ("13.5", "CUdevResource_st"),
            ("13.1", "cudaDevResource_st"),
            ("13.5", "cudaDevResource_st"),
        ] {
            let checks = chidori_cuda::checks::record(version, name).unwrap_or_else(|| panic!("{name} at {version}"));
            let map = structs::get(version, name).unwrap();
            let at = map.fields.iter().find(|f| f.name == "nextResource").unwrap().offset as usize;
            let mut r = vec![0u8; map.size as usize];
            checks.apply(&mut r, |_, v| Some(v)).expect("an unchained resource passes");
            put(&mut r, at, 0x7fff_0000_1000);
            assert!(
                checks.apply(&mut r, |_, v| Some(v)).is_err(),
                "{name} at {version}: a pointer the library would follow"
            );
        }
        let before = chidori_cuda::checks::record("13.0", "CUdevResource_st").expect("13.0 checks");
        assert!(before.allow.is_empty(), "no such field before 13.1");
    }

    /// Every record a spec says the worker checks span by span (`spans`) is one this module
    /// reads, at every version that has it.
    #[test]
    fn every_record_checked_span_by_span_is_read_here() {
        assert!(chidori_cuda::checks::SPANS.len() >= 11, "{:?}", chidori_cuda::checks::SPANS);
        for record in chidori_cuda::checks::SPANS {
            for (version, _) in structs::BY_VERSION {
                let Some(map) = structs::get(version, record) else { continue };
                let zeroed = vec![0u8; map.size as usize];
                if let Err(why) = device_spans(record, version, &zeroed) {
                    assert!(!why.contains("not known to this server"), "{record} at {version}: {why}");
                }
            }
        }
    }

    /// NCCL's configuration names strings in the client's memory: at every version, one
    /// that sets a name is refused (NCCL would read the server's memory there), and one
    /// that leaves them NULL passes.
    #[test]
    fn every_nccl_configuration_refuses_the_clients_strings() {
        let mut seen = 0;
        for (version, maps) in structs::BY_VERSION {
            for map in maps.iter().filter(|m| m.name.starts_with("ncclConfig_v")) {
                let checks = chidori_cuda::checks::record(version, map.name)
                    .unwrap_or_else(|| panic!("{} at {version}: no checks", map.name));
                for field in map.fields.iter().filter(|f| matches!(f.name, "netName" | "commName")) {
                    let mut r = vec![0u8; map.size as usize];
                    checks.apply(&mut r, |_, v| Some(v)).expect("NULL names pass");
                    put(&mut r, field.offset as usize, 0x7fff_0000_2000);
                    assert!(
                        checks.apply(&mut r, |_, v| Some(v)).is_err(),
                        "{}.{} at {version}: a client's string passed",
                        map.name,
                        field.name
                    );
                    seen += 1;
                }
            }
        }
        assert!(seen >= structs::BY_VERSION.len(), "{seen} fields checked");
    }

    #[test]
    fn memsets_and_linear_resources() {
        let map = structs::get("13.0", "cudaMemsetParams").unwrap();
        let mut r = vec![0u8; map.size as usize];
        let f = |n: &str| map.fields.iter().find(|x| x.name == n).unwrap();
        put(&mut r, f("dst").offset as usize, 0x30_0000);
        put(&mut r, f("pitch").offset as usize, 1024);
        let (e, w, h) = (f("elementSize"), f("width"), f("height"));
        r[e.offset as usize..e.offset as usize + e.size as usize]
            .copy_from_slice(&4u32.to_le_bytes()[..e.size as usize]);
        put(&mut r, w.offset as usize, 10);
        put(&mut r, h.offset as usize, 2);
        assert_eq!(plain(device_spans("cudaMemsetParams", "13.0", &r)), [(0x30_0000, 1024 + 40)]);

        let map = structs::get("13.0", "cudaResourceDesc").unwrap();
        let mut r = vec![0u8; map.size as usize];
        r[0..4].copy_from_slice(&2u32.to_le_bytes());
        put(&mut r, 8, 0x40_0000);
        put(&mut r, 8 + 32, 4096);
        assert_eq!(
            device_spans("cudaResourceDesc", "13.0", &r).unwrap(),
            [Span { start: 0x40_0000, len: 4096, field: 8, base: 0x40_0000 }]
        );
        assert!(device_spans("cudaPos", "13.0", &r).unwrap().is_empty(), "a record naming no memory");
    }
}
