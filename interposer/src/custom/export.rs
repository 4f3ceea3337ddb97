//! `cuGetExportTable`: the driver's private tables, which a statically linked CUDA runtime
//! (nvcc's default, CuPy's and cuda-python's modules, NVIDIA's libraries) asks for at start
//! and without which it answers every call with an error. They are answered on the client:
//! what they do is local bookkeeping (context-local storage, tool buffers), a check the
//! runtime makes of its driver, or the public API under another name.
//!
//! * **runtime interface**: a device's primary context (as `cuDevicePrimaryCtxRetain` names
//!   it, without keeping a reference), modules from fat binaries (as `cuModuleLoadData`);
//! * **tool hooks**, **tool thread storage**: buffers the runtime's tool support writes;
//! * **tool support, newer**: a table CUDA 13.5's runtime (not 13.0's to 13.2's) requires
//!   beside the tool tables at start, else it answers every call "insufficient driver" (seen
//!   in NVIDIA's nvJPEG 13.3 and the 13.5 runtime wheel); no runtime was seen to call into
//!   it, so every slot is one no known runtime calls;
//! * **context-local storage**: a value per (context, key) with a destructor, run when the
//!   context is reset or destroyed; the runtime keeps its per-context state there;
//! * **context checks**: no context is a wrapper of another;
//! * **integrity check**: an HMAC (RFC 2104) over MD2 (RFC 1319) of the driver version, the
//!   process and thread, the tables' addresses and each device's UUID and PCI location, which
//!   the runtime computes again from what the driver told it and compares. Every input is
//!   what this client answers the program, so the two agree.
//!
//! Each table is a static that never moves (the check covers their addresses); the first
//! word is its size in bytes, except for context-local storage. Slots no runtime is known
//! to call answer CUDA_ERROR_NOT_SUPPORTED. A table this client does not know is refused
//! with CUDA_ERROR_INVALID_VALUE, as the driver refuses an unknown one, and logged once.
#![allow(clippy::missing_safety_doc)]

use std::ffi::c_void;

use chidori_cuda::desc::Ctx;

use crate::state::CLIENT;

const SUCCESS: u32 = chidori_cuda::consts::cudaError_enum::CUDA_SUCCESS;
const INVALID_VALUE: u32 = chidori_cuda::consts::cudaError_enum::CUDA_ERROR_INVALID_VALUE;
const INVALID_CONTEXT: u32 = chidori_cuda::consts::cudaError_enum::CUDA_ERROR_INVALID_CONTEXT;
const INVALID_HANDLE: u32 = chidori_cuda::consts::cudaError_enum::CUDA_ERROR_INVALID_HANDLE;
const NOT_SUPPORTED: u32 = chidori_cuda::consts::cudaError_enum::CUDA_ERROR_NOT_SUPPORTED;

type Uuid = [u8; 16];

const RUNTIME_INTERFACE: Uuid =
    [0x6b, 0xd5, 0xfb, 0x6c, 0x5b, 0xf4, 0xe7, 0x4a, 0x89, 0x87, 0xd9, 0x39, 0x12, 0xfd, 0x9d, 0xf9];
const TOOL_HOOKS: Uuid =
    [0xa0, 0x94, 0x79, 0x8c, 0x2e, 0x74, 0x2e, 0x74, 0x93, 0xf2, 0x08, 0x00, 0x20, 0x0c, 0x0a, 0x66];
const TOOL_THREAD_STORAGE: Uuid =
    [0x42, 0xd8, 0x5a, 0x81, 0x23, 0xf6, 0xcb, 0x47, 0x82, 0x98, 0xf6, 0xe7, 0x8a, 0x3a, 0xec, 0xdc];
const CONTEXT_STORAGE: Uuid =
    [0xc6, 0x93, 0x33, 0x6e, 0x11, 0x21, 0xdf, 0x11, 0xa8, 0xc3, 0x68, 0xf3, 0x55, 0xd8, 0x95, 0x93];
