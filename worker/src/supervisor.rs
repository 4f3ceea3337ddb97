//! `chidori serve`: accept connections, check the protocol version, and hand each
//! connection to a freshly spawned session worker (spawn + pass the socket, never a bare
//! fork of this threaded process). The supervisor never loads CUDA.

use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use chidori_protocol::frame::{FrameError, HEADER_LEN, Header, Kind};
use chidori_protocol::messages::{self, Refuse, RefuseReason};

/// The file descriptor a session worker finds its connection at.
pub const SESSION_FD: i32 = 3;

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
    /// The chidori binary that runs sessions (`chidori session`).
    pub exe: PathBuf,
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
        ];
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

/// Start a session worker that only loads its backend and reports what it found.
pub fn probe(options: &ServeOptions) -> Result<String> {
    let out = options.command().arg("--probe").stdin(Stdio::null()).output().context("starting a session worker")?;
    let text = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        bail!("{}", if text.is_empty() { err.trim().to_owned() } else { text });
    }
    Ok(text)
}

pub fn serve(options: ServeOptions) -> Result<()> {
    let found = probe(&options)?;
    let listener = TcpListener::bind((options.bind.as_str(), options.port)).with_context(|| {
        format!(
            "cannot listen on {}:{} (is another chidori serve running? choose one with --port)",
            options.bind, options.port
        )
    })?;
    let addr = listener.local_addr()?;
    tracing::info!("chidori serve listening on {addr}: {found}");
    // One line on stderr that scripts and tests wait for (it names the port when --port 0).
    eprintln!("chidori serve: listening on {addr}; {found}");
    if !addr.ip().is_loopback() {
        // Sessions are not authenticated yet: whoever reaches the port runs code on the GPU.
        tracing::warn!(
            "{addr} is reachable from the network and Chidori does not authenticate clients yet: \
             expose it only on a trusted network, or bind 127.0.0.1 and reach it through an SSH tunnel \
             (ssh -L 43211:127.0.0.1:43211 gpu-box)"
        );
    }
    for conn in listener.incoming() {
        let stream = match conn {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!("accept failed: {e}");
                continue;
            }
        };
        let options = options.clone();
        std::thread::spawn(move || {
            let peer = stream.peer_addr().map(|a| a.to_string()).unwrap_or_else(|_| "?".into());
            if let Err(e) = hand_over(stream, &options) {
                tracing::warn!("connection from {peer}: {e:#}");
            }
        });
    }
    Ok(())
}

/// Check the first frame's header without consuming it, then start the session worker on
/// the connection and wait for it to end.
fn hand_over(stream: TcpStream, options: &ServeOptions) -> Result<()> {
    let peer = stream.peer_addr()?;
    stream.set_read_timeout(Some(Duration::from_millis(200)))?;
    let mut head = [0u8; HEADER_LEN];
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match stream.peek(&mut head) {
            Ok(0) => return Ok(()),
            Ok(n) if n >= HEADER_LEN => break,
            Ok(_) | Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
            Ok(_) => bail!("sent no complete frame header within 10 s"),
            Err(e) => bail!("reading the first frame: {e}"),
        }
    }
    match Header::decode(&head) {
        Ok(h) if h.kind == Kind::Hello => {}
        Ok(h) => bail!("first frame is {:?}, not Hello", h.kind),
        Err(e @ FrameError::Version { .. }) => {
            let refuse = Refuse { reason: RefuseReason::Protocol, message: e.to_string() };
            let mut w = &stream;
            let frame =
                chidori_protocol::frame::to_vec(Header::new(Kind::Refuse, 0, 0, 0), &messages::encode(&refuse), &[])?;
            std::io::Write::write_all(&mut w, &frame).ok();
            bail!("{e}");
        }
        Err(e) => bail!("{e}"),
    }
    stream.set_read_timeout(None)?;
    let fd = stream.as_raw_fd();
    let mut cmd = options.command();
    // SAFETY: the closure runs in the child between fork and exec and only calls
    // async-signal-safe functions (dup2, fcntl).
    unsafe {
        cmd.pre_exec(move || {
            if fd != SESSION_FD && libc::dup2(fd, SESSION_FD) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            // dup2 clears close-on-exec on the copy; when fd already was SESSION_FD, clear it.
            if libc::fcntl(SESSION_FD, libc::F_SETFD, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.stdin(Stdio::null()).spawn().context("starting a session worker")?;
    // The child owns the connection now; ours closes with `stream`.
    drop(stream);
    tracing::info!("session for {peer}: worker pid {}", child.id());
    let status = child.wait()?;
    tracing::info!("session for {peer}: worker pid {} exited ({status})", child.id());
    Ok(())
}
