//! The real backend: NVIDIA's libraries, loaded at run time, called with the client's
//! arguments through the generated typed trampolines.

use std::collections::HashMap;
use std::ffi::c_void;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

use anyhow::{Context, Result, bail};
use chidori_cuda::calls::VARIANTS;
use chidori_protocol::desc::CallDesc;
use chidori_protocol::messages::{
    Device, GraphList, GraphLoop, GraphNode, Launch, LinkRequest, LinkResult, LoopCopy, NodeParams, NodeTarget,
};

use crate::backend::{
    Backend, HostFn, KernelHandle, LOOP_SLOTS, LoopDevice, LoopEnd, ModuleKernel, ModuleLoad, NodeList, NodeMade,
    run_loop,
};
use crate::loader::{self, Library};

mod vmm;

pub struct Real {
    dirs: Vec<PathBuf>,
    driver: Library,
    cudart: Library,
    libraries: Mutex<HashMap<String, Arc<Result<Library, String>>>>,
    symbols: Vec<OnceLock<Option<usize>>>,
    /// By wire id: the variant of the call's function the server's library has.
    server_variants: Vec<OnceLock<Option<&'static CallDesc>>>,
    layout: String,
    driver_version: i32,
    devices: Vec<Device>,
    module_api: ModuleApi,
}

type CuResult = i32;

/// The driver functions module loading and launching use, resolved once.
struct ModuleApi {
    library_load_data: unsafe extern "C" fn(
        *mut u64,
        *const c_void,
        *mut c_void,
        *mut c_void,
        u32,
        *mut c_void,
        *mut c_void,
        u32,
    ) -> CuResult,
    library_get_module: unsafe extern "C" fn(*mut u64, u64) -> CuResult,
    library_get_kernel_count: unsafe extern "C" fn(*mut u32, u64) -> CuResult,
    library_enumerate_kernels: unsafe extern "C" fn(*mut u64, u32, u64) -> CuResult,
    library_get_global: unsafe extern "C" fn(*mut u64, *mut usize, u64, *const i8) -> CuResult,
    library_get_managed: unsafe extern "C" fn(*mut u64, *mut usize, u64, *const i8) -> CuResult,
    pointer_get_attribute: unsafe extern "C" fn(*mut c_void, u32, u64) -> CuResult,
    kernel_get_function: unsafe extern "C" fn(*mut u64, u64) -> CuResult,
    kernel_get_name: unsafe extern "C" fn(*mut *const i8, u64) -> CuResult,
    func_get_param_info: unsafe extern "C" fn(u64, usize, *mut usize, *mut usize) -> CuResult,
    /// cuKernelGetParamInfo (drivers of CUDA 12.4 on): a kernel's layout without loading it.
    kernel_get_param_info: Option<unsafe extern "C" fn(u64, usize, *mut usize, *mut usize) -> CuResult>,
    ctx_get_current: unsafe extern "C" fn(*mut u64) -> CuResult,
    ctx_push_current: unsafe extern "C" fn(u64) -> CuResult,
    ctx_pop_current: unsafe extern "C" fn(*mut u64) -> CuResult,
    ctx_set_current: unsafe extern "C" fn(u64) -> CuResult,
    launch_kernel_ex: unsafe extern "C" fn(*const LaunchConfig, u64, *mut *mut c_void, *mut *mut c_void) -> CuResult,
    max_active_clusters: unsafe extern "C" fn(*mut i32, u64, *const LaunchConfig) -> CuResult,
    max_potential_cluster_size: unsafe extern "C" fn(*mut i32, u64, *const LaunchConfig) -> CuResult,
    rt_free: unsafe extern "C" fn(*mut c_void) -> u32,
    host_register: unsafe extern "C" fn(*mut c_void, usize, u32) -> u32,
    host_unregister: unsafe extern "C" fn(*mut c_void) -> u32,
    host_get_device_pointer: unsafe extern "C" fn(*mut *mut c_void, *mut c_void, u32) -> u32,
    exchange_capture_mode: unsafe extern "C" fn(*mut u32) -> u32,
    stream_is_capturing: unsafe extern "C" fn(u64, *mut u32) -> CuResult,
    stream_synchronize: unsafe extern "C" fn(u64) -> CuResult,
}

const CAPTURE_MODE_RELAXED: u32 = chidori_cuda::consts::cudaStreamCaptureMode::cudaStreamCaptureModeRelaxed;

impl ModuleApi {
    /// Run `f` with this thread's stream-capture mode relaxed. The worker registers host
    /// memory for mirrors while the program may be capturing a stream in global mode (a copy
    /// of pageable memory recorded into a graph); there, a registration on any thread fails
    /// with cudaErrorStreamCaptureUnsupported and invalidates the program's capture. The
    /// worker's own bookkeeping is no part of the capture, so it opts out as the CUDA
    /// documentation describes for such calls.
    fn relaxed<T>(&self, f: impl FnOnce() -> T) -> T {
        let mut mode = CAPTURE_MODE_RELAXED;
        // SAFETY: a valid in/out pointer to a cudaStreamCaptureMode.
        let swapped = unsafe { (self.exchange_capture_mode)(&mut mode) } == 0;
        let out = f();
        if swapped {
            // SAFETY: as above; puts the thread's previous mode back.
            unsafe { (self.exchange_capture_mode)(&mut mode) };
        }
        out
    }
}

/// cudaErrorNotSupported (CUDA_ERROR_NOT_SUPPORTED is the same number).
const NOT_SUPPORTED_RT: i64 = chidori_cuda::consts::cudaError::cudaErrorNotSupported as i64;
const _: () = assert!(NOT_SUPPORTED_RT == chidori_cuda::consts::cudaError_enum::CUDA_ERROR_NOT_SUPPORTED as i64);
/// What the worker answers for a failure of its own around a driver call: an argument it
/// cannot pass on, and a failure with no status of the driver's.
const INVALID_VALUE: i64 = chidori_cuda::consts::cudaError_enum::CUDA_ERROR_INVALID_VALUE as i64;
const UNKNOWN: i64 = chidori_cuda::consts::cudaError_enum::CUDA_ERROR_UNKNOWN as i64;

/// The runtime functions a graph-replay loop calls.
struct LoopApi {
    graph_launch: unsafe extern "C" fn(u64, u64) -> u32,
    memcpy_async: unsafe extern "C" fn(*mut c_void, *const c_void, usize, u32, u64) -> u32,
    event_create: unsafe extern "C" fn(*mut u64, u32) -> u32,
    event_record: unsafe extern "C" fn(u64, u64) -> u32,
    event_synchronize: unsafe extern "C" fn(u64) -> u32,
    event_destroy: unsafe extern "C" fn(u64) -> u32,
    stream_synchronize: unsafe extern "C" fn(u64) -> u32,
    device_synchronize: unsafe extern "C" fn() -> u32,
    malloc_host: unsafe extern "C" fn(*mut *mut c_void, usize) -> u32,
    free_host: unsafe extern "C" fn(*mut c_void) -> u32,
}

impl LoopApi {
    fn new(cudart: &Library) -> Result<LoopApi> {
        Ok(LoopApi {
            graph_launch: symbol_as(cudart, "cudaGraphLaunch")?,
            memcpy_async: symbol_as(cudart, "cudaMemcpyAsync")?,
            event_create: symbol_as(cudart, "cudaEventCreateWithFlags")?,
            event_record: symbol_as(cudart, "cudaEventRecord")?,
            event_synchronize: symbol_as(cudart, "cudaEventSynchronize")?,
            event_destroy: symbol_as(cudart, "cudaEventDestroy")?,
            stream_synchronize: symbol_as(cudart, "cudaStreamSynchronize")?,
            device_synchronize: symbol_as(cudart, "cudaDeviceSynchronize")?,
            malloc_host: symbol_as(cudart, "cudaMallocHost")?,
            free_host: symbol_as(cudart, "cudaFreeHost")?,
        })
    }
}

/// A loop on the real GPU: checkpoints copy into slots of pinned memory (4-byte flag at 0,
/// the output from 8) and record an event.
struct RealLoop<'a> {
    api: &'a LoopApi,
    request: &'a GraphLoop,
    host: *mut u8,
    slot_size: usize,
    events: [u64; LOOP_SLOTS],
    lens: [usize; LOOP_SLOTS],
}

const D2H: u32 = chidori_cuda::consts::cudaMemcpyKind::cudaMemcpyDeviceToHost;
const D2D: u32 = chidori_cuda::consts::cudaMemcpyKind::cudaMemcpyDeviceToDevice;

fn status(rc: u32) -> Result<(), i64> {
    if rc == 0 { Ok(()) } else { Err(i64::from(rc)) }
}

