//! The connection to `chidori serve`: made lazily on the first call that needs the server,
//! once per process (a forked child makes its own). A frame whose caller waits for the reply
//! is written by the calling thread, under one lock, in one vectored write; frames nobody
//! waits for (asynchronous calls, launches) are copied into an outbox that a flusher thread
//! writes out, so a burst of them costs one system call instead of one each (the outbox is
//! written before any later waiting frame, so the order on the wire is the issue order). One mio
//! I/O thread reads, delivers replies (writing outputs into the caller's memory), runs the
//! heartbeat, and answers the server's pings and host-callback requests.
//!
//! With a token (`CHIDORI_TOKEN`, `CHIDORI_TOKEN_FILE`) the connection is TLS
//! (`chidori_tls::Secure`): writers encrypt under their usual lock, the I/O thread decrypts;
//! without one the plain path is what it always was.
//!
//! A resumable session ([`chidori_protocol::resume`]; on by default for a server that is not
//! on loopback, `CHIDORI_RESUME`) keeps every byte written until the server acknowledges
//! it. When the connection breaks, writers only keep what they write, and the I/O thread
//! connects again (for the grace period), presents the session's secret, and sends what the
//! server missed; the program sees a pause. The I/O thread never waits for the write lock:
//! its Pongs and acknowledgements go out with the next frame when a writer holds it.

use std::collections::HashMap;
use std::io::{IoSlice, Read};
use std::net::{TcpStream, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use chidori_protocol::frame::{self, Frame, FrameError, HEADER_LEN, Header, Kind};
use chidori_protocol::messages::{
    self, AsyncError, COMPRESSED_FLAG, Goodbye, Hello, HostCallback, Progress, Refuse, Reply, ResumeRequest, Service,
    ServiceReply, Welcome,
};
use chidori_protocol::read::Incremental;
use chidori_protocol::resume::{ACK_EVERY, Replay};
use chidori_protocol::{PROTOCOL_VERSION, env};

/// Where a reply's output bytes go: the caller's memory.
#[derive(Clone, Copy)]
pub struct OutTarget {
    pub param: usize,
    pub ptr: usize,
    pub len: usize,
}

/// The outcome of a call: the raw return value, or why there is none.
pub type Outcome = Result<u64, String>;

/// The round trip from which a connection counts as a WAN, unless the program says
/// otherwise: large copies go compressed (one core compresses faster than a WAN carries; a
/// LAN's link may be faster than the compressor) and cuDNN finalizes are answered as before
/// (each waited one costs a round trip; on loopback following descriptors saves nothing).
pub const WAN_RTT: Duration = Duration::from_millis(2);

pub struct Slot {
    done: Mutex<Option<Outcome>>,
    ready: Condvar,
    /// The answer to a service request.
    service: Mutex<Option<ServiceReply>>,
    /// Bytes the reply's bulk section carried (compressed outputs as they crossed the wire).
    received: AtomicU64,
}

impl Slot {
    fn new() -> Arc<Slot> {
        Arc::new(Slot {
            done: Mutex::new(None),
            ready: Condvar::new(),
            service: Mutex::new(None),
            received: AtomicU64::new(0),
        })
    }

    /// The service reply that completed this slot (after [`Slot::wait`]).
    fn service_reply(&self) -> Result<ServiceReply, String> {
        let reply = self.service.lock().unwrap_or_else(|p| p.into_inner()).take();
        reply.ok_or_else(|| "the server's answer was not a service reply".to_owned())
    }

    /// Bytes the reply's bulk section carried, once it came.
    pub fn received(&self) -> u64 {
        self.received.load(Ordering::Relaxed)
    }

    fn complete(&self, outcome: Outcome) {
        let mut d = self.done.lock().unwrap_or_else(|p| p.into_inner());
        *d = Some(outcome);
        self.ready.notify_all();
    }

    /// Whether the reply has come, waiting for it at most `timeout` (the outcome stays for
    /// [`Slot::wait`]).
    pub fn ready_within(&self, timeout: Duration) -> bool {
        let d = self.done.lock().unwrap_or_else(|p| p.into_inner());
        if d.is_some() {
            return true;
        }
        let (d, _) = self.ready.wait_timeout(d, timeout).unwrap_or_else(|p| p.into_inner());
        d.is_some()
    }

    /// Wait for the reply; spins briefly first, since loopback replies come within tens of µs.
    pub fn wait(&self) -> Outcome {
        let start = Instant::now();
        loop {
            if let Ok(mut d) = self.done.try_lock()
                && let Some(o) = d.take()
            {
                return o;
            }
            if start.elapsed() > Duration::from_micros(50) {
                break;
            }
            std::hint::spin_loop();
        }
        let mut d = self.done.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(o) = d.take() {
                return o;
            }
            d = self.ready.wait(d).unwrap_or_else(|p| p.into_inner());
        }
    }
}

struct Pending {
    slot: Arc<Slot>,
    outs: Vec<OutTarget>,
}

/// A service request sent ahead ([`Conn::ask_ahead`]), its answer still to take.
pub struct Asked {
    slot: Arc<Slot>,
}

impl Asked {
    /// Whether the answer has come (taking it then waits for nothing).
    pub fn came(&self) -> bool {
        self.slot.ready_within(Duration::ZERO)
    }

    /// The answer, waited for where it has not come.
    pub fn answer(self) -> Result<ServiceReply, String> {
        self.slot.wait()?;
        self.slot.service_reply()
    }
}

/// Where a long request's Progress frames go: (steps done, output bytes).
pub type ProgressSender = std::sync::mpsc::Sender<(u32, Vec<u8>)>;

/// A host callback of the program, run with the stream's status. A callback captured into
/// a graph runs once per replay.
pub type CallbackFn = Arc<dyn Fn(i64) + Send + Sync>;

/// A host callback the server asks for.
type CallbackRun = HostCallback;

