// Several streams (plain, non-blocking, prioritised) ordered by events. Event timings must be
// positive; they go to stderr only.
#include "common.h"

constexpr int kStreams = 4, kRounds = 64;

__host__ __device__ unsigned churn_one(unsigned v) {
  for (int r = 0; r < kRounds; ++r) v = (v * 1664525u + 1013904223u) ^ (v >> 13);
  return v;
}

__global__ void churn(unsigned* data, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) data[i] = churn_one(data[i]);
}

__global__ void fold(const unsigned* data, int n, unsigned long long* sum) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) atomicAdd(sum, (unsigned long long)data[i]);
}

int main() {
  const int n = 1 << 20, chunk = n / kStreams;
  int least, greatest;
  CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  cudaStream_t streams[kStreams];
  CHECK(cudaStreamCreateWithPriority(&streams[0], cudaStreamNonBlocking, greatest));
  CHECK(cudaStreamCreateWithFlags(&streams[1], cudaStreamNonBlocking));
  for (int k = 2; k < kStreams; ++k) CHECK(cudaStreamCreate(&streams[k]));
  cudaEvent_t start[kStreams], stop[kStreams], done[kStreams];
  for (int k = 0; k < kStreams; ++k) {
    CHECK(cudaEventCreate(&start[k]));
    CHECK(cudaEventCreateWithFlags(&stop[k], cudaEventBlockingSync));
    CHECK(cudaEventCreateWithFlags(&done[k], cudaEventDisableTiming));
  }

  std::vector<unsigned> data(n), got(n);
  for (int i = 0; i < n; ++i) data[i] = i;
  unsigned* d_data;
  unsigned long long* d_sum;
  CHECK(cudaMalloc(&d_data, n * sizeof(unsigned)));
  CHECK(cudaMalloc(&d_sum, sizeof(unsigned long long)));
  CHECK(cudaMemcpy(d_data, data.data(), n * sizeof(unsigned), cudaMemcpyHostToDevice));

  for (int k = 0; k < kStreams; ++k) {
    CHECK(cudaEventRecord(start[k], streams[k]));
    churn<<<blocks_for(chunk, 256), 256, 0, streams[k]>>>(d_data + k * chunk, chunk);
    CHECK_LAUNCH();
    CHECK(cudaEventRecord(stop[k], streams[k]));
    CHECK(cudaEventRecord(done[k], streams[k]));
  }
  // Stream 0 folds all chunks, so it waits for every other stream's work.
  for (int k = 1; k < kStreams; ++k) CHECK(cudaStreamWaitEvent(streams[0], done[k], 0));
  CHECK(cudaMemsetAsync(d_sum, 0, sizeof(unsigned long long), streams[0]));
  fold<<<blocks_for(n, 256), 256, 0, streams[0]>>>(d_data, n, d_sum);
  CHECK_LAUNCH();
  unsigned long long sum = 0;
  CHECK(cudaMemcpyAsync(&sum, d_sum, sizeof sum, cudaMemcpyDeviceToHost, streams[0]));
  CHECK(cudaStreamSynchronize(streams[0]));

  for (int k = 0; k < kStreams; ++k) {
    CHECK(cudaEventSynchronize(stop[k]));
    CHECK(cudaEventQuery(stop[k]));
    CHECK(cudaStreamQuery(streams[k]));
    float ms;
    CHECK(cudaEventElapsedTime(&ms, start[k], stop[k]));
    EXPECT(ms > 0.0f);
    fprintf(stderr, "stream %d: churn took %.3f ms\n", k, ms);
  }

  unsigned long long want_sum = 0;
  for (unsigned& v : data) {
    v = churn_one(v);
    want_sum += v;
  }
  CHECK(cudaMemcpy(got.data(), d_data, n * sizeof(unsigned), cudaMemcpyDeviceToHost));
  expect_equal("churn", got, data);
  EXPECT(sum == want_sum);

  Report report;
  report.line("churned", checksum(got));
  report.line("sum", sum);
  for (int k = 0; k < kStreams; ++k) {
    CHECK(cudaEventDestroy(start[k]));
    CHECK(cudaEventDestroy(stop[k]));
    CHECK(cudaEventDestroy(done[k]));
    CHECK(cudaStreamDestroy(streams[k]));
  }
  CHECK(cudaFree(d_data));
  CHECK(cudaFree(d_sum));
  report.done("streams_events");
  return 0;
}