impl LoopDevice for RealLoop<'_> {
    fn launch(&mut self) -> Result<(), i64> {
        // SAFETY: exec and stream are this session's handles (checked by the session).
        status(unsafe { (self.api.graph_launch)(self.request.exec, self.request.stream) })
    }

    fn checkpoint(&mut self, slot: usize, from: u32, to: u32) -> Result<(), i64> {
        let r = self.request;
        // SAFETY: the slot lies inside the pinned allocation; `to - from` steps of output
        // fit its output area (at most check_every steps per checkpoint); the device
        // addresses are the client's.
        unsafe {
            let base = self.host.add(slot * self.slot_size);
            if r.stop_flag != 0 {
                status((self.api.memcpy_async)(base.cast(), r.stop_flag as *const c_void, 4, D2H, r.stream))?;
            }
            let n = (to - from) as usize * r.bytes_per_step as usize;
            self.lens[slot] = 0;
            if r.output != 0 && n > 0 {
                let src = r.output + u64::from(from) * u64::from(r.bytes_per_step);
                status((self.api.memcpy_async)(base.add(8).cast(), src as *const c_void, n, D2H, r.stream))?;
                self.lens[slot] = n;
            }
            status((self.api.event_record)(self.events[slot], r.stream))
        }
    }

    fn examine(&mut self, slot: usize) -> Result<(u32, &[u8]), i64> {
        // SAFETY: the event was recorded by checkpoint; the slot's bytes are written once
        // it completes.
        unsafe {
            status((self.api.event_synchronize)(self.events[slot]))?;
            let base = self.host.add(slot * self.slot_size);
            let flag = std::ptr::read_unaligned(base as *const u32);
            Ok((flag, std::slice::from_raw_parts(base.add(8), self.lens[slot])))
        }
    }

    fn copy(&mut self, copy: &LoopCopy) -> Result<(), i64> {
        let (dst, src) = (copy.dst as *mut c_void, copy.src as *const c_void);
        let invalid = i64::from(chidori_cuda::consts::cudaError::cudaErrorInvalidValue);
        let bytes = usize::try_from(copy.bytes).map_err(|_| invalid)?;
        // SAFETY: both ranges are this session's device memory (checked by the session).
        status(unsafe { (self.api.memcpy_async)(dst, src, bytes, D2D, self.request.stream) })
    }

    fn drain(&mut self) -> Result<(), i64> {
        // SAFETY: the session's stream.
        status(unsafe { (self.api.stream_synchronize)(self.request.stream) })
    }

    fn synchronize_device(&mut self) -> Result<(), i64> {
        // SAFETY: no arguments; the loop's thread has the session's context current.
        status(unsafe { (self.api.device_synchronize)() })
    }
}

/// cudaHostRegisterPortable | cudaHostRegisterMapped: every context may address it. The
/// header's macros, not an enum, so not among the generated constants.
const HOST_REGISTER_PORTABLE_MAPPED: u32 = 1 | 2;

/// cudaHostRegisterPortable: pinned for every context.
const HOST_REGISTER_PORTABLE: u32 = 1;

/// CUlaunchConfig (56 bytes in every CUDA 12 and 13 release).
#[repr(C)]
struct LaunchConfig {
    grid: [u32; 3],
    block: [u32; 3],
    shared_mem: u32,
    stream: u64,
    attrs: *mut LaunchAttribute,
    num_attrs: u32,
}

/// CUlaunchAttribute: id, padding, 64-byte value.
#[repr(C)]
struct LaunchAttribute {
    id: u32,
    pad: u32,
    value: [u8; 64],
}

/// A launch's attributes as the driver takes them (a cooperative launch is one more).
fn launch_attributes(launch: &Launch) -> Vec<LaunchAttribute> {
    let mut attrs: Vec<LaunchAttribute> = launch
        .attributes
        .iter()
        .map(|(id, v)| {
            let mut value = [0u8; 64];
            let n = v.len().min(64);
            value[..n].copy_from_slice(&v[..n]);
            LaunchAttribute { id: *id, pad: 0, value }
        })
        .collect();
    if launch.cooperative {
        let mut value = [0u8; 64];
        value[..4].copy_from_slice(&1i32.to_le_bytes());
        attrs.push(LaunchAttribute { id: ATTRIBUTE_COOPERATIVE, pad: 0, value });
    }
    attrs
}

/// The CUlaunchConfig of `launch`, pointing at `attrs` (which must outlive its use).
fn launch_config(launch: &Launch, attrs: &mut [LaunchAttribute]) -> LaunchConfig {
    LaunchConfig {
        grid: launch.grid,
        block: launch.block,
        shared_mem: launch.shared_mem,
        stream: launch.stream,
        attrs: attrs.as_mut_ptr(),
        num_attrs: attrs.len() as u32,
    }
}

const _: () = {
    assert!(size_of::<LaunchConfig>() == 56);
    assert!(std::mem::offset_of!(LaunchConfig, stream) == 32);
    assert!(size_of::<LaunchAttribute>() == 72);
};

const ATTRIBUTE_COOPERATIVE: u32 = chidori_cuda::consts::CUlaunchAttributeID_enum::CU_LAUNCH_ATTRIBUTE_COOPERATIVE;

fn cstr(p: *const i8) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: the driver returns NUL-terminated names it owns.
    unsafe { std::ffi::CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// The CUDA versions Chidori has struct maps for, oldest first.
fn layout_for(version: i32) -> String {
    let (major, minor) = (version / 1000, (version % 1000) / 10);
    let mut best = "11.8".to_owned();
    for (v, _) in chidori_cuda::structs::BY_VERSION {
        let mut it = v.split('.').map(|p| p.parse::<i32>().unwrap_or(0));
        let (a, b) = (it.next().unwrap_or(0), it.next().unwrap_or(0));
        if (a, b) <= (major, minor) {
            best = (*v).to_owned();
        }
    }
    best
}

fn sonames(library: &str) -> Vec<&'static str> {
    chidori_cuda::libraries::LIBRARIES
        .iter()
        .find(|l| l.name == library)
        .map(|l| l.shims.iter().rev().map(|s| s.soname).collect())
        .unwrap_or_default()
}

/// The function pointer `name` of `lib`, typed by its destination field.
fn symbol_as<F: Copy>(lib: &Library, name: &str) -> Result<F> {
    // SAFETY: the caller states F, the C signature, in its field declaration, matching the
    // CUDA headers of every version.
    unsafe { lib.function(name) }.map_err(anyhow::Error::msg)
}

/// A parameter layout asked index by index of `info` (cuFuncGetParamInfo or
/// cuKernelGetParamInfo): (offset, size) each, up to the first index the driver refuses
/// (CUDA_ERROR_INVALID_VALUE past the last parameter).
fn param_layout(info: impl Fn(usize, *mut usize, *mut usize) -> CuResult) -> Vec<(u32, u32)> {
    let mut params = Vec::new();
    for i in 0.. {
        let (mut offset, mut size) = (0usize, 0usize);
        if info(i, &mut offset, &mut size) != 0 {
            break;
        }
        params.push((offset as u32, size as u32));
    }
    params
}

macro_rules! fn_ptr {
    ($lib:expr, $name:literal, _) => {
        symbol_as(&$lib, $name)?
    };
    ($lib:expr, $name:literal, $ty:ty) => {{
        let p = $lib.symbol($name).with_context(|| format!("{} lacks {}", $lib.path, $name))?;
        // SAFETY: the symbol of this name has this C signature in every CUDA version.
        unsafe { std::mem::transmute::<*const c_void, $ty>(p) }
    }};
}

