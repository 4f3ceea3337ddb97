//! The emulated backend's arrays, 3D memory, memory pools, texture and surface objects,
//! stream attributes and graphs, call by call. Records arrive in the server's layout (the
//! session translated them to CUDA 13.0's, `profile::PROPS_VERSION`); their offsets below
//! are that version's.

use std::sync::Arc;

use chidori_protocol::desc::{CallDesc, Wire};
use chidori_protocol::messages::{GraphList, GraphNode, NodeParams, NodeTarget};

use super::graphs::{self, Op, Region, kind};
use super::{
    ALIGN, CAPTURE_UNSUPPORTED, Emulated, ILLEGAL_STATE, INVALID_HANDLE, INVALID_VALUE, NOT_SUPPORTED, SUCCESS,
    put_u32, put_u64,
};
use crate::backend::{HostFn, NodeList, NodeMade};

use chidori_cuda::consts::{cudaError, cudaMemPoolAttr, cudaStreamCaptureStatus};

const INVALID_DEVICE: u64 = cudaError::cudaErrorInvalidDevice as u64;
const PEER_ACCESS_ALREADY_ENABLED: u64 = cudaError::cudaErrorPeerAccessAlreadyEnabled as u64;
const PEER_ACCESS_NOT_ENABLED: u64 = cudaError::cudaErrorPeerAccessNotEnabled as u64;

impl Emulated {
    /// cudaUserObjectRetain/Release and cudaGraphRetain/ReleaseUserObject (and the
    /// driver's): count the object's references, the program's and each graph's (a graph's
    /// go when it is destroyed).
    fn user_object_references(&self, name: &str, a: &[u64]) -> u64 {
        let graph = name.contains("Graph");
        let (object, count) = if graph { (a[1], a[2] & 0xffff_ffff) } else { (a[0], a[1] & 0xffff_ffff) };
        let mut s = self.state();
        if count == 0 || !s.user_objects.contains_key(&object) {
            return INVALID_VALUE;
        }
        match (graph, name.contains("Retain")) {
            (false, true) => {
                if let Some((references, _)) = s.user_objects.get_mut(&object) {
                    *references = references.saturating_add(count);
                }
                SUCCESS
            }
            (false, false) => {
                drop(s);
                self.release_user_object(object, count)
            }
            (true, true) => {
                // cudaGraphUserObjectMove (the driver's number: the runtime's enum is not among
                // the generated constants): the caller's references become the graph's.
                let flag = u64::from(chidori_cuda::consts::CUuserObjectRetain_flags_enum::CU_GRAPH_USER_OBJECT_MOVE);
                let moved = a.get(3).is_some_and(|f| f & flag != 0);
                if !moved && let Some((references, _)) = s.user_objects.get_mut(&object) {
                    *references = references.saturating_add(count);
                }
                *s.graph_user_objects.entry(a[0]).or_default().entry(object).or_default() += count;
                SUCCESS
            }
            (true, false) => {
                let held = s.graph_user_objects.get_mut(&a[0]).and_then(|m| m.get_mut(&object));
                match held {
                    Some(held) if *held >= count => *held -= count,
                    _ => return INVALID_VALUE,
                }
                drop(s);
                self.release_user_object(object, count)
            }
        }
    }

    /// Give up `count` references to a user object; the last one runs its destructor
    /// (outside the state's lock: it waits for the client).
    pub(super) fn release_user_object(&self, object: u64, count: u64) -> u64 {
        let mut s = self.state();
        let Some((references, _)) = s.user_objects.get_mut(&object) else { return INVALID_VALUE };
        if count > *references {
            return INVALID_VALUE;
        }
        *references -= count;
        if *references > 0 {
            return SUCCESS;
        }
        let destroy = s.user_objects.remove(&object).map(|(_, d)| d);
        drop(s);
        if let Some(destroy) = destroy {
            destroy(0, false);
        }
        SUCCESS
    }

    /// A graph's references to user objects go with it.
    fn release_graph_user_objects(&self, graph: u64) {
        let held = self.state().graph_user_objects.remove(&graph).unwrap_or_default();
        for (object, count) in held {
            self.release_user_object(object, count);
        }
    }

    /// Whether `ordinal` is one of the session's GPUs.
    fn is_device(&self, ordinal: i32) -> bool {
        usize::try_from(ordinal).is_ok_and(|d| d < self.profile.devices.len())
    }
}

/// An array: its bytes are the allocation at its handle, rows of `width` elements.
#[derive(Clone, Copy, Debug)]
pub struct ArrayInfo {
    pub elem: u64,
    pub width: u64,
    pub height: u64,
    pub depth: u64,
    pub flags: u32,
    /// The channel description (cudaChannelFormatDesc) or the driver's format and channels.
    pub channels: [i32; 5],
}

impl ArrayInfo {
    // Saturating: a hostile description never overflows; its allocation fails instead.
    fn pitch(&self) -> u64 {
        self.width.saturating_mul(self.elem)
    }

    fn slice(&self) -> u64 {
        self.pitch().saturating_mul(self.height.max(1))
    }

    fn bytes(&self) -> u64 {
        self.slice().saturating_mul(self.depth.max(1))
    }
}

/// A memory pool: its attributes, and the bytes allocated from it now and at most.
#[derive(Clone, Debug, Default)]
pub struct Pool {
    attributes: std::collections::HashMap<u32, u64>,
    used: u64,
    high: u64,
}

/// cudaMemPoolAttr / CUmemPool_attribute (the same numbers): reserved and used memory,
/// current and high.
const RESERVED_CURRENT: u32 = cudaMemPoolAttr::cudaMemPoolAttrReservedMemCurrent;
const RESERVED_HIGH: u32 = cudaMemPoolAttr::cudaMemPoolAttrReservedMemHigh;
const USED_CURRENT: u32 = cudaMemPoolAttr::cudaMemPoolAttrUsedMemCurrent;
const USED_HIGH: u32 = cudaMemPoolAttr::cudaMemPoolAttrUsedMemHigh;
const _: () = {
    use chidori_cuda::consts::CUmemPool_attribute_enum as driver;
    assert!(RESERVED_CURRENT == driver::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT);
    assert!(RESERVED_HIGH == driver::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH);
    assert!(USED_CURRENT == driver::CU_MEMPOOL_ATTR_USED_MEM_CURRENT);
    assert!(USED_HIGH == driver::CU_MEMPOOL_ATTR_USED_MEM_HIGH);
};

/// Records that may be NULL wherever they appear: a texture's resource view.
fn optional_record(record: Option<&str>) -> bool {
    matches!(record, Some("cudaResourceViewDesc" | "CUDA_RESOURCE_VIEW_DESC_st"))
}

/// Functions whose single input record may be NULL ("default parameters"), which the
/// emulation reads only when it is not.
fn optional_input(name: &str) -> bool {
    matches!(name, "cuCtxCreate_v4" | "cudaGraphInstantiateWithParams" | "cudaStreamBeginCaptureToGraph")
}

/// # Safety
/// `p` must be readable at `offset` for a T.
unsafe fn rd<T: Copy>(p: u64, offset: usize) -> T {
    // SAFETY: per the contract.
    unsafe { std::ptr::read_unaligned((p as usize + offset) as *const T) }
}

/// # Safety
/// `p` must be readable for `len` bytes.
unsafe fn bytes(p: u64, len: usize) -> Vec<u8> {
    // SAFETY: per the contract.
    unsafe { std::slice::from_raw_parts(p as *const u8, len) }.to_vec()
}

/// Bytes of the host buffer parameter `i` of `desc` (a record or an array of them).
fn buf_len(desc: &CallDesc, i: usize, a: &[u64]) -> usize {
    match desc.params.get(i) {
        Some(Wire::Buf { elem, len: None, .. }) => *elem as usize,
        Some(Wire::Buf { elem, len: Some(len), .. }) => len.eval(a).unwrap_or(0) as usize * *elem as usize,
        _ => 0,
    }
}

/// The node handles of a `handles(CUgraphNode_st)[n]` parameter.
///
/// # Safety
/// `p` must hold `n` handles (or be null).
unsafe fn nodes(p: u64, n: u64) -> Vec<u64> {
    if p == 0 {
        return Vec::new();
    }
    // SAFETY: per the contract; read element by element (the array need not be aligned).
    (0..n).map(|i| unsafe { std::ptr::read_unaligned((p as *const u64).wrapping_add(i as usize)) }).collect()
}

/// Bytes per element of a driver array format (CUarray_format) and channel count.
fn format_bytes(format: u32, channels: u32) -> u64 {
    use chidori_cuda::consts::CUarray_format_enum as f;
    let per = match format {
        f::CU_AD_FORMAT_UNSIGNED_INT8 | f::CU_AD_FORMAT_SIGNED_INT8 => 1,
        f::CU_AD_FORMAT_UNSIGNED_INT16 | f::CU_AD_FORMAT_SIGNED_INT16 | f::CU_AD_FORMAT_HALF => 2,
        _ => 4,
    };
    per * u64::from(channels.max(1))
}

impl Emulated {
    fn object(&self) -> u64 {
        let mut s = self.state();
        s.next_object += 1;
        s.next_object
    }

    fn new_array(&self, info: ArrayInfo) -> Result<u64, u64> {
        let handle = self.alloc(info.bytes().max(1))?;
        self.state().arrays.insert(handle, info);
        Ok(handle)
    }

    fn array(&self, handle: u64) -> Option<ArrayInfo> {
        self.state().arrays.get(&handle).copied()
    }

    /// The region of a 3D copy side: an array at a position in elements, or pitched memory
    /// at a position in bytes.
    fn side(&self, array: u64, pos: [u64; 3], ptr: [u64; 4]) -> Option<Region> {
        if array != 0 {
            let info = self.array(array)?;
            // Wrapping: a region is only used through the allocation map, which refuses
            // addresses outside it.
            let addr = array
                .wrapping_add(pos[2].wrapping_mul(info.slice()))
                .wrapping_add(pos[1].wrapping_mul(info.pitch()))
                .wrapping_add(pos[0].wrapping_mul(info.elem));
            return Some(Region { addr, pitch: info.pitch(), slice: info.slice() });
        }
        let [base, pitch, _, ysize] = ptr;
        let slice = pitch.wrapping_mul(ysize.max(1));
        Some(Region {
            addr: base
                .wrapping_add(pos[2].wrapping_mul(slice))
                .wrapping_add(pos[1].wrapping_mul(pitch))
                .wrapping_add(pos[0]),
            pitch,
            slice,
        })
    }

