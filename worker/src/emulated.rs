//! The emulated backend, for tests without a GPU: every device query comes from a
//! recorded profile of a real GPU, allocations live in host memory at synthetic device
//! addresses, copies, memsets, streams and events run in order (each stream operation
//! completes when it is issued), and kernel launches answer not-supported. It is a test
//! backend: nothing computes on it.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Mutex;
use std::time::Instant;

use chidori_cuda::consts::{cudaError, cudaStreamCaptureMode, cudnnBackendAttributeType_t, cufftResult_t};
use chidori_protocol::desc::{CallDesc, Form, Wire};
use chidori_protocol::messages::{Device, GraphList, GraphLoop, GraphNode, Launch, LoopCopy};

use crate::backend::{
    Backend, HostFn, KernelHandle, LOOP_SLOTS, LoopDevice, LoopEnd, ModuleKernel, ModuleLoad, NodeList, NodeMade,
    run_loop,
};

mod api;
mod graphs;
mod vmm;

use crate::profile::Profile;
use graphs::Op;

/// Status values shared by the runtime and the driver for what the emulation reports: the
/// runtime's names, and the driver's codes are the same numbers (checked below).
const SUCCESS: u64 = cudaError::cudaSuccess as u64;
const INVALID_VALUE: u64 = cudaError::cudaErrorInvalidValue as u64;
const OUT_OF_MEMORY: u64 = cudaError::cudaErrorMemoryAllocation as u64;
const INVALID_HANDLE: u64 = cudaError::cudaErrorInvalidResourceHandle as u64;
/// cudaErrorIllegalState: an operation in a state that does not allow it.
const ILLEGAL_STATE: u64 = cudaError::cudaErrorIllegalState as u64;
/// cudaErrorSymbolNotFound: a name a module or library does not have.
const NOT_FOUND: u64 = cudaError::cudaErrorSymbolNotFound as u64;
/// cudaErrorNotReady: an event never recorded.
const NOT_READY: u64 = cudaError::cudaErrorNotReady as u64;
const NOT_SUPPORTED: i64 = cudaError::cudaErrorNotSupported as i64;
/// cudaErrorStreamCaptureUnsupported: what the emulated backend cannot record.
const CAPTURE_UNSUPPORTED: u64 = cudaError::cudaErrorStreamCaptureUnsupported as u64;
/// CUDNN_STATUS_BAD_PARAM as cuDNN 9 numbers it, the newest headers' (cuDNN 8's is another
/// number, `consts::v11_8`'s): the emulation answers cuDNN calls as cuDNN 9 does.
const CUDNN_BAD_PARAM: u64 = chidori_cuda::consts::cudnnStatus_t::CUDNN_STATUS_BAD_PARAM as u64;
const _: () = assert!(CUDNN_BAD_PARAM != chidori_cuda::consts::v11_8::cudnnStatus_t::CUDNN_STATUS_BAD_PARAM as u64);
/// cudnnBackendAttributeType_t of the attributes whose elements are handles: cuDNN handles
/// and backend descriptors.
const CUDNN_TYPE_HANDLE: u64 = cudnnBackendAttributeType_t::CUDNN_TYPE_HANDLE as u64;
const CUDNN_TYPE_BACKEND_DESCRIPTOR: u64 = cudnnBackendAttributeType_t::CUDNN_TYPE_BACKEND_DESCRIPTOR as u64;
/// CUSOLVER_STATUS_INVALID_VALUE: what the emulated cuSOLVER refuses.
const CUSOLVER_INVALID_VALUE: u64 = chidori_cuda::consts::cusolverStatus_t::CUSOLVER_STATUS_INVALID_VALUE as u64;
/// CUSPARSE_STATUS_INVALID_VALUE: what the emulated cuSPARSE refuses.
const CUSPARSE_INVALID_VALUE: u64 = chidori_cuda::consts::cusparseStatus_t::CUSPARSE_STATUS_INVALID_VALUE as u64;
const _: () = {
    use chidori_cuda::consts::cudaError_enum as driver;
    assert!(SUCCESS == driver::CUDA_SUCCESS as u64);
    assert!(INVALID_VALUE == driver::CUDA_ERROR_INVALID_VALUE as u64);
    assert!(OUT_OF_MEMORY == driver::CUDA_ERROR_OUT_OF_MEMORY as u64);
    assert!(INVALID_HANDLE == driver::CUDA_ERROR_INVALID_HANDLE as u64);
    assert!(ILLEGAL_STATE == driver::CUDA_ERROR_ILLEGAL_STATE as u64);
    assert!(NOT_FOUND == driver::CUDA_ERROR_NOT_FOUND as u64);
    assert!(NOT_READY == driver::CUDA_ERROR_NOT_READY as u64);
    assert!(NOT_SUPPORTED == driver::CUDA_ERROR_NOT_SUPPORTED as i64);
    assert!(CAPTURE_UNSUPPORTED == driver::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED as u64);
};

/// The calling thread's current context (None: the primary context).
fn current_context() -> Option<u64> {
    CONTEXTS.with(|c| c.borrow().last().copied().flatten())
}

thread_local! {
    /// The calling thread's context stack, current on top (empty or None on top: the primary
    /// context, which the real worker makes current on each executor thread as it starts).
    static CONTEXTS: std::cell::RefCell<Vec<Option<u64>>> = const { std::cell::RefCell::new(Vec::new()) };
    /// The calling thread's stream-capture mode (cudaThreadExchangeStreamCaptureMode).
    static CAPTURE_MODE: std::cell::Cell<u32> =
        const { std::cell::Cell::new(cudaStreamCaptureMode::cudaStreamCaptureModeGlobal) };
}

/// Where synthetic device addresses start: far from where Linux maps host memory.
const DEVICE_BASE: u64 = 0x7e00_0000_0000;
const ALIGN: u64 = 512;
/// Allocation windows (`Backend::window_reserve`): one per device, below the synthetic
/// allocations, in granules of 2 MiB as on the GPUs Chidori serves.
const WINDOW_BASE: u64 = 0x7c00_0000_0000;
const WINDOW_STRIDE: u64 = 1 << 40;
const WINDOW_GRANULARITY: u64 = 2 << 20;

pub struct Emulated {
    profile: Profile,
    state: Mutex<State>,
    /// This backend's number among the process's (from 0): part of the names of the memory it
    /// shares, so that two backends of one process (tests) never name theirs alike.
    instance: u64,
}

#[derive(Default)]
struct State {
    allocations: BTreeMap<u64, Vec<u8>>,
    /// Device memory shared by CUDA IPC, by device address: allocations this worker exported
    /// (their bytes moved here from `allocations`) and handles it opened; and the mapped
    /// pieces of VMM allocations shared as file descriptors (`vmm::Mapping`).
    shared: BTreeMap<u64, SharedRegion>,
    /// Host memory of the worker the GPU may address (map_host): base → length.
    mapped: BTreeMap<u64, u64>,
    /// Graphs, made by capture or call by call, and their executable instances.
    graphs: graphs::Graphs,
    /// Arrays (their bytes are an allocation at the handle's address), texture and surface
    /// objects, memory pools, stream attributes.
    arrays: HashMap<u64, api::ArrayInfo>,
    objects: HashMap<u64, Vec<u8>>,
    pools: HashMap<u64, api::Pool>,
    /// The pool of each allocation made from one.
    pool_of: HashMap<u64, (u64, u64)>,
    /// Addresses graph allocation nodes allocate: kept from the node's making (a launch
    /// natively allocates them again at the same address after a free).
    graph_allocations: HashSet<u64>,
    current_pool: u64,
    stream_attributes: HashMap<(u64, u32), Vec<u8>>,
    /// The worker's pinned staging buffers (`pin_staging`), base → (length, whether a copy
    /// on a stream may still read it): as a GPU's DMA reads pinned memory when the stream
    /// gets there, a copy from one is in flight until a stream synchronization.
    staging: BTreeMap<u64, (u64, bool)>,
    next_object: u64,
    primary_context: Option<u64>,
    next: u64,
    used: u64,
    streams: HashSet<u64>,
    events: HashMap<u64, Option<Instant>>,
    contexts: HashSet<u64>,
    /// cuDNN backend descriptors: (type, finalized).
    descriptors: HashMap<u64, (u64, bool)>,
    cudnn_handles: HashSet<u64>,
    /// Descriptors of cuDNN's legacy API (tensors, RNNs, dropout, ...), of any type.
    legacy: HashSet<u64>,
    /// NCCL communicators (of one rank each), and the reduction operations made on them.
    nccl_comms: HashSet<u64>,
    nccl_ops: HashSet<(u64, u64)>,
    /// ncclGetLastError's text: what the last failing NCCL call said.
    nccl_last_error: String,
    /// Peers whose memory the program enabled access to (cudaDeviceEnablePeerAccess).
    peers: HashSet<i32>,
    /// Tensor descriptors set (or filled by cudnnGetRNNWeightParams): data type, dims, strides.
    tensors: HashMap<u64, (u32, Vec<i32>, Vec<i32>)>,
    /// The hidden size each RNN descriptor was set with (32 where none was).
    rnn_hidden: HashMap<u64, u64>,
    /// cuFFT plans created (handles from 1 on), and whether each was made.
    cufft_plans: HashMap<u64, bool>,
    cufft_created: u64,
    /// The algorithm set on each cuSOLVER parameter set (cusolverDnSetAdvOptions).
    solver_algo: HashMap<u64, u64>,
    /// What each cuSPARSE generic descriptor describes: rows, columns, entries (a dense
    /// vector: its size, 1, its size).
    sparse_shapes: HashMap<u64, (u64, u64, u64)>,
    /// The variables of each loaded library's images (name, initial bytes), and those
    /// asked for, by (library, name): their memory is an allocation.
    variables: HashMap<u64, Vec<(String, Vec<u8>)>>,
    globals: HashMap<(u64, String), (u64, u64)>,
    /// The functions of each loaded module: (name, handle).
    functions: HashMap<u64, Vec<(String, u64)>>,
    /// Each loaded kernel's function (found when first used, as the real driver's are).
    kernel_functions: HashMap<u64, u64>,
    /// Function attributes the program set: (function, attribute) → value.
    function_attributes: HashMap<(u64, u32), i32>,
    /// User objects: references (the program's and graphs') and the destructor, run when
    /// the last one goes; the references each graph holds, released with it.
    user_objects: HashMap<u64, (u64, std::sync::Arc<HostFn>)>,
    graph_user_objects: HashMap<u64, HashMap<u64, u64>>,
    /// The driver's virtual memory management: reserved ranges, physical allocations and
    /// what is mapped where.
    vmm: vmm::Vmm,
    next_handle: u64,
}

impl State {
    fn handle(&mut self) -> u64 {
        self.next_handle += 16;
        0x5e00_0000 + self.next_handle
    }

    /// The `len` bytes at device address `addr`: inside an allocation, or inside host memory
    /// the session mapped for the GPU (a mirror of the client's pinned memory).
    fn find(&mut self, addr: u64, len: u64) -> Option<&mut [u8]> {
        if let Some((&base, &mirror_len)) = self.mapped.range(..=addr).next_back() {
            let offset = addr - base;
            if offset.checked_add(len)? <= mirror_len {
                // SAFETY: the worker mapped [base, base + mirror_len) read-write before
                // map_host recorded it, and unmaps it only after unmap_host forgot it.
                let all = unsafe { std::slice::from_raw_parts_mut(base as *mut u8, mirror_len as usize) };
                return all.get_mut(offset as usize..(offset + len) as usize);
            }
        }
        /// The `len` bytes at `addr` of `bytes`, which start at `base`.
        fn within(bytes: &mut [u8], base: u64, addr: u64, len: u64) -> Option<&mut [u8]> {
            let offset = addr - base;
            let end = offset.checked_add(len)?;
            if end > bytes.len() as u64 {
                return None;
            }
            bytes.get_mut(offset as usize..end as usize)
        }
        let allocated = self.allocations.range_mut(..=addr).next_back().and_then(|(&b, buf)| within(buf, b, addr, len));
        if allocated.is_some() {
            return allocated;
        }
        let (&base, region) = self.shared.range_mut(..=addr).next_back()?;
        within(region.bytes(), base, addr, len)
    }

    /// The base and length of the allocation or shared memory that `addr` lies in.
    fn range_of(&self, addr: u64) -> Option<(u64, u64)> {
        let allocated = self.allocations.range(..=addr).next_back().map(|(&base, buf)| (base, buf.len() as u64));
        let shared = self.shared.range(..=addr).next_back().map(|(&base, region)| (base, region.len));
        [allocated, shared].into_iter().flatten().find(|&(base, len)| addr - base < len)
    }
}

/// Where the names of shared device memory start (`shm_open`'s, and so the handles').
const SHARED_PREFIX: &str = "/chidori-emu-";
/// Where the emulation's IPC event handles start.
const EVENT_PREFIX: &str = "ev-";

/// Device memory shared with another process by CUDA IPC: a POSIX shared memory object
/// mapped into this worker. An exported allocation's bytes move into one this worker makes
/// (`owner`), which it removes when the memory is freed or the backend goes; an opened handle
/// maps the exporting worker's object at an address of this emulation. A mapped piece of a VMM
/// allocation in shared memory is a region too, over its allocation's mapping (`borrows`).
struct SharedRegion {
    /// The mapping's address (a number: a raw pointer would keep the state from being Send).
    ptr: usize,
    len: u64,
    /// The shared memory object's name, as `shm_open` takes it.
    name: String,
    owner: bool,
    /// How many opens of the handle are not yet closed (0 for the owner's region): CUDA
    /// counts them, and unmaps the memory on the last close.
    opens: u32,
    /// For a mapped piece of a VMM allocation (no name, no owner, no opens): the mapping it
    /// is, its allocation's, which the region keeps alive and never unmaps itself.
    borrows: Option<std::sync::Arc<vmm::Mapping>>,
}

