//! Copies with arrays and in three dimensions, 3D allocations, batches of copies.
//!
//! The server sees 2D and 3D copies between device memory and arrays only (the specs'
//! `[record.cudaMemcpy3DParms]`, `[record.CUDA_MEMCPY3D_st]`): a copy with a host side is
//! made of a copy between the program's memory and a staging buffer on the server (the 1D
//! copies of `memory::copy`, in chunks) and the device-side copy the program asked for,
//! with the staging buffer in place of its host side. Copies between arrays and host rows
//! that the headers describe with a pitch (`cudaMemcpy2DToArray`) pack the rows instead.
//! Batches of copies are their copies, in stream order.
//!
//! Every `unsafe fn` here has the safety contract of the CUDA function it implements.
#![allow(clippy::missing_safety_doc)]

use std::ffi::c_void;

use chidori_cuda::calls::{cudart as calls, driver as dcalls};
use chidori_cuda::desc::{CallDesc, Ctx, Form};
use chidori_cuda::types::{cudaChannelFormatDesc, cudaExtent};

use crate::conn::{self, Conn};
use crate::custom::memory::{self, CopyForms};
use crate::runtime;
use crate::state::{self, Memory};

/// Run a hand-written copy: FFI guard, trace, and (for the runtime) the last error.
fn run(ctx: &Ctx, body: impl FnOnce(&Conn) -> Result<u32, u32>) -> u32 {
    crate::guard::ffi(ctx.name, ctx.codes.invalid_value as u32, || {
        crate::trace::local(ctx.name);
        let status = match conn::get() {
            Ok(conn) => body(&conn).unwrap_or_else(|e| e),
            Err(_) => ctx.codes.unavailable as u32,
        };
        if ctx.library == "cudart" {
            state::set_last_error(status);
        }
        status
    })
}

/// cudaSuccess, and the driver's CUDA_SUCCESS: these functions serve both APIs.
const SUCCESS: u32 = chidori_cuda::consts::cudaError::cudaSuccess;
const _: () = assert!(SUCCESS == chidori_cuda::consts::cudaError_enum::CUDA_SUCCESS);

fn invalid(ctx: &Ctx) -> u32 {
    ctx.codes.invalid_value as u32
}

/// The status of a forwarded call, as this library's status type.
///
/// # Safety
/// As [`runtime::call_on`].
unsafe fn call(conn: &Conn, desc: &'static CallDesc, args: &[u64]) -> u32 {
    // SAFETY: per the contract.
    unsafe { runtime::call_on(conn, desc, args) as u32 }
}

// ---- Channel descriptors and 3D allocations ----

/// cudaCreateChannelDesc: the record of its arguments, as cudart makes it.
pub unsafe fn create_channel_desc(ctx: &Ctx, x: i32, y: i32, z: i32, w: i32, f: u32) -> cudaChannelFormatDesc {
    crate::trace::local(ctx.name);
    cudaChannelFormatDesc { x, y, z, w, f }
}

/// cudaMalloc3D: a pitched allocation that enters the interval map.
pub unsafe fn malloc_3d(ctx: &Ctx, pitched: *mut c_void, extent: cudaExtent) -> u32 {
    run(ctx, |conn| {
        if pitched.is_null() {
            return Err(invalid(ctx));
        }
        let extent_at = &extent as *const cudaExtent as u64;
        // SAFETY: the caller's cudaPitchedPtr; the extent travels by value.
        let s = unsafe { call(conn, ctx.form(Form::Call), &[pitched as u64, extent_at]) };
        if s == SUCCESS {
            // SAFETY: written by the reply: ptr, pitch, xsize, ysize.
            let p = unsafe { std::ptr::read_unaligned(pitched as *const PitchedPtr) };
            let len = p.pitch.saturating_mul(extent.height.max(1) as u64).saturating_mul(extent.depth.max(1) as u64);
            if p.ptr != 0 {
                state::add(p.ptr, len, Memory::Device { device: state::current_device() });
            }
        }
        Ok(s)
    })
}

// ---- Copies between arrays and memory described by rows ----

/// Whether the non-array side of a copy with an array is device memory, by its kind.
fn device_side(kind: u32, ptr: u64, array_is_dst: bool) -> Result<bool, u32> {
    use chidori_cuda::consts::cudaMemcpyKind as k;
    let claim = match (kind, array_is_dst) {
        (k::cudaMemcpyHostToDevice, true) | (k::cudaMemcpyDeviceToHost, false) => false,
        (k::cudaMemcpyDeviceToDevice, _) => true,
        (k::cudaMemcpyDefault, _) => state::is_device(ptr),
        _ => return Err(chidori_cuda::consts::cudaError::cudaErrorInvalidMemcpyDirection),
    };
    Ok(crate::mirror::is_mirrored(ptr) || (claim && !state::is_pinned(ptr)))
}

/// Rows of the program's memory copied on a capturing stream: mirrored for the graph (then
/// the copy names them by their address, as device memory). Ok(false): not capturing.
fn captured_rows(
    conn: &Conn,
    stream: Option<u64>,
    base: u64,
    pitch: usize,
    width: usize,
    height: usize,
) -> Result<bool, u32> {
    if !capturing(stream) {
        return Ok(false);
    }
    mirror_box(conn, base, (0, 0, 0), (pitch as u64, 1), (Some(width as u64), height as u64, 1)).map_err(unmirrored)?;
    Ok(true)
}

/// Gather `height` rows of `width` bytes, `pitch` apart, from `base`.
///
/// # Safety
/// The rows must be readable.
unsafe fn gather(base: u64, pitch: usize, width: usize, height: usize) -> Vec<u8> {
    let mut rows = Vec::with_capacity(width * height);
    for r in 0..height {
        // SAFETY: per the contract.
        rows.extend_from_slice(unsafe { std::slice::from_raw_parts((base as usize + r * pitch) as *const u8, width) });
    }
    rows
}

/// Scatter packed rows into `height` rows of `width` bytes, `pitch` apart, at `base`.
///
/// # Safety
/// The rows must be writable.
unsafe fn scatter(rows: &[u8], base: u64, pitch: usize, width: usize, height: usize) {
    for r in 0..height {
        // SAFETY: per the contract; `rows` holds height * width bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(rows.as_ptr().add(r * width), (base as usize + r * pitch) as *mut u8, width)
        };
    }
}

/// cudaMemcpy2DToArray(Async): (dst, wOffset, hOffset, src, spitch, width, height, kind[, stream]).
#[allow(clippy::too_many_arguments)]
fn to_array_2d(
    ctx: &Ctx,
    dst: u64,
    offsets: (u64, u64),
    src: u64,
    spitch: usize,
    (width, height): (usize, usize),
    kind: u32,
    stream: Option<u64>,
) -> u32 {
    run(ctx, |conn| {
        if width > spitch {
            return Err(invalid(ctx));
        }
        let device = device_side(kind, src, true)? || captured_rows(conn, stream, src, spitch, width, height)?;
        if let Some(s) = stream {
            conn.wait_callbacks(s);
        }
        let mut args =
            vec![dst, offsets.0, offsets.1, src, spitch as u64, width as u64, height as u64, u64::from(kind)];
        args.extend(stream);
        if device {
            // SAFETY: device addresses and an array handle, by value.
            return Ok(unsafe { call(conn, ctx.form(Form::D2a), &args) });
        }
        // SAFETY: the source rows lie in the caller's buffer per its pitch.
        let rows = unsafe { gather(src, spitch, width, height) };
        (args[3], args[4]) = (rows.as_ptr() as u64, width as u64);
        // SAFETY: `rows` holds width * height bytes.
        Ok(unsafe { call(conn, ctx.form(Form::H2a), &args) })
    })
}

