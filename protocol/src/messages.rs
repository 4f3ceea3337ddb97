//! The messages inside frames, as rkyv archives. Receivers validate every archive with
//! bytecheck ([`decode`]) before reading it.

use rkyv::rancor::Error as RkyvError;
use rkyv::{Archive, Deserialize, Serialize};

use crate::frame::{Frame, FrameError};

/// Client → server, the first frame of a connection.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Hello {
    pub protocol: u16,
    /// Hash of the generated call descriptors (`chidori_cuda::calls::SCHEMA_HASH`).
    pub schema: u64,
    pub client_version: String,
    pub pid: u32,
    pub host: String,
    /// The program's command line, for the server's log.
    pub program: String,
    /// The server's token (empty: none). Sent only inside TLS: a server that requires a
    /// token accepts only TLS connections.
    pub token: String,
    /// The client keeps what it sends until acknowledged and reconnects when the connection
    /// breaks ([`crate::resume`]); the server grants it with a secret in the Welcome.
    pub resume: bool,
    /// Content the client sent this server before, by hash (newest last; at most
    /// [`MAX_CONTENT_NAMED`]), when it sends large inputs by content ([`CONTENT_FLAG`]);
    /// None: it sends every byte.
    pub content: Option<Vec<[u8; 32]>>,
    /// The program's `CUDA_VISIBLE_DEVICES` (None: unset): which of the server's GPUs the
    /// session sees, in that order (indices into the server's list, or UUIDs).
    pub visible_devices: Option<String>,
}

/// Server → client: the session is open.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Welcome {
    pub server_version: String,
    /// "real" or "emulated".
    pub backend: String,
    pub session: u64,
    /// cuDriverGetVersion of the server (e.g. 13000).
    pub driver_version: i32,
    /// CUDA version ("13.0") of each library the server loaded, by Chidori library name.
    pub libraries: Vec<(String, String)>,
    pub devices: Vec<Device>,
    /// GPUs NVML counts: those the server exposes, before the program's
    /// `CUDA_VISIBLE_DEVICES` selected `devices` among them (NVML ignores that variable on
    /// a GPU's own machine too; torch counts devices by NVML and then applies it).
    pub nvml_devices: u32,
    /// The secret a reconnecting client presents with the session id (empty: the session
    /// ends with its connection).
    pub resume_secret: Vec<u8>,
    /// Of the Hello's `content`, which the server keeps for this session: those the client
    /// may send as their hash. Empty: none (or the server keeps no content).
    pub content_kept: Vec<bool>,
    /// Bytes of new content the server will keep from this session (0: none).
    pub content_budget: u64,
    /// Bulk lanes the client may open (0: none): further connections over which frames of
    /// large copies travel beside this one, so that a copy is not bound by one TCP stream.
    pub lanes: u8,
    /// The secret a lane presents (empty where `lanes` is 0).
    pub lane_secret: Vec<u8>,
}

/// Client → server, inside TLS where there is TLS: reconnecting the session whose id the
/// preamble named ([`crate::resume`]).
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct ResumeRequest {
    /// The server's token (empty: none), as in the Hello.
    pub token: String,
    /// The Welcome's `resume_secret`.
    pub secret: Vec<u8>,
    /// Bytes of the server's stream the client received.
    pub received: u64,
    /// 0: resuming the session's connection. 1 to the Welcome's `lanes`: opening that bulk
    /// lane, a second connection that carries large copies beside the first (with the
    /// Welcome's `lane_secret`); the server answers Resumed.
    pub lane: u8,
}

/// A GPU as the server sees it: everything the client answers device queries from.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Device {
    pub ordinal: u32,
    pub name: String,
    pub uuid: [u8; 16],
    pub total_mem: u64,
    /// (CUdevice_attribute value, result) for every attribute the driver answered.
    pub attributes: Vec<(i32, i32)>,
    /// cudaDeviceProp at the server's runtime version, field by field: the canonical record
    /// from which the client writes the layout of whatever version it was built with.
    pub props: Vec<(String, PropValue)>,
    /// The CUDA version of the layout `props` was read with.
    pub props_version: String,
}