impl SharedRegion {
    /// Makes the shared memory object `name`, of the length of `bytes`, with `bytes` in it.
    /// An object left by a process that had this one's id before (it never freed the memory
    /// it exported) is replaced.
    fn create(name: &str, bytes: &[u8]) -> Result<SharedRegion, u64> {
        let c_name = std::ffi::CString::new(name).map_err(|_| INVALID_VALUE)?;
        let len = bytes.len();
        let size = libc::off_t::try_from(len).map_err(|_| OUT_OF_MEMORY)?;
        if len == 0 {
            return Err(INVALID_VALUE);
        }
        let open = || {
            // SAFETY: a NUL-terminated name; the call only makes a file under /dev/shm.
            unsafe { libc::shm_open(c_name.as_ptr(), libc::O_CREAT | libc::O_RDWR | libc::O_EXCL, 0o600) }
        };
        let mut fd = open();
        if fd < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EEXIST) {
            // SAFETY: as above; the name is this process's own, so the object is stale.
            unsafe { libc::shm_unlink(c_name.as_ptr()) };
            fd = open();
        }
        if fd < 0 {
            return Err(OUT_OF_MEMORY);
        }
        // Space reserved now (not only a size set), so that no write through the mapping can
        // find tmpfs full: that would be SIGBUS, not an error.
        // SAFETY: `fd` is the object just opened read-write.
        let ptr = if unsafe { libc::posix_fallocate(fd, 0, size) } == 0 {
            // SAFETY: as above, now `len` bytes long; `map` closes `fd`.
            unsafe { map(fd, len) }
        } else {
            // SAFETY: as above.
            unsafe { close(fd) }
        };
        let Some(ptr) = ptr else {
            // SAFETY: the name of the object made above.
            unsafe { libc::shm_unlink(c_name.as_ptr()) };
            return Err(OUT_OF_MEMORY);
        };
        let mut region =
            SharedRegion { ptr, len: len as u64, name: name.to_owned(), owner: true, opens: 0, borrows: None };
        region.bytes().copy_from_slice(bytes);
        Ok(region)
    }

    /// Maps the shared memory object `name` that another process made.
    fn open(name: &str) -> Option<SharedRegion> {
        let c_name = std::ffi::CString::new(name).ok()?;
        // SAFETY: a NUL-terminated name.
        let fd = unsafe { libc::shm_open(c_name.as_ptr(), libc::O_RDWR, 0) };
        if fd < 0 {
            return None;
        }
        // SAFETY: a zeroed `stat` is a valid value for fstat to overwrite.
        let mut stat: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: `fd` is open; `stat` is ours.
        let size = if unsafe { libc::fstat(fd, &mut stat) } == 0 { stat.st_size } else { 0 };
        let Some(len) = usize::try_from(size).ok().filter(|&len| len > 0) else {
            // SAFETY: `fd` is open.
            return unsafe { close(fd) };
        };
        // SAFETY: `fd` is the object opened read-write above; `map` closes it.
        let ptr = unsafe { map(fd, len) }?;
        Some(SharedRegion { ptr, len: len as u64, name: name.to_owned(), owner: false, opens: 1, borrows: None })
    }

    fn bytes(&mut self) -> &mut [u8] {
        // SAFETY: [ptr, ptr + len) is mapped read-write until the region is dropped (a piece's
        // stays mapped while the region holds its mapping), which the borrow of the region
        // prevents while the slice lives. The other process may write the same bytes meanwhile,
        // as a GPU's other users may: what a read then sees is as unspecified as it is with
        // CUDA IPC.
        unsafe { std::slice::from_raw_parts_mut(self.ptr as *mut u8, self.len as usize) }
    }
}

impl Drop for SharedRegion {
    fn drop(&mut self) {
        // A piece's mapping goes with the last holder of it.
        if self.borrows.is_some() {
            return;
        }
        // SAFETY: the mapping is this region's own, and no slice of it outlives the region.
        unsafe { libc::munmap(self.ptr as *mut libc::c_void, self.len as usize) };
        if self.owner
            && let Ok(name) = std::ffi::CString::new(self.name.as_str())
        {
            // SAFETY: a NUL-terminated name, of the object this worker made.
            unsafe { libc::shm_unlink(name.as_ptr()) };
        }
    }
}

/// Maps `len` bytes of the shared memory object open as `fd`, read-write and shared, and
/// closes `fd` (None where the mapping failed).
///
/// # Safety
/// `fd` must be an open descriptor of an object of at least `len` bytes that the caller
/// gives up.
unsafe fn map(fd: libc::c_int, len: usize) -> Option<usize> {
    // SAFETY: a new mapping, placed by the kernel, of the caller's descriptor.
    let ptr =
        unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd, 0) };
    // SAFETY: the caller gave `fd` up; the mapping keeps the object.
    unsafe { close::<()>(fd) };
    (ptr != libc::MAP_FAILED).then_some(ptr as usize)
}

/// Closes `fd`; None, for the callers that give up.
///
/// # Safety
/// `fd` must be an open descriptor that the caller gives up.
unsafe fn close<T>(fd: libc::c_int) -> Option<T> {
    // SAFETY: per the contract.
    unsafe { libc::close(fd) };
    None
}

/// The name in an IPC handle's 64 bytes: up to the first NUL, starting with `prefix`, the
/// rest digits, hexadecimal digits and dashes (as this emulation writes them). None for any
/// other handle.
fn handle_name(handle: &[u8; 64], prefix: &str) -> Option<String> {
    let end = handle.iter().position(|&b| b == 0)?;
    let name = std::str::from_utf8(&handle[..end]).ok()?;
    let rest = name.strip_prefix(prefix)?;
    let plain = !rest.is_empty() && rest.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-');
    plain.then(|| name.to_owned())
}

/// Writes `name` as a 64-byte IPC handle, zero padded.
///
/// # Safety
/// `out` must be a worker buffer of at least 64 bytes.
unsafe fn put_handle(out: u64, name: &str) {
    let mut handle = [0u8; 64];
    let n = name.len().min(63);
    handle[..n].copy_from_slice(&name.as_bytes()[..n]);
    // SAFETY: per the contract.
    unsafe { std::ptr::copy_nonoverlapping(handle.as_ptr(), out as *mut u8, handle.len()) };
}

impl Emulated {
    /// A host copy that names a pinned staging buffer of the worker's: refused where a copy on a
    /// stream may still read it (the worker filled it again before waiting for that copy);
    /// an asynchronous one leaves it in flight until a stream synchronization.
    fn staging_read(&self, desc: &CallDesc, a: &[u64]) -> Result<(), String> {
        // Only a copy of host bytes names one (other calls take no lock for it).
        if !desc.host_copy() {
            return Ok(());
        }
        let mut state = self.state();
        let asynchronous = desc.name.contains("Async");
        for &word in a {
            let Some((&base, (len, in_flight))) = state.staging.range_mut(..=word).next_back() else { continue };
            if word - base >= *len {
                continue;
            }
            if *in_flight {
                return Err(format!(
                    "{}: a pinned staging buffer is read again while a copy on a stream may still read it",
                    desc.name
                ));
            }
            *in_flight |= asynchronous;
        }
        Ok(())
    }

    pub fn new(profile: Profile) -> Emulated {
        static INSTANCES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let instance = INSTANCES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Emulated { profile, state: Mutex::new(State { next: DEVICE_BASE, ..State::default() }), instance }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn total_mem(&self) -> u64 {
        self.profile.devices.first().map(|d| d.total_mem).unwrap_or(0)
    }

    fn alloc(&self, size: u64) -> Result<u64, u64> {
        let mut s = self.state();
        if s.used.saturating_add(size) > self.total_mem() || size > (64 << 30) {
            return Err(OUT_OF_MEMORY);
        }
        let len = usize::try_from(size).map_err(|_| OUT_OF_MEMORY)?;
        let mut buf = Vec::new();
        buf.try_reserve_exact(len).map_err(|_| OUT_OF_MEMORY)?;
        buf.resize(len, 0);
        let addr = s.next;
        s.next = addr + size.max(1).div_ceil(ALIGN) * ALIGN + ALIGN;
        s.used += size;
        s.allocations.insert(addr, buf);
        Ok(addr)
    }

    fn free(&self, addr: u64) -> u64 {
        if addr == 0 {
            return SUCCESS;
        }
        let mut s = self.state();
        if s.graph_allocations.contains(&addr) {
            return SUCCESS;
        }
        if let Some(buf) = s.allocations.remove(&addr) {
            s.used -= buf.len() as u64;
            return SUCCESS;
        }
        // Memory this worker exported goes as any allocation (its shared memory object with
        // it); memory it opened is closed, never freed (CUDA refuses that too).
        match s.shared.get(&addr) {
            Some(region) if region.owner => {
                let len = region.len;
                s.shared.remove(&addr);
                s.used -= len;
                SUCCESS
            }
            _ => INVALID_VALUE,
        }
    }

    /// `cudaIpcGetMemHandle`: the allocation at `addr` (its base) moves into shared memory,
    /// if it is not there already, and `out` gets the handle that names it.
    ///
    /// # Safety
    /// `out` must be a worker buffer of 64 bytes, or 0.
    unsafe fn ipc_export(&self, out: u64, addr: u64) -> u64 {
        if out == 0 {
            return INVALID_VALUE;
        }
        let mut s = self.state();
        let name = match s.shared.get(&addr) {
            Some(region) if region.owner => region.name.clone(),
            // Memory opened from another process is not exported again.
            Some(_) => return INVALID_VALUE,
            // A mapped piece of a VMM allocation is shared by other means (as natively).
            None if s.vmm.maps(addr) => return INVALID_VALUE,
            None => {
                let Some(bytes) = s.allocations.get(&addr) else { return INVALID_VALUE };
                let name = format!("{SHARED_PREFIX}{}-{}-{addr:x}", std::process::id(), self.instance);
                let region = match SharedRegion::create(&name, bytes) {
                    Ok(region) => region,
                    Err(status) => return status,
                };
                s.allocations.remove(&addr);
                s.shared.insert(addr, region);
                name
            }
        };
        // SAFETY: per the contract.
        unsafe { put_handle(out, &name) };
        SUCCESS
    }

    /// `cudaIpcOpenMemHandle`: the memory another process exported as the 64 bytes at
    /// `handle`, mapped at a new device address (the same one again where this worker has it
    /// open already), written to `out`.
    ///
    /// # Safety
    /// `out` must be a worker buffer of 8 bytes and `handle` one of 64, or 0.
    unsafe fn ipc_open(&self, out: u64, handle: u64, flags: u64) -> u64 {
        // cudaIpcMemLazyEnablePeerAccess is the one flag.
        if out == 0 || handle == 0 || flags & !1 != 0 {
            return INVALID_VALUE;
        }
        // SAFETY: per the contract.
        let bytes = unsafe { std::ptr::read_unaligned(handle as *const [u8; 64]) };
        let Some(name) = handle_name(&bytes, SHARED_PREFIX) else { return INVALID_VALUE };
        let mut s = self.state();
        let addr = match s.shared.iter_mut().find(|(_, region)| region.name == name) {
            // A process cannot open what it exported.
            Some((_, region)) if region.owner => return INVALID_VALUE,
            Some((&addr, region)) => {
                region.opens = region.opens.saturating_add(1);
                addr
            }
            None => {
                let Some(region) = SharedRegion::open(&name) else { return INVALID_VALUE };
                let addr = s.next;
                s.next = addr + region.len.div_ceil(ALIGN) * ALIGN + ALIGN;
                s.shared.insert(addr, region);
                addr
            }
        };
        // SAFETY: per the contract.
        unsafe { put_u64(out, addr) };
        SUCCESS
    }

    /// `cudaIpcCloseMemHandle`: one open of the memory at `addr` undone; the last unmaps it.
    fn ipc_close(&self, addr: u64) -> u64 {
        let mut s = self.state();
        let last = match s.shared.get_mut(&addr) {
            Some(region) if !region.owner && region.borrows.is_none() => {
                region.opens = region.opens.saturating_sub(1);
                region.opens == 0
            }
            _ => return INVALID_VALUE,
        };
        if last {
            s.shared.remove(&addr);
        }
        SUCCESS
    }

    /// Copy `len` bytes; `dst`/`src` are device addresses when the flags say so, else
    /// worker buffers the session allocated for this call.
    ///
    /// # Safety
    /// Host pointers must be valid for `len` bytes.
    unsafe fn copy(&self, dst: u64, dst_device: bool, src: u64, src_device: bool, len: u64) -> u64 {
        if len == 0 {
            return SUCCESS;
        }
        let Ok(n) = usize::try_from(len) else { return INVALID_VALUE };
        let mut s = self.state();
        let data: Vec<u8> = if src_device {
            match s.find(src, len) {
                Some(bytes) => bytes.to_vec(),
                None => return INVALID_VALUE,
            }
        } else {
            // SAFETY: host pointers are the session's buffers of at least `len` bytes.
            unsafe { std::slice::from_raw_parts(src as *const u8, n) }.to_vec()
        };
        if dst_device {
            match s.find(dst, len) {
                Some(bytes) => bytes.copy_from_slice(&data),
                None => return INVALID_VALUE,
            }
        } else {
            // SAFETY: as above, for the destination.
            unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), dst as *mut u8, n) };
        }
        SUCCESS
    }

    fn memset(&self, dst: u64, value: u8, count: u64, width: u64) -> u64 {
        let Some(len) = count.checked_mul(width) else { return INVALID_VALUE };
        let mut s = self.state();
        let Some(bytes) = s.find(dst, len) else { return INVALID_VALUE };
        bytes.fill(value);
        SUCCESS
    }

    fn memset32(&self, dst: u64, value: u32, count: u64) -> u64 {
        let Some(len) = count.checked_mul(4) else { return INVALID_VALUE };
        let mut s = self.state();
        let Some(bytes) = s.find(dst, len) else { return INVALID_VALUE };
        for chunk in bytes.chunks_exact_mut(4) {
            chunk.copy_from_slice(&value.to_le_bytes());
        }
        SUCCESS
    }

    fn new_handle(&self, kind: HandleSet) -> u64 {
        let mut s = self.state();
        let h = s.handle();
        match kind {
            HandleSet::Stream => s.streams.insert(h),
            HandleSet::Event => s.events.insert(h, None).is_none(),
            HandleSet::Context => s.contexts.insert(h),
        };
        h
    }

    /// The device's primary context (made on first use).
    fn primary_context(&self) -> u64 {
        let mut s = self.state();
        if let Some(p) = s.primary_context {
            return p;
        }
        let p = s.handle();
        s.contexts.insert(p);
        s.primary_context = Some(p);
        p
    }

    fn stream_ok(&self, stream: u64) -> bool {
        stream <= 2 || self.state().streams.contains(&stream)
    }

    /// Record `op` if `stream` is being captured: Some(status) when it was (or could not
    /// be), None when the stream runs it now.
    fn captured(&self, stream: u64, op: Option<(u32, Op)>) -> Option<u64> {
        let mut s = self.state();
        s.graphs.capturing(stream)?;
        Some(match op {
            Some((kind, op)) => s.graphs.record(stream, kind, op).unwrap_or(INVALID_VALUE),
            None => CAPTURE_UNSUPPORTED,
        })
    }

    /// Run a graph's operations, in order.
    fn replay(&self, ops: &[Op]) -> u64 {
        for op in ops {
            let status = match op {
                // SAFETY: both sides of a graph's copy are device addresses, looked up in
                // the allocation map.
                Op::Copy { dst, src, len } => unsafe { self.copy(*dst, true, *src, true, *len) },
                Op::Memset { dst, pitch, value, elem, width, height } => {
                    self.memset_2d(*dst, *pitch, *value, *elem, *width, *height)
                }
                Op::Region { dst, src, width, height, depth } => self.copy_region(*dst, *src, *width, *height, *depth),
                Op::Host(f) => {
                    f(0, true);
                    SUCCESS
                }
                Op::Words(words) => self.write_words(words),
                Op::Nothing | Op::Child(_) => SUCCESS,
            };
            if status != SUCCESS {
                return status;
            }
        }
        SUCCESS
    }

    /// Words of device memory set: (address, value, bytes).
    fn write_words(&self, words: &[(u64, u64, u8)]) -> u64 {
        let mut s = self.state();
        for &(at, value, len) in words {
            let Some(bytes) = s.find(at, u64::from(len)) else { return INVALID_VALUE };
            bytes.copy_from_slice(&value.to_le_bytes()[..usize::from(len)]);
        }
        SUCCESS
    }

    /// `height` rows of `width` elements of `elem` bytes set to `value`, `pitch` bytes apart.
    fn memset_2d(&self, dst: u64, pitch: u64, value: u32, elem: u32, width: u64, height: u64) -> u64 {
        let elem = u64::from(elem);
        if !matches!(elem, 1 | 2 | 4) {
            return INVALID_VALUE;
        }
        let Some(row) = width.checked_mul(elem) else { return INVALID_VALUE };
        let mut s = self.state();
        for r in 0..height.max(1) {
            let Some(at) = r.checked_mul(pitch).and_then(|o| dst.checked_add(o)) else { return INVALID_VALUE };
            let Some(bytes) = s.find(at, row) else { return INVALID_VALUE };
            for chunk in bytes.chunks_exact_mut(elem as usize) {
                chunk.copy_from_slice(&value.to_le_bytes()[..elem as usize]);
            }
        }
        SUCCESS
    }

    /// `depth` slices of `height` rows of `width` bytes between device regions.
    fn copy_region(&self, dst: graphs::Region, src: graphs::Region, width: u64, height: u64, depth: u64) -> u64 {
        if width == 0 {
            return SUCCESS;
        }
        // Rows and slices that overlap are invalid natively (and would let a copy loop over
        // the same bytes for as long as the extent says).
        let overlaps = |r: &graphs::Region| {
            (height > 1 && r.pitch < width) || (depth > 1 && r.slice < r.pitch.saturating_mul(height.max(1)))
        };
        if overlaps(&dst) || overlaps(&src) {
            return INVALID_VALUE;
        }
        for z in 0..depth.max(1) {
            for y in 0..height.max(1) {
                let at = |r: &graphs::Region| {
                    z.checked_mul(r.slice)
                        .and_then(|o| o.checked_add(y.checked_mul(r.pitch)?))
                        .and_then(|o| r.addr.checked_add(o))
                };
                let (Some(d), Some(s)) = (at(&dst), at(&src)) else { return INVALID_VALUE };
                // SAFETY: both sides are device addresses, looked up in the allocation map.
                let status = unsafe { self.copy(d, true, s, true, width) };
                if status != SUCCESS {
                    return status;
                }
            }
        }
        SUCCESS
    }
}