pub struct Conn {
    pub server: String,
    pub welcome: Welcome,
    pub profile: crate::state::Profile,
    /// The fork generation the connection was made in (a forked child makes its own).
    forks: u64,
    writer: Mutex<Link>,
    /// The TLS reading half used during the handshake, for the I/O thread to continue with
    /// (it may hold bytes that came after the Welcome).
    secure_reader: Mutex<Option<chidori_tls::SecureReader<TcpStream>>>,
    /// The connection is up: while it is not (a resumable session reconnecting), writes are
    /// only kept.
    up: AtomicBool,
    /// A second handle on the current socket: shutting it down wakes a reader or writer
    /// blocked on a dead connection.
    breaker: Mutex<Option<TcpStream>>,
    /// Frames without archive (Pong, Ack) the I/O thread could not write at once: the next
    /// writer sends them.
    control: Mutex<Vec<[u8; HEADER_LEN]>>,
    /// What a resumable session needs to reconnect (None: it ends with its connection).
    resume: Option<Resume>,
    /// The program is exiting and said goodbye: the end of the connection is expected.
    closing: AtomicBool,
    /// Frames sent without waiting, not yet written (lock order: `writer`, then `outbox`).
    outbox: Mutex<Outbox>,
    /// Wakes the flusher thread when the outbox fills while it sleeps.
    flush_wanted: Condvar,
    pending: Mutex<HashMap<u64, Pending>>,
    /// Where Progress frames of a running request go, by its sequence number.
    progress: Mutex<HashMap<u64, ProgressSender>>,
    next_seq: AtomicU64,
    broken: OnceLock<String>,
    /// Reports the broken connection, once, before `broken` is set: a call that fails
    /// because of it may end the process at once, and the reason must be on stderr by then.
    report: std::sync::Once,
    /// Deferred statuses of failed asynchronous calls, per library, reported by the next
    /// synchronizing call of that library.
    deferred: Mutex<Vec<(&'static str, i64)>>,
    callbacks: Mutex<HashMap<u64, CallbackFn>>,
    next_callback: AtomicU64,
    /// Callbacks enqueued and not yet run: a copy from host memory enqueued after one must
    /// read the memory after the callback ran, as the GPU would.
    unrun: Mutex<HashMap<u64, u64>>,
    ran: Condvar,
    callback_queue: Mutex<std::sync::mpsc::Sender<CallbackRun>>,
    last_heard: Mutex<Instant>,
    /// When the probe of the round trip was sent, and the round trip it measured (µs; 0:
    /// not yet known).
    probe_sent: Mutex<Option<Instant>>,
    rtt_us: AtomicU64,
    /// Further connections for large copies ([`crate::lanes`]), opened on first use.
    pub(crate) lanes: crate::lanes::Slot,
    /// The token this session presented, for its further connections (a reconnection, a
    /// bulk lane); None without TLS.
    pub(crate) token: Option<String>,
}

/// The socket frames are written to, replaced when a resumable session reconnects.
struct Link {
    stream: TcpStream,
    /// TLS over the socket (None: plain TCP).
    secure: Option<Arc<chidori_tls::Secure>>,
    /// In a resumable session, what was written and not yet acknowledged.
    replay: Option<Replay>,
}

/// A resumable session's identity and what reconnecting needs.
struct Resume {
    session: u64,
    secret: Vec<u8>,
    grace: Duration,
    /// The stream offset the server acknowledged.
    peer_acked: AtomicU64,
}

/// Whether to ask for a session that survives a dropped connection: CHIDORI_RESUME, else
/// yes unless the server is on a loopback address.
fn wants_resume(addr: &std::net::SocketAddr) -> bool {
    switch(env::RESUME, addr)
}

/// An on/off setting from the environment, by default on except for a loopback server.
fn switch(name: &str, addr: &std::net::SocketAddr) -> bool {
    match std::env::var(name).ok().as_deref().map(str::trim) {
        Some("1") | Some("yes") | Some("on") | Some("true") => true,
        Some("0") | Some("no") | Some("off") | Some("false") => false,
        _ => !addr.ip().is_loopback(),
    }
}

#[derive(Default)]
struct Outbox {
    bytes: Vec<u8>,
    /// An emptied buffer to reuse (its capacity stays).
    spare: Vec<u8>,
    /// The flusher was told there is work (posting threads need not wake it again).
    awake: bool,
}

/// A frame with more bulk bytes than this is written straight from the caller's buffers
/// rather than copied into the outbox.
const OUTBOX_FRAME_MAX: usize = 64 << 10;

/// Queued bytes beyond which a posting thread writes the outbox itself.
const OUTBOX_LIMIT: usize = 8 << 20;

thread_local! {
    // A const Cell has no destructor, so it stays readable while the process exits
    // (library destructors, such as torch's handle pools, still make calls then).
    static THREAD: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

fn next_thread_id() -> u32 {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// The calling thread's id on the wire (the server runs its calls on one executor).
pub fn thread_id() -> u32 {
    THREAD
        .try_with(|t| {
            if t.get() == 0 {
                t.set(next_thread_id());
            }
            t.get()
        })
        .unwrap_or_else(|_| next_thread_id())
}

static CONN: Mutex<Option<Result<Arc<Conn>, String>>> = Mutex::new(None);

/// Forks this process has been through: bumped in the child, so a connection compares a
/// number instead of asking the kernel for its pid on every call.
static FORKS: AtomicU64 = AtomicU64::new(0);

/// How many forks this process has been through (state kept per process, such as what a
/// thread's executor on the server holds, is stale where it was noted under another count).
pub fn forks() -> u64 {
    FORKS.load(Ordering::Relaxed)
}

fn count_forks() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    extern "C" fn in_child() {
        FORKS.fetch_add(1, Ordering::Relaxed);
    }
    // SAFETY: registers a child handler that only bumps an atomic (async-signal-safe).
    ONCE.call_once(|| unsafe {
        libc::pthread_atfork(None, None, Some(in_child));
    });
}

/// What a layer above asks of every new connection before the program's first call goes
/// (questions every program asks once, sent ahead: `crate::custom::connected`). It runs
/// with the process's connection being made: it must not ask for it ([`get`]).
static CONNECTED: OnceLock<fn(&Conn)> = OnceLock::new();

/// Set the hook every new connection runs ([`CONNECTED`]); the first one set stays.
pub fn on_connect(hook: fn(&Conn)) {
    let _ = CONNECTED.set(hook);
}

/// The process's connection, made on first use. Err: why there is none (logged once).
pub fn get() -> Result<Arc<Conn>, String> {
    crate::log::init();
    count_forks();
    let mut slot = CONN.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(existing) = slot.as_ref() {
        match existing {
            // A forked child must not write into its parent's connection.
            Ok(c) if c.forks != FORKS.load(Ordering::Relaxed) => {}
            other => return other.clone(),
        }
    }
    let made = connect().map(Arc::new);
    if let Err(e) = &made {
        tracing::error!("{e}");
    }
    if let Ok(c) = &made {
        start_io_thread(c.clone());
        start_flusher(c.clone());
        c.probe_round_trip();
        if let Some(hook) = CONNECTED.get() {
            hook(c);
        }
        register_exit_flush();
        crate::trace::register_exit_report();
    }
    *slot = Some(made.clone());
    made
}

/// The connection if one was already made (no connecting), for cheap checks.
pub fn existing() -> Option<Arc<Conn>> {
    CONN.lock().ok()?.as_ref()?.as_ref().ok().cloned()
}

fn server_address() -> Result<String, String> {
    let server = std::env::var(env::SERVER).map_err(|_| {
        format!("no Chidori server configured ({} is unset): run the program with `chidori run -s HOST`", env::SERVER)
    })?;
    Ok(if server.rsplit_once(':').is_some_and(|(_, p)| p.parse::<u16>().is_ok()) {
        server
    } else {
        format!("{server}:{}", env::DEFAULT_PORT)
    })
}

fn heartbeat() -> Duration {
    let secs = std::env::var(env::HEARTBEAT_SECS).ok().and_then(|s| s.parse().ok()).unwrap_or(5u64);
    Duration::from_secs(secs.max(1))
}

/// Open a TCP connection to `server` (the first of its addresses that answers).
fn dial(server: &str) -> Result<TcpStream, String> {
    let addrs: Vec<_> =
        server.to_socket_addrs().map_err(|e| format!("cannot resolve Chidori server {server}: {e}"))?.collect();
    let mut last = None;
    for a in addrs {
        match TcpStream::connect_timeout(&a, Duration::from_secs(5)) {
            Ok(s) => {
                s.set_nodelay(true).ok();
                return Ok(s);
            }
            Err(e) => last = Some(e),
        }
    }
    Err(format!(
        "cannot reach Chidori server {server}: {} (is `chidori serve` running there, and the port open?)",
        last.map(|e| e.to_string()).unwrap_or_else(|| "no address".into())
    ))
}

/// TLS over `stream` when there is a token: the connection and its reading half.
pub(crate) type Tls = (Arc<chidori_tls::Secure>, chidori_tls::SecureReader<TcpStream>);

fn start_tls(stream: &mut TcpStream, server: &str) -> Result<Tls, String> {
    let pins = chidori_tls::pin::Pins::from_env()?;
    match chidori_tls::client_handshake(stream, server, &pins) {
        Ok(s) => {
            let reader = s.reader(stream.try_clone().map_err(|e| e.to_string())?);
            Ok((s, reader))
        }
        Err(chidori_tls::HandshakeError::Refused(frame)) => {
            let refuse: Refuse =
                messages::decode(&frame, "refusal").map_err(|e| format!("Chidori server {server}: {e}"))?;
            Err(format!("Chidori server {server} refused the session: {}", refuse.message))
        }
        Err(chidori_tls::HandshakeError::Pin(mismatch)) => Err(mismatch.to_string()),
        Err(e) => Err(format!("Chidori server {server}: {e}")),
    }
}

/// Write one whole frame during a handshake (through TLS where there is TLS).
fn send_plain(stream: &TcpStream, tls: Option<&Tls>, bytes: &[u8]) -> std::io::Result<()> {
    match tls {
        Some((s, _)) => s.send(stream, &[IoSlice::new(bytes)]),
        None => chidori_protocol::sock::send_all(stream.as_raw_fd(), &mut [IoSlice::new(bytes)]),
    }
}

fn connect() -> Result<Conn, String> {
    let server = server_address()?;
    let mut stream = dial(&server)?;
    let resume_wanted = stream.peer_addr().map(|a| wants_resume(&a)).unwrap_or(false);
    let content_wanted = stream.peer_addr().map(|a| switch(env::CONTENT, &a)).unwrap_or(false);
    let named = if content_wanted { crate::content::recorded(&server) } else { Vec::new() };
    stream.set_read_timeout(Some(Duration::from_secs(60))).ok();
    let token = chidori_tls::token::from_env()?;
    let mut tls = match token {
        Some(_) => Some(start_tls(&mut stream, &server)?),
        None => None,
    };
    let hello = Hello {
        protocol: PROTOCOL_VERSION,
        schema: chidori_cuda::calls::SCHEMA_HASH,
        client_version: env!("CARGO_PKG_VERSION").to_owned(),
        pid: std::process::id(),
        host: hostname(),
        program: std::env::args().collect::<Vec<_>>().join(" "),
        token: token.clone().unwrap_or_default(),
        resume: resume_wanted,
        content: content_wanted.then(|| named.clone()),
        visible_devices: std::env::var("CUDA_VISIBLE_DEVICES").ok(),
    };
    let bytes =
        frame::to_vec(Header::new(Kind::Hello, 0, 0, 0), &messages::encode(&hello), &[]).map_err(|e| e.to_string())?;
    send_plain(&stream, tls.as_ref(), &bytes).map_err(|e| format!("Chidori server {server}: {e}"))?;
    let answer = match tls.as_mut() {
        Some((_, r)) => read_blocking(r),
        None => read_blocking(&mut &stream),
    };
    let frame = answer.map_err(|e| match e {
        FrameError::Version { got } => format!(
            "Chidori server {server} speaks protocol {got}, this client {PROTOCOL_VERSION}: install the same Chidori release on both machines"
        ),
        other => format!("Chidori server {server}: {other}"),
    })?;
    let welcome: Welcome = match frame.header.kind {
        Kind::Welcome => messages::decode(&frame, "welcome").map_err(|e| format!("Chidori server {server}: {e}"))?,
        Kind::Refuse => {
            let refuse: Refuse =
                messages::decode(&frame, "refusal").map_err(|e| format!("Chidori server {server}: {e}"))?;
            return Err(format!("Chidori server {server} refused the session: {}", refuse.message));
        }
        other => return Err(format!("Chidori server {server} answered {other:?} to hello")),
    };
    if welcome.devices.is_empty() {
        return Err(format!("Chidori server {server} has no GPU"));
    }
    if content_wanted {
        crate::content::start(&server, &named, &welcome.content_kept, welcome.content_budget);
    }
    let resume = (!welcome.resume_secret.is_empty()).then(|| Resume {
        session: welcome.session,
        secret: welcome.resume_secret.clone(),
        grace: chidori_protocol::resume::grace(),
        peer_acked: AtomicU64::new(0),
    });
    tracing::info!(
        "connected to Chidori server {server} ({} backend, {}, driver {}{})",
        welcome.backend,
        welcome.devices.iter().map(|d| d.name.as_str()).collect::<Vec<_>>().join(", "),
        welcome.driver_version,
        if resume.is_some() { "; the session survives a dropped connection" } else { "" }
    );
    stream.set_read_timeout(None).ok();
    stream.set_nonblocking(true).map_err(|e| e.to_string())?;
    let (tx, rx) = std::sync::mpsc::channel();
    let (secure, secure_reader) = match tls {
        Some((s, r)) => (Some(s), Some(r)),
        None => (None, None),
    };
    let breaker = stream.try_clone().ok();
    let conn = Conn {
        server,
        profile: crate::state::Profile::from_welcome(&welcome),
        welcome,
        forks: FORKS.load(Ordering::Relaxed),
        writer: Mutex::new(Link { stream, secure, replay: resume.as_ref().map(|_| Replay::default()) }),
        secure_reader: Mutex::new(secure_reader),
        up: AtomicBool::new(true),
        breaker: Mutex::new(breaker),
        control: Mutex::new(Vec::new()),
        resume,
        closing: AtomicBool::new(false),
        outbox: Mutex::new(Outbox::default()),
        flush_wanted: Condvar::new(),
        pending: Mutex::new(HashMap::new()),
        progress: Mutex::new(HashMap::new()),
        next_seq: AtomicU64::new(1),
        broken: OnceLock::new(),
        report: std::sync::Once::new(),
        deferred: Mutex::new(Vec::new()),
        callbacks: Mutex::new(HashMap::new()),
        next_callback: AtomicU64::new(1),
        unrun: Mutex::new(HashMap::new()),
        ran: Condvar::new(),
        callback_queue: Mutex::new(tx),
        last_heard: Mutex::new(Instant::now()),
        probe_sent: Mutex::new(None),
        rtt_us: AtomicU64::new(0),
        lanes: Default::default(),
        token,
    };
    start_callback_thread(rx);
    Ok(conn)
}

/// Why a reconnection did not work: worth another try, or never (the session is gone).
pub(crate) enum Retry {
    Again(String),
    Never(String),
}

/// One attempt to reconnect a resumable session: a new connection, the plaintext
/// preamble naming the session, TLS where there is a token, the request with the secret
/// and the bytes received. Returns the connection, its TLS, and the bytes the server
/// received.
fn reconnect_once(conn: &Conn, resume: &Resume, received: u64) -> Result<(TcpStream, Option<Tls>, u64), Retry> {
    let server = &conn.server;
    let request = ResumeRequest {
        token: conn.token.clone().unwrap_or_default(),
        secret: resume.secret.clone(),
        received,
        lane: 0,
    };
    let (stream, tls, received) = join(server, resume.session, &request)?;
    stream.set_nonblocking(true).map_err(|e| Retry::Again(e.to_string()))?;
    Ok((stream, tls, received))
}

/// A further connection to session `session` (a reconnection, or a bulk lane): the
/// plaintext preamble naming the session, TLS where the request has a token, the request;
/// the server's answer is Resumed. Returns the connection (blocking), its TLS, and the bytes
/// the server says it received.
pub(crate) fn join(
    server: &str,
    session: u64,
    request: &ResumeRequest,
) -> Result<(TcpStream, Option<Tls>, u64), Retry> {
    let mut stream = dial(server).map_err(Retry::Again)?;
    stream.set_read_timeout(Some(Duration::from_secs(10))).ok();
    stream.set_write_timeout(Some(Duration::from_secs(10))).ok();
    let preamble = Header::new(Kind::Resume, 0, 0, session).encode();
    chidori_protocol::sock::send_all(stream.as_raw_fd(), &mut [IoSlice::new(&preamble)])
        .map_err(|e| Retry::Again(e.to_string()))?;
    let mut tls = match request.token.is_empty() {
        // A refusal before TLS (the session is gone) is final.
        false => Some(
            start_tls(&mut stream, server)
                .map_err(|e| if e.contains("refused the session") { Retry::Never(e) } else { Retry::Again(e) })?,
        ),
        true => None,
    };
    let bytes = frame::to_vec(Header::new(Kind::Resume, 0, 0, session), &messages::encode(request), &[])
        .map_err(|e| Retry::Never(e.to_string()))?;
    send_plain(&stream, tls.as_ref(), &bytes).map_err(|e| Retry::Again(e.to_string()))?;
    let answer = match tls.as_mut() {
        Some((_, r)) => read_blocking(r),
        None => read_blocking(&mut &stream),
    };
    let frame = answer.map_err(|e| Retry::Again(e.to_string()))?;
    match frame.header.kind {
        Kind::Resumed => {}
        Kind::Refuse => {
            let refuse: Refuse = messages::decode(&frame, "refusal").map_err(|e| Retry::Never(e.to_string()))?;
            return Err(Retry::Never(format!(
                "Chidori server {server} refused to resume the session: {}",
                refuse.message
            )));
        }
        other => return Err(Retry::Never(format!("Chidori server {server} answered {other:?} to a resume request"))),
    }
    stream.set_read_timeout(None).ok();
    stream.set_write_timeout(None).ok();
    Ok((stream, tls, frame.header.seq))
}

fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: buf is writable for its length; gethostname NUL-terminates within it.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return "?".into();
    }
    let end = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// One whole frame, read into memory as it arrives (a header may claim more than comes).
fn read_blocking(r: &mut impl Read) -> Result<Frame, FrameError> {
    chidori_tls::read_plain_frame(r)
}

impl Conn {
    pub fn broken(&self) -> Option<&str> {
        self.broken.get().map(String::as_str)
    }

