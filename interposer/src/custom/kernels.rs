//! Hand-written runtime functions for kernels and symbols: launches through the registry
//! (the module is loaded on the server the first time one of its kernels runs), symbol
//! copies (the variable's module likewise), kernel attributes and occupancy (asked of the
//! driver with the kernel's function handle, once per kernel).
//!
//! Every `unsafe fn` here has the safety contract of the CUDA function of the same name.
#![allow(non_snake_case, clippy::missing_safety_doc)]

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Arc;

use chidori_cuda::calls::{cudart as calls, driver as dcalls};
use chidori_cuda::desc::Ctx;
use chidori_cuda::types::dim3;
use chidori_protocol::messages::{Api, PropValue};

use crate::ahead::learned::Space;
use crate::conn::{self, Conn};
use crate::custom::memory::{self, CopyForms};
use crate::modules::{self, LaunchShape};
use crate::registry;
use crate::state::{self, CLIENT};

const SUCCESS: u32 = chidori_cuda::consts::cudaError::cudaSuccess;
const INVALID_VALUE: u32 = chidori_cuda::consts::cudaError::cudaErrorInvalidValue;
const INVALID_DEVICE_FUNCTION: u32 = chidori_cuda::consts::cudaError::cudaErrorInvalidDeviceFunction;
const INVALID_SYMBOL: u32 = chidori_cuda::consts::cudaError::cudaErrorInvalidSymbol;
const NO_DEVICE: u32 = chidori_cuda::consts::cudaError::cudaErrorNoDevice;
const INVALID_MEMCPY_DIRECTION: u32 = chidori_cuda::consts::cudaError::cudaErrorInvalidMemcpyDirection;
use chidori_cuda::consts::cudaMemcpyKind as memcpy_kind;

fn connection() -> Result<Arc<Conn>, u32> {
    conn::get().map_err(|_| NO_DEVICE)
}

fn runtime(name: &'static str, body: impl FnOnce() -> Result<u32, u32>) -> u32 {
    crate::guard::ffi(name, INVALID_VALUE, || {
        let status = body().unwrap_or_else(|e| e);
        state::set_last_error(status);
        status
    })
}

/// Map a driver status of module loading to the runtime's.
fn runtime_status(driver: u32) -> u32 {
    use chidori_cuda::consts::{cudaError as rt, cudaError_enum as cu};
    match driver {
        cu::CUDA_ERROR_NO_DEVICE => NO_DEVICE,
        // The emulated backend runs no kernels.
        cu::CUDA_ERROR_NOT_SUPPORTED => rt::cudaErrorNotSupported,
        cu::CUDA_ERROR_NO_BINARY_FOR_GPU => rt::cudaErrorNoKernelImageForDevice,
        _ => INVALID_DEVICE_FUNCTION,
    }
}

fn kernel_of(host_fun: *mut c_void) -> Result<&'static registry::Kernel, u32> {
    registry::kernel_by_host_fun(host_fun as usize).ok_or(INVALID_DEVICE_FUNCTION)
}

fn function_of(conn: &Conn, kernel: &registry::Kernel) -> Result<modules::Function, u32> {
    modules::resolve(conn, kernel).map_err(runtime_status)
}

#[allow(clippy::too_many_arguments)]
fn launch(
    kernel: Result<&'static registry::Kernel, u32>,
    grid: dim3,
    block: dim3,
    args: *mut c_void,
    shared_mem: usize,
    stream: *mut c_void,
    attributes: Vec<(u32, Vec<u8>)>,
    cooperative: bool,
) -> u32 {
    runtime("cudaLaunchKernel", || {
        let kernel = kernel?;
        let conn = connection()?;
        let f = function_of(&conn, kernel)?;
        if !dynamic_shared_allowed(&conn, f.handle, shared_mem)? {
            return Err(INVALID_VALUE);
        }
        // SAFETY: `args` holds a pointer to each kernel argument (the launch contract).
        let packed = unsafe { modules::pack(&f.params, args as *const *const u8) };
        let shape = LaunchShape {
            grid: [grid.x, grid.y, grid.z],
            block: [block.x, block.y, block.z],
            shared_mem: u32::try_from(shared_mem).map_err(|_| INVALID_VALUE)?,
            stream: stream as u64,
            attributes,
            cooperative,
            api: Api::Runtime,
        };
        modules::launch(&conn, &f, shape, &packed)?;
        Ok(SUCCESS)
    })
}

pub unsafe fn __cudaLaunchKernel(
    kernel: *mut c_void,
    gridDim: dim3,
    blockDim: dim3,
    args: *mut c_void,
    sharedMem: usize,
    stream: *mut c_void,
) -> u32 {
    let k = registry::kernel_by_handle(kernel as usize).ok_or(INVALID_DEVICE_FUNCTION);
    launch(k, gridDim, blockDim, args, sharedMem, stream, Vec::new(), false)
}

pub unsafe fn cudaLaunchKernel(
    func: *mut c_void,
    gridDim: dim3,
    blockDim: dim3,
    args: *mut c_void,
    sharedMem: usize,
    stream: *mut c_void,
) -> u32 {
    launch(kernel_of(func), gridDim, blockDim, args, sharedMem, stream, Vec::new(), false)
}