    /// A cudaMemcpy3DParms (160 bytes) as a region copy: srcArray@0, srcPos@8, srcPtr@32,
    /// dstArray@64, dstPos@72, dstPtr@96, extent@128. The extent counts an array's elements
    /// where one takes part.
    ///
    /// # Safety
    /// `p` must hold the record.
    unsafe fn copy_3d_op(&self, p: u64, peer: bool) -> Option<Op> {
        // The peer record puts the devices after each pointer: dst at 72, extent at 144.
        let (dst_at, extent_at) = if peer { (72, 144) } else { (64, 128) };
        // SAFETY (block): per the contract.
        unsafe {
            let (src_array, dst_array): (u64, u64) = (rd(p, 0), rd(p, dst_at));
            let src = self.side(src_array, rd(p, 8), rd(p, 32))?;
            let dst = self.side(dst_array, rd(p, dst_at + 8), rd(p, dst_at + 32))?;
            let extent: [u64; 3] = rd(p, extent_at);
            let elem =
                [src_array, dst_array].iter().find(|a| **a != 0).and_then(|a| self.array(*a)).map_or(1, |i| i.elem);
            Some(Op::Region { dst, src, width: extent[0].saturating_mul(elem), height: extent[1], depth: extent[2] })
        }
    }

    /// A CUDA_MEMCPY3D (200 bytes; `two_d`: a CUDA_MEMCPY2D, 128) as a region copy, between
    /// device memory and arrays (the worker refused host memory types).
    ///
    /// # Safety
    /// `p` must hold the record.
    unsafe fn cu_copy_op(&self, p: u64, two_d: bool) -> Option<Op> {
        // (x, y, z, type, device, array, pitch, rows) offsets of each side, and the extent's.
        let (src, dst, extent) = if two_d {
            (
                [0, 8, usize::MAX, 16, 32, 40, 48, usize::MAX],
                [56, 64, usize::MAX, 72, 88, 96, 104, usize::MAX],
                [112, 120],
            )
        } else {
            ([0, 8, 16, 32, 48, 56, 72, 80], [88, 96, 104, 120, 136, 144, 160, 168], [176, 184])
        };
        // SAFETY (block): per the contract.
        unsafe {
            let word = |at: usize| if at == usize::MAX { 0 } else { rd::<u64>(p, at) };
            let region = |o: [usize; 8]| -> Option<Region> {
                let (x, y, z, ty) = (word(o[0]), word(o[1]), word(o[2]), rd::<u32>(p, o[3]));
                if ty == chidori_cuda::consts::CUmemorytype_enum::CU_MEMORYTYPE_ARRAY {
                    let array = word(o[5]);
                    let info = self.array(array)?;
                    return Some(Region {
                        addr: array
                            .wrapping_add(z.wrapping_mul(info.slice()))
                            .wrapping_add(y.wrapping_mul(info.pitch()))
                            .wrapping_add(x),
                        pitch: info.pitch(),
                        slice: info.slice(),
                    });
                }
                let (pitch, rows) = (word(o[6]), word(o[7]).max(1));
                let slice = pitch.wrapping_mul(rows);
                let addr =
                    word(o[4]).wrapping_add(z.wrapping_mul(slice)).wrapping_add(y.wrapping_mul(pitch)).wrapping_add(x);
                Some(Region { addr, pitch, slice })
            };
            let depth = if two_d { 1 } else { rd::<u64>(p, 192) };
            Some(Op::Region {
                dst: region(dst)?,
                src: region(src)?,
                width: word(extent[0]),
                height: word(extent[1]),
                depth,
            })
        }
    }

    /// Run `op` now, or record it if `stream` is capturing.
    fn run_or_record(&self, stream: Option<u64>, kind: u32, op: Op) -> u64 {
        if let Some(s) = stream
            && let Some(status) = self.captured(s, Some((kind, op.clone())))
        {
            return status;
        }
        if stream.is_some_and(|s| !self.stream_ok(s)) {
            return INVALID_HANDLE;
        }
        self.replay(&[op])
    }

    /// Rows between an array (handle, x in bytes, row) and memory (worker buffer or device).
    #[allow(clippy::too_many_arguments)]
    fn array_rows(
        &self,
        array: u64,
        (x, y): (u64, u64),
        mem: u64,
        mem_device: bool,
        mem_pitch: u64,
        (width, height): (u64, u64),
        to_array: bool,
    ) -> u64 {
        let Some(info) = self.array(array) else { return INVALID_HANDLE };
        let inside = x.checked_add(width).is_some_and(|end| end <= info.pitch())
            && y.checked_add(height).is_some_and(|end| end <= info.height.max(1).saturating_mul(info.depth.max(1)));
        if !inside || (height > 1 && mem_pitch < width) {
            return INVALID_VALUE;
        }
        for r in 0..height {
            // Inside the array (checked above); the memory side is checked by the copy.
            let a = array + (y + r) * info.pitch() + x;
            let m = mem.wrapping_add(r.wrapping_mul(mem_pitch));
            // SAFETY: the array is an allocation; a host side is the session's buffer of
            // height * pitch bytes.
            let status = unsafe {
                if to_array {
                    self.copy(a, true, m, mem_device, width)
                } else {
                    self.copy(m, mem_device, a, true, width)
                }
            };
            if status != SUCCESS {
                return status;
            }
        }
        SUCCESS
    }

    /// `count` bytes between an array, from (x bytes, row y) on as one run, and memory.
    fn array_linear(
        &self,
        array: u64,
        (x, y): (u64, u64),
        mem: u64,
        mem_device: bool,
        count: u64,
        to_array: bool,
    ) -> u64 {
        let Some(info) = self.array(array) else { return INVALID_HANDLE };
        let start = y.checked_mul(info.pitch()).and_then(|r| r.checked_add(x));
        let Some(start) = start.filter(|s| s.checked_add(count).is_some_and(|end| end <= info.bytes())) else {
            return INVALID_VALUE;
        };
        // SAFETY: the array is an allocation; a host side is the session's buffer of `count` bytes.
        unsafe {
            if to_array {
                self.copy(array + start, true, mem, mem_device, count)
            } else {
                self.copy(mem, mem_device, array + start, true, count)
            }
        }
    }

    fn graph_status(&self, r: Result<u64, u64>, out: u64) -> u64 {
        match r {
            Ok(h) => {
                if out != 0 {
                    // SAFETY: the session's 8-byte buffer for the handle.
                    unsafe { put_u64(out, h) };
                }
                SUCCESS
            }
            Err(e) => e,
        }
    }

