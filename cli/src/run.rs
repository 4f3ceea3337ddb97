//! `chidori run`: check the server, preload the shims of this installation, exec the command.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use chidori_protocol::env;

#[derive(clap::Args)]
pub struct RunArgs {
    /// The `chidori serve` to use, HOST[:PORT] (default port 43211).
    #[arg(short = 's', long = "server", env = env::SERVER, value_name = "HOST[:PORT]")]
    pub server: String,
    /// The server's token (printed by `chidori serve`); with it the session uses TLS.
    #[arg(long, env = env::TOKEN, value_name = "TOKEN", hide_env_values = true, conflicts_with = "token_file")]
    pub token: Option<String>,
    /// A file holding the server's token.
    #[arg(long, env = env::TOKEN_FILE, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// The server certificate's fingerprint (sha256:…, printed by `chidori serve`). Without
    /// it the certificate seen first is pinned in ~/.config/chidori/known_servers.
    #[arg(long, env = env::FINGERPRINT, value_name = "SHA256")]
    pub fingerprint: Option<String>,
    /// Log what the interposer does (connection, unsupported functions) to stderr.
    #[arg(short, long)]
    pub verbose: bool,
    /// At exit, print per-function call counts, round trips, bytes each way and time waiting,
    /// and where the program made the round trips it waited for (its own source lines in
    /// Python, the calling function in native code).
    #[arg(long)]
    pub trace: bool,
    /// Do not check that the server answers before starting the command.
    #[arg(long)]
    pub no_check: bool,
    /// Directory holding libchidori.so and the shims (default: ../lib beside this binary,
    /// else the installed Python package's chidori/lib).
    #[arg(long, env = env::LIB_DIR, value_name = "DIR")]
    pub lib_dir: Option<PathBuf>,
    /// Run Hugging Face `generate` with its token loop on the server, without a code
    /// change (Python programs: the `chidori` package is loaded at interpreter start).
    #[arg(long, env = env::OPTIMIZE)]
    pub optimize: bool,
    /// The command and its arguments.
    #[arg(trailing_var_arg = true, required = true, value_name = "COMMAND")]
    pub command: Vec<OsString>,
}

/// The shim libraries in `dir`, newest CUDA major first so that unversioned lookups find
/// the newest ABI.
pub fn shims(dir: &std::path::Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        // Real files with a SONAME-style name; not the core library, not the -lcuda symlink.
        if name == "libchidori.so" || !name.contains(".so.") || entry.file_type()?.is_symlink() {
            continue;
        }
        out.push(entry.path());
    }
    out.sort_by(|a, b| b.file_name().cmp(&a.file_name()));
    if out.is_empty() {
        bail!("no shim libraries in {}; is this a complete Chidori installation?", dir.display());
    }
    Ok(out)
}

/// The directory of the shims: `explicit` (`--lib-dir`, `CHIDORI_LIB_DIR`), else the one
/// of this installation (see [`crate::install`]).
pub fn lib_dir(explicit: Option<PathBuf>) -> Result<PathBuf> {
    if let Some(dir) = explicit {
        // LD_PRELOAD entries must be absolute: the program may change directory first.
        return std::fs::canonicalize(&dir)
            .with_context(|| format!("the library directory {} (--lib-dir, CHIDORI_LIB_DIR)", dir.display()));
    }
    let exe = std::env::current_exe().context("locating the chidori binary")?;
    crate::install::find_lib_dir(&exe)
}

/// The `chidori` Python package of this installation: beside the shims in a wheel, under
/// `python/` in a release directory.
fn python_package(lib_dir: &std::path::Path) -> Result<PathBuf> {
    let exe = std::env::current_exe().context("locating the chidori binary")?;
    let prefix = exe.parent().and_then(|p| p.parent()).map(PathBuf::from);
    let mut candidates = vec![lib_dir.parent().map(PathBuf::from)];
    candidates.push(lib_dir.parent().map(|p| p.join("python/chidori")));
    candidates.push(prefix.as_ref().map(|p| p.join("python/chidori")));
    candidates.push(prefix.as_ref().map(|p| p.join("share/chidori/python/chidori")));
    let candidates: Vec<PathBuf> = candidates.into_iter().flatten().collect();
    candidates
        .iter()
        .find(|p| p.join("decode.py").is_file() && p.join("_hook/sitecustomize.py").is_file())
        .cloned()
        .with_context(|| {
            format!(
                "--optimize needs the chidori Python package of this installation, looked in: {}",
                candidates.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
            )
        })
}

