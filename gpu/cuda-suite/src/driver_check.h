// CU_CHECK for the suite's driver-API programs: on failure it names the call and the
// driver's error name, then exits 1.
#pragma once
#include <cstdio>
#include <cstdlib>
#include <cuda.h>

#define CU_CHECK(call)                                                                            \
  do {                                                                                            \
    CUresult check_res_ = (call);                                                                 \
    if (check_res_ != CUDA_SUCCESS) {                                                             \
      const char* name_ = nullptr;                                                                \
      cuGetErrorName(check_res_, &name_);                                                         \
      fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #call, name_ ? name_ : "?"); \
      exit(1);                                                                                    \
    }                                                                                             \
  } while (0)