#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub enum PropValue {
    Int(i64),
    Ints(Vec<i64>),
    Text(String),
    Bytes(Vec<u8>),
}

#[derive(Archive, Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefuseReason {
    Protocol,
    Schema,
    NoGpu,
    Unauthorized,
    Busy,
    Internal,
    /// A reconnecting client named a session that has ended (or a wrong secret).
    Gone,
}

/// Server → client: the session cannot open; the client reports `message` and gives up.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Refuse {
    pub reason: RefuseReason,
    pub message: String,
}

/// Client → server: one call. Header: `call` = descriptor wire id, `thread`, `seq`.
/// `args` holds one raw value per parameter; `lens` one byte length per parameter for the
/// input bytes concatenated in the bulk section (0 for parameters without bytes,
/// [`NULL_LEN`] for a null pointer).
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
pub struct Call {
    pub args: Vec<u64>,
    pub lens: Vec<u64>,
}

/// The length standing for a null pointer.
pub const NULL_LEN: u64 = u64::MAX;

/// Set in a `lens` entry of an input buffer sent by content: the bulk section holds the
/// 32-byte SHA-256 of the buffer's bytes (a chunk the server said it keeps, in the
/// Welcome's `content_kept`) instead of the bytes; the other bits are the buffer's length.
pub const CONTENT_FLAG: u64 = 1 << 62;

/// Set in a `lens` entry of a buffer sent compressed ([`crate::pack`]). In a Call (an input
/// buffer): the bulk section holds the byte count of a zstd frame (8 bytes, little-endian)
/// and the frame, which expands to the buffer's bytes; the other bits are the buffer's
/// length. In a Reply (an output, where the call's header has
/// [`crate::frame::OUTPUTS_COMPRESSED`]): the other bits are the frame's byte count in the
/// bulk section, and the frame expands to exactly the output's length the client asked for.
pub const COMPRESSED_FLAG: u64 = 1 << 61;

/// Buffers of at least this many bytes may be sent compressed (smaller ones save too
/// little for the time it takes).
pub const COMPRESS_MIN: u64 = 256 << 10;

/// The most bytes a compressed buffer may expand to: a few bytes of a frame can stand for
/// many megabytes of zeros, which the worker must hold (copies travel in 8 MiB chunks).
pub const COMPRESS_MAX: u64 = 64 << 20;

/// Input buffers of at least this many bytes are sent by content, and kept by a server
/// that keeps content (smaller ones cost more to hash and name than they save).
pub const CONTENT_MIN: u64 = 1 << 20;

/// Hashes a Hello may name.
pub const MAX_CONTENT_NAMED: usize = 1 << 15;

/// Server → client: the outcome of a call. `ret` is the raw return value; `lens` gives one
/// byte length per parameter for the outputs in the bulk section, in parameter order.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
pub struct Reply {
    pub ret: u64,
    pub lens: Vec<u64>,
    /// Set when the server could not execute the call at all (bad handle, unknown call):
    /// the client logs it once; `ret` then holds the library's error status.
    pub error: Option<String>,
}

/// Server → client: an asynchronous call (no reply awaited) failed with `status`.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct AsyncError {
    pub status: i64,
    pub message: Option<String>,
}

/// Server → client: run the host function the client registered as `id` (its stream
/// reached it), then answer with `token`.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct HostCallback {
    pub id: u64,
    pub token: u64,
    pub status: i64,
    /// The function was captured into a graph and runs again on each replay: the client
    /// keeps it registered.
    pub keep: bool,
    /// Bytes of the client's mirrored memory the GPU changed before the stream reached the
    /// function: written into the program's memory before it runs (a host node reads what
    /// a copy node before it wrote).
    pub changes: Vec<MirrorChanges>,
    /// The frame only carries changes (more than one frame holds): the client writes them
    /// and runs nothing; the frame that names the function follows.
    pub land_only: bool,
}

