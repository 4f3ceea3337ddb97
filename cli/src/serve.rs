//! `chidori serve` and the hidden `chidori session` it spawns per connection.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use chidori_protocol::env;
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
    /// Address to bind: loopback by default (clients are not authenticated yet; reach it
    /// through an SSH tunnel, or bind 0.0.0.0 on a trusted network).
    #[arg(long, env = env::BIND, default_value = "127.0.0.1")]
    pub bind: String,
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
    /// Load the backend, print what it found, exit.
    #[arg(long)]
    pub probe: bool,
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
    let options = ServeOptions {
        bind: args.bind,
        port: args.port,
        gpus: args.gpus,
        backend,
        heartbeat: Duration::from_secs(args.heartbeat_secs.max(1)),
        module_cache: args.module_cache.unwrap_or_else(chidori_worker::cache::default_dir),
        module_cache_mb: args.module_cache_mb,
        exe: std::env::current_exe().context("locating the chidori binary")?,
    };
    supervisor::serve(options)
}

fn backend(args: &SessionArgs) -> Result<Arc<dyn Backend>, String> {
    match args.backend {
        BackendKind::Real => chidori_worker::real::Real::new(&args.cuda_lib_dirs)
            .map(|b| Arc::new(b) as Arc<dyn Backend>)
            .map_err(|e| format!("{e:#}")),
        BackendKind::Emulated => {
            let profile = args.profile.clone().ok_or("the emulated backend needs --profile")?;
            chidori_worker::profile::load(&profile)
                .map(|p| Arc::new(chidori_worker::emulated::Emulated::new(p)) as Arc<dyn Backend>)
                .map_err(|e| format!("{e:#}"))
        }
    }
}

pub fn session(args: SessionArgs) -> Result<()> {
    crate::init_logging();
    // Before CUDA starts: the driver then keeps its own address reservations out of it.
    chidori_worker::mirror::reserve_arena();
    let backend = backend(&args);
    if args.probe {
        match backend {
            Ok(b) => {
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
    let module_cache = match (args.module_cache, args.module_cache_mb) {
        (Some(dir), mb) if mb > 0 => Some(chidori_worker::cache::ModuleCache::new(dir, mb << 20)),
        _ => None,
    };
    let options =
        chidori_worker::session::Options { heartbeat: Duration::from_secs(args.heartbeat_secs.max(1)), module_cache };
    let result = chidori_worker::session::run_on_fd(supervisor::SESSION_FD, backend, options);
    // Executors may be blocked inside CUDA: end the process, which frees the session's GPU state.
    std::process::exit(if result.is_ok() { 0 } else { 1 })
}