enum HandleSet {
    Stream,
    Event,
    Context,
}

/// `CHIDORI_EMULATED_SALT`: another salt, another library. What tests of answers kept from
/// an earlier session change to have the server answer otherwise (0 where unset).
fn salt() -> u64 {
    std::env::var(chidori_protocol::env::EMULATED_SALT).ok().and_then(|v| v.parse().ok()).unwrap_or(0)
}

/// The kernel names of the `.text.<name>` section names in an image, each once, in order.
fn kernel_section_names(image: &[u8]) -> Vec<String> {
    const PREFIX: &[u8] = b".text.";
    let mut names: Vec<String> = Vec::new();
    let mut at = 0;
    while let Some(found) = image.get(at..).and_then(|rest| rest.windows(PREFIX.len()).position(|w| w == PREFIX)) {
        let start = at + found + PREFIX.len();
        let len = image[start..].iter().take_while(|b| b.is_ascii_alphanumeric() || **b == b'_' || **b == b'$').count();
        if len > 0 && image.get(start + len) == Some(&0) {
            let name = String::from_utf8_lossy(&image[start..start + len]).into_owned();
            if !names.contains(&name) {
                names.push(name);
            }
        }
        at = start;
    }
    names
}

/// The data symbols of the ELF images (cubins) inside a module image: name and initial
/// bytes (zeros where the image has none), each at most 64 MiB.
fn data_symbols(image: &[u8]) -> Vec<(String, Vec<u8>)> {
    use object::{Object, ObjectSection, ObjectSymbol, SymbolKind};
    const MAX: u64 = 64 << 20;
    let mut out: Vec<(String, Vec<u8>)> = Vec::new();
    let mut at = 0;
    while let Some(found) = image.get(at..).and_then(|rest| rest.windows(4).position(|w| w == b"\x7fELF")) {
        let start = at + found;
        at = start + 4;
        let Ok(file) = object::File::parse(&image[start..]) else { continue };
        for symbol in file.symbols().filter(|s| s.kind() == SymbolKind::Data && s.size() > 0 && s.size() <= MAX) {
            let Ok(name) = symbol.name() else { continue };
            if out.iter().any(|(n, _)| n == name) {
                continue;
            }
            let mut init = vec![0u8; symbol.size() as usize];
            let data = symbol.section_index().and_then(|i| file.section_by_index(i).ok()).and_then(|s| s.data().ok());
            let (offset, n) = (symbol.address() as usize, init.len());
            if let Some(bytes) = data.and_then(|d| d.get(offset..offset.checked_add(n)?)) {
                init.copy_from_slice(bytes);
            }
            out.push((name.to_owned(), init));
        }
    }
    out
}

/// # Safety
/// `ptr` must be a worker buffer of at least 8 bytes.
unsafe fn put_u64(ptr: u64, v: u64) {
    // SAFETY: per the contract.
    unsafe { std::ptr::write_unaligned(ptr as *mut u64, v) }
}

/// # Safety
/// `ptr` must be a worker buffer of at least 4 bytes.
unsafe fn put_u32(ptr: u64, v: u32) {
    // SAFETY: per the contract.
    unsafe { std::ptr::write_unaligned(ptr as *mut u32, v) }
}

