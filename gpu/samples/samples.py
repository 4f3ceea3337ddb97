#!/usr/bin/env python3
"""NVIDIA's CUDA samples, built as they ship and run natively and through Chidori.

Programs nobody wrote for Chidori: each sample is built from NVIDIA/cuda-samples exactly as its
CMakeLists.txt says (its sources, its libraries, separable compilation, its fatbin or PTX
kernel file), without CMake, which the GPU machine lacks. Three steps:

    python3 samples.py pack --repo GIT_DIR [--commit REV] --out target/cuda-samples.txz
        (here, where the repository is: the sources, the shared headers and the data files of
        every sample that can run on a headless Linux machine with one GPU)
    python3 samples.py build --src DIR --out BUILD [--jobs N] [--only A,B] [--cudart static]
        (on the GPU machine, with nvcc; a line per sample, logs in BUILD/NAME/build.log)
    python3 samples.py run --build BUILD --chidori BIN --server HOST:PORT [--json OUT]
        [--parallel N] [--timeout S] [--only A,B]

A sample matches when its remote run exits as the native one did and prints the same stdout
with every number masked (samples print timings and bandwidths; a few whose output varies
natively are compared by exit status, `EXIT_STATUS_ONLY`); `same-text` is the stricter
count where the stdout is byte for byte the native one. A sample whose native run fails or
times out is not counted. The table comes last; the exit code is 0 only if every counted
sample matches.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

# What a sample needs that this kind of machine does not have: a display, another graphics
# API, MPI, NvSci, FreeImage. Such a sample is not packed.
UNAVAILABLE_PACKAGES = {"OpenGL", "GLUT", "EGL", "Vulkan", "MPI", "NVSCI", "FreeImage"}
UNAVAILABLE_LIBRARIES = {"d3d11", "d3d12", "glfw"}
# The categories of samples that run on Linux x86_64 (7 is libNVVM's own build, 8 is Tegra
# and Windows).
CATEGORIES = ("0_", "1_", "2_", "3_", "4_", "5_", "6_")
CODE_SUFFIXES = {".cu", ".cuh", ".cpp", ".c", ".h", ".hpp", ".hxx", ".inc", ".txt", ".ptx"}
# A data file larger than this stays out of the pack (the device carries 64 MiB in all).
MAX_DATA_BYTES = 4 << 20

# CMake's imported targets, as linker arguments.
LIBRARY_FLAGS = {
    "CUDA::cuda_driver": ["-lcuda"],
    "CUDA::cudart": [],
    # CMake's cuSOLVER target brings the libraries cuSOLVER itself calls.
    "CUDA::cusolver": ["-lcusolver", "-lcusparse", "-lcublas", "-lcublasLt"],
    "CUDA::nvrtc": ["-lnvrtc"],
    "${NVJITLINK_LIB}": ["-lnvJitLink"],
    "CUDA::cufft_static": ["-lcufft_static"],
    "culibos": ["-lculibos"],
    "OpenMP::OpenMP_CXX": ["-Xcompiler", "-fopenmp"],
    "dl": ["-ldl"],
    "rt": ["-lrt"],
    "pthread": ["-lpthread"],
    "socket": [],
}


@dataclass
class Sample:
    """One sample as its CMakeLists.txt describes it."""

    name: str
    directory: Path
    sources: list[str]
    link: list[str]
    kernel_files: list[tuple[str, str, str]] = field(default_factory=list)  # (kind, source, output)


def cmake_text(path: Path) -> str:
    """The CMakeLists.txt without comments, on one line."""
    lines = [line.split("#", 1)[0] for line in path.read_text(errors="replace").splitlines()]
    return " ".join(lines)


def parse_sample(directory: Path) -> Sample | None:
    """The sample in directory, or None where it needs what this machine lacks."""
    cmake = directory / "CMakeLists.txt"
    if not cmake.is_file():
        return None
    text = cmake_text(cmake)
    packages = set(re.findall(r"find_package\(\s*([A-Za-z0-9_]+)", text))
    if packages & UNAVAILABLE_PACKAGES:
        return None
    name = directory.name
    executables = re.findall(r"add_executable\(\s*([A-Za-z0-9_]+)\s+([^)]*)\)", text)
    sources: list[str] = []
    for target, arguments in executables:
        if target == name:
            sources = [a for a in arguments.split() if not a.startswith("$") and a != "WIN32"]
    if not sources:
        return None
    link: list[str] = []
    for arguments in re.findall(r"target_link_libraries\(\s*[A-Za-z0-9_]+\s+([^)]*)\)", text):
        for item in arguments.split():
            if item in ("PRIVATE", "PUBLIC", "INTERFACE"):
                continue
            if item in UNAVAILABLE_LIBRARIES:
                return None
            if item in LIBRARY_FLAGS:
                link += LIBRARY_FLAGS[item]
            elif item.startswith("CUDA::"):
                link.append("-l" + item.removeprefix("CUDA::"))
            else:
                return None
    kernel_files = []
    for kind, variable in (("fatbin", "CUDA_FATBIN_FILE"), ("ptx", "CUDA_PTX_FILE")):
        output = re.search(r"set\(\s*" + variable + r'\s+"\$\{CMAKE_CURRENT_BINARY_DIR\}/([^"]+)"', text)
        source = re.search(r'set\(\s*CUDA_KERNEL_SOURCE\s+"\$\{CMAKE_CURRENT_SOURCE_DIR\}/([^"]+)"', text)
        if output and source:
            kernel_files.append((kind, source.group(1), output.group(1)))
    return Sample(name, directory, sources, sorted(set(link), key=link.index), kernel_files)


def samples_in(root: Path) -> list[Sample]:
    """Every sample under root/Samples that can run here, in the repository's order."""
    found = []
    for category in sorted((root / "Samples").iterdir()):
        if not category.is_dir() or not category.name.startswith(CATEGORIES):
            continue
        for directory in sorted(category.iterdir()):
            sample = parse_sample(directory) if directory.is_dir() else None
            if sample:
                found.append(sample)
    return found


