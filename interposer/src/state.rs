//! Client-side CUDA state: what is answered without a round trip.
//!
//! * The device profile from the handshake (properties, attributes).
//! * Per-thread runtime state: current device, sticky last error.
//! * The interval map of device and pinned allocations, for pointer attributes and
//!   `cudaMemcpyDefault`. Device ranges are also reserved in this process's address space
//!   (PROT_NONE), so no later host allocation of the client can alias a device address.
//! * Deferred replies (asynchronous copies into pinned memory) that synchronizing calls
//!   wait for.

use std::cell::Cell;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::Hash;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, RwLock};

use chidori_cuda::structs::{FieldMap, StructMap};
use chidori_protocol::desc::CallDesc;
use chidori_protocol::messages::{PropValue, Welcome};

use crate::ahead::capture::Captures;
use crate::ahead::cudnn::Replay;
use crate::ahead::idle::Idle;
use crate::ahead::{Answers, Pool};
use crate::conn::Slot;

/// What the program set that the client answers from or acts on later: one owner for the
/// tables hand-written functions keep (each table has its own lock) and for what the
/// engines of answers made ahead learned ([`Ahead`]). State that one module alone reaches,
/// through functions of its own, stays private to it: the connection, the registry of
/// nvcc's registrations, the pinned-memory mirrors and the arena's free extents, the
/// interval map of allocations below, the store of earlier sessions' answers, the content
/// session, the records of modules each server holds and each command loaded.
pub struct Client {
    /// How the scalars of calls on a handle travel, for handles not in the default (host
    /// values of the parameter's widest size): cuBLAS and cuSPARSE handles and cuBLASLt
    /// matmul descriptors in device pointer mode, and each descriptor's scale type's width.
    pub scalar_modes: Table<u64, chidori_protocol::codec::ScalarMode>,
    /// cuBLAS math mode per handle, as last set.
    pub math_modes: Table<u64, u32>,
    /// Primary context flags per device, once known active (dropped by calls that change it).
    pub primary: Table<i32, u32>,
    /// cuDNN: the type of each backend descriptor the client named, until destroyed.
    pub cudnn_types: Table<u64, u32>,
    /// cuDNN: the attribute (name, values) last set on a backend descriptor whose values the
    /// library holds as the worker's own: a CUDNN_TYPE_HANDLE, or a variant pack's data
    /// pointers where host scalars travelled by value. Gets of it are answered from here.
    pub cudnn_set_values: Table<u64, (u32, Vec<u64>)>,
    /// cuDNN: the stream last set on each handle.
    pub cudnn_streams: Table<u64, u64>,
    /// Graph nodes the program made through the client: what it set, for GetParams.
    pub graph_nodes: Table<u64, crate::custom::graphs::NodeRecord>,
    /// Function and kernel names the server gave (cuFuncGetName), kept for the process.
    pub function_names: Table<u64, &'static std::ffi::CStr>,
    /// Context-local storage of the driver's private tables: (context, key) → entry.
    pub context_storage: Table<(u64, usize), crate::custom::export::StorageEntry>,
    /// Each device's primary context, as the runtime interface named it.
    pub primary_contexts: Table<i32, u64>,
    /// Each device's stream priorities (least, greatest) as the server answered them: a
    /// device's range never changes.
    pub stream_priorities: Table<i32, [i32; 2]>,
    /// Parameter layouts of functions, by handle: from module loads, and from the server
    /// for functions of cuModuleGetFunction (fetched once each).
    pub function_params: Table<u64, crate::modules::ParamLayout>,
    /// Modules loaded through the client, by their handle: their functions by name.
    pub modules: Table<u64, Arc<crate::modules::Loaded>>,
    /// The module content (sha256) and name of each function those modules hold: what a
    /// function's learned answers are keyed by.
    pub function_origins: Table<u64, ([u8; 32], Arc<str>)>,
    /// (function, CUfunction_attribute) this process set: not learned across sessions.
    pub attributes_set: Table<(u64, u32), ()>,
    /// NVRTC programs, which live on the client (compiled by the server's NVRTC).
    pub nvrtc_programs: Table<u64, crate::custom::nvrtc::Program>,
    /// nvJitLink links, which live on the client (linked by the server's nvJitLink).
    pub jit_links: Table<u64, crate::custom::nvjitlink::Link>,
    /// The driver's link states (`cuLinkCreate` … `cuLinkComplete`), by handle.
    pub link_states: Table<u64, crate::custom::link::LinkState>,
    /// cuRAND generators made by curandCreateGeneratorHost, until destroyed.
    pub host_generators: Table<u64, ()>,
    /// cuRAND's Sobol' tables fetched, by (function, set): never freed (the program may hold
    /// their pointers as long as it runs, as natively).
    pub curand_tables: Table<(&'static str, u64), &'static [u8]>,
    /// Graph loops started on the server, by id, while not being polled.
    pub loops: Table<u64, crate::custom::loops::Running>,
    /// cuBLASLt descriptors and preferences the client named: what was set on each.
    pub cublaslt_records: Table<u64, crate::custom::cublaslt::Record>,
    /// cuDNN descriptors whose content was fingerprinted for size queries (None: unknown).
    pub cudnn_fingerprints: Table<u64, Option<u64>>,
    /// What was set on each cuFFT plan since its create (`crate::runtime::cufft_plans`).
    pub cufft_prints: Table<u64, Option<u64>>,
    /// What was set on each cuSOLVER context and parameter object (`crate::runtime::solver_sizes`).
    pub solver_prints: Mutex<Option<crate::runtime::solver_sizes::Objects>>,
    /// What each cuSPARSE generic-API descriptor describes (`crate::runtime::sparse_sizes`;
    /// None: unknown).
    pub sparse_prints: Table<u64, Option<u64>>,
    /// cuSOLVER's low-level CPU-path info objects: the sizes their calls said.
    pub sp_infos: Table<u64, crate::custom::cusolver::SpInfo>,
    /// cuSPARSELt: matmul descriptors (by id) with alpha or beta vector scaling set.
    pub cusparselt_vectors: Table<u64, (bool, bool)>,
    /// cuSPARSELt: what each record the client named says (`runtime::sparselt_sizes`).
    pub sparselt_prints: Mutex<Option<crate::runtime::sparselt_sizes::Prints>>,
    /// What the engines of `crate::ahead` learned in this process.
    pub ahead: Ahead,
}

/// A call whose answer does not change while the process runs: its descriptor's wire index
/// and the values passed (`crate::runtime`).
pub type ConstantKey = (u32, Vec<u64>);

/// The state of the engines of answers made ahead (`crate::ahead`, `docs/ahead.md`), one
/// instance each for the process.
pub struct Ahead {
    /// Streams being captured, and what the worker said of their captures.
    pub captures: Captures,
    /// cuBLASLt heuristics by problem (`crate::custom::cublaslt`).
    pub heuristics: Answers<Vec<u8>, crate::custom::cublaslt::Answer>,
    /// cuDNN's legacy size queries by content (`crate::runtime::cudnn_sizes`).
    pub cudnn_sizes: Answers<u64, crate::runtime::kept::Answer>,
    /// cuSPARSELt's workspace and compressed sizes, by question (`runtime::sparselt_sizes`).
    pub sparselt_sizes: Answers<u64, crate::runtime::kept::Answer>,
    /// Function attributes fetched: (function handle, CUfunction_attribute) → value. They
    /// change only through cu/cudaFuncSetAttribute, which record the value they set.
    pub function_attributes: Answers<(u64, u32), i32>,
    /// The program set an attribute of a CUkernel, which also sets it for the kernel's
    /// functions (whose handles the client cannot tell apart): settable attributes are no
    /// longer learned or answered from what was learned.
    pub kernel_attributes_set: AtomicBool,
    /// Occupancy: (function, block size, dynamic shared memory, flags) → active blocks per SM.
    pub occupancy: Answers<crate::custom::kernels::OccupancyKey, i32>,
    /// The scope last found idle, and the copies in since (`crate::custom::sync`).
    pub idle: Idle,
    /// Events known complete (`crate::custom::sync`).
    pub events: crate::ahead::events::Events,
    /// Graphs and instances the server handed out and the program has not destroyed.
    pub graphs: crate::ahead::graphs::Lives,
    /// Device allocations placed by the client, by device (`crate::custom::placed`).
    pub windows: crate::ahead::windows::Windows,
    /// Answers of calls that do not change while the process runs (specs' `constant`:
    /// versions, properties), by (descriptor, the values passed): the return value and the
    /// outputs' bytes (`crate::runtime`).
    pub constants: Answers<ConstantKey, (u64, Vec<Vec<u8>>)>,
    /// cuDNN backend descriptors: what is asked after finalizes and fills, and the fills made
    /// ahead (`crate::custom::cudnn`).
    pub cudnn: Mutex<Option<Replay>>,
    /// The last `cudnnGetRNNWeightParams` the server answered, by its arguments (the output
    /// pointers only as null or not): the addresses it wrote, trusted while the connection
    /// has sent nothing since.
    pub rnn_weight_params: Answers<[u64; 9], (u64, u64)>,
    /// The dimensions of the descriptors the last forwarded `cudnnGetRNNWeightParams` filled,
    /// asked in its round trip, trusted while the connection has sent nothing since.
    pub rnn_filled_tensors: Answers<u64, crate::ahead::rnn::TensorNd>,
    /// The batch of a CTC loss's probabilities, by what their descriptor was set to (its
    /// fingerprint, `crate::runtime::cudnn_sizes::fingerprint`): asked once per shape.
    pub ctc_batches: Answers<u64, usize>,
    /// cuFFT plans made before: the status and work sizes, by the call and what was set on
    /// the plan (`crate::runtime::cufft_plans`).
    pub cufft_plans: Answers<u64, crate::runtime::kept::Answer>,
    /// cuSOLVER workspace sizes answered before, by the call and what was set on the
    /// objects it passes (`crate::runtime::solver_sizes`).
    pub solver_sizes: Answers<u64, crate::runtime::kept::Answer>,
    /// cuSPARSE buffer sizes answered before, by the call and what its descriptors describe
    /// (`crate::runtime::sparse_sizes`).
    pub sparse_sizes: Answers<u64, crate::runtime::kept::Answer>,
    /// cuFFT plans made ahead of the program's creates, by context (`crate::custom::cufft`).
    pub cufft_pool: Pool<u64, i32>,
    /// `cudnnGetRNNWeightParams` answers by what the RNN descriptor says (`crate::ahead::rnn`).
    pub rnn_weights: Answers<crate::ahead::rnn::Question, crate::ahead::rnn::Weights>,
}

pub static CLIENT: Client = Client {
    scalar_modes: Table::new(),
    math_modes: Table::new(),
    primary: Table::new(),
    cudnn_types: Table::new(),
    cudnn_set_values: Table::new(),
    cudnn_streams: Table::new(),
    graph_nodes: Table::new(),
    function_names: Table::new(),
    context_storage: Table::new(),
    primary_contexts: Table::new(),
    stream_priorities: Table::new(),
    function_params: Table::new(),
    modules: Table::new(),
    function_origins: Table::new(),
    attributes_set: Table::new(),
    nvrtc_programs: Table::new(),
    jit_links: Table::new(),
    link_states: Table::new(),
    host_generators: Table::new(),
    curand_tables: Table::new(),
    loops: Table::new(),
    cublaslt_records: Table::new(),
    cudnn_fingerprints: Table::new(),
    cufft_prints: Table::new(),
    solver_prints: Mutex::new(None),
    sparse_prints: Table::new(),
    sp_infos: Table::new(),
    cusparselt_vectors: Table::new(),
    sparselt_prints: Mutex::new(None),
    ahead: Ahead {
        captures: Captures::new(),
        heuristics: Answers::new(crate::custom::cublaslt::HEURISTIC_CACHE_LIMIT),
        cudnn_sizes: Answers::new(crate::runtime::cudnn_sizes::ANSWERS_MAX),
        sparselt_sizes: Answers::new(crate::runtime::sparselt_sizes::ANSWERS_MAX),
        function_attributes: Answers::new(1 << 16),
        kernel_attributes_set: AtomicBool::new(false),
        occupancy: Answers::new(1 << 16),
        idle: Idle::new(),
        events: crate::ahead::events::Events::new(),
        graphs: crate::ahead::graphs::Lives::new(),
        windows: crate::ahead::windows::Windows::new(),
        constants: Answers::new(4096),
        cudnn: Mutex::new(None),
        rnn_weight_params: Answers::new(1),
        rnn_filled_tensors: Answers::new(2),
        ctc_batches: Answers::new(256),
        rnn_weights: Answers::new(4096),
        cufft_plans: Answers::new(crate::runtime::cufft_plans::ANSWERS_MAX),
        solver_sizes: Answers::new(crate::runtime::solver_sizes::ANSWERS_MAX),
        sparse_sizes: Answers::new(crate::runtime::sparse_sizes::ANSWERS_MAX),
        cufft_pool: Pool::new(),
    },
};

/// A table of values by key behind one lock.
pub struct Table<K, V> {
    map: Mutex<Option<HashMap<K, V>>>,
}

impl<K, V> Table<K, V> {
    pub const fn new() -> Self {
        Table { map: Mutex::new(None) }
    }

