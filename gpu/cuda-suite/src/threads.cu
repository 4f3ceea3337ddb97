// Two host threads at once, each with its own stream (stream-ordered allocations), launch
// configuration and kernel arguments.
#include <functional>
#include <thread>
#include "common.h"

constexpr int kIters = 50;

__host__ __device__ unsigned step_one(unsigned v, unsigned mul, unsigned add) { return v * mul + add; }

__global__ void step(unsigned* d, int n, unsigned mul, unsigned add) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) d[i] = step_one(d[i], mul, add);
}

struct Job {
  unsigned mul, add;
  int threads;
  unsigned long long result;
};

void worker(Job& job) {
  const int n = 1 << 20;
  CHECK(cudaSetDevice(0));
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  std::vector<unsigned> data(n), got(n);
  for (int i = 0; i < n; ++i) data[i] = i;
  unsigned* d;
  CHECK(cudaMallocAsync(&d, n * sizeof(unsigned), s));
  CHECK(cudaMemcpyAsync(d, data.data(), n * sizeof(unsigned), cudaMemcpyHostToDevice, s));
  for (int it = 0; it < kIters; ++it) {
    step<<<blocks_for(n, job.threads), job.threads, 0, s>>>(d, n, job.mul, job.add);
    CHECK_LAUNCH();
  }
  CHECK(cudaMemcpyAsync(got.data(), d, n * sizeof(unsigned), cudaMemcpyDeviceToHost, s));
  CHECK(cudaFreeAsync(d, s));
  CHECK(cudaStreamSynchronize(s));
  CHECK(cudaStreamDestroy(s));
  for (unsigned& v : data)
    for (int it = 0; it < kIters; ++it) v = step_one(v, job.mul, job.add);
  expect_equal("worker", got, data);
  job.result = checksum(got);
}

int main() {
  Job jobs[2] = {{1664525u, 1013904223u, 128, 0}, {22695477u, 1u, 512, 0}};
  std::thread first(worker, std::ref(jobs[0])), second(worker, std::ref(jobs[1]));
  first.join();
  second.join();
  Report report;
  report.line("thread 0", jobs[0].result);
  report.line("thread 1", jobs[1].result);
  report.done("threads");
  return 0;
}
