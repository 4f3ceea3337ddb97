//! One session: the worker process that owns a client's CUDA context.
//!
//! The main thread reads frames, validates them and routes calls to one executor thread
//! per client thread (so per-thread CUDA state, such as the current device or the
//! per-thread default stream, matches the client's). It answers heartbeats itself, so a
//! long GPU wait never looks like a dead server. A malformed frame ends the session with a
//! logged reason; the process exit releases everything the session held on the GPU.

use std::collections::HashMap;
use std::io::Read;
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use chidori_cuda::calls::{SCHEMA_HASH, VARIANTS};
use chidori_cuda::structs;
use chidori_protocol::PROTOCOL_VERSION;
use chidori_protocol::codec::{self, Arg, BufArg, DecodeError, Refusal};
use chidori_protocol::desc::{CallDesc, Dir, Form, HandleKind, RecordRefused, Ret, Wire};
use chidori_protocol::frame::{self, Frame, Header, Kind};
use chidori_protocol::messages::{
    self, Api, AsyncError, COMPRESSED_FLAG, CONTENT_MIN, Call, Goodbye, GraphList, GraphLoop, GraphNode, Hello,
    HostCallback, HostCallbackDone, KernelInfo, Launch, NULL_LEN, NodeParams, NodeTarget, Progress, Refuse,
    RefuseReason, Reply, Service, ServiceReply, Welcome,
};
use chidori_protocol::resume::SECRET_LEN;

use crate::auth::Security;
use crate::backend::{Backend, HostFn, KernelHandle};
use crate::cache::{self, ModuleCache};
use crate::call_checks::{self, CallChecks};
use crate::handles::{Entry, Handles, Landing, Pending};
use crate::io::{ReadError, Sink, Writer, read_frame};
use crate::lanes::Lanes;
use crate::memory::{self, Effect, Memory, Origin, Size};
use crate::mirror::Mirrors;
use crate::resume::{Acceptor, Resumable, spawn_acceptor};

/// A kernel's parameters: (offset, size) each, in order.
type ParamLayout = Arc<Vec<(u32, u32)>>;

/// Largest host buffer one call may move (a frame's bulk section is smaller still).
const MAX_BUFFER: u64 = codec::MAX_BUFFER;

pub struct Options {
    /// Silence after which the worker sends a heartbeat; three unanswered ones end the session.
    pub heartbeat: Duration,
    /// Where module images are kept across sessions (None: only in memory).
    pub module_cache: Option<ModuleCache>,
    /// GPU memory the session may allocate, in bytes (None: no quota).
    pub memory_quota: Option<u64>,
    /// Where the supervisor passes a reconnecting client's connection (None: the session
    /// ends with its connection).
    pub resume: Option<std::os::unix::net::UnixStream>,
    /// Where large uploads are kept across sessions (None: nowhere).
    pub content: Option<Arc<crate::content::Store>>,
    /// Where the server's sessions publish the CUDA IPC handles they export (None: this
    /// session shares nothing).
    pub ipc_dir: Option<std::path::PathBuf>,
}

/// A session's share of the content store: the chunks its client may name by hash, and
/// what it may still add.
struct Content {
    pinned: crate::content::Pinned,
    budget: Mutex<u64>,
    keeper: crate::content::Keeper,
}

/// A module loaded in this session, its handles as the client knows them.
#[derive(Clone)]
struct Loaded {
    library: u64,
    module: u64,
    kernels: Vec<KernelInfo>,
}

struct Session {
    backend: Arc<dyn Backend>,
    handles: Mutex<Handles>,
    /// Where the loader thread names what it loaded (the handle table's, see [`Landing`]).
    landing: Arc<Landing>,
    /// Module images asked of the client (`Kind::NeedModule`): where each goes when it comes.
    pulls: Mutex<HashMap<[u8; 32], mpsc::Sender<Vec<u8>>>>,
    /// (client thread, stream as the client names it) → the graph, as the client names it,
    /// that the thread's last successful end of a capture on the stream made
    /// (`GraphList::Ended`).
    ended: Mutex<HashMap<(u32, u64), u64>>,
    /// (client thread, stream as the client names it) → (the library's capture id, the
    /// client's) of the last capture begun there without waiting (`Service::CaptureNamed`):
    /// answers about that capture carry the client's id.
    capture_ids: Mutex<HashMap<(u32, u64), (u64, u64)>>,
    writer: Arc<Writer>,
    /// Host callbacks waiting for the client: id → wake-up.
    callbacks: Mutex<HashMap<u64, mpsc::Sender<()>>>,
    next_callback: AtomicU64,
    module_cache: Option<ModuleCache>,
    modules: Mutex<HashMap<[u8; 32], Arc<Loaded>>>,
    /// The libraries of loaded modules, by the client's names (their globals may be asked).
    libraries: Mutex<std::collections::HashSet<u64>>,
    /// Parameter layouts of every function this session may launch, by the client's name.
    layouts: Mutex<HashMap<u64, ParamLayout>>,
    /// Memory kept for a library handle until the handle is destroyed: the host scalars of
    /// a cuDNN variant pack (its data pointers point at them).
    owned: Mutex<HashMap<u64, Box<[u128]>>>,
    /// Records the program holds for a library, kept here (`crate::held`).
    held: Mutex<crate::held::Records>,
    /// The references the program holds to user objects (`crate::user_objects`).
    user_objects: Mutex<crate::user_objects::References>,
    /// Time in the library per function (calls, total), kept when `chidori::calls` logs at
    /// debug: where a slow remote run spends the server's time.
    timing: Option<Mutex<HashMap<&'static str, (u64, Duration)>>>,
    /// Mirrors of the client's pinned memory that kernels and libraries were handed.
    mirrors: Mutex<Mirrors>,
    /// The session's device memory: every device address a call passes must lie in it.
    memory: Mutex<Memory>,
    /// The CUDA IPC handles this session exported.
    ipc: crate::ipc::Exports,
    /// Allocation windows where the client places device memory itself (`crate::windows`).
    windows: Mutex<crate::windows::Windows>,
    /// Large inputs sent by content (None: the client sends every byte).
    content: Option<Content>,
    /// Functions whose failure without a waiting client was logged at warn (once each: a
    /// client cannot flood the operator's log).
    warned: Mutex<std::collections::HashSet<&'static str>>,
    /// A capture was begun in this session: a stream may be capturing (until then no call
    /// asks the driver).
    captures: AtomicBool,
    /// Further connections carrying large copies (None: the session has none).
    lanes: Option<Arc<Lanes>>,
    /// The program's PID on the client's machine: its processes in NVML's lists.
    program_pid: u32,
    /// The client has gone: executors skip the frames still queued ([`finish`]).
    closing: AtomicBool,
    /// Module loads asked behind the calls (`Service::LoadModuleBehind`), run in order on a
    /// thread of their own, started at the first ([`load_behind`]).
    loader: Mutex<Option<mpsc::Sender<LoadJob>>>,
    /// What [`finish`] waits on, handed to the loader thread as it starts (None: no thread
    /// may be started, as in the harness; loads are then made where they are asked).
    running: Mutex<Option<mpsc::Sender<()>>>,
}

/// A module load for the loader thread.
type LoadJob = Box<dyn FnOnce() + Send>;

/// Log target of the per-function time the session spent in the libraries.
const TIMING_TARGET: &str = "chidori::calls";

/// A service request that makes no sense (cudaErrorInvalidValue, CUDA_ERROR_INVALID_VALUE:
/// the same value in both APIs).
const INVALID_VALUE: i64 = chidori_cuda::consts::cudaError::cudaErrorInvalidValue as i64;

/// A handle the session never made (CUDA_ERROR_INVALID_HANDLE, cudaErrorInvalidResourceHandle:
/// the same value in both APIs); also what a status-text request the server cannot answer gets.
const INVALID_HANDLE: i64 = chidori_cuda::consts::cudaError_enum::CUDA_ERROR_INVALID_HANDLE as i64;
const _: () = assert!(INVALID_HANDLE == chidori_cuda::consts::cudaError::cudaErrorInvalidResourceHandle as i64);
/// A kernel a module lacks, or a module the server could not get (cudaErrorSymbolNotFound,
/// CUDA_ERROR_NOT_FOUND).
const NOT_FOUND: i64 = chidori_cuda::consts::cudaError_enum::CUDA_ERROR_NOT_FOUND as i64;
const _: () = assert!(NOT_FOUND == chidori_cuda::consts::cudaError::cudaErrorSymbolNotFound as i64);

/// Why a session ends badly: the frame or call that broke the protocol.
#[derive(Debug)]
struct Fatal(String);

/// How long a new connection has for the TLS handshake and its Hello.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Makes the session's backend: called once the client is authenticated, so that an
/// unauthenticated peer never gets a CUDA context made for it. Its argument is the
/// program's `CUDA_VISIBLE_DEVICES` ([`crate::visible`]); with the backend it returns the
/// number of GPUs the server exposes before that selection, where it made one.
pub type MakeBackend = Box<dyn FnOnce(Option<&str>) -> Result<(Arc<dyn Backend>, Option<u32>), String>>;

/// Run a session on an accepted connection until the client leaves: the TLS handshake
/// (with `security`), the Hello and its token, then (authenticated: `authenticated` is
/// called) the backend and the calls.
pub fn run(
    mut stream: TcpStream,
    security: Option<Security>,
    make_backend: MakeBackend,
    options: Options,
    authenticated: Box<dyn FnOnce()>,
) -> Result<()> {
    stream.set_nodelay(true).ok();
    stream.set_read_timeout(Some(HANDSHAKE_TIMEOUT))?;
    stream.set_write_timeout(Some(HANDSHAKE_TIMEOUT))?;
    let (mut reader, writer): (Box<dyn Read + Send>, Writer) = match &security {
        Some(security) => {
            let secure = chidori_tls::server_handshake(&mut stream, security.tls.clone())
                .map_err(|e| anyhow::anyhow!("TLS handshake with the client: {e}"))?;
            let reader = Box::new(secure.reader(stream.try_clone()?));
            (reader, Writer::new(Sink::Tls { sock: stream.try_clone()?, secure }))
        }
        None => (Box::new(stream.try_clone()?), Writer::new(Sink::Plain(stream.try_clone()?))),
    };
    let writer = Arc::new(writer);
    let frame =
        read_frame(&mut reader, HANDSHAKE_TIMEOUT).map_err(|e| anyhow::anyhow!("reading the client's hello: {e}"))?;
    if frame.header.kind != Kind::Hello {
        bail!("first frame is {:?}, not Hello", frame.header.kind);
    }
    let hello: Hello = messages::decode(&frame, "hello")?;
    let refuse = |reason, message: String| -> Result<()> {
        let msg = Refuse { reason, message: message.clone() };
        writer.send(Header::new(Kind::Refuse, 0, 0, 0), &messages::encode(&msg), &[])?;
        writer.close();
        bail!("refused {} (pid {}): {message}", hello.host, hello.pid)
    };
    if let Some(security) = &security
        && !chidori_tls::token::matches(&security.token, &hello.token)
    {
        return refuse(
            RefuseReason::Unauthorized,
            format!(
                "{}: use the one `chidori serve` printed at its start (it is kept in {} on the server), with \
                 --token, --token-file or CHIDORI_TOKEN",
                if hello.token.is_empty() { "this server requires a token" } else { "wrong token" },
                security.token_file.display()
            ),
        );
    }
    if hello.protocol != PROTOCOL_VERSION {
        return refuse(
            RefuseReason::Protocol,
            format!(
                "client speaks protocol {}, server {PROTOCOL_VERSION}: install the same Chidori release on both",
                hello.protocol
            ),
        );
    }
    if hello.schema != SCHEMA_HASH {
        return refuse(
            RefuseReason::Schema,
            format!(
                "client and server were generated from different CUDA specs (schema {:016x} vs {SCHEMA_HASH:016x}): install the same Chidori release on both",
                hello.schema
            ),
        );
    }
    authenticated();
    stream.set_write_timeout(None)?;
    let (backend, exposed) = match make_backend(hello.visible_devices.as_deref()) {
        Ok(b) => b,
        Err(e) => return refuse(RefuseReason::NoGpu, e),
    };
    // Where the supervisor can pass the session further connections: a resumable session
    // (if the client asked) and bulk lanes.
    let resume_secret = match (hello.resume, &options.resume) {
        (true, Some(_)) => crate::auth::random_bytes(SECRET_LEN)?,
        _ => Vec::new(),
    };
    let lanes = match &options.resume {
        Some(_) => Some((crate::auth::random_bytes(SECRET_LEN)?, Arc::new(Lanes::new(backend.clone())))),
        None => None,
    };
    // Content the client sent before: the store pins what it still has for this session.
    let content = match (&hello.content, &options.content) {
        (Some(named), Some(store)) => {
            let named = &named[..named.len().min(messages::MAX_CONTENT_NAMED)];
            let (kept, pinned) = store.pin(named);
            let budget = store.session_budget();
            Some((
                kept,
                Content { pinned, budget: Mutex::new(budget), keeper: crate::content::Keeper::new(store.clone()) },
            ))
        }
        _ => None,
    };
    let welcome = Welcome {
        server_version: env!("CARGO_PKG_VERSION").to_owned(),
        backend: backend.name().to_owned(),
        session: u64::from(std::process::id()),
        driver_version: backend.driver_version(),
        libraries: backend.libraries(),
        devices: backend.devices(),
        nvml_devices: exposed.unwrap_or(backend.devices().len() as u32),
        resume_secret: resume_secret.clone(),
        content_kept: content.as_ref().map(|(kept, _)| kept.clone()).unwrap_or_default(),
        content_budget: content.as_ref().map(|(_, c)| *lock(&c.budget)).unwrap_or(0),
        lanes: if lanes.is_some() { crate::lanes::OFFERED } else { 0 },
        lane_secret: lanes.as_ref().map(|(secret, _)| secret.clone()).unwrap_or_default(),
    };
    writer.send(Header::new(Kind::Welcome, 0, 0, 0), &messages::encode(&welcome), &[])?;
    tracing::info!(
        "session for {} pid {} ({}) open, backend {}{}{}",
        hello.host,
        hello.pid,
        hello.program,
        backend.name(),
        if resume_secret.is_empty() { "" } else { "; it survives a dropped connection" },
        match &content {
            Some((kept, c)) => format!("; {} of {} uploads it names are kept", c.pinned.len(), kept.len()),
            None => String::new(),
        }
    );
    // The stream of a resumable session starts after the Welcome.
    let resumable = !resume_secret.is_empty();
    let reader = match options.resume {
        Some(control) => {
            if resumable {
                writer.keep_for_resume();
            }
            let acceptor = Acceptor {
                control,
                security: security.clone(),
                secret: resume_secret,
                lanes: lanes.clone(),
                heartbeat: options.heartbeat,
            };
            let links = spawn_acceptor(acceptor, writer.clone());
            match resumable {
                true => Resumable::surviving(reader, writer.clone(), links, chidori_protocol::resume::grace()),
                false => Resumable::plain(reader, writer.clone()),
            }
        }
        None => Resumable::plain(reader, writer.clone()),
    };

    let handles = Handles::with_finder(module_functions(&backend));
    let session = Arc::new(Session {
        landing: handles.landing(),
        handles: Mutex::new(handles),
        pulls: Mutex::new(HashMap::new()),
        backend,
        ended: Mutex::new(HashMap::new()),
        capture_ids: Mutex::new(HashMap::new()),
        writer,
        callbacks: Mutex::new(HashMap::new()),
        next_callback: AtomicU64::new(1),
        module_cache: options.module_cache,
        modules: Mutex::new(HashMap::new()),
        libraries: Mutex::new(std::collections::HashSet::new()),
        layouts: Mutex::new(HashMap::new()),
        owned: Mutex::new(HashMap::new()),
        held: Mutex::new(crate::held::Records::default()),
        user_objects: Mutex::new(crate::user_objects::References::default()),
        timing: tracing::enabled!(target: TIMING_TARGET, tracing::Level::DEBUG).then(Default::default),
        mirrors: Mutex::new(Mirrors::default()),
        memory: Mutex::new(Memory::new(options.memory_quota)),
        ipc: crate::ipc::Exports::new(options.ipc_dir),
        windows: Mutex::default(),
        content: content.map(|(_, c)| c),
        warned: Mutex::new(std::collections::HashSet::new()),
        captures: AtomicBool::new(false),
        lanes: lanes.map(|(_, lanes)| lanes),
        program_pid: hello.pid,
        closing: AtomicBool::new(false),
        loader: Mutex::new(None),
        running: Mutex::new(None),
    });
    stream.set_read_timeout(Some(options.heartbeat))?;
    // Buffered: a burst of small frames (the client's outbox) arrives in one read.
    let mut reader = std::io::BufReader::with_capacity(READ_BUFFER, reader);
    // A resumable session's reader replaces a connection silent for a few heartbeats before
    // a frame's stall limit would end the session.
    let stall = if reader.get_ref().is_resumable() {
        options.heartbeat * (RESUMABLE_STALL_HEARTBEATS)
    } else {
        frame_stall(options.heartbeat)
    };
    let result = serve(&session, &mut reader, stall);
    session.ipc.withdraw();
    if let Some(content) = &session.content {
        content.keeper.finish();
    }
    log_timing(&session);
    match &result {
        Ok(()) => tracing::info!("session for {} pid {} closed by the client", hello.host, hello.pid),
        Err(e) => {
            tracing::warn!("session for {} pid {} ends: {e}", hello.host, hello.pid);
            let bye = Goodbye { reason: e.to_string() };
            let _ = session.writer.send(Header::new(Kind::Goodbye, 0, 0, 0), &messages::encode(&bye), &[]);
        }
    }
    session.writer.close();
    result
}

/// Heartbeats a frame of a resumable session may make no progress (its reader reconnects
/// after fewer).
const RESUMABLE_STALL_HEARTBEATS: u32 = 8;

/// How long a frame that has started may make no progress: twice the heartbeat, at least
/// 2 s.
pub fn frame_stall(heartbeat: Duration) -> Duration {
    (heartbeat * 2).max(Duration::from_secs(2))
}

/// The functions the session spent most time in, longest first (CHIDORI_LOG=chidori::calls=debug).
fn log_timing(session: &Session) {
    let Some(timing) = &session.timing else { return };
    let mut rows: Vec<_> = lock(timing).iter().map(|(name, &(calls, total))| (total, calls, *name)).collect();
    rows.sort_unstable_by(|a, b| b.cmp(a));
    let total: Duration = rows.iter().map(|r| r.0).sum();
    tracing::debug!(target: TIMING_TARGET, "time in the libraries: {:.1} ms in all", total.as_secs_f64() * 1e3);
    for (time, calls, name) in rows.into_iter().take(25) {
        let ms = time.as_secs_f64() * 1e3;
        tracing::debug!(target: TIMING_TARGET, "{name:<44} {calls:>9} calls {ms:>10.1} ms");
    }
}

