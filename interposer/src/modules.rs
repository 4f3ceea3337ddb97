//! Modules on the server, loaded lazily: the first time one of a fat binary's kernels or
//! variables is used, the client sends the content hash of the image the server's GPU
//! needs (only its cubin and PTX entries where the fat binary allows); the server loads it
//! from its module cache or asks for the bytes. One round trip brings back every kernel of
//! the module with its function handle and parameter layout.
//!
//! The client keeps a record of the modules each server has said it holds
//! (`$XDG_CACHE_HOME/chidori/servers/<address>`, hashes in hex). A module the record lacks
//! goes with its first load when it is small: one round trip on a fresh server, where asking
//! first would take two; one the record has is asked for by hash, and no bytes travel.
//! The first load of a process also brings the modules the last run of the same command
//! loaded (`last_run`): those the server holds are loaded behind the program's calls
//! (`behind`), the others with that load.

use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use chidori_protocol::messages::{Api, Launch, Service, ServiceReply};
use sha2::{Digest, Sha256};

use crate::conn::Conn;
use crate::registry::{self, FATBIN_WRAPPER_MAGIC, FatbinWrapper};

/// A function the client can launch: the server's handle and the parameter layout.
#[derive(Clone, Debug)]
pub struct Function {
    pub handle: u64,
    pub params: Arc<[(u32, u32)]>,
}

/// A module loaded on the server.
#[derive(Debug)]
pub struct Loaded {
    pub library: u64,
    pub module: u64,
    pub kernels: HashMap<String, Function>,
}

pub const NOT_FOUND: u32 = chidori_cuda::consts::cudaError_enum::CUDA_ERROR_NOT_FOUND;
pub const INVALID_IMAGE: u32 = chidori_cuda::consts::cudaError_enum::CUDA_ERROR_INVALID_IMAGE;
pub const NO_DEVICE: u32 = chidori_cuda::consts::cudaError_enum::CUDA_ERROR_NO_DEVICE;

/// A kernel's parameters: (offset, size) each, in order.
pub type ParamLayout = Arc<[(u32, u32)]>;

fn remember(handle: u64, params: Arc<[(u32, u32)]>) {
    crate::state::CLIENT.function_params.insert(handle, params);
}

/// The compute capability (90 for sm_90) of the current device of the server.
fn server_sm(conn: &Conn) -> u32 {
    let d = conn.profile.device(crate::state::current_device()).or_else(|| conn.profile.device(0));
    d.map(|d| {
        let major = d.attributes.get(&75).copied().unwrap_or(0);
        let minor = d.attributes.get(&76).copied().unwrap_or(0);
        (major * 10 + minor) as u32
    })
    .unwrap_or(0)
}

/// Load `image` on the server (uploading it only when the server has not seen it).
/// Err: a driver status, logged once with the reason.
/// An image an earlier load listed the kernels of is loaded under the client's names, without
/// waiting (`named`).
pub fn load_image(conn: &Conn, image: &[u8]) -> Result<Arc<Loaded>, u32> {
    let hash: [u8; 32] = Sha256::digest(image).into();
    if let Some(loaded) = named::load_bytes(conn, image, hash) {
        return Ok(loaded);
    }
    load_images_then(conn, &[image], &[hash], || {}).pop().unwrap_or(Err(INVALID_IMAGE))
}

/// Load several images (of `hashes`) in one round trip (two where the server lacks some it
/// must be sent), running `then` once the first round's requests are sent, before their
/// answers are awaited (questions asked behind them); each image's module or driver status,
/// in order.
fn load_images_then(
    conn: &Conn,
    images: &[&[u8]],
    hashes: &[[u8; 32]],
    then: impl FnOnce(),
) -> Vec<Result<Arc<Loaded>, u32>> {
    let start = Instant::now();
    let held: Vec<Option<bool>> = hashes.iter().map(|h| server_holds(&conn.server, h)).collect();
    // A module the record lacks goes with its first load when it is small: one round trip
    // on a fresh server, where asking first would take two.
    let inline = |i: usize| held[i] == Some(false) && images[i].len() <= INLINE_MAX;
    let requests: Vec<(Service, &[u8])> = (0..images.len())
        .map(|i| {
            let hash = hashes[i];
            if inline(i) {
                (Service::UploadModule { hash }, images[i])
            } else {
                (Service::LoadModule { hash }, &[][..])
            }
        })
        .collect();
    let mut uploaded: u64 = (0..images.len()).filter(|&i| inline(i)).map(|i| images[i].len() as u64).sum();
    let mut replies = conn.services_then(&requests, then);
    let mut trips = 1;
    let need: Vec<usize> = (0..images.len()).filter(|&i| matches!(replies[i], Ok(ServiceReply::NeedUpload))).collect();
    if !need.is_empty() {
        let big = need.iter().filter(|&&i| images[i].len() > (1 << 20)).count();
        if big > 0 {
            tracing::info!("uploading {big} module(s) over 1 MiB (once: the server caches them)");
        }
        let uploads: Vec<(Service, &[u8])> =
            need.iter().map(|&i| (Service::UploadModule { hash: hashes[i] }, images[i])).collect();
        for (&i, reply) in need.iter().zip(conn.services(&uploads)) {
            uploaded += images[i].len() as u64;
            replies[i] = reply;
        }
        trips += 1;
    }
    crate::trace::bytes("(module load)", trips, uploaded, 0, start.elapsed());
    replies
        .into_iter()
        .enumerate()
        .map(|(i, reply)| {
            let reply = reply.map_err(|_| NO_DEVICE)?;
            loaded_from(conn, reply, images[i], &hashes[i], held[i])
        })
        .collect()
}