def git(repo: Path, *arguments: str) -> bytes:
    return subprocess.run(["git", "-C", str(repo), *arguments], check=True,
                          capture_output=True).stdout


def pack(repo: Path, commit: str, out: Path) -> None:
    """Writes the runnable samples of repo at commit, with their data, to out (tar.xz)."""
    revision = git(repo, "rev-parse", commit).decode().strip()
    listing = git(repo, "ls-tree", "-r", "-l", revision, "Samples", "Common").decode()
    entries = []
    for line in listing.splitlines():
        meta, path = line.split("\t", 1)
        _mode, kind, blob, size = meta.split()
        if kind == "blob":
            entries.append((path, blob, int(size) if size.isdigit() else 0))
    # First the CMake files, to learn which samples run here.
    scratch = out.with_suffix(".scan")
    shutil.rmtree(scratch, ignore_errors=True)
    for path, blob, _size in entries:
        if path.endswith("CMakeLists.txt"):
            target = scratch / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(git(repo, "cat-file", "blob", blob))
    runnable = {str(s.directory.relative_to(scratch)) + "/" for s in samples_in(scratch)}
    shutil.rmtree(scratch)
    out.parent.mkdir(parents=True, exist_ok=True)
    packed, skipped = 0, []
    with tarfile.open(out, "w:xz") as archive:
        def add(path: str, data: bytes) -> None:
            info = tarfile.TarInfo(path)
            info.size = len(data)
            info.mtime = 0
            archive.addfile(info, io.BytesIO(data))

        for path, blob, size in entries:
            in_sample = any(path.startswith(d) for d in runnable)
            if not (path.startswith("Common/") or in_sample):
                continue
            is_data = "/data/" in path
            if not is_data and Path(path).suffix not in CODE_SUFFIXES:
                continue
            if is_data and size > MAX_DATA_BYTES:
                skipped.append(path)
                continue
            try:
                data = git(repo, "cat-file", "blob", blob)
            except subprocess.CalledProcessError:
                skipped.append(path)  # A snapshot may hold a large file as absent.
                continue
            add(path, data)
            packed += 1
        add("SOURCE", f"NVIDIA/cuda-samples {revision}\n".encode())
    print(f"packed {packed} files of {len(runnable)} samples at {revision[:12]} into {out} "
          f"({out.stat().st_size >> 10} KiB); left out: {len(skipped)} data files")
    for path in skipped:
        print(f"  left out {path}")


