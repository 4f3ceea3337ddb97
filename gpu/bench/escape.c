/* Copies a program makes through the server, and ones it must not be able to make: a
 * made-up device address, a stream handle's value (a pointer on a server that passed its
 * own pointers as handles), a range past an allocation's end. Each must fail with
 * CUDA_ERROR_INVALID_VALUE (1) and leave the session working. Run by cli/tests/security.rs
 * on the emulated backend and by `gpu/round.sh tls` on the GPU (plain and over TLS).
 * Prints "OK made_up=1 handle=1 past_end=1" where all three are refused. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cuda.h>
#include <cuda_runtime_api.h>
int main(void) {
  char in[4096], out[4096];
  for (int i = 0; i < 4096; ++i) in[i] = (char)i;
  void *d; int e = cudaMalloc(&d, sizeof in);
  if (e) { printf("malloc %d\n", e); return 2; }
  e = cudaMemcpy(d, in, sizeof in, cudaMemcpyHostToDevice);
  e |= cudaMemcpy(out, d, sizeof out, cudaMemcpyDeviceToHost);
  if (e || memcmp(in, out, sizeof in)) { printf("round trip %d\n", e); return 3; }
  /* Many TLS records each way, and an asynchronous copy queued before a waiting one. */
  size_t big = 24u << 20;
  char *a = malloc(big), *b = malloc(big);
  for (size_t i = 0; i < big; ++i) a[i] = (char)(i * 7);
  void *db; if (cudaMalloc(&db, big)) return 4;
  e = cudaMemcpyAsync(db, a, big, cudaMemcpyHostToDevice, 0);
  e |= cudaMemcpy(b, db, big, cudaMemcpyDeviceToHost);
  if (e || memcmp(a, b, big)) { printf("big round trip %d\n", e); return 5; }
  /* A made-up device address, and a stream handle's value (a pointer on the server). */
  cudaStream_t s; cudaStreamCreate(&s);
  CUresult made_up = cuMemcpyDtoH_v2(out, (CUdeviceptr)0x7e00dead0000ull, 16);
  CUresult handle = cuMemcpyDtoH_v2(out, (CUdeviceptr)s, 16);
  CUresult past_end = cuMemcpyDtoH_v2(out, (CUdeviceptr)d + 4000, 200);
  /* The session still works after the refusals. */
  memset(out, 0, 16);
  e = cudaMemcpy(out, d, 16, cudaMemcpyDeviceToHost);
  if (e || memcmp(in, out, 16)) { printf("copy after the refusals %d\n", e); return 6; }
  printf("OK made_up=%d handle=%d past_end=%d\n", (int)made_up, (int)handle, (int)past_end);
  return 0;
}