    fn fail(&self, reason: String) {
        self.report.call_once(|| {
            // After the goodbye at exit, the server closing is what was asked for.
            if !self.closing.load(Ordering::Acquire) {
                tracing::error!("{reason}; CUDA calls fail from now on");
            }
            let _ = self.broken.set(reason.clone());
        });
        let pending: Vec<Pending> =
            self.pending.lock().unwrap_or_else(|p| p.into_inner()).drain().map(|(_, p)| p).collect();
        for p in pending {
            p.slot.complete(Err(reason.clone()));
        }
    }

    /// Whether the session survives a dropped connection.
    pub fn is_resumable(&self) -> bool {
        self.resume.is_some()
    }

    /// Whether the connection is TLS.
    pub fn is_secure(&self) -> bool {
        self.writer.lock().unwrap_or_else(|p| p.into_inner()).secure.is_some()
    }

    /// A bulk lane broke or the server sent it nonsense: a frame of the session may be
    /// lost, so the session ends (unless the program is exiting and said goodbye).
    pub(crate) fn lane_lost(&self, reason: String) {
        if !self.closing.load(Ordering::Acquire) {
            self.fail(reason);
        }
    }

    /// End the session from the client's side (an answer it gave turned out wrong): every
    /// later call fails with `reason`, which is logged once.
    pub fn end_session(&self, reason: String) {
        self.fail(reason);
    }

