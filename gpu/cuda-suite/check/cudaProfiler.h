/* Stand-in for the toolkit's cudaProfiler.h (not in the runtime wheels), for check.sh's
   syntax check only; nvcc builds use the toolkit's own. Written for Chidori. */
#pragma once
#include <cuda.h>
extern "C" CUresult cuProfilerStart(void);
extern "C" CUresult cuProfilerStop(void);
