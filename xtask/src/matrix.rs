//! `cargo xtask matrix`: the version-translation test matrix.
//!
//! For each CUDA version, a C program is generated from that version's IR, compiled with gcc
//! against that version's runtime headers (no nvcc, no NVIDIA library), linked against the
//! shim of its SONAME, and run through `chidori run` against a server. It prints every
//! `cudaDeviceProp` field of its own layout and every device attribute, and checks memory
//! round trips (1 B to 256 MiB; sync and async; pinned and pageable), memset and
//! device-to-device copies, streams and events, host callbacks, pointer and function
//! attributes (with guard bytes around the caller's struct), graphs (edges, instantiation
//! and update, whose signatures differ between versions), and error paths. The runner
//! compares the properties with the device profile and prints one row per version.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use anyhow::{Context, Result, bail};

use crate::ir::{self, Ty};

/// Groups of checks, in table order.
pub const GROUPS: &[&str] =
    &["props", "attrs", "memory", "memset_d2d", "streams", "callbacks", "pointers", "graphs", "errors"];

/// `cudaDeviceProp` fields CUDA 13 removed, and the attribute that holds each value.
const DERIVED: &[(&str, &str)] = &[
    ("clockRate", "CU_DEVICE_ATTRIBUTE_CLOCK_RATE"),
    ("deviceOverlap", "CU_DEVICE_ATTRIBUTE_GPU_OVERLAP"),
    ("kernelExecTimeoutEnabled", "CU_DEVICE_ATTRIBUTE_KERNEL_EXEC_TIMEOUT"),
    ("computeMode", "CU_DEVICE_ATTRIBUTE_COMPUTE_MODE"),
    ("memoryClockRate", "CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE"),
    ("maxTexture1DLinear", "CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE1D_LINEAR_WIDTH"),
    ("singleToDoublePrecisionPerfRatio", "CU_DEVICE_ATTRIBUTE_SINGLE_TO_DOUBLE_PRECISION_PERF_RATIO"),
    ("cooperativeMultiDeviceLaunch", "CU_DEVICE_ATTRIBUTE_COOPERATIVE_MULTI_DEVICE_LAUNCH"),
];

fn soname_of(root: &Path, cuda: &str) -> Result<String> {
    let text = std::fs::read_to_string(ir::ir_path(root, cuda, "cudart"))?;
    let ir = ir::LibraryIr::from_jsonl(&text, Path::new("cudart"))?;
    Ok(ir.meta().soname.clone())
}

/// The C program for one CUDA version.
pub fn source(root: &Path, cuda: &str) -> Result<String> {
    let text = std::fs::read_to_string(ir::ir_path(root, cuda, "cudart"))?;
    let ir = ir::LibraryIr::from_jsonl(&text, Path::new("cudart"))?;
    let prop = ir.records.get("cudaDeviceProp").context("no cudaDeviceProp in the IR")?;
    let mut props = String::new();
    for f in &prop.fields {
        if f.name.starts_with("reserved") || f.offset == u64::MAX {
            continue;
        }
        let name = &f.name;
        let ty = Ty::parse(&f.ty)?;
        match &ty {
            Ty::Array { of, len } if **of == Ty::Prim("i8") => {
                let _ = writeln!(props, "  printf(\"PROP {name}\"); hex(p.{name}, {len});");
            }
            Ty::Array { len, .. } => {
                let _ = write!(props, "  printf(\"PROP {name}\");");
                for i in 0..*len {
                    let _ = write!(props, " printf(\" %lld\", (long long)p.{name}[{i}]);");
                }
                props.push_str(" printf(\"\\n\");\n");
            }
            Ty::Named(_) => {
                let _ = writeln!(props, "  printf(\"PROP {name}\"); hex(&p.{name}, sizeof(p.{name}));");
            }
            _ => {
                let _ = writeln!(props, "  printf(\"PROP {name} %lld\\n\", (long long)p.{name});");
            }
        }
    }
    let mut derived = String::new();
    for (field, attr) in DERIVED {
        if prop.fields.iter().any(|f| f.name == *field) {
            let cuda_attr = cuda_dev_attr(attr);
            let _ = writeln!(
                derived,
                "  {{ int v = -1; check(\"attrs\", cudaDeviceGetAttribute(&v, {cuda_attr}, 0) == 0 && v == p.{field}, \"{field} %d vs attribute %d\", (int)p.{field}, v); }}"
            );
        }
    }
    // Entry points newer versions added, where this version declares them.
    let mut newer = String::new();
    for (function, check) in NEWER {
        if ir.functions.contains_key(*function) {
            newer.push_str(check);
        }
    }
    Ok(TEMPLATE
        .replace("@PROPS@", &props)
        .replace("@DERIVED@", &derived)
        .replace("@NEWER@", &newer)
        .replace("@CUDA@", cuda))
}