const CONTEXT_CHECKS: Uuid =
    [0x26, 0x3e, 0x88, 0x60, 0x7c, 0xd2, 0x61, 0x43, 0x92, 0xf6, 0xbb, 0xd5, 0x00, 0x6d, 0xfa, 0x7e];
const INTEGRITY: Uuid =
    [0xd4, 0x08, 0x20, 0x55, 0xbd, 0xe6, 0x70, 0x4b, 0x8d, 0x34, 0xba, 0x12, 0x3c, 0x66, 0xe1, 0xf2];
/// Required by CUDA 13.5's runtime after the tool tables (see the module's documentation).
const TOOL_EXTRA: Uuid =
    [0x21, 0x31, 0x8c, 0x60, 0x97, 0x14, 0x32, 0x48, 0x8c, 0xa6, 0x41, 0xff, 0x73, 0x24, 0xc8, 0xf2];

/// A table of words: sizes and function addresses. Read-only after start.
#[repr(C)]
pub struct Table<const N: usize>([*const c_void; N]);

// SAFETY: the tables are immutable statics of addresses.
unsafe impl<const N: usize> Sync for Table<N> {}

impl<const N: usize> Table<N> {
    fn address(&'static self) -> *const c_void {
        self.0.as_ptr().cast()
    }
}

/// The first word of a table with a size: its length in bytes.
const fn size_word(entries: usize) -> *const c_void {
    (entries * 8) as *const c_void
}

/// A slot no known runtime calls.
extern "C" fn unknown_slot() -> u32 {
    crate::log::once("cuGetExportTable-slot", || {
        tracing::warn!("a private driver table's slot Chidori does not implement was called; it answers NOT_SUPPORTED")
    });
    NOT_SUPPORTED
}

const U: *const c_void = unknown_slot as *const c_void;

static RUNTIME_TABLE: Table<13> = Table([
    size_word(13),
    module_from_fatbin as *const c_void,
    primary_context as *const c_void,
    U,
    U,
    U,
    module_from_fatbin_ext as *const c_void,
    ignore_size as *const c_void,
    module_from_fatbin_header as *const c_void,
    U,
    U,
    U,
    load_compilers as *const c_void,
]);

static TOOL_HOOKS_TABLE: Table<7> =
    Table([size_word(7), U, tool_buffer_large as *const c_void, U, U, U, tool_buffer_small as *const c_void]);

static TOOL_THREAD_STORAGE_TABLE: Table<3> = Table([size_word(3), U, U]);

/// No size word: the runtime calls the first slot.
static CONTEXT_STORAGE_TABLE: Table<4> = Table([
    storage_put as *const c_void,
    storage_delete as *const c_void,
    storage_get as *const c_void,
    std::ptr::null(),
]);

static CONTEXT_CHECKS_TABLE: Table<4> =
    Table([size_word(4), U, context_check as *const c_void, context_check_count as *const c_void]);

static INTEGRITY_TABLE: Table<3> = Table([size_word(3), integrity_check as *const c_void, U]);

static TOOL_EXTRA_TABLE: Table<16> = Table([size_word(16), U, U, U, U, U, U, U, U, U, U, U, U, U, U, U]);