pub unsafe fn cudaLaunchCooperativeKernel(
    func: *mut c_void,
    gridDim: dim3,
    blockDim: dim3,
    args: *mut c_void,
    sharedMem: usize,
    stream: *mut c_void,
) -> u32 {
    launch(kernel_of(func), gridDim, blockDim, args, sharedMem, stream, Vec::new(), true)
}

/// A cudaLaunchConfig_t's fields: grid, block, dynamic shared memory, stream, attributes
/// (id, 64-byte value).
type LaunchConfigFields = (dim3, dim3, usize, *mut c_void, Vec<(u32, Vec<u8>)>);

/// Read a cudaLaunchConfig_t (56 bytes in every version: gridDim@0, blockDim@12,
/// dynamicSmemBytes@24, stream@32, attrs@40, numAttrs@48), each attribute an id and a
/// 64-byte value at 8 (72 bytes).
///
/// # Safety
/// `config` must point at a cudaLaunchConfig_t whose attribute array holds `numAttrs`.
unsafe fn read_launch_config(config: *mut c_void) -> LaunchConfigFields {
    // SAFETY: per the contract.
    unsafe {
        let c = config as *const u8;
        let grid = std::ptr::read_unaligned(c as *const dim3);
        let block = std::ptr::read_unaligned(c.add(12) as *const dim3);
        let smem = std::ptr::read_unaligned(c.add(24) as *const usize);
        let stream = std::ptr::read_unaligned(c.add(32) as *const *mut c_void);
        let attrs = std::ptr::read_unaligned(c.add(40) as *const *const u8);
        let n = std::ptr::read_unaligned(c.add(48) as *const u32) as usize;
        let mut out = Vec::with_capacity(n);
        for i in 0..n {
            if attrs.is_null() {
                break;
            }
            let a = attrs.add(i * 72);
            let id = std::ptr::read_unaligned(a as *const u32);
            out.push((id, std::slice::from_raw_parts(a.add(8), 64).to_vec()));
        }
        (grid, block, smem, stream, out)
    }
}

/// cudaLaunchKernelExC.
fn launch_ex(config: *mut c_void, func: *mut c_void, args: *mut c_void, per_thread: bool) -> u32 {
    if config.is_null() {
        return INVALID_VALUE;
    }
    // SAFETY: the caller's cudaLaunchConfig_t and its attribute array.
    let (grid, block, smem, stream, attributes) = unsafe { read_launch_config(config) };
    let stream = chidori_protocol::desc::stream_meant(stream as u64, per_thread) as *mut c_void;
    launch(kernel_of(func), grid, block, args, smem, stream, attributes, false)
}

/// cudaOccupancyMaxActiveClusters (`potential`: cudaOccupancyMaxPotentialClusterSize):
/// asked of the server's driver with the kernel's function and the configuration as a
/// launch carries it. The driver's codes for these answers are the runtime's.
fn cluster_occupancy(ctx: &Ctx, out: *mut c_void, func: *mut c_void, config: *mut c_void, potential: bool) -> u32 {
    runtime(ctx.name, || {
        if out.is_null() || config.is_null() {
            return Err(INVALID_VALUE);
        }
        let kernel = kernel_of_any(func)?;
        let conn = connection()?;
        let f = function_of(&conn, kernel)?;
        // SAFETY: the caller's cudaLaunchConfig_t.
        let (grid, block, smem, stream, attributes) = unsafe { read_launch_config(config) };
        let launch = chidori_protocol::messages::Launch {
            function: f.handle,
            grid: [grid.x, grid.y, grid.z],
            block: [block.x, block.y, block.z],
            shared_mem: u32::try_from(smem).map_err(|_| INVALID_VALUE)?,
            stream: stream as u64,
            attributes,
            cooperative: false,
            api: Api::Runtime,
        };
        let value = super::driver::ask_cluster_occupancy(&conn, launch, potential)?;
        // SAFETY: the caller's int, checked non-null.
        unsafe { std::ptr::write_unaligned(out as *mut i32, value) };
        Ok(SUCCESS)
    })
}

pub unsafe fn max_active_clusters(ctx: &Ctx, num_clusters: *mut c_void, func: *mut c_void, config: *mut c_void) -> u32 {
    cluster_occupancy(ctx, num_clusters, func, config, false)
}

pub unsafe fn max_potential_cluster_size(
    ctx: &Ctx,
    cluster_size: *mut c_void,
    func: *mut c_void,
    config: *mut c_void,
) -> u32 {
    cluster_occupancy(ctx, cluster_size, func, config, true)
}

/// cudaLaunchKernelExC and its per-thread variant, in every version: cudaLaunchAttributeValue
/// grew members inside its 64 bytes between releases, one ABI.
pub unsafe fn launch_kernel_ex(ctx: &Ctx, config: *mut c_void, func: *mut c_void, args: *mut c_void) -> u32 {
    launch_ex(config, func, args, ctx.name.ends_with("_ptsz"))
}

pub unsafe fn cudaGetKernel(kernelPtr: *mut c_void, entryFuncAddr: *mut c_void) -> u32 {
    // SAFETY: same contract.
    unsafe { super::cudart::__cudaGetKernel(kernelPtr, entryFuncAddr) }
}

// ---- Kernel attributes and occupancy: asked of the driver with the function handle ----

