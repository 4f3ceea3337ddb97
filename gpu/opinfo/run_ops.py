#!/usr/bin/env python3
"""Run PyTorch's operator database (OpInfo) on CUDA in this process and save every result.

    python3 run_ops.py --out DIR --ops NAME[,NAME...] [--dtypes float32,float16,...]
    python3 run_ops.py --list [--dtypes ...]      # the ops that support CUDA, one a line

For each op, in the order given, and each dtype it supports on CUDA: every sample input,
forward, and backward where the op supports autograd in that dtype. The RNGs are seeded
per (op, dtype), so two runs of the same op (natively and through `chidori run`) build the
same inputs. `CHIDORI_OPINFO_DEVICE=cpu` runs on the CPU (to try the harness without a
GPU). Results of one op go to `DIR/<op>.pt` (a dict of result key -> list of
leaves), written when the op is done; `DIR/<op>.started` is written before it starts, so a
driver can tell which op killed the process.

Each result also records whether PyTorch itself calls the kernels that made it
nondeterministic: the sample is run once more with `torch.use_deterministic_algorithms(True,
warn_only=True)` (RNG state kept) and the "does not have a deterministic implementation"
warnings counted; results of such kernels may differ from run to run, natively too.

After each op the process checks that its CUDA context still works (a device
synchronization and a tiny kernel). If it does not, the op is recorded as having broken the
context and the process exits with status 3: every later CUDA call of this process would
fail, so the driver continues in a fresh one.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import random
import sys
import time
import traceback
import warnings
from typing import Any, Callable, Iterable

import torch

try:
    import expecttest  # noqa: F401 - torch's test utilities import it
except ImportError:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "stubs"))

from torch.testing._internal.common_methods_invocations import op_db  # noqa: E402
from torch.utils._pytree import tree_flatten

DTYPES = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "complex64": torch.complex64,
    "int64": torch.int64,
}

DEVICE = os.environ.get("CHIDORI_OPINFO_DEVICE", "cuda")

# Ops whose outputs are uninitialized memory: only their metadata is comparable.
UNINITIALIZED = {
    "empty", "empty_like", "new_empty", "new_empty_strided", "empty_strided", "empty_permuted",
    "resize_", "resize_as_",
}

# A leaf of a result: ("tensor", cpu tensor), ("meta", shape/dtype/stride text),
# ("value", repr of a non-tensor), ("none", "").
Leaf = tuple[str, Any]


def full_name(op: Any) -> str:
    return op.name + ("." + op.variant_test_name if op.variant_test_name else "")


def seed_for(key: str) -> int:
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:4], "little")


def seed_all(key: str) -> None:
    s = seed_for(key)
    torch.manual_seed(s)
    random.seed(s)
    try:
        import numpy

        numpy.random.seed(s)
    except ImportError:
        pass


def to_leaf(x: Any, metadata_only: bool) -> Leaf:
    """One result leaf, on the CPU, detached."""
    if x is None:
        return ("none", "")
    if isinstance(x, torch.Tensor):
        if metadata_only:
            return ("meta", f"{tuple(x.shape)} {x.dtype} {x.stride() if x.layout == torch.strided else x.layout}")
        t = x.detach()
        if t.layout != torch.strided:
            t = t.to_dense()
        if t.is_conj():
            t = t.resolve_conj()
        if t.is_neg():
            t = t.resolve_neg()
        return ("tensor", t.cpu().clone())
    if isinstance(x, (torch.dtype, torch.device, torch.Size, str, bool, int, float, complex, type(Ellipsis))):
        return ("value", repr(x))
    return ("value", type(x).__name__)


def leaves(result: Any, metadata_only: bool) -> list[Leaf]:
    flat, _ = tree_flatten(result)
    return [to_leaf(x, metadata_only) for x in flat]


def grad_inputs(sample: Any) -> list[torch.Tensor]:
    flat, _ = tree_flatten((sample.input, sample.args, sample.kwargs))
    return [t for t in flat if isinstance(t, torch.Tensor) and t.requires_grad and t.is_leaf]


def describe_error(e: BaseException) -> str:
    """Type and first line: comparable across runs (no addresses, no traceback)."""
    first = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{type(e).__name__}: {first[:200]}"


def context_alive() -> bool:
    try:
        if DEVICE == "cuda":
            torch.cuda.synchronize()
        return bool(torch.ones(2, device=DEVICE).add(1).sum().item() == 4.0)
    except Exception:  # noqa: BLE001 - any failure here means the context is gone
        return False


def own_tolerance(op: Any, dtype: torch.dtype) -> tuple[float, float]:
    """The loosest (atol, rtol) the op's own test decorators allow for `dtype` in any of
    PyTorch's tests (toleranceOverride, precisionOverride); (0, 0) when none does."""
    atol, rtol = 0.0, 0.0
    for info in getattr(op, "decorators", ()) or ():
        for dec in getattr(info, "decorators", [info]):
            table = getattr(dec, "d", None)
            if not isinstance(table, dict) or dtype not in table:
                continue
            t = table[dtype]
            if isinstance(t, (int, float)):
                atol = max(atol, float(t))
            else:
                atol, rtol = max(atol, float(getattr(t, "atol", 0.0))), max(rtol, float(getattr(t, "rtol", 0.0)))
    return atol, rtol