/// cuGetExportTable(const void **ppExportTable, const CUuuid *pExportTableId).
pub unsafe fn get_export_table(ctx: &Ctx, table: *mut c_void, id: *mut c_void) -> u32 {
    crate::guard::ffi(ctx.name, INVALID_VALUE, || {
        crate::trace::local(ctx.name);
        if table.is_null() || id.is_null() {
            return INVALID_VALUE;
        }
        // SAFETY: a CUuuid is 16 bytes.
        let uuid: Uuid = unsafe { std::ptr::read_unaligned(id as *const Uuid) };
        let found = match uuid {
            RUNTIME_INTERFACE => RUNTIME_TABLE.address(),
            TOOL_HOOKS => TOOL_HOOKS_TABLE.address(),
            TOOL_THREAD_STORAGE => TOOL_THREAD_STORAGE_TABLE.address(),
            CONTEXT_STORAGE => CONTEXT_STORAGE_TABLE.address(),
            CONTEXT_CHECKS => CONTEXT_CHECKS_TABLE.address(),
            INTEGRITY => INTEGRITY_TABLE.address(),
            TOOL_EXTRA => TOOL_EXTRA_TABLE.address(),
            _ => {
                let hex: String = uuid.iter().map(|b| format!("{b:02x}")).collect();
                crate::log::once_owned(&format!("export-table-{hex}"), || {
                    tracing::info!("cuGetExportTable: private table {hex} is not one Chidori provides (INVALID_VALUE)")
                });
                return INVALID_VALUE;
            }
        };
        // SAFETY: the caller's const void** (checked non-null).
        unsafe { std::ptr::write_unaligned(table as *mut *const c_void, found) };
        SUCCESS
    })
}

// ---- The runtime interface ----

/// A module from a fat binary's wrapper, as cuModuleLoadData loads one.
extern "C" fn module_from_fatbin(module: *mut c_void, wrapper: *mut c_void) -> u32 {
    // SAFETY: the runtime passes its CUmodule* and a registered wrapper.
    unsafe { crate::custom::driver::cuModuleLoadData(module, wrapper) }
}

/// As [`module_from_fatbin`], with host-variable arguments no known runtime passes.
extern "C" fn module_from_fatbin_ext(
    module: *mut c_void,
    wrapper: *mut c_void,
    extra1: *mut c_void,
    extra2: *mut c_void,
    count: u32,
) -> u32 {
    if !extra1.is_null() || !extra2.is_null() || count != 0 {
        return unknown_slot();
    }
    module_from_fatbin(module, wrapper)
}

/// A module from a bare fat binary (the arguments in the other order).
extern "C" fn module_from_fatbin_header(
    header: *mut c_void,
    module: *mut c_void,
    extra1: *mut c_void,
    extra2: *mut c_void,
    count: u32,
) -> u32 {
    module_from_fatbin_ext(module, header, extra1, extra2, count)
}

/// The device's primary context, which the runtime makes current before retaining it: the
/// server's handle, named by a retain and its release (the server's worker already holds
/// the context, so the pair changes nothing there).
extern "C" fn primary_context(out: *mut c_void, device: i32) -> u32 {
    crate::guard::ffi("cuGetExportTable (primary context)", INVALID_VALUE, || {
        if out.is_null() {
            return INVALID_VALUE;
        }
        use chidori_cuda::calls::driver as calls;
        let dev = device as u32 as u64;
        // SAFETY: the caller's CUcontext* and a device ordinal.
        let s = unsafe { crate::runtime::call(&calls::cuDevicePrimaryCtxRetain, &[out as u64, dev]) } as u32;
        if s != SUCCESS {
            return s;
        }
        // SAFETY: a device ordinal.
        unsafe { crate::runtime::call(&calls::cuDevicePrimaryCtxRelease_v2, &[dev]) };
        // SAFETY: written by the retain.
        let ctx = unsafe { std::ptr::read_unaligned(out as *const u64) };
        CLIENT.primary_contexts.insert(device, ctx);
        SUCCESS
    })
}

extern "C" fn ignore_size(_size: usize) {}

/// The runtime's compilers (PTX, NVVM) are the server's: nothing to load here.
extern "C" fn load_compilers() -> u32 {
    SUCCESS
}

// ---- Tool hooks: buffers for the runtime's tool support, zeroed, alive for the process ----

/// A zeroed buffer the runtime may write.
#[repr(C, align(16))]
pub struct Buffer<const N: usize>(std::cell::UnsafeCell<[u32; N]>);

// SAFETY: only the runtime reads and writes it, through the pointer it is given.
unsafe impl<const N: usize> Sync for Buffer<N> {}

static LARGE: Buffer<1024> = Buffer(std::cell::UnsafeCell::new([0; 1024]));
static SMALL: Buffer<14> = Buffer(std::cell::UnsafeCell::new([0; 14]));