    /// The map itself, for callers that change entries in place or several at once (the
    /// per-handle objects of NVRTC, nvJitLink, the driver's linker, graph loops).
    pub fn lock(&self) -> std::sync::MutexGuard<'_, Option<HashMap<K, V>>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl<K: Eq + Hash, V: Clone> Table<K, V> {
    pub fn get(&self, key: &K) -> Option<V> {
        self.lock().as_ref()?.get(key).cloned()
    }

    pub fn contains(&self, key: &K) -> bool {
        self.lock().as_ref().is_some_and(|m| m.contains_key(key))
    }

    pub fn insert(&self, key: K, value: V) {
        self.lock().get_or_insert_with(HashMap::new).insert(key, value);
    }

    pub fn remove(&self, key: &K) -> Option<V> {
        self.lock().as_mut()?.remove(key)
    }

    /// Change the value at `key` (a default one if absent); a value left at its default is
    /// removed.
    pub fn update(&self, key: K, f: impl FnOnce(&mut V))
    where
        K: Clone,
        V: Default + PartialEq,
    {
        let mut guard = self.lock();
        let map = guard.get_or_insert_with(HashMap::new);
        let value = map.entry(key.clone()).or_default();
        f(value);
        if *value == V::default() {
            map.remove(&key);
        }
    }

