// __managed__ variables: module-scope variables in managed memory that host code and kernels
// use by name. The host reads a variable's initializer, kernels update it with atomics and
// through a pointer the host passes (&variable is the device address on both sides), the host
// writes an array that a kernel then reads, and copies and memsets name the variables too.
#include "common.h"

__managed__ int counter = 5;
__managed__ float table[1024];
__managed__ unsigned long long sum;

__global__ void count(int times) {
  for (int i = 0; i < times; ++i) atomicAdd(&counter, 1);
}

// Through a pointer: the host's &counter is the GPU's.
__global__ void add_through(int* p, int value) { atomicAdd(p, value); }

__global__ void scale_table(float a) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < 1024) table[i] = table[i] * a + 1.0f;
}

__global__ void sum_table() {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < 1024) atomicAdd(&sum, (unsigned long long)table[i]);
}

int main() {
  Report report;
  // 1. The initializer, as the host first sees it.
  EXPECT(counter == 5);
  // 2. Kernels change it; the host sees their writes after a synchronization.
  count<<<4, 64>>>(10);
  CHECK_LAUNCH();
  CHECK(cudaDeviceSynchronize());
  EXPECT(counter == 5 + 4 * 64 * 10);
  add_through<<<1, 32>>>(&counter, 3);
  CHECK_LAUNCH();
  CHECK(cudaDeviceSynchronize());
  EXPECT(counter == 5 + 2560 + 96);
  report.line("counter", (unsigned long long)counter);
  // 3. The host's writes reach the kernels.
  counter = -7;
  add_through<<<1, 1>>>(&counter, 1);
  CHECK_LAUNCH();
  CHECK(cudaDeviceSynchronize());
  EXPECT(counter == -6);
  for (int i = 0; i < 1024; ++i) table[i] = (float)i;
  scale_table<<<4, 256>>>(2.0f);
  CHECK_LAUNCH();
  CHECK(cudaDeviceSynchronize());
  for (int i = 0; i < 1024; ++i) EXPECT(table[i] == 2.0f * i + 1.0f);
  sum = 0;
  sum_table<<<4, 256>>>();
  CHECK_LAUNCH();
  CHECK(cudaDeviceSynchronize());
  EXPECT(sum == 1024ull * 1024ull);  // sum of (2i + 1) for i < 1024
  report.line("table", fnv1a(table, sizeof(table)));
  // 4. Copies and memsets name the variables as device memory.
  float* d = nullptr;
  CHECK(cudaMalloc(&d, sizeof(table)));
  CHECK(cudaMemcpy(d, table, sizeof(table), cudaMemcpyDefault));
  CHECK(cudaMemset(table, 0, sizeof(table)));
  CHECK(cudaDeviceSynchronize());
  EXPECT(table[0] == 0.0f && table[1023] == 0.0f);
  CHECK(cudaMemcpy(table, d, sizeof(table), cudaMemcpyDefault));
  CHECK(cudaDeviceSynchronize());
  EXPECT(table[1023] == 2047.0f);
  cudaPointerAttributes attributes;
  CHECK(cudaPointerGetAttributes(&attributes, &counter));
  EXPECT(attributes.type == cudaMemoryTypeManaged);
  report.line("copied back", fnv1a(table, sizeof(table)));
  CHECK(cudaFree(d));
  report.done("managed_vars");
  return 0;
}
