//! Every environment variable Chidori reads, in one place. CLI flags read these as
//! fallbacks; the interposer reads them at run time.

/// `HOST[:PORT]` of the `chidori serve` to use; set by `chidori run -s`.
pub const SERVER: &str = "CHIDORI_SERVER";

/// Log filter of the interposer and the server, `tracing` syntax (`warn`, `chidori=debug`).
/// The interposer never reads `RUST_LOG`, which belongs to the application.
pub const LOG: &str = "CHIDORI_LOG";

/// Default port of `chidori serve`.
pub const DEFAULT_PORT: u16 = 43211;

/// Extra directories (colon-separated) where the server looks for the real CUDA libraries
/// before the Python `nvidia/*/lib` directories, the CUDA toolkit and the loader path.
pub const CUDA_LIB_DIRS: &str = "CHIDORI_CUDA_LIB_DIRS";

/// Backend of `chidori serve`: `real` (default) or `emulated` (tests without a GPU).
pub const BACKEND: &str = "CHIDORI_BACKEND";

/// Device profile the emulated backend answers from (JSON from gpu/record_profile.py).
pub const PROFILE: &str = "CHIDORI_PROFILE";

/// Port `chidori serve` listens on.
pub const PORT: &str = "CHIDORI_PORT";

/// Address `chidori serve` binds.
pub const BIND: &str = "CHIDORI_BIND";

/// When set (to a path or `-` for stderr), the interposer writes per-function call counts,
/// round trips, bytes each way and time spent waiting when the program exits.
pub const TRACE: &str = "CHIDORI_TRACE";

/// Seconds without any frame after which either side sends a heartbeat, and after three of
/// which it gives up on the peer (default 5).
pub const HEARTBEAT_SECS: &str = "CHIDORI_HEARTBEAT_SECS";

/// Directory of the server's module cache (module images by hash, so the second run of a
/// program uploads nothing).
pub const MODULE_CACHE: &str = "CHIDORI_MODULE_CACHE";

/// Set (to 1) by `chidori run --optimize`: Hugging Face `generate` runs its token loop on
/// the server (the `chidori` Python package turns it on at interpreter start).
pub const OPTIMIZE: &str = "CHIDORI_OPTIMIZE";

/// Directory holding libchidori.so and the shim libraries `chidori run` preloads (the
/// fallback of its `--lib-dir`). Unset, `chidori run` looks beside its binary: `../lib` of
/// a `cargo xtask dist` directory, else the `chidori/lib` directory of the Python package
/// the binary was installed with (a venv, `pip install --user` or `--target DIR`).
pub const LIB_DIR: &str = "CHIDORI_LIB_DIR";

/// The token a client presents to a server that requires one (`chidori serve` prints it at
/// start; it is kept in the server's token file). Read by `chidori run` and the interposer.
pub const TOKEN: &str = "CHIDORI_TOKEN";

/// A file holding the client's token (instead of [`TOKEN`]); on the server, where
/// `chidori serve` keeps its token (default `~/.config/chidori/token`).
pub const TOKEN_FILE: &str = "CHIDORI_TOKEN_FILE";

/// The SHA-256 fingerprint (`sha256:<hex>`) the server's certificate must have. Without
/// it the client pins the certificate it sees first, in `~/.config/chidori/known_servers`.
pub const FINGERPRINT: &str = "CHIDORI_FINGERPRINT";

/// `chidori serve`: the TLS certificate and key (PEM) to present instead of the generated
/// self-signed pair (default `~/.config/chidori/server.crt` and `server.key`).
pub const TLS_CERT: &str = "CHIDORI_TLS_CERT";
pub const TLS_KEY: &str = "CHIDORI_TLS_KEY";

/// `chidori serve`: most sessions at once (default 16 per GPU); more get Busy.
pub const MAX_SESSIONS: &str = "CHIDORI_MAX_SESSIONS";

/// `chidori serve`: GPU memory one session may allocate, in MiB (default: no quota).
pub const MEMORY_QUOTA_MB: &str = "CHIDORI_MEMORY_QUOTA_MB";

