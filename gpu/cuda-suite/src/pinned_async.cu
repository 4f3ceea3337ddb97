// Pinned host memory (cudaMallocHost, cudaHostAlloc) with chunked cudaMemcpyAsync in both
// directions over two streams. The second pass rewrites the same pinned buffer and uploads it again.
#include "common.h"

constexpr int kChunks = 8, kStreams = 2;

__global__ void square_plus(const int* in, long long* out, int n, int pass) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = (long long)in[i] * in[i] + i + pass;
}

int main() {
  const int n = 1 << 20, chunk = n / kChunks;
  int* h_in;
  long long* h_out;
  // The cast selects the C entry point; the C++ overload for T** forwards to cudaHostAlloc.
  CHECK(cudaMallocHost((void**)&h_in, n * sizeof(int)));
  CHECK(cudaHostAlloc(&h_out, n * sizeof(long long), cudaHostAllocDefault));
  int* d_in;
  long long* d_out;
  CHECK(cudaMalloc(&d_in, n * sizeof(int)));
  CHECK(cudaMalloc(&d_out, n * sizeof(long long)));

  cudaPointerAttributes host_attr, device_attr;
  CHECK(cudaPointerGetAttributes(&host_attr, h_out));
  CHECK(cudaPointerGetAttributes(&device_attr, d_in));
  EXPECT(host_attr.type == cudaMemoryTypeHost);
  EXPECT(device_attr.type == cudaMemoryTypeDevice);

  cudaStream_t streams[kStreams];
  for (cudaStream_t& s : streams) CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  Report report;
  for (int pass = 0; pass < 2; ++pass) {
    for (int i = 0; i < n; ++i) h_in[i] = (i * 37 + pass * 11) % 10007 - 5000;
    for (int c = 0; c < kChunks; ++c) {
      cudaStream_t s = streams[c % kStreams];
      const size_t off = (size_t)c * chunk;
      CHECK(cudaMemcpyAsync(d_in + off, h_in + off, chunk * sizeof(int), cudaMemcpyHostToDevice, s));
      square_plus<<<blocks_for(chunk, 256), 256, 0, s>>>(d_in + off, d_out + off, chunk, pass);
      CHECK_LAUNCH();
      CHECK(cudaMemcpyAsync(h_out + off, d_out + off, chunk * sizeof(long long), cudaMemcpyDeviceToHost, s));
    }
    for (cudaStream_t s : streams) CHECK(cudaStreamSynchronize(s));
    for (int i = 0; i < n; ++i) {
      const long long want = (long long)h_in[i] * h_in[i] + i % chunk + pass;
      if (h_out[i] != want) {
        fprintf(stderr, "pass %d: mismatch at index %d\n", pass, i);
        return 1;
      }
    }
    report.line(pass == 0 ? "pass 0" : "pass 1", fnv1a(h_out, n * sizeof(long long)));
  }

  for (cudaStream_t s : streams) CHECK(cudaStreamDestroy(s));
  CHECK(cudaFree(d_in));
  CHECK(cudaFree(d_out));
  CHECK(cudaFreeHost(h_in));
  CHECK(cudaFreeHost(h_out));
  report.done("pinned_async");
  return 0;
}
