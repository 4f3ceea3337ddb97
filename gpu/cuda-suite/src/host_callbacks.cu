// Host callbacks in a stream (cudaLaunchHostFunc on even rounds, cudaStreamAddCallback on odd ones).
// Each callback must see the data of the kernel before it (through a pinned D2H copy) and must run
// before the H2D copy after it, which uploads the value the callback wrote.
#include <atomic>
#include "common.h"

constexpr int kRounds = 8;

struct Round {
  int index;
  const int* snapshot;  // pinned; the D2H copy queued before the callback fills it
  int n;
  int* param;           // pinned; the H2D copy queued after the callback reads it
  unsigned long long seen = 0;
  int order = -1;
  cudaError_t status = cudaSuccess;
};

std::atomic<int> g_callbacks_run{0};

void on_host(Round& r) {
  r.seen = fnv1a(r.snapshot, r.n * sizeof(int));
  r.order = g_callbacks_run++;
  *r.param = (r.index + 1) * 100;
}

void CUDART_CB host_func(void* user) { on_host(*static_cast<Round*>(user)); }

void CUDART_CB stream_callback(cudaStream_t, cudaError_t status, void* user) {
  Round& r = *static_cast<Round*>(user);
  r.status = status;
  on_host(r);
}

__global__ void add_const(int* d, int n, int v) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) d[i] += v;
}

__global__ void add_param(int* d, int n, const int* param) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) d[i] += *param;
}

int main() {
  const int n = 1 << 20, g = blocks_for(n, 256);
  std::vector<int> model(n), got(n);
  for (int i = 0; i < n; ++i) model[i] = i;
  int *d, *d_param, *snapshot, *param;
  CHECK(cudaMalloc(&d, n * sizeof(int)));
  CHECK(cudaMalloc(&d_param, sizeof(int)));
  CHECK(cudaMallocHost(&snapshot, n * sizeof(int)));
  CHECK(cudaMallocHost(&param, sizeof(int)));
  *param = 0;
  CHECK(cudaMemcpy(d, model.data(), n * sizeof(int), cudaMemcpyHostToDevice));
  cudaStream_t s;
  CHECK(cudaStreamCreate(&s));

  Round rounds[kRounds];
  for (int r = 0; r < kRounds; ++r) {
    rounds[r].index = r;
    rounds[r].snapshot = snapshot;
    rounds[r].n = n;
    rounds[r].param = param;
    add_const<<<g, 256, 0, s>>>(d, n, r + 1);
    CHECK_LAUNCH();
    CHECK(cudaMemcpyAsync(snapshot, d, n * sizeof(int), cudaMemcpyDeviceToHost, s));
    if (r % 2 == 0)
      CHECK(cudaLaunchHostFunc(s, host_func, &rounds[r]));
    else
      CHECK(cudaStreamAddCallback(s, stream_callback, &rounds[r], 0));
    CHECK(cudaMemcpyAsync(d_param, param, sizeof(int), cudaMemcpyHostToDevice, s));
    add_param<<<g, 256, 0, s>>>(d, n, d_param);
    CHECK_LAUNCH();
  }
  CHECK(cudaStreamSynchronize(s));

  Report report;
  for (int r = 0; r < kRounds; ++r) {
    for (int& v : model) v += r + 1;
    EXPECT(rounds[r].seen == checksum(model));
    EXPECT(rounds[r].order == r);
    EXPECT(rounds[r].status == cudaSuccess);
    for (int& v : model) v += (r + 1) * 100;
    char label[32];
    snprintf(label, sizeof label, "round %d seen", r);
    report.line(label, rounds[r].seen);
  }
  CHECK(cudaMemcpy(got.data(), d, n * sizeof(int), cudaMemcpyDeviceToHost));
  expect_equal("final", got, model);
  report.line("final", checksum(got));

  CHECK(cudaStreamDestroy(s));
  CHECK(cudaFree(d));
  CHECK(cudaFree(d_param));
  CHECK(cudaFreeHost(snapshot));
  CHECK(cudaFreeHost(param));
  report.done("host_callbacks");
  return 0;
}
