#!/usr/bin/env python3
"""numba-cuda on the GPU: kernels compiled by NVVM to PTX and loaded through the driver
(`cuLink*`, `cuModuleLoadDataEx`), device arrays, shared memory, atomics and a reduction.

Prints one line per result with values rounded to 4 significant digits; run natively and
through `chidori run`, the two outputs must be equal.
"""

import numpy as np

# The GPU machine's numba-cuda registers an overload for np.row_stack, which its NumPy no
# longer has: its import fails natively. The alias (NumPy's own old meaning) lets it load;
# native and remote runs get the same.
if not hasattr(np, "row_stack"):
    np.row_stack = np.vstack  # type: ignore[attr-defined]

from numba import cuda, float32, int32  # noqa: E402


@cuda.jit
def saxpy(a: float, x: "np.ndarray", y: "np.ndarray", out: "np.ndarray") -> None:
    i = cuda.grid(1)
    if i < out.size:
        out[i] = a * x[i] + y[i]


@cuda.jit
def block_sums(x: "np.ndarray", sums: "np.ndarray") -> None:
    tile = cuda.shared.array(256, float32)
    i = cuda.grid(1)
    t = cuda.threadIdx.x
    tile[t] = x[i] if i < x.size else float32(0)
    cuda.syncthreads()
    stride = 128
    while stride > 0:
        if t < stride:
            tile[t] += tile[t + stride]
        cuda.syncthreads()
        stride //= 2
    if t == 0:
        sums[cuda.blockIdx.x] = tile[0]


@cuda.jit
def histogram(values: "np.ndarray", bins: "np.ndarray") -> None:
    i = cuda.grid(1)
    if i < values.size:
        cuda.atomic.add(bins, values[i] % int32(16), 1)


def show(label: str, value: "np.ndarray") -> None:
    """One result line: shape, first and last values and the sum, rounded."""
    flat = value.ravel()
    picks = [flat[0], flat[-1], flat.sum()]
    print(label, tuple(value.shape), " ".join(f"{float(v):.4g}" for v in picks))


def main() -> None:
    print("devices", len(cuda.gpus))
    n = 1 << 16
    x = np.arange(n, dtype=np.float32) / 1000
    y = np.ones(n, dtype=np.float32)
    out = cuda.device_array(n, dtype=np.float32)
    saxpy[(n + 255) // 256, 256](np.float32(2.5), cuda.to_device(x), cuda.to_device(y), out)
    show("saxpy", out.copy_to_host())
    sums = cuda.device_array(n // 256, dtype=np.float32)
    block_sums[n // 256, 256](cuda.to_device(x), sums)
    show("block sums", sums.copy_to_host())
    values = np.arange(n, dtype=np.int32) * 7
    bins = cuda.to_device(np.zeros(16, dtype=np.int32))
    histogram[(n + 255) // 256, 256](cuda.to_device(values), bins)
    show("histogram", bins.copy_to_host())
    cuda.synchronize()


if __name__ == "__main__":
    main()
