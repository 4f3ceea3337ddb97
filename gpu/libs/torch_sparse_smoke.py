#!/usr/bin/env python3
"""PyTorch's 2:4 semi-structured sparsity through cuSPARSELt.

`to_sparse_semi_structured` (cuSPARSELt rather than CUTLASS), `torch._cslt_compress` and
`torch._cslt_sparse_mm` with a bias and with a per-row alpha vector (vector scaling: alpha on
the device, beta a host float; or the library's refusal of it, which must come alike). Prints one line per result with values rounded to 4
significant digits; run natively and through `chidori run`, the two outputs must be equal.
"""

import torch


def show(label: str, value: torch.Tensor) -> None:
    """One result line: shape, the first and last values and the sum, rounded."""
    flat = value.float().ravel()
    picks = [flat[0], flat[-1], flat.sum()]
    print(label, tuple(value.shape), " ".join(f"{v.item():.4g}" for v in picks))


def main() -> None:
    if not torch.backends.cusparselt.is_available():
        print("cusparselt unavailable")
        return
    print("cusparselt", torch.backends.cusparselt.version())
    from torch.sparse import SparseSemiStructuredTensor, to_sparse_semi_structured

    SparseSemiStructuredTensor._FORCE_CUTLASS = False
    # nn.Linear draws its initial weights from the CPU generator: seeded, both runs agree.
    torch.manual_seed(0)
    g = torch.Generator(device="cuda").manual_seed(0)
    mask = torch.tensor([1, 1, 0, 0], dtype=torch.bool, device="cuda").tile(128, 64)
    a = torch.randn(128, 256, dtype=torch.float16, device="cuda", generator=g) * mask
    b = torch.randn(256, 64, dtype=torch.float16, device="cuda", generator=g)
    dense = a @ b
    sparse = to_sparse_semi_structured(a) @ b
    show("semi-structured", sparse)
    print("close to dense", bool(torch.allclose(sparse, dense, rtol=1e-2, atol=1e-2)))

    compressed = torch._cslt_compress(a)
    show("cslt mm", torch._cslt_sparse_mm(compressed, b))
    bias = torch.linspace(-1, 1, 128, dtype=torch.float16, device="cuda")
    show("cslt bias", torch._cslt_sparse_mm(compressed, b, bias=bias))
    alpha = torch.linspace(0.5, 2, 128, dtype=torch.float32, device="cuda")
    try:
        scaled = torch._cslt_sparse_mm(compressed, b, alpha=alpha)
    except RuntimeError as error:
        # A library may refuse vector scaling for these types: the refusal, at the same
        # call, is the result to compare.
        print("cslt alpha vector refused:", str(error).splitlines()[0][:160])
    else:
        show("cslt alpha vector", scaled)
        want = (alpha[:, None] * (a.float() @ b.float())).half()
        print("alpha vector close", bool(torch.allclose(scaled, want, rtol=2e-2, atol=2e-2)))

    linear = torch.nn.Linear(256, 128, dtype=torch.float16, device="cuda")
    with torch.no_grad():
        linear.weight.mul_(mask)
        linear.weight = torch.nn.Parameter(to_sparse_semi_structured(linear.weight))
    x = torch.randn(64, 256, dtype=torch.float16, device="cuda", generator=g)
    show("sparse linear", linear(x))


if __name__ == "__main__":
    main()