/// cudaMemcpy2DFromArray(Async): (dst, dpitch, src, wOffset, hOffset, width, height, kind[, stream]).
#[allow(clippy::too_many_arguments)]
fn from_array_2d(
    ctx: &Ctx,
    dst: u64,
    dpitch: usize,
    src: u64,
    offsets: (u64, u64),
    (width, height): (usize, usize),
    kind: u32,
    stream: Option<u64>,
) -> u32 {
    run(ctx, |conn| {
        if width > dpitch {
            return Err(invalid(ctx));
        }
        let device = device_side(kind, dst, false)? || captured_rows(conn, stream, dst, dpitch, width, height)?;
        let mut args =
            vec![dst, dpitch as u64, src, offsets.0, offsets.1, width as u64, height as u64, u64::from(kind)];
        args.extend(stream);
        if device {
            // SAFETY: device addresses and an array handle, by value.
            return Ok(unsafe { call(conn, ctx.form(Form::A2d), &args) });
        }
        let mut rows = vec![0u8; width * height];
        (args[0], args[1]) = (rows.as_mut_ptr() as u64, width as u64);
        // SAFETY: `rows` holds width * height bytes for the reply.
        let s = unsafe { call(conn, ctx.form(Form::A2h), &args) };
        if s == SUCCESS {
            // SAFETY: the destination rows lie in the caller's buffer per its pitch.
            unsafe { scatter(&rows, dst, dpitch, width, height) };
        }
        Ok(s)
    })
}

/// cudaMemcpyToArray(Async): `count` bytes from `src` into the array from (wOffset, hOffset).
fn to_array(ctx: &Ctx, dst: u64, offsets: (u64, u64), src: u64, count: u64, kind: u32, stream: Option<u64>) -> u32 {
    run(ctx, |conn| {
        let device =
            device_side(kind, src, true)? || captured_rows(conn, stream, src, count as usize, count as usize, 1)?;
        if let Some(s) = stream {
            conn.wait_callbacks(s);
        }
        let mut args = vec![dst, offsets.0, offsets.1, src, count, u64::from(kind)];
        args.extend(stream);
        let form = if device { ctx.form(Form::D2a) } else { ctx.form(Form::H2a) };
        // SAFETY: a device address, or the caller's buffer of `count` bytes.
        Ok(unsafe { call(conn, form, &args) })
    })
}

/// cudaMemcpyFromArray(Async): `count` bytes of the array from (wOffset, hOffset) into `dst`.
fn from_array(ctx: &Ctx, dst: u64, src: u64, offsets: (u64, u64), count: u64, kind: u32, stream: Option<u64>) -> u32 {
    run(ctx, |conn| {
        let device =
            device_side(kind, dst, false)? || captured_rows(conn, stream, dst, count as usize, count as usize, 1)?;
        let mut args = vec![dst, src, offsets.0, offsets.1, count, u64::from(kind)];
        args.extend(stream);
        let form = if device { ctx.form(Form::A2d) } else { ctx.form(Form::A2h) };
        // SAFETY: a device address, or the caller's buffer of `count` bytes.
        Ok(unsafe { call(conn, form, &args) })
    })
}

/// cudaMemcpy{,2D}{To,From}Array{,Async} (`raw_args`; the async forms end with the stream):
/// the form by the call's name.
pub unsafe fn array_copy_raw(ctx: &Ctx, args: &[u64]) -> u64 {
    let word = |i: usize| args.get(i).copied().unwrap_or(0);
    let name = chidori_protocol::desc::strip_suffixes(ctx.name, &["_ptsz"]);
    let (two_d, to, n) = (name.contains("2D"), name.contains("ToArray"), if name.contains("2D") { 8 } else { 6 });
    let stream = name.ends_with("Async").then(|| ctx.stream(word(n)));
    let status = match (two_d, to) {
        // (dst, wOffset, hOffset, src, spitch, width, height, kind)
        (true, true) => {
            let size = (word(5) as usize, word(6) as usize);
            to_array_2d(ctx, word(0), (word(1), word(2)), word(3), word(4) as usize, size, word(7) as u32, stream)
        }
        // (dst, dpitch, src, wOffset, hOffset, width, height, kind)
        (true, false) => {
            let size = (word(5) as usize, word(6) as usize);
            from_array_2d(ctx, word(0), word(1) as usize, word(2), (word(3), word(4)), size, word(7) as u32, stream)
        }
        // (dst, wOffset, hOffset, src, count, kind)
        (false, true) => to_array(ctx, word(0), (word(1), word(2)), word(3), word(4), word(5) as u32, stream),
        // (dst, src, wOffset, hOffset, count, kind)
        (false, false) => from_array(ctx, word(0), word(1), (word(2), word(3)), word(4), word(5) as u32, stream),
    };
    u64::from(status)
}

// ---- 3D copies of the runtime ----

/// cudaPitchedPtr.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct PitchedPtr {
    ptr: u64,
    pitch: u64,
    xsize: u64,
    ysize: u64,
}

/// cudaMemcpy3DParms (160 bytes in every CUDA version).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct Memcpy3DParms {
    src_array: u64,
    src_pos: [u64; 3],
    src_ptr: PitchedPtr,
    dst_array: u64,
    dst_pos: [u64; 3],
    dst_ptr: PitchedPtr,
    extent: [u64; 3],
    kind: u32,
}

const _: () = {
    assert!(size_of::<Memcpy3DParms>() == 160);
    assert!(std::mem::offset_of!(Memcpy3DParms, dst_array) == 64);
    assert!(std::mem::offset_of!(Memcpy3DParms, kind) == 152);
};

/// Where one side of a 3D copy lies, in bytes (host or device memory), or in an array.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Side {
    Host,
    Device,
    Array,
}

/// A pitched region of host memory: the address of its first byte, its row pitch and the
/// rows per slice.
#[derive(Clone, Copy, Debug)]
struct HostRegion {
    first: u64,
    pitch: u64,
    rows: u64,
}

impl HostRegion {
    /// Gather `depth` slices of `height` rows of `width` bytes into one packed buffer.
    ///
    /// # Safety
    /// The region must be readable.
    unsafe fn gather(&self, width: usize, height: usize, depth: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(width * height * depth);
        for z in 0..depth as u64 {
            let slice = self.first + z * self.pitch * self.rows;
            // SAFETY: per the contract.
            out.extend(unsafe { gather(slice, self.pitch as usize, width, height) });
        }
        out
    }

    /// Scatter a packed buffer back into the region.
    ///
    /// # Safety
    /// The region must be writable.
    unsafe fn scatter(&self, packed: &[u8], width: usize, height: usize, depth: usize) {
        for z in 0..depth {
            let slice = self.first + z as u64 * self.pitch * self.rows;
            let part = &packed[z * width * height..(z + 1) * width * height];
            // SAFETY: per the contract.
            unsafe { scatter(part, slice, self.pitch as usize, width, height) };
        }
    }
}