    /// Measure the round trip once: a ping whose answer the I/O thread times.
    fn probe_round_trip(&self) {
        *self.probe_sent.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
        self.send_control(Header::new(Kind::Ping, 0, 0, RTT_PROBE));
    }

    /// The round trip the probe measured, once its answer came.
    pub fn round_trip(&self) -> Option<Duration> {
        let us = self.rtt_us.load(Ordering::Relaxed);
        (us > 0).then(|| Duration::from_micros(us))
    }

    /// Whether the probe measured a round trip of [`WAN_RTT`] or more (unknown: no).
    pub fn is_wan(&self) -> bool {
        self.round_trip().is_some_and(|rtt| rtt >= WAN_RTT)
    }

    /// [`Conn::is_wan`], waiting up to `limit` for the probe's answer where it has not come
    /// yet (a decision kept for the whole process, made at a program's first call).
    pub fn is_wan_waiting(&self, limit: Duration) -> bool {
        let until = Instant::now() + limit;
        while self.round_trip().is_none() && Instant::now() < until && self.broken().is_none() {
            std::thread::sleep(Duration::from_millis(1));
        }
        self.is_wan()
    }

    pub fn next_seq(&self) -> u64 {
        self.next_seq.fetch_add(1, Ordering::Relaxed)
    }

    /// How many messages this connection has sent (the next sequence number): unchanged
    /// means nothing reached the server in between.
    pub fn sent_so_far(&self) -> u64 {
        self.next_seq.load(Ordering::Relaxed)
    }

    /// Expect a reply to `seq`: the I/O thread writes its outputs to `outs` and completes
    /// the returned slot. Register before sending, so a fast reply finds it.
    pub fn expect(&self, seq: u64, outs: Vec<OutTarget>) -> Arc<Slot> {
        let slot = Slot::new();
        self.pending.lock().unwrap_or_else(|p| p.into_inner()).insert(seq, Pending { slot: slot.clone(), outs });
        if let Some(reason) = self.broken() {
            slot.complete(Err(reason.to_owned()));
        }
        slot
    }

    pub fn forget(&self, seq: u64) {
        self.pending.lock().unwrap_or_else(|p| p.into_inner()).remove(&seq);
    }

    /// Send one frame now: whatever the outbox holds, then the header, archive and bulk
    /// parts, in one vectored write where the socket takes it (waiting for room otherwise).
    /// For frames whose sender waits for the reply. Frames never interleave.
    pub fn send(&self, header: Header, archive: &[u8], bulk: &[&[u8]]) -> Result<(), String> {
        if let Some(reason) = self.broken() {
            return Err(reason.to_owned());
        }
        let total: usize = bulk.iter().map(|b| b.len()).sum();
        // A frame over the limits is this call's error, not the connection's.
        let head = frame::assemble(header, archive, total).map_err(|e| e.to_string())?;
        let mut link = self.writer.lock().unwrap_or_else(|p| p.into_inner());
        let queued = self.take_outbox();
        let mut slices = Vec::with_capacity(3 + bulk.len());
        slices.push(IoSlice::new(&queued));
        slices.push(IoSlice::new(&head));
        slices.push(IoSlice::new(archive));
        slices.extend(bulk.iter().map(|b| IoSlice::new(b)));
        let result = self.write_locked(&mut link, &mut slices);
        drop(link);
        self.return_spare(queued);
        self.send_control_queued();
        result.map_err(|e| self.lost(e))
    }

    /// Write a frame without archive or bulk (Pong, Ack) from the I/O thread, which must
    /// never wait for the write lock: now if no writer holds it, else by that writer.
    fn send_control(&self, header: Header) {
        let Ok(head) = frame::assemble(header, &[], 0) else { return };
        self.control.lock().unwrap_or_else(|p| p.into_inner()).push(head);
        if let Ok(link) = self.writer.try_lock() {
            self.write_control(link);
        }
    }

    /// Control frames the I/O thread queued while this thread wrote.
    fn send_control_queued(&self) {
        if self.control.lock().unwrap_or_else(|p| p.into_inner()).is_empty() {
            return;
        }
        self.write_control(self.writer.lock().unwrap_or_else(|p| p.into_inner()));
    }