extern "C" fn tool_buffer_large(ptr: *mut *mut c_void, size: *mut usize) {
    give(&LARGE, ptr, size);
}

extern "C" fn tool_buffer_small(ptr: *mut *mut c_void, size: *mut usize) {
    give(&SMALL, ptr, size);
}

fn give<const N: usize>(buffer: &'static Buffer<N>, ptr: *mut *mut c_void, size: *mut usize) {
    if !ptr.is_null() {
        // SAFETY: the caller's void**.
        unsafe { std::ptr::write_unaligned(ptr, buffer.0.get().cast()) };
    }
    if !size.is_null() {
        // SAFETY: the caller's size_t*.
        unsafe { std::ptr::write_unaligned(size, N) };
    }
}

// ---- Context-local storage ----

type Destructor = Option<unsafe extern "C" fn(ctx: *mut c_void, key: *mut c_void, value: *mut c_void)>;

/// A context-local value and the destructor the runtime registered with it.
#[derive(Clone, Copy)]
pub struct StorageEntry {
    value: usize,
    destructor: Destructor,
}

/// The context meant: the given one, or the calling thread's current one for NULL.
fn context_of(ctx: *mut c_void) -> Option<u64> {
    if ctx.is_null() { crate::custom::context::current() } else { Some(ctx as u64) }
}

extern "C" fn storage_put(ctx: *mut c_void, key: *mut c_void, value: *mut c_void, destructor: Destructor) -> u32 {
    crate::guard::ffi("cuGetExportTable (context storage)", INVALID_VALUE, || {
        let Some(ctx) = context_of(ctx) else { return INVALID_CONTEXT };
        tracing::trace!("context storage: put {ctx:#x} {key:?} -> {value:?}");
        CLIENT.context_storage.insert((ctx, key as usize), StorageEntry { value: value as usize, destructor });
        SUCCESS
    })
}

extern "C" fn storage_delete(ctx: *mut c_void, key: *mut c_void) -> u32 {
    crate::guard::ffi("cuGetExportTable (context storage)", INVALID_VALUE, || {
        let Some(ctx) = context_of(ctx) else { return INVALID_CONTEXT };
        tracing::trace!("context storage: delete {ctx:#x} {key:?}");
        CLIENT.context_storage.remove(&(ctx, key as usize));
        SUCCESS
    })
}

extern "C" fn storage_get(value: *mut *mut c_void, ctx: *mut c_void, key: *mut c_void) -> u32 {
    crate::guard::ffi("cuGetExportTable (context storage)", INVALID_VALUE, || {
        if value.is_null() {
            return INVALID_VALUE;
        }
        let Some(ctx) = context_of(ctx) else { return INVALID_CONTEXT };
        let found = CLIENT.context_storage.get(&(ctx, key as usize)).map(|e| e.value);
        tracing::trace!("context storage: get {ctx:#x} {key:?}: {found:x?}");
        match found {
            Some(v) => {
                // SAFETY: the caller's void** (checked non-null).
                unsafe { std::ptr::write_unaligned(value, v as *mut c_void) };
                SUCCESS
            }
            None => INVALID_HANDLE,
        }
    })
}

/// A context is being destroyed or reset: run the destructors of its entries (outside the
/// lock: they may call the driver) and forget them. `device` names a primary context.
pub fn context_ends(ctx: Option<u64>, device: Option<i32>) {
    let ctx = ctx.or_else(|| device.and_then(|d| CLIENT.primary_contexts.get(&d)));
    let Some(ctx) = ctx else { return };
    let ended = CLIENT.context_storage.remove_where(|(c, _)| *c == ctx);
    for ((ctx, key), entry) in ended {
        if let Some(destructor) = entry.destructor {
            // SAFETY: the destructor the runtime registered with this entry, called as the
            // driver calls it.
            unsafe { destructor(ctx as *mut c_void, key as *mut c_void, entry.value as *mut c_void) };
        }
    }
}

