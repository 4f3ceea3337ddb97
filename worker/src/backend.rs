//! What executes calls on the server.

use chidori_protocol::desc::CallDesc;
use chidori_protocol::messages::{
    CompileRequest, CompileResult, Device, GraphList, GraphLoop, GraphNode, JitLinkRequest, JitLinkResult, Launch,
    LinkRequest, LinkResult, LoopCopy,
};

/// A host function installed on a stream: called when the stream reaches it with the
/// stream's status and whether it was captured into a graph (then it is called again on
/// every replay); returns when the client has run its callback.
pub type HostFn = Box<dyn Fn(i64, bool) + Send + Sync>;

/// What a backend without a usable NVRTC answers a compile with.
pub const NVRTC_INTERNAL_ERROR: i64 = chidori_cuda::consts::nvrtcResult::NVRTC_ERROR_INTERNAL_ERROR as i64;

/// What a backend without a facility answers in the driver's codes.
const NOT_SUPPORTED: i64 = chidori_cuda::consts::cudaError_enum::CUDA_ERROR_NOT_SUPPORTED as i64;

/// A module image loaded by a backend.
pub struct ModuleLoad {
    pub library: u64,
    /// Its CUmodule in `context`.
    pub module: u64,
    /// The context it was loaded in: its kernels' functions are that context's.
    pub context: u64,
    pub kernels: Vec<ModuleKernel>,
}

/// One kernel of a loaded module.
pub struct ModuleKernel {
    pub name: String,
    /// Parameter layout: (offset, size) each, in order; empty where the driver cannot tell.
    pub params: Vec<(u32, u32)>,
    pub handle: KernelHandle,
}