/// cudaFuncAttributes fields and the CUfunction_attribute each one is.
const FUNC_ATTRIBUTES: &[(&str, u32)] = &[
    ("maxThreadsPerBlock", 0),
    ("sharedSizeBytes", 1),
    ("constSizeBytes", 2),
    ("localSizeBytes", 3),
    ("numRegs", 4),
    ("ptxVersion", 5),
    ("binaryVersion", 6),
    ("cacheModeCA", 7),
    ("maxDynamicSharedSizeBytes", 8),
    ("preferredShmemCarveout", 9),
    ("clusterDimMustBeSet", 10),
    ("requiredClusterWidth", 11),
    ("requiredClusterHeight", 12),
    ("requiredClusterDepth", 13),
    ("clusterSchedulingPolicyPreference", 14),
    ("nonPortableClusterSizeAllowed", 15),
];

/// Dynamic shared memory a launch may use without an opt-in (48 KiB on every GPU since Volta).
const DEFAULT_SHARED_LIMIT: usize = 48 << 10;
const MAX_DYNAMIC_SHARED: u32 = chidori_cuda::consts::cudaFuncAttribute::cudaFuncAttributeMaxDynamicSharedMemorySize;

/// CUfunction_attribute values no call changes (cuFuncSetAttribute and cuKernelSetAttribute
/// set the others).
const FIXED_ATTRIBUTES: &[u32] = {
    use chidori_cuda::consts::CUfunction_attribute_enum as a;
    &[
        a::CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK,
        a::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES,
        a::CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES,
        a::CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES,
        a::CU_FUNC_ATTRIBUTE_NUM_REGS,
        a::CU_FUNC_ATTRIBUTE_PTX_VERSION,
        a::CU_FUNC_ATTRIBUTE_BINARY_VERSION,
        a::CU_FUNC_ATTRIBUTE_CACHE_MODE_CA,
        a::CU_FUNC_ATTRIBUTE_CLUSTER_SIZE_MUST_BE_SET,
    ]
};

/// The key of an attribute of a function the client knows the origin of, while this
/// process has not set it: its value then is what any process of the same program sees
/// first, for one module image on one server GPU and driver.
fn learned_key(function: u64, id: u32) -> Option<Vec<u8>> {
    let settable = !FIXED_ATTRIBUTES.contains(&id);
    if settable
        && (CLIENT.attributes_set.contains(&(function, id))
            || CLIENT.ahead.kernel_attributes_set.load(std::sync::atomic::Ordering::Relaxed))
    {
        return None;
    }
    let (hash, name) = CLIENT.function_origins.get(&function)?;
    Some([&hash[..], name.as_bytes(), &[0], &id.to_le_bytes()].concat())
}

/// The values of `ids` for `function`: cached in this process, else learned in an earlier
/// session (given now, checked when the server's answer comes), else fetched in one round
/// trip. Err: the server's status.
pub(crate) fn attributes_of(conn: &Arc<Conn>, function: u64, ids: &[u32]) -> Result<Vec<i32>, u32> {
    let cached: Vec<Option<i32>> =
        ids.iter().map(|id| CLIENT.ahead.function_attributes.get(&(function, *id))).collect();
    if let Some(v) = cached.iter().copied().collect::<Option<Vec<i32>>>() {
        return Ok(v);
    }
    if let Some(values) = learned_attributes(conn, function, ids, &cached) {
        return Ok(values);
    }
    let mut values = vec![0i32; ids.len()];
    let calls: Vec<Vec<u64>> =
        ids.iter().zip(values.iter_mut()).map(|(id, v)| vec![v as *mut i32 as u64, u64::from(*id), function]).collect();
    // SAFETY: each call writes one int into `values`.
    let s = unsafe { crate::runtime::call_batch(conn, &dcalls::cuFuncGetAttribute__call, &calls) } as u32;
    if s != SUCCESS {
        return Err(s);
    }
    for (id, v) in ids.iter().zip(&values) {
        CLIENT.ahead.function_attributes.learn((function, *id), *v);
        if let Some(key) = learned_key(function, *id) {
            crate::learned::with(conn, |l| l.learn(Space::FuncAttribute, &key, &v.to_le_bytes()));
        }
    }
    Ok(values)
}

/// Every one of `ids` this process knows (`cached`: an answer it had, or a value it set) or
/// an earlier session on this server learned; each learned one is still asked, and its
/// answer checked when it comes. None: any of them is unknown.
fn learned_attributes(conn: &Arc<Conn>, function: u64, ids: &[u32], cached: &[Option<i32>]) -> Option<Vec<i32>> {
    let keys: Vec<Option<Vec<u8>>> = ids
        .iter()
        .zip(cached)
        .map(|(&id, known)| match known {
            Some(_) => Some(None),
            None => learned_key(function, id).map(Some),
        })
        .collect::<Option<_>>()?;
    let learned: Vec<Option<i32>> = crate::learned::with(conn, |l| {
        keys.iter()
            .map(|k| match k {
                None => Some(None),
                Some(k) => {
                    l.get(Space::FuncAttribute, k).and_then(|v| v.try_into().ok()).map(|v| Some(i32::from_le_bytes(v)))
                }
            })
            .collect::<Option<Vec<Option<i32>>>>()
    })??;
    let mut values = Vec::with_capacity(ids.len());
    for ((&id, known), learned) in ids.iter().zip(cached).zip(learned) {
        let value = match (known, learned) {
            (Some(v), _) => *v,
            (None, Some(v)) => {
                let desc = &dcalls::cuFuncGetAttribute__call;
                checked_int(conn, desc, |out| vec![out, u64::from(id), function], v, format!("attribute {id}"))?;
                CLIENT.ahead.function_attributes.learn((function, id), v);
                v
            }
            (None, None) => return None,
        };
        values.push(value);
    }
    crate::trace::local("cuFuncGetAttribute");
    Some(values)
}