    pub fn clear(&self) {
        *self.lock() = None;
    }

    /// Remove and return the entries whose key `matches`.
    pub fn remove_where(&self, matches: impl Fn(&K) -> bool) -> Vec<(K, V)> {
        let mut guard = self.lock();
        let Some(map) = guard.as_mut() else { return Vec::new() };
        let (gone, kept): (HashMap<K, V>, HashMap<K, V>) = map.drain().partition(|(k, _)| matches(k));
        *map = kept;
        gone.into_iter().collect()
    }
}

impl<K: Eq + Hash, V: Clone> Default for Table<K, V> {
    fn default() -> Self {
        Self::new()
    }
}

/// A device as the handshake described it, indexed for lookups.
pub struct DeviceView {
    pub name: String,
    pub uuid: [u8; 16],
    pub total_mem: u64,
    pub attributes: HashMap<i32, i32>,
    pub props: HashMap<String, PropValue>,
}

pub struct Profile {
    pub devices: Vec<DeviceView>,
    pub driver_version: i32,
    /// GPUs NVML counts (the server's, before the program's `CUDA_VISIBLE_DEVICES`).
    pub nvml_devices: u32,
}

impl Profile {
    pub fn from_welcome(w: &Welcome) -> Profile {
        Profile {
            driver_version: w.driver_version,
            nvml_devices: w.nvml_devices,
            devices: w
                .devices
                .iter()
                .map(|d| DeviceView {
                    name: d.name.clone(),
                    uuid: d.uuid,
                    total_mem: d.total_mem,
                    attributes: d.attributes.iter().copied().collect(),
                    props: d.props.iter().cloned().collect(),
                })
                .collect(),
        }
    }