def wheel_directories(subdir: str) -> list[Path]:
    """The NVIDIA wheels' SUBDIR (lib or include) beside the machine's torch."""
    import site

    found = []
    for root in site.getsitepackages():
        for wheel in ("cu13", "cudnn"):
            candidate = Path(root) / "nvidia" / wheel / subdir
            if candidate.is_dir():
                found.append(candidate)
    return found


# The header each library's samples include, to find it where the toolkit lacks it.
LIBRARY_HEADERS = {"cublas": "cublas_v2.h", "cusparse": "cusparse.h", "cusolver": "cusolverDn.h",
                   "curand": "curand.h", "cufft": "cufft.h", "nvjpeg": "nvjpeg.h",
                   "nvJitLink": "nvJitLink.h", "nvrtc": "nvrtc.h", "nppc": "npp.h"}


def library_flags(flag: str, cuda_home: Path) -> tuple[list[str], list[str]]:
    """A -lNAME as (compile flags, link flags): the toolkit's, else a wheel's library and header."""
    if not flag.startswith("-l") or flag in ("-lcuda", "-ldl", "-lrt", "-lpthread"):
        return [], [flag]
    name = flag[2:]
    compile_flags: list[str] = []
    header = LIBRARY_HEADERS.get(name)
    if header and not (cuda_home / "include" / header).is_file():
        for include in wheel_directories("include"):
            if (include / header).is_file():
                compile_flags = ["-I", str(include)]
                break
    for directory in [cuda_home / "lib64", *wheel_directories("lib")]:
        shared = sorted(directory.glob(f"lib{name}.so*")) + sorted(directory.glob(f"lib{name}.a"))
        if shared:
            return compile_flags, [f"-L{directory}", "-Xlinker", "-rpath", "-Xlinker",
                                   str(directory), f"-l:{shared[0].name}"]
    return compile_flags, [flag]


def build_one(sample: Sample, src: Path, out: Path, nvcc: str, cudart: str) -> tuple[str, bool, float]:
    """Builds one sample into out/NAME (a copy of its directory, where it runs: its data and
    kernel files beside it); returns (name, ok, seconds)."""
    start = time.monotonic()
    work = out / sample.name
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(sample.directory, work)
    cuda_home = Path(nvcc).resolve().parent.parent
    flags = ["-arch=sm_90", "-O2", "-std=c++17", "--extended-lambda", "-Wno-deprecated-gpu-targets",
             "-Xcompiler", "-Wno-deprecated-declarations", "-I", str(src / "Common"),
             "-I", str(sample.directory)]
    for sub in ("inc", "include", "src"):
        if (sample.directory / sub).is_dir():
            flags += ["-I", str(sample.directory / sub)]
    link: list[str] = []
    for flag in sample.link:
        more_flags, more_link = library_flags(flag, cuda_home)
        flags += more_flags
        link += more_link
    commands = []
    for kind, source, output in sample.kernel_files:
        commands.append([nvcc, *flags, f"-{kind}", "-o", str(work / output),
                         str(sample.directory / source)])
    sources = [str((sample.directory / s).resolve()) for s in sample.sources]
    commands.append([nvcc, *flags, "-rdc=true", "-cudart", cudart, "-o", str(work / sample.name),
                     *sources, "-lcudadevrt", *link,
                     "-Xlinker", "-rpath", "-Xlinker", str(cuda_home / "lib64")])
    ok = True
    with open(work / "build.log", "w") as log:
        for command in commands:
            log.write(" ".join(command) + "\n")
            log.flush()
            done = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, cwd=work)
            if done.returncode != 0:
                ok = False
                break
    return sample.name, ok, time.monotonic() - start


