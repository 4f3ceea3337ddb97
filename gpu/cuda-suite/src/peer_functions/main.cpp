// Peer copies on one device (cudaMemcpyPeer, cudaMemcpyPeerAsync, cudaMemcpy3DPeer), stream
// attributes (priority and an access policy window set and read back), and the runtime's
// questions about functions: name, parameter layout, the function handle, attributes,
// occupancy and the block size of best occupancy (cudaOccupancyMaxPotentialBlockSize and its
// variable shared memory form, header templates over the C API), dynamic shared memory
// available per block; profiler start and stop. Host code only: the kernels are in kernels.cu.
#include <cuda_profiler_api.h>

#include "common.h"
#include "peer_functions/kernels.h"

static size_t smem_for_block(int block_size) { return size_t(block_size) * sizeof(float); }

int main() {
  Report report;
  CHECK(cudaProfilerStart());
  int can = -1;
  CHECK(cudaDeviceCanAccessPeer(&can, 0, 0));
  printf("peer access 0->0 %d\n", can);

  // Peer copies inside device 0.
  const int n = 100000;
  std::vector<int> v(n), back(n);
  for (int i = 0; i < n; ++i) v[i] = i * 3 - 17;
  int *a, *b;
  CHECK(cudaMalloc(&a, n * sizeof(int)));
  CHECK(cudaMalloc(&b, n * sizeof(int)));
  CHECK(cudaMemcpy(a, v.data(), n * sizeof(int), cudaMemcpyHostToDevice));
  CHECK(cudaMemcpyPeer(b, 0, a, 0, n * sizeof(int)));
  CHECK(cudaMemcpy(back.data(), b, n * sizeof(int), cudaMemcpyDeviceToHost));
  expect_equal("peer copy", back, v);
  cudaStream_t stream;
  CHECK(cudaStreamCreateWithPriority(&stream, cudaStreamNonBlocking, 0));
  CHECK(cudaMemsetAsync(b, 0, n * sizeof(int), stream));
  CHECK(cudaMemcpyPeerAsync(b, 0, a, 0, n / 2 * sizeof(int), stream));
  CHECK(cudaStreamSynchronize(stream));
  CHECK(cudaMemcpy(back.data(), b, n * sizeof(int), cudaMemcpyDeviceToHost));
  for (int i = 0; i < n; ++i) EXPECT(back[i] == (i < n / 2 ? v[i] : 0));
  report.line("peer async", checksum(back));
  cudaPitchedPtr pa, pb;
  cudaExtent extent = make_cudaExtent(64, 8, 4);
  CHECK(cudaMalloc3D(&pa, extent));
  CHECK(cudaMalloc3D(&pb, extent));
  CHECK(cudaMemset3D(pa, 0x42, extent));
  CHECK(cudaMemset3D(pb, 0, extent));
  cudaMemcpy3DPeerParms pp{};
  pp.srcPtr = pa;
  pp.srcDevice = 0;
  pp.dstPtr = pb;
  pp.dstDevice = 0;
  pp.extent = make_cudaExtent(32, 8, 2);
  CHECK(cudaMemcpy3DPeer(&pp));
  std::vector<unsigned char> box(64 * 8 * 4);
  cudaMemcpy3DParms out{};
  out.srcPtr = pb;
  out.dstPtr = make_cudaPitchedPtr(box.data(), 64, 64, 8);
  out.extent = extent;
  out.kind = cudaMemcpyDeviceToHost;
  CHECK(cudaMemcpy3D(&out));
  for (int z = 0; z < 4; ++z)
    for (int y = 0; y < 8; ++y)
      for (int x = 0; x < 64; ++x) EXPECT(box[(z * 8 + y) * 64 + x] == (z < 2 && x < 32 ? 0x42 : 0));
  report.line("3d peer", checksum(box));

  // Stream attributes.
  cudaLaunchAttributeValue value{}, got{};
  value.priority = -1;
  CHECK(cudaStreamSetAttribute(stream, cudaLaunchAttributePriority, &value));
  CHECK(cudaStreamGetAttribute(stream, cudaLaunchAttributePriority, &got));
  int priority = 0;
  CHECK(cudaStreamGetPriority(stream, &priority));
  printf("stream priority  %d %d\n", got.priority, priority);
  value = cudaLaunchAttributeValue{};
  value.accessPolicyWindow.base_ptr = a;
  value.accessPolicyWindow.num_bytes = 4096;
  value.accessPolicyWindow.hitRatio = 0.5f;
  value.accessPolicyWindow.hitProp = cudaAccessPropertyPersisting;
  value.accessPolicyWindow.missProp = cudaAccessPropertyStreaming;
  CHECK(cudaStreamSetAttribute(stream, cudaLaunchAttributeAccessPolicyWindow, &value));
  CHECK(cudaStreamGetAttribute(stream, cudaLaunchAttributeAccessPolicyWindow, &got));
  EXPECT(got.accessPolicyWindow.base_ptr == a && got.accessPolicyWindow.num_bytes == 4096);
  printf("access window    %d %d\n", int(got.accessPolicyWindow.hitProp), int(got.accessPolicyWindow.missProp));

  // Functions: name, parameters, handle, attributes, occupancy.
  const char* name = nullptr;
  CHECK(cudaFuncGetName(&name, saxpy_kernel()));
  printf("name             %s\n", name);
  for (size_t i = 0;; ++i) {
    size_t offset = 0, size = 0;
    cudaError_t e = cudaFuncGetParamInfo(saxpy_kernel(), i, &offset, &size);
    if (e != cudaSuccess) {
      EXPECT(e == cudaErrorInvalidValue && i == 5);
      cudaGetLastError();
      break;
    }
    printf("parameter %zu     %zu %zu\n", i, offset, size);
  }
  cudaFunction_t function = nullptr;
  CHECK(cudaGetFuncBySymbol(&function, saxpy_kernel()));
  EXPECT(function != nullptr);
  cudaFuncAttributes attributes;
  CHECK(cudaFuncGetAttributes(&attributes, tiled_kernel()));
  printf("max threads      %d\n", attributes.maxThreadsPerBlock);
  int min_grid = 0, block = 0;
  CHECK(cudaOccupancyMaxPotentialBlockSize(&min_grid, &block, saxpy_kernel(), 0, 0));
  printf("best block       %d grid %d\n", block, min_grid);
  CHECK(cudaOccupancyMaxPotentialBlockSizeVariableSMem(&min_grid, &block, tiled_kernel(), smem_for_block, 0));
  printf("best tiled block %d grid %d\n", block, min_grid);
  size_t available = 0;
  CHECK(cudaOccupancyAvailableDynamicSMemPerBlock(&available, tiled_kernel(), 2, 256));
  printf("smem for 2x256   %d\n", available > 0);
  CHECK(cudaFuncSetSharedMemConfig(tiled_kernel(), cudaSharedMemBankSizeDefault));
  CHECK(cudaProfilerStop());

  for (void* ptr : {(void*)a, (void*)b, pa.ptr, pb.ptr}) CHECK(cudaFree(ptr));
  CHECK(cudaStreamDestroy(stream));
  report.done("peer_functions");
  return 0;
}
