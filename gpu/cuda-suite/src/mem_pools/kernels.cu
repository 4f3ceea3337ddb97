// Kernels that use stream-ordered allocations.
#include "mem_pools/kernels.h"

__global__ void fill_kernel(int* p, int seed, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] = seed * 31 + i;
}

__global__ void plus_one_kernel(int* dst, const int* src, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) dst[i] = src[i] + 1;
}

void fill(int* p, int seed, int n, cudaStream_t stream) { fill_kernel<<<(n + 255) / 256, 256, 0, stream>>>(p, seed, n); }

void plus_one(int* dst, const int* src, int n, cudaStream_t stream) {
  plus_one_kernel<<<(n + 255) / 256, 256, 0, stream>>>(dst, src, n);
}