/// What the GPU changed in one mirror since the client last saw it, as
/// [`crate::mirror::Changes`] encodes it: packed spans (offsets from `base`), the bitmaps of
/// masked spans, and the changed bytes one after another. Only the changed bytes travel:
/// an equal byte between two changed ones may be one the program wrote since.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
pub struct MirrorChanges {
    pub base: u64,
    pub runs: Vec<u8>,
    pub mask: Vec<u8>,
    pub bytes: Vec<u8>,
}

/// The most status values one `Service::StatusTexts` may name.
pub const MAX_STATUS_TEXTS: usize = 4096;

/// The module image of `hash`: asked for by the server ([`crate::frame::Kind::NeedModule`]),
/// sent by the client in the bulk ([`crate::frame::Kind::ModuleImage`]).
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct ModuleImage {
    pub hash: [u8; 32],
}

/// Client → server: the host callback of `token` returned.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct HostCallbackDone {
    pub token: u64,
}

#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Goodbye {
    pub reason: String,
}

/// Which API a launch came from: its failure is reported in that library's status codes.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    Runtime,
    Driver,
}

/// Client → server: launch `function` (a kernel or function handle of this session) on
/// `stream`. The bulk section holds the parameters packed by the kernel's layout.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Launch {
    pub function: u64,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub shared_mem: u32,
    pub stream: u64,
    /// Launch attributes: (CUlaunchAttributeID, its 64-byte value).
    pub attributes: Vec<(u32, Vec<u8>)>,
    pub cooperative: bool,
    pub api: Api,
}

/// One kernel of a loaded module: name, handle, and parameter layout (offset, size).
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct KernelInfo {
    pub name: String,
    pub handle: u64,
    pub params: Vec<(u32, u32)>,
}