/// Checks of entry points that only some versions declare, each run where the version's
/// runtime has the function: CUDA 13.5's host function with a sync mode and copy with
/// attributes (a round trip through the device in stream order).
const NEWER: &[(&str, &str)] = &[
    (
        "cudaLaunchHostFunc_v2",
        r#"  { /* a host function with a sync mode, between two without */
    order_n = 0;
    cudaError_t e = cudaLaunchHostFunc(s, host_fn, (void *)1);
    if (!e) e = cudaLaunchHostFunc_v2(s, host_fn, (void *)2, cudaHostTaskSpinWait);
    if (!e) e = cudaLaunchHostFunc(s, host_fn, (void *)3);
    if (!e) e = cudaStreamSynchronize(s);
    check("callbacks", e == 0 && order_n == 3 && order[0] == 1 && order[1] == 2 && order[2] == 3, "v2: status %d, ran %d", e, order_n);
  }
"#,
    ),
    (
        "cudaMemcpyWithAttributesAsync",
        r#"  { /* copies with attributes, there and back */
    unsigned char h[4096], back[4096];
    fill(h, sizeof h, 7); memset(back, 0, sizeof back);
    void *d = NULL;
    struct cudaMemcpyAttributes attr;
    memset(&attr, 0, sizeof attr);
    attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    cudaError_t e = cudaMalloc(&d, sizeof h);
    if (!e) e = cudaMemcpyWithAttributesAsync(d, h, sizeof h, &attr, s);
    if (!e) e = cudaMemcpyWithAttributesAsync(back, d, sizeof back, &attr, s);
    if (!e) e = cudaStreamSynchronize(s);
    check("memory", e == 0 && memcmp(h, back, sizeof h) == 0, "with attributes: status %d", e);
    cudaFree(d);
  }
"#,
    ),
];

/// The runtime's name for a driver attribute (`cudaDevAttrClockRate` has the same value as
/// `CU_DEVICE_ATTRIBUTE_CLOCK_RATE`): the number works with either enum.
fn cuda_dev_attr(driver: &str) -> String {
    let value = match driver {
        "CU_DEVICE_ATTRIBUTE_CLOCK_RATE" => 13,
        "CU_DEVICE_ATTRIBUTE_GPU_OVERLAP" => 15,
        "CU_DEVICE_ATTRIBUTE_KERNEL_EXEC_TIMEOUT" => 17,
        "CU_DEVICE_ATTRIBUTE_COMPUTE_MODE" => 20,
        "CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE" => 36,
        "CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE1D_LINEAR_WIDTH" => 69,
        "CU_DEVICE_ATTRIBUTE_SINGLE_TO_DOUBLE_PRECISION_PERF_RATIO" => 87,
        _ => 96,
    };
    format!("(enum cudaDeviceAttr){value}")
}

const TEMPLATE: &str = r#"/* Chidori version-translation matrix, CUDA @CUDA@ headers (generated by cargo xtask matrix). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cuda_runtime_api.h>

static void check(const char *group, int ok, const char *fmt, ...);
#include <stdarg.h>
static void check(const char *group, int ok, const char *fmt, ...) {
  if (ok) { printf("OK %s\n", group); return; }
  va_list ap; va_start(ap, fmt);
  printf("FAIL %s ", group); vprintf(fmt, ap); printf("\n");
  va_end(ap);
}
static void hex(const void *p, size_t n) {
  printf(" ");
  for (size_t i = 0; i < n; i++) printf("%02x", ((const unsigned char *)p)[i]);
  printf("\n");
}
static int order[8]; static int order_n = 0;
static void CUDART_CB host_fn(void *arg) { order[order_n++] = (int)(size_t)arg; }
static void CUDART_CB stream_cb(cudaStream_t s, cudaError_t status, void *arg) { (void)s; order[order_n++] = status == cudaSuccess ? (int)(size_t)arg : -1; }

