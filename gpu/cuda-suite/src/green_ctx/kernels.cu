// Kernels of the green_ctx program.
#include "green_ctx/kernels.h"

__global__ void fill_kernel(int* out, unsigned* sm, int seed, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = seed * 7 + i;
  if (threadIdx.x == 0) {
    unsigned id;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(id));
    sm[blockIdx.x] = id;
  }
}

void fill_and_record_sms(int* out, unsigned* sm, int seed, int n, cudaStream_t stream) {
  fill_kernel<<<(n + 255) / 256, 256, 0, stream>>>(out, sm, seed, n);
}