/// The device staging buffer of a copy with a host side, and how it is freed.
struct Staging {
    address: u64,
    stream: Option<u64>,
    driver: bool,
}

impl Staging {
    fn new(conn: &Conn, len: u64, stream: Option<u64>, driver: bool) -> Result<Staging, u32> {
        let mut address = 0u64;
        let out = &mut address as *mut u64 as u64;
        // SAFETY (all arms): a local out-pointer and values.
        let s = unsafe {
            match (driver, stream) {
                (true, _) => call(conn, &dcalls::cuMemAlloc_v2__call, &[out, len.max(1)]),
                (false, Some(s)) => call(conn, &calls::cudaMallocAsync__call, &[out, len.max(1), s]),
                (false, None) => call(conn, &calls::cudaMalloc__call, &[out, len.max(1)]),
            }
        };
        if s != SUCCESS {
            return Err(s);
        }
        Ok(Staging { address, stream, driver })
    }

    fn free(self, conn: &Conn) {
        // SAFETY (all arms): the staging buffer's address and the stream, by value.
        let s = unsafe {
            match (self.driver, self.stream) {
                (true, Some(stream)) => {
                    // The driver frees at once: the stream's copies first.
                    call(conn, &dcalls::cuStreamSynchronize__call, &[stream]);
                    call(conn, &dcalls::cuMemFree_v2__call, &[self.address])
                }
                (true, None) => call(conn, &dcalls::cuMemFree_v2__call, &[self.address]),
                (false, Some(stream)) => call(conn, &calls::cudaFreeAsync__call, &[self.address, stream]),
                (false, None) => call(conn, &calls::cudaFree__call, &[self.address]),
            }
        };
        if s != SUCCESS {
            tracing::debug!("freeing a staging buffer answered {s}");
        }
    }
}

/// The copy forms a staging buffer is filled and drained with.
fn staging_forms(driver: bool, stream: Option<u64>) -> (CopyForms, Vec<u64>) {
    match (driver, stream) {
        (true, Some(s)) => (
            CopyForms {
                h2d: &dcalls::cuMemcpyHtoDAsync_v2__call,
                d2h: &dcalls::cuMemcpyDtoHAsync_v2__call,
                d2d: &dcalls::cuMemcpyDtoDAsync_v2,
            },
            vec![s],
        ),
        (true, None) => (
            CopyForms {
                h2d: &dcalls::cuMemcpyHtoD_v2__call,
                d2h: &dcalls::cuMemcpyDtoH_v2__call,
                d2d: &dcalls::cuMemcpyDtoD_v2,
            },
            Vec::new(),
        ),
        (false, Some(s)) => (
            CopyForms {
                h2d: &calls::cudaMemcpyAsync__h2d,
                d2h: &calls::cudaMemcpyAsync__d2h,
                d2d: &calls::cudaMemcpyAsync__d2d,
            },
            vec![s],
        ),
        (false, None) => (
            CopyForms { h2d: &calls::cudaMemcpy__h2d, d2h: &calls::cudaMemcpy__d2h, d2d: &calls::cudaMemcpy__d2d },
            Vec::new(),
        ),
    }
}

/// Move `packed` into a new staging buffer (host to device, in chunks).
fn stage_in(conn: &Conn, packed: &[u8], stream: Option<u64>, driver: bool) -> Result<Staging, u32> {
    let staging = Staging::new(conn, packed.len() as u64, stream, driver)?;
    let (forms, tail) = staging_forms(driver, stream);
    if driver {
        // SAFETY: the packed buffer holds packed.len() bytes; the staging buffer as many.
        let s = unsafe {
            copy_driver(conn, forms.h2d, staging.address, packed.as_ptr() as u64, packed.len() as u64, &tail)
        };
        if s != SUCCESS {
            staging.free(conn);
            return Err(s);
        }
        return Ok(staging);
    }
    let n = packed.len() as u64;
    // SAFETY: as above.
    let s = unsafe {
        memory::copy(conn, &forms, staging.address, packed.as_ptr() as u64, n, (true, false), &tail, stream.is_some())
    } as u32;
    if s != SUCCESS {
        staging.free(conn);
        return Err(s);
    }
    Ok(staging)
}

/// Bring `len` bytes of a staging buffer back into a new host buffer (the copy completes
/// before this returns, asynchronous or not).
fn stage_out(conn: &Conn, staging: &Staging, len: u64) -> Result<Vec<u8>, u32> {
    let mut packed = vec![0u8; len as usize];
    let (forms, tail) = staging_forms(staging.driver, staging.stream);
    let s = if staging.driver {
        // SAFETY: `packed` holds len bytes for the replies.
        unsafe { copy_driver(conn, forms.d2h, packed.as_mut_ptr() as u64, staging.address, len, &tail) }
    } else {
        let dst = packed.as_mut_ptr() as u64;
        let asynchronous = staging.stream.is_some();
        // SAFETY: as above. A copy into memory that is not pinned waits for its bytes, in
        // the stream's order.
        let s = unsafe { memory::copy(conn, &forms, dst, staging.address, len, (false, true), &tail, asynchronous) };
        s as u32
    };
    if s != SUCCESS {
        return Err(s);
    }
    Ok(packed)
}

/// A driver copy in chunks: (dst, src, count[, stream]) per chunk, as `desc`.
///
/// # Safety
/// The host side must hold `count` bytes.
unsafe fn copy_driver(conn: &Conn, desc: &'static CallDesc, dst: u64, src: u64, count: u64, tail: &[u64]) -> u32 {
    let chunks: Vec<Vec<u64>> = (0..count)
        .step_by(memory::CHUNK as usize)
        .map(|off| {
            let mut a = vec![dst + off, src + off, memory::CHUNK.min(count - off)];
            a.extend_from_slice(tail);
            a
        })
        .collect();
    // SAFETY: per the contract.
    unsafe { runtime::call_pipelined(conn, desc, &chunks) as u32 }
}

/// The element size of an array (for a copy between it and host memory: its extent is in
/// elements), asked of the server.
fn array_element_size(conn: &Conn, array: u64) -> Result<u64, u32> {
    let mut desc = cudaChannelFormatDesc { x: 0, y: 0, z: 0, w: 0, f: 0 };
    let mut extent = cudaExtent { width: 0, height: 0, depth: 0 };
    let mut flags = 0u32;
    let args = [
        &mut desc as *mut cudaChannelFormatDesc as u64,
        &mut extent as *mut cudaExtent as u64,
        &mut flags as *mut u32 as u64,
        array,
    ];
    // SAFETY: locals as out-pointers, an array handle by value.
    let s = unsafe { call(conn, &calls::cudaArrayGetInfo, &args) };
    if s != SUCCESS {
        return Err(s);
    }
    let bits = [desc.x, desc.y, desc.z, desc.w].iter().map(|b| (*b).max(0) as u64).sum::<u64>();
    Ok((bits / 8).max(1))
}

/// Which side of a runtime 3D copy each pointer is, from the kind and the interval map.
fn sides_3d(m: &Memcpy3DParms) -> Result<(Side, Side), u32> {
    let (src_addr, dst_addr) = (m.src_ptr.ptr, m.dst_ptr.ptr);
    let (dst_dev, src_dev) = memory::direction(m.kind, dst_addr, src_addr)
        .ok_or(chidori_cuda::consts::cudaError::cudaErrorInvalidMemcpyDirection)?;
    let side = |array: u64, device: bool| match (array != 0, device) {
        (true, _) => Side::Array,
        (false, true) => Side::Device,
        (false, false) => Side::Host,
    };
    Ok((side(m.src_array, src_dev), side(m.dst_array, dst_dev)))
}