    pub fn device(&self, ordinal: i32) -> Option<&DeviceView> {
        usize::try_from(ordinal).ok().and_then(|i| self.devices.get(i))
    }
}

/// `cudaDeviceProp` fields that CUDA 13 removed, and the attribute each one mirrors (the
/// driver's names: the runtime's enum lost some of them in CUDA 13, with the same numbers).
const DERIVED_PROPS: &[(&str, u32)] = {
    use chidori_cuda::consts::CUdevice_attribute_enum as a;
    &[
        ("clockRate", a::CU_DEVICE_ATTRIBUTE_CLOCK_RATE),
        ("deviceOverlap", a::CU_DEVICE_ATTRIBUTE_GPU_OVERLAP),
        ("kernelExecTimeoutEnabled", a::CU_DEVICE_ATTRIBUTE_KERNEL_EXEC_TIMEOUT),
        ("computeMode", a::CU_DEVICE_ATTRIBUTE_COMPUTE_MODE),
        ("memoryClockRate", a::CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE),
        ("maxTexture1DLinear", a::CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE1D_LINEAR_WIDTH),
        ("singleToDoublePrecisionPerfRatio", a::CU_DEVICE_ATTRIBUTE_SINGLE_TO_DOUBLE_PRECISION_PERF_RATIO),
        ("cooperativeMultiDeviceLaunch", a::CU_DEVICE_ATTRIBUTE_COOPERATIVE_MULTI_DEVICE_LAUNCH),
    ]
};

/// Write a record field by field into `dst` (zeroed first) in the layout `map`.
///
/// # Safety
/// `dst` must be writable for `map.size` bytes.
pub unsafe fn write_record(map: &StructMap, dst: *mut u8, value: impl Fn(&FieldMap) -> Option<PropValue>) {
    // SAFETY: per the contract.
    let out = unsafe { std::slice::from_raw_parts_mut(dst, map.size as usize) };
    out.fill(0);
    for f in map.fields {
        let Some(v) = value(f) else { continue };
        let Some(slot) = out.get_mut(f.offset as usize..(f.offset + f.size) as usize) else { continue };
        match v {
            PropValue::Int(i) => {
                let bytes = i.to_le_bytes();
                let n = slot.len().min(8);
                slot[..n].copy_from_slice(&bytes[..n]);
            }
            PropValue::Ints(items) => {
                let n = element_count(f.ty).unwrap_or(items.len()).max(1);
                let width = (f.size as usize / n).min(8);
                for (i, item) in items.iter().take(n).enumerate() {
                    let at = i * width;
                    slot[at..at + width].copy_from_slice(&item.to_le_bytes()[..width]);
                }
            }
            PropValue::Text(t) => {
                let n = t.len().min(slot.len().saturating_sub(1));
                slot[..n].copy_from_slice(&t.as_bytes()[..n]);
            }
            PropValue::Bytes(b) => {
                let n = b.len().min(slot.len());
                slot[..n].copy_from_slice(&b[..n]);
            }
        }
    }
}

/// N of an IR array type `[T; N]`.
fn element_count(ty: &str) -> Option<usize> {
    ty.strip_prefix('[')?.strip_suffix(']')?.rsplit_once(';')?.1.trim().parse().ok()
}

/// Fill a `cudaDeviceProp` of CUDA `version`'s layout for `device`.
///
/// # Safety
/// `dst` must be writable for the size of that version's cudaDeviceProp.
pub unsafe fn device_props(version: &str, device: &DeviceView, dst: *mut u8) -> bool {
    let Some(map) = chidori_cuda::structs::get(version, "cudaDeviceProp") else { return false };
    // SAFETY: per the contract.
    unsafe {
        write_record(map, dst, |f| {
            if let Some(v) = device.props.get(f.name) {
                return Some(v.clone());
            }
            DERIVED_PROPS
                .iter()
                .find(|(n, _)| *n == f.name)
                .and_then(|(_, attr)| device.attributes.get(&(*attr as i32)))
                .map(|v| PropValue::Int(i64::from(*v)))
        })
    };
    true
}

thread_local! {
    static CURRENT_DEVICE: Cell<i32> = const { Cell::new(0) };
    static LAST_ERROR: Cell<u32> = const { Cell::new(0) };
}

pub fn current_device() -> i32 {
    CURRENT_DEVICE.with(Cell::get)
}

pub fn set_current_device(d: i32) {
    CURRENT_DEVICE.with(|c| c.set(d));
}

/// Record a runtime error as the thread's last error (kept until cudaGetLastError).
pub fn set_last_error(e: u32) {
    if e != 0 {
        LAST_ERROR.with(|c| c.set(e));
    }
}

pub fn take_last_error() -> u32 {
    LAST_ERROR.with(|c| c.replace(0))
}

pub fn peek_last_error() -> u32 {
    LAST_ERROR.with(Cell::get)
}

/// What a client address range is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Memory {
    /// Device memory of `device` (the server's address).
    Device { device: i32 },
    /// Client memory allocated as pinned (cudaHostAlloc and friends).
    Pinned { flags: u32 },
    /// Client memory the program registered (cudaHostRegister).
    Registered { flags: u32 },
    /// Managed memory (cudaMallocManaged): client memory at one address for the host and
    /// the GPU. The server mirrors it (as pinned memory handed to the GPU); every call that
    /// hands the GPU pointers brings every managed range up to date first, since the GPU may
    /// reach one through a pointer stored in memory.
    Managed,
}