impl Backend for Emulated {
    fn name(&self) -> &'static str {
        "emulated"
    }

    fn driver_version(&self) -> i32 {
        self.profile.driver_version
    }

    fn libraries(&self) -> Vec<(String, String)> {
        vec![
            ("cudart".into(), crate::profile::PROPS_VERSION.into()),
            ("driver".into(), crate::profile::PROPS_VERSION.into()),
        ]
    }

    fn devices(&self) -> Vec<Device> {
        self.profile.devices.clone()
    }

    fn layout_version(&self, library: &str) -> Option<String> {
        matches!(library, "cudart" | "driver").then(|| crate::profile::PROPS_VERSION.to_owned())
    }

    fn pin_staging(&self, base: u64, len: u64) -> bool {
        self.state().staging.insert(base, (len, false));
        true
    }

    fn synchronize_stream(&self, _stream: u64) -> Result<(), i64> {
        self.state().staging.values_mut().for_each(|(_, in_flight)| *in_flight = false);
        Ok(())
    }

    unsafe fn invoke(&self, desc: &'static CallDesc, a: &[u64]) -> Result<u64, String> {
        if let Err(why) = self.staging_read(desc, a) {
            // What the GPU would have read is gone: the worker broke its own rule.
            tracing::error!("{why}");
            return Err(why);
        }
        let name = chidori_protocol::desc::strip_suffixes(desc.name, &["_ptsz", "_ptds"]);
        let device = |i: usize| matches!(desc.params.get(i), Some(Wire::Device));
        if desc.library == "driver"
            // SAFETY: as below.
            && let Some(status) = unsafe { self.invoke_vmm(name, a) }
        {
            return Ok(status);
        }
        // Arrays, 3D memory, pools, texture objects, stream attributes and graphs.
        // SAFETY: as below.
        if let Some(status) = unsafe { self.invoke_more(desc, name, a) } {
            return Ok(status);
        }
        // SAFETY (all arms): out-parameters are worker buffers sized by the descriptor;
        // device addresses are only looked up in the allocation map, never dereferenced.
        let status = unsafe {
            match (desc.library, name) {
                ("cudart", "cudaMalloc" | "cudaMallocAsync") | ("driver", "cuMemAlloc_v2" | "cuMemAllocAsync") => {
                    match self.alloc(a[1]) {
                        Ok(p) => {
                            // Made on a capturing stream, it is the graph's (kept from now on,
                            // as an allocation node's).
                            if name.ends_with("Async") && self.stream_capturing(a[2]) {
                                self.state().graph_allocations.insert(p);
                            }
                            put_u64(a[0], p);
                            SUCCESS
                        }
                        Err(e) => e,
                    }
                }
                ("cudart", "cudaMallocPitch") => {
                    let pitch = a[2].div_ceil(ALIGN) * ALIGN;
                    match pitch.checked_mul(a[3]).map(|n| self.alloc(n)) {
                        Some(Ok(p)) => {
                            put_u64(a[0], p);
                            put_u64(a[1], pitch);
                            SUCCESS
                        }
                        Some(Err(e)) => e,
                        None => INVALID_VALUE,
                    }
                }
                ("cudart", "cudaFree" | "cudaFreeAsync") | ("driver", "cuMemFree_v2" | "cuMemFreeAsync") => {
                    self.free(a[0])
                }
                // (CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr): either output may be
                // NULL.
                ("driver", "cuMemGetAddressRange_v2") => match self.state().range_of(a[2]) {
                    Some((base, len)) => {
                        if a[0] != 0 {
                            put_u64(a[0], base);
                        }
                        if a[1] != 0 {
                            put_u64(a[1], len);
                        }
                        SUCCESS
                    }
                    None => NOT_FOUND,
                },
                // CUDA IPC: memory shared with another worker through POSIX shared memory
                // (`SharedRegion`). (handle *, devPtr), (devPtr *, handle, flags), (devPtr).
                ("cudart", "cudaIpcGetMemHandle") | ("driver", "cuIpcGetMemHandle") => self.ipc_export(a[0], a[1]),
                ("cudart", "cudaIpcOpenMemHandle") | ("driver", "cuIpcOpenMemHandle" | "cuIpcOpenMemHandle_v2") => {
                    self.ipc_open(a[0], a[1], a[2])
                }
                ("cudart", "cudaIpcCloseMemHandle") | ("driver", "cuIpcCloseMemHandle") => self.ipc_close(a[0]),
                // Events shared with another worker: as every emulated event is complete, the
                // handle only names the event, and an open makes a new one. (handle *, event),
                // (event *, handle).
                ("cudart", "cudaIpcGetEventHandle") | ("driver", "cuIpcGetEventHandle") => {
                    if a[0] == 0 {
                        INVALID_VALUE
                    } else if !self.state().events.contains_key(&a[1]) {
                        INVALID_HANDLE
                    } else {
                        put_handle(a[0], &format!("{EVENT_PREFIX}{}-{:x}", std::process::id(), a[1]));
                        SUCCESS
                    }
                }
                ("cudart", "cudaIpcOpenEventHandle") | ("driver", "cuIpcOpenEventHandle") => {
                    let named = a[1] != 0
                        && handle_name(&std::ptr::read_unaligned(a[1] as *const [u8; 64]), EVENT_PREFIX).is_some();
                    if a[0] == 0 || !named {
                        INVALID_VALUE
                    } else {
                        put_u64(a[0], self.new_handle(HandleSet::Event));
                        SUCCESS
                    }
                }
                ("cudart", "cudaMemGetInfo") | ("driver", "cuMemGetInfo_v2") => {
                    let used = self.state().used;
                    put_u64(a[0], self.total_mem().saturating_sub(used));
                    put_u64(a[1], self.total_mem());
                    SUCCESS
                }
                ("cudart", "cudaMemcpyAsync")
                    if let Some(status) = self.captured(
                        a[4],
                        (device(0) && device(1))
                            .then_some((graphs::kind::MEMCPY, Op::Copy { dst: a[0], src: a[1], len: a[2] })),
                    ) =>
                {
                    status
                }
                ("driver", "cuMemcpyDtoDAsync_v2")
                    if let Some(status) = self
                        .captured(a[3], Some((graphs::kind::MEMCPY, Op::Copy { dst: a[0], src: a[1], len: a[2] }))) =>
                {
                    status
                }
                ("cudart", "cudaMemsetAsync")
                    if let Some(status) = self.captured(
                        a[3],
                        Some((
                            graphs::kind::MEMSET,
                            Op::Memset {
                                dst: a[0],
                                pitch: a[2],
                                value: a[1] as u8 as u32,
                                elem: 1,
                                width: a[2],
                                height: 1,
                            },
                        )),
                    ) =>
                {
                    status
                }
                ("cudart", "cudaMemcpy" | "cudaMemcpyAsync") => {
                    if !self.stream_ok(if name == "cudaMemcpyAsync" { a[4] } else { 0 }) {
                        INVALID_HANDLE
                    } else {
                        self.copy(a[0], device(0), a[1], device(1), a[2])
                    }
                }
                ("cudart", "cudaMemcpy2DAsync")
                    if let Some(status) = self.captured(
                        a[7],
                        (device(0) && device(2)).then_some((
                            graphs::kind::MEMCPY,
                            Op::Region {
                                dst: graphs::Region { addr: a[0], pitch: a[1], slice: 0 },
                                src: graphs::Region { addr: a[2], pitch: a[3], slice: 0 },
                                width: a[4],
                                height: a[5],
                                depth: 1,
                            },
                        )),
                    ) =>
                {
                    status
                }
                // Row by row; the wire form says which side is the GPU's.
                ("cudart", "cudaMemcpy2D" | "cudaMemcpy2DAsync") => {
                    let (dst, dpitch, src, spitch, width, height) = (a[0], a[1], a[2], a[3], a[4], a[5]);
                    let mut status = if width > dpitch || width > spitch { INVALID_VALUE } else { SUCCESS };
                    if width == 0 {
                        // Nothing to copy, however many rows (CUDA returns at once too).
                        return Ok(status);
                    }
                    for r in 0..height {
                        let at = |base: u64, pitch: u64| r.checked_mul(pitch).and_then(|o| base.checked_add(o));
                        let (Some(d), Some(s)) = (at(dst, dpitch), at(src, spitch)) else {
                            status = INVALID_VALUE;
                            break;
                        };
                        if status != SUCCESS {
                            break;
                        }
                        status = self.copy(d, device(0), s, device(2), width);
                    }
                    status
                }
                ("driver", "cuMemcpyHtoD_v2" | "cuMemcpyHtoDAsync_v2") => self.copy(a[0], true, a[1], false, a[2]),
                ("driver", "cuMemcpyDtoH_v2" | "cuMemcpyDtoHAsync_v2") => self.copy(a[0], false, a[1], true, a[2]),
                // cuMemcpy's wire forms say which side is the worker's buffer of the
                // program's bytes.
                ("driver", "cuMemcpy" | "cuMemcpyAsync") => match desc.form {
                    Some(Form::H2d) => self.copy(a[0], true, a[1], false, a[2]),
                    Some(Form::D2h) => self.copy(a[0], false, a[1], true, a[2]),
                    _ => self.copy(a[0], true, a[1], true, a[2]),
                },
                ("driver", "cuMemcpyDtoD_v2" | "cuMemcpyDtoDAsync_v2") => self.copy(a[0], true, a[1], true, a[2]),
                ("cudart", "cudaMemset" | "cudaMemsetAsync") => self.memset(a[0], a[1] as u8, a[2], 1),
                ("driver", "cuMemsetD8_v2" | "cuMemsetD8Async") => self.memset(a[0], a[1] as u8, a[2], 1),
                ("driver", "cuFuncSetAttribute") => {
                    // (CUfunction, CUfunction_attribute, int value)
                    use chidori_cuda::consts::CUfunction_attribute_enum as f;
                    if a[1] as u32 >= f::CU_FUNC_ATTRIBUTE_MAX {
                        return Ok(INVALID_VALUE);
                    }
                    self.state().function_attributes.insert((a[0], a[1] as u32), a[2] as i32);
                    SUCCESS
                }
                ("cudart", "cudaThreadExchangeStreamCaptureMode") | ("driver", "cuThreadExchangeStreamCaptureMode") => {
                    // (mode *): each thread's own mode, global to begin with.
                    if a[0] == 0 {
                        return Ok(INVALID_VALUE);
                    }
                    let wanted = std::ptr::read_unaligned(a[0] as *const u32);
                    if wanted > cudaStreamCaptureMode::cudaStreamCaptureModeRelaxed {
                        return Ok(INVALID_VALUE);
                    }
                    put_u32(a[0], CAPTURE_MODE.with(|m| m.replace(wanted)));
                    SUCCESS
                }
                ("driver", "cuFuncSetCacheConfig") => {
                    // (CUfunction, CUfunc_cache): a preference the emulated device has no use for.
                    if a[1] > u64::from(chidori_cuda::consts::CUfunc_cache_enum::CU_FUNC_CACHE_PREFER_EQUAL) {
                        return Ok(INVALID_VALUE);
                    }
                    SUCCESS
                }
                ("driver", "cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags") => {
                    // (int *numBlocks, CUfunction, int blockSize, size_t dynamicSMem, flags): an
                    // sm_90 multiprocessor (2048 threads, 32 blocks, 228 KiB of shared memory,
                    // the function's carveout preference taken) for a kernel of no registers.
                    let block = a[2] as i32;
                    if a[0] == 0 || !(1..=1024).contains(&block) {
                        return Ok(INVALID_VALUE);
                    }
                    use chidori_cuda::consts::CUfunction_attribute_enum as f;
                    let carveout = self
                        .state()
                        .function_attributes
                        .get(&(a[1], f::CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT))
                        .copied();
                    let shared = match carveout {
                        Some(percent @ 0..=100) => (228u64 << 10) * percent as u64 / 100,
                        _ => 228 << 10,
                    };
                    let by_shared = shared.checked_div(a[3]).unwrap_or(32);
                    let blocks = (2048 / block as u64).min(32).min(by_shared);
                    put_u32(a[0], blocks as u32);
                    SUCCESS
                }
                ("driver", "cuModuleGetFunction") => {
                    // (CUfunction *, CUmodule, const char *name)
                    if a[2] == 0 {
                        return Ok(INVALID_VALUE);
                    }
                    let name = std::ffi::CStr::from_ptr(a[2] as *const std::ffi::c_char).to_string_lossy();
                    let found =
                        self.state().functions.get(&a[1]).and_then(|f| f.iter().find(|(n, _)| *n == name).map(|f| f.1));
                    match found {
                        Some(handle) if a[0] != 0 => {
                            put_u64(a[0], handle);
                            SUCCESS
                        }
                        Some(_) => INVALID_VALUE,
                        None => NOT_FOUND,
                    }
                }
                ("driver", "cuFuncGetAttribute") => {
                    // (int *pi, CUfunction_attribute, CUfunction): the emulated device runs no
                    // code, so its functions are as a kernel without registers or memory of
                    // its own would be on an sm_90 GPU.
                    use chidori_cuda::consts::CUfunction_attribute_enum as f;
                    let set = self.state().function_attributes.get(&(a[2], a[1] as u32)).copied();
                    let value = match a[1] as u32 {
                        id if id < f::CU_FUNC_ATTRIBUTE_MAX && set.is_some() => set.unwrap_or(0) as u32,
                        f::CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK => 1024,
                        f::CU_FUNC_ATTRIBUTE_PTX_VERSION | f::CU_FUNC_ATTRIBUTE_BINARY_VERSION => 90,
                        f::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES => 48 << 10,
                        id if id < f::CU_FUNC_ATTRIBUTE_MAX => 0,
                        _ => return Ok(INVALID_VALUE),
                    };
                    if a[0] != 0 {
                        put_u32(a[0], value);
                    }
                    SUCCESS
                }
                ("driver", "cuLibraryGetGlobal" | "cuLibraryGetManaged")
                | ("cudart", "cudaLibraryGetGlobal" | "cudaLibraryGetManaged") => {
                    // (CUdeviceptr *, size_t *, CUlibrary, const char *name): the decoder
                    // passes a NUL-terminated name (or NULL) and 8-byte buffers for the
                    // outputs (or NULL). "One of the parameters dptr or bytes (not both)
                    // can be NULL" (cuda.h).
                    if a[3] == 0 || (a[0] == 0 && a[1] == 0) {
                        return Ok(INVALID_VALUE);
                    }
                    let name = std::ffi::CStr::from_ptr(a[3] as *const std::ffi::c_char);
                    match self.global(a[2], &name.to_string_lossy()) {
                        Ok((address, size)) => {
                            if a[0] != 0 {
                                put_u64(a[0], address);
                            }
                            if a[1] != 0 {
                                put_u64(a[1], size);
                            }
                            SUCCESS
                        }
                        Err((status, _)) => status as u64,
                    }
                }
                ("driver", "cuMemsetD32_v2" | "cuMemsetD32Async") => self.memset32(a[0], a[1] as u32, a[2]),
                // Hints, and discards that leave contents undefined (kept as they are here);
                // the worker checked every address as the session's.
                (
                    "driver",
                    "cuMemPrefetchBatchAsync" | "cuMemDiscardBatchAsync" | "cuMemDiscardAndPrefetchBatchAsync",
                )
                | (
                    "cudart",
                    "cudaMemPrefetchBatchAsync" | "cudaMemDiscardBatchAsync" | "cudaMemDiscardAndPrefetchBatchAsync",
                ) => SUCCESS,
                ("cudart", "cudaStreamCreate" | "cudaStreamCreateWithFlags" | "cudaStreamCreateWithPriority")
                | ("driver", "cuStreamCreate" | "cuStreamCreateWithPriority") => {
                    // Default or non-blocking, as CUDA takes them.
                    let flags = if desc.name == "cudaStreamCreate" { 0 } else { a[1] };
                    if a[0] == 0 || flags & !1 != 0 {
                        return Ok(INVALID_VALUE);
                    }
                    put_u64(a[0], self.new_handle(HandleSet::Stream));
                    SUCCESS
                }
                ("cudart", "cudaStreamDestroy") | ("driver", "cuStreamDestroy_v2") => {
                    if self.state().streams.remove(&a[0]) { SUCCESS } else { INVALID_HANDLE }
                }
                ("cudart", "cudaStreamSynchronize" | "cudaStreamQuery")
                | ("driver", "cuStreamSynchronize" | "cuStreamQuery") => {
                    if self.stream_ok(a[0]) {
                        SUCCESS
                    } else {
                        INVALID_HANDLE
                    }
                }
                ("cudart", "cudaStreamWaitEvent") | ("driver", "cuStreamWaitEvent") => {
                    if self.stream_ok(a[0]) && self.state().events.contains_key(&a[1]) {
                        SUCCESS
                    } else {
                        INVALID_HANDLE
                    }
                }
                ("cudart", "cudaEventCreate" | "cudaEventCreateWithFlags") | ("driver", "cuEventCreate") => {
                    // Blocking synchronization, no timing, interprocess, as CUDA takes them.
                    let flags = if desc.name == "cudaEventCreate" { 0 } else { a[1] };
                    if a[0] == 0 || flags & !7 != 0 {
                        return Ok(INVALID_VALUE);
                    }
                    put_u64(a[0], self.new_handle(HandleSet::Event));
                    SUCCESS
                }
                ("cudart", "cudaEventRecord" | "cudaEventRecordWithFlags")
                | ("driver", "cuEventRecord" | "cuEventRecordWithFlags") => {
                    let stream_ok = self.stream_ok(a[1]);
                    match self.state().events.get_mut(&a[0]) {
                        Some(t) if stream_ok => {
                            *t = Some(Instant::now());
                            SUCCESS
                        }
                        _ => INVALID_HANDLE,
                    }
                }
                ("cudart", "cudaEventSynchronize" | "cudaEventQuery")
                | ("driver", "cuEventSynchronize" | "cuEventQuery") => {
                    if self.state().events.contains_key(&a[0]) {
                        SUCCESS
                    } else {
                        INVALID_HANDLE
                    }
                }
                ("cudart", "cudaEventElapsedTime" | "cudaEventElapsedTime_v2")
                | ("driver", "cuEventElapsedTime" | "cuEventElapsedTime_v2") => {
                    let s = self.state();
                    match (s.events.get(&a[1]), s.events.get(&a[2])) {
                        (Some(Some(t0)), Some(Some(t1))) => {
                            let ms = t1.saturating_duration_since(*t0).as_secs_f64() * 1e3;
                            put_u32(a[0], (ms as f32).to_bits());
                            SUCCESS
                        }
                        // cudaErrorInvalidResourceHandle for unknown events, NotReady for
                        // events never recorded.
                        (Some(_), Some(_)) => NOT_READY,
                        _ => INVALID_HANDLE,
                    }
                }
                ("cudart", "cudaEventDestroy") | ("driver", "cuEventDestroy_v2") => {
                    if self.state().events.remove(&a[0]).is_some() { SUCCESS } else { INVALID_HANDLE }
                }
                ("cudart", "cudaDeviceSynchronize" | "cudaSetDevice" | "cudaDeviceReset" | "cudaFree0")
                | ("driver", "cuInit" | "cuCtxSynchronize" | "cuCtxSynchronize_v2") => SUCCESS,
                ("driver", "cuDevicePrimaryCtxRetain") => {
                    put_u64(a[0], self.primary_context());
                    SUCCESS
                }
                // The driver's default: modules load their kernels on first use. NVIDIA's
                // runtime asks at start.
                ("driver", "cuModuleGetLoadingMode") => {
                    put_u32(a[0], chidori_cuda::consts::CUmoduleLoadingMode_enum::CU_MODULE_LAZY_LOADING);
                    SUCCESS
                }
                // A new context is pushed on the calling thread's stack.
                ("driver", "cuCtxCreate_v2" | "cuCtxCreate_v3") => {
                    let ctx = self.new_handle(HandleSet::Context);
                    CONTEXTS.with(|c| c.borrow_mut().push(Some(ctx)));
                    put_u64(a[0], ctx);
                    SUCCESS
                }
                ("driver", "cuCtxSetCurrent" | "cuCtxPushCurrent_v2") => {
                    if a[0] != 0 && !self.state().contexts.contains(&a[0]) {
                        INVALID_HANDLE
                    } else {
                        // A push covers the current context (its pop brings it back); a set
                        // replaces it.
                        let ctx = (a[0] != 0).then_some(a[0]);
                        CONTEXTS.with(|c| {
                            let mut c = c.borrow_mut();
                            if desc.name != "cuCtxPushCurrent_v2" {
                                c.pop();
                            }
                            c.push(ctx);
                        });
                        SUCCESS
                    }
                }
                ("driver", "cuCtxPopCurrent_v2") => match current_context() {
                    // (CUcontext *pctx): the popped context where asked; the one it covered
                    // becomes current again.
                    Some(ctx) => {
                        if a[0] != 0 {
                            put_u64(a[0], ctx);
                        }
                        CONTEXTS.with(|c| c.borrow_mut().pop());
                        SUCCESS
                    }
                    None => u64::from(chidori_cuda::consts::cudaError_enum::CUDA_ERROR_INVALID_CONTEXT),
                },
                // As cudaDeviceReset above: the emulation keeps its state.
                ("driver", "cuDevicePrimaryCtxRelease" | "cuDevicePrimaryCtxRelease_v2") => SUCCESS,
                ("driver", "cuDevicePrimaryCtxReset" | "cuDevicePrimaryCtxReset_v2") => SUCCESS,
                ("driver", "cuCtxDestroy_v2") => {
                    if !self.state().contexts.remove(&a[0]) {
                        INVALID_HANDLE
                    } else {
                        // Current on this thread: popped.
                        if current_context() == Some(a[0]) {
                            CONTEXTS.with(|c| c.borrow_mut().pop());
                        }
                        SUCCESS
                    }
                }
                ("cudart", "cudaDeviceGetStreamPriorityRange") | ("driver", "cuCtxGetStreamPriorityRange") => {
                    // (least, greatest) of every GPU since Volta.
                    if a[0] != 0 {
                        put_u32(a[0], 0);
                    }
                    if a[1] != 0 {
                        put_u32(a[1], -5i32 as u32);
                    }
                    SUCCESS
                }
                ("driver", "cuDevicePrimaryCtxGetState") => {
                    // (flags, active): like the real worker, which creates the primary context
                    // when the session starts.
                    put_u32(a[1], 0);
                    put_u32(a[2], 1);
                    SUCCESS
                }
                // cuDNN's backend API, as far as its descriptor lifecycle goes (cuDNN 9's status
                // codes): an execution needs finalized descriptors of the right types; no graph
                // runs.
                ("cudnn", "cudnnCreate") => {
                    let h = self.state().handle();
                    self.state().cudnn_handles.insert(h);
                    put_u64(a[0], h);
                    SUCCESS
                }
                ("cudnn", "cudnnDestroy") => {
                    if self.state().cudnn_handles.remove(&a[0]) {
                        SUCCESS
                    } else {
                        CUDNN_BAD_PARAM
                    }
                }
                // The legacy API's descriptors: created and destroyed.
                ("cudnn", name)
                    if name.starts_with("cudnnCreate") && name.ends_with("Descriptor") && desc.params.len() == 1 =>
                {
                    let mut s = self.state();
                    let h = s.handle();
                    s.legacy.insert(h);
                    put_u64(a[0], h);
                    SUCCESS
                }
                ("cudnn", name)
                    if name.starts_with("cudnnDestroy") && name.ends_with("Descriptor") && desc.params.len() == 1 =>
                {
                    let mut s = self.state();
                    s.tensors.remove(&a[0]);
                    s.rnn_hidden.remove(&a[0]);
                    if s.legacy.remove(&a[0]) { SUCCESS } else { CUDNN_BAD_PARAM }
                }
                // An RNN data descriptor: a live one, positive sizes (the padding value may
                // be NULL; the sequence lengths the decoder already required).
                ("cudnn", "cudnnSetRNNDataDescriptor") => {
                    let sizes = [a[3], a[4], a[5]].iter().all(|&v| (1..=i32::MAX as u64).contains(&(v & 0xffff_ffff)));
                    if self.state().legacy.contains(&a[0]) && sizes { SUCCESS } else { CUDNN_BAD_PARAM }
                }
                // cuFFT plans: created, made once (a work size of 16 bytes per element of
                // the batch's transforms; another salt, another library: 8 more), destroyed.
                ("cufft", "cufftCreate") => {
                    let mut s = self.state();
                    s.cufft_created += 1;
                    let plan = s.cufft_created;
                    s.cufft_plans.insert(plan, false);
                    put_u32(a[0], plan as u32);
                    SUCCESS
                }
                ("cufft", "cufftDestroy") => match self.state().cufft_plans.remove(&(a[0] & 0xffff_ffff)) {
                    Some(_) => SUCCESS,
                    None => u64::from(cufftResult_t::CUFFT_INVALID_PLAN),
                },
                ("cufft", "cufftSetAutoAllocation" | "cufftSetStream") => {
                    match self.state().cufft_plans.contains_key(&(a[0] & 0xffff_ffff)) {
                        true => SUCCESS,
                        false => u64::from(cufftResult_t::CUFFT_INVALID_PLAN),
                    }
                }
                ("cufft", "cufftXtMakePlanMany") => {
                    let rank = a[1] & 0xffff_ffff;
                    let batch = a[11] as i64;
                    if !(1..=3).contains(&rank) || a[2] == 0 || batch < 1 || a[12] == 0 {
                        return Ok(u64::from(cufftResult_t::CUFFT_INVALID_VALUE));
                    }
                    // SAFETY: the worker's copy of the caller's rank sizes (i64 each).
                    let n = std::slice::from_raw_parts(a[2] as *const i64, rank as usize);
                    if n.iter().any(|&d| d < 1) {
                        return Ok(u64::from(cufftResult_t::CUFFT_INVALID_SIZE));
                    }
                    let mut st = self.state();
                    match st.cufft_plans.get_mut(&(a[0] & 0xffff_ffff)) {
                        Some(made @ false) => *made = true,
                        _ => return Ok(u64::from(cufftResult_t::CUFFT_INVALID_PLAN)),
                    }
                    let salt = salt();
                    let elements = n.iter().fold(batch as u64, |acc, &d| acc.saturating_mul(d as u64));
                    put_u64(a[12], elements.saturating_mul(16) + 8 * salt);
                    SUCCESS
                }
                // An RNN descriptor's settings: only its hidden size (a[10], 1 to 1024) is kept.
                ("cudnn", "cudnnSetRNNDescriptor_v8") => {
                    let hidden = a[10] & 0xffff_ffff;
                    let mut s = self.state();
                    if !s.legacy.contains(&a[0]) || !(1..=1024).contains(&hidden) {
                        return Ok(CUDNN_BAD_PARAM);
                    }
                    s.rnn_hidden.insert(a[0], hidden);
                    SUCCESS
                }
                ("cudnn", "cudnnSetDropoutDescriptor") => {
                    if self.state().legacy.contains(&a[0]) {
                        SUCCESS
                    } else {
                        CUDNN_BAD_PARAM
                    }
                }
                // For a hidden size h (32 where unset): a matrix is h x h floats, a bias 2h
                // floats, each layer 8 of each (matrices first); the descriptors passed are
                // filled with their dimensions. Another salt, another library: the biases
                // start one float later.
                ("cudnn", "cudnnGetRNNWeightParams") => {
                    let (layer, lin) = (a[2] as i32, a[5] as i32);
                    // As cuDNN: an address asked without its descriptor is a bad parameter.
                    let unpaired = (a[6] == 0 && a[7] != 0) || (a[8] == 0 && a[9] != 0);
                    if !(0..8).contains(&lin) || layer < 0 || a[4] == 0 || unpaired {
                        return Ok(CUDNN_BAD_PARAM);
                    }
                    let mut s = self.state();
                    let h = s.rnn_hidden.get(&a[1]).copied().unwrap_or(32);
                    let (matrix, bias) = (4 * h * h, 8 * h);
                    let salt = salt();
                    let base = a[4] + layer as u64 * 8 * (matrix + bias);
                    let (hi, h2) = (h as i32, 2 * h as i32);
                    const FLOAT: u32 = chidori_cuda::consts::cudnnDataType_t::CUDNN_DATA_FLOAT;
                    if a[6] != 0 {
                        s.tensors.insert(a[6], (FLOAT, vec![1, hi, hi], vec![hi * hi, hi, 1]));
                    }
                    if a[8] != 0 {
                        s.tensors.insert(a[8], (FLOAT, vec![1, h2, 1], vec![h2, 1, 1]));
                    }
                    if a[7] != 0 {
                        put_u64(a[7], base + lin as u64 * matrix);
                    }
                    if a[9] != 0 {
                        put_u64(a[9], base + 8 * matrix + lin as u64 * bias + 4 * salt);
                    }
                    SUCCESS
                }
                ("cudnn", "cudnnSetTensorNdDescriptor") => {
                    let n = a[2] as i32;
                    if !(1..=8).contains(&n) || a[3] == 0 || a[4] == 0 {
                        return Ok(CUDNN_BAD_PARAM);
                    }
                    // SAFETY: the worker's copies of the caller's two arrays of nbDims ints.
                    let (dims, strides) = (
                        std::slice::from_raw_parts(a[3] as *const i32, n as usize).to_vec(),
                        std::slice::from_raw_parts(a[4] as *const i32, n as usize).to_vec(),
                    );
                    self.state().tensors.insert(a[0], (a[1] as u32, dims, strides));
                    SUCCESS
                }
                // The bytes the tensor spans: the largest offset plus one element (floats and
                // other data types of four bytes, halves of two, doubles of eight).
                ("cudnn", "cudnnGetTensorSizeInBytes") => {
                    let Some((dt, dims, strides)) = self.state().tensors.get(&a[0]).cloned() else {
                        return Ok(CUDNN_BAD_PARAM);
                    };
                    use chidori_cuda::consts::cudnnDataType_t as data;
                    let elem: u64 = match dt {
                        data::CUDNN_DATA_DOUBLE => 8,
                        data::CUDNN_DATA_HALF | data::CUDNN_DATA_BFLOAT16 => 2,
                        _ => 4,
                    };
                    if dims.iter().chain(&strides).any(|v| *v <= 0) {
                        return Ok(CUDNN_BAD_PARAM);
                    }
                    let last = dims
                        .iter()
                        .zip(&strides)
                        .fold(0u64, |acc, (d, s)| acc.saturating_add((*d as u64 - 1).saturating_mul(*s as u64)));
                    put_u64(a[1], last.saturating_add(1).saturating_mul(elem));
                    SUCCESS
                }
                // cuDNN's v7 CTC loss, as far as its host arrays go (the probabilities'
                // descriptor gives the batch): the workspace is 64 bytes per label and 256 per
                // sequence; each sequence's cost is what its arrays held, so that a test can
                // tell they arrived whole: 1000 × (sum of its labels) + 10 × its label length
                // + its input length, as a float. No loss is computed.
                ("cudnn", "cudnnGetCTCLossWorkspaceSize" | "cudnnCTCLoss") => {
                    let batch = match self.state().tensors.get(&a[1]) {
                        Some((_, dims, _)) if dims.len() == 3 && dims[1] > 0 => dims[1] as usize,
                        _ => return Ok(CUDNN_BAD_PARAM),
                    };
                    let ints = |p: u64, n: usize| std::slice::from_raw_parts(p as *const i32, n);
                    let (lengths, inputs) = (ints(a[4], batch), ints(a[5], batch));
                    let total: usize = lengths.iter().map(|&n| n.max(0) as usize).sum();
                    let labels = ints(a[3], total);
                    if name == "cudnnGetCTCLossWorkspaceSize" {
                        put_u64(a[8], 64 * total as u64 + 256 * batch as u64);
                        return Ok(SUCCESS);
                    }
                    let mut costs = Vec::with_capacity(4 * batch);
                    let mut at = 0;
                    for b in 0..batch {
                        let n = lengths[b].max(0) as usize;
                        let sum: i64 = labels[at..at + n].iter().map(|&l| i64::from(l)).sum();
                        at += n;
                        let cost = 1000 * sum + 10 * i64::from(lengths[b]) + i64::from(inputs[b]);
                        costs.extend_from_slice(&(cost as f32).to_le_bytes());
                    }
                    let mut s = self.state();
                    let Some(out) = s.find(a[6], costs.len() as u64) else { return Ok(CUDNN_BAD_PARAM) };
                    out.copy_from_slice(&costs);
                    SUCCESS
                }
                // Writes min(requested, nbDims) dimensions and strides.
                ("cudnn", "cudnnGetTensorNdDescriptor") => {
                    let Some((dt, dims, strides)) = self.state().tensors.get(&a[0]).cloned() else {
                        return Ok(CUDNN_BAD_PARAM);
                    };
                    let k = (a[1] as i32).clamp(0, dims.len() as i32) as usize;
                    put_u32(a[2], dt);
                    put_u32(a[3], dims.len() as u32);
                    for i in 0..k {
                        put_u32(a[4] + 4 * i as u64, dims[i] as u32);
                        put_u32(a[5] + 4 * i as u64, strides[i] as u32);
                    }
                    SUCCESS
                }
                (
                    "cusolver",
                    "cusolverSpCreate"
                    | "cusolverDnCreate"
                    | "cusolverDnCreateParams"
                    | "cusolverDnCreateSyevjInfo"
                    | "cusolverDnCreateGesvdjInfo",
                )
                | ("cusparse", "cusparseCreateMatDescr" | "cusparseCreate") => {
                    let h = self.state().handle();
                    put_u64(a[0], h);
                    SUCCESS
                }
                ("cusolver", "cusolverDnSetAdvOptions") => {
                    self.state().solver_algo.insert(a[0], a[2]);
                    SUCCESS
                }
                // Workspace sizes that depend on the problem and on how the parameter set was
                // set (the algorithm, in the device bytes); another salt, another library.
                ("cusolver", "cusolverDnSgetrf_bufferSize") => {
                    let (m, n, lda) = (a[1] as i32, a[2] as i32, a[4] as i32);
                    if m < 0 || n < 0 || lda < m.max(1) {
                        return Ok(CUSOLVER_INVALID_VALUE);
                    }
                    put_u32(a[5], (n as u32).saturating_mul(64).saturating_add(salt() as u32));
                    SUCCESS
                }
                ("cusolver", "cusolverDnXpotrf_bufferSize") => {
                    let (n, lda) = (a[3] as i64, a[6] as i64);
                    if n < 0 || lda < n.max(1) {
                        return Ok(CUSOLVER_INVALID_VALUE);
                    }
                    let algo = self.state().solver_algo.get(&a[1]).copied().unwrap_or(0);
                    put_u64(a[8], (n as u64).saturating_mul(256).saturating_add(algo * 4096 + 8 * salt()));
                    put_u64(a[9], 0);
                    SUCCESS
                }
                (
                    "cusolver",
                    "cusolverSpDestroy"
                    | "cusolverDnDestroy"
                    | "cusolverDnDestroyParams"
                    | "cusolverDnDestroySyevjInfo"
                    | "cusolverDnDestroyGesvdjInfo",
                )
                | ("cusparse", "cusparseDestroyMatDescr" | "cusparseDestroy") => SUCCESS,
                // A Cholesky factorization's arguments checked as cuSOLVER checks them (the
                // order, the leading dimension); nothing is computed.
                ("cusolver", "cusolverDnXpotrf") => {
                    let (n, lda) = (a[3] as i64, a[6] as i64);
                    if n < 0 || lda < n.max(1) { CUSOLVER_INVALID_VALUE } else { SUCCESS }
                }
                // The generic API's descriptors: sizes checked as cuSPARSE checks them (a
                // dense vector's size; a dense matrix's rows, columns and leading dimension by
                // its order; a CSR matrix's rows, columns and entries).
                ("cusparse", "cusparseCreateDnVec" | "cusparseCreateDnMat" | "cusparseCreateCsr") => {
                    let signed = |i: usize| a[i] as i64;
                    let valid = match desc.name {
                        "cusparseCreateDnVec" => signed(1) >= 0,
                        "cusparseCreateDnMat" => {
                            let column_major = a[6] as u32 == chidori_cuda::consts::cusparseOrder_t::CUSPARSE_ORDER_COL;
                            let least = if column_major { signed(1) } else { signed(2) };
                            signed(1) >= 0 && signed(2) >= 0 && signed(3) >= least.max(1)
                        }
                        _ => signed(1) >= 0 && signed(2) >= 0 && signed(3) >= 0,
                    };
                    if !valid {
                        return Ok(CUSPARSE_INVALID_VALUE);
                    }
                    let shape = match desc.name {
                        "cusparseCreateDnVec" => (a[1], 1, a[1]),
                        "cusparseCreateDnMat" => (a[1], a[2], a[1].saturating_mul(a[2])),
                        _ => (a[1], a[2], a[3]),
                    };
                    let mut state = self.state();
                    let h = state.handle();
                    state.sparse_shapes.insert(h, shape);
                    put_u64(a[0], h);
                    SUCCESS
                }
                // Buffer sizes that depend on the descriptors' shapes and the algorithm;
                // another salt, another library. (handle, opA, opB, alpha, A, B, beta, C,
                // computeType, alg, size) and (handle, opA, alpha, A, x, beta, y,
                // computeType, alg, size).
                ("cusparse", "cusparseSpMM_bufferSize" | "cusparseSpMV_bufferSize") => {
                    let spmm = desc.name == "cusparseSpMM_bufferSize";
                    let (matrix, dense, alg, out) =
                        if spmm { (a[4], a[5], a[9], a[10]) } else { (a[3], a[4], a[8], a[9]) };
                    let state = self.state();
                    let (Some(&(rows, _, nnz)), Some(&(_, columns, _))) =
                        (state.sparse_shapes.get(&matrix), state.sparse_shapes.get(&dense))
                    else {
                        return Ok(CUSPARSE_INVALID_VALUE);
                    };
                    let size = rows * 64 + nnz * 8 + columns * 16 + alg * 4096 + 8 * salt() + u64::from(spmm);
                    put_u64(out, size);
                    SUCCESS
                }
                ("cusparse", "cusparseDestroyDnVec" | "cusparseDestroyDnMat" | "cusparseDestroySpMat") => {
                    self.state().sparse_shapes.remove(&a[0]);
                    SUCCESS
                }
                ("cusparse", "cusparseCsrSetPointers") => SUCCESS,
                ("cusparse", "cusparseGetVersion") => {
                    // (handle, int *version): CUDA 13.0's cuSPARSE.
                    put_u32(a[1], 12_600);
                    SUCCESS
                }
                // The workspace B = P*A*Q^T needs: its pattern and a map, as int32s.
                ("cusolver", "cusolverSpXcsrperm_bufferSizeHost") => {
                    let (m, nnz) = (a[1] as i32, a[3] as i32);
                    if m < 0 || nnz < 0 {
                        return Ok(CUSOLVER_INVALID_VALUE);
                    }
                    put_u64(a[9], 4 * (m as u64 + 1 + 2 * nnz as u64) + 64);
                    SUCCESS
                }
                ("cusolver", "cusolverSpXcsrpermHost") => permute_csr(a),
                // The low-level Cholesky's CPU path for diagonal matrices: enough to see the
                // program's host arrays reach the library (as the worker's stand-ins of them)
                // and the workspace keep the factor from Factor to Solve.
                ("cusolver", "cusolverSpCreateCsrcholInfoHost") => {
                    let h = self.state().handle();
                    put_u64(a[0], h);
                    SUCCESS
                }
                ("cusolver", "cusolverSpDestroyCsrcholInfoHost") => SUCCESS,
                ("cusolver", "cusolverSpXcsrcholAnalysisHost") => SUCCESS,
                ("cusolver", "cusolverSpDcsrcholBufferInfoHost") => {
                    let n = a[1] as i32;
                    if n <= 0 {
                        return Ok(CUSOLVER_INVALID_VALUE);
                    }
                    put_u64(a[8], 64);
                    put_u64(a[9], 8 * n as u64);
                    SUCCESS
                }
                ("cusolver", "cusolverSpDcsrcholFactorHost") => {
                    // L = sqrt(A) of a diagonal A (one entry per row), into the workspace.
                    let n = a[1] as i32;
                    let mut values = vec![0u8; 8 * n.max(0) as usize];
                    if n <= 0 || !chidori_protocol::mirror::read_own(a[4], &mut values) {
                        return Ok(CUSOLVER_INVALID_VALUE);
                    }
                    let l: Vec<u8> = values
                        .chunks_exact(8)
                        .flat_map(|c| f64::from_le_bytes(c.try_into().unwrap_or_default()).sqrt().to_le_bytes())
                        .collect();
                    if chidori_protocol::mirror::write_own(a[8], &l) { SUCCESS } else { CUSOLVER_INVALID_VALUE }
                }
                ("cusolver", "cusolverSpDcsrcholZeroPivotHost") => {
                    put_u32(a[3], u32::MAX);
                    SUCCESS
                }
                ("cusolver", "cusolverSpDcsrcholSolveHost") => {
                    // x = b / (L L^T) with the L the workspace kept.
                    let n = a[1] as i32;
                    let bytes = 8 * n.max(0) as usize;
                    let (mut b, mut l) = (vec![0u8; bytes], vec![0u8; bytes]);
                    if n <= 0
                        || !chidori_protocol::mirror::read_own(a[2], &mut b)
                        || !chidori_protocol::mirror::read_own(a[5], &mut l)
                    {
                        return Ok(CUSOLVER_INVALID_VALUE);
                    }
                    let f = |c: &[u8]| f64::from_le_bytes(c.try_into().unwrap_or_default());
                    let x: Vec<u8> = b
                        .chunks_exact(8)
                        .zip(l.chunks_exact(8))
                        .flat_map(|(b, l)| (f(b) / (f(l) * f(l))).to_le_bytes())
                        .collect();
                    if chidori_protocol::mirror::write_own(a[3], &x) { SUCCESS } else { CUSOLVER_INVALID_VALUE }
                }
                ("cudnn", "cudnnBackendCreateDescriptor") => {
                    let mut s = self.state();
                    let h = s.handle();
                    s.descriptors.insert(h, (a[0], false));
                    put_u64(a[1], h);
                    SUCCESS
                }
                // An array of descriptors (CUDNN_TYPE_BACKEND_DESCRIPTOR) holds live ones, an
                // array of handles (CUDNN_TYPE_HANDLE) live cudnnHandle_t.
                ("cudnn", "cudnnBackendSetAttribute") => {
                    let s = self.state();
                    let handles = matches!(a[2], CUDNN_TYPE_HANDLE | CUDNN_TYPE_BACKEND_DESCRIPTOR);
                    let elements = if handles && a[4] != 0 { a[3] as usize } else { 0 };
                    let known = |v: u64| {
                        if a[2] == CUDNN_TYPE_HANDLE {
                            s.cudnn_handles.contains(&v)
                        } else {
                            s.descriptors.contains_key(&v)
                        }
                    };
                    // SAFETY: the worker's array of `elementCount` handles (the wire form).
                    let live = (0..elements).all(|i| known(*(a[4] as *const u64).add(i)));
                    match s.descriptors.get(&a[0]) {
                        Some((_, false)) if live => SUCCESS,
                        _ => CUDNN_BAD_PARAM,
                    }
                }
                ("cudnn", "cudnnBackendFinalize") => match self.state().descriptors.get_mut(&a[0]) {
                    Some((_, finalized @ false)) => {
                        *finalized = true;
                        SUCCESS
                    }
                    _ => CUDNN_BAD_PARAM,
                },
                // RNN computations of a handle of the session: nothing is computed (as a
                // graph's execution, below).
                ("cudnn", "cudnnRNNForward" | "cudnnRNNBackwardData_v8" | "cudnnRNNBackwardWeights_v8") => {
                    if self.state().cudnn_handles.contains(&a[0]) { SUCCESS } else { CUDNN_BAD_PARAM }
                }
                ("cudnn", "cudnnBackendExecute") => {
                    let s = self.state();
                    use chidori_cuda::consts::cudnnBackendDescriptorType_t as d;
                    let finalized = |desc: u64, ty: u32| s.descriptors.get(&desc) == Some(&(u64::from(ty), true));
                    if s.cudnn_handles.contains(&a[0])
                        && finalized(a[1], d::CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR)
                        && finalized(a[2], d::CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR)
                    {
                        SUCCESS
                    } else {
                        CUDNN_BAD_PARAM
                    }
                }
                // Two elements of any attribute are available (one descriptor): a Get writes
                // min(requested, available) elements and their count.
                ("cudnn", "cudnnBackendGetAttribute") => {
                    if !self.state().descriptors.contains_key(&a[0]) {
                        CUDNN_BAD_PARAM
                    } else {
                        let descriptors = a[2] == CUDNN_TYPE_BACKEND_DESCRIPTOR;
                        let (requested, available) = (a[3] as i64, if descriptors { 1 } else { 2 });
                        if descriptors && a[5] != 0 && requested > 0 {
                            // SAFETY: the worker's array of `requested` descriptors.
                            let filled = *(a[5] as *const u64);
                            if !self.state().descriptors.contains_key(&filled) {
                                return Ok(CUDNN_BAD_PARAM);
                            }
                        }
                        let n = if a[5] == 0 { available } else { requested.clamp(0, available) };
                        if a[4] != 0 {
                            put_u64(a[4], n as u64);
                        }
                        let bytes = match desc.params.get(5) {
                            Some(Wire::Buf { len: Some(len), .. }) => len.eval(a).unwrap_or(0),
                            _ => 0,
                        };
                        if !descriptors && a[5] != 0 && requested > 0 {
                            let per = bytes / requested as u64;
                            // Another salt, another library (`salt`).
                            // SAFETY: the worker's buffer of `bytes` >= n * per bytes.
                            std::ptr::write_bytes(a[5] as *mut u8, 0x11 ^ salt() as u8, (n as u64 * per) as usize);
                        }
                        SUCCESS
                    }
                }
                ("cudnn", "cudnnBackendDestroyDescriptor") => {
                    if self.state().descriptors.remove(&a[0]).is_some() {
                        SUCCESS
                    } else {
                        CUDNN_BAD_PARAM
                    }
                }
                ("nvrtc", "nvrtcVersion") => {
                    // (int *major, int *minor): CUDA 13.0's NVRTC (whose compiles the
                    // emulation refuses; its version is asked all the same).
                    put_u32(a[0], 13);
                    put_u32(a[1], 0);
                    SUCCESS
                }
                // The context API version contexts have had since CUDA 3.2 (3020).
                ("driver", "cuCtxGetApiVersion") => {
                    put_u32(a[1], 3020);
                    SUCCESS
                }
                // The emulation has one device.
                ("driver", "cuCtxGetDevice" | "cuCtxGetDevice_v2") => {
                    put_u32(a[0], 0);
                    SUCCESS
                }
                ("driver", "cuCtxGetCurrent") => {
                    // The primary context, which the real worker makes current on each
                    // executor thread, unless the program made one of its own current there.
                    let current = current_context();
                    put_u64(a[0], current.unwrap_or_else(|| self.primary_context()));
                    SUCCESS
                }
                _ => {
                    return Err(format!(
                        "{} is not emulated (the emulated backend runs no kernels or libraries)",
                        desc.name
                    ));
                }
            }
        };
        Ok(status)
    }

    fn window_reserve(&self, device: i32, size: u64) -> Result<crate::backend::Window, (i64, String)> {
        let slot = u64::try_from(device).ok().filter(|&d| d < 4);
        let Some(slot) = slot else {
            return Err((INVALID_VALUE as i64, format!("no device {device}")));
        };
        let size = size.div_ceil(WINDOW_GRANULARITY) * WINDOW_GRANULARITY;
        let base = WINDOW_BASE + slot * WINDOW_STRIDE;
        let free = self.total_mem().saturating_sub(self.state().used);
        Ok(crate::backend::Window { base, size: size.min(WINDOW_STRIDE), granularity: WINDOW_GRANULARITY, free })
    }

    fn window_map(&self, _device: i32, address: u64, size: u64) -> Result<(), (i64, String)> {
        let mut s = self.state();
        if s.used.saturating_add(size) > self.total_mem() {
            return Err((OUT_OF_MEMORY as i64, format!("{size} bytes more than the device has")));
        }
        let len = usize::try_from(size).map_err(|_| (OUT_OF_MEMORY as i64, "too large".to_owned()))?;
        let mut buf = Vec::new();
        buf.try_reserve_exact(len).map_err(|_| (OUT_OF_MEMORY as i64, format!("{size} bytes of host memory")))?;
        buf.resize(len, 0);
        s.used += size;
        s.allocations.insert(address, buf);
        Ok(())
    }

    fn window_unmap(&self, _device: i32, address: u64, _size: u64, _reset: bool) -> Result<(), (i64, String)> {
        match self.free(address) {
            SUCCESS => Ok(()),
            status => Err((status as i64, format!("no allocation at {address:#x}"))),
        }
    }

    fn function_name(&self, _handle: u64, _kernel: bool) -> Result<String, (i64, String)> {
        Err((NOT_SUPPORTED, "the emulated backend has no functions".into()))
    }

    fn graph_list(&self, query: &GraphList) -> Result<NodeList, (i64, String)> {
        self.list(query)
    }

    fn status_texts(&self, library: &str, _function: &str, values: &[i64]) -> Result<Vec<String>, (i64, String)> {
        // No library here: each value's name at the newest CUDA version, marked, so tests
        // can tell the server answered.
        let version = chidori_cuda::status::BY_VERSION.last().map(|(v, _)| *v).unwrap_or_default();
        let table = chidori_cuda::status::table(version, library);
        Ok(values
            .iter()
            .map(|&v| match table.and_then(|t| chidori_cuda::status::find(t, v)) {
                Some(s) => format!("{} (emulated)", s.name.trim_end_matches('\0')),
                None => "unknown status (emulated)".to_owned(),
            })
            .collect())
    }

    fn nccl_last_error(&self, _comm: u64) -> Result<String, (i64, String)> {
        Ok(self.state().nccl_last_error.clone())
    }

    fn graph_dot(&self, graph: u64, _flags: u32) -> Result<String, (i64, String)> {
        self.dot(graph)
    }

    fn link(
        &self,
        _request: &chidori_protocol::messages::LinkRequest,
    ) -> Result<chidori_protocol::messages::LinkResult, (i64, String)> {
        Err((NOT_SUPPORTED, "the emulated backend has no JIT linker".into()))
    }

    /// A stand-in for nvJitLink with its rules on options and inputs: `-arch=sm_NN` is
    /// required, an input must be non-empty and of a known type; the "CUBIN" is an ELF
    /// magic and the inputs' bytes, PTX only with `-ptx`.
    fn jit_link(
        &self,
        request: &chidori_protocol::messages::JitLinkRequest,
    ) -> Result<chidori_protocol::messages::JitLinkResult, (i64, String)> {
        use chidori_cuda::consts::nvJitLinkInputType as input;
        use chidori_cuda::consts::nvJitLinkResult as result;
        use chidori_protocol::messages::JitLinkResult;
        let fail = |status: u32, log: String| JitLinkResult {
            status: i64::from(status),
            error_log: format!("{log}\0").into_bytes(),
            ..JitLinkResult::default()
        };
        let Some(arch) = request.options.iter().find_map(|o| o.strip_prefix("-arch=")) else {
            return Ok(fail(result::NVJITLINK_ERROR_MISSING_ARCH, "ERROR: -arch=sm_NN is required".into()));
        };
        if let Some(o) =
            request.options.iter().find(|o| !o.starts_with("-arch=") && !["-ptx", "-lto"].contains(&o.as_str()))
        {
            return Ok(fail(result::NVJITLINK_ERROR_UNRECOGNIZED_OPTION, format!("ERROR: unrecognized option {o}")));
        }
        let known = |kind: u32| {
            matches!(kind, input::NVJITLINK_INPUT_CUBIN..=input::NVJITLINK_INPUT_INDEX | input::NVJITLINK_INPUT_ANY)
        };
        if let Some((kind, name, _)) = request.inputs.iter().find(|(kind, _, bytes)| bytes.is_empty() || !known(*kind))
        {
            let why = format!("ERROR: input {name:?} (type {kind}) is empty or of no known type");
            return Ok(fail(result::NVJITLINK_ERROR_INVALID_INPUT, why));
        }
        let mut cubin = b"\x7fELF".to_vec();
        for (_, _, bytes) in &request.inputs {
            cubin.extend_from_slice(bytes);
        }
        let ptx =
            if request.options.iter().any(|o| o == "-ptx") { b"// emulated link\n\0".to_vec() } else { Vec::new() };
        Ok(JitLinkResult {
            status: i64::from(result::NVJITLINK_SUCCESS),
            cubin,
            ptx,
            info_log: format!("emulated link: {} inputs for {arch}\0", request.inputs.len()).into_bytes(),
            error_log: Vec::new(),
        })
    }

    unsafe fn graph_node(
        &self,
        request: &GraphNode,
        params: &mut [u8],
        _layout: &[(u32, u32)],
        host: Option<HostFn>,
    ) -> Result<NodeMade, (i64, String)> {
        self.node(request, params, host)
    }

    /// A module whose kernels are the `.text.<name>` sections its uncompressed cubins name
    /// (the client's module loading, made ahead or not, can be tested; nothing runs).
    fn load_module(&self, image: &[u8]) -> Result<ModuleLoad, (i64, String)> {
        let names = kernel_section_names(image);
        if names.is_empty() {
            return Err((NOT_SUPPORTED, "the emulated backend loads only uncompressed cubins with kernels".into()));
        }
        let variables = data_symbols(image);
        let mut s = self.state();
        let (library, module) = (s.handle(), s.handle());
        let mut kernels = Vec::new();
        let mut functions = Vec::new();
        for name in names {
            let (kernel, function) = (s.handle(), s.handle());
            s.kernel_functions.insert(kernel, function);
            functions.push((name.clone(), function));
            kernels.push(ModuleKernel { name, params: Vec::new(), handle: KernelHandle::Kernel(kernel) });
        }
        s.variables.insert(library, variables);
        s.functions.insert(module, functions);
        Ok(ModuleLoad { library, module, context: 0, kernels })
    }

    fn module_function(&self, kernel: u64, _context: u64) -> Result<u64, (i64, String)> {
        let found = self.state().kernel_functions.get(&kernel).copied();
        found.ok_or_else(|| (INVALID_HANDLE as i64, format!("{kernel:#x} is no kernel of a loaded module")))
    }

    fn global(&self, library: u64, name: &str) -> Result<(u64, u64), (i64, String)> {
        let key = (library, name.to_owned());
        let init = {
            let s = self.state();
            if let Some(&known) = s.globals.get(&key) {
                return Ok(known);
            }
            let Some(variables) = s.variables.get(&library) else {
                return Err((INVALID_HANDLE as i64, format!("{library:#x} is no library of the emulated backend")));
            };
            match variables.iter().find(|(n, _)| n == name) {
                Some((_, init)) => init.clone(),
                None => return Err((NOT_FOUND as i64, format!("no variable {name} in the library"))),
            }
        };
        let size = init.len() as u64;
        let address = self.alloc(size).map_err(|status| (status as i64, format!("{size} bytes for {name}")))?;
        let mut s = self.state();
        if let Some(bytes) = s.find(address, size) {
            bytes.copy_from_slice(&init);
        }
        s.globals.insert(key, (address, size));
        Ok((address, size))
    }

    fn stream_capturing(&self, stream: u64) -> bool {
        self.state().graphs.capturing(stream).is_some()
    }

    fn host_accessible(&self, addr: u64, len: u64) -> bool {
        // The emulated device's memory is the worker's own.
        len > 0 && self.state().find(addr, len).is_some()
    }

    fn read_host_accessible(&self, addr: u64, out: &mut [u8]) -> Result<(), String> {
        let mut s = self.state();
        let bytes = s.find(addr, out.len() as u64).ok_or_else(|| format!("{addr:#x} is no emulated memory"))?;
        out.copy_from_slice(bytes);
        Ok(())
    }

    fn write_host_accessible(&self, addr: u64, bytes: &[u8]) -> Result<(), String> {
        let mut s = self.state();
        let target = s.find(addr, bytes.len() as u64).ok_or_else(|| format!("{addr:#x} is no emulated memory"))?;
        target.copy_from_slice(bytes);
        Ok(())
    }

    fn function_params(&self, _function: u64) -> Result<Vec<(u32, u32)>, (i64, String)> {
        Err((NOT_SUPPORTED, "the emulated backend has no functions".into()))
    }

    unsafe fn launch(&self, _launch: &Launch, _params: &mut [u8], _layout: &[(u32, u32)]) -> i64 {
        NOT_SUPPORTED
    }

    fn map_host(&self, base: u64, len: u64) -> Result<(), String> {
        self.state().mapped.insert(base, len);
        Ok(())
    }

    fn graph_loop(&self, request: &GraphLoop, progress: &mut dyn FnMut(u32, &[u8])) -> LoopEnd {
        let Some(ops) = self.state().graphs.ops(request.exec) else {
            return LoopEnd { steps: 0, stopped_at: None, status: INVALID_HANDLE as i64, idle: false };
        };
        let mut device = EmulatedLoop { backend: self, request, ops, slots: Default::default() };
        run_loop(request, &mut device, progress)
    }

    fn unmap_host(&self, base: u64) {
        self.state().mapped.remove(&base);
    }

    fn user_object(
        &self,
        _desc: &'static CallDesc,
        out: u64,
        refcount: u32,
        flags: u32,
        destroy: HostFn,
    ) -> Result<u64, String> {
        // As CUDA: a positive count and the one flag (cudaUserObjectNoDestructorSync, the
        // driver's number: the runtime's enum is not among the generated constants).
        if refcount == 0 || flags != chidori_cuda::consts::CUuserObject_flags_enum::CU_USER_OBJECT_NO_DESTRUCTOR_SYNC {
            return Ok(INVALID_VALUE);
        }
        let mut s = self.state();
        let handle = s.handle();
        s.user_objects.insert(handle, (u64::from(refcount), std::sync::Arc::new(destroy)));
        // SAFETY: `out` is the worker's 8-byte buffer for the new handle.
        unsafe { put_u64(out, handle) };
        Ok(SUCCESS)
    }

    fn host_fn(&self, _desc: &'static CallDesc, stream: u64, host: HostFn) -> Result<u64, String> {
        if !self.stream_ok(stream) {
            return Ok(INVALID_HANDLE);
        }
        // On a capturing stream: a host node of the graph, run on each replay.
        let host = std::sync::Arc::new(host);
        if let Some(status) = self.captured(stream, Some((graphs::kind::HOST, Op::Host(host.clone())))) {
            return Ok(status);
        }
        // Every earlier operation of the stream has completed: the stream reaches the host
        // function now.
        host(0, false);
        Ok(SUCCESS)
    }
}