    /// Write the queued control frames with the write lock held.
    fn write_control(&self, mut link: std::sync::MutexGuard<'_, Link>) {
        let heads = std::mem::take(&mut *self.control.lock().unwrap_or_else(|p| p.into_inner()));
        for head in heads {
            if let Err(e) = self.write_locked(&mut link, &mut [IoSlice::new(&head)]) {
                drop(link);
                self.lost(e);
                return;
            }
        }
    }

    /// Queue one frame nobody waits for: its bytes (the caller's host buffers included) are
    /// copied now, and the flusher writes them soon, together with whatever else is queued.
    pub fn post(&self, header: Header, archive: &[u8], bulk: &[&[u8]]) -> Result<(), String> {
        let total: usize = bulk.iter().map(|b| b.len()).sum();
        if total > OUTBOX_FRAME_MAX {
            return self.send(header, archive, bulk);
        }
        if let Some(reason) = self.broken() {
            return Err(reason.to_owned());
        }
        let head = frame::assemble(header, archive, total).map_err(|e| e.to_string())?;
        let mut outbox = self.outbox.lock().unwrap_or_else(|p| p.into_inner());
        outbox.bytes.extend_from_slice(&head);
        outbox.bytes.extend_from_slice(archive);
        for b in bulk {
            outbox.bytes.extend_from_slice(b);
        }
        if outbox.bytes.len() > OUTBOX_LIMIT {
            // The network is slower than the program: write on this thread, which waits
            // for the socket (what bounds the outbox).
            drop(outbox);
            return self.flush();
        }
        let wake = !outbox.awake;
        outbox.awake = true;
        drop(outbox);
        if wake {
            self.flush_wanted.notify_one();
        }
        Ok(())
    }

    /// The queued bytes, leaving the spare buffer in their place. Called under `writer`.
    fn take_outbox(&self) -> Vec<u8> {
        let mut outbox = self.outbox.lock().unwrap_or_else(|p| p.into_inner());
        let spare = std::mem::take(&mut outbox.spare);
        std::mem::replace(&mut outbox.bytes, spare)
    }

    fn return_spare(&self, mut buf: Vec<u8>) {
        // Keep a moderately sized buffer for reuse; a huge one goes back to the allocator.
        if buf.capacity() <= 4 * OUTBOX_FRAME_MAX {
            buf.clear();
            let mut outbox = self.outbox.lock().unwrap_or_else(|p| p.into_inner());
            if outbox.spare.capacity() < buf.capacity() {
                outbox.spare = buf;
            }
        }
    }

    /// Write the outbox (the flusher's work; also before the process exits).
    pub fn flush(&self) -> Result<(), String> {
        let mut link = self.writer.lock().unwrap_or_else(|p| p.into_inner());
        let queued = self.take_outbox();
        if queued.is_empty() {
            return Ok(());
        }
        let result = self.write_locked(&mut link, &mut [IoSlice::new(&queued)]);
        drop(link);
        self.return_spare(queued);
        self.send_control_queued();
        result.map_err(|e| self.lost(e))
    }

    /// Write under the `writer` lock: straight to the socket, or through TLS. In a
    /// resumable session the bytes are kept first, and a failed write only marks the
    /// connection down (the I/O thread reconnects and sends them again).
    fn write_locked(&self, link: &mut Link, slices: &mut [IoSlice<'_>]) -> std::io::Result<()> {
        let Link { stream, secure, replay } = link;
        let (stream, secure) = (&*stream, secure.as_deref());
        let write = |slices: &mut [IoSlice<'_>]| match secure {
            None => chidori_protocol::sock::send_all(stream.as_raw_fd(), slices),
            Some(secure) => secure.send(stream, slices),
        };
        let (Some(replay), Some(resume)) = (replay.as_mut(), self.resume.as_ref()) else { return write(slices) };
        replay.acked(resume.peer_acked.load(Ordering::Acquire));
        replay.record(slices);
        if self.up.load(Ordering::Acquire)
            && let Err(e) = write(slices)
        {
            tracing::warn!("writing to Chidori server {} failed ({e}): reconnecting", self.server);
            self.link_down();
        }
        Ok(())
    }

    /// The connection is broken: writes are kept only, and the I/O thread (blocked on the
    /// socket, or not) learns it.
    fn link_down(&self) {
        self.up.store(false, Ordering::Release);
        if let Some(sock) = self.breaker.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
            let _ = sock.shutdown(std::net::Shutdown::Both);
        }
    }

    /// Say goodbye to the server (at exit): a resumable session then ends at once instead
    /// of waiting for the client to come back.
    fn goodbye(&self) {
        if self.broken().is_none() {
            self.closing.store(true, Ordering::Release);
            let bye = Goodbye { reason: "the program exited".to_owned() };
            let _ = self.send(Header::new(Kind::Goodbye, 0, 0, 0), &messages::encode(&bye), &[]);
        }
    }

    fn lost(&self, e: std::io::Error) -> String {
        let reason = format!("lost the connection to Chidori server {}: {e}", self.server);
        self.fail(reason.clone());
        reason
    }

    /// A Chidori request (module loading, kernel metadata), answered on the calling
    /// thread's server executor in order with its calls.
    pub fn service(&self, request: &Service, bulk: &[&[u8]]) -> Result<ServiceReply, String> {
        self.request(request, bulk, true)?.answer()
    }

    /// A service request with a slot for its answer, written now (`now`: its sender waits)
    /// or queued in order with the calling thread's calls.
    fn request(&self, request: &Service, bulk: &[&[u8]], now: bool) -> Result<Asked, String> {
        let seq = self.next_seq();
        let slot = self.expect(seq, Vec::new());
        let header = Header::new(Kind::Service, 0, thread_id(), seq);
        let archive = messages::encode(request);
        let sent = if now { self.send(header, &archive, bulk) } else { self.post(header, &archive, bulk) };
        if let Err(e) = sent {
            self.forget(seq);
            return Err(e);
        }
        Ok(Asked { slot })
    }

    /// A request sent now, whose answer is taken later ([`Asked::answer`]): the next page
    /// of an answer asked for while the caller handles this one.
    pub fn ask_now(&self, request: &Service) -> Result<Asked, String> {
        self.request(request, &[], true)
    }

    /// A request queued now, in order with the calling thread's calls, whose answer is
    /// taken later ([`Asked::answer`]): a question asked ahead of the program's need.
    pub fn ask_ahead(&self, request: &Service) -> Result<Asked, String> {
        self.request(request, &[], false)
    }

    /// A request the server does not answer (a failure comes back as an AsyncError or ends
    /// the session), queued in order with the calling thread's calls; `bulk` its bulk section.
    pub fn post_service(&self, request: &Service, bulk: &[&[u8]]) -> Result<(), String> {
        let header = Header::new(Kind::Service, 0, thread_id(), self.next_seq());
        self.post(header, &messages::encode(request), bulk)
    }

    /// Several requests sent back to back, then every answer awaited: one round trip of
    /// latency for all. Each request's answer, in order.
    pub fn services(&self, requests: &[(Service, &[u8])]) -> Vec<Result<ServiceReply, String>> {
        self.services_then(requests, || {})
    }

    /// [`Conn::services`], running `then` once the requests are sent, before their answers
    /// are awaited.
    pub fn services_then(
        &self,
        requests: &[(Service, &[u8])],
        then: impl FnOnce(),
    ) -> Vec<Result<ServiceReply, String>> {
        let asked: Vec<_> = requests.iter().map(|(request, bulk)| self.request(request, &[bulk], true)).collect();
        then();
        asked.into_iter().map(|asked| asked?.answer()).collect()
    }