/// Why a copy a graph replays on the server cannot be made: the library's status, or the
/// program's memory could not be mirrored (the reason).
pub(crate) enum Unmirrored {
    Status(u32),
    Why(String),
}

/// `len` bytes spanned by `depth` slices of `height` rows of `width` bytes, `pitch` bytes
/// apart and `rows` rows per slice (0 when empty); None past the address space.
pub(crate) fn span_3d(pitch: u64, rows: u64, width: u64, height: u64, depth: u64) -> Option<u64> {
    if width == 0 || height == 0 || depth == 0 {
        return Some(0);
    }
    let slice = pitch.checked_mul(rows.max(1))?;
    (depth - 1).checked_mul(slice)?.checked_add((height - 1).checked_mul(pitch)?)?.checked_add(width)
}

/// The first byte of a box at (x, y, z) in memory at `base` with rows of `pitch` bytes and
/// `rows` rows per slice; None past the address space.
fn box_start(base: u64, (x, y, z): (u64, u64, u64), pitch: u64, rows: u64) -> Option<u64> {
    let off = z.checked_mul(pitch.checked_mul(rows.max(1))?)?.checked_add(y.checked_mul(pitch)?)?.checked_add(x)?;
    base.checked_add(off)
}

/// Make the box of `width` × `height` × `depth` bytes at (x, y, z) of the program's memory at
/// `base` (rows of `pitch` bytes, `rows` a slice) one the server mirrors, for a graph.
fn mirror_box(
    conn: &Conn,
    base: u64,
    at: (u64, u64, u64),
    (pitch, rows): (u64, u64),
    (width, height, depth): (Option<u64>, u64, u64),
) -> Result<(), Unmirrored> {
    let first = box_start(base, at, pitch, rows);
    let len = width.and_then(|w| span_3d(pitch, rows, w, height, depth));
    let (Some(first), Some(len)) = (first, len) else {
        return Err(Unmirrored::Status(chidori_cuda::consts::cudaError::cudaErrorInvalidValue));
    };
    crate::mirror::for_server(conn, first, len, crate::mirror::GRAPHS).map_err(Unmirrored::Why)
}

/// A runtime 3D copy that a graph replays on the server (a node, or a copy on a capturing
/// stream): each pointer side in the program's memory becomes memory the server mirrors,
/// which the graph then names by the program's address (the server gives the node its
/// mirror's: `mirror::for_server`).
fn mirror_sides_3d(conn: &Conn, m: &Memcpy3DParms) -> Result<(), Unmirrored> {
    let (src, dst) = sides_3d(m).map_err(Unmirrored::Status)?;
    if src != Side::Host && dst != Side::Host {
        return Ok(());
    }
    let elem = if src == Side::Array || dst == Side::Array {
        array_element_size(conn, m.src_array.max(m.dst_array)).map_err(Unmirrored::Status)?
    } else {
        1
    };
    let [w, h, d] = m.extent;
    for (side, p, pos) in [(src, &m.src_ptr, &m.src_pos), (dst, &m.dst_ptr, &m.dst_pos)] {
        if side == Side::Host {
            let at = (pos[0], pos[1], pos[2]);
            mirror_box(conn, p.ptr, at, (p.pitch, p.ysize), (w.checked_mul(elem), h, d))?;
        }
    }
    Ok(())
}

/// A cudaMemcpy3DParms for a graph node: sides in the program's memory mirrored, the kind
/// the record allows the server (DeviceToDevice).
///
/// # Safety
/// `p` is the caller's cudaMemcpy3DParms.
pub(crate) unsafe fn node_copy_record(conn: &Conn, p: *const c_void) -> Result<Vec<u8>, Unmirrored> {
    // SAFETY: per the contract (160 bytes in every version).
    let mut m = unsafe { std::ptr::read_unaligned(p as *const Memcpy3DParms) };
    mirror_sides_3d(conn, &m)?;
    m.kind = chidori_cuda::consts::cudaMemcpyKind::cudaMemcpyDeviceToDevice;
    // SAFETY: a plain-data record, read as its bytes.
    let bytes =
        unsafe { std::slice::from_raw_parts(&m as *const Memcpy3DParms as *const u8, size_of::<Memcpy3DParms>()) };
    Ok(bytes.to_vec())
}

/// Whether `stream` (of an asynchronous copy) is capturing: its copy becomes a graph node.
fn capturing(stream: Option<u64>) -> bool {
    stream.is_some_and(|s| super::capture::stream_capturing(s, false))
}

/// The status for a copy on a capturing stream whose host memory cannot be mirrored.
fn unmirrored(e: Unmirrored) -> u32 {
    match e {
        Unmirrored::Status(s) => s,
        Unmirrored::Why(why) => memory::refused_in_capture(why),
    }
}

/// A runtime 3D copy: sent as is between device memory and arrays; through a staging
/// buffer where a side is host memory (on a capturing stream, its mirror instead).
fn copy_3d_runtime(conn: &Conn, form: &'static CallDesc, mut m: Memcpy3DParms, stream: Option<u64>) -> u32 {
    let (mut src, mut dst) = match sides_3d(&m) {
        Ok(s) => s,
        Err(e) => return e,
    };
    if (src == Side::Host || dst == Side::Host) && capturing(stream) {
        if let Err(e) = mirror_sides_3d(conn, &m) {
            return unmirrored(e);
        }
        (src, dst) = (Side::Device, Side::Device);
    }
    let send = |m: &Memcpy3DParms| -> u32 {
        let mut m = *m;
        m.kind = chidori_cuda::consts::cudaMemcpyKind::cudaMemcpyDeviceToDevice;
        let mut args = vec![&m as *const Memcpy3DParms as u64];
        args.extend(stream);
        // SAFETY: the record lives across the call; the worker checks its arrays.
        unsafe { call(conn, form, &args) }
    };
    if src != Side::Host && dst != Side::Host {
        return send(&m);
    }
    if let Some(s) = stream {
        conn.wait_callbacks(s);
        state::wait_deferred();
    }
    let [w, h, d] = m.extent.map(|v| v.max(1));
    // The extent counts an array's elements where one takes part, bytes otherwise.
    let array = if src == Side::Array { m.src_array } else { m.dst_array };
    let elem = if src == Side::Array || dst == Side::Array {
        match array_element_size(conn, array) {
            Ok(e) => e,
            Err(e) => return e,
        }
    } else {
        1
    };
    let width = m.extent[0] * elem;
    let region = |p: &PitchedPtr, pos: &[u64; 3]| HostRegion {
        first: p.ptr + pos[2] * p.pitch * p.ysize.max(1) + pos[1] * p.pitch + pos[0],
        pitch: p.pitch,
        rows: p.ysize.max(1),
    };
    let packed_len = width * h * d;
    let staged = |at: u64| PitchedPtr { ptr: at, pitch: width, xsize: width, ysize: h };
    let _ = w;
    match (src, dst) {
        (Side::Host, Side::Host) => {
            let (from, to) = (region(&m.src_ptr, &m.src_pos), region(&m.dst_ptr, &m.dst_pos));
            // SAFETY: both regions are the caller's host memory (CUDA's contract).
            unsafe {
                let packed = from.gather(width as usize, h as usize, d as usize);
                to.scatter(&packed, width as usize, h as usize, d as usize);
            }
            0
        }
        (Side::Host, _) => {
            let from = region(&m.src_ptr, &m.src_pos);
            // SAFETY: the source region is the caller's host memory.
            let packed = unsafe { from.gather(width as usize, h as usize, d as usize) };
            let staging = match stage_in(conn, &packed, stream, false) {
                Ok(s) => s,
                Err(e) => return e,
            };
            (m.src_array, m.src_pos, m.src_ptr) = (0, [0; 3], staged(staging.address));
            let s = send(&m);
            staging.free(conn);
            s
        }
        (_, Side::Host) => {
            let to = region(&m.dst_ptr, &m.dst_pos);
            let staging = match Staging::new(conn, packed_len, stream, false) {
                Ok(s) => s,
                Err(e) => return e,
            };
            let original = m;
            (m.dst_array, m.dst_pos, m.dst_ptr) = (0, [0; 3], staged(staging.address));
            let s = send(&m);
            let packed = if s == SUCCESS { stage_out(conn, &staging, packed_len) } else { Err(s) };
            staging.free(conn);
            match packed {
                Ok(bytes) => {
                    let _ = original;
                    // SAFETY: the destination region is the caller's host memory.
                    unsafe { to.scatter(&bytes, width as usize, h as usize, d as usize) };
                    0
                }
                Err(e) => e,
            }
        }
        _ => send(&m),
    }
}

