// Second translation unit: its own static tu_kernel, same name and signature as main.cu's.
#include "common.h"
#include "multi_tu/steps.h"

static __global__ void tu_kernel(int* d, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) d[i] *= 3;
}

void scale_step(int* d, int n) {
  tu_kernel<<<blocks_for(n, 512), 512>>>(d, n);
  CHECK_LAUNCH();
}
