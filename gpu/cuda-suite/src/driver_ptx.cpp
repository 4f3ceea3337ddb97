// Driver API only (links -lcuda, no runtime): JIT-loads hand-written PTX with cuModuleLoadData,
// sets a module global found with cuModuleGetGlobal, and launches with cuLaunchKernel both with a
// kernelParams array and with a packed CU_LAUNCH_PARAM_BUFFER_POINTER buffer.
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <cuda.h>

#include "driver_check.h"

// axpy_i32(y, x, a, n): y[i] = a * x[i] + y[i].  scale_by_global(y, n): y[i] *= g_scale.
static const char kPtx[] = R"(
.version 8.0
.target sm_90
.address_size 64

.visible .global .align 4 .u32 g_scale = 1;

.visible .entry axpy_i32(
	.param .u64 axpy_i32_y,
	.param .u64 axpy_i32_x,
	.param .u32 axpy_i32_a,
	.param .u32 axpy_i32_n
)
{
	.reg .pred %p<2>;
	.reg .b32 %r<10>;
	.reg .b64 %rd<8>;

	ld.param.u64 %rd1, [axpy_i32_y];
	ld.param.u64 %rd2, [axpy_i32_x];
	ld.param.u32 %r1, [axpy_i32_a];
	ld.param.u32 %r2, [axpy_i32_n];
	mov.u32 %r3, %ctaid.x;
	mov.u32 %r4, %ntid.x;
	mov.u32 %r5, %tid.x;
	mad.lo.s32 %r6, %r3, %r4, %r5;
	setp.ge.s32 %p1, %r6, %r2;
	@%p1 bra AXPY_DONE;
	cvta.to.global.u64 %rd3, %rd1;
	cvta.to.global.u64 %rd4, %rd2;
	mul.wide.s32 %rd5, %r6, 4;
	add.s64 %rd6, %rd4, %rd5;
	ld.global.u32 %r7, [%rd6];
	add.s64 %rd7, %rd3, %rd5;
	ld.global.u32 %r8, [%rd7];
	mad.lo.s32 %r9, %r7, %r1, %r8;
	st.global.u32 [%rd7], %r9;
AXPY_DONE:
	ret;
}

.visible .entry scale_by_global(
	.param .u64 scale_by_global_y,
	.param .u32 scale_by_global_n
)
{
	.reg .pred %p<2>;
	.reg .b32 %r<9>;
	.reg .b64 %rd<5>;

	ld.param.u64 %rd1, [scale_by_global_y];
	ld.param.u32 %r1, [scale_by_global_n];
	mov.u32 %r2, %ctaid.x;
	mov.u32 %r3, %ntid.x;
	mov.u32 %r4, %tid.x;
	mad.lo.s32 %r5, %r2, %r3, %r4;
	setp.ge.s32 %p1, %r5, %r1;
	@%p1 bra SCALE_DONE;
	cvta.to.global.u64 %rd2, %rd1;
	mul.wide.s32 %rd3, %r5, 4;
	add.s64 %rd4, %rd2, %rd3;
	ld.global.u32 %r6, [%rd4];
	ld.global.u32 %r7, [g_scale];
	mul.lo.s32 %r8, %r6, %r7;
	st.global.u32 [%rd4], %r8;
SCALE_DONE:
	ret;
}
)";

static unsigned long long fnv1a(const void* data, size_t n_bytes) {
  const unsigned char* bytes = static_cast<const unsigned char*>(data);
  unsigned long long hash = 1469598103934665603ull;
  for (size_t i = 0; i < n_bytes; ++i) hash = (hash ^ bytes[i]) * 1099511628211ull;
  return hash;
}