pub unsafe fn memcpy_3d(ctx: &Ctx, p: *mut c_void) -> u32 {
    run(ctx, |conn| {
        if p.is_null() {
            return Err(invalid(ctx));
        }
        // SAFETY: the caller's cudaMemcpy3DParms.
        let m = unsafe { std::ptr::read_unaligned(p as *const Memcpy3DParms) };
        Ok(copy_3d_runtime(conn, ctx.form(Form::D2d), m, None))
    })
}

pub unsafe fn memcpy_3d_async(ctx: &Ctx, p: *mut c_void, stream: *mut c_void) -> u32 {
    run(ctx, |conn| {
        if p.is_null() {
            return Err(invalid(ctx));
        }
        // SAFETY: the caller's cudaMemcpy3DParms.
        let m = unsafe { std::ptr::read_unaligned(p as *const Memcpy3DParms) };
        Ok(copy_3d_runtime(conn, ctx.form(Form::D2d), m, Some(ctx.stream(stream as u64))))
    })
}

// ---- Batches of the runtime ----

/// cudaMemcpyBatchAsync: each copy as cudaMemcpyAsync with cudaMemcpyDefault, in order
/// (the attributes are hints about access order and overlap).
fn batch(ctx: &Ctx, dsts: u64, srcs: u64, sizes: u64, count: usize, fail: u64, stream: u64) -> u32 {
    run(ctx, |conn| {
        if count == 0 || dsts == 0 || srcs == 0 || sizes == 0 {
            return Err(invalid(ctx));
        }
        let forms = CopyForms {
            h2d: &calls::cudaMemcpyAsync__h2d,
            d2h: &calls::cudaMemcpyAsync__d2h,
            d2d: &calls::cudaMemcpyAsync__d2d,
        };
        for i in 0..count {
            // SAFETY: the caller's three arrays of `count` elements.
            let (dst, src, size) =
                unsafe { (*(dsts as *const u64).add(i), *(srcs as *const u64).add(i), *(sizes as *const u64).add(i)) };
            let direction = memory::direction(chidori_cuda::consts::cudaMemcpyKind::cudaMemcpyDefault, dst, src)
                .ok_or(invalid(ctx))?;
            // SAFETY: host sides are the caller's buffers of `size` bytes.
            let s = unsafe { memory::copy(conn, &forms, dst, src, size, direction, &[stream], true) } as u32;
            if s != SUCCESS {
                if fail != 0 {
                    // SAFETY: the caller's size_t.
                    unsafe { std::ptr::write_unaligned(fail as *mut usize, i) };
                }
                return Err(s);
            }
        }
        Ok(SUCCESS)
    })
}

/// cudaMemcpy3DOperand: a type (cudaMemcpy3DOperandType) and, for a pointer, its address, row
/// length and layer height in elements and a location hint; for an array, the array and
/// an offset in elements.
fn operand(op: &[u8]) -> Option<(u32, [u64; 4])> {
    let word = |at: usize| op.get(at..at + 8).and_then(|b| b.try_into().ok()).map(u64::from_le_bytes);
    let ty = u32::from_le_bytes(op.get(..4)?.try_into().ok()?);
    Some((ty, [word(8)?, word(16)?, word(24)?, word(32)?]))
}

/// One cudaMemcpy3DBatchOp (112 bytes: src operand, dst operand, extent, order, flags) as
/// cudaMemcpy3DParms. A pointer operand's row length and layer height count elements of
/// the copy (an array's when one takes part, else bytes); 0 means the extent's.
fn batch_op(conn: &Conn, op: &[u8]) -> Result<Memcpy3DParms, u32> {
    use chidori_cuda::consts::cudaMemcpy3DOperandType::{
        cudaMemcpyOperandTypeArray as ARRAY, cudaMemcpyOperandTypePointer as POINTER,
    };
    const INVALID_VALUE: u32 = chidori_cuda::consts::cudaError::cudaErrorInvalidValue;
    let (src_ty, src) = operand(op.get(..40).ok_or(INVALID_VALUE)?).ok_or(INVALID_VALUE)?;
    let (dst_ty, dst) = operand(op.get(40..80).ok_or(INVALID_VALUE)?).ok_or(INVALID_VALUE)?;
    let word = |at: usize| op.get(at..at + 8).and_then(|b| b.try_into().ok()).map(u64::from_le_bytes).unwrap_or(0);
    let extent = [word(80), word(88), word(96)];
    let array = if src_ty == ARRAY {
        src[0]
    } else if dst_ty == ARRAY {
        dst[0]
    } else {
        0
    };
    let elem = if array != 0 { array_element_size(conn, array)? } else { 1 };
    let mut m =
        Memcpy3DParms { extent, kind: chidori_cuda::consts::cudaMemcpyKind::cudaMemcpyDefault, ..Default::default() };
    let pitched = |v: &[u64; 4]| {
        let row = if v[1] == 0 { extent[0] } else { v[1] } * elem;
        let layer = if v[2] == 0 { extent[1] } else { v[2] };
        PitchedPtr { ptr: v[0], pitch: row, xsize: row, ysize: layer }
    };
    match src_ty {
        POINTER => m.src_ptr = pitched(&src),
        ARRAY => (m.src_array, m.src_pos) = (src[0], [src[1], src[2], src[3]]),
        _ => return Err(INVALID_VALUE),
    }
    match dst_ty {
        POINTER => m.dst_ptr = pitched(&dst),
        ARRAY => (m.dst_array, m.dst_pos) = (dst[0], [dst[1], dst[2], dst[3]]),
        _ => return Err(INVALID_VALUE),
    }
    Ok(m)
}

