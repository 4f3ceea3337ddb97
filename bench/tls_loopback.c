/* Small-call round trip and bulk copy throughput through chidori run, for comparing a
 * plaintext session with a TLS one on the same machine (bench/2026-12-03-tls-loopback.md).
 * Build against the CUDA 13.0 runtime headers and the libcudart.so.13 shim. */
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
  int calls = argc > 1 ? atoi(argv[1]) : 5000;
  size_t total = (size_t)(argc > 2 ? atoi(argv[2]) : 1024) << 20;
  size_t chunk = 256u << 20;
  size_t free_b, total_b;
  if (cudaMemGetInfo(&free_b, &total_b)) return 2;
  double t0 = now();
  for (int i = 0; i < calls; ++i) cudaMemGetInfo(&free_b, &total_b);
  double rtt = (now() - t0) / calls;
  char *host = malloc(chunk);
  memset(host, 7, chunk);
  void *dev;
  if (cudaMalloc(&dev, chunk)) return 3;
  t0 = now();
  for (size_t done = 0; done < total; done += chunk) cudaMemcpy(dev, host, chunk, cudaMemcpyHostToDevice);
  cudaDeviceSynchronize();
  double h2d = total / (now() - t0) / 1e9;
  t0 = now();
  for (size_t done = 0; done < total; done += chunk) cudaMemcpy(host, dev, chunk, cudaMemcpyDeviceToHost);
  double d2h = total / (now() - t0) / 1e9;
  printf("round trip %.1f us, H2D %.2f GB/s, D2H %.2f GB/s (%zu MiB each way)\n", rtt * 1e6, h2d, d2h, total >> 20);
  return 0;
}