int main() {
  int n = 1 << 20;
  const unsigned blocks = (n + 255) / 256;
  CU_CHECK(cuInit(0));
  CUdevice dev;
  CU_CHECK(cuDeviceGet(&dev, 0));
  CUcontext ctx;
  CU_CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
  CU_CHECK(cuCtxSetCurrent(ctx));

  CUmodule module;
  CU_CHECK(cuModuleLoadData(&module, kPtx));
  CUfunction axpy, scale;
  CU_CHECK(cuModuleGetFunction(&axpy, module, "axpy_i32"));
  CU_CHECK(cuModuleGetFunction(&scale, module, "scale_by_global"));
  CUdeviceptr g_scale;
  size_t g_scale_bytes;
  CU_CHECK(cuModuleGetGlobal(&g_scale, &g_scale_bytes, module, "g_scale"));
  if (g_scale_bytes != sizeof(int)) {
    fprintf(stderr, "g_scale is %zu bytes\n", g_scale_bytes);
    return 1;
  }

  std::vector<int> x(n), y(n), got(n);
  for (int i = 0; i < n; ++i) {
    x[i] = i % 1000 - 500;
    y[i] = i % 7;
  }
  CUdeviceptr d_x, d_y;
  CU_CHECK(cuMemAlloc(&d_x, n * sizeof(int)));
  CU_CHECK(cuMemAlloc(&d_y, n * sizeof(int)));
  CU_CHECK(cuMemcpyHtoD(d_x, x.data(), n * sizeof(int)));
  CU_CHECK(cuMemcpyHtoD(d_y, y.data(), n * sizeof(int)));

  int a = 7;
  void* params[] = {&d_y, &d_x, &a, &n};
  CU_CHECK(cuLaunchKernel(axpy, blocks, 1, 1, 256, 1, 1, 0, nullptr, params, nullptr));

  const int factor = -3;
  CU_CHECK(cuMemcpyHtoD(g_scale, &factor, sizeof factor));
  // The buffer size is the end of the last parameter, without tail padding.
  struct {
    CUdeviceptr y;
    int n;
  } packed = {d_y, n};
  size_t packed_size = offsetof(decltype(packed), n) + sizeof(int);
  void* extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, &packed, CU_LAUNCH_PARAM_BUFFER_SIZE, &packed_size,
                   CU_LAUNCH_PARAM_END};
  // Cluster occupancy of axpy's launch: the largest cluster, then 2-block clusters at once.
  CUlaunchConfig occupancy = {};
  occupancy.gridDimX = blocks;
  occupancy.gridDimY = occupancy.gridDimZ = 1;
  occupancy.blockDimX = 256;
  occupancy.blockDimY = occupancy.blockDimZ = 1;
  int cluster_size = 0, active_clusters = 0;
  CU_CHECK(cuOccupancyMaxPotentialClusterSize(&cluster_size, axpy, &occupancy));
  CUlaunchAttribute cluster = {};
  cluster.id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
  cluster.value.clusterDim.x = 2;
  cluster.value.clusterDim.y = cluster.value.clusterDim.z = 1;
  occupancy.attrs = &cluster;
  occupancy.numAttrs = 1;
  CU_CHECK(cuOccupancyMaxActiveClusters(&active_clusters, axpy, &occupancy));
  if (cluster_size < 2 || active_clusters < 1) {
    fprintf(stderr, "cluster occupancy: size %d, active %d\n", cluster_size, active_clusters);
    return 1;
  }
  printf("clusters %d %d\n", cluster_size, active_clusters);

  CUstream stream;
  CU_CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  CU_CHECK(cuLaunchKernel(scale, blocks, 1, 1, 256, 1, 1, 0, stream, nullptr, extra));
  CU_CHECK(cuStreamSynchronize(stream));
  CU_CHECK(cuMemcpyDtoH(got.data(), d_y, n * sizeof(int)));

  for (int i = 0; i < n; ++i) {
    if (got[i] != (a * x[i] + y[i]) * factor) {
      fprintf(stderr, "mismatch at index %d\n", i);
      return 1;
    }
  }

  CU_CHECK(cuStreamDestroy(stream));
  CU_CHECK(cuMemFree(d_x));
  CU_CHECK(cuMemFree(d_y));
  CU_CHECK(cuModuleUnload(module));
  CU_CHECK(cuDevicePrimaryCtxRelease(dev));
  printf("driver_ptx OK %016llx\n", fnv1a(got.data(), n * sizeof(int)));
  return 0;
}
