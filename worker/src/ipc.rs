//! CUDA IPC between sessions: memory and events one program's process shares with another
//! process of the same machine (`cudaIpcGetMemHandle`, then `cudaIpcOpenMemHandle` in the
//! other process; the same for events). Through Chidori each of those processes is a session,
//! each session a worker process on the GPU's machine, so the real driver maps the memory
//! from one worker into the other as it would natively.
//!
//! What keeps sessions apart otherwise ([`crate::memory`]: a session names only its own
//! memory) holds here too: a session opens only a handle that a session of the same server
//! exported. Each export is published as a file named by the handle's bytes in a directory
//! the supervisor makes for its sessions (mode 0700); an open looks for the file. The
//! exporting session removes its files when it ends, as its memory goes with it natively.
//! A session without the directory (one run outside a supervisor) shares nothing.
//!
//! Shareable file descriptors (`cuMemExportToShareableHandle`, a memory pool's export) are
//! the exporting worker's own: it keeps each one under a random token, which is what its
//! client gets (inside a stand-in descriptor the program can pass on as it would the
//! driver's); the token is published as a file in the same directory, and an importing
//! worker fetches the descriptor from the exporter over a Unix socket there (`SCM_RIGHTS`).

use std::collections::{HashMap, HashSet, VecDeque};
use std::fmt::Write as _;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

/// What a handle names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Memory,
    Event,
}

impl Kind {
    fn prefix(self) -> &'static str {
        match self {
            Kind::Memory => "memory",
            Kind::Event => "event",
        }
    }
}

/// The file descriptors a session exported, by token, and their tokens oldest first.
#[derive(Debug, Default)]
struct KeptFds {
    fds: HashMap<u64, OwnedFd>,
    order: VecDeque<u64>,
}

type Kept = Arc<Mutex<KeptFds>>;

/// The handles this session exported, published for the server's other sessions.
#[derive(Debug)]
pub struct Exports {
    dir: Option<PathBuf>,
    /// The directory's lock file, held shared while the session runs (see [`hold`]).
    _held: Option<std::fs::File>,
    /// The files of the memory and event handles this session published.
    handles: Mutex<HashSet<PathBuf>>,
    kept: Kept,
    /// The socket other sessions fetch this one's descriptors on, once one is exported.
    socket: OnceLock<Result<PathBuf, String>>,
}

/// Descriptors one session keeps for others at most.
const MAX_KEPT: usize = 1024;

/// How long a fetch of another session's descriptor may take.
const FETCH_TIMEOUT: Duration = Duration::from_secs(10);

impl Exports {
    pub fn new(dir: Option<PathBuf>) -> Exports {
        let held = dir
            .as_deref()
            .and_then(|d| hold(d).map_err(|e| tracing::warn!("holding the IPC directory {}: {e}", d.display())).ok());
        Exports { dir, _held: held, handles: Mutex::default(), kept: Kept::default(), socket: OnceLock::new() }
    }

    fn socket_path(dir: &Path, pid: u32) -> PathBuf {
        dir.join(format!("fds-{pid}.sock"))
    }

    fn token_path(dir: &Path, token: u64) -> PathBuf {
        dir.join(format!("fd-{token:016x}"))
    }

    /// Keeps `fd`, which this session's library just exported, for the server's other
    /// sessions: the token that names it.
    pub fn publish_fd(&self, fd: OwnedFd) -> Result<u64, String> {
        let Some(dir) = &self.dir else {
            return Err("this session runs without the server's IPC directory".to_owned());
        };
        self.socket.get_or_init(|| serve_fds(dir, self.kept.clone())).clone()?;
        let token = random_token().map_err(|e| format!("a token for the descriptor: {e}"))?;
        std::fs::write(Self::token_path(dir, token), std::process::id().to_string())
            .map_err(|e| format!("publishing the descriptor in {}: {e}", dir.display()))?;
        // The program's own close of its stand-in is not seen here, so the worker keeps each
        // descriptor while the session lasts, the oldest closed past a bound (a descriptor
        // holds its memory).
        let mut kept = lock(&self.kept);
        if kept.order.len() >= MAX_KEPT
            && let Some(oldest) = kept.order.pop_front()
        {
            kept.fds.remove(&oldest);
            let _ = std::fs::remove_file(Self::token_path(dir, oldest));
        }
        kept.fds.insert(token, fd);
        kept.order.push_back(token);
        Ok(token)
    }

