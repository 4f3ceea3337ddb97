// A kernel that reads a pitched 3D allocation the way the device lays it out.
#include "copies_3d/kernels.h"

__global__ void slice_sums_kernel(cudaPitchedPtr volume, int width, int height, unsigned int* sums) {
  int z = blockIdx.x;
  const char* slice = static_cast<const char*>(volume.ptr) + size_t(z) * volume.pitch * height;
  unsigned int sum = 0;
  for (int y = threadIdx.x; y < height; y += blockDim.x)
    for (int x = 0; x < width; ++x) sum += static_cast<const unsigned char*>((const void*)(slice + y * volume.pitch))[x];
  atomicAdd(&sums[z], sum);
}

void slice_sums(cudaPitchedPtr volume, int width, int height, int depth, unsigned int* sums) {
  cudaMemset(sums, 0, depth * sizeof(unsigned int));
  slice_sums_kernel<<<depth, 32>>>(volume, width, height, sums);
}