/// The flag of page-locked memory mapped for the device: `cudaHostAllocMapped`,
/// `cudaHostRegisterMapped`, `CU_MEMHOSTALLOC_DEVICEMAP` and `CU_MEMHOSTREGISTER_DEVICEMAP`
/// are all `0x02` (`#define`s of the headers, which the generator does not carry).
const MAPPED: u32 = 0x02;

impl Memory {
    /// Memory a kernel may reach through a pointer stored in memory rather than one it was
    /// handed: managed memory, and host memory the program mapped for the device on purpose
    /// (zero-copy: NVIDIA's simpleZeroCopy). Every such range is brought up to date before
    /// each launch; other pinned memory only when a call hands the GPU a pointer into it
    /// (PyTorch's staging buffers would otherwise be hashed at every launch).
    pub fn reachable(self) -> bool {
        match self {
            Memory::Managed => true,
            Memory::Pinned { flags } | Memory::Registered { flags } => flags & MAPPED != 0,
            Memory::Device { .. } => false,
        }
    }
}

#[derive(Clone, Copy, Debug)]
pub struct Range {
    pub base: u64,
    pub len: u64,
    pub memory: Memory,
    /// Whether `[base, base+len)` is reserved (PROT_NONE) in this process.
    reserved: bool,
}

static RANGES: RwLock<BTreeMap<u64, Range>> = RwLock::new(BTreeMap::new());

