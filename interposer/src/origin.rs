//! Where a waited round trip came from: the line of the program's own source that made the
//! call the client had to wait for, so a user sees "train.py:57 `loss.item()`: 60 round
//! trips, 4.2 s" and can move or remove the synchronization.
//!
//! Looked up only while tracing (`chidori run --trace`, or CHIDORI_TRACE set), once per
//! waited round trip, never for calls sent without waiting. In a Python process whose
//! calling thread holds the interpreter, the origin is the innermost Python frame outside
//! installed packages and the standard library (torch, transformers, … are skipped, the
//! script is not); the Python C API is found in the process itself, nothing is linked. On
//! any other thread, or in a program without Python, it is the innermost native frame
//! outside Chidori's libraries and the CUDA, PyTorch and Python libraries, symbolized from
//! the object's ELF symbol tables when the report is written.

use std::collections::HashMap;
use std::ffi::{CStr, c_char, c_int, c_void};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

/// Where one waited round trip came from.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Site {
    /// A Python frame: its file (as Python names it), line and code object's name.
    Python { file: String, line: u32, function: String },
    /// A native frame: its object file and the address within it (a link-time address, as
    /// in the file's symbol table).
    Native { object: String, address: u64 },
    /// No frame outside Chidori's and the CUDA libraries.
    Unknown,
}

/// What waited at one site.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SiteRow {
    pub round_trips: u64,
    pub wait_ns: u64,
    /// The CUDA functions that waited here, with their round trips.
    pub functions: HashMap<&'static str, u64>,
}

impl SiteRow {
    /// The function that waited most often here.
    fn main_function(&self) -> &'static str {
        self.functions.iter().max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(a.0))).map_or("", |(name, _)| name)
    }
}

fn sites() -> &'static Mutex<HashMap<Site, SiteRow>> {
    static SITES: OnceLock<Mutex<HashMap<Site, SiteRow>>> = OnceLock::new();
    SITES.get_or_init(Mutex::default)
}

/// Count one waited round trip of `function` (`round_trips` of them: a batch counts as one),
/// which waited `wait_ns`, at the site of the current thread's caller.
pub fn waited(function: &'static str, round_trips: u64, wait_ns: u64) {
    if !python_waited(function, round_trips, wait_ns) {
        add(native_site(), function, round_trips, wait_ns);
    }
}

fn add(site: Site, function: &'static str, round_trips: u64, wait_ns: u64) {
    let mut sites = sites().lock().unwrap_or_else(|p| p.into_inner());
    let row = sites.entry(site).or_default();
    row.round_trips += round_trips;
    row.wait_ns += wait_ns;
    *row.functions.entry(function).or_default() += round_trips;
}

/// Every site so far, most waiting first.
pub fn snapshot() -> Vec<(Site, SiteRow)> {
    let sites = sites().lock().unwrap_or_else(|p| p.into_inner());
    let mut rows: Vec<_> = sites.iter().map(|(s, r)| (s.clone(), r.clone())).collect();
    rows.sort_by(|a, b| b.1.wait_ns.cmp(&a.1.wait_ns).then(b.1.round_trips.cmp(&a.1.round_trips)));
    rows
}

/// One site as the report shows it: where, the function it is in, and (for Python) the
/// text of the line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Described {
    pub location: String,
    pub function: String,
    pub source: String,
}

/// Describe `site`: paths relative to the working directory where they are below it; native
/// addresses symbolized through `symbols` (one table per object, read once).
pub fn describe(site: &Site, symbols: &mut Symbols) -> Described {
    match site {
        Site::Python { file, line, function } => Described {
            location: format!("{}:{line}", shorten(file)),
            function: function.clone(),
            source: source_line(Path::new(file), *line).unwrap_or_default(),
        },
        Site::Native { object, address } => {
            let function = symbols.name(object, *address).unwrap_or_else(|| format!("{address:#x}"));
            Described { location: shorten(object), function, source: String::new() }
        }
        Site::Unknown => Described {
            location: "(no frame outside the CUDA libraries)".to_owned(),
            function: String::new(),
            source: String::new(),
        },
    }
}

