// Kernels of the peer_functions program, as the function pointers the runtime's function
// queries take; the host code (main.cpp) is plain C++.
#pragma once

// saxpy(float* y, const float* x, float a, int n, char tag): y[i] += a * x[i].
const void* saxpy_kernel();
// tiled(float* out, int n): uses dynamic shared memory.
const void* tiled_kernel();
