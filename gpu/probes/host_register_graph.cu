// Probe: how CUDA graphs treat host memory registrations that change under them.
// 1. A copy node captured from registered memory A; A unregistered and A+B registered
//    before instantiation: does the launch still work?
// 2. A copy spanning two adjacent, separately registered ranges, captured: accepted, and
//    right?
#include <cstdio>
#include <cstring>
#include <sys/mman.h>
#include <cuda_runtime.h>

#define TRY(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("  %s -> %s\n", #x, cudaGetErrorName(e)); } } while (0)

static char* pages(int n) {
  void* p = mmap(nullptr, 4096 * n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return (char*)p;
}

int main() {
  cudaStream_t s;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  char* d;
  cudaMalloc(&d, 1 << 20);
  cudaMemset(d, 0x5a, 1 << 20);
  cudaDeviceSynchronize();
  {
    printf("case 1: re-registered under a captured node\n");
    char* h = pages(2);
    memset(h, 1, 8192);
    TRY(cudaHostRegister(h, 4096, cudaHostRegisterPortable | cudaHostRegisterMapped));
    cudaGraph_t g;
    TRY(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    TRY(cudaMemcpyAsync(d, h + 100, 1000, cudaMemcpyHostToDevice, s));
    cudaStreamCaptureMode m = cudaStreamCaptureModeRelaxed;
    cudaThreadExchangeStreamCaptureMode(&m);
    TRY(cudaHostUnregister(h));
    TRY(cudaHostRegister(h, 8192, cudaHostRegisterPortable | cudaHostRegisterMapped));
    cudaThreadExchangeStreamCaptureMode(&m);
    TRY(cudaMemcpyAsync(h + 4000, d, 1000, cudaMemcpyDeviceToHost, s));
    TRY(cudaStreamEndCapture(s, &g));
    cudaGraphExec_t x;
    TRY(cudaGraphInstantiate(&x, g, 0));
    TRY(cudaGraphLaunch(x, s));
    TRY(cudaStreamSynchronize(s));
    printf("  h[4000]=%d (want 1)\n", h[4000]);
    TRY(cudaGetLastError());
  }
  {
    printf("case 2: a copy across two adjacent registrations\n");
    char* h = pages(2);
    memset(h, 2, 8192);
    TRY(cudaHostRegister(h, 4096, cudaHostRegisterPortable | cudaHostRegisterMapped));
    TRY(cudaHostRegister(h + 4096, 4096, cudaHostRegisterPortable | cudaHostRegisterMapped));
    cudaGraph_t g;
    TRY(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    TRY(cudaMemcpyAsync(d + 8192, h + 3000, 2000, cudaMemcpyHostToDevice, s));
    TRY(cudaMemcpyAsync(h + 3500, d, 1500, cudaMemcpyDeviceToHost, s));
    TRY(cudaStreamEndCapture(s, &g));
    cudaGraphExec_t x;
    TRY(cudaGraphInstantiate(&x, g, 0));
    TRY(cudaGraphLaunch(x, s));
    TRY(cudaStreamSynchronize(s));
    char back[2000];
    TRY(cudaMemcpy(back, d + 8192, 2000, cudaMemcpyDeviceToHost));
    printf("  back[1999]=%d (want 2) h[3500]=%d h[4999]=%d (want 90 90)\n", back[1999], h[3500], h[4999]);
    TRY(cudaGetLastError());
  }
  printf("done\n");
  return 0;
}
