// Cooperative launch (cudaLaunchCooperativeKernel) with grid-wide synchronisation.
#include <cooperative_groups.h>
#include "common.h"

namespace cg = cooperative_groups;

constexpr int kThreads = 256;

// Phase 1: block partial sums. Phase 2: thread 0 of the grid totals them. Phase 3: every thread
// uses the total. The result does not depend on how many blocks the device runs at once.
__global__ void centre(const int* in, long long* partial, long long* total, long long* out, int n) {
  cg::grid_group grid = cg::this_grid();
  __shared__ long long scratch[kThreads];
  const int first = blockIdx.x * blockDim.x + threadIdx.x, stride = gridDim.x * blockDim.x;
  long long sum = 0;
  for (int i = first; i < n; i += stride) sum += in[i];
  scratch[threadIdx.x] = sum;
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) scratch[threadIdx.x] += scratch[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) partial[blockIdx.x] = scratch[0];
  grid.sync();
  if (first == 0) {
    long long t = 0;
    for (unsigned b = 0; b < gridDim.x; ++b) t += partial[b];
    *total = t;
  }
  grid.sync();
  const long long t = *(volatile long long*)total;
  for (int i = first; i < n; i += stride) out[i] = (long long)in[i] * n - t;
}

int main() {
  const int n = 1 << 20;
  int supported, sms, per_sm;
  CHECK(cudaDeviceGetAttribute(&supported, cudaDevAttrCooperativeLaunch, 0));
  EXPECT(supported);
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, centre, kThreads, 0));
  EXPECT(per_sm > 0);
  const int blocks = sms * per_sm;

  std::vector<int> in(n);
  for (int i = 0; i < n; ++i) in[i] = i % 1000 - 300;
  int* d_in;
  long long *d_partial, *d_total, *d_out;
  CHECK(cudaMalloc(&d_in, n * sizeof(int)));
  CHECK(cudaMalloc(&d_partial, blocks * sizeof(long long)));
  CHECK(cudaMalloc(&d_total, sizeof(long long)));
  CHECK(cudaMalloc(&d_out, n * sizeof(long long)));
  CHECK(cudaMemcpy(d_in, in.data(), n * sizeof(int), cudaMemcpyHostToDevice));

  cudaStream_t stream;
  CHECK(cudaStreamCreate(&stream));
  int n_arg = n;
  void* args[] = {&d_in, &d_partial, &d_total, &d_out, &n_arg};
  CHECK(cudaLaunchCooperativeKernel((const void*)centre, dim3(blocks), dim3(kThreads), args, 0, stream));
  CHECK(cudaStreamSynchronize(stream));

  long long total, want_total = 0;
  CHECK(cudaMemcpy(&total, d_total, sizeof total, cudaMemcpyDeviceToHost));
  for (int v : in) want_total += v;
  EXPECT(total == want_total);
  std::vector<long long> got(n), want(n);
  CHECK(cudaMemcpy(got.data(), d_out, n * sizeof(long long), cudaMemcpyDeviceToHost));
  for (int i = 0; i < n; ++i) want[i] = (long long)in[i] * n - want_total;
  expect_equal("centre", got, want);

  Report report;
  printf("total            %lld\n", total);
  report.line("centred", checksum(got));
  for (void* p : {(void*)d_in, (void*)d_partial, (void*)d_total, (void*)d_out}) CHECK(cudaFree(p));
  CHECK(cudaStreamDestroy(stream));
  report.done("coop_grid");
  return 0;
}