/// A module kernel's handle as the load left it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum KernelHandle {
    /// Its function in the load's context, found at the load.
    Function(u64),
    /// The library's kernel: its function is found when first used
    /// ([`Backend::module_function`]), as the driver's lazy loading does for a program.
    Kernel(u64),
}

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
    /// The variant of `desc`'s function that this backend's library declares: `desc` itself
    /// where its CUDA version's headers declare it alike; another where the parameters
    /// differ ([`crate::adapt`] rewrites the call); None where the version is not known.
    fn server_variant(&self, desc: &'static CallDesc) -> Option<&'static CallDesc> {
        crate::adapt::variant_of(desc, &self.layout_version(desc.library)?)
    }
    /// Enqueue `host` on `stream` (cudaLaunchHostFunc semantics). Returns the status of the
    /// enqueueing call in the library of `desc`.
    fn host_fn(&self, desc: &'static CallDesc, stream: u64, host: HostFn) -> Result<u64, String>;
    /// Create a user object whose destructor is `destroy` (cudaUserObjectCreate and
    /// cuUserObjectCreate semantics: run once, when the last reference goes), its handle
    /// written to `out` (a worker buffer). Returns the status in the library of `desc`.
    fn user_object(
        &self,
        desc: &'static CallDesc,
        out: u64,
        refcount: u32,
        flags: u32,
        destroy: HostFn,
    ) -> Result<u64, String>;
    /// Load a module image (fat binary, cubin or PTX) into the current context: the library
    /// handle, its module in this context, and every kernel with its parameter layout.
    /// Err: (driver status, message).
    fn load_module(&self, image: &[u8]) -> Result<ModuleLoad, (i64, String)>;
    /// [`Backend::load_module`] on a thread of the worker's own (not an executor): `context`
    /// made current there first (the one current on the executor that asked), the worker's
    /// own work, apart from any capture the program makes.
    fn load_module_in(&self, image: &[u8], context: u64) -> Result<ModuleLoad, (i64, String)> {
        let _ = context;
        self.load_module(image)
    }
    /// The calling thread's current context (0: none, or a backend without contexts).
    fn current_context(&self) -> u64 {
        0
    }
    /// The function of a loaded module's kernel ([`KernelHandle::Kernel`]) in the context
    /// the module was loaded in, whichever is current. Err: (driver status, message).
    fn module_function(&self, kernel: u64, context: u64) -> Result<u64, (i64, String)> {
        let _ = context;
        self.kernel_function(kernel)
    }
    /// Address and size of a global variable of a loaded library.
    fn global(&self, library: u64, name: &str) -> Result<(u64, u64), (i64, String)>;
    /// Parameter layout of a function handle.
    fn function_params(&self, function: u64) -> Result<Vec<(u32, u32)>, (i64, String)>;
    /// The function of a kernel handle (`CUkernel`, from a library) in the current context.
    /// The driver takes a kernel where a function is expected (a statically linked runtime
    /// launches kernels so); its parameter layout is asked of this function.
    fn kernel_function(&self, _kernel: u64) -> Result<u64, (i64, String)> {
        Err((NOT_SUPPORTED, format!("the {} backend has no kernels (CUDA_ERROR_NOT_SUPPORTED)", self.name())))
    }
    /// Compile an NVRTC program with the server's NVRTC. Err: (NVRTC status, message) when
    /// the server has no usable NVRTC.
    fn compile(&self, _request: &CompileRequest) -> Result<CompileResult, (i64, String)> {
        Err((NVRTC_INTERNAL_ERROR, format!("the {} backend has no NVRTC", self.name())))
    }
    /// Link with the server's nvJitLink. Err: (nvJitLink status, message) when the server
    /// has no usable nvJitLink.
    fn jit_link(&self, _request: &JitLinkRequest) -> Result<JitLinkResult, (i64, String)> {
        Err((crate::nvjitlink::INTERNAL, format!("the {} backend has no nvJitLink", self.name())))
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

    /// Pin `len` bytes of this process at `base` (memory that lives as long as the process)
    /// for the GPU's copies: a copy from it runs at the GPU's speed, not through a staging
    /// buffer of the driver. False where the backend does not (the memory stays pageable).
    fn pin_staging(&self, _base: u64, _len: u64) -> bool {
        false
    }

    /// Wait until stream `stream` (a real handle) has finished its work: a copy from pinned
    /// staging memory on it has read its bytes.
    fn synchronize_stream(&self, _stream: u64) -> Result<(), i64> {
        Ok(())
    }
    /// Whether stream `stream` (a real handle, or a special stream's value) is capturing: a
    /// stream-ordered allocation there is a graph's.
    fn stream_capturing(&self, _stream: u64) -> bool {
        false
    }
    /// Whether `[addr, addr + len)` is device memory this process may also read and write
    /// from the CPU, in one allocation: managed memory (a module's `__managed__` variable).
    /// The client's copy of such memory is mirrored by the memory itself.
    fn host_accessible(&self, _addr: u64, _len: u64) -> bool {
        false
    }
    /// Read host-accessible memory ([`Backend::host_accessible`]) at `addr` into `out`.
    fn read_host_accessible(&self, addr: u64, out: &mut [u8]) -> Result<(), String> {
        let _ = out;
        Err(format!("{addr:#x} is no memory the worker may read"))
    }
    /// Write `bytes` into host-accessible memory at `addr`.
    fn write_host_accessible(&self, addr: u64, bytes: &[u8]) -> Result<(), String> {
        let _ = bytes;
        Err(format!("{addr:#x} is no memory the worker may write"))
    }
    /// cuOccupancyMaxActiveClusters (`potential`: cuOccupancyMaxPotentialClusterSize) of
    /// `launch` (its handles the backend's own, its function a CUfunction). Err: (driver
    /// status, message).
    fn cluster_occupancy(&self, launch: &Launch, potential: bool) -> Result<i32, (i64, String)> {
        let _ = (launch, potential);
        Err((NOT_SUPPORTED, format!("the {} backend has no functions to ask about clusters", self.name())))
    }
    /// Reserve `size` bytes of address space on `device` for allocations placed by the client
    /// (`Service::MemoryWindow`). Err: (driver status, message).
    fn window_reserve(&self, device: i32, size: u64) -> Result<Window, (i64, String)> {
        let _ = (device, size);
        Err((NOT_SUPPORTED, format!("the {} backend places no allocations for the client", self.name())))
    }
    /// Back `[address, address + size)` of a window on `device` with new device memory,
    /// readable and writable from that device. Err: (driver status, message).
    fn window_map(&self, device: i32, address: u64, size: u64) -> Result<(), (i64, String)> {
        let _ = (device, address, size);
        Err((NOT_SUPPORTED, format!("the {} backend places no allocations for the client", self.name())))
    }
    /// Free what [`Backend::window_map`] made, after `device`'s work queued so far (cudaFree's
    /// synchronization), or at once where the device's primary context was just reset
    /// (`reset`: there is no work, and the context the worker knew is gone). Err: (driver
    /// status, message): the memory then stays.
    fn window_unmap(&self, device: i32, address: u64, size: u64, reset: bool) -> Result<(), (i64, String)> {
        let _ = (device, address, size, reset);
        Err((NOT_SUPPORTED, format!("the {} backend places no allocations for the client", self.name())))
    }
    /// The name of a function (`kernel`: a CUkernel) of this session. Err: (driver status,
    /// message).
    fn function_name(&self, handle: u64, kernel: bool) -> Result<String, (i64, String)>;
    /// The node arrays `query` asks for (its handles already the backend's own).
    fn graph_list(&self, query: &GraphList) -> Result<NodeList, (i64, String)>;
    /// Make or change the node `request` describes (its handles already the backend's own).
    /// For a kernel node, `params` holds the parameters packed by `layout`; for a host node,
    /// `host` is the function to run each time a graph reaches it.
    ///
    /// # Safety
    /// A kernel node's function must be one of this session's, `layout` its parameter layout
    /// and `params` cover it.
    unsafe fn graph_node(
        &self,
        request: &GraphNode,
        params: &mut [u8],
        layout: &[(u32, u32)],
        host: Option<HostFn>,
    ) -> Result<NodeMade, (i64, String)>;
    /// A graph (the backend's own handle) as Graphviz text.
    fn graph_dot(&self, graph: u64, flags: u32) -> Result<String, (i64, String)>;
    /// ncclGetLastError's text (`comm`: the backend's communicator, or 0). Err: (ncclResult_t,
    /// message) where the server has no NCCL.
    fn nccl_last_error(&self, comm: u64) -> Result<String, (i64, String)>;
    /// The texts `library`'s error-string function `function` (one of
    /// `chidori_cuda::status::TEXT_FUNCTIONS`, checked by the caller) gives for `values`.
    /// Err: (status, message) where the library is missing.
    fn status_texts(&self, library: &str, function: &str, values: &[i64]) -> Result<Vec<String>, (i64, String)>;
    /// Link with the JIT linker. Err: (driver status, message) when there is no linker.
    fn link(&self, request: &LinkRequest) -> Result<LinkResult, (i64, String)>;
    /// Run a graph-replay loop (`request` with its `exec` and `stream` already the backend's
    /// own handles). `progress(steps, bytes)` receives the output of completed steps, in
    /// order, as the loop goes. Returns what `ServiceReply::Looped` reports.
    fn graph_loop(&self, request: &GraphLoop, progress: &mut dyn FnMut(u32, &[u8])) -> LoopEnd;
}

/// Address space reserved for the client's allocations: see `ServiceReply::Window`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    pub base: u64,
    pub size: u64,
    pub granularity: u64,
    pub free: u64,
}

/// The answer to a [`GraphList`]: see `ServiceReply::Nodes`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeList {
    pub nodes: Vec<u64>,
    pub peers: Vec<u64>,
    pub edge_data: Vec<u64>,
    pub capture: Option<(u32, u64, u64)>,
}