static void fill(unsigned char *b, size_t n, unsigned seed) { for (size_t i = 0; i < n; i++) b[i] = (unsigned char)(i * 31 + seed); }

static void round_trip(size_t n, int pinned, int async, cudaStream_t s) {
  unsigned char *h, *back;
  if (pinned) { cudaMallocHost((void **)&h, n); cudaMallocHost((void **)&back, n); }
  else { h = malloc(n); back = malloc(n); }
  fill(h, n, (unsigned)n); memset(back, 0, n);
  void *d = NULL;
  cudaError_t e = cudaMalloc(&d, n);
  if (e) { check("memory", 0, "cudaMalloc(%zu) -> %d", n, e); return; }
  if (async) {
    e = cudaMemcpyAsync(d, h, n, cudaMemcpyHostToDevice, s);
    if (!e) e = cudaMemcpyAsync(back, d, n, cudaMemcpyDeviceToHost, s);
    if (!e) e = cudaStreamSynchronize(s);
  } else {
    e = cudaMemcpy(d, h, n, cudaMemcpyHostToDevice);
    if (!e) e = cudaMemcpy(back, d, n, cudaMemcpyDefault);
  }
  check("memory", e == 0 && memcmp(h, back, n) == 0, "%zu bytes pinned=%d async=%d: status %d, data %s", n, pinned, async, e,
        memcmp(h, back, n) ? "differs" : "same");
  cudaFree(d);
  if (pinned) { cudaFreeHost(h); cudaFreeHost(back); } else { free(h); free(back); }
}

int main(void) {
  int count = 0;
  check("props", cudaGetDeviceCount(&count) == 0 && count >= 1, "device count %d", count);
  struct { unsigned char before[64]; struct cudaDeviceProp p; unsigned char after[64]; } g;
  memset(&g, 0xA5, sizeof g);
  check("props", cudaGetDeviceProperties(&g.p, 0) == 0, "cudaGetDeviceProperties failed");
  int intact = 1; for (int i = 0; i < 64; i++) intact &= g.before[i] == 0xA5 && g.after[i] == 0xA5;
  check("props", intact, "cudaGetDeviceProperties wrote outside the caller's struct");
  struct cudaDeviceProp p = g.p;
@PROPS@
  for (int a = 1; a < 256; a++) { int v; if (cudaDeviceGetAttribute(&v, (enum cudaDeviceAttr)a, 0) == 0) printf("ATTR %d %d\n", a, v); }
  cudaGetLastError();
@DERIVED@
  cudaStream_t s; check("streams", cudaStreamCreate(&s) == 0, "cudaStreamCreate");
  size_t sizes[] = {1, 4096, 1 << 20, 64 << 20};
  for (int i = 0; i < 4; i++) for (int pinned = 0; pinned < 2; pinned++) for (int async = 0; async < 2; async++) round_trip(sizes[i], pinned, async, s);
  round_trip(256u << 20, 0, 0, s);
  round_trip(256u << 20, 1, 1, s);

  { /* memset and device-to-device */
    size_t n = 3 << 20; unsigned char *h = malloc(n), *d1, *d2;
    cudaMalloc((void **)&d1, n); cudaMalloc((void **)&d2, n);
    cudaError_t e = cudaMemset(d1, 0x5a, n);
    if (!e) e = cudaMemsetAsync(d1 + 1000, 0x11, 24, s);
    if (!e) e = cudaMemcpy(d2, d1, n, cudaMemcpyDeviceToDevice);
    if (!e) e = cudaStreamSynchronize(s);
    if (!e) e = cudaMemcpy(h, d2, n, cudaMemcpyDeviceToHost);
    int ok = e == 0;
    for (size_t i = 0; ok && i < n; i++) ok = h[i] == ((i >= 1000 && i < 1024) ? 0x11 : 0x5a);
    check("memset_d2d", ok, "status %d", e);
    cudaFree(d1); cudaFree(d2); free(h);
  }
  { /* streams and events */
    cudaStream_t s2; cudaEvent_t a, b;
    cudaError_t e = cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking);
    if (!e) e = cudaEventCreate(&a);
    if (!e) e = cudaEventCreate(&b);
    if (!e) e = cudaEventRecord(a, s);
    if (!e) e = cudaStreamWaitEvent(s2, a, 0);
    if (!e) e = cudaEventRecord(b, s2);
    if (!e) e = cudaEventSynchronize(b);
    float ms = -1;
    if (!e) e = cudaEventElapsedTime(&ms, a, b);
    check("streams", e == 0 && ms >= 0, "status %d elapsed %f", e, ms);
    check("streams", cudaEventQuery(b) == 0 && cudaStreamQuery(s2) == 0, "queries");
    check("streams", cudaEventDestroy(a) == 0 && cudaEventDestroy(b) == 0 && cudaStreamDestroy(s2) == 0, "destroy");
  }
  { /* host callbacks run on this process, in stream order */
    order_n = 0;
    cudaError_t e = cudaLaunchHostFunc(s, host_fn, (void *)1);
    if (!e) e = cudaStreamAddCallback(s, stream_cb, (void *)2, 0);
    if (!e) e = cudaLaunchHostFunc(s, host_fn, (void *)3);
    if (!e) e = cudaStreamSynchronize(s);
    check("callbacks", e == 0 && order_n == 3 && order[0] == 1 && order[1] == 2 && order[2] == 3, "status %d, ran %d", e, order_n);
  }
