//! `chidori serve` and the hidden `chidori session` it spawns per connection.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use chidori_protocol::env;
use chidori_worker::auth::{SecretFiles, Security};
use chidori_worker::backend::Backend;
use chidori_worker::supervisor::{self, BackendChoice, ServeOptions};

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum BackendKind {
    /// The GPU, through NVIDIA's libraries.
    Real,
    /// A test backend: answers device queries from a recorded profile, keeps memory in
    /// host RAM, runs copies/streams/events in order, runs no kernels. For CI without a GPU.
    Emulated,
}

#[derive(clap::Args)]
pub struct ServeArgs {
    /// Port to listen on.
    #[arg(long, env = env::PORT, default_value_t = env::DEFAULT_PORT)]
    pub port: u16,
    /// Address to bind: loopback by default. Off loopback, clients need TLS and the token
    /// (printed at start) unless --insecure.
    #[arg(long, env = env::BIND, default_value = "127.0.0.1")]
    pub bind: String,
    /// Require TLS and the token on a loopback address too (other users of this machine
    /// can reach loopback ports).
    #[arg(long, conflicts_with = "insecure")]
    pub secure: bool,
    /// Serve without TLS or token off loopback: whoever reaches the port runs code on the
    /// GPUs. Only for networks you trust completely; the server warns at every start.
    #[arg(long)]
    pub insecure: bool,
    /// The token file (made with a new random token on first start).
    #[arg(long, env = env::TOKEN_FILE, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// TLS certificate (PEM) to present instead of the self-signed one made on first start
    /// (~/.config/chidori/server.crt); clients pin its fingerprint either way.
    #[arg(long, env = env::TLS_CERT, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The private key (PEM) of --tls-cert.
    #[arg(long, env = env::TLS_KEY, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Most sessions at once; more connections get Busy (default: 16 per GPU).
    #[arg(long, env = env::MAX_SESSIONS, value_name = "N")]
    pub max_sessions: Option<usize>,
    /// GPU memory one session may allocate, in MiB; an allocation beyond it fails with the
    /// library's out-of-memory status (default: no quota).
    #[arg(long, env = env::MEMORY_QUOTA_MB, value_name = "MIB")]
    pub memory_quota_mb: Option<u64>,
    /// Serve only these GPUs (CUDA ordinals; repeat the flag for several).
    #[arg(long = "gpu", value_name = "N")]
    pub gpus: Vec<u32>,
    /// What executes calls.
    #[arg(long, env = env::BACKEND, value_enum, default_value = "real")]
    pub backend: BackendKind,
    /// Device profile for the emulated backend (JSON from gpu/record_profile.py).
    #[arg(long, env = env::PROFILE, value_name = "FILE")]
    pub profile: Option<PathBuf>,
    /// Extra directories to find the NVIDIA libraries in (searched first).
    #[arg(long = "cuda-lib-dir", value_name = "DIR")]
    pub cuda_lib_dirs: Vec<PathBuf>,
    /// Seconds of silence before a heartbeat; a client missing three is gone.
    #[arg(long, env = env::HEARTBEAT_SECS, default_value_t = 5)]
    pub heartbeat_secs: u64,
    /// Directory of the module cache (default: ~/.cache/chidori/modules).
    #[arg(long, env = env::MODULE_CACHE, value_name = "DIR")]
    pub module_cache: Option<PathBuf>,
    /// Size bound of the module cache, in MiB (0: no cache on disk).
    #[arg(long, default_value_t = 4096)]
    pub module_cache_mb: u64,
    /// Directory where large uploads are kept so that a client sending them again sends
    /// only their hashes (default: ~/.cache/chidori/content).
    #[arg(long, env = env::CONTENT_CACHE, value_name = "DIR")]
    pub content_cache: Option<PathBuf>,
    /// Size bound of the content store, in MiB (0: keep no uploads).
    #[arg(long, default_value_t = 16384)]
    pub content_cache_mb: u64,
}

#[derive(clap::Args)]
pub struct SessionArgs {
    #[arg(long, value_enum)]
    pub backend: BackendKind,
    #[arg(long)]
    pub profile: Option<PathBuf>,
    #[arg(long = "cuda-lib-dir")]
    pub cuda_lib_dirs: Vec<PathBuf>,
    #[arg(long, default_value_t = 5)]
    pub heartbeat_secs: u64,
    #[arg(long)]
    pub module_cache: Option<PathBuf>,
    #[arg(long, default_value_t = 4096)]
    pub module_cache_mb: u64,
    #[arg(long)]
    pub content_cache: Option<PathBuf>,
    #[arg(long, default_value_t = 0)]
    pub content_cache_mb: u64,
    /// Load the backend, print what it found, exit.
    #[arg(long)]
    pub probe: bool,
    /// Where to write one byte once the client is authenticated.
    #[arg(long)]
    pub auth_fd: Option<i32>,
    /// A Unix socket the supervisor passes a reconnecting client's connection on.
    #[arg(long)]
    pub resume_fd: Option<i32>,
    /// TLS and token: all three or none.
    #[arg(long)]
    pub token_file: Option<PathBuf>,
    #[arg(long)]
    pub tls_cert: Option<PathBuf>,
    #[arg(long)]
    pub tls_key: Option<PathBuf>,
    #[arg(long)]
    pub memory_quota_mb: Option<u64>,
    /// Where the server's sessions publish the CUDA IPC handles they export.
    #[arg(long)]
    pub ipc_dir: Option<PathBuf>,
}