/// Chidori's own requests: module loading and kernel metadata.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub enum Service {
    /// Load the module whose image has this sha256 (from the session, or the server's
    /// module cache); answered by `Module` or `NeedUpload`.
    LoadModule { hash: [u8; 32] },
    /// The image of `hash` is in the bulk section; answered by `Module`.
    UploadModule { hash: [u8; 32] },
    /// Load the module of `hash` from the session or the server's module cache behind the
    /// thread's later calls: on a thread of the worker's own, in the context current on the
    /// thread's executor, so that those calls need not wait for it (the modules an earlier
    /// run loaded, asked for ahead of their use). Answered like `LoadModule`, when loaded.
    LoadModuleBehind { hash: [u8; 32] },
    /// Load the module of `hash` behind the thread's later calls, as `LoadModuleBehind`,
    /// under the client's names: `library`, `module`, and each kernel's (by its name) as an
    /// earlier load of the same image answered them. Not answered: a call that passes one of
    /// these names waits on the server for the load, and gets the load's failure (or
    /// NOT_FOUND for a kernel the image lacks). An image the server's module cache lacks is
    /// asked of the client ([`crate::frame::Kind::NeedModule`]). A name already taken ends
    /// the session.
    LoadModuleNamed { hash: [u8; 32], library: u64, module: u64, kernels: Vec<(String, u64)> },
    /// Address and size of a `__device__`/`__constant__` variable of a loaded module.
    Global { module: u64, name: String },
    /// Parameter layout of a function (from cuModuleGetFunction).
    FunctionParams { function: u64 },
    /// Compile a CUDA C++ program with the server's NVRTC (the client keeps NVRTC programs
    /// and sends everything a compile needs at once); answered by `Compiled`.
    Compile(CompileRequest),
    /// Bring the mirror of the client's pinned range `[base, base + len)` up to date (made
    /// on first use): the bulk section holds the bytes of `runs` ((offset, length) from
    /// `base`, see [`crate::mirror`]). A stand-in (`base` a key from
    /// [`crate::mirror::STAND_IN_KEYS`]) names in `client` the client's address of the
    /// range, which calls name it by; `client` is 0 for every other mirror. Not answered; a
    /// failure comes back as an AsyncError.
    MirrorWrite { base: u64, len: u64, runs: Vec<(u64, u64)>, client: u64 },
    /// The bytes of these mirrors that the GPU changed since the client last saw them,
    /// starting at offset `from` of the first; answered by `MirrorRuns` (one answer carries
    /// at most [`crate::mirror::PULL_BUDGET`] bytes and says where the next pull starts).
    MirrorPull { bases: Vec<u64>, from: u64 },
    /// The client freed or unregistered the range: the mirror goes. Not answered.
    MirrorDrop { base: u64 },
    /// Replay a graph in a loop on the server until a device flag says stop; answered by
    /// `Looped`, with `Kind::Progress` frames on the way.
    GraphLoop(GraphLoop),
    /// The name of a function (`kernel`: of a CUkernel) of this session, as cuFuncGetName
    /// and cuKernelGetName give it; answered by `Name`.
    FunctionName { handle: u64, kernel: bool },
    /// Nodes of a graph, of a node's edges, or of a capture's frontier: arrays whose
    /// elements are handles the worker makes known to the session; answered by `Nodes`.
    GraphList(GraphList),
    /// Make or change a graph node whose parameters only the worker can lay out (a kernel's
    /// packed parameters are in the bulk section); answered by `Node`.
    GraphNode(GraphNode),
    /// A graph as Graphviz text (cuGraphDebugDotPrint's file, written on the server), with
    /// cuGraphDebugDotPrint's flags; answered by `Name`.
    GraphDot { graph: u64, flags: u32 },
    /// Link inputs with the server's JIT linker (the client keeps cuLink state and sends
    /// everything a link needs at once); answered by `Linked`.
    Link(LinkRequest),
    /// Link with the server's nvJitLink (the client keeps nvJitLink handles and sends a
    /// whole link at nvJitLinkComplete); answered by `JitLinked`.
    JitLink(JitLinkRequest),
    /// cuOccupancyMaxActiveClusters (`potential`: cuOccupancyMaxPotentialClusterSize) of a
    /// launch configuration, as a launch without parameters; answered by `Value`.
    ClusterOccupancy { launch: Launch, potential: bool },
    /// Run the server's `nvidia-smi` with these arguments, for the session's GPUs: queries
    /// only (the worker refuses what would change a GPU or write a file on the server);
    /// answered by `Tool`.
    NvidiaSmi { args: Vec<String> },
    /// ncclGetLastError of the session's NCCL (`comm`: a communicator of the session, or 0;
    /// NCCL keeps one text per process); answered by `Name`.
    NcclLastError { comm: u64 },
    /// The texts the server's library gives for these status values, through its own
    /// error-string function (one of `chidori_cuda::status::TEXT_FUNCTIONS`): the client's
    /// tables have only names where a header documents no status. Answered by `Texts`, one
    /// per value; at most [`MAX_STATUS_TEXTS`] values.
    StatusTexts { library: String, function: String, values: Vec<i64> },
    /// Reserve address space on `device` where the client places allocations itself (see
    /// [`Service::WindowMap`]); answered by `Window`, or `Error` where the server cannot
    /// (its driver has no virtual memory management, or the session's window is spent). A
    /// second request for the same device answers the same window.
    MemoryWindow { device: i32 },
    /// Back `[address, address + size)` of the session's window on `device` with new device
    /// memory, readable and writable from that device: an allocation the client answered
    /// without waiting. `address` and `size` are multiples of the window's granularity, the
    /// range lies in the window and overlaps no other. Not answered: a failure (the GPU out
    /// of memory) ends the session, whose program already holds the address.
    WindowMap { device: i32, address: u64, size: u64 },
    /// Free the window allocation at `address` as cudaFree does: after the device's work
    /// queued before it; answered by `Value(0)`, or `Error` with the synchronization's
    /// status (the allocation then stays).
    WindowUnmap { address: u64 },
    /// Free the window allocation at `address` as [`Service::WindowUnmap`] does, where the
    /// client answered the program itself: the device was idle with nothing sent since, so
    /// cudaFree had nothing to wait for. Not answered: a failure ends the session, whose
    /// program was told the memory is free.
    WindowFree { address: u64 },
    /// `device`'s primary context was reset (cudaDeviceReset, cuDevicePrimaryCtxReset),
    /// which frees what the program allocated on it: the session's window allocations there
    /// go too (the window stays). Not answered.
    WindowReset { device: i32 },
    /// The capture the calling thread's last begin on `stream` started, sent without
    /// waiting, is known to the client by `id` (its capture id, as cudaStreamGetCaptureInfo
    /// gives it) and `graph` (the graph it builds, a name the client chose): the worker
    /// answers that capture's id as `id` and names its graph `graph`. A begin that failed
    /// (its failure already on its way to the client) names nothing. Not answered; a name
    /// the session holds already (or none) ends the session: no client of this protocol
    /// sends one.
    CaptureNamed { stream: u64, id: u64, graph: u64 },
}