@NEWER@  { /* pointer attributes, in this version's layout */
    struct { unsigned char before[64]; struct cudaPointerAttributes a; unsigned char after[64]; } pa;
    void *d; void *pinned; int local;
    cudaMalloc(&d, 64); cudaMallocHost(&pinned, 64);
    memset(&pa, 0xA5, sizeof pa);
    cudaError_t e = cudaPointerGetAttributes(&pa.a, d);
    check("pointers", e == 0 && pa.a.type == cudaMemoryTypeDevice && pa.a.devicePointer == d, "device: %d type %d", e, (int)pa.a.type);
    e = cudaPointerGetAttributes(&pa.a, pinned);
    check("pointers", e == 0 && pa.a.type == cudaMemoryTypeHost, "pinned: %d type %d", e, (int)pa.a.type);
    e = cudaPointerGetAttributes(&pa.a, &local);
    check("pointers", e == 0 && pa.a.type == cudaMemoryTypeUnregistered, "unregistered: %d type %d", e, (int)pa.a.type);
    intact = 1; for (int i = 0; i < 64; i++) intact &= pa.before[i] == 0xA5 && pa.after[i] == 0xA5;
    check("pointers", intact, "cudaPointerGetAttributes wrote outside the caller's struct");
    struct { unsigned char before[64]; struct cudaFuncAttributes f; unsigned char after[64]; } fa;
    memset(&fa, 0xA5, sizeof fa);
    e = cudaFuncGetAttributes(&fa.f, (const void *)main);
    intact = 1; for (int i = 0; i < 64; i++) intact &= fa.before[i] == 0xA5 && fa.after[i] == 0xA5;
    check("pointers", e == cudaErrorInvalidDeviceFunction && intact, "cudaFuncGetAttributes(host function) -> %d", e);
    cudaFree(d); cudaFreeHost(pinned);
    cudaGetLastError();
  }
  { /* graphs: an edge added, the graph instantiated, launched and updated (11.8, 12.x and
       13.x declare these calls with other parameters; the server's library is one). An edge
       between two empty nodes is not removed here: the H200's 13.0 runtime refused that
       removal (cudaErrorInvalidValue) where the CUDA suite's graph_build removes an edge
       from a memset node natively and remotely alike. */
    cudaGraph_t g; cudaGraphNode_t a, b; cudaGraphExec_t x; size_t n = 99;
    cudaError_t e = cudaGraphCreate(&g, 0);
    if (!e) e = cudaGraphAddEmptyNode(&a, g, NULL, 0);
    if (!e) e = cudaGraphAddEmptyNode(&b, g, NULL, 0);
#if CUDART_VERSION >= 13000
    if (!e) e = cudaGraphAddDependencies(g, &a, &b, NULL, 1);
    if (!e) e = cudaGraphGetEdges(g, NULL, NULL, NULL, &n);
#else
    if (!e) e = cudaGraphAddDependencies(g, &a, &b, 1);
    if (!e) e = cudaGraphGetEdges(g, NULL, NULL, &n);
#endif
    check("graphs", e == 0 && n == 1, "add an edge: status %d, %zu edges", e, n);
#if CUDART_VERSION >= 12000
    if (!e) e = cudaGraphInstantiate(&x, g, 0);
#else
    if (!e) e = cudaGraphInstantiate(&x, g, NULL, NULL, 0);
#endif
    if (!e) e = cudaGraphLaunch(x, s);
    if (!e) e = cudaStreamSynchronize(s);
    check("graphs", e == 0, "instantiate and launch: status %d", e);
    int updated = -1;
#if CUDART_VERSION >= 12000
    cudaGraphExecUpdateResultInfo info;
    if (!e) e = cudaGraphExecUpdate(x, g, &info);
    if (!e) updated = (int)info.result;
#else
    cudaGraphNode_t failed; enum cudaGraphExecUpdateResult result;
    if (!e) e = cudaGraphExecUpdate(x, g, &failed, &result);
    if (!e) updated = (int)result;
#endif
    check("graphs", e == 0 && updated == (int)cudaGraphExecUpdateSuccess, "update: status %d, result %d", e, updated);
    check("graphs", cudaGraphExecDestroy(x) == 0 && cudaGraphDestroy(g) == 0, "destroy");
    cudaGetLastError();
  }
  { /* error paths */
    void *d; cudaMalloc(&d, 16);
    check("errors", cudaFree(d) == 0, "free");
    check("errors", cudaFree(d) == cudaErrorInvalidValue, "double free");
    check("errors", cudaGetLastError() == cudaErrorInvalidValue && cudaGetLastError() == cudaSuccess, "last error is sticky until read");
    check("errors", cudaFree((void *)0x1000) == cudaErrorInvalidValue, "bad pointer");
    check("errors", cudaStreamSynchronize((cudaStream_t)0x1234) == cudaErrorInvalidResourceHandle, "bad stream handle");
    check("errors", cudaMemcpy(&d, &d, 8, (enum cudaMemcpyKind)99) == cudaErrorInvalidMemcpyDirection, "bad copy kind");
    check("errors", cudaSetDevice(99) == cudaErrorInvalidDevice, "bad device");
    cudaGetLastError();
    check("errors", cudaDeviceSynchronize() == 0, "session still healthy");
  }
  check("streams", cudaStreamDestroy(s) == 0, "destroy");
  printf("DONE\n");
  return 0;
}
"#;