/// The report's table: one line per site, most waiting first, at most `limit` lines.
pub fn report(limit: usize) -> String {
    let rows = snapshot();
    if rows.is_empty() {
        return String::new();
    }
    let mut symbols = Symbols::default();
    let mut out = String::from(
        "chidori trace: waited round trips by where the program made them (most waiting first)\n\
         round trips, ms waiting, where, in, the call that waited most there, source\n",
    );
    for (site, row) in rows.iter().take(limit) {
        let d = describe(site, &mut symbols);
        let source = if d.source.is_empty() { String::new() } else { format!("  `{}`", d.source) };
        out.push_str(&format!(
            "{:>9} {:>10.1}  {} in {}  [{}]{source}\n",
            row.round_trips,
            row.wait_ns as f64 / 1e6,
            d.location,
            if d.function.is_empty() { "?" } else { &d.function },
            row.main_function(),
        ));
    }
    if rows.len() > limit {
        out.push_str(&format!("({} more sites)\n", rows.len() - limit));
    }
    out
}

/// The sites as a JSON array of `{"where", "in", "source", "round_trips", "ms_waiting",
/// "waited_for"}`, most waiting first.
pub fn json(out: &mut String, json_string: fn(&mut String, &str)) {
    let mut symbols = Symbols::default();
    out.push('[');
    for (i, (site, row)) in snapshot().iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let d = describe(site, &mut symbols);
        for (key, value) in [("{\"where\":", &d.location), (",\"in\":", &d.function), (",\"source\":", &d.source)] {
            out.push_str(key);
            json_string(out, value);
        }
        out.push_str(&format!(
            ",\"round_trips\":{},\"ms_waiting\":{},\"waited_for\":",
            row.round_trips,
            row.wait_ns as f64 / 1e6
        ));
        json_string(out, row.main_function());
        out.push('}');
    }
    out.push(']');
}

fn shorten(path: &str) -> String {
    let cwd = std::env::current_dir().unwrap_or_default();
    match Path::new(path).strip_prefix(&cwd) {
        Ok(rel) if !cwd.as_os_str().is_empty() && cwd != Path::new("/") => rel.display().to_string(),
        _ => path.to_owned(),
    }
}

/// Line `line` (from 1) of `file`, trimmed and cut to 80 characters.
fn source_line(file: &Path, line: u32) -> Option<String> {
    let text = std::fs::read_to_string(file).ok()?;
    let raw = text.lines().nth((line as usize).checked_sub(1)?)?.trim();
    let mut cut: String = raw.chars().take(80).collect();
    if cut.len() < raw.len() {
        cut.push('…');
    }
    Some(cut)
}

// ---- Python ----

type PyObject = c_void;

/// The functions of the Python C API (stable ABI; the collector switches since 3.10) that
/// reading frames needs, found in the process with dlsym.
struct PyApi {
    is_initialized: unsafe extern "C" fn() -> c_int,
    gil_check: unsafe extern "C" fn() -> c_int,
    err_fetch: unsafe extern "C" fn(*mut *mut PyObject, *mut *mut PyObject, *mut *mut PyObject),
    err_restore: unsafe extern "C" fn(*mut PyObject, *mut PyObject, *mut PyObject),
    err_clear: unsafe extern "C" fn(),
    gc_disable: Option<unsafe extern "C" fn() -> c_int>,
    gc_enable: Option<unsafe extern "C" fn() -> c_int>,
    get_frame: unsafe extern "C" fn() -> *mut PyObject,
    frame_back: unsafe extern "C" fn(*mut PyObject) -> *mut PyObject,
    frame_code: unsafe extern "C" fn(*mut PyObject) -> *mut PyObject,
    frame_line: unsafe extern "C" fn(*mut PyObject) -> c_int,
    get_attr: unsafe extern "C" fn(*mut PyObject, *const c_char) -> *mut PyObject,
    as_utf8: unsafe extern "C" fn(*mut PyObject) -> *const c_char,
    sys_get: unsafe extern "C" fn(*const c_char) -> *mut PyObject,
    dec_ref: unsafe extern "C" fn(*mut PyObject),
    set_profile: unsafe extern "C" fn(Option<ProfileFn>, *mut PyObject),
    set_profile_all: Option<unsafe extern "C" fn(Option<ProfileFn>, *mut PyObject)>,
}