/// The module a load's answer describes.
fn loaded_from(
    conn: &Conn,
    reply: ServiceReply,
    image: &[u8],
    hash: &[u8; 32],
    held: Option<bool>,
) -> Result<Arc<Loaded>, u32> {
    match reply {
        ServiceReply::Module { library, module, kernels } => {
            if held == Some(false) {
                record_held(&conn.server, hash);
            }
            let fallback = nv_info_params(image);
            let kernels = kernels
                .into_iter()
                .map(|k| {
                    // Drivers before 12.4 cannot tell parameter layouts: the cubin can.
                    let params: Arc<[(u32, u32)]> = match (k.params.is_empty(), fallback.get(&k.name)) {
                        (true, Some(p)) => p.clone().into(),
                        _ => k.params.into(),
                    };
                    remember(k.handle, params.clone());
                    crate::state::CLIENT.function_origins.insert(k.handle, (*hash, Arc::from(k.name.as_str())));
                    (k.name, Function { handle: k.handle, params })
                })
                .collect();
            let loaded = Arc::new(Loaded { library, module, kernels });
            crate::state::CLIENT.modules.insert(module, loaded.clone());
            named::keep(conn, hash, &loaded);
            Ok(loaded)
        }
        ServiceReply::Error { status, message } => {
            crate::log::once_owned(&message, || tracing::warn!("loading a module on the server: {message}"));
            Err(status as u32)
        }
        other => {
            tracing::warn!("unexpected answer to a module load: {other:?}");
            Err(INVALID_IMAGE)
        }
    }
}

/// Modules up to this size go with their first load when the record lacks them.
const INLINE_MAX: usize = 8 << 20;

/// The modules the server at one address has said it holds, as recorded on this machine.
struct Record {
    server: String,
    path: PathBuf,
    held: HashSet<[u8; 32]>,
}

static RECORD: Mutex<Option<Option<Record>>> = Mutex::new(None);

fn record_path(server: &str) -> Option<PathBuf> {
    let dir = chidori_protocol::env::cache_dir()?.join("servers");
    std::fs::create_dir_all(&dir).ok()?;
    Some(dir.join(chidori_protocol::env::server_file_name(server)))
}

fn with_record<T>(server: &str, f: impl FnOnce(&mut Record) -> T) -> Option<T> {
    let mut slot = RECORD.lock().unwrap_or_else(|p| p.into_inner());
    if slot.as_ref().is_none_or(|r| r.as_ref().is_some_and(|r| r.server != server)) {
        *slot = Some(record_path(server).map(|path| {
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            let held = text.lines().filter_map(parse_hash).collect();
            Record { server: server.to_owned(), path, held }
        }));
    }
    slot.as_mut().and_then(|r| r.as_mut()).map(f)
}