/// Record a range. Device ranges are reserved in the client's address space when free. A
/// graph's allocation is marked as such after this ([`graph_allocation`]).
pub fn add(base: u64, len: u64, memory: Memory) {
    if let Some(mut graph) = graph_allocations() {
        graph.remove(&base);
    }
    let reserved = matches!(memory, Memory::Device { .. }) && reserve(base, len);
    let mut r = RANGES.write().unwrap_or_else(|p| p.into_inner());
    let old = r.insert(base, Range { base, len, memory, reserved });
    count_live(old.as_ref(), -1);
    count_live(Some(&Range { base, len, memory, reserved }), 1);
}

/// Keep the live counts of managed and of reachable ranges as `range` comes (+1) or goes.
fn count_live(range: Option<&Range>, by: isize) {
    use std::sync::atomic::Ordering::Relaxed;
    let Some(range) = range else { return };
    let counters =
        [(matches!(range.memory, Memory::Managed), &MANAGED_LIVE), (range.memory.reachable(), &REACHABLE_LIVE)];
    for (counted, counter) in counters {
        if counted && by > 0 {
            counter.fetch_add(1, Relaxed);
        } else if counted {
            counter.fetch_sub(1, Relaxed);
        }
    }
}

/// Bases of device ranges a graph allocates at each launch (an allocation node's, or a
/// stream-ordered allocation captured into a graph): a free of one leaves it known, since the
/// next launch allocates it again at the same address.
static GRAPH_ALLOCATIONS: Mutex<BTreeSet<u64>> = Mutex::new(BTreeSet::new());
/// Some graph allocated memory (until then allocations and frees take no lock for it).
static ANY_GRAPH_ALLOCATION: AtomicBool = AtomicBool::new(false);

fn graph_allocations() -> Option<std::sync::MutexGuard<'static, BTreeSet<u64>>> {
    ANY_GRAPH_ALLOCATION
        .load(std::sync::atomic::Ordering::Relaxed)
        .then(|| GRAPH_ALLOCATIONS.lock().unwrap_or_else(|p| p.into_inner()))
}

/// The device range at `base` is a graph's allocation ([`freed`] keeps it).
pub fn graph_allocation(base: u64) {
    ANY_GRAPH_ALLOCATION.store(true, std::sync::atomic::Ordering::Relaxed);
    GRAPH_ALLOCATIONS.lock().unwrap_or_else(|p| p.into_inner()).insert(base);
}

/// The program freed the device memory at `base`: forgotten, unless a graph allocates it.
pub fn freed(base: u64) {
    if !graph_allocations().is_some_and(|g| g.contains(&base)) {
        remove(base);
    }
}