    /// The calls of the groups above; None: not one of them.
    ///
    /// # Safety
    /// As [`crate::backend::Backend::invoke`].
    pub(super) unsafe fn invoke_more(&self, desc: &'static CallDesc, name: &str, a: &[u64]) -> Option<u64> {
        if desc.library == "nccl" {
            // SAFETY: as below.
            return unsafe { self.invoke_nccl(name, a) };
        }
        if desc.library == "cublaslt" {
            // SAFETY: as below.
            return unsafe { self.invoke_cublaslt(desc, name, a) };
        }
        if desc.library == "nvml" {
            // SAFETY: as below.
            return unsafe { self.invoke_nvml(name, a) };
        }
        if name.contains("UserObject") {
            return Some(self.user_object_references(name, a));
        }
        if matches!(name, "cuDeviceGetDevResource" | "cuDevSmResourceSplitByCount") {
            // SAFETY: as below.
            return unsafe { self.invoke_sm_resources(name, a) };
        }
        if desc.library == "cusparselt" {
            // SAFETY: as below.
            return unsafe { self.invoke_cusparselt(name, a) };
        }
        if desc.library == "cublas" && name.starts_with("cublasXt") {
            // SAFETY: as below.
            return unsafe { self.invoke_cublas_xt(name, a) };
        }
        // Every function here reads its single input records (descriptions, extents,
        // parameters): NULL for one is an invalid value, as it is natively.
        let null_input = desc.params.iter().zip(a).any(|(w, &v)| match w {
            Wire::Buf { dir: chidori_protocol::desc::Dir::In, len: None, record, .. } => {
                v == 0 && !optional_record(*record)
            }
            _ => false,
        });
        if null_input && !optional_input(name) {
            return Some(INVALID_VALUE);
        }
        let device = |i: usize| matches!(desc.params.get(i), Some(Wire::Device));
        let stream_at = |i: usize| a.get(i).copied();
        // SAFETY (all arms): out-parameters and records are the session's buffers, sized by
        // the descriptor; device addresses are only looked up in the allocation map.
        let status =
            unsafe {
                match (desc.library, name) {
                    // ---- 3D memory ----
                    ("cudart", "cudaMalloc3D") => {
                        let [w, h, d]: [u64; 3] = rd(a[1], 0);
                        let pitch = w.max(1).div_ceil(ALIGN).saturating_mul(ALIGN);
                        match self.alloc(pitch.saturating_mul(h.max(1)).saturating_mul(d.max(1))) {
                            Ok(p) => {
                                for (i, v) in [p, pitch, w, h].into_iter().enumerate() {
                                    put_u64(a[0] + 8 * i as u64, v);
                                }
                                SUCCESS
                            }
                            Err(e) => e,
                        }
                    }
                    ("cudart", "cudaMemset3D" | "cudaMemset3DAsync") => {
                        let [ptr, pitch, _, ysize]: [u64; 4] = rd(a[0], 0);
                        let [w, h, d]: [u64; 3] = rd(a[2], 0);
                        let stream = if name == "cudaMemset3DAsync" { stream_at(3) } else { None };
                        if w == 0 || h == 0 || d == 0 {
                            return Some(SUCCESS);
                        }
                        // The whole extent must lie in one allocation (this also bounds the loop).
                        let slice = pitch.checked_mul(ysize.max(1));
                        let span = slice.and_then(|sl| sl.checked_mul(d.max(1)));
                        if span.is_none_or(|n| self.state().find(ptr, n).is_none()) || w > pitch || h > ysize.max(1) {
                            return Some(INVALID_VALUE);
                        }
                        let slice = slice.unwrap_or(0);
                        for z in 0..d.max(1) {
                            let at = ptr.wrapping_add(z.wrapping_mul(slice));
                            let op =
                                Op::Memset { dst: at, pitch, value: a[1] as u8 as u32, elem: 1, width: w, height: h };
                            let s = self.run_or_record(stream, kind::MEMSET, op);
                            if s != SUCCESS {
                                return Some(s);
                            }
                        }
                        SUCCESS
                    }
                    ("cudart", "cudaMemset2D" | "cudaMemset2DAsync") => {
                        let stream = if name == "cudaMemset2DAsync" { stream_at(5) } else { None };
                        let op = Op::Memset {
                            dst: a[0],
                            pitch: a[1],
                            value: a[2] as u8 as u32,
                            elem: 1,
                            width: a[3],
                            height: a[4],
                        };
                        self.run_or_record(stream, kind::MEMSET, op)
                    }
                    ("cudart", "cudaMemcpyPeer" | "cudaMemcpyPeerAsync") => {
                        let stream = if name == "cudaMemcpyPeerAsync" { stream_at(5) } else { None };
                        self.run_or_record(stream, kind::MEMCPY, Op::Copy { dst: a[0], src: a[2], len: a[4] })
                    }
                    // Every emulated GPU can reach every other's memory (as NVLink-connected
                    // GPUs of one box can); a GPU is not its own peer.
                    ("cudart", "cudaDeviceCanAccessPeer") => {
                        let (dev, peer) = (a[1] as i32, a[2] as i32);
                        if !self.is_device(dev) || !self.is_device(peer) {
                            INVALID_DEVICE
                        } else {
                            put_u32(a[0], u32::from(dev != peer));
                            SUCCESS
                        }
                    }
                    ("cudart", "cudaDeviceEnablePeerAccess") => {
                        let peer = a[0] as i32;
                        if !self.is_device(peer) {
                            INVALID_DEVICE
                        } else if self.state().peers.insert(peer) {
                            SUCCESS
                        } else {
                            PEER_ACCESS_ALREADY_ENABLED
                        }
                    }
                    ("cudart", "cudaDeviceDisablePeerAccess") => {
                        if self.state().peers.remove(&(a[0] as i32)) {
                            SUCCESS
                        } else {
                            PEER_ACCESS_NOT_ENABLED
                        }
                    }
                    // ---- Arrays ----
                    ("cudart", "cudaMallocArray" | "cudaMalloc3DArray") => {
                        let c: [i32; 5] = rd(a[1], 0);
                        let bits = c[..4].iter().map(|&b| i64::from(b)).sum::<i64>();
                        let elem = (bits.clamp(8, 1 << 20) / 8) as u64;
                        let (w, h, d, flags) = if name == "cudaMallocArray" {
                            (a[2], a[3], 0, a[4] as u32)
                        } else {
                            let e: [u64; 3] = rd(a[2], 0);
                            (e[0], e[1], e[2], a[3] as u32)
                        };
                        let info = ArrayInfo { elem, width: w, height: h, depth: d, flags, channels: c };
                        match self.new_array(info) {
                            Ok(h) => {
                                put_u64(a[0], h);
                                SUCCESS
                            }
                            Err(e) => e,
                        }
                    }
                    ("driver", "cuArrayCreate_v2" | "cuArray3DCreate_v2") => {
                        let three = name == "cuArray3DCreate_v2";
                        let (w, h): (u64, u64) = (rd(a[1], 0), rd(a[1], 8));
                        let d: u64 = if three { rd(a[1], 16) } else { 0 };
                        let (format, channels): (u32, u32) =
                            if three { (rd(a[1], 24), rd(a[1], 28)) } else { (rd(a[1], 16), rd(a[1], 20)) };
                        let flags: u32 = if three { rd(a[1], 32) } else { 0 };
                        let elem = format_bytes(format, channels);
                        let channels = [format as i32, channels as i32, 0, 0, 0];
                        match self.new_array(ArrayInfo { elem, width: w, height: h, depth: d, flags, channels }) {
                            Ok(h) => {
                                put_u64(a[0], h);
                                SUCCESS
                            }
                            Err(e) => e,
                        }
                    }
                    ("cudart", "cudaFreeArray") | ("driver", "cuArrayDestroy") => {
                        if self.state().arrays.remove(&a[0]).is_some() { self.free(a[0]) } else { INVALID_HANDLE }
                    }
                    ("cudart", "cudaArrayGetInfo") => match self.array(a[3]) {
                        Some(i) => {
                            if a[0] != 0 {
                                std::ptr::write_unaligned(a[0] as *mut [i32; 5], i.channels);
                            }
                            if a[1] != 0 {
                                std::ptr::write_unaligned(a[1] as *mut [u64; 3], [i.width, i.height, i.depth]);
                            }
                            if a[2] != 0 {
                                put_u32(a[2], i.flags);
                            }
                            SUCCESS
                        }
                        None => INVALID_HANDLE,
                    },
                    ("cudart", "cudaGetChannelDesc") => match self.array(a[1]) {
                        Some(i) => {
                            std::ptr::write_unaligned(a[0] as *mut [i32; 5], i.channels);
                            SUCCESS
                        }
                        None => INVALID_HANDLE,
                    },
                    ("driver", "cuArrayGetDescriptor_v2" | "cuArray3DGetDescriptor_v2") => match self.array(a[1]) {
                        Some(i) => {
                            let (format, channels) = (i.channels[0] as u32, i.channels[1] as u32);
                            if name == "cuArrayGetDescriptor_v2" {
                                std::ptr::write_unaligned(a[0] as *mut [u64; 2], [i.width, i.height]);
                                std::ptr::write_unaligned((a[0] + 16) as *mut [u32; 2], [format, channels]);
                            } else {
                                std::ptr::write_unaligned(a[0] as *mut [u64; 3], [i.width, i.height, i.depth]);
                                std::ptr::write_unaligned((a[0] + 24) as *mut [u32; 3], [format, channels, i.flags]);
                            }
                            SUCCESS
                        }
                        None => INVALID_HANDLE,
                    },
                    // (dst array, wOffset, hOffset, src, spitch, width, height, kind[, stream]).
                    ("cudart", "cudaMemcpy2DToArray" | "cudaMemcpy2DToArrayAsync") => {
                        let s = self.array_rows(a[0], (a[1], a[2]), a[3], device(3), a[4], (a[5], a[6]), true);
                        if name.ends_with("Async") && !self.stream_ok(a[8]) { INVALID_HANDLE } else { s }
                    }
                    // (dst, dpitch, src array, wOffset, hOffset, width, height, kind[, stream]).
                    ("cudart", "cudaMemcpy2DFromArray" | "cudaMemcpy2DFromArrayAsync") => {
                        self.array_rows(a[2], (a[3], a[4]), a[0], device(0), a[1], (a[5], a[6]), false)
                    }
                    // (dst array, wOffset, hOffset, src, count, kind[, stream]): one run of bytes.
                    ("cudart", "cudaMemcpyToArray" | "cudaMemcpyToArrayAsync") => {
                        self.array_linear(a[0], (a[1], a[2]), a[3], device(3), a[4], true)
                    }
                    ("cudart", "cudaMemcpyFromArray" | "cudaMemcpyFromArrayAsync") => {
                        self.array_linear(a[1], (a[2], a[3]), a[0], device(0), a[4], false)
                    }
                    ("driver", "cuMemcpyHtoA_v2" | "cuMemcpyHtoAAsync_v2") => {
                        self.array_linear(a[0], (a[1], 0), a[2], false, a[3], true)
                    }
                    ("driver", "cuMemcpyAtoH_v2" | "cuMemcpyAtoHAsync_v2") => {
                        self.array_linear(a[1], (a[2], 0), a[0], false, a[3], false)
                    }
                    ("cudart", "cudaMemcpy3D" | "cudaMemcpy3DAsync" | "cudaMemcpy3DPeer" | "cudaMemcpy3DPeerAsync") => {
                        let peer = name.contains("Peer");
                        let stream = if name.ends_with("Async") { stream_at(1) } else { None };
                        match self.copy_3d_op(a[0], peer) {
                            Some(op) => self.run_or_record(stream, kind::MEMCPY, op),
                            None => INVALID_HANDLE,
                        }
                    }
                    ("driver", "cuMemcpy2D_v2" | "cuMemcpy2DUnaligned_v2" | "cuMemcpy2DAsync_v2") => {
                        let stream = if name.ends_with("Async_v2") { stream_at(1) } else { None };
                        match self.cu_copy_op(a[0], true) {
                            Some(op) => self.run_or_record(stream, kind::MEMCPY, op),
                            None => INVALID_HANDLE,
                        }
                    }
                    ("driver", "cuMemcpy3D_v2" | "cuMemcpy3DAsync_v2") => {
                        let stream = if name.ends_with("Async_v2") { stream_at(1) } else { None };
                        match self.cu_copy_op(a[0], false) {
                            Some(op) => self.run_or_record(stream, kind::MEMCPY, op),
                            None => INVALID_HANDLE,
                        }
                    }
                    // ---- Texture and surface objects: their descriptors, kept ----
                    ("cudart", "cudaCreateTextureObject" | "cudaCreateSurfaceObject")
                    | ("driver", "cuTexObjectCreate" | "cuSurfObjectCreate") => {
                        let mut kept = Vec::new();
                        for i in 1..desc.params.len() {
                            let n = buf_len(desc, i, a);
                            kept.extend(if a[i] == 0 { vec![0; n] } else { bytes(a[i], n) });
                        }
                        // A resource descriptor's array must be live (the session mapped it);
                        // cudaResourceTypeArray and CU_RESOURCE_TYPE_ARRAY are the same number.
                        let res_type: u32 = rd(a[1], 0);
                        let array: u64 = rd(a[1], 8);
                        let of_array = res_type == chidori_cuda::consts::cudaResourceType::cudaResourceTypeArray;
                        if of_array && !self.state().arrays.contains_key(&array) {
                            return Some(INVALID_HANDLE);
                        }
                        let o = self.object();
                        self.state().objects.insert(o, kept);
                        put_u64(a[0], o);
                        SUCCESS
                    }
                    ("cudart", "cudaDestroyTextureObject" | "cudaDestroySurfaceObject")
                    | ("driver", "cuTexObjectDestroy" | "cuSurfObjectDestroy") => {
                        if self.state().objects.remove(&a[0]).is_some() { SUCCESS } else { INVALID_VALUE }
                    }
                    (
                        "cudart",
                        "cudaGetTextureObjectResourceDesc"
                        | "cudaGetTextureObjectTextureDesc"
                        | "cudaGetTextureObjectResourceViewDesc"
                        | "cudaGetSurfaceObjectResourceDesc",
                    )
                    | (
                        "driver",
                        "cuTexObjectGetResourceDesc"
                        | "cuTexObjectGetTextureDesc"
                        | "cuTexObjectGetResourceViewDesc"
                        | "cuSurfObjectGetResourceDesc",
                    ) => {
                        let Some(kept) = self.state().objects.get(&a[1]).cloned() else { return Some(INVALID_VALUE) };
                        let n = buf_len(desc, 0, a);
                        // The resource descriptor comes first, then the texture's, then the view's.
                        let (res, tex) = if desc.library == "cudart" { (144, 72) } else { (144, 104) };
                        let at = if name.contains("ResourceViewDesc") {
                            res + tex
                        } else if name.contains("TextureDesc") {
                            res
                        } else {
                            0
                        };
                        let part = kept.get(at..at + n).map(<[u8]>::to_vec).unwrap_or_else(|| vec![0; n]);
                        std::ptr::copy_nonoverlapping(part.as_ptr(), a[0] as *mut u8, n);
                        SUCCESS
                    }
                    // ---- Memory pools ----
                    ("cudart", "cudaDeviceGetDefaultMemPool" | "cudaDeviceGetMemPool")
                    | ("driver", "cuDeviceGetDefaultMemPool" | "cuDeviceGetMemPool") => {
                        let mut s = self.state();
                        if s.current_pool == 0 {
                            let p = s.handle();
                            s.pools.insert(p, Pool::default());
                            s.current_pool = p;
                        }
                        let p = if name.contains("Default") {
                            *s.pools.keys().min().unwrap_or(&s.current_pool)
                        } else {
                            s.current_pool
                        };
                        put_u64(a[0], p);
                        SUCCESS
                    }
                    ("cudart", "cudaDeviceSetMemPool") | ("driver", "cuDeviceSetMemPool") => {
                        let mut s = self.state();
                        if s.pools.contains_key(&a[1]) {
                            s.current_pool = a[1];
                            SUCCESS
                        } else {
                            INVALID_HANDLE
                        }
                    }
                    ("cudart", "cudaMemPoolCreate") | ("driver", "cuMemPoolCreate") => {
                        let mut s = self.state();
                        let p = s.handle();
                        s.pools.insert(p, Pool::default());
                        put_u64(a[0], p);
                        SUCCESS
                    }
                    ("cudart", "cudaMemPoolDestroy") | ("driver", "cuMemPoolDestroy") => {
                        if self.state().pools.remove(&a[0]).is_some() { SUCCESS } else { INVALID_HANDLE }
                    }
                    ("cudart", "cudaMemPoolSetAttribute") | ("driver", "cuMemPoolSetAttribute") if a[2] == 0 => {
                        INVALID_VALUE
                    }
                    ("cudart", "cudaMemPoolSetAttribute") | ("driver", "cuMemPoolSetAttribute") => {
                        let n = buf_len(desc, 2, a).min(8);
                        let mut v = [0u8; 8];
                        v[..n].copy_from_slice(&bytes(a[2], n));
                        let value = u64::from_le_bytes(v);
                        let mut s = self.state();
                        let Some(pool) = s.pools.get_mut(&a[0]) else { return Some(INVALID_HANDLE) };
                        match a[1] as u32 {
                            // Only the high-water marks may be set (to 0, which resets them).
                            RESERVED_HIGH | USED_HIGH if value == 0 => pool.high = pool.used,
                            RESERVED_CURRENT | USED_CURRENT | RESERVED_HIGH | USED_HIGH => return Some(INVALID_VALUE),
                            attr => {
                                pool.attributes.insert(attr, value);
                            }
                        }
                        SUCCESS
                    }
                    ("cudart", "cudaMemPoolGetAttribute") | ("driver", "cuMemPoolGetAttribute") => {
                        let n = buf_len(desc, 2, a).min(8);
                        let s = self.state();
                        let Some(pool) = s.pools.get(&a[0]) else { return Some(INVALID_HANDLE) };
                        let value = match a[1] as u32 {
                            RESERVED_CURRENT | USED_CURRENT => pool.used,
                            RESERVED_HIGH | USED_HIGH => pool.high,
                            attr => pool.attributes.get(&attr).copied().unwrap_or(0),
                        };
                        std::ptr::copy_nonoverlapping(value.to_le_bytes().as_ptr(), a[2] as *mut u8, n);
                        SUCCESS
                    }
                    ("cudart", "cudaMemPoolTrimTo" | "cudaMemPoolSetAccess")
                    | ("driver", "cuMemPoolTrimTo" | "cuMemPoolSetAccess") => {
                        if self.state().pools.contains_key(&a[0]) { SUCCESS } else { INVALID_HANDLE }
                    }
                    ("cudart", "cudaMemPoolGetAccess") | ("driver", "cuMemPoolGetAccess") => {
                        // The pool's device reads and writes it.
                        if self.state().pools.contains_key(&a[1]) {
                            put_u32(a[0], chidori_cuda::consts::cudaMemAccessFlags::cudaMemAccessFlagsProtReadWrite);
                            SUCCESS
                        } else {
                            INVALID_HANDLE
                        }
                    }
                    ("cudart", "cudaMallocFromPoolAsync") | ("driver", "cuMemAllocFromPoolAsync") => {
                        if !self.state().pools.contains_key(&a[2]) {
                            return Some(INVALID_HANDLE);
                        }
                        match self.alloc(a[1]) {
                            Ok(p) => {
                                let mut s = self.state();
                                s.pool_of.insert(p, (a[2], a[1]));
                                if let Some(pool) = s.pools.get_mut(&a[2]) {
                                    pool.used += a[1];
                                    pool.high = pool.high.max(pool.used);
                                }
                                put_u64(a[0], p);
                                SUCCESS
                            }
                            Err(e) => e,
                        }
                    }
                    ("cudart", "cudaFreeAsync") | ("driver", "cuMemFreeAsync")
                        if self.state().pool_of.contains_key(&a[0]) =>
                    {
                        let mut s = self.state();
                        if let Some((pool, size)) = s.pool_of.remove(&a[0])
                            && let Some(p) = s.pools.get_mut(&pool)
                        {
                            p.used = p.used.saturating_sub(size);
                        }
                        drop(s);
                        self.free(a[0])
                    }
                    // ---- Stream attributes: kept per stream ----
                    ("cudart", "cudaStreamSetAttribute") | ("driver", "cuStreamSetAttribute") => {
                        if !self.stream_ok(a[0]) {
                            return Some(INVALID_HANDLE);
                        }
                        if a[2] == 0 {
                            return Some(INVALID_VALUE);
                        }
                        self.state().stream_attributes.insert((a[0], a[1] as u32), bytes(a[2], 64));
                        SUCCESS
                    }
                    ("cudart", "cudaStreamGetAttribute") | ("driver", "cuStreamGetAttribute") => {
                        if !self.stream_ok(a[0]) {
                            return Some(INVALID_HANDLE);
                        }
                        let v =
                            self.state().stream_attributes.get(&(a[0], a[1] as u32)).cloned().unwrap_or(vec![0; 64]);
                        std::ptr::copy_nonoverlapping(v.as_ptr(), a[2] as *mut u8, 64);
                        SUCCESS
                    }
                    _ => return self.invoke_graph(desc, name, a),
                }
            };
        Some(status)
    }

