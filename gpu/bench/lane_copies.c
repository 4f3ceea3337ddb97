/* Large copies whose bytes are checked: host-to-device and back, synchronous and on a
   stream (the source overwritten right after the asynchronous copy returns), in order with
   a small call between, from two threads at once, and a copy that must fail. Through
   Chidori these travel on bulk lanes. Shared by cli/tests/e2e.rs (emulated backend) and
   gpu/round.sh's wire stage (the H200, natively and through chidori).

     nvcc -O2 -o lane_copies lane_copies.c -lpthread && ./lane_copies   # prints OK */
#include <stdio.h>
#include <string.h>
#define CHECK(x) do { int e_ = (int)(x); if (e_ != 0) { printf("FAIL line %d: %s -> %d\n", __LINE__, #x, e_); return 1; } } while (0)
#define EXPECT(c) do { if (!(c)) { printf("FAIL line %d: %s\n", __LINE__, #c); return 1; } } while (0)
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdlib.h>
#define N (40u << 20)
static int fill_check(unsigned seed) {
  unsigned char *in = malloc(N), *out = malloc(N);
  for (unsigned i = 0; i < N; ++i) in[i] = (unsigned char)(i * 7 + seed);
  void *d;
  CHECK(cudaMalloc(&d, N));
  CHECK(cudaMemcpy(d, in, N, cudaMemcpyHostToDevice));
  CHECK(cudaMemset(d, 0x5a, 4096));
  memset(out, 0, N);
  CHECK(cudaMemcpy(out, d, N, cudaMemcpyDeviceToHost));
  for (unsigned i = 0; i < N; ++i) {
    unsigned char want = i < 4096 ? 0x5a : (unsigned char)(i * 7 + seed);
    if (out[i] != want) { printf("FAIL seed %u byte %u: %d, not %d\n", seed, i, out[i], want); return 1; }
  }
  cudaStream_t s;
  CHECK(cudaStreamCreate(&s));
  for (unsigned i = 0; i < N; ++i) in[i] = (unsigned char)(i * 3 + seed);
  CHECK(cudaMemcpyAsync(d, in, N, cudaMemcpyHostToDevice, s));
  memset(in, 0, N);
  memset(out, 0, N);
  CHECK(cudaMemcpyAsync(out, d, N, cudaMemcpyDeviceToHost, s));
  CHECK(cudaStreamSynchronize(s));
  for (unsigned i = 0; i < N; ++i) {
    if (out[i] != (unsigned char)(i * 3 + seed)) { printf("FAIL async seed %u byte %u\n", seed, i); return 1; }
  }
  CHECK(cudaStreamDestroy(s));
  CHECK(cudaFree(d));
  free(in);
  free(out);
  return 0;
}
static void *thread(void *arg) { return (void *)(long)fill_check((unsigned)(long)arg); }
int main(void) {
  if (fill_check(1)) return 1;
  pthread_t t[2];
  for (long i = 0; i < 2; ++i) pthread_create(&t[i], NULL, thread, (void *)(i + 2));
  for (int i = 0; i < 2; ++i) { void *r; pthread_join(t[i], &r); if (r) return 1; }
  /* Four copies in on one stream, back to back, each from a buffer refilled at once (more
     chunks than a server keeps staging buffers), then all read back. */
  {
    unsigned char *in = malloc(N), *out = malloc(4 * (size_t)N);
    unsigned char *d;
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));
    CHECK(cudaMalloc((void **)&d, 4 * (size_t)N));
    for (unsigned k = 0; k < 4; ++k) {
      for (unsigned i = 0; i < N; ++i) in[i] = (unsigned char)(i * 5 + k * 11);
      CHECK(cudaMemcpyAsync(d + (size_t)k * N, in, N, cudaMemcpyHostToDevice, s));
    }
    CHECK(cudaMemcpyAsync(out, d, 4 * (size_t)N, cudaMemcpyDeviceToHost, s));
    CHECK(cudaStreamSynchronize(s));
    for (unsigned k = 0; k < 4; ++k)
      for (unsigned i = 0; i < N; ++i)
        if (out[(size_t)k * N + i] != (unsigned char)(i * 5 + k * 11)) { printf("FAIL stream copy %u byte %u\n", k, i); return 1; }
    CHECK(cudaFree(d));
    CHECK(cudaStreamDestroy(s));
    free(in);
    free(out);
  }
  /* A copy that runs past its allocation fails with the copy's status, and the session goes on. */
  void *small, *big = malloc(N);
  CHECK(cudaMalloc(&small, 1 << 20));
  EXPECT(cudaMemcpy(big, small, N, cudaMemcpyDeviceToHost) != cudaSuccess);
  cudaGetLastError();
  CHECK(cudaMemset(small, 1, 1 << 20));
  CHECK(cudaMemcpy(big, small, 1 << 20, cudaMemcpyDeviceToHost));
  EXPECT(((unsigned char *)big)[12345] == 1);
  printf("OK\n");
  return 0;
}
