//! The server's `nvidia-smi`, run for a client (`Service::NvidiaSmi`).
//!
//! A client's own `nvidia-smi` cannot use Chidori's NVML: before anything else it asks
//! NVML for a private table of some 240 unexported functions (`nvmlInternalGetExportTable`;
//! without it: "Mismatch in versions between nvidia-smi and NVML"), whose meaning NVIDIA
//! does not publish. So `chidori run … nvidia-smi` runs the server's, next to the GPUs, and
//! prints what it printed. Only what reads is run: the summary, `-L`, `-q` (with `-d`, `-x`,
//! `--dtd`, `-u`), the `--query-*=` selections with `--format=`, `topo -m`, help and
//! version. What changes a GPU (persistence, ECC, clocks, power limits, compute mode,
//! resets, MIG), writes a file on the server (`-f`, `--debug`), or runs until interrupted
//! (`-l`, `dmon`, `pmon`) is refused with a message that says so.
//!
//! Where the server exposes only some of its GPUs (`chidori serve --gpu`), the tool runs
//! once per GPU exposed, with `--id=` its UUID, so that no other GPU of the machine shows; a
//! program's `-i N` names the N-th GPU exposed, a UUID (or its prefix) one of those. (The
//! tool's session carries no `CUDA_VISIBLE_DEVICES`: like NVML, it sees every GPU the server
//! exposes.)

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use chidori_protocol::messages::ServiceReply;

/// The longest a run may take, and the most output it may give (each stream).
const TIME_LIMIT: Duration = Duration::from_secs(30);
const OUTPUT_MAX: usize = 8 << 20;

/// Names the server's nvidia-smi when it is not on the worker's PATH (tests use a stand-in).
pub const BINARY_ENV: &str = "CHIDORI_NVIDIA_SMI";

/// What a client asked for, once checked: the arguments to pass on, and the GPU it named.
#[derive(Debug, PartialEq, Eq)]
pub struct Checked {
    pub args: Vec<String>,
    /// The `-i`/`--id` value the program gave, without the option.
    pub id: Option<String>,
}

/// Check `args` against what may run for a client (module doc).
pub fn check(args: &[String]) -> Result<Checked, String> {
    let mut out = Vec::new();
    let mut id = None;
    let mut it = args.iter().peekable();
    if let Some(first) = it.peek()
        && !first.starts_with('-')
    {
        // A subcommand: only `topo -m` reads without touching anything.
        let sub = it.next().map(String::as_str).unwrap_or_default();
        let rest: Vec<&String> = it.collect();
        return match (sub, rest.as_slice()) {
            ("topo", [m]) if matches!(m.as_str(), "-m" | "--matrix") => {
                Ok(Checked { args: vec!["topo".into(), "-m".into()], id: None })
            }
            _ => Err(format!(
                "`nvidia-smi {sub}` is not run through Chidori: of the subcommands only `topo -m` is (the \
                 others change the GPUs or run until interrupted)"
            )),
        };
    }
    while let Some(arg) = it.next() {
        let (name, inline) = match arg.split_once('=') {
            Some((n, v)) if n.starts_with("--") => (n, Some(v.to_owned())),
            _ => (arg.as_str(), None),
        };
        let value = |it: &mut std::iter::Peekable<std::slice::Iter<'_, String>>| -> Result<String, String> {
            match inline.clone() {
                Some(v) => Ok(v),
                None => it.next().cloned().ok_or_else(|| format!("nvidia-smi {name} needs a value")),
            }
        };
        match name {
            "-h"
            | "--help"
            | "--version"
            | "-L"
            | "--list-gpus"
            | "-B"
            | "--list-excluded-gpus"
            | "-q"
            | "--query"
            | "-u"
            | "--unit"
            | "-x"
            | "--xml-format"
            | "--dtd" => out.push(arg.clone()),
            n if n.starts_with("--help-query-") && inline.is_none() => out.push(arg.clone()),
            n if n.starts_with("--query-") && inline.is_some() => out.push(arg.clone()),
            "--format" if inline.is_some() => out.push(arg.clone()),
            "-d" | "--display" => {
                let v = value(&mut it)?;
                out.push(format!("--display={v}"));
            }
            "-i" | "--id" => id = Some(value(&mut it)?),
            "-f" | "--filename" | "--debug" => {
                return Err(format!(
                    "nvidia-smi {name} writes a file on the Chidori server: not run; its output comes back to \
                     this machine (redirect it here)"
                ));
            }
            "-l" | "--loop" | "-lms" | "--loop-ms" => {
                return Err(format!(
                    "nvidia-smi {name} runs until interrupted: not run through Chidori (repeat the query, e.g. \
                     with `watch`)"
                ));
            }
            _ => {
                return Err(format!(
                    "nvidia-smi {arg} is not run through Chidori: only queries are (it would change the server's \
                     GPUs, or is not known to only read)"
                ));
            }
        }
    }
    Ok(Checked { args: out, id })
}

