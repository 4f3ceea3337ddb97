// Kernels of the textures program; the host code (main.cpp) is plain C++.
#pragma once
#include <cuda_runtime.h>

// out[y * width + x] = 2 * tex2D(tex, x, y) + 1 (point sampling at texel centers).
void read_texture_2d(cudaTextureObject_t tex, float* out, int width, int height);
// out[(z * height + y) * width + x] = tex3D(tex, x, y, z).
void read_texture_3d(cudaTextureObject_t tex, float* out, int width, int height, int depth);
// out[i] = tex1Dfetch(tex, n - 1 - i): a texture over linear device memory.
void read_linear(cudaTextureObject_t tex, int* out, int n);
// surface[x, y] = y * 1000 + x, as 32-bit texels.
void write_surface(cudaSurfaceObject_t surf, int width, int height);