// ---- Context checks ----

/// No context is a wrapper of another here: the context is itself (NULL: the current one).
extern "C" fn context_check(ctx: *mut c_void, wrapped: *mut u32, unwrapped: *mut u64) -> u32 {
    crate::guard::ffi("cuGetExportTable (context check)", INVALID_VALUE, || {
        let Some(ctx) = context_of(ctx) else { return INVALID_CONTEXT };
        if !wrapped.is_null() {
            // SAFETY: the caller's uint32_t*.
            unsafe { std::ptr::write_unaligned(wrapped, 0) };
        }
        if !unwrapped.is_null() {
            // SAFETY: the caller's CUcontext*.
            unsafe { std::ptr::write_unaligned(unwrapped, ctx) };
        }
        SUCCESS
    })
}

extern "C" fn context_check_count() -> u32 {
    0
}

// ---- The integrity check ----

/// The key of the runtime's check of its driver.
const KEY: [u8; 16] = [0x14, 0x6a, 0xdd, 0xae, 0x53, 0xa9, 0xa7, 0x52, 0xaa, 0x08, 0x41, 0x36, 0x0b, 0xf5, 0x5a, 0x9f];

/// Versions ending in 0 or 1 are answered with fixed words.
const FIXED: [[u64; 2]; 2] =
    [[0x3341_181c_03cb_675c, 0x8ed3_83aa_1f4c_d1e8], [0x1841_181c_03cb_675c, 0x8ed3_83aa_1f4c_d1e8]];

extern "C" fn integrity_check(version: u32, unix_seconds: u64, out: *mut [u64; 2]) -> u32 {
    crate::guard::ffi("cuGetExportTable (integrity)", INVALID_VALUE, || {
        if out.is_null() {
            return INVALID_VALUE;
        }
        let words = match version % 10 {
            v @ (0 | 1) => FIXED[v as usize],
            _ => {
                let facts = Facts::of_this_client(version, unix_seconds);
                let digest = integrity_digest(&facts);
                let lo = u64::from_le_bytes(digest[..8].try_into().unwrap_or_default());
                let hi = u64::from_le_bytes(digest[8..].try_into().unwrap_or_default());
                [lo, hi]
            }
        };
        // SAFETY: the caller's two 64-bit words (checked non-null).
        unsafe { std::ptr::write_unaligned(out, words) };
        SUCCESS
    })
}

/// What the integrity check covers.
struct Facts {
    driver_version: u32,
    version: u32,
    pid: u32,
    thread: u32,
    runtime_table: u64,
    integrity_table: u64,
    check_function: u64,
    unix_seconds: u64,
    /// Each device's UUID and PCI domain, bus and device numbers.
    devices: Vec<(Uuid, i32, i32, i32)>,
}

impl Facts {
    /// What this client answered, or answers, the program: the two must agree.
    fn of_this_client(version: u32, unix_seconds: u64) -> Facts {
        use crate::custom::driver as d;
        let mut driver_version = 0i32;
        let mut count = 0i32;
        // SAFETY: out-pointers to locals.
        unsafe {
            d::cuDriverGetVersion(&mut driver_version as *mut i32 as *mut c_void);
            d::cuDeviceGetCount(&mut count as *mut i32 as *mut c_void);
        }
        let devices = (0..count)
            .map(|dev| {
                let mut uuid = [0u8; 16];
                let attr = |a: u32| {
                    let mut v = 0i32;
                    // SAFETY: an out-pointer to a local.
                    unsafe { d::cuDeviceGetAttribute(&mut v as *mut i32 as *mut c_void, a, dev) };
                    v
                };
                use chidori_cuda::consts::CUdevice_attribute_enum as A;
                let (domain, bus, device) = (
                    attr(A::CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID),
                    attr(A::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID),
                    attr(A::CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID),
                );
                // SAFETY: a 16-byte local.
                unsafe { d::uuid(uuid.as_mut_ptr().cast(), dev) };
                (uuid, domain, bus, device)
            })
            .collect();
        Facts {
            driver_version: driver_version as u32,
            version,
            // SAFETY: plain queries of the calling process and thread.
            pid: unsafe { libc::getpid() } as u32,
            // SAFETY: as above; the check takes the thread's id truncated to 32 bits.
            thread: unsafe { libc::pthread_self() } as u32,
            runtime_table: RUNTIME_TABLE.address() as u64,
            integrity_table: INTEGRITY_TABLE.address() as u64,
            check_function: INTEGRITY_TABLE.0[1] as u64,
            unix_seconds,
            devices,
        }
    }
}

