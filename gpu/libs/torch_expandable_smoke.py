#!/usr/bin/env python3
"""PyTorch's caching allocator with expandable segments (`expandable_segments:True`).

The allocator then reserves a large virtual range and maps physical chunks into it as it grows
(the driver's `cuMemAddressReserve`, `cuMemCreate`, `cuMemMap`, `cuMemSetAccess`), unmapping them
again on `empty_cache` (`cuMemUnmap`, `cuMemRelease`). The script grows and shrinks the pool,
trains a small model on it and prints rounded values and the allocator's segment counts; run
natively and through `chidori run`, the two outputs must be equal.
"""

import os

os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"

import torch  # noqa: E402  (the allocator reads its setting at import)


def show(label: str, value: torch.Tensor) -> None:
    """One result line: shape, the first and last values and the sum, rounded."""
    flat = value.double().ravel()
    picks = [flat[0], flat[-1], flat.sum()]
    print(label, tuple(value.shape), " ".join(f"{v.item():.4g}" for v in picks))


def segments() -> str:
    """The allocator's segments: how many, and whether they are expandable."""
    snapshot = torch.cuda.memory_snapshot()
    expandable = sum(1 for s in snapshot if s.get("is_expandable", False))
    return f"{len(snapshot)} segments, {expandable} expandable"


def main() -> None:
    torch.manual_seed(0)
    # Grow: tensors of rising size, each kept, so the range is mapped further each time.
    kept = [torch.full((1 << k,), float(k), device="cuda") for k in range(10, 26)]
    total = sum(t.sum() for t in kept)
    print("grown", f"{total.item():.6g}", segments())
    # Shrink: every other tensor freed, the cache emptied (chunks unmapped), then grown again.
    del kept[::2]
    torch.cuda.empty_cache()
    again = [torch.arange(1 << k, device="cuda", dtype=torch.float32) for k in range(20, 25)]
    print("after empty_cache", f"{sum(t.sum() for t in kept).item():.6g}", f"{sum(t.sum() for t in again).item():.6g}")
    del kept, again
    torch.cuda.empty_cache()
    # A small model trained on the expandable pool.
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x = torch.randn(1024, 256, device="cuda")
    y = torch.randint(0, 10, (1024,), device="cuda")
    for step in range(20):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 5 == 4:
            print("step", step, f"{loss.item():.4g}")
    show("weight", model[0].weight.detach())
    # A large tensor, several chunks at once, then everything given back.
    big = torch.ones(256 << 20, dtype=torch.uint8, device="cuda")
    print("big", big.sum().item())
    del big, model, opt, x, y
    torch.cuda.empty_cache()
    print("reserved after empty_cache", torch.cuda.memory_reserved())


if __name__ == "__main__":
    main()