fn batch_3d(ctx: &Ctx, num_ops: usize, ops: u64, fail: u64, stream: u64) -> u32 {
    batch_ops(ctx, num_ops, ops, fail, |conn, op| match batch_op(conn, op) {
        Ok(m) => copy_3d_runtime(conn, &calls::cudaMemcpy3DAsync__d2d, m, Some(stream)),
        Err(e) => e,
    })
}

/// Run `copy` on each of a batch's `num_ops` 112-byte records in order; the first failure
/// ends the batch, its index written to `fail` where the caller asked for it.
fn batch_ops(ctx: &Ctx, num_ops: usize, ops: u64, fail: u64, copy: impl Fn(&Conn, &[u8]) -> u32) -> u32 {
    run(ctx, |conn| {
        if num_ops == 0 || ops == 0 {
            return Err(invalid(ctx));
        }
        for i in 0..num_ops {
            // SAFETY: the caller's array of numOps 112-byte records.
            let op = unsafe { std::slice::from_raw_parts((ops as usize + i * 112) as *const u8, 112) };
            let s = copy(conn, op);
            if s != SUCCESS {
                if fail != 0 {
                    // SAFETY: the caller's size_t.
                    unsafe { std::ptr::write_unaligned(fail as *mut usize, i) };
                }
                return Err(s);
            }
        }
        Ok(SUCCESS)
    })
}

// ---- 2D and 3D copies of the driver ----

use chidori_cuda::consts::CUmemorytype_enum::{
    CU_MEMORYTYPE_ARRAY as ARRAY, CU_MEMORYTYPE_DEVICE as DEVICE, CU_MEMORYTYPE_HOST as HOST,
    CU_MEMORYTYPE_UNIFIED as UNIFIED,
};

/// CUDA_MEMCPY3D (200 bytes from CUDA 11 to 13).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct CuMemcpy3D {
    src_x: u64,
    src_y: u64,
    src_z: u64,
    src_lod: u64,
    src_type: u32,
    src_host: u64,
    src_device: u64,
    src_array: u64,
    reserved0: u64,
    src_pitch: u64,
    src_height: u64,
    dst_x: u64,
    dst_y: u64,
    dst_z: u64,
    dst_lod: u64,
    dst_type: u32,
    dst_host: u64,
    dst_device: u64,
    dst_array: u64,
    reserved1: u64,
    dst_pitch: u64,
    dst_height: u64,
    width: u64,
    height: u64,
    depth: u64,
}

/// CUDA_MEMCPY2D (128 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct CuMemcpy2D {
    src_x: u64,
    src_y: u64,
    src_type: u32,
    src_host: u64,
    src_device: u64,
    src_array: u64,
    src_pitch: u64,
    dst_x: u64,
    dst_y: u64,
    dst_type: u32,
    dst_host: u64,
    dst_device: u64,
    dst_array: u64,
    dst_pitch: u64,
    width: u64,
    height: u64,
}

const _: () = {
    assert!(size_of::<CuMemcpy3D>() == 200);
    assert!(std::mem::offset_of!(CuMemcpy3D, src_host) == 40);
    assert!(std::mem::offset_of!(CuMemcpy3D, dst_type) == 120);
    assert!(std::mem::offset_of!(CuMemcpy3D, width) == 176);
    assert!(size_of::<CuMemcpy2D>() == 128);
    assert!(std::mem::offset_of!(CuMemcpy2D, dst_type) == 72);
    assert!(std::mem::offset_of!(CuMemcpy2D, height) == 120);
};

/// A driver copy side's memory type, with unified addresses resolved by the interval map
/// (pinned memory is the client's unless the server mirrors it).
fn resolve_type(ty: u32, device: u64) -> u32 {
    match ty {
        UNIFIED => {
            let addr = device;
            if crate::mirror::is_mirrored(addr) || (state::is_device(addr) && !state::is_pinned(addr)) {
                DEVICE
            } else {
                HOST
            }
        }
        other => other,
    }
}

/// Both sides of a driver copy with unified sides resolved to device or host memory (a
/// unified side's address is its device field, natively: its host field is not read).
fn resolve_unified(m: &mut CuMemcpy3D) {
    if m.src_type == UNIFIED {
        m.src_host = m.src_device;
    }
    if m.dst_type == UNIFIED {
        m.dst_host = m.dst_device;
    }
    m.src_type = resolve_type(m.src_type, m.src_device);
    m.dst_type = resolve_type(m.dst_type, m.dst_device);
}

/// A memcpy node's CUDA_MEMCPY3D as the server's graph can run it: unified sides resolved to
/// device memory (a statically linked runtime names every side unified); a side in the
/// program's own memory is refused (the graph replays on the server).
///
/// # Safety
/// `p` is null or the caller's CUDA_MEMCPY3D.
pub(crate) unsafe fn node_copy_3d(conn: &Conn, p: *const c_void) -> Result<Vec<u8>, Unmirrored> {
    if p.is_null() {
        return Err(Unmirrored::Status(chidori_cuda::consts::cudaError_enum::CUDA_ERROR_INVALID_VALUE));
    }
    // SAFETY: per the contract (200 bytes in every version).
    let mut m = unsafe { std::ptr::read_unaligned(p as *const CuMemcpy3D) };
    resolve_unified(&mut m);
    mirror_host_sides_driver(conn, &mut m)?;
    // SAFETY: a plain-data record, read as its bytes.
    let bytes = unsafe { std::slice::from_raw_parts(&m as *const CuMemcpy3D as *const u8, size_of::<CuMemcpy3D>()) };
    Ok(bytes.to_vec())
}

/// A driver copy (unified sides resolved) that a graph replays on the server: each host side
/// becomes memory the server mirrors, named as device memory by the program's address (the
/// server gives the node its mirror's).
fn mirror_host_sides_driver(conn: &Conn, m: &mut CuMemcpy3D) -> Result<(), Unmirrored> {
    let size = (Some(m.width), m.height.max(1), m.depth.max(1));
    if m.src_type == HOST {
        mirror_box(conn, m.src_host, (m.src_x, m.src_y, m.src_z), (m.src_pitch, m.src_height), size)?;
        (m.src_type, m.src_device) = (DEVICE, m.src_host);
    }
    if m.dst_type == HOST {
        mirror_box(conn, m.dst_host, (m.dst_x, m.dst_y, m.dst_z), (m.dst_pitch, m.dst_height), size)?;
        (m.dst_type, m.dst_device) = (DEVICE, m.dst_host);
    }
    Ok(())
}

