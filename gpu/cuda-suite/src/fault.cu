// A kernel writes to an unmapped address. The next synchronising call reports the error
// (cudaErrorIllegalAddress), which is sticky: later calls report it too. Exits 0 only then.
#include "common.h"

__global__ void fill(int* d, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) d[i] = i;
}

__global__ void write_to(int* p) { *p = 42; }

int main() {
  const int n = 1 << 20;
  int* d;
  CHECK(cudaMalloc(&d, n * sizeof(int)));
  fill<<<blocks_for(n, 256), 256>>>(d, n);
  CHECK_LAUNCH();
  CHECK(cudaDeviceSynchronize());
  printf("before fault     ok\n");

  // 1 TiB past a live allocation: nothing is mapped there. The launch itself succeeds; its result
  // is left unchecked because the fault may already have been recorded by then.
  write_to<<<1, 1>>>(d + (size_t(1) << 38));
  const cudaError_t err = cudaDeviceSynchronize();
  printf("synchronize      %s\n", cudaGetErrorName(err));
  printf("next call        %s\n", cudaGetErrorName(cudaMemset(d, 0, sizeof(int))));
  if (err != cudaErrorIllegalAddress) return 1;
  printf("fault OK %s\n", cudaGetErrorName(err));
  return 0;
}
