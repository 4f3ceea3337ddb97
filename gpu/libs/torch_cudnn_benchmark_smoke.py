#!/usr/bin/env python3
"""PyTorch with `torch.backends.cudnn.benchmark = True`: cuDNN's algorithms found by timing.

For every new convolution shape torch times the candidate engines (cuDNN's plans executed
on the GPU, timed with CUDA events) and keeps the fastest; through Chidori the timing runs on
the server's GPU. Trains a small CNN for a few steps over three input sizes and prints the
losses and a weight checksum rounded to 3 significant digits (the engine chosen may differ
from run to run, natively too, and engines round differently); run natively and through
`chidori run`, the two outputs must be equal.
"""

import torch


def main() -> None:
    torch.backends.cudnn.benchmark = True
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, padding=1),
        torch.nn.BatchNorm2d(16),
        torch.nn.ReLU(),
        torch.nn.Conv2d(16, 32, 3, stride=2, padding=1),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(32, 10),
    ).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for size in (32, 48, 32):
        x = torch.randn(16, 3, size, size, device="cuda")
        y = torch.randint(0, 10, (16,), device="cuda")
        for _ in range(3):
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        print("size", size, f"loss {loss.item():.3g}")
    total = sum(p.detach().double().abs().sum().item() for p in model.parameters())
    print("weights", f"{total:.3g}")


if __name__ == "__main__":
    main()
