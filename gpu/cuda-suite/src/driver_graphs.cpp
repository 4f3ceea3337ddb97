// Driver API only (links -lcuda, no runtime): CUDA 13's context creation (cuCtxCreate_v4) and
// the current context, function names, parameter layouts and the block size of best occupancy
// with a shared-memory callback, arrays with 2D and 3D copies between host memory, arrays and
// device memory, a texture object, pool and stream-ordered allocations with pointer
// attributes, a graph of memset, memcpy and kernel nodes (hand-written PTX) with its node
// queries and per-instance kernel parameters, a stream callback, and a tiled tensor map.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <cuda.h>
#include <cudaProfiler.h>

#include "driver_check.h"

#define EXPECT(cond)                                                                 \
  do {                                                                               \
    if (!(cond)) {                                                                   \
      fprintf(stderr, "%s:%d: expectation failed: %s\n", __FILE__, __LINE__, #cond); \
      exit(1);                                                                       \
    }                                                                                \
  } while (0)

// scale_f32(x, a, n): x[i] *= a.  bump_u64(counter): *counter += 1 (one thread).
static const char kPtx[] = R"(
.version 8.0
.target sm_90
.address_size 64

.visible .entry scale_f32(
	.param .u64 scale_f32_x,
	.param .f32 scale_f32_a,
	.param .u32 scale_f32_n
)
{
	.reg .pred %p<2>;
	.reg .b32 %r<6>;
	.reg .f32 %f<4>;
	.reg .b64 %rd<5>;

	ld.param.u64 %rd1, [scale_f32_x];
	ld.param.f32 %f1, [scale_f32_a];
	ld.param.u32 %r1, [scale_f32_n];
	mov.u32 %r2, %ctaid.x;
	mov.u32 %r3, %ntid.x;
	mov.u32 %r4, %tid.x;
	mad.lo.s32 %r5, %r2, %r3, %r4;
	setp.ge.s32 %p1, %r5, %r1;
	@%p1 bra SCALE_DONE;
	cvta.to.global.u64 %rd2, %rd1;
	mul.wide.s32 %rd3, %r5, 4;
	add.s64 %rd4, %rd2, %rd3;
	ld.global.f32 %f2, [%rd4];
	mul.f32 %f3, %f2, %f1;
	st.global.f32 [%rd4], %f3;
SCALE_DONE:
	ret;
}

.visible .entry bump_u64(
	.param .u64 bump_u64_counter
)
{
	.reg .b64 %rd<4>;

	ld.param.u64 %rd1, [bump_u64_counter];
	cvta.to.global.u64 %rd2, %rd1;
	atom.global.add.u64 %rd3, [%rd2], 1;
	ret;
}
)";

// 64-bit FNV-1a, and the result lines of the suite ("label checksum", "NAME OK digest").
static unsigned long long fnv1a(const void* data, size_t n_bytes) {
  const unsigned char* bytes = static_cast<const unsigned char*>(data);
  unsigned long long hash = 1469598103934665603ull;
  for (size_t i = 0; i < n_bytes; ++i) hash = (hash ^ bytes[i]) * 1099511628211ull;
  return hash;
}

static unsigned long long digest = 1469598103934665603ull;
static void line(const char* label, unsigned long long value) {
  printf("%-16s %016llx\n", label, value);
  digest = (digest ^ value) * 1099511628211ull;
}

static size_t smem_of_block(int block_size) { return size_t(block_size) * 8; }

static volatile int callbacks = 0;
static void CUDA_CB on_stream(CUstream, CUresult status, void*) {
  if (status == CUDA_SUCCESS) ++callbacks;
}