/// Client: `1` makes the session survive a dropped connection (the client keeps what it
/// sends until acknowledged and reconnects), `0` not. Default: on, except for a server on
/// a loopback address (where connections do not drop and copies cost most).
pub const RESUME: &str = "CHIDORI_RESUME";

/// Client: how many bulk lanes (further connections) large copies may travel on beside
/// the session's connection; `0`: none. Default 4, 8 over TLS (at most what the server
/// offers), in a session that does not survive a dropped connection (lanes are not
/// resumed).
pub const LANES: &str = "CHIDORI_LANES";

/// Seconds a session whose connection broke waits for its client to reconnect (the client
/// tries as long), default 60.
pub const RESUME_GRACE_SECS: &str = "CHIDORI_RESUME_GRACE_SECS";

/// Client: `1` sends large inputs (host-to-device copies of 1 MiB and more) by content, so
/// that a server that kept them from an earlier run gets their hash instead of their
/// bytes; `0` sends every byte. Default: on, except for a server on a loopback address
/// (where sending is faster than hashing).
pub const CONTENT: &str = "CHIDORI_CONTENT";

/// `chidori serve`: directory of the content store (default: ~/.cache/chidori/content).
pub const CONTENT_CACHE: &str = "CHIDORI_CONTENT_CACHE";

/// `0` turns off loading, with a process's first module load, the modules the last run of
/// the same command loaded (interposer, `docs/ahead.md`).
pub const MODULES_AHEAD: &str = "CHIDORI_MODULES_AHEAD";

/// `0` turns off module loads named by the client: a module whose kernels an earlier load
/// of the same image listed is loaded without waiting (interposer, `docs/ahead.md`).
pub const MODULES_NAMED: &str = "CHIDORI_MODULES_NAMED";

/// `0` turns off answers learned in earlier sessions (interposer, `docs/ahead.md`).
pub const LEARNED: &str = "CHIDORI_LEARNED";

/// Large inputs and outputs (copies to and from the GPU) sent zstd-compressed where that
/// makes them at least 10% smaller: `1` always, `0` never; unset, once the connection's
/// round trip is known to be 2 ms or more (a WAN, which one core compresses faster than it
/// carries; a LAN's link may be faster than the compressor).
pub const COMPRESS: &str = "CHIDORI_COMPRESS";

/// cuDNN finalizes answered as earlier builds of the same graph were (interposer,
/// `docs/ahead.md`): `1` on, `0` off; unset, on where the connection's measured round trip
/// is 2 ms or more when the program first uses cuDNN's backend API (a WAN, where each
/// finalize waited costs a round trip; on loopback following what each descriptor holds is
/// work that saves nothing).
pub const LEARNED_CUDNN: &str = "CHIDORI_LEARNED_CUDNN";

/// The emulated backend's answers that depend on the library (cuBLASLt heuristics) change
/// with this value: a test's way to make a server answer differently than before.
pub const EMULATED_SALT: &str = "CHIDORI_EMULATED_SALT";

/// Chidori's cache directory on this machine: `$XDG_CACHE_HOME/chidori`, else
/// `~/.cache/chidori` (None without either). The client keeps its records of each server
/// there, the server its module cache.
pub fn cache_dir() -> Option<std::path::PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(std::path::PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| std::path::PathBuf::from(h).join(".cache")))?;
    Some(base.join("chidori"))
}

/// A server address as a file name (`gpu-box_43211`).
pub fn server_file_name(server: &str) -> String {
    server.chars().map(|c| if c.is_ascii_alphanumeric() || c == '.' || c == '-' { c } else { '_' }).collect()
}

/// Device allocations placed by the client (interposer, `docs/ahead.md`): `1` on, `0` off;
/// unset, on where the connection's measured round trip is 2 ms or more. On, a `cudaMalloc`
/// of whole granules (2 MiB multiples: every block torch's allocator asks for), or of 4 MiB
/// or more (rounded up to granules), on a
/// server with one GPU returns an address in a window of address space the server reserved
/// for the session, without waiting; the server backs it with new memory in order with the
/// program's calls. Only while what the session allocated stays below the device memory
/// that was free when the window was made, less a margin (1/8, at least 1 GiB); a failure
/// there ends the session, saying so.
pub const WINDOW_ALLOC: &str = "CHIDORI_WINDOW_ALLOC";