/// Give the program `value`, learned in an earlier session, for a call that writes one int
/// (its arguments from `args` of where it writes): the call is still sent, without waiting,
/// and its answer checked when it comes (`what` names the value in a mismatch). None: the
/// call could not be sent.
fn checked_int(
    conn: &Arc<Conn>,
    desc: &'static chidori_protocol::desc::CallDesc,
    args: impl FnOnce(u64) -> Vec<u64>,
    value: i32,
    what: String,
) -> Option<()> {
    let mut scratch = Box::new(0i32);
    let args = args((&raw mut *scratch) as u64);
    // SAFETY: the call writes one int into `scratch`, which the checking thread keeps until
    // the reply has landed.
    let slot = unsafe { crate::runtime::send_checked(conn, desc, &args) }?;
    crate::learned::check(conn.clone(), desc.name, slot, scratch, move |outcome, got| match outcome {
        Ok(s) if *s != u64::from(SUCCESS) => Some(format!("status {s}")),
        _ if **got != value => Some(format!("{what}: {}, not {value}", **got)),
        _ => None,
    });
    Some(())
}

/// cuFuncGetAttribute: through the attribute cache (and what earlier sessions learned).
pub unsafe fn func_get_attribute(ctx: &Ctx, pi: *mut c_void, attrib: u32, hfunc: *mut c_void) -> u32 {
    crate::guard::ffi(ctx.name, ctx.codes.invalid_value as u32, || {
        if pi.is_null() {
            return ctx.codes.invalid_value as u32;
        }
        if CLIENT.ahead.function_attributes.get(&(hfunc as u64, attrib)).is_some() {
            crate::trace::local(ctx.name);
        }
        let Ok(conn) = conn::get() else { return ctx.codes.unavailable as u32 };
        match attributes_of(&conn, hfunc as u64, &[attrib]) {
            Ok(values) => {
                // SAFETY: the caller's int, checked non-null.
                unsafe { std::ptr::write_unaligned(pi as *mut i32, values.first().copied().unwrap_or(0)) };
                ctx.codes.success as u32
            }
            Err(status) => status,
        }
    })
}

fn func_attributes(version: &str, attr: *mut c_void, func: *mut c_void) -> u32 {
    runtime("cudaFuncGetAttributes", || {
        if attr.is_null() {
            return Err(INVALID_VALUE);
        }
        let kernel = kernel_of(func)?;
        let conn = connection()?;
        let f = function_of(&conn, kernel)?;
        let map = chidori_cuda::structs::get(version, "cudaFuncAttributes").ok_or(INVALID_VALUE)?;
        let wanted: Vec<&(&str, u32)> =
            FUNC_ATTRIBUTES.iter().filter(|(n, _)| map.fields.iter().any(|m| m.name == *n)).collect();
        let ids: Vec<u32> = wanted.iter().map(|(_, id)| *id).collect();
        let values = attributes_of(&conn, f.handle, &ids).map_err(|_| INVALID_DEVICE_FUNCTION)?;
        let by_name: HashMap<&str, i64> = wanted.iter().zip(&values).map(|((n, _), v)| (*n, i64::from(*v))).collect();
        // SAFETY: the caller's struct of its version's layout.
        unsafe { state::write_record(map, attr as *mut u8, |f| by_name.get(f.name).map(|v| PropValue::Int(*v))) };
        Ok(SUCCESS)
    })
}

/// In the layout of the caller's CUDA version.
pub unsafe fn func_get_attributes(ctx: &Ctx, attr: *mut c_void, func: *mut c_void) -> u32 {
    func_attributes(ctx.version, attr, func)
}

pub unsafe fn cudaFuncSetAttribute(func: *mut c_void, attr: u32, value: i32) -> u32 {
    runtime("cudaFuncSetAttribute", || {
        let kernel = kernel_of(func)?;
        let conn = connection()?;
        let f = function_of(&conn, kernel)?;
        // cudaFuncAttribute values are CUfunction_attribute values.
        // SAFETY: value arguments only.
        Ok(set_function_attribute(&conn, f.handle, attr, value))
    })
}

/// Set an attribute of a function, without waiting, and remember the value.
fn set_function_attribute(conn: &Conn, function: u64, attr: u32, value: i32) -> u32 {
    // SAFETY: value arguments only.
    let s = unsafe {
        crate::runtime::call_on(conn, &dcalls::cuFuncSetAttribute__call, &[function, u64::from(attr), value as u64])
    } as u32;
    if s == SUCCESS {
        CLIENT.ahead.function_attributes.learn((function, attr), value);
        CLIENT.attributes_set.insert((function, attr), ());
        // The shared memory it may use or prefers changes how many blocks fit.
        CLIENT.ahead.occupancy.forget_where(|k| k.0 == function);
    }
    s
}

/// Whether a launch of `function` may use `shared_mem` bytes of dynamic shared memory:
/// above the default limit, only up to the function's opt-in
/// (MaxDynamicSharedMemorySize), which CUDA checks at the launch itself.
pub(crate) fn dynamic_shared_allowed(conn: &Arc<Conn>, function: u64, shared_mem: usize) -> Result<bool, u32> {
    if shared_mem <= DEFAULT_SHARED_LIMIT {
        return Ok(true);
    }
    let max = attributes_of(conn, function, &[MAX_DYNAMIC_SHARED]).map_err(|_| INVALID_DEVICE_FUNCTION)?;
    Ok(max.first().is_some_and(|m| shared_mem <= *m as usize))
}

