// Separable compilation (-rdc=true): the kernel calls a __device__ function and reads a __device__
// variable defined in device_fn.cu; the host sets that variable through its extern declaration.
#include "common.h"

extern __device__ int g_offset;
extern __device__ int transform(int x);
void bump_step(int* d, int n);

__global__ void apply(int* d, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) d[i] = transform(d[i]);
}

int main() {
  const int n = 1 << 20;
  std::vector<int> want(n), got(n);
  for (int i = 0; i < n; ++i) want[i] = i % 1000;
  int* d;
  CHECK(cudaMalloc(&d, n * sizeof(int)));
  CHECK(cudaMemcpy(d, want.data(), n * sizeof(int), cudaMemcpyHostToDevice));

  apply<<<blocks_for(n, 256), 256>>>(d, n);
  CHECK_LAUNCH();
  const int offset = -4;
  CHECK(cudaMemcpyToSymbol(g_offset, &offset, sizeof offset));
  apply<<<blocks_for(n, 256), 256>>>(d, n);
  CHECK_LAUNCH();
  bump_step(d, n);
  for (int& v : want) v = (v * 5 + 11) * 5 + offset + offset;

  int offset_back = 0;
  CHECK(cudaMemcpyFromSymbol(&offset_back, g_offset, sizeof offset_back));
  EXPECT(offset_back == offset);
  CHECK(cudaMemcpy(got.data(), d, n * sizeof(int), cudaMemcpyDeviceToHost));
  expect_equal("rdc", got, want);
  CHECK(cudaFree(d));
  Report report;
  report.line("result", checksum(got));
  report.done("rdc");
  return 0;
}