/// Forget the range starting at `base`.
pub fn remove(base: u64) -> Option<Range> {
    let removed = RANGES.write().unwrap_or_else(|p| p.into_inner()).remove(&base);
    count_live(removed.as_ref(), -1);
    if let Some(r) = removed.filter(|r| r.reserved) {
        // SAFETY: the range was reserved by `reserve` with exactly this base and length.
        unsafe { libc::munmap(r.base as *mut libc::c_void, page_round(r.len.max(1)) as usize) };
    }
    removed
}

/// Forget every range that starts inside `[base, base + len)`: a driver unmap of a range that
/// several `cuMemMap` calls mapped piece by piece.
pub fn remove_within(base: u64, len: u64) -> usize {
    let end = base.saturating_add(len.max(1));
    let starts: Vec<u64> = {
        let r = RANGES.read().unwrap_or_else(|p| p.into_inner());
        r.range(base..end).map(|(start, _)| *start).collect()
    };
    starts.into_iter().filter_map(remove).count()
}

/// The range containing `addr`.
pub fn find(addr: u64) -> Option<Range> {
    let r = RANGES.read().unwrap_or_else(|p| p.into_inner());
    let (_, range) = r.range(..=addr).next_back()?;
    (addr < range.base.saturating_add(range.len.max(1))).then_some(*range)
}

pub fn is_device(addr: u64) -> bool {
    matches!(find(addr), Some(Range { memory: Memory::Device { .. }, .. }))
}

/// Whether `addr` is client memory the GPU reaches at its own address: pinned, registered
/// or managed.
pub fn is_pinned(addr: u64) -> bool {
    matches!(
        find(addr),
        Some(Range { memory: Memory::Pinned { .. } | Memory::Registered { .. } | Memory::Managed, .. })
    )
}

/// Managed ranges live in this process (a cheap test on hot paths).
static MANAGED_LIVE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

pub fn managed_live() -> bool {
    MANAGED_LIVE.load(std::sync::atomic::Ordering::Relaxed) > 0
}

/// Ranges the GPU may reach through a pointer stored in memory live in this process.
static REACHABLE_LIVE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

pub fn reachable_live() -> bool {
    REACHABLE_LIVE.load(std::sync::atomic::Ordering::Relaxed) > 0
}

/// Every range the GPU may reach through a pointer stored in memory ([`Memory::reachable`]):
/// (base, length).
pub fn reachable_ranges() -> Vec<(u64, u64)> {
    if !reachable_live() {
        return Vec::new();
    }
    let r = RANGES.read().unwrap_or_else(|p| p.into_inner());
    r.values().filter(|r| r.memory.reachable()).map(|r| (r.base, r.len)).collect()
}

fn page_round(n: u64) -> u64 {
    n.div_ceil(4096) * 4096
}

/// Reserve `[base, base+len)` so that no client host mapping can land there later.
fn reserve(base: u64, len: u64) -> bool {
    if !base.is_multiple_of(4096) {
        return false;
    }
    let len = page_round(len.max(1));
    // SAFETY: MAP_FIXED_NOREPLACE never replaces an existing mapping; it fails instead.
    let p = unsafe {
        libc::mmap(
            base as *mut libc::c_void,
            len as usize,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_FIXED_NOREPLACE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        crate::log::once("address-overlap", || {
            tracing::warn!(
                "device allocation at {base:#x} overlaps client memory; cudaMemcpyDefault on such addresses is ambiguous"
            )
        });
        return false;
    }
    if p as u64 != base {
        // An old kernel ignored the hint: give the wrong mapping back.
        // SAFETY: p is the mapping just created with this length.
        unsafe { libc::munmap(p, len as usize) };
        return false;
    }
    true
}

/// Replies that land in the background (asynchronous device-to-host copies into pinned
/// memory). Synchronizing calls wait for them.
static DEFERRED: Mutex<Vec<Arc<Slot>>> = Mutex::new(Vec::new());
static HAS_DEFERRED: AtomicBool = AtomicBool::new(false);

pub fn defer(_desc: &CallDesc, slot: Arc<Slot>) {
    DEFERRED.lock().unwrap_or_else(|p| p.into_inner()).push(slot);
    HAS_DEFERRED.store(true, std::sync::atomic::Ordering::Release);
}

/// Wait until every deferred reply so far has landed. Returns the first failure status.
pub fn wait_deferred() -> Option<u64> {
    if !HAS_DEFERRED.load(std::sync::atomic::Ordering::Acquire) {
        return None;
    }
    let slots: Vec<Arc<Slot>> = {
        let mut d = DEFERRED.lock().unwrap_or_else(|p| p.into_inner());
        HAS_DEFERRED.store(false, std::sync::atomic::Ordering::Release);
        std::mem::take(&mut *d)
    };
    let mut first = None;
    for s in slots {
        match s.wait() {
            Ok(0) => {}
            Ok(status) => {
                first.get_or_insert(status);
            }
            Err(_) => {
                first.get_or_insert(u64::MAX);
            }
        }
    }
    first
}

/// This process's command line (`/proc/self/cmdline`, read once): what the records kept
/// per command (the modules a run loaded, the cuFFT plans it created) are keyed by.
pub fn command_line() -> &'static [u8] {
    static LINE: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    LINE.get_or_init(|| std::fs::read("/proc/self/cmdline").unwrap_or_default())
}

