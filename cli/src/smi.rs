//! `nvidia-smi` under `chidori run`: the server's, run next to its GPUs, its output printed
//! here (the worker's `smi` module says why a local nvidia-smi cannot use Chidori's NVML,
//! and what it runs).
//!
//! `chidori run -s HOST -- nvidia-smi …` asks the server directly; for programs that start
//! `nvidia-smi` themselves, `chidori run` puts a directory first on their PATH whose
//! `nvidia-smi` is this binary, which does the same with the session's server and token
//! (from the environment `chidori run` gave the program).

use std::ffi::OsString;
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use chidori_protocol::env;
use chidori_protocol::frame::{Header, Kind};
use chidori_protocol::messages::{self, Service, ServiceReply};

use crate::check::ClientAuth;

/// The tool's name, as programs run it.
pub const NAME: &str = "nvidia-smi";

/// Whether `program` (a command as given) is nvidia-smi.
pub fn is_smi(program: &std::ffi::OsStr) -> bool {
    Path::new(program).file_name().is_some_and(|n| n == NAME)
}

/// Run the server's nvidia-smi with `args`, print its output here; its exit status.
pub fn relay(server: &str, auth: &ClientAuth, args: &[OsString]) -> Result<u8> {
    let args: Vec<String> = args
        .iter()
        .map(|a| a.to_str().map(str::to_owned).context("nvidia-smi's arguments must be UTF-8 to go to the server"))
        .collect::<Result<_>>()?;
    let mut session = crate::check::open(server, auth, NAME)?;
    let request = messages::encode(&Service::NvidiaSmi { args });
    session.send(Header::new(Kind::Service, 0, 1, 1), &request)?;
    let reply = loop {
        let frame = session.read()?;
        match frame.header.kind {
            Kind::ServiceReply if frame.header.seq == 1 => {
                break messages::decode::<ServiceReply>(&frame, "nvidia-smi's output")?;
            }
            Kind::Goodbye => {
                bail!("the Chidori server at {} ended the session before nvidia-smi's output", session.addr)
            }
            // Anything else (a ping, the worker's own output) is not the answer.
            _ => continue,
        }
    };
    session.close("nvidia-smi done");
    match reply {
        ServiceReply::Tool { code, stdout, stderr } => {
            std::io::stdout().write_all(&stdout)?;
            std::io::stdout().flush()?;
            std::io::stderr().write_all(&stderr)?;
            Ok(u8::try_from(code).unwrap_or(1))
        }
        ServiceReply::Error { message, .. } => {
            bail!("the Chidori server at {} did not run nvidia-smi: {message}", session.addr)
        }
        _ => bail!(
            "the Chidori server at {} answered nvidia-smi with something else: is it the same release?",
            session.addr
        ),
    }
}

/// The binary started as `nvidia-smi` (through the PATH `chidori run` gave a program): ask
/// the server of the session the program runs in.
pub fn as_program(args: &[OsString]) -> Result<u8> {
    let server = std::env::var(env::SERVER).map_err(|_| {
        anyhow::anyhow!(
            "this nvidia-smi is Chidori's: it shows the GPUs of the server `chidori run` uses, and {} is not set \
             (run it under `chidori run -s HOST`)",
            env::SERVER
        )
    })?;
    let token = std::env::var(env::TOKEN).ok().filter(|t| !t.is_empty());
    let explicit = std::env::var(env::FINGERPRINT).ok().filter(|f| !f.is_empty());
    let pins = chidori_tls::pin::Pins { explicit, file: Some(chidori_tls::token::config_dir().join("known_servers")) };
    relay(&server, &ClientAuth { token, pins }, args)
}

/// A directory whose `nvidia-smi` is this binary, to put first on a program's PATH (None
/// where none can be made: the program then finds its own, which cannot use Chidori's NVML).
pub fn tools_dir() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let dir = env::cache_dir()?.join("tools");
    std::fs::create_dir_all(&dir).ok()?;
    let link = dir.join(NAME);
    if std::fs::read_link(&link).ok().as_deref() != Some(exe.as_path()) {
        // Made beside and renamed over: another run may be using the old one.
        let tmp = dir.join(format!(".{NAME}.{}", std::process::id()));
        let _ = std::fs::remove_file(&tmp);
        std::os::unix::fs::symlink(&exe, &tmp).ok()?;
        std::fs::rename(&tmp, &link).ok()?;
    }
    Some(dir)
}

#[cfg(test)]
mod tests {
    #[test]
    fn nvidia_smi_is_told_by_its_name_wherever_it_is() {
        for yes in ["nvidia-smi", "/usr/bin/nvidia-smi", "./nvidia-smi"] {
            assert!(super::is_smi(yes.as_ref()), "{yes}");
        }
        for no in ["python", "nvidia-smi.sh", "/usr/bin/nvidia-smi/x", "nvidia"] {
            assert!(!super::is_smi(no.as_ref()), "{no}");
        }
    }
}
