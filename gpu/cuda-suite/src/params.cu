// Kernel parameters of mixed types, sizes and alignments, including a 4 KiB struct by value.
#include "common.h"

struct S24 {
  int a;
  float b;
  double c;
  long long d;
};
static_assert(sizeof(S24) == 24, "S24 is 24 bytes");

struct Big {
  int v[1024];
};
static_assert(sizeof(Big) == 4096, "Big is 4 KiB");

__host__ __device__ long long mixed_value(int i, S24 s, char c, double d) {
  return (long long)i * s.a + (long long)(s.b * 4.0f) + (long long)s.c + s.d + c * (long long)d;
}

// Parameter offsets 0, 8, 16, 40, 48: padding before the pointer and before the double.
__global__ void mixed(int n, long long* out, S24 s, char c, double d) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = mixed_value(i, s, c, d);
}

// The parameters after the struct take the buffer past 4096 bytes (allowed since CUDA 12.1).
__global__ void big_param(Big big, char c, int n, long long* out) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = (long long)big.v[i % 1024] * c + i;
}

int main() {
  const int n = 1 << 20;
  long long* d_out;
  CHECK(cudaMalloc(&d_out, n * sizeof(long long)));
  std::vector<long long> got(n), want(n);
  Report report;

  const S24 s{7, 2.5f, 1e9 + 7, -123456789012LL};
  const char c = 'C';
  const double d = 3.0;
  mixed<<<blocks_for(n, 256), 256>>>(n, d_out, s, c, d);
  CHECK_LAUNCH();
  CHECK(cudaMemcpy(got.data(), d_out, n * sizeof(long long), cudaMemcpyDeviceToHost));
  for (int i = 0; i < n; ++i) want[i] = mixed_value(i, s, c, d);
  expect_equal("mixed", got, want);
  report.line("mixed", checksum(got));

  static Big big;
  for (int k = 0; k < 1024; ++k) big.v[k] = k * 31 - 5000;
  const char tag = -3;
  big_param<<<blocks_for(n, 128), 128>>>(big, tag, n, d_out);
  CHECK_LAUNCH();
  CHECK(cudaMemcpy(got.data(), d_out, n * sizeof(long long), cudaMemcpyDeviceToHost));
  for (int i = 0; i < n; ++i) want[i] = (long long)big.v[i % 1024] * tag + i;
  expect_equal("big_param", got, want);
  report.line("big_param", checksum(got));

  CHECK(cudaFree(d_out));
  report.done("params");
  return 0;
}