fn parse_hash(line: &str) -> Option<[u8; 32]> {
    let line = line.trim();
    let mut out = [0u8; 32];
    if line.len() != 64 {
        return None;
    }
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(line.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// Whether the record says the server holds `hash` (None: no record can be kept here, so
/// the client asks before sending bytes).
fn server_holds(server: &str, hash: &[u8; 32]) -> Option<bool> {
    with_record(server, |r| r.held.contains(hash))
}

fn record_held(server: &str, hash: &[u8; 32]) {
    with_record(server, |r| {
        if r.held.insert(*hash) {
            let line: String = hash.iter().map(|b| format!("{b:02x}")).collect();
            let file = std::fs::OpenOptions::new().create(true).append(true).open(&r.path);
            if let Err(e) = file.and_then(|mut f| writeln!(f, "{line}")) {
                crate::log::once_owned(&format!("{}", r.path.display()), || {
                    tracing::warn!("cannot record the server's modules in {}: {e}", r.path.display())
                });
            }
        }
    });
}

/// Parameter layouts from the image's cubins (used only when the driver gives none).
fn nv_info_params(image: &[u8]) -> HashMap<String, Vec<(u32, u32)>> {
    let mut out = HashMap::new();
    if let Ok(entries) = crate::fatbin::entries(image) {
        for e in entries.iter().filter(|e| e.is_elf()) {
            if let Ok(cubin) = e.decompressed() {
                out.extend(crate::fatbin::kernel_params(&cubin));
            }
        }
    } else if image.starts_with(b"\x7fELF") {
        out = crate::fatbin::kernel_params(image);
    }
    out
}

/// The image of a registered fat binary: only what the server's GPU runs, when the fat
/// binary has it; else the whole fat binary.
fn image_of(conn: &Conn, module: &registry::Module) -> Result<Vec<u8>, u32> {
    // SAFETY: nvcc-generated constructors register pointers to their static wrappers.
    let wrapper: &FatbinWrapper = unsafe { module.wrapper.as_ref() }.ok_or(INVALID_IMAGE)?;
    if wrapper.magic != FATBIN_WRAPPER_MAGIC || wrapper.data.is_null() {
        return Err(INVALID_IMAGE);
    }
    // SAFETY: the fat binary header is 16 bytes at `data`; its size field covers the rest,
    // all in the program's .nv_fatbin section.
    let header = unsafe { std::slice::from_raw_parts(wrapper.data as *const u8, 16) };
    let len = crate::fatbin::total_len(header).map_err(|_| INVALID_IMAGE)?;
    // SAFETY: as above.
    let whole = unsafe { std::slice::from_raw_parts(wrapper.data as *const u8, len) };
    Ok(match crate::fatbin::select(whole, server_sm(conn)) {
        Ok(Some(picked)) => picked,
        _ => whole.to_vec(),
    })
}

/// The server-side module of a registered fat binary, loading it on first use. A module
/// whose kernels an earlier load of the same image listed is loaded under names the client
/// gives (`named`), without waiting. The first load of the process also asks for the
/// registered modules the last run of the same command loaded (`last_run`): named ones
/// like this one; others the server holds are loaded behind the program's calls
/// (`Service::LoadModuleBehind`, on a thread of the worker's own: the calls after this one
/// need not wait for them), the rest in this load's round trip.
pub fn ensure(conn: &Conn, module: &'static registry::Module) -> Result<Arc<Loaded>, u32> {
    let mut slot = module.loaded.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(m) = slot.as_ref() {
        return Ok(m.clone());
    }
    let image = image_of(conn, module)?;
    if let Some(loaded) = behind::take(conn, module, &image) {
        *slot = Some(loaded.clone());
        return Ok(loaded);
    }
    let hash: [u8; 32] = Sha256::digest(&image).into();
    // Named first: the worker's loader takes it before those of the last run.
    let this = named::load(conn, module, hash);
    let ahead = last_run::take_first(conn, module);
    // Modules of the last run not yet loaded and not being loaded by another thread; their
    // slots stay locked until their answers are in. Named ones need none; those the server
    // holds go behind.
    let mut others = Vec::new();
    let mut held_ones = Vec::new();
    let mut named_ones = 0;
    for m in ahead {
        if let Ok(mut other) = m.loaded.try_lock()
            && other.is_none()
            && let Ok(image) = image_of(conn, m)
        {
            let hash: [u8; 32] = Sha256::digest(&image).into();
            if let Some(loaded) = named::load(conn, m, hash) {
                *other = Some(loaded);
                last_run::note(conn, m);
                named_ones += 1;
            } else if server_holds(&conn.server, &hash) == Some(true) {
                held_ones.push((m, hash));
            } else {
                others.push((m, other, image, hash));
            }
        }
    }
    if let Some(loaded) = this {
        // Nothing to wait for: those the server lacks are loaded when first used.
        behind::ask(conn, &held_ones);
        tracing::debug!(
            "modules the last run loaded: {named_ones} named, {} behind, {} when first used",
            held_ones.len(),
            others.len()
        );
        *slot = Some(loaded.clone());
        last_run::note(conn, module);
        return Ok(loaded);
    }
    let mut images: Vec<&[u8]> = vec![&image];
    images.extend(others.iter().map(|(_, _, i, _)| i.as_slice()));
    let mut hashes = vec![hash];
    hashes.extend(others.iter().map(|(_, _, _, h)| *h));
    // The loads behind go after this one: the worker starts them once it has loaded this.
    let mut results = load_images_then(conn, &images, &hashes, || behind::ask(conn, &held_ones)).into_iter();
    let loaded = results.next().unwrap_or(Err(INVALID_IMAGE))?;
    if !others.is_empty() || !held_ones.is_empty() || named_ones > 0 {
        let (made, behind) = (others.len(), held_ones.len());
        for ((m, mut other, _, _), result) in others.into_iter().zip(results) {
            // One that failed is loaded again when the program uses it (and fails then).
            if let Ok(l) = result {
                *other = Some(l);
                last_run::note(conn, m);
            }
        }
        tracing::debug!(
            "modules the last run loaded: {named_ones} named, {made} with the first load, {behind} behind it"
        );
    }
    *slot = Some(loaded.clone());
    last_run::note(conn, module);
    Ok(loaded)
}

/// Module loads named by the client (`Service::LoadModuleNamed`): what a load answers (its
/// kernels, their names and parameter layouts) depends only on the image and the server's
/// driver, so the client keeps each answer (`$XDG_CACHE_HOME/chidori/module-answers/<hash>`,
/// written at the first load of the image, at most 8,192 of them) and, the next time a
/// process needs that image, names its library, module and kernels itself and sends the
/// load without waiting. The worker loads it behind the calls; a call passing one of the names waits there for the
/// load, not here. An image the server's cache has lost is asked of the client
/// ([`image_asked`]), so a stale record costs a transfer, not an error. A kernel the answer
/// lists and the image lacks (a record written by another build) gets NOT_FOUND when used.
/// Images the program passes itself (`cuModuleLoadData`, `cuLibraryLoadData`: Triton's and
/// NVRTC's kernels) are named likewise, a copy of each kept for the server to ask for.
/// `CHIDORI_MODULES_NAMED=0` turns it off, as `CHIDORI_LEARNED=0` does.
mod named {
    use std::collections::HashMap;
    use std::io::Write;
    use std::path::PathBuf;
    use std::sync::{Arc, Mutex};

    use chidori_protocol::messages::Service;

    use super::{Function, Loaded};
    use crate::conn::Conn;
    use crate::registry::Module;

    /// A kernel as an answer lists it: its name and parameter layout.
    type Kernel = (String, Vec<(u32, u32)>);

    /// The first line of an answer file, before the driver's version.
    const HEADER: &str = "chidori module answer 1, driver ";

    /// Where the image of a module loaded by name is: what the server may ask for.
    enum Source {
        /// A registered fat binary: its image is made again when asked.
        Registered(&'static Module),
        /// An image the program passed (`cuModuleLoadData`, `cuLibraryLoadData`): a copy,
        /// since the program may free its own once the load returns.
        Bytes(Arc<[u8]>),
    }

    /// Images of modules loaded by name, by hash, and the bytes the copies among them take.
    #[derive(Default)]
    struct Sent {
        sources: HashMap<[u8; 32], Source>,
        copied: usize,
    }

    static SENT: Mutex<Option<Sent>> = Mutex::new(None);

    /// At most this many bytes of copies are kept; past it, images are loaded waiting.
    const COPIES_MAX: usize = 256 << 20;

    /// On unless `CHIDORI_MODULES_NAMED=0`, or `CHIDORI_LEARNED=0` (a kept answer is one
    /// learned in an earlier session); read once.
    fn enabled() -> bool {
        static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *ON.get_or_init(|| {
            !std::env::var(chidori_protocol::env::MODULES_NAMED).is_ok_and(|v| v == "0") && !crate::learned::off()
        })
    }

    fn path(hash: &[u8; 32]) -> Option<PathBuf> {
        let hex: String = hash.iter().map(|b| format!("{b:02x}")).collect();
        Some(chidori_protocol::env::cache_dir()?.join("module-answers").join(hex))
    }

    /// A kept answer: each kernel's name and parameter layout. None: malformed, or kept
    /// from a server with another driver.
    pub(super) fn parse(text: &str, driver: i32) -> Option<Vec<Kernel>> {
        let mut lines = text.lines();
        if lines.next()? != format!("{HEADER}{driver}") {
            return None;
        }
        lines
            .map(|line| {
                let (name, params) = line.split_once('\t')?;
                let params = params
                    .split(',')
                    .filter(|p| !p.is_empty())
                    .map(|p| {
                        let (offset, size) = p.split_once(':')?;
                        Some((offset.parse().ok()?, size.parse().ok()?))
                    })
                    .collect::<Option<Vec<(u32, u32)>>>()?;
                (!name.is_empty()).then(|| (name.to_owned(), params))
            })
            .collect()
    }

    /// The text of an answer (None: a name a line cannot hold).
    pub(super) fn format(loaded: &Loaded, driver: i32) -> Option<String> {
        let mut kernels: Vec<(&String, &Function)> = loaded.kernels.iter().collect();
        kernels.sort_by_key(|(name, _)| name.as_str());
        let mut text = format!("{HEADER}{driver}\n");
        for (name, f) in kernels {
            if name.is_empty() || name.contains(['\t', '\n', '\r']) {
                return None;
            }
            let params: Vec<String> = f.params.iter().map(|(o, s)| format!("{o}:{s}")).collect();
            text.push_str(&format!("{name}\t{}\n", params.join(",")));
        }
        Some(text)
    }

    /// Keep the answer of a load of the image of `hash` (once per image and driver).
    pub fn keep(conn: &Conn, hash: &[u8; 32], loaded: &Loaded) {
        if !enabled() {
            return;
        }
        let driver = conn.profile.driver_version;
        let Some(path) = path(hash) else { return };
        let header = format!("{HEADER}{driver}");
        let first_line = || -> std::io::Result<String> {
            let mut line = String::new();
            std::io::BufRead::read_line(&mut std::io::BufReader::new(std::fs::File::open(&path)?), &mut line)?;
            Ok(line.trim_end().to_owned())
        };
        if first_line().is_ok_and(|line| line == header) {
            return;
        }
        let Some(text) = format(loaded, driver) else { return };
        let write = || -> std::io::Result<()> {
            let dir = path.parent().ok_or(std::io::ErrorKind::NotFound)?;
            std::fs::create_dir_all(dir)?;
            // Whole or not at all: another process may read it meanwhile.
            let tmp = dir.join(format!(".{}.{}", std::process::id(), crate::conn::thread_id()));
            std::fs::File::create(&tmp)?.write_all(text.as_bytes())?;
            std::fs::rename(&tmp, &path)?;
            bound(dir, KEPT_MAX);
            Ok(())
        };
        if let Err(e) = write() {
            crate::log::once("module answers", || {
                tracing::warn!("cannot keep a module's kernels in {}: {e}", path.display())
            });
        }
    }

    /// Answers kept at most; past it the oldest written go (each is a few kilobytes).
    const KEPT_MAX: usize = 8192;

    /// Keep at most `max` answers in `dir`: past it, the oldest written go, down to 90%.
    pub(super) fn bound(dir: &std::path::Path, max: usize) {
        let Ok(entries) = std::fs::read_dir(dir) else { return };
        let mut kept: Vec<(std::time::SystemTime, PathBuf)> = entries
            .flatten()
            .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
            .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
            .collect();
        if kept.len() <= max {
            return;
        }
        kept.sort();
        let extra = kept.len() - max * 9 / 10;
        for (_, path) in kept.into_iter().take(extra) {
            let _ = std::fs::remove_file(path);
        }
    }

    /// Load registered `module` (its image's hash `hash`) under the client's names, if an
    /// earlier load of the image listed its kernels: sent without waiting.
    pub fn load(conn: &Conn, module: &'static Module, hash: [u8; 32]) -> Option<Arc<Loaded>> {
        load_from(conn, hash, || Some(Source::Registered(module)))
    }

    /// [`load`] for an image the program passed (a copy is kept while the process runs).
    pub fn load_bytes(conn: &Conn, image: &[u8], hash: [u8; 32]) -> Option<Arc<Loaded>> {
        load_from(conn, hash, || Some(Source::Bytes(Arc::from(image))))
    }

    fn load_from(conn: &Conn, hash: [u8; 32], source: impl FnOnce() -> Option<Source>) -> Option<Arc<Loaded>> {
        if !enabled() {
            return None;
        }
        let text = std::fs::read_to_string(path(&hash)?).ok()?;
        let kernels = parse(&text, conn.profile.driver_version)?;
        {
            let mut sent = SENT.lock().unwrap_or_else(|p| p.into_inner());
            let Sent { sources, copied } = sent.get_or_insert_with(Sent::default);
            if let std::collections::hash_map::Entry::Vacant(slot) = sources.entry(hash) {
                let source = source()?;
                if let Source::Bytes(bytes) = &source {
                    if *copied + bytes.len() > COPIES_MAX {
                        return None;
                    }
                    *copied += bytes.len();
                }
                slot.insert(source);
            }
        }
        let name = crate::state::next_handle_name;
        let (library, module_name) = (name(), name());
        let named: Vec<(Kernel, u64)> = kernels.into_iter().map(|k| (k, name())).collect();
        let request = Service::LoadModuleNamed {
            hash,
            library,
            module: module_name,
            kernels: named.iter().map(|((k, _), n)| (k.clone(), *n)).collect(),
        };
        conn.post_service(&request, &[]).ok()?;
        crate::trace::bytes("(module load, named)", 0, 0, 0, std::time::Duration::ZERO);
        let kernels = named
            .into_iter()
            .map(|((k, params), handle)| {
                let params: Arc<[(u32, u32)]> = params.into();
                super::remember(handle, params.clone());
                crate::state::CLIENT.function_origins.insert(handle, (hash, Arc::from(k.as_str())));
                (k, Function { handle, params })
            })
            .collect();
        let loaded = Arc::new(Loaded { library, module: module_name, kernels });
        crate::state::CLIENT.modules.insert(module_name, loaded.clone());
        Some(loaded)
    }

    /// The image of `hash`, for a server that asked for it (`Kind::NeedModule`): one this
    /// process loaded by name. None: no such module.
    pub fn image_asked(conn: &Conn, hash: &[u8; 32]) -> Option<Vec<u8>> {
        let module = match SENT.lock().unwrap_or_else(|p| p.into_inner()).as_ref()?.sources.get(hash)? {
            Source::Registered(module) => *module,
            Source::Bytes(bytes) => return Some(bytes.to_vec()),
        };
        super::image_of(conn, module).ok()
    }

    #[cfg(test)]
    mod tests {
        use super::super::{Function, Loaded};
        use std::collections::HashMap;
        use std::sync::Arc;

        #[test]
        fn answers_past_the_bound_go_oldest_first() {
            let dir = std::env::temp_dir().join(format!("chidori-answers-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            for i in 0..12 {
                std::fs::write(dir.join(format!("{i:02}")), "x").unwrap();
                let when = std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000 + i);
                std::fs::File::options()
                    .write(true)
                    .open(dir.join(format!("{i:02}")))
                    .unwrap()
                    .set_modified(when)
                    .unwrap();
            }
            std::fs::write(dir.join(".tmp"), "x").unwrap();
            super::bound(&dir, 20);
            assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 13, "under the bound: nothing goes");
            super::bound(&dir, 10);
            let mut left: Vec<String> = std::fs::read_dir(&dir)
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            left.sort();
            assert_eq!(left, [".tmp", "03", "04", "05", "06", "07", "08", "09", "10", "11"], "down to 9, oldest first");
            std::fs::remove_dir_all(&dir).unwrap();
        }

        #[test]
        fn answers_read_back_as_written_and_only_for_their_driver() {
            let kernels: HashMap<String, Function> = [
                ("_Z3addPfS_i".to_owned(), Function { handle: 1, params: Arc::from(vec![(0, 8), (8, 8), (16, 4)]) }),
                ("noargs".to_owned(), Function { handle: 2, params: Arc::from(Vec::new()) }),
            ]
            .into();
            let loaded = Loaded { library: 3, module: 4, kernels };
            let text = super::format(&loaded, 13000).expect("plain names");
            let back = super::parse(&text, 13000).expect("its own text");
            assert_eq!(back, vec![("_Z3addPfS_i".into(), vec![(0, 8), (8, 8), (16, 4)]), ("noargs".into(), vec![])]);
            assert_eq!(super::parse(&text, 12080), None, "another driver's answer is not used");
            assert_eq!(super::parse(&text.replace("16:4", "16:x"), 13000), None, "a malformed layout");
            assert_eq!(super::parse(&format!("{text}no tab\n"), 13000), None, "a malformed line");
            let mut odd = loaded;
            odd.kernels.insert("a\tb".into(), Function { handle: 5, params: Arc::from(Vec::new()) });
            assert_eq!(super::format(&odd, 13000), None, "a name a line cannot hold");
        }
    }
}

/// The image of `hash` for a server that asked for it: see `named`.
pub fn image_asked(conn: &Conn, hash: &[u8; 32]) -> Option<Vec<u8>> {
    named::image_asked(conn, hash)
}

/// Modules loaded behind the program's calls (`Service::LoadModuleBehind`): asked with the
/// first load of the process, taken when the program first uses each (waiting only where
/// the worker has not loaded it yet).
mod behind {
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex};
    use std::time::Instant;

    use chidori_protocol::messages::{Service, ServiceReply};

    use super::{Loaded, loaded_from};
    use crate::conn::{Asked, Conn};
    use crate::registry::Module;

    /// The fork count they were asked under, and each module's (by its address) question
    /// and image hash.
    type Asks = (u64, HashMap<usize, (Asked, [u8; 32])>);

    static ASKED: Mutex<Option<Asks>> = Mutex::new(None);

    /// Ask for `modules` (with their images' hashes) to be loaded behind the calls.
    pub fn ask(conn: &Conn, modules: &[(&'static Module, [u8; 32])]) {
        if modules.is_empty() {
            return;
        }
        let forks = crate::conn::forks();
        let mut asked = ASKED.lock().unwrap_or_else(|p| p.into_inner());
        let (at, map) = asked.get_or_insert_with(|| (forks, HashMap::new()));
        if *at != forks {
            (*at, *map) = (forks, HashMap::new());
        }
        for &(m, hash) in modules {
            if let Ok(question) = conn.ask_ahead(&Service::LoadModuleBehind { hash }) {
                map.insert(std::ptr::from_ref(m) as usize, (question, hash));
            }
        }
        // Out now, so that the worker starts them as soon as it has loaded the first.
        let _ = conn.flush();
    }

    /// The module loaded behind the calls for `module` (whose image is `image`), if one was
    /// asked for in this process and loaded. None: not asked, or not loaded there (the
    /// server no longer holds it, or failed to load it): the caller loads it as any module.
    pub fn take(conn: &Conn, module: &Module, image: &[u8]) -> Option<Arc<Loaded>> {
        let (question, hash) = {
            let mut asked = ASKED.lock().unwrap_or_else(|p| p.into_inner());
            let (at, map) = asked.as_mut()?;
            if *at != crate::conn::forks() {
                return None;
            }
            map.remove(&(std::ptr::from_ref(module) as usize))?
        };
        let start = Instant::now();
        let came = question.came();
        let reply = question.answer();
        crate::trace::bytes("(module load)", u64::from(!came), 0, 0, start.elapsed());
        match reply {
            Ok(reply @ ServiceReply::Module { .. }) => {
                let loaded = loaded_from(conn, reply, image, &hash, Some(true)).ok()?;
                super::last_run::note(conn, module);
                Some(loaded)
            }
            _ => None,
        }
    }
}

/// Registered modules the last run of the same command loaded, so that the first load of
/// a process brings them all in one round trip instead of one round trip each as the
/// program first uses them (at 70 ms, torch's first elementwise operations load about 30).
///
/// The record is `$XDG_CACHE_HOME/chidori/programs/<key>`, the key a hash of the server's
/// address and the process's command line; each line names a fat binary by the object file
/// that holds it and its wrapper's offset in that file (`<offset hex> <path>`), which a
/// rebuilt library changes only where the module changed too. What is made ahead is only
/// what the program registered in this run, by the same identity: the server loads the
/// same image it would load on first use (its hash, not the record, names it), so a stale
/// record costs at most a module loaded and not used. `CHIDORI_MODULES_AHEAD=0` turns it off.
mod last_run {
    use std::collections::HashMap;
    use std::ffi::CStr;
    use std::io::Write;
    use std::path::PathBuf;
    use std::sync::Mutex;

    use sha2::{Digest, Sha256};

    use crate::conn::Conn;
    use crate::registry::{self, Module};

    /// Lines kept in one record (past it, new modules are not recorded).
    const MAX_RECORDED: usize = 2048;
    /// Modules made ahead with one first load.
    const MAX_AHEAD: usize = 512;

    struct Record {
        path: Option<PathBuf>,
        /// Fat binaries the record names, each with its line's place in the record: the
        /// order in which the run that recorded them first used them.
        named: HashMap<(u64, String), usize>,
        /// Whether this process's first load has happened (only it makes modules ahead).
        first_done: bool,
    }

    static RECORD: Mutex<Option<Record>> = Mutex::new(None);

    fn path_for(server: &str) -> Option<PathBuf> {
        let dir = chidori_protocol::env::cache_dir()?.join("programs");
        let cmdline = crate::state::command_line();
        if cmdline.is_empty() {
            return None;
        }
        let mut h = Sha256::new();
        h.update(server.as_bytes());
        h.update([0u8]);
        h.update(cmdline);
        let key: String = h.finalize()[..12].iter().map(|b| format!("{b:02x}")).collect();
        std::fs::create_dir_all(&dir).ok()?;
        Some(dir.join(key))
    }

    /// Each identity with the place of its first line.
    fn ordered(ids: impl Iterator<Item = (u64, String)>) -> HashMap<(u64, String), usize> {
        let mut named = HashMap::new();
        for id in ids {
            let next = named.len();
            named.entry(id).or_insert(next);
        }
        named
    }

    fn parse(line: &str) -> Option<(u64, String)> {
        let (offset, path) = line.split_once(' ')?;
        Some((u64::from_str_radix(offset, 16).ok()?, path.to_owned()))
    }

    fn with<T>(conn: &Conn, f: impl FnOnce(&mut Record) -> T) -> T {
        let mut slot = RECORD.lock().unwrap_or_else(|p| p.into_inner());
        let record = slot.get_or_insert_with(|| {
            let path = path_for(&conn.server);
            let text = path.as_ref().and_then(|p| std::fs::read_to_string(p).ok()).unwrap_or_default();
            Record { path, named: ordered(text.lines().filter_map(parse)), first_done: false }
        });
        f(record)
    }

    /// The object file holding a fat binary's wrapper and the wrapper's offset in it.
    pub fn identity(module: &Module) -> Option<(u64, String)> {
        // SAFETY: a zeroed Dl_info is valid; dladdr only reads the address.
        let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
        // SAFETY: any address may be asked about; the wrapper is in the program's data.
        if unsafe { libc::dladdr(module.wrapper.cast(), &mut info) } == 0 || info.dli_fname.is_null() {
            return None;
        }
        // SAFETY: dladdr returned a NUL-terminated file name.
        let path = unsafe { CStr::from_ptr(info.dli_fname) }.to_string_lossy().into_owned();
        let offset = (module.wrapper as u64).checked_sub(info.dli_fbase as u64)?;
        (!path.contains('\n')).then_some((offset, path))
    }

    /// On the process's first load only: the other registered modules the record names, in
    /// the order the recording run first used them (the worker loads those it holds in this
    /// order, behind the calls: the program's next module is most likely loaded first).
    pub fn take_first(conn: &Conn, first: &Module) -> Vec<&'static Module> {
        if std::env::var(chidori_protocol::env::MODULES_AHEAD).is_ok_and(|v| v == "0") {
            return Vec::new();
        }
        let named = with(conn, |r| {
            if std::mem::replace(&mut r.first_done, true) || r.named.is_empty() { None } else { Some(r.named.clone()) }
        });
        let Some(named) = named else { return Vec::new() };
        // `complete` is read under the registry's lock; dladdr (the loader's lock) outside
        // it, since a library's constructors register fat binaries under the loader's lock.
        let registered: Vec<&'static Module> = registry::lock()
            .as_ref()
            .map(|r| r.modules.iter().copied().filter(|m| m.complete && !std::ptr::eq(*m, first)).collect())
            .unwrap_or_default();
        let mut known: Vec<(usize, &'static Module)> =
            registered.into_iter().filter_map(|m| Some((*named.get(&identity(m)?)?, m))).collect();
        known.sort_by_key(|&(place, _)| place);
        known.into_iter().take(MAX_AHEAD).map(|(_, m)| m).collect()
    }

    /// Record that this run loaded `module` (once per module; the file is appended to).
    pub fn note(conn: &Conn, module: &Module) {
        let Some(id) = identity(module) else { return };
        with(conn, |r| {
            if r.named.len() >= MAX_RECORDED || r.named.contains_key(&id) {
                return;
            }
            let Some(path) = r.path.clone() else { return };
            let line = format!("{:x} {}", id.0, id.1);
            let place = r.named.len();
            r.named.insert(id, place);
            let file = std::fs::OpenOptions::new().create(true).append(true).open(&path);
            if let Err(e) = file.and_then(|mut f| writeln!(f, "{line}")) {
                crate::log::once_owned(&format!("{}", path.display()), || {
                    tracing::warn!("cannot record this program's modules in {}: {e}", path.display())
                });
            }
        });
    }

    #[cfg(test)]
    mod tests {
        #[test]
        fn record_lines_parse_and_reject_garbage() {
            assert_eq!(super::parse("1f40 /usr/lib/libx.so"), Some((0x1f40, "/usr/lib/libx.so".into())));
            assert_eq!(super::parse("zz /a"), None);
            assert_eq!(super::parse("12"), None);
            assert_eq!(super::parse("10 /a b.so"), Some((0x10, "/a b.so".into())));
        }

        #[test]
        fn a_records_order_is_its_first_lines() {
            let ids = ["2 /b", "1 /a", "2 /b", "3 /c"].into_iter().filter_map(super::parse);
            let named = super::ordered(ids);
            assert_eq!(named.len(), 3);
            assert_eq!(named[&(2, "/b".into())], 0);
            assert_eq!(named[&(1, "/a".into())], 1);
            assert_eq!(named[&(3, "/c".into())], 2);
        }
    }
}

/// The server function of a registered kernel.
pub fn resolve(conn: &Conn, kernel: &registry::Kernel) -> Result<Function, u32> {
    if let Some(f) = kernel.resolved.get() {
        return Ok(f.clone());
    }
    // SAFETY: kernel records point at their leaked module record.
    let module = unsafe { kernel.module.as_ref() }.ok_or(NOT_FOUND)?;
    let loaded = ensure(conn, module)?;
    let name = kernel.name.to_string_lossy();
    let f = loaded.kernels.get(name.as_ref()).cloned().ok_or_else(|| {
        crate::log::once_owned(&name, || tracing::warn!("the server's module has no kernel {name}"));
        NOT_FOUND
    })?;
    Ok(kernel.resolved.get_or_init(|| f).clone())
}

/// `__cudaInitModule`: the module's `__managed__` variables become the program's memory at
/// their device addresses (managed memory the server mirrors by the variables themselves),
/// with their contents, and the host's pointer to each points there.
pub fn init_managed(module: *const registry::Module) -> Result<(), u32> {
    let variables = registry::managed_variables(module);
    if variables.is_empty() {
        return Ok(());
    }
    let conn = crate::conn::get().map_err(|_| NO_DEVICE)?;
    for &(host_pointer, var) in &variables {
        let address = variable_address(&conn, var)?;
        if let Err(why) = crate::mirror::managed_variable(address, var.size as u64) {
            let message = format!("__managed__ variable {}: {why}", var.name.to_string_lossy());
            crate::log::once_owned(&message, || tracing::warn!("{message}"));
            return Err(NO_DEVICE);
        }
        // SAFETY: nvcc registers the address of the host's pointer to the variable, a
        // pointer-sized static of the program.
        unsafe { std::ptr::write_unaligned(host_pointer as *mut u64, address) };
    }
    // The server's mirrors are the variables; the first pull brings their contents.
    crate::mirror::prepare_reachable(&conn);
    crate::mirror::pull(&conn);
    Ok(())
}

/// The device address of a registered variable.
pub fn variable_address(conn: &Conn, var: &registry::Variable) -> Result<u64, u32> {
    if let Some(a) = var.address.get() {
        return Ok(*a);
    }
    // SAFETY: variable records point at their leaked module record.
    let module = unsafe { var.module.as_ref() }.ok_or(NOT_FOUND)?;
    let loaded = ensure(conn, module)?;
    let name = var.name.to_string_lossy().into_owned();
    let start = Instant::now();
    let reply = conn.service(&Service::Global { module: loaded.library, name }, &[]).map_err(|_| NO_DEVICE)?;
    crate::trace::bytes("(module variable)", 1, 0, 0, start.elapsed());
    match reply {
        ServiceReply::Global { address, .. } => Ok(*var.address.get_or_init(|| address)),
        ServiceReply::Error { status, message } => {
            crate::log::once_owned(&message, || tracing::warn!("{message}"));
            Err(status as u32)
        }
        _ => Err(NOT_FOUND),
    }
}

/// The parameter layout of a function handle from cuModuleGetFunction.
pub fn function_params(conn: &Conn, handle: u64) -> Result<Arc<[(u32, u32)]>, u32> {
    if let Some(p) = crate::state::CLIENT.function_params.get(&handle) {
        return Ok(p);
    }
    let start = Instant::now();
    let reply = conn.service(&Service::FunctionParams { function: handle }, &[]).map_err(|_| NO_DEVICE)?;
    crate::trace::bytes("(function parameters)", 1, 0, 0, start.elapsed());
    match reply {
        ServiceReply::Params { params } => {
            let params: Arc<[(u32, u32)]> = params.into();
            remember(handle, params.clone());
            Ok(params)
        }
        ServiceReply::Error { status, .. } => Err(status as u32),
        _ => Err(NOT_FOUND),
    }
}

/// Pack launch arguments (`args[i]` points at parameter i) by the parameter layout.
///
/// # Safety
/// `args` must hold one valid pointer per parameter, each to `size` readable bytes.
pub unsafe fn pack(params: &[(u32, u32)], args: *const *const u8) -> Vec<u8> {
    let total = params.iter().map(|(o, s)| (*o + *s) as usize).max().unwrap_or(0);
    let mut buf = vec![0u8; total];
    if args.is_null() {
        return buf;
    }
    for (i, (offset, size)) in params.iter().enumerate() {
        // SAFETY: per the contract.
        let p = unsafe { *args.add(i) };
        if !p.is_null() {
            // SAFETY: per the contract; the destination range lies inside `buf`.
            unsafe { std::ptr::copy_nonoverlapping(p, buf.as_mut_ptr().add(*offset as usize), *size as usize) };
        }
    }
    buf
}

/// The values of the 8-byte, 8-aligned parameters (those that may be pointers).
fn pointer_params<'a>(params: &'a [(u32, u32)], packed: &'a [u8]) -> impl Iterator<Item = u64> + 'a {
    params.iter().filter(|(offset, size)| *size == 8 && offset % 8 == 0).filter_map(|(offset, _)| {
        let at = *offset as usize;
        packed.get(at..at + 8).map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
    })
}

/// A pointer-sized parameter may point into the program's pinned memory, which the kernel
/// then reads directly: the server's mirror must hold it first.
pub fn prepare_mirrors(conn: &Conn, params: &[(u32, u32)], packed: &[u8]) {
    crate::mirror::prepare_launch(conn, pointer_params(params, packed));
}

/// Everything about one launch but the function.
pub struct LaunchShape {
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub shared_mem: u32,
    pub stream: u64,
    pub attributes: Vec<(u32, Vec<u8>)>,
    pub cooperative: bool,
    pub api: Api,
}

/// Launch `function` with packed parameters (fire-and-forget).
pub fn launch(conn: &Conn, function: &Function, shape: LaunchShape, packed: &[u8]) -> Result<(), u32> {
    // A pointer-sized parameter may point into the program's pinned memory, which the
    // kernel then reads directly (zero-copy): the server's mirror must hold it first.
    crate::mirror::prepare_launch(conn, pointer_params(&function.params, packed));
    let l = Launch {
        function: function.handle,
        grid: shape.grid,
        block: shape.block,
        shared_mem: shape.shared_mem,
        stream: shape.stream,
        attributes: shape.attributes,
        cooperative: shape.cooperative,
        api: shape.api,
    };
    crate::trace::local("(kernel launch)");
    conn.launch(&l, packed).map_err(|_| NO_DEVICE)
}

/// The module image at `code`, as cuModuleLoadData and cuLibraryLoadData take it: a fat
/// binary, an ELF cubin or PTX text, or a fat binary's wrapper (what nvcc registers; a
/// statically linked runtime passes it to cuLibraryLoadData), which stands for its fat
/// binary.
///
/// # Safety
/// `code` must point at one of those.
pub unsafe fn image_at<'a>(code: *const u8) -> &'a [u8] {
    // SAFETY: every image starts with at least 16 readable bytes (a wrapper has 24).
    let wrapper = unsafe { std::ptr::read_unaligned(code as *const FatbinWrapper) };
    let image =
        if wrapper.magic == FATBIN_WRAPPER_MAGIC && !wrapper.data.is_null() { wrapper.data as *const u8 } else { code };
    // SAFETY: per the contract, `image` is a fat binary, cubin or PTX.
    unsafe { std::slice::from_raw_parts(image, image_len(image)) }
}

/// The length of a module image passed to cuModuleLoadData: a fat binary (its header
/// says), an ELF cubin (its section and program header tables end it), else PTX text.
///
/// # Safety
/// `image` must point at one of those, as cuModuleLoadData requires.
pub unsafe fn image_len(image: *const u8) -> usize {
    // SAFETY: every image starts with at least 16 readable bytes (fat binary header, ELF
    // identification, or PTX text which is longer than that).
    let head = unsafe { std::slice::from_raw_parts(image, 16) };
    if let Ok(n) = crate::fatbin::total_len(head) {
        return n;
    }
    if head.starts_with(b"\x7fELF") {
        // SAFETY: a 64-byte ELF64 header follows the identification.
        let h = unsafe { std::slice::from_raw_parts(image, 64) };
        let u16_at = |at: usize| u64::from(u16::from_le_bytes([h[at], h[at + 1]]));
        let u64_at = |at: usize| u64::from_le_bytes(h[at..at + 8].try_into().unwrap_or([0; 8]));
        let sections = u64_at(0x28) + u16_at(0x3c) * u16_at(0x3a);
        let programs = u64_at(0x20) + u16_at(0x38) * u16_at(0x36);
        return sections.max(programs) as usize;
    }
    // SAFETY: PTX is NUL-terminated text.
    unsafe { std::ffi::CStr::from_ptr(image.cast()) }.to_bytes_with_nul().len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_pointer_sized_aligned_parameters_are_looked_at() {
        // (int at 0, pointer at 8, a 16-byte struct at 16, a pointer at 36 (misaligned), a
        // pointer at 40): the values at 8 and 40 may be pointers.
        let params = [(0, 4), (8, 8), (16, 16), (36, 8), (40, 8)];
        let mut packed = vec![0u8; 48];
        packed[8..16].copy_from_slice(&0x3f00_0000_1000u64.to_le_bytes());
        packed[40..48].copy_from_slice(&7u64.to_le_bytes());
        let found: Vec<u64> = pointer_params(&params, &packed).collect();
        assert_eq!(found, [0x3f00_0000_1000, 7]);
        // A layout that runs past the packed bytes yields nothing for that parameter.
        assert_eq!(pointer_params(&[(48, 8)], &packed).count(), 0);
    }

    #[test]
    fn the_record_holds_hashes_in_hex_and_skips_what_is_not_one() {
        let hash: [u8; 32] = Sha256::digest(b"module").into();
        let line: String = hash.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(parse_hash(&format!("{line}\n")), Some(hash));
        assert_eq!(parse_hash(&line[..62]), None, "too short");
        assert_eq!(parse_hash(&format!("{}zz", &line[..62])), None, "not hex");
        assert_eq!(parse_hash(""), None);
    }
}