/// What [`Backend::graph_node`] made: see `ServiceReply::Node`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeMade {
    pub node: u64,
    pub graphs: Vec<u64>,
    pub address: u64,
}

/// How a graph-replay loop ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoopEnd {
    pub steps: u32,
    pub stopped_at: Option<u32>,
    /// The status of the call that failed (0: none), in the runtime's codes.
    pub status: i64,
    /// Whether the device had finished all its work when the loop ended.
    pub idle: bool,
}

/// The schedule of a graph-replay loop, shared by the backends: launch, and every
/// `check_every` launches (and after the last) a checkpoint that reads the stop flag and
/// the output of the steps since the previous one. A checkpoint is examined once the next
/// one has been queued, so the GPU always has a window of launches ahead of the host.
pub trait LoopDevice {
    /// Launch the graph once. Err: the status.
    fn launch(&mut self) -> Result<(), i64>;
    /// Queue checkpoint `slot`: copy the flag and the output of steps `from..to` (already
    /// launched) into the slot's host memory once the GPU gets there.
    fn checkpoint(&mut self, slot: usize, from: u32, to: u32) -> Result<(), i64>;
    /// Wait for checkpoint `slot`: (flag, the output bytes of its steps).
    fn examine(&mut self, slot: usize) -> Result<(u32, &[u8]), i64>;
    /// Queue a device-to-device copy on the loop's stream.
    fn copy(&mut self, copy: &LoopCopy) -> Result<(), i64>;
    /// Wait for every launch to finish.
    fn drain(&mut self) -> Result<(), i64>;
    /// Wait for all of the device's work (the loop's stream drained: normally at once).
    fn synchronize_device(&mut self) -> Result<(), i64>;
}

/// Checkpoint slots in use at once: the one being examined, the one queued after it, and
/// the one being filled.
pub const LOOP_SLOTS: usize = 3;