    /// The descriptor a session of this server exported under `token` (a duplicate of it, in
    /// this process).
    pub fn fetch_fd(&self, token: u64) -> Result<OwnedFd, String> {
        let Some(dir) = &self.dir else {
            return Err("this session runs without the server's IPC directory".to_owned());
        };
        let refused = || "the shareable handle was not exported by a running session of this server".to_owned();
        let owner = std::fs::read_to_string(Self::token_path(dir, token)).map_err(|_| refused())?;
        let pid: u32 = owner.trim().parse().map_err(|_| refused())?;
        if pid == std::process::id()
            && let Some(fd) = lock(&self.kept).fds.get(&token)
        {
            return fd.try_clone().map_err(|e| format!("duplicating the descriptor: {e}"));
        }
        let mut stream = UnixStream::connect(Self::socket_path(dir, pid))
            .map_err(|e| format!("reaching the exporting session (pid {pid}): {e}"))?;
        stream.set_read_timeout(Some(FETCH_TIMEOUT)).ok();
        stream.set_write_timeout(Some(FETCH_TIMEOUT)).ok();
        stream.write_all(&token.to_le_bytes()).map_err(|e| format!("asking the exporting session: {e}"))?;
        match receive_fd(&stream) {
            Ok(Some(fd)) => Ok(fd),
            Ok(None) => Err(refused()),
            Err(e) => Err(format!("receiving the descriptor from the exporting session: {e}")),
        }
    }

    fn path(dir: &Path, kind: Kind, handle: &[u8]) -> PathBuf {
        let mut name = String::with_capacity(8 + 2 * handle.len());
        name.push_str(kind.prefix());
        name.push('-');
        for byte in handle {
            let _ = write!(name, "{byte:02x}");
        }
        dir.join(name)
    }

    /// Publishes `handle`, which this session's library just wrote for one of its
    /// allocations or events (once: a handle asked again is the same).
    pub fn publish(&self, kind: Kind, handle: &[u8]) -> Result<(), String> {
        let Some(dir) = &self.dir else {
            return Err("this session runs without the server's IPC directory".to_owned());
        };
        let path = Self::path(dir, kind, handle);
        let mut handles = lock(&self.handles);
        if !handles.contains(&path) {
            std::fs::write(&path, std::process::id().to_string())
                .map_err(|e| format!("publishing the handle in {}: {e}", dir.display()))?;
            handles.insert(path);
        }
        Ok(())
    }

    /// Whether this session may publish what it exports.
    pub fn enabled(&self) -> bool {
        self.dir.is_some()
    }

    /// Whether a session of this server exported `handle` and is still running.
    pub fn published(&self, kind: Kind, handle: &[u8]) -> bool {
        self.dir.as_deref().is_some_and(|dir| Self::path(dir, kind, handle).is_file())
    }

