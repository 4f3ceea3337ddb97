// Round trip and bulk throughput of cudaMemcpy, the numbers of bench/core-*.md.
//
//   rtt [calls] [bulk] [tries] [data]   prints one JSON object (bulk 0: round trips only):
//     d2h_4b_us: median and p99 of `calls` (default 10,000) synchronous 4-byte D2H copies
//     h2d/d2h_{pageable,pinned}_gbps: best of `tries` (default 3) copies of 1 GiB of `data`:
//       random (default: bytes no compressor shrinks, the link's own speed) or relu (float32,
//       half of them zero and the rest random, as activations after a ReLU: zstd level 1
//       shrinks such tensors about 1.7x, `interposer/benches/zstd_tensors.rs`)
// No kernel: it also builds as C++ against the runtime headers (`g++ -x c++`), for the
// emulated backend.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
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

// Fill `n` bytes with the pattern of the top comment (relu or random), deterministically.
static void fill(char* p, size_t n, bool relu, uint64_t seed) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (size_t i = 0; i + 8 <= n; i += 8) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    uint64_t v = x;
    if (relu) {
      // Two float32 lanes; each is zero where its sign bit is set (ReLU), else a positive value.
      uint32_t lo = uint32_t(v), hi = uint32_t(v >> 32);
      lo = (lo & 0x80000000u) ? 0 : (lo & 0x3fffffffu);
      hi = (hi & 0x80000000u) ? 0 : (hi & 0x3fffffffu);
      v = uint64_t(lo) | (uint64_t(hi) << 32);
    }
    memcpy(p + i, &v, 8);
  }
}

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
  const char* data = argc > 4 ? argv[4] : "random";
  const bool relu = strcmp(data, "relu") == 0;
  if (!relu && strcmp(data, "random") != 0) {
    fprintf(stderr, "data: random or relu, not %s\n", data);
    return 2;
  }
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
  char* expected = static_cast<char*>(malloc(gib));
  if (!pageable || !expected) { fprintf(stderr, "cannot allocate 2 GiB of host memory\n"); return 1; }
  fill(expected, gib, relu, 1);
  memcpy(pageable, expected, gib);
  const double h2d_pageable = best_gbps(d_buf, pageable, gib, cudaMemcpyHostToDevice);
  memset(pageable, 0, gib);
  const double d2h_pageable = best_gbps(pageable, d_buf, gib, cudaMemcpyDeviceToHost);
  bool ok = memcmp(pageable, expected, gib) == 0;
  char* pinned;
  CHECK(cudaMallocHost(&pinned, gib));
  fill(expected, gib, relu, 2);
  memcpy(pinned, expected, gib);
  const double h2d_pinned = best_gbps(d_buf, pinned, gib, cudaMemcpyHostToDevice);
  memset(pinned, 0, gib);
  const double d2h_pinned = best_gbps(pinned, d_buf, gib, cudaMemcpyDeviceToHost);
  ok = ok && memcmp(pinned, expected, gib) == 0;
  if (!ok) { fprintf(stderr, "1 GiB copies returned wrong bytes\n"); return 1; }
  printf("{\"calls\": %d, \"data\": \"%s\", \"d2h_4b_median_us\": %.1f, \"d2h_4b_p99_us\": %.1f, "
         "\"h2d_pageable_gbps\": %.3f, \"d2h_pageable_gbps\": %.3f, "
         "\"h2d_pinned_gbps\": %.3f, \"d2h_pinned_gbps\": %.3f}\n",
         calls, data, median, p99, h2d_pageable, d2h_pageable, h2d_pinned, d2h_pinned);
  CHECK(cudaFreeHost(pinned));
  CHECK(cudaFree(d_buf));
  free(pageable);
  free(expected);
  return 0;
}