/// An nvJitLink link: its options as the program gave them (`-arch=sm_90`, `-lto`) and its
/// inputs (nvJitLinkInputType, name, bytes).
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
pub struct JitLinkRequest {
    pub options: Vec<String>,
    pub inputs: Vec<(u32, String, Vec<u8>)>,
}

/// What an nvJitLink link produced: `status` in nvJitLink's codes (of the first failing
/// call), the linked CUBIN and PTX (each empty where the link made none), both logs.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
pub struct JitLinkResult {
    pub status: i64,
    pub cubin: Vec<u8>,
    pub ptx: Vec<u8>,
    pub info_log: Vec<u8>,
    pub error_log: Vec<u8>,
}

/// A JIT link: numeric options (CUjit_option, value) and inputs (CUjitInputType, name,
/// bytes).
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
pub struct LinkRequest {
    pub options: Vec<(u32, u64)>,
    pub inputs: Vec<(u32, String, Vec<u8>)>,
}

/// What a JIT link produced: `status` in the driver's codes (of the first failing call), the
/// linked image, the info and error logs, the wall time in milliseconds.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
pub struct LinkResult {
    pub status: i64,
    pub image: Vec<u8>,
    pub info_log: Vec<u8>,
    pub error_log: Vec<u8>,
    pub wall_ms: f32,
}

/// Which node arrays a `GraphList` asks for.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub enum GraphList {
    /// Every node of a graph.
    Nodes { graph: u64 },
    /// The nodes of a graph without dependencies.
    RootNodes { graph: u64 },
    /// Every edge of a graph: `nodes` are the sources, `peers` the destinations.
    Edges { graph: u64 },
    /// A node's dependencies.
    Dependencies { node: u64 },
    /// The nodes that depend on a node.
    Dependents { node: u64 },
    /// The frontier of the capture on a stream (the nodes its next operation depends on),
    /// with the capture's status, id and graph.
    Capture { stream: u64 },
    /// Every node of the graph that the calling thread's last end of a capture on a stream
    /// made, where that end succeeded (asked right behind the end: torch counts the nodes
    /// of each graph it captured).
    Ended { stream: u64 },
}

/// One graph node to make (`Add`) or change (`Set`, or `ExecSet` in an executable graph).
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct GraphNode {
    pub target: NodeTarget,
    pub params: NodeParams,
    pub api: Api,
}

#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub enum NodeTarget {
    /// A new node of `graph` after `dependencies`; `edge_data` is empty or one 8-byte
    /// cudaGraphEdgeData per dependency.
    Add {
        graph: u64,
        dependencies: Vec<u64>,
        edge_data: Vec<u64>,
    },
    Set {
        node: u64,
    },
    ExecSet {
        exec: u64,
        node: u64,
    },
}