impl Real {
    /// Load the driver and runtime and read every device's profile. Fails with a message a
    /// user can act on when there is no driver or no GPU.
    pub fn new(extra_dirs: &[PathBuf]) -> Result<Real> {
        let dirs = loader::search_dirs(extra_dirs);
        let driver = loader::load(&["libcuda.so.1"], &dirs).map_err(|e| anyhow::anyhow!("no NVIDIA driver: {e}"))?;
        let cudart = loader::load(&sonames("cudart"), &dirs).map_err(|e| anyhow::anyhow!("no CUDA runtime: {e}"))?;
        let cu_init = fn_ptr!(driver, "cuInit", unsafe extern "C" fn(u32) -> i32);
        let cu_driver_version = fn_ptr!(driver, "cuDriverGetVersion", unsafe extern "C" fn(*mut i32) -> i32);
        let cu_count = fn_ptr!(driver, "cuDeviceGetCount", unsafe extern "C" fn(*mut i32) -> i32);
        let cu_get = fn_ptr!(driver, "cuDeviceGet", unsafe extern "C" fn(*mut i32, i32) -> i32);
        let cu_name = fn_ptr!(driver, "cuDeviceGetName", unsafe extern "C" fn(*mut u8, i32, i32) -> i32);
        let cu_total = fn_ptr!(driver, "cuDeviceTotalMem_v2", unsafe extern "C" fn(*mut usize, i32) -> i32);
        let cu_uuid = fn_ptr!(driver, "cuDeviceGetUuid", unsafe extern "C" fn(*mut u8, i32) -> i32);
        let cu_attr = fn_ptr!(driver, "cuDeviceGetAttribute", unsafe extern "C" fn(*mut i32, i32, i32) -> i32);
        let rt_version = fn_ptr!(cudart, "cudaRuntimeGetVersion", unsafe extern "C" fn(*mut i32) -> i32);
        let props_fn = cudart
            .symbol("cudaGetDeviceProperties_v2")
            .or_else(|| cudart.symbol("cudaGetDeviceProperties"))
            .context("the CUDA runtime lacks cudaGetDeviceProperties")?;
        // SAFETY: (cudaDeviceProp*, int) -> cudaError_t in every version; the buffer below is
        // larger than any version's struct.
        let props_fn: unsafe extern "C" fn(*mut u8, i32) -> i32 = unsafe { std::mem::transmute(props_fn) };
        let module_api = ModuleApi {
            library_load_data: fn_ptr!(driver, "cuLibraryLoadData", _),
            library_get_module: fn_ptr!(driver, "cuLibraryGetModule", _),
            library_get_kernel_count: fn_ptr!(driver, "cuLibraryGetKernelCount", _),
            library_enumerate_kernels: fn_ptr!(driver, "cuLibraryEnumerateKernels", _),
            library_get_global: fn_ptr!(driver, "cuLibraryGetGlobal", _),
            library_get_managed: fn_ptr!(driver, "cuLibraryGetManaged", _),
            pointer_get_attribute: fn_ptr!(driver, "cuPointerGetAttribute", _),
            kernel_get_function: fn_ptr!(driver, "cuKernelGetFunction", _),
            kernel_get_name: fn_ptr!(driver, "cuKernelGetName", _),
            func_get_param_info: fn_ptr!(driver, "cuFuncGetParamInfo", _),
            kernel_get_param_info: symbol_as(&driver, "cuKernelGetParamInfo").ok(),
            ctx_get_current: fn_ptr!(driver, "cuCtxGetCurrent", _),
            ctx_push_current: fn_ptr!(driver, "cuCtxPushCurrent_v2", _),
            ctx_pop_current: fn_ptr!(driver, "cuCtxPopCurrent_v2", _),
            ctx_set_current: fn_ptr!(driver, "cuCtxSetCurrent", _),
            launch_kernel_ex: fn_ptr!(driver, "cuLaunchKernelEx", _),
            max_active_clusters: fn_ptr!(driver, "cuOccupancyMaxActiveClusters", _),
            max_potential_cluster_size: fn_ptr!(driver, "cuOccupancyMaxPotentialClusterSize", _),
            rt_free: symbol_as(&cudart, "cudaFree")?,
            host_register: symbol_as(&cudart, "cudaHostRegister")?,
            host_unregister: symbol_as(&cudart, "cudaHostUnregister")?,
            host_get_device_pointer: symbol_as(&cudart, "cudaHostGetDevicePointer")?,
            exchange_capture_mode: symbol_as(&cudart, "cudaThreadExchangeStreamCaptureMode")?,
            stream_is_capturing: fn_ptr!(driver, "cuStreamIsCapturing", _),
            stream_synchronize: fn_ptr!(driver, "cuStreamSynchronize", _),
        };
        // SAFETY (block): each call passes valid out-pointers of the documented types.
        unsafe {
            let rc = cu_init(0);
            if rc != 0 {
                bail!("cuInit failed with status {rc}: is the NVIDIA driver loaded and a GPU visible?");
            }
            let mut driver_version = 0;
            cu_driver_version(&mut driver_version);
            let mut runtime_version = 0;
            rt_version(&mut runtime_version);
            let layout = layout_for(runtime_version);
            let map = chidori_cuda::structs::get(&layout, "cudaDeviceProp").context("no cudaDeviceProp map")?;
            let mut count = 0;
            cu_count(&mut count);
            if count == 0 {
                bail!("no CUDA GPU is visible to the server (check CUDA_VISIBLE_DEVICES and --gpu)");
            }
            let mut devices = Vec::new();
            for ordinal in 0..count {
                let mut dev = 0;
                cu_get(&mut dev, ordinal);
                let mut name = [0u8; 256];
                cu_name(name.as_mut_ptr(), 256, dev);
                let mut total = 0usize;
                cu_total(&mut total, dev);
                let mut uuid = [0u8; 16];
                cu_uuid(uuid.as_mut_ptr(), dev);
                let mut attributes = Vec::new();
                for attr in 1..=256 {
                    let mut v = 0;
                    if cu_attr(&mut v, attr, dev) == 0 {
                        attributes.push((attr, v));
                    }
                }
                let mut raw = vec![0u8; 4096];
                let rc = props_fn(raw.as_mut_ptr(), ordinal);
                if rc != 0 {
                    bail!("cudaGetDeviceProperties({ordinal}) failed with status {rc}");
                }
                let end = name.iter().position(|b| *b == 0).unwrap_or(name.len());
                devices.push(Device {
                    ordinal: ordinal as u32,
                    name: String::from_utf8_lossy(&name[..end]).into_owned(),
                    uuid,
                    total_mem: total as u64,
                    attributes,
                    props: crate::profile::decode_props(map, &raw),
                    props_version: layout.clone(),
                });
            }
            Ok(Real {
                module_api,
                dirs,
                driver,
                cudart,
                libraries: Mutex::new(HashMap::new()),
                symbols: (0..VARIANTS.len()).map(|_| OnceLock::new()).collect(),
                server_variants: (0..VARIANTS.len()).map(|_| OnceLock::new()).collect(),
                layout,
                driver_version,
                devices,
            })
        }
    }

    fn library(&self, name: &str) -> Arc<Result<Library, String>> {
        let mut libs = self.libraries.lock().unwrap_or_else(|p| p.into_inner());
        libs.entry(name.to_owned())
            .or_insert_with(|| {
                let lib = loader::load(&sonames(name), &self.dirs);
                if let (Ok(l), "nvml") = (&lib, name) {
                    init_nvml(l);
                }
                Arc::new(lib)
            })
            .clone()
    }

    fn symbol(&self, desc: &'static CallDesc) -> Result<*const c_void, String> {
        let slot = self.symbols.get(desc.wire as usize).ok_or("unknown call")?;
        let found = *slot.get_or_init(|| {
            let lib = match desc.library {
                "driver" => self.driver.symbol(desc.name),
                "cudart" => self.cudart.symbol(desc.name),
                other => match &*self.library(other) {
                    Ok(lib) => lib.symbol(desc.name),
                    Err(e) => {
                        tracing::warn!("{e}");
                        None
                    }
                },
            };
            lib.map(|p| p as usize)
        });
        found.map(|p| p as *const c_void).ok_or_else(|| format!("the server's {} has no {}", desc.library, desc.name))
    }
}