/// The `--id=` values to run with: the program's GPU `id` among the session's (`visible`,
/// UUIDs in the program's order), each GPU the session sees where the server shows it only
/// some (`all`: the session sees every GPU), or none (one run as asked).
pub fn targets(id: Option<&str>, visible: &[String], all: bool) -> Result<Vec<Option<String>>, String> {
    match id {
        Some(id) => {
            let found = match id.parse::<usize>() {
                Ok(i) => visible.get(i),
                Err(_) => visible.iter().find(|u| u.starts_with(id) && id.len() > 4),
            };
            match found {
                Some(uuid) => Ok(vec![Some(uuid.clone())]),
                None => Err(format!(
                    "nvidia-smi -i {id}: no such GPU in this session (it sees {}: give an index from 0 or a UUID)",
                    visible.len()
                )),
            }
        }
        None if all => Ok(vec![None]),
        None => Ok(visible.iter().cloned().map(Some).collect()),
    }
}

/// Run the server's nvidia-smi as `args` ask, for the session's GPUs.
pub fn run(args: &[String], visible: &[String], all: bool) -> ServiceReply {
    let refused = |message: String| ServiceReply::Tool { code: 2, stdout: Vec::new(), stderr: message.into_bytes() };
    let checked = match check(args) {
        Ok(c) => c,
        Err(message) => return refused(format!("chidori: {message}\n")),
    };
    // Help, version and the topology are not per GPU.
    let per_gpu = !checked.args.iter().any(|a| matches!(a.as_str(), "-h" | "--help" | "--version" | "topo"))
        && !checked.args.iter().any(|a| a.starts_with("--help-query-"));
    let runs = if per_gpu {
        match targets(checked.id.as_deref(), visible, all) {
            Ok(t) => t,
            Err(message) => return refused(format!("chidori: {message}\n")),
        }
    } else {
        vec![None]
    };
    let binary = std::env::var(BINARY_ENV).unwrap_or_else(|_| "nvidia-smi".to_owned());
    let (mut stdout, mut stderr, mut code) = (Vec::new(), Vec::new(), 0);
    for id in runs {
        let mut cmd = Command::new(&binary);
        cmd.args(&checked.args);
        if let Some(id) = id {
            cmd.arg(format!("--id={id}"));
        }
        match run_one(cmd) {
            Ok((c, out, err)) => {
                stdout.extend_from_slice(&out);
                stderr.extend_from_slice(&err);
                code = if code == 0 { c } else { code };
            }
            Err(e) => {
                return refused(format!("chidori: the server could not run {binary}: {e}\n"));
            }
        }
    }
    ServiceReply::Tool { code, stdout, stderr }
}