/// Compile the matrix program of every version into `out`.
pub fn build(root: &Path, versions: &[String], out: &Path, lib_dir: &Path) -> Result<()> {
    std::fs::create_dir_all(out)?;
    let stub = root.join("headers/stub");
    for v in versions {
        let lock = crate::lock::Lock::load(root)?;
        let entry = lock.version(v)?;
        if !crate::headers::is_complete(root, entry, crate::headers::Selection::RuntimeOnly) {
            crate::headers::fetch(root, std::slice::from_ref(v), crate::headers::Selection::RuntimeOnly, false)?;
        }
        let include = crate::headers::include_dir(root, v);
        let src = out.join(format!("matrix-{v}.c"));
        std::fs::write(&src, source(root, v)?)?;
        let exe = out.join(format!("matrix-{v}"));
        let soname = soname_of(root, v)?;
        let status = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
            .arg(&src)
            .arg("-o")
            .arg(&exe)
            .arg(format!("-I{}", include.display()))
            .arg(format!("-I{}", stub.display()))
            .arg(format!("-L{}", lib_dir.display()))
            .arg(format!("-l:{soname}"))
            .arg("-w")
            .status()
            .context("running the C compiler")?;
        if !status.success() {
            bail!("compiling the matrix program for CUDA {v} failed");
        }
    }
    Ok(())
}