impl Backend for Real {
    fn name(&self) -> &'static str {
        "real"
    }

    fn driver_version(&self) -> i32 {
        self.driver_version
    }

    fn libraries(&self) -> Vec<(String, String)> {
        vec![("cudart".into(), self.layout.clone()), ("driver".into(), self.layout.clone())]
    }

    fn devices(&self) -> Vec<Device> {
        self.devices.clone()
    }

    fn compile(
        &self,
        request: &chidori_protocol::messages::CompileRequest,
    ) -> Result<chidori_protocol::messages::CompileResult, (i64, String)> {
        let internal = crate::backend::NVRTC_INTERNAL_ERROR;
        match &*self.library("nvrtc") {
            Ok(lib) => crate::nvrtc::compile(lib, request).map_err(|e| (internal, e)),
            Err(e) => Err((internal, format!("the server has no NVRTC: {e}"))),
        }
    }

    fn jit_link(
        &self,
        request: &chidori_protocol::messages::JitLinkRequest,
    ) -> Result<chidori_protocol::messages::JitLinkResult, (i64, String)> {
        let internal = crate::nvjitlink::INTERNAL;
        match &*self.library("nvjitlink") {
            Ok(lib) => crate::nvjitlink::link(lib, request).map_err(|e| (internal, e)),
            Err(e) => Err((internal, format!("the server has no nvJitLink: {e}"))),
        }
    }

    fn layout_version(&self, _library: &str) -> Option<String> {
        Some(self.layout.clone())
    }

    fn thread_init(&self) {
        // The runtime's primary context becomes current on this thread, as cudart does on a
        // program's threads: kernels and driver calls of this client thread run in it.
        // Relaxed: another client thread may be capturing in global mode, and a cudaFree
        // would invalidate its capture (the program made no such call).
        let api = &self.module_api;
        // SAFETY: cudaFree(NULL) only initializes.
        api.relaxed(|| unsafe { (api.rt_free)(std::ptr::null_mut()) });
    }

    fn load_module(&self, image: &[u8]) -> Result<ModuleLoad, (i64, String)> {
        let api = &self.module_api;
        let check = |rc: CuResult, what: &str| -> Result<(), (i64, String)> {
            if rc == 0 { Ok(()) } else { Err((i64::from(rc), format!("{what} failed with status {rc}"))) }
        };
        let null = std::ptr::null_mut();
        // SAFETY (block): the image stays alive for the call (the driver copies it); every
        // out-pointer is a local of the right type.
        unsafe {
            let mut library = 0u64;
            check(
                (api.library_load_data)(&mut library, image.as_ptr().cast(), null, null, 0, null, null, 0),
                "cuLibraryLoadData",
            )?;
            let mut module = 0u64;
            check((api.library_get_module)(&mut module, library), "cuLibraryGetModule")?;
            let mut context = 0u64;
            check((api.ctx_get_current)(&mut context), "cuCtxGetCurrent")?;
            let mut count = 0u32;
            check((api.library_get_kernel_count)(&mut count, library), "cuLibraryGetKernelCount")?;
            let mut kernels = vec![0u64; count as usize];
            if count > 0 {
                check(
                    (api.library_enumerate_kernels)(kernels.as_mut_ptr(), count, library),
                    "cuLibraryEnumerateKernels",
                )?;
            }
            let mut infos = Vec::new();
            for kernel in kernels {
                let mut name = std::ptr::null();
                check((api.kernel_get_name)(&mut name, kernel), "cuKernelGetName")?;
                // A kernel's function is found when first used where the driver can tell its
                // layout without it; asking for every function here loaded every kernel of
                // the library (most of a module load's time).
                let (handle, params) = match api.kernel_get_param_info {
                    Some(info) => (KernelHandle::Kernel(kernel), param_layout(|i, o, s| info(kernel, i, o, s))),
                    None => {
                        let mut function = 0u64;
                        check((api.kernel_get_function)(&mut function, kernel), "cuKernelGetFunction")?;
                        (KernelHandle::Function(function), self.function_params(function)?)
                    }
                };
                infos.push(ModuleKernel { name: cstr(name), params, handle });
            }
            Ok(ModuleLoad { library, module, context, kernels: infos })
        }
    }

    fn load_module_in(&self, image: &[u8], context: u64) -> Result<ModuleLoad, (i64, String)> {
        let api = &self.module_api;
        api.relaxed(|| {
            if context != 0 {
                // SAFETY: a context the session's executor had current; a destroyed one is
                // refused by the driver with a status.
                let rc = unsafe { (api.ctx_set_current)(context) };
                if rc != 0 {
                    return Err((
                        i64::from(rc),
                        format!("cuCtxSetCurrent of the asking thread's context failed with status {rc}"),
                    ));
                }
            }
            self.load_module(image)
        })
    }

    fn current_context(&self) -> u64 {
        let mut current = 0u64;
        // SAFETY: an out-pointer to a local.
        let rc = unsafe { (self.module_api.ctx_get_current)(&mut current) };
        if rc == 0 { current } else { 0 }
    }

    fn module_function(&self, kernel: u64, context: u64) -> Result<u64, (i64, String)> {
        let api = &self.module_api;
        let mut current = 0u64;
        // SAFETY: an out-pointer to a local.
        let rc = unsafe { (api.ctx_get_current)(&mut current) };
        if rc != 0 || current == context || context == 0 {
            return self.kernel_function(kernel);
        }
        // The function of the context the module was loaded in, as a load that found every
        // function at once gave.
        // SAFETY: pushing a context the session's load saw current; an invalid (destroyed)
        // one is refused by the driver with a status.
        let rc = unsafe { (api.ctx_push_current)(context) };
        if rc != 0 {
            return Err((i64::from(rc), format!("cuCtxPushCurrent of the module's context failed with status {rc}")));
        }
        let found = self.kernel_function(kernel);
        let mut popped = 0u64;
        // SAFETY: pops the context pushed just now; an out-pointer to a local.
        unsafe { (api.ctx_pop_current)(&mut popped) };
        found
    }

    fn global(&self, library: u64, name: &str) -> Result<(u64, u64), (i64, String)> {
        let name = std::ffi::CString::new(name).map_err(|_| (INVALID_VALUE, "bad symbol name".to_owned()))?;
        let (mut address, mut size) = (0u64, 0usize);
        // SAFETY: out-pointers are locals; name is NUL-terminated.
        let mut rc = unsafe { (self.module_api.library_get_global)(&mut address, &mut size, library, name.as_ptr()) };
        if rc as u32 == chidori_cuda::consts::cudaError_enum::CUDA_ERROR_NOT_FOUND {
            // A `__managed__` variable is the library's managed memory, not a global.
            // SAFETY: as above.
            rc = unsafe { (self.module_api.library_get_managed)(&mut address, &mut size, library, name.as_ptr()) };
        }
        if rc != 0 {
            return Err((i64::from(rc), format!("cuLibraryGetGlobal failed with status {rc}")));
        }
        Ok((address, size as u64))
    }

    fn host_accessible(&self, addr: u64, len: u64) -> bool {
        use chidori_cuda::consts::CUpointer_attribute_enum as a;
        let attribute = |attribute: u32| {
            let mut value = 0u64;
            // SAFETY: an 8-byte out-value (each of these attributes is at most 8 bytes);
            // the driver answers an error for an address it does not know.
            let rc = unsafe { (self.module_api.pointer_get_attribute)((&raw mut value).cast(), attribute, addr) };
            (rc == 0).then_some(value)
        };
        let managed = attribute(a::CU_POINTER_ATTRIBUTE_IS_MANAGED).is_some_and(|v| v != 0);
        let start = attribute(a::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR);
        let size = attribute(a::CU_POINTER_ATTRIBUTE_RANGE_SIZE);
        match (managed, start, size) {
            (true, Some(start), Some(size)) => {
                len > 0 && addr >= start && addr.checked_add(len).is_some_and(|end| end <= start.saturating_add(size))
            }
            _ => false,
        }
    }

    fn read_host_accessible(&self, addr: u64, out: &mut [u8]) -> Result<(), String> {
        if !self.host_accessible(addr, out.len() as u64) {
            return Err(format!("{addr:#x} ({} bytes) is no managed memory of this process", out.len()));
        }
        // SAFETY: managed memory of one live allocation, readable from the CPU (checked
        // just now; the worker's session is the only user of its own allocations).
        unsafe { std::ptr::copy_nonoverlapping(addr as *const u8, out.as_mut_ptr(), out.len()) };
        Ok(())
    }

    fn write_host_accessible(&self, addr: u64, bytes: &[u8]) -> Result<(), String> {
        if !self.host_accessible(addr, bytes.len() as u64) {
            return Err(format!("{addr:#x} ({} bytes) is no managed memory of this process", bytes.len()));
        }
        // SAFETY: as in read_host_accessible, writable likewise.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), addr as *mut u8, bytes.len()) };
        Ok(())
    }

    fn function_params(&self, function: u64) -> Result<Vec<(u32, u32)>, (i64, String)> {
        let info = self.module_api.func_get_param_info;
        // SAFETY: the function is one of the session's live handles.
        Ok(param_layout(|i, o, s| unsafe { info(function, i, o, s) }))
    }

    fn kernel_function(&self, kernel: u64) -> Result<u64, (i64, String)> {
        let mut function = 0u64;
        // SAFETY: an out-pointer to a local; the kernel is a live handle of the session.
        let rc = unsafe { (self.module_api.kernel_get_function)(&mut function, kernel) };
        if rc != 0 {
            return Err((i64::from(rc), format!("cuKernelGetFunction failed with status {rc}")));
        }
        Ok(function)
    }

    unsafe fn launch(&self, launch: &Launch, params: &mut [u8], layout: &[(u32, u32)]) -> i64 {
        let mut pointers: Vec<*mut c_void> =
            layout.iter().map(|(offset, _)| params.as_mut_ptr().wrapping_add(*offset as usize).cast()).collect();
        let mut attrs = launch_attributes(launch);
        let config = launch_config(launch, &mut attrs);
        // SAFETY: per the contract, the pointers address each parameter inside `params`.
        i64::from(unsafe {
            (self.module_api.launch_kernel_ex)(&config, launch.function, pointers.as_mut_ptr(), std::ptr::null_mut())
        })
    }

    // The worker's own bookkeeping, no part of a capture the program may be making (the
    // client places an allocation ahead only where the program's thread may allocate).
    fn window_reserve(&self, device: i32, size: u64) -> Result<crate::backend::Window, (i64, String)> {
        self.module_api.relaxed(|| vmm::reserve(&self.driver, device, size))
    }

    fn window_map(&self, device: i32, address: u64, size: u64) -> Result<(), (i64, String)> {
        self.module_api.relaxed(|| vmm::map(&self.driver, device, address, size))
    }

    fn window_unmap(&self, device: i32, address: u64, size: u64, reset: bool) -> Result<(), (i64, String)> {
        vmm::unmap(&self.driver, device, address, size, reset)
    }

    fn cluster_occupancy(&self, launch: &Launch, potential: bool) -> Result<i32, (i64, String)> {
        let mut attrs = launch_attributes(launch);
        let config = launch_config(launch, &mut attrs);
        let (query, name) = if potential {
            (self.module_api.max_potential_cluster_size, "cuOccupancyMaxPotentialClusterSize")
        } else {
            (self.module_api.max_active_clusters, "cuOccupancyMaxActiveClusters")
        };
        let mut value = 0i32;
        // SAFETY: an out-pointer to a local; the configuration and its attributes live
        // through the call; the function is one of the session's.
        let rc = unsafe { query(&mut value, launch.function, &config) };
        if rc != 0 {
            return Err((i64::from(rc), format!("{name} failed with status {rc}")));
        }
        Ok(value)
    }

    fn graph_loop(&self, request: &GraphLoop, progress: &mut dyn FnMut(u32, &[u8])) -> LoopEnd {
        let failed = |status: i64| LoopEnd { steps: 0, stopped_at: None, status, idle: false };
        let api = match LoopApi::new(&self.cudart) {
            Ok(api) => api,
            Err(e) => {
                tracing::warn!("graph loop: {e}");
                return failed(NOT_SUPPORTED_RT);
            }
        };
        let every = request.check_every.max(1) as usize;
        let out_len = every.saturating_mul(request.bytes_per_step as usize);
        let slot_size = 8 + out_len;
        let mut host: *mut c_void = std::ptr::null_mut();
        // SAFETY: cudaMallocHost with a valid out-pointer.
        let rc = unsafe { (api.malloc_host)(&mut host, slot_size * LOOP_SLOTS) };
        if rc != 0 {
            return failed(i64::from(rc));
        }
        let mut events = [0u64; LOOP_SLOTS];
        for e in &mut events {
            // cudaEventDisableTiming: a macro of the runtime's header, the driver's number.
            let disable_timing = chidori_cuda::consts::CUevent_flags_enum::CU_EVENT_DISABLE_TIMING;
            // SAFETY: a valid out-pointer.
            let rc = unsafe { (api.event_create)(e, disable_timing) };
            if rc != 0 {
                // SAFETY: allocated above.
                unsafe { (api.free_host)(host) };
                return failed(i64::from(rc));
            }
        }
        let mut device =
            RealLoop { api: &api, request, host: host as *mut u8, slot_size, events, lens: [0; LOOP_SLOTS] };
        let end = run_loop(request, &mut device, progress);
        // SAFETY: created and allocated above; every launch has finished (drain).
        unsafe {
            for e in events {
                (api.event_destroy)(e);
            }
            (api.free_host)(host);
        }
        end
    }

    fn map_host(&self, base: u64, len: u64) -> Result<(), String> {
        let api = &self.module_api;
        let p = base as *mut c_void;
        let len = usize::try_from(len).map_err(|_| "mirror too large".to_owned())?;
        api.relaxed(|| {
            // SAFETY: the caller mapped [base, base + len) read-write in this process.
            let rc = unsafe { (api.host_register)(p, len, HOST_REGISTER_PORTABLE_MAPPED) };
            if rc != 0 {
                return Err(format!("cudaHostRegister of {len} bytes at {base:#x} failed with status {rc}"));
            }
            let mut device: *mut c_void = std::ptr::null_mut();
            // SAFETY: p is registered memory; `device` is a valid out-pointer.
            let rc = unsafe { (api.host_get_device_pointer)(&mut device, p, 0) };
            if rc != 0 || device != p {
                // SAFETY: registered just above.
                unsafe { (api.host_unregister)(p) };
                return Err(format!(
                    "the GPU addresses host memory at {base:#x} as {device:p} (status {rc}): this GPU cannot read the client's pinned memory at its own address"
                ));
            }
            Ok(())
        })
    }

    fn pin_staging(&self, base: u64, len: u64) -> bool {
        let Ok(len) = usize::try_from(len) else { return false };
        let api = &self.module_api;
        // SAFETY: the caller's memory of `len` bytes, alive as long as the process.
        let rc = api.relaxed(|| unsafe { (api.host_register)(base as *mut c_void, len, HOST_REGISTER_PORTABLE) });
        if rc != 0 {
            tracing::debug!("cudaHostRegister of a {len}-byte staging buffer failed ({rc}): it stays pageable");
        }
        rc == 0
    }

    fn stream_capturing(&self, stream: u64) -> bool {
        self.capture_status(stream) == Some(true)
    }

    fn synchronize_stream(&self, stream: u64) -> Result<(), i64> {
        // A capturing stream is not waited for (that would end its capture), nor one the
        // driver cannot say of; natively a copy of pageable memory there fails, so no program
        // depends on it.
        if self.capture_status(stream) != Some(false) {
            return Ok(());
        }
        // SAFETY: a stream of the session (or a special stream handle), which the copy just used.
        match unsafe { (self.module_api.stream_synchronize)(stream) } {
            0 => Ok(()),
            rc => Err(i64::from(rc)),
        }
    }

    fn unmap_host(&self, base: u64) {
        let api = &self.module_api;
        // SAFETY: `base` was registered by map_host.
        let rc = api.relaxed(|| unsafe { (api.host_unregister)(base as *mut c_void) });
        if rc != 0 {
            tracing::warn!("cudaHostUnregister at {base:#x} failed with status {rc}");
        }
    }

    unsafe fn invoke(&self, desc: &'static CallDesc, args: &[u64]) -> Result<u64, String> {
        let f = self.symbol(desc)?;
        // The trampoline of the variant's own C signature (crate::adapt hands this backend
        // the variant its library declares).
        let called = match chidori_worker_gen::signature(desc.wire) {
            // SAFETY: `f` is the real function named by the descriptor, of its signature, and
            // `args` are laid out for it.
            0 => unsafe { chidori_worker_gen::invoke(desc.call, f, args) },
            // SAFETY: as above.
            _ => unsafe { chidori_worker_gen::invoke_older(desc.wire, f, args) },
        };
        called.ok_or_else(|| format!("no trampoline for {} with {} arguments", desc.name, args.len()))
    }

    fn server_variant(&self, desc: &'static CallDesc) -> Option<&'static CallDesc> {
        let slot = self.server_variants.get(desc.wire as usize)?;
        *slot.get_or_init(|| {
            let version = match desc.library {
                "cudart" | "driver" => self.layout.clone(),
                other => {
                    // The CUDA versions whose headers the loaded soname serves; the newest.
                    let lib = self.library(other);
                    let file = lib.as_ref().as_ref().ok().and_then(|l| {
                        std::path::Path::new(&l.path).file_name().map(|f| f.to_string_lossy().into_owned())
                    })?;
                    let shims = chidori_cuda::libraries::LIBRARIES.iter().find(|l| l.name == other)?.shims;
                    let shim = shims.iter().find(|s| file.starts_with(s.soname))?;
                    (*shim.versions.last()?).to_owned()
                }
            };
            crate::adapt::variant_of(desc, &version)
        })
    }

    fn function_name(&self, handle: u64, kernel: bool) -> Result<String, (i64, String)> {
        let name = if kernel { "cuKernelGetName" } else { "cuFuncGetName" };
        let f: unsafe extern "C" fn(*mut *const i8, u64) -> i32 = self.driver_fn(name)?;
        let mut p = std::ptr::null();
        // SAFETY: a function of the session and a local out-pointer.
        rc(unsafe { f(&mut p, handle) }, name)?;
        Ok(cstr(p))
    }

    fn graph_list(&self, query: &GraphList) -> Result<NodeList, (i64, String)> {
        self.listed(query)
    }

    fn nccl_last_error(&self, comm: u64) -> Result<String, (i64, String)> {
        // ncclInternalError: the server has no NCCL (the program's own calls were refused).
        const INTERNAL: i64 = chidori_cuda::consts::ncclResult_t::ncclInternalError as i64;
        let lib = self.library("nccl");
        let lib = lib.as_ref().as_ref().map_err(|e| (INTERNAL, e.clone()))?;
        let f: unsafe extern "C" fn(u64) -> *const i8 =
            symbol_as(lib, "ncclGetLastError").map_err(|e| (INTERNAL, e.to_string()))?;
        // SAFETY: a communicator of the session or NULL (NCCL does not read it); the text is
        // NCCL's NUL-terminated buffer, copied at once.
        Ok(cstr(unsafe { f(comm) }))
    }

    fn status_texts(&self, library: &str, function: &str, values: &[i64]) -> Result<Vec<String>, (i64, String)> {
        let lib = self.library(library);
        let lib = lib.as_ref().as_ref().map_err(|e| (NOT_SUPPORTED_RT, e.clone()))?;
        // The caller checked `function` is one of TEXT_FUNCTIONS: the library's error-string
        // function, one status enum (a C int) in, a static NUL-terminated text out.
        let f: unsafe extern "C" fn(i32) -> *const i8 =
            symbol_as(lib, function).map_err(|e| (NOT_SUPPORTED_RT, e.to_string()))?;
        Ok(values
            .iter()
            .map(|&v| match i32::try_from(v) {
                // SAFETY: see above; any int is a valid argument (an unknown value gets the
                // library's own text for it), and the text is copied at once.
                Ok(v) => cstr(unsafe { f(v) }),
                Err(_) => String::new(),
            })
            .collect())
    }

    fn graph_dot(&self, graph: u64, flags: u32) -> Result<String, (i64, String)> {
        let f: unsafe extern "C" fn(u64, *const i8, u32) -> i32 = self.driver_fn("cuGraphDebugDotPrint")?;
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("chidori-graph-{}-{n}.dot", std::process::id()));
        let c_path = std::ffi::CString::new(path.to_string_lossy().into_owned())
            .map_err(|_| (INVALID_VALUE, "a temporary path with a NUL".to_owned()))?;
        // SAFETY: a graph of the session and a NUL-terminated path the worker owns.
        let status = unsafe { f(graph, c_path.as_ptr(), flags) };
        let text = std::fs::read_to_string(&path);
        let _ = std::fs::remove_file(&path);
        rc(status, "cuGraphDebugDotPrint")?;
        text.map_err(|e| (UNKNOWN, format!("reading the graph's dot file: {e}")))
    }

    fn link(&self, request: &LinkRequest) -> Result<LinkResult, (i64, String)> {
        link::run(self, request)
    }

    unsafe fn graph_node(
        &self,
        request: &GraphNode,
        params: &mut [u8],
        layout: &[(u32, u32)],
        host: Option<HostFn>,
    ) -> Result<NodeMade, (i64, String)> {
        let _ = layout;
        let mut made = NodeMade::default();
        let (graph, deps, edges) = match &request.target {
            NodeTarget::Add { graph, dependencies, edge_data } => {
                (*graph, dependencies.as_slice(), edge_data.as_slice())
            }
            _ => (0, &[][..], &[][..]),
        };
        // A kernel's parameters travel as one buffer, as a launch's do.
        let mut size = params.len();
        let mut extra = [
            LAUNCH_PARAM_BUFFER_POINTER as *mut c_void,
            params.as_mut_ptr().cast(),
            LAUNCH_PARAM_BUFFER_SIZE as *mut c_void,
            (&mut size as *mut usize).cast(),
            LAUNCH_PARAM_END as *mut c_void,
        ];
        // The parameters as the driver left them (a conditional node's body graphs are an
        // array it points to from them).
        let add_v2 = |kind: u32, bytes: &[u8], node: &mut u64| -> Result<[u8; 232], (i64, String)> {
            let f: NodeV2Fn = self.driver_fn("cuGraphAddNode_v2")?;
            let mut p = NodeParamsUnion { kind, reserved0: [0; 3], params: [0; 232], reserved2: 0 };
            p.params[..bytes.len()].copy_from_slice(bytes);
            let edge_ptr = if edges.is_empty() { std::ptr::null() } else { edges.as_ptr() };
            // SAFETY: handles of the session, arrays of deps.len() elements, parameters laid
            // out for `kind`.
            rc(unsafe { f(node, graph, deps.as_ptr(), edge_ptr, deps.len(), &mut p) }, "cuGraphAddNode_v2")?;
            Ok(p.params)
        };
        match &request.params {
            NodeParams::Kernel { function, grid, block, shared_mem } => {
                let p = KernelNodeParams {
                    func: *function,
                    grid: *grid,
                    block: *block,
                    shared_mem: *shared_mem,
                    kernel_params: std::ptr::null_mut(),
                    extra: extra.as_mut_ptr(),
                    kern: 0,
                    ctx: 0,
                };
                let raw = (&p as *const KernelNodeParams).cast::<c_void>();
                match &request.target {
                    NodeTarget::Add { .. } if !edges.is_empty() => {
                        // SAFETY: the record's bytes, read as bytes.
                        let bytes =
                            unsafe { std::slice::from_raw_parts(raw.cast::<u8>(), size_of::<KernelNodeParams>()) };
                        let mut node = 0u64;
                        add_v2(NODE_KERNEL, bytes, &mut node)?;
                        made.node = node;
                    }
                    NodeTarget::Add { .. } => {
                        let f: NodeFn = self.driver_fn("cuGraphAddKernelNode_v2")?;
                        // SAFETY: handles of the session; the driver copies the parameters.
                        rc(
                            unsafe { f(&mut made.node, graph, deps.as_ptr(), deps.len(), raw) },
                            "cuGraphAddKernelNode_v2",
                        )?;
                    }
                    NodeTarget::Set { node } => {
                        let f: SetFn = self.driver_fn("cuGraphKernelNodeSetParams_v2")?;
                        // SAFETY: as above.
                        rc(unsafe { f(*node, raw) }, "cuGraphKernelNodeSetParams_v2")?;
                    }
                    NodeTarget::ExecSet { exec, node } => {
                        let f: ExecSetFn = self.driver_fn("cuGraphExecKernelNodeSetParams_v2")?;
                        // SAFETY: as above.
                        rc(unsafe { f(*exec, *node, raw) }, "cuGraphExecKernelNodeSetParams_v2")?;
                    }
                }
            }
            NodeParams::Host { .. } => {
                let host = host.ok_or((INVALID_VALUE, "a host node without its function".to_owned()))?;
                // The node runs on every replay: the closure lives as long as the session.
                let ctx = Box::into_raw(Box::new(HostCtx { keep: true, host })) as *mut c_void;
                let p = HostNodeParams { f: host_trampoline, user_data: ctx };
                let raw = (&p as *const HostNodeParams).cast::<c_void>();
                let status = match &request.target {
                    NodeTarget::Add { .. } => {
                        let f: NodeFn = self.driver_fn("cuGraphAddHostNode")?;
                        // SAFETY: handles of the session; the trampoline owns `ctx`.
                        unsafe { f(&mut made.node, graph, deps.as_ptr(), deps.len(), raw) }
                    }
                    NodeTarget::Set { node } => {
                        let f: SetFn = self.driver_fn("cuGraphHostNodeSetParams")?;
                        // SAFETY: as above.
                        unsafe { f(*node, raw) }
                    }
                    NodeTarget::ExecSet { exec, node } => {
                        let f: ExecSetFn = self.driver_fn("cuGraphExecHostNodeSetParams")?;
                        // SAFETY: as above.
                        unsafe { f(*exec, *node, raw) }
                    }
                };
                if status != 0 {
                    // SAFETY: ctx came from Box::into_raw above and the driver refused it.
                    drop(unsafe { Box::from_raw(ctx as *mut HostCtx) });
                }
                rc(status, "a host node")?;
            }
            NodeParams::Conditional { handle, kind, size } => {
                if !matches!(request.target, NodeTarget::Add { .. }) {
                    return Err((NOT_SUPPORTED_RT, "a conditional node's parameters cannot change".into()));
                }
                let ctx = self.current_context()?;
                // CUDA_CONDITIONAL_NODE_PARAMS: handle, type, size, phGraph_out (which the
                // driver sets to an array of its own), ctx.
                let mut bytes = Vec::with_capacity(32);
                bytes.extend_from_slice(&handle.to_le_bytes());
                bytes.extend_from_slice(&kind.to_le_bytes());
                bytes.extend_from_slice(&size.to_le_bytes());
                bytes.extend_from_slice(&0u64.to_le_bytes());
                bytes.extend_from_slice(&ctx.to_le_bytes());
                let mut node = 0u64;
                let after = add_v2(NODE_CONDITIONAL, &bytes, &mut node)?;
                let mut at = [0u8; 8];
                at.copy_from_slice(&after[16..24]);
                let bodies = u64::from_le_bytes(at) as *const u64;
                if bodies.is_null() {
                    return Err((INVALID_VALUE, "the driver made a conditional node without body graphs".into()));
                }
                made.node = node;
                // SAFETY: the driver's array of `size` body graphs, valid while the node is.
                made.graphs = unsafe { std::slice::from_raw_parts(bodies, *size as usize) }.to_vec();
            }
            NodeParams::MemAlloc { alloc_type, location, max_size, access, bytesize } => {
                if !matches!(request.target, NodeTarget::Add { .. }) || !edges.is_empty() {
                    return Err((NOT_SUPPORTED_RT, "a memory allocation node is only made, without edge data".into()));
                }
                let descs: Vec<[i32; 3]> =
                    access.iter().map(|(t, id, flags)| [*t as i32, *id, *flags as i32]).collect();
                let mut p = MemAllocNodeParams {
                    alloc_type: *alloc_type,
                    handle_types: 0,
                    location: [location.0 as i32, location.1],
                    win32_security_attributes: std::ptr::null_mut(),
                    max_size: *max_size as usize,
                    usage: 0,
                    reserved: [0; 54],
                    access_descs: descs.as_ptr(),
                    access_desc_count: descs.len(),
                    bytesize: *bytesize as usize,
                    dptr: 0,
                };
                let f: unsafe extern "C" fn(*mut u64, u64, *const u64, usize, *mut MemAllocNodeParams) -> i32 =
                    self.driver_fn("cuGraphAddMemAllocNode")?;
                // SAFETY: handles of the session; the access descriptors outlive the call.
                rc(unsafe { f(&mut made.node, graph, deps.as_ptr(), deps.len(), &mut p) }, "cuGraphAddMemAllocNode")?;
                made.address = p.dptr;
            }
            NodeParams::BatchMemOp { ctx, count, flags } => {
                if !edges.is_empty() {
                    return Err((NOT_SUPPORTED_RT, "a batch memory operation node is made without edge data".into()));
                }
                let ctx = if *ctx == 0 { self.current_context()? } else { *ctx };
                // The operations (checked and renamed by the session) are `params`; the
                // driver copies them into the node.
                let p = BatchMemOpNodeParams { ctx, count: *count, ops: params.as_mut_ptr().cast(), flags: *flags };
                let raw = (&p as *const BatchMemOpNodeParams).cast::<c_void>();
                match &request.target {
                    NodeTarget::Add { .. } => {
                        let f: NodeFn = self.driver_fn("cuGraphAddBatchMemOpNode")?;
                        // SAFETY: handles of the session, operations naming its memory.
                        rc(
                            unsafe { f(&mut made.node, graph, deps.as_ptr(), deps.len(), raw) },
                            "cuGraphAddBatchMemOpNode",
                        )?;
                    }
                    NodeTarget::Set { node } => {
                        let f: SetFn = self.driver_fn("cuGraphBatchMemOpNodeSetParams")?;
                        // SAFETY: as above.
                        rc(unsafe { f(*node, raw) }, "cuGraphBatchMemOpNodeSetParams")?;
                    }
                    NodeTarget::ExecSet { exec, node } => {
                        let f: ExecSetFn = self.driver_fn("cuGraphExecBatchMemOpNodeSetParams")?;
                        // SAFETY: as above.
                        rc(unsafe { f(*exec, *node, raw) }, "cuGraphExecBatchMemOpNodeSetParams")?;
                    }
                }
            }
        }
        Ok(made)
    }

    fn host_fn(&self, desc: &'static CallDesc, stream: u64, host: HostFn) -> Result<u64, String> {
        // Enqueued while the stream is capturing, the function becomes a host node of a
        // graph and runs on every replay: it must outlive this call (it is kept until the
        // session ends; graphs do not tell when they are destroyed).
        let per_thread = desc.name.ends_with("_ptsz");
        let keep = self.capturing(stream, per_thread);
        let ctx = Box::into_raw(Box::new(HostCtx { keep, host })) as *mut c_void;
        let base = chidori_protocol::desc::strip_suffixes(desc.name, &["_ptsz"]);
        let status = match base {
            "cudaStreamAddCallback" | "cuStreamAddCallback" => {
                let lib = if desc.library == "driver" { &self.driver } else { &self.cudart };
                let f = lib.symbol(desc.name).ok_or_else(|| format!("no {}", desc.name))?;
                // SAFETY: the documented signature, the runtime's and the driver's alike; the
                // trampoline owns `ctx` from here on.
                let f: unsafe extern "C" fn(u64, unsafe extern "C" fn(u64, u32, *mut c_void), *mut c_void, u32) -> u32 =
                    unsafe { std::mem::transmute(f) };
                unsafe { f(stream, stream_callback, ctx, 0) }
            }
            _ => {
                let lib = if desc.library == "driver" { &self.driver } else { &self.cudart };
                // The _v2 forms (CUDA 13.5) add how CUDA's thread waits for the function: the
                // client's function is a round trip away, where waiting blocked is right.
                let name = desc.name.replacen("_v2", "", 1);
                let f = lib.symbol(&name).ok_or_else(|| format!("no {name}"))?;
                // SAFETY: cudaLaunchHostFunc and cuLaunchHostFunc share this signature.
                let f: unsafe extern "C" fn(u64, unsafe extern "C" fn(*mut c_void), *mut c_void) -> u32 =
                    unsafe { std::mem::transmute(f) };
                unsafe { f(stream, host_trampoline, ctx) }
            }
        };
        if status != 0 {
            // The function was not enqueued: reclaim the closure.
            // SAFETY: ctx came from Box::into_raw above and was not handed to the library.
            drop(unsafe { Box::from_raw(ctx as *mut HostCtx) });
        }
        Ok(u64::from(status))
    }

    fn user_object(
        &self,
        desc: &'static CallDesc,
        out: u64,
        refcount: u32,
        flags: u32,
        destroy: HostFn,
    ) -> Result<u64, String> {
        let lib = if desc.library == "driver" { &self.driver } else { &self.cudart };
        let f = lib.symbol(desc.name).ok_or_else(|| format!("no {}", desc.name))?;
        // Run once, when the driver releases the object: not kept.
        let ctx = Box::into_raw(Box::new(HostCtx { keep: false, host: destroy })) as *mut c_void;
        // SAFETY: cudaUserObjectCreate and cuUserObjectCreate share this signature; `out` is
        // the worker's 8-byte buffer for the handle; the trampoline owns `ctx` from here on.
        let status = unsafe {
            let f: unsafe extern "C" fn(*mut u64, *mut c_void, unsafe extern "C" fn(*mut c_void), u32, u32) -> u32 =
                std::mem::transmute(f);
            f(out as *mut u64, ctx, host_trampoline, refcount, flags)
        };
        if status != 0 {
            // No object was made: reclaim the closure.
            // SAFETY: ctx came from Box::into_raw above and the driver did not keep it.
            drop(unsafe { Box::from_raw(ctx as *mut HostCtx) });
        }
        Ok(u64::from(status))
    }
}

