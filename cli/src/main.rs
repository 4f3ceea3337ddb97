//! `chidori`: run unmodified CUDA programs on a GPU in another machine.

mod check;
mod install;
mod run;
mod serve;
mod smi;

use anyhow::Result;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "chidori",
    version,
    about = "Run unmodified CUDA programs on a GPU in another machine",
    after_help = "Examples:\n  chidori serve                                  # on the GPU machine\n  chidori run -s gpu-box:43211 -- python train.py   # on yours"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run COMMAND with its CUDA libraries replaced by Chidori's, talking to SERVER.
    Run(run::RunArgs),
    /// Serve this machine's GPUs to `chidori run` clients.
    Serve(serve::ServeArgs),
    /// One client's session worker (started by `chidori serve`).
    #[command(hide = true)]
    Session(serve::SessionArgs),
}

/// Logging of the chidori binary: stderr, filtered by CHIDORI_LOG (default info).
pub fn init_logging() {
    let filter = std::env::var(chidori_protocol::env::LOG).unwrap_or_else(|_| "info".to_owned());
    let filter =
        tracing_subscriber::EnvFilter::try_new(&filter).unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let color = std::env::var_os("NO_COLOR").is_none() && std::io::IsTerminal::is_terminal(&std::io::stderr());
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(color).try_init();
}

fn main() -> std::process::ExitCode {
    // Started as `nvidia-smi` from the PATH `chidori run` gave a program: the server's.
    let mut argv = std::env::args_os();
    if argv.next().is_some_and(|a0| smi::is_smi(&a0)) {
        let args: Vec<std::ffi::OsString> = argv.collect();
        return match smi::as_program(&args) {
            Ok(code) => std::process::ExitCode::from(code),
            Err(e) => {
                eprintln!("chidori: {e:#}");
                std::process::ExitCode::from(2)
            }
        };
    }
    let cli = Cli::parse();
    let result: Result<()> = match cli.command {
        Command::Run(args) => run::run(args),
        Command::Serve(args) => serve::serve(args),
        Command::Session(args) => serve::session(args),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            // The chain of causes, one line; a backtrace only when CHIDORI_LOG asks for debug.
            eprintln!("chidori: {e:#}");
            if std::env::var(chidori_protocol::env::LOG).is_ok_and(|l| l.contains("debug") || l.contains("trace")) {
                eprintln!("{}", e.backtrace());
            }
            std::process::ExitCode::from(2)
        }
    }
}
