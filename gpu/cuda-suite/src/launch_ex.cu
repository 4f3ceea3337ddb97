// cudaLaunchKernelExC with launch attributes: a 2-block thread-block cluster chosen at launch time
// (the kernel has no __cluster_dims__), after the cluster occupancy queries of that configuration,
// and a stream priority through the C++ cudaLaunchKernelEx.
#include <cooperative_groups.h>
#include "common.h"

namespace cg = cooperative_groups;

constexpr int kThreads = 256;

// Each block sums its slice, then reads its partner's sum from the partner's shared memory
// (distributed shared memory). Outside a 2-block cluster it writes -1 instead.
__global__ void pair_sums(const int* in, long long* out) {
  __shared__ long long partial[kThreads];
  cg::cluster_group cluster = cg::this_cluster();
  partial[threadIdx.x] = in[blockIdx.x * kThreads + threadIdx.x];
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) partial[threadIdx.x] += partial[threadIdx.x + half];
    __syncthreads();
  }
  if (cluster.num_blocks() != 2) {
    if (threadIdx.x == 0) out[blockIdx.x] = -1;
    return;
  }
  cluster.sync();
  if (threadIdx.x == 0) {
    const long long* other = cluster.map_shared_rank(&partial[0], (int)(cluster.block_rank() ^ 1));
    out[blockIdx.x] = partial[0] * 1000 + *other;
  }
  cluster.sync();  // keeps this block's shared memory alive until the partner has read it
}

__global__ void scale(long long* d, int n, int factor) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) d[i] *= factor;
}

int main() {
  const int n = 1 << 20, blocks = n / kThreads;
  std::vector<int> in(n);
  for (int i = 0; i < n; ++i) in[i] = i % 97 - 48;
  int* d_in;
  long long* d_out;
  CHECK(cudaMalloc(&d_in, n * sizeof(int)));
  CHECK(cudaMalloc(&d_out, blocks * sizeof(long long)));
  CHECK(cudaMemcpy(d_in, in.data(), n * sizeof(int), cudaMemcpyHostToDevice));
  cudaStream_t stream;
  CHECK(cudaStreamCreate(&stream));

  cudaLaunchAttribute cluster_attr = {};
  cluster_attr.id = cudaLaunchAttributeClusterDimension;
  cluster_attr.val.clusterDim.x = 2;
  cluster_attr.val.clusterDim.y = 1;
  cluster_attr.val.clusterDim.z = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(blocks);
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = 0;
  config.stream = stream;
  config.attrs = &cluster_attr;
  config.numAttrs = 1;
  // What the GPU fits of this configuration, asked as CUTLASS asks before a cluster launch:
  // the largest cluster without the attribute, then how many 2-block clusters run at once.
  Report report;
  int potential = 0, active = 0;
  config.numAttrs = 0;
  CHECK(cudaOccupancyMaxPotentialClusterSize(&potential, (const void*)pair_sums, &config));
  config.numAttrs = 1;
  CHECK(cudaOccupancyMaxActiveClusters(&active, (const void*)pair_sums, &config));
  if (potential < 2 || active < 1) {
    fprintf(stderr, "cluster occupancy: potential size %d, active clusters %d\n", potential, active);
    return 1;
  }
  report.line("cluster_size", (unsigned long long)potential);
  report.line("active_clusters", (unsigned long long)active);

  void* args[] = {&d_in, &d_out};
  CHECK(cudaLaunchKernelExC(&config, (const void*)pair_sums, args));

  int least, greatest;
  CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  cudaLaunchAttribute priority_attr = {};
  priority_attr.id = cudaLaunchAttributePriority;
  priority_attr.val.priority = greatest;
  cudaLaunchConfig_t scale_config = {};
  scale_config.gridDim = dim3(blocks_for(blocks, 128));
  scale_config.blockDim = dim3(128);
  scale_config.stream = stream;
  scale_config.attrs = &priority_attr;
  scale_config.numAttrs = 1;
  CHECK(cudaLaunchKernelEx(&scale_config, scale, d_out, blocks, 3));
  CHECK(cudaStreamSynchronize(stream));

  std::vector<long long> sums(blocks), got(blocks), want(blocks);
  for (int i = 0; i < n; ++i) sums[i / kThreads] += in[i];
  for (int b = 0; b < blocks; ++b) want[b] = (sums[b] * 1000 + sums[b ^ 1]) * 3;
  CHECK(cudaMemcpy(got.data(), d_out, blocks * sizeof(long long), cudaMemcpyDeviceToHost));
  expect_equal("pair_sums", got, want);

  CHECK(cudaFree(d_in));
  CHECK(cudaFree(d_out));
  CHECK(cudaStreamDestroy(stream));
  report.line("pair_sums", checksum(got));
  report.done("launch_ex");
  return 0;
}
