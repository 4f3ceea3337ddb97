// Kernels of the mem_pools program; the host code (main.cpp) is plain C++.
#pragma once
#include <cuda_runtime.h>

// p[i] = seed * 31 + i on `stream`.
void fill(int* p, int seed, int n, cudaStream_t stream);
// dst[i] = src[i] + 1 on `stream`.
void plus_one(int* dst, const int* src, int n, cudaStream_t stream);
