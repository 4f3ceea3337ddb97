// Device allocations through their whole life: sizes of whole 2 MiB granules and odd sizes
// from bytes to megabytes, written by kernels, copied, freed and made again in rounds (so
// that freed address ranges are reused), a reset of the device with allocations live, then
// rounds of memsets and copies (kernels after a reset load their modules again: a matter
// for programs of their own). Through Chidori at 70 ms most of these allocations are placed
// by the client (docs/ahead.md); every value must still be native's.
#include "common.h"

__global__ void fill(unsigned* data, size_t n, unsigned seed) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i < n) data[i] = (unsigned)(i * 2654435761u) ^ seed;
}

__global__ void mix(const unsigned* a, const unsigned* b, unsigned* out, size_t n) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i < n) out[i] = a[i] * 3u + (b[i] >> 1);
}

static unsigned model_fill(size_t i, unsigned seed) { return (unsigned)(i * 2654435761u) ^ seed; }

// One round: three buffers of `bytes` each (a and b filled, out mixed by a kernel; or, without
// kernels, a and b set by memsets and out copied from a with b's first half over it),
// checked against the host model; returns the checksum of out. Frees everything it made.
static unsigned long long round_of(size_t bytes, unsigned seed, bool kernels) {
  size_t n = bytes / sizeof(unsigned);
  unsigned *a, *b, *out;
  CHECK(cudaMalloc(&a, bytes));
  CHECK(cudaMalloc(&b, bytes));
  CHECK(cudaMalloc(&out, bytes));
  struct cudaPointerAttributes attr;
  CHECK(cudaPointerGetAttributes(&attr, out + n / 2));
  EXPECT(attr.type == cudaMemoryTypeDevice && attr.devicePointer == out + n / 2);
  EXPECT(((unsigned long long)a % 256) == 0 && ((unsigned long long)out % 256) == 0);
  std::vector<unsigned> got(n), want(n);
  if (kernels) {
    int threads = 256;
    int blocks = (int)((n + threads - 1) / threads);
    if (n > 0) {
      fill<<<blocks, threads>>>(a, n, seed);
      CHECK_LAUNCH();
      fill<<<blocks, threads>>>(b, n, seed * 7u + 1u);
      CHECK_LAUNCH();
      mix<<<blocks, threads>>>(a, b, out, n);
      CHECK_LAUNCH();
    }
    for (size_t i = 0; i < n; ++i) want[i] = model_fill(i, seed) * 3u + (model_fill(i, seed * 7u + 1u) >> 1);
  } else {
    unsigned char va = (unsigned char)seed, vb = (unsigned char)(seed * 7u + 1u);
    CHECK(cudaMemset(a, va, bytes));
    CHECK(cudaMemset(b, vb, bytes));
    CHECK(cudaMemcpy(out, a, bytes, cudaMemcpyDeviceToDevice));
    CHECK(cudaMemcpy(out, b, n / 2 * sizeof(unsigned), cudaMemcpyDeviceToDevice));
    for (size_t i = 0; i < n; ++i) want[i] = (i < n / 2 ? vb : va) * 0x01010101u;
  }
  if (n > 0) CHECK(cudaMemcpy(got.data(), out, n * sizeof(unsigned), cudaMemcpyDeviceToHost));
  expect_equal("round", got, want);
  CHECK(cudaFree(a));
  CHECK(cudaFree(b));
  CHECK(cudaFree(out));
  return checksum(got);
}

int main() {
  // Whole granules, odd sizes below and above 4 MiB, and a large one.
  const size_t sizes[] = {2u << 20, 4u << 20, 1000, 3u << 20, 4000000, 5000000, 12345678, 64u << 20};
  Report report;
  unsigned long long digest = 0;
  for (int pass = 0; pass < 2; ++pass) {
    unsigned seed = 17u + (unsigned)pass;
    for (size_t bytes : sizes) digest = digest * 31u + round_of(bytes, seed++, pass == 0);
    // Live allocations across the reset: freed by it, as natively.
    unsigned* kept;
    CHECK(cudaMalloc(&kept, 6u << 20));
    CHECK(cudaMemset(kept, 0x5a, 6u << 20));
    size_t free_before, total;
    CHECK(cudaMemGetInfo(&free_before, &total));
    fprintf(stderr, "pass %d: %zu of %zu bytes free\n", pass, free_before, total);
    if (pass == 0) CHECK(cudaDeviceReset());
  }
  report.line("rounds", digest);
  // A freed range made again at once, many times.
  unsigned long long churned = 0;
  for (int i = 0; i < 32; ++i) {
    unsigned* p;
    size_t bytes = (size_t)(i % 4 + 1) << 21;
    CHECK(cudaMalloc(&p, bytes));
    CHECK(cudaMemset(p, i, bytes));
    unsigned char last;
    CHECK(cudaMemcpy(&last, (unsigned char*)p + bytes - 1, 1, cudaMemcpyDeviceToHost));
    EXPECT(last == (unsigned char)i);
    churned = churned * 131u + last;
    CHECK(cudaFree(p));
  }
  report.line("churned", churned);
  report.done("alloc_lifecycle");
  return 0;
}
