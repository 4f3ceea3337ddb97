// Kernels whose names, parameters and occupancy the program asks about.
#include "peer_functions/kernels.h"

__global__ void saxpy(float* y, const float* x, float a, int n, char tag) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] += a * x[i] + (tag == 'z' ? 0.0f : 1.0f);
}

__global__ void tiled(float* out, int n) {
  extern __shared__ float tile[];
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  tile[threadIdx.x] = float(i);
  __syncthreads();
  if (i < n) out[i] = tile[blockDim.x - 1 - threadIdx.x];
}

const void* saxpy_kernel() { return (const void*)saxpy; }
const void* tiled_kernel() { return (const void*)tiled; }