    /// Graph calls; None: not one.
    ///
    /// # Safety
    /// cuBLASLt's handles and descriptors, and a heuristic that answers up to two made-up
    /// algorithms (their first word depends on `CHIDORI_EMULATED_SALT`, so a test can have a
    /// server answer differently than before); no matmul runs.
    ///
    /// # Safety
    /// As [`Emulated::invoke_more`].
    unsafe fn invoke_cublaslt(&self, desc: &'static CallDesc, name: &str, a: &[u64]) -> Option<u64> {
        // cuBLAS numbers its statuses its own way (1 is NOT_INITIALIZED there).
        const LT_INVALID_VALUE: u64 = chidori_cuda::consts::cublasStatus_t::CUBLAS_STATUS_INVALID_VALUE as u64;
        // SAFETY (all arms): out-parameters are the session's buffers, sized by the descriptor.
        let status = unsafe {
            match name {
                "cublasLtCreate"
                | "cublasLtMatmulDescCreate"
                | "cublasLtMatrixTransformDescCreate"
                | "cublasLtMatrixLayoutCreate"
                | "cublasLtMatmulPreferenceCreate" => {
                    let h = self.state().handle();
                    put_u64(a[0], h);
                    SUCCESS
                }
                "cublasLtDestroy"
                | "cublasLtMatmulDescDestroy"
                | "cublasLtMatrixLayoutDestroy"
                | "cublasLtMatmulPreferenceDestroy"
                | "cublasLtMatmulDescSetAttribute"
                | "cublasLtMatrixLayoutSetAttribute"
                | "cublasLtMatmulPreferenceSetAttribute"
                | "cublasLtMatrixTransformDescDestroy"
                | "cublasLtMatrixTransformDescSetAttribute" => SUCCESS,
                // Only the first element, float (C[0] = alpha A[0] + beta B[0]): enough to
                // see alpha and beta arrive as host values or at device addresses.
                "cublasLtMatrixTransform" => {
                    let mut state = self.state();
                    let mut float_at = |addr: u64| -> Option<f32> {
                        match state.find(addr, 4) {
                            Some(bytes) => Some(f32::from_le_bytes(bytes[..4].try_into().ok()?)),
                            // A host scalar: the session's buffer of it.
                            None if addr != 0 => Some(std::ptr::read_unaligned(addr as *const f32)),
                            None => None,
                        }
                    };
                    let (Some(alpha), Some(a0), Some(beta), Some(b0)) =
                        (float_at(a[2]), float_at(a[3]), float_at(a[5]), float_at(a[6]))
                    else {
                        return Some(LT_INVALID_VALUE);
                    };
                    match state.find(a[8], 4) {
                        Some(c) => {
                            c[..4].copy_from_slice(&(alpha * a0 + beta * b0).to_le_bytes());
                            SUCCESS
                        }
                        None => LT_INVALID_VALUE,
                    }
                }
                "cublasLtMatmulAlgoGetHeuristic" => {
                    let elem = match desc.params.get(8) {
                        Some(Wire::Buf { elem, .. }) => *elem as usize,
                        _ => return Some(LT_INVALID_VALUE),
                    };
                    let requested = a[7] as i32;
                    // A NULL results array reaches the backend as NULL (a getter's count query).
                    if requested <= 0 || a[8] == 0 || a[9] == 0 {
                        return Some(LT_INVALID_VALUE);
                    }
                    let salt = super::salt();
                    let n = requested.min(2);
                    let results = std::slice::from_raw_parts_mut(a[8] as *mut u8, elem * requested as usize);
                    for i in 0..n as usize {
                        let r = &mut results[i * elem..(i + 1) * elem];
                        r.fill(0);
                        r[..8].copy_from_slice(&(1000 + i as u64 + salt).to_le_bytes());
                        if elem >= 80 {
                            r[76..80].copy_from_slice(&1.0f32.to_le_bytes());
                        }
                    }
                    put_u32(a[9], n as u32);
                    SUCCESS
                }
                _ => return None,
            }
        };
        Some(status)
    }