/// A driver 3D copy (a 2D one has depth 1): sent as is between device memory and arrays,
/// through a staging buffer where a side is host memory (on a capturing stream, its mirror
/// instead). `send` issues the device-side copy.
fn copy_3d_driver(conn: &Conn, mut m: CuMemcpy3D, stream: Option<u64>, send: &dyn Fn(&CuMemcpy3D) -> u32) -> u32 {
    resolve_unified(&mut m);
    if (m.src_type == HOST && m.src_host == 0) || (m.dst_type == HOST && m.dst_host == 0) {
        return chidori_cuda::consts::cudaError_enum::CUDA_ERROR_INVALID_VALUE;
    }
    if (m.src_type == HOST || m.dst_type == HOST)
        && capturing(stream)
        && let Err(e) = mirror_host_sides_driver(conn, &mut m)
    {
        return unmirrored(e);
    }
    let (w, h, d) = (m.width as usize, m.height.max(1) as usize, m.depth.max(1) as usize);
    let host_region = |host: u64, x: u64, y: u64, z: u64, pitch: u64, rows: u64| HostRegion {
        first: host + z * pitch * rows.max(1) + y * pitch + x,
        pitch,
        rows: rows.max(1),
    };
    let staged = |m: &mut CuMemcpy3D, source: bool, address: u64| {
        if source {
            (m.src_type, m.src_device, m.src_array, m.src_host) = (DEVICE, address, 0, 0);
            (m.src_x, m.src_y, m.src_z, m.src_pitch, m.src_height) = (0, 0, 0, w as u64, h as u64);
        } else {
            (m.dst_type, m.dst_device, m.dst_array, m.dst_host) = (DEVICE, address, 0, 0);
            (m.dst_x, m.dst_y, m.dst_z, m.dst_pitch, m.dst_height) = (0, 0, 0, w as u64, h as u64);
        }
    };
    match (m.src_type, m.dst_type) {
        (HOST, HOST) => {
            let from = host_region(m.src_host, m.src_x, m.src_y, m.src_z, m.src_pitch, m.src_height);
            let to = host_region(m.dst_host, m.dst_x, m.dst_y, m.dst_z, m.dst_pitch, m.dst_height);
            state::wait_deferred();
            // SAFETY: both regions are the caller's host memory (CUDA's contract).
            unsafe { to.scatter(&from.gather(w, h, d), w, h, d) };
            0
        }
        (HOST, DEVICE | ARRAY) => {
            if let Some(s) = stream {
                conn.wait_callbacks(s);
            }
            let from = host_region(m.src_host, m.src_x, m.src_y, m.src_z, m.src_pitch, m.src_height);
            // SAFETY: the source region is the caller's host memory.
            let packed = unsafe { from.gather(w, h, d) };
            let staging = match stage_in(conn, &packed, stream, true) {
                Ok(s) => s,
                Err(e) => return e,
            };
            staged(&mut m, true, staging.address);
            let s = send(&m);
            staging.free(conn);
            s
        }
        (DEVICE | ARRAY, HOST) => {
            let to = host_region(m.dst_host, m.dst_x, m.dst_y, m.dst_z, m.dst_pitch, m.dst_height);
            let len = (w * h * d) as u64;
            let staging = match Staging::new(conn, len, stream, true) {
                Ok(s) => s,
                Err(e) => return e,
            };
            staged(&mut m, false, staging.address);
            let s = send(&m);
            let packed = if s == SUCCESS { stage_out(conn, &staging, len) } else { Err(s) };
            staging.free(conn);
            match packed {
                Ok(bytes) => {
                    // SAFETY: the destination region is the caller's host memory.
                    unsafe { to.scatter(&bytes, w, h, d) };
                    0
                }
                Err(e) => e,
            }
        }
        (DEVICE | ARRAY, DEVICE | ARRAY) => send(&m),
        _ => chidori_cuda::consts::cudaError_enum::CUDA_ERROR_INVALID_VALUE,
    }
}

fn to_3d(c: &CuMemcpy2D) -> CuMemcpy3D {
    CuMemcpy3D {
        src_x: c.src_x,
        src_y: c.src_y,
        src_type: c.src_type,
        src_host: c.src_host,
        src_device: c.src_device,
        src_array: c.src_array,
        src_pitch: c.src_pitch,
        src_height: c.height,
        dst_x: c.dst_x,
        dst_y: c.dst_y,
        dst_type: c.dst_type,
        dst_host: c.dst_host,
        dst_device: c.dst_device,
        dst_array: c.dst_array,
        dst_pitch: c.dst_pitch,
        dst_height: c.height,
        width: c.width,
        height: c.height,
        depth: 1,
        ..Default::default()
    }
}

fn to_2d(m: &CuMemcpy3D) -> CuMemcpy2D {
    CuMemcpy2D {
        src_x: m.src_x,
        src_y: m.src_y,
        src_type: m.src_type,
        src_host: m.src_host,
        src_device: m.src_device,
        src_array: m.src_array,
        src_pitch: m.src_pitch,
        dst_x: m.dst_x,
        dst_y: m.dst_y,
        dst_type: m.dst_type,
        dst_host: m.dst_host,
        dst_device: m.dst_device,
        dst_array: m.dst_array,
        dst_pitch: m.dst_pitch,
        width: m.width,
        height: m.height,
    }
}

fn cu_2d(ctx: &Ctx, p: *mut c_void, stream: Option<u64>) -> u32 {
    run(ctx, |conn| {
        if p.is_null() {
            return Err(invalid(ctx));
        }
        // SAFETY: the caller's CUDA_MEMCPY2D.
        let c = unsafe { std::ptr::read_unaligned(p as *const CuMemcpy2D) };
        let form = ctx.form(Form::D2d);
        let send = |m: &CuMemcpy3D| -> u32 {
            let c = to_2d(m);
            let mut args = vec![&c as *const CuMemcpy2D as u64];
            args.extend(stream);
            // SAFETY: the record lives across the call; the worker checks its arrays.
            unsafe { call(conn, form, &args) }
        };
        Ok(copy_3d_driver(conn, to_3d(&c), stream, &send))
    })
}

fn cu_3d(ctx: &Ctx, p: *mut c_void, stream: Option<u64>) -> u32 {
    run(ctx, |conn| {
        if p.is_null() {
            return Err(invalid(ctx));
        }
        // SAFETY: the caller's CUDA_MEMCPY3D.
        let m = unsafe { std::ptr::read_unaligned(p as *const CuMemcpy3D) };
        let form = ctx.form(Form::D2d);
        let send = |m: &CuMemcpy3D| -> u32 {
            let mut args = vec![m as *const CuMemcpy3D as u64];
            args.extend(stream);
            // SAFETY: the record lives across the call; the worker checks its arrays.
            unsafe { call(conn, form, &args) }
        };
        Ok(copy_3d_driver(conn, m, stream, &send))
    })
}

/// cuMemcpyBatchAsync: each copy as cuMemcpyAsync (unified addressing decides the sides).
fn cu_batch(ctx: &Ctx, dsts: u64, srcs: u64, sizes: u64, count: usize, fail: u64, stream: u64) -> u32 {
    run(ctx, |conn| {
        if count == 0 || dsts == 0 || srcs == 0 || sizes == 0 {
            return Err(invalid(ctx));
        }
        for i in 0..count {
            // SAFETY: the caller's three arrays of `count` elements.
            let (dst, src, size) =
                unsafe { (*(dsts as *const u64).add(i), *(srcs as *const u64).add(i), *(sizes as *const u64).add(i)) };
            let m = CuMemcpy3D {
                src_type: UNIFIED,
                src_device: src,
                src_pitch: size,
                dst_type: UNIFIED,
                dst_device: dst,
                dst_pitch: size,
                width: size,
                height: 1,
                depth: 1,
                ..Default::default()
            };
            let send = |m: &CuMemcpy3D| -> u32 {
                let args = [m as *const CuMemcpy3D as u64, stream];
                // SAFETY: the record lives across the call.
                unsafe { call(conn, &dcalls::cuMemcpy3DAsync_v2__d2d, &args) }
            };
            let s = if size == 0 { SUCCESS } else { copy_3d_driver(conn, m, Some(stream), &send) };
            if s != SUCCESS {
                if fail != 0 {
                    // SAFETY: the caller's size_t.
                    unsafe { std::ptr::write_unaligned(fail as *mut usize, i) };
                }
                return Err(s);
            }
        }
        Ok(SUCCESS)
    })
}