/// `Py_tracefunc`: (object, frame, event, argument) -> 0.
type ProfileFn = unsafe extern "C" fn(*mut PyObject, *mut PyObject, c_int, *mut PyObject) -> c_int;

/// `PyTrace_CALL` and `PyTrace_RETURN`: a Python function's frame starts and ends.
const PY_TRACE_CALL: c_int = 0;
const PY_TRACE_RETURN: c_int = 3;

fn python() -> Option<&'static PyApi> {
    static API: OnceLock<Option<PyApi>> = OnceLock::new();
    API.get_or_init(|| {
        fn find(name: &CStr) -> Option<*mut c_void> {
            // SAFETY: dlsym with RTLD_DEFAULT and a NUL-terminated name only looks the name up.
            let p = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
            (!p.is_null()).then_some(p)
        }
        macro_rules! f {
            ($name:literal) => {
                // SAFETY: the symbol is the Python C API function of that name, whose C
                // signature the field's type spells.
                find($name).map(|p| unsafe { std::mem::transmute::<*mut c_void, _>(p) })
            };
        }
        Some(PyApi {
            is_initialized: f!(c"Py_IsInitialized")?,
            gil_check: f!(c"PyGILState_Check")?,
            err_fetch: f!(c"PyErr_Fetch")?,
            err_restore: f!(c"PyErr_Restore")?,
            err_clear: f!(c"PyErr_Clear")?,
            gc_disable: f!(c"PyGC_Disable"),
            gc_enable: f!(c"PyGC_Enable"),
            get_frame: f!(c"PyEval_GetFrame")?,
            frame_back: f!(c"PyFrame_GetBack")?,
            frame_code: f!(c"PyFrame_GetCode")?,
            frame_line: f!(c"PyFrame_GetLineNumber")?,
            get_attr: f!(c"PyObject_GetAttrString")?,
            as_utf8: f!(c"PyUnicode_AsUTF8")?,
            sys_get: f!(c"PySys_GetObject")?,
            dec_ref: f!(c"Py_DecRef")?,
            set_profile: f!(c"PyEval_SetProfile")?,
            set_profile_all: f!(c"PyEval_SetProfileAllThreads"),
        })
    })
    .as_ref()
}

/// Frames examined before giving up on finding the program's own.
const MAX_FRAMES: usize = 128;
/// Frames of one thread followed by the profile hook (deeper recursion is not followed).
const MAX_DEPTH: usize = 100_000;

/// A waited round trip made while the thread had released the interpreter, to be placed
/// when the thread next runs Python.
struct Pending {
    frame: usize,
    function: &'static str,
    round_trips: u64,
    wait_ns: u64,
}

/// What the profile hook keeps per thread: its Python frames, innermost last, and the
/// round trips waiting to be placed.
#[derive(Default)]
struct Followed {
    frames: Vec<usize>,
    pending: Vec<Pending>,
}

thread_local! {
    static FOLLOWED: std::cell::RefCell<Followed> = std::cell::RefCell::default();
}

/// Where a waited round trip of `function` belongs in Python: placed now when the thread
/// holds the interpreter, queued for the thread's next Python event when it released it
/// inside a call the profile hook saw start (torch releases it around every operator).
/// False where Python cannot say: the caller uses the native frame.
fn python_waited(function: &'static str, round_trips: u64, wait_ns: u64) -> bool {
    let Some(api) = python() else { return false };
    // SAFETY: the interpreter's own functions, called only once it is initialized; frames
    // are read only while the thread holds it (PyGILState_Check).
    unsafe {
        if (api.is_initialized)() == 0 {
            return false;
        }
        if (api.gil_check)() != 0 {
            let frame = (api.get_frame)();
            return match place(api, frame) {
                Some(site) => {
                    add(site, function, round_trips, wait_ns);
                    true
                }
                None => false,
            };
        }
    }
    FOLLOWED
        .try_with(|f| {
            let mut f = f.borrow_mut();
            let Some(&frame) = f.frames.last() else { return false };
            f.pending.push(Pending { frame, function, round_trips, wait_ns });
            true
        })
        .unwrap_or(false)
}

