#!/usr/bin/env python3
"""PyTorch's profiler with CUDA activities (CUPTI underneath) around a few training steps.

Prints the losses and the CPU operators the profiler saw (names and counts, which do not
depend on timing); run natively and through `chidori run`, the two outputs must be equal.
Whether it recorded GPU kernels goes to stderr: through Chidori the GPU is another machine's,
CUPTI in the program has none to trace, and Kineto says "CUDA profiler activities will be
missing" (the profiler must still run, not throw).
"""

import sys

import torch
from torch.profiler import ProfilerActivity, profile


def main() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 4)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(256, 64, device="cuda")
    y = torch.randint(0, 4, (256,), device="cuda")
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for step in range(3):
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            print("step", step, f"{loss.item():.4g}")
    events = prof.key_averages()
    ops = sorted((e.key, e.count) for e in events if e.key.startswith("aten::") and e.count >= 3)
    print("operators", " ".join(f"{name}={count}" for name, count in ops[:8]))
    kernels = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
    print("gpu kernels recorded", "yes" if kernels else "no", file=sys.stderr)


if __name__ == "__main__":
    main()