/// What a node does.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub enum NodeParams {
    /// Launch `function` (of this session); its parameters, packed by its layout, are the
    /// bulk section.
    Kernel { function: u64, grid: [u32; 3], block: [u32; 3], shared_mem: u32 },
    /// A conditional node: `size` body graphs come back in `Node::graphs`.
    Conditional { handle: u64, kind: u32, size: u32 },
    /// Run the client's host function `id` each time the graph reaches the node.
    Host { id: u64 },
    /// Allocate `bytesize` bytes from a pool of these properties; the address comes back in
    /// `Node::address`. `access`: (location type, location id, flags) per access descriptor.
    MemAlloc { alloc_type: u32, location: (u32, i32), max_size: u64, access: Vec<(u32, i32, u32)>, bytesize: u64 },
    /// Run `count` stream memory operations (waits on, writes of and reductions into words of
    /// device memory, flushes, barriers) in `ctx` (0: the current context): the bulk section
    /// holds the `CUstreamBatchMemOpParams`, 48 bytes each, as the program laid them out.
    BatchMemOp { ctx: u64, count: u32, flags: u32 },
}

/// A graph-replay loop that runs on the server without a round trip per step: launch `exec`
/// on `stream` up to `max_steps` times; every `check_every` launches read the 4-byte
/// device flag at `stop_flag` (0: none) and stop once it is nonzero. Each step writes
/// `bytes_per_step` bytes of output at `output + step * bytes_per_step` (0: no output):
/// they are streamed back in `Progress` frames at least every `progress_ms` (0: only at
/// the end). With `tail`, a loop that ran all `max_steps` also sends slot `max_steps` (for a
/// graph whose step writes the next slot, as a decode step writes the next token: the last
/// step's output). `then_copy` is a device-to-device copy on the stream after the last
/// step (a result assembled by the graph, copied where the program wants it), so that
/// nothing need follow the loop. Nothing in it knows what the graph computes (a decode step
/// of a language model, a simulation step, ...).
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct GraphLoop {
    pub exec: u64,
    pub stream: u64,
    pub max_steps: u32,
    pub check_every: u32,
    pub stop_flag: u64,
    pub output: u64,
    pub bytes_per_step: u32,
    pub progress_ms: u32,
    pub tail: bool,
    pub then_copy: Option<LoopCopy>,
}

/// A device-to-device copy of `bytes` bytes from `src` to `dst`.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, Copy, PartialEq)]
pub struct LoopCopy {
    pub dst: u64,
    pub src: u64,
    pub bytes: u64,
}

/// Server → client during a `GraphLoop`: steps completed so far; the bulk section holds the
/// output of the steps not sent before.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Progress {
    pub steps: u32,
}

/// An NVRTC program and the options of one compile.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
pub struct CompileRequest {
    pub source: String,
    /// The program's name (None: NVRTC's default).
    pub name: Option<String>,
    /// (include name, contents) of each header the program was created with.
    pub headers: Vec<(String, String)>,
    pub options: Vec<String>,
    /// Name expressions added before the compile, whose lowered names come back.
    pub name_expressions: Vec<String>,
}

/// What an NVRTC compile produced: `status` in NVRTC's codes, the log, PTX and CUBIN
/// (empty when the options asked for none), each name expression's lowered name; the LTO IR
/// (`-dlto`), OptiX IR (`--optix-ir`) and NVVM IR (NVRTC 12) where the options made them,
/// and the precompiled header's creation status and heap size (`-pch`, NVRTC 12.8+).
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
pub struct CompileResult {
    pub status: i64,
    pub log: Vec<u8>,
    pub ptx: Vec<u8>,
    pub cubin: Vec<u8>,
    pub lowered: Vec<(String, String)>,
    pub ltoir: Vec<u8>,
    pub optixir: Vec<u8>,
    pub nvvm: Vec<u8>,
    /// nvrtcGetPCHCreateStatus's answer (None: this NVRTC has none).
    pub pch_status: Option<i64>,
    /// nvrtcGetPCHHeapSizeRequired's answer: (its status, the size).
    pub pch_heap: Option<(i64, u64)>,
}

