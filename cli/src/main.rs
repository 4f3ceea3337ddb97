//! `chidori`: run unmodified CUDA programs on a GPU in another machine.

mod run;

use anyhow::Result;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "chidori",
    version,
    about = "Run unmodified CUDA programs on a GPU in another machine",
    after_help = "Example:\n  chidori run -s gpu-box:43211 -- python train.py"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run COMMAND with its CUDA libraries replaced by Chidori's, talking to SERVER.
    Run(run::RunArgs),
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Run(args) => run::run(args),
    }
}