    /// cuSPARSELt as far as its records go: each initializer writes a tag and what it was
    /// given into the record the worker passes (as the library fills the program's), and a
    /// matmul descriptor, selection and plan keep pointers to the records they were made
    /// from, which the library follows later (the workspace size reads the matrices through
    /// the plan). The matmul writes alpha (a host float, or the first of a device vector
    /// under vector scaling) × 1000 + beta into D's first float.
    ///
    /// # Safety
    /// As [`Emulated::invoke_more`]; record pointers are the worker's records (1 KiB) or
    /// NULL, which the decoder refused for the kinds that may not be.
    unsafe fn invoke_cusparselt(&self, name: &str, a: &[u64]) -> Option<u64> {
        const INVALID: u64 = chidori_cuda::consts::cusparseStatus_t::CUSPARSE_STATUS_INVALID_VALUE as u64;
        const HANDLE: u64 = 0x4c54_4841_4e44_4c45;
        const MATRIX: u64 = 0x4c54_4d41_5452_4958;
        const MATMUL: u64 = 0x4c54_4d41_544d_554c;
        const SELECTION: u64 = 0x4c54_5345_4c45_4354;
        const PLAN: u64 = 0x4c54_504c_414e_0000;
        const DESTROYED: u64 = 0x4445_4144;
        const ALPHA_VECTOR: u64 =
            chidori_cuda::consts::cusparseLtMatmulDescAttribute_t::CUSPARSELT_MATMUL_ALPHA_VECTOR_SCALING as u64;
        // SAFETY: every pointer read is a record the worker keeps (1 KiB) or one an earlier
        // call stored in such a record.
        let tag = |record: u64, at: u64| {
            if record == 0 { 0 } else { unsafe { std::ptr::read_unaligned((record + at) as *const u64) } }
        };
        let is = |record: u64, want: u64| tag(record, 0) == want;
        // SAFETY (all arms): records and outputs are the session's buffers, sized by the
        // descriptor; device memory is looked up in the emulation's allocations.
        let status = unsafe {
            match name {
                "cusparseLtInit" => {
                    put_u64(a[0], HANDLE);
                    SUCCESS
                }
                "cusparseLtDenseDescriptorInit" | "cusparseLtStructuredDescriptorInit" if is(a[0], HANDLE) => {
                    put_u64(a[1], MATRIX);
                    put_u64(a[1] + 8, a[2]);
                    put_u64(a[1] + 16, a[3]);
                    SUCCESS
                }
                "cusparseLtMatmulDescriptorInit" if is(a[0], HANDLE) && is(a[4], MATRIX) && is(a[5], MATRIX) => {
                    put_u64(a[1], MATMUL);
                    put_u64(a[1] + 8, a[4]);
                    put_u64(a[1] + 16, a[5]);
                    put_u64(a[1] + 24, 0);
                    SUCCESS
                }
                // An attribute the library does not have is refused (the last one is the
                // output scale's pointer).
                "cusparseLtMatmulDescSetAttribute"
                    if is(a[1], MATMUL)
                        && a[2]
                            <= u64::from(
                                chidori_cuda::consts::cusparseLtMatmulDescAttribute_t::CUSPARSELT_MATMUL_D_OUT_SCALE_POINTER,
                            ) =>
                {
                    if a[2] == ALPHA_VECTOR && a[4] >= 4 && a[3] != 0 {
                        put_u64(a[1] + 24, u64::from(std::ptr::read_unaligned(a[3] as *const u32)));
                    }
                    SUCCESS
                }
                "cusparseLtMatmulAlgSelectionInit" if is(a[0], HANDLE) && is(a[2], MATMUL) => {
                    put_u64(a[1], SELECTION);
                    put_u64(a[1] + 8, a[2]);
                    SUCCESS
                }
                "cusparseLtMatmulPlanInit" if is(a[0], HANDLE) && is(a[2], MATMUL) && is(a[3], SELECTION) => {
                    put_u64(a[1], PLAN);
                    put_u64(a[1] + 8, a[2]);
                    SUCCESS
                }
                // rows of A × columns of B floats, read through the plan's own pointers.
                "cusparseLtMatmulGetWorkspace" if is(a[1], PLAN) => {
                    let matmul = tag(a[1], 8);
                    let (matrix_a, matrix_b) = (tag(matmul, 8), tag(matmul, 16));
                    put_u64(a[2], tag(matrix_a, 8).saturating_mul(tag(matrix_b, 16)).saturating_mul(4));
                    SUCCESS
                }
                "cusparseLtMatmul" if is(a[0], HANDLE) && is(a[1], PLAN) => {
                    let vector = tag(tag(a[1], 8), 24) != 0;
                    let mut word = [0u8; 4];
                    let alpha = if vector {
                        match self.state().find(a[2], 4) {
                            Some(bytes) => word.copy_from_slice(bytes),
                            None => return Some(INVALID),
                        }
                        f32::from_le_bytes(word)
                    } else {
                        std::ptr::read_unaligned(a[2] as *const f32)
                    };
                    let beta = std::ptr::read_unaligned(a[5] as *const f32);
                    match self.state().find(a[7], 4) {
                        Some(d) => d.copy_from_slice(&(alpha * 1000.0 + beta).to_le_bytes()),
                        None => return Some(INVALID),
                    }
                    SUCCESS
                }
                "cusparseLtMatDescriptorDestroy"
                | "cusparseLtMatmulAlgSelectionDestroy"
                | "cusparseLtMatmulPlanDestroy"
                | "cusparseLtDestroy" => {
                    let kind = match name {
                        "cusparseLtMatDescriptorDestroy" => MATRIX,
                        "cusparseLtMatmulAlgSelectionDestroy" => SELECTION,
                        "cusparseLtMatmulPlanDestroy" => PLAN,
                        _ => HANDLE,
                    };
                    if !is(a[0], kind) {
                        return Some(INVALID);
                    }
                    put_u64(a[0], DESTROYED);
                    SUCCESS
                }
                // A record of another kind, or none an initializer filled.
                "cusparseLtDenseDescriptorInit"
                | "cusparseLtStructuredDescriptorInit"
                | "cusparseLtMatmulDescriptorInit"
                | "cusparseLtMatmulDescSetAttribute"
                | "cusparseLtMatmulAlgSelectionInit"
                | "cusparseLtMatmulPlanInit"
                | "cusparseLtMatmulGetWorkspace"
                | "cusparseLtMatmul" => INVALID,
                _ => return None,
            }
        };
        Some(status)
    }