/// cuKernelSetAttribute: forwarded; the value is remembered for the kernel handle (which a
/// launch may pass as its function).
pub unsafe fn kernel_set_attribute(ctx: &Ctx, attrib: u32, val: i32, kernel: *mut c_void, dev: i32) -> u32 {
    crate::guard::ffi(ctx.name, ctx.codes.invalid_value as u32, || {
        let args = [u64::from(attrib), val as u32 as u64, kernel as u64, dev as u32 as u64];
        // SAFETY: value arguments only.
        let s = unsafe { crate::runtime::call(ctx.form(chidori_cuda::desc::Form::Call), &args) } as u32;
        if s == SUCCESS {
            CLIENT.ahead.function_attributes.learn((kernel as u64, attrib), val);
            CLIENT.ahead.kernel_attributes_set.store(true, std::sync::atomic::Ordering::Relaxed);
            // Its functions' handles are not known apart: every occupancy answer may change.
            CLIENT.ahead.occupancy.clear();
        }
        s
    })
}

pub unsafe fn cuFuncSetAttribute(hfunc: *mut c_void, attrib: u32, value: i32) -> u32 {
    crate::guard::ffi("cuFuncSetAttribute", dcalls::cuFuncSetAttribute__call.codes.unavailable as u32, || {
        match conn::get() {
            Ok(conn) => set_function_attribute(&conn, hfunc as u64, attrib, value),
            Err(_) => dcalls::cuFuncSetAttribute__call.codes.unavailable as u32,
        }
    })
}

pub unsafe fn cudaFuncSetCacheConfig(func: *mut c_void, cacheConfig: u32) -> u32 {
    runtime("cudaFuncSetCacheConfig", || {
        let kernel = kernel_of(func)?;
        let conn = connection()?;
        let f = function_of(&conn, kernel)?;
        // The preferred split of shared memory and L1 changes how many blocks fit.
        CLIENT.ahead.occupancy.forget_where(|k| k.0 == f.handle);
        CLIENT.attributes_set.insert((f.handle, CACHE_PREFERENCE), ());
        // SAFETY: value arguments only.
        Ok(
            unsafe {
                crate::runtime::call_on(&conn, &dcalls::cuFuncSetCacheConfig, &[f.handle, u64::from(cacheConfig)])
            } as u32,
        )
    })
}

/// Occupancy answers, per (function, block size, shared memory, flags): they change only
/// when the program sets the function's attributes or its cache preference (the answers of
/// that function are forgotten then). (function, block size, dynamic shared memory, flags)
/// → active blocks per SM.
pub(crate) type OccupancyKey = (u64, i32, usize, u32);

fn occupancy(num_blocks: *mut c_void, func: *mut c_void, block_size: i32, smem: usize, flags: u32) -> u32 {
    runtime("cudaOccupancyMaxActiveBlocksPerMultiprocessor", || {
        if num_blocks.is_null() {
            return Err(INVALID_VALUE);
        }
        let kernel = kernel_of(func)?;
        let conn = connection()?;
        let f = function_of(&conn, kernel)?;
        let key = (f.handle, block_size, smem, flags);
        let desc = &dcalls::cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags;
        let learned = occupancy_learned_key(key);
        let n = if let Some(n) = CLIENT.ahead.occupancy.get(&key) {
            n
        } else if let Some(n) = learned_occupancy(&conn, key, learned.as_deref()) {
            n
        } else {
            let mut n = 0i32;
            let args = [&mut n as *mut i32 as u64, f.handle, block_size as u64, smem as u64, u64::from(flags)];
            // SAFETY: writes one int into `n`.
            let s = unsafe { crate::runtime::call_on(&conn, desc, &args) } as u32;
            if s != SUCCESS {
                return Err(INVALID_VALUE);
            }
            CLIENT.ahead.occupancy.learn(key, n);
            if let Some(k) = &learned {
                crate::learned::with(&conn, |l| l.learn(Space::Occupancy, k, &n.to_le_bytes()));
            }
            n
        };
        // SAFETY: the caller's int.
        unsafe { std::ptr::write_unaligned(num_blocks as *mut i32, n) };
        Ok(SUCCESS)
    })
}

/// Attribute ids no function's occupancy depends on being unset: the dynamic shared memory
/// limit and the carveout preference, and [`CACHE_PREFERENCE`].
const OCCUPANCY_ATTRIBUTES: &[u32] = &[MAX_DYNAMIC_SHARED, CARVEOUT, CACHE_PREFERENCE];
const CARVEOUT: u32 =
    chidori_cuda::consts::CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT;
/// Recorded in `attributes_set` when the program sets a function's cache preference.
const CACHE_PREFERENCE: u32 = u32::MAX;