pub fn run(args: RunArgs) -> Result<()> {
    let token = match (&args.token, &args.token_file) {
        (Some(t), _) => Some(t.trim().to_owned()),
        (None, Some(file)) => Some(chidori_tls::token::read(file).map_err(anyhow::Error::msg)?),
        (None, None) => None,
    };
    let explicit = match &args.fingerprint {
        Some(f) => Some(chidori_tls::pin::normalize(f).with_context(|| {
            format!("--fingerprint {f} is not a SHA-256 fingerprint (sha256: and 64 hex digits, as `chidori serve` prints it)")
        })?),
        None => None,
    };
    let pins = chidori_tls::pin::Pins { explicit, file: Some(chidori_tls::token::config_dir().join("known_servers")) };
    let mut fingerprint = pins.explicit.clone();
    let auth = crate::check::ClientAuth { token: token.clone(), pins };
    if !args.no_check {
        let (_, seen) = crate::check::check(&args.server, &auth)?;
        fingerprint = fingerprint.or(seen);
    }
    let (program, rest) = args.command.split_first().context("no command given")?;
    if crate::smi::is_smi(program) {
        // The server's nvidia-smi: a local one cannot use Chidori's NVML.
        let code = crate::smi::relay(&args.server, &auth, rest)?;
        std::process::exit(i32::from(code));
    }
    let dir = lib_dir(args.lib_dir)?;
    let shims = shims(&dir)?;
    let mut preload = OsString::new();
    for (i, shim) in shims.iter().enumerate() {
        if i > 0 {
            preload.push(":");
        }
        preload.push(shim.as_os_str());
    }
    if let Some(existing) = std::env::var_os("LD_PRELOAD").filter(|v| !v.is_empty()) {
        preload.push(":");
        preload.push(existing);
    }
    let mut cmd = std::process::Command::new(program);
    cmd.args(rest).env("LD_PRELOAD", &preload).env(env::SERVER, &args.server);
    // The program's own connection presents the same token and accepts only the
    // certificate the preflight accepted.
    cmd.env_remove(env::TOKEN).env_remove(env::TOKEN_FILE).env_remove(env::FINGERPRINT);
    if let Some(token) = &token {
        cmd.env(env::TOKEN, token);
    }
    if let Some(fingerprint) = &fingerprint {
        cmd.env(env::FINGERPRINT, fingerprint);
    }
    // A program that starts nvidia-smi gets the server's (see `crate::smi`).
    if let Some(tools) = crate::smi::tools_dir() {
        let mut path = OsString::from(tools);
        if let Some(existing) = std::env::var_os("PATH").filter(|v| !v.is_empty()) {
            path.push(":");
            path.push(existing);
        }
        cmd.env("PATH", path);
    }
    // Triton links its launchers with -lcuda and dlopens libcuda.so.1 from here.
    cmd.env("TRITON_LIBCUDA_PATH", &dir);
    if args.verbose {
        cmd.env(env::LOG, "info");
    }
    if args.trace {
        cmd.env(env::TRACE, "-");
    }
    // The interpreter-start hook: needed by --optimize; with --trace it places waits made
    // while Python released the interpreter (without it, those show native frames).
    let package = match python_package(&dir) {
        Ok(package) => Some(package),
        Err(e) if args.optimize => return Err(e),
        Err(_) => None,
    };
    if let Some(package) = package.filter(|_| args.optimize || args.trace) {
        let mut path = OsString::from(package.join("_hook"));
        path.push(":");
        path.push(package.parent().context("the chidori package has no parent directory")?);
        if let Some(existing) = std::env::var_os("PYTHONPATH").filter(|v| !v.is_empty()) {
            path.push(":");
            path.push(existing);
        }
        cmd.env("PYTHONPATH", path);
    }
    if args.optimize {
        cmd.env(env::OPTIMIZE, "1");
    }
    let err = cmd.exec();
    bail!("could not run {}: {err}", program.to_string_lossy())
}
