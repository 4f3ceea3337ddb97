//! `chidori serve`: accept connections and hand each to a freshly spawned session worker
//! (spawn + pass the socket, never a bare fork of this threaded process). The supervisor
//! never loads CUDA and never sees a session's bytes past the first few: with TLS the
//! worker runs the handshake and checks the token (before it creates its backend), so
//! bulk copies go straight from the socket into the worker.
//!
//! What the supervisor decides on its own, in plain text before any TLS: whether the
//! server is full (`--max-sessions`, and a cap on connections still authenticating:
//! Refuse `Busy`), and whether the connection speaks what the server requires (TLS or
//! not). A worker that has not authenticated its client within [`AUTH_DEADLINE`] is
//! killed.

use std::collections::HashMap;
use std::net::{TcpListener, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use chidori_protocol::frame::{FrameError, HEADER_LEN, Header, Kind, MAGIC};
use chidori_protocol::messages::{self, Refuse, RefuseReason};

use crate::auth::SecretFiles;

/// The file descriptor a session worker finds its connection at.
pub const SESSION_FD: i32 = 3;

/// The file descriptor a session worker writes one byte to once its client is
/// authenticated (then closes).
pub const AUTH_FD: i32 = 4;

/// The file descriptor of a session worker's end of a Unix socket on which the supervisor
/// passes a reconnecting client's connection.
pub const RESUME_FD: i32 = 5;

/// How long a connection may take from accept to an authenticated Hello (TLS handshake
/// included) before its worker is killed.
pub const AUTH_DEADLINE: Duration = Duration::from_secs(15);

/// How long a new connection has to send its first bytes.
const FIRST_BYTES_DEADLINE: Duration = Duration::from_secs(10);

/// Connections at once that have not authenticated yet (workers starting, handshakes):
/// past it, new ones get Busy. They also count against `--max-sessions`.
pub const MAX_UNAUTHENTICATED: usize = 32;

/// Default of `--max-sessions`: sessions per GPU.
pub const SESSIONS_PER_GPU: usize = 16;

/// How long a new session waits for a place on a full server before it is told the server
/// is busy: a session that just ended (`chidori run`'s version check is one) frees its place
/// only once its worker has exited.
const BUSY_GRACE: Duration = Duration::from_secs(2);

#[derive(Clone, Debug)]
pub enum BackendChoice {
    Real { cuda_lib_dirs: Vec<PathBuf> },
    Emulated { profile: PathBuf },
}

#[derive(Clone, Debug)]
pub struct ServeOptions {
    pub bind: String,
    pub port: u16,
    /// Only these GPUs (CUDA ordinals) are visible to sessions; empty: all.
    pub gpus: Vec<u32>,
    pub backend: BackendChoice,
    pub heartbeat: Duration,
    pub module_cache: PathBuf,
    pub module_cache_mb: u64,
    /// The content store (large uploads kept by hash) and its bound (0: none).
    pub content_cache: PathBuf,
    pub content_cache_mb: u64,
    /// The chidori binary that runs sessions (`chidori session`).
    pub exe: PathBuf,
    /// TLS and token (None: plain TCP, no token; only with `--insecure` or on loopback).
    pub secure: Option<SecretFiles>,
    /// Sessions at once (0: [`SESSIONS_PER_GPU`] per GPU).
    pub max_sessions: usize,
    /// GPU memory one session may allocate, in bytes (None: no quota).
    pub memory_quota: Option<u64>,
    /// (token, certificate fingerprint) to print for clients, with TLS.
    pub credentials: Option<(String, String)>,
    /// Where sessions publish the CUDA IPC handles they export ([`crate::ipc`]): made by
    /// [`serve`] (None until then, or where it could not be made: no session shares).
    pub ipc_dir: Option<PathBuf>,
}

impl ServeOptions {
    /// Arguments of `chidori session` for this configuration.
    fn session_args(&self) -> Vec<String> {
        let mut args = vec![
            "session".to_owned(),
            "--heartbeat-secs".to_owned(),
            self.heartbeat.as_secs().to_string(),
            "--module-cache".to_owned(),
            self.module_cache.display().to_string(),
            "--module-cache-mb".to_owned(),
            self.module_cache_mb.to_string(),
            "--content-cache".to_owned(),
            self.content_cache.display().to_string(),
            "--content-cache-mb".to_owned(),
            self.content_cache_mb.to_string(),
            "--auth-fd".to_owned(),
            AUTH_FD.to_string(),
            "--resume-fd".to_owned(),
            RESUME_FD.to_string(),
        ];
        if let Some(files) = &self.secure {
            for (flag, path) in [("--token-file", &files.token), ("--tls-cert", &files.cert), ("--tls-key", &files.key)]
            {
                args.push(flag.to_owned());
                args.push(path.display().to_string());
            }
        }
        if let Some(quota) = self.memory_quota {
            args.push("--memory-quota-mb".to_owned());
            args.push((quota >> 20).to_string());
        }
        if let Some(dir) = &self.ipc_dir {
            args.push("--ipc-dir".to_owned());
            args.push(dir.display().to_string());
        }
        match &self.backend {
            BackendChoice::Real { cuda_lib_dirs } => {
                args.push("--backend".into());
                args.push("real".into());
                for d in cuda_lib_dirs {
                    args.push("--cuda-lib-dir".into());
                    args.push(d.display().to_string());
                }
            }
            BackendChoice::Emulated { profile } => {
                args.push("--backend".into());
                args.push("emulated".into());
                args.push("--profile".into());
                args.push(profile.display().to_string());
            }
        }
        args
    }

    fn command(&self) -> Command {
        let mut cmd = Command::new(&self.exe);
        cmd.args(self.session_args()).env_remove("LD_PRELOAD");
        if !self.gpus.is_empty() {
            let list: Vec<String> = self.gpus.iter().map(|g| g.to_string()).collect();
            cmd.env("CUDA_VISIBLE_DEVICES", list.join(","));
        }
        cmd
    }
}

/// Start a session worker that only loads its backend and reports what it found (one
/// line, `backend NAME: N GPU(s): ...`).
pub fn probe(options: &ServeOptions) -> Result<String> {
    let out = options.command().arg("--probe").stdin(Stdio::null()).output().context("starting a session worker")?;
    let text = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        bail!("{}", if text.is_empty() { err.trim().to_owned() } else { text });
    }
    Ok(text)
}