/// The check's digest: HMAC-MD2 of the facts, little-endian, packed.
fn integrity_digest(f: &Facts) -> [u8; 16] {
    let mut message = Vec::with_capacity(48 + 28 * f.devices.len());
    for word in [f.driver_version, f.version, f.pid, f.thread] {
        message.extend_from_slice(&word.to_le_bytes());
    }
    for word in [f.runtime_table, f.integrity_table, f.check_function, f.unix_seconds] {
        message.extend_from_slice(&word.to_le_bytes());
    }
    for (uuid, domain, bus, device) in &f.devices {
        message.extend_from_slice(uuid);
        for v in [domain, bus, device] {
            message.extend_from_slice(&v.to_le_bytes());
        }
    }
    hmac_md2(&KEY, &message)
}

/// HMAC (RFC 2104) with MD2, whose block is 16 bytes: the key is used as it is.
fn hmac_md2(key: &[u8; 16], message: &[u8]) -> [u8; 16] {
    let pad = |x: u8| key.iter().map(|k| k ^ x).collect::<Vec<u8>>();
    let mut inner = pad(0x36);
    inner.extend_from_slice(message);
    let mut outer = pad(0x5c);
    outer.extend_from_slice(&md2(&inner));
    md2(&outer)
}

/// MD2's substitution table (RFC 1319), a permutation of 0..=255 derived from the digits
/// of pi.
const PI_SUBST: [u8; 256] = [
    41, 46, 67, 201, 162, 216, 124, 1, 61, 54, 84, 161, 236, 240, 6, 19, 98, 167, 5, 243, 192, 199, 115, 140, 152, 147,
    43, 217, 188, 76, 130, 202, 30, 155, 87, 60, 253, 212, 224, 22, 103, 66, 111, 24, 138, 23, 229, 18, 190, 78, 196,
    214, 218, 158, 222, 73, 160, 251, 245, 142, 187, 47, 238, 122, 169, 104, 121, 145, 21, 178, 7, 63, 148, 194, 16,
    137, 11, 34, 95, 33, 128, 127, 93, 154, 90, 144, 50, 39, 53, 62, 204, 231, 191, 247, 151, 3, 255, 25, 48, 179, 72,
    165, 181, 209, 215, 94, 146, 42, 172, 86, 170, 198, 79, 184, 56, 210, 150, 164, 125, 182, 118, 252, 107, 226, 156,
    116, 4, 241, 69, 157, 112, 89, 100, 113, 135, 32, 134, 91, 207, 101, 230, 45, 168, 2, 27, 96, 37, 173, 174, 176,
    185, 246, 28, 70, 97, 105, 52, 64, 126, 15, 85, 71, 163, 35, 221, 81, 175, 58, 195, 92, 249, 206, 186, 197, 234,
    38, 44, 83, 13, 110, 133, 40, 132, 9, 211, 223, 205, 244, 65, 129, 77, 82, 106, 220, 55, 200, 108, 193, 171, 250,
    36, 225, 123, 8, 12, 189, 177, 74, 120, 136, 149, 139, 227, 99, 232, 109, 233, 203, 213, 254, 59, 0, 29, 57, 242,
    239, 183, 14, 102, 88, 208, 228, 166, 119, 114, 248, 235, 117, 75, 10, 49, 68, 80, 180, 143, 237, 31, 26, 219, 153,
    141, 51, 159, 17, 131, 20,
];