/// The profile hook: follows the thread's Python frames, and places the round trips it
/// waited while outside Python. Runs with the interpreter held, at every call and return
/// of a Python function (and of a C function, which change no frame).
unsafe extern "C" fn follow(_obj: *mut PyObject, frame: *mut PyObject, what: c_int, _arg: *mut PyObject) -> c_int {
    let _ = std::panic::catch_unwind(|| {
        let pending = FOLLOWED
            .try_with(|f| {
                let mut f = f.borrow_mut();
                let frame = frame as usize;
                match what {
                    PY_TRACE_CALL if f.frames.len() < MAX_DEPTH => f.frames.push(frame),
                    PY_TRACE_RETURN => {
                        if let Some(i) = f.frames.iter().rposition(|&x| x == frame) {
                            f.frames.truncate(i);
                        }
                    }
                    _ => {}
                }
                std::mem::take(&mut f.pending)
            })
            .unwrap_or_default();
        if pending.is_empty() {
            return;
        }
        let Some(api) = python() else { return };
        for p in pending {
            // SAFETY: the hook runs with the interpreter held; the queued frame is one of
            // this thread's, still running: the thread has not run Python since (this is
            // its first event), and a frame ends only through its return event.
            let site = unsafe { place(api, p.frame as *mut PyObject) }.unwrap_or(Site::Unknown);
            add(site, p.function, p.round_trips, p.wait_ns);
        }
    });
    0
}

/// Start following Python frames in every thread of the interpreter (the calling thread
/// only, before Python 3.12), so waits made with the interpreter released are placed too.
/// Returns 1 when the hook is in place, 0 when not (not tracing, no Python, or the
/// interpreter not held by the caller). Python calls this through ctypes.PyDLL at start
/// (the `chidori run --trace` hook), when no profiler of the program's own is installed.
#[unsafe(no_mangle)]
pub extern "C" fn chidori_trace_python() -> c_int {
    crate::guard::ffi("chidori_trace_python", 0, || {
        if !crate::trace::tracing() {
            return 0;
        }
        let Some(api) = python() else { return 0 };
        // SAFETY: setting a profile function is allowed only with the interpreter held,
        // which PyGILState_Check confirms; `follow` has Py_tracefunc's signature.
        unsafe {
            if (api.is_initialized)() == 0 || (api.gil_check)() == 0 {
                return 0;
            }
            match api.set_profile_all {
                Some(all) => all(Some(follow), std::ptr::null_mut()),
                None => (api.set_profile)(Some(follow), std::ptr::null_mut()),
            }
        }
        1
    })
}

/// The Python site of `frame` and its callers: the innermost frame that is the program's
/// own, or the innermost when every one is a library's.
///
/// # Safety
/// The interpreter is held; `frame` is null or a live frame of the calling thread.
unsafe fn place(api: &PyApi, frame: *mut PyObject) -> Option<Site> {
    if frame.is_null() {
        return None;
    }
    // SAFETY: the interpreter is held. A pending exception (the hook runs while one
    // propagates) is set aside and put back; the collector is off while frame objects are
    // made, so no finalizer (which could call CUDA again) runs inside this call.
    unsafe {
        let (mut t, mut v, mut tb) = (std::ptr::null_mut(), std::ptr::null_mut(), std::ptr::null_mut());
        (api.err_fetch)(&mut t, &mut v, &mut tb);
        let was_enabled = api.gc_disable.map_or(0, |f| f());
        let site = walk(api, frame);
        if was_enabled != 0
            && let Some(enable) = api.gc_enable
        {
            enable();
        }
        (api.err_clear)();
        (api.err_restore)(t, v, tb);
        site
    }
}