def build(src: Path, out: Path, jobs: int, only: set[str], nvcc: str, cudart: str) -> int:
    samples = [s for s in samples_in(src) if not only or s.name in only]
    out.mkdir(parents=True, exist_ok=True)
    listing = out / "BUILT"
    listing.write_text("")
    built = 0
    # BUILT grows as samples finish: a build cut short by a time limit still runs what it made.
    with ThreadPoolExecutor(jobs) as pool:
        futures = [pool.submit(build_one, s, src, out, nvcc, cudart) for s in samples]
        for future in as_completed(futures):
            name, ok, seconds = future.result()
            print(f"{'built ' if ok else 'FAILED'} {name} ({seconds:.0f} s)"
                  + ("" if ok else f" {out / name / 'build.log'}"), flush=True)
            if ok:
                built += 1
                with open(listing, "a") as names:
                    names.write(name + "\n")
    print(f"built {built} of {len(samples)} samples")
    return 0 if built == len(samples) else 1


NUMBER = re.compile(r"0x[0-9a-fA-F]+|[-+]?\d+(?:\.\d*)?(?:[eE][-+]?\d+)?")
SPACES = re.compile(r"[ \t]+")

# Samples whose stdout differs from run to run natively: only their exit status is compared.
EXIT_STATUS_ONLY = {
    "UnifiedMemoryStreams": "task sizes drawn from a generator seeded by the time; OpenMP threads print in any order",
    "memMapIPCDrv": "several processes print to one stdout in any order",
    # Measured on the H100 (bench/2026-12-07-session46.md): natively twice, the second run
    # prints no "ptxas info" lines; with CUDA_CACHE_DISABLE=1 both print 5.
    "ptxjit": "the linker's log says what the driver's JIT cache (~/.nv/ComputeCache) spared it, "
              "and the native run fills the cache the server then finds",
}


def masked(text: str) -> str:
    """stdout with every number replaced by '#' and runs of blanks by one: what a sample
    prints besides its timings (and the widths they take)."""
    return SPACES.sub(" ", NUMBER.sub("#", text))


def run_once(command: list[str], cwd: Path, timeout: float) -> dict:
    start = time.monotonic()
    try:
        done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, errors="replace",
                              timeout=timeout, stdin=subprocess.DEVNULL)
        rc, stdout, stderr = done.returncode, done.stdout, done.stderr
    except subprocess.TimeoutExpired as exc:
        def text(x: object) -> str:
            return x.decode(errors="replace") if isinstance(x, bytes) else (x or "")  # type: ignore[return-value]
        rc, stdout, stderr = None, text(exc.stdout), text(exc.stderr)
    return {"rc": rc, "seconds": round(time.monotonic() - start, 2), "stdout": stdout,
            "stderr": stderr}


def first_difference(native: str, remote: str) -> str:
    a, b = masked(native).splitlines(), masked(remote).splitlines()
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return f"line {i + 1}: native {x[:70]!r} remote {y[:70]!r}"
    return f"native {len(a)} lines, remote {len(b)}"


def verdict(name: str, native: dict, remote: dict) -> str:
    if native["rc"] is None or native["rc"] not in (0, 2):
        return "native-fails"
    if remote["rc"] != native["rc"]:
        return "DIFFERS"
    if name not in EXIT_STATUS_ONLY and masked(remote["stdout"]) != masked(native["stdout"]):
        return "DIFFERS"
    return "waived" if native["rc"] == 2 else "match"


def tail(result: dict) -> str:
    if result["rc"] is None:
        return "TIMEOUT"
    lines = (result["stdout"] + result["stderr"]).strip().splitlines()
    return f"rc={result['rc']} " + (lines[-1][:60] if lines else "")


