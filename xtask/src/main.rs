//! `cargo xtask <command>`: see `cargo xtask --help`.

use anyhow::Result;
use clap::{Parser, Subcommand};

use xtask::{headers, irgen, lock, project_root};

#[derive(Parser)]
#[command(name = "cargo xtask", about = "Chidori build tasks")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Fetch the locked NVIDIA wheels and extract their headers into target/cuda-headers.
    Headers {
        /// One CUDA version (default: all in headers/cuda.lock.toml).
        #[arg(long)]
        cuda: Option<String>,
        /// Only the small runtime wheels (cuda.h, cuda_runtime_api.h, …) the C probes need.
        #[arg(long)]
        runtime_only: bool,
        /// Keep large wheels after extraction.
        #[arg(long)]
        keep_wheels: bool,
    },
    /// Stage 1: bindgen over the cached headers → generated/ir (needs libclang).
    Ir {
        #[arg(long)]
        cuda: Option<String>,
        #[arg(long)]
        all: bool,
        /// Only this library.
        #[arg(long)]
        library: Option<String>,
    },
}

fn versions(cuda: Option<String>) -> Result<Vec<String>> {
    Ok(match cuda {
        Some(v) => vec![v],
        None => lock::Lock::load(&project_root())?.versions(),
    })
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    let root = project_root();
    match cli.command {
        Command::Headers { cuda, runtime_only, keep_wheels } => {
            let selection = if runtime_only { headers::Selection::RuntimeOnly } else { headers::Selection::All };
            headers::fetch(&root, &versions(cuda)?, selection, keep_wheels)
        }
        Command::Ir { cuda, all, library } => {
            if cuda.is_none() && !all {
                anyhow::bail!("say which version: --cuda 12.6, or --all");
            }
            irgen::run(&root, &versions(cuda)?, library.as_deref())
        }
    }
}