/// The order in which the client issued its calls, across its threads. Each client thread
/// has its own executor (thread-local CUDA state: current device, capture mode), but the
/// GPU must see work in the order the client issued it: autograd's backward thread
/// launches onto the stream that the main thread's forward kernels went to a moment
/// earlier, and may not overtake them. Frames are numbered as they arrive (the client
/// sends under one lock, so arrival order is issue order) and executed in that order; a
/// call that only waits (stream, event, device synchronize) lets the next one start first,
/// as it would natively.
#[derive(Default)]
struct Turn {
    state: Mutex<TurnState>,
    changed: Condvar,
}

#[derive(Default)]
struct TurnState {
    /// Every frame before this one has been released.
    released: u64,
    /// Executors blocked in `wait` (no wake-up is needed while there are none).
    waiting: usize,
}

impl Turn {
    /// Block until every frame before `n` has been released.
    fn wait(&self, n: u64) {
        let mut s = lock(&self.state);
        while s.released < n {
            s.waiting += 1;
            s = self.changed.wait(s).unwrap_or_else(|p| p.into_inner());
            s.waiting -= 1;
        }
    }

    /// Frame `n` no longer holds up later frames.
    fn release(&self, n: u64) {
        let mut s = lock(&self.state);
        if s.released <= n {
            s.released = n + 1;
            if s.waiting > 0 {
                self.changed.notify_all();
            }
        }
    }
}

/// Bytes the session's reader takes from the socket at once.
const READ_BUFFER: usize = 256 << 10;

/// Whether `buffered` starts with a whole frame (or with bytes that are no frame header:
/// reading them reports the error without blocking).
fn whole_frame(buffered: &[u8]) -> bool {
    match frame::buffered_len(buffered) {
        Ok(Some(total)) => buffered.len() >= total,
        Ok(None) => false,
        Err(_) => true,
    }
}

/// Calls that only wait for earlier work (`only_waits` in the specs): later frames need
/// not wait for them to return.
fn only_waits(frame: &Frame) -> bool {
    frame.header.kind == Kind::Call && VARIANTS.get(frame.header.call as usize).is_some_and(|d| d.only_waits)
}

fn serve(session: &Arc<Session>, reader: &mut std::io::BufReader<Resumable>, stall: Duration) -> Result<()> {
    let mut executors: HashMap<u32, mpsc::Sender<Batch>> = HashMap::new();
    // Each executor holds a sender until it ends: `finish` waits for all of them.
    let (running_tx, running_rx) = mpsc::channel::<()>();
    *lock(&session.running) = Some(running_tx.clone());
    let result = receive(session, reader, stall, &mut executors, &running_tx);
    finish(session, executors, running_tx, &running_rx);
    result
}

/// Read the client's frames and hand each to its thread's executor, until the client
/// closes the session (Ok) or breaks it (Err).
fn receive(
    session: &Arc<Session>,
    reader: &mut std::io::BufReader<Resumable>,
    stall: Duration,
    executors: &mut HashMap<u32, mpsc::Sender<Batch>>,
    running_tx: &mpsc::Sender<()>,
) -> Result<()> {
    // Consecutive frames of one client thread, handed to its executor together.
    let mut batch: Option<(u32, Batch)> = None;
    let turn = Arc::new(Turn::default());
    let mut issued = 0u64;
    let (fatal_tx, fatal_rx) = mpsc::channel::<Fatal>();
    let mut silent = 0;
    loop {
        if let Ok(Fatal(reason)) = fatal_rx.try_recv() {
            bail!("{reason}");
        }
        // Before blocking on the socket, hand over what was read.
        if !whole_frame(reader.buffer())
            && let Some((thread, frames)) = batch.take()
            && let Some(tx) = executors.get(&thread)
            && tx.send(frames).is_err()
        {
            bail!("executor of client thread {thread} is gone");
        }
        let frame = match read_frame(reader, stall) {
            Ok(f) => f,
            Err(ReadError::Closed) => return Ok(()),
            Err(ReadError::Timeout) => {
                silent += 1;
                // A resumable session's reader reconnects instead (after as many heartbeats).
                if silent > 3 && !reader.get_ref().is_resumable() {
                    bail!("the client stopped answering heartbeats");
                }
                session.writer.send_control(Header::new(Kind::Ping, 0, 0, 0));
                reader.get_mut().acknowledge();
                continue;
            }
            Err(e) => bail!("malformed frame: {e}"),
        };
        silent = 0;
        // A call sent on a bulk lane: taken from there in its place in the call order.
        let (frame, lane) = match frame.header.kind {
            Kind::Lane => {
                // What was read goes to its executor first: the lane's frame may take a while.
                if let Some((t, frames)) = batch.take()
                    && let Some(tx) = executors.get(&t)
                    && tx.send(frames).is_err()
                {
                    bail!("executor of client thread {t} is gone");
                }
                (lane_call(session, &frame, stall)?, u8::try_from(frame.header.call).ok())
            }
            _ => (frame, None),
        };
        match frame.header.kind {
            Kind::Call | Kind::Launch | Kind::Service => {
                let thread = frame.header.thread;
                issued += 1;
                match &mut batch {
                    Some((t, frames)) if *t == thread => frames.push((issued - 1, frame, lane)),
                    _ => {
                        if let Some((t, frames)) = batch.take()
                            && let Some(tx) = executors.get(&t)
                            && tx.send(frames).is_err()
                        {
                            bail!("executor of client thread {t} is gone");
                        }
                        executors.entry(thread).or_insert_with(|| {
                            spawn_executor(session.clone(), turn.clone(), fatal_tx.clone(), running_tx.clone())
                        });
                        batch = Some((thread, vec![(issued - 1, frame, lane)]));
                    }
                }
            }
            Kind::Ping => session.writer.send_control(Header::new(Kind::Pong, 0, 0, frame.header.seq)),
            Kind::Pong => {}
            Kind::Ack => session.writer.acked(frame.header.seq),
            Kind::HostCallbackDone => {
                let done: HostCallbackDone = messages::decode(&frame, "callback done")?;
                let waiter = session.callbacks.lock().unwrap_or_else(|p| p.into_inner()).remove(&done.token);
                match waiter {
                    Some(tx) => {
                        let _ = tx.send(());
                    }
                    None => bail!("completion of unknown host callback {}", done.token),
                }
            }
            Kind::ModuleImage => {
                let image: messages::ModuleImage = messages::decode(&frame, "module image")?;
                // One the loader gave up waiting for (a large image on a slow link) comes late:
                // dropped, the session goes on.
                let Some(tx) = lock(&session.pulls).remove(&image.hash) else {
                    tracing::debug!("module {} came, and no load waits for it", cache::hex(&image.hash));
                    continue;
                };
                if !frame.bulk.is_empty() && cache::sha256(&frame.bulk) != image.hash {
                    bail!("the client sent module {} with other bytes", cache::hex(&image.hash));
                }
                let _ = tx.send(frame.bulk.to_vec());
            }
            Kind::Goodbye => return Ok(()),
            other => bail!("unexpected {other:?} frame from the client"),
        }
    }
}

/// The call a [`Kind::Lane`] frame stands for: the lane's next frame, which must be that
/// call (its thread and sequence number).
fn lane_call(session: &Session, marker: &Frame, stall: Duration) -> Result<Frame> {
    let Some(lanes) = &session.lanes else { bail!("the client sent a call on a bulk lane the server never offered") };
    let lane = u8::try_from(marker.header.call)
        .map_err(|_| anyhow::anyhow!("bulk lane {} does not exist", marker.header.call))?;
    let frame = lanes.next_frame(lane, stall).map_err(|e| anyhow::anyhow!("{e}"))?;
    let (h, m) = (frame.header, marker.header);
    if h.kind != Kind::Call || h.thread != m.thread || h.seq != m.seq {
        bail!(
            "bulk lane {lane} carried {:?} {} of thread {} where the session expected call {} of thread {}",
            h.kind,
            h.seq,
            h.thread,
            m.seq,
            m.thread
        );
    }
    Ok(frame)
}

/// Frames for one executor, with their arrival numbers and the bulk lane each came on.
type Batch = Vec<(u64, Frame, Option<u8>)>;

thread_local! {
    /// The bulk lane the frame this executor runs came on: its reply goes back there.
    static REPLY_LANE: std::cell::Cell<Option<u8>> = const { std::cell::Cell::new(None) };
}

/// Write a reply to the frame this thread executes: on the lane the frame came on, else on
/// the session's connection.
fn send_reply(session: &Session, header: Header, archive: &[u8], bulk: &[&[u8]]) -> std::io::Result<()> {
    match (REPLY_LANE.get(), &session.lanes) {
        (Some(lane), Some(lanes)) => lanes.send(lane, header, archive, bulk),
        _ => session.writer.send(header, archive, bulk),
    }
}

/// How long the calls running when the client closes its session may take to return before
/// the worker ends anyway (a kernel that never ends, a wait for the client).
const FINISH_LIMIT: Duration = Duration::from_secs(10);

/// The client has closed its session: what its executors still hold is not run (as a
/// process's queued work ends with it natively), and the calls running now return before
/// the worker exits. The exit runs the libraries' own teardown (cuDNN, cuSOLVER, the
/// runtime's), which must not race a call inside the same library: a `cusolverDnDestroy`
/// sent as the program exited faulted in the worker under the runtime's teardown.
fn finish(
    session: &Session,
    executors: HashMap<u32, mpsc::Sender<Batch>>,
    running: mpsc::Sender<()>,
    running_rx: &mpsc::Receiver<()>,
) {
    session.closing.store(true, Ordering::SeqCst);
    drop(executors);
    drop(running);
    // The loader thread skips what it still holds and ends (it holds a `running` too).
    lock(&session.running).take();
    lock(&session.loader).take();
    // A host function waiting for the client returns (the client will never run it).
    lock(&session.callbacks).clear();
    // Nothing is sent on `running`: it disconnects when the last executor has ended.
    if let Err(mpsc::RecvTimeoutError::Timeout) = running_rx.recv_timeout(FINISH_LIMIT) {
        tracing::warn!(
            "a call of the closed session still runs after {} s; the worker ends anyway",
            FINISH_LIMIT.as_secs()
        );
        CALL_LEFT_RUNNING.store(true, Ordering::SeqCst);
    }
}

/// A call may still run inside a library (a fatal error ended the session from an executor,
/// or a call outlived [`FINISH_LIMIT`]).
static CALL_LEFT_RUNNING: AtomicBool = AtomicBool::new(false);

/// End the session's worker process. Normally with `exit`, which runs the libraries' own
/// teardown as a program's exit does; where a call may still run inside a library, with
/// `_exit`, which skips that teardown (it would free what the call uses under it: a fault
/// instead of an exit). The process's end frees the session's GPU state either way.
pub fn end_process(code: i32) -> ! {
    if CALL_LEFT_RUNNING.load(Ordering::SeqCst) {
        use std::io::Write;
        let _ = std::io::stderr().flush();
        // SAFETY: _exit ends the process at once; nothing of this process is used after.
        unsafe { libc::_exit(code) }
    }
    std::process::exit(code)
}

fn spawn_executor(
    session: Arc<Session>,
    turn: Arc<Turn>,
    fatal: mpsc::Sender<Fatal>,
    running: mpsc::Sender<()>,
) -> mpsc::Sender<Batch> {
    let (tx, rx) = mpsc::channel::<Batch>();
    std::thread::Builder::new()
        .name("chidori-exec".into())
        .spawn(move || {
            session.backend.thread_init();
            while let Ok(frames) = rx.recv() {
                for (n, mut frame, lane) in frames {
                    REPLY_LANE.set(lane);
                    turn.wait(n);
                    if session.closing.load(Ordering::SeqCst) {
                        turn.release(n);
                        continue;
                    }
                    let early = only_waits(&frame);
                    if early {
                        turn.release(n);
                    }
                    let result = match frame.header.kind {
                        Kind::Launch => launch(&session, &frame),
                        Kind::Service => service(&session, &frame),
                        _ => execute(&session, &frame),
                    };
                    if !early {
                        turn.release(n);
                    }
                    // A lane's copy chunk: its buffer is filled again by a lane's reader (the
                    // call is done with it, as with any frame dropped here).
                    if let (Some(_), Some(lanes)) = (lane, &session.lanes) {
                        lanes.recycle(std::mem::take(&mut frame.bulk));
                    }
                    if let Err(Fatal(reason)) = result {
                        let _ = fatal.send(Fatal(reason.clone()));
                        // The main thread may be blocked reading: end the process from here so
                        // the client learns at once. Exit releases the GPU state of the session.
                        tracing::warn!("session ends: {reason}");
                        let bye = Goodbye { reason };
                        let _ = session.writer.send(Header::new(Kind::Goodbye, 0, 0, 0), &messages::encode(&bye), &[]);
                        // Other executors may be inside a library: no teardown of the
                        // libraries under them ([`end_process`]).
                        CALL_LEFT_RUNNING.store(true, Ordering::SeqCst);
                        end_process(2);
                    }
                }
            }
            // The session goes before `running` says this executor has ended.
            drop(session);
            drop(running);
        })
        .expect("spawning an executor thread");
    tx
}

/// Host memory of one call: each buffer owns 8-byte-aligned storage.
struct Buffer {
    words: Vec<u64>,
    len: usize,
    /// From [`OUTPUTS`], and goes back there (until the library writes it, it holds bytes
    /// of an earlier call of this session).
    pooled: bool,
}

/// Outputs this large are taken from [`OUTPUTS`] and go back there: a large read-back's
/// buffer is neither faulted in nor zeroed again for every chunk.
const SPARE_MIN: usize = 1 << 20;

/// Words of a pooled output buffer: the largest copy chunk a client sends (8 MiB).
const POOLED_WORDS: usize = 1 << 20;

/// The records the program holds (`crate::held`) that a call takes and initializes.
struct HeldCall {
    /// Records an initializer fills (`Wire::NewRecordHandle`), by parameter: kept once the
    /// call succeeds, dropped otherwise.
    fresh: Vec<Option<Box<[u128]>>>,
    /// The worker's records the call takes (what a new one is made from).
    taken: Vec<u64>,
}

impl HeldCall {
    /// Nothing allocated until a call takes or makes a record (every call makes one).
    fn new() -> HeldCall {
        HeldCall { fresh: Vec::new(), taken: Vec::new() }
    }

    fn keep_fresh(&mut self, param: usize, record: Box<[u128]>) {
        if self.fresh.len() <= param {
            self.fresh.resize_with(param + 1, || None);
        }
        self.fresh[param] = Some(record);
    }

    fn is_empty(&self) -> bool {
        self.taken.is_empty() && self.fresh.iter().all(Option::is_none)
    }

    /// After the call: the records it took were used; a new one is kept and its id goes
    /// back (the client's name where it named it; 0 after a failure, and the record is
    /// dropped); records of kinds no call destroys beyond the bound retire.
    fn finish(
        &mut self,
        session: &Session,
        desc: &CallDesc,
        ok: bool,
        handles: &mut Handles,
        args: &[u64],
        buffers: &mut [Option<Buffer>],
    ) {
        let never_destroyed = chidori_cuda::handles::NEVER_DESTROYED;
        let mut held = lock(&session.held);
        for &real in &self.taken {
            held.touch(real);
        }
        let mut retire = false;
        for (i, wire) in desc.params.iter().enumerate() {
            let (Wire::NewRecordHandle { kind, named, .. }, Some(record)) =
                (*wire, self.fresh.get_mut(i).and_then(Option::take))
            else {
                continue;
            };
            let value = match (ok, args.get(i)) {
                (false, _) => 0,
                // The client's name for it (nothing goes back).
                (true, Some(&name)) if named => {
                    handles.insert_named(kind, name, held.keep(record, kind, &self.taken));
                    name
                }
                (true, _) => handles.insert(kind, held.keep(record, kind, &self.taken)),
            };
            if let Some(word) =
                buffers.get_mut(i).and_then(Option::as_mut).and_then(|b| b.bytes_mut().first_chunk_mut::<8>())
            {
                *word = value.to_le_bytes();
            }
            retire |= ok && never_destroyed.contains(&kind);
        }
        if !retire {
            return;
        }
        for (kind, real) in held.retire(never_destroyed, crate::held::NEVER_DESTROYED_KEPT) {
            if let Some(value) = handles.known(kind, real) {
                handles.remove(kind, value);
            }
            if lock(&session.warned).insert("held records retired") {
                tracing::warn!(
                    "{}: more than {} {} records live, which no call destroys: the least recently used are retired \
                     (a later call with one is refused as a stale handle)",
                    desc.name,
                    crate::held::NEVER_DESTROYED_KEPT,
                    Handles::name(kind)
                );
            }
        }
    }
}

/// Large output buffers kept for reuse (a worker serves one session): made once, pinned
/// for the GPU's copies where the backend can, never freed; at most [`OUTPUTS_MADE`], or
/// what the session's lanes hold ([`outputs_for_lanes`]) where that is more (beyond: one of
/// its own per call, freed after).
static OUTPUTS: Mutex<crate::lanes::Reused<u64>> =
    Mutex::new(crate::lanes::Reused::new(OUTPUTS_MADE, POOLED_WORDS, false));

const OUTPUTS_MADE: usize = 12;

/// Let [`OUTPUTS`] make enough for `lanes` lanes' read-backs in flight (each lane's writer
/// holds up to three replies): beyond the pool, every chunk's buffer would be allocated,
/// faulted in and zeroed anew, and not pinned.
pub fn outputs_for_lanes(lanes: usize) {
    lock(&OUTPUTS).allow(crate::lanes::staging_for(lanes));
}

impl Buffer {
    fn zeroed(len: usize) -> Buffer {
        Buffer { words: vec![0u64; len.div_ceil(8)], len, pooled: false }
    }

    /// A buffer the library writes whole when it succeeds (a copy's destination): a large
    /// one comes from [`OUTPUTS`], and is zeroed only if the call fails ([`Buffer::settle`]).
    fn output(len: usize, backend: &dyn Backend) -> Buffer {
        let words = len.div_ceil(8);
        if len >= SPARE_MIN
            && words <= POOLED_WORDS
            && let Some(mut w) = lock(&OUTPUTS).take(backend)
        {
            w.resize(words, 0);
            return Buffer { words: w, len, pooled: true };
        }
        Buffer::zeroed(len)
    }