/// # Safety
/// As [`place`], with no exception pending.
unsafe fn walk(api: &PyApi, first: *mut PyObject) -> Option<Site> {
    // SAFETY: the caller holds the interpreter; `first` is borrowed, later frames are
    // references PyFrame_GetBack gave, released before moving on.
    unsafe {
        let library = library_prefixes(api);
        let mut frame = first;
        let mut owned = false;
        let mut innermost = None;
        for _ in 0..MAX_FRAMES {
            if frame.is_null() {
                return innermost;
            }
            if let Some(site) = frame_site(api, frame) {
                let own = matches!(&site, Site::Python { file, .. } if !is_library(file, &library));
                if own {
                    if owned {
                        (api.dec_ref)(frame);
                    }
                    return Some(site);
                }
                innermost.get_or_insert(site);
            }
            let back = (api.frame_back)(frame);
            if owned {
                (api.dec_ref)(frame);
            }
            frame = back;
            owned = true;
        }
        if owned && !frame.is_null() {
            (api.dec_ref)(frame);
        }
        innermost
    }
}

/// # Safety
/// `frame` is a live Python frame object; the interpreter is held.
unsafe fn frame_site(api: &PyApi, frame: *mut PyObject) -> Option<Site> {
    // SAFETY: documented API on a live frame; `code` is a new reference released below.
    unsafe {
        let line = (api.frame_line)(frame);
        let code = (api.frame_code)(frame);
        if code.is_null() {
            return None;
        }
        let file = attr_string(api, code, c"co_filename");
        let function = attr_string(api, code, c"co_qualname").or_else(|| attr_string(api, code, c"co_name"));
        (api.dec_ref)(code);
        Some(Site::Python {
            file: file?,
            line: u32::try_from(line).unwrap_or(0),
            function: function.unwrap_or_default(),
        })
    }
}

/// # Safety
/// `obj` is a live object; the interpreter is held.
unsafe fn attr_string(api: &PyApi, obj: *mut PyObject, name: &CStr) -> Option<String> {
    // SAFETY: a new reference (or null with an exception set, cleared here); the UTF-8
    // buffer belongs to the string and is copied before the reference is released.
    unsafe {
        let value = (api.get_attr)(obj, name.as_ptr());
        if value.is_null() {
            (api.err_clear)();
            return None;
        }
        let text = (api.as_utf8)(value);
        let out = if text.is_null() {
            (api.err_clear)();
            None
        } else {
            Some(CStr::from_ptr(text).to_string_lossy().into_owned())
        };
        (api.dec_ref)(value);
        out
    }
}

/// Directories whose files are libraries, not the program: the standard library under
/// `sys.base_prefix` and `sys.prefix` (site-packages is recognized by name).
///
/// # Safety
/// The interpreter is held.
unsafe fn library_prefixes(api: &PyApi) -> Vec<String> {
    static PREFIXES: OnceLock<Vec<String>> = OnceLock::new();
    PREFIXES
        .get_or_init(|| {
            let mut out = Vec::new();
            for name in [c"base_prefix", c"prefix", c"base_exec_prefix"] {
                // SAFETY: a borrowed reference to a sys attribute (null when missing, with
                // no exception set), read at once.
                let value = unsafe { (api.sys_get)(name.as_ptr()) };
                if value.is_null() {
                    continue;
                }
                // SAFETY: as in attr_string; the buffer is copied at once.
                let text = unsafe { (api.as_utf8)(value) };
                if text.is_null() {
                    // SAFETY: clearing the error a non-string raised.
                    unsafe { (api.err_clear)() };
                    continue;
                }
                // SAFETY: a NUL-terminated UTF-8 buffer owned by the string.
                let prefix = unsafe { CStr::from_ptr(text) }.to_string_lossy().into_owned();
                out.push(format!("{}/lib/python", prefix.trim_end_matches('/')));
                out.push(format!("{}/lib64/python", prefix.trim_end_matches('/')));
            }
            out
        })
        .clone()
}

/// Whether a Python file is a library's: an installed package, the standard library,
/// frozen modules, or Chidori's own package.
pub fn is_library(file: &str, library_prefixes: &[String]) -> bool {
    file.starts_with("<frozen")
        || file.contains("/site-packages/")
        || file.contains("/dist-packages/")
        || file.contains("/chidori/_hook/")
        || Path::new(file).parent().is_some_and(|dir| dir.ends_with("python/chidori"))
        || library_prefixes.iter().any(|p| file.starts_with(p.as_str()))
}

