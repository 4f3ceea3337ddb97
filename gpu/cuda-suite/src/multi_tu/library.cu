// Built into the static library libsteps.a, which the program links.
#include "common.h"
#include "multi_tu/steps.h"

__global__ void library_xor(int* d, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) d[i] ^= 0x5a5a;
}

void library_step(int* d, int n) {
  library_xor<<<blocks_for(n, 128), 128>>>(d, n);
  CHECK_LAUNCH();
}