    /// The session ends: its handles are no longer published, its descriptors closed.
    pub fn withdraw(&self) {
        for path in lock(&self.handles).drain() {
            let _ = std::fs::remove_file(path);
        }
        let mut kept = lock(&self.kept);
        if let Some(dir) = &self.dir {
            for &token in &kept.order {
                let _ = std::fs::remove_file(Self::token_path(dir, token));
            }
        }
        if let Some(Ok(socket)) = self.socket.get() {
            let _ = std::fs::remove_file(socket);
        }
        *kept = KeptFds::default();
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A number no one can guess (the server's secure random source); never 0.
fn random_token() -> std::io::Result<u64> {
    let bytes = crate::auth::random_bytes(8).map_err(|e| std::io::Error::other(e.to_string()))?;
    let bytes: [u8; 8] = bytes.try_into().map_err(|_| std::io::Error::other("8 random bytes"))?;
    Ok(u64::from_le_bytes(bytes).max(1))
}

/// Listens on this session's socket in `dir`: each connection sends a token and gets the
/// descriptor kept under it (or a refusal), then ends.
fn serve_fds(dir: &Path, kept: Kept) -> Result<PathBuf, String> {
    let path = Exports::socket_path(dir, std::process::id());
    let _ = std::fs::remove_file(&path);
    let listener = UnixListener::bind(&path).map_err(|e| format!("listening on {}: {e}", path.display()))?;
    std::thread::Builder::new()
        .name("chidori-ipc-fds".to_owned())
        .spawn(move || {
            for stream in listener.incoming().flatten() {
                stream.set_read_timeout(Some(FETCH_TIMEOUT)).ok();
                stream.set_write_timeout(Some(FETCH_TIMEOUT)).ok();
                let mut token = [0u8; 8];
                if (&stream).read_exact(&mut token).is_err() {
                    continue;
                }
                // A duplicate, sent once the lock is let go (an exporting call waits for it).
                let fd = lock(&kept).fds.get(&u64::from_le_bytes(token)).and_then(|fd| fd.try_clone().ok());
                if let Err(e) = send_fd(&stream, fd.as_ref()) {
                    tracing::debug!("sending a shared descriptor: {e}");
                }
            }
        })
        .map_err(|e| format!("starting the descriptor thread: {e}"))?;
    Ok(path)
}

/// Sends one byte, 1 with `fd` attached (`SCM_RIGHTS`), 0 without (a refusal).
fn send_fd(stream: &UnixStream, fd: Option<&OwnedFd>) -> std::io::Result<()> {
    let byte = [u8::from(fd.is_some())];
    let mut iov = libc::iovec { iov_base: byte.as_ptr() as *mut libc::c_void, iov_len: 1 };
    let int = size_of::<libc::c_int>() as u32;
    // SAFETY: CMSG_SPACE only computes a size.
    let space = unsafe { libc::CMSG_SPACE(int) } as usize;
    let mut control = vec![0u8; space];
    // SAFETY: an all-zero msghdr is a valid empty message.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if let Some(fd) = fd {
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = space as _;
        // SAFETY: the control buffer holds one header and one int (CMSG_SPACE of it), so the
        // first header and its data lie inside it.
        unsafe {
            let header = libc::CMSG_FIRSTHDR(&msg);
            (*header).cmsg_level = libc::SOL_SOCKET;
            (*header).cmsg_type = libc::SCM_RIGHTS;
            (*header).cmsg_len = libc::CMSG_LEN(int) as _;
            std::ptr::write_unaligned(libc::CMSG_DATA(header).cast::<libc::c_int>(), fd.as_raw_fd());
        }
    }
    // SAFETY: `msg` points at the iovec and control buffer above, alive for the call.
    let sent = unsafe { libc::sendmsg(stream.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
    if sent == 1 { Ok(()) } else { Err(std::io::Error::last_os_error()) }
}

/// Receives what [`send_fd`] sends: Some(descriptor), or None for a refusal.
fn receive_fd(stream: &UnixStream) -> std::io::Result<Option<OwnedFd>> {
    let mut byte = [0u8];
    let mut iov = libc::iovec { iov_base: byte.as_mut_ptr().cast(), iov_len: 1 };
    let int = size_of::<libc::c_int>() as u32;
    // SAFETY: CMSG_SPACE only computes a size.
    let space = unsafe { libc::CMSG_SPACE(int) } as usize;
    let mut control = vec![0u8; space];
    // SAFETY: an all-zero msghdr is a valid empty message.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    // SAFETY: `msg` points at buffers above, alive for the call.
    let received = unsafe { libc::recvmsg(stream.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if received < 0 {
        return Err(std::io::Error::last_os_error());
    }
    if received == 0 {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    // SAFETY: the kernel filled `msg`'s control buffer; a header it reports lies inside it.
    let header = unsafe { libc::CMSG_FIRSTHDR(&msg) };
    // SAFETY: as above; the header is read only where the kernel wrote one.
    let rights = !header.is_null()
        && unsafe { (*header).cmsg_level == libc::SOL_SOCKET && (*header).cmsg_type == libc::SCM_RIGHTS };
    if !rights {
        return Ok(None);
    }
    // SAFETY: an SCM_RIGHTS header carries a descriptor the kernel just installed in this
    // process, which nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(std::ptr::read_unaligned(libc::CMSG_DATA(header).cast::<libc::c_int>())) };
    Ok((byte[0] == 1).then_some(fd))
}

impl Drop for Exports {
    fn drop(&mut self) {
        self.withdraw();
    }
}

/// The directory the supervisor's sessions publish their exports in: new, private to the
/// server's user, under the system's temporary directory (named by the process and a random
/// number, so that no other server's, in another process namespace sharing the directory,
/// is ever taken). With it, the supervisor's hold on it ([`hold`]), kept while it runs.
pub fn make_directory() -> std::io::Result<(PathBuf, std::fs::File)> {
    make_directory_in(&std::env::temp_dir())
}

fn make_directory_in(root: &Path) -> std::io::Result<(PathBuf, std::fs::File)> {
    use std::os::unix::fs::DirBuilderExt;
    let mut last = std::io::Error::other("no attempt");
    for _ in 0..8 {
        let dir = root.join(format!("{DIRECTORY_PREFIX}{}-{:016x}", std::process::id(), random_token()?));
        match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => {
                let held = hold(&dir)?;
                return Ok((dir, held));
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last = e,
            Err(e) => return Err(e),
        }
    }
    Err(last)
}

/// What a server's IPC directory is named with, then `PID-RANDOM` (16 hex digits).
const DIRECTORY_PREFIX: &str = "chidori-ipc-";

/// The file in a server's IPC directory that its supervisor and each of its session workers
/// hold a shared lock on while they run (`flock`, which process namespaces sharing the
/// directory see alike): a directory whose lock no one holds is a stopped server's.
const HELD: &str = ".held";

/// Hold `dir` for as long as the returned file stays open.
fn hold(dir: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new().create(true).append(true).mode(0o600).open(dir.join(HELD))?;
    loop {
        // SAFETY: a descriptor the file owns; flock takes no pointer.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_SH) } == 0 {
            return Ok(file);
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Remove the IPC directories of stopped servers (a server killed outright leaves its own)
/// that this user owns under the system's temporary directory: the number removed.
pub fn sweep() -> usize {
    sweep_in(&std::env::temp_dir(), Duration::from_secs(60))
}

/// As [`sweep`], under `root`; a directory younger than `young` is left alone whatever its
/// lock says (a server may be making it).
fn sweep_in(root: &Path, young: Duration) -> usize {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = std::fs::read_dir(root) else { return 0 };
    // SAFETY: geteuid takes nothing and cannot fail.
    let me = unsafe { libc::geteuid() };
    let mut removed = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some((pid, random)) = name.to_str().and_then(|n| n.strip_prefix(DIRECTORY_PREFIX)?.split_once('-')) else {
            continue;
        };
        let ours = !pid.is_empty()
            && pid.bytes().all(|b| b.is_ascii_digit())
            && random.len() == 16
            && random.bytes().all(|b| b.is_ascii_hexdigit());
        // Not through a link, and only this user's.
        let Ok(meta) = std::fs::symlink_metadata(entry.path()) else { continue };
        if !ours || !meta.is_dir() || meta.uid() != me {
            continue;
        }
        if meta.modified().ok().and_then(|m| m.elapsed().ok()).is_none_or(|age| age < young) {
            continue;
        }
        let dir = entry.path();
        // An exclusive lock taken means no supervisor or session holds it; a directory
        // without the file is an older server's.
        let free = match std::fs::File::open(dir.join(HELD)) {
            // SAFETY: a descriptor the file owns; flock takes no pointer.
            Ok(f) => (unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) }) == 0,
            Err(e) => e.kind() == std::io::ErrorKind::NotFound,
        };
        if free && std::fs::remove_dir_all(&dir).is_ok() {
            removed += 1;
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Seek;

    fn tempfile_with(bytes: &[u8]) -> std::fs::File {
        let path = std::env::temp_dir().join(format!("chidori-ipc-fd-{}", std::process::id()));
        let mut file =
            std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&path).expect("file");
        let _ = std::fs::remove_file(&path);
        file.write_all(bytes).expect("write");
        file
    }

    fn read_all(mut file: std::fs::File) -> Vec<u8> {
        let mut bytes = Vec::new();
        file.rewind().expect("rewind");
        file.read_to_end(&mut bytes).expect("read");
        bytes
    }

    #[test]
    fn a_session_keeps_a_bounded_number_of_descriptors_the_oldest_going_first() {
        let dir = std::env::temp_dir().join(format!("chidori-ipc-bound-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("directory");
        let exporter = Exports::new(Some(dir.clone()));
        let file = tempfile_with(b"x");
        let tokens: Vec<u64> = (0..=MAX_KEPT)
            .map(|_| exporter.publish_fd(OwnedFd::from(file.try_clone().expect("clone"))).expect("published"))
            .collect();
        assert!(exporter.fetch_fd(tokens[0]).is_err(), "the oldest was closed");
        assert!(exporter.fetch_fd(tokens[MAX_KEPT]).is_ok());
        assert_eq!(lock(&exporter.kept).fds.len(), MAX_KEPT);
        drop(exporter);
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn each_server_makes_a_directory_of_its_own_that_only_its_user_can_enter() {
        use std::os::unix::fs::PermissionsExt;
        let ((a, _a), (b, _b)) = (make_directory().expect("one"), make_directory().expect("another"));
        assert_ne!(a, b);
        assert_eq!(std::fs::metadata(&a).expect("made").permissions().mode() & 0o777, 0o700);
        let _ = (std::fs::remove_dir_all(a), std::fs::remove_dir_all(b));
    }

    /// A stopped server's directory goes at the next server's start; one its supervisor or
    /// any of its sessions still holds stays, as do a young one, another user's naming and
    /// what is no directory of this form.
    #[test]
    fn stopped_servers_directories_are_swept_and_held_ones_stay() {
        let root = std::env::temp_dir().join(format!("chidori-ipc-sweep-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).expect("root");
        let (running, supervisor) = make_directory_in(&root).expect("a running server's");
        let (stopped, held) = make_directory_in(&root).expect("a stopped server's");
        drop(held);
        let (orphaned, held) = make_directory_in(&root).expect("a server whose session outlives it");
        let session = Exports::new(Some(orphaned.clone()));
        drop(held);
        let older = root.join(format!("{DIRECTORY_PREFIX}12-{:016x}", 5));
        let other = root.join(format!("{DIRECTORY_PREFIX}test-{}", 7));
        for d in [&older, &other] {
            std::fs::create_dir(d).expect("directory");
        }
        assert_eq!(sweep_in(&root, Duration::from_secs(3600)), 0, "all are young");
        assert_eq!(sweep_in(&root, Duration::ZERO), 2, "the stopped one and the one without a lock file");
        assert!(running.is_dir() && orphaned.is_dir() && other.is_dir());
        assert!(!stopped.exists() && !older.exists());
        drop((supervisor, session));
        assert_eq!(sweep_in(&root, Duration::ZERO), 2);
        assert!(!running.exists() && !orphaned.exists() && other.is_dir());
        let _ = std::fs::remove_dir_all(root);
    }

    #[test]
    fn a_handle_is_published_until_its_session_ends_and_only_where_there_is_a_directory() {
        let dir = std::env::temp_dir().join(format!("chidori-ipc-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("directory");
        let handle = [7u8; 64];
        let exporter = Exports::new(Some(dir.clone()));
        let opener = Exports::new(Some(dir.clone()));
        assert!(!opener.published(Kind::Memory, &handle));
        exporter.publish(Kind::Memory, &handle).expect("published");
        assert!(opener.published(Kind::Memory, &handle));
        assert!(!opener.published(Kind::Event, &handle), "an event handle is another name");
        assert!(!opener.published(Kind::Memory, &[8u8; 64]));
        drop(exporter);
        assert!(!opener.published(Kind::Memory, &handle), "gone with the exporting session");
        // A descriptor: fetched by another session through the exporter's socket, and by the
        // exporter itself; an unknown token is refused.
        let exporter = Exports::new(Some(dir.clone()));
        let mut file = tempfile_with(b"shared bytes");
        let token = exporter.publish_fd(OwnedFd::from(file.try_clone().expect("clone"))).expect("published");
        let exporter = Arc::new(exporter);
        let other = std::thread::spawn({
            let dir = dir.clone();
            move || {
                // A session of another process is another pid: the socket path is the
                // exporter's either way, so fetching from a thread exercises the transfer.
                let opener = Exports::new(Some(dir));
                opener.fetch_fd(token).map(|fd| read_all(std::fs::File::from(fd)))
            }
        });
        assert_eq!(other.join().expect("thread").expect("fetched"), b"shared bytes");
        assert_eq!(read_all(std::fs::File::from(exporter.fetch_fd(token).expect("own"))), b"shared bytes");
        assert!(opener.fetch_fd(token ^ 1).is_err(), "no such token");
        exporter.withdraw();
        assert!(opener.fetch_fd(token).is_err(), "withdrawn with its session");
        let _ = file.flush();
        let alone = Exports::new(None);
        assert!(alone.publish(Kind::Memory, &handle).is_err());
        assert!(!alone.published(Kind::Memory, &handle));
        let _ = std::fs::remove_dir_all(dir);
    }
}
