// Kernels of the copies_3d program; the host code (main.cpp) is plain C++.
#pragma once
#include <cuda_runtime.h>

// sums[z] = sum of the bytes of slice z of a pitched width x height x depth volume.
void slice_sums(cudaPitchedPtr volume, int width, int height, int depth, unsigned int* sums);
