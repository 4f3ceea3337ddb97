// Allocates and touches GiB of device memory (argument, default 8), prints "ready" and
// waits to be killed: the SIGKILL memory-release measurement of gpu/round.sh.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <unistd.h>

int main(int argc, char** argv) {
  const size_t gib = argc > 1 ? strtoull(argv[1], nullptr, 10) : 8;
  void* p;
  cudaError_t e = cudaMalloc(&p, gib << 30);
  if (e == cudaSuccess) e = cudaMemset(p, 1, gib << 30);
  if (e == cudaSuccess) e = cudaDeviceSynchronize();
  if (e != cudaSuccess) { fprintf(stderr, "hold: %s\n", cudaGetErrorString(e)); return 1; }
  printf("ready\n");
  fflush(stdout);
  for (;;) pause();
}