/// The key of an occupancy answer across sessions: the function's module content and name
/// with the question, while this process has set nothing that changes it (the function's
/// shared memory attributes or cache preference, any CUkernel's attributes). None: not
/// learned.
fn occupancy_learned_key((function, block, smem, flags): OccupancyKey) -> Option<Vec<u8>> {
    if CLIENT.ahead.kernel_attributes_set.load(std::sync::atomic::Ordering::Relaxed)
        || OCCUPANCY_ATTRIBUTES.iter().any(|&id| CLIENT.attributes_set.contains(&(function, id)))
    {
        return None;
    }
    let (hash, name) = CLIENT.function_origins.get(&function)?;
    let question = [&block.to_le_bytes()[..], &(smem as u64).to_le_bytes(), &flags.to_le_bytes()].concat();
    Some([&hash[..], name.as_bytes(), &[0], &question].concat())
}

/// The occupancy an earlier session on this server learned for `key`: given now, the call
/// still made and its answer checked when it comes. None: not learned.
fn learned_occupancy(conn: &Arc<Conn>, key: OccupancyKey, learned: Option<&[u8]>) -> Option<i32> {
    let k = learned?;
    let n = crate::learned::with(conn, |l| l.get(Space::Occupancy, k).and_then(|v| v.try_into().ok()))??;
    let n = i32::from_le_bytes(n);
    let (function, block, smem, flags) = key;
    let desc = &dcalls::cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags;
    let args = |out| vec![out, function, block as u64, smem as u64, u64::from(flags)];
    checked_int(conn, desc, args, n, "active blocks".to_owned())?;
    CLIENT.ahead.occupancy.learn(key, n);
    crate::trace::local(desc.name);
    Some(n)
}

pub unsafe fn cudaOccupancyMaxActiveBlocksPerMultiprocessor(
    numBlocks: *mut c_void,
    func: *mut c_void,
    blockSize: i32,
    dynamicSMemSize: usize,
) -> u32 {
    occupancy(numBlocks, func, blockSize, dynamicSMemSize, 0)
}

pub unsafe fn cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(
    numBlocks: *mut c_void,
    func: *mut c_void,
    blockSize: i32,
    dynamicSMemSize: usize,
    flags: u32,
) -> u32 {
    occupancy(numBlocks, func, blockSize, dynamicSMemSize, flags)
}

// ---- Symbols ----

fn symbol_address(conn: &Conn, symbol: *mut c_void) -> Result<(u64, usize), u32> {
    let var = registry::variable_by_host_var(symbol as usize).ok_or(INVALID_SYMBOL)?;
    let address = modules::variable_address(conn, var).map_err(|_| INVALID_SYMBOL)?;
    Ok((address, var.size))
}

static MEMCPY: CopyForms =
    CopyForms { h2d: &calls::cudaMemcpy__h2d, d2h: &calls::cudaMemcpy__d2h, d2d: &calls::cudaMemcpy__d2d };
static MEMCPY_ASYNC: CopyForms = CopyForms {
    h2d: &calls::cudaMemcpyAsync__h2d,
    d2h: &calls::cudaMemcpyAsync__d2h,
    d2d: &calls::cudaMemcpyAsync__d2d,
};

/// A copy to (`into`) or from a `__device__` variable: `other` is the program's side,
/// `kind` HostToDevice or DeviceToHost (by direction), DeviceToDevice, or Default (decided
/// by `other`).
fn symbol_copy(
    into: bool,
    symbol: *mut c_void,
    other: *mut c_void,
    count: usize,
    offset: usize,
    kind: u32,
    stream: Option<*mut c_void>,
) -> u32 {
    let name = if into { "cudaMemcpyToSymbol" } else { "cudaMemcpyFromSymbol" };
    runtime(name, || {
        let conn = connection()?;
        let (address, size) = symbol_address(&conn, symbol)?;
        if offset.checked_add(count).is_none_or(|end| end > size) {
            return Err(INVALID_VALUE);
        }
        let host_kind = if into { memcpy_kind::cudaMemcpyHostToDevice } else { memcpy_kind::cudaMemcpyDeviceToHost };
        let other_dev = match kind {
            k if k == host_kind => false,
            memcpy_kind::cudaMemcpyDeviceToDevice => true,
            memcpy_kind::cudaMemcpyDefault => state::is_device(other as u64),
            _ => return Err(INVALID_MEMCPY_DIRECTION),
        };
        let (forms, tail) = match stream {
            Some(s) => (&MEMCPY_ASYNC, vec![s as u64]),
            None => (&MEMCPY, Vec::new()),
        };
        let variable = address + offset as u64;
        let (dst, src, devices) = if into {
            (variable, other as u64, (true, other_dev))
        } else {
            (other as u64, variable, (other_dev, true))
        };
        // SAFETY: `other` is the caller's buffer of `count` bytes.
        Ok(unsafe { memory::copy(&conn, forms, dst, src, count as u64, devices, &tail, stream.is_some()) } as u32)
    })
}

/// cudaMemcpyToSymbol(Async) (symbol, src, count, offset, kind[, stream]) and
/// cudaMemcpyFromSymbol(Async) (dst, symbol, count, offset, kind[, stream]), and their
/// per-thread forms (`raw_args`).
pub unsafe fn symbol_copy_raw(ctx: &Ctx, args: &[u64]) -> u64 {
    let word = |i: usize| args.get(i).copied().unwrap_or(0);
    let into = ctx.name.contains("ToSymbol");
    let (symbol, other) = if into { (word(0), word(1)) } else { (word(1), word(0)) };
    let stream = (args.len() == 6).then(|| ctx.stream(word(5)) as *mut c_void);
    let (count, offset, kind) = (word(2) as usize, word(3) as usize, word(4) as u32);
    u64::from(symbol_copy(into, symbol as *mut c_void, other as *mut c_void, count, offset, kind, stream))
}