/// The number of GPUs in a probe's line.
fn gpus_found(probe: &str) -> usize {
    probe
        .split_once(": ")
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(1)
}

/// Sessions running and connections not yet authenticated; the running workers by
/// session id (their pid), with the socket that passes them a reconnecting client.
#[derive(Default)]
struct Counts {
    sessions: AtomicUsize,
    unauthenticated: AtomicUsize,
    workers: Mutex<HashMap<u32, UnixStream>>,
}

/// One unit of a count, given back when dropped.
struct Held<'a>(&'a AtomicUsize);

impl<'a> Held<'a> {
    /// Take one unit unless `max` are taken.
    fn take(count: &'a AtomicUsize, max: usize) -> Option<Held<'a>> {
        count.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < max).then_some(n + 1)).ok()?;
        Some(Held(count))
    }

    /// Take one unit, waiting up to `grace` for one to be given back.
    fn take_within(count: &'a AtomicUsize, max: usize, grace: Duration) -> Option<Held<'a>> {
        let until = Instant::now() + grace;
        loop {
            if let Some(held) = Held::take(count, max) {
                return Some(held);
            }
            if Instant::now() >= until {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

pub fn serve(mut options: ServeOptions) -> Result<()> {
    let found = probe(&options)?;
    let max_sessions =
        if options.max_sessions > 0 { options.max_sessions } else { SESSIONS_PER_GPU * gpus_found(&found).max(1) };
    let listener = TcpListener::bind((options.bind.as_str(), options.port)).with_context(|| {
        format!(
            "cannot listen on {}:{} (is another chidori serve running? choose one with --port)",
            options.bind, options.port
        )
    })?;
    // Made once the port is the server's (a server that cannot listen leaves nothing behind);
    // stopped servers' directories go first (one killed outright cannot remove its own).
    let swept = crate::ipc::sweep();
    if swept > 0 {
        tracing::debug!("removed {swept} CUDA IPC directories of stopped servers");
    }
    // The hold lasts while the server runs: `serve` returns only as it stops.
    let _held = match crate::ipc::make_directory() {
        Ok((dir, held)) => {
            options.ipc_dir = Some(dir);
            Some(held)
        }
        Err(e) => {
            tracing::warn!("no directory for CUDA IPC between sessions ({e}): sessions cannot share memory");
            None
        }
    };
    let addr = listener.local_addr()?;
    tracing::info!("chidori serve listening on {addr}: {found}; at most {max_sessions} sessions");
    if let Some((token, fingerprint)) = &options.credentials {
        // The one line a client needs.
        let host = if addr.ip().is_unspecified() { hostname() } else { addr.ip().to_string() };
        let port = addr.port();
        eprintln!(
            "chidori serve: clients connect with: chidori run -s {host}:{port} --token {token} --fingerprint {fingerprint} -- COMMAND"
        );
        eprintln!(
            "chidori serve: (or with {}={token} {}={fingerprint}; the token is kept in {})",
            chidori_protocol::env::TOKEN,
            chidori_protocol::env::FINGERPRINT,
            options.secure.as_ref().map(|f| f.token.display().to_string()).unwrap_or_default()
        );
    }
    // One line on stderr that scripts and tests wait for (it names the port when --port 0).
    eprintln!("chidori serve: listening on {addr}; {found}");
    if options.secure.is_none() && !addr.ip().is_loopback() {
        // Said at every start: whoever reaches the port runs code on the GPU.
        tracing::warn!(
            "--insecure: {addr} is reachable from the network without TLS or a token: whoever reaches the port \
             runs code on this machine's GPUs and reads what other programs send. Drop --insecure to require both"
        );
    }
    let counts = Arc::new(Counts::default());
    for conn in listener.incoming() {
        let stream = match conn {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!("accept failed: {e}");
                continue;
            }
        };
        let options = options.clone();
        let counts = counts.clone();
        std::thread::spawn(move || {
            let peer = stream.peer_addr().map(|a| a.to_string()).unwrap_or_else(|_| "?".into());
            if let Err(e) = hand_over(stream, &options, &counts, max_sessions) {
                tracing::warn!("connection from {peer}: {e:#}");
            }
        });
    }
    Ok(())
}

/// Answer in plain text before any TLS, then close.
fn refuse_plain(stream: &TcpStream, reason: RefuseReason, message: String) {
    let refuse = Refuse { reason, message };
    if let Ok(frame) =
        chidori_protocol::frame::to_vec(Header::new(Kind::Refuse, 0, 0, 0), &messages::encode(&refuse), &[])
    {
        let mut w = stream;
        stream.set_write_timeout(Some(Duration::from_secs(5))).ok();
        std::io::Write::write_all(&mut w, &frame).ok();
    }
}

/// Wait until `fd` is readable or `timeout` passes (no busy polling). Ok(false): timeout.
fn wait_readable(fd: RawFd, timeout: Duration) -> std::io::Result<bool> {
    let mut pfd = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
    loop {
        // SAFETY: one valid pollfd; the timeout bounds the wait.
        let rc = unsafe { libc::poll(&mut pfd, 1, ms) };
        if rc >= 0 {
            return Ok(rc > 0);
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Peek until `buf` is full: Ok(false) when the peer closed first.
fn peek_exact(stream: &TcpStream, buf: &mut [u8], deadline: Instant) -> Result<bool> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            bail!("sent no complete frame header within {} s", FIRST_BYTES_DEADLINE.as_secs());
        }
        if !wait_readable(stream.as_raw_fd(), left)? {
            continue;
        }
        match stream.peek(buf) {
            Ok(0) => return Ok(false),
            Ok(n) if n >= buf.len() => return Ok(true),
            // Some bytes, not all: they stay readable, so wait a little before looking again.
            Ok(_) => std::thread::sleep(Duration::from_millis(20)),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => bail!("reading the first bytes: {e}"),
        }
    }
}

/// The first byte of a TLS handshake record.
const TLS_HANDSHAKE: u8 = 0x16;

/// Check the connection's first bytes without consuming them, then start the session
/// worker on it and wait for it to end.
fn hand_over(stream: TcpStream, options: &ServeOptions, counts: &Counts, max_sessions: usize) -> Result<()> {
    let accepted = Instant::now();
    let peer = stream.peer_addr()?;
    // A client reconnecting to its session starts with a plaintext Resume header.
    let deadline = Instant::now() + FIRST_BYTES_DEADLINE;
    let mut head = [0u8; HEADER_LEN];
    let mut first = [0u8; 4];
    if !peek_exact(&stream, &mut first, deadline)? {
        return Ok(());
    }
    if u32::from_le_bytes(first) == MAGIC {
        if !peek_exact(&stream, &mut head, deadline)? {
            return Ok(());
        }
        if let Ok(h) = Header::decode(&head)
            && h.kind == Kind::Resume
        {
            return pass_to_session(stream, h.seq, counts);
        }
    }
    let Some(_session) = Held::take_within(&counts.sessions, max_sessions, BUSY_GRACE) else {
        refuse_plain(
            &stream,
            RefuseReason::Busy,
            format!("the server is full ({max_sessions} sessions, its --max-sessions): try again when one ends"),
        );
        bail!("refused: {max_sessions} sessions are running (--max-sessions)");
    };
    let Some(unauthenticated) = Held::take(&counts.unauthenticated, MAX_UNAUTHENTICATED) else {
        refuse_plain(
            &stream,
            RefuseReason::Busy,
            format!("the server has {MAX_UNAUTHENTICATED} connections still starting: try again in a few seconds"),
        );
        bail!("refused: {MAX_UNAUTHENTICATED} connections are still authenticating");
    };
    let tls = first[0] == TLS_HANDSHAKE;
    let plain = u32::from_le_bytes(first) == MAGIC;
    match (&options.secure, tls, plain) {
        (Some(_), true, _) | (None, false, true) => {}
        (Some(files), false, true) => {
            refuse_plain(
                &stream,
                RefuseReason::Unauthorized,
                format!(
                    "this server requires TLS and a token: run `chidori run` with the --token (and --fingerprint) \
                     that `chidori serve` printed at its start; the token is also in {} on the server",
                    files.token.display()
                ),
            );
            bail!("refused a client without TLS (this server requires TLS and a token)");
        }
        (None, true, _) => {
            refuse_plain(
                &stream,
                RefuseReason::Protocol,
                "this server does not use TLS (it listens on loopback, or was started with --insecure): \
                 run without --token / CHIDORI_TOKEN"
                    .to_owned(),
            );
            bail!("refused a TLS client (this server runs without TLS)");
        }
        _ => bail!("{}", FrameError::BadMagic(u32::from_le_bytes(first))),
    }
    if !tls {
        // Plain text: check the version in the first frame's header.
        if !peek_exact(&stream, &mut head, deadline)? {
            return Ok(());
        }
        match Header::decode(&head) {
            Ok(h) if h.kind == Kind::Hello => {}
            Ok(h) => bail!("first frame is {:?}, not Hello", h.kind),
            Err(e @ FrameError::Version { .. }) => {
                refuse_plain(&stream, RefuseReason::Protocol, e.to_string());
                bail!("{e}");
            }
            Err(e) => bail!("{e}"),
        }
    }
    let fd = stream.as_raw_fd();
    let (auth_read, auth_write) = pipe()?;
    let auth_fd = auth_write.as_raw_fd();
    // std's Unix sockets are made close-on-exec: the child gets its end by dup2 below.
    let (resume_ours, resume_theirs) = UnixStream::pair().context("making the worker's resume socket")?;
    let resume_fd = resume_theirs.as_raw_fd();
    let mut cmd = options.command();
    // SAFETY: the closure runs in the child between fork and exec and only calls
    // async-signal-safe functions (dup2, fcntl).
    unsafe {
        cmd.pre_exec(move || {
            for (from, to) in [(fd, SESSION_FD), (auth_fd, AUTH_FD), (resume_fd, RESUME_FD)] {
                if from != to && libc::dup2(from, to) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // dup2 clears close-on-exec on the copy; when `from` already was `to`, clear it.
                if libc::fcntl(to, libc::F_SETFD, 0) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    let mut child = cmd.stdin(Stdio::null()).spawn().context("starting a session worker")?;
    // The child owns the connection now; ours closes with `stream`.
    drop(stream);
    drop(auth_write);
    drop(resume_theirs);
    let pid = child.id();
    lock(&counts.workers).insert(pid, resume_ours);
    tracing::info!("session for {peer}: worker pid {pid}");
    // Until the worker says its client is authenticated: at most AUTH_DEADLINE.
    let left = AUTH_DEADLINE.saturating_sub(accepted.elapsed());
    let mut byte = [0u8; 1];
    let authenticated = wait_readable(auth_read.as_raw_fd(), left)?
        // SAFETY: reading one byte from the pipe we own into a local buffer.
        && unsafe { libc::read(auth_read.as_raw_fd(), byte.as_mut_ptr().cast(), 1) } == 1;
    drop(unauthenticated);
    if !authenticated && child.try_wait()?.is_none() {
        let _ = child.kill();
        tracing::warn!(
            "session for {peer}: worker pid {pid} killed: no authenticated Hello within {} s",
            AUTH_DEADLINE.as_secs()
        );
    }
    let status = child.wait();
    lock(&counts.workers).remove(&pid);
    let status = status?;
    if status.success() {
        tracing::info!("session for {peer}: worker pid {pid} exited ({status})");
    } else {
        tracing::warn!("session for {peer}: worker pid {pid} failed ({status}); its log above says why");
    }
    Ok(())
}

/// Pass a reconnecting client's connection to its session's worker, after reading the
/// plaintext Resume header (the worker continues with what follows: TLS, or the request).
fn pass_to_session(mut stream: TcpStream, session: u64, counts: &Counts) -> Result<()> {
    let mut head = [0u8; HEADER_LEN];
    std::io::Read::read_exact(&mut stream, &mut head).context("reading the resume header")?;
    let passed = {
        let workers = lock(&counts.workers);
        let worker = u32::try_from(session).ok().and_then(|pid| workers.get(&pid));
        worker.map(|w| crate::resume::send_fd(w, stream.as_raw_fd()))
    };
    match passed {
        Some(Ok(())) => {
            tracing::info!("a client reconnects to session {session}");
            Ok(())
        }
        Some(Err(e)) => bail!("passing a reconnection to session {session}: {e}"),
        None => {
            refuse_plain(
                &stream,
                RefuseReason::Gone,
                format!(
                    "session {session} is not running on this server any more (it ended, its client was away \
                     longer than its grace period, or the server restarted)"
                ),
            );
            bail!("refused a reconnection to session {session}, which is not running");
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname").map(|h| h.trim().to_owned()).unwrap_or_else(|_| "HOST".into())
}

/// A pipe whose ends close on exec (the child gets a copy of the write end at AUTH_FD).
fn pipe() -> Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0i32; 2];
    // SAFETY: pipe2 fills two descriptors into the array on success.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } < 0 {
        return Err(std::io::Error::last_os_error()).context("making a pipe");
    }
    // SAFETY: both descriptors were just created and are owned by nothing else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}
