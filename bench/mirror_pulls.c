/* Pulls of mirrored pinned memory, the way NVIDIA's simpleStreams makes them: 64 MiB of
 * mapped pinned memory, handed to the GPU, rewritten there each round from device memory
 * whose integers grew by 25 (one byte in four changes; argv[2] another step), then a
 * synchronize that brings the changes back. Prints the seconds per round, after checking
 * every byte (argv[1] rounds, 10 by default). Run through
 * `chidori run` (bench/mirror_pulls.sh); on the emulated backend a device-to-device copy
 * into the mirror stands for the kernel. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <cuda_runtime_api.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
  const size_t n = (size_t)64 << 20;
  int rounds = argc > 1 ? atoi(argv[1]) : 10;
  /* What each round adds to every integer: 25 changes one byte in four, 0x01010101 all. */
  unsigned int step = argc > 2 ? (unsigned int)strtoul(argv[2], 0, 0) : 25;
  unsigned int *p, *values = malloc(n);
  void *d;
  if (!values || cudaHostAlloc((void **)&p, n, cudaHostAllocMapped) != cudaSuccess) return 2;
  if (cudaMalloc(&d, n) != cudaSuccess) return 2;
  memset(p, 0, n);
  memset(values, 0, n);
  /* The GPU is handed the memory: mirrored from here on. */
  if (cudaMemsetAsync(p, 0, 4, 0) != cudaSuccess || cudaDeviceSynchronize() != cudaSuccess) return 3;
  double total = 0;
  for (int r = 0; r < rounds; ++r) {
    for (size_t i = 0; i < n / 4; ++i) values[i] += step;
    if (cudaMemcpy(d, values, n, cudaMemcpyHostToDevice) != cudaSuccess) return 4;
    double t0 = now();
    if (cudaMemcpyAsync(p, d, n, cudaMemcpyDeviceToDevice, 0) != cudaSuccess) return 5;
    if (cudaStreamSynchronize(0) != cudaSuccess) return 6;
    total += now() - t0;
    if (memcmp(p, values, n) != 0) return 7;
  }
  printf("%.4f s per round (%d rounds of 64 MiB, each integer + %#x)\n", total / rounds, rounds, step);
  return 0;
}