pub unsafe fn cudaGetSymbolAddress(devPtr: *mut c_void, symbol: *mut c_void) -> u32 {
    runtime("cudaGetSymbolAddress", || {
        if devPtr.is_null() {
            return Err(INVALID_VALUE);
        }
        let conn = connection()?;
        let (address, size) = symbol_address(&conn, symbol)?;
        state::add(address, size as u64, state::Memory::Device { device: state::current_device() });
        // SAFETY: the caller's void**.
        unsafe { std::ptr::write_unaligned(devPtr as *mut u64, address) };
        Ok(SUCCESS)
    })
}

pub unsafe fn cudaGetSymbolSize(size: *mut c_void, symbol: *mut c_void) -> u32 {
    runtime("cudaGetSymbolSize", || {
        if size.is_null() {
            return Err(INVALID_VALUE);
        }
        let var = registry::variable_by_host_var(symbol as usize).ok_or(INVALID_SYMBOL)?;
        // SAFETY: the caller's size_t.
        unsafe { std::ptr::write_unaligned(size as *mut usize, var.size) };
        Ok(SUCCESS)
    })
}

// ---- 2D copies ----

pub(crate) struct Copy2d {
    pub dst: u64,
    pub dpitch: usize,
    pub src: u64,
    pub spitch: usize,
    pub width: usize,
    pub height: usize,
}

/// A 2D copy: host rows are gathered into (or scattered from) one contiguous buffer whose
/// pitch on the wire is the width.
///
/// # Safety
/// A host side holds `height` rows of `width` bytes, its pitch apart (cudaMemcpy2D's contract).
pub(crate) unsafe fn copy_2d(forms: &CopyForms, c: Copy2d, kind: u32, tail: &[u64]) -> u32 {
    runtime("cudaMemcpy2D", || {
        if c.width > c.dpitch || c.width > c.spitch {
            return Err(INVALID_VALUE);
        }
        let direction = memory::direction(kind, c.dst, c.src).ok_or(INVALID_MEMCPY_DIRECTION)?;
        let conn = connection()?;
        // On a capturing stream, host rows are the server's mirror of them (the graph keeps
        // the addresses it copies).
        let span = |pitch: usize| {
            super::arrays::span_3d(pitch as u64, 1, c.width as u64, c.height as u64, 1).unwrap_or(u64::MAX)
        };
        let direction = memory::captured(
            &conn,
            tail.first().copied(),
            (c.dst, span(c.dpitch)),
            (c.src, span(c.spitch)),
            direction,
        )?;
        let n = c.width * c.height;
        let with = |dst: u64, dpitch: usize, src: u64, spitch: usize, kind: u64| -> Vec<u64> {
            let mut a = vec![dst, dpitch as u64, src, spitch as u64, c.width as u64, c.height as u64, kind];
            a.extend_from_slice(tail);
            a
        };
        // SAFETY (all arms): host rows lie in the caller's buffers per its pitches.
        unsafe {
            match direction {
                (true, false) => {
                    let mut rows = Vec::with_capacity(n);
                    for r in 0..c.height {
                        rows.extend_from_slice(std::slice::from_raw_parts(
                            (c.src as usize + r * c.spitch) as *const u8,
                            c.width,
                        ));
                    }
                    let args = with(c.dst, c.dpitch, rows.as_ptr() as u64, c.width, 1);
                    Ok(crate::runtime::call_on(&conn, forms.h2d, &args) as u32)
                }
                (false, true) => {
                    let mut rows = vec![0u8; n];
                    let args = with(rows.as_mut_ptr() as u64, c.width, c.src, c.spitch, 2);
                    let s = crate::runtime::call_on(&conn, forms.d2h, &args) as u32;
                    if s == SUCCESS {
                        for r in 0..c.height {
                            std::ptr::copy_nonoverlapping(
                                rows.as_ptr().add(r * c.width),
                                (c.dst as usize + r * c.dpitch) as *mut u8,
                                c.width,
                            );
                        }
                    }
                    Ok(s)
                }
                (true, true) => {
                    Ok(crate::runtime::call_on(&conn, forms.d2d, &with(c.dst, c.dpitch, c.src, c.spitch, 3)) as u32)
                }
                (false, false) => {
                    for r in 0..c.height {
                        std::ptr::copy(
                            (c.src as usize + r * c.spitch) as *const u8,
                            (c.dst as usize + r * c.dpitch) as *mut u8,
                            c.width,
                        );
                    }
                    Ok(SUCCESS)
                }
            }
        }
    })
}

/// cudaMemcpy2D and cudaMemcpy2D_ptds.
#[allow(clippy::too_many_arguments)]
pub unsafe fn memcpy_2d(
    ctx: &Ctx,
    dst: *mut c_void,
    dpitch: usize,
    src: *mut c_void,
    spitch: usize,
    width: usize,
    height: usize,
    kind: u32,
) -> u32 {
    let c = Copy2d { dst: dst as u64, dpitch, src: src as u64, spitch, width, height };
    // SAFETY: the caller's rows, per cudaMemcpy2D's contract.
    unsafe { copy_2d(&CopyForms::of(ctx), c, kind, &[]) }
}