/// The recorded H200 profile of this installation (`share/chidori/profiles` of a dist
/// directory, `profiles` of the installed Python package); the error lists where it looked.
fn default_profile() -> Result<PathBuf> {
    let exe = std::env::current_exe().context("locating the chidori binary")?;
    let candidates = crate::install::profile_candidates(&exe, "nvidia-h200.json");
    if let Some(found) = candidates.iter().find(|p| p.is_file()) {
        return Ok(found.clone());
    }
    anyhow::bail!(
        "the emulated backend needs a device profile: pass --profile FILE or set {} (searched:\n  {})",
        env::PROFILE,
        candidates.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join("\n  ")
    )
}

pub fn serve(args: ServeArgs) -> Result<()> {
    crate::init_logging();
    let backend = match args.backend {
        BackendKind::Real => BackendChoice::Real { cuda_lib_dirs: args.cuda_lib_dirs },
        BackendKind::Emulated => BackendChoice::Emulated {
            profile: match args.profile {
                Some(profile) => profile,
                None => default_profile()?,
            },
        },
    };
    let loopback = is_loopback(&args.bind, args.port);
    if args.insecure && loopback {
        tracing::info!("--insecure has no effect on a loopback address (no TLS there unless --secure)");
    }
    let secure = args.secure || (!args.insecure && !loopback);
    let secret_files = secure.then(|| SecretFiles::with_defaults(args.token_file, args.tls_cert, args.tls_key));
    let mut connect_line = None;
    if let Some(files) = &secret_files {
        let (token, fingerprint) = files.ensure()?;
        connect_line = Some((token, fingerprint));
    }
    let options = ServeOptions {
        bind: args.bind,
        port: args.port,
        gpus: args.gpus,
        backend,
        heartbeat: Duration::from_secs(args.heartbeat_secs.max(1)),
        module_cache: args.module_cache.unwrap_or_else(chidori_worker::cache::default_dir),
        module_cache_mb: args.module_cache_mb,
        content_cache: args.content_cache.unwrap_or_else(chidori_worker::content::default_dir),
        content_cache_mb: args.content_cache_mb,
        exe: std::env::current_exe().context("locating the chidori binary")?,
        secure: secret_files,
        max_sessions: args.max_sessions.unwrap_or(0),
        memory_quota: args.memory_quota_mb.map(|mb| mb << 20),
        credentials: connect_line,
        ipc_dir: None,
    };
    if options.credentials.is_none() && loopback {
        tracing::info!("loopback only: no TLS or token (--secure requires both here too)");
    }
    supervisor::serve(options)
}

/// Whether every address `bind` resolves to is a loopback address.
fn is_loopback(bind: &str, port: u16) -> bool {
    use std::net::ToSocketAddrs;
    match (bind, port).to_socket_addrs() {
        Ok(addrs) => {
            let addrs: Vec<_> = addrs.collect();
            !addrs.is_empty() && addrs.iter().all(|a| a.ip().is_loopback())
        }
        Err(_) => false,
    }
}

