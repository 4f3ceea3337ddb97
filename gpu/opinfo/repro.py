#!/usr/bin/env python3
"""Small reproductions of operator failures, one step at a time, each checked at once.

    python3 repro.py [STEP...]     # default: all steps

Each step prints one line `step: ok <value>` or `step: FAILED <error>`; after a failure that
breaks the CUDA context the remaining steps are skipped. Run it natively and through
`chidori run` and compare the lines.
"""
from __future__ import annotations

import sys
import traceback
from typing import Callable

import torch

STEPS: dict[str, Callable[[], str]] = {}


def step(fn: Callable[[], str]) -> Callable[[], str]:
    STEPS[fn.__name__] = fn
    return fn


@step
def pinned_copy_then_kernel() -> str:
    """A pinned host buffer copied without blocking, then read by a kernel (pack_vecs)."""
    host = torch.arange(64, dtype=torch.int64).pin_memory()
    dev = host.to("cuda", non_blocking=True)
    return str(int(dev.sum().item()))


@step
def chunk_cat() -> str:
    """FSDP2's copy-in: torch._chunk_cat packs pointer arrays in pinned memory."""
    ts = [torch.arange(12, dtype=torch.float32, device="cuda").reshape(3, 4) + i for i in range(3)]
    out = torch._chunk_cat(ts, dim=1, num_chunks=2)
    torch.cuda.synchronize()
    return f"{tuple(out.shape)} {float(out.sum().item())}"


@step
def chunk_cat_bf16() -> str:
    ts = [torch.randn(5, 7, device="cuda", dtype=torch.bfloat16) for _ in range(4)]
    out = torch._chunk_cat(ts, dim=0, num_chunks=3)
    torch.cuda.synchronize()
    return f"{tuple(out.shape)} {float(out.float().abs().sum().item()):.4f}"


@step
def lu_factor_batched() -> str:
    """Batched LU (MAGMA or cuBLAS, by size): pointer arrays again."""
    torch.manual_seed(0)
    a = torch.randn(8, 5, 5, device="cuda")
    lu, piv = torch.linalg.lu_factor(a)
    torch.cuda.synchronize()
    return f"{float(lu.abs().sum().item()):.4f} {int(piv.sum().item())}"


@step
def lu_unpack() -> str:
    torch.manual_seed(1)
    a = torch.randn(3, 2, 4, 4, device="cuda")
    lu, piv = torch.linalg.lu_factor(a)
    p, l, u = torch.lu_unpack(lu, piv)
    torch.cuda.synchronize()
    return f"{float((p @ l @ u - a).abs().max().item()) < 1e-4}"


@step
def lu_solve_large_batch() -> str:
    torch.manual_seed(2)
    a = torch.randn(64, 16, 16, device="cuda", dtype=torch.float64)
    b = torch.randn(64, 16, 3, device="cuda", dtype=torch.float64)
    x = torch.linalg.solve(a, b)
    return f"{float((a @ x - b).abs().max().item()) < 1e-8}"


@step
def det_inv() -> str:
    torch.manual_seed(3)
    a = torch.randn(4, 6, 6, device="cuda")
    return f"{float(torch.linalg.det(a).abs().sum().item()):.3f} {float(torch.linalg.inv(a).abs().sum().item()):.3f}"


def main() -> int:
    names = sys.argv[1:] or list(STEPS)
    failed = 0
    for name in names:
        try:
            print(f"{name}: ok {STEPS[name]()}", flush=True)
        except Exception as e:  # noqa: BLE001 - report and go on while the context lives
            failed += 1
            print(f"{name}: FAILED {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}", flush=True)
            traceback.print_exc()
            try:
                torch.cuda.synchronize()
            except Exception:  # noqa: BLE001
                print("the CUDA context is broken: the remaining steps are skipped", flush=True)
                return 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