/// A record of cuDNN's variant-pack data pointers as the `hostvalues` wire form of
/// cudnnBackendSetAttribute sends them: the pointer (a device address), or, where
/// [`HOST_VALUE_FLAG`] is set, the bytes of the host scalar the caller's pointer points at
/// (the worker keeps them beside the descriptor and passes their address).
pub const HOST_VALUE_RECORD: usize = 32;
/// Bytes of a host scalar in a record: the widest by-value type (16); the library reads
/// what the tensor's type needs.
pub const HOST_VALUE_MAX: usize = 16;
pub const HOST_VALUE_FLAG: u64 = 1;

#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq)]
pub enum ServiceReply {
    /// `library` is the loaded image; `module` its CUmodule in the current context.
    Module {
        library: u64,
        module: u64,
        kernels: Vec<KernelInfo>,
    },
    NeedUpload,
    Global {
        address: u64,
        size: u64,
    },
    Params {
        params: Vec<(u32, u32)>,
    },
    Compiled(CompileResult),
    /// Changed bytes of pulled mirrors; `next`: more changed, pull again from (mirror base,
    /// offset).
    MirrorRuns {
        changes: Vec<MirrorChanges>,
        next: Option<(u64, u64)>,
    },
    /// A `GraphLoop` ended: steps launched, the step count at which the stop flag was seen
    /// (None: it ran to `max_steps`), the status of the first failing call (0: none), and,
    /// for a loop with a closing copy, whether the device had finished all its work when
    /// the loop ended (a synchronize of it then returns at once).
    Looped {
        steps: u32,
        stopped_at: Option<u32>,
        status: i64,
        idle: bool,
    },
    /// `status` in the driver's codes.
    Error {
        status: i64,
        message: String,
    },
    Name(String),
    Texts(Vec<String>),
    Linked(LinkResult),
    /// A `GraphList`'s arrays: `edge_data` is empty where every edge has default data;
    /// `capture` holds (status, id, graph) for a capture's frontier.
    Nodes {
        nodes: Vec<u64>,
        peers: Vec<u64>,
        edge_data: Vec<u64>,
        capture: Option<(u32, u64, u64)>,
    },
    /// A node was made or changed: the node (`Add`), a conditional node's body graphs, a
    /// memory allocation node's address.
    Node {
        node: u64,
        graphs: Vec<u64>,
        address: u64,
    },
    JitLinked(JitLinkResult),
    /// One number the library answered (a cluster count or size).
    Value(i64),
    /// A `MemoryWindow`: the reserved range, the granularity of its allocations (each a
    /// multiple, at a multiple), and the device memory free when it was made.
    Window {
        base: u64,
        size: u64,
        granularity: u64,
        free: u64,
    },
    /// A tool's run on the server: its exit status, standard output and standard error.
    Tool {
        code: i32,
        stdout: Vec<u8>,
        stderr: Vec<u8>,
    },
}

/// Serialize a message into an archive.
pub fn encode<T>(value: &T) -> rkyv::util::AlignedVec
where
    T: for<'a> Serialize<
        rkyv::api::high::HighSerializer<rkyv::util::AlignedVec, rkyv::ser::allocator::ArenaHandle<'a>, RkyvError>,
    >,
{
    use rkyv::ser::allocator::Arena;
    thread_local! {
        static ARENA: std::cell::RefCell<Arena> = std::cell::RefCell::new(Arena::new());
    }
    let with = |arena: &mut Arena| rkyv::api::high::to_bytes_with_alloc::<_, RkyvError>(value, arena.acquire());
    // The thread's arena, or (while the thread exits and its thread-local state is gone,
    // or if a caller re-enters) a fresh one. Serializing plain owned data into a growable
    // buffer cannot fail.
    ARENA
        .try_with(|a| a.try_borrow_mut().ok().map(|mut a| with(&mut a)))
        .ok()
        .flatten()
        .unwrap_or_else(|| with(&mut Arena::new()))
        .expect("serializing a message")
}

