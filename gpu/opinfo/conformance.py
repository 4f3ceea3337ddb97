#!/usr/bin/env python3
"""OpInfo conformance: PyTorch's operator database natively and through Chidori, compared.

    python3 conformance.py --chidori PATH --server HOST:PORT --work DIR
                           [--jobs N] [--ops a,b | --first N] [--dtypes ...]
                           [--native-twice] [--op-timeout S] [--total S] [--json OUT]

Runs `run_ops.py` over every op of `op_db` that supports CUDA (or the ones named), split
into --jobs shards per run, natively and through `chidori run -s SERVER` side by side.
A shard whose process dies, breaks its CUDA context or spends more than --op-timeout
seconds in one op goes on in a fresh process from the next op; the op is recorded as a
crash (or timeout) of that run. With --native-twice a second native run tells which ops
give different values natively from run to run (nondeterministic kernels; host memory an
op leaves unwritten, which that run fills with another byte).

A comparison is one result of one sample: an op's forward outputs, or the gradients of
its backward, for one dtype and sample input. Tensors are compared bit for bit
(`identical`), else with `torch.testing.assert_close`'s tolerances for the dtype, or the
op's own where its PyTorch tests declare looser ones (`within tolerance`); where a second
native run (--native-twice) gives other values too, a remote result within twice the
native runs' own spread is within tolerance as well (counted apart), else they `differ`;
except where PyTorch itself calls a kernel that made the native result nondeterministic
(`run_ops.py` asks it under deterministic mode): those are counted and listed apart, as
`nondeterministic kernel`. A float result that differs where the two native runs happened
to agree, of an op whose other samples of the same dtype and pass (forward, backward) do
vary natively, by no more than twice their largest variation in units in the last place,
is listed apart too (`like native variation`): an atomic accumulation in another order.
An error raised in both runs with the same type and message counts as identical. The table comes last; exit status 0 only when nothing
differs and no op crashed remotely that did not natively.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
RUN_OPS = os.path.join(HERE, "run_ops.py")


@dataclass
class OpEnd:
    """How an op ended in one run: ok, crash (process died or context broken), timeout."""

    state: str
    detail: str = ""


@dataclass
class Run:
    label: str
    prefix: list[str]
    out: str
    ends: dict[str, OpEnd] = field(default_factory=dict)
    restarts: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    # Environment the run's processes get beyond the harness's own.
    env: dict[str, str] = field(default_factory=dict)


def list_ops(dtypes: str) -> list[str]:
    proc = subprocess.run([sys.executable, RUN_OPS, "--list", "--dtypes", dtypes],
                          capture_output=True, text=True, check=True)
    seen: dict[str, None] = {}
    for line in proc.stdout.splitlines():
        if line.strip():
            seen.setdefault(line.strip(), None)
    return list(seen)


def run_shard(run: Run, ops: list[str], dtypes: str, op_timeout: float, deadline: float, shard: int) -> None:
    """Run ops in order in one process after another until all have ended."""
    pending = list(ops)
    log_path = os.path.join(run.out, f"shard-{shard}.log")
    while pending:
        if time.monotonic() > deadline:
            with run.lock:
                for name in pending:
                    run.ends[name] = OpEnd("not run", "the time budget (--total) was spent")
            return
        cmd = run.prefix + [sys.executable, RUN_OPS, "--out", run.out, "--ops", ",".join(pending), "--dtypes", dtypes]
        with open(log_path, "a") as log:
            log.write(f"\n== {' '.join(cmd[:len(run.prefix) + 2])} ({len(pending)} ops, first {pending[0]})\n")
            log.flush()
            # Sample inputs iterate over sets (meshgrid's {'xy', 'ij'}): a fixed hash seed
            # gives every run the same samples in the same order.
            env = dict(os.environ, PYTHONHASHSEED="0", **run.env)
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
            started = time.monotonic()
            timed_out = None
            while proc.poll() is None:
                time.sleep(0.5)
                current = next((n for n in pending if not os.path.exists(os.path.join(run.out, n + ".pt"))), None)
                if current is None:
                    continue
                marker = os.path.join(run.out, current + ".started")
                since = os.path.getmtime(marker) if os.path.exists(marker) else None
                now = time.time()
                over_op = since is not None and now - since > op_timeout
                over_total = time.monotonic() > deadline
                if over_op or over_total or (since is None and time.monotonic() - started > op_timeout * 2):
                    timed_out = current if (over_op or since is None) else None
                    proc.kill()
                    proc.wait()
                    break
            rc = proc.returncode
        done = [n for n in pending if os.path.exists(os.path.join(run.out, n + ".pt"))]
        with run.lock:
            for n in done:
                run.ends.setdefault(n, OpEnd("ok"))
        rest = [n for n in pending if n not in done]
        broke_after_op = rc == 3 and bool(done)
        if broke_after_op:
            # The last op written broke the context (run_ops.py exits 3 right after it).
            last = max(done, key=lambda n: os.path.getmtime(os.path.join(run.out, n + ".pt")))
            with run.lock:
                run.ends[last] = OpEnd("crash", "the CUDA context was broken after this op")
        if not rest:
            return
        if broke_after_op and timed_out is None and time.monotonic() <= deadline:
            # The next op never started: run it in the fresh process, not as a crash.
            with run.lock:
                run.restarts += 1
            pending = rest
            continue
        first = rest[0]
        with run.lock:
            run.restarts += 1
            if timed_out == first:
                run.ends[first] = OpEnd("timeout", f"more than {op_timeout:.0f} s in this op")
            elif time.monotonic() > deadline:
                for name in rest:
                    run.ends[name] = OpEnd("not run", "the time budget (--total) was spent")
                return
            else:
                tail = open(log_path, errors="replace").read().splitlines()[-6:]
                run.ends[first] = OpEnd("crash", f"process ended ({rc}) in this op: " + " | ".join(tail)[-400:])
        pending = rest[1:]


def run_all(runs: list[Run], ops: list[str], jobs: int, dtypes: str, op_timeout: float, total: float) -> None:
    deadline = time.monotonic() + total
    threads = []
    for run in runs:
        os.makedirs(run.out, exist_ok=True)
        for shard in range(jobs):
            part = ops[shard::jobs]
            if part:
                t = threading.Thread(target=run_shard, args=(run, part, dtypes, op_timeout, deadline, shard))
                t.start()
                threads.append(t)
    for t in threads:
        t.join()


@dataclass
class Tally:
    compared: int = 0
    identical: int = 0
    within: int = 0
    differ: int = 0
    missing: int = 0
    tensors: int = 0
    failures: list[str] = field(default_factory=list)
    tolerated: dict[str, int] = field(default_factory=dict)
    # Comparisons accepted because the native run itself varies there (a second native run
    # gave other values): within that variation, or integer leaves that are uninitialized
    # memory natively.
    by_native_variation: int = 0
    # Differing or missing comparisons per op: the one line a truncated log still shows.
    by_op: dict[str, int] = field(default_factory=dict)
    # Differing results made by kernels PyTorch calls nondeterministic (they warn under
    # torch.use_deterministic_algorithms), listed apart from `failures`.
    nondeterministic_kernel: list[str] = field(default_factory=list)
    # Differing results of an op whose other samples of the same dtype and pass vary between
    # native runs, by no more units in the last place than they vary: the two native runs
    # happened to agree on this sample. Listed apart from `failures`.
    like_native_variation: list[str] = field(default_factory=list)


def as_real(t: Any) -> Any:
    import torch

    return torch.view_as_real(t) if t.is_complex() else t


def leaf_verdict(a: Any, b: Any, tol: tuple[float, float], spread: Any = None) -> tuple[str, str]:
    """(identical | within | varies | differ, detail) for a native leaf `a` and a remote `b`.
    `tol` is the op's own (atol, rtol) for the dtype; `spread` the same leaf of a second
    native run, when there was one."""
    import torch

    if a[0] != b[0]:
        return "differ", f"native {a[0]} {str(a[1])[:80]!r}, remote {b[0]} {str(b[1])[:80]!r}"
    if a[0] != "tensor":
        return ("identical", "") if a[1] == b[1] else ("differ", f"native {a[1]!r:.80}, remote {b[1]!r:.80}")
    x, y = a[1], b[1]
    if x.dtype != y.dtype or x.shape != y.shape:
        return "differ", f"native {tuple(x.shape)} {x.dtype}, remote {tuple(y.shape)} {y.dtype}"
    if x.numel() == 0:
        return "identical", ""
    if x.dtype == torch.bool or not (x.is_floating_point() or x.is_complex()):
        if torch.equal(x, y):
            return "identical", ""
        if spread is not None and spread[0] == "tensor" and not torch.equal(x, spread[1]):
            return "varies", "integers that differ between native runs (uninitialized memory)"
        n = int((x != y).sum())
        return "differ", f"{tuple(x.shape)} {x.dtype}: {n} of {x.numel()} elements differ"
    xv, yv = as_real(x).contiguous(), as_real(y).contiguous()
    int_type = {2: torch.int16, 4: torch.int32, 8: torch.int64}[xv.element_size()]
    nan = torch.isnan(xv) & torch.isnan(yv)
    same = (xv.view(int_type) == yv.view(int_type)) | nan
    if bool(same.all()):
        return "identical", ""
    x64, y64 = xv.double(), yv.double()
    diff = (x64 - y64).abs().nan_to_num(nan=float("inf"))
    diff[nan] = 0
    detail = f"{tuple(x.shape)} {x.dtype}: {int((~same).sum())} of {xv.numel()} differ, max |diff| {float(diff.max()):.3g}"
    atol, rtol = tol
    try:
        kw = {"atol": max(atol, 1e-5), "rtol": max(rtol, 1.3e-6)} if (atol or rtol) else {}
        torch.testing.assert_close(y, x, equal_nan=True, check_stride=False, **kw)
        return "within", detail
    except AssertionError:
        pass
    if spread is not None and spread[0] == "tensor" and spread[1].shape == x.shape:
        native_diff = (as_real(spread[1]).contiguous().double() - x64).abs().nan_to_num(nan=float("inf"))
        if float(native_diff.max()) > 0 and bool((diff <= 2 * native_diff.max()).all()):
            return "varies", detail + f" (native runs differ by up to {float(native_diff.max()):.3g})"
    return "differ", detail


def ulps(a: Any, b: Any) -> float:
    """The largest distance between two float tensor leaves of one shape, in units in the
    last place of the larger magnitude (inf where only one is NaN); 0 for anything else."""
    import torch

    if a[0] != "tensor" or b[0] != "tensor":
        return 0.0
    x, y = a[1], b[1]
    if x.shape != y.shape or x.dtype != y.dtype or x.numel() == 0 or not (x.is_floating_point() or x.is_complex()):
        return 0.0
    xv, yv = as_real(x).contiguous(), as_real(y).contiguous()
    # The spacing of the dtype at the larger magnitude (its smallest normal's below it),
    # computed in double: every float dtype, half and bfloat16 included.
    info = torch.finfo(xv.dtype)
    top = torch.maximum(xv.abs(), yv.abs()).double().clamp(min=info.tiny)
    spacing = info.eps * torch.exp2(torch.floor(torch.log2(top)))
    dist = ((xv.double() - yv.double()).abs() / spacing).nan_to_num(nan=float("inf"))
    dist[torch.isnan(xv) & torch.isnan(yv)] = 0
    dist[xv == yv] = 0
    return float(dist.max())


def compare(native: Run, remote: Run, native2: Run | None, ops: list[str]) -> tuple[Tally, dict[str, list[str]]]:
    import torch

    tally = Tally()
    by_state: dict[str, list[str]] = {"remote crash": [], "remote timeout": [], "native crash": [],
                                      "not run": [], "nondeterministic natively": []}
    for name in ops:
        n_end = native.ends.get(name, OpEnd("not run"))
        r_end = remote.ends.get(name, OpEnd("not run"))
        if r_end.state == "not run" or n_end.state == "not run":
            by_state["not run"].append(name)
            continue
        if r_end.state in ("crash", "timeout") and n_end.state == "ok":
            by_state["remote " + r_end.state].append(f"{name}: {r_end.detail}")
        if n_end.state != "ok":
            by_state["native crash"].append(f"{name}: native {n_end.state} {n_end.detail}"[:300])
        paths = [os.path.join(run.out, name + ".pt") for run in (native, remote)]
        if not all(os.path.exists(p) for p in paths):
            continue
        a = torch.load(paths[0], weights_only=False)
        b = torch.load(paths[1], weights_only=False)
        c = None
        if native2 is not None and os.path.exists(os.path.join(native2.out, name + ".pt")):
            c = torch.load(os.path.join(native2.out, name + ".pt"), weights_only=False)
        tolerances = a.get("__meta__", {}).get("tolerance", {})
        alerted = set(a.get("__meta__", {}).get("nondeterministic", []))
        varies = False
        # (dtype, pass) -> the most the two native runs differ in any sample, in ulps; and
        # the differing comparisons left to judge against it once the op is read.
        native_ulps: dict[tuple[str, str], float] = {}
        undecided: list[tuple[str, tuple[str, str], float, str]] = []
        for key in sorted(set(a) | set(b)):
            if key == "__meta__":
                continue
            if key not in a or key not in b:
                tally.missing += 1
                tally.by_op[name] = tally.by_op.get(name, 0) + 1
                tally.failures.append(f"{key}: only in the {'native' if key in a else 'remote'} run")
                continue
            la, lb = a[key], b[key]
            lc = c.get(key) if c is not None else None
            if lc is not None and len(lc) != len(la):
                lc = None
            tally.compared += 1
            tally.tensors += sum(1 for x in la if x[0] == "tensor")
            if len(la) != len(lb):
                tally.differ += 1
                tally.by_op[name] = tally.by_op.get(name, 0) + 1
                tally.failures.append(f"{key}: {len(la)} native leaves, {len(lb)} remote")
                continue
            tol = tuple(tolerances.get(key.split("|")[1], (0.0, 0.0)))
            verdicts = [leaf_verdict(x, y, tol, lc[i] if lc else None) for i, (x, y) in enumerate(zip(la, lb))]
            group = (key.split("|")[1], key.rsplit("|", 1)[-1])
            if lc is not None and any(leaf_verdict(x, z, (0.0, 0.0))[0] != "identical" for x, z in zip(la, lc)):
                varies = True
                spread = max(ulps(x, z) for x, z in zip(la, lc))
                native_ulps[group] = max(native_ulps.get(group, 0.0), spread)
            kinds = [v for v, _ in verdicts]
            if all(v == "identical" for v in kinds):
                tally.identical += 1
            elif all(v != "differ" for v in kinds):
                tally.within += 1
                tally.tolerated[name] = tally.tolerated.get(name, 0) + 1
                if "varies" in kinds:
                    tally.by_native_variation += 1
            else:
                worst = next(i for i, v in enumerate(kinds) if v == "differ")
                if key in alerted:
                    tally.nondeterministic_kernel.append(f"{key}: leaf {worst}: {verdicts[worst][1]}")
                    continue
                # Float leaves of one shape only: anything else differing is no rounding.
                distances = [ulps(x, y) for v, x, y in zip(kinds, la, lb) if v == "differ"]
                if all(d > 0 for d in distances):
                    undecided.append((key, group, max(distances), f"leaf {worst}: {verdicts[worst][1]}"))
                    continue
                tally.differ += 1
                tally.by_op[name] = tally.by_op.get(name, 0) + 1
                tally.failures.append(f"{key}: leaf {worst}: {verdicts[worst][1]}")
        for key, group, distance, detail in undecided:
            spread = native_ulps.get(group, 0.0)
            if 0 < distance <= 2 * spread:
                tally.like_native_variation.append(
                    f"{key}: {detail}; {distance:.3g} ulp, native runs of other samples differ by {spread:.3g}")
                continue
            tally.differ += 1
            tally.by_op[name] = tally.by_op.get(name, 0) + 1
            tally.failures.append(f"{key}: {detail}" + (f"; {distance:.3g} ulp, native runs by {spread:.3g}" if spread else ""))
        if varies:
            by_state["nondeterministic natively"].append(name)
    return tally, by_state


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chidori", required=True)
    parser.add_argument("--server", required=True)
    parser.add_argument("--work", required=True, help="directory for results and logs")
    parser.add_argument("--jobs", type=int, default=4, help="processes per run")
    parser.add_argument("--ops", default="", help="comma-separated op names (default: all)")
    parser.add_argument("--first", type=int, default=0, help="only the first N ops")
    parser.add_argument("--dtypes", default="float32,float16,bfloat16,complex64,int64")
    parser.add_argument("--native-twice", action="store_true")
    parser.add_argument("--op-timeout", type=float, default=120)
    parser.add_argument("--total", type=float, default=480, help="seconds for all runs together")
    parser.add_argument("--json", default="")
    args = parser.parse_args()

    started = time.monotonic()
    ops = args.ops.split(",") if args.ops else list_ops(args.dtypes)
    if args.first:
        ops = ops[: args.first]
    print(f"conformance: {len(ops)} ops, dtypes {args.dtypes}, {args.jobs} processes per run", flush=True)
    native = Run("native", [], os.path.join(args.work, "native"))
    remote = Run("remote", [args.chidori, "run", "-s", args.server, "--"], os.path.join(args.work, "remote"))
    # The second native run fills the host memory malloc hands out with another byte
    # (glibc's MALLOC_PERTURB_): an output an op leaves unwritten in host memory (the Philox
    # seed and offset of attention without dropout) then differs natively too.
    native2 = (Run("native2", [], os.path.join(args.work, "native2"), env={"MALLOC_PERTURB_": "165"})
               if args.native_twice else None)
    runs = [native, remote] + ([native2] if native2 else [])
    run_all(runs, ops, args.jobs, args.dtypes, args.op_timeout, args.total)
    ran = time.monotonic() - started
    tally, by_state = compare(native, remote, native2, ops)

    for title, names in by_state.items():
        if names:
            print(f"-- {title} ({len(names)}):")
            for n in names[:60]:
                print("   ", n)
    if tally.tolerated:
        print(f"-- within tolerance, not bit-identical ({len(tally.tolerated)} ops):")
        print("   ", ", ".join(f"{k} ({v})" for k, v in sorted(tally.tolerated.items())))
    if tally.nondeterministic_kernel:
        print(f"-- differing where PyTorch calls the kernel nondeterministic ({len(tally.nondeterministic_kernel)}):")
        for f in tally.nondeterministic_kernel[:100]:
            print("   ", f)
    if tally.like_native_variation:
        print(f"-- differing like other samples of the op between native runs ({len(tally.like_native_variation)}):")
        for f in tally.like_native_variation[:100]:
            print("   ", f)
    if tally.failures:
        print(f"-- differences ({len(tally.failures)}):")
        for f in tally.failures[:200]:
            print("   ", f)
    summary = {
        "ops": len(ops), "seconds": round(ran, 1), "compared": tally.compared, "tensors": tally.tensors,
        "identical": tally.identical, "within_tolerance": tally.within, "differ": tally.differ,
        "missing": tally.missing, "accepted_by_native_variation": tally.by_native_variation,
        "differ_in_nondeterministic_kernels": len(tally.nondeterministic_kernel),
        "differ_like_native_variation": len(tally.like_native_variation), "remote_crash": len(by_state["remote crash"]),
        "remote_timeout": len(by_state["remote timeout"]), "native_crash": len(by_state["native crash"]),
        "not_run": len(by_state["not run"]), "nondeterministic_natively": len(by_state["nondeterministic natively"]),
        "restarts": {r.label: r.restarts for r in runs},
    }
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"summary": summary, "states": by_state, "tolerated": tally.tolerated, "by_op": tally.by_op,
                       "failures": tally.failures, "nondeterministic_kernel": tally.nondeterministic_kernel,
                       "like_native_variation": tally.like_native_variation}, f,
                      indent=1)
    if tally.by_op:
        ranked = sorted(tally.by_op.items(), key=lambda kv: (-kv[1], kv[0]))
        print("differing or missing, by op:", ", ".join(f"{k} {v}" for k, v in ranked))
    print("== OpInfo conformance (remote vs native)")
    for k, v in summary.items():
        print(f"{k:28} {v}")
    bad = tally.differ + tally.missing + summary["remote_crash"] + summary["remote_timeout"]
    return 0 if bad == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
