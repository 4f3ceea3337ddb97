// Dynamic shared memory (extern __shared__) above the 48 KiB default, opted in with
// cudaFuncSetAttribute(cudaFuncAttributeMaxDynamicSharedMemorySize).
#include "common.h"

constexpr int kTile = 16384;  // ints per block: 64 KiB of shared memory
constexpr int kSmemBytes = kTile * sizeof(int);

// Each block reverses its tile through shared memory.
__global__ void reverse_tiles(const int* in, int* out) {
  extern __shared__ int tile[];
  const int* src = in + (size_t)blockIdx.x * kTile;
  for (int k = threadIdx.x; k < kTile; k += blockDim.x) tile[k] = src[k];
  __syncthreads();
  int* dst = out + (size_t)blockIdx.x * kTile;
  for (int k = threadIdx.x; k < kTile; k += blockDim.x) dst[k] = tile[kTile - 1 - k] * 2 + 1;
}

int main() {
  const int n = 1 << 20, blocks = n / kTile;
  int optin;
  CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0));
  EXPECT(optin >= kSmemBytes);

  std::vector<int> in(n), want(n), got(n);
  for (int i = 0; i < n; ++i) in[i] = (i * 7) % 100003;
  for (int i = 0; i < n; ++i) {
    int base = i / kTile * kTile;
    want[i] = in[base + kTile - 1 - (i - base)] * 2 + 1;
  }
  int *d_in, *d_out;
  CHECK(cudaMalloc(&d_in, n * sizeof(int)));
  CHECK(cudaMalloc(&d_out, n * sizeof(int)));
  CHECK(cudaMemcpy(d_in, in.data(), n * sizeof(int), cudaMemcpyHostToDevice));

  // Without the opt-in, the launch is refused (not a sticky error).
  reverse_tiles<<<blocks, 256, kSmemBytes>>>(d_in, d_out);
  cudaError_t refused = cudaGetLastError();
  EXPECT(refused != cudaSuccess);
  printf("without opt-in   %s\n", cudaGetErrorName(refused));

  CHECK(cudaFuncSetAttribute(reverse_tiles, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
  cudaFuncAttributes attrs;
  CHECK(cudaFuncGetAttributes(&attrs, reverse_tiles));
  EXPECT(attrs.maxDynamicSharedSizeBytes == kSmemBytes);
  printf("max dynamic smem %d\n", attrs.maxDynamicSharedSizeBytes);

  reverse_tiles<<<blocks, 256, kSmemBytes>>>(d_in, d_out);
  CHECK_LAUNCH();
  CHECK(cudaMemcpy(got.data(), d_out, n * sizeof(int), cudaMemcpyDeviceToHost));
  expect_equal("reverse_tiles", got, want);
  CHECK(cudaFree(d_in));
  CHECK(cudaFree(d_out));
  Report report;
  report.line("reversed", checksum(got));
  report.done("dyn_smem");
  return 0;
}