/// CUDA_KERNEL_NODE_PARAMS (v2 and v3: 72 bytes from CUDA 12.0 to 13.1).
#[repr(C)]
struct KernelNodeParams {
    func: u64,
    grid: [u32; 3],
    block: [u32; 3],
    shared_mem: u32,
    kernel_params: *mut *mut c_void,
    extra: *mut *mut c_void,
    kern: u64,
    ctx: u64,
}

/// CUDA_HOST_NODE_PARAMS.
#[repr(C)]
struct HostNodeParams {
    f: unsafe extern "C" fn(*mut c_void),
    user_data: *mut c_void,
}

/// CUDA_MEM_ALLOC_NODE_PARAMS: a CUmemPoolProps (88 bytes), the access descriptors, the
/// size, and the address the driver writes.
#[repr(C)]
struct MemAllocNodeParams {
    alloc_type: u32,
    handle_types: u32,
    location: [i32; 2],
    win32_security_attributes: *mut c_void,
    max_size: usize,
    usage: u16,
    reserved: [u8; 54],
    access_descs: *const [i32; 3],
    access_desc_count: usize,
    bytesize: usize,
    dptr: u64,
}

/// CUDA_BATCH_MEM_OP_NODE_PARAMS (v1 and v2 alike).
#[repr(C)]
struct BatchMemOpNodeParams {
    ctx: u64,
    count: u32,
    ops: *mut c_void,
    flags: u32,
}