/// A graph-replay loop on the emulated backend: every operation completes when issued, so a
/// checkpoint reads the flag and the output at once.
struct EmulatedLoop<'a> {
    backend: &'a Emulated,
    request: &'a GraphLoop,
    ops: Vec<Op>,
    slots: [(u32, Vec<u8>); LOOP_SLOTS],
}

impl LoopDevice for EmulatedLoop<'_> {
    fn launch(&mut self) -> Result<(), i64> {
        match self.backend.replay(&self.ops) {
            SUCCESS => Ok(()),
            status => Err(status as i64),
        }
    }

    fn checkpoint(&mut self, slot: usize, from: u32, to: u32) -> Result<(), i64> {
        let r = self.request;
        let mut s = self.backend.state();
        let flag = if r.stop_flag == 0 {
            0
        } else {
            let bytes = s.find(r.stop_flag, 4).ok_or(INVALID_VALUE as i64)?;
            u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]])
        };
        let mut out = Vec::new();
        if r.output != 0 {
            let per = u64::from(r.bytes_per_step);
            let len = u64::from(to - from) * per;
            let at = r.output + u64::from(from) * per;
            out = s.find(at, len).ok_or(INVALID_VALUE as i64)?.to_vec();
        }
        self.slots[slot] = (flag, out);
        Ok(())
    }

    fn examine(&mut self, slot: usize) -> Result<(u32, &[u8]), i64> {
        let (flag, out) = &self.slots[slot];
        Ok((*flag, out))
    }

    fn copy(&mut self, copy: &LoopCopy) -> Result<(), i64> {
        let mut s = self.backend.state();
        let bytes = s.find(copy.src, copy.bytes).ok_or(INVALID_VALUE as i64)?.to_vec();
        s.find(copy.dst, copy.bytes).ok_or(INVALID_VALUE as i64)?.copy_from_slice(&bytes);
        Ok(())
    }

    fn drain(&mut self) -> Result<(), i64> {
        Ok(())
    }

    fn synchronize_device(&mut self) -> Result<(), i64> {
        // Every operation completes when issued.
        Ok(())
    }
}