    /// Whether the buffer is pinned (a copy into it on a stream lands when the GPU gets to it).
    fn is_pinned(&self) -> bool {
        self.pooled && lock(&OUTPUTS).is_pinned(self.words.as_ptr() as u64)
    }

    /// After a failed call: a reused buffer holds no earlier bytes.
    fn settle_failed(&mut self) {
        if self.pooled {
            self.words.fill(0);
        }
    }

    fn from(bytes: &[u8]) -> Buffer {
        let mut b = Buffer::zeroed(bytes.len());
        b.bytes_mut().copy_from_slice(bytes);
        b
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: words holds at least len bytes.
        unsafe { std::slice::from_raw_parts(self.words.as_ptr() as *const u8, self.len) }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above.
        unsafe { std::slice::from_raw_parts_mut(self.words.as_mut_ptr() as *mut u8, self.len) }
    }

    fn addr(&mut self) -> u64 {
        self.words.as_mut_ptr() as u64
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        if self.pooled {
            lock(&OUTPUTS).give(std::mem::take(&mut self.words));
        }
    }
}

impl AsRef<[u8]> for Buffer {
    fn as_ref(&self) -> &[u8] {
        self.bytes()
    }
}

/// A record in the client's layout and the server's, when they differ.
struct Translation {
    client: &'static structs::StructMap,
    server: &'static structs::StructMap,
}

fn translation(session: &Session, desc: &CallDesc, record: Option<&str>) -> Option<Translation> {
    let record = record?;
    let client_version = desc.versions.last()?;
    let server_version = session.backend.layout_version(desc.library)?;
    let client = structs::get(client_version, record)?;
    let server = structs::get(&server_version, record)?;
    (client != server).then_some(Translation { client, server })
}

/// Bytes of a record the library fills for the program (`Wire::NewRecordHandle`): the
/// largest any CUDA version's headers give its type, at least `bytes` (the client's). The
/// server's library may be another release with larger records (cuSPARSELt's are 13,072
/// bytes in 0.6, 1024 in 0.7, 512 in 0.8, all under one soname).
fn record_bytes(kind: HandleKind, bytes: usize) -> usize {
    let Some(name) = chidori_cuda::handles::KINDS.get(usize::from(kind)) else { return bytes };
    structs::BY_VERSION
        .iter()
        .filter_map(|(v, _)| structs::get(v, name))
        .map(|m| m.size as usize)
        .fold(bytes, usize::max)
}

/// Records in `len` bytes of `map`'s layout: whole records, a partial last one counted, at
/// least one (the library writes a whole record).
fn records_in(len: usize, map: &structs::StructMap) -> usize {
    len.div_ceil((map.size as usize).max(1)).max(1)
}

/// An array of records (one, or a call's `count` of them) from one layout to another, each
/// field by field: `dst` holds as many records of `to` as `src` holds of `from`.
fn translate_all(from: &structs::StructMap, to: &structs::StructMap, src: &[u8], dst: &mut [u8]) {
    let (a, b) = ((from.size as usize).max(1), (to.size as usize).max(1));
    for (s, d) in src.chunks(a).zip(dst.chunks_mut(b)) {
        translate(from, to, s, d);
    }
}

/// Copy a record field by field (by name) from one layout to another; fields missing on
/// one side are zero.
fn translate(from: &structs::StructMap, to: &structs::StructMap, src: &[u8], dst: &mut [u8]) {
    dst.fill(0);
    for f in to.fields {
        let Some(g) = from.fields.iter().find(|g| g.name == f.name) else { continue };
        let n = f.size.min(g.size) as usize;
        let (s, d) = (g.offset as usize, f.offset as usize);
        if let (Some(src), Some(dst)) = (src.get(s..s + n), dst.get_mut(d..d + n)) {
            dst.copy_from_slice(src);
        }
    }
}

/// The session's handle tables and memory, as the argument decoder checks them.
struct SessionTables<'a> {
    session: &'a Session,
    args: &'a [u64],
    /// The call's checks (extents of its device arguments).
    checks: &'static CallChecks,
}

impl codec::Tables for SessionTables<'_> {
    fn resolve(&mut self, kind: HandleKind, value: u64) -> Option<u64> {
        let mut handles = lock(&self.session.handles);
        // A kernel where a function is expected (a statically linked runtime's attributes,
        // occupancy, cache config): the driver takes it as its function in the current
        // context, and so is it asked here.
        use chidori_cuda::handles::kind::{CUfunc_st, CUkern_st};
        if kind == CUfunc_st && !handles.owns(kind, value) && handles.owns(CUkern_st, value) {
            let kernel = handles.resolve(CUkern_st, value)?;
            drop(handles);
            return self.session.backend.kernel_function(kernel).ok();
        }
        handles.resolve(kind, value)
    }

    fn name_free(&mut self, kind: HandleKind, value: u64) -> bool {
        lock(&self.session.handles).name_free(kind, value)
    }

    fn null_ok(&mut self, param: usize) -> bool {
        self.checks.null_ok.iter().any(|&p| usize::from(p) == param)
    }

    fn device(&mut self, param: usize, addr: u64, bytes: Option<u64>) -> Result<u64, String> {
        let arg = |j: usize| self.args.get(j).copied().unwrap_or(0);
        let extent = match bytes {
            Some(bytes) => Some(bytes),
            // The bytes the specs' `extent` says the argument spans.
            None => match (
                self.checks.extents.iter().find(|&&(p, _, _)| usize::from(p) == param).copied(),
                self.checks.extents_2d.iter().find(|&&(p, _, _, _)| usize::from(p) == param).copied(),
            ) {
                // A fixed size (a stream memory operation's word).
                (Some((_, u8::MAX, bytes)), _) => Some(bytes),
                (Some((_, count, unit)), _) => arg(count.into()).checked_mul(unit),
                (None, Some((_, pitch, width, height))) => {
                    memory::span_2d(arg(pitch.into()), arg(width.into()), arg(height.into()))
                }
                (None, None) => Some(1),
            },
        };
        let Some(extent) = extent else { return Err("a length past the address space".into()) };
        device_at(self.session, addr, extent)
            .ok_or_else(|| format!("{addr:#x} ({extent} bytes) is not device memory of this session"))
    }
}

/// `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`, and the runtime's
/// `cudaMemHandleTypePosixFileDescriptor`: the shareable handles that travel between sessions.
const POSIX_FD: u64 =
    chidori_cuda::consts::CUmemAllocationHandleType_enum::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR as u64;

/// The size of the memory that CUDA IPC just opened at `base` (`cuMemGetAddressRange`).
fn opened_size(session: &Session, base: u64) -> Option<u64> {
    let (mut start, mut len) = (0u64, 0u64);
    let args = [&raw mut start as u64, &raw mut len as u64, base];
    // SAFETY: the two outputs are the locals above, the address a value.
    let status = unsafe {
        crate::adapt::invoke(&*session.backend, &chidori_cuda::calls::driver::cuMemGetAddressRange_v2__call, &args)
    };
    (status == Ok(0) && start == base && len > 0).then_some(len)
}

/// Whether `[addr, addr + len)` is memory of this session at that address (NULL is left to
/// the library).
fn device_ok(session: &Session, addr: u64, len: u64) -> bool {
    addr == 0 || lock(&session.memory).contains(addr, len) || lock(&session.mirrors).contains(addr, len)
}

/// Memory named in records the library wrote (a copy node's parameters read back): where
/// a stand-in of the client's memory holds it, the client's own address, as the program
/// gave it.
fn untranslate_records(session: &Session, desc: &CallDesc, checks: &CallChecks, buffers: &mut [Option<Buffer>]) {
    for &(i, record, _, _) in checks.memory_records.iter().filter(|r| r.3) {
        let (Some(b), Some(version)) =
            (buffers.get_mut(i).and_then(Option::as_mut), session.backend.layout_version(desc.library))
        else {
            continue;
        };
        let mirrors = lock(&session.mirrors);
        // A record the library wrote that names no span this server can read is left as it is.
        let _ =
            crate::records::rename_spans(record, &version, b.bytes_mut(), |span| Ok(mirrors.untranslate(span.start)));
    }
}

/// The stream a call runs on, as the library gets it (its stream parameter in `raw`).
fn stream_of(desc: &CallDesc, raw: &[u64]) -> Option<u64> {
    desc.params.iter().zip(raw).find_map(|(wire, &value)| {
        matches!(wire, Wire::Handle { kind, .. } if *kind == chidori_cuda::handles::kind::CUstream_st).then_some(value)
    })
}

/// Whether the call's stream (in `raw`) is capturing; asked of the driver only once the
/// session has begun a capture.
fn capturing(session: &Session, desc: &CallDesc, raw: &[u64]) -> bool {
    session.captures.load(Ordering::Relaxed)
        && stream_of(desc, raw).is_some_and(|stream| session.backend.stream_capturing(stream))
}

/// Where the session has `[addr, addr + len)` of what the client names: the address itself
/// ([`device_ok`]), or where a stand-in of the client's pageable memory holds it
/// (`crate::mirror`); None where neither.
fn device_at(session: &Session, addr: u64, len: u64) -> Option<u64> {
    if device_ok(session, addr, len) {
        return Some(addr);
    }
    lock(&session.mirrors).translate(addr, len)
}

/// Check every span of device memory the records in `bytes` name (records of type `record`
/// back to back, in the layout of CUDA `version`) to be the session's, and name each where
/// the session has it ([`device_at`]). Err: the first span that is not, or a malformed record.
fn name_where_the_session_has(session: &Session, record: &str, version: &str, bytes: &mut [u8]) -> Result<(), String> {
    // Records whose memory CUDA takes reaching past its allocation (a texture's): only
    // their start must be the session's (`span_start` in the specs).
    let resource = crate::records::checks_start_only(record);
    crate::records::rename_spans(record, version, bytes, |span| {
        let (addr, len) = (span.start, span.len);
        let at = device_at(session, addr, len)
            .or_else(|| (resource && lock(&session.memory).contains(addr, 1)).then_some(addr))
            .ok_or_else(|| format!("{addr:#x} ({len} bytes) in {record} is not device memory of this session"))?;
        Ok((at != addr).then_some(at))
    })
}

/// Answer a call whose arguments the decoder refused: the library's status, or the end of
/// the session for a frame that breaks the protocol.
fn refuse(session: &Session, header: &Header, desc: &CallDesc, e: DecodeError) -> Result<(), Fatal> {
    let message = match &e {
        DecodeError::Handle { kind, value, element: None, .. } => {
            format!("{}: {value:#x} is not a {} of this session", desc.name, Handles::name(*kind))
        }
        DecodeError::Handle { kind, value, element: Some(at), .. } => format!(
            "{}: element {at} of the array, {value:#x}, is not a {} of this session",
            desc.name,
            Handles::name(*kind)
        ),
        DecodeError::NameTaken { kind, value, .. } => {
            format!("{}: the client named two {} handles {value:#x}", desc.name, Handles::name(*kind))
        }
        e => format!("{}: {e}", desc.name),
    };
    match e.refusal() {
        Refusal::Fatal => Err(Fatal(message)),
        Refusal::InvalidValue => reply_error(session, header, desc, desc.codes.invalid_value, message),
        // Quiet where the program waits for the status (it may pass the NULL on purpose);
        // a call sent without waiting learns of it far away, at another call, so it is
        // said as a failed one is: at warn once per function, to both sides.
        Refusal::InvalidValueQuietly if desc.waits() => {
            tracing::debug!("{message}");
            reply_status(session, header, desc, desc.codes.invalid_value, None)
        }
        Refusal::InvalidValueQuietly => {
            if lock(&session.warned).insert(desc.name) {
                tracing::warn!("{message} (the client did not wait for it)");
            } else {
                tracing::debug!("{message}");
            }
            reply_error(session, header, desc, desc.codes.invalid_value, message)
        }
        Refusal::InvalidHandle => reply_error(session, header, desc, desc.codes.invalid_handle, message),
    }
}

/// A call's per-parameter array: inline up to 16 parameters (most calls), on the heap past.
type PerCall<T> = smallvec::SmallVec<[T; 16]>;