    /// cuBLASXt's handles, device selection and `cublasXtSgemm` without transposes, computed
    /// on the CPU: its matrices may be device memory (the emulation's allocations) or the
    /// program's host memory, which the worker mirrors at the program's addresses.
    ///
    /// # Safety
    /// As [`Emulated::invoke_more`]; host matrices are the worker's mirrors of the sizes the
    /// client computed.
    unsafe fn invoke_cublas_xt(&self, name: &str, a: &[u64]) -> Option<u64> {
        const NOT_SUPPORTED_XT: u64 = chidori_cuda::consts::cublasStatus_t::CUBLAS_STATUS_NOT_SUPPORTED as u64;
        const INVALID: u64 = chidori_cuda::consts::cublasStatus_t::CUBLAS_STATUS_INVALID_VALUE as u64;
        // SAFETY (all arms): out-parameters are the session's buffers, sized by the descriptor.
        let status = unsafe {
            match name {
                "cublasXtCreate" => {
                    put_u64(a[0], self.state().handle());
                    SUCCESS
                }
                "cublasXtDestroy" => SUCCESS,
                "cublasXtDeviceSelect" => {
                    let n = a[1] as i32;
                    if n <= 0 || a[2] == 0 {
                        return Some(INVALID);
                    }
                    // The decoder gave the array the count's elements.
                    let devices = std::slice::from_raw_parts(a[2] as *const i32, n as usize);
                    if devices.iter().all(|&d| self.is_device(d)) { SUCCESS } else { INVALID }
                }
                "cublasXtSgemm" => {
                    let [transa, transb, m, n, k] = [a[1], a[2], a[3], a[4], a[5]];
                    // A CPU multiply: small problems only (a hostile size is refused, not run).
                    let work = m.checked_mul(n).and_then(|mn| mn.checked_mul(k.max(1)));
                    let plain = u64::from(chidori_cuda::consts::cublasOperation_t::CUBLAS_OP_N);
                    if transa != plain || transb != plain || work.is_none_or(|w| w > 1 << 26) {
                        return Some(NOT_SUPPORTED_XT);
                    }
                    let (lda, ldb, ldc) = (a[8] as usize, a[10] as usize, a[13] as usize);
                    let (m, n, k) = (m as usize, n as usize, k as usize);
                    let alpha = std::ptr::read_unaligned(a[6] as *const f32);
                    let beta = std::ptr::read_unaligned(a[11] as *const f32);
                    // A matrix's floats: in the emulation's device memory, or host memory
                    // (the worker's mirror of the program's), read through the kernel so a
                    // bad address is an error, never a fault.
                    let extent = |ld: usize, cols: usize, rows: usize| {
                        ld.checked_mul(cols.saturating_sub(1))?
                            .checked_add(rows)?
                            .checked_mul(4)
                            .filter(|&b| b <= 1 << 28)
                    };
                    let matrix = |addr: u64, len: usize| -> Option<Vec<f32>> {
                        let bytes = match self.state().find(addr, len as u64) {
                            Some(b) => b.to_vec(),
                            None => {
                                let mut b = vec![0u8; len];
                                chidori_protocol::mirror::read_own(addr, &mut b).then_some(b)?
                            }
                        };
                        Some(bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
                    };
                    let (Some(la), Some(lb), Some(lc)) = (extent(lda, k, m), extent(ldb, n, k), extent(ldc, n, m))
                    else {
                        return Some(INVALID);
                    };
                    let (Some(ma), Some(mb), Some(mut mc)) = (matrix(a[7], la), matrix(a[9], lb), matrix(a[12], lc))
                    else {
                        return Some(INVALID);
                    };
                    for j in 0..n {
                        for i in 0..m {
                            let dot: f32 = (0..k).map(|p| ma[i + p * lda] * mb[p + j * ldb]).sum();
                            mc[i + j * ldc] = alpha * dot + beta * mc[i + j * ldc];
                        }
                    }
                    let out: Vec<u8> = mc.iter().flat_map(|v| v.to_le_bytes()).collect();
                    let written = match self.state().find(a[12], out.len() as u64) {
                        Some(b) => {
                            b.copy_from_slice(&out);
                            true
                        }
                        None => chidori_protocol::mirror::write_own(a[12], &out),
                    };
                    if written { SUCCESS } else { INVALID }
                }
                _ => return None,
            }
        };
        Some(status)
    }

    /// NVML's lists whose length the caller passes by pointer, as a GPU with memory clocks,
    /// vGPU types and three processes answers them: one of them this worker (with the bytes
    /// the session has allocated), two of other users, which the session must not show.
    ///
    /// # Safety
    /// As [`Emulated::invoke_more`].
    unsafe fn invoke_nvml(&self, name: &str, a: &[u64]) -> Option<u64> {
        use chidori_cuda::consts::nvmlReturn_enum as r;
        const HANDLE: u64 = 0x4e56_4d4c_0000;
        let insufficient = u64::from(r::NVML_ERROR_INSUFFICIENT_SIZE);
        let invalid = u64::from(r::NVML_ERROR_INVALID_ARGUMENT);
        let device_ok = |d: u64| d.checked_sub(HANDLE).is_some_and(|i| i < self.profile.devices.len() as u64);
        // A list of `n` entries into an array of `*count` (NULL with 0 asks for the count).
        // SAFETY: `count` is the session's 4-byte buffer, checked non-null.
        let room = |count: u64, n: usize| -> Result<(), u64> {
            if count == 0 {
                return Err(invalid);
            }
            let have = unsafe { std::ptr::read_unaligned(count as *const u32) } as usize;
            // SAFETY: as above.
            unsafe { put_u32(count, n as u32) };
            if have < n { Err(insufficient) } else { Ok(()) }
        };
        // SAFETY (all arms): out-parameters are the session's buffers, sized by the descriptor.
        let status = unsafe {
            match name {
                "nvmlDeviceGetHandleByIndex" | "nvmlDeviceGetHandleByIndex_v2" => {
                    if a[0] >= self.profile.devices.len() as u64 {
                        return Some(invalid);
                    }
                    put_u64(a[1], HANDLE + a[0]);
                    SUCCESS
                }
                "nvmlDeviceGetSupportedMemoryClocks" | "nvmlDeviceGetComputeRunningProcesses_v3"
                    if !device_ok(a[0]) =>
                {
                    invalid
                }
                "nvmlDeviceGetSupportedMemoryClocks" => {
                    const CLOCKS: [u32; 3] = [4800, 3201, 1593];
                    match room(a[1], CLOCKS.len()) {
                        Err(status) => status,
                        Ok(()) => {
                            for (i, c) in CLOCKS.iter().enumerate() {
                                put_u32(a[2] + 4 * i as u64, *c);
                            }
                            SUCCESS
                        }
                    }
                }
                "nvmlDeviceGetComputeRunningProcesses_v3" => {
                    let used = self.state().allocations.values().map(|b| b.len() as u64).sum::<u64>();
                    let listed = [(1u32, 1 << 30), (std::process::id(), used), (2u32, 5 << 20)];
                    let have = if a[1] == 0 { 0 } else { std::ptr::read_unaligned(a[1] as *const u32) as usize };
                    let status = match room(a[1], listed.len()) {
                        Err(status) => status,
                        Ok(()) => SUCCESS,
                    };
                    // What fits is written even when the array is too short (a library may
                    // fill what it can before it answers NVML_ERROR_INSUFFICIENT_SIZE).
                    let fits = if a[2] == 0 { 0 } else { have.min(listed.len()) };
                    for (i, (pid, bytes)) in listed.iter().take(fits).enumerate() {
                        // nvmlProcessInfo_v2_t: pid, usedGpuMemory, gpuInstanceId,
                        // computeInstanceId (no MIG: 0xffffffff each).
                        let at = a[2] + 24 * i as u64;
                        put_u32(at, *pid);
                        put_u64(at + 8, *bytes);
                        put_u32(at + 16, u32::MAX);
                        put_u32(at + 20, u32::MAX);
                    }
                    status
                }
                // A GPU outside any NVLink fabric: the record as long as its version word says
                // (the client sends the newest headers' length), every field after it 0x11.
                "nvmlDeviceGetGpuFabricInfoV" if !device_ok(a[0]) || a[1] == 0 => invalid,
                "nvmlDeviceGetGpuFabricInfoV" => {
                    let said = std::ptr::read_unaligned(a[1] as *const u32) & 0x00ff_ffff;
                    std::ptr::write_bytes((a[1] + 4) as *mut u8, 0x11, (said as usize).saturating_sub(4));
                    SUCCESS
                }
                // The driver's and NVML's versions, of the driver series the profile was
                // recorded on (CUDA 13.0: 580): into `length` bytes, the terminator included.
                "nvmlSystemGetDriverVersion" | "nvmlSystemGetNVMLVersion" => {
                    let text: &[u8] =
                        if name == "nvmlSystemGetDriverVersion" { b"580.95.05\0" } else { b"13.580.95.05\0" };
                    if a[0] == 0 {
                        invalid
                    } else if (a[1] as usize) < text.len() {
                        insufficient
                    } else {
                        std::ptr::copy_nonoverlapping(text.as_ptr(), a[0] as *mut u8, text.len());
                        SUCCESS
                    }
                }
                "nvmlVgpuTypeGetName" => {
                    const NAME: &[u8] = b"GRID H200-1-18C\0";
                    match room(a[2], NAME.len()) {
                        Err(status) => status,
                        Ok(()) => {
                            std::ptr::copy_nonoverlapping(NAME.as_ptr(), a[1] as *mut u8, NAME.len());
                            SUCCESS
                        }
                    }
                }
                _ => return None,
            }
        };
        Some(status)
    }

    /// Green contexts' SM resources, in the server's layout of CUdevResource (the emulated
    /// driver's CUDA version): the device's SMs (its profile's count), split into groups of
    /// the minimum size rounded up to the partition granularity of sm_90 (8 SMs), what is
    /// left in the remainder. A NULL result array asks for the number of groups.
    ///
    /// # Safety
    /// As [`Emulated::invoke_more`].
    unsafe fn invoke_sm_resources(&self, name: &str, a: &[u64]) -> Option<u64> {
        use chidori_cuda::consts::CUdevResourceType::CU_DEV_RESOURCE_TYPE_SM as SM;
        use chidori_cuda::consts::cudaError_enum::CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION as CONFIGURATION;
        const GRANULARITY: u32 = 8;
        let map = chidori_cuda::structs::get(crate::profile::PROPS_VERSION, "CUdevResource_st")?;
        let size = map.size as usize;
        // The union's SM resource: smCount, minSmPartitionSize, smCoscheduledAlignment.
        let sm = map.fields.iter().find(|f| f.name.starts_with("__bindgen_anon"))?.offset as u64;
        // SAFETY: a worker buffer of whole records, per the descriptor.
        let write = |at: u64, count: u32| unsafe {
            std::ptr::write_bytes(at as *mut u8, 0, size);
            put_u32(at, SM);
            put_u32(at + sm, count);
            put_u32(at + sm + 4, GRANULARITY);
            put_u32(at + sm + 8, GRANULARITY);
        };
        // SAFETY: the input record, a worker buffer of a whole record.
        let read = |at: u64| unsafe {
            (std::ptr::read_unaligned(at as *const u32), std::ptr::read_unaligned((at + sm) as *const u32))
        };
        let status = match name {
            // (CUdevice, CUdevResource *, CUdevResourceType)
            "cuDeviceGetDevResource" => {
                let Some(device) = self.profile.devices.get(a[0] as usize) else { return Some(INVALID_DEVICE) };
                if a[1] == 0 || a[2] != u64::from(SM) {
                    return Some(INVALID_VALUE);
                }
                let count = chidori_cuda::consts::CUdevice_attribute_enum::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT;
                let sms = device.attributes.iter().find(|(k, _)| *k as u32 == count).map_or(0, |(_, v)| *v as u32);
                write(a[1], sms);
                SUCCESS
            }
            // (result, nbGroups, input, remainder, flags, minCount)
            _ => {
                if a[1] == 0 || a[2] == 0 {
                    return Some(INVALID_VALUE);
                }
                let (kind, input) = read(a[2]);
                if kind != SM {
                    return Some(INVALID_VALUE);
                }
                let per = (a[5] as u32).max(1).div_ceil(GRANULARITY).saturating_mul(GRANULARITY);
                let groups = input / per;
                if groups == 0 {
                    return Some(u64::from(CONFIGURATION));
                }
                // SAFETY: nbGroups is a worker buffer of one int.
                let asked = unsafe { std::ptr::read_unaligned(a[1] as *const u32) };
                let made = if a[0] == 0 { groups } else { groups.min(asked) };
                if a[0] != 0 {
                    for g in 0..made as u64 {
                        write(a[0] + g * size as u64, per);
                    }
                }
                // SAFETY: as above.
                unsafe { put_u32(a[1], made) };
                if a[3] != 0 {
                    write(a[3], input - made * per);
                }
                SUCCESS
            }
        };
        Some(status)
    }

    /// NCCL with communicators of one rank (a collective of one rank copies its input to its
    /// output, in stream order): enough to carry NCCL's calls through a session without a GPU.
    /// A communicator of more ranks is refused with ncclInvalidUsage.
    ///
    /// # Safety
    /// As [`Emulated::invoke_more`].
    unsafe fn invoke_nccl(&self, name: &str, a: &[u64]) -> Option<u64> {
        use chidori_cuda::consts::ncclDataType_t as t;
        use chidori_cuda::consts::ncclResult_t as r;
        let bytes_of = |datatype: u64, count: u64| -> Option<u64> {
            let size = match datatype as u32 {
                t::ncclInt8 | t::ncclUint8 | t::ncclFloat8e4m3 | t::ncclFloat8e5m2 => 1,
                t::ncclFloat16 | t::ncclBfloat16 => 2,
                t::ncclInt32 | t::ncclUint32 | t::ncclFloat32 => 4,
                t::ncclInt64 | t::ncclUint64 | t::ncclFloat64 => 8,
                _ => return None,
            };
            count.checked_mul(size)
        };
        let comm_ok = |comm: u64| self.state().nccl_comms.contains(&comm);
        let copy = |send: u64, recv: u64, count: u64, datatype: u64, comm: u64, stream: u64| -> u64 {
            let Some(len) = bytes_of(datatype, count).filter(|_| comm_ok(comm)) else {
                return u64::from(r::ncclInvalidArgument);
            };
            // In place, a collective of one rank changes nothing (but is still stream work).
            let len = if send == recv { 0 } else { len };
            match self.run_or_record(Some(stream), kind::MEMCPY, Op::Copy { dst: recv, src: send, len }) {
                SUCCESS => SUCCESS,
                _ => u64::from(r::ncclInvalidArgument),
            }
        };
        // SAFETY (all arms): out-parameters are the session's buffers, sized by the descriptor.
        let status = unsafe {
            match name {
                "ncclGetVersion" => {
                    put_u32(a[0], 22700);
                    SUCCESS
                }
                "ncclGetUniqueId" => {
                    let h = self.state().handle();
                    let id = std::slice::from_raw_parts_mut(a[0] as *mut u8, 128);
                    id.fill(0);
                    id[..8].copy_from_slice(&h.to_le_bytes());
                    SUCCESS
                }
                "ncclCommInitRank" | "ncclCommInitRankConfig" if a[1] as i32 != 1 || a[3] as i32 != 0 => {
                    u64::from(r::ncclInvalidUsage)
                }
                "ncclCommInitRank" | "ncclCommInitRankConfig" => {
                    let mut s = self.state();
                    let comm = s.handle();
                    s.nccl_comms.insert(comm);
                    put_u64(a[0], comm);
                    SUCCESS
                }
                "ncclCommDestroy" | "ncclCommAbort" => {
                    // NULL: nothing to do, as NCCL says.
                    if a[0] == 0 || self.state().nccl_comms.remove(&a[0]) {
                        SUCCESS
                    } else {
                        u64::from(r::ncclInvalidArgument)
                    }
                }
                "ncclCommFinalize"
                | "ncclCommGetAsyncError"
                | "ncclCommCount"
                | "ncclCommUserRank"
                | "ncclCommCuDevice"
                    if !comm_ok(a[0]) =>
                {
                    u64::from(r::ncclInvalidArgument)
                }
                "ncclCommFinalize" => SUCCESS,
                "ncclCommGetAsyncError" | "ncclCommUserRank" | "ncclCommCuDevice" => {
                    put_u32(a[1], 0);
                    SUCCESS
                }
                "ncclCommCount" => {
                    put_u32(a[1], 1);
                    SUCCESS
                }
                "ncclGroupStart" | "ncclGroupEnd" => SUCCESS,
                // A pre-multiplied sum: the next operation number of the communicator after the
                // built-in ones (its scalar was checked: the session's device memory, or a host
                // value sent).
                "ncclRedOpCreatePreMulSum"
                    if comm_ok(a[4])
                        && bytes_of(a[2], 1).is_some()
                        && a[3] <= u64::from(chidori_cuda::consts::ncclScalarResidence_t::ncclScalarHostImmediate) =>
                {
                    let mut s = self.state();
                    let first = u64::from(chidori_cuda::consts::ncclRedOp_t::ncclNumOps);
                    let op = (first..).find(|op| !s.nccl_ops.contains(&(a[4], *op))).unwrap_or(first);
                    s.nccl_ops.insert((a[4], op));
                    put_u32(a[0], op as u32);
                    SUCCESS
                }
                "ncclRedOpCreatePreMulSum" => u64::from(r::ncclInvalidArgument),
                "ncclRedOpDestroy" => {
                    if self.state().nccl_ops.remove(&(a[1], a[0] & 0xffff_ffff)) {
                        SUCCESS
                    } else {
                        u64::from(r::ncclInvalidArgument)
                    }
                }
                "ncclAllReduce" | "ncclBroadcast" => copy(a[0], a[1], a[2], a[3], a[a.len() - 2], a[a.len() - 1]),
                "ncclReduce" => copy(a[0], a[1], a[2], a[3], a[6], a[7]),
                "ncclAllGather" | "ncclReduceScatter" => copy(a[0], a[1], a[2], a[3], a[a.len() - 2], a[a.len() - 1]),
                "ncclBcast" => copy(a[0], a[0], a[1], a[2], a[4], a[5]),
                _ => return None,
            }
        };
        if status != SUCCESS {
            let why = if status == u64::from(r::ncclInvalidUsage) {
                "the emulated backend's communicators have one rank"
            } else {
                "a communicator, operation, data type or buffer this session does not have"
            };
            self.state().nccl_last_error = format!("{name}: {why}");
        }
        Some(status)
    }

    /// As [`Emulated::invoke_more`].
    unsafe fn invoke_graph(&self, desc: &'static CallDesc, name: &str, a: &[u64]) -> Option<u64> {
        let lib = desc.library;
        let n = desc.params.len();
        // SAFETY (all arms): as in invoke_more.
        let status = unsafe {
            match name.strip_prefix("cuda").or_else(|| name.strip_prefix("cu")).unwrap_or(name) {
                "GraphCreate" => {
                    let g = self.state().graphs.create();
                    put_u64(a[0], g);
                    SUCCESS
                }
                "GraphAddEmptyNode" | "GraphAddEventRecordNode" | "GraphAddEventWaitNode" | "GraphAddMemFreeNode" => {
                    let k = match name {
                        _ if name.ends_with("EmptyNode") => kind::EMPTY,
                        _ if name.ends_with("EventRecordNode") => kind::EVENT_RECORD,
                        _ if name.ends_with("EventWaitNode") => kind::WAIT_EVENT,
                        _ => kind::MEM_FREE,
                    };
                    let r = self.state().graphs.add(a[1], &nodes(a[2], a[3]), k, Op::Nothing, Vec::new());
                    self.graph_status(r, a[0])
                }
                "GraphAddMemsetNode" => {
                    // (node, graph, deps, n, params[, ctx]): dst@0, pitch@8, value@16,
                    // elementSize@20, width@24, height@32.
                    let p = bytes(a[4], 40);
                    let op = memset_op(a[4]);
                    let r = self.state().graphs.add(a[1], &nodes(a[2], a[3]), kind::MEMSET, op, p);
                    self.graph_status(r, a[0])
                }
                "GraphAddMemcpyNode" => {
                    let op = if lib == "cudart" { self.copy_3d_op(a[4], false) } else { self.cu_copy_op(a[4], false) };
                    let Some(op) = op else { return Some(INVALID_HANDLE) };
                    let p = bytes(a[4], buf_len(desc, 4, a));
                    let r = self.state().graphs.add(a[1], &nodes(a[2], a[3]), kind::MEMCPY, op, p);
                    self.graph_status(r, a[0])
                }
                "GraphAddMemcpyNode1D" => {
                    let op = Op::Copy { dst: a[4], src: a[5], len: a[6] };
                    let r = self.state().graphs.add(a[1], &nodes(a[2], a[3]), kind::MEMCPY, op, Vec::new());
                    self.graph_status(r, a[0])
                }
                "GraphAddChildGraphNode" => {
                    let r = self.state().graphs.add_child(a[1], &nodes(a[2], a[3]), a[4]);
                    self.graph_status(r, a[0])
                }
                "GraphChildGraphNodeGetGraph" => match self.state().graphs.child_graph(a[0]) {
                    Some(g) => {
                        put_u64(a[1], g);
                        SUCCESS
                    }
                    None => INVALID_VALUE,
                },
                "GraphAddDependencies"
                | "GraphAddDependencies_v2"
                | "GraphRemoveDependencies"
                | "GraphRemoveDependencies_v2" => {
                    // (graph, from, to[, edge data], count).
                    let count = a[n - 1];
                    let (from, to) = (nodes(a[1], count), nodes(a[2], count));
                    let add = name.contains("Add");
                    match self.state().graphs.edges(a[0], &from, &to, add) {
                        Ok(()) => SUCCESS,
                        Err(e) => e,
                    }
                }
                "GraphNodeGetType" => match self.state().graphs.node(a[0]) {
                    Some(node) => {
                        put_u32(a[1], node.kind);
                        SUCCESS
                    }
                    None => INVALID_VALUE,
                },
                "GraphDestroyNode" => match self.state().graphs.destroy_node(a[0]) {
                    Ok(()) => SUCCESS,
                    Err(e) => e,
                },
                "GraphClone" => {
                    let r = self.state().graphs.clone_graph(a[1]);
                    self.graph_status(r, a[0])
                }
                "GraphMemsetNodeGetParams" | "GraphMemcpyNodeGetParams" => {
                    let Some(node) = self.state().graphs.node(a[0]).cloned() else { return Some(INVALID_VALUE) };
                    let len = buf_len(desc, 1, a).min(node.params.len());
                    std::ptr::copy_nonoverlapping(node.params.as_ptr(), a[1] as *mut u8, len);
                    SUCCESS
                }
                "GraphMemsetNodeSetParams" => {
                    let r = self.state().graphs.set(a[0], kind::MEMSET, memset_op(a[1]), bytes(a[1], 40));
                    r.err().unwrap_or(SUCCESS)
                }
                "GraphExecMemsetNodeSetParams" => {
                    let r = self.state().graphs.exec_set(a[0], a[1], kind::MEMSET, memset_op(a[2]));
                    r.err().unwrap_or(SUCCESS)
                }
                "GraphMemcpyNodeSetParams" => {
                    let op = if lib == "cudart" { self.copy_3d_op(a[1], false) } else { self.cu_copy_op(a[1], false) };
                    let Some(op) = op else { return Some(INVALID_HANDLE) };
                    let p = bytes(a[1], buf_len(desc, 1, a));
                    self.state().graphs.set(a[0], kind::MEMCPY, op, p).err().unwrap_or(SUCCESS)
                }
                "GraphExecMemcpyNodeSetParams" => {
                    let op = if lib == "cudart" { self.copy_3d_op(a[2], false) } else { self.cu_copy_op(a[2], false) };
                    let Some(op) = op else { return Some(INVALID_HANDLE) };
                    self.state().graphs.exec_set(a[0], a[1], kind::MEMCPY, op).err().unwrap_or(SUCCESS)
                }
                "GraphMemcpyNodeSetParams1D" => {
                    let op = Op::Copy { dst: a[1], src: a[2], len: a[3] };
                    self.state().graphs.set(a[0], kind::MEMCPY, op, Vec::new()).err().unwrap_or(SUCCESS)
                }
                "GraphExecMemcpyNodeSetParams1D" => {
                    let op = Op::Copy { dst: a[2], src: a[3], len: a[4] };
                    self.state().graphs.exec_set(a[0], a[1], kind::MEMCPY, op).err().unwrap_or(SUCCESS)
                }
                "GraphInstantiate" | "GraphInstantiateWithFlags" | "GraphInstantiate_v2" => {
                    let r = self.state().graphs.instantiate(a[1]);
                    self.graph_status(r, a[0])
                }
                "GraphInstantiateWithParams" => {
                    use chidori_cuda::consts::cudaGraphInstantiateResult as result;
                    let r = self.state().graphs.instantiate(a[1]);
                    // cudaGraphInstantiateResult at 24.
                    let outcome = if r.is_err() {
                        result::cudaGraphInstantiateError
                    } else {
                        result::cudaGraphInstantiateSuccess
                    };
                    put_u32(a[2] + 24, outcome);
                    self.graph_status(r, a[0])
                }
                "GraphExecUpdate" | "GraphExecUpdate_v2" => {
                    const UPDATED: u32 = chidori_cuda::consts::cudaGraphExecUpdateResult::cudaGraphExecUpdateSuccess;
                    let r = self.state().graphs.update(a[0], a[1]);
                    let (result, node) = match r {
                        Ok(()) => (UPDATED, 0),
                        Err((result, node)) => (result, node),
                    };
                    if n == 3 {
                        // cudaGraphExecUpdateResultInfo: result, error node, error-from node.
                        if a[2] != 0 {
                            put_u32(a[2], result);
                            put_u64(a[2] + 8, node);
                            put_u64(a[2] + 16, 0);
                        }
                    } else {
                        // 11.8 and 12.0: (exec, graph, error node out, result out).
                        if a[2] != 0 {
                            put_u64(a[2], node);
                        }
                        if a[3] != 0 {
                            put_u32(a[3], result);
                        }
                    }
                    if result == UPDATED { SUCCESS } else { graphs::UPDATE_FAILURE }
                }
                "GraphLaunch" => {
                    let ops = self.state().graphs.ops(a[0]);
                    match ops {
                        Some(ops) if self.stream_ok(a[1]) => self.replay(&ops),
                        _ => INVALID_HANDLE,
                    }
                }
                "GraphUpload" => {
                    if self.state().graphs.is_exec(a[0]) && self.stream_ok(a[1]) {
                        SUCCESS
                    } else {
                        INVALID_HANDLE
                    }
                }
                "GraphDestroy" => {
                    let status = self.state().graphs.destroy(a[0]).err().unwrap_or(SUCCESS);
                    if status == SUCCESS {
                        self.release_graph_user_objects(a[0]);
                    }
                    status
                }
                "GraphExecDestroy" => self.state().graphs.destroy_exec(a[0]).err().unwrap_or(SUCCESS),
                "StreamBeginCapture" | "StreamBeginCapture_v2" => {
                    if a[0] <= 2 || !self.stream_ok(a[0]) {
                        // The legacy stream cannot be captured (cudaErrorStreamCaptureUnsupported).
                        CAPTURE_UNSUPPORTED
                    } else {
                        self.state().graphs.begin(a[0], None).err().unwrap_or(SUCCESS)
                    }
                }
                "StreamBeginCaptureToGraph" => {
                    if a[0] <= 2 || !self.stream_ok(a[0]) {
                        CAPTURE_UNSUPPORTED
                    } else {
                        let deps = nodes(a[2], a[4]);
                        self.state().graphs.begin(a[0], Some((a[1], deps))).err().unwrap_or(SUCCESS)
                    }
                }
                "StreamEndCapture" => match self.state().graphs.end(a[0]) {
                    Some(g) => {
                        // NULL where the capture was into the program's graph (`null_ok`).
                        if a[1] != 0 {
                            put_u64(a[1], g);
                        }
                        SUCCESS
                    }
                    // The stream was not capturing.
                    None => ILLEGAL_STATE,
                },
                "StreamIsCapturing" => {
                    let active = self.state().graphs.capturing(a[0]).is_some();
                    use cudaStreamCaptureStatus::{cudaStreamCaptureStatusActive, cudaStreamCaptureStatusNone};
                    put_u32(a[1], if active { cudaStreamCaptureStatusActive } else { cudaStreamCaptureStatusNone });
                    SUCCESS
                }
                "StreamUpdateCaptureDependencies" | "StreamUpdateCaptureDependencies_v2" => {
                    // 13.0: (stream, deps, data, count, flags); 12.x: (stream, deps, count, flags).
                    let (count, flags) = if n == 5 { (a[3], a[4]) } else { (a[2], a[3]) };
                    let deps = nodes(a[1], count);
                    // cudaStreamAddCaptureDependencies, or cudaStreamSetCaptureDependencies (the
                    // driver's numbers: the runtime's enum is not among the generated constants).
                    use chidori_cuda::consts::CUstreamUpdateCaptureDependencies_flags_enum as update;
                    let add = flags == u64::from(update::CU_STREAM_ADD_CAPTURE_DEPENDENCIES);
                    self.state().graphs.set_frontier(a[0], &deps, add).err().unwrap_or(SUCCESS)
                }
                _ => return None,
            }
        };
        Some(status)
    }

    pub(super) fn list(&self, query: &GraphList) -> Result<NodeList, (i64, String)> {
        let s = self.state();
        let g = &s.graphs;
        let missing = || (INVALID_VALUE as i64, "no such graph, node or capture".to_owned());
        let mut out = NodeList::default();
        match *query {
            GraphList::Nodes { graph } => out.nodes = g.nodes_of(graph).ok_or_else(missing)?,
            GraphList::RootNodes { graph } => out.nodes = g.roots_of(graph).ok_or_else(missing)?,
            GraphList::Edges { graph } => (out.nodes, out.peers) = g.edges_of(graph).ok_or_else(missing)?,
            GraphList::Dependencies { node } => out.nodes = g.dependencies(node).ok_or_else(missing)?,
            GraphList::Dependents { node } => out.nodes = g.dependents(node).ok_or_else(missing)?,
            GraphList::Capture { stream } => match g.capturing(stream) {
                // The id is the graph's.
                Some((graph, frontier)) => {
                    out.nodes = frontier;
                    out.capture = Some((cudaStreamCaptureStatus::cudaStreamCaptureStatusActive, graph, graph));
                }
                None => out.capture = Some((cudaStreamCaptureStatus::cudaStreamCaptureStatusNone, 0, 0)),
            },
            // The session asks it as the graph's nodes.
            GraphList::Ended { .. } => return Err(missing()),
        }
        Ok(out)
    }

    /// A graph as Graphviz text: its nodes by type, its edges.
    pub(super) fn dot(&self, graph: u64) -> Result<String, (i64, String)> {
        let s = self.state();
        let g = &s.graphs;
        let missing = || (INVALID_VALUE as i64, "no such graph".to_owned());
        let nodes = g.nodes_of(graph).ok_or_else(missing)?;
        let (from, to) = g.edges_of(graph).ok_or_else(missing)?;
        let mut out = format!("digraph dot {{\nsubgraph cluster_{graph:x} {{\n");
        for n in &nodes {
            let kind = g.node(*n).map_or(0, |node| node.kind);
            out.push_str(&format!("\"node_{n:x}\" [label=\"type {kind}\"];\n"));
        }
        for (f, t) in from.iter().zip(&to) {
            out.push_str(&format!("\"node_{f:x}\" -> \"node_{t:x}\";\n"));
        }
        out.push_str("}\n}\n");
        Ok(out)
    }

    /// `params`: a batch memory operation node's operations, as the session checked them.
    pub(super) fn node(
        &self,
        request: &GraphNode,
        params: &[u8],
        host: Option<HostFn>,
    ) -> Result<NodeMade, (i64, String)> {
        let unsupported = |what: &str| (NOT_SUPPORTED, format!("the emulated backend has no {what}"));
        let (k, op, address) = match &request.params {
            NodeParams::Kernel { .. } => return Err(unsupported("kernels")),
            NodeParams::Conditional { .. } => return Err(unsupported("conditional nodes (they need kernels)")),
            NodeParams::Host { .. } => {
                let host = host.ok_or((INVALID_VALUE as i64, "a host node without its function".to_owned()))?;
                (kind::HOST, Op::Host(Arc::new(host)), 0)
            }
            NodeParams::MemAlloc { bytesize, .. } => {
                if !matches!(request.target, NodeTarget::Add { .. }) {
                    return Err((INVALID_VALUE as i64, "an allocation node is only made".to_owned()));
                }
                // The allocation lives from the node's making (the emulation runs no frees
                // of graphs).
                let at = self.alloc(*bytesize).map_err(|e| (e as i64, "out of memory".to_owned()))?;
                self.state().graph_allocations.insert(at);
                (kind::MEM_ALLOC, Op::Nothing, at)
            }
            NodeParams::BatchMemOp { .. } => (kind::BATCH_MEM_OP, Op::Words(written_words(params)), 0),
        };
        let mut s = self.state();
        let status = |e: u64| (e as i64, format!("graph node: status {e}"));
        let node = match &request.target {
            NodeTarget::Add { graph, dependencies, .. } => {
                s.graphs.add(*graph, dependencies, k, op, Vec::new()).map_err(status)?
            }
            NodeTarget::Set { node } => {
                s.graphs.set(*node, k, op, Vec::new()).map_err(status)?;
                *node
            }
            NodeTarget::ExecSet { exec, node } => {
                s.graphs.exec_set(*exec, *node, k, op).map_err(status)?;
                *node
            }
        };
        Ok(NodeMade { node, graphs: Vec::new(), address })
    }
}

/// The words that stream memory operations (48 bytes each) write: a write's address at 8 and
/// value at 16, 4 or 8 bytes by its operation.
fn written_words(ops: &[u8]) -> Vec<(u64, u64, u8)> {
    use chidori_cuda::consts::CUstreamBatchMemOpType_enum as t;
    let word = |op: &[u8], at: usize| u64::from_le_bytes(op[at..at + 8].try_into().unwrap_or([0; 8]));
    ops.chunks_exact(48)
        .filter_map(|op| match word(op, 0) as u32 {
            t::CU_STREAM_MEM_OP_WRITE_VALUE_32 => Some((word(op, 8), word(op, 16) & 0xffff_ffff, 4)),
            t::CU_STREAM_MEM_OP_WRITE_VALUE_64 => Some((word(op, 8), word(op, 16), 8)),
            _ => None,
        })
        .collect()
}

/// A memset node's record (dst@0, pitch@8, value@16, element size@20, width@24, height@32)
/// as an operation.
///
/// # Safety
/// `p` must hold the 40-byte record.
unsafe fn memset_op(p: u64) -> Op {
    // SAFETY: per the contract.
    unsafe {
        Op::Memset {
            dst: rd(p, 0),
            pitch: rd(p, 8),
            value: rd(p, 16),
            elem: rd(p, 20),
            width: rd(p, 24),
            height: rd::<u64>(p, 32).max(1),
        }
    }
}
