//! Sessions that survive a dropped connection, end to end on the emulated backend: a relay
//! between client and server cuts every connection (with a reset, as a broken path looks)
//! while a program copies data to the GPU and back; the program must see only pauses and
//! its own data. Also: a client that does not come back in time gets a clear error, and
//! nobody but the session's client can take a session over.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chidori_protocol::frame::{self, Frame, Header, Kind};
use chidori_protocol::messages::{self, Refuse, RefuseReason, ResumeRequest};

fn chidori() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_chidori"))
}

/// A `chidori serve --backend emulated`; its log goes to a file (named in failures).
struct Server {
    child: Child,
    address: String,
    lines: Vec<String>,
    log: PathBuf,
}

impl Server {
    fn start(name: &str, extra: &[&str]) -> Server {
        let log = chidori_tests::scratch(name).join("server.log");
        let mut child = Command::new(chidori())
            .args(["serve", "--backend", "emulated", "--bind", "127.0.0.1", "--port", "0", "--profile"])
            .arg(chidori_tests::root().join("worker/profiles/nvidia-h200.json"))
            .args(["--heartbeat-secs", "1"])
            .args(extra)
            .env("CHIDORI_LOG", "info")
            .env("CHIDORI_RESUME_GRACE_SECS", "20")
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting chidori serve");
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let mut seen = Vec::new();
        let address = loop {
            let line = lines.next().expect("chidori serve exited before listening").unwrap();
            if let Some(rest) = line.strip_prefix("chidori serve: listening on ") {
                break rest.split(';').next().unwrap().trim().to_owned();
            }
            seen.push(line);
        };
        let mut file = std::fs::File::create(&log).unwrap();
        std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                let _ = writeln!(file, "{line}");
            }
        });
        Server { child, address, lines: seen, log }
    }

    /// The value after `flag` in the "clients connect with" line (a secure server).
    fn printed(&self, flag: &str) -> String {
        let line = self.lines.iter().find(|l| l.contains("clients connect with")).expect("a connect line");
        let mut words = line.split_whitespace();
        words.find(|w| *w == flag).unwrap_or_else(|| panic!("{flag} in {line}"));
        words.next().unwrap().to_owned()
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A TCP relay that cuts its connections on demand (both sides reset), and can refuse new
/// ones (the path stays down).
struct Relay {
    address: String,
    open: Arc<Mutex<Vec<TcpStream>>>,
    refusing: Arc<AtomicBool>,
    accepted: Arc<AtomicU64>,
    relayed: Arc<AtomicU64>,
}

impl Relay {
    fn start(target: &str) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let open: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let refusing = Arc::new(AtomicBool::new(false));
        let accepted = Arc::new(AtomicU64::new(0));
        let relayed = Arc::new(AtomicU64::new(0));
        let (target, o, r, a, moved) =
            (target.to_owned(), open.clone(), refusing.clone(), accepted.clone(), relayed.clone());
        std::thread::spawn(move || {
            for client in listener.incoming().map_while(Result::ok) {
                if r.load(Ordering::SeqCst) {
                    reset(&client);
                    continue;
                }
                let Ok(server) = TcpStream::connect(&target) else { continue };
                a.fetch_add(1, Ordering::SeqCst);
                for s in [&client, &server] {
                    s.set_nodelay(true).ok();
                    o.lock().unwrap().push(s.try_clone().unwrap());
                }
                for (from, to) in [(client.try_clone().unwrap(), server.try_clone().unwrap()), (server, client)] {
                    let moved = moved.clone();
                    std::thread::spawn(move || pump(from, to, &moved));
                }
            }
        });
        Relay { address, open, refusing, accepted, relayed }
    }

    /// Reset every open connection.
    fn cut(&self) {
        for s in self.open.lock().unwrap().drain(..) {
            reset(&s);
        }
    }
}

fn reset(s: &TcpStream) {
    use std::os::fd::AsRawFd;
    // SO_LINGER 0: close sends a reset, as a broken path looks to both ends. The descriptor
    // closes when the last handle on it drops; shut it down now, so both ends see it break.
    let linger = libc::linger { l_onoff: 1, l_linger: 0 };
    // SAFETY: setsockopt on an open socket with a pointer to a linger value and its size.
    unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&linger as *const libc::linger).cast(),
            size_of::<libc::linger>() as libc::socklen_t,
        );
    }
    let _ = s.shutdown(Shutdown::Both);
}

fn pump(mut from: TcpStream, mut to: TcpStream, moved: &AtomicU64) {
    let mut buf = vec![0u8; 64 << 10];
    while let Ok(n) = from.read(&mut buf) {
        if n == 0 || to.write_all(&buf[..n]).is_err() {
            break;
        }
        moved.fetch_add(n as u64, Ordering::Relaxed);
    }
    let _ = to.shutdown(Shutdown::Both);
    let _ = from.shutdown(Shutdown::Both);
}

