//! Every environment variable Chidori reads, in one place. CLI flags read these as
//! fallbacks; the interposer reads them at run time.

/// `HOST[:PORT]` of the `chidori serve` to use; set by `chidori run -s`.
pub const SERVER: &str = "CHIDORI_SERVER";

/// Log filter of the interposer and the server, `tracing` syntax (`warn`, `chidori=debug`).
/// The interposer never reads `RUST_LOG`, which belongs to the application.
pub const LOG: &str = "CHIDORI_LOG";

/// Default port of `chidori serve`.
pub const DEFAULT_PORT: u16 = 43211;
