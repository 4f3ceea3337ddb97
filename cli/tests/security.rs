//! End-to-end tests of what makes a server safe to expose, on the emulated backend: TLS and
//! the token, pinned certificates, --max-sessions, frames that stall or announce more than
//! they send, and hostile calls (NULL and out-of-range arguments for every descriptor,
//! device addresses that are not the session's). No worker may crash; refusals carry the
//! library's status or a message that says what to do.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use chidori_cuda::calls::VARIANTS;
use chidori_protocol::desc::Wire;
use chidori_protocol::frame::{self, Frame, HEADER_LEN, Header, Kind, MAX_BULK};
use chidori_protocol::messages::{self, Call, Goodbye, Hello, NULL_LEN};

fn chidori() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_chidori"))
}

fn profile() -> PathBuf {
    chidori_tests::root().join("worker/profiles/nvidia-h200.json")
}

/// A `chidori serve --backend emulated` with extra flags, and what it printed before
/// listening.
struct Server {
    child: Child,
    address: String,
    lines: Vec<String>,
}

impl Server {
    fn start(extra: &[&str], envs: &[(&str, &str)]) -> Server {
        let mut cmd = Command::new(chidori());
        cmd.args(["serve", "--backend", "emulated", "--bind", "127.0.0.1", "--port", "0", "--profile"])
            .arg(profile())
            .args(extra)
            .env("CHIDORI_LOG", "warn")
            .stderr(Stdio::piped());
        for (k, v) in envs {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("starting chidori serve");
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let mut seen = Vec::new();
        let address = loop {
            let line = lines.next().expect("chidori serve exited before listening").unwrap();
            if let Some(rest) = line.strip_prefix("chidori serve: listening on ") {
                break rest.split(';').next().unwrap().trim().to_owned();
            }
            seen.push(line);
        };
        std::thread::spawn(move || for _ in lines.by_ref() {});
        Server { child, address, lines: seen }
    }

    /// The value after `flag` in the "clients connect with" line.
    fn printed(&self, flag: &str) -> String {
        let line = self.lines.iter().find(|l| l.contains("clients connect with")).expect("a connect line");
        let mut words = line.split_whitespace();
        words.find(|w| *w == flag).unwrap_or_else(|| panic!("{flag} in {line}"));
        words.next().unwrap().to_owned()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Session workers (children) of `pid`.
fn children(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(child) = entry.file_name().to_string_lossy().parse::<u32>() else { continue };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{child}/stat")) else { continue };
        let Some((_, rest)) = stat.rsplit_once(')') else { continue };
        let ppid: u32 = rest.split_whitespace().nth(1).and_then(|p| p.parse().ok()).unwrap_or(0);
        if ppid == pid && !rest.trim_start().starts_with('Z') {
            out.push(child);
        }
    }
    out
}

fn program(name: &str, source: &str) -> PathBuf {
    let dir = chidori_tests::scratch(name);
    let src = dir.join(format!("{name}.c"));
    std::fs::write(&src, source).unwrap();
    let exe = dir.join(name);
    let include = chidori_tests::runtime_headers("13.0");
    let stub = chidori_tests::root().join("headers/stub");
    let flags = [
        format!("-I{}", include.display()),
        format!("-I{}", stub.display()),
        format!("-L{}", chidori_tests::shim_dir().display()),
        "-l:libcudart.so.13".to_owned(),
        "-l:libcuda.so.1".to_owned(),
        "-lpthread".to_owned(),
    ];
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    chidori_tests::cc(&src, &exe, &flags);
    exe
}

/// `chidori run -s ADDRESS ARGS -- exe`, with its own config directory (pins).
fn run(address: &str, config: &Path, args: &[&str], exe: &Path) -> (bool, String, String) {
    let out = Command::new(chidori())
        .args(["run", "-s", address, "--lib-dir"])
        .arg(chidori_tests::shim_dir())
        .args(args)
        .arg("--")
        .arg(exe)
        .env("XDG_CONFIG_HOME", config)
        .env_remove("CHIDORI_TOKEN")
        .env_remove("CHIDORI_FINGERPRINT")
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Copies a program makes through the server, and ones it must not be able to make.
const COPIES: &str = include_str!("../../gpu/bench/escape.c");

#[test]
fn tls_with_a_token_and_a_pinned_certificate() {
    let dir = chidori_tests::scratch("tls");
    let server_config = dir.join("server");
    let server = Server::start(&["--secure"], &[("XDG_CONFIG_HOME", server_config.to_str().unwrap())]);
    let token = server.printed("--token");
    let fingerprint = server.printed("--fingerprint");
    assert_eq!(token, std::fs::read_to_string(server_config.join("chidori/token")).unwrap().trim());
    let exe = program("tls-copies", COPIES);
    let client = dir.join("client");

    // No token: the server wants TLS and says how to connect.
    let (ok, _, err) = run(&server.address, &client, &[], &exe);
    assert!(!ok && err.contains("requires TLS and a token") && err.contains("--token"), "{err}");
    // A wrong token: Unauthorized, with what to do (the TLS handshake before it pinned the
    // certificate: the first TLS connection to a server does).
    let (ok, _, err) = run(&server.address, &client, &["--token", "0123"], &exe);
    assert!(!ok && err.contains("wrong token") && err.contains("--token"), "{err}");
    assert!(err.contains("pinned its certificate"), "{err}");
    // The right token: copies work.
    let (ok, out, err) = run(&server.address, &client, &["--token", &token], &exe);
    assert!(ok && out.contains("OK made_up=1 handle=1 past_end=1"), "{out}\n{err}");
    let known = std::fs::read_to_string(client.join("chidori/known_servers")).unwrap();
    assert_eq!(known.trim(), format!("{} {fingerprint}", server.address));
    // Large copies travel on bulk lanes, each with its own TLS, the token and the lane
    // secret: their bytes arrive intact.
    let lanes = program("tls-lane-copies", include_str!("../../gpu/bench/lane_copies.c"));
    let (ok, out, err) = run(&server.address, &client, &["--token", &token], &lanes);
    assert!(ok && out.contains("OK"), "{out}\n{err}");
    // The explicit fingerprint printed by the server works from a fresh client too.
    let (ok, out, err) =
        run(&server.address, &dir.join("client2"), &["--token", &token, "--fingerprint", &fingerprint], &exe);
    assert!(ok && out.contains("OK"), "{out}\n{err}");

    // nvidia-smi is the server's over TLS too: run directly, and from a program, whose
    // Chidori nvidia-smi presents the session's token and pin from its environment.
    let fake = dir.join("server-nvidia-smi");
    chidori_tests::script(&fake, "#!/bin/sh\necho \"server nvidia-smi: $*\"\n");
    let smi_config = dir.join("smi-server");
    let smi_server = Server::start(
        &["--secure"],
        &[("XDG_CONFIG_HOME", smi_config.to_str().unwrap()), ("CHIDORI_NVIDIA_SMI", fake.to_str().unwrap())],
    );
    let smi_token = smi_server.printed("--token");
    let (ok, out, err) = run(&smi_server.address, &client, &["--token", &smi_token], Path::new("nvidia-smi"));
    assert!(ok && out == "server nvidia-smi: \n", "{out}\n{err}");
    let script = dir.join("calls-nvidia-smi.sh");
    chidori_tests::script(&script, "#!/bin/sh\nexec nvidia-smi -L\n");
    let (ok, out, err) = run(&smi_server.address, &client, &["--token", &smi_token], &script);
    assert!(ok && out == "server nvidia-smi: -L\n", "{out}\n{err}");

    // A changed certificate (here: a changed pin) is refused, saying what to do.
    let other = format!("sha256:{}", "ab".repeat(32));
    std::fs::write(client.join("chidori/known_servers"), format!("{} {other}\n", server.address)).unwrap();
    let (ok, _, err) = run(&server.address, &client, &["--token", &token], &exe);
    assert!(!ok && err.contains(&fingerprint) && err.contains("delete that line"), "{err}");
    let (ok, _, err) = run(&server.address, &dir.join("client3"), &["--token", &token, "--fingerprint", &other], &exe);
    assert!(!ok && err.contains("intercepting"), "{err}");
}

#[test]
fn copies_from_addresses_that_are_not_the_sessions_are_refused() {
    let dir = chidori_tests::scratch("made-up");
    let server = Server::start(&[], &[]);
    let exe = program("made-up-copies", COPIES);
    let (ok, out, err) = run(&server.address, &dir, &[], &exe);
    assert!(ok, "{out}\n{err}");
    // CUDA_ERROR_INVALID_VALUE for each, and the session lives on.
    assert!(out.contains("OK made_up=1 handle=1 past_end=1"), "{out}\n{err}");
}

/// A program that connects and then waits for a line on stdin.
const WAITER: &str = r#"
#include <stdio.h>
#include <cuda_runtime_api.h>
int main(void) {
  void *d; int e = cudaMalloc(&d, 1 << 20);
  printf("READY %d\n", e); fflush(stdout);
  char line[16]; if (!fgets(line, sizeof line, stdin)) return 3;
  return 0;
}
"#;

#[test]
fn sessions_beyond_max_sessions_are_busy() {
    let dir = chidori_tests::scratch("busy");
    let server = Server::start(&["--max-sessions", "2"], &[]);
    let exe = program("busy-waiter", WAITER);
    let mut waiters = Vec::new();
    for _ in 0..2 {
        let mut child = Command::new(chidori())
            .args(["run", "-s", &server.address, "--lib-dir"])
            .arg(chidori_tests::shim_dir())
            .arg("--")
            .arg(&exe)
            .env("XDG_CONFIG_HOME", &dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "READY 0");
        waiters.push(child);
    }
    let (ok, _, err) = run(&server.address, &dir, &[], &exe);
    assert!(!ok && err.contains("busy") && err.contains("--max-sessions"), "{err}");
    for mut w in waiters {
        w.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
        w.wait().unwrap();
    }
    // Once they are gone, there is room again.
    let supervisor = server.child.id();
    let start = Instant::now();
    while !children(supervisor).is_empty() && start.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut child = Command::new(chidori())
        .args(["run", "-s", &server.address, "--lib-dir"])
        .arg(chidori_tests::shim_dir())
        .arg("--")
        .arg(&exe)
        .env("XDG_CONFIG_HOME", &dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
    let mut out = String::new();
    child.stdout.take().unwrap().read_to_string(&mut out).unwrap();
    assert!(child.wait().unwrap().success() && out.contains("READY 0"), "{out}");
}

fn hello() -> Vec<u8> {
    let hello = Hello {
        protocol: chidori_protocol::PROTOCOL_VERSION,
        schema: chidori_cuda::calls::SCHEMA_HASH,
        client_version: "test".into(),
        pid: 1,
        host: "hostile".into(),
        program: "test".into(),
        token: String::new(),
        resume: false,
        content: None,
        visible_devices: None,
    };
    frame::to_vec(Header::new(Kind::Hello, 0, 0, 0), &messages::encode(&hello), &[]).unwrap()
}

/// Connect, say hello and read the Welcome.
fn session(address: &str) -> TcpStream {
    let mut s = TcpStream::connect(address).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(&hello()).unwrap();
    let welcome = read_frame(&mut s).expect("a welcome");
    assert_eq!(welcome.header.kind, Kind::Welcome);
    s
}

fn read_frame(s: &mut TcpStream) -> Option<Frame> {
    chidori_tls::read_plain_frame(s).ok()
}

/// The resident and data sizes (KiB) of process `pid`.
fn memory_kib(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmData:"))
}

#[test]
fn stalled_and_oversized_frames_end_only_their_session() {
    // The server's heartbeat is 1 s: a frame that stops for 2 s ends its session.
    let server = Server::start(&["--heartbeat-secs", "1"], &[]);
    let supervisor = server.child.id();

    // A frame announcing the largest bulk section, of which 1 KiB arrives.
    let mut big = session(&server.address);
    let worker = *children(supervisor).first().expect("a session worker");
    let before = memory_kib(worker);
    let mut h = Header::new(Kind::Call, 0, 1, 1);
    h.bulk_len = MAX_BULK as u32;
    big.write_all(&h.encode()).unwrap();
    big.write_all(&[0u8; 1024]).unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let during = memory_kib(worker);
    assert!(
        during.1 < before.1 + (32 << 10),
        "the worker reserved {} KiB for a frame that sent 1 KiB (data size {} → {} KiB)",
        during.1 - before.1,
        before.1,
        during.1
    );

    // A stalled partial frame ends the session within seconds, with a Goodbye saying why.
    let start = Instant::now();
    let mut reason = String::new();
    while let Some(f) = read_frame(&mut big) {
        if f.header.kind == Kind::Goodbye {
            reason = messages::decode::<Goodbye>(&f, "goodbye").unwrap().reason;
            break;
        }
    }
    let took = start.elapsed();
    assert!(took < Duration::from_secs(6), "the stalled session lasted {took:?}");
    assert!(reason.contains("stopped sending"), "{reason}");

    // The server still serves others.
    let mut s = session(&server.address);
    s.write_all(&frame::to_vec(Header::new(Kind::Ping, 0, 0, 9), &[], &[]).unwrap()).unwrap();
    assert_eq!(read_frame(&mut s).map(|f| f.header.kind), Some(Kind::Pong));
}

/// The arguments of a hostile call: every pointer NULL, values zero, small, huge or a
/// made-up device address (by-value records get their size in zeros).
fn hostile_calls() -> Vec<(u32, Call, Vec<u8>)> {
    let mut out = Vec::new();
    for desc in VARIANTS {
        let n = desc.params.len();
        for value in [0u64, 3, u64::MAX, 0x7e00_dead_0000] {
            let lens = desc
                .params
                .iter()
                .map(|w| match w {
                    Wire::Buf { .. }
                    | Wire::Handles { .. }
                    | Wire::Scalar { .. }
                    | Wire::Str
                    | Wire::OutHandle { .. } => NULL_LEN,
                    Wire::ByValRecord { bytes } => u64::from(*bytes),
                    _ => 0,
                })
                .collect::<Vec<u64>>();
            let records: u64 = desc
                .params
                .iter()
                .map(|w| if let Wire::ByValRecord { bytes } = w { u64::from(*bytes) } else { 0 })
                .sum();
            out.push((desc.wire, Call { args: vec![value; n], lens }, vec![0u8; records as usize]));
        }
    }
    out
}

#[test]
fn hostile_calls_for_every_descriptor_crash_no_worker() {
    let server = Server::start(&[], &[]);
    let calls = hostile_calls();
    let marker = VARIANTS
        .iter()
        .rev()
        .find(|d| d.name == "cudaDeviceSynchronize" && d.waits() && d.params.is_empty())
        .expect("cudaDeviceSynchronize");
    let (mut answered, mut ended, mut crashed) = (0usize, 0usize, Vec::new());
    let mut next = 0;
    while next < calls.len() {
        let mut s = session(&server.address);
        // A batch, then a device synchronize: it runs after every call of the batch (one
        // client thread, one executor), so its reply says the session lived through them.
        let batch = &calls[next..calls.len().min(next + 256)];
        let mut bytes = Vec::new();
        for (i, (wire, call, bulk)) in batch.iter().enumerate() {
            let h = Header::new(Kind::Call, *wire, 1, (next + i) as u64);
            bytes.extend(frame::to_vec(h, &messages::encode(call), &[bulk]).unwrap());
        }
        let sync = Call { args: vec![], lens: vec![] };
        let h = Header::new(Kind::Call, marker.wire, 1, u64::MAX);
        bytes.extend(frame::to_vec(h, &messages::encode(&sync), &[]).unwrap());
        let _ = s.write_all(&bytes);
        let mut last_seq = next as u64;
        loop {
            match read_frame(&mut s) {
                // A host function of a stream: run (nothing) and say so.
                Some(f) if f.header.kind == Kind::HostCallback => {
                    let cb: messages::HostCallback = messages::decode(&f, "host callback").unwrap();
                    let done = messages::HostCallbackDone { token: cb.token };
                    let h = Header::new(Kind::HostCallbackDone, 0, 0, 0);
                    let _ = s.write_all(&frame::to_vec(h, &messages::encode(&done), &[]).unwrap());
                }
                Some(f) if f.header.kind == Kind::Ping => {
                    let _ = s.write_all(&frame::to_vec(Header::new(Kind::Pong, 0, 0, f.header.seq), &[], &[]).unwrap());
                }
                Some(f) if f.header.seq == u64::MAX => {
                    next += batch.len();
                    break;
                }
                Some(f) if f.header.kind == Kind::Goodbye => {
                    // A call broke the protocol (a refusal, logged): go on after it.
                    let reason = messages::decode::<Goodbye>(&f, "goodbye").map(|g| g.reason).unwrap_or_default();
                    if ended < 5 {
                        eprintln!("session refused a frame: {reason}");
                    }
                    ended += 1;
                    next = (last_seq as usize + 1).max(next + 1);
                    break;
                }
                Some(f) => {
                    answered += 1;
                    last_seq = last_seq.max(f.header.seq);
                }
                None => {
                    // Closed without a Goodbye: the worker died.
                    let (wire, _, _) = &calls[(last_seq as usize + 1).min(calls.len() - 1)];
                    crashed.push(VARIANTS[*wire as usize].name);
                    next = (last_seq as usize + 2).max(next + 1);
                    break;
                }
            }
        }
    }
    eprintln!("{} hostile calls: {answered} answered, {ended} sessions refused a frame", calls.len());
    assert!(crashed.is_empty(), "workers died after: {crashed:?}");
    let _ = HEADER_LEN;
}

/// Chidori's own requests with made-up values (handles, addresses, hashes, a launch of no
/// function, a refused nvidia-smi): each is answered (an error saying what was wrong, or
/// nothing for those never answered) and the session lives on; no worker dies.
#[test]
fn hostile_services_crash_no_worker() {
    use chidori_protocol::messages::{
        Api, GraphList, GraphLoop, GraphNode, JitLinkRequest, Launch, LinkRequest, LoopCopy, NodeParams, NodeTarget,
        Service, ServiceReply,
    };
    use chidori_protocol::mirror::STAND_IN_KEYS;
    let server = Server::start(&[], &[]);
    let junk = 0x7e00_dead_0000u64;
    let launch = Launch {
        function: junk,
        grid: [u32::MAX; 3],
        block: [0; 3],
        shared_mem: u32::MAX,
        stream: junk,
        attributes: vec![(u32::MAX, vec![0xff; 64])],
        cooperative: true,
        api: Api::Driver,
    };
    // (request, bulk, answered)
    let requests: Vec<(Service, Vec<u8>, bool)> = vec![
        (Service::LoadModule { hash: [7; 32] }, vec![], true),
        (Service::LoadModuleBehind { hash: [7; 32] }, vec![], true),
        // An image neither the server nor this client has: asked of the client, never sent.
        (
            Service::LoadModuleNamed {
                hash: [7; 32],
                library: junk + 0x10,
                module: junk + 0x11,
                kernels: vec![("k".into(), junk + 0x12)],
            },
            vec![],
            false,
        ),
        (Service::Global { module: junk, name: "x".repeat(10_000) }, vec![], true),
        (Service::FunctionParams { function: junk }, vec![], true),
        (Service::FunctionName { handle: junk, kernel: true }, vec![], true),
        (Service::FunctionName { handle: 0, kernel: false }, vec![], true),
        (Service::MirrorPull { bases: vec![junk, 0, u64::MAX], from: u64::MAX }, vec![], true),
        (Service::MirrorDrop { base: junk }, vec![], false),
        // Stand-ins: a key without the client's address, an address without a key, one in
        // kernel space, one past the session's limit, runs past the end; then a good one
        // (its worker pages wherever the worker puts them), pulled and dropped.
        (Service::MirrorWrite { base: STAND_IN_KEYS, len: 4096, runs: vec![(0, 4)], client: 0 }, vec![1; 4], false),
        (Service::MirrorWrite { base: junk, len: 4096, runs: vec![], client: junk }, vec![], false),
        (Service::MirrorWrite { base: STAND_IN_KEYS, len: 4096, runs: vec![], client: u64::MAX - 4095 }, vec![], false),
        (Service::MirrorWrite { base: STAND_IN_KEYS + 1, len: 1 << 40, runs: vec![], client: junk }, vec![], false),
        (Service::MirrorWrite { base: STAND_IN_KEYS + 2, len: 8, runs: vec![(6, 4)], client: junk }, vec![1; 4], false),
        (
            Service::MirrorWrite { base: STAND_IN_KEYS + 3, len: 8192, runs: vec![(8190, 2)], client: junk },
            vec![7; 2],
            false,
        ),
        (Service::MirrorPull { bases: vec![STAND_IN_KEYS + 3, STAND_IN_KEYS], from: 0 }, vec![], true),
        (Service::MirrorDrop { base: STAND_IN_KEYS + 3 }, vec![], false),
        (Service::GraphList(GraphList::Nodes { graph: junk }), vec![], true),
        (Service::GraphList(GraphList::Edges { graph: 0 }), vec![], true),
        (Service::GraphList(GraphList::Dependents { node: junk }), vec![], true),
        (Service::GraphList(GraphList::Capture { stream: junk }), vec![], true),
        (Service::GraphList(GraphList::Ended { stream: junk }), vec![], true),
        (Service::GraphList(GraphList::Ended { stream: 0 }), vec![], true),
        (Service::GraphDot { graph: junk, flags: u32::MAX }, vec![], true),
        (
            Service::Link(LinkRequest { options: vec![(u32::MAX, junk)], inputs: vec![(99, "x".into(), vec![1])] }),
            vec![],
            true,
        ),
        (
            Service::JitLink(JitLinkRequest {
                options: vec!["-arch=sm_0".into()],
                inputs: vec![(99, "x".into(), vec![])],
            }),
            vec![],
            true,
        ),
        (Service::ClusterOccupancy { launch: launch.clone(), potential: true }, vec![], true),
        (Service::ClusterOccupancy { launch, potential: false }, vec![], true),
        (Service::NvidiaSmi { args: vec!["--gpu-reset".into()] }, vec![], true),
        (
            Service::GraphNode(GraphNode {
                target: NodeTarget::Add { graph: junk, dependencies: vec![junk; 3], edge_data: vec![] },
                params: NodeParams::Kernel { function: junk, grid: [1; 3], block: [1; 3], shared_mem: 0 },
                api: Api::Runtime,
            }),
            vec![0xff; 64],
            true,
        ),
        (
            Service::GraphNode(GraphNode {
                target: NodeTarget::Set { node: junk },
                params: NodeParams::MemAlloc {
                    alloc_type: u32::MAX,
                    location: (u32::MAX, -1),
                    max_size: u64::MAX,
                    access: vec![(u32::MAX, -1, u32::MAX); 100],
                    bytesize: u64::MAX,
                },
                api: Api::Driver,
            }),
            vec![],
            true,
        ),
        (
            Service::GraphNode(GraphNode {
                target: NodeTarget::Add { graph: junk, dependencies: vec![], edge_data: vec![junk] },
                params: NodeParams::BatchMemOp { ctx: junk, count: u32::MAX, flags: u32::MAX },
                api: Api::Driver,
            }),
            vec![0xff; 48],
            true,
        ),
        (
            Service::GraphNode(GraphNode {
                target: NodeTarget::ExecSet { exec: junk, node: junk },
                params: NodeParams::BatchMemOp { ctx: 0, count: 1, flags: 0 },
                api: Api::Runtime,
            }),
            vec![2; 48],
            true,
        ),
        (
            Service::GraphLoop(GraphLoop {
                exec: junk,
                stream: junk,
                max_steps: u32::MAX,
                check_every: 0,
                stop_flag: junk,
                output: junk,
                bytes_per_step: u32::MAX,
                progress_ms: 0,
                tail: true,
                then_copy: Some(LoopCopy { dst: junk, src: junk, bytes: u64::MAX }),
            }),
            vec![],
            true,
        ),
        (Service::NcclLastError { comm: junk }, vec![], true),
        (Service::MemoryWindow { device: -1 }, vec![], true),
        (Service::MemoryWindow { device: i32::MAX }, vec![], true),
        (Service::MemoryWindow { device: 0 }, vec![], true),
        (Service::WindowUnmap { address: junk }, vec![], true),
        (Service::WindowUnmap { address: 0 }, vec![], true),
        (Service::WindowReset { device: -1 }, vec![], false),
        (Service::WindowReset { device: 0 }, vec![], false),
        // A capture named on a stream of no one's, and on one that is not capturing: nothing.
        (Service::CaptureNamed { stream: junk, id: 7, graph: junk }, vec![], false),
        (Service::CaptureNamed { stream: 2, id: 9, graph: junk + 1 }, vec![], false),
        (Service::NcclLastError { comm: 0 }, vec![], true),
        (
            Service::StatusTexts { library: "cudart".into(), function: "cudaMalloc".into(), values: vec![1] },
            vec![],
            true,
        ),
        (
            Service::StatusTexts {
                library: "cusparse".into(),
                function: "cusparseGetErrorString".into(),
                values: vec![junk as i64; 5000],
            },
            vec![],
            true,
        ),
        (
            Service::StatusTexts {
                library: "cusparse".into(),
                function: "cusparseGetErrorString".into(),
                values: vec![i64::MIN, -1, i64::MAX],
            },
            vec![],
            true,
        ),
    ];
    // An upload whose bytes are not the image its hash names breaks the protocol: that
    // session ends, saying why; the server serves the next.
    let mut s = session(&server.address);
    let h = Header::new(Kind::Service, 0, 1, 1);
    let upload = Service::UploadModule { hash: [7; 32] };
    s.write_all(&frame::to_vec(h, &messages::encode(&upload), &[&[0xff; 4096]]).unwrap()).unwrap();
    assert!(goodbye_reason(&mut s).contains("does not match its hash"));
    // A module image no load waits for (one that came too late) is dropped; the session
    // goes on.
    let mut s = session(&server.address);
    let image = messages::ModuleImage { hash: [7; 32] };
    s.write_all(
        &frame::to_vec(Header::new(Kind::ModuleImage, 0, 0, 0), &messages::encode(&image), &[&[1; 64]]).unwrap(),
    )
    .unwrap();
    s.write_all(&frame::to_vec(Header::new(Kind::Ping, 0, 0, 5), &[], &[]).unwrap()).unwrap();
    loop {
        let f = read_frame(&mut s).expect("a pong after the image");
        assert_ne!(f.header.kind, Kind::Goodbye, "{f:?}");
        if f.header.kind == Kind::Pong {
            break;
        }
    }
    // A module load named with a name that is no name (0), or one named twice, ends the
    // session, saying why.
    for (library, module) in [(0, junk), (junk, junk)] {
        let mut s = session(&server.address);
        let load = Service::LoadModuleNamed { hash: [7; 32], library, module, kernels: vec![] };
        s.write_all(&frame::to_vec(Header::new(Kind::Service, 0, 1, 1), &messages::encode(&load), &[]).unwrap())
            .unwrap();
        assert!(goodbye_reason(&mut s).contains("names that are taken or repeated"));
    }
    // So does an allocation placed where no correct client places one: outside its window,
    // or over one placed before.
    // 0: outside the window; 1: placed and freed (the session goes on); 2: placed twice;
    // 3: more than the device has (the GPU cannot make it: the program was told it had it).
    for n in 0..4 {
        let mut s = session(&server.address);
        let window = Service::MemoryWindow { device: 0 };
        s.write_all(&frame::to_vec(Header::new(Kind::Service, 0, 1, 1), &messages::encode(&window), &[]).unwrap())
            .unwrap();
        let f = read_frame(&mut s).expect("the window");
        let Ok(ServiceReply::Window { base, size: window, granularity, .. }) = messages::decode(&f, "window") else {
            panic!("no window: {f:?}")
        };
        let (address, size) = match n {
            0 => (junk, 2 << 20),
            3 => (base, window),
            _ => (base, granularity),
        };
        let maps = if n == 2 { 2 } else { 1 };
        for seq in 0..maps {
            let map = Service::WindowMap { device: 0, address, size };
            let h = Header::new(Kind::Service, 0, 1, 2 + seq);
            s.write_all(&frame::to_vec(h, &messages::encode(&map), &[]).unwrap()).unwrap();
        }
        if n == 1 {
            let unmap = Service::WindowUnmap { address };
            s.write_all(&frame::to_vec(Header::new(Kind::Service, 0, 1, 3), &messages::encode(&unmap), &[]).unwrap())
                .unwrap();
            let f = read_frame(&mut s).expect("the free's answer");
            assert!(matches!(messages::decode(&f, "free"), Ok(ServiceReply::Value(0))), "{f:?}");
            continue;
        }
        let reason = goodbye_reason(&mut s);
        let why =
            if n == 3 { "the GPU could not make" } else { "the client placed an allocation the server cannot make" };
        assert!(reason.contains(why), "{reason}");
    }

    let nccl_junk = requests
        .iter()
        .position(|(r, _, _)| matches!(r, Service::NcclLastError { comm } if *comm == junk))
        .expect("the NCCL request") as u64
        + 1;
    let mut s = session(&server.address);
    let mut expected = Vec::new();
    for (seq, (request, bulk, answered)) in requests.iter().enumerate() {
        let h = Header::new(Kind::Service, 0, 1, seq as u64 + 1);
        s.write_all(&frame::to_vec(h, &messages::encode(request), &[bulk]).unwrap()).unwrap();
        if *answered {
            expected.push(seq as u64 + 1);
        }
    }
    let mut got = Vec::new();
    while got.len() < expected.len() {
        let f = read_frame(&mut s).expect("the worker answers every request (none may kill it)");
        match f.header.kind {
            Kind::ServiceReply => {
                let reply: ServiceReply = messages::decode(&f, "service reply").unwrap();
                if f.header.seq == nccl_junk {
                    // ncclGetLastError of a communicator of no one's: refused, with why.
                    assert!(
                        matches!(&reply, ServiceReply::Error { message, .. } if message.contains("no NCCL communicator")),
                        "{reply:?}"
                    );
                }
                got.push(f.header.seq);
            }
            Kind::Ping => {
                s.write_all(&frame::to_vec(Header::new(Kind::Pong, 0, 0, f.header.seq), &[], &[]).unwrap()).unwrap();
            }
            Kind::Goodbye => {
                panic!("the session ended: {:?}", messages::decode::<Goodbye>(&f, "goodbye").map(|g| g.reason))
            }
            _ => {}
        }
    }
    got.sort_unstable();
    assert_eq!(got, expected);
    // The session still works.
    s.write_all(&frame::to_vec(Header::new(Kind::Ping, 0, 0, 9), &[], &[]).unwrap()).unwrap();
    loop {
        let f = read_frame(&mut s).expect("a pong");
        if f.header.kind == Kind::Pong {
            break;
        }
    }
}

/// Read frames until a Goodbye: its reason (empty if the connection ends without one).
fn goodbye_reason(s: &mut TcpStream) -> String {
    while let Some(f) = read_frame(s) {
        if f.header.kind == Kind::Goodbye {
            return messages::decode::<Goodbye>(&f, "goodbye").unwrap().reason;
        }
    }
    String::new()
}

/// Join session `session` as bulk lane `lane` with `secret`: the server's answer.
fn join_lane(address: &str, session: u64, lane: u8, secret: &[u8]) -> Option<Frame> {
    let mut s = TcpStream::connect(address).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(&Header::new(Kind::Resume, 0, 0, session).encode()).unwrap();
    let request = messages::ResumeRequest { token: String::new(), secret: secret.to_vec(), received: 0, lane };
    s.write_all(&frame::to_vec(Header::new(Kind::Resume, 0, 0, session), &messages::encode(&request), &[]).unwrap())
        .unwrap();
    read_frame(&mut s)
}

#[test]
fn bulk_lanes_take_only_the_sessions_secret_and_calls_in_order() {
    let server = Server::start(&["--heartbeat-secs", "1"], &[]);
    let mut s = TcpStream::connect(&server.address).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(&hello()).unwrap();
    let welcome: messages::Welcome = messages::decode(&read_frame(&mut s).unwrap(), "welcome").unwrap();
    assert!(welcome.lanes > 0 && welcome.lane_secret.len() >= 16, "lanes are offered with a secret");

    // A wrong secret, a lane past those offered, and the lane secret as a resume are refused.
    let mut wrong = welcome.lane_secret.clone();
    wrong[0] ^= 1;
    for (lane, secret) in [(1, &wrong), (welcome.lanes + 1, &welcome.lane_secret), (0, &welcome.lane_secret)] {
        let answer = join_lane(&server.address, welcome.session, lane, secret).map(|f| f.header.kind);
        assert_eq!(answer, Some(Kind::Refuse), "lane {lane}");
    }
    // The right one joins.
    let answer = join_lane(&server.address, welcome.session, 1, &welcome.lane_secret).map(|f| f.header.kind);
    assert_eq!(answer, Some(Kind::Resumed));

    // A call said to come on a lane that was never opened ends the session with a reason.
    s.write_all(&frame::to_vec(Header::new(Kind::Lane, 5, 1, 1), &[], &[]).unwrap()).unwrap();
    let reason = goodbye_reason(&mut s);
    assert!(reason.contains("bulk lane 5") && reason.contains("never opened"), "{reason}");

    // A lane frame that is not the call its marker names ends the session too.
    let mut s = TcpStream::connect(&server.address).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(&hello()).unwrap();
    let welcome: messages::Welcome = messages::decode(&read_frame(&mut s).unwrap(), "welcome").unwrap();
    let mut lane = TcpStream::connect(&server.address).unwrap();
    lane.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    lane.write_all(&Header::new(Kind::Resume, 0, 0, welcome.session).encode()).unwrap();
    let request =
        messages::ResumeRequest { token: String::new(), secret: welcome.lane_secret.clone(), received: 0, lane: 2 };
    let head = Header::new(Kind::Resume, 0, 0, welcome.session);
    lane.write_all(&frame::to_vec(head, &messages::encode(&request), &[]).unwrap()).unwrap();
    assert_eq!(read_frame(&mut lane).map(|f| f.header.kind), Some(Kind::Resumed));
    lane.write_all(&frame::to_vec(Header::new(Kind::Call, 0, 1, 8), &[], &[]).unwrap()).unwrap();
    s.write_all(&frame::to_vec(Header::new(Kind::Lane, 2, 1, 7), &[], &[]).unwrap()).unwrap();
    let reason = goodbye_reason(&mut s);
    assert!(reason.contains("bulk lane 2 carried") && reason.contains("expected call 7"), "{reason}");

    // The server still serves others.
    let mut s = session(&server.address);
    s.write_all(&frame::to_vec(Header::new(Kind::Ping, 0, 0, 9), &[], &[]).unwrap()).unwrap();
    assert_eq!(read_frame(&mut s).map(|f| f.header.kind), Some(Kind::Pong));
}