/// Copies to the GPU and back, verified, for at most `SECONDS` or until the file `STOP` (if
/// given) exists: the data must survive cuts. A stop file, not a fixed time, ends the runs that
/// are cut: on a loaded machine a fixed time could run out before the third cut.
const COPIES: &str = r#"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <cuda_runtime_api.h>
#define N (1 << 20)
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
int main(int argc, char **argv) {
  double seconds = argc > 1 ? atof(argv[1]) : 3.0;
  const char *stop = argc > 2 ? argv[2] : 0;
  unsigned char *host = malloc(N), *back = malloc(N), *pinned = 0, *dev = 0;
  cudaStream_t stream;
  if (cudaMalloc((void **)&dev, N) || cudaMallocHost((void **)&pinned, N) || cudaStreamCreate(&stream)) {
    printf("setup failed\n");
    return 2;
  }
  double start = now();
  long rounds = 0;
  while (now() - start < seconds && !(stop && fopen(stop, "r"))) {
    for (int i = 0; i < N; i++) host[i] = (unsigned char)(i * 7 + rounds);
    cudaError_t e = cudaMemcpy(dev, host, N, cudaMemcpyHostToDevice);
    if (!e) e = cudaMemset(dev + 100, (int)(rounds & 0xff), 1000);
    /* Frames nobody waits for, then one that waits. */
    for (int k = 0; k < 20 && !e; k++) e = cudaMemcpyAsync(pinned + k * 4096, dev + k * 4096, 4096, cudaMemcpyDeviceToHost, stream);
    if (!e) e = cudaStreamSynchronize(stream);
    if (!e) e = cudaMemcpy(back, dev, N, cudaMemcpyDeviceToHost);
    if (e) {
      printf("round %ld: %s\n", rounds, cudaGetErrorString(e));
      return 3;
    }
    for (int i = 0; i < N; i++) {
      unsigned char want = (i >= 100 && i < 1100) ? (unsigned char)(rounds & 0xff) : (unsigned char)(i * 7 + rounds);
      if (back[i] != want || (i < 20 * 4096 && pinned[i] != want)) {
        printf("round %ld: byte %d is %d, not %d\n", rounds, i, back[i], want);
        return 4;
      }
    }
    rounds++;
  }
  printf("OK %ld rounds\n", rounds);
  return 0;
}
"#;

fn copies_program() -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| {
            let dir = chidori_tests::scratch("resume-copies");
            let src = dir.join("copies.c");
            std::fs::write(&src, COPIES).unwrap();
            let exe = dir.join("copies");
            let include = chidori_tests::runtime_headers("13.0");
            let stub = chidori_tests::root().join("headers/stub");
            let flags = [
                format!("-I{}", include.display()),
                format!("-I{}", stub.display()),
                format!("-L{}", chidori_tests::shim_dir().display()),
                "-l:libcudart.so.13".to_owned(),
            ];
            let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
            chidori_tests::cc(&src, &exe, &flags);
            exe
        })
        .clone()
}

