//! The real backend: NVIDIA's libraries, loaded at run time, called with the client's
//! arguments through the generated typed trampolines.

use std::collections::HashMap;
use std::ffi::c_void;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

use anyhow::{Context, Result, bail};
use chidori_cuda::calls::VARIANTS;
use chidori_protocol::desc::CallDesc;
use chidori_protocol::messages::{Device, GraphLoop, KernelInfo, Launch};

use crate::backend::{Backend, HostFn, LOOP_SLOTS, LoopDevice, LoopEnd, run_loop};
use crate::loader::{self, Library};

pub struct Real {
    dirs: Vec<PathBuf>,
    driver: Library,
    cudart: Library,
    libraries: Mutex<HashMap<String, Arc<Result<Library, String>>>>,
    symbols: Vec<OnceLock<Option<usize>>>,
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
    kernel_get_function: unsafe extern "C" fn(*mut u64, u64) -> CuResult,
    kernel_get_name: unsafe extern "C" fn(*mut *const i8, u64) -> CuResult,
    func_get_param_info: unsafe extern "C" fn(u64, usize, *mut usize, *mut usize) -> CuResult,
    launch_kernel_ex: unsafe extern "C" fn(*const LaunchConfig, u64, *mut *mut c_void, *mut *mut c_void) -> CuResult,
    rt_free: unsafe extern "C" fn(*mut c_void) -> u32,
    host_register: unsafe extern "C" fn(*mut c_void, usize, u32) -> u32,
    host_unregister: unsafe extern "C" fn(*mut c_void) -> u32,
    host_get_device_pointer: unsafe extern "C" fn(*mut *mut c_void, *mut c_void, u32) -> u32,
}

/// cudaErrorNotSupported.
const NOT_SUPPORTED_RT: i64 = 801;

/// The runtime functions a graph-replay loop calls.
struct LoopApi {
    graph_launch: unsafe extern "C" fn(u64, u64) -> u32,
    memcpy_async: unsafe extern "C" fn(*mut c_void, *const c_void, usize, u32, u64) -> u32,
    event_create: unsafe extern "C" fn(*mut u64, u32) -> u32,
    event_record: unsafe extern "C" fn(u64, u64) -> u32,
    event_synchronize: unsafe extern "C" fn(u64) -> u32,
    event_destroy: unsafe extern "C" fn(u64) -> u32,
    stream_synchronize: unsafe extern "C" fn(u64) -> u32,
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

/// cudaMemcpyDeviceToHost.
const D2H: u32 = 2;

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

    fn drain(&mut self) -> Result<(), i64> {
        // SAFETY: the session's stream.
        status(unsafe { (self.api.stream_synchronize)(self.request.stream) })
    }
}

/// cudaHostRegisterPortable | cudaHostRegisterMapped: every context may address it.
const HOST_REGISTER_PORTABLE_MAPPED: u32 = 1 | 2;

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

const _: () = {
    assert!(size_of::<LaunchConfig>() == 56);
    assert!(std::mem::offset_of!(LaunchConfig, stream) == 32);
    assert!(size_of::<LaunchAttribute>() == 72);
};

