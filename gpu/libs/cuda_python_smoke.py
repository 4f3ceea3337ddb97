#!/usr/bin/env python3
"""cuda-python (`cuda.bindings`, whose runtime module links the CUDA runtime statically):
the runtime's memory calls, and a kernel compiled by NVRTC, loaded and launched through
the driver API.

Prints one line per result; run natively and through `chidori run`, the two outputs must
be equal.
"""

import ctypes

import numpy as np
from cuda.bindings import driver, nvrtc, runtime

SOURCE = b"""
extern "C" __global__ void scale(float* x, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = a * x[i] + 1.0f;
}
"""


def check(result: tuple) -> tuple:
    """The values after a call's status; raises with the status where it is not success."""
    status, *values = result
    if int(status) != 0:
        raise RuntimeError(f"CUDA call failed: {status}")
    return tuple(values)


def main() -> None:
    (count,) = check(runtime.cudaGetDeviceCount())
    print("devices", count)
    n = 4096
    host = np.arange(n, dtype=np.float32) / 100
    (dptr,) = check(runtime.cudaMalloc(host.nbytes))
    check(runtime.cudaMemcpy(dptr, host.ctypes.data, host.nbytes, runtime.cudaMemcpyKind.cudaMemcpyHostToDevice))

    (prog,) = check(nvrtc.nvrtcCreateProgram(SOURCE, b"scale.cu", 0, [], []))
    (major,) = check(runtime.cudaDeviceGetAttribute(runtime.cudaDeviceAttr.cudaDevAttrComputeCapabilityMajor, 0))
    (minor,) = check(runtime.cudaDeviceGetAttribute(runtime.cudaDeviceAttr.cudaDevAttrComputeCapabilityMinor, 0))
    check(nvrtc.nvrtcCompileProgram(prog, 1, [f"--gpu-architecture=compute_{major}{minor}".encode()]))
    (size,) = check(nvrtc.nvrtcGetPTXSize(prog))
    ptx = b" " * size
    check(nvrtc.nvrtcGetPTX(prog, ptx))
    (module,) = check(driver.cuModuleLoadData(ptx))
    (kernel,) = check(driver.cuModuleGetFunction(module, b"scale"))
    args = ((int(dptr), 2.5, n), (ctypes.c_void_p, ctypes.c_float, ctypes.c_int))
    check(driver.cuLaunchKernel(kernel, (n + 255) // 256, 1, 1, 256, 1, 1, 0, 0, args, 0))
    check(runtime.cudaDeviceSynchronize())

    out = np.empty_like(host)
    check(runtime.cudaMemcpy(out.ctypes.data, dptr, out.nbytes, runtime.cudaMemcpyKind.cudaMemcpyDeviceToHost))
    print("scale", out.shape, f"{out[0]:.4g} {out[-1]:.4g} {out.sum():.6g}")
    check(runtime.cudaFree(dptr))


if __name__ == "__main__":
    main()