fn execute(session: &Arc<Session>, frame: &Frame) -> Result<(), Fatal> {
    let header = frame.header;
    let desc: &'static CallDesc =
        VARIANTS.get(header.call as usize).copied().ok_or_else(|| Fatal(format!("unknown call {}", header.call)))?;
    let call = messages::access::<Call>(frame, "call").map_err(|e| Fatal(e.to_string()))?;
    // A capture's end keeps its graph by the stream as the client sent it.
    let capture_end = call_checks::of(desc).capture_end;
    let ended_stream = if capture_end { call.args.first().map_or(0, |a| a.to_native()) } else { 0 };
    let n = desc.params.len();
    // Per-call arrays live on the stack up to 16 parameters ([`PerCall`]): their
    // allocations showed in the executor's profile for small asynchronous calls.
    let mut args: PerCall<u64> = call.args.iter().map(|a| a.to_native()).collect();
    let lens: PerCall<u64> = call.lens.iter().map(|l| l.to_native()).collect();
    // Values a wire form fixes (a copy's direction is what its form says), whatever the
    // client sent.
    if let Some(form) = desc.form {
        for (i, value) in chidori_cuda::checks::fixed(desc.name, form) {
            if let Some(a) = args.get_mut(usize::from(i)) {
                *a = value;
            }
        }
        // And parameters it sets to another's value (a packed host side's pitch is its
        // width: the worker's buffer holds width x height bytes).
        for (i, j) in chidori_cuda::checks::same(desc.name, form) {
            if let Some(&v) = args.get(usize::from(j))
                && let Some(a) = args.get_mut(usize::from(i))
            {
                *a = v;
            }
        }
    }
    let fail =
        |status: i64, message: String| -> Result<(), Fatal> { reply_error(session, &header, desc, status, message) };
    let invalid = |message: String| fail(desc.codes.invalid_value, format!("{}: {message}", desc.name));
    // A NULL the library would dereference: its invalid-value status, without a log line on
    // either side (a program testing its error paths passes them on purpose).
    let quiet = |message: String| {
        tracing::debug!("{}: {message}", desc.name);
        reply_status(session, &header, desc, desc.codes.invalid_value, None)
    };

    // What the call does to the session's memory: allocations within the quota, and never
    // memory of another process.
    let checks = call_checks::of(desc);
    let effect = checks.effect;
    match effect {
        Effect::Export { .. }
        | Effect::Open { .. }
        | Effect::ExportFd { .. }
        | Effect::ImportFd { .. }
        | Effect::ImportPointer { .. }
            if !session.ipc.enabled() =>
        {
            return fail(desc.codes.not_supported, format!("{}: this session runs without CUDA IPC", desc.name));
        }
        Effect::ExportFd { kind, .. } | Effect::ImportFd { kind, .. } if args.get(kind) != Some(&POSIX_FD) => {
            return fail(
                desc.codes.not_supported,
                format!("{}: only POSIX file descriptors travel between sessions", desc.name),
            );
        }
        Effect::ExportFd { out, .. } if lens.get(out).is_none_or(|&len| len == NULL_LEN || len < 8) => {
            return invalid("the shareable handle's output holds no token".to_owned());
        }
        Effect::Close { ptr } => {
            let base = args.get(ptr).copied().unwrap_or(0);
            if lock(&session.memory).origin_at(base) != Some(Origin::Opened) {
                return invalid(format!("{base:#x} is not memory this session opened by CUDA IPC"));
            }
        }
        Effect::Alloc { size, origin: Origin::Allocated, .. } => {
            let bytes = match size {
                Size::Param(p) => args.get(p).copied().unwrap_or(0),
                // The pitch is known after the call; width × height is what it at least takes.
                Size::Pitch { width, height, .. } => {
                    args.get(width).copied().unwrap_or(0).saturating_mul(args.get(height).copied().unwrap_or(0))
                }
                Size::Out(_) | Size::Pitched3D { .. } => 0,
            };
            if !lock(&session.memory).fits(bytes) {
                let status = status_named(desc, &["cudaErrorMemoryAllocation", "CUDA_ERROR_OUT_OF_MEMORY"])
                    .unwrap_or(desc.codes.invalid_value);
                return fail(
                    status,
                    format!(
                        "{}: {bytes} bytes more would exceed this session's memory quota ({} MiB, the server's \
                         --memory-quota-mb)",
                        desc.name,
                        lock(&session.memory).quota.unwrap_or(0) >> 20
                    ),
                );
            }
        }
        _ => {}
    }
    if let Effect::Alloc { out, origin: Origin::Allocated, .. } = effect
        && lens.get(out) == Some(&NULL_LEN)
    {
        return reply_status(session, &header, desc, desc.codes.invalid_value, None);
    }
    // Whether `[addr, addr + len)` is memory of this session (NULL is left to the library).
    let device_ok = |addr: u64, len: u64| device_ok(session, addr, len);

    // Handles the library dereferences unchecked are never NULL (`required` in the specs).
    if let Some(&i) = checks.required.iter().find(|&&i| args.get(usize::from(i)) == Some(&0)) {
        return fail(desc.codes.invalid_value, format!("{}: parameter {i} may not be NULL", desc.name));
    }
    // A host function travels as the client's number for it, counted from 1: 0 names none
    // (the client refuses a NULL function itself; the library would call whatever it got).
    if desc.form == Some(Form::Host) && args.get(1) == Some(&0) {
        return fail(desc.codes.invalid_value, format!("{}: no host function (NULL)", desc.name));
    }
    // Parameters that select a union's member may hold only the values the spec allows.
    for &(i, allowed) in &checks.params {
        if let Some(value) = args.get(usize::from(i)).filter(|v| !allowed.contains(v)) {
            return fail(desc.codes.invalid_value, format!("{}: parameter {i} may not be {value}", desc.name));
        }
    }

    // Parse the arguments (lengths, bulk, handles, device addresses), then lay out the host
    // memory of the call.
    let decoded = {
        let mut tables = SessionTables { session, args: &args, checks };
        match codec::decode(desc, &args, &lens, &frame.bulk, &mut tables) {
            Ok(decoded) => decoded,
            Err(e) => return refuse(session, &header, desc, e),
        }
    };
    let mut raw: PerCall<u64> = smallvec::smallvec![0u64; n];
    let mut buffers: PerCall<Option<Buffer>> = (0..n).map(|_| None).collect();
    let mut translations: PerCall<Option<Translation>> = (0..n).map(|_| None).collect();
    let mut destroyed: Vec<(HandleKind, u64, u64)> = Vec::new();
    let mut held = HeldCall::new();
    // Outputs the caller passed as NULL: the library writes into a buffer no one reads.
    let mut nulled: PerCall<bool> = smallvec::smallvec![false; n];
    for (i, (wire, arg)) in desc.params.iter().zip(decoded).enumerate() {
        let mut keep = |raw: &mut u64, mut b: Buffer| {
            *raw = b.addr();
            buffers[i] = Some(b);
        };
        match arg {
            Arg::Val(v) | Arg::Device(v) | Arg::ScalarDevice(v) => raw[i] = v,
            Arg::Scratch(bytes) => keep(&mut raw[i], Buffer::zeroed(bytes)),
            Arg::Handle { kind, value, real, destroy } => {
                if destroy {
                    destroyed.push((kind, value, real));
                }
                if matches!(wire, Wire::RecordHandle { .. }) {
                    held.taken.push(real);
                }
                raw[i] = real;
            }
            Arg::NewRecord { kind, bytes, .. } => {
                // The library fills the worker's record; the id goes back in 8 bytes.
                let record = crate::held::Records::fresh(record_bytes(kind, bytes));
                raw[i] = record.as_ptr() as u64;
                held.keep_fresh(i, record);
                buffers[i] = Some(Buffer::zeroed(8));
            }
            Arg::Record(bytes) | Arg::Str(Some(bytes)) => keep(&mut raw[i], Buffer::from(bytes)),
            Arg::Str(None) | Arg::Handles(None) | Arg::Buf(BufArg::Absent) => {}
            Arg::NewHandle { .. } => keep(&mut raw[i], Buffer::zeroed(8)),
            Arg::Scalar { bytes, input, .. } => {
                // As wide as the parameter may be, whatever the client sent (a shorter
                // value is padded with zeros): the library reads what its type needs.
                let mut b = Buffer::zeroed(bytes);
                if let Some(value) = input {
                    let n = value.len().min(bytes);
                    b.bytes_mut()[..n].copy_from_slice(&value[..n]);
                }
                keep(&mut raw[i], b);
            }
            Arg::Handles(Some(mapped)) => keep(&mut raw[i], Buffer::from(&mapped)),
            Arg::Buf(BufArg::Discarded { bytes }) => {
                let Wire::Buf { elem, record, .. } = *wire else { continue };
                let bytes = match (translation(session, desc, record), bytes) {
                    (Some(t), _) => u64::from(t.server.size),
                    (None, Some(b)) => b,
                    (None, None) => return invalid(format!("argument {i}: {elem} bytes is too large")),
                };
                keep(&mut raw[i], Buffer::zeroed(bytes as usize));
                nulled[i] = true;
            }
            Arg::Buf(BufArg::Content { len, hash }) => {
                // Bytes the client sent before, which the session pinned at its handshake.
                let Some(content) = &session.content else {
                    return Err(Fatal(format!("{}: argument {i} sent by content to a session without", desc.name)));
                };
                let Some(bytes) = content.pinned.read(&hash, len as usize) else {
                    return invalid(format!(
                        "argument {i}: sent by content the server does not keep for this session ({len} bytes)"
                    ));
                };
                keep(&mut raw[i], Buffer::from(&bytes));
            }
            Arg::Buf(BufArg::Compressed { len, frame }) => {
                // Never more than the buffer's declared length is made, whatever the frame says.
                let bytes = match chidori_protocol::pack::expand(frame, len as usize) {
                    Ok(b) => b,
                    Err(e) => return invalid(format!("argument {i}: {e}")),
                };
                if len >= CONTENT_MIN
                    && let Some(content) = &session.content
                {
                    keep_content(content, &bytes);
                }
                keep(&mut raw[i], Buffer::from(&bytes));
            }
            Arg::Buf(BufArg::Present { len, input }) => {
                let Wire::Buf { dir, elem, record, .. } = *wire else { continue };
                let t = translation(session, desc, record);
                // Handles inside input records are checked and mapped, restricted fields
                // checked, in the client's layout, before any translation.
                let record_checks = checks.records.get(i).copied().flatten().filter(|_| record.is_some());
                if let (Some(checks), Some(input)) = (record_checks, input) {
                    let mut bytes = input.to_vec();
                    let mut handles = lock(&session.handles);
                    let checked = checks.apply(&mut bytes, |kind, value| handles.resolve(kind, value));
                    drop(handles);
                    match checked {
                        Ok(()) => {}
                        Err(RecordRefused::Handle(why)) => {
                            return fail(desc.codes.invalid_handle, format!("{}: parameter {i}: {why}", desc.name));
                        }
                        Err(RecordRefused::Value(why)) => {
                            return fail(desc.codes.invalid_value, format!("{}: parameter {i}: {why}", desc.name));
                        }
                    }
                    let b = match &t {
                        Some(t) => {
                            let n = records_in(bytes.len(), t.client);
                            let mut b = Buffer::zeroed(n * t.server.size as usize);
                            translate_all(t.client, t.server, &bytes, b.bytes_mut());
                            b
                        }
                        None => Buffer::from(&bytes),
                    };
                    keep(&mut raw[i], b);
                    translations[i] = t;
                    continue;
                }
                if let (None, Dir::In, Some(s)) = (&t, dir, input) {
                    // Kept for a later run that sends it again (within the session's budget).
                    if len >= CONTENT_MIN
                        && let Some(content) = &session.content
                    {
                        keep_content(content, s);
                    }
                    // Read in place from the frame (copy payloads are most of the bytes).
                    if elem == 1 || (s.as_ptr() as usize).is_multiple_of(8) {
                        raw[i] = s.as_ptr() as u64;
                        continue;
                    }
                    keep(&mut raw[i], Buffer::from(s));
                    continue;
                }
                let b = match (&t, input) {
                    (Some(t), input) => {
                        let n = records_in(len as usize, t.client);
                        let mut b = Buffer::zeroed(n * t.server.size as usize);
                        if let Some(input) = input {
                            translate_all(t.client, t.server, input, b.bytes_mut());
                        }
                        b
                    }
                    // A device-to-host copy's destination, which the copy writes whole.
                    // A lane's read-back chunk: a pooled (pinned) buffer the copy writes whole.
                    (None, None) if dir == Dir::Out && desc.form == Some(Form::D2h) && REPLY_LANE.get().is_some() => {
                        Buffer::output(len as usize, &*session.backend)
                    }
                    (None, None) => Buffer::zeroed(len as usize),
                    (None, Some(input)) => Buffer::from(input),
                };
                keep(&mut raw[i], b);
                translations[i] = t;
            }
        }
    }

    // Device memory named inside input records (copies, memsets, resources): the session's.
    for &(i, record, _, _) in checks.memory_records.iter().filter(|r| r.2) {
        if lens[i] == NULL_LEN {
            // The copy, memset or resource itself: required by every API that takes one.
            return quiet(format!("argument {i}: NULL for the {record}"));
        }
        let Some(b) = buffers[i].as_mut() else { continue };
        let Some(version) = session.backend.layout_version(desc.library) else { continue };
        // Every record of an array (each in the server's layout); memory the session has
        // elsewhere (a stand-in) is named there.
        if let Err(why) = name_where_the_session_has(session, record, &version, b.bytes_mut()) {
            return invalid(format!("argument {i}: {why}"));
        }
    }

    // A CUDA IPC handle opens only what a session of this server exported.
    if let Effect::Open { handle, kind, .. } = effect {
        let bytes = buffers.get(handle).and_then(Option::as_ref).map(|b| b.bytes()).unwrap_or(&[]);
        if !session.ipc.published(kind, bytes) {
            return invalid(format!(
                "the {} handle was not exported by a running session of this server",
                if kind == crate::ipc::Kind::Memory { "memory" } else { "event" }
            ));
        }
    }

    // A global's size the program did not ask for (`cuModuleGetGlobal(&dptr, NULL, ...)`):
    // the library writes it here, so the session knows how far the global reaches.
    let mut unasked_size: Option<Buffer> = None;
    if let Effect::Alloc { out, size: Size::Out(o), origin: Origin::Global } = effect
        && raw.get(out).is_some_and(|&p| p != 0)
        && raw.get(o) == Some(&0)
    {
        // (A Vec's heap words: the address stays as the buffer moves into the Option.)
        let mut b = Buffer::zeroed(8);
        raw[o] = b.addr();
        unasked_size = Some(b);
    }
    // A shareable descriptor's token: the descriptor, fetched from the session that exported
    // it (kept open until the call returns; the library duplicates what it keeps).
    let mut _imported = None;
    if let Effect::ImportFd { token, .. } = effect {
        match session.ipc.fetch_fd(args.get(token).copied().unwrap_or(0)) {
            Ok(fd) => {
                raw[token] = std::os::fd::AsRawFd::as_raw_fd(&fd) as u64;
                _imported = Some(fd);
            }
            Err(why) => return invalid(why),
        }
    }

    // Arrays whose length only their data gives: as long as the library will read.
    if checks.told {
        // SAFETY: each told array's decoded argument: `lens[i]` bytes at `raw[i]`, in the
        // frame or in a buffer kept for the call.
        if let Err(why) = unsafe { crate::told::check(&*session.backend, desc, &raw, &lens) } {
            return invalid(why);
        }
    }

    // Host arrays of device addresses (the specs' `addresses`: batched prefetches and
    // discards, cuFFT's work areas).
    for &(addrs, sizes) in &checks.address_arrays {
        let (addrs, sizes) = (usize::from(addrs), sizes.map(usize::from));
        let words = |p: usize| -> Vec<u64> {
            let (ptr, len) = (raw.get(p).copied().unwrap_or(0), lens.get(p).copied().unwrap_or(0));
            if ptr == 0 || len == NULL_LEN {
                return Vec::new();
            }
            // SAFETY: the decoded argument: `len` bytes at `ptr`, in the frame or in a buffer
            // kept for the call.
            let bytes = unsafe { std::slice::from_raw_parts(ptr as *const u8, len as usize) };
            bytes.chunks_exact(8).map(|w| u64::from_le_bytes(w.try_into().unwrap_or([0; 8]))).collect()
        };
        let addrs = words(addrs);
        let sizes = sizes.map_or_else(|| vec![1; addrs.len()], words);
        if let Some((addr, len)) = addrs.iter().zip(&sizes).find(|&(&addr, &len)| addr == 0 || !device_ok(addr, len)) {
            return invalid(format!("{addr:#x} ({len} bytes) in the array is not device memory of this session"));
        }
    }

    // NVML's versioned records: the version the caller set names the struct the library
    // writes (NVML_STRUCT_VERSION: its size in the low 24 bits). One naming a larger struct
    // than the record sent would have the library write past the worker's buffer.
    if desc.library == "nvml" {
        for (i, wire) in desc.params.iter().enumerate() {
            let Wire::Buf { dir: Dir::InOut, record: Some(record), .. } = *wire else { continue };
            let Some(b) = buffers[i].as_ref() else { continue };
            let versioned = desc
                .versions
                .last()
                .and_then(|v| structs::get(v, record))
                .is_some_and(|m| m.fields.iter().any(|f| f.name == "version" && f.offset == 0 && f.size == 4));
            let Some(word) = b.bytes().first_chunk::<4>().filter(|_| versioned) else { continue };
            let size = u32::from_le_bytes(*word) & 0x00ff_ffff;
            if size as usize > b.bytes().len() {
                return invalid(format!(
                    "argument {i}: its version names a {size}-byte {record}, larger than the {} bytes sent",
                    b.bytes().len()
                ));
            }
        }
    }

    // cuDNN variant-pack data pointers with host scalars inline (the `hostvalues` form):
    // the worker keeps the scalars beside the pack and passes their addresses.
    let mut kept = None;
    // Outlives the call: raw[4] points into it.
    let data_pointers: Vec<u64>;
    if desc.form == Some(Form::HostValues) && lens[4] != NULL_LEN {
        // SAFETY: raw[4] addresses the buffer laid out above, lens[4] bytes long.
        let records = unsafe { std::slice::from_raw_parts(raw[4] as *const u8, lens[4] as usize) };
        let Some((pointers, values)) = host_value_pointers(records) else {
            return Err(Fatal(format!("{}: {} bytes of host value records", desc.name, lens[4])));
        };
        // Device data pointers must be the session's; host scalars point at the kept copies.
        let kept_range = values.as_ptr() as u64..values.as_ptr().wrapping_add(values.len()) as u64;
        if let Some(bad) = pointers.iter().find(|&&p| !kept_range.contains(&p) && !device_ok(p, 1)) {
            return invalid(format!("data pointer {bad:#x} is not device memory of this session"));
        }
        data_pointers = pointers;
        raw[4] = data_pointers.as_ptr() as u64;
        kept = Some(values);
    }
    // A process list: the caller's bytes of the array, which the entries not kept get back.
    let process_list = (desc.form == Some(Form::Processes)).then(|| crate::processes::list(desc)).flatten();
    let sent_entries = process_list.and_then(|l| buffers[l.array].as_ref().map(|b| b.bytes().to_vec()));
    // A user object reaches the driver only while the program holds a reference to it.
    let user_object = crate::user_objects::involved(desc.name);
    if let Err(why) = if user_object { lock(&session.user_objects).check(desc.name, &raw) } else { Ok(()) } {
        return fail(desc.codes.invalid_handle, why);
    }
    // A copy with a side in the worker's own buffer (the program's bytes as they came, or a
    // buffer for the reply) cannot be captured: the graph would keep the buffer's address
    // past this call. The client sends such copies as copies of its memory's mirror.
    // (The flag first: most sessions never capture, and `host_copy` reads the name.)
    if session.captures.load(Ordering::Relaxed) && desc.host_copy() && capturing(session, desc, &raw) {
        let status =
            status_named(desc, &["cudaErrorStreamCaptureUnsupported", "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED"])
                .unwrap_or(desc.codes.invalid_value);
        return fail(status, format!("{}: a copy of the client's bytes on a capturing stream", desc.name));
    }
    if checks.capture_begin {
        session.captures.store(true, Ordering::Relaxed);
    }
    let started = session.timing.as_ref().map(|_| std::time::Instant::now());
    let call = crate::fatal::running(desc.name);
    let ret = if desc.form == Some(Form::Host) {
        host_function(session, desc, &raw)
    } else {
        // SAFETY: raw holds values, device addresses and addresses of `buffers`, laid out
        // by the descriptor the generated trampoline was made from.
        unsafe { crate::adapt::invoke(&*session.backend, desc, &raw) }
    };
    drop(call);
    // A copy on a stream from a lane's pinned staging buffer reads it when the GPU gets to
    // it, and one into a pinned output buffer writes it then; the buffer is reused (or its
    // bytes sent) once the call returns. With pageable memory the copy would have been done
    // by then (its stream synchronized first): wait for the stream, which keeps that.
    // Only a lane's frames use the staging pools (no lock on other calls' way), whatever
    // their form (the runtime's `h2d`, the driver's `call`: static runtimes copy so).
    let pinned = REPLY_LANE.get().is_some()
        && (session.lanes.as_ref().is_some_and(|lanes| !frame.bulk.is_empty() && lanes.is_pinned(&frame.bulk))
            || buffers.iter().flatten().any(Buffer::is_pinned));
    if pinned
        && let Some(stream) = stream_of(desc, &raw)
        && let Err(status) = session.backend.synchronize_stream(stream)
    {
        // The copy's own status is what the program gets; a failed stream reports again at
        // its next synchronization.
        tracing::debug!("{}: waiting for the stream after a staged copy: status {status}", desc.name);
    }
    if let (Some(timing), Some(started)) = (&session.timing, started) {
        let mut t = lock(timing);
        let e = t.entry(desc.name).or_default();
        e.0 += 1;
        e.1 += started.elapsed();
    }
    let ret = match ret {
        Ok(r) => r,
        Err(message) => {
            tracing::warn!("{message}");
            return fail(desc.codes.not_supported, message);
        }
    };
    let ok = desc.ret != Ret::Status || ret == desc.codes.success as u64;
    if !ok {
        buffers.iter_mut().flatten().for_each(Buffer::settle_failed);
    }
    // A table of the library's own memory handed back by pointer goes back as its bytes
    // (`crate::tables`), never as the worker's pointer.
    if ok
        && desc.form == Some(Form::Table)
        && let Some(b) = buffers.first_mut().and_then(|b| b.as_mut())
        && let Err(why) = crate::tables::fill(b.bytes_mut())
    {
        return fail(desc.codes.not_supported, format!("{}: {why}", desc.name));
    }
    // Of the GPU's processes, the session's own (`crate::processes`).
    if desc.form == Some(Form::Processes) {
        let Some(list) = process_list else {
            return fail(desc.codes.not_supported, format!("{}: no process list in its descriptor", desc.name));
        };
        let (array, count) = two_mut(&mut buffers, list.array, list.count);
        if let (Some(sent), Some(entries)) = (sent_entries, array.and_then(|b| b.as_mut())) {
            match count.and_then(|b| b.as_mut()) {
                Some(count) if ok => crate::processes::keep_own(
                    entries.bytes_mut(),
                    &sent,
                    count.bytes_mut(),
                    list.entry,
                    std::process::id(),
                    session.program_pid,
                ),
                // The count the library asks for goes back; the array as the caller sent it.
                _ => crate::processes::forget_all(entries.bytes_mut(), &sent, &mut []),
            }
        }
    }
    // The program's references to user objects; its last one takes the handle away.
    if ok && user_object {
        let created = buffers.first().and_then(|b| b.as_ref()).and_then(|b| b.bytes().first_chunk::<8>().copied());
        if let Some(gone) = lock(&session.user_objects).after(desc.name, &raw, created.map(u64::from_le_bytes)) {
            let kind = chidori_cuda::handles::kind::CUuserObject_st;
            let mut handles = lock(&session.handles);
            if let Some(value) = handles.known(kind, gone) {
                handles.remove(kind, value);
            }
        }
    }
    // A new handle reaches the client as its name: the client's own, or an id given now;
    // never the library's pointer. After a failure only a handle the client knows (the node
    // an instantiation failed at) goes back.
    {
        let mut handles = lock(&session.handles);
        if !held.is_empty() {
            held.finish(session, desc, ok, &mut handles, &args, &mut buffers);
        }
        for (i, wire) in desc.params.iter().enumerate() {
            if let (Wire::OutHandle { kind, named }, Some(b)) = (wire, buffers[i].as_mut()) {
                let Some(word) = b.bytes_mut().first_chunk_mut::<8>() else { continue };
                let real = u64::from_le_bytes(*word);
                let value = match (ok, named) {
                    (false, _) => handles.known(*kind, real).unwrap_or(0),
                    (true, true) => {
                        handles.insert_named(*kind, args[i], real);
                        args[i]
                    }
                    (true, false) if checks.retains => handles.insert_reference(*kind, real),
                    (true, false) => handles.insert(*kind, real),
                };
                *word = value.to_le_bytes();
            }
        }
    }
    if capture_end {
        let graph = buffers.get(1).and_then(|b| b.as_ref()).and_then(|b| b.bytes().first_chunk::<8>().copied());
        let mut ended = lock(&session.ended);
        match graph.map(u64::from_le_bytes) {
            Some(graph) if ok && graph != 0 => {
                if ended.len() >= ENDED_MAX {
                    ended.clear();
                }
                ended.insert((header.thread, ended_stream), graph);
            }
            _ => {
                ended.remove(&(header.thread, ended_stream));
            }
        }
    }
    if ok {
        match effect {
            Effect::Alloc { out, size, origin } => {
                let word = |i: usize| {
                    buffers.get(i).and_then(|b| b.as_ref()).and_then(|b| b.bytes().first_chunk::<8>().copied())
                };
                let base = word(out).map(u64::from_le_bytes).unwrap_or(0);
                let bytes = match size {
                    Size::Param(p) => args.get(p).copied().unwrap_or(0),
                    Size::Pitch { pitch, height, .. } => word(pitch)
                        .map(u64::from_le_bytes)
                        .unwrap_or(0)
                        .saturating_mul(args.get(height).copied().unwrap_or(0)),
                    Size::Out(o) => word(o)
                        .or_else(|| unasked_size.as_ref().and_then(|b| b.bytes().first_chunk::<8>().copied()))
                        .map(u64::from_le_bytes)
                        .unwrap_or(0),
                    Size::Pitched3D { extent } => {
                        let at = |b: Option<&Buffer>, offset: usize| {
                            b.and_then(|b| b.bytes().get(offset..offset + 8))
                                .and_then(|w| w.try_into().ok())
                                .map_or(0, u64::from_le_bytes)
                        };
                        let (out_record, extent) = (buffers[out].as_ref(), buffers[extent].as_ref());
                        // pitch × height × depth (the extent: width, height, depth).
                        at(out_record, 8).saturating_mul(at(extent, 8)).saturating_mul(at(extent, 16).max(1))
                    }
                };
                // A stream-ordered allocation on a capturing stream is the graph's: its
                // address is allocated at each launch. (`raw`: the stream as the library got
                // it; `args` hold the client's names for handles.)
                let origin =
                    if origin == Origin::Allocated && capturing(session, desc, &raw) { Origin::Graph } else { origin };
                lock(&session.memory).insert(base, bytes, origin);
            }
            Effect::Free { ptr } => lock(&session.memory).remove(args.get(ptr).copied().unwrap_or(0)),
            Effect::Close { ptr } => lock(&session.memory).closed(args.get(ptr).copied().unwrap_or(0)),
            Effect::Export { out, kind } => {
                let handle = buffers.get(out).and_then(Option::as_ref).map(|b| b.bytes()).unwrap_or(&[]);
                if let Err(why) = session.ipc.publish(kind, handle) {
                    tracing::warn!("{}: {why}; other sessions cannot open it", desc.name);
                }
            }
            Effect::ExportFd { out, .. } => {
                if let Some(b) = buffers.get_mut(out).and_then(Option::as_mut) {
                    let bytes = b.bytes_mut();
                    let fd = bytes.first_chunk::<4>().copied().map_or(-1, i32::from_le_bytes);
                    let token = if fd >= 0 {
                        // SAFETY: the library just made this descriptor for the call; nothing
                        // else in the worker knows it.
                        let fd = unsafe { std::os::fd::FromRawFd::from_raw_fd(fd) };
                        session.ipc.publish_fd(fd).unwrap_or_else(|why| {
                            tracing::warn!("{}: {why}; other sessions cannot import it", desc.name);
                            0
                        })
                    } else {
                        0
                    };
                    if let Some(word) = bytes.first_chunk_mut::<8>() {
                        *word = token.to_le_bytes();
                    }
                }
            }
            Effect::Open { out, kind: crate::ipc::Kind::Memory, .. } | Effect::ImportPointer { out } => {
                let base = buffers.get(out).and_then(Option::as_ref).and_then(|b| b.bytes().first_chunk::<8>());
                let base = base.copied().map(u64::from_le_bytes).unwrap_or(0);
                // Open already: the size is known (asked of the driver at the first open).
                let known = lock(&session.memory).origin_at(base) == Some(Origin::Opened);
                match if known { Some(0) } else { opened_size(session, base) } {
                    Some(len) => lock(&session.memory).opened(base, len),
                    None => tracing::warn!("{}: the size of the memory opened at {base:#x} is unknown", desc.name),
                }
            }
            _ => {}
        }
        if !checks.memory_records.is_empty() {
            untranslate_records(session, desc, checks, &mut buffers);
        }
        if let Some(values) = kept {
            lock(&session.owned).insert(raw[0], values);
        }
        for (kind, value, real) in destroyed {
            if !lock(&session.handles).release(kind, value) {
                continue;
            }
            lock(&session.owned).remove(&real);
            lock(&session.held).release(real);
        }
    }
    if !desc.waits() {
        if !ok {
            // The client learns of it at its next call that waits, far from this one: the
            // operator's log names the call and what the client passed (its own values),
            // at warn the first time per function, then at debug.
            let sent = &args[..n.min(args.len())];
            if lock(&session.warned).insert(desc.name) {
                tracing::warn!(
                    "{} failed with status {} (the client did not wait for it); arguments as the client sent them: {sent:x?}",
                    desc.name,
                    ret as i64
                );
            } else {
                tracing::debug!("{} failed with status {}; arguments {sent:x?}", desc.name, ret as i64);
            }
            return reply_error(
                session,
                &header,
                desc,
                ret as i64,
                format!("{} failed with status {}", desc.name, ret as i64),
            );
        }
        return Ok(());
    }
    // Outputs, in parameter order.
    let mut out_lens = vec![0u64; n];
    // Records in the client's layout where it differs; other outputs go out as they are.
    let mut translated: Vec<Option<Vec<u8>>> = (0..n).map(|_| None).collect();
    let mut is_out: PerCall<bool> = smallvec::smallvec![false; n];
    for (i, wire) in desc.params.iter().enumerate() {
        is_out[i] = !nulled[i]
            && matches!(
                wire,
                Wire::OutHandle { named: false, .. }
                    | Wire::NewRecordHandle { named: false, .. }
                    | Wire::Buf { dir: Dir::Out | Dir::InOut, .. }
                    | Wire::Scalar { dir: Dir::Out | Dir::InOut, .. }
            );
        let Some(b) = buffers[i].as_ref().filter(|_| is_out[i]) else { continue };
        let handle_checks = match *wire {
            Wire::Buf { record: Some(_), .. } => {
                checks.records.get(i).copied().flatten().filter(|c| !c.handles.is_empty())
            }
            _ => None,
        };
        let client = match &translations[i] {
            Some(t) => {
                let mut client = vec![0u8; records_in(b.bytes().len(), t.server) * t.client.size as usize];
                translate_all(t.server, t.client, b.bytes(), &mut client);
                Some(client)
            }
            None => handle_checks.map(|_| b.bytes().to_vec()),
        };
        out_lens[i] = match client {
            Some(mut client) => {
                // Handles in a record that comes back reach the client as its names.
                if let Some(checks) = handle_checks {
                    let mut handles = lock(&session.handles);
                    checks.map_handles(&mut client, |kind, real| handles.insert(kind, real));
                }
                let len = client.len() as u64;
                translated[i] = Some(client);
                len
            }
            None => b.bytes().len() as u64,
        };
        // A large output travels compressed where the call asked and that pays.
        if header.flags & frame::OUTPUTS_COMPRESSED != 0 {
            let bytes = translated[i].as_deref().unwrap_or(b.bytes());
            if let Some(packed) = chidori_protocol::pack::compress(bytes) {
                out_lens[i] = packed.len() as u64 | COMPRESSED_FLAG;
                translated[i] = Some(packed);
            }
        }
    }
    let reply = Reply { ret, lens: out_lens, error: None };
    send_output(session, header.thread)?;
    let h = Header::new(Kind::Reply, header.call, header.thread, header.seq);
    if let (Some(lane), Some(lanes)) = (REPLY_LANE.get(), &session.lanes) {
        // The outputs move to the lane's writer as they are (a large copy's bytes are not
        // copied again): the executor goes on with the next call while they are written.
        let parts: Vec<crate::lanes::Part> = (0..n)
            .filter(|&i| is_out[i])
            .filter_map(|i| match translated[i].take() {
                Some(bytes) => Some(Box::new(bytes) as crate::lanes::Part),
                None => buffers[i].take().map(|b| Box::new(b) as crate::lanes::Part),
            })
            .collect();
        return lanes
            .send_owned(lane, h, &messages::encode(&reply), parts)
            .map_err(|e| Fatal(format!("writing a reply: {e}")));
    }
    let parts: Vec<&[u8]> = (0..n)
        .filter(|&i| is_out[i])
        .filter_map(|i| translated[i].as_deref().or_else(|| buffers[i].as_ref().map(|b| b.bytes())))
        .collect();
    send_reply(session, h, &messages::encode(&reply), &parts).map_err(|e| Fatal(format!("writing a reply: {e}")))
}