/// Expected `PROP` lines of one version from a recorded profile (gpu/record_profile.py).
fn expected_props(root: &Path, cuda: &str, profile: &serde_json::Value) -> Result<BTreeMap<String, String>> {
    let text = std::fs::read_to_string(ir::ir_path(root, cuda, "cudart"))?;
    let ir = ir::LibraryIr::from_jsonl(&text, Path::new("cudart"))?;
    let prop = ir.records.get("cudaDeviceProp").context("no cudaDeviceProp")?;
    let dev = &profile["devices"][0];
    let recorded = &dev["cudaDeviceProp_13_0"];
    let attrs = &dev["attributes"];
    let mut out = BTreeMap::new();
    for f in &prop.fields {
        if f.name.starts_with("reserved") || f.offset == u64::MAX {
            continue;
        }
        let ty = Ty::parse(&f.ty)?;
        let value = if f.name == "uuid" {
            Some(dev["uuid"].as_str().unwrap_or_default().to_owned())
        } else if let Some(v) = recorded.get(&f.name) {
            Some(match (&ty, v) {
                (Ty::Array { len, .. }, serde_json::Value::String(s)) => {
                    let mut bytes = s.as_bytes().to_vec();
                    bytes.resize(*len as usize, 0);
                    bytes.iter().map(|b| format!("{b:02x}")).collect()
                }
                (_, serde_json::Value::Array(items)) => {
                    items.iter().map(|i| i.as_i64().unwrap_or(0).to_string()).collect::<Vec<_>>().join(" ")
                }
                (_, v) => v.as_i64().map(|i| i.to_string()).unwrap_or_default(),
            })
        } else {
            DERIVED
                .iter()
                .find(|(n, _)| *n == f.name)
                .and_then(|(_, a)| attrs[*a]["result"].as_i64())
                .map(|i| i.to_string())
        };
        if let Some(v) = value {
            out.insert(f.name.clone(), v);
        }
    }
    Ok(out)
}

#[derive(Debug, Default)]
pub struct Row {
    pub cuda: String,
    /// Per group: (passed, failed).
    pub groups: BTreeMap<String, (usize, usize)>,
    pub failures: Vec<String>,
    pub seconds: f64,
}

impl Row {
    pub fn ok(&self) -> bool {
        self.failures.is_empty() && GROUPS.iter().all(|g| self.groups.get(*g).is_some_and(|(p, f)| *p > 0 && *f == 0))
    }
}

/// Run the built programs through `chidori run` against `server` and compare with `profile`.
/// `lib_dir`: the shims, when not in `../lib` next to the chidori binary.
pub fn run(
    root: &Path,
    built: &Path,
    versions: &[String],
    chidori: &Path,
    lib_dir: Option<&Path>,
    server: &str,
    profile: &Path,
) -> Result<Vec<Row>> {
    let profile: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(profile)?)?;
    let attrs: BTreeMap<i64, i64> = profile["devices"][0]["attributes"]
        .as_object()
        .map(|o| o.values().filter_map(|a| Some((a["value"].as_i64()?, a["result"].as_i64()?))).collect())
        .unwrap_or_default();
    let mut rows = Vec::new();
    for v in versions {
        let start = std::time::Instant::now();
        let mut cmd = Command::new(chidori);
        cmd.args(["run", "-s", server]);
        if let Some(dir) = lib_dir {
            cmd.arg("--lib-dir").arg(dir);
        }
        let out = cmd.arg("--").arg(built.join(format!("matrix-{v}"))).output().context("running chidori run")?;
        let mut row = Row { cuda: v.clone(), seconds: start.elapsed().as_secs_f64(), ..Row::default() };
        let stdout = String::from_utf8_lossy(&out.stdout);
        let expected = expected_props(root, v, &profile)?;
        let mut done = false;
        for line in stdout.lines() {
            let parts: Vec<&str> = line.splitn(3, ' ').collect();
            match parts.as_slice() {
                ["OK", group] => row.groups.entry((*group).to_owned()).or_default().0 += 1,
                ["FAIL", group, detail] => {
                    row.groups.entry((*group).to_owned()).or_default().1 += 1;
                    row.failures.push(format!("{group}: {}", detail.trim()));
                }
                ["PROP", name, value] => {
                    let entry = row.groups.entry("props".into()).or_default();
                    match expected.get(*name) {
                        Some(want) if want == value.trim() => entry.0 += 1,
                        Some(want) => {
                            entry.1 += 1;
                            row.failures.push(format!("props: {name} = {} expected {want}", value.trim()));
                        }
                        None => {
                            entry.1 += 1;
                            row.failures.push(format!("props: {name} has no expected value"));
                        }
                    }
                }
                ["ATTR", a, value] => {
                    let entry = row.groups.entry("attrs".into()).or_default();
                    let (a, value): (i64, i64) = (a.parse().unwrap_or(-1), value.trim().parse().unwrap_or(-1));
                    if attrs.get(&a) == Some(&value) {
                        entry.0 += 1;
                    } else {
                        entry.1 += 1;
                        row.failures.push(format!("attrs: attribute {a} = {value}, profile {:?}", attrs.get(&a)));
                    }
                }
                ["DONE"] => done = true,
                _ => {}
            }
        }
        if !done || !out.status.success() {
            row.failures.push(format!(
                "program did not finish ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).lines().last().unwrap_or("")
            ));
        }
        rows.push(row);
    }
    Ok(rows)
}

