//! End-to-end tests of `chidori serve` and `chidori run` on the emulated backend: the
//! version matrix, and the reliability promises (bad frames end only their session, a
//! killed client frees its session, a dead or hung server is a clear error, not a hang).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use chidori_protocol::frame::{self, Frame, HEADER_LEN, Header, Kind};
use xtask::matrix::EmulatedServer;

fn chidori() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_chidori"))
}

fn profile() -> PathBuf {
    chidori_tests::root().join("worker/profiles/nvidia-h200.json")
}

fn server() -> EmulatedServer {
    EmulatedServer::start(&chidori(), &profile()).expect("starting an emulated server")
}

/// A server of the same GPU and versions whose libraries answer otherwise
/// (`CHIDORI_EMULATED_SALT`): what a test of answers learned in an earlier session runs
/// against to see a different answer end the session.
fn salted_server() -> EmulatedServer {
    EmulatedServer::start_env(&chidori(), Some(&profile()), &[], &[("CHIDORI_EMULATED_SALT", "5")])
        .expect("starting an emulated server")
}

/// Compile a C program against the CUDA 13.0 runtime headers and the 13.0 shim.
fn program(name: &str, source: &str) -> PathBuf {
    program_with(name, source, &[])
}

/// As [`program`], also linked with the shims `libs` (`-l:libcublas.so.13`, …).
fn program_with(name: &str, source: &str, libs: &[&str]) -> PathBuf {
    program_against("13.0", name, source, libs)
}

/// As [`program_with`], built against the runtime headers of CUDA `version`.
fn program_against(version: &str, name: &str, source: &str, libs: &[&str]) -> PathBuf {
    let dir = chidori_tests::scratch(name);
    let src = dir.join(format!("{name}.c"));
    std::fs::write(&src, source).unwrap();
    let exe = dir.join(name);
    let include = chidori_tests::runtime_headers(version);
    let stub = chidori_tests::root().join("headers/stub");
    let flags = [
        format!("-I{}", include.display()),
        format!("-I{}", stub.display()),
        format!("-L{}", chidori_tests::shim_dir().display()),
        "-l:libcudart.so.13".to_owned(),
    ];
    let flags: Vec<&str> = flags.iter().map(String::as_str).chain(libs.iter().copied()).collect();
    chidori_tests::cc(&src, &exe, &flags);
    exe
}

/// `chidori run` of `exe`. Answers learned in earlier sessions are off: every emulated server
/// has the same identity, so one test's runs would change another's round trips (the tests
/// of learning turn it on, each with a cache directory of its own).
fn run_cmd(server: &str, exe: &Path) -> Command {
    let mut cmd = Command::new(chidori());
    cmd.args(["run", "-s", server, "--lib-dir"]).arg(chidori_tests::shim_dir()).arg("--").arg(exe);
    cmd.env("CHIDORI_LEARNED", "0");
    cmd
}

/// Run `exe` through `chidori run --trace` and expect it to succeed: its stdout and stderr
/// (the trace table at the end).
fn run_traced(server: &EmulatedServer, exe: &Path) -> (String, String) {
    let mut cmd = Command::new(chidori());
    cmd.args(["run", "--trace", "-s", &server.address, "--lib-dir"]).arg(chidori_tests::shim_dir()).arg("--").arg(exe);
    cmd.env("CHIDORI_LEARNED", "0");
    let out = cmd.output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "status {:?}; stdout: {stdout}; stderr: {stderr}", out.status);
    (stdout.into_owned(), stderr.into_owned())
}

/// Run `exe` through `chidori run --trace` with learning on and the client's cache in
/// `cache` (the tests of what a later run learns from an earlier one); `envs` added. Its
/// stdout and stderr, whatever its exit status (a session a test ends may fail it).
fn run_learning(server: &EmulatedServer, exe: &Path, cache: &Path, envs: &[(&str, &str)]) -> (String, String) {
    let mut cmd = Command::new(chidori());
    cmd.args(["run", "--trace", "-s", &server.address, "--lib-dir"]).arg(chidori_tests::shim_dir()).arg("--").arg(exe);
    cmd.env("XDG_CACHE_HOME", cache).envs(envs.iter().copied());
    let out = cmd.output().unwrap();
    (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// A function's calls and round trips in the trace table of `stderr`.
fn trace_row(stderr: &str, function: &str) -> Vec<String> {
    // A row's name may hold a space ("(module load)"); two or more end it.
    let rest = stderr
        .lines()
        .find_map(|l| l.strip_prefix(function).filter(|r| r.starts_with("  ")))
        .unwrap_or_else(|| panic!("no {function} row: {stderr}"));
    rest.split_whitespace().take(2).map(str::to_owned).collect()
}

/// Children of `pid` (the session workers of a supervisor).
fn children(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(child) = entry.file_name().to_string_lossy().parse::<u32>() else { continue };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{child}/stat")) else { continue };
        // pid (comm) state ppid …: comm may hold spaces, so split after the last ')'.
        let Some((_, rest)) = stat.rsplit_once(')') else { continue };
        let ppid: u32 = rest.split_whitespace().nth(1).and_then(|p| p.parse().ok()).unwrap_or(0);
        if ppid == pid && !rest.trim_start().starts_with('Z') {
            out.push(child);
        }
    }
    out
}

fn wait_for(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < timeout, "{what} did not happen within {timeout:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
    start.elapsed()
}

#[test]
fn the_version_matrix_passes_for_every_cuda_version() {
    let root = chidori_tests::root();
    let versions = xtask::matrix::versions(&root).unwrap();
    assert_eq!(versions.len(), 7);
    let built = chidori_tests::scratch("matrix");
    xtask::matrix::build(&root, &versions, &built, chidori_tests::shim_dir()).unwrap();
    let server = server();
    let rows = xtask::matrix::run(
        &root,
        &built,
        &versions,
        &chidori(),
        Some(chidori_tests::shim_dir()),
        &server.address,
        &profile(),
    )
    .unwrap();
    let table = xtask::matrix::table(&rows);
    assert!(rows.iter().all(|r| r.ok()), "\n{table}");
}

/// A program that connects, then waits for a line on stdin before its next call.
const WAITER: &str = r#"
#include <stdio.h>
#include <cuda_runtime_api.h>
int main(void) {
  void *d; int e = cudaMalloc(&d, 1 << 20);
  printf("READY %d\n", e); fflush(stdout);
  char line[16]; if (!fgets(line, sizeof line, stdin)) return 3;
  e = cudaMalloc(&d, 1 << 20);
  printf("AFTER %d\n", e); fflush(stdout);
  return 0;
}
"#;

fn start_waiter(server: &str, exe: &Path, envs: &[(&str, &str)]) -> (Child, BufReader<std::process::ChildStdout>) {
    let mut cmd = run_cmd(server, exe);
    cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "READY 0", "the waiter could not connect");
    (child, out)
}

fn finish_waiter(mut child: Child, mut out: BufReader<std::process::ChildStdout>) -> (String, String) {
    child.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
    let mut rest = String::new();
    out.read_to_string(&mut rest).unwrap();
    let mut err = String::new();
    child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    child.wait().unwrap();
    (rest, err)
}

#[test]
fn killing_a_client_ends_its_session_worker() {
    let server = server();
    let supervisor = server.pid();
    let exe = program("waiter-kill", WAITER);
    let (mut child, _out) = start_waiter(&server.address, &exe, &[]);
    wait_for("a session worker", Duration::from_secs(5), || children(supervisor).len() == 1);
    child.kill().unwrap();
    child.wait().unwrap();
    let took = wait_for("the session worker's exit", Duration::from_secs(5), || children(supervisor).is_empty());
    eprintln!("session worker gone {took:?} after the client was killed");
}

#[test]
fn a_dead_server_is_a_clear_error_not_a_hang() {
    let mut server = server();
    let exe = program("waiter-dead", WAITER);
    let (child, out) = start_waiter(&server.address, &exe, &[]);
    // The session worker is forked when the client connects: wait for it, or it outlives
    // the supervisor below and the client never loses its server.
    let supervisor = server.pid();
    wait_for("a session worker", Duration::from_secs(5), || children(supervisor).len() == 1);
    let workers = children(supervisor);
    server.kill();
    for w in workers {
        // SAFETY: sending a signal to a process we started.
        unsafe { libc::kill(w as i32, libc::SIGKILL) };
    }
    let start = Instant::now();
    let (rest, err) = finish_waiter(child, out);
    assert!(start.elapsed() < Duration::from_secs(10), "took {:?}", start.elapsed());
    assert!(rest.contains("AFTER 100"), "stdout: {rest}");
    assert!(err.contains(&server.address), "the error must name the server: {err}");
}

#[test]
fn a_hung_server_is_detected_by_heartbeats() {
    let server = server();
    let exe = program("waiter-hung", WAITER);
    let (child, out) = start_waiter(&server.address, &exe, &[("CHIDORI_HEARTBEAT_SECS", "1")]);
    let workers = children(server.pid());
    assert_eq!(workers.len(), 1);
    // SAFETY: stopping a process we started (it is killed with the server).
    unsafe { libc::kill(workers[0] as i32, libc::SIGSTOP) };
    let start = Instant::now();
    let (rest, err) = finish_waiter(child, out);
    // SAFETY: as above.
    unsafe { libc::kill(workers[0] as i32, libc::SIGKILL) };
    assert!(start.elapsed() < Duration::from_secs(15), "took {:?}", start.elapsed());
    assert!(rest.contains("AFTER 100"), "stdout: {rest}");
    assert!(err.contains("stopped answering"), "stderr: {err}");
}

/// Send raw bytes as a client and return whether the server closed the connection.
fn server_closes_after(addr: &str, bytes: &[u8]) -> bool {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    let _ = s.write_all(bytes);
    let _ = s.shutdown(std::net::Shutdown::Write);
    let mut sink = Vec::new();
    // Whatever the server answers (a Refuse or a Goodbye), it must end with a close.
    s.read_to_end(&mut sink).is_ok() || sink.is_empty()
}

fn hello() -> Vec<u8> {
    let hello = chidori_protocol::messages::Hello {
        protocol: chidori_protocol::PROTOCOL_VERSION,
        schema: chidori_cuda_schema(),
        client_version: "test".into(),
        pid: 1,
        host: "test".into(),
        program: "test".into(),
        token: String::new(),
        resume: false,
        content: None,
        visible_devices: None,
    };
    frame::to_vec(Header::new(Kind::Hello, 0, 0, 0), &chidori_protocol::messages::encode(&hello), &[]).unwrap()
}

fn chidori_cuda_schema() -> u64 {
    chidori_cuda::calls::SCHEMA_HASH
}

#[test]
fn malformed_input_ends_only_its_session() {
    let server = server();
    let addr = server.address.clone();
    // Garbage instead of a frame.
    assert!(server_closes_after(&addr, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"));
    // A truncated header, and a valid hello followed by a truncated call.
    assert!(server_closes_after(&addr, &hello()[..10]));
    let mut truncated = hello();
    let call = frame::to_vec(Header::new(Kind::Call, 0, 1, 1), &[0u8; 64], &[&[1, 2, 3]]).unwrap();
    truncated.extend_from_slice(&call[..call.len() - 2]);
    assert!(server_closes_after(&addr, &truncated));
    // Absurd lengths: a header announcing a 4 GiB bulk section.
    let mut absurd = hello();
    let mut h = Header::new(Kind::Call, 0, 1, 1).encode();
    h[28..32].copy_from_slice(&u32::MAX.to_le_bytes());
    absurd.extend_from_slice(&h);
    assert!(server_closes_after(&addr, &absurd));
    // An archive that does not validate, and an unknown call id.
    let mut bad_archive = hello();
    bad_archive.extend_from_slice(&frame::to_vec(Header::new(Kind::Call, 0, 1, 1), &[0xff; 48], &[]).unwrap());
    assert!(server_closes_after(&addr, &bad_archive));
    let mut unknown = hello();
    let call = chidori_protocol::messages::encode(&chidori_protocol::messages::Call::default());
    unknown.extend_from_slice(&frame::to_vec(Header::new(Kind::Call, u32::MAX, 1, 1), &call, &[]).unwrap());
    assert!(server_closes_after(&addr, &unknown));
    // Another protocol version is refused with a Refuse frame.
    let mut old = hello();
    old[4] = 99;
    let mut s = TcpStream::connect(&addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(&old).unwrap();
    let mut head = [0u8; HEADER_LEN];
    s.read_exact(&mut head).unwrap();
    assert_eq!(Header::decode(&head).unwrap().kind, Kind::Refuse);
    // The server still serves a well-behaved client.
    let exe = program("healthy", "#include <cuda_runtime_api.h>\nint main(void){void*d;return cudaMalloc(&d,64);}\n");
    let status = run_cmd(&addr, &exe).status().unwrap();
    assert!(status.success());
    let _ = Frame::decode(&[]);
}

#[test]
fn unreachable_servers_and_other_releases_are_explained() {
    let out = Command::new(chidori()).args(["run", "-s", "127.0.0.1:1", "--", "true"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("127.0.0.1:1") && err.contains("chidori serve"), "{err}");
    // A fake server of another protocol version.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        if let Ok((mut s, _)) = listener.accept() {
            let mut head = [0u8; HEADER_LEN];
            let _ = s.read_exact(&mut head);
            let mut h = Header::new(Kind::Welcome, 0, 0, 0).encode();
            h[4] = 99;
            let _ = s.write_all(&h);
        }
    });
    let out = Command::new(chidori()).args(["run", "-s", &addr, "--", "true"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("protocol 99"), "{err}");
}

#[test]
fn serve_explains_a_missing_gpu() {
    let out = Command::new(chidori()).args(["serve", "--backend", "real", "--port", "0"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    // Without a driver (CI) serve refuses to start and says why; with one it would serve.
    if !Path::new("/proc/driver/nvidia").exists() {
        assert!(!out.status.success());
        assert!(err.contains("NVIDIA driver") || err.contains("GPU"), "{err}");
    }
}

/// Capture status is answered on the client while nothing captures (torch asks before
/// many operations); once a capture begins, the server is asked.
const CAPTURE_STATUS: &str = r#"
#include <stdio.h>
#include <cuda_runtime_api.h>
int main(void) {
  if (cudaFree(0) != cudaSuccess) return 2;
  for (int i = 0; i < 100; ++i) {
    enum cudaStreamCaptureStatus st = cudaStreamCaptureStatusActive;
    if (cudaStreamIsCapturing(0, &st) != cudaSuccess || st != cudaStreamCaptureStatusNone) return 3;
  }
  if (cudaStreamIsCapturing(0, NULL) != cudaErrorInvalidValue) return 4;
  printf("OK\n");
  return 0;
}
"#;

#[test]
fn capture_status_is_answered_locally_while_nothing_captures() {
    let server = server();
    let exe = program("capture-status", CAPTURE_STATUS);
    let (stdout, stderr) = run_traced(&server, &exe);
    assert!(stdout.contains("OK"), "{stdout}\n{stderr}");
    assert_eq!(trace_row(&stderr, "cudaStreamIsCapturing"), ["101", "0"], "calls and round trips: {stderr}");
}

/// torch fills a stream pool with 32 creates of one priority in a row: the client names
/// each stream and sends its create without waiting; every stream is a distinct, live
/// stream of the server's, one made on a thread serves another's calls, and creates CUDA
/// refuses are asked.
const STREAM_POOL: &str = r#"
#include <pthread.h>
#include <stdio.h>
#include <cuda.h>
#include <cuda_runtime_api.h>
static void *use(void *arg) {
  cudaStream_t s = *(cudaStream_t *)arg;
  static char d[16];
  char *p;
  if (cudaMalloc((void **)&p, 16) != cudaSuccess) return (void *)1;
  if (cudaMemsetAsync(p, 7, 16, s) != cudaSuccess) return (void *)2;
  if (cudaMemcpyAsync(d, p, 16, cudaMemcpyDeviceToHost, s) != cudaSuccess) return (void *)3;
  if (cudaStreamSynchronize(s) != cudaSuccess || d[15] != 7) return (void *)4;
  return NULL;
}
int main(void) {
  cudaStream_t s[32], t, u, v;
  for (int i = 0; i < 32; ++i)
    if (cudaStreamCreateWithPriority(&s[i], cudaStreamNonBlocking, -1) != cudaSuccess || !s[i]) return 2;
  for (int i = 0; i < 32; ++i)
    for (int j = 0; j < i; ++j)
      if (s[i] == s[j]) return 3;
  if (cudaStreamCreate(&t) != cudaSuccess || cudaStreamCreateWithFlags(&u, cudaStreamDefault) != cudaSuccess) return 7;
  CUstream w;
  if (cuStreamCreate(&w, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS) return 8;
  pthread_t th;
  void *res = (void *)9;
  if (pthread_create(&th, NULL, use, &s[31]) != 0 || pthread_join(th, &res) != 0 || res != NULL) return 10;
  for (int i = 0; i < 32; ++i)
    if (cudaStreamDestroy(s[i]) != cudaSuccess) return 4;
  if (cudaStreamDestroy(t) != cudaSuccess || cudaStreamDestroy(u) != cudaSuccess) return 13;
  if (cuStreamDestroy(w) != CUDA_SUCCESS) return 14;
  /* Every destroy above reached a live stream: the next waiting call reports none failing. */
  if (cudaDeviceSynchronize() != cudaSuccess) return 5;
  if (cudaStreamCreateWithPriority(NULL, 0, 0) == cudaSuccess) return 6;
  if (cudaStreamCreateWithFlags(&v, 0x10) != cudaErrorInvalidValue) return 15;
  printf("OK\n");
  return 0;
}
"#;

#[test]
fn streams_are_named_by_the_client() {
    let server = server();
    let exe = program_with("stream-pool", STREAM_POOL, &["-l:libcuda.so.1", "-lpthread"]);
    let (stdout, stderr) = run_traced(&server, &exe);
    assert!(stdout.contains("OK"), "{stdout}\n{stderr}");
    // 32 streams without waiting, and the create with a null pointer, which the server
    // refuses; as many of the other creates, and the one with flags CUDA refuses, asked.
    assert_eq!(trace_row(&stderr, "cudaStreamCreateWithPriority"), ["33", "1"], "calls and round trips: {stderr}");
    assert_eq!(trace_row(&stderr, "cudaStreamCreate"), ["1", "0"], "{stderr}");
    assert_eq!(trace_row(&stderr, "cudaStreamCreateWithFlags"), ["2", "1"], "{stderr}");
    assert_eq!(trace_row(&stderr, "cuStreamCreate"), ["1", "0"], "{stderr}");
    assert!(!stderr.contains("ERROR"), "{stderr}");
}

/// The GPU is handed pointers into pinned host memory, as MAGMA's batched solvers and
/// zero-copy programs do: the server's mirror holds what the program wrote before each
/// call, and what the GPU wrote there lands in the program's memory at its next wait.
const PINNED_FOR_THE_GPU: &str = r#"
#include <stdio.h>
#include <string.h>
#include <cuda_runtime_api.h>
int main(void) {
  unsigned char *p, *q, back[4096];
  void *d;
  if (cudaHostAlloc((void **)&p, 4096, cudaHostAllocMapped) != cudaSuccess) return 2;
  if (cudaMallocHost((void **)&q, 100) != cudaSuccess) return 2;
  if (cudaMalloc(&d, 4096) != cudaSuccess) return 2;
  for (int i = 0; i < 4096; ++i) p[i] = (unsigned char)(i * 7);
  void *dp = 0;
  if (cudaHostGetDevicePointer(&dp, p, 0) != cudaSuccess || dp != (void *)p) return 3;
  /* Its attributes name the same address for the device (unified addressing), for pinned
     memory mapped or not (NVIDIA's simpleZeroCopy checks the mapped one). */
  struct cudaPointerAttributes a;
  if (cudaPointerGetAttributes(&a, p + 8) != cudaSuccess || a.type != cudaMemoryTypeHost ||
      a.devicePointer != p + 8 || a.hostPointer != p + 8) return 17;
  if (cudaPointerGetAttributes(&a, q) != cudaSuccess || a.devicePointer != q) return 18;
  /* A "device-to-device" copy from pinned memory reads the program's bytes. */
  if (cudaMemcpy(d, dp, 4096, cudaMemcpyDeviceToDevice) != cudaSuccess) return 4;
  if (cudaMemcpy(back, d, 4096, cudaMemcpyDeviceToHost) != cudaSuccess) return 5;
  if (memcmp(back, p, 4096) != 0) return 6;
  /* The GPU writes pinned memory through its device pointer (a memset: the mirror). */
  if (cudaMemsetAsync((unsigned char *)dp + 16, 0xab, 8, 0) != cudaSuccess) return 7;
  p[1000] = 0x55; /* the program's own write meanwhile, elsewhere in the range */
  if (cudaStreamSynchronize(0) != cudaSuccess) return 8;
  for (int i = 0; i < 4096; ++i) {
    unsigned char want = (i >= 16 && i < 24) ? 0xab : (i == 1000 ? 0x55 : (unsigned char)(i * 7));
    if (p[i] != want) { printf("byte %d: %d, want %d\n", i, p[i], want); return 9; }
  }
  /* Again, after the program changed the bytes the GPU reads. */
  memset(p, 0x11, 64);
  if (cudaMemsetAsync(p + 32, 0x22, 4, 0) != cudaSuccess) return 10;
  if (cudaMemcpy(back, p, 64, cudaMemcpyDeviceToHost) != cudaSuccess) return 11;
  if (back[0] != 0x11 || back[32] != 0x22 || back[36] != 0x11) return 12;
  /* A copy into mirrored pinned memory returns with the bytes there, as natively. */
  if (cudaMemcpy(p + 200, d, 8, cudaMemcpyDeviceToHost) != cudaSuccess) return 15;
  for (int i = 0; i < 8; ++i) if (p[200 + i] != (unsigned char)(i * 7)) return 16;
  if (cudaFreeHost(p) != cudaSuccess || cudaFreeHost(q) != cudaSuccess) return 13;
  /* Memory that is no pinned memory has no device pointer. */
  if (cudaHostGetDevicePointer(&dp, back, 0) == cudaSuccess) return 14;
  printf("OK\n");
  return 0;
}
"#;

#[test]
fn pinned_memory_handed_to_the_gpu_is_mirrored() {
    let server = server();
    let exe = program("pinned-for-the-gpu", PINNED_FOR_THE_GPU);
    let (stdout, stderr) = run_traced(&server, &exe);
    assert!(stdout.contains("OK"), "{stdout}\n{stderr}");
    assert!(stderr.contains("(pinned memory mirrored)"), "{stderr}");
    assert!(!stderr.contains("WARN") && !stderr.contains("ERROR"), "{stderr}");
}

/// A flag the program sets in mirrored memory before it synchronizes reaches the server
/// before the synchronization does (NVIDIA's UnifiedMemoryPerf launches a kernel that spins
/// until the program sets one: sent only at the next launch, the kernel never ends). The
/// emulated backend runs no kernel, so the trace shows it: the range is mirrored when the
/// GPU is handed it, then updated before each wait, and nowhere else (without the update
/// before the wait, the first flag goes with the second launch and the second never).
const FLAG_BEFORE_A_WAIT: &str = r#"
#include <stdio.h>
#include <string.h>
#include <cuda_runtime_api.h>
int main(void) {
  volatile unsigned char *p;
  if (cudaMallocHost((void **)&p, 4096) != cudaSuccess) return 2;
  memset((void *)p, 0, 4096);
  if (cudaMemsetAsync((void *)(p + 2048), 1, 16, 0) != cudaSuccess) return 3;
  p[0] = 9;
  if (cudaStreamSynchronize(0) != cudaSuccess) return 4;
  if (p[0] != 9 || p[2048] != 1 || p[2064] != 0) return 5;
  /* Handed again, nothing changed: nothing is sent; a second flag goes before the wait. */
  if (cudaMemsetAsync((void *)(p + 3000), 2, 4, 0) != cudaSuccess) return 6;
  p[1] = 5;
  if (cudaDeviceSynchronize() != cudaSuccess || p[3000] != 2 || p[1] != 5 || p[0] != 9) return 7;
  printf("OK\n");
  return 0;
}
"#;

#[test]
fn a_flag_written_before_a_wait_reaches_the_gpu_first() {
    let server = server();
    let exe = program("flag-before-a-wait", FLAG_BEFORE_A_WAIT);
    let (stdout, stderr) = run_traced(&server, &exe);
    assert!(stdout.contains("OK"), "{stdout}\n{stderr}");
    assert_eq!(trace_row(&stderr, "(pinned memory mirrored)")[0], "3", "mirrored, then each flag: {stderr}");
    assert!(!stderr.contains("WARN") && !stderr.contains("ERROR"), "{stderr}");
}

/// The GPU writes mirrored memory, and before that comes back the program writes another
/// byte of the same 256-byte chunk and hands the GPU the memory again: the update carries
/// the whole chunk, with the program's stale copy of the GPU's bytes, and the server writes
/// only the byte the program changed (writing the chunk lost the GPU's bytes).
const UPDATE_BESIDE_THE_GPU: &str = r#"
#include <stdio.h>
#include <string.h>
#include <cuda_runtime_api.h>
int main(void) {
  unsigned char *p, src[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  void *d;
  if (cudaHostAlloc((void **)&p, 4096, cudaHostAllocMapped) != cudaSuccess) return 2;
  if (cudaMalloc(&d, 4096) != cudaSuccess) return 2;
  memset(p, 0, 4096);
  if (cudaMemcpy(d, src, 8, cudaMemcpyHostToDevice) != cudaSuccess) return 3;
  if (cudaMemsetAsync(p + 2048, 0, 1, 0) != cudaSuccess) return 4;
  if (cudaMemcpyAsync(p, d, 8, cudaMemcpyDeviceToDevice, 0) != cudaSuccess) return 5;
  p[100] = 0x77;
  if (cudaMemsetAsync(p + 2048, 0, 1, 0) != cudaSuccess) return 6;
  if (cudaStreamSynchronize(0) != cudaSuccess) return 7;
  if (memcmp(p, src, 8) != 0) { printf("the GPU's bytes: %d %d\n", p[0], p[7]); return 8; }
  if (p[100] != 0x77) return 9;
  printf("OK\n");
  return 0;
}
"#;

#[test]
fn an_update_keeps_what_the_gpu_wrote_beside_it() {
    let server = server();
    let exe = program("update-beside-the-gpu", UPDATE_BESIDE_THE_GPU);
    let (stdout, stderr) = run_traced(&server, &exe);
    assert!(stdout.contains("OK"), "{stdout}\n{stderr}");
    assert!(!stderr.contains("WARN") && !stderr.contains("ERROR"), "{stderr}");
}

/// Copies between device memory and pieces of a large mapped buffer: only the copied bytes
/// are brought up to date first, and the result is native's: a byte the program wrote where
/// the copy lands takes the copy's value (even one equal to what the server had before),
/// a byte it wrote elsewhere stays, and a copy from the buffer reads the program's bytes.
const PIECES_OF_MAPPED_MEMORY: &str = r#"
#include <stdio.h>
#include <string.h>
#include <cuda_runtime_api.h>
int main(void) {
  const size_t n = (size_t)4 << 20, mib = (size_t)1 << 20;
  unsigned char *p, back[4096];
  unsigned char *d;
  if (cudaHostAlloc((void **)&p, n, cudaHostAllocMapped) != cudaSuccess) return 2;
  if (cudaMalloc((void **)&d, n) != cudaSuccess || cudaMemset(d, 0, n) != cudaSuccess) return 2;
  memset(p, 0, n);
  /* Handed to the GPU: mirrored from here on. */
  if (cudaMemsetAsync(p + n - 1, 0, 1, 0) != cudaSuccess || cudaStreamSynchronize(0) != cudaSuccess) return 3;
  p[0] = 0xAA;
  if (cudaMemsetAsync(d, 1, 16, 0) != cudaSuccess) return 4;
  p[mib + 3] = 0x55;
  if (cudaMemcpyAsync(p + mib, d + 4096, mib, cudaMemcpyDeviceToDevice, 0) != cudaSuccess) return 5;
  if (cudaStreamSynchronize(0) != cudaSuccess) return 6;
  if (p[0] != 0xAA) { printf("the program's byte: %d\n", p[0]); return 7; }
  if (p[mib + 3] != 0) { printf("the copy's byte: %d\n", p[mib + 3]); return 8; }
  memset(p + 2 * mib, 7, sizeof back);
  if (cudaMemcpy(d, p + 2 * mib, sizeof back, cudaMemcpyHostToDevice) != cudaSuccess) return 9;
  if (cudaMemcpy(back, d, sizeof back, cudaMemcpyDeviceToHost) != cudaSuccess) return 10;
  for (size_t i = 0; i < sizeof back; ++i)
    if (back[i] != 7) { printf("byte %zu: %d\n", i, back[i]); return 11; }
  printf("OK\n");
  return 0;
}
"#;

#[test]
fn copies_of_pieces_of_mapped_memory_move_their_bytes_exactly() {
    let server = server();
    let exe = program("pieces-of-mapped-memory", PIECES_OF_MAPPED_MEMORY);
    let (stdout, stderr) = run_traced(&server, &exe);
    assert!(stdout.contains("OK"), "{stdout}\n{stderr}");
    assert!(!stderr.contains("WARN") && !stderr.contains("ERROR"), "{stderr}");
}

/// The GPU changes one byte in every four of mirrored memory (as a kernel adding to small
/// integers does): the pull sends a bitmap and the changed bytes, and the program finds
/// exactly the GPU's bytes and its own.
const SPARSE_CHANGES: &str = r#"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cuda_runtime_api.h>
int main(void) {
  const size_t n = (size_t)3 << 20;
  unsigned char *p, *pattern = malloc(n);
  void *d;
  if (!pattern) return 2;
  if (cudaHostAlloc((void **)&p, n, cudaHostAllocMapped) != cudaSuccess) return 2;
  if (cudaMalloc(&d, n) != cudaSuccess) return 2;
  for (size_t i = 0; i < n; ++i) { p[i] = (unsigned char)(i / 4); pattern[i] = p[i]; }
  for (size_t i = 0; i < n; i += 4) pattern[i] += 25;
  if (cudaMemcpy(d, pattern, n, cudaMemcpyHostToDevice) != cudaSuccess) return 3;
  /* Handed to the GPU, then rewritten there from device memory. */
  if (cudaMemsetAsync(p + n - 1, p[n - 1], 1, 0) != cudaSuccess) return 4;
  if (cudaMemcpyAsync(p, d, n, cudaMemcpyDeviceToDevice, 0) != cudaSuccess) return 5;
  if (cudaStreamSynchronize(0) != cudaSuccess) return 6;
  for (size_t i = 0; i < n; ++i)
    if (p[i] != pattern[i]) { printf("byte %zu: %d, want %d\n", i, p[i], pattern[i]); return 7; }
  if (cudaFreeHost(p) != cudaSuccess || cudaFree(d) != cudaSuccess) return 8;
  printf("OK\n");
  return 0;
}
"#;

#[test]
fn sparse_changes_to_mirrored_memory_come_back_exactly() {
    let server = server();
    let exe = program("sparse-changes", SPARSE_CHANGES);
    let (stdout, stderr) = run_traced(&server, &exe);
    assert!(stdout.contains("OK"), "{stdout}\n{stderr}");
    assert!(!stderr.contains("WARN") && !stderr.contains("ERROR"), "{stderr}");
}

/// Pinned memory larger than one frame holds, read and then rewritten by the GPU: the
/// program's bytes reach the mirror in several updates and the GPU's writes come back in
/// several pulls (72 MiB: a pull answers at most 8 MiB, an update carries at most 64).
const PINNED_LARGER_THAN_A_FRAME: &str = r#"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cuda_runtime_api.h>
int main(void) {
  const size_t n = (size_t)72 << 20;
  unsigned char *p, *back = malloc(n);
  void *d, *dp;
  if (!back) return 2;
  if (cudaHostAlloc((void **)&p, n, cudaHostAllocMapped) != cudaSuccess) return 2;
  if (cudaMalloc(&d, n) != cudaSuccess) return 2;
  if (cudaHostGetDevicePointer(&dp, p, 0) != cudaSuccess || dp != (void *)p) return 3;
  for (size_t i = 0; i < n; ++i) p[i] = (unsigned char)(i % 251);
  if (cudaMemcpy(d, dp, n, cudaMemcpyDeviceToDevice) != cudaSuccess) return 4;
  if (cudaMemcpy(back, d, n, cudaMemcpyDeviceToHost) != cudaSuccess) return 5;
  if (memcmp(back, p, n) != 0) return 6;
  /* Every byte but each 251st (already 7) changes. */
  if (cudaMemsetAsync(dp, 7, n, 0) != cudaSuccess) return 7;
  if (cudaStreamSynchronize(0) != cudaSuccess) return 8;
  for (size_t i = 0; i < n; ++i)
    if (p[i] != 7) { printf("byte %zu: %d\n", i, p[i]); return 9; }
  if (cudaFreeHost(p) != cudaSuccess || cudaFree(d) != cudaSuccess) return 10;
  printf("OK\n");
  return 0;
}
"#;

#[test]
fn pinned_memory_larger_than_a_frame_travels_in_parts() {
    let server = server();
    let exe = program("pinned-larger-than-a-frame", PINNED_LARGER_THAN_A_FRAME);
    let (stdout, stderr) = run_traced(&server, &exe);
    assert!(stdout.contains("OK"), "{stdout}\n{stderr}");
    assert!(!stderr.contains("WARN") && !stderr.contains("ERROR"), "{stderr}");
}

/// Managed memory: one address for the host and the GPU. The program's writes reach the
/// GPU's accesses (a memset, copies) and the GPU's writes are seen after a synchronization;
/// hints succeed; attributes say managed; cudaFree frees it.
const MANAGED: &str = r#"
#include <stdio.h>
#include <string.h>
#include <cuda_runtime_api.h>
int main(void) {
  unsigned char *m = 0, back[8192];
  void *d;
  if (cudaMallocManaged((void **)&m, 8192, cudaMemAttachGlobal) != cudaSuccess || !m) return 2;
  if (cudaMallocManaged((void **)&d, 0, cudaMemAttachGlobal) != cudaErrorInvalidValue) return 3;
  if (cudaMalloc(&d, 8192) != cudaSuccess) return 3;
  for (int i = 0; i < 8192; ++i) m[i] = (unsigned char)(i * 3);
  /* The GPU reads what the host wrote, through the same address. */
  if (cudaMemcpy(d, m, 8192, cudaMemcpyDefault) != cudaSuccess) return 4;
  if (cudaMemcpy(back, d, 8192, cudaMemcpyDeviceToHost) != cudaSuccess) return 5;
  if (memcmp(back, m, 8192) != 0) return 6;
  /* The GPU writes it; the host sees it after synchronizing, beside its own later write. */
  if (cudaMemsetAsync(m + 100, 0x5a, 50, 0) != cudaSuccess) return 7;
  if (cudaDeviceSynchronize() != cudaSuccess) return 8;
  m[5000] = 0xee;
  for (int i = 0; i < 8192; ++i) {
    unsigned char want = (i >= 100 && i < 150) ? 0x5a : (i == 5000 ? 0xee : (unsigned char)(i * 3));
    if (m[i] != want) { printf("byte %d: %d, want %d\n", i, m[i], want); return 9; }
  }
  /* A device-to-device copy out of it sees the host's latest write. */
  if (cudaMemcpy(d, m, 8192, cudaMemcpyDeviceToDevice) != cudaSuccess) return 10;
  if (cudaMemcpy(back, d, 8192, cudaMemcpyDeviceToHost) != cudaSuccess || back[5000] != 0xee || back[120] != 0x5a) return 11;
  /* Hints succeed; attributes say managed. */
  struct cudaMemLocation here = { cudaMemLocationTypeDevice, 0 };
  if (cudaMemPrefetchAsync(m, 8192, here, 0, 0) != cudaSuccess) return 12;
  if (cudaStreamAttachMemAsync(0, m, 0, cudaMemAttachGlobal) != cudaSuccess) return 13;
  struct cudaPointerAttributes a;
  if (cudaPointerGetAttributes(&a, m + 10) != cudaSuccess || a.type != cudaMemoryTypeManaged || a.devicePointer != m + 10 - 10 + 10) return 14;
  if (cudaFree(m) != cudaSuccess) return 15;
  if (cudaPointerGetAttributes(&a, m) != cudaSuccess || a.type != cudaMemoryTypeUnregistered) return 16;
  if (cudaFree(d) != cudaSuccess) return 17;
  printf("OK\n");
  return 0;
}
"#;

#[test]
fn managed_memory_is_coherent_between_the_host_and_the_gpu() {
    let server = server();
    let exe = program("managed", MANAGED);
    let (stdout, stderr) = run_traced(&server, &exe);
    assert!(stdout.contains("OK"), "{stdout}\n{stderr}");
    assert!(!stderr.contains("WARN") && !stderr.contains("ERROR"), "{stderr}");
}

/// A graph replayed in a loop on the server (`chidori_loop_*`): the output of every step
/// streams back, and a device flag the graph sets stops the loop at the next check.
const GRAPH_LOOP: &str = r#"
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdint.h>
#include <cuda_runtime_api.h>
typedef uint64_t (*start_fn)(uint64_t, uint64_t, uint32_t, uint32_t, uint64_t, uint64_t, uint32_t, uint32_t, uint32_t,
                             uint64_t, uint64_t, uint64_t);
typedef int64_t (*poll_fn)(uint64_t, uint8_t *, uint64_t, uint32_t, uint32_t *, uint32_t *, uint32_t *, int64_t *);
typedef void (*end_fn)(uint64_t);
static start_fn start; static poll_fn poll; static end_fn end;
/* Wait for a loop's end: its status. */
static int64_t finish(uint64_t id) {
  uint32_t steps = 0, stopped = 0, done = 0; int64_t status = 0;
  while (!done) if (poll(id, NULL, 0, 1000, &steps, &stopped, &done, &status) < 0) return -1;
  end(id);
  return status;
}
/* Run a loop of up to 20 steps, checking every 4 (flags 1: and the slot after the last);
   returns the steps launched. */
static int run(cudaGraphExec_t exec, cudaStream_t s, void *flag, void *out, int *got, uint32_t *stopped, uint32_t flags) {
  uint64_t id = start((uint64_t)exec, (uint64_t)s, 20, 4, (uint64_t)flag, (uint64_t)out, 4, 1, flags, 0, 0, 0);
  if (!id) return -1;
  uint32_t steps = 0, done = 0; int64_t status = 0; int n = 0;
  while (!done) {
    int64_t k = poll(id, (uint8_t *)(got + n), (21 - n) * 4, 1000, &steps, stopped, &done, &status);
    if (k < 0 || status != 0) return -2;
    n += (int)(k / 4);
  }
  end(id);
  return n == (*stopped ? (int)*stopped : 20 + (int)(flags & 1)) ? (int)steps : -3;
}
int main(void) {
  start = (start_fn)dlsym(RTLD_DEFAULT, "chidori_loop_start");
  poll = (poll_fn)dlsym(RTLD_DEFAULT, "chidori_loop_poll");
  end = (end_fn)dlsym(RTLD_DEFAULT, "chidori_loop_end");
  if (!start || !poll || !end) return 2;
  int host[21], got[21]; void *flag, *src, *out;
  for (int i = 0; i < 21; ++i) host[i] = 100 + i;
  if (cudaMalloc(&flag, 4) || cudaMalloc(&src, 4) || cudaMalloc(&out, 84)) return 3;
  if (cudaMemset(flag, 0, 4) || cudaMemset(src, 0, 4) || cudaMemcpy(out, host, 84, cudaMemcpyHostToDevice)) return 3;
  cudaStream_t s; cudaGraph_t g; cudaGraphExec_t exec;
  if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)) return 4;
  /* One step: copy src into the flag. */
  if (cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal)) return 5;
  if (cudaMemcpyAsync(flag, src, 4, cudaMemcpyDeviceToDevice, s)) return 5;
  if (cudaStreamEndCapture(s, &g) || cudaGraphInstantiate(&exec, g, 0)) return 6;
  uint32_t stopped = 99;
  int steps = run(exec, s, flag, out, got, &stopped, 0);
  if (steps != 20 || stopped != 0) { printf("steps %d stopped %u\n", steps, stopped); return 7; }
  for (int i = 0; i < 20; ++i) if (got[i] != 100 + i) return 8;
  /* With the tail: the slot after the last step too. */
  steps = run(exec, s, flag, out, got, &stopped, 1);
  if (steps != 20 || stopped != 0) { printf("tail: steps %d stopped %u\n", steps, stopped); return 13; }
  for (int i = 0; i < 21; ++i) if (got[i] != 100 + i) return 14;
  /* Now each step sets the flag: the first check stops the loop. */
  int one = 1;
  if (cudaMemcpy(src, &one, 4, cudaMemcpyHostToDevice)) return 9;
  steps = run(exec, s, flag, out, got, &stopped, 1);
  if (stopped != 4 || steps < 4 || steps > 12) { printf("steps %d stopped %u\n", steps, stopped); return 10; }
  for (int i = 0; i < 4; ++i) if (got[i] != 100 + i) return 11;
  /* A graph handle of no one's is refused, not dereferenced. */
  if (run((cudaGraphExec_t)0x1234, s, flag, out, got, &stopped, 0) != -2) return 12;
  /* The closing copy: `out` into `back` after the last step. The device is idle then, and
     nothing was sent since the start: the synchronize after it costs no round trip. */
  void *back;
  if (cudaMalloc(&back, 84) || cudaMemset(back, 0, 84)) return 15;
  uint64_t id = start((uint64_t)exec, (uint64_t)s, 3, 1, 0, 0, 0, 0, 0, (uint64_t)back, (uint64_t)out, 84);
  if (!id || finish(id) != 0) return 16;
  if (cudaDeviceSynchronize()) return 17;
  int check[21];
  if (cudaMemcpy(check, back, 84, cudaMemcpyDeviceToHost)) return 18;
  for (int i = 0; i < 21; ++i) if (check[i] != 100 + i) return 19;
  /* A closing copy outside the session's memory is refused. */
  id = start((uint64_t)exec, (uint64_t)s, 3, 1, 0, 0, 0, 0, 0, 0x1000, (uint64_t)out, 84);
  if (id && finish(id) == 0) return 20;
  printf("OK\n");
  return 0;
}
"#;

#[test]
fn graphs_replay_in_a_loop_on_the_server() {
    let server = server();
    let exe = program("graph-loop", GRAPH_LOOP);
    let (stdout, stderr) = run_traced(&server, &exe);
    assert!(stdout.contains("OK"), "{stdout}\n{stderr}");
    // Six loops of one request each; no round trip per step.
    assert_eq!(trace_row(&stderr, "chidori_loop_start"), ["6", "0"], "{stderr}");
    // Idle after the closing copy: answered by the client.
    assert_eq!(trace_row(&stderr, "cudaDeviceSynchronize"), ["1", "0"], "{stderr}");
}

/// `chidori run --optimize` loads the chidori package at interpreter start (after the
/// environment's own sitecustomize), and its loop wrapper replays a graph on the server:
/// a Python program without torch, calling the runtime through ctypes.
const PYTHON_LOOP: &str = r#"
import ctypes, os, sys
import chidori.decode as decode
assert decode._enabled, "optimize() was not turned on at start"
assert os.environ.get("ENV_HOOK_RAN") == "1" or "envhook" in sys.modules, "the environment's sitecustomize did not run"
rt = ctypes.CDLL("libcudart.so.13")
def check(rc, what):
    if rc != 0:
        raise SystemExit(f"{what} failed: {rc}")
p = lambda: ctypes.c_void_p()
flag, src, out = p(), p(), p()
for ptr, n in ((flag, 4), (src, 4), (out, 64)):
    check(rt.cudaMalloc(ctypes.byref(ptr), ctypes.c_size_t(n)), "cudaMalloc")
host = (ctypes.c_int32 * 16)(*range(500, 516))
check(rt.cudaMemcpy(out, host, ctypes.c_size_t(64), 1), "cudaMemcpy")
check(rt.cudaMemset(flag, 0, ctypes.c_size_t(4)), "cudaMemset")
one = ctypes.c_int32(1)
check(rt.cudaMemcpy(src, ctypes.byref(one), ctypes.c_size_t(4), 1), "cudaMemcpy")
stream, graph, exe = p(), p(), p()
check(rt.cudaStreamCreateWithFlags(ctypes.byref(stream), 1), "cudaStreamCreateWithFlags")
check(rt.cudaStreamBeginCapture(stream, 0), "cudaStreamBeginCapture")
check(rt.cudaMemcpyAsync(flag, src, ctypes.c_size_t(4), 3, stream), "cudaMemcpyAsync")
check(rt.cudaStreamEndCapture(stream, ctypes.byref(graph)), "cudaStreamEndCapture")
check(rt.cudaGraphInstantiate(ctypes.byref(exe), graph, ctypes.c_ulonglong(0)), "cudaGraphInstantiate")
rows = []
r = decode.run_loop(exe.value, stream.value, 16, 2, flag.value, out.value, 4, 1, rows.append)
assert r.status == 0 and r.stopped_at == 2, r
assert [int.from_bytes(b, "little") for b in rows] == [500, 501], rows
print("OK", r)
"#;

#[test]
fn optimize_loads_the_package_and_its_loop_wrapper_replays_on_the_server() {
    let server = server();
    let dir = chidori_tests::scratch("python-loop");
    std::fs::write(dir.join("loop.py"), PYTHON_LOOP).unwrap();
    // The environment's own sitecustomize, which --optimize must keep.
    let env_hook = dir.join("env-hook");
    std::fs::create_dir_all(&env_hook).unwrap();
    std::fs::write(env_hook.join("sitecustomize.py"), "import os\nos.environ['ENV_HOOK_RAN'] = '1'\n").unwrap();
    let shims = package_beside_shims();
    let out = Command::new(chidori())
        .args(["run", "--optimize", "-s", &server.address, "--lib-dir"])
        .arg(shims)
        .args(["--", "python3"])
        .arg(dir.join("loop.py"))
        .env("PYTHONPATH", &env_hook)
        .output()
        .unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && stdout.contains("OK"), "{stdout}\n{stderr}");
}

/// The shims' directory, with the chidori package beside it as a release lays it out.
fn package_beside_shims() -> &'static Path {
    static ONCE: std::sync::Once = std::sync::Once::new();
    let shims = chidori_tests::shim_dir();
    ONCE.call_once(|| {
        copy_tree(&chidori_tests::root().join("python/chidori"), &shims.parent().unwrap().join("python/chidori"))
    });
    shims
}

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap().flatten() {
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            if entry.file_name() != "__pycache__" {
                copy_tree(&entry.path(), &target);
            }
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// Driver entry points handed out by the runtime are the shims' own: calling one reaches
/// the server (here: the emulated profile's device count), with no NVIDIA library loaded.
const ENTRY_POINT: &str = r#"
#include <stdio.h>
#include <cuda_runtime_api.h>
typedef int (*count_fn)(int *);
int main(void) {
  void *fn = 0;
  enum cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
  if (cudaGetDriverEntryPoint("cuDeviceGetCount", &fn, cudaEnableDefault, &q) != cudaSuccess) return 2;
  if (q != cudaDriverEntryPointSuccess || !fn) return 3;
  int n = -1;
  int rc = ((count_fn)fn)(&n);
  void *missing = (void *)1;
  if (cudaGetDriverEntryPoint("cuNoSuchFunction", &missing, cudaEnableDefault, &q) != cudaSuccess) return 4;
  printf("rc=%d count=%d missing=%p status=%d\n", rc, n, missing, (int)q);
  return 0;
}
"#;

#[test]
fn driver_entry_points_are_the_shims_functions() {
    let server = server();
    let exe = program("entry-point", ENTRY_POINT);
    let output = run_cmd(&server.address, &exe).output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stdout}\n{stderr}");
    assert_eq!(stdout.trim(), "rc=0 count=1 missing=(nil) status=1", "{stderr}");
}

/// A call from an exit handler, after the thread's Rust state is gone (torch's handle
/// pools destroy their cuBLAS/cuSPARSE handles then).
const AT_EXIT: &str = r#"
#include <stdio.h>
#include <stdlib.h>
#include <cuda_runtime_api.h>
static void bye(void) {
    void *p = 0;
    cudaError_t e = cudaMalloc(&p, 16);
    fprintf(stderr, "AT EXIT %d\n", (int)e);
}
int main(void) {
    void *p = 0;
    if (cudaMalloc(&p, 16) != cudaSuccess) return 2;
    atexit(bye);
    printf("MAIN DONE\n");
    return 0;
}
"#;

#[test]
fn calls_from_exit_handlers_do_not_panic() {
    let server = server();
    let exe = program("at-exit", AT_EXIT);
    let out = run_cmd(&server.address, &exe).output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "status {:?}; stderr: {stderr}", out.status);
    assert!(stdout.contains("MAIN DONE"), "stdout: {stdout}");
    assert!(stderr.contains("AT EXIT 0"), "the exit handler's call must work: {stderr}");
    assert!(!stderr.contains("panicked"), "no panic may show: {stderr}");
}

/// A cuDNN graph built and executed the way torch's frontend does it: tensors, an operation
/// whose attribute is an array of descriptors, the operation graph, a plan; then a variant
/// pack per execution, created, filled (a host scalar among its data pointers, as SDPA's
/// scale), finalized, executed and destroyed. The client names
/// every descriptor, so only the finalizes whose status steers the caller (the graph's, the
/// plan's) wait; a descriptor the session never made is refused, as an argument and inside
/// an array (there the failure surfaces at the next waiting call).
const CUDNN_GRAPH: &str = r#"
#include <stdio.h>
typedef void *desc_t;
int cudnnCreate(void **handle);
int cudnnBackendCreateDescriptor(int type, desc_t *d);
int cudnnBackendSetAttribute(desc_t d, int name, int type, long long count, const void *elements);
int cudnnBackendFinalize(desc_t d);
int cudnnBackendExecute(void *handle, desc_t plan, desc_t pack);
int cudnnBackendDestroyDescriptor(desc_t d);
int cudnnBackendGetAttribute(desc_t d, int name, int type, long long requested, long long *count, void *elements);
enum { POINTWISE_OP = 13, GRAPH = 15, PACK = 16, TENSOR = 17, PLAN = 5, DESCRIPTORS = 15, INT64 = 5, VOID_PTR = 6,
       HANDLE = 0, PLAN_HANDLE = 400 };
int main(void) {
  void *h = 0;
  desc_t x = 0, y = 0, op = 0, graph = 0, plan = 0, stray = 0, graph2 = 0;
  if (cudnnCreate(&h)) return 2;
  if (cudnnBackendCreateDescriptor(TENSOR, &x) || cudnnBackendCreateDescriptor(TENSOR, &y)) return 3;
  if (cudnnBackendFinalize(x) || cudnnBackendFinalize(y)) return 3;
  desc_t xy[2] = {x, y};
  if (cudnnBackendCreateDescriptor(POINTWISE_OP, &op) || cudnnBackendSetAttribute(op, 750, DESCRIPTORS, 2, xy)) return 4;
  if (cudnnBackendFinalize(op)) return 4;
  if (cudnnBackendCreateDescriptor(GRAPH, &graph) || cudnnBackendSetAttribute(graph, 800, DESCRIPTORS, 1, &op)) return 5;
  int graph_status = cudnnBackendFinalize(graph);
  /* The plan's cudnnHandle_t: the client's value, the worker's handle in the library. */
  if (cudnnBackendCreateDescriptor(PLAN, &plan) || cudnnBackendSetAttribute(plan, PLAN_HANDLE, HANDLE, 1, &h)) return 6;
  if (cudnnBackendFinalize(plan)) return 6;
  void *got = 0;
  long long count = 0;
  if (cudnnBackendGetAttribute(plan, PLAN_HANDLE, HANDLE, 1, &count, &got) || count != 1 || got != h) return 13;
  for (int i = 0; i < 100; i++) {
    desc_t pack = 0;
    long long ids[2] = {1, 2};
    float scale = 0.125f * i; /* a pass-by-value tensor: its pointer is a host address */
    void *data[2] = {0, &scale};
    if (cudnnBackendCreateDescriptor(PACK, &pack)) return 7;
    if (cudnnBackendSetAttribute(pack, 1000, INT64, 2, ids)) return 8;
    if (cudnnBackendSetAttribute(pack, 1001, VOID_PTR, 2, data)) return 8;
    if (i == 0) {
      /* Read back: the program's own pointers, not the worker's copy of the scalar. */
      void *back[2] = {0, 0};
      long long n = 0;
      if (cudnnBackendGetAttribute(pack, 1001, VOID_PTR, 2, &n, back) || n != 2 || back[1] != &scale) return 14;
    }
    if (cudnnBackendFinalize(pack) || cudnnBackendExecute(h, plan, pack)) return 9;
    if (cudnnBackendDestroyDescriptor(pack)) return 10;
  }
  desc_t foreign_array[2] = {x, (desc_t)0x1234};
  if (cudnnBackendCreateDescriptor(POINTWISE_OP, &stray)) return 11;
  int sent = cudnnBackendSetAttribute(stray, 750, DESCRIPTORS, 2, foreign_array);
  /* A waiting call: it reports the failure of the call sent without waiting. */
  if (cudnnBackendCreateDescriptor(GRAPH, &graph2)) return 12;
  int next = cudnnBackendFinalize(graph2);
  int foreign = cudnnBackendFinalize((desc_t)0x1234);
  printf("graph=%d sent=%d next=%d foreign=%d\n", graph_status, sent, next, foreign);
  return 0;
}
"#;

/// cuda-samples' cuSolverSp_LinearSolver reorders its matrix on the host: B = P*A*Q^T with
/// `cusolverSpXcsrpermHost`, whose host workspace only `cusolverSpXcsrperm_bufferSizeHost`
/// sizes. The client asks the size itself and the worker passes a workspace of that size;
/// the pattern and the map come back permuted.
const CSRPERM_HOST: &str = r#"
#include <stdio.h>
#include <stdlib.h>
typedef void *h_t;
int cusolverSpCreate(h_t *h);
int cusolverSpDestroy(h_t h);
int cusparseCreateMatDescr(h_t *d);
int cusparseDestroyMatDescr(h_t d);
int cusolverSpXcsrperm_bufferSizeHost(h_t h, int m, int n, int nnz, h_t descr, const int *rows, const int *cols,
                                      const int *p, const int *q, size_t *bytes);
int cusolverSpXcsrpermHost(h_t h, int m, int n, int nnz, h_t descr, int *rows, int *cols, const int *p,
                           const int *q, int *map, void *buffer);
int main(void) {
  /* [[a, 0, b], [0, c, 0], [d, 0, e]] */
  int rows[4] = {0, 2, 3, 5}, cols[5] = {0, 2, 1, 0, 2}, map[5] = {0, 1, 2, 3, 4};
  int p[3] = {2, 0, 1}, q[3] = {1, 2, 0};
  h_t h = 0, d = 0;
  size_t bytes = 0;
  if (cusolverSpCreate(&h) || cusparseCreateMatDescr(&d)) return 2;
  if (cusolverSpXcsrperm_bufferSizeHost(h, 3, 3, 5, d, rows, cols, p, q, &bytes) || bytes == 0) return 3;
  void *buffer = malloc(bytes);
  int s = cusolverSpXcsrpermHost(h, 3, 3, 5, d, rows, cols, p, q, map, buffer);
  printf("status %d rows", s);
  for (int i = 0; i < 4; i++) printf(" %d", rows[i]);
  printf(" cols");
  for (int i = 0; i < 5; i++) printf(" %d", cols[i]);
  printf(" map");
  for (int i = 0; i < 5; i++) printf(" %d", map[i]);
  printf("\n");
  free(buffer);
  return cusparseDestroyMatDescr(d) || cusolverSpDestroy(h);
}
"#;

#[test]
fn a_host_workspace_sized_by_a_query_is_the_workers_own() {
    let server = server();
    let exe = program_with("csrperm-host", CSRPERM_HOST, &["-l:libcusolver.so.12", "-l:libcusparse.so.12"]);
    let (stdout, stderr) = run_traced(&server, &exe);
    // B(i, j) = A(p[i], q[j]), each row in column order; map[k]: the entry of A at B's k-th.
    assert_eq!(stdout.trim(), "status 0 rows 0 2 4 5 cols 1 2 1 2 0 map 4 3 1 0 2", "{stderr}");
    // The program's size query, the client's own before the permutation, the permutation.
    assert_eq!(trace_row(&stderr, "cusolverSpXcsrperm_bufferSizeHost"), ["2", "2"], "{stderr}");
    assert_eq!(trace_row(&stderr, "cusolverSpXcsrpermHost"), ["1", "1"], "{stderr}");
}

/// cuSPARSE's header documents no status: once connected, its error strings are the
/// server's library's (the emulated backend marks its own), asked once for all values;
/// before any call, the status name serves.
const STATUS_TEXTS: &str = r#"
#include <stdio.h>
typedef void *h_t;
const char *cusparseGetErrorString(int status);
int cusparseCreateMatDescr(h_t *d);
int cusparseDestroyMatDescr(h_t d);
int main(void) {
  h_t d = 0;
  printf("%s\n", cusparseGetErrorString(10));
  if (cusparseCreateMatDescr(&d)) return 2;
  printf("%s\n", cusparseGetErrorString(10));
  printf("%s\n", cusparseGetErrorString(3));
  printf("%s\n", cusparseGetErrorString(12345));
  return cusparseDestroyMatDescr(d);
}
"#;

#[test]
fn undocumented_status_texts_are_the_servers_librarys() {
    let server = server();
    let exe = program_with("status-texts", STATUS_TEXTS, &["-l:libcusparse.so.12"]);
    let (stdout, stderr) = run_traced(&server, &exe);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(
        lines,
        [
            "CUSPARSE_STATUS_NOT_SUPPORTED",
            "CUSPARSE_STATUS_NOT_SUPPORTED (emulated)",
            "CUSPARSE_STATUS_INVALID_VALUE (emulated)",
            "unrecognized error code"
        ],
        "{stderr}"
    );
    // Named by the client: no round trip (the texts are asked once connected).
    assert_eq!(trace_row(&stderr, "cusparseCreateMatDescr"), ["1", "0"], "{stderr}");
}

/// torch makes two or three cuSPARSE descriptors for every sparse product: the client names
/// them and their creates go without waiting; each is a distinct handle the library knows;
/// a create the library refuses surfaces at the next cuSPARSE call that waits.
const CUSPARSE_DESCRIPTORS: &str = r#"
#include <stdio.h>
typedef void *h_t;
int cusparseCreate(h_t *h);
int cusparseDestroy(h_t h);
int cusparseCreateDnVec(h_t *d, long size, void *values, int type);
int cusparseCreateDnMat(h_t *d, long rows, long cols, long ld, void *values, int type, int order);
int cusparseCreateCsr(h_t *d, long rows, long cols, long nnz, void *offsets, void *columns, void *values,
                      int offsetType, int columnType, int base, int valueType);
int cusparseDestroyDnVec(h_t d);
int cusparseDestroyDnMat(h_t d);
int cusparseDestroySpMat(h_t d);
int cusparseGetVersion(h_t h, int *version);
int cudaMalloc(void **p, unsigned long size);
#define C(x) do { int e = (x); if (e) { printf("FAIL line %d: %s -> %d\n", __LINE__, #x, e); return 1; } } while (0)
int main(void) {
  h_t h, v[4], m[8], s[4], bad;
  int version;
  void *buf;
  C(cusparseCreate(&h));
  C(cudaMalloc(&buf, 4096));
  for (int i = 0; i < 4; ++i) C(cusparseCreateDnVec(&v[i], 16, buf, 0));
  for (int i = 0; i < 8; ++i) C(cusparseCreateDnMat(&m[i], 4, 8, 4, buf, 0, 1));
  for (int i = 0; i < 4; ++i) C(cusparseCreateCsr(&s[i], 4, 4, 6, buf, buf, buf, 2, 2, 0, 0));
  for (int i = 0; i < 8; ++i)
    for (int j = 0; j < i; ++j)
      if (m[i] == m[j] || (i < 4 && (v[i] == v[j] || s[i] == s[j]))) return 3;
  for (int i = 0; i < 4; ++i) C(cusparseDestroyDnVec(v[i]));
  for (int i = 0; i < 8; ++i) C(cusparseDestroyDnMat(m[i]));
  for (int i = 0; i < 4; ++i) C(cusparseDestroySpMat(s[i]));
  /* A leading dimension shorter than a column: refused by the library, said at the next
     wait (every destroy before it reached a descriptor the library knows). */
  C(cusparseCreateDnMat(&bad, 4, 8, 2, buf, 0, 1));
  printf("%d\n", cusparseGetVersion(h, &version));
  return 0;
}
"#;

#[test]
fn cusparse_descriptors_are_named_by_the_client() {
    let server = server();
    let exe = program_with("cusparse-descriptors", CUSPARSE_DESCRIPTORS, &["-l:libcusparse.so.12"]);
    let (stdout, stderr) = run_traced(&server, &exe);
    // CUSPARSE_STATUS_INVALID_VALUE, from the refused create.
    assert_eq!(stdout.trim(), "3", "{stderr}");
    // The library context is named by the client too.
    for (f, n) in [
        ("cusparseCreate", "1"),
        ("cusparseCreateDnVec", "4"),
        ("cusparseCreateDnMat", "9"),
        ("cusparseCreateCsr", "4"),
    ] {
        assert_eq!(trace_row(&stderr, f), [n, "0"], "{f}: {stderr}");
    }
    for (f, n) in [("cusparseDestroyDnVec", "4"), ("cusparseDestroyDnMat", "8"), ("cusparseDestroySpMat", "4")] {
        assert_eq!(trace_row(&stderr, f), [n, "0"], "{f}: {stderr}");
    }
}

/// torch creates a sparse matrix and dense operands anew for every product and asks the
/// buffer size each time: here two products of one shape, one of another, the first shape
/// again after its matrix's pointers were set (the same alignment: what it describes is
/// still known), and with an array of another alignment (another question).
const CUSPARSE_SIZES: &str = r#"
#include <stdio.h>
#include <stddef.h>
typedef void *h_t;
int cusparseCreate(h_t *h);
int cusparseCreateDnVec(h_t *d, long size, void *values, int type);
int cusparseCreateDnMat(h_t *d, long rows, long cols, long ld, void *values, int type, int order);
int cusparseCreateCsr(h_t *d, long rows, long cols, long nnz, void *offsets, void *columns, void *values,
                      int offsetType, int columnType, int base, int valueType);
int cusparseCsrSetPointers(h_t d, void *offsets, void *columns, void *values);
int cusparseDestroyDnVec(h_t d);
int cusparseDestroyDnMat(h_t d);
int cusparseDestroySpMat(h_t d);
int cusparseSpMM_bufferSize(h_t h, int opA, int opB, const void *alpha, h_t A, h_t B, const void *beta, h_t C,
                            int computeType, int alg, size_t *size);
int cusparseSpMV_bufferSize(h_t h, int opA, const void *alpha, h_t A, h_t x, const void *beta, h_t y,
                            int computeType, int alg, size_t *size);
int cudaMalloc(void **p, unsigned long size);
static h_t h;
static char *buf;
static int product(long rows, long cols, long nnz, int set, int offset) {
  h_t a, b, c, x, y;
  float alpha = 1, beta = 0;
  size_t mm = 0, mv = 0;
  if (cusparseCreateCsr(&a, rows, cols, nnz, buf, buf + 4096, buf + 8192, 2, 2, 0, 0)) return -1;
  if (set && cusparseCsrSetPointers(a, buf + offset, buf + 4096, buf + 8192)) return -2;
  if (cusparseCreateDnMat(&b, cols, 16, cols, buf, 0, 1) || cusparseCreateDnMat(&c, rows, 16, rows, buf, 0, 1)) return -3;
  if (cusparseCreateDnVec(&x, cols, buf, 0) || cusparseCreateDnVec(&y, rows, buf, 0)) return -4;
  if (cusparseSpMM_bufferSize(h, 0, 0, &alpha, a, b, &beta, c, 0, 0, &mm)) return -5;
  if (cusparseSpMV_bufferSize(h, 0, &alpha, a, x, &beta, y, 0, 0, &mv)) return -6;
  printf("%zu,%zu ", mm, mv);
  return cusparseDestroySpMat(a) || cusparseDestroyDnMat(b) || cusparseDestroyDnMat(c) ||
         cusparseDestroyDnVec(x) || cusparseDestroyDnVec(y);
}
int main(void) {
  if (cusparseCreate(&h) || cudaMalloc((void **)&buf, 1 << 16)) return 10;
  int e = product(64, 32, 100, 0, 0) || product(64, 32, 100, 0, 0) || product(128, 32, 50, 0, 0) ||
          product(64, 32, 100, 1, 256) || product(64, 32, 100, 1, 4);
  printf("\n");
  return e;
}
"#;

/// Issue 19: a cuSPARSE buffer size asked before (descriptors that describe the same) is
/// answered by the client, in the same process and, checked, in a later one; a server
/// whose library answers otherwise ends the session naming the call.
#[test]
fn cusparse_buffer_sizes_asked_before_are_answered_by_the_client() {
    let server = server();
    let exe = program_with("cusparse-sizes", CUSPARSE_SIZES, &["-l:libcusparse.so.12"]);
    let (stdout, stderr) = run_traced(&server, &exe);
    // rows * 64 + nnz * 8 + dense columns * 16 (+1 for SpMM): the emulated library's sizes.
    assert_eq!(stdout.trim(), "5153,4912 5153,4912 8849,8608 5153,4912 5153,4912", "{stderr}");
    // Asked: the first shape, the second, the first with its pointers set, and set with an
    // array of another alignment.
    assert_eq!(trace_row(&stderr, "cusparseSpMM_bufferSize"), ["5", "4"], "{stderr}");
    assert_eq!(trace_row(&stderr, "cusparseSpMV_bufferSize"), ["5", "4"], "{stderr}");

    let cache = chidori_tests::scratch("cusparse-sizes-cache");
    let (first, stderr) = run_learning(&server, &exe, &cache, &[]);
    assert_eq!(first, stdout, "{stderr}");
    let (second, stderr) = run_learning(&server, &exe, &cache, &[]);
    assert_eq!(second, stdout, "{stderr}");
    assert_eq!(trace_row(&stderr, "cusparseSpMM_bufferSize"), ["5", "0"], "{stderr}");
    assert_eq!(trace_row(&stderr, "cusparseSpMV_bufferSize"), ["5", "0"], "{stderr}");
    assert!(!stderr.contains("answered differently") && !stderr.contains("WARN"), "{stderr}");
    drop(server);

    let other = salted_server();
    let (_, stderr) = run_learning(&other, &exe, &cache, &[]);
    assert!(
        stderr.contains("the server answered differently (another buffer size)"),
        "a different answer ends the session, naming the call: {stderr}"
    );
}

/// cuSPARSELt's handle, descriptors and plans are 1 KiB records the program holds and the
/// library fills with its own pointers: the worker keeps the library's records, the
/// program's hold ids. The emulated library links its records (a plan to its descriptor,
/// the descriptor to its matrices) and follows those links later, after the program
/// destroyed the matrices; a copied plan record is the same plan; a device alpha vector
/// (vector scaling) and a host beta travel as such; a destroyed or never initialized
/// record is refused.
const SPARSELT: &str = r#"
#include <stdio.h>
#include <string.h>
#include <cuda_runtime.h>
typedef struct { unsigned char data[1024]; } rec_t;
int cusparseLtInit(rec_t *h);
int cusparseLtDestroy(const rec_t *h);
int cusparseLtDenseDescriptorInit(const rec_t *h, rec_t *m, long rows, long cols, long ld, unsigned align, int type,
                                  int order);
int cusparseLtMatDescriptorDestroy(const rec_t *m);
int cusparseLtMatmulDescriptorInit(const rec_t *h, rec_t *mm, int opA, int opB, const rec_t *a, const rec_t *b,
                                   const rec_t *c, const rec_t *d, int compute);
int cusparseLtMatmulDescSetAttribute(const rec_t *h, rec_t *mm, int attr, const void *data, size_t size);
int cusparseLtMatmulAlgSelectionInit(const rec_t *h, rec_t *sel, const rec_t *mm, int alg);
int cusparseLtMatmulAlgSelectionDestroy(const rec_t *sel);
int cusparseLtMatmulPlanInit(const rec_t *h, rec_t *plan, const rec_t *mm, const rec_t *sel);
int cusparseLtMatmulPlanDestroy(const rec_t *plan);
int cusparseLtMatmulGetWorkspace(const rec_t *h, const rec_t *plan, size_t *size);
int cusparseLtMatmul(const rec_t *h, const rec_t *plan, const void *alpha, const void *A, const void *B,
                     const void *beta, const void *C, void *D, void *workspace, cudaStream_t *streams, int n);
int main(void) {
  static rec_t h, a, b, c, mm, sel, plan, copy, mm2, sel2, plan2, never;
  size_t ws = 0;
  if (cusparseLtInit(&h) || cusparseLtDenseDescriptorInit(&h, &a, 8, 4, 4, 16, 2, 1) ||
      cusparseLtDenseDescriptorInit(&h, &b, 4, 6, 6, 16, 2, 1) || cusparseLtDenseDescriptorInit(&h, &c, 8, 6, 6, 16, 2, 1))
    return 2;
  if (cusparseLtMatmulDescriptorInit(&h, &mm, 0, 0, &a, &b, &c, &c, 2)) return 3;
  int on = 1;
  if (cusparseLtMatmulDescSetAttribute(&h, &mm, 5, &on, sizeof on)) return 4;
  /* Whether the library takes a set is its answer, at the call. */
  printf("refused %d\n", cusparseLtMatmulDescSetAttribute(&h, &mm, 99, &on, sizeof on) != 0);
  if (cusparseLtMatmulAlgSelectionInit(&h, &sel, &mm, 0) || cusparseLtMatmulPlanInit(&h, &plan, &mm, &sel)) return 5;
  // The matrices go; the plan's descriptor still reaches them (the library's pointers).
  if (cusparseLtMatDescriptorDestroy(&a) || cusparseLtMatDescriptorDestroy(&b)) return 6;
  memcpy(&copy, &plan, sizeof plan);
  int s = cusparseLtMatmulGetWorkspace(&h, &copy, &ws);
  printf("workspace %d %zu\n", s, ws);
  float *d_alpha, *d_out, alphas[8] = {2.5f, 9, 9, 9, 9, 9, 9, 9}, beta = 0.5f, out = 0;
  if (cudaMalloc((void **)&d_alpha, sizeof alphas) || cudaMalloc((void **)&d_out, 64)) return 7;
  if (cudaMemcpy(d_alpha, alphas, sizeof alphas, cudaMemcpyHostToDevice)) return 8;
  s = cusparseLtMatmul(&h, &plan, d_alpha, 0, 0, &beta, 0, d_out, 0, NULL, 0);
  if (cudaMemcpy(&out, d_out, 4, cudaMemcpyDeviceToHost)) return 9;
  printf("vector alpha %d %.1f\n", s, out);
  // A descriptor without vector scaling: alpha is a host float.
  if (cusparseLtMatmulDescriptorInit(&h, &mm2, 0, 0, &c, &c, &c, &c, 2) ||
      cusparseLtMatmulAlgSelectionInit(&h, &sel2, &mm2, 0) || cusparseLtMatmulPlanInit(&h, &plan2, &mm2, &sel2))
    return 10;
  float alpha = 1.5f;
  s = cusparseLtMatmul(&h, &plan2, &alpha, 0, 0, &beta, 0, d_out, 0, NULL, 0);
  if (cudaMemcpy(&out, d_out, 4, cudaMemcpyDeviceToHost)) return 11;
  printf("host alpha %d %.1f\n", s, out);
  /* torch's pattern: records made anew for every matmul, the workspace asked each time. */
  size_t sizes[3];
  int off = 0;
  /* A bias at another address each time: the same question for the library. */
  float *bias[3] = {d_out, d_out + 4, d_out + 8};
  for (int k = 0; k < 3; k++) {
    static rec_t la, lb, lc, lmm, lsel, lplan;
    if (cusparseLtDenseDescriptorInit(&h, &la, 8, 4, 4, 16, 2, 1) || cusparseLtDenseDescriptorInit(&h, &lb, 4, 6, 6, 16, 2, 1) ||
        cusparseLtDenseDescriptorInit(&h, &lc, 8, 6, 6, 16, 2, 1) ||
        cusparseLtMatmulDescriptorInit(&h, &lmm, 0, 0, &la, &lb, &lc, &lc, 2) ||
        cusparseLtMatmulDescSetAttribute(&h, &lmm, 5, &off, sizeof off) ||
        cusparseLtMatmulDescSetAttribute(&h, &lmm, 8 /* BIAS_POINTER */, &bias[k], sizeof bias[k]) ||
        cusparseLtMatmulAlgSelectionInit(&h, &lsel, &lmm, 0) || cusparseLtMatmulPlanInit(&h, &lplan, &lmm, &lsel) ||
        cusparseLtMatmulGetWorkspace(&h, &lplan, &sizes[k]))
      return 12;
    if (cusparseLtMatmulPlanDestroy(&lplan) || cusparseLtMatmulAlgSelectionDestroy(&lsel) ||
        cusparseLtMatDescriptorDestroy(&la) || cusparseLtMatDescriptorDestroy(&lb) || cusparseLtMatDescriptorDestroy(&lc))
      return 13;
  }
  printf("loop %zu %zu %zu\n", sizes[0], sizes[1], sizes[2]);
  int destroyed = cusparseLtMatmulPlanDestroy(&plan);
  int stale = cusparseLtMatmulGetWorkspace(&h, &copy, &ws);
  int uninitialized = cusparseLtMatmulGetWorkspace(&h, &never, &ws);
  printf("destroyed %d stale %d never %d\n", destroyed, stale != 0, uninitialized != 0);
  return cusparseLtMatmulPlanDestroy(&plan2) || cusparseLtMatmulAlgSelectionDestroy(&sel) ||
         cusparseLtMatmulAlgSelectionDestroy(&sel2) || cusparseLtMatDescriptorDestroy(&c) || cusparseLtDestroy(&h);
}
"#;

#[test]
fn library_records_the_program_holds_are_the_workers() {
    let server = server();
    let exe = program_with("sparselt", SPARSELT, &["-l:libcusparseLt.so.0"]);
    let (stdout, stderr) = run_traced(&server, &exe);
    assert_eq!(
        stdout.trim(),
        "refused 1\nworkspace 0 192\nvector alpha 0 2500.5\nhost alpha 0 1500.5\nloop 192 192 192\ndestroyed 0 stale 1 never 1",
        "{stderr}"
    );
    // The client names the descriptors, selections and plans it initializes: only the
    // handle's initializer and the workspace queries wait; a workspace asked again of
    // records made the same way is the client's answer (the loop's second and third), one
    // about a destroyed or never initialized plan the server's.
    assert_eq!(trace_row(&stderr, "cusparseLtInit"), ["1", "1"], "{stderr}");
    for init in [
        "cusparseLtDenseDescriptorInit",
        "cusparseLtMatmulDescriptorInit",
        "cusparseLtMatmulAlgSelectionInit",
        "cusparseLtMatmulPlanInit",
    ] {
        assert_eq!(trace_row(&stderr, init)[1], "0", "{init}: {stderr}");
    }
    assert_eq!(trace_row(&stderr, "cusparseLtMatmulGetWorkspace"), ["6", "4"], "{stderr}");
    // An attribute set waits for the library's answer, unless the library took the same
    // set on a record in the same state: the loop's second and third go without waiting,
    // their bias pointers at other addresses included (and their workspace is still the
    // client's answer).
    assert_eq!(trace_row(&stderr, "cusparseLtMatmulDescSetAttribute"), ["8", "4"], "{stderr}");
}

/// A user object's destructor is the program's function: it runs on the client, once, when
/// the last reference goes — the program's (runtime and driver API) or a graph's — and not
/// before. A handle the program holds no reference to never reaches the driver again (the
/// object may be freed): using it is refused.
const USER_OBJECTS: &str = r#"
#include <stdio.h>
#include <unistd.h>
#include <cuda.h>
#include <cuda_runtime.h>
static volatile int destroyed[3];
static void destroy(void *p) { destroyed[*(int *)p] += 1; }
/* Destructors run on another thread, asynchronously: wait for one (at most 5 s). */
static int wait_for(int i) {
  for (int t = 0; t < 500 && !destroyed[i]; t++) usleep(10000);
  return destroyed[i];
}
int main(void) {
  static int ids[3] = {0, 1, 2};
  cudaUserObject_t a;
  if (cudaUserObjectCreate(&a, &ids[0], destroy, 1, cudaUserObjectNoDestructorSync)) return 2;
  if (cudaUserObjectRetain(a, 2) || cudaUserObjectRelease(a, 2)) return 3;
  usleep(50000);
  int early = destroyed[0];
  if (cudaUserObjectRelease(a, 1)) return 4;
  printf("runtime: before the last release %d, after %d\n", early, wait_for(0));
  cudaGraph_t g;
  cudaUserObject_t b;
  if (cudaGraphCreate(&g, 0) || cudaUserObjectCreate(&b, &ids[1], destroy, 1, cudaUserObjectNoDestructorSync))
    return 5;
  /* The graph takes a reference of its own, then the program gives up its one. */
  if (cudaGraphRetainUserObject(g, b, 1, 0) || cudaUserObjectRelease(b, 1)) return 6;
  usleep(50000);
  early = destroyed[1];
  /* The program holds no reference: the handle is no longer its to use (Chidori's rule). */
  int stale = cudaUserObjectRetain(b, 1) != cudaSuccess;
  if (cudaGraphDestroy(g)) return 7;
  printf("graph: before it went %d, after %d; stale %d\n", early, wait_for(1), stale);
  CUuserObject c;
  if (cuUserObjectCreate(&c, &ids[2], destroy, 2, CU_USER_OBJECT_NO_DESTRUCTOR_SYNC)) return 8;
  if (cuUserObjectRelease(c, 2)) return 9;
  int refused = cudaUserObjectCreate(&a, &ids[0], NULL, 1, cudaUserObjectNoDestructorSync) != cudaSuccess;
  printf("driver: %d; no destructor refused %d; runs %d %d %d\n", wait_for(2), refused, destroyed[0], destroyed[1],
         destroyed[2]);
  return 0;
}
"#;

#[test]
fn user_object_destructors_run_on_the_client_when_the_last_reference_goes() {
    let server = server();
    let exe = program_with("user-objects", USER_OBJECTS, &["-l:libcuda.so.1"]);
    let (stdout, stderr) = run_traced(&server, &exe);
    assert_eq!(
        stdout.trim(),
        "runtime: before the last release 0, after 1\ngraph: before it went 0, after 1; stale 1\n\
         driver: 1; no destructor refused 1; runs 1 1 1",
        "{stderr}"
    );
}

/// The driver's virtual memory management as NVIDIA's vectorAddMMAP and PyTorch's expandable
/// segments use it: a reserved range mapped piece by piece (allocations that may be exported,
/// as PyTorch asks), data across a piece unmapped and mapped again, a handle retained from an
/// address and released (the program's own handle stays good), one unmap of the whole range
/// (every piece leaves the client's map), then everything released.
const VMM: &str = r#"
#include <stdio.h>
#include <string.h>
#include <cuda.h>
#include <cuda_runtime_api.h>
#define EXPECT(c, code) do { if (!(c)) { printf("failed at %d: %s\n", code, #c); return code; } } while (0)
int main(void) {
  EXPECT(cudaFree(0) == cudaSuccess, 2);
  CUmemAllocationProp prop;
  memset(&prop, 0, sizeof prop);
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  size_t g = 0;
  EXPECT(cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) == CUDA_SUCCESS && g, 3);
  CUdeviceptr base;
  EXPECT(cuMemAddressReserve(&base, 4 * g, 0, 0, 0) == CUDA_SUCCESS, 4);
  CUmemGenericAllocationHandle h[4];
  CUmemAccessDesc access;
  memset(&access, 0, sizeof access);
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  for (int i = 0; i < 4; ++i) {
    EXPECT(cuMemCreate(&h[i], g, &prop, 0) == CUDA_SUCCESS, 5);
    EXPECT(cuMemMap(base + i * g, g, 0, h[i], 0) == CUDA_SUCCESS, 6);
    EXPECT(cuMemSetAccess(base + i * g, g, &access, 1) == CUDA_SUCCESS, 7);
  }
  static unsigned char in[4096], out[4096];
  for (int i = 0; i < 4096; ++i) in[i] = (unsigned char)(i * 13);
  EXPECT(cudaMemcpy((void *)(base + 2 * g + 100), in, 4096, cudaMemcpyHostToDevice) == cudaSuccess, 8);
  /* The piece is unmapped and mapped again: its bytes are still there. */
  EXPECT(cuMemUnmap(base + 2 * g, g) == CUDA_SUCCESS, 9);
  EXPECT(cuMemMap(base + 2 * g, g, 0, h[2], 0) == CUDA_SUCCESS, 10);
  EXPECT(cuMemSetAccess(base + 2 * g, g, &access, 1) == CUDA_SUCCESS, 11);
  EXPECT(cudaMemcpy(out, (void *)(base + 2 * g + 100), 4096, cudaMemcpyDeviceToHost) == cudaSuccess, 12);
  EXPECT(memcmp(in, out, 4096) == 0, 13);
  /* A handle found from an address is the program's own, one reference more. */
  CUmemGenericAllocationHandle found;
  EXPECT(cuMemRetainAllocationHandle(&found, (void *)(base + 2 * g + 64)) == CUDA_SUCCESS && found == h[2], 14);
  CUmemAllocationProp got;
  EXPECT(cuMemGetAllocationPropertiesFromHandle(&got, found) == CUDA_SUCCESS, 15);
  EXPECT(got.type == CU_MEM_ALLOCATION_TYPE_PINNED, 16);
  EXPECT(cuMemRelease(found) == CUDA_SUCCESS, 17);
  unsigned int type = 0;
  EXPECT(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, base + 3 * g + 8) == CUDA_SUCCESS, 18);
  EXPECT(type == CU_MEMORYTYPE_DEVICE, 19);
  /* One unmap of the whole range: no piece of it is memory any more. */
  EXPECT(cuMemUnmap(base, 4 * g) == CUDA_SUCCESS, 20);
  for (int i = 0; i < 4; ++i)
    EXPECT(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, base + i * g + 8) != CUDA_SUCCESS, 21);
  for (int i = 0; i < 4; ++i) EXPECT(cuMemRelease(h[i]) == CUDA_SUCCESS, 22);
  EXPECT(cuMemRelease(h[0]) != CUDA_SUCCESS, 23);
  EXPECT(cuMemAddressFree(base, 4 * g) == CUDA_SUCCESS, 24);
  printf("OK\n");
  return 0;
}
"#;

#[test]
fn virtual_memory_is_mapped_in_pieces_retained_and_unmapped_whole() {
    let server = server();
    let exe = program_with("vmm", VMM, &["-l:libcuda.so.1"]);
    let (stdout, stderr) = run_traced(&server, &exe);
    assert_eq!(stdout.trim(), "OK", "{stderr}");
    // The one refused call is the release of a handle already gone.
    let warnings: Vec<&str> = stderr.lines().filter(|l| l.contains("WARN")).collect();
    assert!(warnings.len() <= 1 && warnings.iter().all(|w| w.contains("cuMemRelease")), "{stderr}");
}

/// The driver's copies of a statically linked runtime (cuda-samples' simpleMultiGPU): 128 MiB
/// in on a stream, in 8 MiB chunks over the bulk lanes into the worker's pinned staging
/// buffers, then back. The emulated backend refuses a staging buffer named again while a
/// copy on a stream may still read it, as a GPU would read the next chunk's bytes there.
const STAGED_DRIVER_COPIES: &str = r#"
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#define CHECK(x) do { CUresult r = (x); if (r) { printf("%s: %d\n", #x, r); return 1; } } while (0)
int main(void) {
  CUcontext ctx; CUdevice dev;
  CHECK(cuInit(0)); CHECK(cuDeviceGet(&dev, 0)); CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
  CHECK(cuCtxSetCurrent(ctx));
  size_t n = (size_t)32 << 20, bytes = n * 4;
  CUstream s; CHECK(cuStreamCreate(&s, 0));
  CUdeviceptr d; CHECK(cuMemAlloc(&d, bytes));
  float *h, *back;
  CHECK(cuMemHostAlloc((void **)&h, bytes, 0)); CHECK(cuMemHostAlloc((void **)&back, bytes, 0));
  for (size_t i = 0; i < n; ++i) h[i] = (float)rand() / (float)RAND_MAX;
  for (int rep = 0; rep < 2; ++rep) {
    memset(back, 0, bytes);
    CHECK(cuMemcpyHtoDAsync(d, h, bytes, s));
    CHECK(cuMemcpyDtoHAsync(back, d, bytes, s));
    CHECK(cuStreamSynchronize(s));
    if (memcmp(back, h, bytes)) { printf("rep %d differs\n", rep); return 1; }
  }
  printf("OK\n");
  return 0;
}
"#;

#[test]
fn driver_copies_wait_for_their_stream_before_a_staging_buffer_is_reused() {
    let server = server();
    let exe = program_with("staged-driver-copies", STAGED_DRIVER_COPIES, &["-l:libcuda.so.1"]);
    let (stdout, stderr) = run_traced(&server, &exe);
    assert_eq!(stdout.trim(), "OK", "{stderr}");
}

/// cuda-samples' cuSolverSp_LowlevelCholesky, CPU path: analysis, the workspace size, a
/// factorization into the program's workspace, a solve from it. The host arrays reach the
/// library at the program's own addresses (mirrored), the workspace keeps the factor from
/// the factorization to the solve (the emulated Cholesky writes it there, as a library may),
/// and x comes back.
const LOWLEVEL_CHOLESKY: &str = r#"
#include <stdio.h>
#include <stdlib.h>
typedef void *h_t;
int cusolverSpCreate(h_t *h);
int cusolverSpDestroy(h_t h);
int cusparseCreateMatDescr(h_t *d);
int cusolverSpCreateCsrcholInfoHost(h_t *info);
int cusolverSpDestroyCsrcholInfoHost(h_t info);
int cusolverSpXcsrcholAnalysisHost(h_t h, int n, int nnz, h_t descr, const int *rows, const int *cols, h_t info);
int cusolverSpDcsrcholBufferInfoHost(h_t h, int n, int nnz, h_t descr, const double *vals, const int *rows,
                                     const int *cols, h_t info, size_t *internal, size_t *workspace);
int cusolverSpDcsrcholFactorHost(h_t h, int n, int nnz, h_t descr, const double *vals, const int *rows,
                                 const int *cols, h_t info, void *buffer);
int cusolverSpDcsrcholZeroPivotHost(h_t h, h_t info, double tol, int *position);
int cusolverSpDcsrcholSolveHost(h_t h, int n, const double *b, double *x, h_t info, void *buffer);
int main(void) {
  enum { N = 600 };
  static int rows[N + 1], cols[N];
  static double vals[N], b[N], x[N];
  for (int i = 0; i < N; i++) { rows[i] = i; cols[i] = i; vals[i] = (double)((i % 9) + 1) * ((i % 9) + 1); b[i] = i; }
  rows[N] = N;
  h_t h = 0, info = 0, d = 0;
  size_t internal = 0, workspace = 0;
  int position = 0;
  if (cusolverSpCreate(&h) || cusparseCreateMatDescr(&d) || cusolverSpCreateCsrcholInfoHost(&info)) return 2;
  if (cusolverSpXcsrcholAnalysisHost(h, N, N, d, rows, cols, info)) return 3;
  if (cusolverSpDcsrcholBufferInfoHost(h, N, N, d, vals, rows, cols, info, &internal, &workspace)) return 4;
  void *buffer = malloc(workspace);
  int f = cusolverSpDcsrcholFactorHost(h, N, N, d, vals, rows, cols, info, buffer);
  int z = cusolverSpDcsrcholZeroPivotHost(h, info, 1e-12, &position);
  int s = cusolverSpDcsrcholSolveHost(h, N, b, x, info, buffer);
  double worst = 0;
  for (int i = 0; i < N; i++) {
    double d = x[i] * vals[i] - b[i];
    if (d < 0) d = -d;
    if (d > worst) worst = d;
  }
  printf("workspace %zu factor %d pivot %d %d solve %d close %d\n", workspace, f, z, position, s, worst < 1e-9);
  free(buffer);
  return cusolverSpDestroyCsrcholInfoHost(info) || cusolverSpDestroy(h);
}
"#;

#[test]
fn low_level_sparse_cholesky_on_the_host_keeps_its_arrays_across_calls() {
    let server = server();
    let exe = program_with("lowlevel-cholesky", LOWLEVEL_CHOLESKY, &["-l:libcusolver.so.12", "-l:libcusparse.so.12"]);
    let out = run_cmd(&server.address, &exe).output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert_eq!(stdout.trim(), "workspace 4800 factor 0 pivot 0 -1 solve 0 close 1", "{stderr}");
}

/// torch's Cholesky, LU and QR go through cuSOLVER's 64-bit API without a host workspace:
/// the factorization then sends back nothing but its status and goes without waiting; with
/// a host workspace it waits for the bytes the library leaves there; a refused one surfaces
/// at the next cuSOLVER call that waits.
const CUSOLVER_X_POTRF: &str = r#"
#include <stdio.h>
typedef void *h_t;
int cusolverDnCreate(h_t *h);
int cusolverDnCreateParams(h_t *p);
int cusolverDnXpotrf(h_t h, h_t params, int uplo, long n, int typeA, void *A, long lda, int computeType,
                     void *bufferOnDevice, unsigned long bytesOnDevice, void *bufferOnHost, unsigned long bytesOnHost,
                     int *info);
int cusolverDnXpotrf_bufferSize(h_t h, h_t params, int uplo, long n, int typeA, const void *A, long lda,
                                int computeType, unsigned long *onDevice, unsigned long *onHost);
int cudaMalloc(void **p, unsigned long size);
int main(void) {
  h_t h, params;
  unsigned long on_device, on_host;
  void *a, *work;
  int *info;
  char host[64];
  if (cusolverDnCreate(&h) || cusolverDnCreateParams(&params)) return 2;
  if (cudaMalloc(&a, 4096) || cudaMalloc(&work, 4096) || cudaMalloc((void **)&info, 4)) return 3;
  for (int i = 0; i < 4; ++i)
    if (cusolverDnXpotrf(h, params, 0, 16, 0, a, 16, 0, work, 4096, NULL, 0, info)) return 4;
  if (cusolverDnXpotrf(h, params, 0, 16, 0, a, 16, 0, work, 4096, host, sizeof host, info)) return 5;
  /* A leading dimension shorter than the order: refused, said at the next wait. */
  if (cusolverDnXpotrf(h, params, 0, 16, 0, a, 8, 0, work, 4096, NULL, 0, info)) return 6;
  printf("%d\n", cusolverDnXpotrf_bufferSize(h, params, 0, 16, 0, a, 16, 0, &on_device, &on_host));
  return 0;
}
"#;

#[test]
fn cusolver_factorizations_without_a_host_workspace_do_not_wait() {
    let server = server();
    let exe = program_with("cusolver-xpotrf", CUSOLVER_X_POTRF, &["-l:libcusolver.so.12"]);
    let (stdout, stderr) = run_traced(&server, &exe);
    // CUSOLVER_STATUS_INVALID_VALUE, from the refused factorization.
    assert_eq!(stdout.trim(), "3", "{stderr}");
    // Six factorizations: the one with a host workspace waited. The context is the client's.
    assert_eq!(trace_row(&stderr, "cusolverDnXpotrf"), ["6", "1"], "{stderr}");
    assert_eq!(trace_row(&stderr, "cusolverDnCreate"), ["1", "0"], "{stderr}");
}

/// torch asks cuSOLVER's workspace size before every factorization: here three shapes of
/// LU, each asked twice, and a question the library refuses; Cholesky's with no parameter
/// set, with one as created, with one whose algorithm was set, each again, and with a new
/// set as created.
const CUSOLVER_SIZES: &str = r#"
#include <stdio.h>
#include <stdint.h>
#include <stddef.h>
typedef void *cusolverDnHandle_t;
typedef void *cusolverDnParams_t;
int cusolverDnCreate(cusolverDnHandle_t *h);
int cusolverDnDestroy(cusolverDnHandle_t h);
int cusolverDnCreateParams(cusolverDnParams_t *p);
int cusolverDnDestroyParams(cusolverDnParams_t p);
int cusolverDnSetAdvOptions(cusolverDnParams_t p, int function, int algo);
int cusolverDnSgetrf_bufferSize(cusolverDnHandle_t h, int m, int n, float *A, int lda, int *lwork);
int cusolverDnXpotrf_bufferSize(cusolverDnHandle_t h, cusolverDnParams_t p, int uplo, int64_t n, int typeA,
                                const void *A, int64_t lda, int computeType, size_t *device, size_t *host);
static long potrf(cusolverDnHandle_t h, cusolverDnParams_t p) {
  size_t device = 0, host = 1;
  int s = cusolverDnXpotrf_bufferSize(h, p, 0, 64, 0, 0, 64, 0, &device, &host);
  return s ? -s : (long)(device + host);
}
int main(void) {
  cusolverDnHandle_t h;
  cusolverDnParams_t created, set, fresh;
  if (cusolverDnCreate(&h) || cusolverDnCreateParams(&created) || cusolverDnCreateParams(&set)) return 10;
  int sizes[6] = {32, 64, 32, 64, 128, 32};
  for (int i = 0; i < 6; i++) {
    int lwork = 0;
    if (cusolverDnSgetrf_bufferSize(h, sizes[i], sizes[i], 0, sizes[i], &lwork)) return 11;
    printf("%d ", lwork);
  }
  int lwork = 0;
  printf("refused:%d ", cusolverDnSgetrf_bufferSize(h, 8, 8, 0, 4, &lwork));
  if (cusolverDnSetAdvOptions(set, 0, 1)) return 12;
  printf("%ld %ld %ld ", potrf(h, 0), potrf(h, created), potrf(h, set));
  printf("%ld %ld ", potrf(h, created), potrf(h, set));
  if (cusolverDnDestroyParams(set) || cusolverDnCreateParams(&fresh)) return 13;
  printf("%ld\n", potrf(h, fresh));
  return cusolverDnDestroyParams(created) || cusolverDnDestroyParams(fresh) || cusolverDnDestroy(h);
}
"#;

/// Issue 19: a cuSOLVER workspace question asked before (the same problem, its parameter
/// set set the same way) is answered by the client, in the same process and, checked, in
/// a later one; a refused question is asked each time; a server whose library answers
/// otherwise ends the session naming the call.
#[test]
fn cusolver_workspace_sizes_asked_before_are_answered_by_the_client() {
    let server = server();
    let exe = program_with("cusolver-sizes", CUSOLVER_SIZES, &["-l:libcusolver.so.12"]);
    let (stdout, stderr) = run_traced(&server, &exe);
    assert_eq!(
        stdout.trim(),
        "2048 4096 2048 4096 8192 2048 refused:3 16384 16384 20480 16384 20480 16384",
        "{stderr}"
    );
    let row = |stderr: &str, f: &str| trace_row(stderr, f);
    // Three shapes and the refused question asked; no parameter set, one as created and
    // one set (a new set as created is the question asked of the first).
    assert_eq!(row(&stderr, "cusolverDnSgetrf_bufferSize"), ["7", "4"], "{stderr}");
    assert_eq!(row(&stderr, "cusolverDnXpotrf_bufferSize"), ["6", "3"], "{stderr}");
    // Parameter sets are named by the client: made without waiting.
    assert_eq!(row(&stderr, "cusolverDnCreateParams"), ["3", "0"], "{stderr}");

    let cache = chidori_tests::scratch("cusolver-sizes-cache");
    let (first, stderr) = run_learning(&server, &exe, &cache, &[]);
    assert_eq!(first, stdout, "{stderr}");
    let (second, stderr) = run_learning(&server, &exe, &cache, &[]);
    assert_eq!(second, stdout, "{stderr}");
    assert_eq!(row(&stderr, "cusolverDnSgetrf_bufferSize"), ["7", "1"], "only the refused one: {stderr}");
    assert_eq!(row(&stderr, "cusolverDnXpotrf_bufferSize"), ["6", "0"], "{stderr}");
    assert!(!stderr.contains("answered differently") && !stderr.contains("WARN"), "{stderr}");
    drop(server);

    // A server whose library needs other workspaces (same GPU, same versions).
    let other = salted_server();
    let (_, stderr) = run_learning(&other, &exe, &cache, &[]);
    assert!(
        stderr.contains("the server answered differently (another workspace size)"),
        "a different answer ends the session, naming the call: {stderr}"
    );
}

/// torch resets a captured graph by destroying its instance and its graph: here graphs
/// made by a create, a capture and a clone, their instances, and a graph and an instance
/// destroyed a second time, a made-up handle and NULL.
const GRAPH_DESTROYS: &str = r#"
#include <stdio.h>
#include <cuda_runtime_api.h>
int main(void) {
  cudaStream_t s;
  cudaGraph_t made, captured, cloned;
  cudaGraphExec_t x1, x2, x3;
  if (cudaStreamCreate(&s) || cudaGraphCreate(&made, 0)) return 10;
  if (cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) || cudaStreamEndCapture(s, &captured)) return 11;
  if (cudaGraphClone(&cloned, captured)) return 12;
  if (cudaGraphInstantiate(&x1, made, 0) || cudaGraphInstantiate(&x2, captured, 0) ||
      cudaGraphInstantiateWithFlags(&x3, cloned, 0)) return 13;
  int a = cudaGraphExecDestroy(x1), b = cudaGraphExecDestroy(x2), c = cudaGraphExecDestroy(x3);
  int d = cudaGraphDestroy(made), e = cudaGraphDestroy(captured), f = cudaGraphDestroy(cloned);
  printf("%d%d%d%d%d%d ", a, b, c, d, e, f);
  printf("again:%d,%d ", cudaGraphExecDestroy(x2) != 0, cudaGraphDestroy(made) != 0);
  printf("made-up:%d null:%d\n", cudaGraphDestroy((cudaGraph_t)0x1234) != 0, cudaGraphExecDestroy(0) != 0);
  return 0;
}
"#;

/// Issue 19: graphs and instances the server handed out are destroyed without waiting
/// (they cannot be refused); any other handle waits for the server's refusal.
#[test]
fn graphs_handed_out_are_destroyed_without_waiting() {
    let server = server();
    let exe = program("graph-destroys", GRAPH_DESTROYS);
    let (stdout, stderr) = run_traced(&server, &exe);
    assert_eq!(stdout.trim(), "000000 again:1,1 made-up:1 null:1", "{stderr}");
    // The three instances and three graphs went without waiting; the second destroys, the
    // made-up handle and NULL waited.
    assert_eq!(trace_row(&stderr, "cudaGraphExecDestroy"), ["5", "2"], "{stderr}");
    assert_eq!(trace_row(&stderr, "cudaGraphDestroy"), ["5", "2"], "{stderr}");
}

const PLACED_ALLOCATIONS: &str = r#"
#include <stdio.h>
#include <string.h>
#include <stdlib.h>
#include <cuda_runtime_api.h>
#define MIB (1u << 20)
int main(void) {
  void *a = 0, *b = 0, *c = 0, *again = 0, *huge = 0;
  /* Whole granules (2 MiB multiples), an odd size, and more than the GPU has. */
  if (cudaMalloc(&a, 4 * MIB) || cudaMalloc(&b, 2 * MIB) || cudaMalloc(&c, 1000)) return 10;
  int oom = cudaMalloc(&huge, (size_t)512 << 30);
  unsigned char *host = malloc(4 * MIB), *back = malloc(2 * MIB);
  for (unsigned i = 0; i < 4 * MIB; i++) host[i] = (unsigned char)(i * 7 + 3);
  if (cudaMemcpy(a, host, 4 * MIB, cudaMemcpyHostToDevice)) return 11;
  if (cudaMemcpy(b, (char *)a + 2 * MIB, 2 * MIB, cudaMemcpyDeviceToDevice)) return 12;
  if (cudaMemcpy(back, b, 2 * MIB, cudaMemcpyDeviceToHost)) return 13;
  int same = memcmp(back, host + 2 * MIB, 2 * MIB) == 0;
  struct cudaPointerAttributes attr;
  if (cudaPointerGetAttributes(&attr, (char *)b + 100)) return 14;
  int inside = cudaFree((char *)a + 4096);
  cudaGetLastError();
  int freed = cudaFree(a);
  int twice = cudaFree(a);
  cudaGetLastError();
  if (cudaMalloc(&again, 2 * MIB)) return 15;
  printf("oom:%d same:%d type:%d base:%d inside:%d freed:%d reused:%d twice:%d\n", oom, same, (int)attr.type,
         attr.devicePointer == (char *)b + 100, inside, freed, again == a, twice);
  if (cudaFree(b) || cudaFree(c) || cudaFree(again)) return 16;
  /* A reset frees everything allocated on the device: the window's front is placed again. */
  void *x = 0, *y = 0, *z = 0;
  if (cudaMalloc(&x, 2 * MIB) || cudaMalloc(&y, 4 * MIB) || cudaDeviceReset()) return 17;
  if (cudaMalloc(&z, 6 * MIB) || cudaMemset(z, 1, 6 * MIB)) return 18;
  printf("reset:%d ", z == a);
  /* 5,000,000 bytes: placed in three granules; what the program holds is its 5,000,000. */
  void *odd = 0;
  unsigned char *big = malloc(5000000), *big_back = malloc(5000000);
  for (unsigned i = 0; i < 5000000; i++) big[i] = (unsigned char)(i * 13 + 1);
  if (cudaMalloc(&odd, 5000000) || cudaMemcpy(odd, big, 5000000, cudaMemcpyHostToDevice)) return 19;
  if (cudaMemcpy(big_back, odd, 5000000, cudaMemcpyDeviceToHost)) return 20;
  struct cudaPointerAttributes odd_attr;
  if (cudaPointerGetAttributes(&odd_attr, (char *)odd + 4999999)) return 21;
  printf("odd:%d\n", memcmp(big, big_back, 5000000) == 0 && odd_attr.type == cudaMemoryTypeDevice);
  return cudaFree(odd) ? 22 : 0;
}
"#;

/// Issue 19: a `cudaMalloc` of whole granules, or of 4 MiB or more rounded up to them, is
/// placed by the client in the window the server reserved, without waiting; what it holds
/// is ordinary device memory (copies, pointer attributes, frees, reuse, resets), and what
/// does not fit waits for the GPU's answer.
#[test]
fn large_allocations_are_placed_without_waiting() {
    let server = server();
    let exe = program("placed-allocations", PLACED_ALLOCATIONS);
    let cache = chidori_tests::scratch("placed-allocations-cache");
    let expected = "oom:2 same:1 type:2 base:1 inside:1 freed:0 reused:1 twice:1\nreset:1 odd:1";
    let (stdout, stderr) = run_learning(&server, &exe, &cache, &[("CHIDORI_WINDOW_ALLOC", "1")]);
    assert_eq!(stdout.trim(), expected, "{stderr}");
    // Nine allocations: the small odd size and the one larger than the device's free
    // memory waited (5,000,000 bytes were rounded up to granules); the window's question
    // was asked as the session started, so the first allocation waited for its answer at
    // most; the four frees of placed memory (one a refused inner address, answered by the
    // client) and the two others waited as before; the reset's frees went with it.
    let trips = |stderr: &str, f: &str| trace_row(stderr, f)[1].clone();
    assert_eq!(trips(&stderr, "cudaMalloc"), "2", "{stderr}");
    let window = trace_row(&stderr, "(allocation window)");
    assert!(window == ["1", "0"] || window == ["1", "1"], "{stderr}");
    assert_eq!(trace_row(&stderr, "(placed free)"), ["4", "4"], "{stderr}");
    assert_eq!(trips(&stderr, "cudaFree"), "2", "{stderr}");
    let (stdout, stderr) = run_learning(&server, &exe, &cache, &[("CHIDORI_WINDOW_ALLOC", "0")]);
    // The emulated GPU's own allocator never hands an address out again.
    assert_eq!(stdout.trim(), expected.replace(":1 twice", ":0 twice").replace("reset:1", "reset:0"), "{stderr}");
    assert_eq!(trips(&stderr, "cudaMalloc"), "9", "{stderr}");
    assert!(!stderr.contains("(allocation window)"), "{stderr}");
    assert_eq!(trips(&stderr, "cudaFree"), "7", "{stderr}");
}

/// Frees of placed memory after a device synchronize, as torch empties its cache when a
/// graph capture starts: nothing to wait for, so none waits; the device stays idle for
/// the next; after new work, a free waits again.
const PLACED_FREES_ON_IDLE: &str = r#"
#include <stdio.h>
#include <cuda_runtime_api.h>
int main(void) {
  void *p[3];
  unsigned char back[4] = {0};
  for (int i = 0; i < 3; i++)
    if (cudaMalloc(&p[i], 2 << 20) || cudaMemset(p[i], i + 1, 2 << 20)) return 10;
  if (cudaDeviceSynchronize()) return 11;
  for (int i = 0; i < 3; i++)
    if (cudaFree(p[i])) return 12;
  if (cudaDeviceSynchronize()) return 13;
  void *again = 0;
  if (cudaMalloc(&again, 2 << 20) || cudaMemset(again, 9, 2 << 20)) return 14;
  if (cudaMemcpy(back, again, 4, cudaMemcpyDeviceToHost)) return 15;
  if (cudaFree(again)) return 16;
  printf("reused:%d back:%d\n", again == p[0], back[3]);
  return 0;
}
"#;

#[test]
fn frees_of_placed_memory_on_an_idle_device_wait_for_nothing() {
    let server = server();
    let exe = program("placed-frees-idle", PLACED_FREES_ON_IDLE);
    let cache = chidori_tests::scratch("placed-frees-idle-cache");
    let (stdout, stderr) = run_learning(&server, &exe, &cache, &[("CHIDORI_WINDOW_ALLOC", "1")]);
    assert_eq!(stdout.trim(), "reused:1 back:9", "{stderr}");
    // Three frees after the synchronize went without waiting (and so did the synchronize
    // after them: the device stayed idle); the last one, after a memset, waited.
    assert_eq!(trace_row(&stderr, "(placed free)"), ["4", "1"], "{stderr}");
    assert_eq!(trace_row(&stderr, "cudaDeviceSynchronize"), ["2", "1"], "{stderr}");
}

/// Allocations while a stream captures: in the global mode an allocation is illegal on
/// any thread, so the GPU must answer it; a thread that swapped in the relaxed mode (as
/// torch's allocator does around its capture allocations) may allocate, and is placed.
const PLACED_WHILE_CAPTURING: &str = r#"
#include <stdio.h>
#include <cuda_runtime_api.h>
int main(void) {
  cudaStream_t s;
  cudaGraph_t g;
  void *global = 0, *relaxed = 0;
  if (cudaStreamCreate(&s) || cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal)) return 10;
  int in_global = cudaMalloc(&global, 2 << 20);
  enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  if (cudaThreadExchangeStreamCaptureMode(&mode)) return 11;
  int in_relaxed = cudaMalloc(&relaxed, 2 << 20);
  if (cudaThreadExchangeStreamCaptureMode(&mode) || cudaStreamEndCapture(s, &g)) return 12;
  printf("global:%d relaxed:%d\n", in_global, in_relaxed);
  return 0;
}
"#;

#[test]
fn allocations_while_capturing_are_placed_only_where_legal() {
    let server = server();
    let exe = program("placed-capturing", PLACED_WHILE_CAPTURING);
    let cache = chidori_tests::scratch("placed-capturing-cache");
    let (stdout, stderr) = run_learning(&server, &exe, &cache, &[("CHIDORI_WINDOW_ALLOC", "1")]);
    // The emulated GPU allows both (a real one refuses the first and ends the capture).
    assert_eq!(stdout.trim(), "global:0 relaxed:0", "{stderr}");
    assert_eq!(trace_row(&stderr, "cudaMalloc")[1], "1", "the global mode's allocation waited: {stderr}");
    // Asked as the session started; the global mode's allocation waited after it, so it
    // had come.
    assert_eq!(trace_row(&stderr, "(allocation window)"), ["1", "0"], "{stderr}");
}

/// Compile a C program that declares the cuDNN functions it uses and links the cuDNN 9 shim.
fn cudnn_program(name: &str, source: &str) -> PathBuf {
    let dir = chidori_tests::scratch(name);
    let src = dir.join(format!("{name}.c"));
    std::fs::write(&src, source).unwrap();
    let exe = dir.join(name);
    chidori_tests::cc(
        &src,
        &exe,
        &[&format!("-L{}", chidori_tests::shim_dir().display()), "-l:libcudnn.so.9", "-l:libcudart.so.13"],
    );
    exe
}

#[test]
fn cudnn_graphs_wait_only_where_a_status_steers() {
    let server = server();
    let exe = cudnn_program("cudnn-graph", CUDNN_GRAPH);
    let (stdout, stderr) = run_traced(&server, &exe);
    // The graph of named descriptors finalized (the worker mapped the names in the arrays);
    // the foreign element is CUDNN_STATUS_BAD_PARAM at the next waiting call, and so is the
    // foreign argument.
    assert_eq!(stdout.trim(), "graph=0 sent=0 next=2000 foreign=2000", "{stderr}");
    assert!(stderr.contains("element 1 of the array, 0x1234, is not a cudnnBackendDescriptor_t"), "{stderr}");
    let row = |f: &str| trace_row(&stderr, f);
    // Round trips: the finalizes of the two graphs, the plan, and the foreign descriptor.
    assert_eq!(row("cudnnBackendCreateDescriptor"), ["107", "0"], "{stderr}");
    assert_eq!(row("cudnnBackendFinalize"), ["107", "4"], "{stderr}");
    assert_eq!(row("cudnnBackendSetAttribute"), ["204", "0"], "{stderr}");
    // The plan's handle and a pack's data pointers, asked back, are answered with the
    // client's own values.
    assert_eq!(row("cudnnBackendGetAttribute"), ["2", "0"], "{stderr}");
    assert_eq!(row("cudnnBackendExecute"), ["100", "0"], "{stderr}");
    assert_eq!(row("cudnnBackendDestroyDescriptor"), ["100", "0"], "{stderr}");
}

/// cuBLAS's host<->GPU helpers copy strided host arrays: only the elements the arguments
/// name are read or written (the host side never travels as a GPU address).
const CUBLAS_HELPERS: &str = r#"
#include <stdio.h>
#include <cuda_runtime_api.h>
int cublasSetMatrix(int rows, int cols, int elemSize, const void *A, int lda, void *B, int ldb);
int cublasGetMatrix(int rows, int cols, int elemSize, const void *A, int lda, void *B, int ldb);
int cublasSetVector(int n, int elemSize, const void *x, int incx, void *y, int incy);
int cublasGetVector(int n, int elemSize, const void *x, int incx, void *y, int incy);
int cublasSetMatrixAsync(int rows, int cols, int elemSize, const void *A, int lda, void *B, int ldb, cudaStream_t s);
int cublasGetVectorAsync(int n, int elemSize, const void *x, int incx, void *y, int incy, cudaStream_t s);
int cublasAlloc(int n, int elemSize, void **devicePtr);
int cublasFree(void *devicePtr);
int main(void) {
  float *d = 0;
  /* The legacy allocator: the client's cudaMalloc and cudaFree. */
  if (cublasAlloc(64, sizeof(float), (void **)&d) || !d) return 2;
  struct cudaPointerAttributes at;
  if (cudaPointerGetAttributes(&at, d + 10) || at.type != cudaMemoryTypeDevice) return 3;
  if (cublasFree(d) || cublasAlloc(0, 4, (void **)&d) != 7) return 4;
  if (cudaMalloc((void **)&d, 64 * sizeof(float))) return 2;
  float a[8] = {1, 2, 3, -1, 4, 5, 6, -1}; /* 3x2, column-major, lda 4 */
  float back[10], v[6] = {10, -1, 20, -1, 30, -1}, w[3] = {0}, z[6] = {0};
  for (int i = 0; i < 10; i++) back[i] = 99;
  int s1 = cublasSetMatrix(3, 2, sizeof(float), a, 4, d, 3);
  int s2 = cublasGetMatrix(3, 2, sizeof(float), d, 3, back, 5);
  int s3 = cublasSetVector(3, sizeof(float), v, 2, d + 16, 1);
  int s4 = cublasGetVector(3, sizeof(float), d + 16, 1, w, 1);
  int s5 = cublasSetMatrixAsync(3, 2, sizeof(float), a, 4, d + 32, 3, 0);
  int s6 = cublasGetVectorAsync(6, sizeof(float), d + 32, 1, z, 1, 0);
  int sync = cudaDeviceSynchronize();
  int bad = cublasSetVector(3, 0, v, 2, d, 1), short_ld = cublasSetMatrix(3, 2, 4, a, 2, d, 3);
  printf("%d %d %d %d %d %d %d %d %d |", s1, s2, s3, s4, s5, s6, sync, bad, short_ld);
  for (int i = 0; i < 10; i++) printf(" %g", back[i]);
  printf(" | %g %g %g | %g %g\n", w[0], w[1], w[2], z[0], z[5]);
  return 0;
}
"#;

#[test]
fn cublas_helpers_copy_only_the_named_elements() {
    let server = server();
    let exe = program_with("cublas-helpers", CUBLAS_HELPERS, &["-l:libcublas.so.13"]);
    let out = run_cmd(&server.address, &exe).output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "status {:?}; {stdout}\n{stderr}", out.status);
    // CUBLAS_STATUS_INVALID_VALUE (7) for a zero element size and a leading dimension below
    // the rows; the padding of the host arrays is neither read nor written.
    assert_eq!(stdout.trim(), "0 0 0 0 0 0 0 7 7 | 1 2 3 99 99 4 5 6 99 99 | 10 20 30 | 1 6", "{stderr}");
}

/// The runtime's 2D copies move `width` bytes of each row between pitched buffers, and the
/// per-thread form's NULL stream is the thread's own (what cudaStreamPerThread waits for).
const COPIES_2D: &str = r#"
#include <stdio.h>
#include <string.h>
#include <cuda_runtime_api.h>
cudaError_t cudaMemcpy2DAsync_ptsz(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                                   size_t height, enum cudaMemcpyKind kind, cudaStream_t stream);
int main(void) {
  unsigned char host[3][8], back[3][6], *d;
  for (int r = 0; r < 3; r++)
    for (int c = 0; c < 8; c++) host[r][c] = (unsigned char)(r * 10 + c);
  memset(back, 99, sizeof back);
  if (cudaMalloc((void **)&d, 64)) return 2;
  int s1 = cudaMemcpy2D(d, 5, host, 8, 5, 3, cudaMemcpyHostToDevice);
  int s2 = cudaMemcpy2DAsync_ptsz(back, 6, d, 5, 4, 3, cudaMemcpyDeviceToHost, 0);
  int s3 = cudaStreamSynchronize(cudaStreamPerThread);
  printf("%d %d %d |", s1, s2, s3);
  for (int r = 0; r < 3; r++)
    for (int c = 0; c < 6; c++) printf(" %d", back[r][c]);
  printf("\n");
  return 0;
}
"#;

#[test]
fn runtime_2d_copies_move_only_each_rows_width() {
    let server = server();
    let exe = program("copies-2d", COPIES_2D);
    let (stdout, stderr) = run_traced(&server, &exe);
    // Four bytes of each row come back, six apart; the pitch's padding keeps its 99s.
    assert_eq!(stdout.trim(), "0 0 0 | 0 1 2 3 99 99 10 11 12 13 99 99 20 21 22 23 99 99", "{stderr}");
}

/// cu/cudaMemRangeGetAttributes refuse NULL arrays and an empty list as invalid values.
const RANGE_ATTRIBUTES: &str = r#"
#include <stdio.h>
#include <cuda.h>
#include <cuda_runtime_api.h>
int main(void) {
  char *d;
  if (cudaMalloc((void **)&d, 4096)) return 2;
  int v = 0;
  void *data[1] = {&v};
  size_t sizes[1] = {sizeof v};
  enum cudaMemRangeAttribute rt[1] = {cudaMemRangeAttributeLastPrefetchLocation};
  CUmem_range_attribute cu[1] = {CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION};
  int r1 = cudaMemRangeGetAttributes(NULL, sizes, rt, 1, d, 4096);
  int r2 = cudaMemRangeGetAttributes(data, sizes, rt, 0, d, 4096);
  int d1 = cuMemRangeGetAttributes(data, sizes, NULL, 1, (CUdeviceptr)d, 4096);
  int d2 = cuMemRangeGetAttributes(data, NULL, cu, 1, (CUdeviceptr)d, 4096);
  printf("%d %d %d %d\n", r1, r2, d1, d2);
  return 0;
}
"#;

#[test]
fn range_attribute_lists_that_name_nothing_are_invalid_values() {
    let server = server();
    let exe = program_with("range-attributes", RANGE_ATTRIBUTES, &["-l:libcuda.so.1"]);
    let (stdout, stderr) = run_traced(&server, &exe);
    assert_eq!(stdout.trim(), "1 1 1 1", "{stderr}");
}

/// cudnnBackendGetAttribute writes what the library wrote and nothing more: an array
/// shorter than the requested count (the library has fewer elements) ends at a read-only
/// page, and a Get of descriptors may pass a read-only array (it is only read).
const CUDNN_GET_ATTRIBUTE: &str = r#"
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
typedef void *desc_t;
int cudnnBackendCreateDescriptor(int type, desc_t *d);
int cudnnBackendGetAttribute(desc_t d, int name, int type, long long requested, long long *count, void *elements);
int main(void) {
  desc_t tensor = 0, engine = 0;
  if (cudnnBackendCreateDescriptor(17, &tensor) || cudnnBackendCreateDescriptor(2, &engine)) return 2;
  char *page = mmap(0, 8192, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (page == MAP_FAILED) return 3;
  memcpy(page + 4096, &engine, sizeof engine);
  if (mprotect(page + 4096, 4096, PROT_READ)) return 4;
  long long *two = (long long *)(page + 4096 - 16);
  long long count = -1, described = -1, available = -1;
  int a = cudnnBackendGetAttribute(tensor, 1, 3 /* INT64 */, 8, &count, two);
  int b = cudnnBackendGetAttribute(tensor, 1, 15 /* descriptors */, 1, &described, page + 4096);
  int c = cudnnBackendGetAttribute(tensor, 1, 3, 0, &available, 0);
  printf("%d %d %d count=%lld described=%lld available=%lld first=%llx second=%llx\n", a, b, c, count, described,
         available, (unsigned long long)two[0], (unsigned long long)two[1]);
  return 0;
}
"#;

#[test]
fn cudnn_get_attribute_writes_only_what_the_library_wrote() {
    let server = server();
    let exe = cudnn_program("cudnn-get", CUDNN_GET_ATTRIBUTE);
    let out = run_cmd(&server.address, &exe).output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "status {:?} (a write past the elements faults); {stdout}\n{stderr}", out.status);
    assert_eq!(
        stdout.trim(),
        "0 0 0 count=2 described=1 available=2 first=1111111111111111 second=1111111111111111",
        "{stderr}"
    );
}

/// torch's frontend fills an engine from each engine configuration, then asks it for its
/// notes and index. What the program asked of the first engine is asked of the next ones in
/// the same round trip as their fill; a repeated question is answered from there; a Set
/// drops what is known.
const CUDNN_ENGINE_QUERIES: &str = r#"
#include <stdio.h>
typedef void *desc_t;
int cudnnBackendCreateDescriptor(int type, desc_t *d);
int cudnnBackendSetAttribute(desc_t d, int name, int type, long long count, const void *elements);
int cudnnBackendGetAttribute(desc_t d, int name, int type, long long requested, long long *count, void *elements);
enum { ENGINE = 2, ENGINECFG = 3, DESCRIPTORS = 15, NOTE = 11, INT64 = 3 };
enum { CFG_ENGINE = 300, GLOBAL_INDEX = 1301, NUMERICAL_NOTE = 1303 };
static void ask(desc_t e, int label) {
  long long m = -1, k = -1, index = 0;
  int notes[4] = {0};
  int a = cudnnBackendGetAttribute(e, NUMERICAL_NOTE, NOTE, 4, &m, notes);
  int b = cudnnBackendGetAttribute(e, NUMERICAL_NOTE, NOTE, 4, &m, notes);
  int c = cudnnBackendGetAttribute(e, GLOBAL_INDEX, INT64, 1, &k, &index);
  printf("%d: %d %d %d m=%lld k=%lld notes=%x,%x,%x index=%llx\n", label, a, b, c, m, k, notes[0], notes[1], notes[2],
         (unsigned long long)index);
}
int main(void) {
  desc_t cfg = 0, engines[3] = {0};
  if (cudnnBackendCreateDescriptor(ENGINECFG, &cfg)) return 2;
  for (int i = 0; i < 3; i++) {
    long long n = -1;
    if (cudnnBackendCreateDescriptor(ENGINE, &engines[i])) return 3;
    if (cudnnBackendGetAttribute(cfg, CFG_ENGINE, DESCRIPTORS, 1, &n, &engines[i]) || n != 1) return 4;
    ask(engines[i], i);
  }
  long long one = 1;
  if (cudnnBackendSetAttribute(engines[2], GLOBAL_INDEX, INT64, 1, &one)) return 5;
  ask(engines[2], 3);
  return 0;
}
"#;

#[test]
fn cudnn_engine_questions_ride_with_the_fill() {
    let server = server();
    let exe = cudnn_program("cudnn-engines", CUDNN_ENGINE_QUERIES);
    let (stdout, stderr) = run_traced(&server, &exe);
    // The emulated library has two elements of every attribute: every answer is the one the
    // server gives, whether asked now or earlier.
    let same = "0 0 0 m=2 k=1 notes=11111111,11111111,0 index=1111111111111111";
    let expected: Vec<String> = (0..4).map(|i| format!("{i}: {same}")).collect();
    assert_eq!(stdout.lines().collect::<Vec<_>>(), expected, "{stderr}");
    let row = stderr.lines().find(|l| l.starts_with("cudnnBackendGetAttribute")).expect("a GetAttribute row");
    let cols: Vec<&str> = row.split_whitespace().skip(1).take(2).collect();
    // 3 fills + 4 × 3 questions = 15 calls. Round trips: the first engine's fill and its
    // two new questions (3; the repeat is answered here), each later fill with its questions
    // (2), and all three questions after the Set (3: the Set dropped what was known).
    assert_eq!(cols, ["15", "8"], "{stderr}");
}

/// torch's frontend, building a cuDNN graph, finalizes the heuristics, asks their count,
/// fills configurations, asks each its workspace, fills its engine and asks the engine's
/// notes (their count without an array, then the notes), then fills the engine again. The first build teaches the client those questions; in the next builds they all
/// ride with the heuristics' finalize (made ahead into the client's own descriptors) and the
/// program's calls are answered from there, its descriptors filled without waiting.
const CUDNN_HEURISTICS: &str = r#"
#include <stdio.h>
typedef void *desc_t;
int cudnnBackendCreateDescriptor(int type, desc_t *d);
int cudnnBackendDestroyDescriptor(desc_t d);
int cudnnBackendFinalize(desc_t d);
int cudnnBackendGetAttribute(desc_t d, int name, int type, long long requested, long long *count, void *elements);
enum { ENGINE = 2, ENGINECFG = 3, ENGINEHEUR = 4, KNOB_CHOICE = 7, DESCRIPTORS = 15, NOTE = 11, INT64 = 3 };
enum { HEUR_RESULTS = 202, CFG_ENGINE = 300, CFG_KNOBS = 302, CFG_WORKSPACE = 303, NUMERICAL_NOTE = 1303 };
enum { KNOB_VALUE = 601 };
static int build(int label) {
  desc_t heur = 0, cfgs[4] = {0};
  if (cudnnBackendCreateDescriptor(ENGINEHEUR, &heur)) return 10;
  if (cudnnBackendFinalize(heur)) return 11;
  long long n = -1, got = -1;
  if (cudnnBackendGetAttribute(heur, HEUR_RESULTS, DESCRIPTORS, 0, &n, 0) || n < 1 || n > 4) return 12;
  for (int i = 0; i < n; i++)
    if (cudnnBackendCreateDescriptor(ENGINECFG, &cfgs[i])) return 13;
  if (cudnnBackendGetAttribute(heur, HEUR_RESULTS, DESCRIPTORS, n, &got, cfgs)) return 14;
  for (int i = 0; i < got; i++) {
    long long k = -1, ws = 0, m = -1, notes_n = -1, notes_asked = -1;
    desc_t engine = 0;
    int notes[4] = {0};
    int a = cudnnBackendGetAttribute(cfgs[i], CFG_WORKSPACE, INT64, 1, &k, &ws);
    if (cudnnBackendCreateDescriptor(ENGINE, &engine)) return 15;
    int b = cudnnBackendGetAttribute(cfgs[i], CFG_ENGINE, DESCRIPTORS, 1, &m, &engine);
    /* How many notes (no array), then the notes: as torch's frontend asks. */
    int c = cudnnBackendGetAttribute(engine, NUMERICAL_NOTE, NOTE, 4, &notes_asked, 0);
    int d = cudnnBackendGetAttribute(engine, NUMERICAL_NOTE, NOTE, 4, &notes_n, notes);
    /* The configuration's engine again, into a new descriptor (to build the plan). */
    desc_t again = 0;
    long long m2 = -1, notes_again = -1;
    if (cudnnBackendCreateDescriptor(ENGINE, &again)) return 18;
    if (cudnnBackendGetAttribute(cfgs[i], CFG_ENGINE, DESCRIPTORS, 1, &m2, &again) || m2 != 1) return 19;
    if (cudnnBackendGetAttribute(again, NUMERICAL_NOTE, NOTE, 4, &notes_again, 0) || notes_again != notes_asked) return 20;
    if (cudnnBackendDestroyDescriptor(again)) return 21;
    /* Room for 8 knob choices; the library sets fewer. */
    desc_t knobs[8] = {0};
    long long kn = -1, kc = -1, kv = 0;
    for (int j = 0; j < 8; j++)
      if (cudnnBackendCreateDescriptor(KNOB_CHOICE, &knobs[j])) return 22;
    int e = cudnnBackendGetAttribute(cfgs[i], CFG_KNOBS, DESCRIPTORS, 8, &kn, knobs);
    int g = cudnnBackendGetAttribute(knobs[0], KNOB_VALUE, INT64, 1, &kc, &kv);
    for (int j = 0; j < 8; j++)
      if (cudnnBackendDestroyDescriptor(knobs[j])) return 23;
    printf("%d: n=%lld got=%lld %d %d %d %d k=%lld ws=%llx m=%lld notes=%lld/%lld:%x,%x,%x knobs=%d %lld %d %lld %llx\n",
           label, n, got, a, b, c, d, k, (unsigned long long)ws, m, notes_asked, notes_n, notes[0], notes[1], notes[2], e,
           kn, g, kc, (unsigned long long)kv);
    if (cudnnBackendDestroyDescriptor(engine) || cudnnBackendDestroyDescriptor(cfgs[i])) return 16;
  }
  return cudnnBackendDestroyDescriptor(heur) ? 17 : 0;
}
int main(void) {
  for (int i = 0; i < 3; i++) {
    int rc = build(i);
    if (rc) return rc;
  }
  return 0;
}
"#;

#[test]
fn cudnn_graph_builds_after_the_first_ride_with_the_heuristics() {
    let server = server();
    let exe = cudnn_program("cudnn-heuristics", CUDNN_HEURISTICS);
    let (stdout, stderr) = run_traced(&server, &exe);
    // Every build sees the emulated library's answers, whether asked or made ahead.
    let same =
        "n=1 got=1 0 0 0 0 k=1 ws=1111111111111111 m=1 notes=2/2:11111111,11111111,0 knobs=0 1 0 1 1111111111111111";
    let expected: Vec<String> = (0..3).map(|i| format!("{i}: {same}")).collect();
    assert_eq!(stdout.lines().collect::<Vec<_>>(), expected, "{stderr}");
    // The first build: its finalize, each of six questions, the second fill of the engine,
    // whose question rides with it, the knob fill and the knob's value (10); each later
    // build: the finalize with everything made ahead, both engine fills and the knobs
    // included (1).
    let total = stderr.lines().find(|l| l.starts_with("TOTAL")).unwrap_or_else(|| panic!("{stderr}"));
    assert_eq!(total.split_whitespace().nth(2), Some("12"), "{stderr}");
    // The program makes 12 descriptors per build (36). Made ahead in each later build: one
    // configuration, two engines, and 2 knob choices, not 8: the library set one last time,
    // and a fill of 2 that sets one shows there is no more (10).
    let creates =
        stderr.lines().find(|l| l.starts_with("cudnnBackendCreateDescriptor")).unwrap_or_else(|| panic!("{stderr}"));
    assert_eq!(creates.split_whitespace().nth(1), Some("46"), "{stderr}");
    assert!(!stderr.contains("WARN") && !stderr.contains("ERROR"), "{stderr}");
}

/// The round trips `--trace` counted in all (its TOTAL row), from a run's stderr.
fn round_trips(stderr: &str) -> Option<u64> {
    stderr.lines().find(|l| l.starts_with("TOTAL"))?.split_whitespace().nth(2)?.parse().ok()
}

/// Issue 19 item 1: what one process learned to ask after cuDNN's finalizes and fills is kept
/// for the next process on the same server identity, whose first graph build then rides
/// like a later one, with the same answers.
#[test]
fn cudnn_questions_learned_by_one_process_ride_with_the_next_ones_first_build() {
    let server = server();
    let exe = cudnn_program("cudnn-patterns", CUDNN_HEURISTICS);
    let cache = chidori_tests::scratch("cudnn-patterns-cache");
    let run = || {
        // Finalizes answered as before off, whatever round trip a loaded machine measures.
        let (stdout, stderr) = run_learning(&server, &exe, &cache, &[("CHIDORI_LEARNED_CUDNN", "0")]);
        (stdout, round_trips(&stderr).unwrap_or(0), stderr)
    };
    let (first, first_trips, stderr) = run();
    assert_eq!(first_trips, 12, "as within one process: {stderr}");
    let (second, second_trips, stderr) = run();
    assert_eq!(second, first, "{stderr}");
    assert_eq!(second_trips, 3, "every build rides with its finalize: {stderr}");
}

/// Issue 19 item 1: a cuDNN finalize that steers its caller, the questions and the fills,
/// answered as before when the descriptor holds what it held then
/// (`CHIDORI_LEARNED_CUDNN=1`): a later build of the same graph, in this process or the
/// next, waits for nothing, still makes every call on the server, and a server whose
/// library answers otherwise ends the session saying so.
#[test]
fn cudnn_finalizes_learned_answer_later_builds_of_the_same_graph() {
    let server = server();
    let exe = cudnn_program("cudnn-finalizes", CUDNN_HEURISTICS);
    let cache = chidori_tests::scratch("cudnn-finalizes-cache");
    let on = [("CHIDORI_LEARNED_CUDNN", "1")];
    let run = |server: &EmulatedServer| {
        let (stdout, stderr) = run_learning(server, &exe, &cache, &on);
        (stdout, round_trips(&stderr).unwrap_or(0), stderr)
    };
    let (first, trips, stderr) = run(&server);
    assert_eq!(first.lines().count(), 3, "{stderr}");
    // The first build waits for its finalize and each of its eight questions and fills but
    // one (the configuration's engine filled again: answered as the first fill was); the
    // next two builds are the first's graph, answered without waiting (12 without it).
    assert_eq!(trips, 9, "{stderr}");
    let (second, trips, stderr) = run(&server);
    assert_eq!(second, first, "{stderr}");
    assert_eq!(trips, 0, "every build answered as before: {stderr}");
    assert!(!stderr.contains("answered differently"), "{stderr}");

    // A server whose library answers otherwise (same GPU, same versions).
    let other = salted_server();
    let (_, _, stderr) = run(&other);
    // The finalize answers alike; the configuration's workspace size does not.
    assert!(
        stderr.contains(
            "cudnnBackendGetAttribute: the server answered differently (attribute 303 of type 3: other values)"
        ),
        "{stderr}"
    );
    let (_, trips, stderr) = run(&other);
    assert!(trips > 0, "what was learned was dropped: {stderr}");
    assert!(!stderr.contains("answered differently"), "{stderr}");

    // A finalize that failed fails again at once (the emulated library refuses a second
    // finalize), and nothing rides with it.
    // (A cache of its own: the salted server above taught this server identity its answers.)
    let exe = cudnn_program("cudnn-finalize-twice", CUDNN_FINALIZE_TWICE);
    let cache = chidori_tests::scratch("cudnn-finalize-twice-cache");
    let runs: Vec<(String, String)> = (0..2).map(|_| run_learning(&server, &exe, &cache, &on)).collect();
    let trips = |stderr: &str| {
        stderr.lines().find(|l| l.starts_with("TOTAL")).map(|l| l.split_whitespace().nth(2).unwrap_or("?").to_owned())
    };
    assert_eq!(runs[0].0, "0 2000\n", "{}", runs[0].1);
    assert_eq!(runs[1].0, runs[0].0, "{}", runs[1].1);
    assert_eq!(trips(&runs[0].1).as_deref(), Some("2"), "{}", runs[0].1);
    assert_eq!(trips(&runs[1].1).as_deref(), Some("0"), "{}", runs[1].1);
}

/// A relay to `target` that holds every chunk `delay` before passing it on, each way: a
/// WAN's round trip on loopback. Its address.
fn delaying_relay(target: &str, delay: Duration) -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let target = target.to_owned();
    std::thread::spawn(move || {
        for client in listener.incoming().flatten() {
            let Ok(server) = TcpStream::connect(&target) else { continue };
            for (mut from, mut to) in [(client.try_clone().unwrap(), server.try_clone().unwrap()), (server, client)] {
                std::thread::spawn(move || {
                    use std::io::{Read, Write};
                    let mut buf = vec![0u8; 1 << 16];
                    while let Ok(n @ 1..) = from.read(&mut buf) {
                        std::thread::sleep(delay);
                        if to.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                    let _ = to.shutdown(std::net::Shutdown::Write);
                });
            }
        }
    });
    address
}

/// Issue 19: where the connection's round trip is a WAN's (2 ms or more), cuDNN finalizes
/// are answered as earlier builds were without being asked to (`CHIDORI_LEARNED_CUDNN`
/// unset); on loopback, only when asked.
#[test]
fn cudnn_finalizes_are_answered_as_before_by_default_on_a_wan() {
    let server = server();
    let relay = delaying_relay(&server.address, Duration::from_millis(3));
    let exe = cudnn_program("cudnn-finalizes-wan", CUDNN_HEURISTICS);
    let cache = chidori_tests::scratch("cudnn-finalizes-wan-cache");
    let _ = std::fs::remove_dir_all(&cache);
    let run = |address: &str, envs: &[(&str, &str)]| {
        let mut cmd = Command::new(chidori());
        cmd.args(["run", "--trace", "-s", address, "--lib-dir"]).arg(chidori_tests::shim_dir()).arg("--").arg(&exe);
        cmd.env("XDG_CACHE_HOME", &cache).env_remove("CHIDORI_LEARNED_CUDNN").envs(envs.iter().copied());
        let out = cmd.output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        (String::from_utf8_lossy(&out.stdout).into_owned(), round_trips(&stderr), stderr)
    };
    // As with `CHIDORI_LEARNED_CUDNN=1` (cudnn_finalizes_learned_answer_later_builds_of_the_same_graph).
    let (first, trips, stderr) = run(&relay, &[]);
    assert_eq!(trips, Some(9), "{stderr}");
    let (second, trips, stderr) = run(&relay, &[]);
    assert_eq!(second, first, "{stderr}");
    assert_eq!(trips, Some(0), "{stderr}");
    // Turned off, the finalizes wait as within one process (12, with the questions learned: 3).
    let (off, trips, stderr) = run(&relay, &[("CHIDORI_LEARNED_CUDNN", "0")]);
    assert_eq!(off, first, "{stderr}");
    assert_eq!(trips, Some(3), "{stderr}");
}

/// Graphs told apart by a value set on their heuristics, each built once, each reading more
/// knob choices than the last: what is made ahead of a finalize changes build by build (as
/// torch's convolutions, whose heuristics offer graph by graph more or fewer configurations).
const CUDNN_DISTINCT_GRAPHS: &str = r#"
#include <stdio.h>
typedef void *desc_t;
int cudnnBackendCreateDescriptor(int type, desc_t *d);
int cudnnBackendDestroyDescriptor(desc_t d);
int cudnnBackendSetAttribute(desc_t d, int name, int type, long long count, const void *elements);
int cudnnBackendFinalize(desc_t d);
int cudnnBackendGetAttribute(desc_t d, int name, int type, long long requested, long long *count, void *elements);
enum { ENGINECFG = 3, ENGINEHEUR = 4, KNOB_CHOICE = 7, DESCRIPTORS = 15, INT64 = 3 };
enum { HEUR_MODE = 200, HEUR_RESULTS = 202, CFG_KNOBS = 302, CFG_WORKSPACE = 303, KNOB_VALUE = 601 };
static int build(long long label, int knobs) {
  desc_t heur = 0, cfg = 0, choices[8] = {0};
  long long n = -1, got = -1, k = -1, ws = 0, kn = -1, kc = -1, kv = 0;
  if (cudnnBackendCreateDescriptor(ENGINEHEUR, &heur)) return 10;
  if (cudnnBackendSetAttribute(heur, HEUR_MODE, INT64, 1, &label)) return 11;
  if (cudnnBackendFinalize(heur)) return 12;
  if (cudnnBackendGetAttribute(heur, HEUR_RESULTS, DESCRIPTORS, 0, &n, 0) || n != 1) return 13;
  if (cudnnBackendCreateDescriptor(ENGINECFG, &cfg)) return 14;
  if (cudnnBackendGetAttribute(heur, HEUR_RESULTS, DESCRIPTORS, 1, &got, &cfg) || got != 1) return 15;
  if (cudnnBackendGetAttribute(cfg, CFG_WORKSPACE, INT64, 1, &k, &ws)) return 16;
  for (int j = 0; j < knobs; j++)
    if (cudnnBackendCreateDescriptor(KNOB_CHOICE, &choices[j])) return 17;
  if (cudnnBackendGetAttribute(cfg, CFG_KNOBS, DESCRIPTORS, knobs, &kn, choices)) return 18;
  if (cudnnBackendGetAttribute(choices[0], KNOB_VALUE, INT64, 1, &kc, &kv)) return 19;
  for (int j = 0; j < knobs; j++)
    if (cudnnBackendDestroyDescriptor(choices[j])) return 20;
  printf("%lld: n=%lld got=%lld k=%lld ws=%llx knobs=%lld %lld %llx\n", label, n, got, k, (unsigned long long)ws, kn,
         kc, (unsigned long long)kv);
  return cudnnBackendDestroyDescriptor(cfg) || cudnnBackendDestroyDescriptor(heur) ? 21 : 0;
}
int main(void) {
  for (int i = 0; i < 3; i++) {
    int rc = build(i, 2 + 2 * i);
    if (rc) return rc;
  }
  return 0;
}
"#;

/// Issue 19 item 1: the second run of a program that builds each of its graphs once waits
/// for none of their finalizes, questions or fills, though what the first run made ahead of
/// each finalize grew from graph to graph (its questions and fills learned on the way).
#[test]
fn a_second_run_builds_graphs_each_built_once_before_without_waiting() {
    let server = server();
    let exe = cudnn_program("cudnn-distinct", CUDNN_DISTINCT_GRAPHS);
    let cache = chidori_tests::scratch("cudnn-distinct-cache");
    let run = || {
        let (stdout, stderr) = run_learning(&server, &exe, &cache, &[("CHIDORI_LEARNED_CUDNN", "1")]);
        (stdout, round_trips(&stderr), stderr)
    };
    let (first, trips, stderr) = run();
    assert_eq!(first.lines().count(), 3, "{stderr}");
    // The first graph: its finalize and each of its five questions and fills; each next one:
    // its finalize, with everything asked of it made ahead.
    assert_eq!(trips, Some(8), "{stderr}");
    let (second, trips, stderr) = run();
    assert_eq!(second, first, "{stderr}");
    assert_eq!(trips, Some(0), "{stderr}");
    assert!(!stderr.contains("answered differently"), "{stderr}");
}

const CUDNN_FINALIZE_TWICE: &str = r#"
#include <stdio.h>
typedef void *desc_t;
int cudnnBackendCreateDescriptor(int type, desc_t *d);
int cudnnBackendFinalize(desc_t d);
int main(void) {
  desc_t heur = 0;
  if (cudnnBackendCreateDescriptor(4, &heur)) return 10;
  int a = cudnnBackendFinalize(heur);
  int b = cudnnBackendFinalize(heur);
  printf("%d %d\n", a, b);
  return 0;
}
"#;

/// torch's `get_parameters` asks each RNN matrix's address 100 times in a row; an LSTM of two
/// layers asks 3,200 times per forward. A repeat with nothing sent in between is answered by
/// the client; anything sent in between sends the next one to the server. The dimensions of
/// the descriptors a forwarded call fills come back in its round trip.
const CUDNN_RNN_WEIGHTS: &str = r#"
#include <stdio.h>
typedef void *h_t;
int cudnnCreate(h_t *h);
int cudnnCreateRNNDescriptor(h_t *d);
int cudnnCreateTensorDescriptor(h_t *d);
int cudnnDestroyTensorDescriptor(h_t d);
int cudnnSetTensorNdDescriptor(h_t d, int dataType, int nbDims, const int *dims, const int *strides);
int cudnnGetRNNWeightParams(h_t handle, h_t rnn, int layer, unsigned long size, const void *space, int lin,
                            h_t mDesc, void **mAddr, h_t bDesc, void **bAddr);
int cudnnGetTensorNdDescriptor(h_t d, int requested, int *dataType, int *nbDims, int *dims, int *strides);
int cudaMalloc(void **p, unsigned long size);
int main(void) {
  h_t handle, rnn;
  /* The weight space must be device memory of the session (the server checks). */
  char *space;
  unsigned long size = 1ul << 20;
  if (cudaMalloc((void **)&space, size)) return 9;
  if (cudnnCreate(&handle) || cudnnCreateRNNDescriptor(&rnn)) return 10;
  int wrong = 0;
  for (int layer = 0; layer < 2; layer++)
    for (int matrix = 1; matrix >= 0; matrix--)
      for (int lin = 0; lin < 8; lin++) {
        h_t mat, unused;
        if (cudnnCreateTensorDescriptor(&mat) || cudnnCreateTensorDescriptor(&unused)) return 11;
        for (int i = 0; i < 100; i++) {
          void *p = 0, *q = 0;
          int s = matrix ? cudnnGetRNNWeightParams(handle, rnn, layer, size, space, lin, mat, &p, unused, &q)
                         : cudnnGetRNNWeightParams(handle, rnn, layer, size, space, lin, unused, &q, mat, &p);
          char *base = space + layer * (8 * 4096 + 8 * 256);
          char *want = matrix ? base + lin * 4096 : base + 8 * 4096 + lin * 256;
          if (s || (char *)p != want) wrong++;
          /* Something sent in between: the next call is the server's again. */
          if (layer == 1 && lin == 7 && matrix == 0 && i == 49) {
            h_t other;
            if (cudnnCreateTensorDescriptor(&other) || cudnnDestroyTensorDescriptor(other)) return 12;
          }
        }
        /* torch then reads the filled descriptor's dimensions (3 of them). */
        int type = -1, nb = -1, dims[3] = {0}, strides[3] = {0};
        if (cudnnGetTensorNdDescriptor(mat, 3, &type, &nb, dims, strides)) return 14;
        int want = matrix ? (dims[1] == 32 && dims[2] == 32 && strides[0] == 1024)
                          : (dims[1] == 64 && dims[2] == 1 && strides[0] == 64);
        if (type != 0 || nb != 3 || dims[0] != 1 || !want) wrong++;
        if (cudnnDestroyTensorDescriptor(mat) || cudnnDestroyTensorDescriptor(unused)) return 13;
      }
  /* A descriptor the program set itself is the server's to describe. */
  h_t own;
  int own_dims[4] = {2, 3, 4, 5}, own_strides[4] = {60, 20, 5, 1}, type = -1, nb = -1, dims[4], strides[4];
  if (cudnnCreateTensorDescriptor(&own) || cudnnSetTensorNdDescriptor(own, 0, 4, own_dims, own_strides)) return 15;
  if (cudnnGetTensorNdDescriptor(own, 4, &type, &nb, dims, strides) || nb != 4 || dims[3] != 5 || strides[0] != 60)
    wrong++;
  printf("wrong=%d\n", wrong);
  return 0;
}
"#;

#[test]
fn rnn_weight_addresses_asked_again_are_answered_by_the_client() {
    let server = server();
    let exe = cudnn_program("cudnn-rnn-weights", CUDNN_RNN_WEIGHTS);
    let (stdout, stderr) = run_traced(&server, &exe);
    assert_eq!(stdout.trim(), "wrong=0", "{stderr}");
    let row = |f: &str| trace_row(&stderr, f);
    // 32 addresses asked 100 times each: the server answers the first of each layer and
    // linear layer (16). A repeat with nothing sent since is the client's; so is the same
    // question with the two descriptors swapped, and the one after the create and destroy
    // sent in between: what the RNN descriptor says has not changed.
    assert_eq!(row("cudnnGetRNNWeightParams"), ["3200", "16"], "{stderr}");
    // The dimensions of each filled descriptor came in the round trip of its fill; the
    // program's own descriptor is described by the server.
    assert_eq!(row("cudnnGetTensorNdDescriptor"), ["33", "1"], "{stderr}");
    // Tensor descriptors are named by the client: creates, sets and destroys wait for nothing.
    assert_eq!(row("cudnnCreateTensorDescriptor"), ["66", "0"], "{stderr}");
    assert_eq!(row("cudnnSetTensorNdDescriptor"), ["1", "0"], "{stderr}");
    assert_eq!(row("cudnnDestroyTensorDescriptor"), ["65", "0"], "{stderr}");
    assert!(!stderr.contains("WARN") && !stderr.contains("ERROR"), "{stderr}");
}

/// torch's `_cudnn_ctc_loss` (targets on the CPU): cuDNN's v7 CTC loss reads host arrays as
/// long as the probabilities' batch and the sum of the label lengths, which no parameter
/// gives. The emulated loss writes each sequence's cost from what its arrays held.
const CUDNN_CTC: &str = r#"
#include <stdio.h>
typedef void *h_t;
int cudnnCreate(h_t *h);
int cudnnCreateTensorDescriptor(h_t *d);
int cudnnSetTensorNdDescriptor(h_t d, int dataType, int nbDims, const int *dims, const int *strides);
int cudnnCreateCTCLossDescriptor(h_t *d);
int cudnnGetCTCLossWorkspaceSize(h_t h, h_t probs, h_t grads, const int *labels, const int *labelLengths,
                                 const int *inputLengths, int algo, h_t ctc, unsigned long *size);
int cudnnCTCLoss(h_t h, h_t probsDesc, const void *probs, const int *labels, const int *labelLengths,
                 const int *inputLengths, void *costs, h_t gradientsDesc, void *gradients, int algo, h_t ctc,
                 void *workspace, unsigned long workspaceSize);
int cudaMalloc(void **p, unsigned long size);
int cudaMemcpy(void *dst, const void *src, unsigned long n, int kind);
int main(void) {
  h_t handle, probs, ctc;
  int dims[3] = {50, 3, 15}, strides[3] = {45, 15, 1};
  if (cudnnCreate(&handle) || cudnnCreateTensorDescriptor(&probs) || cudnnCreateCTCLossDescriptor(&ctc)) return 10;
  if (cudnnSetTensorNdDescriptor(probs, 0, 3, dims, strides)) return 11;
  int lengths[3] = {30, 25, 20}, inputs[3] = {50, 50, 50}, labels[75];
  for (int i = 0; i < 75; i++) labels[i] = 1 + i % 14;
  unsigned long size = 0;
  int s = cudnnGetCTCLossWorkspaceSize(handle, probs, probs, labels, lengths, inputs, 0, ctc, &size);
  void *d_probs, *d_costs, *d_grads, *ws;
  if (cudaMalloc(&d_probs, 50 * 45 * 4) || cudaMalloc(&d_costs, 12) || cudaMalloc(&d_grads, 50 * 45 * 4) ||
      cudaMalloc(&ws, size))
    return 12;
  int l = cudnnCTCLoss(handle, probs, d_probs, labels, lengths, inputs, d_costs, probs, d_grads, 0, ctc, ws, size);
  float costs[3] = {0};
  if (cudaMemcpy(costs, d_costs, 12, 2)) return 13;
  printf("size=%d:%lu loss=%d costs=%.0f,%.0f,%.0f\n", s, size, l, costs[0], costs[1], costs[2]);
  /* The descriptor set again, to a batch of two. */
  dims[1] = 2;
  strides[0] = 30;
  if (cudnnSetTensorNdDescriptor(probs, 0, 3, dims, strides)) return 14;
  unsigned long two = 0;
  int t = cudnnGetCTCLossWorkspaceSize(handle, probs, probs, labels, lengths, inputs, 0, ctc, &two);
  printf("two=%d:%lu\n", t, two);
  /* A negative label length, and no label lengths: the library's bad parameter. */
  lengths[1] = -1;
  int negative = cudnnGetCTCLossWorkspaceSize(handle, probs, probs, labels, lengths, inputs, 0, ctc, &size);
  int none = cudnnCTCLoss(handle, probs, d_probs, labels, 0, inputs, d_costs, probs, d_grads, 0, ctc, ws, size);
  printf("negative=%d none=%d\n", negative, none);
  return 0;
}
"#;

#[test]
fn the_v7_ctc_loss_sends_its_host_arrays_whole() {
    let server = server();
    let exe = cudnn_program("cudnn-ctc", CUDNN_CTC);
    let (stdout, stderr) = run_traced(&server, &exe);
    let labels: Vec<i64> = (0..75).map(|i| 1 + i % 14).collect();
    let cost = |from: usize, n: usize| 1000 * labels[from..from + n].iter().sum::<i64>() + 10 * n as i64 + 50;
    let want = format!(
        "size=0:{} loss=0 costs={},{},{}\ntwo=0:{}\nnegative=2000 none=2000",
        64 * 75 + 256 * 3,
        cost(0, 30),
        cost(30, 25),
        cost(55, 20),
        64 * 55 + 256 * 2
    );
    assert_eq!(stdout.trim(), want, "{stderr}");
    let row = |f: &str| trace_row(&stderr, f);
    // The descriptor's batch is asked once per shape it is set to (twice: the only calls of
    // cudnnGetTensorNdDescriptor the trace shows), the other three calls know it; the loss
    // goes without waiting, the sizes are questions. The two calls the client refused
    // reached no server.
    assert_eq!(row("cudnnGetTensorNdDescriptor"), ["2", "2"], "{stderr}");
    assert_eq!(row("cudnnCTCLoss"), ["1", "0"], "{stderr}");
    assert_eq!(row("cudnnGetCTCLossWorkspaceSize"), ["2", "2"], "{stderr}");
    assert!(!stderr.contains("WARN") && !stderr.contains("ERROR"), "{stderr}");
}

/// torch makes a new RNN descriptor for each forward and backward and asks every matrix and
/// bias of every layer with its shape (the backward after computing the weights' gradients):
/// each pass here does the same, twice with a hidden size of 32, then once with 64.
const CUDNN_RNN_PASSES: &str = r#"
#include <stdio.h>
typedef void *h_t;
int cudnnCreate(h_t *h);
int cudnnCreateRNNDescriptor(h_t *d);
int cudnnDestroyRNNDescriptor(h_t d);
int cudnnCreateDropoutDescriptor(h_t *d);
int cudnnSetDropoutDescriptor(h_t d, h_t handle, float dropout, void *states, unsigned long size,
                              unsigned long long seed);
int cudnnSetRNNDescriptor_v8(h_t d, int algo, int cellMode, int biasMode, int dirMode, int inputMode,
                             int dataType, int mathPrec, int mathType, int inputSize, int hiddenSize,
                             int projSize, int numLayers, h_t dropoutDesc, unsigned auxFlags);
int cudnnCreateTensorDescriptor(h_t *d);
int cudnnDestroyTensorDescriptor(h_t d);
int cudnnGetRNNWeightParams(h_t handle, h_t rnn, int layer, unsigned long size, const void *space, int lin,
                            h_t mDesc, void **mAddr, h_t bDesc, void **bAddr);
int cudnnGetTensorNdDescriptor(h_t d, int requested, int *dataType, int *nbDims, int *dims, int *strides);
int cudnnRNNBackwardWeights_v8(h_t handle, h_t rnn, int addGrad, const int *seqLengths, h_t xDesc, const void *x,
                               h_t hDesc, const void *hx, h_t yDesc, const void *y, unsigned long weightSpaceSize,
                               void *dweightSpace, unsigned long workSpaceSize, void *workSpace,
                               unsigned long reserveSpaceSize, void *reserveSpace);
int cudaMalloc(void **p, unsigned long size);
#define C(x) do { int e = (x); if (e) { printf("FAIL line %d: %s -> %d\n", __LINE__, #x, e); return -1; } } while (0)
static long pass(h_t handle, h_t dropout, int hidden, char *space, unsigned long size) {
  h_t rnn, mat, bias;
  long sum = 0;
  C(cudnnCreateRNNDescriptor(&rnn));
  C(cudnnSetRNNDescriptor_v8(rnn, 0, 2, 3, 0, 0, 0, 0, 0, 16, hidden, hidden, 2, dropout, 0));
  /* As torch's backward: the gradients first, which only read the RNN descriptor. */
  C(cudnnRNNBackwardWeights_v8(handle, rnn, 0, 0, 0, 0, 0, 0, 0, 0, size, space, 0, 0, 0, 0));
  C(cudnnCreateTensorDescriptor(&mat));
  C(cudnnCreateTensorDescriptor(&bias));
  for (int layer = 0; layer < 2; layer++)
    for (int lin = 0; lin < 8; lin++) {
      void *m = 0, *b = 0;
      int type, nb, dims[3], strides[3];
      C(cudnnGetRNNWeightParams(handle, rnn, layer, size, space, lin, mat, &m, bias, &b));
      C(cudnnGetTensorNdDescriptor(mat, 3, &type, &nb, dims, strides));
      sum += ((char *)m - space) * 3 + dims[1] * 7 + strides[0] + nb;
      C(cudnnGetTensorNdDescriptor(bias, 3, &type, &nb, dims, strides));
      sum += ((char *)b - space) * 5 + dims[1] * 11 + strides[0];
    }
  C(cudnnDestroyTensorDescriptor(mat));
  C(cudnnDestroyTensorDescriptor(bias));
  C(cudnnDestroyRNNDescriptor(rnn));
  return sum;
}
int main(void) {
  h_t handle, dropout;
  char *space;
  unsigned long size = 4ul << 20;
  if (cudaMalloc((void **)&space, size)) return 9;
  if (cudnnCreate(&handle) || cudnnCreateDropoutDescriptor(&dropout)) return 10;
  /* No dropout: torch's descriptor, without states. */
  if (cudnnSetDropoutDescriptor(dropout, handle, 0.0f, 0, 0, 0)) return 11;
  long a = pass(handle, dropout, 32, space, size);
  long b = pass(handle, dropout, 32, space, size);
  long c = pass(handle, dropout, 64, space, size);
  printf("%ld %ld %ld\n", a, b, c);
  return 0;
}
"#;

/// Issue 19: an RNN's matrices and biases asked about a new descriptor set like an earlier
/// one are answered by the client (the call still made, its answer checked), in the same
/// process and in a later one; a descriptor set otherwise is asked; a server that answers
/// otherwise ends the session naming the call.
#[test]
fn rnn_weights_of_descriptors_set_alike_are_answered_by_the_client() {
    let server = server();
    let exe = cudnn_program("cudnn-rnn-passes", CUDNN_RNN_PASSES);
    let (stdout, stderr) = run_traced(&server, &exe);
    let sums: Vec<i64> = stdout.split_whitespace().filter_map(|v| v.parse().ok()).collect();
    assert_eq!(sums.len(), 3, "{stdout}{stderr}");
    assert_eq!(sums[0], sums[1], "a descriptor set alike, the same answers: {stdout}");
    assert_ne!(sums[0], sums[2], "another hidden size, other answers: {stdout}");
    let row = |stderr: &str, f: &str| trace_row(stderr, f);
    // The first and the third pass ask the server (16 each, the shapes in the same round
    // trips); the second is answered by the client.
    assert_eq!(row(&stderr, "cudnnGetRNNWeightParams"), ["48", "32"], "{stderr}");
    assert_eq!(row(&stderr, "cudnnGetTensorNdDescriptor"), ["96", "0"], "{stderr}");

    // A later process asks none of them, and the server's answers agree.
    let cache = chidori_tests::scratch("cudnn-rnn-passes-cache");
    let (first, stderr) = run_learning(&server, &exe, &cache, &[]);
    assert_eq!(first, stdout, "{stderr}");
    assert_eq!(row(&stderr, "cudnnGetRNNWeightParams")[1], "32", "{stderr}");
    let (second, stderr) = run_learning(&server, &exe, &cache, &[]);
    assert_eq!(second, stdout, "{stderr}");
    assert_eq!(row(&stderr, "cudnnGetRNNWeightParams")[1], "0", "{stderr}");
    assert_eq!(row(&stderr, "cudnnGetTensorNdDescriptor")[1], "0", "{stderr}");
    assert!(!stderr.contains("answered differently") && !stderr.contains("WARN"), "{stderr}");
    drop(server);

    // A server whose library places the biases otherwise (same GPU, same versions).
    let other = salted_server();
    let (_, stderr) = run_learning(&other, &exe, &cache, &[]);
    assert!(
        stderr.contains("cudnnGetRNNWeightParams: the server answered differently (other addresses)"),
        "a different answer ends the session, naming the call: {stderr}"
    );
}

/// torch creates a cuFFT plan for each new transform shape and makes it, waiting for its
/// work size; here five plans, of three kinds (two shapes, and the first shape with its work
/// area left to the program).
const CUFFT_PLANS: &str = r#"
#include <stdio.h>
typedef int cufftHandle;
int cufftCreate(cufftHandle *plan);
int cufftDestroy(cufftHandle plan);
int cufftSetAutoAllocation(cufftHandle plan, int autoAllocate);
int cufftXtMakePlanMany(cufftHandle plan, int rank, long long *n, long long *inembed, long long istride,
                        long long idist, int inputtype, long long *onembed, long long ostride, long long odist,
                        int outputtype, long long batch, unsigned long *workSize, int executiontype);
int main(void) {
  long long sizes[5] = {64, 128, 64, 64, 64};
  int manual[5] = {0, 0, 0, 1, 1};
  cufftHandle plans[5];
  for (int i = 0; i < 5; i++) {
    unsigned long work = 0;
    if (cufftCreate(&plans[i])) return 10;
    if (manual[i] && cufftSetAutoAllocation(plans[i], 0)) return 11;
    int s = cufftXtMakePlanMany(plans[i], 1, &sizes[i], 0, 1, 0, 4, 0, 1, 0, 4, 3, &work, 4);
    printf("%d:%lu ", s, work);
  }
  /* The server made the third plan too: making it again is refused there. */
  unsigned long work = 0;
  int again = cufftXtMakePlanMany(plans[2], 1, &sizes[2], 0, 1, 0, 4, 0, 1, 0, 4, 3, &work, 4);
  printf("again:%d\n", again != 0);
  for (int i = 0; i < 5; i++)
    if (cufftDestroy(plans[i])) return 12;
  return 0;
}
"#;

/// Issue 19: cuFFT plans are created ahead of the program's creates (in a later process, as
/// many as the earlier one created, at its first create), and a plan made like an earlier
/// one (the same transform, the same settings) is answered by the client (the call still
/// made, its work size checked), in the same process and in a later one.
#[test]
fn cufft_plans_made_as_before_are_answered_by_the_client() {
    let server = server();
    let exe = program_with("cufft-plans", CUFFT_PLANS, &["-l:libcufft.so.12"]);
    let (stdout, stderr) = run_traced(&server, &exe);
    assert_eq!(stdout.trim(), "0:3072 0:6144 0:3072 0:3072 0:3072 again:1", "{stderr}");
    let row = |stderr: &str, f: &str| trace_row(stderr, f);
    // Five creates: the first two asked (the second with one more), the third from those,
    // the fourth with three more, the fifth from those.
    assert_eq!(row(&stderr, "cufftCreate"), ["5", "3"], "{stderr}");
    // Three kinds of plan asked; the third plan's make and the second make of it (refused
    // by the server, which made it) are what the client knew and what it did not.
    assert_eq!(row(&stderr, "cufftXtMakePlanMany"), ["6", "4"], "{stderr}");

    // A later process makes none of them waiting, and the server's answers agree.
    let cache = chidori_tests::scratch("cufft-plans-cache");
    let (first, stderr) = run_learning(&server, &exe, &cache, &[]);
    assert_eq!(first, stdout, "{stderr}");
    assert_eq!(row(&stderr, "cufftCreate"), ["5", "3"], "{stderr}");
    let (second, stderr) = run_learning(&server, &exe, &cache, &[]);
    assert_eq!(second, stdout, "{stderr}");
    assert_eq!(row(&stderr, "cufftXtMakePlanMany"), ["6", "1"], "{stderr}");
    // The first create makes as many as the last run created: one wait for five.
    assert_eq!(row(&stderr, "cufftCreate"), ["5", "1"], "{stderr}");
    assert!(!stderr.contains("answered differently") && !stderr.contains("WARN"), "{stderr}");
    drop(server);

    // A server whose library needs another work size (same GPU, same versions).
    let other = salted_server();
    let (_, stderr) = run_learning(&other, &exe, &cache, &[]);
    assert!(
        stderr.contains("cufftXtMakePlanMany: the server answered differently (another work size)"),
        "a different answer ends the session, naming the call: {stderr}"
    );
}

/// A fill made ahead answers only the same call into fresh descriptors: a configuration the
/// program already set an attribute of is filled by the server, as natively.
const CUDNN_TWIN_FRESH: &str = r#"
#include <stdio.h>
typedef void *desc_t;
int cudnnBackendCreateDescriptor(int type, desc_t *d);
int cudnnBackendDestroyDescriptor(desc_t d);
int cudnnBackendFinalize(desc_t d);
int cudnnBackendSetAttribute(desc_t d, int name, int type, long long count, const void *elements);
int cudnnBackendGetAttribute(desc_t d, int name, int type, long long requested, long long *count, void *elements);
enum { ENGINECFG = 3, ENGINEHEUR = 4, DESCRIPTORS = 15, INT64 = 3, HEUR_RESULTS = 202, CFG_WORKSPACE = 303 };
static int build(int label, int touch) {
  desc_t heur = 0, cfg = 0;
  long long n = -1, got = -1, k = -1, ws = 0, one = 1;
  if (cudnnBackendCreateDescriptor(ENGINEHEUR, &heur) || cudnnBackendFinalize(heur)) return 10;
  if (cudnnBackendGetAttribute(heur, HEUR_RESULTS, DESCRIPTORS, 0, &n, 0) || n != 1) return 11;
  if (cudnnBackendCreateDescriptor(ENGINECFG, &cfg)) return 12;
  if (touch && cudnnBackendSetAttribute(cfg, CFG_WORKSPACE, INT64, 1, &one)) return 13;
  int a = cudnnBackendGetAttribute(heur, HEUR_RESULTS, DESCRIPTORS, 1, &got, &cfg);
  int b = cudnnBackendGetAttribute(cfg, CFG_WORKSPACE, INT64, 1, &k, &ws);
  printf("%d: %d %d got=%lld k=%lld ws=%llx\n", label, a, b, got, k, (unsigned long long)ws);
  return cudnnBackendDestroyDescriptor(cfg) || cudnnBackendDestroyDescriptor(heur) ? 14 : 0;
}
int main(void) {
  for (int i = 0; i < 3; i++) {
    int rc = build(i, i == 1);
    if (rc) return rc;
  }
  return 0;
}
"#;

#[test]
fn cudnn_fills_made_ahead_answer_only_fresh_descriptors() {
    let server = server();
    let exe = cudnn_program("cudnn-twin-fresh", CUDNN_TWIN_FRESH);
    let (stdout, stderr) = run_traced(&server, &exe);
    let expected: Vec<String> = (0..3).map(|i| format!("{i}: 0 0 got=1 k=1 ws=1111111111111111")).collect();
    assert_eq!(stdout.lines().collect::<Vec<_>>(), expected, "{stderr}");
    // Build 0 learns (finalize, count, fill, workspace: 4); build 1 sets the configuration
    // first, so its fill goes to the server (finalize with what is made ahead, the fill with
    // the workspace question: 2); build 2 is answered from the finalize's round trip (1).
    let total = stderr.lines().find(|l| l.starts_with("TOTAL")).unwrap_or_else(|| panic!("{stderr}"));
    assert_eq!(total.split_whitespace().nth(2), Some("7"), "{stderr}");
    assert!(!stderr.contains("WARN") && !stderr.contains("ERROR"), "{stderr}");
}

/// NVRTC programs live on the client: only the compile reaches the server (the emulated
/// backend has no NVRTC, and says so in the program's log).
const NVRTC: &str = r##"
#include <stdio.h>
#include <string.h>
typedef void *prog_t;
int nvrtcCreateProgram(prog_t *p, const char *src, const char *name, int n, const char *const *h, const char *const *i);
int nvrtcAddNameExpression(prog_t p, const char *e);
int nvrtcCompileProgram(prog_t p, int n, const char *const *o);
int nvrtcGetProgramLogSize(prog_t p, size_t *n);
int nvrtcGetProgramLog(prog_t p, char *log);
int nvrtcGetPTXSize(prog_t p, size_t *n);
int nvrtcDestroyProgram(prog_t *p);
int main(void) {
  prog_t p = 0;
  const char *hdr = "#define N 4\n", *inc = "n.h", *opt = "--gpu-architecture=sm_90";
  int a = nvrtcCreateProgram(&p, "#include \"n.h\"\n__global__ void k(float *x) { x[N] = 1; }", "k.cu", 1, &hdr, &inc);
  int b = nvrtcAddNameExpression(p, "k");
  int c = nvrtcCompileProgram(p, 1, &opt);
  size_t n = 0, ptx = 0;
  int d = nvrtcGetProgramLogSize(p, &n);
  char log[512] = {0};
  int e = n <= sizeof log ? nvrtcGetProgramLog(p, log) : -1;
  int f = nvrtcGetPTXSize(p, &ptx);
  int g = nvrtcDestroyProgram(&p);
  printf("%d %d %d %d %d %d %d %s|%s\n", a, b, c, d, e, f, g, p ? "live" : "gone", log);
  return 0;
}
"##;

#[test]
fn nvrtc_programs_stay_on_the_client_and_compile_on_the_server() {
    let server = server();
    let dir = chidori_tests::scratch("nvrtc");
    let src = dir.join("nvrtc.c");
    std::fs::write(&src, NVRTC).unwrap();
    let exe = dir.join("nvrtc");
    chidori_tests::cc(&src, &exe, &[&format!("-L{}", chidori_tests::shim_dir().display()), "-l:libnvrtc.so.13"]);
    let mut cmd = Command::new(chidori());
    cmd.args(["run", "--trace", "-s", &server.address, "--lib-dir"]).arg(chidori_tests::shim_dir()).arg("--").arg(&exe);
    let out = cmd.output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    // NVRTC_ERROR_INTERNAL_ERROR from the compile; the log says why; no PTX after a failed
    // compile (NVRTC_ERROR_INVALID_PROGRAM); the handle is cleared.
    assert_eq!(
        stdout.trim(),
        "0 0 11 0 0 4 0 gone|the server cannot compile: the emulated backend has no NVRTC",
        "{stderr}"
    );
    let total = stderr.lines().find(|l| l.starts_with("TOTAL")).unwrap_or_else(|| panic!("{stderr}"));
    assert_eq!(total.split_whitespace().nth(2), Some("1"), "one round trip, the compile: {total}");
}

/// nvJitLink links live on the client: only the completion reaches the server. The program
/// calls both the unversioned exports (what cuda-python `dlsym`s) and a versioned one (what
/// the header's macros name); a file input is read on the client.
const NVJITLINK: &str = r##"
#include <stdio.h>
#include <string.h>
typedef void *link_t;
int nvJitLinkCreate(link_t *h, unsigned n, const char **options);
int __nvJitLinkCreate_13_0(link_t *h, unsigned n, const char **options);
int nvJitLinkAddData(link_t h, int type, const void *data, size_t size, const char *name);
int nvJitLinkAddFile(link_t h, int type, const char *path);
int nvJitLinkComplete(link_t h);
int nvJitLinkGetLinkedCubinSize(link_t h, size_t *n);
int nvJitLinkGetLinkedCubin(link_t h, void *cubin);
int nvJitLinkGetLinkedPtxSize(link_t h, size_t *n);
int nvJitLinkGetInfoLogSize(link_t h, size_t *n);
int nvJitLinkGetInfoLog(link_t h, char *log);
int nvJitLinkGetErrorLogSize(link_t h, size_t *n);
int nvJitLinkGetErrorLog(link_t h, char *log);
int nvJitLinkDestroy(link_t *h);
int main(int argc, char **argv) {
  link_t h = 0, bad = 0;
  const char *arch[] = {"-arch=sm_90"}, *none[] = {"-lto"}, *bogus[] = {"-arch=sm_90", "-bogus"};
  int a = nvJitLinkCreate(&h, 1, arch);
  int b = nvJitLinkAddData(h, 2, "abc", 3, "k.ptx");
  int c = nvJitLinkAddFile(h, 10, argv[1]);
  int d = nvJitLinkComplete(h);
  size_t n = 0, ptx = 0, info = 0;
  char cubin[64] = {0}, log[256] = {0};
  int e = nvJitLinkGetLinkedCubinSize(h, &n);
  int f = n <= sizeof cubin ? nvJitLinkGetLinkedCubin(h, cubin) : -1;
  int g = nvJitLinkGetLinkedPtxSize(h, &ptx);
  int i = nvJitLinkGetInfoLogSize(h, &info);
  if (info <= sizeof log) nvJitLinkGetInfoLog(h, log);
  size_t empty = 99;
  nvJitLinkGetErrorLogSize(h, &empty);
  int j = nvJitLinkDestroy(&h);
  int k = nvJitLinkDestroy(&h);
  printf("%d %d %d %d %d %d %zu %.3s%.6s %d %d %d %s %s|%s|%zu\n", a, b, c, d, e, f, n, cubin + 1, cubin + 4, g, i,
         j, h ? "live" : "gone", k ? "again refused" : "again accepted", log, empty);
  int m = __nvJitLinkCreate_13_0(&bad, 1, none);
  int o = __nvJitLinkCreate_13_0(&bad, 2, bogus);
  int p = nvJitLinkComplete(bad);
  size_t en = 0;
  char err[256] = {0};
  nvJitLinkGetErrorLogSize(bad, &en);
  if (en <= sizeof err) nvJitLinkGetErrorLog(bad, err);
  printf("%d %d %d %s\n", m, o, p, err);
  return 0;
}
"##;

#[test]
fn nvjitlink_links_stay_on_the_client_and_complete_on_the_server() {
    let server = server();
    let dir = chidori_tests::scratch("nvjitlink");
    let src = dir.join("nvjitlink.c");
    std::fs::write(&src, NVJITLINK).unwrap();
    let input = dir.join("lib.cubin");
    std::fs::write(&input, "xyz").unwrap();
    let exe = dir.join("nvjitlink");
    chidori_tests::cc(&src, &exe, &[&format!("-L{}", chidori_tests::shim_dir().display()), "-l:libnvJitLink.so.13"]);
    let mut cmd = Command::new(chidori());
    cmd.args(["run", "--trace", "-s", &server.address, "--lib-dir"]).arg(chidori_tests::shim_dir()).arg("--");
    let out = cmd.arg(&exe).arg(&input).output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let lines: Vec<&str> = stdout.lines().collect();
    // The emulated linker's image is an ELF magic and the inputs in order (the PTX's bytes,
    // then the file's); no PTX without -ptx (NVJITLINK_ERROR_INVALID_INPUT); an empty error
    // log has size 0 (NVIDIA's jitLto prints a log whose size is not); the handle is cleared
    // and a second destroy refused.
    assert_eq!(
        lines.first().copied(),
        Some("0 0 0 0 0 0 10 ELFabcxyz 3 0 0 gone again refused|emulated link: 2 inputs for sm_90|0"),
        "{stderr}"
    );
    // No -arch: NVJITLINK_ERROR_MISSING_ARCH at once; an unknown option: the linker's
    // NVJITLINK_ERROR_UNRECOGNIZED_OPTION at completion, with its log.
    assert_eq!(lines.get(1).copied(), Some("2 0 1 ERROR: unrecognized option -bogus"), "{stderr}");
    let total = stderr.lines().find(|l| l.starts_with("TOTAL")).unwrap_or_else(|| panic!("{stderr}"));
    assert_eq!(total.split_whitespace().nth(2), Some("2"), "two round trips, the completions: {total}");
}

/// A C program whose waits come from two functions of its own, one static. (Work goes
/// before each synchronize: one with nothing sent since the last is answered locally.)
const WAIT_SITES: &str = r#"
#include <stdio.h>
#include <cuda_runtime_api.h>
static int *dev = 0;
static __attribute__((noinline)) int wait_for_gpu(void) {
  cudaMemsetAsync(dev, 0, sizeof *dev, 0);
  return (int)cudaDeviceSynchronize();
}
__attribute__((noinline)) int read_back(const int *dev) {
  int x = -1;
  if (cudaMemcpy(&x, dev, sizeof x, cudaMemcpyDeviceToHost) != cudaSuccess) return -2;
  return x;
}
int main(void) {
  if (cudaMalloc((void **)&dev, sizeof *dev) != cudaSuccess || cudaMemset(dev, 0, sizeof *dev) != cudaSuccess) return 2;
  for (int i = 0; i < 3; i++)
    if (wait_for_gpu() != 0) return 3;
  if (read_back(dev) != 0) return 4;
  printf("OK\n");
  return 0;
}
"#;

/// The rows of the trace's "by where" table: (round trips, the rest of the line).
fn site_rows(stderr: &str) -> Vec<(u64, String)> {
    stderr
        .lines()
        .skip_while(|l| !l.starts_with("chidori trace: waited round trips by where"))
        .skip(2)
        .filter_map(|l| {
            let mut parts = l.split_whitespace();
            let trips = parts.next()?.parse().ok()?;
            Some((trips, l.to_owned()))
        })
        .collect()
}

#[test]
fn the_trace_names_the_native_functions_that_waited() {
    let server = server();
    let exe = program("wait-sites", WAIT_SITES);
    let (stdout, stderr) = run_traced(&server, &exe);
    assert!(stdout.contains("OK"), "{stdout}\n{stderr}");
    let rows = site_rows(&stderr);
    let sync = rows.iter().find(|(_, l)| l.contains("in wait_for_gpu+0x")).unwrap_or_else(|| panic!("{stderr}"));
    assert_eq!(sync.0, 3, "{stderr}");
    assert!(sync.1.contains("wait-sites") && sync.1.contains("[cudaDeviceSynchronize]"), "{stderr}");
    let copy = rows.iter().find(|(_, l)| l.contains("in read_back+0x")).unwrap_or_else(|| panic!("{stderr}"));
    assert!(copy.0 >= 1 && copy.1.contains("[cudaMemcpy"), "{stderr}");
}

/// A Python program waiting through ctypes, which releases the interpreter around the call
/// (as torch does around every operator): the wait is placed at the script's line.
const PYTHON_WAITS: &str = r#"import ctypes
rt = ctypes.CDLL("libcudart.so.13")
rt.cudaMemsetAsync.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t, ctypes.c_void_p]
p = ctypes.c_void_p()
assert rt.cudaMalloc(ctypes.byref(p), 4) == 0


def wait_for_gpu():
    rt.cudaMemsetAsync(p, 0, 4, None)
    return rt.cudaDeviceSynchronize()


def held():
    rt.cudaMemsetAsync(p, 0, 4, None)
    return ctypes.PyDLL("libcudart.so.13").cudaDeviceSynchronize()


for _ in range(4):
    assert wait_for_gpu() == 0
assert held() == 0
import chidori
sites = {s["where"].rsplit("/", 1)[-1]: s for s in chidori.waits()}
assert sites["waits.py:10"]["round_trips"] == 4 and sites["waits.py:15"]["in"] == "held", sites
print("OK")
"#;

#[test]
fn the_trace_names_the_python_lines_that_waited() {
    let server = server();
    let dir = chidori_tests::scratch("python-waits");
    let script = dir.join("waits.py");
    std::fs::write(&script, PYTHON_WAITS).unwrap();
    let out = Command::new(chidori())
        .args(["run", "--trace", "-s", &server.address, "--lib-dir"])
        .arg(package_beside_shims())
        .args(["--", "python3"])
        .arg(&script)
        .output()
        .unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && stdout.contains("OK"), "{stdout}\n{stderr}");
    let rows = site_rows(&stderr);
    // Released interpreter: placed through the frames the hook follows.
    let released =
        rows.iter().find(|(_, l)| l.contains("waits.py:10 in wait_for_gpu")).unwrap_or_else(|| panic!("{stderr}"));
    assert_eq!(released.0, 4, "{stderr}");
    assert!(released.1.contains("[cudaDeviceSynchronize]  `return rt.cudaDeviceSynchronize()`"), "{stderr}");
    // Interpreter held: placed at once.
    let held = rows.iter().find(|(_, l)| l.contains("waits.py:15 in held")).unwrap_or_else(|| panic!("{stderr}"));
    assert_eq!(held.0, 1, "{stderr}");
}

/// Checks shared by the API programs below: a failing call names itself and exits non-zero.
/// Build `source` (after [`CHECKS`]) as `name`, linked with `libs`, run it through a fresh
/// emulated server, and expect it to succeed printing exactly "OK".
fn prints_ok(name: &str, source: &str, libs: &[&str]) {
    let server = server();
    let exe = program_with(name, &format!("{CHECKS}{source}"), libs);
    let out = run_cmd(&server.address, &exe).output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && stdout.trim() == "OK", "{stdout}\n{stderr}");
}

const CHECKS: &str = r#"
#include <stdio.h>
#include <string.h>
#define CHECK(x) do { int e_ = (int)(x); if (e_ != 0) { printf("FAIL line %d: %s -> %d\n", __LINE__, #x, e_); return 1; } } while (0)
#define EXPECT(c) do { if (!(c)) { printf("FAIL line %d: %s\n", __LINE__, #c); return 1; } } while (0)
"#;

/// Arrays, 3D memory, texture objects, memory pools, stream attributes, peer and batch
/// copies on the emulated backend: records that hold handles are checked by the worker,
/// allocations enter the interval map, host sides of 3D copies move through staging
/// buffers, and what the client answers costs no round trip.
const RUNTIME_MEMORY: &str = r#"
#include <cuda_runtime_api.h>
/* cuda_profiler_api.h is not in the runtime wheels. */
extern cudaError_t cudaProfilerStart(void);
extern cudaError_t cudaProfilerStop(void);
int main(void) {
  struct cudaChannelFormatDesc f32 = cudaCreateChannelDesc(32, 0, 0, 0, cudaChannelFormatKindFloat);
  EXPECT(f32.x == 32 && f32.y == 0 && f32.f == cudaChannelFormatKindFloat);
  CHECK(cudaProfilerStart());
  CHECK(cudaProfilerStop());

  /* A 2D array: rows in and out, part of a row by offsets, and device memory. */
  cudaArray_t arr;
  CHECK(cudaMallocArray(&arr, &f32, 16, 8, 0));
  float host[8][16], back[8][16], part[4];
  for (int i = 0; i < 8; ++i) for (int j = 0; j < 16; ++j) host[i][j] = (float)(i * 16 + j);
  CHECK(cudaMemcpy2DToArray(arr, 0, 0, host, sizeof host[0], 16 * 4, 8, cudaMemcpyHostToDevice));
  memset(back, 0, sizeof back);
  CHECK(cudaMemcpy2DFromArray(back, sizeof back[0], arr, 0, 0, 16 * 4, 8, cudaMemcpyDeviceToHost));
  EXPECT(memcmp(host, back, sizeof host) == 0);
  CHECK(cudaMemcpy2DFromArray(part, 16, arr, 3 * 4, 2, 16, 1, cudaMemcpyDeviceToHost));
  EXPECT(part[0] == 2 * 16 + 3 && part[3] == 2 * 16 + 6);
  struct cudaChannelFormatDesc got; struct cudaExtent ext; unsigned flags = 7;
  CHECK(cudaArrayGetInfo(&got, &ext, &flags, arr));
  EXPECT(got.x == 32 && ext.width == 16 && ext.height == 8 && flags == 0);
  float *dev;
  CHECK(cudaMalloc((void **)&dev, sizeof host));
  CHECK(cudaMemcpy2DFromArray(dev, 64, arr, 0, 0, 64, 8, cudaMemcpyDeviceToDevice));
  memset(back, 0, sizeof back);
  CHECK(cudaMemcpy(back, dev, sizeof host, cudaMemcpyDefault));
  EXPECT(memcmp(host, back, sizeof host) == 0);
  CHECK(cudaMemcpyToArray(arr, 0, 1, part, sizeof part, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpyFromArray(back, arr, 0, 1, sizeof part, cudaMemcpyDeviceToHost));
  EXPECT(back[0][0] == part[0] && back[0][3] == part[3]);
  /* The stream-ordered forms, on the thread's default stream. */
  float row[16];
  for (int j = 0; j < 16; ++j) row[j] = -1.0f - j;
  CHECK(cudaMemcpy2DToArrayAsync(arr, 0, 5, row, sizeof row, sizeof row, 1, cudaMemcpyHostToDevice, 0));
  CHECK(cudaMemcpyFromArrayAsync(part, arr, 4 * 4, 5, sizeof part, cudaMemcpyDeviceToHost, 0));
  memset(back, 0, sizeof back);
  CHECK(cudaMemcpy2DFromArrayAsync(back, sizeof back[0], arr, 0, 0, 16 * 4, 8, cudaMemcpyDeviceToHost, 0));
  CHECK(cudaMemcpyToArrayAsync(arr, 0, 7, row, 8, cudaMemcpyHostToDevice, 0));
  CHECK(cudaStreamSynchronize(0));
  EXPECT(part[0] == -5.0f && part[3] == -8.0f && back[5][15] == -16.0f && back[6][0] == 6 * 16);

  /* A texture object over the array: the worker checks the array handle inside the
     resource descriptor, which comes back as it went. */
  struct cudaResourceDesc res, res2;
  memset(&res, 0, sizeof res);
  res.resType = cudaResourceTypeArray;
  res.res.array.array = arr;
  struct cudaTextureDesc tex;
  memset(&tex, 0, sizeof tex);
  tex.filterMode = cudaFilterModePoint;
  cudaTextureObject_t t;
  CHECK(cudaCreateTextureObject(&t, &res, &tex, NULL));
  CHECK(cudaGetTextureObjectResourceDesc(&res2, t));
  EXPECT(res2.resType == cudaResourceTypeArray && res2.res.array.array == arr);
  CHECK(cudaDestroyTextureObject(t));
  res.res.array.array = (cudaArray_t)0x1234;
  EXPECT(cudaCreateTextureObject(&t, &res, &tex, NULL) == cudaErrorInvalidResourceHandle);
  cudaGetLastError();
  /* Linear memory needs no handle. */
  memset(&res, 0, sizeof res);
  res.resType = cudaResourceTypeLinear;
  res.res.linear.devPtr = dev;
  res.res.linear.desc = f32;
  res.res.linear.sizeInBytes = sizeof host;
  CHECK(cudaCreateTextureObject(&t, &res, &tex, NULL));
  CHECK(cudaDestroyTextureObject(t));

  /* 3D memory: a pitched allocation (in the interval map), a memset, and boxes between
     host memory and the allocation through staging buffers. */
  struct cudaExtent e3 = {10, 4, 3};
  struct cudaPitchedPtr pp;
  CHECK(cudaMalloc3D(&pp, e3));
  EXPECT(pp.pitch >= 10 && pp.xsize == 10 && pp.ysize == 4);
  struct cudaPointerAttributes pa;
  CHECK(cudaPointerGetAttributes(&pa, (char *)pp.ptr + pp.pitch));
  EXPECT(pa.type == cudaMemoryTypeDevice);
  CHECK(cudaMemset3D(pp, 7, e3));
  unsigned char box[3][4][10], box2[3][4][10];
  struct cudaMemcpy3DParms p;
  memset(&p, 0, sizeof p);
  p.srcPtr = pp;
  p.dstPtr.ptr = box; p.dstPtr.pitch = 10; p.dstPtr.xsize = 10; p.dstPtr.ysize = 4;
  p.extent = e3;
  p.kind = cudaMemcpyDeviceToHost;
  CHECK(cudaMemcpy3D(&p));
  for (int i = 0; i < 120; ++i) EXPECT(((unsigned char *)box)[i] == 7);
  for (int i = 0; i < 120; ++i) ((unsigned char *)box)[i] = (unsigned char)i;
  /* Host (1..6, 1..3, 0..2) -> device at (2, 0, 1), extent 5 x 2 x 2. */
  memset(&p, 0, sizeof p);
  p.srcPtr.ptr = box; p.srcPtr.pitch = 10; p.srcPtr.xsize = 10; p.srcPtr.ysize = 4;
  p.srcPos.x = 1; p.srcPos.y = 1;
  p.dstPtr = pp;
  p.dstPos.x = 2; p.dstPos.z = 1;
  p.extent.width = 5; p.extent.height = 2; p.extent.depth = 2;
  p.kind = cudaMemcpyDefault;
  CHECK(cudaMemcpy3D(&p));
  memset(&p, 0, sizeof p);
  p.srcPtr = pp;
  p.dstPtr.ptr = box2; p.dstPtr.pitch = 10; p.dstPtr.xsize = 10; p.dstPtr.ysize = 4;
  p.extent = e3;
  p.kind = cudaMemcpyDefault;
  CHECK(cudaMemcpy3D(&p));
  for (int z = 0; z < 3; ++z) for (int y = 0; y < 4; ++y) for (int x = 0; x < 10; ++x) {
    int inside = z >= 1 && y < 2 && x >= 2 && x < 7;
    unsigned char want = inside ? box[z - 1][y + 1][x - 1] : 7;
    EXPECT(box2[z][y][x] == want);
  }

  /* A 3D array: device memory in (checked array handle), host memory out (staging, with
     the array's element size asked of the server). */
  struct cudaChannelFormatDesc u8 = cudaCreateChannelDesc(8, 0, 0, 0, cudaChannelFormatKindUnsigned);
  cudaArray_t a3;
  struct cudaExtent ae = {10, 4, 3};
  CHECK(cudaMalloc3DArray(&a3, &u8, ae, 0));
  memset(&p, 0, sizeof p);
  p.srcPtr = pp; p.dstArray = a3; p.extent = ae; p.kind = cudaMemcpyDeviceToDevice;
  CHECK(cudaMemcpy3D(&p));
  memset(box, 0, sizeof box);
  memset(&p, 0, sizeof p);
  p.srcArray = a3;
  p.dstPtr.ptr = box; p.dstPtr.pitch = 10; p.dstPtr.xsize = 10; p.dstPtr.ysize = 4;
  p.extent = ae; p.kind = cudaMemcpyDeviceToHost;
  CHECK(cudaMemcpy3D(&p));
  EXPECT(memcmp(box, box2, sizeof box) == 0);
  CHECK(cudaFreeArray(a3));

  /* Memory pools: allocations enter the interval map; attributes; a pool with shareable
     handles (CUDA IPC) is refused by the worker. */
  cudaMemPool_t pool;
  struct cudaMemPoolProps props;
  memset(&props, 0, sizeof props);
  props.allocType = cudaMemAllocationTypePinned;
  props.location.type = cudaMemLocationTypeDevice;
  CHECK(cudaMemPoolCreate(&pool, &props));
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  void *pm;
  CHECK(cudaMallocFromPoolAsync(&pm, 1000, pool, s));
  CHECK(cudaPointerGetAttributes(&pa, (char *)pm + 999));
  EXPECT(pa.type == cudaMemoryTypeDevice);
  unsigned long long used = 0, threshold = 1 << 20, read = 0;
  CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &used));
  EXPECT(used == 1000);
  CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
  CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &read));
  EXPECT(read == threshold);
  CHECK(cudaMemcpyAsync(pm, host, 256, cudaMemcpyDefault, s));
  memset(back, 0, sizeof back);
  CHECK(cudaMemcpyAsync(back, pm, 256, cudaMemcpyDefault, s));
  CHECK(cudaStreamSynchronize(s));
  EXPECT(memcmp(host, back, 256) == 0);
  CHECK(cudaFreeAsync(pm, s));
  CHECK(cudaStreamSynchronize(s));
  CHECK(cudaMemPoolTrimTo(pool, 0));
  CHECK(cudaMemPoolDestroy(pool));
  /* A pool that may be exported is made (exporting it is refused); Windows' handles are not. */
  props.handleTypes = cudaMemHandleTypePosixFileDescriptor;
  CHECK(cudaMemPoolCreate(&pool, &props));
  CHECK(cudaMemPoolDestroy(pool));
  props.handleTypes = cudaMemHandleTypeWin32;
  EXPECT(cudaMemPoolCreate(&pool, &props) == cudaErrorInvalidValue);
  cudaGetLastError();

  /* Stream attributes: a priority goes and comes back; an attribute whose value holds an
     event is refused by the worker, set or got (a get would bring the worker's event). */
  cudaLaunchAttributeValue v, w;
  memset(&v, 0, sizeof v);
  v.priority = -1;
  CHECK(cudaStreamSetAttribute(s, cudaLaunchAttributePriority, &v));
  CHECK(cudaStreamGetAttribute(s, cudaLaunchAttributePriority, &w));
  EXPECT(w.priority == -1);
  EXPECT(cudaStreamSetAttribute(s, cudaLaunchAttributeProgrammaticEvent, &v) == cudaErrorInvalidValue);
  cudaGetLastError();
  EXPECT(cudaStreamGetAttribute(s, cudaLaunchAttributeLaunchCompletionEvent, &w) == cudaErrorInvalidValue);
  cudaGetLastError();

  /* A peer copy inside the one device, and a batch of copies in stream order. */
  float *dev2;
  CHECK(cudaMalloc((void **)&dev2, sizeof host));
  CHECK(cudaMemcpyPeer(dev2, 0, dev, 0, sizeof host));
  void *dsts[2] = {dev, back};
  const void *srcs[2] = {part, dev2};
  size_t sizes[2] = {sizeof part, sizeof host};
  struct cudaMemcpyAttributes attrs;
  memset(&attrs, 0, sizeof attrs);
  attrs.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
  size_t idx = 0;
  memset(back, 0, sizeof back);
  CHECK(cudaMemcpyBatchAsync(dsts, srcs, sizes, 2, &attrs, &idx, 1, s));
  CHECK(cudaStreamSynchronize(s));
  EXPECT(memcmp(host, back, sizeof host) == 0);
  CHECK(cudaMemcpy(back, dev, sizeof part, cudaMemcpyDeviceToHost));
  EXPECT(memcmp(back, part, sizeof part) == 0);
  printf("OK\n");
  return 0;
}
"#;

#[test]
fn arrays_textures_pools_and_3d_copies_reach_the_emulated_gpu() {
    let server = server();
    let exe = program("runtime-memory", &format!("{CHECKS}{RUNTIME_MEMORY}"));
    let (stdout, stderr) = run_traced(&server, &exe);
    assert!(stdout.contains("OK"), "{stdout}\n{stderr}");
    // Answered by the client: no round trip.
    for local in ["cudaCreateChannelDesc", "cudaProfilerStart", "cudaProfilerStop", "cudaPointerGetAttributes"] {
        assert_eq!(trace_row(&stderr, local)[1], "0", "{local}: {stderr}");
    }
}

/// Graphs built call by call on the emulated backend: memset, 1D and 3D memcpy, empty, child
/// graph and host nodes with dependencies; node arrays (every node the worker names becomes
/// a handle of the session); replays, per-instance parameters, exec update; capture into an
/// existing graph with its frontier.
const RUNTIME_GRAPHS: &str = r#"
#include <cuda_runtime_api.h>
static volatile int replays = 0;
static void count_replay(void *user) { (void)user; ++replays; }
int main(void) {
  int *a, *b, *c, host[64], out[64];
  for (int i = 0; i < 64; ++i) host[i] = 1000 + i;
  CHECK(cudaMalloc((void **)&a, sizeof host));
  CHECK(cudaMalloc((void **)&b, sizeof host));
  CHECK(cudaMalloc((void **)&c, sizeof host));
  CHECK(cudaMemcpy(a, host, sizeof host, cudaMemcpyHostToDevice));

  cudaGraph_t g, child;
  cudaGraphNode_t set, copy, empty, nested, hostnode, inner;
  CHECK(cudaGraphCreate(&g, 0));
  struct cudaMemsetParams mp;
  memset(&mp, 0, sizeof mp);
  mp.dst = b; mp.value = 0x05; mp.elementSize = 1; mp.width = sizeof host; mp.height = 1;
  CHECK(cudaGraphAddMemsetNode(&set, g, NULL, 0, &mp));
  CHECK(cudaGraphAddMemcpyNode1D(&copy, g, &set, 1, b, a, 32 * sizeof(int), cudaMemcpyDefault));
  CHECK(cudaGraphAddEmptyNode(&empty, g, NULL, 0));
  CHECK(cudaGraphAddDependencies(g, &copy, &empty, NULL, 1));
  /* The child graph copies b to c with a 3D copy node. */
  CHECK(cudaGraphCreate(&child, 0));
  struct cudaMemcpy3DParms p3;
  memset(&p3, 0, sizeof p3);
  p3.srcPtr.ptr = b; p3.srcPtr.pitch = sizeof host; p3.srcPtr.xsize = sizeof host; p3.srcPtr.ysize = 1;
  p3.dstPtr.ptr = c; p3.dstPtr.pitch = sizeof host; p3.dstPtr.xsize = sizeof host; p3.dstPtr.ysize = 1;
  p3.extent.width = sizeof host; p3.extent.height = 1; p3.extent.depth = 1;
  p3.kind = cudaMemcpyDefault;
  CHECK(cudaGraphAddMemcpyNode(&inner, child, NULL, 0, &p3));
  CHECK(cudaGraphAddChildGraphNode(&nested, g, &empty, 1, child));
  struct cudaHostNodeParams hp = {count_replay, NULL};
  CHECK(cudaGraphAddHostNode(&hostnode, g, &nested, 1, &hp));

  size_t n = 0;
  CHECK(cudaGraphGetNodes(g, NULL, &n));
  EXPECT(n == 5);
  cudaGraphNode_t all[8];
  n = 8;
  CHECK(cudaGraphGetNodes(g, all, &n));
  EXPECT(n == 5 && all[0] == set && all[4] == hostnode && all[5] == NULL);
  cudaGraphNode_t deps[4];
  n = 4;
  CHECK(cudaGraphNodeGetDependencies(copy, deps, NULL, &n));
  EXPECT(n == 1 && deps[0] == set);
  n = 4;
  CHECK(cudaGraphNodeGetDependentNodes(empty, deps, NULL, &n));
  EXPECT(n == 1 && deps[0] == nested);
  n = 0;
  CHECK(cudaGraphGetRootNodes(g, NULL, &n));
  EXPECT(n == 1);
  cudaGraphNode_t from[8], to[8];
  n = 8;
  CHECK(cudaGraphGetEdges(g, from, to, NULL, &n));
  EXPECT(n == 4);
  enum cudaGraphNodeType type;
  CHECK(cudaGraphNodeGetType(hostnode, &type));
  EXPECT(type == cudaGraphNodeTypeHost);
  struct cudaHostNodeParams hp2;
  CHECK(cudaGraphHostNodeGetParams(hostnode, &hp2));
  EXPECT(hp2.fn == count_replay);
  cudaGraphExec_t x;
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CHECK(cudaGraphInstantiate(&x, g, 0));
  CHECK(cudaGraphLaunch(x, s));
  CHECK(cudaGraphLaunch(x, s));
  CHECK(cudaStreamSynchronize(s));
  EXPECT(replays == 2);
  CHECK(cudaMemcpy(out, c, sizeof out, cudaMemcpyDeviceToHost));
  for (int i = 0; i < 64; ++i) EXPECT(out[i] == (i < 32 ? 1000 + i : 0x05050505));

  /* One instance's parameters; the graph keeps its own. */
  mp.value = 0x07;
  CHECK(cudaGraphExecMemsetNodeSetParams(x, set, &mp));
  CHECK(cudaGraphLaunch(x, s));
  CHECK(cudaStreamSynchronize(s));
  CHECK(cudaMemcpy(out, c, sizeof out, cudaMemcpyDeviceToHost));
  EXPECT(out[40] == 0x07070707 && replays == 3);
  struct cudaMemsetParams mp2;
  CHECK(cudaGraphMemsetNodeGetParams(set, &mp2));
  EXPECT(mp2.value == 0x05);

  /* Exec update: the graph's new parameters, then a graph of another shape. */
  mp.value = 0x09;
  CHECK(cudaGraphMemsetNodeSetParams(set, &mp));
  cudaGraphExecUpdateResultInfo info;
  CHECK(cudaGraphExecUpdate(x, g, &info));
  EXPECT(info.result == cudaGraphExecUpdateSuccess);
  CHECK(cudaGraphLaunch(x, s));
  CHECK(cudaStreamSynchronize(s));
  CHECK(cudaMemcpy(out, c, sizeof out, cudaMemcpyDeviceToHost));
  EXPECT(out[40] == 0x09090909 && out[0] == 1000);
  cudaGraph_t other;
  cudaGraphNode_t lone;
  CHECK(cudaGraphCreate(&other, 0));
  CHECK(cudaGraphAddEmptyNode(&lone, other, NULL, 0));
  EXPECT(cudaGraphExecUpdate(x, other, &info) == cudaErrorGraphExecUpdateFailure);
  EXPECT(info.result == cudaGraphExecUpdateErrorTopologyChanged);
  cudaGetLastError();

  /* Capture into an existing graph, after one of its nodes; the capture's frontier is a
     node the session knows. */
  cudaGraph_t cg, got;
  cudaGraphNode_t first;
  CHECK(cudaGraphCreate(&cg, 0));
  CHECK(cudaGraphAddEmptyNode(&first, cg, NULL, 0));
  CHECK(cudaStreamBeginCaptureToGraph(s, cg, &first, NULL, 1, cudaStreamCaptureModeGlobal));
  CHECK(cudaMemsetAsync(b, 0, 16, s));
  enum cudaStreamCaptureStatus status;
  unsigned long long id;
  const cudaGraphNode_t *frontier;
  const cudaGraphEdgeData *edges;
  size_t nd = 0;
  CHECK(cudaStreamGetCaptureInfo(s, &status, &id, &got, &frontier, &edges, &nd));
  EXPECT(status == cudaStreamCaptureStatusActive && got == cg && nd == 1);
  /* Every output but the status is optional (torch asks with NULL graph and frontier). */
  status = cudaStreamCaptureStatusNone;
  unsigned long long id2 = 0;
  CHECK(cudaStreamGetCaptureInfo(s, &status, &id2, NULL, NULL, NULL, NULL));
  EXPECT(status == cudaStreamCaptureStatusActive && id2 == id);
  CHECK(cudaStreamGetCaptureInfo(s, &status, NULL, NULL, NULL, NULL, NULL));
  EXPECT(status == cudaStreamCaptureStatusActive);
  CHECK(cudaGraphNodeGetType(frontier[0], &type));
  EXPECT(type == cudaGraphNodeTypeMemset);
  CHECK(cudaStreamEndCapture(s, &got));
  EXPECT(got == cg);
  n = 0;
  CHECK(cudaGraphGetNodes(cg, NULL, &n));
  EXPECT(n == 2);
  /* Ended without an out-pointer, as NVIDIA's graphConditionalNodes does: the program holds
     the graph already. */
  CHECK(cudaStreamBeginCaptureToGraph(s, cg, NULL, NULL, 0, cudaStreamCaptureModeGlobal));
  CHECK(cudaMemsetAsync(b, 0, 16, s));
  CHECK(cudaStreamEndCapture(s, NULL));
  n = 0;
  CHECK(cudaGraphGetNodes(cg, NULL, &n));
  EXPECT(n == 3);

  /* The graph as dot text, written by the client to its path. */
  CHECK(cudaGraphDebugDotPrint(g, "graph.dot", 0));
  FILE *dot = fopen("graph.dot", "r");
  EXPECT(dot != NULL);
  char head[16] = {0};
  EXPECT(fread(head, 1, 7, dot) == 7 && strcmp(head, "digraph") == 0);
  fclose(dot);

  CHECK(cudaGraphExecDestroy(x));
  CHECK(cudaGraphDestroy(g));
  CHECK(cudaGraphDestroy(child));
  CHECK(cudaGraphDestroy(other));
  CHECK(cudaGraphDestroy(cg));
  printf("OK\n");
  return 0;
}
"#;

/// Graphs that copy the program's own memory (NVIDIA's simpleCudaGraphs, jacobiCudaGraphs,
/// conjugateGradientCudaGraphs): copy nodes and captured copies between device memory and
/// pinned memory, a `malloc`ed buffer and stack variables; a host node reads what the copy
/// before it wrote; each replay reads the host memory as it is at the launch.
const GRAPH_HOST_MEMORY: &str = r#"
#include <stdlib.h>
#include <cuda_runtime_api.h>
static float seen = -1;
static int replays = 0;
static void CUDART_CB read_result(void *p) { seen = *(float *)p; replays++; }
static struct cudaPitchedPtr pitched(void *p, size_t bytes) {
  struct cudaPitchedPtr r = { p, bytes, bytes, 1 };
  return r;
}
int main(void) {
  enum { N = 4096 };
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  float *pinned, *pageable = malloc(N * sizeof(float)), *d;
  CHECK(cudaMallocHost((void **)&pinned, N * sizeof(float)));
  CHECK(cudaMalloc((void **)&d, 2 * N * sizeof(float)));
  for (int i = 0; i < N; ++i) { pinned[i] = (float)i; pageable[i] = 2.0f * i; }
  float result = 0; /* a stack variable, as in simpleCudaGraphs */

  /* Call by call: in from pinned (1D) and pageable memory (3D), out into the stack
     variable, then a host node that reads it. */
  cudaGraph_t g;
  cudaGraphNode_t in[2], out, host;
  CHECK(cudaGraphCreate(&g, 0));
  CHECK(cudaGraphAddMemcpyNode1D(&in[0], g, NULL, 0, d, pinned, N * sizeof(float), cudaMemcpyHostToDevice));
  struct cudaMemcpy3DParms p;
  memset(&p, 0, sizeof p);
  p.srcPtr = pitched(pageable, N * sizeof(float));
  p.dstPtr = pitched(d + N, N * sizeof(float));
  p.extent.width = N * sizeof(float); p.extent.height = 1; p.extent.depth = 1;
  p.kind = cudaMemcpyHostToDevice;
  CHECK(cudaGraphAddMemcpyNode(&in[1], g, NULL, 0, &p));
  memset(&p, 0, sizeof p);
  p.srcPtr = pitched(d + N + 7, sizeof(float));
  p.dstPtr = pitched(&result, sizeof(float));
  p.extent.width = sizeof(float); p.extent.height = 1; p.extent.depth = 1;
  p.kind = cudaMemcpyDeviceToHost;
  CHECK(cudaGraphAddMemcpyNode(&out, g, in, 2, &p));
  struct cudaHostNodeParams hp = { read_result, &result };
  CHECK(cudaGraphAddHostNode(&host, g, &out, 1, &hp));
  cudaGraphExec_t x;
  CHECK(cudaGraphInstantiate(&x, g, 0));
  CHECK(cudaGraphLaunch(x, s));
  CHECK(cudaStreamSynchronize(s));
  EXPECT(result == 14.0f && seen == 14.0f && replays == 1);
  /* Each launch copies the memory as it is then. */
  pageable[7] = 100.0f;
  pinned[5] = -5.0f;
  CHECK(cudaGraphLaunch(x, s));
  CHECK(cudaStreamSynchronize(s));
  EXPECT(result == 100.0f && seen == 100.0f && replays == 2);
  float back[N];
  CHECK(cudaMemcpy(back, d, sizeof back, cudaMemcpyDeviceToHost));
  EXPECT(back[5] == -5.0f && back[6] == 6.0f);
  /* The node's parameters read back as they were set. */
  struct cudaMemcpy3DParms got;
  CHECK(cudaGraphMemcpyNodeGetParams(out, &got));
  EXPECT(got.dstPtr.ptr == &result && got.srcPtr.ptr == d + N + 7);
  /* The instance's nodes set anew: another input (a stack array), another output and the
     host function's data; the graph keeps its own. */
  float other[N], other_result = 0;
  for (int i = 0; i < N; ++i) other[i] = 3.0f * i;
  CHECK(cudaGraphExecMemcpyNodeSetParams1D(x, in[0], d, other, N * sizeof(float), cudaMemcpyHostToDevice));
  struct cudaMemcpy3DParms p3 = p;
  p3.dstPtr = pitched(&other_result, sizeof(float));
  CHECK(cudaGraphExecMemcpyNodeSetParams(x, out, &p3));
  struct cudaHostNodeParams hp2 = { read_result, &other_result };
  CHECK(cudaGraphExecHostNodeSetParams(x, host, &hp2));
  result = -1.0f;
  CHECK(cudaGraphLaunch(x, s));
  CHECK(cudaStreamSynchronize(s));
  EXPECT(other_result == 100.0f && seen == 100.0f && result == -1.0f);
  CHECK(cudaMemcpy(back, d, sizeof back, cudaMemcpyDeviceToHost));
  EXPECT(back[5] == 15.0f);
  CHECK(cudaGraphMemcpyNodeSetParams1D(in[0], d, pinned, N * sizeof(float), cudaMemcpyHostToDevice));
  CHECK(cudaGraphMemcpyNodeSetParams(out, &p3));
  CHECK(cudaGraphHostNodeSetParams(host, &hp2));
  CHECK(cudaGraphMemcpyNodeGetParams(out, &got));
  EXPECT(got.dstPtr.ptr == &other_result);

  /* Captured: copies in from a malloc'ed buffer, out into a stack variable and into pinned
     memory, and the host function that reads the result. */
  float captured = 0;
  float *more = malloc(64 * sizeof(float));
  for (int i = 0; i < 64; ++i) more[i] = 1000.0f + i;
  cudaGraph_t cg;
  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  CHECK(cudaMemcpyAsync(d, more, 64 * sizeof(float), cudaMemcpyHostToDevice, s));
  CHECK(cudaMemsetAsync(d + 1, 0, sizeof(float), s));
  CHECK(cudaMemcpyAsync(&captured, d + 3, sizeof(float), cudaMemcpyDefault, s));
  CHECK(cudaMemcpyAsync(pinned + 10, d, 4 * sizeof(float), cudaMemcpyDeviceToHost, s));
  CHECK(cudaLaunchHostFunc(s, read_result, &captured));
  CHECK(cudaStreamEndCapture(s, &cg));
  cudaGraphExec_t cx;
  CHECK(cudaGraphInstantiate(&cx, cg, 0));
  EXPECT(captured == 0.0f && pinned[10] == 10.0f); /* nothing ran while capturing */
  CHECK(cudaGraphLaunch(cx, s));
  CHECK(cudaStreamSynchronize(s));
  EXPECT(captured == 1003.0f && seen == 1003.0f);
  EXPECT(pinned[10] == 1000.0f && pinned[11] == 0.0f && pinned[13] == 1003.0f && pinned[14] == 14.0f);
  more[3] = 7.5f;
  CHECK(cudaGraphLaunch(cx, s));
  CHECK(cudaStreamSynchronize(s));
  EXPECT(captured == 7.5f && seen == 7.5f && pinned[13] == 7.5f);
  /* Only the bytes the GPU wrote come back: a variable between two results, written by
     the program after the launch, keeps its value. */
  struct { float a, between, b; } pair = { 0, 0, 0 };
  cudaGraph_t pg;
  cudaGraphExec_t px;
  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  CHECK(cudaMemcpyAsync(&pair.a, d + 2, sizeof(float), cudaMemcpyDeviceToHost, s));
  CHECK(cudaMemcpyAsync(&pair.b, d + 3, sizeof(float), cudaMemcpyDeviceToHost, s));
  CHECK(cudaStreamEndCapture(s, &pg));
  CHECK(cudaGraphInstantiate(&px, pg, 0));
  CHECK(cudaGraphLaunch(px, s));
  pair.between = 5.0f;
  CHECK(cudaStreamSynchronize(s));
  EXPECT(pair.a == 1002.0f && pair.b == 7.5f && pair.between == 5.0f);
  CHECK(cudaGraphExecDestroy(px));
  CHECK(cudaGraphDestroy(pg));
  /* 2D rows of a malloc'ed buffer in, on a capturing stream. */
  /* Two pages: the rows at the start of the first. */
  float *rows = aligned_alloc(4096, 2 * 4096);
  for (int i = 0; i < 8 * 16; ++i) rows[i] = (float)i;
  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  CHECK(cudaMemcpy2DAsync(d, 4 * sizeof(float), rows, 16 * sizeof(float), 4 * sizeof(float), 8, cudaMemcpyHostToDevice, s));
  CHECK(cudaStreamEndCapture(s, &pg));
  CHECK(cudaGraphInstantiate(&px, pg, 0));
  rows[16 * 7 + 3] = -1.0f;
  CHECK(cudaGraphLaunch(px, s));
  CHECK(cudaStreamSynchronize(s));
  CHECK(cudaMemcpy(back, d, 32 * sizeof(float), cudaMemcpyDeviceToHost));
  for (int r = 0; r < 8; ++r)
    for (int c = 0; c < 4; ++c) EXPECT(back[r * 4 + c] == (r == 7 && c == 3 ? -1.0f : (float)(r * 16 + c)));
  /* A second graph copies the rows in and out to bytes across both pages (one the first
     graph's copy names, one it does not): the first graph still replays, and both are right. */
  float *beside = rows + 1000;
  cudaGraph_t bg;
  cudaGraphExec_t bx;
  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  CHECK(cudaMemcpy2DAsync(d + 64, 4 * sizeof(float), rows, 16 * sizeof(float), 4 * sizeof(float), 8, cudaMemcpyHostToDevice, s));
  CHECK(cudaMemcpyAsync(beside, d + 64, 32 * sizeof(float), cudaMemcpyDeviceToHost, s));
  CHECK(cudaStreamEndCapture(s, &bg));
  CHECK(cudaGraphInstantiate(&bx, bg, 0));
  rows[0] = -2.0f;
  CHECK(cudaGraphLaunch(px, s));
  CHECK(cudaGraphLaunch(bx, s));
  CHECK(cudaStreamSynchronize(s));
  CHECK(cudaMemcpy(back, d, 32 * sizeof(float), cudaMemcpyDeviceToHost));
  EXPECT(back[0] == -2.0f && back[31] == -1.0f && back[5] == 17.0f);
  EXPECT(beside[0] == -2.0f && beside[31] == -1.0f && beside[5] == 17.0f);
  EXPECT(rows[0] == -2.0f && rows[5] == 5.0f && rows[16 * 7 + 3] == -1.0f);
  CHECK(cudaGraphExecDestroy(bx));
  CHECK(cudaGraphDestroy(bg));
  CHECK(cudaGraphExecDestroy(px));
  CHECK(cudaGraphDestroy(pg));
  free(rows);
  /* Outside the graphs, copies of the same memory still see the program's writes. */
  more[0] = 42.0f;
  CHECK(cudaMemcpy(d, more, sizeof(float), cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(&captured, d, sizeof(float), cudaMemcpyDeviceToHost));
  EXPECT(captured == 42.0f);

  CHECK(cudaGraphExecDestroy(cx));
  CHECK(cudaGraphDestroy(cg));
  CHECK(cudaGraphExecDestroy(x));
  CHECK(cudaGraphDestroy(g));
  free(more);
  free(pageable);
  CHECK(cudaFreeHost(pinned));
  CHECK(cudaFree(d));
  printf("OK\n");
  return 0;
}
"#;

#[test]
fn graphs_copy_the_programs_own_memory_through_mirrors() {
    let server = server();
    let exe = program("graph-host-memory", &format!("{CHECKS}{GRAPH_HOST_MEMORY}"));
    let (stdout, stderr) = run_traced(&server, &exe);
    assert!(stdout.contains("OK"), "{stdout}\n{stderr}");
    assert!(!stderr.contains("WARN") && !stderr.contains("ERROR"), "{stderr}");
}

#[test]
fn graphs_built_call_by_call_replay_on_the_emulated_gpu() {
    let server = server();
    let exe = program("runtime-graphs", &format!("{CHECKS}{RUNTIME_GRAPHS}"));
    let mut cmd = Command::new(chidori());
    cmd.current_dir(exe.parent().unwrap());
    cmd.args(["run", "-s", &server.address, "--lib-dir"]).arg(chidori_tests::shim_dir()).arg("--").arg(&exe);
    let out = cmd.output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && stdout.contains("OK"), "{stdout}\n{stderr}");
    let dot = std::fs::read_to_string(exe.parent().unwrap().join("graph.dot")).unwrap();
    assert_eq!(dot.matches(" -> ").count(), 4, "the graph's four edges: {dot}");
}

/// Capture state asked again and again (torch's allocator asks on every allocation).
const CAPTURE_QUESTIONS: &str = r#"
#include <cuda_runtime_api.h>
int main(void) {
  cudaStream_t s;
  cudaEvent_t e;
  int *p;
  enum cudaStreamCaptureStatus status;
  unsigned long long id = 0, first = 0;
  cudaGraph_t g, got;
  const cudaGraphNode_t *deps;
  size_t n = 0;
  CHECK(cudaStreamCreate(&s));
  CHECK(cudaEventCreate(&e));
  CHECK(cudaMalloc((void **)&p, 64));
  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
  CHECK(cudaStreamGetCaptureInfo(s, &status, &first, NULL, NULL, NULL, NULL));
  EXPECT(status == cudaStreamCaptureStatusActive);
  for (int i = 0; i < 50; ++i) {
    CHECK(cudaMemsetAsync(p, i, 64, s));
    CHECK(cudaStreamGetCaptureInfo(s, &status, &id, &got, NULL, NULL, NULL));
    EXPECT(status == cudaStreamCaptureStatusActive && id == first);
    CHECK(cudaStreamIsCapturing(s, &status));
    EXPECT(status == cudaStreamCaptureStatusActive);
  }
  /* Another stream, not capturing: learned too. */
  CHECK(cudaStreamIsCapturing(0, &status));
  for (int i = 0; i < 3; ++i) {
    CHECK(cudaStreamGetCaptureInfo(0, &status, NULL, NULL, NULL, NULL, NULL));
    EXPECT(status == cudaStreamCaptureStatusNone);
  }
  /* The frontier moves with every captured call: always asked. */
  for (int i = 0; i < 3; ++i) {
    CHECK(cudaMemsetAsync(p, i, 64, s));
    CHECK(cudaStreamGetCaptureInfo(s, &status, &id, &g, &deps, NULL, &n));
    EXPECT(status == cudaStreamCaptureStatusActive && n == 1);
  }
  /* A failing call may have invalidated the capture: asked again. */
  EXPECT(cudaStreamQuery((cudaStream_t)0x1234) != cudaSuccess);
  CHECK(cudaStreamGetCaptureInfo(s, &status, &id, NULL, NULL, NULL, NULL));
  /* Waiting on an event may join a capture: asked again. */
  CHECK(cudaEventRecord(e, s));
  CHECK(cudaStreamWaitEvent(s, e, 0));
  CHECK(cudaStreamGetCaptureInfo(s, &status, &id, NULL, NULL, NULL, NULL));
  EXPECT(status == cudaStreamCaptureStatusActive && id == first);
  CHECK(cudaStreamEndCapture(s, &g));
  CHECK(cudaStreamGetCaptureInfo(s, &status, &id, NULL, NULL, NULL, NULL));
  EXPECT(status == cudaStreamCaptureStatusNone);
  /* A new capture: a new id, asked once. */
  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
  for (int i = 0; i < 10; ++i) {
    CHECK(cudaStreamGetCaptureInfo(s, &status, &id, NULL, NULL, NULL, NULL));
    EXPECT(status == cudaStreamCaptureStatusActive && id != first);
  }
  CHECK(cudaStreamEndCapture(s, &got));
  printf("OK\n");
  return 0;
}
"#;

/// Issue 19 (torch asks a capture's status on every allocation: 1,071 round trips in one
/// decode warm-up at 70 ms on the H200): the worker's answer about a capturing stream
/// answers later questions until something may change it.
#[test]
fn capture_state_asked_again_is_answered_by_the_client_until_something_may_change_it() {
    let server = server();
    let exe = program("capture-questions", &format!("{CHECKS}{CAPTURE_QUESTIONS}"));
    let (stdout, stderr) = run_traced(&server, &exe);
    assert!(stdout.contains("OK"), "{stdout}\n{stderr}");
    // Each capture's status, id and graph were the client's from its begin, which waited
    // for nothing (the client named the capture). Then the legacy stream's, 3 frontiers,
    // after the failure, after the wait: 6 of 70. The id after the failure is the worker's
    // answer, the one the client chose (`id == first`).
    let asked = stderr.lines().find(|l| l.starts_with("(graph nodes)")).unwrap_or_else(|| panic!("{stderr}"));
    assert_eq!(asked.split_whitespace().nth(3), Some("6"), "round trips: {stderr}");
    assert_eq!(trace_row(&stderr, "cudaStreamBeginCapture")[1], "0", "{stderr}");
    assert_eq!(trace_row(&stderr, "cudaStreamGetCaptureInfo"), ["70", "0"], "{stderr}");
    let capturing = trace_row(&stderr, "cudaStreamIsCapturing");
    assert_eq!(capturing[1], "1", "the legacy stream's, before it was learned: {stderr}");
}

/// A graph captured and instantiated as torch does it, three times: the begin and the first
/// instance of each graph wait for nothing (the client names the capture and the
/// instance); a second instance of a graph, a graph of no one's, wait; a begin the server
/// refuses reaches the program at the next call that waits.
const CAPTURE_UNWAITED: &str = r#"
#include <cuda_runtime_api.h>
int main(void) {
  cudaStream_t s;
  cudaGraph_t g, during;
  cudaGraphExec_t x, second;
  int *p, host[16];
  enum cudaStreamCaptureStatus status;
  unsigned long long id = 0, last = 0;
  size_t n = 0;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CHECK(cudaMalloc((void **)&p, 64));
  for (int round = 1; round <= 3; ++round) {
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    CHECK(cudaStreamGetCaptureInfo(s, &status, &id, &during, NULL, NULL, NULL));
    EXPECT(status == cudaStreamCaptureStatusActive && id != 0 && id != last && during != NULL);
    last = id;
    CHECK(cudaMemsetAsync(p, round, 64, s));
    CHECK(cudaStreamEndCapture(s, &g));
    EXPECT(g == during);
    CHECK(cudaGraphGetNodes(g, NULL, &n));
    EXPECT(n == 1);
    CHECK(cudaGraphInstantiateWithFlags(&x, g, cudaGraphInstantiateFlagAutoFreeOnLaunch | cudaGraphInstantiateFlagUseNodePriority));
    CHECK(cudaGraphLaunch(x, s));
    CHECK(cudaMemcpyAsync(host, p, 64, cudaMemcpyDeviceToHost, s));
    CHECK(cudaStreamSynchronize(s));
    EXPECT(host[0] == 0x01010101 * round && host[15] == host[0]);
    if (round == 1) {
      CHECK(cudaGraphInstantiateWithFlags(&second, g, 0));
      CHECK(cudaGraphExecDestroy(second));
    }
    CHECK(cudaGraphExecDestroy(x));
    CHECK(cudaGraphDestroy(g));
  }
  EXPECT(cudaGraphInstantiateWithFlags(&x, (cudaGraph_t)0x1234, 0) != cudaSuccess);
  CHECK(cudaStreamBeginCapture((cudaStream_t)0x5678, cudaStreamCaptureModeGlobal));
  EXPECT(cudaDeviceSynchronize() == cudaErrorInvalidResourceHandle);
  EXPECT(cudaStreamIsCapturing((cudaStream_t)0x5678, &status) != cudaSuccess);
  printf("OK\n");
  return 0;
}
"#;

/// Issue 19 (torch's cuda_graph case at 70 ms: each capture's begin and instantiation
/// waited a round trip): both are made without waiting where the client can tell they
/// succeed, and the capture's id and graph are the client's names on both sides.
#[test]
fn a_captures_begin_and_its_graphs_first_instance_wait_for_nothing() {
    let server = server();
    let exe = program("capture-unwaited", &format!("{CHECKS}{CAPTURE_UNWAITED}"));
    let (stdout, stderr) = run_traced(&server, &exe);
    assert!(stdout.contains("OK"), "{stdout}\n{stderr}");
    assert_eq!(trace_row(&stderr, "cudaStreamBeginCapture"), ["4", "0"], "{stderr}");
    assert_eq!(trace_row(&stderr, "cudaStreamGetCaptureInfo"), ["3", "0"], "{stderr}");
    // The second instance of the first graph and the graph of no one's waited.
    assert_eq!(trace_row(&stderr, "cudaGraphInstantiateWithFlags"), ["5", "2"], "{stderr}");
}

/// A capture's end as torch makes it: the graph's node count asked right after. The nodes
/// come with the end's round trip; the count and the array are the client's while nothing
/// was sent since; after a change of the graph they are asked; an end that fails keeps
/// nothing.
const CAPTURE_END_NODES: &str = r#"
#include <cuda_runtime_api.h>
int main(void) {
  cudaStream_t s, other;
  cudaGraph_t g, none = NULL;
  cudaGraphNode_t nodes[16], extra;
  int *p;
  size_t n1 = 0, n2 = 16, n3 = 0;
  CHECK(cudaStreamCreate(&s));
  CHECK(cudaStreamCreate(&other));
  CHECK(cudaMalloc((void **)&p, 64));
  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  for (int i = 0; i < 5; ++i) CHECK(cudaMemsetAsync(p, i, 64, s));
  CHECK(cudaStreamEndCapture(s, &g));
  CHECK(cudaGraphGetNodes(g, NULL, &n1));
  CHECK(cudaGraphGetNodes(g, nodes, &n2));
  EXPECT(n1 == 5 && n2 == 5 && nodes[0] != NULL && nodes[4] != NULL);
  /* A node added: the graph changed, asked again. */
  CHECK(cudaGraphAddEmptyNode(&extra, g, NULL, 0));
  CHECK(cudaGraphGetNodes(g, NULL, &n3));
  EXPECT(n3 == 6);
  /* An end on a stream that is not capturing fails: nothing kept. */
  EXPECT(cudaStreamEndCapture(other, &none) != cudaSuccess);
  cudaGetLastError();
  CHECK(cudaGraphGetNodes(g, NULL, &n3));
  EXPECT(n3 == 6);
  CHECK(cudaGraphDestroy(g));
  printf("OK\n");
  return 0;
}
"#;

#[test]
fn a_captured_graphs_nodes_come_with_the_end_of_its_capture() {
    let server = server();
    let exe = program("capture-end-nodes", &format!("{CHECKS}{CAPTURE_END_NODES}"));
    let (stdout, stderr) = run_traced(&server, &exe);
    assert!(stdout.contains("OK"), "{stdout}\n{stderr}");
    // Asked: the count after the added node and after the failed end (something was sent).
    assert_eq!(trace_row(&stderr, "(graph nodes)"), ["2", "2"], "{stderr}");
    assert_eq!(trace_row(&stderr, "cudaGraphGetNodes")[0], "4", "{stderr}");
}

/// Reads back as torch makes them (`.item()`: a copy into pageable memory, then a stream
/// synchronize): the copy returns once done, so the synchronize finds its stream idle and
/// the client answers it. Asked where another stream is meant, or anything was sent since.
const READ_BACKS: &str = r#"
#include <cuda_runtime_api.h>
#include <cuda.h>
int main(void) {
  cudaStream_t s;
  int *p;
  int host[16];
  CHECK(cudaStreamCreate(&s));
  CHECK(cudaMalloc((void **)&p, sizeof host));
  for (int i = 0; i < 20; ++i) {
    CHECK(cudaMemsetAsync(p, i, sizeof host, s));
    CHECK(cudaMemcpyAsync(host, p, sizeof host, cudaMemcpyDeviceToHost, s));
    CHECK(cudaStreamSynchronize(s));
    EXPECT(host[0] == i * 0x01010101);
  }
  /* The legacy stream, likewise. */
  for (int i = 0; i < 5; ++i) {
    CHECK(cudaMemsetAsync(p, i, sizeof host, 0));
    CHECK(cudaMemcpyAsync(host, p, sizeof host, cudaMemcpyDeviceToHost, 0));
    CHECK(cudaStreamSynchronize(0));
    EXPECT(host[15] == i * 0x01010101);
  }
  /* Another stream than the copy's: asked. */
  CHECK(cudaMemcpyAsync(host, p, sizeof host, cudaMemcpyDeviceToHost, s));
  CHECK(cudaStreamSynchronize(0));
  /* Work sent since the copy: asked. */
  CHECK(cudaMemcpyAsync(host, p, sizeof host, cudaMemcpyDeviceToHost, s));
  CHECK(cudaMemsetAsync(p, 9, sizeof host, s));
  CHECK(cudaStreamSynchronize(s));
  CHECK(cudaMemcpy(host, p, sizeof host, cudaMemcpyDeviceToHost));
  EXPECT(host[3] == 9 * 0x01010101);
  /* A device synchronize repeated: the second is answered. */
  CHECK(cudaDeviceSynchronize());
  CHECK(cudaDeviceSynchronize());
  /* The driver's read back. */
  CHECK(cuMemcpyDtoHAsync(host, (CUdeviceptr)p, sizeof host, (CUstream)s));
  CHECK(cuStreamSynchronize((CUstream)s));
  /* A failing copy teaches nothing. */
  EXPECT(cudaMemcpyAsync(host, (void *)0x10, sizeof host, cudaMemcpyDeviceToHost, s) != cudaSuccess);
  CHECK(cudaStreamSynchronize(s));
  /* Host bytes copied in after a drain (torch's `.to("cuda")`: a copy from pageable memory,
     then a synchronize): answered, and still sent for the server's stream order. */
  CHECK(cudaDeviceSynchronize());
  for (int i = 0; i < 4; ++i) {
    int in[16], back[16];
    for (int j = 0; j < 16; ++j) in[j] = 100 + i + j;
    CHECK(cudaMemcpyAsync(p, in, sizeof in, cudaMemcpyHostToDevice, 0));
    CHECK(cudaStreamSynchronize(0));
    for (int j = 0; j < 16; ++j) in[j] = -1; /* the program may reuse its buffer */
    CHECK(cudaMemcpyAsync(p + 8, in, 8 * sizeof(int), cudaMemcpyHostToDevice, 0));
    CHECK(cudaStreamSynchronize(0));
    CHECK(cudaMemcpyAsync(back, p, sizeof back, cudaMemcpyDeviceToHost, 0));
    CHECK(cudaStreamSynchronize(0));
    /* Read back from what the client wrote: the second copy patched the first. */
    EXPECT(back[0] == 100 + i && back[7] == 107 + i && back[8] == -1 && back[15] == -1);
  }
  /* The server holds the same bytes (the driver's blocking copy goes to it). */
  int check[16];
  CHECK(cuMemcpyDtoH_v2(check, (CUdeviceptr)p, sizeof check));
  EXPECT(check[0] == 103 && check[7] == 110 && check[8] == -1 && check[15] == -1);
  CHECK(cudaDeviceSynchronize());
  /* Other work after the copy: asked. */
  CHECK(cudaMemcpyAsync(p, host, sizeof host, cudaMemcpyHostToDevice, 0));
  CHECK(cudaMemsetAsync(p, 1, sizeof host, 0));
  CHECK(cudaStreamSynchronize(0));
  /* The driver's copy in. */
  CHECK(cuMemcpyHtoDAsync((CUdeviceptr)p, host, sizeof host, (CUstream)0));
  CHECK(cuStreamSynchronize((CUstream)0));
  /* A copy past the end of its allocation is not trusted to succeed: asked. */
  CHECK(cudaMemcpy(host, p, sizeof host, cudaMemcpyDeviceToHost));
  CHECK(cudaStreamSynchronize(0));
  cudaMemcpyAsync(p + 8, host, sizeof host, cudaMemcpyHostToDevice, 0);
  cudaStreamSynchronize(0);
  cudaGetLastError();
  puts("OK");
  return 0;
}
"#;

#[test]
fn a_synchronize_after_a_read_back_is_answered_by_the_client() {
    let server = server();
    let exe = program_with("read-backs", &format!("{CHECKS}{READ_BACKS}"), &["-l:libcuda.so.1"]);
    let (stdout, stderr) = run_traced(&server, &exe);
    assert!(stdout.contains("OK"), "{stdout}\n{stderr}");
    // 43 synchronizes: asked for another stream, after work sent, after a failing copy,
    // after other work than a copy in, after a copy in past an allocation's end (and the
    // one before it, after a blocking copy); 8 after copies in forwarded without waiting.
    assert_eq!(trace_row(&stderr, "cudaStreamSynchronize"), ["43", "6"], "{stderr}");
    assert_eq!(trace_row(&stderr, "cudaDeviceSynchronize"), ["4", "3"], "{stderr}");
    assert_eq!(trace_row(&stderr, "cuStreamSynchronize"), ["2", "0"], "{stderr}");
    // 32 reads and 10 copies in: the copies wait for nothing, and the 4 reads of bytes the
    // program had just copied in (the device idle, nothing else sent) are the client's.
    assert_eq!(trace_row(&stderr, "cudaMemcpyAsync"), ["42", "28"], "{stderr}");
}

/// Event queries as torch's pinned host allocator makes them (an event recorded after a
/// block's last use, queried before the block is reused, usually after a synchronize):
/// answered by the client where the event is known complete, asked where it was recorded
/// again since, on a stream no synchronize drained, or before a graph launch.
const EVENT_QUERIES: &str = r#"
#include <cuda_runtime_api.h>
#include <cuda.h>
int main(void) {
  cudaEvent_t e, f;
  cudaStream_t s;
  int *p;
  int host[16];
  CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  CHECK(cudaEventCreate(&f));
  CHECK(cudaStreamCreate(&s));
  CHECK(cudaMalloc((void **)&p, sizeof host));
  for (int i = 0; i < 10; ++i) {
    CHECK(cudaMemsetAsync(p, i, sizeof host, 0));
    CHECK(cudaEventRecord(e, 0));
    CHECK(cudaMemcpyAsync(host, p, sizeof host, cudaMemcpyDeviceToHost, 0));
    CHECK(cudaStreamSynchronize(0));
    EXPECT(host[0] == i * 0x01010101);
    /* The read back drained the stream the event was recorded on. */
    EXPECT(cudaEventQuery(e) == cudaSuccess);
    EXPECT(cudaEventQuery(e) == cudaSuccess);
  }
  /* Recorded again, nothing drained since: asked; once it said complete, a synchronize of
     it is the client's. */
  CHECK(cudaMemsetAsync(p, 1, sizeof host, 0));
  CHECK(cudaEventRecord(e, 0));
  while (cudaEventQuery(e) != cudaSuccess) {}
  CHECK(cudaEventSynchronize(e));
  /* On another stream than the one drained: asked; then that stream drained: answered. */
  CHECK(cudaEventRecord(f, s));
  CHECK(cudaStreamSynchronize(0));
  EXPECT(cudaEventQuery(f) == cudaSuccess);
  CHECK(cudaEventRecord(f, s));
  CHECK(cudaStreamSynchronize(s));
  EXPECT(cudaEventQuery(f) == cudaSuccess);
  /* A graph launch may record any event again: asked. */
  cudaGraph_t g;
  cudaGraphNode_t n;
  cudaGraphExec_t x;
  CHECK(cudaGraphCreate(&g, 0));
  CHECK(cudaGraphAddEmptyNode(&n, g, NULL, 0));
  CHECK(cudaGraphInstantiate(&x, g, 0));
  CHECK(cudaGraphLaunch(x, s));
  EXPECT(cudaEventQuery(f) == cudaSuccess);
  CHECK(cudaStreamSynchronize(s));
  /* The driver's. */
  CUevent d;
  CHECK(cuEventCreate(&d, CU_EVENT_DISABLE_TIMING));
  CHECK(cuEventRecord(d, (CUstream)s));
  CHECK(cuStreamSynchronize((CUstream)s));
  EXPECT(cuEventQuery(d) == CUDA_SUCCESS);
  /* One found complete: so is one recorded before it on its stream. */
  cudaEvent_t a;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventRecord(a, s));
  CHECK(cudaEventRecord(f, s));
  CHECK(cudaEventSynchronize(f));
  EXPECT(cudaEventQuery(a) == cudaSuccess);
  /* Destroyed (without waiting, being complete): nothing is known of its handle. */
  CHECK(cuEventDestroy(d));
  CHECK(cudaEventDestroy(e));
  CHECK(cudaEventDestroy(a));
  CHECK(cudaEventCreate(&e));
  EXPECT(cudaEventQuery(e) == cudaSuccess);
  CHECK(cudaGraphExecDestroy(x));
  CHECK(cudaGraphDestroy(g));
  puts("OK");
  return 0;
}
"#;

#[test]
fn queries_of_events_known_complete_are_answered_by_the_client() {
    let server = server();
    let exe = program_with("event-queries", &format!("{CHECKS}{EVENT_QUERIES}"), &["-l:libcuda.so.1"]);
    let (stdout, stderr) = run_traced(&server, &exe);
    assert!(stdout.contains("OK"), "{stdout}\n{stderr}");
    // 20 in the loop answered, the other stream's once drained, `a`'s; asked: the query
    // after recording again (at least once, until the server says complete), the other
    // stream's before its synchronize, after the graph launch, the new event's.
    let queries = trace_row(&stderr, "cudaEventQuery");
    let (calls, trips): (u32, u32) = (queries[0].parse().unwrap(), queries[1].parse().unwrap());
    assert_eq!(calls - trips, 22, "{stderr}");
    // The one after a query said complete answered; the one that taught `a` asked.
    assert_eq!(trace_row(&stderr, "cudaEventSynchronize"), ["2", "1"], "{stderr}");
    assert_eq!(trace_row(&stderr, "cuEventQuery"), ["1", "0"], "{stderr}");
    // Destroys of the session's events go without waiting (`e` was forgotten at the graph
    // launch, but is still one the server made for this client).
    assert_eq!(trace_row(&stderr, "cudaEventDestroy"), ["2", "0"], "{stderr}");
    assert_eq!(trace_row(&stderr, "cuEventDestroy_v2"), ["1", "0"], "{stderr}");
}

/// Events as torch makes them, one per Python event object: the client names each and sends
/// its create without waiting; each works as an event made when asked. Interprocess events
/// are asked.
const EVENTS_AHEAD: &str = r#"
#include <cuda_runtime_api.h>
#include <cuda.h>
int main(void) {
  cudaEvent_t e[12];
  cudaStream_t s;
  CHECK(cudaStreamCreate(&s));
  for (int i = 0; i < 12; ++i) CHECK(cudaEventCreateWithFlags(&e[i], cudaEventDisableTiming));
  for (int i = 0; i < 12; ++i)
    for (int j = 0; j < i; ++j) EXPECT(e[i] != e[j]);
  for (int i = 0; i < 12; ++i) CHECK(cudaEventRecord(e[i], s));
  CHECK(cudaStreamSynchronize(s));
  for (int i = 0; i < 12; ++i) EXPECT(cudaEventQuery(e[i]) == cudaSuccess);
  for (int i = 0; i < 12; ++i) CHECK(cudaEventDestroy(e[i]));
  cudaEvent_t ipc[3];
  for (int i = 0; i < 3; ++i) CHECK(cudaEventCreateWithFlags(&ipc[i], cudaEventInterprocess | cudaEventDisableTiming));
  for (int i = 0; i < 3; ++i) CHECK(cudaEventDestroy(ipc[i]));
  CUevent d[4];
  for (int i = 0; i < 4; ++i) CHECK(cuEventCreate(&d[i], CU_EVENT_DEFAULT));
  for (int i = 0; i < 4; ++i) CHECK(cuEventRecord(d[i], (CUstream)s));
  CHECK(cuStreamSynchronize((CUstream)s));
  for (int i = 0; i < 4; ++i) CHECK(cuEventDestroy(d[i]));
  /* Recorded and not known complete: its destroy cannot be refused either. */
  cudaEvent_t pending;
  CHECK(cudaEventCreate(&pending));
  CHECK(cudaEventRecord(pending, s));
  CHECK(cudaEventDestroy(pending));
  /* A made-up handle, and one destroyed already: asked, and refused. */
  EXPECT(cudaEventDestroy((cudaEvent_t)0x1234) != cudaSuccess);
  EXPECT(cudaEventDestroy(e[0]) != cudaSuccess);
  CHECK(cudaStreamSynchronize(s));
  puts("OK");
  return 0;
}
"#;

#[test]
fn events_are_named_by_the_client() {
    let server = server();
    let exe = program_with("events-ahead", &format!("{CHECKS}{EVENTS_AHEAD}"), &["-l:libcuda.so.1"]);
    let (stdout, stderr) = run_traced(&server, &exe);
    assert!(stdout.contains("OK"), "{stdout}\n{stderr}");
    // Only the two refusals the program asks for are warned of.
    let warnings: Vec<&str> = stderr.lines().filter(|l| l.contains("WARN")).collect();
    assert_eq!(warnings.len(), 2, "{stderr}");
    assert!(warnings.iter().all(|w| w.contains("cudaEventDestroy") && w.contains("is not a CUevent_st")), "{stderr}");
    let row = |name: &str| -> (u32, u32) {
        let r = trace_row(&stderr, name);
        (r[0].parse().unwrap(), r[1].parse().unwrap())
    };
    // Named by the client, without waiting; the 3 interprocess ones asked.
    assert_eq!(row("cudaEventCreateWithFlags"), (15, 3), "{stderr}");
    assert_eq!(row("cuEventCreate"), (4, 0), "{stderr}");
    assert_eq!(row("cudaEventCreate"), (1, 0), "{stderr}");
    // The session's events (12, 3 interprocess, the pending one) without waiting; the
    // made-up and the destroyed one asked.
    assert_eq!(row("cudaEventDestroy"), (18, 2), "{stderr}");
    assert_eq!(row("cuEventDestroy_v2"), (4, 0), "{stderr}");
}

/// Capture-mode exchanges as torch's allocator makes them around every cudaMalloc while a
/// graph captures (RELAXED in, the old mode back): the client knows every thread's mode
/// (global where it never exchanged one), answers with it and sends the exchange without
/// waiting.
const CAPTURE_MODES: &str = r#"
#include <pthread.h>
#include <cuda_runtime_api.h>
#include <cuda.h>
static void *other(void *out) {
  enum cudaStreamCaptureMode m = cudaStreamCaptureModeRelaxed;
  *(int *)out = cudaThreadExchangeStreamCaptureMode(&m) == cudaSuccess && m == cudaStreamCaptureModeGlobal;
  return NULL;
}
int main(void) {
  enum cudaStreamCaptureMode m = cudaStreamCaptureModeRelaxed;
  CHECK(cudaThreadExchangeStreamCaptureMode(&m));
  EXPECT(m == cudaStreamCaptureModeGlobal);
  for (int i = 0; i < 10; ++i) {
    m = cudaStreamCaptureModeThreadLocal;
    CHECK(cudaThreadExchangeStreamCaptureMode(&m));
    EXPECT(m == cudaStreamCaptureModeRelaxed);
    m = cudaStreamCaptureModeRelaxed;
    CHECK(cudaThreadExchangeStreamCaptureMode(&m));
    EXPECT(m == cudaStreamCaptureModeThreadLocal);
  }
  /* No such mode: the server's to refuse; the mode stays. */
  m = (enum cudaStreamCaptureMode)7;
  EXPECT(cudaThreadExchangeStreamCaptureMode(&m) == cudaErrorInvalidValue);
  EXPECT(cudaThreadExchangeStreamCaptureMode(NULL) == cudaErrorInvalidValue);
  CUstreamCaptureMode d = CU_STREAM_CAPTURE_MODE_GLOBAL;
  CHECK(cuThreadExchangeStreamCaptureMode(&d));
  EXPECT(d == CU_STREAM_CAPTURE_MODE_RELAXED);
  /* Another thread has a mode of its own. */
  pthread_t t;
  int ok = 0;
  pthread_create(&t, NULL, other, &ok);
  pthread_join(t, NULL);
  EXPECT(ok);
  CHECK(cudaDeviceSynchronize());
  puts("OK");
  return 0;
}
"#;

#[test]
fn a_threads_capture_mode_is_the_clients_after_its_first_exchange() {
    let server = server();
    let exe = program_with("capture-modes", &format!("{CHECKS}{CAPTURE_MODES}"), &["-l:libcuda.so.1", "-lpthread"]);
    let (stdout, stderr) = run_traced(&server, &exe);
    assert!(stdout.contains("OK"), "{stdout}\n{stderr}");
    assert!(!stderr.contains("WARN"), "{stderr}");
    // Asked: only the one refused (NULL is the client's).
    assert_eq!(trace_row(&stderr, "cudaThreadExchangeStreamCaptureMode"), ["23", "1"], "{stderr}");
    assert_eq!(trace_row(&stderr, "cuThreadExchangeStreamCaptureMode"), ["1", "0"], "{stderr}");
}

/// A thread that never changed its context has its device's primary context current on
/// the server (the worker makes it current on each executor as it starts): after one such
/// thread asked, the others are answered by the client, until a context call intervenes.
const THREAD_CONTEXTS: &str = r#"
#include <pthread.h>
#include <cuda_runtime_api.h>
#include <cuda.h>
static CUcontext primary = NULL;
static void *plain(void *out) {
  CUcontext c = NULL;
  *(int *)out = cuCtxGetCurrent(&c) == CUDA_SUCCESS && c == primary;
  return NULL;
}
static void *own(void *out) {
  CUcontext made = NULL, c = NULL;
  *(int *)out = cuCtxCreate(&made, NULL, 0, 0) == CUDA_SUCCESS && cuCtxGetCurrent(&c) == CUDA_SUCCESS &&
                c == made && made != primary && cuCtxDestroy(made) == CUDA_SUCCESS;
  return NULL;
}
static int on_thread(void *(*f)(void *)) {
  pthread_t t;
  int ok = 0;
  if (pthread_create(&t, NULL, f, &ok) || pthread_join(t, NULL)) return 0;
  return ok;
}
int main(void) {
  CHECK(cudaFree(0));
  CHECK(cuCtxGetCurrent(&primary));
  EXPECT(primary != NULL);
  EXPECT(on_thread(plain));
  EXPECT(on_thread(plain));
  /* A context of its own on another thread: the next fresh thread asks again. */
  EXPECT(on_thread(own));
  EXPECT(on_thread(plain));
  EXPECT(on_thread(plain));
  puts("OK");
  return 0;
}
"#;

#[test]
fn a_fresh_threads_current_context_is_the_primary_one_another_thread_was_told() {
    let server = server();
    let exe = program_with("thread-contexts", &format!("{CHECKS}{THREAD_CONTEXTS}"), &["-l:libcuda.so.1", "-lpthread"]);
    let (stdout, stderr) = run_traced(&server, &exe);
    assert!(stdout.contains("OK"), "{stdout}\n{stderr}");
    assert!(!stderr.contains("WARN"), "{stderr}");
    // Asked: the creating thread's and the first fresh thread's after it (the main
    // thread's was asked as the connection was made; the client asks itself too: the calls
    // are more than the program's six).
    assert_eq!(trace_row(&stderr, "cuCtxGetCurrent")[1], "2", "{stderr}");
}

/// What every program asks once (device 0's primary-context state, the current context,
/// the stream priorities) is asked as the connection is made, behind no call of the
/// program's: answered without waiting, and the same answers as asked later; after a
/// context call, the state and the context are asked again; the range never is.
const ASKED_AT_CONNECTION: &str = r#"
#include <cuda_runtime_api.h>
#include <cuda.h>
static void facts(const char *when) {
  int least = 7, greatest = 7, only = 7, active = 7;
  unsigned flags = 7;
  CUcontext c = NULL;
  int s1 = cudaDeviceGetStreamPriorityRange(&least, &greatest);
  int s2 = cudaDeviceGetStreamPriorityRange(NULL, &only);
  int s3 = cuDevicePrimaryCtxGetState(0, &flags, &active);
  int s4 = cuCtxGetCurrent(&c);
  printf("%s %d %d %d %d [%d %d %d] [%u %d] %d\n", when, s1, s2, s3, s4, least, greatest, only, flags, active, c != NULL);
}
int main(void) {
  CHECK(cuInit(0));
  facts("first");
  CUcontext made = NULL;
  CHECK(cuCtxCreate(&made, NULL, 0, 0));
  CHECK(cuCtxDestroy(made));
  facts("after");
  return 0;
}
"#;

#[test]
fn what_every_program_asks_once_is_asked_as_the_connection_is_made() {
    let server = server();
    let exe = program_with("asked-at-connection", &format!("{CHECKS}{ASKED_AT_CONNECTION}"), &["-l:libcuda.so.1"]);
    let (stdout, stderr) = run_traced(&server, &exe);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{stdout}\n{stderr}");
    let (first, after) = (lines[0].trim_start_matches("first "), lines[1].trim_start_matches("after "));
    assert!(first.starts_with("0 0 0 0 ["), "{stdout}\n{stderr}");
    let range: Vec<&str> = first.split(['[', ']']).nth(1).unwrap().split(' ').collect();
    assert_eq!(range[1], range[2], "the greatest priority alone is the pair's: {stdout}");
    // The context created and destroyed leaves the primary one current: the same answers.
    assert_eq!(first, after, "{stdout}\n{stderr}");
    assert!(!stderr.contains("WARN"), "{stderr}");
    assert_eq!(trace_row(&stderr, "cudaDeviceGetStreamPriorityRange"), ["4", "0"], "{stderr}");
    // The three answers are taken together, once: at most one round trip waited for them.
    let early = trace_row(&stderr, "(asked at connection)");
    assert!(early[0] == "1" && (early[1] == "0" || early[1] == "1"), "{stderr}");
    // After the context calls: asked again, each once (the client asks the state itself
    // too: more calls than the program's two).
    assert_eq!(trace_row(&stderr, "cuDevicePrimaryCtxGetState")[1], "1", "{stderr}");
    assert_eq!(trace_row(&stderr, "cuCtxGetCurrent")[1], "1", "{stderr}");
}

/// The driver API's equivalents: CUDA 13's context creation (the client's cached current
/// context follows), arrays with 2D copies between host memory, arrays and device memory,
/// texture objects, pools, pointer attributes from the interval map, graphs, stream
/// callbacks.
const DRIVER_API: &str = r#"
#include <cuda.h>
extern CUresult cuProfilerStart(void);
extern CUresult cuProfilerStop(void);
static volatile int called = 0;
static void CUDA_CB on_stream(CUstream s, CUresult status, void *user) { (void)s; (void)user; if (status == CUDA_SUCCESS) ++called; }
int main(void) {
  CHECK(cuInit(0));
  CUdevice dev;
  CHECK(cuDeviceGet(&dev, 0));
  CUcontext before = NULL, ctx = NULL, cur = NULL;
  CHECK(cuCtxGetCurrent(&before));
  CHECK(cuCtxCreate(&ctx, NULL, 0, dev));
  CHECK(cuCtxGetCurrent(&cur));
  EXPECT(cur == ctx && ctx != before);
  CHECK(cuProfilerStart());
  CHECK(cuProfilerStop());

  /* An array of 16 x 4 floats: host rows in through a staging buffer, out to device memory
     and back to host memory. */
  CUDA_ARRAY_DESCRIPTOR ad = {16, 4, CU_AD_FORMAT_FLOAT, 1};
  CUarray arr;
  CHECK(cuArrayCreate(&arr, &ad));
  CUDA_ARRAY_DESCRIPTOR got;
  CHECK(cuArrayGetDescriptor(&got, arr));
  EXPECT(got.Width == 16 && got.Height == 4 && got.Format == CU_AD_FORMAT_FLOAT);
  float host[4][20], back[4][16];
  for (int i = 0; i < 4; ++i) for (int j = 0; j < 20; ++j) host[i][j] = (float)(i * 100 + j);
  CUDA_MEMCPY2D m;
  memset(&m, 0, sizeof m);
  m.srcMemoryType = CU_MEMORYTYPE_HOST; m.srcHost = host; m.srcPitch = sizeof host[0]; m.srcXInBytes = 4 * 4;
  m.dstMemoryType = CU_MEMORYTYPE_ARRAY; m.dstArray = arr;
  m.WidthInBytes = 16 * 4; m.Height = 4;
  CHECK(cuMemcpy2D(&m));
  CUdeviceptr d;
  CHECK(cuMemAlloc(&d, sizeof back));
  memset(&m, 0, sizeof m);
  m.srcMemoryType = CU_MEMORYTYPE_ARRAY; m.srcArray = arr;
  m.dstMemoryType = CU_MEMORYTYPE_DEVICE; m.dstDevice = d; m.dstPitch = 16 * 4;
  m.WidthInBytes = 16 * 4; m.Height = 4;
  CHECK(cuMemcpy2D(&m));
  memset(back, 0, sizeof back);
  memset(&m, 0, sizeof m);
  m.srcMemoryType = CU_MEMORYTYPE_UNIFIED; m.srcDevice = d; m.srcPitch = 16 * 4;
  m.dstMemoryType = CU_MEMORYTYPE_UNIFIED; m.dstHost = back; m.dstPitch = sizeof back[0];
  m.WidthInBytes = 16 * 4; m.Height = 4;
  /* A unified side's address is its device field, as natively (the H200 answers this). */
  EXPECT(cuMemcpy2D(&m) == CUDA_ERROR_INVALID_VALUE);
  m.dstDevice = (CUdeviceptr)back;
  CHECK(cuMemcpy2D(&m));
  for (int i = 0; i < 4; ++i) for (int j = 0; j < 16; ++j) EXPECT(back[i][j] == host[i][j + 4]);
  float row[16];
  CHECK(cuMemcpyAtoH(row, arr, 16 * 4, sizeof row));
  EXPECT(row[0] == 104.0f);

  /* A texture object over the array, its handle checked by the worker. */
  CUDA_RESOURCE_DESC res, res2;
  memset(&res, 0, sizeof res);
  res.resType = CU_RESOURCE_TYPE_ARRAY;
  res.res.array.hArray = arr;
  CUDA_TEXTURE_DESC tex;
  memset(&tex, 0, sizeof tex);
  CUtexObject t;
  CHECK(cuTexObjectCreate(&t, &res, &tex, NULL));
  CHECK(cuTexObjectGetResourceDesc(&res2, t));
  EXPECT(res2.res.array.hArray == arr);
  CHECK(cuTexObjectDestroy(t));
  res.res.array.hArray = (CUarray)0x4321;
  EXPECT(cuTexObjectCreate(&t, &res, &tex, NULL) == CUDA_ERROR_INVALID_HANDLE);

  /* A pool allocation: pointer attributes and address ranges from the interval map. */
  CUmemoryPool pool;
  CUmemPoolProps props;
  memset(&props, 0, sizeof props);
  props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  CHECK(cuMemPoolCreate(&pool, &props));
  CUstream s;
  CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CUdeviceptr pm;
  CHECK(cuMemAllocFromPoolAsync(&pm, 4096, pool, s));
  CUpointer_attribute which[2] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_RANGE_SIZE};
  unsigned int memtype = 0;
  size_t range = 0;
  void *data[2] = {&memtype, &range};
  CHECK(cuPointerGetAttributes(2, which, data, pm + 100));
  EXPECT(memtype == CU_MEMORYTYPE_DEVICE && range == 4096);
  CUdeviceptr base;
  size_t size;
  CHECK(cuMemGetAddressRange(&base, &size, pm + 100));
  EXPECT(base == pm && size == 4096);
  CHECK(cuMemFreeAsync(pm, s));
  /* Freed in the stream's order: the interval map forgets it, and the driver knows no range. */
  CHECK(cuStreamSynchronize(s));
  EXPECT(cuMemGetAddressRange(&base, &size, pm + 100) != CUDA_SUCCESS);

  /* A graph: memset then a device-to-device copy node, replayed. */
  unsigned char bytes[64];
  CUgraph g;
  CUgraphNode set, cp, nodes[4];
  CHECK(cuGraphCreate(&g, 0));
  CUDA_MEMSET_NODE_PARAMS mp;
  memset(&mp, 0, sizeof mp);
  mp.dst = d; mp.value = 0x11; mp.elementSize = 1; mp.width = 64; mp.height = 1;
  CHECK(cuGraphAddMemsetNode(&set, g, NULL, 0, &mp, ctx));
  CUdeviceptr d2;
  CHECK(cuMemAlloc(&d2, 64));
  CUDA_MEMCPY3D c3;
  memset(&c3, 0, sizeof c3);
  /* Unified sides, as a statically linked runtime names them: device memory passes. */
  c3.srcMemoryType = CU_MEMORYTYPE_UNIFIED; c3.srcDevice = d; c3.srcPitch = 64;
  c3.dstMemoryType = CU_MEMORYTYPE_UNIFIED; c3.dstDevice = d2; c3.dstPitch = 64;
  c3.WidthInBytes = 64; c3.Height = 1; c3.Depth = 1;
  CHECK(cuGraphAddMemcpyNode(&cp, g, &set, 1, &c3, ctx));
  size_t n = 4;
  CHECK(cuGraphGetNodes(g, nodes, &n));
  EXPECT(n == 2 && nodes[0] == set && nodes[1] == cp);
  n = 4;
  CHECK(cuGraphNodeGetDependencies(cp, nodes, NULL, &n));
  EXPECT(n == 1 && nodes[0] == set);
  /* The program's own memory, named unified (out) and host (in): the graph replays on the
     server, which copies its mirror of that memory. */
  unsigned char in[64], out[64];
  for (int i = 0; i < 64; ++i) { in[i] = (unsigned char)(i + 1); out[i] = 0; }
  CUgraphNode out_node, in_node;
  c3.srcMemoryType = CU_MEMORYTYPE_DEVICE; c3.srcDevice = d2;
  c3.dstMemoryType = CU_MEMORYTYPE_UNIFIED; c3.dstDevice = (CUdeviceptr)out;
  CHECK(cuGraphAddMemcpyNode(&out_node, g, &cp, 1, &c3, ctx));
  c3.srcMemoryType = CU_MEMORYTYPE_HOST; c3.srcHost = in;
  c3.dstMemoryType = CU_MEMORYTYPE_DEVICE; c3.dstDevice = d2;
  CHECK(cuGraphAddMemcpyNode(&in_node, g, &out_node, 1, &c3, ctx));
  CUgraphExec x;
  CHECK(cuGraphInstantiate(&x, g, 0));
  CHECK(cuGraphLaunch(x, s));
  CHECK(cuStreamAddCallback(s, on_stream, NULL, 0));
  CHECK(cuStreamSynchronize(s));
  EXPECT(called == 1);
  for (int i = 0; i < 64; ++i) EXPECT(out[i] == 0x11);
  CHECK(cuMemcpyDtoH(bytes, d2, 64));
  for (int i = 0; i < 64; ++i) EXPECT(bytes[i] == i + 1);
  /* The instance's input node set to another host buffer; the graph's own too. */
  unsigned char in2[64];
  for (int i = 0; i < 64; ++i) in2[i] = (unsigned char)(200 - i);
  c3.srcHost = in2;
  CHECK(cuGraphExecMemcpyNodeSetParams(x, in_node, &c3, ctx));
  CHECK(cuGraphLaunch(x, s));
  CHECK(cuStreamSynchronize(s));
  CHECK(cuMemcpyDtoH(bytes, d2, 64));
  for (int i = 0; i < 64; ++i) EXPECT(bytes[i] == 200 - i);
  CHECK(cuGraphMemcpyNodeSetParams(in_node, &c3));
  CHECK(cuGraphExecDestroy(x));
  /* A batch of copies of the program's memory in, on a stream (unified addressing names
     the sides), and an asynchronous 2D copy of it out. */
  CUdeviceptr bd[2] = { d2, d2 + 32 }, bs[2] = { (CUdeviceptr)in, (CUdeviceptr)in2 };
  size_t bsz[2] = { 32, 32 }, bidx = 0;
  CUmemcpyAttributes battr;
  memset(&battr, 0, sizeof battr);
  battr.srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
  CHECK(cuMemcpyBatchAsync(bd, bs, bsz, 2, &battr, &bidx, 1, s));
  CUDA_MEMCPY2D c2;
  memset(&c2, 0, sizeof c2);
  c2.srcMemoryType = CU_MEMORYTYPE_DEVICE; c2.srcDevice = d2; c2.srcPitch = 32;
  c2.dstMemoryType = CU_MEMORYTYPE_HOST; c2.dstHost = bytes; c2.dstPitch = 32;
  c2.WidthInBytes = 32; c2.Height = 2;
  memset(bytes, 0, sizeof bytes);
  CHECK(cuMemcpy2DAsync(&c2, s));
  CHECK(cuStreamSynchronize(s));
  for (int i = 0; i < 32; ++i) EXPECT(bytes[i] == in[i] && bytes[32 + i] == in2[i]);
  CHECK(cuGraphDestroy(g));

  /* A batch memory operation node writes two words when its graph runs; the node keeps its
     own copy of the operations, which GetParams shows; an instance's node set anew; a word
     not of the session refused; the same node through cuGraphAddNode after it. */
  CUstreamBatchMemOpParams ops[2];
  memset(ops, 0, sizeof ops);
  ops[0].writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_32;
  ops[0].writeValue.address = d2; ops[0].writeValue.value = 0xdeadbeefu;
  ops[1].writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_64;
  ops[1].writeValue.address = d2 + 8; ops[1].writeValue.value64 = 0x0123456789abcdefull;
  CUDA_BATCH_MEM_OP_NODE_PARAMS bp, bgot;
  memset(&bp, 0, sizeof bp);
  bp.ctx = ctx; bp.count = 2; bp.paramArray = ops;
  CUgraph gb;
  CUgraphNode bn, bn2;
  CHECK(cuGraphCreate(&gb, 0));
  CHECK(cuGraphAddBatchMemOpNode(&bn, gb, NULL, 0, &bp));
  ops[0].writeValue.value = 7;
  CHECK(cuGraphBatchMemOpNodeGetParams(bn, &bgot));
  EXPECT(bgot.ctx == ctx && bgot.count == 2 && bgot.paramArray != ops);
  EXPECT(bgot.paramArray[0].writeValue.value == 0xdeadbeefu);
  EXPECT(bgot.paramArray[1].writeValue.value64 == 0x0123456789abcdefull);
  CUgraphExec xb;
  CHECK(cuGraphInstantiate(&xb, gb, 0));
  CHECK(cuGraphLaunch(xb, s));
  CHECK(cuStreamSynchronize(s));
  unsigned int w32 = 0;
  unsigned long long w64 = 0;
  CHECK(cuMemcpyDtoH(&w32, d2, 4));
  CHECK(cuMemcpyDtoH(&w64, d2 + 8, 8));
  EXPECT(w32 == 0xdeadbeefu && w64 == 0x0123456789abcdefull);
  CHECK(cuGraphExecBatchMemOpNodeSetParams(xb, bn, &bp));
  CHECK(cuGraphLaunch(xb, s));
  CHECK(cuStreamSynchronize(s));
  CHECK(cuMemcpyDtoH(&w32, d2, 4));
  EXPECT(w32 == 7);
  CHECK(cuGraphBatchMemOpNodeGetParams(bn, &bgot));
  EXPECT(bgot.paramArray[0].writeValue.value == 0xdeadbeefu);
  ops[0].writeValue.address = 0x1000;
  EXPECT(cuGraphBatchMemOpNodeSetParams(bn, &bp) == CUDA_ERROR_INVALID_VALUE);
  ops[0].writeValue.address = d2 + 16; ops[0].writeValue.value = 99;
  CUgraphNodeParams np;
  memset(&np, 0, sizeof np);
  np.type = CU_GRAPH_NODE_TYPE_BATCH_MEM_OP;
  np.memOp.ctx = bp.ctx; np.memOp.count = bp.count; np.memOp.paramArray = bp.paramArray;
  CHECK(cuGraphAddNode(&bn2, gb, &bn, NULL, 1, &np));
  CUgraphNodeType bt;
  CHECK(cuGraphNodeGetType(bn2, &bt));
  EXPECT(bt == CU_GRAPH_NODE_TYPE_BATCH_MEM_OP);
  CHECK(cuGraphExecDestroy(xb));
  CHECK(cuGraphInstantiate(&xb, gb, 0));
  CHECK(cuGraphLaunch(xb, s));
  CHECK(cuStreamSynchronize(s));
  CHECK(cuMemcpyDtoH(&w32, d2 + 16, 4));
  EXPECT(w32 == 99);
  CHECK(cuGraphExecDestroy(xb));
  CHECK(cuGraphDestroy(gb));

  /* The linker's state lives on the client; the emulated server has no linker to finish. */
  CUlinkState link;
  char info[256], error[256];
  CUjit_option keys[4] = {CU_JIT_INFO_LOG_BUFFER, CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES, CU_JIT_ERROR_LOG_BUFFER,
                          CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
  void *values[4] = {info, (void *)sizeof info, error, (void *)sizeof error};
  CHECK(cuLinkCreate(4, keys, values, &link));
  static const char ptx[] = ".version 8.0\n.target sm_90\n.address_size 64\n";
  CHECK(cuLinkAddData(link, CU_JIT_INPUT_PTX, (void *)ptx, sizeof ptx, "empty.ptx", 0, NULL, NULL));
  void *cubin;
  size_t cubin_size;
  EXPECT(cuLinkComplete(link, &cubin, &cubin_size) == CUDA_ERROR_NOT_SUPPORTED);
  CHECK(cuLinkDestroy(link));
  EXPECT(cuLinkDestroy(link) == CUDA_ERROR_INVALID_HANDLE);
  CHECK(cuCtxDestroy(ctx));
  printf("OK\n");
  return 0;
}
"#;

#[test]
fn driver_api_contexts_arrays_pools_and_graphs_on_the_emulated_gpu() {
    let server = server();
    let exe = program_with("driver-api", &format!("{CHECKS}{DRIVER_API}"), &["-l:libcuda.so.1"]);
    let (stdout, stderr) = run_traced(&server, &exe);
    assert!(stdout.contains("OK"), "{stdout}\n{stderr}");
    assert_eq!(trace_row(&stderr, "cuPointerGetAttributes")[1], "0", "{stderr}");
}

/// The CUDA suite's programs of issue 20 keep their host code in plain C++: it must compile
/// against the 13.0 headers here, so that the GPU round (which builds with nvcc) finds no
/// surprise in it.
#[test]
fn cuda_suite_host_code_compiles_against_the_headers() {
    let include = chidori_tests::runtime_headers("13.0");
    let script = chidori_tests::root().join("gpu/cuda-suite/check.sh");
    let out = Command::new("bash").arg(&script).arg(&include).output().expect("running check.sh");
    assert!(out.status.success(), "{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
}

/// Uploads 24 MiB (a "checkpoint" made from the seed in argv[1]) in one cudaMemcpy and
/// 8 MiB with cudaMemcpyAsync, reads it all back and compares.
const UPLOAD: &str = r#"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cuda_runtime.h>
int main(int argc, char **argv) {
  unsigned long long x = strtoull(argc > 1 ? argv[1] : "1", NULL, 10) * 0x9E3779B97F4A7C15ull + 1;
  size_t n = 24u << 20, m = 8u << 20;
  unsigned char *host = malloc(n), *back = malloc(n);
  for (size_t i = 0; i < n; i += 8) {
    x ^= x << 13; x ^= x >> 7; x ^= x << 17;
    memcpy(host + i, &x, 8);
  }
  void *dev, *dev2;
  if (cudaMalloc(&dev, n) || cudaMalloc(&dev2, m)) { printf("FAIL malloc\n"); return 1; }
  if (cudaMemcpy(dev, host, n, cudaMemcpyHostToDevice)) { printf("FAIL h2d\n"); return 1; }
  if (cudaMemcpyAsync(dev2, host + m, m, cudaMemcpyHostToDevice, 0)) { printf("FAIL h2d async\n"); return 1; }
  if (cudaMemcpy(back, dev, n, cudaMemcpyDeviceToHost)) { printf("FAIL d2h\n"); return 1; }
  if (memcmp(back, host, n)) { printf("FAIL different bytes\n"); return 1; }
  if (cudaMemcpy(back, dev2, m, cudaMemcpyDeviceToHost) || memcmp(back, host + m, m)) { printf("FAIL async\n"); return 1; }
  printf("OK\n");
  return 0;
}
"#;

/// Bytes the client sent for `function` (the trace table's fourth column).
fn bytes_sent(stderr: &str, function: &str) -> u64 {
    let line = stderr.lines().find(|l| l.split_whitespace().next() == Some(function)).unwrap_or("");
    line.split_whitespace().nth(3).and_then(|b| b.parse().ok()).unwrap_or_else(|| panic!("no {function} row: {stderr}"))
}

/// Issue 19, item 4: a program run again sends the hashes of the large uploads the server
/// kept, not their bytes, and its device memory holds the same bytes; new content still
/// travels whole.
#[test]
fn a_second_run_sends_large_uploads_by_content() {
    let dir = chidori_tests::scratch("content-store");
    let store = dir.join("store");
    let server = EmulatedServer::start_args(
        &chidori(),
        Some(&profile()),
        &["--content-cache", store.to_str().unwrap(), "--content-cache-mb", "256"],
    )
    .expect("starting an emulated server");
    let exe = program("upload", UPLOAD);
    let run = |seed: &str| {
        let mut cmd = Command::new(chidori());
        cmd.args(["run", "--trace", "-s", &server.address, "--lib-dir"])
            .arg(chidori_tests::shim_dir())
            .arg("--")
            .arg(&exe)
            .arg(seed)
            .env("CHIDORI_CONTENT", "1")
            .env("XDG_CACHE_HOME", dir.join("client"));
        let out = cmd.output().unwrap();
        let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success() && stdout.contains("OK"), "{stdout}\n{stderr}");
        bytes_sent(&stderr, "cudaMemcpy") + bytes_sent(&stderr, "cudaMemcpyAsync")
    };
    let chunks = |dir: &Path| {
        let names: Vec<std::ffi::OsString> =
            std::fs::read_dir(dir).map(|d| d.flatten().map(|e| e.file_name()).collect()).unwrap_or_default();
        names.iter().filter(|n| !n.to_string_lossy().starts_with('.')).count()
    };
    let first = run("7");
    assert!(first >= 32 << 20, "the first run sends every byte: {first}");
    // The server adds the chunks in the background: wait until the 24 MiB (3 chunks of
    // 8 MiB) and the 8 MiB (the same bytes as the second chunk) are in.
    let until = Instant::now() + Duration::from_secs(20);
    while chunks(&store) < 3 && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(chunks(&store), 3, "distinct chunks kept: {:?}", std::fs::read_dir(&store).map(|d| d.count()));
    let second = run("7");
    assert!(second * 100 <= first, "the second run sends {second} bytes of {first}: more than 1%");
    eprintln!("upload bytes sent: first run {first}, second run {second}");
    let other = run("8");
    assert!(other >= 32 << 20, "new content travels whole: {other}");
}

/// The round trips and bytes of the trace's "(module load)" row (0, 0 without one).
fn module_load_row(stderr: &str) -> (u64, u64) {
    let Some(line) = stderr.lines().find(|l| l.starts_with("(module load)")) else { return (0, 0) };
    let cols: Vec<u64> = line["(module load)".len()..].split_whitespace().filter_map(|c| c.parse().ok()).collect();
    (cols.get(1).copied().unwrap_or(0), cols.get(2).copied().unwrap_or(0))
}

/// A program that registers `copies` fat binaries the way nvcc's constructors do (each a
/// copy of one with two kernels) and asks for one kernel's attributes in each: every
/// module is loaded on first use.
fn registering_program(copies: usize) -> String {
    registering_program_of(copies, false)
}

/// [`registering_program`] whose copies are distinct images (`distinct`): each has one of
/// the PTX entry's leading newlines made a space (the cubin, which the emulated backend
/// reads, stays the same).
fn registering_program_of(copies: usize, distinct: bool) -> String {
    let path = chidori_tests::root().join("tests/fixtures/fatbin/k_multi.fatbin");
    let original = std::fs::read(path).unwrap();
    let ptx = original.windows(8).position(|w| w == b"\n\n\n\n\n\n\n\n").expect("the PTX entry's leading newlines");
    assert!(copies <= 8);
    let image = |i: usize| {
        let mut bytes = original.clone();
        if distinct {
            bytes[ptx + i] = b' ';
        }
        bytes.iter().map(|b| b.to_string()).collect::<Vec<_>>().join(",")
    };
    let mut c = String::from(
        "#include <stdio.h>\n#include <cuda_runtime_api.h>\n\
         typedef struct { int magic; int version; const void *data; void *filename_or_fatbins; } wrapper_t;\n\
         extern void **__cudaRegisterFatBinary(void *);\n\
         extern void __cudaRegisterFatBinaryEnd(void **);\n\
         extern void __cudaRegisterFunction(void **, const char *, char *, const char *, int, void *, void *, void *, void *, int *);\n",
    );
    for i in 0..copies {
        c += &format!(
            "static const unsigned char fb{i}[] __attribute__((aligned(16))) = {{{}}};\n\
             static wrapper_t w{i} = {{0x466243b1, 1, fb{i}, 0}};\n\
             static void host{i}(void) {{}}\n",
            image(i)
        );
    }
    c += "int main(void) {\n  struct cudaFuncAttributes attr;\n";
    for i in 0..copies {
        c += &format!(
            "  void **h{i} = __cudaRegisterFatBinary(&w{i});\n  \
             __cudaRegisterFunction(h{i}, (const char *)host{i}, \"_Z5otherPf\", \"_Z5otherPf\", -1, 0, 0, 0, 0, 0);\n  \
             __cudaRegisterFatBinaryEnd(h{i});\n"
        );
    }
    for i in 0..copies {
        c += &format!("  printf(\"%d \", (int)cudaFuncGetAttributes(&attr, (const void *)host{i}));\n");
    }
    c += "  printf(\"\\n\");\n  return 0;\n}\n";
    c
}

/// [`registering_program`] of one image, open for more of `main` (its kernel `host0`, a
/// `struct cudaFuncAttributes attr`): with its attributes asked first where `asked`.
fn registering_program_body(asked: bool) -> String {
    let mut source = registering_program(1);
    let mut cut = |tail: &str| {
        assert!(source.ends_with(tail), "{source}");
        source.truncate(source.len() - tail.len());
    };
    cut("  printf(\"\\n\");\n  return 0;\n}\n");
    if !asked {
        cut("  printf(\"%d \", (int)cudaFuncGetAttributes(&attr, (const void *)host0));\n");
    }
    source
}

/// Occupancy answers are kept per function, block size, shared memory and flags, and
/// forgotten when the program sets the function's attributes or cache preference (which
/// change how many blocks fit): asked again then. Those asked before any such change are
/// learned for the next process.
#[test]
fn occupancy_is_learned_and_asked_again_after_the_function_changes() {
    let mut source = registering_program_body(true);
    source += "  int n = 0;\n\
               #define OCC() { int s = (int)cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, (const void *)host0, 128, 64 << 10); printf(\"%d:%d \", s, n); }\n\
               OCC(); OCC();\n\
               printf(\"%d \", (int)cudaFuncSetAttribute((const void *)host0, cudaFuncAttributePreferredSharedMemoryCarveout, 50));\n\
               OCC(); OCC();\n\
               printf(\"%d \", (int)cudaFuncSetCacheConfig((const void *)host0, cudaFuncCachePreferShared));\n\
               OCC();\n\
               printf(\"\\n\");\n  return 0;\n}\n";
    let server = server();
    let exe = program("occupancy_again", &source);
    let cache = chidori_tests::scratch("occupancy-cache");
    let _ = std::fs::remove_dir_all(&cache);
    let (stdout, stderr) = run_learning(&server, &exe, &cache, &[]);
    // 64 KiB of shared memory a block: 3 fit in 228 KiB, 1 in half of it (the carveout).
    assert_eq!(stdout.trim(), "0 0:3 0:3 0 0:1 0:1 0 0:1", "{stderr}");
    // Asked first, after the attribute and after the cache preference.
    let row = "cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags";
    assert_eq!(trace_row(&stderr, row), ["3", "3"], "{stderr}");
    // The next process: the first answer is the one learned (checked when the server's
    // comes); what follows the changes is asked again.
    let (second, stderr) = run_learning(&server, &exe, &cache, &[]);
    assert_eq!(second, stdout, "{stderr}");
    assert_eq!(trace_row(&stderr, row), ["3", "2"], "{stderr}");
}

/// Issue 19: a function's attributes asked together (cudaFuncGetAttributes) after the
/// program set one of them: the one set is the value it set, the others an earlier
/// process learned, so a later process asks nothing and waits for nothing.
#[test]
fn attributes_asked_together_after_one_was_set_come_from_the_set_and_the_learned() {
    // Nothing asked before the attribute is set.
    let mut source = registering_program_body(false);
    source += "  int s = (int)cudaFuncSetAttribute((const void *)host0, cudaFuncAttributeMaxDynamicSharedMemorySize, 100000);\n\
               int t = (int)cudaFuncGetAttributes(&attr, (const void *)host0);\n\
               printf(\"%d %d %d %d %zu\\n\", s, t, attr.maxDynamicSharedSizeBytes, attr.maxThreadsPerBlock, attr.sharedSizeBytes);\n\
               return 0;\n}\n";
    let server = server();
    let exe = program("attributes_after_set", &source);
    let cache = chidori_tests::scratch("attributes-after-set-cache");
    let _ = std::fs::remove_dir_all(&cache);
    let (first, stderr) = run_learning(&server, &exe, &cache, &[]);
    assert_eq!(first.trim(), "0 0 100000 1024 0", "{stderr}");
    let asked_first: u32 = trace_row(&stderr, "cuFuncGetAttribute")[1].parse().unwrap();
    assert!(asked_first > 0, "the first process asks: {stderr}");
    let (second, stderr) = run_learning(&server, &exe, &cache, &[]);
    assert_eq!(second, first, "{stderr}");
    assert_eq!(trace_row(&stderr, "cuFuncGetAttribute")[1], "0", "set and learned: {stderr}");
    assert!(!stderr.contains("answered differently"), "{stderr}");
}

/// An NVML record that says its size in its version word, of an older NVML (v2, 36 bytes;
/// the newest headers' is 40) ending where memory ends: only its own bytes go and come back.
#[test]
fn an_older_nvml_record_is_read_and_written_only_as_far_as_its_version_says() {
    let source = r#"
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
extern int nvmlInit_v2(void);
extern int nvmlDeviceGetHandleByIndex_v2(unsigned int, void **);
extern int nvmlDeviceGetGpuFabricInfoV(void *, void *);
int main(void) {
  void *dev;
  if (nvmlInit_v2() || nvmlDeviceGetHandleByIndex_v2(0, &dev)) { printf("init\n"); return 1; }
  long page = sysconf(_SC_PAGESIZE);
  unsigned char *pages = mmap(NULL, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (pages == MAP_FAILED || mprotect(pages + page, page, PROT_NONE)) { printf("mmap\n"); return 1; }
  unsigned char *info = pages + page - 36;
  memset(info, 0, 36);
  unsigned version = 36u | (2u << 24); /* NVML_STRUCT_VERSION(GpuFabricInfo, 2) */
  memcpy(info, &version, 4);
  int status = nvmlDeviceGetGpuFabricInfoV(dev, info);
  int filled = 1;
  for (int i = 4; i < 36; ++i) filled &= info[i] == 0x11;
  printf("%d %d\n", status, filled);
  return 0;
}
"#;
    let server = server();
    let exe = program_with("nvml_versioned", source, &["-l:libnvidia-ml.so.1"]);
    let out = run_cmd(&server.address, &exe).output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && stdout.trim() == "0 1", "{stdout}\n{stderr}");
}

/// Issue 19: versions and properties (the specs' `constant`) are asked once per process,
/// and a later process on the same server is given what the first was, the call still sent
/// without waiting and its answer checked.
#[test]
fn constants_learned_by_one_process_answer_the_next() {
    let source = r#"
#include <stdio.h>
extern int nvmlInit_v2(void);
extern int nvmlSystemGetDriverVersion(char *, unsigned int);
extern int nvmlSystemGetNVMLVersion(char *, unsigned int);
int main(void) {
  char a[80] = {0}, b[80] = {0}, c[80] = {0};
  if (nvmlInit_v2()) { printf("init\n"); return 1; }
  int s1 = nvmlSystemGetDriverVersion(a, sizeof a);
  int s2 = nvmlSystemGetDriverVersion(b, sizeof b);
  int s3 = nvmlSystemGetNVMLVersion(c, sizeof c);
  printf("%d %d %d [%s] [%s] [%s]\n", s1, s2, s3, a, b, c);
  return 0;
}
"#;
    let server = server();
    let exe = program_with("constants_learned", source, &["-l:libnvidia-ml.so.1"]);
    let cache = chidori_tests::scratch("constants-cache");
    let _ = std::fs::remove_dir_all(&cache);
    let (first, stderr) = run_learning(&server, &exe, &cache, &[]);
    assert!(first.starts_with("0 0 0 [") && !first.contains("[]"), "{first} {stderr}");
    assert_eq!(trace_row(&stderr, "nvmlSystemGetDriverVersion"), ["2", "1"], "asked once: {stderr}");
    assert_eq!(trace_row(&stderr, "nvmlSystemGetNVMLVersion"), ["1", "1"], "{stderr}");
    let (second, stderr) = run_learning(&server, &exe, &cache, &[]);
    assert_eq!(second, first, "{stderr}");
    assert_eq!(trace_row(&stderr, "nvmlSystemGetDriverVersion"), ["2", "0"], "given as learned: {stderr}");
    assert_eq!(trace_row(&stderr, "nvmlSystemGetNVMLVersion"), ["1", "0"], "{stderr}");
    assert!(!stderr.contains("differs"), "the server's answers were the learned ones: {stderr}");
    // cuDNN's version (a value, not a status): once a process, then learned likewise.
    let exe = cudnn_program(
        "cudnn_version_learned",
        "#include <stdio.h>\n#include <stddef.h>\nsize_t cudnnGetVersion(void);\n\
         int main(void) { size_t a = cudnnGetVersion(), b = cudnnGetVersion(); printf(\"%zu %zu\\n\", a, b); return 0; }\n",
    );
    let (versions, stderr) = run_learning(&server, &exe, &cache, &[]);
    let v: Vec<&str> = versions.split_whitespace().collect();
    assert!(v.len() == 2 && v[0] == v[1] && v[0] != "0", "{versions} {stderr}");
    assert_eq!(trace_row(&stderr, "cudnnGetVersion"), ["2", "1"], "{stderr}");
    let (again, stderr) = run_learning(&server, &exe, &cache, &[]);
    assert_eq!(again, versions, "{stderr}");
    assert_eq!(trace_row(&stderr, "cudnnGetVersion"), ["2", "0"], "{stderr}");
    // NVRTC's version (torch's jiterator asks before its first compile): likewise.
    let nvrtc = "#include <stdio.h>\nint nvrtcVersion(int *, int *);\n\
                 int main(void) { int a = 0, b = 0, c = 0, d = 0; int s = nvrtcVersion(&a, &b) | nvrtcVersion(&c, &d);\n\
                 printf(\"%d %d.%d %d.%d\\n\", s, a, b, c, d); return 0; }\n";
    let exe = program_with("nvrtc_version_learned", nvrtc, &["-l:libnvrtc.so.13"]);
    let (version, stderr) = run_learning(&server, &exe, &cache, &[]);
    assert_eq!(version.trim(), "0 13.0 13.0", "{stderr}");
    assert_eq!(trace_row(&stderr, "nvrtcVersion"), ["2", "1"], "{stderr}");
    let (again, stderr) = run_learning(&server, &exe, &cache, &[]);
    assert_eq!(again, version, "{stderr}");
    assert_eq!(trace_row(&stderr, "nvrtcVersion"), ["2", "0"], "{stderr}");
    // Asked for another length: not what was learned, so asked.
    let other = source.replace("sizeof b", "40");
    let exe = program_with("constants_other_length", &other, &["-l:libnvidia-ml.so.1"]);
    let (third, stderr) = run_learning(&server, &exe, &cache, &[]);
    assert_eq!(third, first, "{stderr}");
    assert_eq!(trace_row(&stderr, "nvmlSystemGetDriverVersion"), ["2", "1"], "{stderr}");
}

/// Issue 19: in the next run, the modules the last one loaded that the server holds are
/// loaded behind the program's calls, on a thread of the worker's own: asked with the first
/// load, each taken when the program first uses it, no image sent again; the same answers.
#[test]
fn modules_the_last_run_loaded_are_loaded_behind_the_calls() {
    let dir = chidori_tests::scratch("modules-behind");
    let cache = dir.join("module-cache");
    let server = EmulatedServer::start_args(&chidori(), Some(&profile()), &["--module-cache", cache.to_str().unwrap()])
        .expect("starting an emulated server");
    let exe = program("register_distinct_modules", &registering_program_of(4, true));
    let client_cache = dir.join("client-cache");
    let _ = std::fs::remove_dir_all(&client_cache);
    let log = ("CHIDORI_LOG", "warn,chidori::modules=debug");
    // Without names (those are tested by `modules_an_earlier_load_listed_are_loaded_without_waiting`).
    let unnamed = ("CHIDORI_MODULES_NAMED", "0");
    let (first, stderr) = run_learning(&server, &exe, &client_cache, &[log, unnamed]);
    let (trips, bytes) = module_load_row(&stderr);
    assert!(trips == 4 && bytes > 0, "four distinct images, each sent on first use: {stderr}");
    let (second, stderr) = run_learning(&server, &exe, &client_cache, &[log, unnamed]);
    assert_eq!(second, first, "the program sees the same answers: {stderr}");
    assert!(first.split_whitespace().all(|s| s == "0") && first.split_whitespace().count() == 4, "{first}");
    assert!(stderr.contains("0 named, 0 with the first load, 3 behind it"), "{stderr}");
    let row = trace_row(&stderr, "(module load)");
    // The first load, then each taken: a wait only where its answer had not come yet.
    assert_eq!(row[0], "4", "{stderr}");
    assert!((1..=4).contains(&row[1].parse::<u32>().unwrap()), "{stderr}");
    assert_eq!(module_load_row(&stderr).1, 0, "the server holds every image: {stderr}");
}

/// Issue 19: the first module load of a process also loads, in the same round trip, the
/// modules the last run of the same command loaded; a run with it turned off loads each
/// module as the program first uses it, and the program sees the same answers.
#[test]
fn modules_the_last_run_loaded_go_with_the_first_load() {
    let dir = chidori_tests::scratch("modules-ahead");
    let cache = dir.join("module-cache");
    let server = EmulatedServer::start_args(&chidori(), Some(&profile()), &["--module-cache", cache.to_str().unwrap()])
        .expect("starting an emulated server");
    let exe = program("register_modules", &registering_program(4));
    let client_cache = dir.join("client-cache");
    let _ = std::fs::remove_dir_all(&client_cache);
    let run = |ahead: bool| {
        let envs = [
            ("CHIDORI_MODULES_AHEAD", if ahead { "1" } else { "0" }),
            ("CHIDORI_MODULES_NAMED", "0"),
            ("CHIDORI_LOG", "warn,chidori::modules=debug"),
        ];
        let (stdout, stderr) = run_learning(&server, &exe, &client_cache, &envs);
        (stdout, module_load_row(&stderr), stderr)
    };
    let (first, (first_trips, first_bytes), stderr) = run(true);
    assert_eq!(first_trips, 4, "one load per module on a first run: {stderr}");
    assert!(first_bytes > 0, "a fresh server is sent the image: {stderr}");
    let (second, (second_trips, second_bytes), stderr) = run(true);
    // The other three are asked with the first load; the worker loads them behind it, and a
    // later load waits only where its answer has not come yet (on a busy machine, some do).
    assert!(stderr.contains("0 named, 0 with the first load, 3 behind it"), "{stderr}");
    assert!((1..=4).contains(&second_trips), "{stderr}");
    assert_eq!(second_bytes, 0, "the server holds the image: {stderr}");
    assert_eq!(second, first, "the program sees the same answers");
    assert!(
        first.split_whitespace().all(|s| s == "0") && !first.trim().is_empty(),
        "every kernel's attributes: {first}"
    );
    let (off, (off_trips, _), stderr) = run(false);
    assert_eq!(off_trips, 4, "turned off, each module is loaded on first use: {stderr}");
    assert_eq!(off, first);
}

/// Issue 19: a module whose kernels an earlier load of the same image listed is loaded
/// under names the client gives, without waiting: the next process waits no round trip for
/// its modules (the worker loads them behind the calls, and a call that uses one waits
/// there). An image the server's module cache has lost is asked of the client and kept
/// again; the program sees the same answers every time.
#[test]
fn modules_an_earlier_load_listed_are_loaded_without_waiting() {
    let dir = chidori_tests::scratch("modules-named");
    let cache = dir.join("module-cache");
    let server = EmulatedServer::start_args(&chidori(), Some(&profile()), &["--module-cache", cache.to_str().unwrap()])
        .expect("starting an emulated server");
    let exe = program("register_named_modules", &registering_program_of(4, true));
    let client_cache = dir.join("client-cache");
    let _ = std::fs::remove_dir_all(&client_cache);
    let run = |ahead: &str| run_learning(&server, &exe, &client_cache, &[("CHIDORI_MODULES_AHEAD", ahead)]);
    let (first, stderr) = run("0");
    assert_eq!(module_load_row(&stderr).0, 4, "each image loaded on first use: {stderr}");
    assert!(first.split_whitespace().all(|s| s == "0") && first.split_whitespace().count() == 4, "{first}");
    let named = |stderr: &str| trace_row(stderr, "(module load, named)");
    for ahead in ["0", "1"] {
        let (again, stderr) = run(ahead);
        assert_eq!(again, first, "the same answers: {stderr}");
        assert_eq!(module_load_row(&stderr), (0, 0), "no module load waited (ahead {ahead}): {stderr}");
        assert_eq!(named(&stderr), ["4", "0"], "{stderr}");
    }
    // The server's cache lost every image: the worker asks the client for each.
    std::fs::remove_dir_all(&cache).unwrap();
    let (again, stderr) = run("0");
    assert_eq!(again, first, "{stderr}");
    assert_eq!(module_load_row(&stderr), (0, 0), "{stderr}");
    let kept = std::fs::read_dir(&cache)
        .map(|d| d.flatten().filter(|e| !e.file_name().to_string_lossy().starts_with('.')).count());
    assert_eq!(kept.unwrap_or(0), 4, "the images the client sent are cached again");
    // Turned off: loaded as on a first run, each waiting (the server holds them).
    let (off, stderr) =
        run_learning(&server, &exe, &client_cache, &[("CHIDORI_MODULES_AHEAD", "0"), ("CHIDORI_MODULES_NAMED", "0")]);
    assert_eq!(off, first);
    assert_eq!(module_load_row(&stderr), (4, 0), "{stderr}");
}

/// A `__managed__` variable as nvcc's code uses it: `__cudaInitModule` points the host's
/// pointer at the variable (its device address, with its contents), the host's writes reach
/// the server before the GPU works on it, and the GPU's come back at the synchronization.
#[test]
fn managed_variables_are_one_memory_for_the_host_and_the_gpu() {
    let path = chidori_tests::root().join("tests/fixtures/fatbin/k_multi.fatbin");
    let bytes: Vec<String> = std::fs::read(path).unwrap().iter().map(|b| b.to_string()).collect();
    let source = format!(
        "#include <stdio.h>\n#include <cuda_runtime_api.h>\n\
         typedef struct {{ int magic; int version; const void *data; void *filename_or_fatbins; }} wrapper_t;\n\
         extern void **__cudaRegisterFatBinary(void *);\n\
         extern void __cudaRegisterFatBinaryEnd(void **);\n\
         extern void __cudaRegisterManagedVar(void **, void **, char *, const char *, int, size_t, int, int);\n\
         extern char __cudaInitModule(void **);\n\
         static const unsigned char fb[] __attribute__((aligned(16))) = {{{}}};\n\
         static wrapper_t w = {{0x466243b1, 1, fb, 0}};\n\
         static int *counter;\n\
         int main(void) {{\n\
           void **h = __cudaRegisterFatBinary(&w);\n\
           __cudaRegisterManagedVar(h, (void **)&counter, \"counter\", \"counter\", 0, sizeof(int), 0, 0);\n\
           __cudaRegisterFatBinaryEnd(h);\n\
           if (__cudaInitModule(h) != 1 || !counter) {{ printf(\"init failed\\n\"); return 1; }}\n\
           if (*counter != 0) {{ printf(\"initial %d\\n\", *counter); return 2; }}\n\
           *counter = 42;\n\
           /* The GPU sets the upper two bytes: the host's 42 must have reached it first. */\n\
           if (cudaMemset((char *)counter + 2, 7, 2) || cudaDeviceSynchronize()) return 3;\n\
           if (*counter != 0x0707002a) {{ printf(\"after the GPU %#x\\n\", *counter); return 4; }}\n\
           int *again = counter;\n\
           if (__cudaInitModule(h) != 1 || counter != again || *counter != 0x0707002a) return 5;\n\
           printf(\"OK %p\\n\", (void *)counter);\n\
           return 0;\n\
         }}\n",
        bytes.join(",")
    );
    let server = server();
    let exe = program("managed_variable", &source);
    let (stdout, stderr) = run_traced(&server, &exe);
    assert!(stdout.starts_with("OK 0x7e"), "the variable is at its device address: {stdout}\n{stderr}");
    assert!(!stderr.contains("WARN") && !stderr.contains("ERROR"), "{stderr}");
}

/// The same through the driver, as a runtime linked into the program reaches a `__managed__`
/// variable: `cuLibraryGetManaged`'s address is the program's memory, with the variable's
/// contents, one memory with the GPU's. `cuLibraryGetGlobal` with both outputs NULL is the
/// driver's invalid value (a NULL output stays NULL: spec `out?`).
#[test]
fn managed_variables_asked_of_the_driver_are_program_memory() {
    let path = chidori_tests::root().join("tests/fixtures/fatbin/k_multi.fatbin");
    let bytes: Vec<String> = std::fs::read(path).unwrap().iter().map(|b| b.to_string()).collect();
    let source = format!(
        "#include <stdio.h>\n#include <cuda.h>\n\
         static const unsigned char fb[] __attribute__((aligned(16))) = {{{}}};\n\
         int main(void) {{\n\
           CUdevice dev; CUcontext ctx; CUlibrary lib; CUdeviceptr p = 0; size_t n = 0;\n\
           if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) || cuCtxSetCurrent(ctx)) return 1;\n\
           if (cuLibraryLoadData(&lib, fb, 0, 0, 0, 0, 0, 0)) return 2;\n\
           if (cuLibraryGetManaged(&p, &n, lib, \"counter\") || !p || n != 4) {{ printf(\"get %zu\\n\", n); return 3; }}\n\
           /* One of dptr and bytes may be NULL, not both (a NULL reaches the driver). */\n\
           if (cuLibraryGetGlobal(0, &n, lib, \"counter\") || n != 4) return 7;\n\
           if (cuLibraryGetGlobal(0, 0, lib, \"counter\") != CUDA_ERROR_INVALID_VALUE) return 8;\n\
           int *counter = (int *)p;\n\
           if (*counter != 0) return 4;\n\
           *counter = 42;\n\
           if (cuMemsetD8(p + 2, 7, 2) || cuCtxSynchronize()) return 5;\n\
           if (*counter != 0x0707002a) {{ printf(\"after the GPU %#x\\n\", *counter); return 6; }}\n\
           printf(\"OK\\n\");\n\
           return 0;\n\
         }}\n",
        bytes.join(",")
    );
    let server = server();
    let exe = program_with("managed_variable_driver", &source, &["-l:libcuda.so.1"]);
    let (stdout, stderr) = run_traced(&server, &exe);
    assert_eq!(stdout.trim(), "OK", "{stderr}");
    assert!(!stderr.contains("WARN") && !stderr.contains("ERROR"), "{stderr}");
}

/// A global whose size the program does not ask for (`cuModuleGetGlobal(&dptr, NULL, ...)`, as
/// NVIDIA's binomialOptions_nvrtc does; `cuLibraryGetGlobal` here) is still the session's
/// memory, whole: the driver's copies to and from it pass the worker's checks.
#[test]
fn a_global_looked_up_without_its_size_is_the_sessions_memory() {
    let path = chidori_tests::root().join("tests/fixtures/fatbin/k_multi.fatbin");
    let bytes: Vec<String> = std::fs::read(path).unwrap().iter().map(|b| b.to_string()).collect();
    let source = format!(
        "#include <stdio.h>\n#include <cuda.h>\n\
         static const unsigned char fb[] __attribute__((aligned(16))) = {{{}}};\n\
         int main(void) {{\n\
           CUdevice dev; CUcontext ctx; CUlibrary lib; CUdeviceptr p = 0;\n\
           if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) || cuCtxSetCurrent(ctx)) return 1;\n\
           if (cuLibraryLoadData(&lib, fb, 0, 0, 0, 0, 0, 0)) return 2;\n\
           if (cuLibraryGetGlobal(&p, 0, lib, \"counter\") || !p) return 3;\n\
           int v = 42, w = 0;\n\
           int a = cuMemcpyHtoD(p, &v, sizeof v), b = cuMemcpyDtoH(&w, p, sizeof w);\n\
           printf(\"%d %d %d\\n\", a, b, w);\n\
           return 0;\n\
         }}\n",
        bytes.join(",")
    );
    let server = server();
    let exe = program_with("global_without_size", &source, &["-l:libcuda.so.1"]);
    let out = run_cmd(&server.address, &exe).output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(stdout.trim(), "0 0 42", "{stderr}");
}

const BATCH_ADDRESSES: &str = r#"
#include <stdio.h>
#include <cuda.h>
#include <cuda_runtime_api.h>
int main(void) {
  void *d;
  if (cudaMalloc(&d, 1 << 16)) return 2;
  CUdeviceptr own[2] = {(CUdeviceptr)d, (CUdeviceptr)d + 4096}, mixed[2] = {(CUdeviceptr)d, 0x7e00dead0000ull};
  size_t sizes[2] = {4096, 4096}, past[2] = {4096, 1 << 16};
  /* Sent without waiting: the status comes with the next call that waits. */
  int a = cuMemDiscardBatchAsync(own, sizes, 2, 0, 0);
  int s1 = cuCtxSynchronize();
  int b = cuMemDiscardBatchAsync(mixed, sizes, 2, 0, 0);
  int s2 = cuCtxSynchronize();
  int c = cuMemDiscardBatchAsync(own, past, 2, 0, 0);
  int s3 = cuCtxSynchronize();
  printf("own %d %d made-up %d %d past the end %d %d\n", a, s1, b, s2, c, s3);
  return 0;
}
"#;

/// Issue 17: batched discards and prefetches name device memory in an array beside an
/// array of sizes; every address is checked as the session's memory, as single addresses
/// are (a made-up one, or a range past an allocation's end, is the library's invalid
/// value; the session goes on).
#[test]
fn batched_addresses_are_the_sessions() {
    let server = server();
    let exe = program_with("batch_addresses", BATCH_ADDRESSES, &["-l:libcuda.so.1"]);
    let (stdout, stderr) = run_traced(&server, &exe);
    assert_eq!(stdout.trim(), "own 0 0 made-up 0 1 past the end 0 1", "{stderr}");
}

const SM_RESOURCES: &str = r#"
#include <stdio.h>
#include <string.h>
#include <cuda.h>
int main(void) {
  CUdevice dev;
  CUdevResource all, rest, split[12];
  unsigned groups = 0;
  memset(&all, 0, sizeof all);
  if (cuInit(0) || cuDeviceGet(&dev, 0)) return 1;
  if (cuDeviceGetDevResource(dev, &all, CU_DEV_RESOURCE_TYPE_SM)) return 2;
  /* How many groups of at least 16 SMs: asked with a NULL array, then filled. */
  if (cuDevSmResourceSplitByCount(NULL, &groups, &all, NULL, 0, 16)) return 3;
  unsigned filled = groups + 2;
  if (filled > 12 || cuDevSmResourceSplitByCount(split, &filled, &all, &rest, 0, 16)) return 4;
  unsigned total = rest.sm.smCount;
  printf("sms %u groups %u filled %u:", all.sm.smCount, groups, filled);
  for (unsigned g = 0; g < filled; g++) {
    printf(" %u", split[g].sm.smCount);
    total += split[g].sm.smCount;
  }
  printf(" rest %u total %u\n", rest.sm.smCount, total);
  return 0;
}
"#;

/// Green contexts' SM resources: the client speaks CUDA 13.1's CUdevResource (a chain
/// pointer added, its union shorter), the emulated driver 13.0's, so every record is
/// translated between the layouts: the SM count in the record's anonymous union survives
/// (on the H100 it came back 0), and so does every record of an array of groups, not only
/// the first.
#[test]
fn sm_resources_keep_their_counts_between_layouts() {
    let server = server();
    let exe = program_with("sm_resources", SM_RESOURCES, &["-l:libcuda.so.1"]);
    let (stdout, stderr) = run_traced(&server, &exe);
    assert_eq!(stdout.trim(), "sms 132 groups 8 filled 8: 16 16 16 16 16 16 16 16 rest 4 total 132", "{stderr}");
}

/// The runtime's library API reaches a library's variables as the driver's does: the
/// address `cudaLibraryGetGlobal` gives is the session's memory (a copy into it and out of
/// it works), and `cudaLibraryGetManaged`'s is the program's memory with the variable's
/// contents, one memory with the GPU's.
#[test]
fn library_variables_asked_of_the_runtime_are_the_sessions() {
    let path = chidori_tests::root().join("tests/fixtures/fatbin/k_multi.fatbin");
    let bytes: Vec<String> = std::fs::read(path).unwrap().iter().map(|b| b.to_string()).collect();
    let source = format!(
        "#include <stdio.h>\n#include <cuda_runtime_api.h>\n\
         static const unsigned char fb[] __attribute__((aligned(16))) = {{{}}};\n\
         int main(void) {{\n\
           cudaLibrary_t lib; void *p = 0; size_t n = 0; int v = 0x1234, back = 0;\n\
           if (cudaLibraryLoadData(&lib, fb, 0, 0, 0, 0, 0, 0)) return 2;\n\
           if (cudaLibraryGetGlobal(&p, &n, lib, \"counter\") || !p || n != 4) {{ printf(\"global %zu\\n\", n); return 3; }}\n\
           if (cudaMemcpy(p, &v, 4, cudaMemcpyHostToDevice) || cudaMemcpy(&back, p, 4, cudaMemcpyDeviceToHost)) {{ printf(\"copy\\n\"); return 4; }}\n\
           if (back != v) return 5;\n\
           void *m = 0;\n\
           if (cudaLibraryGetManaged(&m, &n, lib, \"counter\") || m != p || n != 4) {{ printf(\"managed %p %p\\n\", m, p); return 6; }}\n\
           int *counter = (int *)m;\n\
           if (*counter != v) {{ printf(\"managed reads %#x\\n\", *counter); return 7; }}\n\
           *counter = 42;\n\
           if (cudaMemset((char *)m + 2, 7, 2) || cudaDeviceSynchronize()) return 8;\n\
           if (*counter != 0x0707002a) {{ printf(\"after the GPU %#x\\n\", *counter); return 9; }}\n\
           if (cudaLibraryGetGlobal(&p, &n, lib, \"no_such\") == cudaSuccess) return 10;\n\
           printf(\"OK\\n\");\n\
           return 0;\n\
         }}\n",
        bytes.join(",")
    );
    let server = server();
    let exe = program("library_variables_runtime", &source);
    let (stdout, stderr) = run_traced(&server, &exe);
    assert_eq!(stdout.trim(), "OK", "{stderr}");
    assert!(!stderr.contains("WARN") && !stderr.contains("ERROR"), "{stderr}");
}

/// Issue 19: a module's functions come with its load (cuModuleGetFunction waits for
/// nothing), a function's attributes are asked once per process, and those it cannot change
/// once per server: a second process answers them itself (the server's answer, still asked,
/// is checked when it comes). What the program sees is the same in every run.
#[test]
fn function_attributes_learned_in_one_process_answer_the_next() {
    let path = chidori_tests::root().join("tests/fixtures/fatbin/k_multi.fatbin");
    let bytes: Vec<String> = std::fs::read(path).unwrap().iter().map(|b| b.to_string()).collect();
    let source = format!(
        "#include <stdio.h>\n#include <cuda.h>\n\
         static const unsigned char fb[] __attribute__((aligned(16))) = {{{}}};\n\
         int main(void) {{\n\
           CUdevice dev; CUcontext ctx; CUmodule mod; CUfunction f, g;\n\
           if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) || cuCtxSetCurrent(ctx)) return 1;\n\
           if (cuModuleLoadData(&mod, fb)) return 2;\n\
           if (cuModuleGetFunction(&f, mod, \"_Z5otherPf\") || cuModuleGetFunction(&g, mod, \"_Z5otherPf\") || f != g) return 3;\n\
           if (cuModuleGetFunction(&g, mod, \"no_such_kernel\") != CUDA_ERROR_NOT_FOUND) return 4;\n\
           int threads = 0, regs = -1, again = 0;\n\
           if (cuFuncGetAttribute(&threads, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, f)) return 5;\n\
           if (cuFuncGetAttribute(&regs, CU_FUNC_ATTRIBUTE_NUM_REGS, f)) return 6;\n\
           if (cuFuncGetAttribute(&again, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, f) || again != threads) return 7;\n\
           int shared = 0, raised = 0;\n\
           if (cuFuncGetAttribute(&shared, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, f)) return 9;\n\
           if (cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 100000)) return 10;\n\
           if (cuFuncGetAttribute(&raised, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, f)) return 11;\n\
           if (cuCtxSynchronize()) return 8;\n\
           printf(\"threads %d regs %d shared %d then %d\\n\", threads, regs, shared, raised);\n\
           return 0;\n\
         }}\n",
        bytes.join(",")
    );
    let dir = chidori_tests::scratch("function-attributes");
    let modules = dir.join("module-cache");
    let server =
        EmulatedServer::start_args(&chidori(), Some(&profile()), &["--module-cache", modules.to_str().unwrap()])
            .expect("starting an emulated server");
    let exe = program_with("function_attributes", &source, &["-l:libcuda.so.1"]);
    let cache = dir.join("client-cache");
    let _ = std::fs::remove_dir_all(&cache);
    let (first, stderr) = run_learning(&server, &exe, &cache, &[]);
    assert_eq!(first.trim(), "threads 1024 regs 0 shared 49152 then 100000", "{stderr}");
    assert_eq!(trace_row(&stderr, "cuModuleGetFunction"), ["3", "1"], "only the unknown name is asked: {stderr}");
    assert_eq!(
        trace_row(&stderr, "cuFuncGetAttribute"),
        ["5", "3"],
        "each attribute asked once, a set one known: {stderr}"
    );
    let (second, stderr) = run_learning(&server, &exe, &cache, &[]);
    assert_eq!(second, first, "{stderr}");
    assert_eq!(trace_row(&stderr, "cuFuncGetAttribute"), ["5", "0"], "learned in the first process: {stderr}");
    assert!(!stderr.contains("answered differently"), "{stderr}");
    // The image the program passed is loaded under the client's names, without waiting;
    // where the server's cache lost it, the worker asks the client for the copy it kept.
    assert_eq!(module_load_row(&stderr), (0, 0), "{stderr}");
    assert_eq!(trace_row(&stderr, "(module load, named)"), ["1", "0"], "{stderr}");
    std::fs::remove_dir_all(&modules).unwrap();
    let (third, stderr) = run_learning(&server, &exe, &cache, &[]);
    assert_eq!(third, first, "{stderr}");
    assert_eq!(module_load_row(&stderr), (0, 0), "{stderr}");
    assert_eq!(std::fs::read_dir(&modules).map(|d| d.count()).unwrap_or(0), 1, "cached again");
}

/// A profile of two GPUs: the H200's, and a copy with another UUID, name and PCI bus.
fn two_gpu_profile(dir: &Path) -> PathBuf {
    let text = std::fs::read_to_string(profile()).unwrap();
    let mut p: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut second = p["devices"][0].clone();
    second["ordinal"] = 1.into();
    second["uuid"] = "00112233445566778899aabbccddeeff".into();
    second["name"] = "NVIDIA H200 (second)".into();
    second["cudaDeviceProp_13_0"]["name"] = "NVIDIA H200 (second)".into();
    second["cudaDeviceProp_13_0"]["pciBusID"] = 7.into();
    p["devices"].as_array_mut().unwrap().push(second);
    let path = dir.join("two-h200.json");
    std::fs::write(&path, serde_json::to_string(&p).unwrap()).unwrap();
    path
}

const DEVICES: &str = r#"
#include <stdio.h>
#include <cuda_runtime_api.h>
extern int nvmlInit_v2(void);
extern int nvmlDeviceGetCount_v2(unsigned int *);
int main(void) {
  unsigned int nvml = 0;
  if (nvmlInit_v2() == 0 && nvmlDeviceGetCount_v2(&nvml) == 0) printf("nvml %u; ", nvml);
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e) { printf("error %d\n", (int)e); return 0; }
  printf("%d:", n);
  for (int i = 0; i < n; ++i) {
    struct cudaDeviceProp p;
    if (cudaGetDeviceProperties(&p, i)) return 1;
    printf(" %d", p.pciBusID);
  }
  printf("\n");
  return 0;
}
"#;

/// Issue 21: the program's CUDA_VISIBLE_DEVICES selects among the server's GPUs, in its
/// order (indices or UUIDs), as CUDA would on the GPU's machine; a list that selects none is
/// a clear refusal.
#[test]
fn the_programs_visible_devices_select_among_the_servers() {
    let dir = chidori_tests::scratch("visible-devices");
    let profile = two_gpu_profile(&dir);
    let server = EmulatedServer::start(&chidori(), &profile).expect("starting an emulated server");
    let exe = program_with("devices", DEVICES, &["-l:libnvidia-ml.so.1"]);
    let run = |visible: Option<&str>| {
        let mut cmd = run_cmd(&server.address, &exe);
        match visible {
            Some(v) => cmd.env("CUDA_VISIBLE_DEVICES", v),
            None => cmd.env_remove("CUDA_VISIBLE_DEVICES"),
        };
        let out = cmd.output().unwrap();
        (String::from_utf8_lossy(&out.stdout).trim().to_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    // NVML counts every GPU the server exposes, as it ignores the variable natively too
    // (torch counts devices by NVML, then applies CUDA_VISIBLE_DEVICES itself).
    assert_eq!(run(None).0, "nvml 2; 2: 0 7");
    assert_eq!(run(Some("1")).0, "nvml 2; 1: 7");
    assert_eq!(run(Some("1,0")).0, "nvml 2; 2: 7 0");
    assert_eq!(run(Some("GPU-00112233")).0, "nvml 2; 1: 7");
    assert_eq!(run(Some("0,5,1")).0, "nvml 2; 1: 0", "the list ends at an index the server lacks");
    let (out, err) = run(Some("3"));
    assert!(out.starts_with("error 100"), "no device: {out}");
    assert!(err.contains("CUDA_VISIBLE_DEVICES=\"3\" selects none of the server's GPUs"), "{err}");
}

const PEERS: &str = r#"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cuda_runtime_api.h>
#define C(x) do { cudaError_t e = (x); if (e) { printf("FAIL line %d: %s -> %d\n", __LINE__, #x, (int)e); return 1; } } while (0)
#define N (1 << 20)
int main(void) {
  int can = -1, self = -1;
  C(cudaDeviceCanAccessPeer(&can, 0, 1));
  C(cudaDeviceCanAccessPeer(&self, 1, 1));
  if (can != 1 || self != 0) { printf("FAIL peers %d %d\n", can, self); return 1; }
  if (cudaDeviceCanAccessPeer(&can, 0, 2) != cudaErrorInvalidDevice) { printf("FAIL device 2\n"); return 1; }
  char *host = malloc(N), *back = malloc(N);
  for (int i = 0; i < N; ++i) host[i] = (char)(i * 7);
  void *a, *b;
  C(cudaSetDevice(0));
  C(cudaMalloc(&a, N));
  C(cudaMemcpy(a, host, N, cudaMemcpyHostToDevice));
  C(cudaSetDevice(1));
  C(cudaMalloc(&b, N));
  C(cudaDeviceEnablePeerAccess(0, 0));
  if (cudaDeviceEnablePeerAccess(0, 0) != cudaErrorPeerAccessAlreadyEnabled) { printf("FAIL enable twice\n"); return 1; }
  cudaGetLastError();
  /* GPU to GPU: the bytes stay on the server. */
  C(cudaMemcpyPeer(b, 1, a, 0, N));
  C(cudaMemcpy(back, b, N, cudaMemcpyDeviceToHost));
  if (memcmp(back, host, N)) { printf("FAIL peer copy\n"); return 1; }
  C(cudaDeviceDisablePeerAccess(0));
  if (cudaDeviceDisablePeerAccess(0) != cudaErrorPeerAccessNotEnabled) { printf("FAIL disable twice\n"); return 1; }
  printf("OK\n");
  return 0;
}
"#;

/// Issue 21 item 2 on the emulated backend: one process on two GPUs, peer access asked and
/// enabled with CUDA's statuses, and a GPU-to-GPU copy whose bytes never reach the client.
#[test]
fn a_copy_between_two_gpus_stays_on_the_server() {
    let dir = chidori_tests::scratch("peers-profile");
    let profile = two_gpu_profile(&dir);
    let server = EmulatedServer::start(&chidori(), &profile).expect("starting an emulated server");
    let exe = program("peers", PEERS);
    let (stdout, stderr) = run_traced(&server, &exe);
    assert_eq!(stdout.trim(), "OK", "{stderr}");
    let sent = bytes_sent(&stderr, "cudaMemcpyPeer");
    assert!(sent < 1024, "the peer copy sent {sent} bytes: {stderr}");
}

const NCCL: &str = r#"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cuda_runtime_api.h>
typedef struct { char internal[128]; } ncclUniqueId;
typedef struct ncclComm *ncclComm_t;
extern int ncclGetVersion(int *);
extern int ncclGetUniqueId(ncclUniqueId *);
extern int ncclCommInitRank(ncclComm_t *, int, ncclUniqueId, int);
extern int ncclCommCount(ncclComm_t, int *);
extern int ncclCommGetAsyncError(ncclComm_t, int *);
extern int ncclAllReduce(const void *, void *, size_t, int, int, ncclComm_t, cudaStream_t);
extern int ncclGroupStart(void);
extern int ncclGroupEnd(void);
extern int ncclCommDestroy(ncclComm_t);
extern int ncclRedOpCreatePreMulSum(int *, void *, int, int, ncclComm_t);
extern int ncclRedOpDestroy(int, ncclComm_t);
extern const char *ncclGetLastError(ncclComm_t);
/* NCCL 2.27's configuration (80 bytes; the newest headers' is 120). */
typedef struct {
  size_t size; unsigned magic, version;
  int blocking, cgaClusterSize, minCTAs, maxCTAs;
  const char *netName; int splitShare, trafficClass; const char *commName;
  int collnetEnable, CTAPolicy, shrinkShare, nvlsCTAs, nChannelsPerNetPeer, nvlinkCentricSched;
} config_v22700;
extern int ncclCommInitRankConfig(ncclComm_t *, int, ncclUniqueId, int, config_v22700 *);
#include <sys/mman.h>
#include <unistd.h>
#define C(x) do { int e = (int)(x); if (e) { printf("FAIL line %d: %s -> %d\n", __LINE__, #x, e); return 1; } } while (0)
#define N (1 << 18)
int main(void) {
  int version = 0, count = 0, async = -1;
  C(ncclGetVersion(&version));
  ncclUniqueId id;
  C(ncclGetUniqueId(&id));
  ncclComm_t comm, two;
  if (ncclCommInitRank(&two, 2, id, 0) != 5) { printf("FAIL two ranks\n"); return 1; }
  /* The refusal's text is the worker's NCCL's, in one buffer the program may keep. */
  const char *last = ncclGetLastError(NULL);
  if (!strstr(last, "ncclCommInitRank") || !strstr(last, "one rank")) { printf("FAIL last error '%s'\n", last); return 1; }
  C(ncclCommInitRank(&comm, 1, id, 0));
  if (ncclGetLastError(comm) != last || !strstr(last, "one rank")) { printf("FAIL last error again\n"); return 1; }
  if (!strstr(ncclGetLastError((ncclComm_t)0x1234), "no NCCL communicator")) { printf("FAIL foreign '%s'\n", last); return 1; }
  C(ncclCommCount(comm, &count));
  if (count != 1) { printf("FAIL count %d\n", count); return 1; }
  float *host = malloc(N * 4), *back = malloc(N * 4);
  for (int i = 0; i < N; ++i) host[i] = (float)i;
  void *a, *b;
  cudaStream_t s;
  C(cudaStreamCreate(&s));
  C(cudaMalloc(&a, N * 4));
  C(cudaMalloc(&b, N * 4));
  C(cudaMemcpy(a, host, N * 4, cudaMemcpyHostToDevice));
  C(ncclGroupStart());
  C(ncclAllReduce(a, b, N, 7 /* ncclFloat32 */, 0 /* ncclSum */, comm, s));
  C(ncclGroupEnd());
  C(cudaStreamSynchronize(s));
  C(cudaMemcpy(back, b, N * 4, cudaMemcpyDeviceToHost));
  if (memcmp(back, host, N * 4)) { printf("FAIL all-reduce of one rank\n"); return 1; }
  C(ncclCommGetAsyncError(comm, &async));
  if (async != 0) { printf("FAIL async error %d\n", async); return 1; }
  /* Pre-multiplied sums: a host scalar read at once, a device one; a host address given as
     device memory is refused. */
  int by_host = -1, by_device = -1, wrong = -1;
  float factor = 0.5f;
  C(ncclRedOpCreatePreMulSum(&by_host, &factor, 7, 1 /* ncclScalarHostImmediate */, comm));
  C(ncclRedOpCreatePreMulSum(&by_device, a, 7, 0 /* ncclScalarDevice */, comm));
  if (by_host < 5 || by_device < 5 || by_host == by_device) { printf("FAIL ops %d %d\n", by_host, by_device); return 1; }
  if (ncclRedOpCreatePreMulSum(&wrong, &factor, 7, 0, comm) == 0) { printf("FAIL host scalar as device\n"); return 1; }
  C(ncclRedOpDestroy(by_host, comm));
  C(ncclRedOpDestroy(by_device, comm));
  /* A collective on a communicator of no one's: sent without waiting, its refusal is the
     status of the next NCCL call that waits. */
  C(ncclAllReduce(a, b, N, 7, 0, (ncclComm_t)0x1234, s));
  if (ncclCommGetAsyncError(comm, &async) != 4) { printf("FAIL deferred refusal\n"); return 1; }
  C(ncclCommDestroy(comm));
  /* An older, shorter configuration ending where memory ends is read no further than its
     size says; one that names a network (a string of this process) is refused. */
  long page = sysconf(_SC_PAGESIZE);
  unsigned char *pages = mmap(NULL, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (pages == MAP_FAILED || mprotect(pages + page, page, PROT_NONE)) { printf("FAIL mmap\n"); return 1; }
  config_v22700 *config = (config_v22700 *)(pages + page - sizeof(config_v22700));
  memset(config, 0, sizeof *config);
  config->size = sizeof *config; config->magic = 0xcafebeef; config->version = 22700;
  config->blocking = config->cgaClusterSize = config->minCTAs = config->maxCTAs = (int)0x80000000;
  ncclComm_t configured;
  C(ncclCommInitRankConfig(&configured, 1, id, 0, config));
  C(ncclCommDestroy(configured));
  config->netName = "ib0";
  if (ncclCommInitRankConfig(&configured, 1, id, 0, config) == 0) { printf("FAIL a client's string reached NCCL\n"); return 1; }
  printf("OK %d\n", version);
  return 0;
}
"#;

/// Issue 21 item 3 on the emulated backend (communicators of one rank): NCCL's calls reach
/// the server, a collective is sent without waiting and its bytes stay there, a
/// communicator of no one's is refused.
#[test]
fn nccl_collectives_run_in_the_worker() {
    let server = server();
    let exe = program_with("nccl", NCCL, &["-l:libnccl.so.2"]);
    let (stdout, stderr) = run_traced(&server, &exe);
    assert_eq!(stdout.trim(), "OK 22700", "{stderr}");
    let row = trace_row(&stderr, "ncclAllReduce");
    assert_eq!(row, ["2", "0"], "two all-reduces, no round trip: {stderr}");
    assert!(bytes_sent(&stderr, "ncclAllReduce") < 1024, "{stderr}");
}

const CUBLAS_XT: &str = r#"
#include <stdio.h>
#include <stdlib.h>
#include <math.h>
#include <cuda_runtime_api.h>
extern int cublasXtCreate(void **);
extern int cublasXtDestroy(void *);
extern int cublasXtDeviceSelect(void *, int, int *);
extern int cublasXtSgemm(void *, int, int, size_t, size_t, size_t, const float *, const float *, size_t,
                         const float *, size_t, const float *, float *, size_t);
enum { M = 70, N = 50, K = 40 };
static float A[M * K], B[K * N], C[M * N], want[M * N];
static float check(float alpha, float beta, const float *c0) {
  float worst = 0;
  for (int j = 0; j < N; j++)
    for (int i = 0; i < M; i++) {
      float dot = 0;
      for (int p = 0; p < K; p++) dot += A[i + p * M] * B[p + j * K];
      float w = alpha * dot + beta * c0[i + j * M], d = fabsf(w - C[i + j * M]);
      if (d > worst) worst = d;
    }
  return worst;
}
int main(void) {
  void *xt;
  int dev = 0;
  if (cublasXtCreate(&xt) || cublasXtDeviceSelect(xt, 1, &dev)) { printf("setup\n"); return 1; }
  for (int i = 0; i < M * K; i++) A[i] = (float)(i % 7) - 3;
  for (int i = 0; i < K * N; i++) B[i] = (float)(i % 5) * 0.5f;
  float *c0 = malloc(sizeof C);
  for (int i = 0; i < M * N; i++) C[i] = c0[i] = 1;
  float alpha = 2, beta = 0.5f;
  int s = cublasXtSgemm(xt, 0, 0, M, N, K, &alpha, A, M, B, K, &beta, C, M);
  printf("host %d worst %g;", s, check(alpha, beta, c0));
  /* The program changes A between calls: the server's copy follows. */
  for (int i = 0; i < M * K; i++) A[i] = (float)(i % 3);
  for (int i = 0; i < M * N; i++) c0[i] = C[i];
  s = cublasXtSgemm(xt, 0, 0, M, N, K, &alpha, A, M, B, K, &beta, C, M);
  printf(" again %d worst %g;", s, check(alpha, beta, c0));
  /* B on the GPU, A and C on the host. */
  float *dB;
  if (cudaMalloc((void **)&dB, sizeof B) || cudaMemcpy(dB, B, sizeof B, cudaMemcpyHostToDevice)) return 1;
  for (int i = 0; i < M * N; i++) c0[i] = C[i];
  s = cublasXtSgemm(xt, 0, 0, M, N, K, &alpha, A, M, dB, K, &beta, C, M);
  printf(" device B %d worst %g;", s, check(alpha, beta, c0));
  printf(" %d\n", cublasXtDestroy(xt));
  return 0;
}
"#;

/// cuBLASXt with host matrices (NVIDIA's simpleCUBLASXT): the program's host matrices are
/// mirrored to the server at their own addresses, the library writes C there, and C is back
/// in the program's memory when the call returns; a changed input travels again; a device
/// matrix passes as it is.
#[test]
fn cublas_xt_reads_and_writes_the_programs_host_matrices() {
    let server = server();
    let exe = program_with("cublas_xt", CUBLAS_XT, &["-l:libcublas.so.13", "-lm"]);
    let out = run_cmd(&server.address, &exe).output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert_eq!(stdout.trim(), "host 0 worst 0; again 0 worst 0; device B 0 worst 0; 0", "{stderr}");
}

const LT_TRANSFORM: &str = r#"
#include <stdio.h>
#include <cuda_runtime_api.h>
extern int cublasLtCreate(void **);
extern int cublasLtMatrixTransformDescCreate(void **, int);
extern int cublasLtMatrixTransformDescSetAttribute(void *, int, const void *, size_t);
extern int cublasLtMatrixTransformDescDestroy(void *);
extern int cublasLtMatrixTransform(void *, void *, const void *, const void *, void *, const void *, const void *,
                                   void *, void *, void *, cudaStream_t);
extern const char *cublasLtGetStatusName(int);
#define C(x) do { int e = (int)(x); if (e) { printf("FAIL line %d: %s -> %d\n", __LINE__, #x, e); return 1; } } while (0)
int main(void) {
  void *lt, *t;
  float *d, host[5] = {10, 100, 0, 20, 30}, got = 0;
  C(cublasLtCreate(&lt));
  C(cudaMalloc((void **)&d, 5 * sizeof(float)));
  C(cudaMemcpy(d, host, sizeof host, cudaMemcpyHostToDevice));
  C(cublasLtMatrixTransformDescCreate(&t, 0 /* CUDA_R_32F */));
  /* Host pointer mode: alpha and beta are the program's values. */
  float alpha = 2, beta = 3;
  C(cublasLtMatrixTransform(lt, t, &alpha, d, 0, &beta, d + 1, 0, d + 2, 0, 0));
  C(cudaMemcpy(&got, d + 2, sizeof got, cudaMemcpyDeviceToHost));
  printf("host %g;", got);
  /* Device pointer mode: alpha and beta are at device addresses (20 and 30). */
  int device_mode = 1;
  C(cublasLtMatrixTransformDescSetAttribute(t, 1 /* POINTER_MODE */, &device_mode, sizeof device_mode));
  C(cublasLtMatrixTransform(lt, t, d + 3, d, 0, d + 4, d + 1, 0, d + 2, 0, 0));
  C(cudaMemcpy(&got, d + 2, sizeof got, cudaMemcpyDeviceToHost));
  printf(" device %g;", got);
  C(cublasLtMatrixTransformDescDestroy(t));
  printf(" %s\n", cublasLtGetStatusName(7));
  return 0;
}
"#;

/// cuBLASLt's matrix transform: alpha and beta follow the transform descriptor's pointer
/// mode (host values, then device addresses), as the client recorded it without a round
/// trip; status names come from the headers.
#[test]
fn cublaslt_transform_scalars_follow_the_descriptors_pointer_mode() {
    let server = server();
    let exe = program_with("lt_transform", LT_TRANSFORM, &["-l:libcublasLt.so.13"]);
    let out = run_cmd(&server.address, &exe).output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert_eq!(stdout.trim(), "host 320; device 3200; CUBLAS_STATUS_INVALID_VALUE", "{stderr}");
}

const LT_HEURISTIC: &str = r#"
#include <stdio.h>
#include <stdint.h>
#include <cuda_runtime_api.h>
typedef struct { unsigned long long algo[8]; size_t workspace; int state; float waves; int reserved[4]; } result_t;
extern int cublasLtCreate(void **);
extern int cublasLtMatmulDescCreate(void **, int, int);
extern int cublasLtMatrixLayoutCreate(void **, int, uint64_t, uint64_t, int64_t);
extern int cublasLtMatmulPreferenceCreate(void **);
extern int cublasLtMatmulAlgoGetHeuristic(void *, void *, void *, void *, void *, void *, void *, int, result_t *, int *);
#define C(x) do { int e = (int)(x); if (e) { printf("FAIL line %d: %s -> %d\n", __LINE__, #x, e); return 1; } } while (0)
int main(void) {
  void *lt, *op, *pref, *l[2];
  C(cublasLtCreate(&lt));
  C(cublasLtMatmulDescCreate(&op, 68 /* CUBLAS_COMPUTE_32F */, 0 /* CUDA_R_32F */));
  C(cublasLtMatmulPreferenceCreate(&pref));
  C(cublasLtMatrixLayoutCreate(&l[0], 0, 64, 64, 64));
  C(cublasLtMatrixLayoutCreate(&l[1], 0, 128, 128, 128));
  for (int p = 0; p < 2; ++p) {
    result_t r[4];
    int n = 0;
    C(cublasLtMatmulAlgoGetHeuristic(lt, op, l[p], l[p], l[p], l[p], pref, 4, r, &n));
    printf("problem %d: %d algorithms, first %llu\n", p, n, n ? r[0].algo[0] : 0ull);
  }
  C(cudaDeviceSynchronize());
  return 0;
}
"#;

/// Issue 19 item 1: a cuBLASLt heuristic answered in an earlier session on the same server
/// GPU and libraries is answered by the client without waiting (the worker still makes the
/// call, and the client checks its answer); a server that answers differently ends the
/// session naming the call, and what was learned is dropped.
#[test]
fn heuristics_learned_in_an_earlier_session_are_answered_without_waiting() {
    let dir = chidori_tests::scratch("learned-answers");
    let exe = program_with("lt_heuristic", LT_HEURISTIC, &["-l:libcublasLt.so.13"]);
    let client_cache = dir.join("client-cache");
    let run = |server: &EmulatedServer| {
        let (stdout, stderr) = run_learning(server, &exe, &client_cache, &[]);
        let trips = stderr
            .lines()
            .find(|l| l.split_whitespace().next() == Some("cublasLtMatmulAlgoGetHeuristic"))
            .and_then(|l| l.split_whitespace().nth(2).and_then(|t| t.parse::<u64>().ok()))
            .unwrap_or(0);
        (stdout, trips, stderr)
    };
    let server = server();
    let (first, trips, stderr) = run(&server);
    assert!(first.contains("problem 1: 2 algorithms, first 1000"), "{first}{stderr}");
    assert_eq!(trips, 2, "the first run asks the server: {stderr}");
    let (second, trips, stderr) = run(&server);
    assert_eq!(second, first, "{stderr}");
    assert_eq!(trips, 0, "the second run answers from the first: {stderr}");
    assert!(!stderr.contains("answered differently"), "{stderr}");
    drop(server);

    // A server whose library answers differently (same GPU, same versions).
    let other = salted_server();
    let (_, _, stderr) = run(&other);
    assert!(
        stderr.contains("cublasLtMatmulAlgoGetHeuristic: the server answered differently"),
        "a different answer ends the session, naming the call: {stderr}"
    );
    let (fourth, trips, stderr) = run(&other);
    assert_eq!(trips, 2, "what was learned was dropped: {stderr}");
    assert!(fourth.contains("first 1005"), "{fourth}{stderr}");
}

const CUDNN_SIZES: &str = r#"
#include <stdio.h>
typedef void *h_t;
int cudnnCreate(h_t *h);
int cudnnCreateTensorDescriptor(h_t *d);
int cudnnDestroyTensorDescriptor(h_t d);
int cudnnSetTensorNdDescriptor(h_t d, int dataType, int nbDims, const int *dims, const int *strides);
int cudnnGetTensorSizeInBytes(h_t d, unsigned long *size);
int cudnnCreateRNNDescriptor(h_t *d);
int cudnnGetRNNWeightParams(h_t handle, h_t rnn, int layer, unsigned long size, const void *space, int lin,
                            h_t mDesc, void **mAddr, h_t bDesc, void **bAddr);
int cudaMalloc(void **p, unsigned long size);
#define C(x) do { int e = (x); if (e) { printf("FAIL line %d: %s -> %d\n", __LINE__, #x, e); return 1; } } while (0)
int main(void) {
  h_t handle, t;
  unsigned long size = 0;
  int small[3] = {2, 3, 4}, small_strides[3] = {12, 4, 1};
  int big[3] = {2, 8, 8}, big_strides[3] = {64, 8, 1};
  C(cudnnCreate(&handle));
  /* Torch's pattern: a descriptor made and set anew for each call, its size asked. */
  for (int step = 0; step < 5; ++step) {
    C(cudnnCreateTensorDescriptor(&t));
    C(cudnnSetTensorNdDescriptor(t, 0, 3, small, small_strides));
    C(cudnnGetTensorSizeInBytes(t, &size));
    printf("%lu ", size);
    /* Set again, differently: another question. */
    C(cudnnSetTensorNdDescriptor(t, 0, 3, big, big_strides));
    C(cudnnGetTensorSizeInBytes(t, &size));
    printf("%lu ", size);
    C(cudnnDestroyTensorDescriptor(t));
  }
  /* Half precision: another question again. */
  C(cudnnCreateTensorDescriptor(&t));
  C(cudnnSetTensorNdDescriptor(t, 2, 3, small, small_strides));
  C(cudnnGetTensorSizeInBytes(t, &size));
  printf("%lu ", size);
  /* A call that fills the descriptor (an RNN matrix of 32 x 32 floats): its size is asked. */
  h_t rnn;
  void *space, *matrix;
  C(cudaMalloc(&space, 1 << 20));
  C(cudnnCreateRNNDescriptor(&rnn));
  C(cudnnCreateTensorDescriptor(&t));
  C(cudnnSetTensorNdDescriptor(t, 0, 3, small, small_strides));
  C(cudnnGetTensorSizeInBytes(t, &size));
  printf("%lu ", size);
  C(cudnnGetRNNWeightParams(handle, rnn, 0, 1 << 20, space, 0, t, &matrix, 0, 0));
  C(cudnnGetTensorSizeInBytes(t, &size));
  printf("%lu\n", size);
  return 0;
}
"#;

/// Issue 19: a legacy cuDNN size query about descriptors set as before is answered by the
/// client; a descriptor set differently, of another data type, or filled by another call
/// is asked again.
#[test]
fn cudnn_size_queries_about_descriptors_set_alike_are_answered_by_the_client() {
    let server = server();
    let exe = cudnn_program("cudnn-sizes", CUDNN_SIZES);
    let (stdout, stderr) = run_traced(&server, &exe);
    assert_eq!(stdout.trim(), "96 512 96 512 96 512 96 512 96 512 48 96 4096", "{stderr}");
    let row = trace_row(&stderr, "cudnnGetTensorSizeInBytes");
    assert_eq!(row, ["13", "4"], "three distinct questions and one after a fill, thirteen asked: {stderr}");

    // Learned for later sessions: a second process asks none of them (and checks them all).
    let cache = chidori_tests::scratch("cudnn-sizes-cache");
    let run = || {
        let (out, stderr) = run_learning(&server, &exe, &cache, &[]);
        (out.trim().to_owned(), trace_row(&stderr, "cudnnGetTensorSizeInBytes"), stderr)
    };
    let (first, rows, stderr) = run();
    assert_eq!((first.as_str(), rows[1].as_str()), (stdout.trim(), "4"), "{stderr}");
    // The question about the filled descriptor is asked again: what a fill wrote is not known.
    let (second, rows, stderr) = run();
    assert_eq!((second.as_str(), rows[1].as_str()), (stdout.trim(), "1"), "{stderr}");
    assert!(!stderr.contains("answered differently"), "{stderr}");
}

const CUDNN_RNN_DATA: &str = r#"
#include <stdio.h>
typedef void *h_t;
int cudnnCreate(h_t *h);
int cudnnCreateRNNDataDescriptor(h_t *d);
int cudnnSetRNNDataDescriptor(h_t d, int dataType, int layout, int maxSeqLength, int batchSize,
                              int vectorSize, const int *seqLengthArray, void *paddingFill);
int cudnnCreateTensorDescriptor(h_t *d);
int cudnnSetTensorNdDescriptor(h_t d, int dataType, int nbDims, const int *dims, const int *strides);
int cudnnGetTensorSizeInBytes(h_t d, unsigned long *size);
/* A question the client cannot answer itself (a shape not asked before): it waits. */
static int ask(h_t t, int n, unsigned long *size) {
  int dims[3] = {n, 3, 4}, strides[3] = {12, 4, 1};
  cudnnSetTensorNdDescriptor(t, 0, 3, dims, strides);
  return cudnnGetTensorSizeInBytes(t, size);
}
int main(void) {
  h_t handle, x, t;
  unsigned long size = 0;
  int lengths[8] = {50, 50, 50, 50, 50, 50, 50, 50};
  float fill = 0.0f;
  if (cudnnCreate(&handle) || cudnnCreateRNNDataDescriptor(&x) || cudnnCreateTensorDescriptor(&t)) return 1;
  /* torch's call: no padding value (NULL), then one; each status surfaces at the next
     waiting cuDNN call. */
  int a = cudnnSetRNNDataDescriptor(x, 0, 1, 50, 8, 32, lengths, 0);
  int after_null = ask(t, 1, &size);
  int b = cudnnSetRNNDataDescriptor(x, 0, 1, 50, 8, 32, lengths, &fill);
  int after_fill = ask(t, 2, &size);
  /* No sequence lengths: cuDNN reads them, so the worker refuses and says so. */
  int c = cudnnSetRNNDataDescriptor(x, 0, 1, 50, 8, 32, 0, 0);
  int after_refused = ask(t, 3, &size);
  printf("%d %d %d %d %d %d\n", a, after_null, b, after_fill, c, after_refused);
  return 0;
}
"#;

/// Issue 14 (torch's LSTM): an input array the API lets be NULL (`in[..]?`) reaches the
/// library as NULL; one it reads is refused, and a refusal of a call sent without waiting is
/// said on both sides, as a failure of one is.
#[test]
fn a_null_the_api_allows_passes_and_a_refused_unwaited_call_is_said() {
    let server = server();
    let exe = cudnn_program("cudnn-rnn-data", CUDNN_RNN_DATA);
    let (stdout, stderr) = run_traced(&server, &exe);
    assert_eq!(stdout.trim(), "0 0 0 0 0 2000", "{stderr}");
    assert!(
        stderr.contains("cudnnSetRNNDataDescriptor") && stderr.contains("NULL for 8 elements"),
        "the refused call, named to the program's side: {stderr}"
    );
}

/// NVIDIA's own runtime, loaded by its path beside the shims (as a program that links it
/// statically carries it): it reaches Chidori's driver through `cuGetProcAddress` and the
/// driver's private tables (`cuGetExportTable`), checks the driver (the integrity check),
/// keeps its per-context state in context-local storage (whose destructor a device reset
/// runs), and its memory calls reach the emulated GPU (cudaMemcpyDefault as cuMemcpy, whose
/// host side the client must recognize).
const REAL_RUNTIME: &str = r#"
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
typedef int (*count_fn)(int *);
typedef int (*malloc_fn)(void **, size_t);
typedef int (*copy_fn)(void *, const void *, size_t, int);
typedef int (*free_fn)(void *);
typedef int (*reset_fn)(void);
typedef int (*version_fn)(int *);
#define CHECK(what, call) do { int s_ = (call); if (s_) { printf("%s failed: %d\n", what, s_); return 1; } } while (0)
static void bump(void *p) { ++*(int *)p; }
int main(int argc, char **argv) {
  void *rt = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!rt) { printf("dlopen: %s\n", dlerror()); return 1; }
  count_fn count = (count_fn)dlsym(rt, "cudaGetDeviceCount");
  malloc_fn alloc = (malloc_fn)dlsym(rt, "cudaMalloc");
  copy_fn copy = (copy_fn)dlsym(rt, "cudaMemcpy");
  free_fn release = (free_fn)dlsym(rt, "cudaFree");
  reset_fn reset = (reset_fn)dlsym(rt, "cudaDeviceReset");
  version_fn driver = (version_fn)dlsym(rt, "cudaDriverGetVersion");
  int n = 0, v = 0;
  CHECK("cudaGetDeviceCount", count(&n));
  CHECK("cudaDriverGetVersion", driver(&v));
  for (int round = 0; round < 2; round++) {
    char in[4096], out[4096];
    for (int i = 0; i < 4096; i++) in[i] = (char)(i * 7 + round);
    void *d = 0;
    CHECK("cudaMalloc", alloc(&d, sizeof in));
    CHECK("cudaMemcpy H2D", copy(d, in, sizeof in, 1));
    CHECK("cudaMemcpy D2H", copy(out, d, sizeof out, 2));
    if (memcmp(in, out, sizeof in)) { printf("round %d: bytes differ\n", round); return 1; }
    /* cudaMemcpyDefault: the runtime leaves the direction to the driver (cuMemcpy). */
    in[7] ^= 0x5a;
    CHECK("cudaMemcpy default H2D", copy(d, in, sizeof in, 4));
    CHECK("cudaMemcpy default D2H", copy(out, d, sizeof out, 4));
    if (memcmp(in, out, sizeof in)) { printf("round %d: default copies differ\n", round); return 1; }
    CHECK("cudaFree", release(d));
    CHECK("cudaDeviceReset", reset());
  }
  /* Managed memory: the hints name the client's memory (answered by the client). */
  typedef struct { int type; int id; } location;
  int (*managed)(void **, size_t, unsigned) = (int (*)(void **, size_t, unsigned))dlsym(rt, "cudaMallocManaged");
  int (*advise)(void *, size_t, int, location) = (int (*)(void *, size_t, int, location))dlsym(rt, "cudaMemAdvise");
  int (*prefetch)(void *, size_t, location, unsigned, void *) =
      (int (*)(void *, size_t, location, unsigned, void *))dlsym(rt, "cudaMemPrefetchAsync");
  float *m = 0;
  location here = {1, 0}; /* cudaMemLocationTypeDevice, device 0 */
  CHECK("cudaMallocManaged", managed((void **)&m, 1 << 16, 1));
  m[5] = 2.5f;
  CHECK("cudaMemAdvise", advise(m, 1 << 16, 3, here)); /* SetPreferredLocation */
  CHECK("cudaMemPrefetchAsync", prefetch(m, 1 << 16, here, 0, 0));
  if (m[5] != 2.5f) { printf("managed memory changed\n"); return 1; }
  /* A memset of managed memory (cuMemsetD8 in this runtime) is seen by the host after a
     synchronization. */
  int (*memset_fn)(void *, int, size_t) = (int (*)(void *, int, size_t))dlsym(rt, "cudaMemset");
  int (*sync)(void) = (int (*)(void))dlsym(rt, "cudaDeviceSynchronize");
  CHECK("cudaMemset managed", memset_fn(m, 0, 1 << 16));
  CHECK("cudaDeviceSynchronize", sync());
  if (m[5] != 0.0f) { printf("managed memset not seen: %f\n", m[5]); return 1; }
  /* The host writes managed memory, then a default-direction copy (cuMemcpy) reads it on
     the server: the server's copy must be brought up to date first. */
  m[9] = 7.0f;
  float row[16] = {0};
  void *dm = 0;
  CHECK("cudaMalloc row", alloc(&dm, sizeof row));
  CHECK("cudaMemcpy managed to device", copy(dm, m, sizeof row, 4));
  CHECK("cudaMemcpy device to host", copy(row, dm, sizeof row, 4));
  if (row[9] != 7.0f) { printf("the copy read stale managed memory: %f\n", row[9]); return 1; }
  CHECK("cudaFree row", release(dm));
  CHECK("cudaFree managed", release(m));
  /* A stream, an event and host functions in stream order around an async round trip
     (a newer runtime reaches the driver's newer entry points for some of them). */
  int (*stream_create)(void **) = (int (*)(void **))dlsym(rt, "cudaStreamCreate");
  int (*host_func)(void *, void (*)(void *), void *) = (int (*)(void *, void (*)(void *), void *))dlsym(rt, "cudaLaunchHostFunc");
  int (*host_func_v2)(void *, void (*)(void *), void *, unsigned) =
      (int (*)(void *, void (*)(void *), void *, unsigned))dlsym(rt, "cudaLaunchHostFunc_v2");
  int (*copy_async)(void *, const void *, size_t, int, void *) =
      (int (*)(void *, const void *, size_t, int, void *))dlsym(rt, "cudaMemcpyAsync");
  int (*event_create)(void **) = (int (*)(void **))dlsym(rt, "cudaEventCreate");
  int (*event_record)(void *, void *) = (int (*)(void *, void *))dlsym(rt, "cudaEventRecord");
  int (*event_sync)(void *) = (int (*)(void *))dlsym(rt, "cudaEventSynchronize");
  int (*stream_sync)(void *) = (int (*)(void *))dlsym(rt, "cudaStreamSynchronize");
  void *s = 0, *ev = 0, *ds = 0;
  /* cudaLaunchHostFunc_v2 needs a 13.5 driver: on an older one the runtime says so itself
     (cudaErrorCallRequiresNewerDriver), as it would natively. */
  int newer = host_func_v2 && v >= 13050;
  int ran = 0, want = newer ? 3 : 2;
  char src[256], dst[256];
  for (int i = 0; i < 256; i++) src[i] = (char)(255 - i);
  memset(dst, 0, sizeof dst);
  CHECK("cudaStreamCreate", stream_create(&s));
  CHECK("cudaEventCreate", event_create(&ev));
  CHECK("cudaMalloc stream", alloc(&ds, sizeof src));
  CHECK("cudaLaunchHostFunc", host_func(s, bump, &ran));
  CHECK("cudaMemcpyAsync H2D", copy_async(ds, src, sizeof src, 1, s));
  if (newer) CHECK("cudaLaunchHostFunc_v2", host_func_v2(s, bump, &ran, 0));
  else if (host_func_v2 && host_func_v2(s, bump, &ran, 0) != 36) { printf("cudaLaunchHostFunc_v2 on driver %d\n", v); return 1; }
  CHECK("cudaMemcpyAsync D2H", copy_async(dst, ds, sizeof dst, 2, s));
  CHECK("cudaLaunchHostFunc again", host_func(s, bump, &ran));
  CHECK("cudaEventRecord", event_record(ev, s));
  CHECK("cudaEventSynchronize", event_sync(ev));
  CHECK("cudaStreamSynchronize", stream_sync(s));
  if (ran != want || memcmp(src, dst, sizeof src)) { printf("stream order: %d of %d functions ran\n", ran, want); return 1; }
  CHECK("cudaFree stream", release(ds));
  printf("devices %d driver %d OK\n", n, v);
  return 0;
}
"#;

/// dlopen in a Chidori program: a library found through its caller's RUNPATH (the shim's
/// `dlopen` must keep the caller's identity), the program itself (NULL), and the machine's
/// own video-engine library, which is refused although one is on the library path.
const DLOPEN: &str = r#"
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
int main(int argc, char **argv) {
  if (argc < 2) return 2;
  void *outer = dlopen(argv[1], RTLD_NOW);
  if (!outer) { printf("outer: %s\n", dlerror()); return 3; }
  int (*load)(void) = (int (*)(void))dlsym(outer, "outer_load");
  printf("inner through its caller's RUNPATH: %s\n", load && load() ? "found" : "missing");
  void *cuvid = dlopen("libnvcuvid.so.1", RTLD_NOW);
  const char *err = cuvid ? "" : dlerror();
  printf("libnvcuvid: %s\n", cuvid ? "loaded" : strstr(err, "hidden by chidori run") ? "hidden" : err);
  printf("the program itself: %s\n", dlopen(NULL, RTLD_NOW) ? "ok" : "NULL");
  return 0;
}
"#;

#[test]
fn dlopen_keeps_its_callers_search_path_and_hides_the_machines_video_engines() {
    let server = server();
    let dir = chidori_tests::scratch("dlopen");
    let write = |name: &str, text: &str| {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
    };
    std::fs::create_dir_all(dir.join("inner")).unwrap();
    std::fs::create_dir_all(dir.join("engines")).unwrap();
    let inner = write("inner.c", "int inner_value(void) { return 7; }\n");
    chidori_tests::cc(&inner, &dir.join("inner/libinner.so"), &["-shared", "-fPIC"]);
    let outer = write(
        "outer.c",
        "#include <dlfcn.h>\nint outer_load(void) { return dlopen(\"libinner.so\", RTLD_NOW) != 0; }\n",
    );
    let outer_so = dir.join("libouter.so");
    chidori_tests::cc(
        &outer,
        &outer_so,
        &["-shared", "-fPIC", "-Wl,-rpath,$ORIGIN/inner", "-Wl,--enable-new-dtags", "-ldl"],
    );
    // A stand-in for the driver's libnvcuvid.so.1 on this machine's library path.
    let engine = write("engine.c", "int engine_present;\n");
    chidori_tests::cc(
        &engine,
        &dir.join("engines/libnvcuvid.so.1"),
        &["-shared", "-fPIC", "-Wl,-soname,libnvcuvid.so.1"],
    );
    let main = write("dlopen.c", DLOPEN);
    let exe = dir.join("dlopen");
    chidori_tests::cc(&main, &exe, &["-ldl"]);

    let native = Command::new(&exe).arg(&outer_so).env("LD_LIBRARY_PATH", dir.join("engines")).output().unwrap();
    assert_eq!(
        String::from_utf8_lossy(&native.stdout),
        "inner through its caller's RUNPATH: found\nlibnvcuvid: loaded\nthe program itself: ok\n"
    );
    let out =
        run_cmd(&server.address, &exe).arg(&outer_so).env("LD_LIBRARY_PATH", dir.join("engines")).output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert_eq!(
        stdout, "inner through its caller's RUNPATH: found\nlibnvcuvid: hidden\nthe program itself: ok\n",
        "{stderr}"
    );
}

/// CUDA 13.5's new entry points of both APIs, in a program built against its headers: host
/// functions with a sync mode, single copies with attributes (1D both ways, 3D between
/// pitched device memory), parameter counts of a module's function and a registered kernel,
/// and a graph node made and set through the new `_v3`/`_v2` forms.
const CUDA_13_5_CALLS: &str = r#"
#include <cuda.h>
#include <cuda_runtime_api.h>
typedef struct { int magic; int version; const void *data; void *filename_or_fatbins; } wrapper_t;
extern void **__cudaRegisterFatBinary(void *);
extern void __cudaRegisterFatBinaryEnd(void **);
extern void __cudaRegisterFunction(void **, const char *, char *, const char *, int, void *, void *, void *, void *, int *);
static wrapper_t wrapper = {0x466243b1, 1, fb, 0};
static void host_stub(void) {}
static void bump(void *p) { ++*(int *)p; }
int main(void) {
  void **h = __cudaRegisterFatBinary(&wrapper);
  __cudaRegisterFunction(h, (const char *)host_stub, "_Z5otherPf", "_Z5otherPf", -1, 0, 0, 0, 0, 0);
  __cudaRegisterFatBinaryEnd(h);
  size_t count = 0;
  CHECK(cudaFuncGetParamCount((const void *)host_stub, &count));
  EXPECT(count == 1);
  EXPECT(cudaFuncGetParamCount((const void *)host_stub, NULL) == cudaErrorInvalidValue);
  cudaGetLastError();

  CUmodule mod; CUfunction f;
  EXPECT(cuModuleLoadData(&mod, fb) == CUDA_SUCCESS);
  EXPECT(cuModuleGetFunction(&f, mod, "_Z5otherPf") == CUDA_SUCCESS);
  count = 0;
  EXPECT(cuFuncGetParamCount(f, &count) == CUDA_SUCCESS && count == 1);
  EXPECT(cuFuncGetParamCount(NULL, &count) == CUDA_ERROR_INVALID_HANDLE);

  cudaStream_t s;
  CHECK(cudaStreamCreate(&s));
  int runs = 0;
  CHECK(cudaLaunchHostFunc_v2(s, bump, &runs, cudaHostTaskBlocking));
  EXPECT(cuLaunchHostFunc_v2((CUstream)s, bump, &runs, CU_HOST_TASK_SPINWAIT) == CUDA_SUCCESS);
  EXPECT(cudaLaunchHostFunc_v2(s, bump, &runs, 7) == cudaErrorInvalidValue);
  cudaGetLastError();
  CHECK(cudaStreamSynchronize(s));
  EXPECT(runs == 2);

  int host[256], back[256];
  for (int i = 0; i < 256; ++i) host[i] = i * 7;
  int *dev;
  CHECK(cudaMalloc((void **)&dev, sizeof host));
  struct cudaMemcpyAttributes attr;
  memset(&attr, 0, sizeof attr);
  attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
  CHECK(cudaMemcpyWithAttributesAsync(dev, host, sizeof host, &attr, s));
  memset(back, 0, sizeof back);
  CUmemcpyAttributes cu_attr;
  memset(&cu_attr, 0, sizeof cu_attr);
  cu_attr.srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
  EXPECT(cuMemcpyWithAttributesAsync((CUdeviceptr)back, (CUdeviceptr)dev, sizeof back, &cu_attr, (CUstream)s) == CUDA_SUCCESS);
  CHECK(cudaStreamSynchronize(s));
  EXPECT(memcmp(host, back, sizeof host) == 0);
  EXPECT(cudaMemcpyWithAttributesAsync(dev, host, sizeof host, NULL, s) == cudaErrorInvalidValue);
  cudaGetLastError();

  /* A 3D copy of 16 x 4 x 2 bytes between two pitched allocations, then the whole back. */
  int *dev2;
  CHECK(cudaMalloc((void **)&dev2, sizeof host));
  CHECK(cudaMemset(dev2, 0, sizeof host));
  struct cudaMemcpy3DBatchOp op;
  memset(&op, 0, sizeof op);
  op.src.type = cudaMemcpyOperandTypePointer;
  op.src.op.ptr.ptr = dev;
  op.src.op.ptr.rowLength = 64;
  op.src.op.ptr.layerHeight = 8;
  op.dst.type = cudaMemcpyOperandTypePointer;
  op.dst.op.ptr.ptr = dev2;
  op.dst.op.ptr.rowLength = 64;
  op.dst.op.ptr.layerHeight = 8;
  op.extent.width = 16; op.extent.height = 4; op.extent.depth = 2;
  op.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
  CHECK(cudaMemcpy3DWithAttributesAsync(&op, 0, s));
  CHECK(cudaStreamSynchronize(s));
  CHECK(cudaMemcpy(back, dev2, sizeof back, cudaMemcpyDeviceToHost));
  const unsigned char *a = (const unsigned char *)host, *b = (const unsigned char *)back;
  int same = 1;
  for (int z = 0; z < 2; ++z)
    for (int y = 0; y < 8; ++y)
      for (int x = 0; x < 64; ++x) {
        size_t at = (size_t)z * 512 + (size_t)y * 64 + x;
        int copied = x < 16 && y < 4;
        if (b[at] != (copied ? a[at] : 0)) same = 0;
      }
  EXPECT(same);

  /* A memset node made with cuGraphAddNode_v3, set anew with cuGraphNodeSetParams_v2. */
  CUcontext ctx;
  EXPECT(cuCtxGetCurrent(&ctx) == CUDA_SUCCESS);
  CUgraph g;
  CUgraphNode node;
  EXPECT(cuGraphCreate(&g, 0) == CUDA_SUCCESS);
  CUgraphNodeParams np;
  memset(&np, 0, sizeof np);
  np.type = CU_GRAPH_NODE_TYPE_MEMSET;
  np.memset.dst = (CUdeviceptr)dev2; np.memset.value = 0x11; np.memset.elementSize = 1;
  np.memset.width = 64; np.memset.height = 1; np.memset.pitch = 64; np.memset.ctx = ctx;
  EXPECT(cuGraphAddNode_v3(&node, g, NULL, NULL, 0, &np) == CUDA_SUCCESS);
  np.memset.value = 0x22;
  EXPECT(cuGraphNodeSetParams_v2(node, &np) == CUDA_SUCCESS);
  CUgraphExec exec;
  EXPECT(cuGraphInstantiate(&exec, g, 0) == CUDA_SUCCESS);
  EXPECT(cuGraphLaunch(exec, (CUstream)s) == CUDA_SUCCESS);
  CHECK(cudaStreamSynchronize(s));
  CHECK(cudaMemcpy(back, dev2, 128, cudaMemcpyDeviceToHost));
  EXPECT(b[0] == 0x22 && b[63] == 0x22 && b[64] != 0x22);
  EXPECT(cuGraphExecDestroy(exec) == CUDA_SUCCESS && cuGraphDestroy(g) == CUDA_SUCCESS);
  printf("OK\n");
  return 0;
}
"#;

#[test]
fn cuda_13_5_host_functions_copies_with_attributes_and_parameter_counts_work() {
    let server = server();
    let path = chidori_tests::root().join("tests/fixtures/fatbin/k_multi.fatbin");
    let bytes: Vec<String> = std::fs::read(path).unwrap().iter().map(|b| b.to_string()).collect();
    let image = format!(
        "#include <string.h>\nstatic const unsigned char fb[] __attribute__((aligned(16))) = {{{}}};\n",
        bytes.join(",")
    );
    let source = format!("{image}{CHECKS}{CUDA_13_5_CALLS}");
    let exe = program_against("13.5", "cuda-13-5-calls", &source, &["-l:libcuda.so.1"]);
    let out = run_cmd(&server.address, &exe).output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && stdout.trim() == "OK", "{stdout}\n{stderr}");
    assert!(!stderr.contains("NOT_SUPPORTED"), "{stderr}");
}

#[test]
fn nvidias_runtime_runs_on_the_drivers_private_tables() {
    let server = server();
    let dir = chidori_tests::scratch("real-runtime");
    let src = dir.join("real_runtime.c");
    std::fs::write(&src, REAL_RUNTIME).unwrap();
    let exe = dir.join("real_runtime");
    chidori_tests::cc(&src, &exe, &["-ldl"]);
    // The runtime of the driver's own version, and a newer one on the same (13.0) driver, as
    // CUDA's minor version compatibility allows; 13.5's also requires a private table of tool
    // support (`TOOL_EXTRA` in `custom/export.rs`) before it answers anything.
    let runtimes = [
        chidori_tests::runtime_library("13.0", "libcudart.so.13"),
        chidori_tests::runtime_library("13.5", "libcudart.so.13"),
    ];
    for runtime in runtimes {
        let out = run_cmd(&server.address, &exe).arg(&runtime).output().unwrap();
        let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(
            out.status.success() && stdout.contains("devices 1 driver 13000 OK"),
            "{}: {stdout}\n{stderr}",
            runtime.display()
        );
        assert!(!stderr.contains("NOT_SUPPORTED") && !stderr.contains("ERROR"), "{stderr}");
    }
}

/// Large copies over bulk lanes: host-to-device and back, synchronous and on a stream, in
/// order with small calls on the session's connection, from two threads at once, a failing
/// chunk, and the same program with lanes off.
const LANE_COPIES: &str = include_str!("../../gpu/bench/lane_copies.c");

#[test]
fn large_copies_travel_on_bulk_lanes_with_their_bytes_intact() {
    let server = server();
    let exe = program_with("lane-copies", LANE_COPIES, &["-lpthread"]);
    // Lanes asked for, none, and asked for in a session that survives a dropped connection
    // (whose frames lanes would not carry across a reconnection: none are opened).
    for (lanes, resume, opens) in [("4", "0", true), ("0", "0", false), ("4", "1", false)] {
        let out = run_cmd(&server.address, &exe)
            .env("CHIDORI_LANES", lanes)
            .env("CHIDORI_RESUME", resume)
            .env("CHIDORI_LOG", "chidori::lanes=debug")
            .output()
            .unwrap();
        let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success() && stdout.contains("OK"), "lanes {lanes}: {stdout}\n{stderr}");
        assert_eq!(stderr.contains("4 bulk lanes open"), opens, "lanes {lanes}, resume {resume}: {stderr}");
    }
}

/// Cluster occupancy queries travel as a launch's configuration does (its attributes
/// included) and are answered by the server's driver; what is not the session's is refused
/// there, a NULL output or configuration here, and the session goes on.
const CLUSTER_QUERIES: &str = r#"
#include <stdio.h>
#include <cuda.h>
int main(void) {
    CUdevice dev;
    CUcontext ctx;
    if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) || cuCtxSetCurrent(ctx)) return 2;
    CUlaunchConfig config = {0};
    config.gridDimX = 64; config.gridDimY = 1; config.gridDimZ = 1;
    config.blockDimX = 128; config.blockDimY = 1; config.blockDimZ = 1;
    CUlaunchAttribute cluster = {0};
    cluster.id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    cluster.value.clusterDim.x = 2; cluster.value.clusterDim.y = 1; cluster.value.clusterDim.z = 1;
    config.attrs = &cluster;
    config.numAttrs = 1;
    int n = -1;
    CUresult null_out = cuOccupancyMaxActiveClusters(NULL, (CUfunction)0x1234, &config);
    CUresult made_up = cuOccupancyMaxActiveClusters(&n, (CUfunction)0x1234, &config);
    CUresult null_config = cuOccupancyMaxPotentialClusterSize(&n, (CUfunction)0x1234, NULL);
    CUresult potential = cuOccupancyMaxPotentialClusterSize(&n, (CUfunction)0x1234, &config);
    CUdeviceptr p;
    CUresult after = cuMemAlloc(&p, 64);
    printf("null=%d made_up=%d null_config=%d potential=%d n=%d after=%d\n", null_out, made_up, null_config,
           potential, n, after);
    return 0;
}
"#;

#[test]
fn cluster_occupancy_queries_reach_the_server_with_their_configuration() {
    let server = server();
    let exe = program_with("cluster-queries", CLUSTER_QUERIES, &["-l:libcuda.so.1"]);
    let output = run_cmd(&server.address, &exe).output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stdout}\n{stderr}");
    // 1: CUDA_ERROR_INVALID_VALUE (here); 400: CUDA_ERROR_INVALID_HANDLE (the server: no
    // function of this session).
    assert_eq!(stdout.trim(), "null=1 made_up=400 null_config=1 potential=400 n=-1 after=0", "{stderr}");
}

const NVML_TABLE: &str = r#"
#include <stdio.h>
extern int nvmlInternalGetExportTable(const void **table, const void *id);
int main(void) {
  static const unsigned char id[16] = {0xc4, 0xfe, 0x3e, 0x6c};
  const void *table = (const void *)1;
  int s = nvmlInternalGetExportTable(&table, id);
  printf("%d %s\n", s, table ? "set" : "null");
  return 0;
}
"#;

/// `nvidia-smi` under `chidori run` is the server's (here a stand-in that prints its
/// arguments): run directly, and from a program through the PATH `chidori run` gives it;
/// what would change a GPU or write a file on the server is refused before anything runs.
#[test]
fn nvidia_smi_runs_on_the_server_for_queries_only() {
    let dir = chidori_tests::scratch("nvidia_smi");
    let fake = dir.join("server-nvidia-smi");
    chidori_tests::script(&fake, "#!/bin/sh\necho \"server nvidia-smi: $*\"\necho note >&2\nexit 0\n");
    let fake = fake.to_str().unwrap();
    let server = EmulatedServer::start_env(&chidori(), Some(&profile()), &[], &[("CHIDORI_NVIDIA_SMI", fake)])
        .expect("starting an emulated server");
    let run = |args: &[&str]| {
        let mut cmd = Command::new(chidori());
        cmd.args(["run", "-s", &server.address, "--lib-dir"]).arg(chidori_tests::shim_dir()).arg("--");
        cmd.env("XDG_CACHE_HOME", dir.join("cache"));
        cmd.args(args).output().unwrap()
    };
    let out = run(&["nvidia-smi", "-q", "-d", "MEMORY"]);
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert_eq!(stdout, "server nvidia-smi: -q --display=MEMORY\n");
    assert_eq!(stderr, "note\n");

    // A program's own nvidia-smi, found on its PATH.
    let out = run(&["sh", "-c", "nvidia-smi --query-gpu=name --format=csv"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(stdout, "server nvidia-smi: --query-gpu=name --format=csv\n");

    // The session sees one GPU of one: `-i 0` is it, `-i 1` none.
    let out = run(&["nvidia-smi", "-L", "-i", "1"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no such GPU in this session"));

    // A local nvidia-smi's first question to NVML: not answered, and the log says where the
    // server's is.
    let exe = program_with("nvml_table", NVML_TABLE, &["-l:libnvidia-ml.so.1"]);
    let out = run_cmd(&server.address, &exe).output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(stdout, "3 null\n", "{stderr}");
    assert!(stderr.contains("the `nvidia-smi` found on PATH is the server's"), "{stderr}");

    for refused in [&["nvidia-smi", "-pm", "1"][..], &["nvidia-smi", "-q", "-f", "/tmp/x"], &["nvidia-smi", "dmon"]] {
        let out = run(refused);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{refused:?}: {stderr}");
        assert!(stderr.contains("not run"), "{refused:?}: {stderr}");
        assert!(out.stdout.is_empty(), "{refused:?}");
    }
}

const NVML_LISTS: &str = r#"
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <cuda_runtime_api.h>
typedef struct { unsigned int pid; unsigned long long used; unsigned int gi, ci; } proc_t;
extern int nvmlInit_v2(void);
extern int nvmlDeviceGetHandleByIndex_v2(unsigned int, void **);
extern int nvmlDeviceGetSupportedMemoryClocks(void *, unsigned int *, unsigned int *);
extern int nvmlDeviceGetComputeRunningProcesses_v3(void *, unsigned int *, proc_t *);
extern int nvmlSystemGetProcessName(unsigned int, char *, unsigned int);
extern int nvmlVgpuTypeGetName(unsigned int, char *, unsigned int *);
int main(void) {
  void *dev = 0, *mem = 0;
  if (nvmlInit_v2() || nvmlDeviceGetHandleByIndex_v2(0, &dev) || cudaMalloc(&mem, 1 << 20)) { printf("setup\n"); return 1; }
  unsigned int n = 0, clocks[8];
  for (int i = 0; i < 8; i++) clocks[i] = 77;
  int s = nvmlDeviceGetSupportedMemoryClocks(dev, &n, 0);
  printf("clocks query %d n %u;", s, n);
  n = 2; s = nvmlDeviceGetSupportedMemoryClocks(dev, &n, clocks);
  printf(" short %d n %u c0 %u;", s, n, clocks[0]);
  n = 8; s = nvmlDeviceGetSupportedMemoryClocks(dev, &n, clocks);
  printf(" full %d n %u: %u %u %u %u;", s, n, clocks[0], clocks[1], clocks[2], clocks[3]);
  n = 5; s = nvmlDeviceGetSupportedMemoryClocks(dev, &n, 0);
  printf(" null %d;", s);
  proc_t procs[4];
  memset(procs, 0xab, sizeof procs);
  n = 0; s = nvmlDeviceGetComputeRunningProcesses_v3(dev, &n, 0);
  printf(" procs query %d n %u;", s, n);
  n = 2; s = nvmlDeviceGetComputeRunningProcesses_v3(dev, &n, procs);
  printf(" procs short %d n %u first %x;", s, n, procs[0].pid);
  n = 4; s = nvmlDeviceGetComputeRunningProcesses_v3(dev, &n, procs);
  printf(" procs %d n %u mine %d used %llu next %x;", s, n, procs[0].pid == (unsigned)getpid(), procs[0].used, procs[1].pid);
  char name[256];
  s = nvmlSystemGetProcessName(procs[0].pid, name, sizeof name);
  const char *base = strrchr(name, '/');
  printf(" name %d %s;", s, base ? base + 1 : name);
  char shorter[8], vname[64];
  unsigned int size = sizeof shorter;
  s = nvmlVgpuTypeGetName(1, shorter, &size);
  printf(" vgpu short %d size %u;", s, size);
  size = sizeof vname;
  s = nvmlVgpuTypeGetName(1, vname, &size);
  printf(" vgpu %d %s\n", s, vname);
  return 0;
}
"#;

/// NVML's lists whose length the caller passes by pointer (`inout[*count]`): the count
/// query, a too-short array (the count needed, the array untouched), a full one (the
/// elements past the count keep the caller's bytes), a char buffer before its size; and
/// the GPU's process list cut to the program's own process, under its PID here, whose name
/// this machine gives.
#[test]
fn nvml_lists_sized_by_pointer_and_only_the_programs_own_process() {
    let server = server();
    let exe = program_with("nvml_lists", NVML_LISTS, &["-l:libnvidia-ml.so.1"]);
    let out = run_cmd(&server.address, &exe).output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert_eq!(
        stdout.trim(),
        "clocks query 7 n 3; short 7 n 3 c0 77; full 0 n 3: 4800 3201 1593 77; null 2; \
         procs query 7 n 3; procs short 7 n 3 first abababab; procs 0 n 1 mine 1 used 1048576 next abababab; \
         name 0 nvml_lists; \
         vgpu short 7 size 16; vgpu 0 GRID H200-1-18C",
        "{stderr}"
    );
}

/// Token ids to the GPU and back (int64 below 32,000: 4 of every 8 bytes are zero).
const TOKEN_IDS: &str = r#"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cuda_runtime_api.h>
int main(void) {
  size_t n = 1 << 20, bytes = n * 8;
  long long *ids = malloc(bytes), *back = malloc(bytes);
  unsigned long long x = 88172645463325252ull;
  for (size_t i = 0; i < n; i++) {
    x ^= x << 13; x ^= x >> 7; x ^= x << 17;
    ids[i] = (long long)(x % 32000);
  }
  void *d;
  if (cudaMalloc(&d, bytes) || cudaMemcpy(d, ids, bytes, cudaMemcpyHostToDevice)) return 2;
  if (cudaMemcpy(back, d, bytes, cudaMemcpyDeviceToHost)) return 3;
  printf("%s\n", memcmp(ids, back, bytes) ? "DIFFER" : "OK");
  return 0;
}
"#;

/// Issue 19 item 3: large inputs and outputs travel zstd-compressed where that makes them
/// at least 10% smaller (`CHIDORI_COMPRESS=1` here; by default on a WAN), expanded by the
/// worker and by the client; the program gets its bytes back exactly.
#[test]
fn large_copies_travel_compressed_where_that_pays() {
    let server = server();
    let exe = program("token_ids", TOKEN_IDS);
    // Bytes sent and received by cudaMemcpy (one copy each way), from the trace.
    let wire = |compress: &str| {
        let mut cmd = Command::new(chidori());
        cmd.args(["run", "--trace", "-s", &server.address, "--lib-dir"]).arg(chidori_tests::shim_dir());
        cmd.arg("--").arg(&exe).env("CHIDORI_LEARNED", "0").env("CHIDORI_COMPRESS", compress);
        let out = cmd.output().unwrap();
        let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert_eq!(stdout, "OK\n", "{stderr}");
        // The trace row: calls, round trips, bytes sent, bytes received, ...
        let row = stderr.lines().find(|l| l.starts_with("cudaMemcpy ")).unwrap_or_else(|| panic!("{stderr}"));
        let column = |n: usize| {
            row.split_whitespace().nth(n).and_then(|b| b.parse::<u64>().ok()).unwrap_or_else(|| panic!("{row}"))
        };
        (column(3), column(4))
    };
    let (plain_sent, plain_received) = wire("0");
    let (packed_sent, packed_received) = wire("1");
    assert!(plain_sent >= 8 << 20 && plain_received >= 8 << 20, "{plain_sent} {plain_received}");
    assert!(packed_sent * 3 < plain_sent, "8 MiB of token ids sent as {packed_sent} bytes (plain: {plain_sent})");
    assert!(
        packed_received * 3 < plain_received,
        "8 MiB of token ids received as {packed_received} bytes (plain: {plain_received})"
    );
}

/// CUDA IPC as NVIDIA's simpleIPC and torch's `multiprocessing` use it: a parent exports
/// device memory and an interprocess event, a child process (another session) opens both,
/// reads the parent's bytes, writes its own and records the event; the parent sees them.
/// A handle no session exported, and a close of memory never opened, are refused.
const IPC: &str = r#"
#include <cuda_runtime_api.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>
enum { N = 4096 };
static int child(const char *path) {
  cudaIpcMemHandle_t mem; cudaIpcEventHandle_t ev;
  FILE *f = fopen(path, "rb");
  EXPECT(f && fread(&mem, sizeof mem, 1, f) == 1 && fread(&ev, sizeof ev, 1, f) == 1);
  fclose(f);
  unsigned char *d = NULL;
  CHECK(cudaIpcOpenMemHandle((void **)&d, mem, cudaIpcMemLazyEnablePeerAccess));
  struct cudaPointerAttributes a;
  CHECK(cudaPointerGetAttributes(&a, d + 100));
  EXPECT(a.type == cudaMemoryTypeDevice);
  unsigned char h[N];
  CHECK(cudaMemcpy(h, d, N, cudaMemcpyDefault));
  for (int i = 0; i < N; i++) EXPECT(h[i] == (unsigned char)(i * 7));
  for (int i = 0; i < N; i++) h[i] = (unsigned char)(255 - i);
  CHECK(cudaMemcpy(d, h, N, cudaMemcpyDefault));
  /* Opened again: the same address, which stays until its last close. */
  unsigned char *again = NULL;
  CHECK(cudaIpcOpenMemHandle((void **)&again, mem, cudaIpcMemLazyEnablePeerAccess));
  EXPECT(again == d);
  CHECK(cudaIpcCloseMemHandle(again));
  CHECK(cudaMemcpy(h, d, 16, cudaMemcpyDefault));
  EXPECT(h[1] == 254);
  cudaEvent_t e;
  CHECK(cudaIpcOpenEventHandle(&e, ev));
  CHECK(cudaEventRecord(e, 0));
  CHECK(cudaEventSynchronize(e));
  CHECK(cudaIpcCloseMemHandle(d));
  CHECK(cudaEventDestroy(e));
  printf("child OK\n");
  return 0;
}
int main(int argc, char **argv) {
  if (argc == 3) return child(argv[2]);
  unsigned char *d, h[N];
  CHECK(cudaMalloc((void **)&d, N));
  for (int i = 0; i < N; i++) h[i] = (unsigned char)(i * 7);
  CHECK(cudaMemcpy(d, h, N, cudaMemcpyHostToDevice));
  cudaIpcMemHandle_t mem; cudaIpcEventHandle_t ev; cudaEvent_t e;
  CHECK(cudaIpcGetMemHandle(&mem, d));
  CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming | cudaEventInterprocess));
  CHECK(cudaIpcGetEventHandle(&ev, e));
  char path[256];
  snprintf(path, sizeof path, "%s.handles", argv[0]);
  FILE *f = fopen(path, "wb");
  EXPECT(f && fwrite(&mem, sizeof mem, 1, f) == 1 && fwrite(&ev, sizeof ev, 1, f) == 1);
  fclose(f);
  /* A handle no session exported opens nothing; memory never opened does not close. */
  cudaIpcMemHandle_t forged;
  memset(&forged, 0x5a, sizeof forged);
  void *p = NULL;
  EXPECT(cudaIpcOpenMemHandle(&p, forged, cudaIpcMemLazyEnablePeerAccess) != cudaSuccess);
  EXPECT(cudaIpcCloseMemHandle(d) != cudaSuccess);
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    execl(argv[0], argv[0], "child", path, (char *)NULL);
    _exit(127);
  }
  int status = 0;
  EXPECT(pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0);
  CHECK(cudaEventSynchronize(e));
  CHECK(cudaMemcpy(h, d, N, cudaMemcpyDeviceToHost));
  for (int i = 0; i < N; i++) EXPECT(h[i] == (unsigned char)(255 - i));
  CHECK(cudaEventDestroy(e));
  CHECK(cudaFree(d));
  printf("parent OK\n");
  return 0;
}
"#;

#[test]
fn processes_share_memory_and_events_by_cuda_ipc() {
    let server = server();
    let exe = program("ipc", &format!("{CHECKS}{IPC}"));
    let out = run_cmd(&server.address, &exe).output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && stdout.contains("child OK") && stdout.contains("parent OK"), "{stdout}\n{stderr}");
    assert!(!stderr.contains("NOT_SUPPORTED"), "{stderr}");
    // The second open of the same handle is the memory the first recorded (no second
    // reservation of its addresses that would find the first one in the way).
    assert!(!stderr.contains("overlaps"), "{stderr}");
}

/// Shareable file descriptors as NVIDIA's memMapIPCDrv uses them: a parent exports a VMM
/// allocation as a POSIX descriptor, a child process (another session) inherits it, imports
/// and maps it, reads the parent's bytes and writes its own, which the parent then sees.
/// A descriptor that no export made, and another handle type, are refused.
const IPC_FD: &str = r#"
#include <cuda.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>
enum { SIZE = 2 << 20, N = 4096 };
static CUdeviceptr mapped(CUmemGenericAllocationHandle h) {
  CUdeviceptr p = 0;
  if (cuMemAddressReserve(&p, SIZE, 0, 0, 0) != CUDA_SUCCESS) return 0;
  if (cuMemMap(p, SIZE, 0, h, 0) != CUDA_SUCCESS) return 0;
  CUmemAccessDesc access = {{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
  if (cuMemSetAccess(p, SIZE, &access, 1) != CUDA_SUCCESS) return 0;
  return p;
}
static int context(void) {
  CUdevice dev; CUcontext ctx;
  CHECK(cuInit(0));
  CHECK(cuDeviceGet(&dev, 0));
  CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
  CHECK(cuCtxSetCurrent(ctx));
  return 0;
}
static int child(int fd) {
  if (context()) return 1;
  CUmemGenericAllocationHandle h;
  CHECK(cuMemImportFromShareableHandle(&h, (void *)(uintptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
  close(fd);
  CUdeviceptr p = mapped(h);
  EXPECT(p != 0);
  unsigned char b[N];
  CHECK(cuMemcpyDtoH(b, p, N));
  for (int i = 0; i < N; i++) EXPECT(b[i] == (unsigned char)(i * 5));
  for (int i = 0; i < N; i++) b[i] = (unsigned char)(3 + i);
  CHECK(cuMemcpyHtoD(p, b, N));
  CHECK(cuMemUnmap(p, SIZE));
  CHECK(cuMemRelease(h));
  CHECK(cuMemAddressFree(p, SIZE));
  printf("child OK\n");
  return 0;
}
int main(int argc, char **argv) {
  if (argc == 3) return child(atoi(argv[2]));
  if (context()) return 1;
  CUmemAllocationProp prop;
  memset(&prop, 0, sizeof prop);
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  CUmemGenericAllocationHandle h;
  CHECK(cuMemCreate(&h, SIZE, &prop, 0));
  CUdeviceptr p = mapped(h);
  EXPECT(p != 0);
  unsigned char b[N];
  for (int i = 0; i < N; i++) b[i] = (unsigned char)(i * 5);
  CHECK(cuMemcpyHtoD(p, b, N));
  int fd = -1;
  CHECK(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  EXPECT(fd >= 0);
  /* Another handle type, and a descriptor no export made. */
  int other = -1;
  EXPECT(cuMemExportToShareableHandle(&other, h, CU_MEM_HANDLE_TYPE_WIN32, 0) == CUDA_ERROR_NOT_SUPPORTED);
  int devnull = open("/dev/null", O_RDONLY);
  CUmemGenericAllocationHandle bogus;
  EXPECT(cuMemImportFromShareableHandle(&bogus, (void *)(uintptr_t)devnull, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) != CUDA_SUCCESS);
  close(devnull);
  char number[16];
  snprintf(number, sizeof number, "%d", fd);
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    execl(argv[0], argv[0], "child", number, (char *)NULL);
    _exit(127);
  }
  int status = 0;
  EXPECT(pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0);
  close(fd);
  CHECK(cuMemcpyDtoH(b, p, N));
  for (int i = 0; i < N; i++) EXPECT(b[i] == (unsigned char)(3 + i));
  CHECK(cuMemUnmap(p, SIZE));
  CHECK(cuMemRelease(h));
  CHECK(cuMemAddressFree(p, SIZE));
  printf("parent OK\n");
  return 0;
}
"#;

#[test]
fn processes_share_virtual_memory_by_file_descriptors() {
    let server = server();
    let exe = program_with("ipc-fd", &format!("{CHECKS}{IPC_FD}"), &["-l:libcuda.so.1"]);
    let out = run_cmd(&server.address, &exe).output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && stdout.contains("child OK") && stdout.contains("parent OK"), "{stdout}\n{stderr}");
}

/// A graph captured with a copy into a stack variable (NVIDIA's conjugateGradientCudaGraphs):
/// the variable keeps the program's value until the graph runs, then holds the GPU's.
const CAPTURED_STACK_RESULT: &str = r#"
#include <cuda_runtime_api.h>
int main(void) {
  float *d;
  CHECK(cudaMalloc((void **)&d, sizeof(float)));
  float seven = 7.0f;
  CHECK(cudaMemcpy(d, &seven, sizeof seven, cudaMemcpyHostToDevice));
  cudaStream_t s, other;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CHECK(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking));
  float r1 = 0.0f;
  CHECK(cudaMemcpyAsync(&r1, d, sizeof(float), cudaMemcpyDeviceToHost, s));
  CHECK(cudaStreamSynchronize(s));
  EXPECT(r1 == 7.0f);
  cudaGraph_t g;
  cudaGraphExec_t x;
  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  CHECK(cudaMemsetAsync(d, 0, sizeof(float), s));
  CHECK(cudaMemcpyAsync(&r1, d, sizeof(float), cudaMemcpyDeviceToHost, s));
  CHECK(cudaStreamEndCapture(s, &g));
  CHECK(cudaGraphInstantiate(&x, g, 0));
  CHECK(cudaStreamSynchronize(s));
  EXPECT(r1 == 7.0f);
  int runs = 0;
  while (r1 > 1.0f && runs < 3) {
    CHECK(cudaGraphLaunch(x, other));
    CHECK(cudaStreamSynchronize(other));
    runs++;
  }
  EXPECT(runs == 1 && r1 == 0.0f);
  printf("OK\n");
  return 0;
}
"#;

#[test]
fn a_captured_copy_into_a_stack_variable_lands_when_the_graph_runs() {
    prints_ok("captured-stack-result", CAPTURED_STACK_RESULT, &[]);
}

/// The driver's copies between the program's memory and the device on a capturing stream
/// (what a statically linked runtime's cudaMemcpyAsync becomes): graph nodes that copy the
/// server's mirror of the program's memory when the graph runs, never at capture (NVIDIA's
/// conjugateGradientCudaGraphs reads its stack variable between capture and launch).
const DRIVER_CAPTURED_COPIES: &str = r#"
#include <cuda.h>
int main(void) {
  CUdevice dev;
  CUcontext ctx;
  CHECK(cuInit(0));
  CHECK(cuDeviceGet(&dev, 0));
  CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
  CHECK(cuCtxSetCurrent(ctx));
  CUdeviceptr a, b;
  CHECK(cuMemAlloc(&a, 4));
  CHECK(cuMemAlloc(&b, 4));
  CUstream s, other;
  CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CHECK(cuStreamCreate(&other, CU_STREAM_NON_BLOCKING));
  float r1 = 7.0f, in = 3.0f;
  CUgraph g;
  CUgraphExec x;
  CHECK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CHECK(cuMemcpyHtoDAsync(b, &in, 4, s));
  CHECK(cuMemcpyDtoDAsync(a, b, 4, s));
  CHECK(cuMemcpyDtoHAsync(&r1, a, 4, s));
  CHECK(cuStreamEndCapture(s, &g));
  CHECK(cuGraphInstantiate(&x, g, 0));
  CHECK(cuCtxSynchronize());
  EXPECT(r1 == 7.0f);
  for (int run = 1; run <= 2; run++) {
    in = 5.0f * run;
    CHECK(cuGraphLaunch(x, other));
    CHECK(cuStreamSynchronize(other));
    EXPECT(r1 == 5.0f * run);
  }
  printf("OK\n");
  return 0;
}
"#;

#[test]
fn driver_copies_on_a_capturing_stream_copy_the_programs_memory_when_the_graph_runs() {
    prints_ok("driver-captured-copies", DRIVER_CAPTURED_COPIES, &["-l:libcuda.so.1"]);
}

/// A graph's allocation used and freed outside the graph between launches (NVIDIA's
/// graphMemoryNodes): each launch allocates it again at the same address, which stays the
/// program's device memory for copies (cudaMemcpyDefault included) and frees.
const GRAPH_ALLOCATION_OUTSIDE: &str = r#"
#include <cuda_runtime_api.h>
enum { N = 1024 };
static float in[N], out[N];
int main(void) {
  for (int i = 0; i < N; i++) in[i] = (float)i;
  struct cudaMemAllocNodeParams ap;
  memset(&ap, 0, sizeof ap);
  ap.bytesize = sizeof in;
  ap.poolProps.allocType = cudaMemAllocationTypePinned;
  ap.poolProps.location.type = cudaMemLocationTypeDevice;
  ap.poolProps.location.id = 0;
  cudaGraph_t g;
  cudaGraphNode_t alloc, up, down;
  CHECK(cudaGraphCreate(&g, 0));
  CHECK(cudaGraphAddMemAllocNode(&alloc, g, NULL, 0, &ap));
  float *d = (float *)ap.dptr;
  EXPECT(d != NULL);
  CHECK(cudaGraphAddMemcpyNode1D(&up, g, &alloc, 1, d, in, sizeof in, cudaMemcpyHostToDevice));
  CHECK(cudaGraphAddMemcpyNode1D(&down, g, &up, 1, out, d, sizeof out, cudaMemcpyDeviceToHost));
  cudaGraphExec_t x;
  CHECK(cudaGraphInstantiate(&x, g, 0));
  CHECK(cudaGraphDestroy(g));
  cudaStream_t s;
  CHECK(cudaStreamCreate(&s));
  for (int run = 1; run <= 3; run++) {
    in[5] = 5.0f * run;
    memset(out, 0, sizeof out);
    CHECK(cudaGraphLaunch(x, s));
    CHECK(cudaStreamSynchronize(s));
    EXPECT(out[5] == 5.0f * run && out[7] == 7.0f);
    float back = 0;
    CHECK(cudaMemcpy(&back, d + 5, sizeof back, cudaMemcpyDefault));
    EXPECT(back == 5.0f * run);
    if (run == 2) {
      CHECK(cudaFreeAsync(d, s));
      CHECK(cudaStreamSynchronize(s));
    } else {
      CHECK(cudaFree(d));
    }
  }
  CHECK(cudaGraphExecDestroy(x));
  // The same with a stream-ordered allocation captured into a graph.
  float *c = NULL;
  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  CHECK(cudaMallocAsync((void **)&c, sizeof in, s));
  CHECK(cudaMemcpyAsync(c, in, sizeof in, cudaMemcpyHostToDevice, s));
  CHECK(cudaStreamEndCapture(s, &g));
  CHECK(cudaGraphInstantiate(&x, g, 0));
  for (int run = 1; run <= 2; run++) {
    in[9] = 9.0f * run;
    CHECK(cudaGraphLaunch(x, s));
    CHECK(cudaStreamSynchronize(s));
    float back = 0;
    CHECK(cudaMemcpy(&back, c + 9, sizeof back, cudaMemcpyDefault));
    EXPECT(back == 9.0f * run);
    CHECK(cudaFree(c));
  }
  printf("OK\n");
  return 0;
}
"#;

#[test]
fn a_graph_allocation_is_used_and_freed_outside_the_graph_between_launches() {
    prints_ok("graph-allocation-outside", GRAPH_ALLOCATION_OUTSIDE, &[]);
}

/// Contexts moved between threads as NVIDIA's threadMigration moves them: made and popped
/// (without asking for the popped handle) on the main thread, pushed, used and popped again
/// on another.
const CONTEXT_MIGRATION: &str = r#"
#include <cuda.h>
#include <pthread.h>
static CUcontext context;
static void *worker(void *result) {
  int *ok = (int *)result;
  CUcontext current = NULL;
  if (cuCtxPushCurrent(context) != CUDA_SUCCESS) return NULL;
  if (cuCtxGetCurrent(&current) != CUDA_SUCCESS || current != context) return NULL;
  CUdeviceptr p;
  int value = 41, back = 0;
  if (cuMemAlloc(&p, sizeof value) != CUDA_SUCCESS) return NULL;
  if (cuMemcpyHtoD(p, &value, sizeof value) != CUDA_SUCCESS) return NULL;
  if (cuMemcpyDtoH(&back, p, sizeof back) != CUDA_SUCCESS || back != 41) return NULL;
  if (cuMemFree(p) != CUDA_SUCCESS) return NULL;
  if (cuCtxPopCurrent(NULL) != CUDA_SUCCESS) return NULL;
  *ok = 1;
  return NULL;
}
int main(void) {
  CUdevice dev;
  CHECK(cuInit(0));
  CHECK(cuDeviceGet(&dev, 0));
  CHECK(cuDevicePrimaryCtxRetain(&context, dev));
  CHECK(cuCtxPushCurrent(context));
  CHECK(cuCtxPopCurrent(NULL));
  pthread_t thread;
  int ok = 0;
  EXPECT(pthread_create(&thread, NULL, worker, &ok) == 0 && pthread_join(thread, NULL) == 0);
  EXPECT(ok == 1);
  CUcontext popped = NULL;
  CHECK(cuCtxPushCurrent(context));
  CHECK(cuCtxPopCurrent(&popped));
  EXPECT(popped == context);
  CHECK(cuDevicePrimaryCtxRelease(dev));
  printf("OK\n");
  return 0;
}
"#;

#[test]
fn contexts_move_between_threads_and_pop_without_an_out_pointer() {
    prints_ok("context-migration", CONTEXT_MIGRATION, &["-l:libcuda.so.1", "-lpthread"]);
}

/// A texture over linear memory that reaches past its allocation, as NVIDIA's
/// convolutionFFT2D makes one (its padded row length): CUDA takes it, so does Chidori; one
/// that starts outside the session's memory is still refused.
const TEXTURE_PAST_ITS_ALLOCATION: &str = r#"
#include <cuda_runtime_api.h>
int main(void) {
  float *d;
  CHECK(cudaMalloc((void **)&d, 4096));
  struct cudaResourceDesc res;
  memset(&res, 0, sizeof res);
  res.resType = cudaResourceTypeLinear;
  res.res.linear.devPtr = d;
  res.res.linear.sizeInBytes = 4096 + 256;
  res.res.linear.desc = cudaCreateChannelDesc(32, 0, 0, 0, cudaChannelFormatKindFloat);
  struct cudaTextureDesc tex;
  memset(&tex, 0, sizeof tex);
  tex.readMode = cudaReadModeElementType;
  cudaTextureObject_t t = 0;
  CHECK(cudaCreateTextureObject(&t, &res, &tex, NULL));
  CHECK(cudaDestroyTextureObject(t));
  res.res.linear.devPtr = (void *)0x7e00dead0000ull;
  EXPECT(cudaCreateTextureObject(&t, &res, &tex, NULL) == cudaErrorInvalidValue);
  printf("OK\n");
  return 0;
}
"#;

#[test]
fn a_texture_may_reach_past_its_allocation_but_not_start_outside_the_sessions_memory() {
    prints_ok("texture-past", TEXTURE_PAST_ITS_ALLOCATION, &[]);
}
