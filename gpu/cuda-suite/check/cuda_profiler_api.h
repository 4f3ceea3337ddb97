/* Stand-in for the toolkit's cuda_profiler_api.h (not in the runtime wheels), for check.sh's
   syntax check only; nvcc builds use the toolkit's own. Written for Chidori. */
#pragma once
#include <cuda_runtime_api.h>
extern "C" cudaError_t cudaProfilerStart(void);
extern "C" cudaError_t cudaProfilerStop(void);