    /// Start a request that runs for a while on the server (a graph loop): its Progress
    /// frames go to `progress`; [`Conn::finish_service`] waits for the answer.
    pub fn start_service(&self, request: &Service, progress: ProgressSender) -> Result<(u64, Arc<Slot>), String> {
        let seq = self.next_seq();
        let slot = self.expect(seq, Vec::new());
        self.progress.lock().unwrap_or_else(|p| p.into_inner()).insert(seq, progress);
        let header = Header::new(Kind::Service, 0, thread_id(), seq);
        if let Err(e) = self.send(header, &messages::encode(request), &[]) {
            self.forget(seq);
            self.progress.lock().unwrap_or_else(|p| p.into_inner()).remove(&seq);
            return Err(e);
        }
        Ok((seq, slot))
    }

    /// The answer to a request from [`Conn::start_service`] (waits for it).
    pub fn finish_service(&self, seq: u64, slot: &Slot) -> Result<ServiceReply, String> {
        let outcome = slot.wait();
        self.progress.lock().unwrap_or_else(|p| p.into_inner()).remove(&seq);
        outcome?;
        slot.service_reply()
    }

    /// Send a kernel launch (fire-and-forget; a failure comes back as a deferred status).
    pub fn launch(&self, launch: &messages::Launch, params: &[u8]) -> Result<(), String> {
        let seq = self.next_seq();
        let header = Header::new(Kind::Launch, 0, thread_id(), seq);
        self.post(header, &messages::encode(launch), &[params])
    }

    pub fn defer_error(&self, library: &'static str, status: i64) {
        self.deferred.lock().unwrap_or_else(|p| p.into_inner()).push((library, status));
    }

    /// The first deferred status of `library`, removed.
    pub fn take_deferred(&self, library: &str) -> Option<i64> {
        let mut d = self.deferred.lock().unwrap_or_else(|p| p.into_inner());
        let i = d.iter().position(|(l, _)| *l == library)?;
        Some(d.remove(i).1)
    }

    /// Register a callback the server will ask to run, enqueued on `stream`; `captured`: a
    /// capture is active, so it runs at replays, not in the stream (nothing waits for it).
    pub fn register_callback(&self, f: CallbackFn, stream: u64, captured: bool) -> u64 {
        let id = self.next_callback.fetch_add(1, Ordering::Relaxed);
        self.callbacks.lock().unwrap_or_else(|p| p.into_inner()).insert(id, f);
        if !captured {
            self.unrun.lock().unwrap_or_else(|p| p.into_inner()).insert(id, stream);
        }
        id
    }

    pub fn drop_callback(&self, id: u64) {
        self.callbacks.lock().unwrap_or_else(|p| p.into_inner()).remove(&id);
        self.callback_ran(id);
    }

    fn callback_ran(&self, id: u64) {
        let mut unrun = self.unrun.lock().unwrap_or_else(|p| p.into_inner());
        if unrun.remove(&id).is_some() {
            self.ran.notify_all();
        }
    }