/// cudaMemcpy2DAsync and cudaMemcpy2DAsync_ptsz (whose NULL stream is the thread's own).
#[allow(clippy::too_many_arguments)]
pub unsafe fn memcpy_2d_async(
    ctx: &Ctx,
    dst: *mut c_void,
    dpitch: usize,
    src: *mut c_void,
    spitch: usize,
    width: usize,
    height: usize,
    kind: u32,
    stream: *mut c_void,
) -> u32 {
    let stream = ctx.stream(stream as u64) as *mut c_void;
    let c = Copy2d { dst: dst as u64, dpitch, src: src as u64, spitch, width, height };
    // SAFETY: the caller's rows, per cudaMemcpy2DAsync's contract.
    unsafe { copy_2d(&CopyForms::of(ctx), c, kind, &[stream as u64]) }
}

// ---- Function queries answered from the registry and the kernel's layout ----

/// The registered kernel of a host stub or a `cudaKernel_t`.
fn kernel_of_any(func: *mut c_void) -> Result<&'static registry::Kernel, u32> {
    registry::kernel_by_host_fun(func as usize)
        .or_else(|| registry::kernel_by_handle(func as usize))
        .ok_or(INVALID_DEVICE_FUNCTION)
}

/// cudaFuncGetName: the kernel's (mangled) name as nvcc registered it; the string lives as
/// long as the program.
pub unsafe fn func_get_name(ctx: &Ctx, name: *mut c_void, func: *mut c_void) -> u32 {
    runtime(ctx.name, || {
        if name.is_null() {
            return Err(INVALID_VALUE);
        }
        let kernel = kernel_of_any(func)?;
        // SAFETY: the caller's const char**.
        unsafe { std::ptr::write_unaligned(name as *mut *const std::ffi::c_char, kernel.name.as_ptr()) };
        Ok(SUCCESS)
    })
}

/// cudaFuncGetParamInfo: offset and size of parameter `index`, from the layout the kernel's
/// module load brought.
pub unsafe fn func_get_param_info(
    ctx: &Ctx,
    func: *mut c_void,
    index: usize,
    offset: *mut c_void,
    size: *mut c_void,
) -> u32 {
    runtime(ctx.name, || {
        let kernel = kernel_of_any(func)?;
        let conn = connection()?;
        let f = function_of(&conn, kernel)?;
        let (o, s) = *f.params.get(index).ok_or(INVALID_VALUE)?;
        // SAFETY: the caller's size_t pointers, each null or writable.
        unsafe {
            if !offset.is_null() {
                std::ptr::write_unaligned(offset as *mut usize, o as usize);
            }
            if !size.is_null() {
                std::ptr::write_unaligned(size as *mut usize, s as usize);
            }
        }
        Ok(SUCCESS)
    })
}

/// cudaFuncGetParamCount (CUDA 13.5): how many parameters the kernel's layout has.
pub unsafe fn func_get_param_count(ctx: &Ctx, func: *mut c_void, count: *mut c_void) -> u32 {
    runtime(ctx.name, || {
        let kernel = kernel_of_any(func)?;
        let conn = connection()?;
        let f = function_of(&conn, kernel)?;
        if count.is_null() {
            return Err(INVALID_VALUE);
        }
        // SAFETY: the caller's size_t.
        unsafe { std::ptr::write_unaligned(count as *mut usize, f.params.len()) };
        Ok(SUCCESS)
    })
}

/// cudaGetFuncBySymbol: the registered kernel's function on the server.
pub unsafe fn get_func_by_symbol(ctx: &Ctx, function: *mut c_void, symbol: *mut c_void) -> u32 {
    runtime(ctx.name, || {
        if function.is_null() {
            return Err(INVALID_VALUE);
        }
        let kernel = kernel_of_any(symbol)?;
        let conn = connection()?;
        let f = function_of(&conn, kernel)?;
        // SAFETY: the caller's cudaFunction_t*.
        unsafe { std::ptr::write_unaligned(function as *mut u64, f.handle) };
        Ok(SUCCESS)
    })
}

/// cudaFuncSetSharedMemConfig: shared memory bank size is fixed since Volta, where CUDA
/// accepts the call and does nothing; the function must be a registered kernel.
pub unsafe fn func_set_shared_mem_config(ctx: &Ctx, func: *mut c_void, config: u32) -> u32 {
    runtime(ctx.name, || {
        kernel_of_any(func)?;
        // cudaSharedMemBankSizeDefault, FourByte, EightByte.
        if config > chidori_cuda::consts::cudaSharedMemConfig::cudaSharedMemBankSizeEightByte {
            return Err(INVALID_VALUE);
        }
        Ok(SUCCESS)
    })
}

/// cudaOccupancyAvailableDynamicSMemPerBlock: asked of the driver with the kernel's function.
pub unsafe fn available_dynamic_smem(
    ctx: &Ctx,
    size: *mut c_void,
    func: *mut c_void,
    num_blocks: i32,
    block_size: i32,
) -> u32 {
    runtime(ctx.name, || {
        if size.is_null() {
            return Err(INVALID_VALUE);
        }
        let kernel = kernel_of_any(func)?;
        let conn = connection()?;
        let f = function_of(&conn, kernel)?;
        let args = [size as u64, f.handle, num_blocks as u32 as u64, block_size as u32 as u64];
        // SAFETY: the caller's size_t; values.
        Ok(unsafe { crate::runtime::call_on(&conn, &dcalls::cuOccupancyAvailableDynamicSMemPerBlock, &args) } as u32)
    })
}
