#!/usr/bin/env python3
"""CuPy on the GPU: an elementwise kernel, a raw kernel, cuBLAS, cuFFT, cuRAND, cuSOLVER and
cuSPARSE.

Prints one line per result with values rounded to 4 significant digits; run natively and
through `chidori run`, the two outputs must be equal. Decompositions show only what no sign
the library may choose changes (eigenvalues, singular values).
"""

import cupy as cp
import cupyx.scipy.sparse as sparse


def show(label: str, value: "cp.ndarray") -> None:
    """One result line: shape and the first and last values, and the sum, rounded."""
    flat = value.ravel()
    picks = [flat[0], flat[-1], flat.sum()]
    print(label, tuple(value.shape), " ".join(f"{complex(v.item()):.4g}" for v in picks))


SCALE = cp.RawKernel(
    r"""
extern "C" __global__ void scale(const float* x, float* y, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + 1.0f;
}""",
    "scale",
)


def main() -> None:
    print("devices", cp.cuda.runtime.getDeviceCount())
    x = cp.arange(4096, dtype=cp.float32) / 100
    show("elementwise", cp.sin(x) * cp.exp(-x))
    y = cp.empty_like(x)
    SCALE((16,), (256,), (x, y, cp.float32(2.5), cp.int32(x.size)))
    show("raw kernel", y)
    a = cp.random.default_rng(0).standard_normal((128, 128), dtype=cp.float32)
    show("matmul", a @ a.T)
    show("fft", cp.fft.fft(a))
    show("irfft2", cp.fft.irfft2(cp.fft.rfft2(a)))
    cp.random.seed(7)
    show("curand", cp.random.rand(1000, dtype=cp.float32))
    spd = a @ a.T + 128 * cp.eye(128, dtype=cp.float32)
    show("solve", cp.linalg.solve(spd, cp.ones(128, dtype=cp.float32)))
    show("eigvalsh", cp.linalg.eigvalsh(spd))
    show("svdvals", cp.linalg.svd(a, compute_uv=False))
    show("cholesky", cp.linalg.cholesky(spd))
    # A sparse matrix (every seventh entry of a) times a vector and a matrix: cuSPARSE's
    # generic SpMV and SpMM.
    m = sparse.csr_matrix(cp.where(cp.arange(a.size).reshape(a.shape) % 7 == 0, a, 0))
    show("spmv", m @ cp.ones(128, dtype=cp.float32))
    show("spmm", m @ a)


if __name__ == "__main__":
    main()