/// One run: its exit status and output, killed past [`TIME_LIMIT`].
fn run_one(mut cmd: Command) -> std::io::Result<(i32, Vec<u8>, Vec<u8>)> {
    let mut child = cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn()?;
    let take = |r: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(r) = r {
                let _ = r.take(OUTPUT_MAX as u64).read_to_end(&mut buf);
            }
            buf
        })
    };
    let out = take(child.stdout.take().map(|s| Box::new(s) as Box<dyn Read + Send>));
    let err = take(child.stderr.take().map(|s| Box::new(s) as Box<dyn Read + Send>));
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break Some(status);
        }
        if start.elapsed() > TIME_LIMIT {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let stdout = out.join().unwrap_or_default();
    let mut stderr = err.join().unwrap_or_default();
    let code = match status {
        Some(s) => s.code().unwrap_or(1),
        None => {
            stderr.extend_from_slice(format!("chidori: stopped after {} s\n", TIME_LIMIT.as_secs()).as_bytes());
            1
        }
    };
    Ok((code, stdout, stderr))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_owned).collect()
    }

    #[test]
    fn queries_run_and_changes_do_not() {
        for ok in [
            "",
            "-L",
            "-q",
            "-q -d MEMORY,UTILIZATION",
            "--query --display=POWER -x",
            "--query-gpu=name,memory.used --format=csv,noheader",
            "--query-compute-apps=pid,used_memory --format=csv",
            "--help-query-gpu",
            "topo -m",
            "--version",
        ] {
            assert!(check(&args(ok)).is_ok(), "{ok:?}");
        }
        for refused in [
            "-pm 1",
            "-e 0",
            "-r",
            "--gpu-reset",
            "-ac 1215,1410",
            "-pl 300",
            "-c EXCLUSIVE_PROCESS",
            "-mig 1",
            "-q -f /etc/passwd",
            "--query-gpu=name --format=csv --filename=out.csv",
            "--debug=log",
            "-l 1",
            "-q --loop=5",
            "dmon",
            "pmon -c 1",
            "topo -p2p r",
            "nvlink -s",
            "--query-gpu",
            "-d",
        ] {
            assert!(check(&args(refused)).is_err(), "{refused:?}");
        }
    }

    #[test]
    fn the_display_and_the_id_are_taken_apart() {
        let c = check(&args("-q -d MEMORY -i 1")).unwrap();
        assert_eq!(c, Checked { args: args("-q --display=MEMORY"), id: Some("1".into()) });
        let c = check(&args("--query-gpu=name --format=csv --id=GPU-abcd")).unwrap();
        assert_eq!(c.id.as_deref(), Some("GPU-abcd"));
    }

    #[test]
    fn ids_name_the_sessions_gpus() {
        let visible = vec!["GPU-aaaa-1".to_owned(), "GPU-bbbb-2".to_owned()];
        assert_eq!(targets(None, &visible, true), Ok(vec![None]), "every GPU: one run as asked");
        assert_eq!(targets(None, &visible, false), Ok(visible.iter().cloned().map(Some).collect()));
        assert_eq!(targets(Some("1"), &visible, true), Ok(vec![Some("GPU-bbbb-2".into())]));
        assert_eq!(targets(Some("GPU-aaaa"), &visible, false), Ok(vec![Some("GPU-aaaa-1".into())]));
        assert!(targets(Some("2"), &visible, true).is_err());
        assert!(targets(Some("GPU-cccc"), &visible, true).is_err());
        assert!(targets(Some("GPU"), &visible, true).is_err(), "too short a prefix");
    }

    #[test]
    fn a_run_gives_back_status_and_output_and_a_missing_tool_is_said() {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "echo out; echo err >&2; exit 3"]);
        let (code, out, err) = run_one(cmd).unwrap();
        assert_eq!((code, out.as_slice(), err.as_slice()), (3, &b"out\n"[..], &b"err\n"[..]));
        assert!(run_one(Command::new("/nonexistent/nvidia-smi")).is_err());
    }
}