    /// Wait until the host callbacks enqueued so far on `stream` have run (all of them for
    /// the legacy default stream, which waits for the others), or the connection is lost:
    /// called before reading host memory for a copy, which such a callback may still write.
    pub fn wait_callbacks(&self, stream: u64) {
        let mut unrun = self.unrun.lock().unwrap_or_else(|p| p.into_inner());
        let blocks = |s: &u64| stream <= 1 || *s == stream || *s <= 1;
        while unrun.values().any(blocks) && self.broken.get().is_none() {
            unrun = self.ran.wait_timeout(unrun, Duration::from_millis(100)).unwrap_or_else(|p| p.into_inner()).0;
        }
    }
}

/// The sequence number of the ping that measures the round trip (the server echoes it).
const RTT_PROBE: u64 = u64::MAX - 1;

/// Work that runs when the program exits while its connection still stands, by name, in the
/// order registered: registered by the layers above the connection (the checks of answers
/// given from earlier sessions, what a process learned for the next ones).
static AT_EXIT: Mutex<Vec<(&'static str, ExitWork)>> = Mutex::new(Vec::new());

type ExitWork = fn();

/// Run `work` at the program's exit, after the queued frames went out and before the
/// goodbye; a name registered again is kept once.
pub fn at_exit(name: &'static str, work: ExitWork) {
    let mut w = AT_EXIT.lock().unwrap_or_else(|p| p.into_inner());
    if !w.iter().any(|(n, _)| *n == name) {
        w.push((name, work));
    }
}

/// Frames still queued when the program exits go out (the flusher may not run again).
fn register_exit_flush() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    extern "C" fn flush_at_exit() {
        let _ = std::panic::catch_unwind(|| {
            // Only this process's own connection: a forked child holds a copy of its
            // parent's outbox and socket, which it must not write.
            if let Some(conn) = existing().filter(|c| c.forks == FORKS.load(Ordering::Relaxed)) {
                let _ = conn.flush();
                let work: Vec<ExitWork> =
                    AT_EXIT.lock().unwrap_or_else(|p| p.into_inner()).iter().map(|w| w.1).collect();
                for w in work {
                    w();
                }
                conn.goodbye();
                crate::content::save();
            }
        });
    }
    // SAFETY: registers a function that takes no arguments and catches its own panics.
    ONCE.call_once(|| unsafe {
        libc::atexit(flush_at_exit);
    });
}

/// The flusher: writes the outbox whenever it holds frames, until the connection breaks.
fn start_flusher(conn: Arc<Conn>) {
    let spawned = std::thread::Builder::new().name("chidori-flush".into()).spawn(move || {
        loop {
            let mut outbox = conn.outbox.lock().unwrap_or_else(|p| p.into_inner());
            while outbox.bytes.is_empty() {
                if conn.broken().is_some() {
                    return;
                }
                outbox.awake = false;
                outbox =
                    conn.flush_wanted.wait_timeout(outbox, Duration::from_secs(1)).unwrap_or_else(|p| p.into_inner()).0;
            }
            drop(outbox);
            if conn.flush().is_err() {
                return;
            }
        }
    });
    if let Err(e) = spawned {
        tracing::error!("cannot start the Chidori flusher thread: {e}");
    }
}

fn start_io_thread(conn: Arc<Conn>) {
    let spawned = std::thread::Builder::new().name("chidori-io".into()).spawn(move || {
        if let Err(reason) = io_loop(&conn) {
            conn.fail(reason);
        }
    });
    if let Err(e) = spawned {
        tracing::error!("cannot start the Chidori I/O thread: {e}");
    }
}

const SOCKET: mio::Token = mio::Token(0);

/// Why reading stopped: the connection broke (a resumable session reconnects), or the
/// session is over.
enum Stop {
    Broken(String),
    Fatal(String),
}

/// The I/O thread: reads the server's frames; in a resumable session, replaces a broken
/// connection and goes on where it stopped (the decoder keeps a frame cut in the middle).
fn io_loop(conn: &Arc<Conn>) -> Result<(), String> {
    let mut decoder = Incremental::default();
    // With TLS the I/O thread reads through the handshake's reader (it decrypts).
    let mut tls_reader = conn.secure_reader.lock().unwrap_or_else(|p| p.into_inner()).take();
    let mut sock =
        conn.writer.lock().unwrap_or_else(|p| p.into_inner()).stream.try_clone().map_err(|e| e.to_string())?;
    let mut received = 0u64;
    let mut acked = 0u64;
    loop {
        let why = match read_link(conn, sock, tls_reader.as_mut(), &mut decoder, &mut received, &mut acked) {
            Stop::Fatal(reason) => return Err(reason),
            Stop::Broken(why) => why,
        };
        let resume = match conn.resume.as_ref() {
            Some(resume) if !conn.closing.load(Ordering::Acquire) => resume,
            _ => return Err(format!("lost the connection to Chidori server {}: {why}", conn.server)),
        };
        (sock, tls_reader) = reconnect(conn, resume, &why, received)?;
    }
}

/// Read frames from one connection until it breaks or the session ends.
fn read_link(
    conn: &Arc<Conn>,
    std_stream: TcpStream,
    mut tls_reader: Option<&mut chidori_tls::SecureReader<TcpStream>>,
    decoder: &mut Incremental,
    received: &mut u64,
    acked: &mut u64,
) -> Stop {
    let mut stream = mio::net::TcpStream::from_std(std_stream);
    let mut poll = match mio::Poll::new() {
        Ok(p) => p,
        Err(e) => return Stop::Fatal(e.to_string()),
    };
    if let Err(e) = poll.registry().register(&mut stream, SOCKET, mio::Interest::READABLE) {
        return Stop::Fatal(e.to_string());
    }
    let mut events = mio::Events::with_capacity(16);
    let mut plain_reader = &stream;
    let heartbeat = heartbeat();
    let mut pinged = 0;
    loop {
        if let Err(e) = poll.poll(&mut events, Some(heartbeat)) {
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Stop::Fatal(e.to_string());
        }
        if events.is_empty() {
            // Silence: ask whether the server is alive; three unanswered pings end it.
            let silent = conn.last_heard.lock().unwrap_or_else(|p| p.into_inner()).elapsed();
            if silent >= heartbeat {
                pinged += 1;
                if pinged > 3 {
                    let why = format!("no heartbeat for {} s", silent.as_secs());
                    if conn.resume.is_some() {
                        return Stop::Broken(why);
                    }
                    return Stop::Fatal(format!("Chidori server {} stopped answering ({why})", conn.server));
                }
                conn.send_control(Header::new(Kind::Ping, 0, 0, 0));
            }
            if conn.resume.is_some() && *received > *acked {
                *acked = *received;
                conn.send_control(Header::new(Kind::Ack, 0, 0, *received));
            }
            if let Some(reason) = conn.broken() {
                return Stop::Fatal(reason.to_owned());
            }
            continue;
        }
        loop {
            let source: &mut dyn Read = match tls_reader.as_mut() {
                Some(r) => *r,
                None => &mut plain_reader,
            };
            match decoder.fill(source) {
                Ok(Some(n)) => *received += n as u64,
                Ok(None) => break,
                Err(e) => return Stop::Broken(e.to_string()),
            }
            loop {
                let frame = match decoder.next_frame() {
                    Ok(Some(frame)) => frame,
                    Ok(None) => break,
                    Err(e) => return Stop::Fatal(format!("Chidori server {} sent a bad frame: {e}", conn.server)),
                };
                pinged = 0;
                *conn.last_heard.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
                if let Err(reason) = handle(conn, &frame) {
                    return Stop::Fatal(reason);
                }
            }
            if conn.resume.is_some() && *received - *acked >= ACK_EVERY {
                *acked = *received;
                conn.send_control(Header::new(Kind::Ack, 0, 0, *received));
            }
        }
    }
}

/// Connect again (for the grace period), then install the new connection: the server gets
/// what it missed on a thread of its own while this one goes back to reading.
fn reconnect(
    conn: &Arc<Conn>,
    resume: &Resume,
    why: &str,
    received: u64,
) -> Result<(TcpStream, Option<chidori_tls::SecureReader<TcpStream>>), String> {
    conn.link_down();
    let started = Instant::now();
    let deadline = started + resume.grace;
    tracing::warn!(
        "the connection to Chidori server {} broke ({why}): reconnecting for up to {} s",
        conn.server,
        resume.grace.as_secs()
    );
    let mut last = why.to_owned();
    let mut tries = 0u32;
    loop {
        if Instant::now() >= deadline {
            return Err(format!(
                "lost the connection to Chidori server {} and could not resume the session within {} s ({tries} tries): {last}",
                conn.server,
                resume.grace.as_secs()
            ));
        }
        tries += 1;
        match reconnect_once(conn, resume, received) {
            Ok((stream, tls, server_received)) => {
                let reader_sock = stream.try_clone().map_err(|e| e.to_string())?;
                let (secure, tls_reader) = match tls {
                    Some((s, r)) => (Some(s), Some(r)),
                    None => (None, None),
                };
                install(conn, stream, secure, server_received)?;
                *conn.last_heard.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
                tracing::warn!(
                    "resumed the session with Chidori server {} after {:.1} s",
                    conn.server,
                    started.elapsed().as_secs_f64()
                );
                return Ok((reader_sock, tls_reader));
            }
            Err(Retry::Never(reason)) => return Err(reason),
            Err(Retry::Again(e)) => {
                last = e;
                let pause = Duration::from_millis(200 * u64::from(tries.min(5)));
                std::thread::sleep(pause.min(deadline.saturating_duration_since(Instant::now())));
            }
        }
    }
}

/// Make `stream` the connection, and send the server every byte after `server_received`
/// from a thread of its own (holding the write lock, so later frames follow them).
fn install(
    conn: &Arc<Conn>,
    stream: TcpStream,
    secure: Option<Arc<chidori_tls::Secure>>,
    server_received: u64,
) -> Result<(), String> {
    let mut link = conn.writer.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(replay) = &link.replay {
        replay.since(server_received).map_err(|gap| format!("Chidori server {}: {gap}", conn.server))?;
    }
    *conn.breaker.lock().unwrap_or_else(|p| p.into_inner()) = stream.try_clone().ok();
    link.stream = stream;
    link.secure = secure;
    drop(link);
    let conn = conn.clone();
    let resend = move || {
        let mut link = conn.writer.lock().unwrap_or_else(|p| p.into_inner());
        let Link { stream, secure, replay } = &mut *link;
        let result = match replay.as_ref().map(|r| r.since(server_received)) {
            Some(Ok((a, b))) => {
                let mut slices = [IoSlice::new(a), IoSlice::new(b)];
                match secure {
                    None => chidori_protocol::sock::send_all(stream.as_raw_fd(), &mut slices),
                    Some(secure) => secure.send(&*stream, &slices),
                }
            }
            _ => Ok(()),
        };
        match result {
            Ok(()) => conn.up.store(true, Ordering::Release),
            Err(e) => {
                tracing::warn!("sending Chidori server {} what it missed failed: {e}", conn.server);
                drop(link);
                conn.link_down();
                return;
            }
        }
        drop(link);
        conn.send_control_queued();
    };
    std::thread::Builder::new()
        .name("chidori-resend".into())
        .spawn(resend)
        .map(|_| ())
        .map_err(|e| format!("cannot start a thread to resend what the server missed: {e}"))
}

/// Deliver a frame a bulk lane read (a reply) as the I/O thread would.
pub(crate) fn deliver(conn: &Arc<Conn>, frame: &Frame) -> Result<(), String> {
    handle(conn, frame)
}

fn handle(conn: &Arc<Conn>, frame: &Frame) -> Result<(), String> {
    match frame.header.kind {
        Kind::Reply => {
            let pending = conn.pending.lock().unwrap_or_else(|p| p.into_inner()).remove(&frame.header.seq);
            let Some(pending) = pending else {
                return Err(format!(
                    "Chidori server {} answered a call never made (seq {})",
                    conn.server, frame.header.seq
                ));
            };
            let reply = messages::access::<Reply>(frame, "reply").map_err(|e| e.to_string())?;
            let lens: Vec<u64> = reply.lens.iter().map(|l| l.to_native()).collect();
            // A compressed output's entry is its frame's byte count with the flag.
            let packed = |l: u64| l != messages::NULL_LEN && l & COMPRESSED_FLAG != 0;
            let parts = frame
                .split_bulk(lens.iter().map(|&l| if packed(l) { l & !COMPRESSED_FLAG } else { l }))
                .map_err(|e| e.to_string())?;
            for out in &pending.outs {
                let Some(bytes) = parts.get(out.param) else { continue };
                if lens.get(out.param).is_some_and(|&l| packed(l)) {
                    // SAFETY: as below; the frame expands into exactly these `len` bytes.
                    let dst = unsafe { std::slice::from_raw_parts_mut(out.ptr as *mut u8, out.len) };
                    chidori_protocol::pack::expand_into(bytes, dst).map_err(|e| {
                        format!("Chidori server {} sent a compressed output that is not valid: {e}", conn.server)
                    })?;
                    continue;
                }
                let n = bytes.len().min(out.len);
                // SAFETY: `ptr` is the caller's output buffer of `len` bytes; the caller is
                // blocked waiting for this reply (or, for deferred copies, promised not to
                // touch it before synchronizing).
                unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), out.ptr as *mut u8, n) };
            }
            if let Some(message) = reply.error.as_ref() {
                crate::log::once_owned(message.as_str(), || tracing::warn!("server: {message}"));
            }
            // Before the caller wakes: a failure may have invalidated a capture.
            if let Some(desc) = chidori_cuda::calls::VARIANTS.get(frame.header.call as usize)
                && desc.ret == chidori_protocol::desc::Ret::Status
                && reply.ret.to_native() != desc.codes.success as u64
            {
                crate::state::CLIENT.ahead.captures.failed();
            }
            pending.slot.received.store(frame.bulk.len() as u64, Ordering::Relaxed);
            pending.slot.complete(Ok(reply.ret.to_native()));
        }
        Kind::AsyncError => {
            let err: AsyncError = messages::decode(frame, "async error").map_err(|e| e.to_string())?;
            let library =
                chidori_cuda::calls::VARIANTS.get(frame.header.call as usize).map(|d| d.library).unwrap_or("cudart");
            // A call sent without waiting failed: its status reaches the program at the next
            // waiting call of the library; say which call it was, once per message.
            if let Some(m) = &err.message {
                crate::log::once_owned(m, || tracing::warn!("server, for a call sent without waiting: {m}"));
            }
            // What the client knew of captures goes first: a thread that takes the deferred
            // status must not find a capture's answer from before the failure.
            crate::state::CLIENT.ahead.captures.failed();
            conn.defer_error(library, err.status);
        }
        Kind::ServiceReply => {
            let pending = conn.pending.lock().unwrap_or_else(|p| p.into_inner()).remove(&frame.header.seq);
            let Some(pending) = pending else {
                return Err(format!(
                    "Chidori server {} answered a request never made (seq {})",
                    conn.server, frame.header.seq
                ));
            };
            let reply: ServiceReply = messages::decode(frame, "service reply").map_err(|e| e.to_string())?;
            *pending.slot.service.lock().unwrap_or_else(|p| p.into_inner()) = Some(reply);
            pending.slot.complete(Ok(0));
        }
        Kind::Progress => {
            let p: Progress = messages::decode(frame, "progress").map_err(|e| e.to_string())?;
            let progress = conn.progress.lock().unwrap_or_else(|p| p.into_inner());
            let Some(tx) = progress.get(&frame.header.seq) else {
                return Err(format!(
                    "Chidori server {} sent progress of a request never made (seq {})",
                    conn.server, frame.header.seq
                ));
            };
            // The receiver may have given up waiting; the request's answer still comes.
            let _ = tx.send((p.steps, frame.bulk.to_vec()));
        }
        Kind::Ping => conn.send_control(Header::new(Kind::Pong, 0, 0, frame.header.seq)),
        Kind::Pong if frame.header.seq == RTT_PROBE => {
            if let Some(sent) = conn.probe_sent.lock().unwrap_or_else(|p| p.into_inner()).take() {
                let us = u64::try_from(sent.elapsed().as_micros()).unwrap_or(u64::MAX).max(1);
                conn.rtt_us.store(us, Ordering::Relaxed);
            }
        }
        Kind::Pong => {}
        Kind::Ack => {
            if let Some(resume) = &conn.resume {
                resume.peer_acked.fetch_max(frame.header.seq, Ordering::AcqRel);
            }
        }
        Kind::HostCallback => {
            let cb: HostCallback = messages::decode(frame, "host callback").map_err(|e| e.to_string())?;
            let queue = conn.callback_queue.lock().unwrap_or_else(|p| p.into_inner());
            queue.send(cb).map_err(|_| "the callback thread is gone".to_owned())?;
        }
        Kind::Output => print_gpu_output(&frame.bulk),
        Kind::NeedModule => {
            let asked: messages::ModuleImage = messages::decode(frame, "module request").map_err(|e| e.to_string())?;
            // Off the I/O thread: the image is read from the program's memory and may be
            // large. The server handles it outside the call order; none: the client lacks it.
            let sent = std::thread::Builder::new().name("chidori-module".into()).spawn(move || {
                let Some(conn) = existing() else { return };
                let image = crate::modules::image_asked(&conn, &asked.hash).unwrap_or_default();
                let header = Header::new(Kind::ModuleImage, 0, 0, 0);
                if let Err(e) = conn.send(header, &messages::encode(&asked), &[&image]) {
                    tracing::warn!("sending a module the server asked for: {e}");
                }
            });
            if let Err(e) = sent {
                return Err(format!("cannot start a thread to send a module the server asked for: {e}"));
            }
        }
        Kind::Goodbye => {
            let bye: Goodbye = messages::decode(frame, "goodbye").map_err(|e| e.to_string())?;
            return Err(format!("Chidori server {} ended the session: {}", conn.server, bye.reason));
        }
        other => return Err(format!("unexpected {other:?} frame from the server")),
    }
    Ok(())
}