/// Two different elements of `v`, mutably (None for both where they are the same or one is
/// out of range).
fn two_mut<T>(v: &mut [T], a: usize, b: usize) -> (Option<&mut T>, Option<&mut T>) {
    if a == b || a >= v.len() || b >= v.len() {
        return (None, None);
    }
    if a < b {
        let (left, right) = v.split_at_mut(b);
        (left.get_mut(a), right.first_mut())
    } else {
        let (left, right) = v.split_at_mut(a);
        (right.first_mut(), left.get_mut(b))
    }
}

/// What the GPU printed since the last reply goes first: the program prints it before the
/// call that waited returns (a synchronization is where the driver writes it).
fn send_output(session: &Session, thread: u32) -> Result<(), Fatal> {
    let bytes = crate::output::take();
    if bytes.is_empty() {
        return Ok(());
    }
    let h = Header::new(Kind::Output, 0, thread, 0);
    session.writer.send(h, &[], &[&bytes]).map_err(|e| Fatal(format!("writing the GPU's output: {e}")))
}

/// The value of the first status named `names` in `desc`'s library, from the headers of
/// the newest CUDA version the variant serves.
fn status_named(desc: &CallDesc, names: &[&str]) -> Option<i64> {
    let version = desc.versions.last()?;
    let table = chidori_cuda::status::table(version, desc.library)?;
    names.iter().find_map(|name| table.iter().find(|s| s.name.trim_end_matches('\0') == *name).map(|s| s.value))
}

/// A call that could not run: a Reply with the status (sync) or an AsyncError (async); the
/// message is logged once by the client.
fn reply_error(session: &Session, header: &Header, desc: &CallDesc, status: i64, message: String) -> Result<(), Fatal> {
    reply_status(session, header, desc, status, Some(message))
}

fn reply_status(
    session: &Session,
    header: &Header,
    desc: &CallDesc,
    status: i64,
    message: Option<String>,
) -> Result<(), Fatal> {
    let result = if desc.waits() {
        let reply = Reply { ret: status as u64, lens: vec![0; desc.params.len()], error: message };
        send_reply(
            session,
            Header::new(Kind::Reply, header.call, header.thread, header.seq),
            &messages::encode(&reply),
            &[],
        )
    } else {
        let err = AsyncError { status, message };
        send_reply(
            session,
            Header::new(Kind::AsyncError, header.call, header.thread, header.seq),
            &messages::encode(&err),
            &[],
        )
    };
    result.map_err(|e| Fatal(format!("writing a reply: {e}")))
}

/// cudaLaunchHostFunc and friends: the client's function stays on the client; the
/// server's stream runs a host function that asks the client to run it and waits.
fn host_function(session: &Arc<Session>, desc: &'static CallDesc, raw: &[u64]) -> Result<u64, String> {
    // A user object's destructor (object_out, the client's number for it, -, refcount,
    // flags): run when the driver releases the object.
    if matches!(desc.name, "cudaUserObjectCreate" | "cuUserObjectCreate") {
        let word = |i: usize| raw.get(i).copied().unwrap_or(0);
        let (refcount, flags) = (word(3) as u32, word(4) as u32);
        return session.backend.user_object(desc, word(0), refcount, flags, host_closure(session, word(1)));
    }
    let stream = raw[0];
    let client_id = raw[1];
    session.backend.host_fn(desc, stream, host_closure(session, client_id))
}

/// What the server runs for the client's host function `client_id`: ask the client to run
/// it, and wait until it has.
fn host_closure(session: &Arc<Session>, client_id: u64) -> HostFn {
    // A weak reference: a host node of a graph outlives nothing it should keep alive.
    let owner = Arc::downgrade(session);
    Box::new(move |status: i64, keep: bool| {
        let Some(owner) = owner.upgrade() else { return };
        // One token per run: a captured function runs once per graph replay.
        let token = owner.next_callback.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::channel();
        owner.callbacks.lock().unwrap_or_else(|p| p.into_inner()).insert(token, tx);
        // What the GPU wrote into the client's mirrored memory before this point of the
        // stream travels with the request: the function may read it (a host node after a
        // copy node into the program's memory).
        // More than one frame holds goes ahead in frames that only carry changes.
        let mut sent = true;
        lock(&owner.mirrors).pull_all(&*owner.backend, |changes, last| {
            let msg = HostCallback { id: client_id, token, status, keep, changes, land_only: !last };
            let h = Header::new(Kind::HostCallback, 0, 0, 0);
            sent &= owner.writer.send(h, &messages::encode(&msg), &[]).is_ok();
        });
        // A closed session's client runs nothing more (`finish` drops the wake-ups it
        // finds; this one was registered before `closing` was set, or is not waited on).
        if sent && !owner.writer.is_detached() && !owner.closing.load(Ordering::SeqCst) {
            drop(owner);
            // Until the client ran the function; a lost client ends the process anyway.
            let _ = rx.recv();
        }
    })
}

/// A session without a connection (replies are counted, not sent), for fuzz targets and
/// property tests: [`Harness::run`] runs one frame exactly as the session's executor does,
/// every argument check included.
pub struct Harness {
    session: Arc<Session>,
}

impl Harness {
    pub fn new(backend: Arc<dyn Backend>, memory_quota: Option<u64>) -> Harness {
        Self::sharing(backend, memory_quota, None)
    }

    /// A harness whose session publishes and opens CUDA IPC handles in `ipc_dir`.
    pub fn sharing(
        backend: Arc<dyn Backend>,
        memory_quota: Option<u64>,
        ipc_dir: Option<std::path::PathBuf>,
    ) -> Harness {
        let handles = Handles::with_finder(module_functions(&backend));
        let session = Arc::new(Session {
            landing: handles.landing(),
            handles: Mutex::new(handles),
            pulls: Mutex::new(HashMap::new()),
            backend,
            ended: Mutex::new(HashMap::new()),
            capture_ids: Mutex::new(HashMap::new()),
            writer: Arc::new(Writer::new(Sink::Discard(0, Vec::new()))),
            callbacks: Mutex::new(HashMap::new()),
            next_callback: AtomicU64::new(1),
            module_cache: None,
            modules: Mutex::new(HashMap::new()),
            libraries: Mutex::new(std::collections::HashSet::new()),
            layouts: Mutex::new(HashMap::new()),
            owned: Mutex::new(HashMap::new()),
            held: Mutex::new(crate::held::Records::default()),
            user_objects: Mutex::new(crate::user_objects::References::default()),
            timing: None,
            mirrors: Mutex::new(Mirrors::default()),
            memory: Mutex::new(Memory::new(memory_quota)),
            ipc: crate::ipc::Exports::new(ipc_dir),
            windows: Mutex::default(),
            content: None,
            warned: Mutex::new(std::collections::HashSet::new()),
            captures: AtomicBool::new(false),
            lanes: None,
            program_pid: 0,
            closing: AtomicBool::new(false),
            loader: Mutex::new(None),
            running: Mutex::new(None),
        });
        Harness { session }
    }

    /// Run one Call, Launch or Service frame. Err: the frame breaks the protocol and would
    /// end the session (with this reason logged), which is a refusal, not a crash.
    pub fn run(&self, frame: &Frame) -> Result<(), String> {
        let result = match frame.header.kind {
            Kind::Call => execute(&self.session, frame),
            Kind::Launch => launch(&self.session, frame),
            Kind::Service => service(&self.session, frame),
            other => Err(Fatal(format!("unexpected {other:?} frame from the client"))),
        };
        result.map_err(|Fatal(reason)| reason)
    }

    /// Run a frame given as bytes (the fuzz targets' input).
    pub fn run_bytes(&self, bytes: &[u8]) -> Result<(), String> {
        let (frame, _) = Frame::decode(bytes).map_err(|e| e.to_string())?;
        self.run(&frame)
    }

    /// Bytes of replies written so far.
    pub fn replied(&self) -> u64 {
        self.session.writer.discarded().0
    }

    /// The last frame the session wrote (a Reply, an AsyncError, ...).
    pub fn last_reply(&self) -> Option<Frame> {
        Frame::decode(&self.session.writer.discarded().1).ok().map(|(f, _)| f)
    }

    /// A live handle of `kind` of this session (the `n`-th, modulo their number).
    pub fn live_handle(&self, kind: HandleKind, n: u64) -> Option<u64> {
        lock(&self.session.handles).pick(kind, n)
    }

    /// An address inside the session's memory (chosen by `n`).
    pub fn live_address(&self, n: u64) -> Option<u64> {
        lock(&self.session.memory).pick(n)
    }

    /// The session's name for the library's handle `real` of `kind`, as if a call had
    /// returned it (tests of libraries a backend does not have).
    pub fn adopt_handle(&self, kind: HandleKind, real: u64) -> u64 {
        lock(&self.session.handles).insert(kind, real)
    }
}

/// Open a session on the connection inherited as file descriptor `fd`.
pub fn run_on_fd(
    fd: i32,
    security: Option<Security>,
    make_backend: MakeBackend,
    options: Options,
    authenticated: Box<dyn FnOnce()>,
) -> Result<()> {
    use std::os::fd::FromRawFd;
    // SAFETY: the supervisor passes an open connected socket at `fd` and nothing else owns it.
    let stream = unsafe { TcpStream::from_raw_fd(fd) };
    run(stream, security, make_backend, options, authenticated).context("session")
}

