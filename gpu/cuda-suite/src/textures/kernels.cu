// Kernels that read texture objects and write a surface object.
#include "textures/kernels.h"

__global__ void tex2d_kernel(cudaTextureObject_t tex, float* out, int width, int height) {
  int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y;
  if (x < width && y < height) out[y * width + x] = 2.0f * tex2D<float>(tex, x + 0.5f, y + 0.5f) + 1.0f;
}

__global__ void tex3d_kernel(cudaTextureObject_t tex, float* out, int width, int height, int depth) {
  int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y, z = blockIdx.z;
  if (x < width && y < height && z < depth)
    out[(z * height + y) * width + x] = tex3D<float>(tex, x + 0.5f, y + 0.5f, z + 0.5f);
}

__global__ void linear_kernel(cudaTextureObject_t tex, int* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = tex1Dfetch<int>(tex, n - 1 - i);
}

__global__ void surface_kernel(cudaSurfaceObject_t surf, int width, int height) {
  int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y;
  if (x < width && y < height) surf2Dwrite<unsigned int>(y * 1000u + x, surf, x * (int)sizeof(unsigned int), y);
}

static dim3 grid_2d(int width, int height) { return dim3((width + 15) / 16, (height + 15) / 16); }

void read_texture_2d(cudaTextureObject_t tex, float* out, int width, int height) {
  tex2d_kernel<<<grid_2d(width, height), dim3(16, 16)>>>(tex, out, width, height);
}

void read_texture_3d(cudaTextureObject_t tex, float* out, int width, int height, int depth) {
  dim3 grid = grid_2d(width, height);
  grid.z = depth;
  tex3d_kernel<<<grid, dim3(16, 16)>>>(tex, out, width, height, depth);
}

void read_linear(cudaTextureObject_t tex, int* out, int n) { linear_kernel<<<(n + 255) / 256, 256>>>(tex, out, n); }

void write_surface(cudaSurfaceObject_t surf, int width, int height) {
  surface_kernel<<<grid_2d(width, height), dim3(16, 16)>>>(surf, width, height);
}
