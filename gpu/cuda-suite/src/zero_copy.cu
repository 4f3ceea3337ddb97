// Zero-copy host memory (NVIDIA's simpleZeroCopy): kernels read and write the program's host
// memory directly through its device pointer. Mapped pinned memory from cudaHostAlloc, then a
// malloc'ed buffer registered with cudaHostRegisterMapped (at a page boundary and not); the host
// changes the input between launches and reads what the kernel wrote after each
// synchronization, with no copy in between; a kernel finds its output through a pointer that
// is itself in mapped memory.
#include <cstdint>

#include "common.h"

__global__ void axpy(const float* x, float* y, int n, float a) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}

struct Job {
  int* out;
  int n;
  int base;
};

// Writes base + 3i through the job's pointer: the kernel's only parameter is the job.
__global__ void fill(const Job* job) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < job->n) job->out[i] = job->base + 3 * i;
}

// y = a * x + y on the host, for the expected values.
static void host_axpy(const std::vector<float>& x, std::vector<float>& y, float a) {
  for (size_t i = 0; i < x.size(); ++i) y[i] = a * x[i] + y[i];
}

// Three rounds of axpy on x and y, which the kernel reaches through dx and dy; the host rewrites
// part of x between rounds. Returns the checksum of y.
static unsigned long long rounds(const char* what, float* x, float* y, float* dx, float* dy, int n) {
  std::vector<float> want_x(n), want_y(n);
  for (int i = 0; i < n; ++i) {
    x[i] = want_x[i] = (float)(i % 1000) * 0.25f;
    y[i] = want_y[i] = (float)(i % 7);
  }
  for (int round = 0; round < 3; ++round) {
    const float a = 1.5f + round;
    axpy<<<blocks_for(n, 256), 256>>>(dx, dy, n, a);
    CHECK_LAUNCH();
    CHECK(cudaDeviceSynchronize());
    host_axpy(want_x, want_y, a);
    for (int i = 0; i < n; ++i) {
      if (y[i] != want_y[i]) {
        fprintf(stderr, "%s: round %d: mismatch at index %d: %f, want %f\n", what, round, i, y[i], want_y[i]);
        exit(1);
      }
    }
    // The host changes the input in place; the next launch must see it.
    for (int i = round; i < n; i += 97) x[i] = want_x[i] = -x[i];
  }
  return fnv1a(y, n * sizeof(float));
}

int main() {
  Report report;
  CHECK(cudaSetDeviceFlags(cudaDeviceMapHost));
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  EXPECT(prop.canMapHostMemory == 1);
  const int n = 1 << 20;

  // 1. Mapped pinned memory; its device pointer is the host pointer (unified addressing).
  float *x = nullptr, *y = nullptr;
  CHECK(cudaHostAlloc((void**)&x, n * sizeof(float), cudaHostAllocMapped));
  CHECK(cudaHostAlloc((void**)&y, n * sizeof(float), cudaHostAllocMapped | cudaHostAllocPortable));
  float *dx = nullptr, *dy = nullptr;
  CHECK(cudaHostGetDevicePointer((void**)&dx, x, 0));
  CHECK(cudaHostGetDevicePointer((void**)&dy, y, 0));
  unsigned int flags = 0;
  CHECK(cudaHostGetFlags(&flags, y));
  EXPECT(flags & cudaHostAllocMapped);
  cudaPointerAttributes attr;
  CHECK(cudaPointerGetAttributes(&attr, y));
  EXPECT(attr.type == cudaMemoryTypeHost && attr.devicePointer == dy && attr.hostPointer == y);
  report.line("host alloc", rounds("host alloc", x, y, dx, dy, n));
  CHECK(cudaFreeHost(x));
  CHECK(cudaFreeHost(y));

  // 2. Registered malloc'ed memory: page aligned, then 16 bytes into a page.
  for (size_t skew : {(size_t)0, (size_t)16}) {
    const size_t page = 4096, bytes = n * sizeof(float);
    char* block = static_cast<char*>(aligned_alloc(page, 2 * (bytes + page)));
    EXPECT(block != nullptr);
    float* hx = reinterpret_cast<float*>(block + skew);
    float* hy = reinterpret_cast<float*>(block + bytes + page + skew);
    CHECK(cudaHostRegister(hx, bytes, cudaHostRegisterMapped));
    CHECK(cudaHostRegister(hy, bytes, cudaHostRegisterMapped));
    float *rx = nullptr, *ry = nullptr;
    CHECK(cudaHostGetDevicePointer((void**)&rx, hx, 0));
    CHECK(cudaHostGetDevicePointer((void**)&ry, hy, 0));
    report.line(skew ? "registered+16" : "registered", rounds("registered", hx, hy, rx, ry, n));
    CHECK(cudaHostUnregister(hx));
    CHECK(cudaHostUnregister(hy));
    // Unregistered memory has no device pointer.
    float* none = nullptr;
    EXPECT(cudaHostGetDevicePointer((void**)&none, hx, 0) != cudaSuccess);
    cudaGetLastError();
    free(block);
  }

  // 3. A kernel finds its output only through a pointer stored in mapped memory.
  Job* job = nullptr;
  int* out = nullptr;
  CHECK(cudaHostAlloc((void**)&job, sizeof(Job), cudaHostAllocMapped));
  CHECK(cudaHostAlloc((void**)&out, 4096 * sizeof(int), cudaHostAllocMapped));
  job->out = out;
  job->n = 4096;
  job->base = 7;
  fill<<<16, 256>>>(job);
  CHECK_LAUNCH();
  CHECK(cudaDeviceSynchronize());
  for (int i = 0; i < 4096; ++i) EXPECT(out[i] == 7 + 3 * i);
  report.line("through job", fnv1a(out, 4096 * sizeof(int)));
  CHECK(cudaFreeHost(out));
  CHECK(cudaFreeHost(job));

  report.done("zero_copy");
  return 0;
}