/// CUDA_MEMCPY3D_BATCH_OP: as cudaMemcpy3DBatchOp, with CUarray operands and extents in
/// bytes for pointers (an array's element size is the driver's to know: asked of it).
fn cu_batch_3d(ctx: &Ctx, num_ops: usize, ops: u64, fail: u64, stream: u64) -> u32 {
    batch_ops(ctx, num_ops, ops, fail, |conn, op| match batch_op(conn, op) {
        Ok(r) => {
            // The runtime's record, as the driver's: pointers are unified addresses.
            let elem = if r.src_array != 0 || r.dst_array != 0 {
                array_element_size(conn, r.src_array.max(r.dst_array)).unwrap_or(1)
            } else {
                1
            };
            let m = CuMemcpy3D {
                src_x: if r.src_array != 0 { r.src_pos[0] * elem } else { 0 },
                src_y: r.src_pos[1],
                src_z: r.src_pos[2],
                src_type: if r.src_array != 0 { ARRAY } else { UNIFIED },
                src_device: r.src_ptr.ptr,
                src_array: r.src_array,
                src_pitch: r.src_ptr.pitch,
                src_height: r.src_ptr.ysize,
                dst_x: if r.dst_array != 0 { r.dst_pos[0] * elem } else { 0 },
                dst_y: r.dst_pos[1],
                dst_z: r.dst_pos[2],
                dst_type: if r.dst_array != 0 { ARRAY } else { UNIFIED },
                dst_device: r.dst_ptr.ptr,
                dst_array: r.dst_array,
                dst_pitch: r.dst_ptr.pitch,
                dst_height: r.dst_ptr.ysize,
                width: r.extent[0] * elem,
                height: r.extent[1],
                depth: r.extent[2],
                ..Default::default()
            };
            let send = |m: &CuMemcpy3D| -> u32 {
                let args = [m as *const CuMemcpy3D as u64, stream];
                // SAFETY: the record lives across the call.
                unsafe { call(conn, &dcalls::cuMemcpy3DAsync_v2__d2d, &args) }
            };
            copy_3d_driver(conn, m, Some(stream), &send)
        }
        Err(e) => e,
    })
}

/// Batches of copies of both APIs (`raw_args`, the stream last): cudaMemcpyBatchAsync and
/// cuMemcpyBatchAsync (dsts, srcs, sizes, count, attributes, their indices, their count,
/// [failIdx,] stream) and the 3D batches (count, operations, [failIdx,] flags, stream). The
/// failure index is 12.8's, gone in 13.0 (one argument fewer). CUDA 13.5's single copies
/// with attributes are batches of one: (dst, src, size, attributes, stream) and (operation,
/// flags, stream). The attributes only say how the copy may overlap other work; each copy
/// goes in stream order, which every ordering they name allows.
pub unsafe fn batch_raw(ctx: &Ctx, args: &[u64]) -> u64 {
    let word = |i: usize| args.get(i).copied().unwrap_or(0);
    let n = args.len();
    let stream = ctx.stream(word(n.saturating_sub(1)));
    let driver = ctx.library == "driver";
    let status = if ctx.name.contains("3DWithAttributes") {
        if driver { cu_batch_3d(ctx, 1, word(0), 0, stream) } else { batch_3d(ctx, 1, word(0), 0, stream) }
    } else if ctx.name.contains("WithAttributes") {
        if word(3) == 0 {
            return u64::from(invalid(ctx));
        }
        let [dst, src, size] = [word(0), word(1), word(2)];
        let (dsts, srcs, sizes) = (&raw const dst as u64, &raw const src as u64, &raw const size as u64);
        if driver {
            cu_batch(ctx, dsts, srcs, sizes, 1, 0, stream)
        } else {
            batch(ctx, dsts, srcs, sizes, 1, 0, stream)
        }
    } else if ctx.name.contains("3DBatch") {
        let fail = if n == 5 { word(2) } else { 0 };
        let count = word(0) as usize;
        if driver {
            cu_batch_3d(ctx, count, word(1), fail, stream)
        } else {
            batch_3d(ctx, count, word(1), fail, stream)
        }
    } else {
        let fail = if n == 9 { word(7) } else { 0 };
        let (dsts, srcs, sizes, count) = (word(0), word(1), word(2), word(3) as usize);
        if driver {
            cu_batch(ctx, dsts, srcs, sizes, count, fail, stream)
        } else {
            batch(ctx, dsts, srcs, sizes, count, fail, stream)
        }
    };
    u64::from(status)
}

/// cuMemcpy2D_v2, cuMemcpy2DUnaligned_v2, cuMemcpy3D_v2, their async and `_ptds`/`_ptsz`
/// forms (`raw_args`: the record[, the stream]).
pub unsafe fn cu_copy_raw(ctx: &Ctx, args: &[u64]) -> u64 {
    let p = args.first().copied().unwrap_or(0) as *mut c_void;
    let stream = args.get(1).map(|&s| ctx.stream(s));
    let status = if ctx.name.contains("3D") { cu_3d(ctx, p, stream) } else { cu_2d(ctx, p, stream) };
    u64::from(status)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The hand-written mirrors match the headers' layouts at every CUDA version.
    #[test]
    fn record_mirrors_match_the_headers() {
        for (version, _) in chidori_cuda::structs::BY_VERSION {
            let check = |name: &str, size: usize, fields: &[(&str, usize)]| {
                let Some(map) = chidori_cuda::structs::get(version, name) else { return };
                assert_eq!(map.size as usize, size, "{name} at {version}");
                for (field, offset) in fields {
                    let f = map.fields.iter().find(|f| f.name == *field).unwrap_or_else(|| panic!("{name}.{field}"));
                    assert_eq!(f.offset as usize, *offset, "{name}.{field} at {version}");
                }
            };
            check("cudaMemcpy3DParms", size_of::<Memcpy3DParms>(), &[("dstArray", 64), ("kind", 152)]);
            check(
                "CUDA_MEMCPY3D_st",
                size_of::<CuMemcpy3D>(),
                &[("srcMemoryType", 32), ("dstArray", 144), ("WidthInBytes", 176)],
            );
            check("CUDA_MEMCPY2D_st", size_of::<CuMemcpy2D>(), &[("dstMemoryType", 72), ("Height", 120)]);
        }
    }

    #[test]
    fn host_regions_gather_and_scatter_slices_of_rows() {
        // 2 slices of 3 rows of pitch 8, of which a 2 x 2 x 2 box at (1, 1, 0).
        let mut host: Vec<u8> = (0..48).collect();
        let region = HostRegion { first: host.as_ptr() as u64 + 8 + 1, pitch: 8, rows: 3 };
        // SAFETY: the region lies inside `host`.
        let packed = unsafe { region.gather(2, 2, 2) };
        assert_eq!(packed, [9, 10, 17, 18, 33, 34, 41, 42]);
        let region = HostRegion { first: host.as_mut_ptr() as u64 + 8 + 1, pitch: 8, rows: 3 };
        // SAFETY: as above.
        unsafe { region.scatter(&[0; 8], 2, 2, 2) };
        assert_eq!(&host[8..12], &[8, 0, 0, 11]);
        assert_eq!(&host[40..44], &[40, 0, 0, 43]);
    }
}