/// MD2 (RFC 1319).
fn md2(message: &[u8]) -> [u8; 16] {
    let pad = 16 - message.len() % 16;
    let mut data = message.to_vec();
    data.resize(message.len() + pad, pad as u8);
    let mut checksum = [0u8; 16];
    let mut last = 0u8;
    for block in data.chunks_exact(16) {
        for (c, b) in checksum.iter_mut().zip(block) {
            *c ^= PI_SUBST[usize::from(b ^ last)];
            last = *c;
        }
    }
    data.extend_from_slice(&checksum);
    let mut x = [0u8; 48];
    for block in data.chunks_exact(16) {
        for j in 0..16 {
            x[16 + j] = block[j];
            x[32 + j] = block[j] ^ x[j];
        }
        let mut t = 0u8;
        for round in 0..18u8 {
            for v in x.iter_mut() {
                *v ^= PI_SUBST[usize::from(t)];
                t = *v;
            }
            t = t.wrapping_add(round);
        }
    }
    let mut digest = [0u8; 16];
    digest.copy_from_slice(&x[..16]);
    digest
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    #[test]
    fn md2_gives_the_rfc_test_vectors() {
        assert_eq!(hex(&md2(b"")), "8350e5a3e24c153df2275c9f80692773");
        assert_eq!(hex(&md2(b"abc")), "da853b0d3f88d99b30283a69e6ded6bb");
        assert_eq!(hex(&md2(b"message digest")), "ab4f496bfb2a530b219ff33031fe06b0");
        let long = b"12345678901234567890123456789012345678901234567890123456789012345678901234567890";
        assert_eq!(hex(&md2(long)), "d5976f79d83d3a0dc9806c3c66f3efd8");
    }

    #[test]
    fn pi_subst_is_a_permutation() {
        let mut seen = [false; 256];
        for &v in &PI_SUBST {
            seen[usize::from(v)] = true;
        }
        assert!(seen.iter().all(|&s| s));
    }

    #[test]
    fn the_integrity_digest_is_the_drivers() {
        // Inputs and the digest the H200's driver (580.159.04) gave for them.
        let devices = [
            (
                [0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0x99, 0xaa, 0xbb, 0xcc, 0xdd, 0xee, 0xff, 0x01],
                0,
                0x1b,
                0,
            ),
            ([7; 16], 1, 0x2c, 3),
        ];
        let facts = |version: u32, n: usize| Facts {
            driver_version: 12080,
            version,
            pid: 0x002f_a423,
            thread: 0xf79c_1000,
            runtime_table: 0x7fff_f695_8240,
            integrity_table: 0x7fff_f695_8220,
            check_function: 0x7fff_f2aa_f4a0,
            unix_seconds: 0x682b_9cee,
            devices: devices[..n].to_vec(),
        };
        assert_eq!(hex(&integrity_digest(&facts(12082, 1))), "74be7792396c0202ecc489e41d2bfd62");
        assert_eq!(hex(&integrity_digest(&facts(13002, 2))), "3c96a361f1be09bb2e44a53793a96eca");
    }

    #[test]
    fn tables_start_with_their_size_and_never_hold_null_slots_before_the_end() {
        assert_eq!(RUNTIME_TABLE.0[0] as usize, 13 * 8);
        assert_eq!(TOOL_HOOKS_TABLE.0[0] as usize, 7 * 8);
        assert_eq!(INTEGRITY_TABLE.0[0] as usize, 3 * 8);
        assert_eq!(TOOL_EXTRA_TABLE.0[0] as usize, 16 * 8);
        assert!(TOOL_EXTRA_TABLE.0.iter().all(|p| !p.is_null()));
        assert!(RUNTIME_TABLE.0.iter().all(|p| !p.is_null()));
        assert!(CONTEXT_STORAGE_TABLE.0[..3].iter().all(|p| !p.is_null()));
    }
}