/// CUgraphNodeParams: the type at 0, the type's parameters at 16, 256 bytes in all.
#[repr(C, align(8))]
struct NodeParamsUnion {
    kind: u32,
    reserved0: [u32; 3],
    params: [u8; 232],
    reserved2: i64,
}

const _: () = {
    assert!(size_of::<KernelNodeParams>() == 72);
    assert!(std::mem::offset_of!(KernelNodeParams, kernel_params) == 40);
    assert!(size_of::<HostNodeParams>() == 16);
    assert!(size_of::<MemAllocNodeParams>() == 120);
    assert!(std::mem::offset_of!(MemAllocNodeParams, access_descs) == 88);
    assert!(size_of::<NodeParamsUnion>() == 256);
    assert!(size_of::<BatchMemOpNodeParams>() == 32);
    assert!(std::mem::offset_of!(BatchMemOpNodeParams, flags) == 24);
};

const NODE_KERNEL: u32 = chidori_cuda::consts::CUgraphNodeType_enum::CU_GRAPH_NODE_TYPE_KERNEL;
const NODE_CONDITIONAL: u32 = chidori_cuda::consts::CUgraphNodeType_enum::CU_GRAPH_NODE_TYPE_CONDITIONAL;
/// CU_LAUNCH_PARAM_END, CU_LAUNCH_PARAM_BUFFER_POINTER, CU_LAUNCH_PARAM_BUFFER_SIZE: the
/// header's macros (pointer values, no enum), so not among the generated constants.
const LAUNCH_PARAM_END: usize = 0;
const LAUNCH_PARAM_BUFFER_POINTER: usize = 1;
const LAUNCH_PARAM_BUFFER_SIZE: usize = 2;