/// A new name for a handle the client names itself: a tagged counter, never a user-space
/// address, so it cannot collide with a handle the library made.
pub fn next_handle_name() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    chidori_protocol::desc::CLIENT_NAME_TAG | NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// Whether `handle` is a name this client made (not a handle the library returned: the
/// worker names those with ids under another tag).
pub fn is_client_name(handle: u64) -> bool {
    handle & chidori_protocol::desc::HANDLE_TAG_MASK == chidori_protocol::desc::CLIENT_NAME_TAG
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remove_where_takes_the_matching_entries_and_keeps_the_rest() {
        let t: Table<(u64, usize), u32> = Table::new();
        assert!(t.remove_where(|_| true).is_empty(), "an empty table gives nothing");
        t.insert((1, 10), 100);
        t.insert((1, 11), 101);
        t.insert((2, 10), 200);
        let mut gone = t.remove_where(|(ctx, _)| *ctx == 1);
        gone.sort();
        assert_eq!(gone, [((1, 10), 100), ((1, 11), 101)]);
        assert_eq!(t.get(&(2, 10)), Some(200));
        assert!(!t.contains(&(1, 10)));
    }

    #[test]
    fn mapped_host_memory_and_managed_memory_are_reachable_through_stored_pointers() {
        assert!(Memory::Managed.reachable());
        assert!(Memory::Pinned { flags: MAPPED }.reachable() && Memory::Registered { flags: MAPPED | 1 }.reachable());
        assert!(!Memory::Pinned { flags: 0 }.reachable(), "PyTorch's staging buffers: only when handed");
        assert!(!Memory::Registered { flags: 1 }.reachable() && !Memory::Device { device: 0 }.reachable());
        let base = 0x7b00_0000_0000u64;
        add(base, 4096, Memory::Registered { flags: MAPPED });
        add(base + 8192, 4096, Memory::Registered { flags: 0 });
        assert!(reachable_live());
        let ranges = reachable_ranges();
        assert!(ranges.contains(&(base, 4096)) && !ranges.contains(&(base + 8192, 4096)));
        remove(base);
        remove(base + 8192);
        assert!(!reachable_ranges().contains(&(base, 4096)));
    }

    #[test]
    fn remove_within_forgets_every_piece_of_an_unmapped_range_and_nothing_beside_it() {
        // Registered ranges: the test process reserves no address space for them.
        let base = 0x7a00_0000_0000u64;
        let piece = 0x20_0000u64;
        let memory = Memory::Registered { flags: 0 };
        add(base - piece, piece, memory);
        for i in 0..4 {
            add(base + i * piece, piece, memory);
        }
        add(base + 4 * piece, piece, memory);
        assert_eq!(remove_within(base, 4 * piece), 4);
        for i in 0..4 {
            assert!(find(base + i * piece + 8).is_none(), "piece {i} is gone");
        }
        assert_eq!(find(base - 1).map(|r| r.base), Some(base - piece), "the range before stays");
        assert_eq!(find(base + 4 * piece).map(|r| r.base), Some(base + 4 * piece), "the range after stays");
        assert_eq!(remove_within(base, 4 * piece), 0);
        remove(base - piece);
        remove(base + 4 * piece);
    }
}