/// Run the copies program through `relay` for at most `seconds`, with `env`; `during` runs
/// while it does (the cuts); with `stop`, the program stops once `during` has returned.
fn run_copies(relay: &Relay, seconds: &str, stop: bool, env: &[(&str, &str)], during: impl FnOnce(&Relay)) -> Output {
    static RUNS: AtomicU64 = AtomicU64::new(0);
    let stop_file =
        chidori_tests::scratch(&format!("resume-stop-{}", RUNS.fetch_add(1, Ordering::SeqCst))).join("stop");
    let mut cmd = Command::new(chidori());
    cmd.args(["run", "--no-check", "-s", &relay.address, "--lib-dir"])
        .arg(chidori_tests::shim_dir())
        .arg("--")
        .arg(copies_program())
        .arg(seconds)
        .arg(&stop_file)
        .env("CHIDORI_RESUME", "1")
        .env("CHIDORI_RESUME_GRACE_SECS", "20")
        .env("CHIDORI_HEARTBEAT_SECS", "1")
        .env("CHIDORI_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let child = cmd.spawn().unwrap();
    during(relay);
    if stop {
        std::fs::write(&stop_file, b"").unwrap();
    }
    child.wait_with_output().unwrap()
}

fn cut_three_times(relay: &Relay) {
    for _ in 0..3 {
        // Wait until the program is moving data on a connection, then cut it.
        let before = relay.relayed.load(Ordering::SeqCst);
        let start = Instant::now();
        while relay.relayed.load(Ordering::SeqCst) < before + (8 << 20) {
            assert!(start.elapsed() < Duration::from_secs(30), "no traffic through the relay");
            std::thread::sleep(Duration::from_millis(10));
        }
        relay.cut();
    }
    // And the program goes on moving data after the last cut.
    let before = relay.relayed.load(Ordering::SeqCst);
    let start = Instant::now();
    while relay.relayed.load(Ordering::SeqCst) < before + (8 << 20) {
        assert!(start.elapsed() < Duration::from_secs(30), "no traffic after the last cut");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn check_survived(out: &Output, relay: &Relay, server: &Server) {
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let context = format!("{}\nstdout: {stdout}\nstderr: {stderr}\nserver log:\n{}", out.status, server.log());
    assert!(out.status.success() && stdout.starts_with("OK "), "{context}");
    // The first connection and one per cut (the preflight check is skipped).
    assert!(relay.accepted.load(Ordering::SeqCst) >= 4, "{context}");
    assert_eq!(stderr.matches("resumed the session").count(), 3, "{context}");
    assert!(server.log().contains("session resumed"), "{context}");
    if std::env::var_os("SHOW").is_some() {
        eprintln!("{context}");
    }
}

#[test]
fn a_session_survives_its_connection_being_cut_three_times() {
    let server = Server::start("resume-plain", &[]);
    let relay = Relay::start(&server.address);
    let out = run_copies(&relay, "60", true, &[], cut_three_times);
    check_survived(&out, &relay, &server);
}

#[test]
fn a_tls_session_survives_its_connection_being_cut_three_times() {
    let server = Server::start("resume-tls", &["--secure"]);
    let (token, fingerprint) = (server.printed("--token"), server.printed("--fingerprint"));
    let relay = Relay::start(&server.address);
    // The relay's address is the one the client pins the certificate for.
    let env = [("CHIDORI_TOKEN", token.as_str()), ("CHIDORI_FINGERPRINT", fingerprint.as_str())];
    let out = run_copies(&relay, "60", true, &env, cut_three_times);
    check_survived(&out, &relay, &server);
}

#[test]
fn a_client_that_cannot_come_back_in_time_gets_a_clear_error() {
    let server = Server::start("resume-expired", &[]);
    let relay = Relay::start(&server.address);
    let started = Instant::now();
    let out = run_copies(&relay, "30", false, &[("CHIDORI_RESUME_GRACE_SECS", "2")], |relay| {
        while relay.relayed.load(Ordering::SeqCst) < (4 << 20) {
            std::thread::sleep(Duration::from_millis(10));
        }
        relay.refusing.store(true, Ordering::SeqCst);
        relay.cut();
    });
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let context = format!("{}\nstdout: {stdout}\nstderr: {stderr}\nserver log:\n{}", out.status, server.log());
    assert!(out.status.code() == Some(3), "the program's call failed: {context}");
    assert!(stderr.contains("could not resume the session within 2 s"), "{context}");
    assert!(started.elapsed() < Duration::from_secs(25), "gave up after {:?}", started.elapsed());
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

/// Send the preamble and a resume request for `session` with `secret`: the answer.
fn try_resume(address: &str, session: u64, secret: &[u8]) -> Frame {
    let mut s = TcpStream::connect(address).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(&Header::new(Kind::Resume, 0, 0, session).encode()).unwrap();
    let request = ResumeRequest { token: String::new(), secret: secret.to_vec(), received: 0, lane: 0 };
    let bytes = frame::to_vec(Header::new(Kind::Resume, 0, 0, session), &messages::encode(&request), &[]).unwrap();
    // The supervisor may refuse before reading the request: a failed write is fine.
    let _ = s.write_all(&bytes);
    chidori_tls::read_plain_frame(&mut s).expect("an answer")
}

#[test]
fn only_the_sessions_client_can_resume_it() {
    let server = Server::start("resume-hijack", &[]);
    // A session that waits (a long run; nothing cuts it).
    let mut victim = Command::new(chidori())
        .args(["run", "--no-check", "-s", &server.address, "--lib-dir"])
        .arg(chidori_tests::shim_dir())
        .arg("--")
        .arg(copies_program())
        .arg("6")
        .env("CHIDORI_RESUME", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    let worker = loop {
        if let Some(&w) = children(server.child.id()).first() {
            break w;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "no session worker");
        std::thread::sleep(Duration::from_millis(20));
    };
    std::thread::sleep(Duration::from_millis(300));
    // A wrong secret: refused by the worker, and the session goes on.
    let answer = try_resume(&server.address, u64::from(worker), &[0u8; 32]);
    assert_eq!(answer.header.kind, Kind::Refuse);
    let refuse: Refuse = messages::decode(&answer, "refusal").unwrap();
    assert_eq!(refuse.reason, RefuseReason::Gone, "{}", refuse.message);
    // A session that does not exist: refused by the supervisor.
    let answer = try_resume(&server.address, 999_999_999, &[1u8; 32]);
    let refuse: Refuse = messages::decode(&answer, "refusal").unwrap();
    assert!(refuse.reason == RefuseReason::Gone && refuse.message.contains("not running"), "{}", refuse.message);
    let out = wait_output(&mut victim, Duration::from_secs(60));
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && stdout.starts_with("OK "), "{stdout}\n{stderr}\n{}", server.log());
    assert!(!stderr.contains("resumed"), "the session was never broken: {stderr}");
    assert!(server.log().contains("refused a reconnection"), "{}", server.log());
}

fn wait_output(child: &mut Child, limit: Duration) -> Output {
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > limit {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut stdout = Vec::new();
    let mut stderr = Vec::new();
    child.stdout.take().unwrap().read_to_end(&mut stdout).unwrap();
    child.stderr.take().unwrap().read_to_end(&mut stderr).unwrap();
    Output { status: child.wait().unwrap(), stdout, stderr }
}