type NodeFn = unsafe extern "C" fn(*mut u64, u64, *const u64, usize, *const c_void) -> i32;
type NodeV2Fn = unsafe extern "C" fn(*mut u64, u64, *const u64, *const u64, usize, *mut NodeParamsUnion) -> i32;
type SetFn = unsafe extern "C" fn(u64, *const c_void) -> i32;
type ExecSetFn = unsafe extern "C" fn(u64, u64, *const c_void) -> i32;
type ListFn = unsafe extern "C" fn(u64, *mut u64, *mut usize) -> i32;
type EdgeListFn = unsafe extern "C" fn(u64, *mut u64, *mut u64, *mut usize) -> i32;
type EdgesFn = unsafe extern "C" fn(u64, *mut u64, *mut u64, *mut u64, *mut usize) -> i32;
type CaptureInfoFn =
    unsafe extern "C" fn(u64, *mut u32, *mut u64, *mut u64, *mut *const u64, *mut *const u64, *mut usize) -> i32;

fn rc(status: i32, what: &str) -> Result<(), (i64, String)> {
    if status == 0 { Ok(()) } else { Err((i64::from(status), format!("{what} failed with status {status}"))) }
}

impl Real {
    /// Whether `stream` (a stream of the session or a special stream's value) is capturing;
    /// None where the driver cannot say (the legacy stream while another captures).
    fn capture_status(&self, stream: u64) -> Option<bool> {
        let mut status = 0u32;
        let none = chidori_cuda::consts::CUstreamCaptureStatus_enum::CU_STREAM_CAPTURE_STATUS_NONE;
        // SAFETY: a stream value and a local out-value.
        (unsafe { (self.module_api.stream_is_capturing)(stream, &mut status) } == 0).then_some(status != none)
    }

    /// A driver function by name, typed by the caller.
    fn driver_fn<F: Copy>(&self, name: &str) -> Result<F, (i64, String)> {
        symbol_as(&self.driver, name).map_err(|e| (NOT_SUPPORTED_RT, e.to_string()))
    }

    /// Ask a node-array function twice: for the count, then for the arrays.
    fn listed(&self, query: &GraphList) -> Result<NodeList, (i64, String)> {
        let mut out = NodeList::default();
        match *query {
            GraphList::Nodes { graph } | GraphList::RootNodes { graph } => {
                let name =
                    if matches!(query, GraphList::Nodes { .. }) { "cuGraphGetNodes" } else { "cuGraphGetRootNodes" };
                let f: ListFn = self.driver_fn(name)?;
                let mut n = 0usize;
                // SAFETY (block): a graph of the session; the array holds n nodes.
                unsafe {
                    rc(f(graph, std::ptr::null_mut(), &mut n), name)?;
                    out.nodes = vec![0; n];
                    rc(f(graph, out.nodes.as_mut_ptr(), &mut n), name)?;
                }
                out.nodes.truncate(n);
            }
            GraphList::Edges { graph } => {
                let f: EdgesFn = self.driver_fn("cuGraphGetEdges_v2")?;
                let mut n = 0usize;
                let null = std::ptr::null_mut();
                // SAFETY (block): as above, three arrays of n elements.
                unsafe {
                    rc(f(graph, null, null, null, &mut n), "cuGraphGetEdges_v2")?;
                    out.nodes = vec![0; n];
                    out.peers = vec![0; n];
                    out.edge_data = vec![0; n];
                    let (from, to, data) = (out.nodes.as_mut_ptr(), out.peers.as_mut_ptr(), out.edge_data.as_mut_ptr());
                    rc(f(graph, from, to, data, &mut n), "cuGraphGetEdges_v2")?;
                }
                out.nodes.truncate(n);
                out.peers.truncate(n);
                out.edge_data.truncate(n);
            }
            GraphList::Dependencies { node } | GraphList::Dependents { node } => {
                let name = if matches!(query, GraphList::Dependencies { .. }) {
                    "cuGraphNodeGetDependencies_v2"
                } else {
                    "cuGraphNodeGetDependentNodes_v2"
                };
                let f: EdgeListFn = self.driver_fn(name)?;
                let mut n = 0usize;
                let null = std::ptr::null_mut();
                // SAFETY (block): a node of the session; two arrays of n elements.
                unsafe {
                    rc(f(node, null, null, &mut n), name)?;
                    out.nodes = vec![0; n];
                    out.edge_data = vec![0; n];
                    rc(f(node, out.nodes.as_mut_ptr(), out.edge_data.as_mut_ptr(), &mut n), name)?;
                }
                out.nodes.truncate(n);
                out.edge_data.truncate(n);
            }
            GraphList::Capture { stream } => {
                let f: CaptureInfoFn = self.driver_fn("cuStreamGetCaptureInfo_v3")?;
                let (mut status, mut id, mut graph, mut n) = (0u32, 0u64, 0u64, 0usize);
                let (mut deps, mut edges): (*const u64, *const u64) = (std::ptr::null(), std::ptr::null());
                // SAFETY: locals as out-pointers; the driver's arrays hold n elements and
                // stay valid until the next capture call on this thread, after the copy.
                unsafe {
                    rc(
                        f(stream, &mut status, &mut id, &mut graph, &mut deps, &mut edges, &mut n),
                        "cuStreamGetCaptureInfo_v3",
                    )?;
                    if !deps.is_null() {
                        out.nodes = std::slice::from_raw_parts(deps, n).to_vec();
                    }
                    if !edges.is_null() {
                        out.edge_data = std::slice::from_raw_parts(edges, n).to_vec();
                    }
                }
                out.capture = Some((status, id, graph));
            }
            // The session asks it as the graph's nodes.
            GraphList::Ended { .. } => {
                return Err((INVALID_VALUE, "a capture's end is the session's to look up".into()));
            }
        }
        // Edge data that is all default says nothing: leave it out.
        if out.edge_data.iter().all(|e| *e == 0) {
            out.edge_data.clear();
        }
        Ok(out)
    }