/// Validate a frame's archive and deserialize it.
pub fn decode<T>(frame: &Frame, what: &'static str) -> Result<T, FrameError>
where
    T: Archive,
    T::Archived: for<'a> rkyv::bytecheck::CheckBytes<rkyv::api::high::HighValidator<'a, RkyvError>>
        + Deserialize<T, rkyv::api::high::HighDeserializer<RkyvError>>,
{
    let archived = rkyv::access::<T::Archived, RkyvError>(&frame.archive)
        .map_err(|e| FrameError::BadArchive { what, reason: e.to_string() })?;
    rkyv::deserialize::<T, RkyvError>(archived).map_err(|e| FrameError::BadArchive { what, reason: e.to_string() })
}

/// Validate a frame's archive and return the archived view without copying.
pub fn access<'a, T>(frame: &'a Frame, what: &'static str) -> Result<&'a T::Archived, FrameError>
where
    T: Archive,
    T::Archived: for<'b> rkyv::bytecheck::CheckBytes<rkyv::api::high::HighValidator<'b, RkyvError>>,
{
    rkyv::access::<T::Archived, RkyvError>(&frame.archive)
        .map_err(|e| FrameError::BadArchive { what, reason: e.to_string() })
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::frame::{Header, Kind, to_vec};

    proptest! {
        #[test]
        fn calls_round_trip(args in proptest::collection::vec(any::<u64>(), 0..40),
                            lens in proptest::collection::vec(any::<u64>(), 0..40)) {
            let call = Call { args, lens };
            let bytes = to_vec(Header::new(Kind::Call, 3, 1, 9), &encode(&call), &[]).unwrap();
            let (frame, _) = Frame::decode(&bytes).unwrap();
            prop_assert_eq!(decode::<Call>(&frame, "call").unwrap(), call);
        }

        #[test]
        fn corrupted_archives_are_rejected_not_trusted(args in proptest::collection::vec(any::<u64>(), 1..20),
                                                      flip in any::<usize>(), value: u8) {
            let call = Call { args, lens: vec![1, 2] };
            let mut archive = encode(&call).to_vec();
            let i = flip % archive.len();
            archive[i] = value;
            let bytes = to_vec(Header::new(Kind::Call, 3, 1, 9), &archive, &[]).unwrap();
            let (frame, _) = Frame::decode(&bytes).unwrap();
            // Either it still validates (and then decodes to some Call) or it is an error.
            let _ = decode::<Call>(&frame, "call");
        }
    }

    #[test]
    fn a_welcome_round_trips() {
        let w = Welcome {
            server_version: "0.1.0".into(),
            backend: "emulated".into(),
            session: 42,
            driver_version: 13000,
            libraries: vec![("cudart".into(), "13.0".into())],
            devices: vec![Device {
                ordinal: 0,
                name: "NVIDIA H200".into(),
                uuid: [7; 16],
                total_mem: 150 << 30,
                attributes: vec![(1, 1024), (16, 132)],
                props: vec![
                    ("name".into(), PropValue::Text("NVIDIA H200".into())),
                    ("maxThreadsDim".into(), PropValue::Ints(vec![1024, 1024, 64])),
                ],
                props_version: "13.0".into(),
            }],
            nvml_devices: 1,
            resume_secret: vec![9; 32],
            content_kept: vec![true, false],
            content_budget: 1 << 30,
            lanes: 4,
            lane_secret: vec![3; 32],
        };
        let bytes = to_vec(Header::new(Kind::Welcome, 0, 0, 0), &encode(&w), &[]).unwrap();
        let (frame, _) = Frame::decode(&bytes).unwrap();
        assert_eq!(decode::<Welcome>(&frame, "welcome").unwrap(), w);
        // A garbage archive is an error, never a panic.
        let bytes = to_vec(Header::new(Kind::Welcome, 0, 0, 0), &[0xff; 40], &[]).unwrap();
        let (frame, _) = Frame::decode(&bytes).unwrap();
        assert!(decode::<Welcome>(&frame, "welcome").is_err());
    }
}