int main() {
  CU_CHECK(cuInit(0));
  CUdevice dev;
  CU_CHECK(cuDeviceGet(&dev, 0));
  CUcontext ctx, current;
  CU_CHECK(cuCtxCreate(&ctx, nullptr, 0, dev));
  CU_CHECK(cuCtxGetCurrent(&current));
  EXPECT(current == ctx);
  CU_CHECK(cuProfilerStart());

  CUmodule module;
  CU_CHECK(cuModuleLoadData(&module, kPtx));
  CUfunction scale, bump;
  CU_CHECK(cuModuleGetFunction(&scale, module, "scale_f32"));
  CU_CHECK(cuModuleGetFunction(&bump, module, "bump_u64"));
  const char* name = nullptr;
  CU_CHECK(cuFuncGetName(&name, scale));
  printf("name             %s\n", name);
  for (size_t i = 0; i < 3; ++i) {
    size_t offset = 0, size = 0;
    CU_CHECK(cuFuncGetParamInfo(scale, i, &offset, &size));
    printf("parameter %zu      %zu %zu\n", i, offset, size);
  }
  int min_grid = 0, block = 0;
  CU_CHECK(cuOccupancyMaxPotentialBlockSize(&min_grid, &block, scale, smem_of_block, 0, 0));
  printf("best block       %d grid %d\n", block, min_grid);

  // A 2D array of floats: host rows (at an offset) in, out to pitched device memory, back.
  const int W = 32, H = 16;
  CUDA_ARRAY_DESCRIPTOR ad{};
  ad.Width = W;
  ad.Height = H;
  ad.Format = CU_AD_FORMAT_FLOAT;
  ad.NumChannels = 1;
  CUarray array;
  CU_CHECK(cuArrayCreate(&array, &ad));
  CUDA_ARRAY_DESCRIPTOR got_ad;
  CU_CHECK(cuArrayGetDescriptor(&got_ad, array));
  EXPECT(got_ad.Width == size_t(W) && got_ad.Height == size_t(H) && got_ad.Format == CU_AD_FORMAT_FLOAT);
  std::vector<float> host((W + 4) * H);
  for (size_t i = 0; i < host.size(); ++i) host[i] = float(i % 251) * 0.5f;
  CUDA_MEMCPY2D m{};
  m.srcMemoryType = CU_MEMORYTYPE_HOST;
  m.srcHost = host.data();
  m.srcXInBytes = 4 * sizeof(float);
  m.srcPitch = (W + 4) * sizeof(float);
  m.dstMemoryType = CU_MEMORYTYPE_ARRAY;
  m.dstArray = array;
  m.WidthInBytes = W * sizeof(float);
  m.Height = H;
  CU_CHECK(cuMemcpy2D(&m));
  CUdeviceptr pitched;
  size_t pitch;
  CU_CHECK(cuMemAllocPitch(&pitched, &pitch, W * sizeof(float), H, 4));
  m = CUDA_MEMCPY2D{};
  m.srcMemoryType = CU_MEMORYTYPE_ARRAY;
  m.srcArray = array;
  m.dstMemoryType = CU_MEMORYTYPE_DEVICE;
  m.dstDevice = pitched;
  m.dstPitch = pitch;
  m.WidthInBytes = W * sizeof(float);
  m.Height = H;
  CU_CHECK(cuMemcpy2D(&m));
  std::vector<float> rows(W * H);
  m = CUDA_MEMCPY2D{};
  m.srcMemoryType = CU_MEMORYTYPE_UNIFIED;
  m.srcDevice = pitched;
  m.srcPitch = pitch;
  m.dstMemoryType = CU_MEMORYTYPE_UNIFIED;
  m.dstDevice = reinterpret_cast<CUdeviceptr>(rows.data());
  m.dstPitch = W * sizeof(float);
  m.WidthInBytes = W * sizeof(float);
  m.Height = H;
  CU_CHECK(cuMemcpy2D(&m));
  for (int y = 0; y < H; ++y)
    for (int x = 0; x < W; ++x) EXPECT(rows[y * W + x] == host[y * (W + 4) + x + 4]);
  line("2d array", fnv1a(rows.data(), rows.size() * sizeof(float)));
  std::vector<float> first_row(W);
  CU_CHECK(cuMemcpyAtoH(first_row.data(), array, 0, W * sizeof(float)));
  EXPECT(first_row[0] == rows[0]);

  // A texture object over the array.
  CUDA_RESOURCE_DESC res{}, res_back{};
  res.resType = CU_RESOURCE_TYPE_ARRAY;
  res.res.array.hArray = array;
  CUDA_TEXTURE_DESC tex{};
  tex.addressMode[0] = tex.addressMode[1] = CU_TR_ADDRESS_MODE_CLAMP;
  tex.filterMode = CU_TR_FILTER_MODE_POINT;
  CUtexObject tex_object;
  CU_CHECK(cuTexObjectCreate(&tex_object, &res, &tex, nullptr));
  CU_CHECK(cuTexObjectGetResourceDesc(&res_back, tex_object));
  EXPECT(res_back.resType == CU_RESOURCE_TYPE_ARRAY && res_back.res.array.hArray == array);
  CU_CHECK(cuTexObjectDestroy(tex_object));

  // A 3D array of bytes: a host box in, a smaller box at an offset out.
  CUDA_ARRAY3D_DESCRIPTOR ad3{};
  ad3.Width = 8;
  ad3.Height = 4;
  ad3.Depth = 3;
  ad3.Format = CU_AD_FORMAT_UNSIGNED_INT8;
  ad3.NumChannels = 1;
  CUarray volume;
  CU_CHECK(cuArray3DCreate(&volume, &ad3));
  std::vector<unsigned char> box(8 * 4 * 3), sub(4 * 2 * 2);
  for (size_t i = 0; i < box.size(); ++i) box[i] = (unsigned char)(i * 7 + 3);
  CUDA_MEMCPY3D c3{};
  c3.srcMemoryType = CU_MEMORYTYPE_HOST;
  c3.srcHost = box.data();
  c3.srcPitch = 8;
  c3.srcHeight = 4;
  c3.dstMemoryType = CU_MEMORYTYPE_ARRAY;
  c3.dstArray = volume;
  c3.WidthInBytes = 8;
  c3.Height = 4;
  c3.Depth = 3;
  CU_CHECK(cuMemcpy3D(&c3));
  c3 = CUDA_MEMCPY3D{};
  c3.srcMemoryType = CU_MEMORYTYPE_ARRAY;
  c3.srcArray = volume;
  c3.srcXInBytes = 2;
  c3.srcY = 1;
  c3.srcZ = 1;
  c3.dstMemoryType = CU_MEMORYTYPE_HOST;
  c3.dstHost = sub.data();
  c3.dstPitch = 4;
  c3.dstHeight = 2;
  c3.WidthInBytes = 4;
  c3.Height = 2;
  c3.Depth = 2;
  CU_CHECK(cuMemcpy3D(&c3));
  for (int z = 0; z < 2; ++z)
    for (int y = 0; y < 2; ++y)
      for (int x = 0; x < 4; ++x) EXPECT(sub[(z * 2 + y) * 4 + x] == box[((z + 1) * 4 + y + 1) * 8 + x + 2]);
  line("3d array box", fnv1a(sub.data(), sub.size()));

  // Pool and stream-ordered allocations; pointer attributes.
  CUmemPoolProps props{};
  props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  props.location.id = 0;
  CUmemoryPool pool;
  CU_CHECK(cuMemPoolCreate(&pool, &props));
  CUstream stream;
  CU_CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  CUdeviceptr from_pool, async_alloc;
  CU_CHECK(cuMemAllocFromPoolAsync(&from_pool, 1 << 20, pool, stream));
  CU_CHECK(cuMemAllocAsync(&async_alloc, 4096, stream));
  CUpointer_attribute which[2] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL};
  unsigned int memory_type = 0;
  int ordinal = -1;
  void* data[2] = {&memory_type, &ordinal};
  CU_CHECK(cuPointerGetAttributes(2, which, data, from_pool + 100));
  EXPECT(memory_type == CU_MEMORYTYPE_DEVICE && ordinal == 0);
  CUdeviceptr base;
  size_t size;
  CU_CHECK(cuMemGetAddressRange(&base, &size, async_alloc + 10));
  EXPECT(base == async_alloc && size >= 4096);
  CU_CHECK(cuMemFreeAsync(from_pool, stream));
  CU_CHECK(cuMemFreeAsync(async_alloc, stream));
  CU_CHECK(cuStreamSynchronize(stream));
  CU_CHECK(cuMemPoolDestroy(pool));

  // A graph: y = 0; y = x; y *= a; ++counter.
  const int n = 4096;
  std::vector<float> x(n);
  for (int i = 0; i < n; ++i) x[i] = float(i % 13) - 6.0f;
  CUdeviceptr d_x, d_y, d_counter;
  CU_CHECK(cuMemAlloc(&d_x, n * sizeof(float)));
  CU_CHECK(cuMemAlloc(&d_y, n * sizeof(float)));
  CU_CHECK(cuMemAlloc(&d_counter, sizeof(unsigned long long)));
  CU_CHECK(cuMemsetD8(d_counter, 0, sizeof(unsigned long long)));
  CU_CHECK(cuMemcpyHtoD(d_x, x.data(), n * sizeof(float)));
  CUgraph graph;
  CU_CHECK(cuGraphCreate(&graph, 0));
  CUgraphNode set, copy, scale_node, bump_node;
  CUDA_MEMSET_NODE_PARAMS mp{};
  mp.dst = d_y;
  mp.value = 0;
  mp.elementSize = 4;
  mp.width = n;
  mp.height = 1;
  CU_CHECK(cuGraphAddMemsetNode(&set, graph, nullptr, 0, &mp, ctx));
  CUDA_MEMCPY3D cp{};
  cp.srcMemoryType = CU_MEMORYTYPE_DEVICE;
  cp.srcDevice = d_x;
  cp.dstMemoryType = CU_MEMORYTYPE_DEVICE;
  cp.dstDevice = d_y;
  cp.WidthInBytes = n * sizeof(float);
  cp.Height = 1;
  cp.Depth = 1;
  CU_CHECK(cuGraphAddMemcpyNode(&copy, graph, &set, 1, &cp, ctx));
  float a = 2.0f;
  unsigned int count = n;
  void* scale_args[] = {&d_y, &a, &count};
  CUDA_KERNEL_NODE_PARAMS kp{};
  kp.func = scale;
  kp.gridDimX = (n + 255) / 256;
  kp.gridDimY = kp.gridDimZ = 1;
  kp.blockDimX = 256;
  kp.blockDimY = kp.blockDimZ = 1;
  kp.kernelParams = scale_args;
  CU_CHECK(cuGraphAddKernelNode(&scale_node, graph, &copy, 1, &kp));
  void* bump_args[] = {&d_counter};
  CUDA_KERNEL_NODE_PARAMS bp{};
  bp.func = bump;
  bp.gridDimX = bp.gridDimY = bp.gridDimZ = 1;
  bp.blockDimX = bp.blockDimY = bp.blockDimZ = 1;
  bp.kernelParams = bump_args;
  CU_CHECK(cuGraphAddKernelNode(&bump_node, graph, &scale_node, 1, &bp));
  size_t n_nodes = 0, n_edges = 0;
  CU_CHECK(cuGraphGetNodes(graph, nullptr, &n_nodes));
  CU_CHECK(cuGraphGetEdges(graph, nullptr, nullptr, nullptr, &n_edges));
  printf("nodes %zu edges %zu\n", n_nodes, n_edges);
  CUgraphNode deps[2];
  size_t n_deps = 2;
  CU_CHECK(cuGraphNodeGetDependencies(scale_node, deps, nullptr, &n_deps));
  EXPECT(n_deps == 1 && deps[0] == copy);
  CUgraphExec exec;
  CU_CHECK(cuGraphInstantiate(&exec, graph, 0));
  CU_CHECK(cuGraphLaunch(exec, stream));
  CU_CHECK(cuGraphLaunch(exec, stream));
  CU_CHECK(cuStreamAddCallback(stream, on_stream, nullptr, 0));
  CU_CHECK(cuStreamSynchronize(stream));
  EXPECT(callbacks == 1);
  std::vector<float> y(n);
  CU_CHECK(cuMemcpyDtoH(y.data(), d_y, n * sizeof(float)));
  for (int i = 0; i < n; ++i) EXPECT(y[i] == x[i] * 2.0f);
  line("graph x2", fnv1a(y.data(), y.size() * sizeof(float)));
  a = 4.0f;
  CU_CHECK(cuGraphExecKernelNodeSetParams(exec, scale_node, &kp));
  CU_CHECK(cuGraphLaunch(exec, stream));
  CU_CHECK(cuStreamSynchronize(stream));
  CU_CHECK(cuMemcpyDtoH(y.data(), d_y, n * sizeof(float)));
  for (int i = 0; i < n; ++i) EXPECT(y[i] == x[i] * 4.0f);
  line("graph exec x4", fnv1a(y.data(), y.size() * sizeof(float)));
  CUDA_KERNEL_NODE_PARAMS got{};
  CU_CHECK(cuGraphKernelNodeGetParams(scale_node, &got));
  EXPECT(got.func == scale && got.blockDimX == 256 && *static_cast<float*>(got.kernelParams[1]) == 2.0f);
  unsigned long long replays = 0;
  CU_CHECK(cuMemcpyDtoH(&replays, d_counter, sizeof replays));
  printf("replays          %llu\n", replays);

  // The JIT linker: the PTX linked into a cubin, loaded, and its bump kernel launched once.
  char info_log[4096] = {0}, error_log[4096] = {0};
  CUjit_option keys[4] = {CU_JIT_INFO_LOG_BUFFER, CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES, CU_JIT_ERROR_LOG_BUFFER,
                          CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
  void* values[4] = {info_log, reinterpret_cast<void*>(sizeof info_log), error_log,
                     reinterpret_cast<void*>(sizeof error_log)};
  CUlinkState link;
  CU_CHECK(cuLinkCreate(4, keys, values, &link));
  CU_CHECK(cuLinkAddData(link, CU_JIT_INPUT_PTX, const_cast<char*>(kPtx), sizeof kPtx, "kernels.ptx", 0, nullptr,
                         nullptr));
  void* cubin = nullptr;
  size_t cubin_size = 0;
  CU_CHECK(cuLinkComplete(link, &cubin, &cubin_size));
  EXPECT(cubin != nullptr && cubin_size > 0 && memcmp(cubin, "\x7f" "ELF", 4) == 0);
  CUmodule linked;
  CU_CHECK(cuModuleLoadData(&linked, cubin));
  CU_CHECK(cuLinkDestroy(link));
  CUfunction linked_bump;
  CU_CHECK(cuModuleGetFunction(&linked_bump, linked, "bump_u64"));
  CU_CHECK(cuLaunchKernel(linked_bump, 1, 1, 1, 1, 1, 1, 0, stream, bump_args, nullptr));
  CU_CHECK(cuStreamSynchronize(stream));
  CU_CHECK(cuMemcpyDtoH(&replays, d_counter, sizeof replays));
  printf("after linked     %llu\n", replays);

  // Batch memory operation nodes: one writes a flag and a counter, the next waits on the
  // flag, a kernel node bumps the counter; the instance's first node set to another value.
  CUdeviceptr d_words;
  CU_CHECK(cuMemAlloc(&d_words, 16));
  CU_CHECK(cuMemsetD8(d_words, 0, 16));
  CUstreamBatchMemOpParams writes[2], waits[1];
  memset(writes, 0, sizeof writes);
  memset(waits, 0, sizeof waits);
  writes[0].writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_32;
  writes[0].writeValue.address = d_words;
  writes[0].writeValue.value = 1;
  writes[1].writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_64;
  writes[1].writeValue.address = d_words + 8;
  writes[1].writeValue.value64 = 40;
  waits[0].waitValue.operation = CU_STREAM_MEM_OP_WAIT_VALUE_32;
  waits[0].waitValue.address = d_words;
  waits[0].waitValue.value = 1;
  waits[0].waitValue.flags = CU_STREAM_WAIT_VALUE_GEQ;
  CUDA_BATCH_MEM_OP_NODE_PARAMS wp{}, vp{}, back{};
  wp.ctx = vp.ctx = ctx;
  wp.count = 2;
  wp.paramArray = writes;
  vp.count = 1;
  vp.paramArray = waits;
  CUgraph ops_graph;
  CUgraphNode write_node, wait_node, counter_node;
  CU_CHECK(cuGraphCreate(&ops_graph, 0));
  CU_CHECK(cuGraphAddBatchMemOpNode(&write_node, ops_graph, nullptr, 0, &wp));
  CU_CHECK(cuGraphAddBatchMemOpNode(&wait_node, ops_graph, &write_node, 1, &vp));
  CUdeviceptr d_op_counter = d_words + 8;
  void* counter_args[] = {&d_op_counter};
  CUDA_KERNEL_NODE_PARAMS cp2 = bp;
  cp2.kernelParams = counter_args;
  CU_CHECK(cuGraphAddKernelNode(&counter_node, ops_graph, &wait_node, 1, &cp2));
  CU_CHECK(cuGraphBatchMemOpNodeGetParams(write_node, &back));
  EXPECT(back.count == 2 && back.paramArray[1].writeValue.value64 == 40);
  CUgraphNodeType op_type;
  CU_CHECK(cuGraphNodeGetType(wait_node, &op_type));
  EXPECT(op_type == CU_GRAPH_NODE_TYPE_BATCH_MEM_OP);
  CUgraphExec ops_exec;
  CU_CHECK(cuGraphInstantiate(&ops_exec, ops_graph, 0));
  CU_CHECK(cuGraphLaunch(ops_exec, stream));
  CU_CHECK(cuGraphLaunch(ops_exec, stream));
  CU_CHECK(cuStreamSynchronize(stream));
  unsigned long long words[2] = {0, 0};
  CU_CHECK(cuMemcpyDtoH(words, d_words, sizeof words));
  EXPECT(words[1] == 41);
  writes[1].writeValue.value64 = 100;
  CU_CHECK(cuGraphExecBatchMemOpNodeSetParams(ops_exec, write_node, &wp));
  CU_CHECK(cuGraphLaunch(ops_exec, stream));
  CU_CHECK(cuStreamSynchronize(stream));
  CU_CHECK(cuMemcpyDtoH(words, d_words, sizeof words));
  EXPECT(words[1] == 101);
  line("memory ops", words[0] ^ (words[1] << 32));
  CU_CHECK(cuGraphExecDestroy(ops_exec));
  CU_CHECK(cuGraphDestroy(ops_graph));
  CU_CHECK(cuMemFree(d_words));

  // A tiled tensor map over a 64 x 32 float tensor: 1 stride for rank 2.
  CUtensorMap map;
  cuuint64_t dims[2] = {64, 32};
  cuuint64_t strides[1] = {64 * sizeof(float)};
  cuuint32_t box_dims[2] = {16, 8};
  cuuint32_t element_strides[2] = {1, 1};
  CUdeviceptr tensor;
  CU_CHECK(cuMemAlloc(&tensor, 64 * 32 * sizeof(float)));
  CU_CHECK(cuTensorMapEncodeTiled(&map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, reinterpret_cast<void*>(tensor), dims,
                                  strides, box_dims, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                  CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_NONE,
                                  CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE));
  printf("tensor map       encoded\n");

  CU_CHECK(cuGraphExecDestroy(exec));
  CU_CHECK(cuGraphDestroy(graph));
  for (CUdeviceptr p : {d_x, d_y, d_counter, tensor, pitched}) CU_CHECK(cuMemFree(p));
  CU_CHECK(cuArrayDestroy(array));
  CU_CHECK(cuArrayDestroy(volume));
  CU_CHECK(cuStreamDestroy(stream));
  CU_CHECK(cuProfilerStop());
  CU_CHECK(cuCtxDestroy(ctx));
  printf("driver_graphs OK %016llx\n", digest);
  return 0;
}
