// Kernels from three translation units, one of them in a static library. main.cu and scale.cu each
// define a static kernel with the same name and signature: two modules, two distinct kernels.
#include "common.h"
#include "multi_tu/steps.h"

static __global__ void tu_kernel(int* d, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) d[i] += 1;
}

int main() {
  const int n = 1 << 20;
  std::vector<int> want(n), got(n);
  for (int i = 0; i < n; ++i) want[i] = i;
  int* d;
  CHECK(cudaMalloc(&d, n * sizeof(int)));
  CHECK(cudaMemcpy(d, want.data(), n * sizeof(int), cudaMemcpyHostToDevice));
  for (int round = 0; round < 3; ++round) {
    tu_kernel<<<blocks_for(n, 256), 256>>>(d, n);
    CHECK_LAUNCH();
    scale_step(d, n);
    library_step(d, n);
    for (int& v : want) v = ((v + 1) * 3) ^ 0x5a5a;
  }
  CHECK(cudaMemcpy(got.data(), d, n * sizeof(int), cudaMemcpyDeviceToHost));
  expect_equal("multi_tu", got, want);
  CHECK(cudaFree(d));
  Report report;
  report.line("result", checksum(got));
  report.done("multi_tu");
  return 0;
}
