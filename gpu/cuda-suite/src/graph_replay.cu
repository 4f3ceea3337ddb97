// A CUDA graph captured once from a stream (with a fork/join through a second stream) and
// replayed 1,000 times.
#include "common.h"

constexpr int kReplays = 1000;

__device__ unsigned long long d_replays;

__global__ void add_into(int* dst, const int* src, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) dst[i] += src[i];
}

__global__ void count_replay() { d_replays += 1; }

int main() {
  const int n = 1 << 20, g = blocks_for(n, 256);
  const size_t bytes = n * sizeof(int);
  std::vector<int> b(n);
  for (int i = 0; i < n; ++i) b[i] = i % 7 + 1;
  int *d_a, *d_b, *d_c, *d_tmp;
  for (int** p : {&d_a, &d_b, &d_c, &d_tmp}) CHECK(cudaMalloc(p, bytes));
  CHECK(cudaMemset(d_a, 0, bytes));
  CHECK(cudaMemcpy(d_b, b.data(), bytes, cudaMemcpyHostToDevice));
  const unsigned long long zero = 0;
  CHECK(cudaMemcpyToSymbol(d_replays, &zero, sizeof zero));

  cudaStream_t s, side;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CHECK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
  cudaEvent_t fork, join;
  CHECK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
  CHECK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));

  // One replay: tmp = 0; tmp += b; a += tmp; c = a; and, on the side stream, count the replay.
  cudaGraph_t graph;
  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  cudaStreamCaptureStatus status;
  CHECK(cudaStreamIsCapturing(s, &status));
  EXPECT(status == cudaStreamCaptureStatusActive);
  CHECK(cudaMemsetAsync(d_tmp, 0, bytes, s));
  CHECK(cudaEventRecord(fork, s));
  CHECK(cudaStreamWaitEvent(side, fork, 0));
  count_replay<<<1, 1, 0, side>>>();
  CHECK_LAUNCH();
  CHECK(cudaEventRecord(join, side));
  add_into<<<g, 256, 0, s>>>(d_tmp, d_b, n);
  CHECK_LAUNCH();
  add_into<<<g, 256, 0, s>>>(d_a, d_tmp, n);
  CHECK_LAUNCH();
  CHECK(cudaMemcpyAsync(d_c, d_a, bytes, cudaMemcpyDeviceToDevice, s));
  CHECK(cudaStreamWaitEvent(s, join, 0));
  CHECK(cudaStreamEndCapture(s, &graph));
  CHECK(cudaStreamIsCapturing(s, &status));
  EXPECT(status == cudaStreamCaptureStatusNone);

  size_t n_nodes = 0;
  CHECK(cudaGraphGetNodes(graph, nullptr, &n_nodes));
  printf("graph nodes      %zu\n", n_nodes);
  cudaGraphExec_t exec;
  CHECK(cudaGraphInstantiate(&exec, graph, 0));

  cudaEvent_t start, stop;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  CHECK(cudaEventRecord(start, s));
  for (int r = 0; r < kReplays; ++r) CHECK(cudaGraphLaunch(exec, s));
  CHECK(cudaEventRecord(stop, s));
  CHECK(cudaStreamSynchronize(s));
  float ms;
  CHECK(cudaEventElapsedTime(&ms, start, stop));
  fprintf(stderr, "%d replays took %.3f ms\n", kReplays, ms);

  unsigned long long replays;
  CHECK(cudaMemcpyFromSymbol(&replays, d_replays, sizeof replays));
  EXPECT(replays == kReplays);
  std::vector<int> a(n), c(n), want(n);
  CHECK(cudaMemcpy(a.data(), d_a, bytes, cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(c.data(), d_c, bytes, cudaMemcpyDeviceToHost));
  for (int i = 0; i < n; ++i) want[i] = kReplays * b[i];
  expect_equal("a", a, want);
  expect_equal("c", c, want);

  Report report;
  printf("replays          %llu\n", replays);
  report.line("a", checksum(a));
  CHECK(cudaGraphExecDestroy(exec));
  CHECK(cudaGraphDestroy(graph));
  for (cudaEvent_t e : {fork, join, start, stop}) CHECK(cudaEventDestroy(e));
  CHECK(cudaStreamDestroy(s));
  CHECK(cudaStreamDestroy(side));
  for (int* p : {d_a, d_b, d_c, d_tmp}) CHECK(cudaFree(p));
  report.done("graph_replay");
  return 0;
}