/// `cusolverSpXcsrpermHost` on the worker's copies of the caller's arrays: B = P*A*Q^T, each
/// of B's rows in column order, `map` permuted alike. `a`: handle, m, n, nnzA, descrA,
/// csrRowPtrA, csrColIndA, p, q, map, pBuffer. CUSOLVER_STATUS_INVALID_VALUE for a
/// pattern, permutation or workspace the library would refuse.
///
/// # Safety
/// The pointers are the worker's buffers of the lengths the spec gives (m + 1, nnzA, m, n,
/// nnzA), or NULL.
unsafe fn permute_csr(a: &[u64]) -> u64 {
    let (Ok(m), Ok(n), Ok(nnz)) =
        (usize::try_from(a[1] as i32), usize::try_from(a[2] as i32), usize::try_from(a[3] as i32))
    else {
        return CUSOLVER_INVALID_VALUE;
    };
    if [a[5], a[6], a[7], a[8], a[9], a[10]].contains(&0) {
        return CUSOLVER_INVALID_VALUE;
    }
    // SAFETY: the worker's buffers of these lengths (the wire form's), checked non-null.
    let (rows, cols, p, q, map) = unsafe {
        (
            std::slice::from_raw_parts_mut(a[5] as *mut i32, m + 1),
            std::slice::from_raw_parts_mut(a[6] as *mut i32, nnz),
            std::slice::from_raw_parts(a[7] as *const i32, m),
            std::slice::from_raw_parts(a[8] as *const i32, n),
            std::slice::from_raw_parts_mut(a[9] as *mut i32, nnz),
        )
    };
    let index = |v: i32, len: usize| usize::try_from(v).ok().filter(|&v| v < len);
    let mut q_inverse = vec![usize::MAX; n];
    for (j, &c) in q.iter().enumerate() {
        match index(c, n) {
            Some(c) if q_inverse[c] == usize::MAX => q_inverse[c] = j,
            _ => return CUSOLVER_INVALID_VALUE,
        }
    }
    let monotone = rows[0] == 0 && rows[m] as usize == nnz && rows.windows(2).all(|w| w[0] <= w[1]);
    if !monotone || cols.iter().any(|&c| index(c, n).is_none()) {
        return CUSOLVER_INVALID_VALUE;
    }
    let (old_rows, old_cols, old_map) = (rows.to_vec(), cols.to_vec(), map.to_vec());
    let mut seen = vec![false; m];
    let mut at = 0;
    for i in 0..m {
        let Some(r) = index(p[i], m).filter(|&r| !std::mem::replace(&mut seen[r], true)) else {
            return CUSOLVER_INVALID_VALUE;
        };
        let (start, end) = (old_rows[r] as usize, old_rows[r + 1] as usize);
        let mut entries: Vec<(usize, i32)> =
            (start..end).map(|k| (q_inverse[old_cols[k] as usize], old_map[k])).collect();
        entries.sort_unstable();
        rows[i] = at as i32;
        for (column, from) in entries {
            cols[at] = column as i32;
            map[at] = from;
            at += 1;
        }
    }
    rows[m] = at as i32;
    SUCCESS
}