// ---- native ----

unsafe extern "C" {
    /// glibc's unwinder (execinfo.h): fills `buffer` with up to `size` return addresses.
    fn backtrace(buffer: *mut *mut c_void, size: c_int) -> c_int;
}

/// Native frames examined.
const NATIVE_FRAMES: usize = 64;

/// The innermost native frame outside Chidori's libraries and the CUDA, PyTorch and Python
/// libraries; failing that, the innermost outside Chidori's.
fn native_site() -> Site {
    let mut frames = [std::ptr::null_mut::<c_void>(); NATIVE_FRAMES];
    // SAFETY: `frames` holds NATIVE_FRAMES pointers.
    let n = unsafe { backtrace(frames.as_mut_ptr(), NATIVE_FRAMES as c_int) };
    let ours = own_directory();
    let mut fallback = None;
    for &pc in frames.iter().take(usize::try_from(n).unwrap_or(0)) {
        let Some((object, address)) = locate(pc) else { continue };
        if ours.as_deref().is_some_and(|dir| Path::new(&object).parent() == Some(dir)) {
            continue;
        }
        let site = Site::Native { object: object.clone(), address };
        if !is_runtime_library(&object) {
            return site;
        }
        fallback.get_or_insert(site);
    }
    fallback.unwrap_or(Site::Unknown)
}

/// The directory of Chidori's own client library (and the shims beside it).
fn own_directory() -> Option<PathBuf> {
    static DIR: OnceLock<Option<PathBuf>> = OnceLock::new();
    DIR.get_or_init(|| {
        let (object, _) = locate(own_directory as *mut c_void)?;
        Path::new(&object).parent().map(Path::to_path_buf)
    })
    .clone()
}

/// Libraries between a program and its CUDA calls, skipped when looking for its own frame.
fn is_runtime_library(object: &str) -> bool {
    let name = Path::new(object).file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    ["libcu", "libnv", "libtorch", "libc10", "libmagma", "libpython", "libc.so", "libstdc++", "libgcc", "libchidori"]
        .iter()
        .any(|p| name.starts_with(p))
        || name.starts_with("python")
}

/// The object containing the return address `pc` and the link-time address of the call
/// instruction within it.
fn locate(pc: *mut c_void) -> Option<(String, u64)> {
    let mut info = std::mem::MaybeUninit::<libc::Dl_info>::zeroed();
    // SAFETY: dladdr writes `info` and returns non-zero on success; the strings it points
    // to belong to the loader and are copied at once.
    let info = unsafe {
        if libc::dladdr(pc, info.as_mut_ptr()) == 0 {
            return None;
        }
        info.assume_init()
    };
    if info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: a NUL-terminated path owned by the loader.
    let mut object = unsafe { CStr::from_ptr(info.dli_fname) }.to_string_lossy().into_owned();
    if object.is_empty() || !object.contains('/') {
        // The main program is named as it was run; /proc has its full path.
        object = std::fs::read_link("/proc/self/exe").map(|p| p.display().to_string()).unwrap_or(object);
    }
    // A return address points after the call: the call itself is one byte earlier.
    let offset = (pc as u64).saturating_sub(info.dli_fbase as u64).saturating_sub(1);
    Some((object, offset))
}

/// ELF symbol tables, read once per object when a report is written.
#[derive(Default)]
pub struct Symbols {
    tables: HashMap<String, Option<Table>>,
}

struct Table {
    /// Where the object's first loadable segment expects to be (0 for a shared object or a
    /// position-independent program): offsets from the load base add this.
    base: u64,
    /// Function symbols, by start address.
    functions: Vec<(u64, u64, String)>,
}

impl Symbols {
    /// The function containing `offset` (from the object's load base) in `object`, as
    /// `name+0x1c`.
    pub fn name(&mut self, object: &str, offset: u64) -> Option<String> {
        let table = self.tables.entry(object.to_owned()).or_insert_with(|| read_table(Path::new(object))).as_ref()?;
        let address = table.base + offset;
        let i = table.functions.partition_point(|(start, _, _)| *start <= address).checked_sub(1)?;
        let (start, size, name) = &table.functions[i];
        (address < start + (*size).max(1) || *size == 0).then(|| format!("{name}+{:#x}", address - start))
    }
}