def run(build_dir: Path, chidori: str, servers: list[tuple[str, str]], timeout: float,
        parallel: int, only: set[str], json_out: Path | None) -> int:
    names = [n for n in (build_dir / "BUILT").read_text().split() if not only or n in only]

    def one(name: str) -> dict:
        work = build_dir / name
        row = {"name": name, "native": run_once([f"./{name}"], work, timeout)}
        for label, server in servers:
            row[label] = run_once([chidori, "run", "-s", server, "--", f"./{name}"], work, timeout)
        return row

    with ThreadPoolExecutor(parallel) as pool:
        rows = list(pool.map(one, names))
    counts: dict[str, dict[str, int]] = {label: {} for label, _ in servers}
    problems = []
    for row in rows:
        for label, _ in servers:
            v = verdict(row["name"], row["native"], row[label])
            row[f"{label}_verdict"] = v
            counts[label][v] = counts[label].get(v, 0) + 1
            if v == "match" and row[label]["stdout"] == row["native"]["stdout"]:
                counts[label]["same-text"] = counts[label].get("same-text", 0) + 1
            if v == "DIFFERS":
                detail = (first_difference(row["native"]["stdout"], row[label]["stdout"])
                          if row[label]["rc"] == row["native"]["rc"] else tail(row[label]))
                problems.append(f"{row['name']} ({label}): {detail}")
            if v == "native-fails" and label == servers[0][0]:
                problems.append(f"{row['name']} (native fails): {tail(row['native'])}")
    if json_out:
        json_out.write_text(json.dumps(rows, indent=1))
    print(f"{'sample':34} {'native s':>8} " + " ".join(f"{label:>22}" for label, _ in servers))
    for row in rows:
        cells = " ".join(f"{row[f'{label}_verdict'] + ' ' + str(row[label]['seconds']):>22}"
                         for label, _ in servers)
        print(f"{row['name']:34} {row['native']['seconds']:>8} {cells}")
    for problem in problems:
        print("  " + problem)
    failed = 0
    for label, _ in servers:
        summary = ", ".join(f"{k} {v}" for k, v in sorted(counts[label].items()))
        print(f"{label}: {len(rows)} samples: {summary}")
        failed += counts[label].get("DIFFERS", 0)
    return 0 if failed == 0 else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    p = commands.add_parser("pack")
    p.add_argument("--repo", required=True, type=Path, help="a git directory of NVIDIA/cuda-samples")
    p.add_argument("--commit", default="HEAD")
    p.add_argument("--out", required=True, type=Path)
    b = commands.add_parser("build")
    b.add_argument("--src", required=True, type=Path, help="the unpacked samples")
    b.add_argument("--out", required=True, type=Path)
    b.add_argument("--jobs", type=int, default=os.cpu_count() or 4)
    b.add_argument("--only", default="")
    b.add_argument("--nvcc", default=os.environ.get("NVCC", "/usr/local/cuda-13.0/bin/nvcc"))
    b.add_argument("--cudart", choices=("static", "shared"), default="static",
                   help="how the runtime is linked (static: as CMake builds the samples)")
    r = commands.add_parser("run")
    r.add_argument("--build", required=True, type=Path)
    r.add_argument("--chidori", required=True)
    r.add_argument("--server", required=True, help="HOST:PORT of chidori serve")
    r.add_argument("--wan-server", help="HOST:PORT of a relay with a round-trip delay")
    r.add_argument("--timeout", type=float, default=120)
    r.add_argument("--parallel", type=int, default=4)
    r.add_argument("--only", default="")
    r.add_argument("--json", type=Path)
    args = parser.parse_args()
    only = {n for n in getattr(args, "only", "").split(",") if n}
    if args.command == "pack":
        pack(args.repo, args.commit, args.out)
        return 0
    if args.command == "build":
        return build(args.src, args.out, args.jobs, only, args.nvcc, args.cudart)
    servers = [("loopback", args.server)] + ([("wan", args.wan_server)] if args.wan_server else [])
    return run(args.build, args.chidori, servers, args.timeout, args.parallel, only, args.json)


if __name__ == "__main__":
    sys.exit(main())
