// Round trip and bulk throughput of cudaMemcpy, the numbers of bench/core-*.md.
//
//   rtt [calls] [bulk] [tries]   prints one JSON object (bulk 0: round trips only):
//     d2h_4b_us: median and p99 of `calls` (default 10,000) synchronous 4-byte D2H copies
//     h2d/d2h_{pageable,pinned}_gbps: best of `tries` (default 3) copies of 1 GiB
// No kernel: it also builds as C++ against the runtime headers (`g++ -x c++`), for the
// emulated backend.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#define CHECK(x)                                                                         \
  do {                                                                                   \
    cudaError_t e_ = (x);                                                                \
    if (e_ != cudaSuccess) {                                                             \
      fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      exit(1);                                                                           \
    }                                                                                    \
  } while (0)

using Clock = std::chrono::steady_clock;

static double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

static int tries = 3;

// Best of `tries`: GB/s (1e9 bytes per second) of copying `bytes` with `kind`.
static double best_gbps(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  double best = 0;
  for (int i = 0; i < tries; ++i) {
    auto t = Clock::now();
    CHECK(cudaMemcpy(dst, src, bytes, kind));
    // A host-to-device cudaMemcpy may return once the source is staged.
    CHECK(cudaDeviceSynchronize());
    best = std::max(best, bytes / seconds_since(t) / 1e9);
  }
  return best;
}

int main(int argc, char** argv) {
  const int calls = argc > 1 ? atoi(argv[1]) : 10000;
  const bool bulk = argc > 2 ? atoi(argv[2]) != 0 : true;
  tries = argc > 3 ? std::max(1, atoi(argv[3])) : 3;
  CHECK(cudaFree(0));
  int* d_word;
  CHECK(cudaMalloc(&d_word, sizeof(int)));
  CHECK(cudaMemset(d_word, 0x5a, sizeof(int)));
  int word = 0;
  for (int i = 0; i < 100; ++i) CHECK(cudaMemcpy(&word, d_word, sizeof word, cudaMemcpyDeviceToHost));
  std::vector<double> us(calls);
  for (int i = 0; i < calls; ++i) {
    auto t = Clock::now();
    CHECK(cudaMemcpy(&word, d_word, sizeof word, cudaMemcpyDeviceToHost));
    us[i] = seconds_since(t) * 1e6;
  }
  if (word != 0x5a5a5a5a) { fprintf(stderr, "wrong word %#x\n", word); return 1; }
  std::sort(us.begin(), us.end());
  const double median = us[calls / 2], p99 = us[std::min(calls - 1, calls * 99 / 100)];
  if (!bulk) {
    printf("{\"calls\": %d, \"d2h_4b_median_us\": %.1f, \"d2h_4b_p99_us\": %.1f}\n", calls, median, p99);
    return 0;
  }

  const size_t gib = size_t(1) << 30;
  char* d_buf;
  CHECK(cudaMalloc(&d_buf, gib));
  char* pageable = static_cast<char*>(malloc(gib));
  memset(pageable, 7, gib);
  const double h2d_pageable = best_gbps(d_buf, pageable, gib, cudaMemcpyHostToDevice);
  memset(pageable, 0, gib);
  const double d2h_pageable = best_gbps(pageable, d_buf, gib, cudaMemcpyDeviceToHost);
  bool ok = pageable[0] == 7 && pageable[gib - 1] == 7 && pageable[gib / 2] == 7;
  char* pinned;
  CHECK(cudaMallocHost(&pinned, gib));
  memset(pinned, 9, gib);
  const double h2d_pinned = best_gbps(d_buf, pinned, gib, cudaMemcpyHostToDevice);
  memset(pinned, 0, gib);
  const double d2h_pinned = best_gbps(pinned, d_buf, gib, cudaMemcpyDeviceToHost);
  ok = ok && pinned[0] == 9 && pinned[gib - 1] == 9 && pinned[gib / 3] == 9;
  if (!ok) { fprintf(stderr, "1 GiB copies returned wrong bytes\n"); return 1; }
  printf("{\"calls\": %d, \"d2h_4b_median_us\": %.1f, \"d2h_4b_p99_us\": %.1f, "
         "\"h2d_pageable_gbps\": %.3f, \"d2h_pageable_gbps\": %.3f, "
         "\"h2d_pinned_gbps\": %.3f, \"d2h_pinned_gbps\": %.3f}\n",
         calls, median, p99, h2d_pageable, d2h_pageable, h2d_pinned, d2h_pinned);
  CHECK(cudaFreeHost(pinned));
  CHECK(cudaFree(d_buf));
  free(pageable);
  return 0;
}