    /// The current context (a conditional node runs in the context that made its handle).
    fn current_context(&self) -> Result<u64, (i64, String)> {
        let f: unsafe extern "C" fn(*mut u64) -> i32 = self.driver_fn("cuCtxGetCurrent")?;
        let mut ctx = 0u64;
        // SAFETY: a local out-value.
        rc(unsafe { f(&mut ctx) }, "cuCtxGetCurrent")?;
        Ok(ctx)
    }

    /// Whether `stream` is capturing (cudaStreamIsCapturing; false when it cannot tell).
    fn capturing(&self, stream: u64, per_thread: bool) -> bool {
        let name = if per_thread { "cudaStreamIsCapturing_ptsz" } else { "cudaStreamIsCapturing" };
        let Some(f) = self.cudart.symbol(name) else { return false };
        // SAFETY: cudaError_t cudaStreamIsCapturing(cudaStream_t, cudaStreamCaptureStatus*).
        let f: unsafe extern "C" fn(u64, *mut u32) -> u32 = unsafe { std::mem::transmute(f) };
        let mut status = 0u32;
        // SAFETY: a stream handle the session checked and a local out-value.
        let rc = unsafe { f(stream, &mut status) };
        rc == 0 && status != 0
    }
}

/// Clients answer nvmlInit themselves: the worker initializes NVML when it first loads it
/// (and never shuts it down; the process ends with the session).
fn init_nvml(lib: &Library) {
    let Some(f) = lib.symbol("nvmlInit_v2") else { return };
    // SAFETY: nvmlReturn_t nvmlInit_v2(void).
    let f: unsafe extern "C" fn() -> u32 = unsafe { std::mem::transmute(f) };
    // SAFETY: no arguments.
    let rc = unsafe { f() };
    if rc != 0 {
        tracing::warn!("nvmlInit_v2 failed with status {rc}: NVML calls will fail");
    }
}

/// A host function handed to the CUDA library, with whether it lives in a graph.
struct HostCtx {
    keep: bool,
    host: HostFn,
}

/// Run the host function of `ctx`; free it unless a graph may run it again.
///
/// # Safety
/// `ctx` is a `HostCtx` from `Real::host_fn`; unless `keep`, this is its last use.
unsafe fn run_host(ctx: *mut c_void, status: i64) {
    // SAFETY: per the contract, ctx is a live HostCtx.
    let keep = unsafe { (*(ctx as *const HostCtx)).keep };
    if keep {
        // SAFETY: a kept HostCtx is never freed while the session lives.
        let host = unsafe { &*(ctx as *const HostCtx) };
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (host.host)(status, true)));
    } else {
        // SAFETY: not kept: enqueued once, consumed here exactly once.
        let host = unsafe { Box::from_raw(ctx as *mut HostCtx) };
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (host.host)(status, false)));
    }
}

unsafe extern "C" fn host_trampoline(ctx: *mut c_void) {
    // SAFETY: ctx is the HostCtx enqueued by host_fn.
    unsafe { run_host(ctx, 0) }
}

unsafe extern "C" fn stream_callback(_stream: u64, status: u32, ctx: *mut c_void) {
    // SAFETY: as host_trampoline.
    unsafe { run_host(ctx, i64::from(status)) }
}

/// The JIT linker: the client's numeric options with the worker's own log buffers, each input
/// added from the request, the linked image copied out before the state is destroyed.
mod link {
    use std::ffi::c_void;

    use chidori_cuda::consts::CUjit_option_enum as jit;
    use chidori_protocol::messages::{LinkRequest, LinkResult};

    use super::Real;

    /// Options whose values are numbers (never pointers the worker would follow).
    const NUMERIC: &[u32] = &[
        jit::CU_JIT_MAX_REGISTERS,
        jit::CU_JIT_THREADS_PER_BLOCK,
        jit::CU_JIT_OPTIMIZATION_LEVEL,
        jit::CU_JIT_TARGET_FROM_CUCONTEXT,
        jit::CU_JIT_TARGET,
        jit::CU_JIT_FALLBACK_STRATEGY,
        jit::CU_JIT_GENERATE_DEBUG_INFO,
        jit::CU_JIT_LOG_VERBOSE,
        jit::CU_JIT_GENERATE_LINE_INFO,
        jit::CU_JIT_CACHE_MODE,
        jit::CU_JIT_FAST_COMPILE,
        jit::CU_JIT_LTO,
        jit::CU_JIT_FTZ,
        jit::CU_JIT_PREC_DIV,
        jit::CU_JIT_PREC_SQRT,
        jit::CU_JIT_FMA,
        jit::CU_JIT_OPTIMIZE_UNUSED_DEVICE_VARIABLES,
        jit::CU_JIT_POSITION_INDEPENDENT_CODE,
        jit::CU_JIT_MIN_CTA_PER_SM,
        jit::CU_JIT_MAX_THREADS_PER_BLOCK,
        jit::CU_JIT_OVERRIDE_DIRECTIVE_VALUES,
        jit::CU_JIT_SPLIT_COMPILE,
        jit::CU_JIT_BINARY_LOADER_THREAD_COUNT,
    ];

    /// Bytes of each log the worker collects.
    const LOG: usize = 1 << 16;

    type Create = unsafe extern "C" fn(u32, *mut u32, *mut *mut c_void, *mut u64) -> i32;
    type AddData =
        unsafe extern "C" fn(u64, u32, *mut c_void, usize, *const i8, u32, *mut u32, *mut *mut c_void) -> i32;
    type Complete = unsafe extern "C" fn(u64, *mut *mut c_void, *mut usize) -> i32;
    type Destroy = unsafe extern "C" fn(u64) -> i32;

    fn text(log: &[u8]) -> Vec<u8> {
        log[..log.iter().position(|b| *b == 0).unwrap_or(log.len())].to_vec()
    }

    pub fn run(real: &Real, request: &LinkRequest) -> Result<LinkResult, (i64, String)> {
        let create: Create = real.driver_fn("cuLinkCreate_v2")?;
        let add: AddData = real.driver_fn("cuLinkAddData_v2")?;
        let complete: Complete = real.driver_fn("cuLinkComplete")?;
        let destroy: Destroy = real.driver_fn("cuLinkDestroy")?;
        let mut info = vec![0u8; LOG];
        let mut error = vec![0u8; LOG];
        let mut keys = Vec::new();
        let mut values: Vec<*mut c_void> = Vec::new();
        for (key, value) in request.options.iter().filter(|(k, _)| NUMERIC.contains(k)) {
            keys.push(*key);
            values.push(*value as usize as *mut c_void);
        }
        let wall_slot = keys.len();
        for (key, value) in [
            (jit::CU_JIT_WALL_TIME, std::ptr::null_mut()),
            (jit::CU_JIT_INFO_LOG_BUFFER, info.as_mut_ptr().cast()),
            (jit::CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES, LOG as *mut c_void),
            (jit::CU_JIT_ERROR_LOG_BUFFER, error.as_mut_ptr().cast()),
            (jit::CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES, LOG as *mut c_void),
        ] {
            keys.push(key);
            values.push(value);
        }
        let mut result = LinkResult::default();
        let mut state = 0u64;
        // SAFETY: option arrays of keys.len() elements whose buffers outlive the state.
        let status = unsafe { create(keys.len() as u32, keys.as_mut_ptr(), values.as_mut_ptr(), &mut state) };
        if status != 0 {
            result.status = i64::from(status);
            return Ok(result);
        }
        for (kind, name, data) in &request.inputs {
            let name = std::ffi::CString::new(name.as_str()).unwrap_or_default();
            let mut bytes = data.clone();
            // SAFETY: the input's bytes, copied by the linker; no per-input options.
            let status = unsafe {
                add(
                    state,
                    *kind,
                    bytes.as_mut_ptr().cast(),
                    bytes.len(),
                    name.as_ptr(),
                    0,
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                )
            };
            if status != 0 {
                result.status = i64::from(status);
                break;
            }
        }
        if result.status == 0 {
            let (mut image, mut size): (*mut c_void, usize) = (std::ptr::null_mut(), 0);
            // SAFETY: out-values; the image is the linker's until the state is destroyed.
            let status = unsafe { complete(state, &mut image, &mut size) };
            result.status = i64::from(status);
            if status == 0 && !image.is_null() {
                // SAFETY: as above: `size` bytes at `image`.
                result.image = unsafe { std::slice::from_raw_parts(image as *const u8, size) }.to_vec();
            }
        }
        result.wall_ms = f32::from_bits(values[wall_slot] as usize as u32);
        // SAFETY: the state made above.
        unsafe { destroy(state) };
        result.info_log = text(&info);
        result.error_log = text(&error);
        Ok(result)
    }
}
