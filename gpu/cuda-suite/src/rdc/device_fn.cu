// Device code used from main.cu: a __device__ function and variable resolved by the device link.
#include "common.h"

__device__ int g_offset = 11;

__device__ int transform(int x) { return x * 5 + g_offset; }

// A kernel of this translation unit, in the same linked module as main.cu's.
__global__ void bump(int* d, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) d[i] += g_offset;
}

void bump_step(int* d, int n) {
  bump<<<blocks_for(n, 256), 256>>>(d, n);
  CHECK_LAUNCH();
}