fn read_table(path: &Path) -> Option<Table> {
    use object::{Object, ObjectSegment, ObjectSymbol, SymbolKind};
    let data = std::fs::read(path).ok()?;
    let file = object::File::parse(&*data).ok()?;
    let base = file.segments().map(|s| s.address()).min().unwrap_or(0) & !0xfff;
    let mut functions: Vec<(u64, u64, String)> = file
        .symbols()
        .chain(file.dynamic_symbols())
        .filter(|s| s.kind() == SymbolKind::Text && s.address() != 0)
        .filter_map(|s| Some((s.address(), s.size(), s.name().ok()?.to_owned())))
        .collect();
    functions.sort();
    functions.dedup_by_key(|f| f.0);
    Some(Table { base, functions })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libraries_are_recognized_and_the_program_is_not() {
        let prefixes = vec!["/usr/lib/python".to_owned()];
        for lib in [
            "/opt/venv/lib/python3.12/site-packages/torch/_tensor.py",
            "/usr/lib/python3/dist-packages/numpy/core.py",
            "<frozen importlib._bootstrap>",
            "/usr/lib/python3.12/threading.py",
            "/opt/chidori/python/chidori/decode.py",
        ] {
            assert!(is_library(lib, &prefixes), "{lib}");
        }
        for own in ["/home/me/train.py", "<stdin>", "<string>", "/home/me/python/model.py"] {
            assert!(!is_library(own, &prefixes), "{own}");
        }
    }

    #[test]
    fn sites_aggregate_and_sort_by_time_waiting() {
        let a = Site::Python { file: "/nowhere/a.py".into(), line: 3, function: "f".into() };
        let b = Site::Python { file: "/nowhere/b.py".into(), line: 9, function: "g".into() };
        add(a.clone(), "cudaStreamSynchronize", 1, 5_000_000);
        add(a.clone(), "cudaStreamSynchronize", 1, 5_000_000);
        add(a.clone(), "cudaMemcpyAsync", 1, 1_000_000);
        add(b.clone(), "cudaMemcpy", 1, 20_000_000);
        let rows = snapshot();
        let ia = rows.iter().position(|(s, _)| *s == a).unwrap();
        let ib = rows.iter().position(|(s, _)| *s == b).unwrap();
        assert!(ib < ia, "most waiting first: {rows:?}");
        assert_eq!(rows[ia].1.round_trips, 3);
        assert_eq!(rows[ia].1.wait_ns, 11_000_000);
        assert_eq!(rows[ia].1.main_function(), "cudaStreamSynchronize");
        let text = report(1000);
        assert!(text.contains("/nowhere/a.py:3 in f  [cudaStreamSynchronize]"), "{text}");
    }

    #[test]
    fn a_python_site_shows_its_source_line() {
        let dir = std::env::temp_dir().join(format!("chidori-origin-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("script.py");
        std::fs::write(&file, "import x\n\n    loss.item()   \n").unwrap();
        let site = Site::Python { file: file.display().to_string(), line: 3, function: "step".into() };
        let d = describe(&site, &mut Symbols::default());
        assert_eq!(d.source, "loss.item()");
        assert_eq!(d.function, "step");
        assert!(d.location.ends_with("script.py:3"), "{d:?}");
        let missing = Site::Python { file: "/no/such.py".into(), line: 1, function: "h".into() };
        assert_eq!(describe(&missing, &mut Symbols::default()).source, "");
    }

    #[inline(never)]
    extern "C" fn marker_function_for_symbols() {}

    #[test]
    fn a_native_address_is_symbolized_from_the_object() {
        // Not a Python process.
        assert!(python().is_none());
        // A return address one byte into the function, as a call inside it would leave.
        let pc = (marker_function_for_symbols as *const () as usize + 1) as *mut c_void;
        let (object, address) = locate(pc).expect("dladdr finds the test binary");
        let name = Symbols::default().name(&object, address).expect("a symbol");
        assert!(name.contains("marker_function_for_symbols") && name.ends_with("+0x0"), "{name}");
    }
}