/// Run `request`'s loop on `device` (see [`LoopDevice`]).
pub fn run_loop(request: &GraphLoop, device: &mut dyn LoopDevice, progress: &mut dyn FnMut(u32, &[u8])) -> LoopEnd {
    let every = request.check_every.max(1);
    let watch = request.stop_flag != 0 || request.output != 0;
    let mut launched = 0u32;
    let mut queued: std::collections::VecDeque<(usize, u32)> = std::collections::VecDeque::new();
    let mut next_slot = 0usize;
    let mut marked = 0u32;
    let mut sent_at = std::time::Instant::now();
    let mut pending: Vec<u8> = Vec::new();
    let mut pending_steps = 0u32;
    // The first output goes as soon as it is known (a streamer's first token: the time to it
    // is what its user sees), later ones every `progress_ms`.
    let mut sent_any = false;
    let mut end = LoopEnd { steps: 0, stopped_at: None, status: 0, idle: false };
    'run: while launched < request.max_steps {
        if let Err(status) = device.launch() {
            end.status = status;
            break;
        }
        launched += 1;
        if !watch || (!launched.is_multiple_of(every) && launched != request.max_steps) {
            continue;
        }
        if let Err(status) = device.checkpoint(next_slot, marked, launched) {
            end.status = status;
            break;
        }
        queued.push_back((next_slot, launched));
        next_slot = (next_slot + 1) % LOOP_SLOTS;
        marked = launched;
        while queued.len() >= 2 || (launched == request.max_steps && !queued.is_empty()) {
            let Some((slot, steps)) = queued.pop_front() else { break };
            let (flag, bytes) = match device.examine(slot) {
                Ok(v) => v,
                Err(status) => {
                    end.status = status;
                    break 'run;
                }
            };
            pending.extend_from_slice(bytes);
            pending_steps = steps;
            let due = request.progress_ms > 0
                && (!sent_any || sent_at.elapsed().as_millis() >= u128::from(request.progress_ms));
            if due && !pending.is_empty() {
                progress(pending_steps, &pending);
                pending.clear();
                sent_at = std::time::Instant::now();
                sent_any = true;
            }
            if request.stop_flag != 0 && flag != 0 {
                end.stopped_at = Some(steps);
                break 'run;
            }
        }
    }
    // The slot after the last step, for a graph whose step writes the next one.
    if request.tail
        && request.output != 0
        && end.status == 0
        && end.stopped_at.is_none()
        && launched == request.max_steps
    {
        let tail = device.checkpoint(next_slot, launched, launched + 1).and_then(|()| {
            let (_, bytes) = device.examine(next_slot)?;
            pending.extend_from_slice(bytes);
            Ok(())
        });
        if let Err(status) = tail {
            end.status = status;
        }
    }
    // The closing copy follows every step launched, a stopped loop's included.
    if let Some(copy) = &request.then_copy
        && end.status == 0
        && let Err(status) = device.copy(copy)
    {
        end.status = status;
    }
    if let Err(status) = device.drain()
        && end.status == 0
    {
        end.status = status;
    }
    // Whether the device is idle, for a loop whose closing copy leaves the program nothing
    // to send before it synchronizes (a device synchronize waits for every stream: a loop
    // without one does not pay for other work of the session).
    end.idle = end.status == 0 && request.then_copy.is_some() && device.synchronize_device().is_ok();
    // Checkpoints queued before a stop are not examined: the steps they cover ran after it.
    if !pending.is_empty() {
        progress(pending_steps, &pending);
    }
    end.steps = launched;
    end
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A device whose graph writes `step` as output and raises the flag at `stop_at`
    /// launches; it records the order of what the schedule asked.
    struct Fake {
        launched: u32,
        stop_at: u32,
        slots: [(u32, Vec<u8>); LOOP_SLOTS],
        log: Vec<String>,
    }

    impl LoopDevice for Fake {
        fn launch(&mut self) -> Result<(), i64> {
            self.launched += 1;
            Ok(())
        }
        fn checkpoint(&mut self, slot: usize, from: u32, to: u32) -> Result<(), i64> {
            self.log.push(format!("check {from}..{to}"));
            let flag = u32::from(self.launched >= self.stop_at);
            self.slots[slot] = (flag, (from..to).map(|s| s as u8).collect());
            Ok(())
        }
        fn examine(&mut self, slot: usize) -> Result<(u32, &[u8]), i64> {
            self.log.push(format!("examine at {}", self.launched));
            Ok((self.slots[slot].0, &self.slots[slot].1))
        }
        fn copy(&mut self, copy: &LoopCopy) -> Result<(), i64> {
            self.log.push(format!("copy {} at {}", copy.bytes, self.launched));
            Ok(())
        }
        fn drain(&mut self) -> Result<(), i64> {
            Ok(())
        }
        fn synchronize_device(&mut self) -> Result<(), i64> {
            self.log.push("idle".into());
            Ok(())
        }
    }

    fn request(max_steps: u32, check_every: u32) -> GraphLoop {
        GraphLoop {
            exec: 1,
            stream: 1,
            max_steps,
            check_every,
            stop_flag: 8,
            output: 16,
            bytes_per_step: 1,
            progress_ms: 0,
            tail: false,
            then_copy: None,
        }
    }

    #[test]
    fn a_loop_runs_to_the_end_and_streams_every_step_in_order() {
        let mut fake = Fake { launched: 0, stop_at: u32::MAX, slots: Default::default(), log: vec![] };
        let mut got = Vec::new();
        let end = run_loop(&request(10, 4), &mut fake, &mut |_, b| got.extend_from_slice(b));
        assert_eq!(end, LoopEnd { steps: 10, stopped_at: None, status: 0, idle: false });
        assert_eq!(got, (0..10).collect::<Vec<u8>>());
        // A checkpoint is examined only once the next is queued: the GPU keeps a window.
        assert_eq!(
            fake.log,
            ["check 0..4", "check 4..8", "examine at 8", "check 8..10", "examine at 10", "examine at 10"]
        );
    }

    #[test]
    fn the_first_output_goes_at_once_and_the_rest_when_due() {
        let mut fake = Fake { launched: 0, stop_at: u32::MAX, slots: Default::default(), log: vec![] };
        let mut sent: Vec<(u32, Vec<u8>)> = Vec::new();
        let slow = GraphLoop { progress_ms: 60_000, ..request(10, 4) };
        run_loop(&slow, &mut fake, &mut |steps, b| sent.push((steps, b.to_vec())));
        // The first checkpoint's steps at the first examine; the rest, not yet due, at the end.
        assert_eq!(sent, vec![(4, vec![0, 1, 2, 3]), (10, (4..10).collect())]);
    }

    #[test]
    fn a_tail_sends_the_slot_after_the_last_step() {
        let mut fake = Fake { launched: 0, stop_at: u32::MAX, slots: Default::default(), log: vec![] };
        let mut got = Vec::new();
        let end =
            run_loop(&GraphLoop { tail: true, ..request(10, 4) }, &mut fake, &mut |_, b| got.extend_from_slice(b));
        assert_eq!(end, LoopEnd { steps: 10, stopped_at: None, status: 0, idle: false });
        assert_eq!(got, (0..=10).collect::<Vec<u8>>());
        // A loop the flag stopped sends no tail: the steps after the stop are not wanted.
        let mut fake = Fake { launched: 0, stop_at: 5, slots: Default::default(), log: vec![] };
        let mut got = Vec::new();
        run_loop(&GraphLoop { tail: true, ..request(100, 4) }, &mut fake, &mut |_, b| got.extend_from_slice(b));
        assert_eq!(got, (0..8).collect::<Vec<u8>>());
    }

    #[test]
    fn the_closing_copy_follows_every_step_launched_even_after_a_stop() {
        let copy = Some(LoopCopy { dst: 64, src: 128, bytes: 40 });
        let mut fake = Fake { launched: 0, stop_at: 5, slots: Default::default(), log: vec![] };
        let end = run_loop(&GraphLoop { then_copy: copy, ..request(100, 4) }, &mut fake, &mut |_, _| {});
        assert_eq!(end, LoopEnd { steps: 12, stopped_at: Some(8), status: 0, idle: true });
        assert_eq!(fake.log[fake.log.len() - 2..], ["copy 40 at 12", "idle"]);
    }

    #[test]
    fn a_raised_flag_stops_the_loop_within_two_windows() {
        let mut fake = Fake { launched: 0, stop_at: 5, slots: Default::default(), log: vec![] };
        let mut got = Vec::new();
        let end = run_loop(&request(100, 4), &mut fake, &mut |_, b| got.extend_from_slice(b));
        // Raised at launch 5, seen at the checkpoint after launch 8, examined after 12.
        assert_eq!(end, LoopEnd { steps: 12, stopped_at: Some(8), status: 0, idle: false });
        assert_eq!(got, (0..8).collect::<Vec<u8>>());
    }
}