pub fn table(rows: &[Row]) -> String {
    let mut s = String::new();
    let _ = write!(s, "{:<6}", "CUDA");
    for g in GROUPS {
        let _ = write!(s, " {g:>11}");
    }
    let _ = writeln!(s, " {:>8}", "seconds");
    for r in rows {
        let _ = write!(s, "{:<6}", r.cuda);
        for g in GROUPS {
            let (p, f) = r.groups.get(*g).copied().unwrap_or((0, 0));
            let cell = if f == 0 && p > 0 { format!("ok {p}") } else { format!("FAIL {f}/{}", p + f) };
            let _ = write!(s, " {cell:>11}");
        }
        let _ = writeln!(s, " {:>8.1}", r.seconds);
    }
    for r in rows {
        for f in r.failures.iter().take(10) {
            let _ = writeln!(s, "  {}: {f}", r.cuda);
        }
    }
    s
}

/// An emulated `chidori serve` on a free port, stopped on drop.
pub struct EmulatedServer {
    child: Child,
    pub address: String,
}

impl EmulatedServer {
    pub fn start(chidori: &Path, profile: &Path) -> Result<EmulatedServer> {
        EmulatedServer::start_with(chidori, Some(profile))
    }

    /// As [`EmulatedServer::start`]; without a profile, the one `chidori serve` finds in its
    /// installation.
    pub fn start_with(chidori: &Path, profile: Option<&Path>) -> Result<EmulatedServer> {
        EmulatedServer::start_args(chidori, profile, &[])
    }

    /// As [`EmulatedServer::start_with`], with more arguments of `chidori serve`.
    pub fn start_args(chidori: &Path, profile: Option<&Path>, extra: &[&str]) -> Result<EmulatedServer> {
        EmulatedServer::start_env(chidori, profile, extra, &[])
    }

    /// As [`EmulatedServer::start_args`], with variables in the server's environment.
    pub fn start_env(
        chidori: &Path,
        profile: Option<&Path>,
        extra: &[&str],
        envs: &[(&str, &str)],
    ) -> Result<EmulatedServer> {
        let mut cmd = Command::new(chidori);
        cmd.envs(envs.iter().copied());
        cmd.args(["serve", "--backend", "emulated", "--bind", "127.0.0.1", "--port", "0"]);
        if let Some(profile) = profile {
            cmd.arg("--profile").arg(profile);
        }
        cmd.args(extra);
        let mut child = cmd
            .env("CHIDORI_LOG", "warn")
            .env_remove("CHIDORI_PROFILE")
            .stderr(Stdio::piped())
            .spawn()
            .context("starting chidori serve")?;
        let stderr = child.stderr.take().context("no stderr")?;
        let mut lines = BufReader::new(stderr).lines();
        let address = loop {
            let Some(line) = lines.next() else { bail!("chidori serve exited before listening") };
            let line = line?;
            if let Some(rest) = line.strip_prefix("chidori serve: listening on ") {
                let addr = rest.split(';').next().unwrap_or_default().trim().replace("0.0.0.0", "127.0.0.1");
                break addr;
            }
        };
        // Keep draining the server's log so it never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines.by_ref() {});
        Ok(EmulatedServer { child, address })
    }
}

impl EmulatedServer {
    /// Process id of the supervisor.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Stop the supervisor now (its session workers keep running until their clients go).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for EmulatedServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Every CUDA version with committed IR.
pub fn versions(root: &Path) -> Result<Vec<String>> {
    Ok(ir::load_all(root)?.keys().cloned().collect())
}

/// The default paths of a dist build.
pub fn dist_paths(root: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let dist = root.join("target/dist");
    (dist.join("bin/chidori"), dist.join("lib"), dist.join("share/chidori/profiles/nvidia-h200.json"))
}
