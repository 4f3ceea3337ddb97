// Kernels of the green_ctx program; the host code (main.cpp) is plain C++.
#pragma once
#include <cuda_runtime.h>

// out[i] = seed * 7 + i on `stream`, and the SM each block ran on into sm[block].
void fill_and_record_sms(int* out, unsigned* sm, int seed, int n, cudaStream_t stream);
