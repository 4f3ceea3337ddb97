// Device printf: what kernels print reaches the program's standard output in order with the
// host's own output, as the driver writes it at each synchronization (cudaDeviceSynchronize,
// cudaStreamSynchronize, a blocking copy). One thread prints per kernel, so the order is
// fixed; the formats cover integers, 64-bit integers, floats and strings.
#include "common.h"

__global__ void say(int round, float x, long long big) {
  if (threadIdx.x == 0 && blockIdx.x == 0) {
    for (int i = 0; i < 3; ++i) printf("device round %d line %d x=%.3f big=%lld %s\n", round, i, x * i, big + i, "ok");
  }
}

__global__ void fill(int* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = i * 3;
  if (i == n - 1) printf("fill wrote %d values, last %d\n", n, out[i]);
}

int main() {
  Report report;
  cudaStream_t s;
  CHECK(cudaStreamCreate(&s));
  for (int r = 0; r < 3; ++r) {
    printf("host before round %d\n", r);
    say<<<2, 32>>>(r, 1.25f, 1LL << 40);
    CHECK_LAUNCH();
    CHECK(cudaDeviceSynchronize());
    printf("host after round %d\n", r);
  }
  // Flushed by a stream synchronization, then by a blocking copy.
  const int n = 1000;
  int* d;
  CHECK(cudaMalloc(&d, n * sizeof(int)));
  fill<<<(n + 255) / 256, 256, 0, s>>>(d, n);
  CHECK_LAUNCH();
  CHECK(cudaStreamSynchronize(s));
  printf("host after the stream\n");
  say<<<1, 1, 0, s>>>(9, 0.5f, 7);
  CHECK_LAUNCH();
  std::vector<int> got(n);
  CHECK(cudaMemcpy(got.data(), d, n * sizeof(int), cudaMemcpyDeviceToHost));
  printf("host after the copy\n");
  report.line("values", checksum(got));
  CHECK(cudaFree(d));
  CHECK(cudaStreamDestroy(s));
  report.done("device_printf");
  return 0;
}