/// CU_LAUNCH_ATTRIBUTE_COOPERATIVE.
const ATTRIBUTE_COOPERATIVE: u32 = 2;

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
    const { assert!(size_of::<F>() == size_of::<*const c_void>()) };
    let p = lib.symbol(name).with_context(|| format!("{} lacks {name}", lib.path))?;
    // SAFETY: F is a function pointer type (same size, checked above) whose C signature the
    // caller states in its field declaration, matching the CUDA headers of every version.
    Ok(unsafe { std::mem::transmute_copy::<*const c_void, F>(&p) })
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
            kernel_get_function: fn_ptr!(driver, "cuKernelGetFunction", _),
            kernel_get_name: fn_ptr!(driver, "cuKernelGetName", _),
            func_get_param_info: fn_ptr!(driver, "cuFuncGetParamInfo", _),
            launch_kernel_ex: fn_ptr!(driver, "cuLaunchKernelEx", _),
            rt_free: symbol_as(&cudart, "cudaFree")?,
            host_register: symbol_as(&cudart, "cudaHostRegister")?,
            host_unregister: symbol_as(&cudart, "cudaHostUnregister")?,
            host_get_device_pointer: symbol_as(&cudart, "cudaHostGetDevicePointer")?,
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

    fn layout_version(&self, _library: &str) -> Option<String> {
        Some(self.layout.clone())
    }

    fn thread_init(&self) {
        // The runtime's primary context becomes current on this thread, as cudart does on a
        // program's threads: kernels and driver calls of this client thread run in it.
        // SAFETY: cudaFree(NULL) only initializes.
        unsafe { (self.module_api.rt_free)(std::ptr::null_mut()) };
    }

    fn load_module(&self, image: &[u8]) -> Result<(u64, u64, Vec<KernelInfo>), (i64, String)> {
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
                let mut function = 0u64;
                check((api.kernel_get_function)(&mut function, kernel), "cuKernelGetFunction")?;
                let params = self.function_params(function)?;
                infos.push(KernelInfo { name: cstr(name), handle: function, params });
            }
            Ok((library, module, infos))
        }
    }

    fn global(&self, library: u64, name: &str) -> Result<(u64, u64), (i64, String)> {
        let name = std::ffi::CString::new(name).map_err(|_| (1, "bad symbol name".to_owned()))?;
        let (mut address, mut size) = (0u64, 0usize);
        // SAFETY: out-pointers are locals; name is NUL-terminated.
        let rc = unsafe { (self.module_api.library_get_global)(&mut address, &mut size, library, name.as_ptr()) };
        if rc != 0 {
            return Err((i64::from(rc), format!("cuLibraryGetGlobal failed with status {rc}")));
        }
        Ok((address, size as u64))
    }

    fn function_params(&self, function: u64) -> Result<Vec<(u32, u32)>, (i64, String)> {
        let mut params = Vec::new();
        for i in 0.. {
            let (mut offset, mut size) = (0usize, 0usize);
            // SAFETY: out-pointers are locals; past the last parameter the driver answers
            // CUDA_ERROR_INVALID_VALUE, which ends the list.
            let rc = unsafe { (self.module_api.func_get_param_info)(function, i, &mut offset, &mut size) };
            if rc != 0 {
                break;
            }
            params.push((offset as u32, size as u32));
        }
        Ok(params)
    }

    unsafe fn launch(&self, launch: &Launch, params: &mut [u8], layout: &[(u32, u32)]) -> i64 {
        let mut pointers: Vec<*mut c_void> =
            layout.iter().map(|(offset, _)| params.as_mut_ptr().wrapping_add(*offset as usize).cast()).collect();
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
        let config = LaunchConfig {
            grid: launch.grid,
            block: launch.block,
            shared_mem: launch.shared_mem,
            stream: launch.stream,
            attrs: attrs.as_mut_ptr(),
            num_attrs: attrs.len() as u32,
        };
        // SAFETY: per the contract, the pointers address each parameter inside `params`.
        i64::from(unsafe {
            (self.module_api.launch_kernel_ex)(&config, launch.function, pointers.as_mut_ptr(), std::ptr::null_mut())
        })
    }

    fn graph_loop(&self, request: &GraphLoop, progress: &mut dyn FnMut(u32, &[u8])) -> LoopEnd {
        let failed = |status: i64| LoopEnd { steps: 0, stopped_at: None, status };
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
            // SAFETY: a valid out-pointer; cudaEventDisableTiming.
            let rc = unsafe { (api.event_create)(e, 2) };
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
    }

    fn unmap_host(&self, base: u64) {
        // SAFETY: `base` was registered by map_host.
        let rc = unsafe { (self.module_api.host_unregister)(base as *mut c_void) };
        if rc != 0 {
            tracing::warn!("cudaHostUnregister at {base:#x} failed with status {rc}");
        }
    }

    unsafe fn invoke(&self, desc: &'static CallDesc, args: &[u64]) -> Result<u64, String> {
        let f = self.symbol(desc)?;
        // SAFETY: `f` is the real function named by the descriptor and `args` match it.
        unsafe { chidori_worker_gen::invoke(desc.call, f, args) }
            .ok_or_else(|| format!("no trampoline for {}", desc.name))
    }

    fn host_fn(&self, desc: &'static CallDesc, stream: u64, host: HostFn) -> Result<u64, String> {
        // Enqueued while the stream is capturing, the function becomes a host node of a
        // graph and runs on every replay: it must outlive this call (it is kept until the
        // session ends; graphs do not tell when they are destroyed).
        let per_thread = desc.name.ends_with("_ptsz");
        let keep = self.capturing(stream, per_thread);
        let ctx = Box::into_raw(Box::new(HostCtx { keep, host })) as *mut c_void;
        let base = desc.name.trim_end_matches("_ptsz");
        let status = match base {
            "cudaStreamAddCallback" => {
                let f = self.cudart.symbol(desc.name).ok_or("no cudaStreamAddCallback")?;
                // SAFETY: the documented signature; the trampoline owns `ctx` from here on.
                let f: unsafe extern "C" fn(u64, unsafe extern "C" fn(u64, u32, *mut c_void), *mut c_void, u32) -> u32 =
                    unsafe { std::mem::transmute(f) };
                unsafe { f(stream, stream_callback, ctx, 0) }
            }
            _ => {
                let lib = if desc.library == "driver" { &self.driver } else { &self.cudart };
                let f = lib.symbol(desc.name).ok_or_else(|| format!("no {}", desc.name))?;
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
}

impl Real {
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
