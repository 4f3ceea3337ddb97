// Triple-chevron launches in their usual forms. Built twice: with nvcc 13's default launch stub
// (__cudaGetKernel + __cudaLaunchKernel) and with -legacy-launch-seq (cudaLaunchKernel).
#include "common.h"

__device__ int d_launches;

__global__ void fill(int* d, int n, int v) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) d[i] = v + i % 13;
}

template <typename T>
__global__ void scale2d(T* d, int width, int height, T factor) {
  int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y;
  if (x < width && y < height) d[y * width + x] *= factor;
}

// Rotates each block's elements by one place through dynamic shared memory.
__global__ void rotate_blocks(int* d) {
  extern __shared__ int buf[];
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  buf[threadIdx.x] = d[i];
  __syncthreads();
  d[i] = buf[(threadIdx.x + 1) % blockDim.x];
}

__global__ void count_launch() {
  if (threadIdx.x == 0) atomicAdd(&d_launches, 1);
}

int main() {
  const int width = 1024, height = 1024, n = width * height, block = 256;
  int* d;
  CHECK(cudaMalloc(&d, n * sizeof(int)));
  cudaStream_t stream;
  CHECK(cudaStreamCreate(&stream));
  const int zero = 0;
  CHECK(cudaMemcpyToSymbol(d_launches, &zero, sizeof zero));

  fill<<<n / block, block>>>(d, n, 5);
  CHECK_LAUNCH();
  scale2d<int><<<dim3(width / 32, height / 8), dim3(32, 8)>>>(d, width, height, 3);
  CHECK_LAUNCH();
  rotate_blocks<<<n / block, block, block * sizeof(int)>>>(d);
  CHECK_LAUNCH();
  rotate_blocks<<<n / 512, 512, 512 * sizeof(int), stream>>>(d);
  CHECK_LAUNCH();
  for (int k = 0; k < 100; ++k) {
    count_launch<<<1, 32, 0, stream>>>();
    CHECK_LAUNCH();
  }
  CHECK(cudaStreamSynchronize(stream));

  std::vector<int> model(n), rotated(n), got(n);
  for (int i = 0; i < n; ++i) model[i] = (5 + i % 13) * 3;
  for (int size : {block, 512}) {
    for (int i = 0; i < n; ++i) rotated[i] = model[i / size * size + (i % size + 1) % size];
    model.swap(rotated);
  }
  CHECK(cudaMemcpy(got.data(), d, n * sizeof(int), cudaMemcpyDeviceToHost));
  expect_equal("launches", got, model);
  int launches;
  CHECK(cudaMemcpyFromSymbol(&launches, d_launches, sizeof launches));
  EXPECT(launches == 100);

  CHECK(cudaFree(d));
  CHECK(cudaStreamDestroy(stream));
  Report report;
  printf("count_launch     %d\n", launches);
  report.line("result", checksum(got));
  report.done("launch_chevron");
  return 0;
}
