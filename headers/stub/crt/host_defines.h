/*
 * Minimal stand-in for nvcc's crt/host_defines.h, used only when Chidori runs bindgen or
 * compiles host-only C probes against the headers of NVIDIA's runtime wheels (which do
 * not carry crt/, it ships with nvcc). It defines the annotation macros the runtime
 * headers expect as host-compiler no-ops. Written for Chidori; not NVIDIA's file.
 */
#ifndef CHIDORI_STUB_HOST_DEFINES_H
#define CHIDORI_STUB_HOST_DEFINES_H

#define __no_return__ __attribute__((noreturn))
#define __noinline__ __attribute__((noinline))
#define __forceinline__ __inline__ __attribute__((always_inline))
#define __inline_hint__
#define __align__(n) __attribute__((aligned(n)))
#define __thread__ __thread
#define __import__
#define __export__
#define __cdecl
#define __annotate__(a) __attribute__((a))
#define __location__(a) __annotate__(a)
#define CUDARTAPI
#define CUDARTAPI_CDECL
#define __specialization_static
#define __host__
#define __device__
#define __global__
#define __shared__
#define __constant__
#define __managed__
#define __grid_constant__
#define __launch_bounds__(...)
#define __cluster_dims__(...)
#define __builtin_align__(a) __align__(a)
#define __device_builtin__
#define __device_builtin_texture_type__
#define __device_builtin_surface_type__
#define __cudart_builtin__
#define __nv_pure__
#define CUDA_CB
#define __cuda_builtin_vector_align8(tag, members) \
    struct __device_builtin__ __align__(8) tag { members }

#endif