#[cfg(test)]
mod tests {
    use chidori_cuda::calls::VARIANTS;
    use chidori_protocol::desc::CallDesc;

    use super::{Emulated, INVALID_HANDLE, INVALID_VALUE, NOT_FOUND, SUCCESS};
    use crate::backend::Backend;

    fn variant(name: &str) -> &'static CallDesc {
        VARIANTS.iter().copied().find(|d| d.name == name && d.versions.contains(&"13.0")).expect(name)
    }

    /// An emulated backend of the recorded H200, as a worker process has one.
    fn backend() -> Emulated {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("profiles/nvidia-h200.json");
        Emulated::new(crate::profile::load(&path).expect("the recorded device profile"))
    }

    /// `name` called on `backend` with `args` (pointers to the test's locals, or values): its
    /// status.
    fn call(backend: &Emulated, name: &str, args: &[u64]) -> u64 {
        // SAFETY: every pointer among the arguments is a live local of the caller, as large
        // as the call writes or reads.
        unsafe { backend.invoke(variant(name), args) }.expect(name)
    }

    /// A thread's contexts are a stack: a created one goes on top, a pop brings back the one
    /// it covered, a destroy of the current one pops it, a set replaces the top.
    #[test]
    fn contexts_stack_per_thread() {
        let b = backend();
        let current = || {
            let mut c = 0u64;
            assert_eq!(call(&b, "cuCtxGetCurrent", &[&raw mut c as u64]), SUCCESS);
            c
        };
        let primary = current();
        let (mut first, mut second, mut popped) = (0u64, 0u64, 0u64);
        assert_eq!(call(&b, "cuCtxCreate_v2", &[&raw mut first as u64, 0, 0]), SUCCESS);
        assert_eq!(call(&b, "cuCtxCreate_v2", &[&raw mut second as u64, 0, 0]), SUCCESS);
        assert_eq!(current(), second);
        assert_eq!(call(&b, "cuCtxPopCurrent_v2", &[&raw mut popped as u64]), SUCCESS);
        assert_eq!((popped, current()), (second, first), "the pop brings back the one it covered");
        assert_eq!(call(&b, "cuCtxSetCurrent", &[second]), SUCCESS);
        assert_eq!(current(), second, "a set replaces the top");
        assert_eq!(call(&b, "cuCtxDestroy_v2", &[second]), SUCCESS);
        assert_eq!(current(), primary, "the destroyed current context is popped");
    }

    /// Whether a shared memory object of the name in `handle` exists.
    fn shm_exists(handle: &[u8; 64]) -> bool {
        let end = handle.iter().position(|&b| b == 0).expect("a NUL-terminated name");
        let name = std::ffi::CString::new(&handle[..end]).expect("a name");
        // SAFETY: a NUL-terminated name; the descriptor is closed at once.
        unsafe {
            let fd = libc::shm_open(name.as_ptr(), libc::O_RDWR, 0);
            if fd >= 0 {
                libc::close(fd);
            }
            fd >= 0
        }
    }

    /// The base and length cuMemGetAddressRange_v2 answers for `addr`, or its status.
    fn range(backend: &Emulated, addr: u64) -> Result<(u64, u64), u64> {
        let (mut base, mut len) = (0u64, 0u64);
        match call(backend, "cuMemGetAddressRange_v2", &[&raw mut base as u64, &raw mut len as u64, addr]) {
            SUCCESS => Ok((base, len)),
            status => Err(status),
        }
    }

    #[test]
    fn memory_and_events_are_shared_between_backends_by_ipc_handles() {
        let (a, b) = (backend(), backend());
        let mut p = 0u64;
        assert_eq!(call(&a, "cudaMalloc", &[&raw mut p as u64, 4096]), SUCCESS);
        let pattern: Vec<u8> = (0..4096u32).map(|i| (i * 7 % 251) as u8).collect();
        assert_eq!(call(&a, "cuMemcpyHtoD_v2", &[p, pattern.as_ptr() as u64, 4096]), SUCCESS);
        assert_eq!(range(&a, p + 10), Ok((p, 4096)));

        // Only an allocation's base is exported; exporting it again names the same memory.
        let mut handle = [0u8; 64];
        assert_eq!(call(&a, "cudaIpcGetMemHandle", &[handle.as_mut_ptr() as u64, p + 8]), INVALID_VALUE);
        assert_eq!(call(&a, "cudaIpcGetMemHandle", &[handle.as_mut_ptr() as u64, p]), SUCCESS);
        assert!(handle.starts_with(b"/chidori-emu-") && shm_exists(&handle), "{handle:?}");
        let mut again = [0u8; 64];
        assert_eq!(call(&a, "cuIpcGetMemHandle", &[again.as_mut_ptr() as u64, p]), SUCCESS);
        assert_eq!(again, handle);
        // The exporter still reads and finds its memory where it was.
        let mut seen = vec![0u8; 4096];
        assert_eq!(call(&a, "cuMemcpyDtoH_v2", &[seen.as_mut_ptr() as u64, p, 4096]), SUCCESS);
        assert_eq!(seen, pattern);
        assert_eq!(range(&a, p + 4095), Ok((p, 4096)));
        let mut q = 0u64;
        assert_eq!(call(&a, "cudaIpcOpenMemHandle", &[&raw mut q as u64, handle.as_ptr() as u64, 1]), INVALID_VALUE);

        // The other backend opens it, reads the pattern and writes bytes the exporter sees.
        assert_eq!(call(&b, "cudaIpcOpenMemHandle", &[&raw mut q as u64, handle.as_ptr() as u64, 1]), SUCCESS);
        assert_ne!(q, 0);
        assert_eq!(range(&b, q), Ok((q, 4096)));
        assert_eq!(range(&b, q + 4095), Ok((q, 4096)));
        assert_eq!(range(&b, q + 4096), Err(NOT_FOUND));
        let mut read = vec![0u8; 4096];
        assert_eq!(call(&b, "cuMemcpyDtoH_v2", &[read.as_mut_ptr() as u64, q, 4096]), SUCCESS);
        assert_eq!(read, pattern);
        let news = [0xabu8; 100];
        assert_eq!(call(&b, "cuMemcpyHtoD_v2", &[q + 100, news.as_ptr() as u64, 100]), SUCCESS);
        assert_eq!(call(&a, "cuMemcpyDtoH_v2", &[seen.as_mut_ptr() as u64, p, 4096]), SUCCESS);
        assert_eq!(&seen[100..200], &news[..]);
        assert_eq!(&seen[..100], &pattern[..100]);
        assert_eq!(&seen[200..], &pattern[200..]);
        // Opened memory is closed, not freed, and closed once per open.
        let mut twice = 0u64;
        assert_eq!(call(&b, "cuIpcOpenMemHandle_v2", &[&raw mut twice as u64, handle.as_ptr() as u64, 1]), SUCCESS);
        assert_eq!(twice, q);
        assert_eq!(call(&b, "cudaFree", &[q]), INVALID_VALUE);
        assert_eq!(call(&b, "cudaIpcCloseMemHandle", &[q]), SUCCESS);
        assert_eq!(range(&b, q), Ok((q, 4096)));
        assert_eq!(call(&b, "cuIpcCloseMemHandle", &[q]), SUCCESS);
        assert_eq!(range(&b, q), Err(NOT_FOUND));
        assert_eq!(call(&b, "cudaIpcCloseMemHandle", &[q]), INVALID_VALUE);
        assert_eq!(call(&a, "cudaIpcCloseMemHandle", &[p]), INVALID_VALUE, "the exporter frees, never closes");

        // Freed by the exporter, the memory and its shared memory object are gone.
        assert_eq!(call(&a, "cudaFree", &[p]), SUCCESS);
        assert!(!shm_exists(&handle));
        assert_eq!(range(&a, p), Err(NOT_FOUND));
        assert_eq!(call(&b, "cudaIpcOpenMemHandle", &[&raw mut q as u64, handle.as_ptr() as u64, 1]), INVALID_VALUE);
        let mut foreign = [0u8; 64];
        foreign[..9].copy_from_slice(b"/dev/null");
        assert_eq!(call(&b, "cudaIpcOpenMemHandle", &[&raw mut q as u64, foreign.as_ptr() as u64, 1]), INVALID_VALUE);

        // Events: a live one's handle opens as a new event of the other backend.
        let (mut event, mut opened) = (0u64, 0u64);
        let mut event_handle = [0u8; 64];
        assert_eq!(call(&a, "cudaIpcGetEventHandle", &[event_handle.as_mut_ptr() as u64, 77]), INVALID_HANDLE);
        assert_eq!(call(&a, "cudaEventCreateWithFlags", &[&raw mut event as u64, 6]), SUCCESS);
        assert_eq!(call(&a, "cudaIpcGetEventHandle", &[event_handle.as_mut_ptr() as u64, event]), SUCCESS);
        assert!(event_handle.starts_with(b"ev-"), "{event_handle:?}");
        let open = [&raw mut opened as u64, event_handle.as_ptr() as u64];
        assert_eq!(call(&b, "cudaIpcOpenEventHandle", &open), SUCCESS);
        assert_eq!(call(&b, "cudaEventQuery", &[opened]), SUCCESS);
        assert_eq!(call(&b, "cuIpcOpenEventHandle", &[&raw mut opened as u64, handle.as_ptr() as u64]), INVALID_VALUE);
    }

    #[test]
    fn a_backend_that_goes_removes_the_memory_it_shared() {
        let (a, b) = (backend(), backend());
        let (mut p, mut q) = (0u64, 0u64);
        let mut handle = [0u8; 64];
        assert_eq!(call(&a, "cuMemAlloc_v2", &[&raw mut p as u64, 1000]), SUCCESS);
        assert_eq!(call(&a, "cuIpcGetMemHandle", &[handle.as_mut_ptr() as u64, p]), SUCCESS);
        assert_eq!(call(&b, "cuIpcOpenMemHandle_v2", &[&raw mut q as u64, handle.as_ptr() as u64, 1]), SUCCESS);
        assert_eq!(range(&b, q + 999), Ok((q, 1000)));
        drop(a);
        assert!(!shm_exists(&handle));
        // What the opener mapped stays readable until it closes it.
        let mut byte = [1u8; 1];
        assert_eq!(call(&b, "cuMemcpyDtoH_v2", &[byte.as_mut_ptr() as u64, q + 999, 1]), SUCCESS);
        assert_eq!(byte, [0]);
        assert_eq!(call(&b, "cuIpcCloseMemHandle", &[q]), SUCCESS);
    }

    /// A CUmemAllocationProp of pinned memory on device 0 that may be exported as
    /// `handle_types`.
    fn allocation_prop(handle_types: u32) -> [u32; 8] {
        use chidori_cuda::consts::{CUmemAllocationType_enum as kind, CUmemLocationType_enum as location};
        [kind::CU_MEM_ALLOCATION_TYPE_PINNED, handle_types, location::CU_MEM_LOCATION_TYPE_DEVICE, 0, 0, 0, 0, 0]
    }

    /// A physical allocation of `len` bytes made with `prop`, mapped at a new reserved range
    /// with access set: (handle, address).
    fn vmm_map(backend: &Emulated, prop: &[u32; 8], len: u64) -> (u64, u64) {
        let (mut handle, mut addr) = (0u64, 0u64);
        let access = [chidori_cuda::consts::CUmemLocationType_enum::CU_MEM_LOCATION_TYPE_DEVICE, 0, 3u32];
        assert_eq!(call(backend, "cuMemCreate", &[&raw mut handle as u64, len, prop.as_ptr() as u64, 0]), SUCCESS);
        assert_eq!(call(backend, "cuMemAddressReserve", &[&raw mut addr as u64, len, 0, 0, 0]), SUCCESS);
        assert_eq!(call(backend, "cuMemMap", &[addr, len, 0, handle, 0]), SUCCESS);
        assert_eq!(call(backend, "cuMemSetAccess", &[addr, len, access.as_ptr() as u64, 1]), SUCCESS);
        (handle, addr)
    }

    /// The free memory cuMemGetInfo_v2 answers.
    fn free_memory(backend: &Emulated) -> u64 {
        let (mut free, mut total) = (0u64, 0u64);
        assert_eq!(call(backend, "cuMemGetInfo_v2", &[&raw mut free as u64, &raw mut total as u64]), SUCCESS);
        free
    }

    /// The requestedHandleTypes cuMemGetAllocationPropertiesFromHandle answers for `handle`.
    fn handle_types(backend: &Emulated, handle: u64) -> u32 {
        let mut prop = [0u32; 8];
        assert_eq!(
            call(backend, "cuMemGetAllocationPropertiesFromHandle", &[prop.as_mut_ptr() as u64, handle]),
            SUCCESS
        );
        prop[1]
    }

    /// The device and inode of the file open as `fd`.
    fn file_id(fd: i32) -> (u64, u64) {
        // SAFETY: a zeroed `stat` is a valid value for fstat to overwrite; `fd` is the test's.
        unsafe {
            let mut stat: libc::stat = std::mem::zeroed();
            assert_eq!(libc::fstat(fd, &mut stat), 0);
            (stat.st_dev, stat.st_ino)
        }
    }

    #[test]
    fn vmm_allocations_are_shared_between_backends_by_file_descriptors() {
        use chidori_cuda::consts::CUmemAllocationHandleType_enum as handle_type;
        const G: u64 = super::vmm::GRANULARITY;
        const POSIX_FD: u32 = handle_type::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
        let not_supported = super::NOT_SUPPORTED as u64;
        let (a, b) = (backend(), backend());
        let (a_free, b_free) = (free_memory(&a), free_memory(&b));

        // The exporter writes through its mapping, then exports: the bytes move into shared
        // memory, and it still reads them where they were.
        let (ha, pa) = vmm_map(&a, &allocation_prop(POSIX_FD), G);
        assert_eq!(handle_types(&a, ha), POSIX_FD);
        let pattern: Vec<u8> = (0..4096u32).map(|i| (i * 7 % 251) as u8).collect();
        assert_eq!(call(&a, "cuMemcpyHtoD_v2", &[pa + 1000, pattern.as_ptr() as u64, 4096]), SUCCESS);
        let export = |handle: u64, kind: u32| {
            let mut fd = [-1i32; 2];
            let status = call(&a, "cuMemExportToShareableHandle", &[fd.as_mut_ptr() as u64, handle, kind.into(), 0]);
            (status, fd[0])
        };
        assert_eq!(export(ha, handle_type::CU_MEM_HANDLE_TYPE_WIN32), (not_supported, -1));
        assert_eq!(export(ha + 1, POSIX_FD), (INVALID_HANDLE, -1));
        let (status, fd) = export(ha, POSIX_FD);
        assert_eq!(status, SUCCESS);
        assert!(fd >= 0);
        // Each export is a new descriptor of the same object.
        let (status, again) = export(ha, POSIX_FD);
        assert_eq!(status, SUCCESS);
        assert_ne!(again, fd);
        assert_eq!(file_id(again), file_id(fd));
        // SAFETY: the descriptor the export gave the test.
        assert_eq!(unsafe { libc::close(again) }, 0);
        let mut seen = vec![0u8; 4096];
        assert_eq!(call(&a, "cuMemcpyDtoH_v2", &[seen.as_mut_ptr() as u64, pa + 1000, 4096]), SUCCESS);
        assert_eq!(seen, pattern);
        assert_eq!(range(&a, pa + 5), Ok((pa, G)));
        assert_eq!(range(&a, pa + G - 1), Ok((pa, G)));
        assert_eq!(free_memory(&a), a_free - G);

        // The importer maps it (the descriptor closed meanwhile), reads the pattern and writes
        // bytes the exporter sees, and the other way round.
        let import = |fd: i32, kind: u32| {
            let mut handle = 0u64;
            let status = call(&b, "cuMemImportFromShareableHandle", &[&raw mut handle as u64, fd as u64, kind.into()]);
            (status, handle)
        };
        assert_eq!(import(fd, handle_type::CU_MEM_HANDLE_TYPE_WIN32).0, not_supported);
        let (status, hb) = import(fd, POSIX_FD);
        assert_eq!(status, SUCCESS);
        // SAFETY: the descriptor the export gave the test, which the import left open.
        assert_eq!(unsafe { libc::close(fd) }, 0);
        assert_eq!(handle_types(&b, hb), POSIX_FD);
        let mut pb = 0u64;
        let access = [chidori_cuda::consts::CUmemLocationType_enum::CU_MEM_LOCATION_TYPE_DEVICE, 0, 3u32];
        assert_eq!(call(&b, "cuMemAddressReserve", &[&raw mut pb as u64, G, 0, 0, 0]), SUCCESS);
        assert_eq!(call(&b, "cuMemMap", &[pb, G, 0, hb, 0]), SUCCESS);
        assert_eq!(call(&b, "cuMemSetAccess", &[pb, G, access.as_ptr() as u64, 1]), SUCCESS);
        assert_eq!(range(&b, pb + 1), Ok((pb, G)));
        // The import is the exporter's memory: it uses none of the importer's.
        assert_eq!(free_memory(&b), b_free);
        let mut read = vec![0u8; 4096];
        assert_eq!(call(&b, "cuMemcpyDtoH_v2", &[read.as_mut_ptr() as u64, pb + 1000, 4096]), SUCCESS);
        assert_eq!(read, pattern);
        let news = [0xabu8; 100];
        assert_eq!(call(&b, "cuMemcpyHtoD_v2", &[pb + 3000, news.as_ptr() as u64, 100]), SUCCESS);
        assert_eq!(call(&a, "cuMemcpyDtoH_v2", &[seen.as_mut_ptr() as u64, pa + 1000, 4096]), SUCCESS);
        assert_eq!(&seen[2000..2100], &news[..]);
        assert_eq!(&seen[..2000], &pattern[..2000]);
        assert_eq!(call(&a, "cuMemsetD8_v2", &[pa + G - 10, 0x5a, 10]), SUCCESS);
        assert_eq!(call(&b, "cuMemcpyDtoH_v2", &[read.as_mut_ptr() as u64, pb + G - 10, 10]), SUCCESS);
        assert_eq!(&read[..10], &[0x5a; 10]);
        // Unmapped and mapped again, the piece still shows the shared bytes.
        assert_eq!(call(&b, "cuMemUnmap", &[pb, G]), SUCCESS);
        assert_eq!(range(&b, pb), Err(NOT_FOUND));
        assert_eq!(call(&b, "cuMemMap", &[pb, G, 0, hb, 0]), SUCCESS);
        assert_eq!(call(&b, "cuMemcpyDtoH_v2", &[read.as_mut_ptr() as u64, pb + 3000, 100]), SUCCESS);
        assert_eq!(&read[..100], &news[..]);
        // A mapped piece is neither freed nor closed nor exported by CUDA IPC.
        let mut ipc = [0u8; 64];
        assert_eq!(call(&b, "cuMemFree_v2", &[pb]), INVALID_VALUE);
        assert_eq!(call(&b, "cuIpcCloseMemHandle", &[pb]), INVALID_VALUE);
        assert_eq!(call(&a, "cuIpcGetMemHandle", &[ipc.as_mut_ptr() as u64, pa]), INVALID_VALUE);

        // The exporter releases while mapped, then unmaps: its memory is gone, the importer's
        // mapping stays.
        assert_eq!(call(&a, "cuMemRelease", &[ha]), SUCCESS);
        assert_eq!(range(&a, pa), Ok((pa, G)));
        assert_eq!(call(&a, "cuMemUnmap", &[pa, G]), SUCCESS);
        assert_eq!(range(&a, pa), Err(NOT_FOUND));
        assert_eq!(call(&a, "cuMemRelease", &[ha]), INVALID_HANDLE);
        assert_eq!(call(&a, "cuMemAddressFree", &[pa, G]), SUCCESS);
        assert_eq!(free_memory(&a), a_free);
        assert_eq!(call(&b, "cuMemcpyDtoH_v2", &[read.as_mut_ptr() as u64, pb + 1000, 100]), SUCCESS);
        assert_eq!(&read[..100], &pattern[..100]);
        assert_eq!(call(&b, "cuMemUnmap", &[pb, G]), SUCCESS);
        assert_eq!(call(&b, "cuMemRelease", &[hb]), SUCCESS);
        assert_eq!(call(&b, "cuMemRelease", &[hb]), INVALID_HANDLE);
        assert_eq!(call(&b, "cuMemAddressFree", &[pb, G]), SUCCESS);

        // Only an exported allocation's descriptor imports: not a closed one, not an empty
        // file's, not another file's.
        assert_eq!(import(fd, POSIX_FD).0, INVALID_VALUE);
        assert_eq!(import(-1, POSIX_FD).0, INVALID_VALUE);
        let path = std::env::temp_dir().join(format!("chidori-vmm-test-{}", std::process::id()));
        let empty = std::fs::File::create(&path).expect("a file");
        assert_eq!(import(std::os::fd::AsRawFd::as_raw_fd(&empty), POSIX_FD).0, INVALID_VALUE);
        empty.set_len(G).expect("a longer file");
        assert_eq!(import(std::os::fd::AsRawFd::as_raw_fd(&empty), POSIX_FD).0, INVALID_VALUE);
        drop(empty);
        std::fs::remove_file(&path).expect("the file removed");

        // An allocation made without the POSIX descriptor type is not exported, and behaves
        // as ever: its bytes stay in this worker across an unmap.
        let (h, p) = vmm_map(&a, &allocation_prop(0), 2 * G);
        assert_eq!(handle_types(&a, h), 0);
        assert_eq!(export(h, POSIX_FD), (INVALID_VALUE, -1));
        assert_eq!(call(&a, "cuMemcpyHtoD_v2", &[p + G, pattern.as_ptr() as u64, 4096]), SUCCESS);
        assert_eq!(call(&a, "cuMemUnmap", &[p, 2 * G]), SUCCESS);
        assert_eq!(call(&a, "cuMemMap", &[p, 2 * G, 0, h, 0]), SUCCESS);
        assert_eq!(call(&a, "cuMemMap", &[p, 2 * G, 0, h, 0]), INVALID_VALUE);
        assert_eq!(call(&a, "cuMemcpyDtoH_v2", &[seen.as_mut_ptr() as u64, p + G, 4096]), SUCCESS);
        assert_eq!(seen, pattern);
        assert_eq!(call(&a, "cuMemRelease", &[h]), SUCCESS);
        assert_eq!(call(&a, "cuMemUnmap", &[p, 2 * G]), SUCCESS);
        assert_eq!(call(&a, "cuMemRelease", &[h]), INVALID_HANDLE);
        assert_eq!(free_memory(&a), a_free);
    }

    #[test]
    fn kernels_are_named_by_the_cubins_text_sections() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/fatbin/k_multi.fatbin");
        let image = std::fs::read(path).unwrap();
        assert_eq!(super::kernel_section_names(&image), ["_Z5otherPf", "_Z4kerniPf3S24cd"]);
        assert!(super::kernel_section_names(b"no sections .text. here .text.x").is_empty());
        assert_eq!(super::kernel_section_names(b".text.k\0.text.k\0"), ["k"]);
    }

    #[test]
    fn variables_are_the_cubins_data_symbols() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/fatbin/k_multi.fatbin");
        let image = std::fs::read(path).unwrap();
        let symbols = super::data_symbols(&image);
        assert!(symbols.iter().any(|(n, init)| n == "counter" && init == &[0; 4]), "{symbols:?}");
        assert!(super::data_symbols(b"\x7fELF but no header").is_empty());
    }
}
