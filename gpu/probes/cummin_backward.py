"""Probe: is cummax/cummin's backward in half precision repeatable on this GPU?

The backward adds each output's gradient into the input position that held the running
extreme (scatter_add), many into the same position; in float16/bfloat16 the order of those
additions changes the rounding. Runs the same inputs 30 times natively and prints how many
distinct gradients came out per op and dtype (1: repeatable).
"""

import torch


def distinct_grads(op: str, dtype: torch.dtype, runs: int = 30) -> int:
    """How many different input gradients `runs` identical backward passes give."""
    g = torch.Generator(device="cpu").manual_seed(0)
    x0 = torch.randn(5, 5, 5, generator=g).to(dtype)
    up = torch.randn(5, 5, 5, generator=g).to(dtype)
    seen: set[bytes] = set()
    for _ in range(runs):
        x = x0.cuda().requires_grad_()
        values, _ = getattr(torch, op)(x, 0)
        values.backward(up.cuda())
        assert x.grad is not None
        seen.add(x.grad.float().cpu().numpy().tobytes())
    return len(seen)


if __name__ == "__main__":
    for op in ("cummax", "cummin"):
        for dtype in (torch.float16, torch.bfloat16, torch.float32):
            print(f"{op} {dtype}: {distinct_grads(op, dtype)} distinct gradients in 30 runs")