/// The session's backend, showing the GPUs the program's `CUDA_VISIBLE_DEVICES` (`visible`)
/// selects among the server's.
fn backend(args: &SessionArgs, visible: Option<&str>) -> Result<(Arc<dyn Backend>, Option<u32>), String> {
    let none_selected = |list: &str, of: String| {
        format!(
            "the program's CUDA_VISIBLE_DEVICES={list:?} selects none of the server's GPUs ({of}): give indices \
             into the server's list (0, 1, ...) or their UUIDs, or unset it"
        )
    };
    match args.backend {
        BackendKind::Real => {
            let mut exposed = None;
            if let Some(list) = visible {
                let server = std::env::var("CUDA_VISIBLE_DEVICES").ok();
                exposed = match &server {
                    Some(s) => Some(chidori_worker::visible::parse(s).len() as u32),
                    None => chidori_worker::visible::physical_gpus(),
                };
                let composed = chidori_worker::visible::compose(list, server.as_deref());
                if composed.is_empty() {
                    return Err(none_selected(
                        list,
                        format!("CUDA_VISIBLE_DEVICES={}", server.as_deref().unwrap_or("all")),
                    ));
                }
                tracing::info!("the program selects GPUs {list:?}: this session's CUDA_VISIBLE_DEVICES={composed}");
                // SAFETY: the driver is not started yet (it reads the variable when it is), and
                // nothing else of this process reads or writes its environment now: the
                // session's threads start after its backend.
                unsafe { std::env::set_var("CUDA_VISIBLE_DEVICES", &composed) };
            }
            chidori_worker::real::Real::new(&args.cuda_lib_dirs)
                .map(|b| (Arc::new(b) as Arc<dyn Backend>, exposed))
                .map_err(|e| match visible {
                    Some(list) => format!("{e:#} (the program's CUDA_VISIBLE_DEVICES={list:?} selected these)"),
                    None => format!("{e:#}"),
                })
        }
        BackendKind::Emulated => {
            let profile = args.profile.clone().ok_or("the emulated backend needs --profile")?;
            let mut p = chidori_worker::profile::load(&profile).map_err(|e| format!("{e:#}"))?;
            let exposed = p.devices.len() as u32;
            if let Some(list) = visible {
                p = p.select(list);
                if p.devices.is_empty() {
                    return Err(none_selected(list, format!("{exposed} emulated")));
                }
            }
            Ok((Arc::new(chidori_worker::emulated::Emulated::new(p)) as Arc<dyn Backend>, Some(exposed)))
        }
    }
}

pub fn session(args: SessionArgs) -> Result<()> {
    crate::init_logging();
    // Before CUDA starts: the driver then keeps its own address reservations out of it.
    chidori_worker::mirror::reserve_arena();
    if args.probe {
        match backend(&args, None) {
            Ok((b, _)) => {
                let names: Vec<String> =
                    b.devices().iter().map(|d| format!("{} ({} MiB)", d.name, d.total_mem >> 20)).collect();
                println!("backend {}: {} GPU(s): {}", b.name(), names.len(), names.join(", "));
                return Ok(());
            }
            Err(e) => {
                println!("{e}");
                std::process::exit(1);
            }
        }
    }
    let security = match (&args.token_file, &args.tls_cert, &args.tls_key) {
        (Some(token), Some(cert), Some(key)) => {
            let files = SecretFiles { token: token.clone(), cert: cert.clone(), key: key.clone() };
            Some(Security::load(&files)?)
        }
        (None, None, None) => None,
        _ => anyhow::bail!("a secure session needs --token-file, --tls-cert and --tls-key"),
    };
    let module_cache = match (args.module_cache.clone(), args.module_cache_mb) {
        (Some(dir), mb) if mb > 0 => Some(chidori_worker::cache::ModuleCache::new(dir, mb << 20)),
        _ => None,
    };
    let options = chidori_worker::session::Options {
        heartbeat: Duration::from_secs(args.heartbeat_secs.max(1)),
        module_cache,
        content: match (args.content_cache.clone(), args.content_cache_mb) {
            (Some(dir), mb) if mb > 0 => Some(Arc::new(chidori_worker::content::Store::new(dir, mb << 20))),
            _ => None,
        },
        memory_quota: args.memory_quota_mb.map(|mb| mb << 20),
        ipc_dir: args.ipc_dir.clone(),
        resume: args.resume_fd.map(|fd| {
            use std::os::fd::FromRawFd;
            // SAFETY: the supervisor passes one end of a Unix socket pair at this descriptor,
            // which nothing else in this process uses.
            unsafe { std::os::unix::net::UnixStream::from_raw_fd(fd) }
        }),
    };
    let auth_fd = args.auth_fd;
    let authenticated = Box::new(move || {
        if let Some(fd) = auth_fd {
            use std::os::fd::FromRawFd;
            // SAFETY: the supervisor passes the write end of a pipe at this descriptor, which
            // nothing else in this process uses; it is closed after the one byte.
            let mut pipe = unsafe { std::fs::File::from_raw_fd(fd) };
            let _ = std::io::Write::write_all(&mut pipe, b"1");
        }
    });
    // The backend (a CUDA context, with the real one) is made only for an authenticated client.
    let make_backend = Box::new(move |visible: Option<&str>| {
        // In this session's worker only: what its kernels print goes to the program, not to
        // the server's terminal.
        if matches!(args.backend, BackendKind::Real)
            && let Err(e) = chidori_worker::output::capture()
        {
            tracing::warn!("the GPU's printf output stays on the server: {e}");
        }
        backend(&args, visible)
    });
    // A fault inside a library names the call it happened in, in the server's log.
    chidori_worker::fatal::install();
    let result =
        chidori_worker::session::run_on_fd(supervisor::SESSION_FD, security, make_backend, options, authenticated);
    // End the process, which frees the session's GPU state (without the libraries' teardown
    // where a call may still run inside one).
    chidori_worker::session::end_process(if result.is_ok() { 0 } else { 1 })
}
