/* Copies into mapped pinned memory the way NVIDIA's simpleStreams makes them: 64 MiB
 * registered with cudaHostRegisterMapped, device memory rewritten each round (a memset
 * stands for the kernel: the emulated backend runs none), then copied back whole and
 * synchronously, then in four pieces on four streams and an event synchronize. Prints the
 * seconds per round of each, after checking the last round's bytes; PAGEABLE=1 leaves the
 * memory unregistered (plain copies: the floor). The buffer is handed to the GPU first, so
 * the server mirrors it and copies into it go through the mirror. argv[1]: rounds (10). Run through
 * `chidori run` (bench/mapped_copies.sh). */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <sys/mman.h>
#include <cuda_runtime_api.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

#define CHECK(call) do { if ((call) != cudaSuccess) { printf("%s failed\n", #call); return 1; } } while (0)

int main(int argc, char **argv) {
  const size_t n = (size_t)64 << 20;
  int rounds = argc > 1 ? atoi(argv[1]) : 10;
  unsigned char *h = mmap(0, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANON, -1, 0), *d;
  if (h == MAP_FAILED) return 2;
  if (!getenv("PAGEABLE")) CHECK(cudaHostRegister(h, n, cudaHostRegisterMapped));
  CHECK(cudaMalloc((void **)&d, n));
  CHECK(cudaMemset(d, 0, n));
  cudaStream_t s[4];
  for (int i = 0; i < 4; i++) CHECK(cudaStreamCreate(&s[i]));
  cudaEvent_t done;
  CHECK(cudaEventCreate(&done));
  /* Handed to the GPU (as simpleStreams' kernel launches hand it every mapped range): the
   * server mirrors the buffer from here on, and copies into it run there. */
  if (!getenv("PAGEABLE")) {
    CHECK(cudaMemsetAsync(h + n - 1, 0, 1, 0));
    CHECK(cudaDeviceSynchronize());
  }
  double t0 = now();
  for (int r = 0; r < rounds; r++) {
    CHECK(cudaMemsetAsync(d, r + 1, n, 0));
    CHECK(cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost));
  }
  double t1 = now();
  for (int r = 0; r < rounds; r++) {
    for (int i = 0; i < 4; i++) CHECK(cudaMemsetAsync(d + i * n / 4, r + 7, n / 4, s[i]));
    for (int i = 0; i < 4; i++) CHECK(cudaMemcpyAsync(h + i * n / 4, d + i * n / 4, n / 4, cudaMemcpyDeviceToHost, s[i]));
  }
  CHECK(cudaEventRecord(done, 0));
  CHECK(cudaEventSynchronize(done));
  double t2 = now();
  for (size_t i = 0; i < n; i++)
    if (h[i] != (unsigned char)(rounds - 1 + 7)) { printf("byte %zu: %d\n", i, h[i]); return 3; }
  printf("whole %.3f s per round, four streams %.3f s per round (%d rounds of 64 MiB)\n", (t1 - t0) / rounds,
         (t2 - t1) / rounds, rounds);
  return 0;
}
