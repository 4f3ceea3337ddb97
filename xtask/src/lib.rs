//! Chidori's build tasks as a library, so the generator can be exercised by tests.
//!
//! Stage 1 (`headers`, `irgen`) needs the network and libclang; stage 2 (`gen`) reads only
//! committed files and is pure Rust.

pub mod codegen;
pub mod coverage;
pub mod dist;
pub mod elf;
pub mod emit;
pub mod glibc;
pub mod headers;
pub mod ir;
pub mod irgen;
pub mod libraries;
pub mod lock;
pub mod matrix;

use std::path::{Path, PathBuf};

/// The workspace root (the directory holding `xtask/`): the current directory when it is a
/// checkout (a prebuilt xtask binary on another machine), else where this crate was built.
pub fn project_root() -> PathBuf {
    if let Ok(cwd) = std::env::current_dir()
        && cwd.join("xtask").is_dir()
        && cwd.join("generated/ir").is_dir()
    {
        return cwd;
    }
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask lives in the workspace").to_path_buf()
}
pub mod model;
pub mod spec;
pub mod tidy;
pub mod wheel;