def nondeterministic(step: Callable[[], Any]) -> bool:
    """Whether `step` runs a kernel PyTorch calls nondeterministic (it warns under
    deterministic mode), leaving the RNGs as they were."""
    devices = [torch.cuda.current_device()] if DEVICE == "cuda" else []
    was, was_warn_only = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    with torch.random.fork_rng(devices=devices), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.use_deterministic_algorithms(True, warn_only=True)
        try:
            step()
        except Exception:  # noqa: BLE001 - the probe's own failure says nothing
            pass
        finally:
            torch.use_deterministic_algorithms(was, warn_only=was_warn_only)
    return any("does not have a deterministic implementation" in str(w.message) for w in caught)


def run_backward(sample: Any, out: Any, key: str, results: dict[str, Any], alerts: dict[str, bool]) -> None:
    """The gradients of one sample's outputs (seeded random cotangents) for its inputs."""
    try:
        outs = [t for t in tree_flatten(sample.output_process_fn_grad(out))[0]
                if isinstance(t, torch.Tensor) and t.requires_grad]
        ins = grad_inputs(sample)
        if not outs or not ins:
            return
        torch.manual_seed(seed_for(key))
        grads = [torch.randn_like(t) for t in outs]
        alert = nondeterministic(lambda: torch.autograd.grad(outs, ins, grads, allow_unused=True, retain_graph=True))
        got = torch.autograd.grad(outs, ins, grads, allow_unused=True)
        results[key + "|bwd"] = leaves(list(got), False)
        if alert:
            alerts[key + "|bwd"] = True
    except Exception as e:  # noqa: BLE001
        results[key + "|bwd"] = [("error", describe_error(e))]


def run_dtype(op: Any, dtype_name: str, results: dict[str, Any], alerts: dict[str, bool]) -> None:
    dtype = DTYPES[dtype_name]
    name = full_name(op)
    backward = op.supports_autograd and dtype in op.supported_backward_dtypes(DEVICE)
    metadata_only = op.name in UNINITIALIZED
    seed_all(f"{name}|{dtype_name}")
    try:
        samples: Iterable[Any] = op.sample_inputs(DEVICE, dtype, requires_grad=backward)
        for idx, sample in enumerate(samples):
            key = f"{name}|{dtype_name}|{idx}"
            try:
                out = op(sample.input, *sample.args, **sample.kwargs)
                results[key + "|fwd"] = leaves(out, metadata_only)
            except Exception as e:  # noqa: BLE001 - the op's own error is a result too
                results[key + "|fwd"] = [("error", describe_error(e))]
                continue
            if backward and not metadata_only:
                run_backward(sample, out, key, results, alerts)
            # Last: an in-place op run again changes its input, which nothing reads after.
            if nondeterministic(lambda: op(sample.input, *sample.args, **sample.kwargs)):
                alerts[key + "|fwd"] = True
    except Exception as e:  # noqa: BLE001 - sample generation itself failed
        results[f"{name}|{dtype_name}|samples"] = [("error", describe_error(e))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", help="directory for the results")
    parser.add_argument("--ops", help="comma-separated full op names (name.variant)")
    parser.add_argument("--dtypes", default=",".join(DTYPES))
    parser.add_argument("--list", action="store_true", help="print the ops that support CUDA in --dtypes")
    args = parser.parse_args()
    dtypes = [d for d in args.dtypes.split(",") if d]
    if args.list:
        for op in op_db:
            supported = op.supported_dtypes(DEVICE)
            if any(DTYPES[d] in supported for d in dtypes):
                print(full_name(op))
        return 0
    if not args.out or not args.ops:
        parser.error("--out and --ops are required unless --list")
    os.makedirs(args.out, exist_ok=True)
    wanted = args.ops.split(",")
    by_name = {full_name(op): op for op in op_db}
    for name in wanted:
        op = by_name.get(name)
        if op is None:
            continue
        marker = os.path.join(args.out, name + ".started")
        open(marker, "w").close()
        started = time.monotonic()
        results: dict[str, Any] = {}
        supported = op.supported_dtypes(DEVICE)
        tolerances: dict[str, tuple[float, float]] = {}
        alerts: dict[str, bool] = {}
        for dtype_name in dtypes:
            if DTYPES[dtype_name] in supported:
                run_dtype(op, dtype_name, results, alerts)
                tolerances[dtype_name] = own_tolerance(op, DTYPES[dtype_name])
        alive = context_alive()
        results["__meta__"] = {"seconds": time.monotonic() - started, "context_alive": alive, "tolerance": tolerances,
                               "nondeterministic": sorted(alerts)}
        tmp = os.path.join(args.out, name + ".pt.tmp")
        torch.save(results, tmp)
        os.replace(tmp, os.path.join(args.out, name + ".pt"))
        if not alive:
            print(f"run_ops: {name} left the CUDA context broken", file=sys.stderr, flush=True)
            return 3
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception:  # noqa: BLE001
        traceback.print_exc()
        sys.exit(1)