unsafe extern "C" {
    /// glibc's standard output stream.
    static mut stdout: *mut libc::FILE;
}

/// What the GPU printed goes to the program's standard output stream, where its own
/// `printf` output is buffered: in order with it, as the driver writes it natively.
fn print_gpu_output(bytes: &[u8]) {
    if bytes.is_empty() {
        return;
    }
    // SAFETY: the C library's stdout stream (locked by fwrite and fflush themselves), and
    // bytes of a live slice.
    unsafe {
        let out = stdout;
        if out.is_null() {
            return;
        }
        libc::fwrite(bytes.as_ptr().cast(), 1, bytes.len(), out);
        libc::fflush(out);
    }
}

/// Host callbacks run here, one at a time in arrival order (the order of their streams),
/// never on the I/O thread.
fn start_callback_thread(rx: std::sync::mpsc::Receiver<CallbackRun>) {
    let _ = std::thread::Builder::new().name("chidori-callback".into()).spawn(move || {
        while let Ok(HostCallback { id, token, status, keep, changes, land_only }) = rx.recv() {
            let Some(conn) = existing() else { continue };
            // What the GPU wrote into mirrored memory before the function: the program's now.
            crate::mirror::land(changes);
            if land_only {
                continue;
            }
            let f = {
                let mut callbacks = conn.callbacks.lock().unwrap_or_else(|p| p.into_inner());
                if keep { callbacks.get(&id).cloned() } else { callbacks.remove(&id) }
            };
            if let Some(f) = f {
                let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(status)));
            }
            conn.callback_ran(id);
            let done = messages::HostCallbackDone { token };
            let _ = conn.send(Header::new(Kind::HostCallbackDone, 0, 0, 0), &messages::encode(&done), &[]);
        }
    });
}