/// Add a large input to the store, within the session's budget (the client counts the same).
fn keep_content(content: &Content, bytes: &[u8]) {
    let mut budget = lock(&content.budget);
    if *budget >= bytes.len() as u64 {
        *budget -= bytes.len() as u64;
        drop(budget);
        content.keeper.keep(bytes.to_vec());
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The wire id an AsyncError of a launch carries: the library whose codes it uses.
pub const LAUNCH_ERROR_RUNTIME: u32 = u32::MAX;
pub const LAUNCH_ERROR_DRIVER: u32 = u32::MAX - 1;

/// Launch attributes whose value starts with an event.
const EVENT_ATTRIBUTES: [u32; 2] = {
    use chidori_cuda::consts::CUlaunchAttributeID_enum as a;
    [a::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_EVENT, a::CU_LAUNCH_ATTRIBUTE_LAUNCH_COMPLETION_EVENT]
};

/// The parameter layout of a function this session may launch: one from a loaded module,
/// or one from cuModuleGetFunction (asked of the driver once).
fn layout_of(session: &Session, function: u64) -> Option<ParamLayout> {
    if let Some(l) = lock(&session.layouts).get(&function) {
        return Some(l.clone());
    }
    use chidori_cuda::handles::kind::{CUfunc_st, CUkern_st};
    let mut handles = lock(&session.handles);
    let kernel = handles.owns(CUkern_st, function);
    let real = handles.resolve(if kernel { CUkern_st } else { CUfunc_st }, function).filter(|&r| r != 0);
    drop(handles);
    // A kernel handle launches as itself; its layout is its function's in this context.
    let target = if kernel { session.backend.kernel_function(real?).ok()? } else { real? };
    let params = Arc::new(session.backend.function_params(target).ok()?);
    lock(&session.layouts).insert(function, params.clone());
    Some(params)
}

/// The library's handles in place of the client's in `l`: the function (or kernel), the
/// stream, and the events some launch attributes name. Err: (driver status, message).
fn resolve_launch(session: &Session, l: &mut Launch) -> Result<(), (i64, String)> {
    use chidori_cuda::handles::kind::{CUevent_st, CUfunc_st, CUkern_st, CUstream_st};
    let mut handles = lock(&session.handles);
    // A module's kernel launched first is found by the resolve (its function loaded now);
    // where the driver failed to load it, that failure is the launch's (as with a
    // program's own lazy loading), asked only then, off the launch path.
    let Some(function) = handles.resolve(CUfunc_st, l.function).or_else(|| handles.resolve(CUkern_st, l.function))
    else {
        if let Err((status, message)) = handles.find(CUfunc_st, l.function) {
            return Err((status, format!("loading the kernel of a launch: {message}")));
        }
        return Err((INVALID_HANDLE, format!("launch of {:#x}, which is no function of this session", l.function)));
    };
    let Some(stream) = handles.resolve(CUstream_st, l.stream) else {
        return Err((INVALID_HANDLE, format!("launch on {:#x}, which is no stream of this session", l.stream)));
    };
    for (id, value) in l.attributes.iter_mut().filter(|(id, _)| EVENT_ATTRIBUTES.contains(id)) {
        let Some(word) = value.first_chunk_mut::<8>() else { continue };
        let event = u64::from_le_bytes(*word);
        let Some(real) = handles.resolve(CUevent_st, event).filter(|&e| e != 0) else {
            return Err((INVALID_HANDLE, format!("launch attribute {id}: {event:#x} is no event of this session")));
        };
        *word = real.to_le_bytes();
    }
    (l.function, l.stream) = (function, stream);
    Ok(())
}

/// A cluster occupancy query of a launch configuration: its handles resolved like a
/// launch's, a CUkernel asked through its function in this context.
fn cluster_occupancy(session: &Session, mut launch: Launch, potential: bool) -> ServiceReply {
    let kernel = lock(&session.handles).owns(chidori_cuda::handles::kind::CUkern_st, launch.function);
    if let Err((status, message)) = resolve_launch(session, &mut launch) {
        return ServiceReply::Error { status, message };
    }
    if kernel {
        match session.backend.kernel_function(launch.function) {
            Ok(f) => launch.function = f,
            Err((status, message)) => return ServiceReply::Error { status, message },
        }
    }
    match session.backend.cluster_occupancy(&launch, potential) {
        Ok(value) => ServiceReply::Value(i64::from(value)),
        Err((status, message)) => ServiceReply::Error { status, message },
    }
}

fn launch(session: &Arc<Session>, frame: &Frame) -> Result<(), Fatal> {
    let _call = crate::fatal::running("a kernel launch");
    let mut l: Launch = messages::decode(frame, "launch").map_err(|e| Fatal(e.to_string()))?;
    let error_call = match l.api {
        Api::Runtime => LAUNCH_ERROR_RUNTIME,
        Api::Driver => LAUNCH_ERROR_DRIVER,
    };
    let fail = |status: i64, message: String| -> Result<(), Fatal> {
        let err = AsyncError { status, message: Some(message) };
        let h = Header::new(Kind::AsyncError, error_call, frame.header.thread, frame.header.seq);
        session.writer.send(h, &messages::encode(&err), &[]).map_err(|e| Fatal(format!("writing a reply: {e}")))
    };
    let Some(layout) = layout_of(session, l.function) else {
        return fail(INVALID_HANDLE, format!("launch of {:#x}, which is no function of this session", l.function));
    };
    if let Err((status, message)) = resolve_launch(session, &mut l) {
        return fail(status, message);
    }
    // The kernel reads every parameter the layout names: pad a short buffer with zeros.
    let needed = layout.iter().map(|(o, s)| (*o + *s) as usize).max().unwrap_or(0);
    let mut params = vec![0u8; needed.max(frame.bulk.len())];
    params[..frame.bulk.len()].copy_from_slice(&frame.bulk);
    // SAFETY: the function is one of this session's, `layout` is its parameter layout and
    // `params` covers it.
    let status = unsafe { session.backend.launch(&l, &mut params, &layout) };
    if status != 0 {
        return fail(status, format!("kernel launch failed with status {status}"));
    }
    Ok(())
}

/// cudaErrorNotSupported: what a program sees when its pinned memory cannot be mirrored.
const MIRROR_FAILED: i64 = chidori_cuda::consts::cudaError::cudaErrorNotSupported as i64;

fn service(session: &Arc<Session>, frame: &Frame) -> Result<(), Fatal> {
    let _call = crate::fatal::running("a Chidori request (module load, mirror, content)");
    let request: Service = messages::decode(frame, "service").map_err(|e| Fatal(e.to_string()))?;
    let reply = match request {
        // Sent without waiting: only a failure is answered, as the next runtime call's status.
        Service::MirrorWrite { base, len, runs, client } => {
            // The session's own memory that the worker can reach from the CPU (a managed
            // variable) is mirrored by itself; other session memory is the GPU's alone.
            let own = client == 0 && lock(&session.memory).contains(base, len);
            let direct = own && session.backend.host_accessible(base, len);
            let result = if own && !direct {
                Err(format!("{base:#x} is device memory, not memory of the client's"))
            } else {
                lock(&session.mirrors).write(&*session.backend, base, len, &runs, &frame.bulk, direct, client)
            };
            return match result {
                Ok(()) => Ok(()),
                Err(e) => {
                    let err =
                        AsyncError { status: MIRROR_FAILED, message: Some(format!("pinned memory for the GPU: {e}")) };
                    let h = Header::new(Kind::AsyncError, LAUNCH_ERROR_RUNTIME, frame.header.thread, frame.header.seq);
                    session
                        .writer
                        .send(h, &messages::encode(&err), &[])
                        .map_err(|e| Fatal(format!("writing a reply: {e}")))
                }
            };
        }
        Service::WindowMap { device, address, size } => return window_map(session, device, address, size),
        Service::WindowFree { address } => {
            return match window_unmap(session, address) {
                ServiceReply::Error { status, message } => Err(Fatal(format!(
                    "the client freed {address:#x} without waiting, and the server could not: {message} (status {status})"
                ))),
                _ => Ok(()),
            };
        }
        Service::WindowReset { device } => {
            window_reset(session, device);
            return Ok(());
        }
        Service::CaptureNamed { stream, id, graph } => {
            return capture_named(session, frame.header.thread, stream, id, graph);
        }
        Service::MirrorDrop { base } => {
            lock(&session.mirrors).remove(&*session.backend, base);
            return Ok(());
        }
        Service::MirrorPull { bases, from } => {
            let (changes, next) =
                lock(&session.mirrors).pull(&*session.backend, &bases, from, chidori_protocol::mirror::PULL_BUDGET);
            ServiceReply::MirrorRuns { changes, next }
        }
        Service::GraphLoop(request) => graph_loop(session, frame, request),
        Service::LoadModule { hash } => load_known(session, hash, None),
        Service::LoadModuleBehind { hash } => return load_behind(session, frame, hash),
        Service::LoadModuleNamed { hash, library, module, kernels } => {
            return load_named(session, hash, library, module, kernels);
        }
        Service::UploadModule { hash } => {
            if cache::sha256(&frame.bulk) != hash {
                return Err(Fatal("uploaded module does not match its hash".into()));
            }
            let reply = load(session, hash, &frame.bulk, None);
            // Only an image the driver loaded is kept for later sessions.
            if let (Some(c), ServiceReply::Module { .. }) = (&session.module_cache, &reply) {
                c.put(&hash, &frame.bulk);
            }
            reply
        }
        Service::Global { module, name } => {
            let real = lock(&session.handles).resolve(chidori_cuda::handles::kind::CUlib_st, module);
            match real.filter(|&r| r != 0 && lock(&session.libraries).contains(&module)) {
                None => ServiceReply::Error {
                    status: INVALID_HANDLE,
                    message: format!("{module:#x} is no module of this session"),
                },
                Some(real) => match session.backend.global(real, &name) {
                    Ok((address, size)) => {
                        lock(&session.memory).insert(address, size, Origin::Global);
                        ServiceReply::Global { address, size }
                    }
                    Err((status, message)) => ServiceReply::Error { status, message },
                },
            }
        }
        Service::Compile(request) => match session.backend.compile(&request) {
            Ok(result) => ServiceReply::Compiled(result),
            Err((status, message)) => ServiceReply::Error { status, message },
        },
        Service::FunctionName { handle, kernel } => {
            let kind =
                if kernel { chidori_cuda::handles::kind::CUkern_st } else { chidori_cuda::handles::kind::CUfunc_st };
            match lock(&session.handles).resolve(kind, handle).filter(|&r| r != 0) {
                None => ServiceReply::Error {
                    status: INVALID_HANDLE,
                    message: format!("{handle:#x} is no function of this session"),
                },
                Some(real) => match session.backend.function_name(real, kernel) {
                    Ok(name) => ServiceReply::Name(name),
                    Err((status, message)) => ServiceReply::Error { status, message },
                },
            }
        }
        Service::NcclLastError { comm } => {
            // NCCL keeps one text per process and does not read `comm`; a name that is not a
            // communicator of this session is refused all the same.
            let real = if comm == 0 {
                Some(0)
            } else {
                lock(&session.handles).resolve(chidori_cuda::handles::kind::ncclComm, comm).filter(|&r| r != 0)
            };
            match real.map(|c| session.backend.nccl_last_error(c)) {
                Some(Ok(text)) => ServiceReply::Name(text),
                Some(Err((status, message))) => ServiceReply::Error { status, message },
                None => foreign("NCCL communicator", comm),
            }
        }
        Service::StatusTexts { library, function, values } => {
            let known = chidori_cuda::status::TEXT_FUNCTIONS.iter().any(|&(l, f)| l == library && f == function);
            if !known {
                ServiceReply::Error {
                    status: INVALID_HANDLE,
                    message: format!("{function} is no error-string function of {library}"),
                }
            } else if values.len() > messages::MAX_STATUS_TEXTS {
                ServiceReply::Error {
                    status: INVALID_HANDLE,
                    message: format!("{} status values asked at once", values.len()),
                }
            } else {
                match session.backend.status_texts(&library, &function, &values) {
                    Ok(texts) => ServiceReply::Texts(texts),
                    Err((status, message)) => ServiceReply::Error { status, message },
                }
            }
        }
        Service::MemoryWindow { device } => memory_window(session, device),
        Service::WindowUnmap { address } => window_unmap(session, address),
        Service::GraphList(query) => graph_list(session, query, frame.header.thread),
        Service::ClusterOccupancy { launch, potential } => cluster_occupancy(session, launch, potential),
        Service::NvidiaSmi { args } => {
            let visible: Vec<String> =
                session.backend.devices().iter().map(|d| crate::visible::uuid_text(&d.uuid)).collect();
            // Without the driver's list (no NVIDIA driver) there is nothing to hide.
            let all = crate::visible::physical_gpus().is_none_or(|n| n as usize <= visible.len());
            crate::smi::run(&args, &visible, all)
        }
        Service::GraphDot { graph, flags } => {
            let real = live(&mut lock(&session.handles), chidori_cuda::handles::kind::CUgraph_st, graph);
            match real.map(|g| session.backend.graph_dot(g, flags)) {
                Some(Ok(dot)) => ServiceReply::Name(dot),
                Some(Err((status, message))) => ServiceReply::Error { status, message },
                None => foreign("graph", graph),
            }
        }
        Service::Link(request) => match session.backend.link(&request) {
            Ok(result) => ServiceReply::Linked(result),
            Err((status, message)) => ServiceReply::Error { status, message },
        },
        Service::JitLink(request) => match session.backend.jit_link(&request) {
            Ok(result) => ServiceReply::JitLinked(result),
            Err((status, message)) => ServiceReply::Error { status, message },
        },
        Service::GraphNode(request) => graph_node(session, frame, request),
        Service::FunctionParams { function } => match layout_of(session, function) {
            Some(l) => ServiceReply::Params { params: l.to_vec() },
            None => ServiceReply::Error {
                status: INVALID_HANDLE,
                message: format!("{function:#x} is no function of this session"),
            },
        },
    };
    service_reply(session, frame.header.thread, frame.header.seq, reply)
}

/// Send the answer to the service request `seq` of client thread `thread`.
fn service_reply(session: &Session, thread: u32, seq: u64, reply: ServiceReply) -> Result<(), Fatal> {
    let h = Header::new(Kind::ServiceReply, 0, thread, seq);
    session.writer.send(h, &fitting(reply), &[]).map_err(|e| Fatal(format!("writing a reply: {e}")))
}

/// The session's allocation window on `device`, made at the first request: twice the
/// device's memory of address space. `free` is what the device had free then, within what
/// the session's quota leaves.
fn memory_window(session: &Session, device: i32) -> ServiceReply {
    let mut windows = lock(&session.windows);
    let window = match windows.window(device) {
        Some(w) => w,
        None => {
            let devices = session.backend.devices();
            let Some(total) = usize::try_from(device).ok().and_then(|d| devices.get(d)).map(|d| d.total_mem) else {
                return ServiceReply::Error {
                    status: INVALID_VALUE,
                    message: format!("device {device} is not one of this session's {}", devices.len()),
                };
            };
            match session.backend.window_reserve(device, total.saturating_mul(2)) {
                Ok(w) => {
                    windows.add_window(device, w);
                    w
                }
                Err((status, message)) => return ServiceReply::Error { status, message },
            }
        }
    };
    let memory = lock(&session.memory);
    let free = memory.quota.map_or(window.free, |q| window.free.min(q.saturating_sub(memory.used)));
    ServiceReply::Window { base: window.base, size: window.size, granularity: window.granularity, free }
}

/// Back an allocation the client placed in a window (and already answered): a request no
/// correct client makes, or memory the GPU no longer has, ends the session, saying which.
fn window_map(session: &Session, device: i32, address: u64, size: u64) -> Result<(), Fatal> {
    let mut windows = lock(&session.windows);
    if let Some(why) = windows.refusal(device, address, size) {
        return Err(Fatal(format!("the client placed an allocation the server cannot make: {why}")));
    }
    let mut memory = lock(&session.memory);
    if !memory.fits(size) {
        return Err(Fatal(format!(
            "an allocation of {size} bytes the client placed ahead exceeds the session's memory quota ({} bytes in use)",
            memory.used
        )));
    }
    if let Err((status, message)) = session.backend.window_map(device, address, size) {
        return Err(Fatal(format!(
            "the GPU could not make {size} bytes of device memory that the program was told it had \
             (an allocation placed without waiting: {message}, status {status}); was its memory taken by \
             another process since the session began? With {}=0 every allocation waits for the GPU's answer",
            chidori_protocol::env::WINDOW_ALLOC
        )));
    }
    windows.mapped(device, address, size);
    memory.insert(address, size, Origin::Allocated);
    Ok(())
}

/// `device`'s primary context was reset: its window allocations go, as the program's others
/// did. One the driver will not unmap stays counted (it is said in the log).
fn window_reset(session: &Session, device: i32) {
    let mut windows = lock(&session.windows);
    for (address, size) in windows.on_device(device) {
        match session.backend.window_unmap(device, address, size, true) {
            Ok(()) => {
                windows.unmapped(address);
                lock(&session.memory).remove(address);
            }
            Err((status, message)) => {
                tracing::warn!("after device {device}'s reset, {size} bytes at {address:#x} stay: {message} ({status})")
            }
        }
    }
}

/// Free a window allocation as cudaFree does.
fn window_unmap(session: &Session, address: u64) -> ServiceReply {
    let mut windows = lock(&session.windows);
    let Some((size, device)) = windows.allocation(address) else {
        return ServiceReply::Error {
            status: INVALID_VALUE,
            message: format!("{address:#x} is no allocation the client placed in this session"),
        };
    };
    match session.backend.window_unmap(device, address, size, false) {
        Ok(()) => {
            windows.unmapped(address);
            lock(&session.memory).remove(address);
            ServiceReply::Value(0)
        }
        Err((status, message)) => ServiceReply::Error { status, message },
    }
}

/// A service reply encoded, or, where it is more than a frame holds (a huge graph's node
/// list, a compiler's output), an error that says so: the request fails, the session goes on.
fn fitting(reply: ServiceReply) -> chidori_protocol::rkyv::util::AlignedVec {
    let archive = messages::encode(&reply);
    if archive.len() <= frame::MAX_ARCHIVE as usize {
        return archive;
    }
    let message = format!(
        "the server's answer is {} bytes, more than one frame carries ({} bytes); not sent",
        archive.len(),
        frame::MAX_ARCHIVE
    );
    tracing::warn!("{message}");
    // The answer did not fit (cudaErrorMemoryAllocation, CUDA_ERROR_OUT_OF_MEMORY: the same
    // value in both APIs).
    let status = chidori_cuda::consts::cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY as i64;
    const _: () = assert!(
        chidori_cuda::consts::cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY
            == chidori_cuda::consts::cudaError::cudaErrorMemoryAllocation
    );
    messages::encode(&ServiceReply::Error { status, message })
}

/// Run a graph-replay loop: the graph and stream must be this session's; the output of
/// completed steps goes back in Progress frames as the loop runs.
fn graph_loop(session: &Arc<Session>, frame: &Frame, mut request: GraphLoop) -> ServiceReply {
    let mut handles = lock(&session.handles);
    let exec = handles.resolve(chidori_cuda::handles::kind::CUgraphExec_st, request.exec).filter(|&e| e != 0);
    let stream = handles.resolve(chidori_cuda::handles::kind::CUstream_st, request.stream);
    drop(handles);
    let (Some(exec), Some(stream)) = (exec, stream) else {
        return ServiceReply::Error {
            status: INVALID_HANDLE,
            message: format!(
                "graph loop: {:#x} / {:#x} is no graph and stream of this session",
                request.exec, request.stream
            ),
        };
    };
    if request.bytes_per_step as u64 * u64::from(request.check_every.max(1)) > MAX_BUFFER {
        return ServiceReply::Error {
            status: INVALID_VALUE,
            message: "graph loop: output per check larger than a frame".into(),
        };
    }
    // The flag and the output must be the session's memory (cudaErrorInvalidValue).
    let slots = u64::from(request.max_steps) + u64::from(request.tail);
    let output_len = u64::from(request.bytes_per_step).saturating_mul(slots);
    let memory = lock(&session.memory);
    let flag_ok = request.stop_flag == 0 || memory.contains(request.stop_flag, 4);
    let output_ok = request.output == 0 || output_len == 0 || memory.contains(request.output, output_len);
    let copy_ok = request.then_copy.is_none_or(|c| memory.contains(c.dst, c.bytes) && memory.contains(c.src, c.bytes));
    drop(memory);
    if !flag_ok || !output_ok {
        return ServiceReply::Error {
            status: INVALID_VALUE,
            message: format!(
                "graph loop: the stop flag {:#x} or the output {:#x} ({output_len} bytes) is not device memory of this session",
                request.stop_flag, request.output
            ),
        };
    }
    if !copy_ok {
        return ServiceReply::Error {
            status: INVALID_VALUE,
            message: format!(
                "graph loop: the closing copy {:?} is not within device memory of this session",
                request.then_copy
            ),
        };
    }
    request.exec = exec;
    request.stream = stream;
    let (thread, seq) = (frame.header.thread, frame.header.seq);
    let mut progress = |steps: u32, bytes: &[u8]| {
        let h = Header::new(Kind::Progress, 0, thread, seq);
        if let Err(e) = session.writer.send(h, &messages::encode(&Progress { steps }), &[bytes]) {
            tracing::warn!("graph loop: sending progress: {e}");
        }
    };
    let end = session.backend.graph_loop(&request, &mut progress);
    ServiceReply::Looped { steps: end.steps, stopped_at: end.stopped_at, status: end.status, idle: end.idle }
}

/// Streams whose last ended capture's graph is kept (`Session::ended`): past this many, all
/// are forgotten (a question about one is then refused, and the client asks as before).
const ENDED_MAX: usize = 4096;

/// A capture the client began without waiting takes the id and graph name it chose (see
/// `Service::CaptureNamed`). A begin that failed left nothing to name: its own failure is
/// what the client hears. A name the session holds already is a client that does not keep
/// the protocol.
fn capture_named(session: &Session, thread: u32, stream: u64, id: u64, graph: u64) -> Result<(), Fatal> {
    use chidori_cuda::handles::kind::{CUgraph_st, CUstream_st};
    let mut handles = lock(&session.handles);
    if id == 0 || !handles.name_free(CUgraph_st, graph) {
        return Err(Fatal(format!("the client named a capture {id:#x} with graph {graph:#x}, a name taken or none")));
    }
    let Some(real) = handles.resolve(CUstream_st, stream) else { return Ok(()) };
    drop(handles);
    let Ok(list) = session.backend.graph_list(&GraphList::Capture { stream: real }) else { return Ok(()) };
    let Some((CAPTURE_ACTIVE, library_id, real_graph)) = list.capture else { return Ok(()) };
    lock(&session.handles).insert_named(CUgraph_st, graph, real_graph);
    let mut ids = lock(&session.capture_ids);
    if ids.len() >= ENDED_MAX {
        ids.clear();
    }
    ids.insert((thread, stream), (library_id, id));
    Ok(())
}

/// cudaStreamCaptureStatusActive (CU_STREAM_CAPTURE_STATUS_ACTIVE: the same value).
const CAPTURE_ACTIVE: u32 = chidori_cuda::consts::cudaStreamCaptureStatus::cudaStreamCaptureStatusActive;

/// The id a capture has for the client: the one it chose where it began the capture
/// without waiting, else the library's.
fn client_capture_id(session: &Session, library_id: u64) -> u64 {
    lock(&session.capture_ids).values().find(|(l, _)| *l == library_id).map_or(library_id, |(_, c)| *c)
}

/// The library's handle for a non-null `value` of `kind` this session holds.
fn live(handles: &mut Handles, kind: HandleKind, value: u64) -> Option<u64> {
    handles.resolve(kind, value).filter(|&real| real != 0)
}

/// The answer for a handle value this session does not hold.
fn foreign(what: &str, value: u64) -> ServiceReply {
    ServiceReply::Error { status: INVALID_HANDLE, message: format!("{value:#x} is no {what} of this session") }
}

/// Node arrays of a graph, a node or a capture: every node in the answer becomes a handle
/// of the session (nodes made by a capture were never named to the client before).
/// `thread`: the client thread asking (a capture's end is the thread's own).
fn graph_list(session: &Session, query: GraphList, thread: u32) -> ServiceReply {
    use chidori_cuda::handles::kind::{CUgraph_st, CUgraphNode_st, CUstream_st};
    // The graph a capture's end made: the session's own record of it, never the library's
    // graph of a capture that failed (the driver destroyed it).
    let query = match query {
        GraphList::Ended { stream } => match lock(&session.ended).get(&(thread, stream)) {
            Some(&graph) => GraphList::Nodes { graph },
            None => return foreign("stream whose capture this thread ended", stream),
        },
        other => other,
    };
    let mut handles = lock(&session.handles);
    let mapped = match query {
        GraphList::Nodes { graph } => live(&mut handles, CUgraph_st, graph).map(|graph| GraphList::Nodes { graph }),
        GraphList::RootNodes { graph } => {
            live(&mut handles, CUgraph_st, graph).map(|graph| GraphList::RootNodes { graph })
        }
        GraphList::Edges { graph } => live(&mut handles, CUgraph_st, graph).map(|graph| GraphList::Edges { graph }),
        GraphList::Dependencies { node } => {
            live(&mut handles, CUgraphNode_st, node).map(|node| GraphList::Dependencies { node })
        }
        GraphList::Dependents { node } => {
            live(&mut handles, CUgraphNode_st, node).map(|node| GraphList::Dependents { node })
        }
        GraphList::Capture { stream } => {
            handles.resolve(CUstream_st, stream).map(|stream| GraphList::Capture { stream })
        }
        GraphList::Ended { .. } => None,
    };
    drop(handles);
    let Some(query) = mapped else { return foreign("graph, node or stream", 0) };
    match session.backend.graph_list(&query) {
        Ok(mut list) => {
            if let Some((_, id, _)) = &mut list.capture {
                *id = client_capture_id(session, *id);
            }
            let mut handles = lock(&session.handles);
            let mut named = |nodes: Vec<u64>| -> Vec<u64> {
                nodes.into_iter().map(|node| handles.insert(CUgraphNode_st, node)).collect()
            };
            let (nodes, peers) = (named(list.nodes), named(list.peers));
            let capture = list.capture.map(|(status, id, graph)| (status, id, handles.insert(CUgraph_st, graph)));
            ServiceReply::Nodes { nodes, peers, edge_data: list.edge_data, capture }
        }
        Err((status, message)) => ServiceReply::Error { status, message },
    }
}

/// Make or change a node whose parameters the worker lays out: a kernel's packed
/// parameters, a host function of the client, a conditional node's body graphs, a memory
/// allocation's pool and access descriptors, a batch of stream memory operations.
fn graph_node(session: &Arc<Session>, frame: &Frame, mut request: GraphNode) -> ServiceReply {
    use chidori_cuda::handles::kind::{CUctx_st, CUfunc_st, CUgraph_st, CUgraphExec_st, CUgraphNode_st, CUkern_st};
    let mut handles = lock(&session.handles);
    match &mut request.target {
        NodeTarget::Add { graph, dependencies, edge_data } => {
            let Some(g) = live(&mut handles, CUgraph_st, *graph) else { return foreign("graph", *graph) };
            *graph = g;
            for d in dependencies.iter_mut() {
                let Some(real) = live(&mut handles, CUgraphNode_st, *d) else { return foreign("graph node", *d) };
                *d = real;
            }
            if !edge_data.is_empty() && edge_data.len() != dependencies.len() {
                return ServiceReply::Error {
                    status: INVALID_VALUE,
                    message: "edge data for some dependencies only".into(),
                };
            }
        }
        NodeTarget::Set { node } => {
            let Some(n) = live(&mut handles, CUgraphNode_st, *node) else { return foreign("graph node", *node) };
            *node = n;
        }
        NodeTarget::ExecSet { exec, node } => {
            let Some(e) = live(&mut handles, CUgraphExec_st, *exec) else { return foreign("executable graph", *exec) };
            let Some(n) = live(&mut handles, CUgraphNode_st, *node) else { return foreign("graph node", *node) };
            (*exec, *node) = (e, n);
        }
    }
    drop(handles);
    let mut params = Vec::new();
    let mut layout: ParamLayout = Arc::new(Vec::new());
    let mut host = None;
    match &mut request.params {
        NodeParams::Kernel { function, .. } => {
            let Some(l) = layout_of(session, *function) else { return foreign("function", *function) };
            let mut handles = lock(&session.handles);
            let real = handles.resolve(CUfunc_st, *function).or_else(|| handles.resolve(CUkern_st, *function));
            drop(handles);
            let Some(real) = real else { return foreign("function", *function) };
            *function = real;
            // The kernel reads every parameter the layout names: pad a short buffer.
            let needed = l.iter().map(|(o, s)| (*o + *s) as usize).max().unwrap_or(0);
            params = vec![0u8; needed.max(frame.bulk.len())];
            params[..frame.bulk.len()].copy_from_slice(&frame.bulk);
            layout = l;
        }
        NodeParams::Host { id } => host = Some(host_closure(session, *id)),
        NodeParams::BatchMemOp { ctx, count, .. } => {
            if *ctx != 0 {
                let Some(real) = live(&mut lock(&session.handles), CUctx_st, *ctx) else {
                    return foreign("context", *ctx);
                };
                *ctx = real;
            }
            match batch_mem_ops(session, *count, &frame.bulk) {
                Ok(ops) => params = ops,
                Err(message) => return ServiceReply::Error { status: INVALID_VALUE, message },
            }
        }
        NodeParams::Conditional { .. } | NodeParams::MemAlloc { .. } => {}
    }
    // SAFETY: a kernel node's function is this session's (layout_of), `layout` its layout
    // and `params` covers it.
    match unsafe { session.backend.graph_node(&request, &mut params, &layout, host) } {
        Ok(made) => {
            let mut handles = lock(&session.handles);
            let node = handles.insert(CUgraphNode_st, made.node);
            let graphs: Vec<u64> = made.graphs.iter().map(|&g| handles.insert(CUgraph_st, g)).collect();
            drop(handles);
            // The address a graph allocation node reserves is the session's memory: kernels,
            // copies and memsets of the graph name it, and the program may use and free it
            // outside the graph after a launch (not counted against the quota: the graph's
            // pool holds it).
            if let (NodeParams::MemAlloc { bytesize, .. }, true) = (&request.params, made.address != 0) {
                lock(&session.memory).insert(made.address, *bytesize, Origin::Graph);
            }
            ServiceReply::Node { node, graphs, address: made.address }
        }
        Err((status, message)) => ServiceReply::Error { status, message },
    }
}

/// The `count` stream memory operations of a graph node (`bytes`, 48 each), every word they
/// name checked to be the session's memory and named where the session has it.
fn batch_mem_ops(session: &Session, count: u32, bytes: &[u8]) -> Result<Vec<u8>, String> {
    const RECORD: &str = "CUstreamBatchMemOpParams_union";
    let version = session.backend.layout_version("driver").ok_or("the server has no driver to lay out records")?;
    let size = structs::get(&version, RECORD).map_or(0, |m| m.size as usize);
    if size == 0 || bytes.len() != size.saturating_mul(count as usize) {
        return Err(format!("{count} memory operations in {} bytes", bytes.len()));
    }
    let mut ops = bytes.to_vec();
    name_where_the_session_has(session, RECORD, &version, &mut ops)?;
    Ok(ops)
}

/// Data pointers from `hostvalues` records: device addresses as they are, host scalars as
/// addresses of the returned copies (16-byte aligned). None: not whole records.
fn host_value_pointers(records: &[u8]) -> Option<(Vec<u64>, Box<[u128]>)> {
    use chidori_protocol::messages::{HOST_VALUE_FLAG, HOST_VALUE_MAX, HOST_VALUE_RECORD};
    if !records.len().is_multiple_of(HOST_VALUE_RECORD) {
        return None;
    }
    let word = |r: &[u8], at: usize| u64::from_le_bytes(r[at..at + 8].try_into().expect("8 bytes"));
    let mut values: Box<[u128]> = records
        .chunks_exact(HOST_VALUE_RECORD)
        .map(|r| u128::from_le_bytes(r[16..16 + HOST_VALUE_MAX].try_into().expect("16 bytes")))
        .collect();
    let base = values.as_mut_ptr();
    let pointers = records
        .chunks_exact(HOST_VALUE_RECORD)
        .enumerate()
        .map(|(i, r)| if word(r, 8) & HOST_VALUE_FLAG != 0 { base.wrapping_add(i) as u64 } else { word(r, 0) })
        .collect();
    Some((pointers, values))
}

/// What finds a module kernel's function when first used: the backend, in the context the
/// module was loaded in.
fn module_functions(backend: &Arc<dyn Backend>) -> crate::handles::Finder {
    let backend = backend.clone();
    Arc::new(move |p: Pending| backend.module_function(p.kernel, p.context))
}

fn module_reply(m: &Loaded) -> ServiceReply {
    ServiceReply::Module { library: m.library, module: m.module, kernels: m.kernels.clone() }
}

/// A module loaded behind the calls of the thread that asked (`Service::LoadModuleBehind`):
/// one this session loaded is answered at once; another is read from the module cache and
/// loaded on the session's loader thread, in the context current on the asking thread's
/// executor, and answered from there (`NeedUpload` where the cache lacks it).
fn load_behind(session: &Arc<Session>, frame: &Frame, hash: [u8; 32]) -> Result<(), Fatal> {
    let (thread, seq) = (frame.header.thread, frame.header.seq);
    if let Some(m) = lock(&session.modules).get(&hash).cloned() {
        return service_reply(session, thread, seq, module_reply(&m));
    }
    let context = session.backend.current_context();
    let s = session.clone();
    // The image is read from the cache (and its hash checked) there too: the executor only
    // hands the load over.
    let job: LoadJob = Box::new(move || {
        if s.closing.load(Ordering::SeqCst) {
            return;
        }
        let _call = crate::fatal::running("a module load behind the calls");
        // (Loaded meanwhile by the executor, where the program used it first: that module.)
        if let Err(Fatal(e)) = service_reply(&s, thread, seq, load_known(&s, hash, Some(context))) {
            tracing::debug!("a module loaded behind the calls: {e}");
        }
    });
    match queue_load(session, job) {
        Ok(()) => Ok(()),
        Err(job) => {
            // No loader thread here: loaded where it was asked.
            job();
            Ok(())
        }
    }
}

/// The module of `hash`: one this session loaded, or one loaded now from the module cache
/// (on the executor, or with `context` on the loader thread: [`load`]); `NeedUpload` where
/// the cache lacks it.
fn load_known(session: &Session, hash: [u8; 32], context: Option<u64>) -> ServiceReply {
    if let Some(m) = lock(&session.modules).get(&hash).cloned() {
        return module_reply(&m);
    }
    match session.module_cache.as_ref().and_then(|c| c.get(&hash)) {
        Some(image) => load(session, hash, &image, context),
        None => ServiceReply::NeedUpload,
    }
}

/// Hand `job` to the session's loader thread, started at the first. Err: no thread may be
/// started (the session is closing, or has no `running` to hold), the job back.
fn queue_load(session: &Session, job: LoadJob) -> Result<(), LoadJob> {
    let mut loader = lock(&session.loader);
    if loader.is_none() {
        let Some(running) = lock(&session.running).clone() else { return Err(job) };
        let (tx, rx) = mpsc::channel::<LoadJob>();
        let backend = session.backend.clone();
        let started = std::thread::Builder::new().name("chidori-loader".into()).spawn(move || {
            let _running = running;
            backend.thread_init();
            for job in rx {
                job();
            }
        });
        if started.is_err() {
            return Err(job);
        }
        *loader = Some(tx);
    }
    match loader.as_ref() {
        Some(tx) => tx.send(job).map_err(|e| e.0),
        None => Err(job),
    }
}

/// Load `image` (of `hash`) for the session: on the executor, in its current context, or
/// (`context`) on the loader thread, in that context.
fn load(session: &Session, hash: [u8; 32], image: &[u8], context: Option<u64>) -> ServiceReply {
    match load_as(session, hash, image, context, None) {
        Ok(loaded) => module_reply(&loaded),
        Err((status, message)) => ServiceReply::Error { status, message },
    }
}

/// The client's names for a module load (`Service::LoadModuleNamed`).
struct Names {
    library: u64,
    module: u64,
    kernels: HashMap<String, u64>,
}

impl Names {
    fn all(&self) -> Vec<u64> {
        [self.library, self.module].into_iter().chain(self.kernels.values().copied()).collect()
    }
}

/// [`load`], named by the client (`names`) or by the worker: the names land through the
/// handle table's [`Landing`], so that the loader thread never takes the table's lock.
fn load_as(
    session: &Session,
    hash: [u8; 32],
    image: &[u8],
    context: Option<u64>,
    names: Option<&Names>,
) -> Result<Arc<Loaded>, (i64, String)> {
    let started = std::time::Instant::now();
    let loaded = match context {
        Some(context) => session.backend.load_module_in(image, context),
        None => session.backend.load_module(image),
    };
    // In the time table (`chidori::calls=debug`): module loads and the kernels they held
    // (those whose functions were found at the load: drivers before CUDA 12.4).
    if let Some(timing) = &session.timing {
        let mut t = lock(timing);
        let e = t.entry("(module load)").or_default();
        e.0 += 1;
        e.1 += started.elapsed();
        if let Ok(m) = &loaded {
            t.entry("(kernels of loaded modules)").or_default().0 += m.kernels.len() as u64;
            let eager = m.kernels.iter().filter(|k| matches!(k.handle, KernelHandle::Function(_))).count();
            t.entry("(kernels found at their module's load)").or_default().0 += eager as u64;
        }
    }
    let m = loaded?;
    // The client knows the module, its library and its kernels by its own names or the
    // session's ids; a kernel's function is found when first used (Handles::find).
    use chidori_cuda::handles::kind::{CUfunc_st, CUlib_st, CUmod_st};
    let landing = &session.landing;
    let mut entries = Vec::with_capacity(m.kernels.len() + 2);
    let mut name = |kind, entry, given: Option<u64>| {
        let name = given.unwrap_or_else(|| landing.next_id());
        entries.push((kind, name, entry));
        name
    };
    let kernels: Vec<KernelInfo> = m
        .kernels
        .into_iter()
        .map(|k| {
            let entry = match k.handle {
                KernelHandle::Function(f) => Entry::Real(f),
                KernelHandle::Kernel(kernel) => Entry::Pending(Pending { kernel, context: m.context }),
            };
            let handle = name(CUfunc_st, entry, names.and_then(|n| n.kernels.get(&k.name).copied()));
            KernelInfo { name: k.name, handle, params: k.params }
        })
        .collect();
    let module = name(CUmod_st, Entry::Real(m.module), names.map(|n| n.module));
    let library = name(CUlib_st, Entry::Real(m.library), names.map(|n| n.library));
    landing.arrive(entries, Vec::new(), &[]);
    let loaded = Arc::new(Loaded { library, module, kernels });
    {
        let mut layouts = lock(&session.layouts);
        for k in &loaded.kernels {
            layouts.insert(k.handle, Arc::new(k.params.clone()));
        }
    }
    lock(&session.libraries).insert(library);
    tracing::debug!(
        target: TIMING_TARGET,
        "module {} loaded: {} bytes, {} kernels, {:.1} ms",
        cache::hex(&hash),
        image.len(),
        loaded.kernels.len(),
        started.elapsed().as_secs_f64() * 1e3
    );
    lock(&session.modules).insert(hash, loaded.clone());
    Ok(loaded)
}

/// A module loaded behind the calls under the client's names (`Service::LoadModuleNamed`):
/// one this session loaded is named at once; another is loaded on the loader thread, as
/// [`load_behind`] does, and calls that pass its names wait for it there. Err: a name that
/// is not free (a client that breaks the protocol).
fn load_named(
    session: &Arc<Session>,
    hash: [u8; 32],
    library: u64,
    module: u64,
    kernels: Vec<(String, u64)>,
) -> Result<(), Fatal> {
    use chidori_cuda::handles::kind::{CUfunc_st, CUlib_st, CUmod_st};
    let count = kernels.len();
    let names = Names { library, module, kernels: kernels.into_iter().collect() };
    let all = names.all();
    {
        let mut handles = lock(&session.handles);
        let kinds = [CUlib_st, CUmod_st].into_iter().chain(std::iter::repeat(CUfunc_st));
        let unique: std::collections::HashSet<u64> = all.iter().copied().collect();
        let free = unique.len() == all.len() && names.kernels.len() == count;
        if !free || !kinds.zip(&all).all(|(kind, &name)| handles.name_free(kind, name)) {
            return Err(Fatal(format!(
                "the client named a load of module {} with names that are taken or repeated",
                cache::hex(&hash)
            )));
        }
    }
    let known = lock(&session.modules).get(&hash).cloned();
    if let Some(m) = known {
        let mut failed = Vec::new();
        let mut handles = lock(&session.handles);
        let mut named = handles.alias(CUlib_st, library, m.library) && handles.alias(CUmod_st, module, m.module);
        let mut layouts = lock(&session.layouts);
        let by_name: HashMap<&str, &KernelInfo> = m.kernels.iter().map(|k| (k.name.as_str(), k)).collect();
        for (kernel, &name) in &names.kernels {
            match by_name.get(kernel.as_str()) {
                Some(k) => {
                    named &= handles.alias(CUfunc_st, name, k.handle);
                    layouts.insert(name, Arc::new(k.params.clone()));
                }
                None => failed.push((name, missing_kernel(&hash, kernel))),
            }
        }
        drop((handles, layouts));
        if !named {
            return Err(Fatal(format!("module {} of this session lost its handles", cache::hex(&hash))));
        }
        lock(&session.libraries).insert(library);
        session.landing.arrive(Vec::new(), failed, &[]);
        return Ok(());
    }
    session.landing.expect(&all);
    // Whatever happens to the job (run, or dropped with the session), the names land.
    let done = Awaited { landing: session.landing.clone(), names: all, failed: Vec::new() };
    let context = session.backend.current_context();
    let s = session.clone();
    let job: LoadJob = Box::new(move || {
        let mut done = done;
        done.failed = named_load(&s, hash, context, &names);
    });
    if let Err(job) = queue_load(session, job) {
        job();
    }
    Ok(())
}

/// The names of a load asked for: they land when this is dropped, `failed` with their
/// status, the others with the load (or as failed, where the load never ran).
struct Awaited {
    landing: Arc<Landing>,
    names: Vec<u64>,
    failed: Vec<(u64, (i64, String))>,
}

impl Drop for Awaited {
    fn drop(&mut self) {
        self.landing.arrive(Vec::new(), std::mem::take(&mut self.failed), &self.names);
    }
}

fn missing_kernel(hash: &[u8; 32], kernel: &str) -> (i64, String) {
    (NOT_FOUND, format!("module {} has no kernel {kernel}", cache::hex(hash)))
}

/// How long the loader waits for a module image asked of the client.
const PULL_WAIT: Duration = Duration::from_secs(120);

/// The loader thread's part of [`load_named`]: the image from the module cache (or the
/// client), loaded and named. The names that failed, with their status.
fn named_load(session: &Session, hash: [u8; 32], context: u64, names: &Names) -> Vec<(u64, (i64, String))> {
    let fail_all =
        |status: i64, message: String| names.all().into_iter().map(|n| (n, (status, message.clone()))).collect();
    if session.closing.load(Ordering::SeqCst) {
        return fail_all(NOT_FOUND, "the session is closing".into());
    }
    let _call = crate::fatal::running("a module load behind the calls");
    let (image, pulled) = match session.module_cache.as_ref().and_then(|c| c.get(&hash)) {
        Some(image) => (image, false),
        None => match pull_image(session, hash) {
            Ok(image) => (image, true),
            Err(e) => {
                tracing::warn!("a module load the client named: {e}");
                return fail_all(NOT_FOUND, e);
            }
        },
    };
    match load_as(session, hash, &image, Some(context), Some(names)) {
        Ok(loaded) => {
            // Only an image the driver loaded is kept for later sessions.
            if let (true, Some(c)) = (pulled, &session.module_cache) {
                c.put(&hash, &image);
            }
            let have: std::collections::HashSet<&str> = loaded.kernels.iter().map(|k| k.name.as_str()).collect();
            names
                .kernels
                .iter()
                .filter(|(kernel, _)| !have.contains(kernel.as_str()))
                .map(|(kernel, &name)| (name, missing_kernel(&hash, kernel)))
                .collect()
        }
        Err((status, message)) => fail_all(status, format!("loading module {}: {message}", cache::hex(&hash))),
    }
}

/// The image of `hash`, asked of the client (`Kind::NeedModule`, answered outside the call
/// order by `Kind::ModuleImage`, which [`receive`] hands over).
fn pull_image(session: &Session, hash: [u8; 32]) -> Result<Vec<u8>, String> {
    let (tx, rx) = mpsc::channel();
    lock(&session.pulls).insert(hash, tx);
    let asked = session
        .writer
        .send(Header::new(Kind::NeedModule, 0, 0, 0), &messages::encode(&messages::ModuleImage { hash }), &[])
        .map_err(|e| format!("asking the client for module {}: {e}", cache::hex(&hash)));
    let deadline = std::time::Instant::now() + PULL_WAIT;
    let image = asked.and_then(|()| {
        loop {
            match rx.recv_timeout(Duration::from_millis(500)) {
                Ok(image) => break Ok(image),
                Err(_) if session.closing.load(Ordering::SeqCst) => break Err("the session is closing".to_owned()),
                Err(_) if std::time::Instant::now() >= deadline => {
                    break Err(format!(
                        "the client did not send module {} within {} s",
                        cache::hex(&hash),
                        PULL_WAIT.as_secs()
                    ));
                }
                Err(_) => {}
            }
        }
    });
    lock(&session.pulls).remove(&hash);
    match image? {
        image if image.is_empty() => Err(format!("the client no longer has module {}", cache::hex(&hash))),
        image => Ok(image),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A service answer larger than a frame carries becomes an error for that request,
    /// not the end of the session; one that fits goes as it is.
    #[test]
    fn answers_too_large_for_a_frame_become_errors() {
        let read = |archive| {
            let f = Frame { header: Header::new(Kind::ServiceReply, 0, 0, 1), archive, bulk: Vec::new() };
            messages::decode::<ServiceReply>(&f, "service reply").expect("a well-formed reply")
        };
        assert_eq!(read(fitting(ServiceReply::Name("small".into()))), ServiceReply::Name("small".into()));
        let huge = ServiceReply::Name("x".repeat(frame::MAX_ARCHIVE as usize + 1));
        match read(fitting(huge)) {
            ServiceReply::Error { status: 2, message } => assert!(message.contains("more than one frame"), "{message}"),
            other => panic!("{other:?}"),
        }
    }

    /// A record the library fills is as large as any release makes it, whatever the
    /// client's headers say (cuSPARSELt 0.6's are 13,072 bytes, 0.7's 1024, 0.8's 512).
    #[test]
    fn records_the_library_fills_fit_every_release() {
        use chidori_cuda::handles::kind::cusparseLtMatDescriptor_t as MAT;
        // cuSPARSELt 0.6 (CUDA 12.6's wheel) made 13,072-byte records.
        assert_eq!(record_bytes(MAT, 512), 13072);
        assert_eq!(record_bytes(MAT, 20000), 20000);
        assert_eq!(record_bytes(HandleKind::MAX, 24), 24, "an unknown kind keeps the client's size");
    }

    /// A record translated between CUDA versions keeps its anonymous union: CUDA 13.1's
    /// CUdevResource (a chain pointer added, the union shorter) asked of a 13.0 driver
    /// still carries the SM count (the green-context program on the H100 read 0 SMs when
    /// the union was missing from the struct maps).
    #[test]
    fn anonymous_members_survive_translation_between_versions() {
        let server = structs::get("13.0", "CUdevResource_st").expect("13.0 map");
        let client = structs::get("13.1", "CUdevResource_st").expect("13.1 map");
        assert_ne!(server, client);
        let mut from = vec![0u8; server.size as usize];
        from[..4].copy_from_slice(&1u32.to_le_bytes()); // CU_DEV_RESOURCE_TYPE_SM
        from[96..100].copy_from_slice(&132u32.to_le_bytes()); // sm.smCount
        from[100..104].copy_from_slice(&8u32.to_le_bytes()); // sm.minSmPartitionSize
        let mut to = vec![0xffu8; client.size as usize];
        translate(server, client, &from, &mut to);
        let word = |b: &[u8], at: usize| u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"));
        assert_eq!((word(&to, 0), word(&to, 96), word(&to, 100)), (1, 132, 8));
        // The chain pointer 13.0 does not have is NULL.
        assert_eq!(&to[136..144], &[0u8; 8]);
        let mut back = vec![0u8; server.size as usize];
        translate(client, server, &to, &mut back);
        assert_eq!(word(&back, 96), 132);
        // An array (cuDevSmResourceSplitByCount's groups): every record, not the first only.
        let size = server.size as usize;
        let mut groups = vec![0u8; 3 * size];
        for g in 0..3 {
            groups[g * size..g * size + 4].copy_from_slice(&1u32.to_le_bytes());
            groups[g * size + 96..g * size + 100].copy_from_slice(&(16 + g as u32).to_le_bytes());
        }
        let mut out = vec![0u8; records_in(groups.len(), server) * client.size as usize];
        translate_all(server, client, &groups, &mut out);
        let counts: Vec<u32> = (0..3).map(|g| word(&out, g * client.size as usize + 96)).collect();
        assert_eq!(counts, [16, 17, 18]);
        assert_eq!(records_in(0, server), 1, "a record is always made");
    }

    #[test]
    fn the_check_tables_are_sorted_for_their_binary_search() {
        use chidori_cuda::checks::{FIXED, PARAMS, SAME, fixed, params, same};
        assert!(PARAMS.windows(2).all(|w| w[0].0 <= w[1].0));
        assert!(FIXED.windows(2).all(|w| w[0].0 <= w[1].0));
        assert!(SAME.windows(2).all(|w| w[0].0 <= w[1].0));
        // Every entry is found by its lookup, and a name no table has finds nothing.
        for (f, i, values) in PARAMS {
            assert!(params(f).any(|(j, v)| j == *i && v == *values), "{f}");
        }
        for (f, form, i, value) in FIXED {
            assert!(fixed(f, *form).any(|(j, v)| j == *i && v == *value), "{f}");
        }
        for (f, form, i, other) in SAME {
            assert!(same(f, *form).any(|(j, o)| j == *i && o == *other), "{f}");
        }
        assert_eq!(params("cudaNoSuchFunction").count(), 0);
    }

    #[test]
    fn frames_of_different_threads_run_in_issue_order() {
        let turn = Arc::new(Turn::default());
        let log = Arc::new(Mutex::new(Vec::new()));
        // Frame 1 (a second client thread) is ready first; it must wait for frame 0.
        let t = {
            let (turn, log) = (turn.clone(), log.clone());
            std::thread::spawn(move || {
                turn.wait(1);
                lock(&log).push(1);
                turn.release(1);
            })
        };
        std::thread::sleep(Duration::from_millis(50));
        assert!(lock(&log).is_empty(), "frame 1 ran before frame 0");
        turn.wait(0);
        lock(&log).push(0);
        turn.release(0);
        t.join().unwrap();
        assert_eq!(*lock(&log), vec![0, 1]);
    }

    #[test]
    fn batches_end_where_the_buffer_holds_no_whole_frame() {
        let frame = frame::to_vec(Header::new(Kind::Call, 3, 1, 7), &[0u8; 16], &[&[1u8; 5]]).unwrap();
        assert!(whole_frame(&frame));
        assert!(!whole_frame(&frame[..frame.len() - 1]), "the bulk is still missing a byte");
        assert!(!whole_frame(&frame[..frame::HEADER_LEN - 1]), "half a header");
        assert!(!whole_frame(&[]));
        let mut two = frame.clone();
        two.extend_from_slice(&frame[..10]);
        assert!(whole_frame(&two), "a whole frame first, then a partial one");
        assert!(whole_frame(&[0xffu8; frame::HEADER_LEN]), "garbage is read (and refused) at once, not waited on");
    }

    #[test]
    fn host_value_records_become_pointers_to_kept_values() {
        use chidori_protocol::messages::{HOST_VALUE_FLAG, HOST_VALUE_RECORD};
        let mut records = vec![0u8; 2 * HOST_VALUE_RECORD];
        records[..8].copy_from_slice(&0x7f00_0000_1000u64.to_le_bytes());
        records[HOST_VALUE_RECORD + 8..HOST_VALUE_RECORD + 16].copy_from_slice(&HOST_VALUE_FLAG.to_le_bytes());
        records[HOST_VALUE_RECORD + 16..HOST_VALUE_RECORD + 20].copy_from_slice(&0.125f32.to_le_bytes());
        let (pointers, values) = host_value_pointers(&records).unwrap();
        assert_eq!(pointers[0], 0x7f00_0000_1000, "a device address passes as it is");
        assert_eq!(pointers[1], values.as_ptr().wrapping_add(1) as u64, "a host scalar points at its kept copy");
        // SAFETY: the address of the second kept value (alive in `values`).
        assert_eq!(unsafe { *(pointers[1] as *const f32) }, 0.125);
        assert!(host_value_pointers(&records[..HOST_VALUE_RECORD + 1]).is_none(), "a torn record");
    }

    /// A session the client closes returns only when no executor runs a call (the worker's
    /// exit then runs the libraries' teardown alone): frames still queued are skipped.
    #[test]
    fn a_closed_session_returns_once_no_executor_runs() {
        use chidori_protocol::desc::Form;
        let harness = crate::fuzz::emulated_harness();
        let desc = VARIANTS.iter().rev().find(|d| d.name == "cudaMalloc" && d.form == Some(Form::Call)).unwrap();
        let mut bytes = Vec::new();
        for seq in 0..300u64 {
            // Three client threads, interleaved: three executors.
            let header = Header::new(Kind::Call, desc.wire, 1 + (seq % 3) as u32, seq + 1);
            let call = Call { args: vec![0, 4096], lens: vec![8, 0] };
            bytes.extend(frame::to_vec(header, &messages::encode(&call), &[]).unwrap());
        }
        let bye = Goodbye { reason: String::new() };
        bytes.extend(frame::to_vec(Header::new(Kind::Goodbye, 0, 0, 0), &messages::encode(&bye), &[]).unwrap());
        let session = harness.session.clone();
        let reader = Resumable::plain(Box::new(std::io::Cursor::new(bytes)), session.writer.clone());
        serve(&session, &mut std::io::BufReader::new(reader), Duration::from_secs(2)).unwrap();
        assert!(session.closing.load(Ordering::SeqCst));
        assert_eq!(Arc::strong_count(&session), 2, "the harness's and this test's: no executor holds the session");
    }
}
