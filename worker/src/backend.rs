//! What executes calls on the server.

use chidori_protocol::desc::CallDesc;
use chidori_protocol::messages::{CompileRequest, CompileResult, Device, KernelInfo, Launch};

/// A host function installed on a stream: called when the stream reaches it with the
/// stream's status and whether it was captured into a graph (then it is called again on
/// every replay); returns when the client has run its callback.
pub type HostFn = Box<dyn Fn(i64, bool) + Send + Sync>;

/// NVRTC_ERROR_INTERNAL_ERROR.
pub const NVRTC_INTERNAL_ERROR: i64 = 11;

pub trait Backend: Send + Sync + 'static {
    /// "real" or "emulated".
    fn name(&self) -> &'static str;
    fn driver_version(&self) -> i32;
    /// (Chidori library name, CUDA version) of every library available to calls.
    fn libraries(&self) -> Vec<(String, String)>;
    fn devices(&self) -> Vec<Device>;
    /// The CUDA version whose record layouts the backend's copy of `library` uses.
    fn layout_version(&self, library: &str) -> Option<String>;
    /// Called on each executor thread before its first call.
    fn thread_init(&self) {}
    /// Execute a call with its raw arguments (values, device addresses, and addresses of
    /// the worker's own buffers for host memory). Err: the call cannot run on this backend
    /// (missing library or function); the caller answers NOT_SUPPORTED with the message.
    ///
    /// # Safety
    /// `args` must match `desc`: every host-buffer argument points at live worker memory of
    /// the size the descriptor implies.
    unsafe fn invoke(&self, desc: &'static CallDesc, args: &[u64]) -> Result<u64, String>;
    /// Enqueue `host` on `stream` (cudaLaunchHostFunc semantics). Returns the status of the
    /// enqueueing call in the library of `desc`.
    fn host_fn(&self, desc: &'static CallDesc, stream: u64, host: HostFn) -> Result<u64, String>;
    /// Load a module image (fat binary, cubin or PTX) into the current context: the library
    /// handle, its module in this context, and every kernel as a function of that context
    /// with its parameter layout. Err: (driver status, message).
    fn load_module(&self, image: &[u8]) -> Result<(u64, u64, Vec<KernelInfo>), (i64, String)>;
    /// Address and size of a global variable of a loaded library.
    fn global(&self, library: u64, name: &str) -> Result<(u64, u64), (i64, String)>;
    /// Parameter layout of a function handle.
    fn function_params(&self, function: u64) -> Result<Vec<(u32, u32)>, (i64, String)>;
    /// Compile an NVRTC program with the server's NVRTC. Err: (NVRTC status, message) when
    /// the server has no usable NVRTC.
    fn compile(&self, _request: &CompileRequest) -> Result<CompileResult, (i64, String)> {
        Err((NVRTC_INTERNAL_ERROR, format!("the {} backend has no NVRTC", self.name())))
    }
    /// Launch with parameters packed by `layout` in `params`; returns the driver status.
    ///
    /// # Safety
    /// `launch.function` must be a function of this session and `layout` its parameter
    /// layout, with `params` covering every (offset, size).
    unsafe fn launch(&self, launch: &Launch, params: &mut [u8], layout: &[(u32, u32)]) -> i64;
    /// Make the worker's host memory `[base, base + len)` (whole pages, mapped read-write)
    /// addressable by the GPU at the same addresses. Err: why it cannot be.
    fn map_host(&self, base: u64, len: u64) -> Result<(), String>;
    /// Undo [`Backend::map_host`] before the worker unmaps the memory.
    fn unmap_host(&self, base: u64);
}
