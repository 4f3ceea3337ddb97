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

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

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

/// The handles this session exported, published for the server's other sessions.
#[derive(Debug, Default)]
pub struct Exports {
    dir: Option<PathBuf>,
    mine: Mutex<Vec<PathBuf>>,
}

impl Exports {
    pub fn new(dir: Option<PathBuf>) -> Exports {
        Exports { dir, mine: Mutex::new(Vec::new()) }
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
    /// allocations or events.
    pub fn publish(&self, kind: Kind, handle: &[u8]) -> Result<(), String> {
        let Some(dir) = &self.dir else {
            return Err("this session runs without the server's IPC directory".to_owned());
        };
        let path = Self::path(dir, kind, handle);
        std::fs::write(&path, std::process::id().to_string())
            .map_err(|e| format!("publishing the handle in {}: {e}", dir.display()))?;
        let mut mine = self.mine.lock().unwrap_or_else(|p| p.into_inner());
        if !mine.contains(&path) {
            mine.push(path);
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

    /// The session ends: its handles are no longer published.
    pub fn withdraw(&self) {
        let mut mine = self.mine.lock().unwrap_or_else(|p| p.into_inner());
        for path in mine.drain(..) {
            let _ = std::fs::remove_file(path);
        }
    }
}

impl Drop for Exports {
    fn drop(&mut self) {
        self.withdraw();
    }
}

/// The directory the supervisor's sessions publish their exports in: new, private to the
/// server's user, under the system's temporary directory.
pub fn make_directory() -> std::io::Result<PathBuf> {
    use std::os::unix::fs::DirBuilderExt;
    let dir = std::env::temp_dir().join(format!("chidori-ipc-{}", std::process::id()));
    // A directory left by an earlier server of the same process id holds nothing current.
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::DirBuilder::new().mode(0o700).create(&dir)?;
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let alone = Exports::new(None);
        assert!(alone.publish(Kind::Memory, &handle).is_err());
        assert!(!alone.published(Kind::Memory, &handle));
        let _ = std::fs::remove_dir_all(dir);
    }
}
