#!/usr/bin/env python3
"""torch.distributed over NCCL, for a GPU round: an all-reduce of 64 MiB and a few DDP steps
of a small model, printed as one JSON line (checksums to compare remote with native, and
the all-reduce's bus bandwidth).

    python3 allreduce.py                                  # one rank (one GPU)
    torchrun --nproc-per-node 2 allreduce.py              # two ranks (two GPUs)

Deterministic: seeded weights and inputs, the same on every rank.
"""

from __future__ import annotations

import json
import os
import time

import torch
import torch.distributed as dist


def main() -> int:
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=torch.device("cuda", local))

    # All-reduce of 64 MiB (float32): the sum of rank-dependent values, and its bandwidth.
    n = 16 << 20
    x = torch.full((n,), float(rank + 1), device="cuda")
    dist.all_reduce(x)
    torch.cuda.synchronize()
    expected = world * (world + 1) / 2
    ok = bool(torch.all(x == expected).item())
    t0 = time.perf_counter()
    reps = 10
    for _ in range(reps):
        dist.all_reduce(x)
    torch.cuda.synchronize()
    seconds = (time.perf_counter() - t0) / reps
    bus_gbps = (n * 4 / seconds / 1e9) * (2 * (world - 1) / world if world > 1 else 1.0)

    # A few DDP steps: the loss and a parameter checksum.
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)).cuda()
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local])
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    g = torch.Generator(device="cuda").manual_seed(1 + rank)
    losses = []
    for _ in range(5):
        inp = torch.randn(64, 256, device="cuda", generator=g)
        target = torch.randint(0, 10, (64,), device="cuda", generator=g)
        loss = torch.nn.functional.cross_entropy(ddp(inp), target)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(round(loss.item(), 6))
    checksum = float(sum(p.double().sum() for p in model.parameters()).item())
    if rank == 0:
        print(json.dumps({"world": world, "allreduce_ok": ok, "allreduce_bus_gbps": round(bus_gbps, 2),
                          "losses": losses, "checksum": checksum}), flush=True)
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
