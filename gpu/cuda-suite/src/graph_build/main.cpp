// A CUDA graph built call by call: memset, 1D memcpy and kernel nodes (the kernel's host stub
// and an argument array per node), a child graph, a host node, dependencies; node and edge
// queries; replays; per-instance kernel parameters (cudaGraphExecKernelNodeSetParams); the
// graph's own parameters taken by cudaGraphExecUpdate; cudaGraphAddNode with a kernel and with
// a conditional IF node whose body is filled afterwards; a memory allocation node; an edge
// added and removed; capture information with dependencies. Host code only: the kernels are
// in kernels.cu.
#include "common.h"
#include "graph_build/kernels.h"

static int host_runs = 0;
static void count_host_run(void* user) { ++*static_cast<int*>(user); }

static cudaKernelNodeParams kernel_params(const void* func, int n, void** args) {
  cudaKernelNodeParams p{};
  p.func = const_cast<void*>(func);
  p.gridDim = dim3(blocks_for(n, 256));
  p.blockDim = dim3(256);
  p.kernelParams = args;
  return p;
}

int main() {
  Report report;
  const int n = 1 << 16;
  std::vector<float> x(n);
  for (int i = 0; i < n; ++i) x[i] = float(i % 97) - 40.0f;
  float *d_x, *d_copy, *d_y;
  unsigned long long* d_counter;
  CHECK(cudaMalloc(&d_x, n * sizeof(float)));
  CHECK(cudaMalloc(&d_copy, n * sizeof(float)));
  CHECK(cudaMalloc(&d_y, n * sizeof(float)));
  CHECK(cudaMalloc(&d_counter, sizeof(unsigned long long)));
  CHECK(cudaMemset(d_counter, 0, sizeof(unsigned long long)));
  CHECK(cudaMemcpy(d_x, x.data(), n * sizeof(float), cudaMemcpyHostToDevice));

  // y = 0; copy = x; copy *= a; y += copy; then a child graph counts the replay on the GPU and a
  // host node counts it on the host.
  cudaGraph_t graph, child;
  CHECK(cudaGraphCreate(&graph, 0));
  cudaGraphNode_t set, copy, scale_node, add_node, child_node, host_node;
  cudaMemsetParams mp{};
  mp.dst = d_y;
  mp.value = 0;
  mp.elementSize = 4;
  mp.width = n;
  mp.height = 1;
  CHECK(cudaGraphAddMemsetNode(&set, graph, nullptr, 0, &mp));
  CHECK(cudaGraphAddMemcpyNode1D(&copy, graph, nullptr, 0, d_copy, d_x, n * sizeof(float), cudaMemcpyDeviceToDevice));
  float a = 2.0f;
  int count = n;
  void* scale_args[] = {&d_copy, &a, &count};
  cudaKernelNodeParams scale_params = kernel_params(scale_kernel(), n, scale_args);
  CHECK(cudaGraphAddKernelNode(&scale_node, graph, &copy, 1, &scale_params));
  void* add_args[] = {&d_y, &d_copy, &count};
  cudaKernelNodeParams add_params = kernel_params(add_kernel(), n, add_args);
  cudaGraphNode_t add_deps[] = {set, scale_node};
  CHECK(cudaGraphAddKernelNode(&add_node, graph, add_deps, 2, &add_params));
  CHECK(cudaGraphCreate(&child, 0));
  cudaGraphNode_t bump_node;
  void* bump_args[] = {&d_counter};
  cudaKernelNodeParams bump_params = kernel_params(bump_kernel(), 1, bump_args);
  CHECK(cudaGraphAddKernelNode(&bump_node, child, nullptr, 0, &bump_params));
  CHECK(cudaGraphAddChildGraphNode(&child_node, graph, &add_node, 1, child));
  cudaHostNodeParams hp{count_host_run, &host_runs};
  CHECK(cudaGraphAddHostNode(&host_node, graph, &child_node, 1, &hp));

  // What the graph holds.
  size_t n_nodes = 0, n_roots = 0, n_edges = 0;
  CHECK(cudaGraphGetNodes(graph, nullptr, &n_nodes));
  CHECK(cudaGraphGetRootNodes(graph, nullptr, &n_roots));
  CHECK(cudaGraphGetEdges(graph, nullptr, nullptr, nullptr, &n_edges));
  printf("nodes %zu roots %zu edges %zu\n", n_nodes, n_roots, n_edges);
  // An edge added and taken away again (edge data NULL: the default edge), statuses printed.
  cudaError_t added = cudaGraphAddDependencies(graph, &set, &host_node, nullptr, 1);
  size_t with_edge = 0, without = 0;
  CHECK(cudaGraphGetEdges(graph, nullptr, nullptr, nullptr, &with_edge));
  cudaError_t removed = cudaGraphRemoveDependencies(graph, &set, &host_node, nullptr, 1);
  CHECK(cudaGraphGetEdges(graph, nullptr, nullptr, nullptr, &without));
  printf("edge added %d (%zu edges), removed %d (%zu edges)\n", int(added), with_edge, int(removed), without);
  cudaGetLastError();
  std::vector<cudaGraphNode_t> nodes(n_nodes);
  CHECK(cudaGraphGetNodes(graph, nodes.data(), &n_nodes));
  int kernels = 0;
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType type;
    CHECK(cudaGraphNodeGetType(node, &type));
    kernels += type == cudaGraphNodeTypeKernel;
  }
  printf("kernel nodes     %d\n", kernels);
  cudaGraphNode_t deps[4];
  size_t n_deps = 4;
  CHECK(cudaGraphNodeGetDependencies(add_node, deps, nullptr, &n_deps));
  EXPECT(n_deps == 2 && ((deps[0] == set && deps[1] == scale_node) || (deps[0] == scale_node && deps[1] == set)));
  cudaKernelNodeParams got{};
  CHECK(cudaGraphKernelNodeGetParams(scale_node, &got));
  EXPECT(got.func == scale_kernel() && got.gridDim.x == unsigned(blocks_for(n, 256)) && got.blockDim.x == 256);
  EXPECT(*static_cast<float*>(got.kernelParams[1]) == 2.0f);

  cudaStream_t stream;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraphExec_t exec;
  CHECK(cudaGraphInstantiate(&exec, graph, 0));
  std::vector<float> y(n), want(n);
  auto check_y = [&](const char* label, float factor) {
    CHECK(cudaMemcpy(y.data(), d_y, n * sizeof(float), cudaMemcpyDeviceToHost));
    for (int i = 0; i < n; ++i) want[i] = x[i] * factor;
    expect_equal(label, y, want);
    report.line(label, checksum(y));
  };
  for (int r = 0; r < 3; ++r) CHECK(cudaGraphLaunch(exec, stream));
  CHECK(cudaStreamSynchronize(stream));
  check_y("replay x2", 2.0f);

  // One instance's kernel parameters; the graph keeps its own.
  a = 3.0f;
  CHECK(cudaGraphExecKernelNodeSetParams(exec, scale_node, &scale_params));
  CHECK(cudaGraphLaunch(exec, stream));
  CHECK(cudaStreamSynchronize(stream));
  check_y("exec set x3", 3.0f);
  CHECK(cudaGraphKernelNodeGetParams(scale_node, &got));
  EXPECT(*static_cast<float*>(got.kernelParams[1]) == 2.0f);

  // The graph's new parameters, into the instance by cudaGraphExecUpdate.
  a = 5.0f;
  CHECK(cudaGraphKernelNodeSetParams(scale_node, &scale_params));
  cudaGraphExecUpdateResultInfo info;
  CHECK(cudaGraphExecUpdate(exec, graph, &info));
  EXPECT(info.result == cudaGraphExecUpdateSuccess);
  CHECK(cudaGraphLaunch(exec, stream));
  CHECK(cudaStreamSynchronize(stream));
  check_y("exec update x5", 5.0f);
  unsigned long long replays = 0;
  CHECK(cudaMemcpy(&replays, d_counter, sizeof replays, cudaMemcpyDeviceToHost));
  printf("replays gpu %llu host %d\n", replays, host_runs);
  EXPECT(replays == 5 && host_runs == 5);

  // cudaGraphAddNode: a kernel node, and a conditional IF node (its condition defaults to 1
  // at every launch) whose body graph gets a kernel node afterwards.
  cudaGraph_t g2;
  CHECK(cudaGraphCreate(&g2, 0));
  cudaGraphNodeParams kp{};
  kp.type = cudaGraphNodeTypeKernel;
  kp.kernel.func = const_cast<void*>(bump_kernel());
  kp.kernel.gridDim = dim3(1);
  kp.kernel.blockDim = dim3(1);
  kp.kernel.kernelParams = bump_args;
  cudaGraphNode_t k2;
  CHECK(cudaGraphAddNode(&k2, g2, nullptr, nullptr, 0, &kp));
  cudaGraphConditionalHandle handle;
  CHECK(cudaGraphConditionalHandleCreate(&handle, g2, 1, cudaGraphCondAssignDefault));
  cudaGraphNodeParams cp{};
  cp.type = cudaGraphNodeTypeConditional;
  cp.conditional.handle = handle;
  cp.conditional.type = cudaGraphCondTypeIf;
  cp.conditional.size = 1;
  cudaGraphNode_t cond;
  CHECK(cudaGraphAddNode(&cond, g2, &k2, nullptr, 1, &cp));
  cudaGraph_t body = cp.conditional.phGraph_out[0];
  cudaGraphNode_t in_body;
  CHECK(cudaGraphAddKernelNode(&in_body, body, nullptr, 0, &bump_params));
  cudaGraphExec_t exec2;
  CHECK(cudaGraphInstantiate(&exec2, g2, 0));
  CHECK(cudaGraphLaunch(exec2, stream));
  CHECK(cudaGraphLaunch(exec2, stream));
  CHECK(cudaStreamSynchronize(stream));
  CHECK(cudaMemcpy(&replays, d_counter, sizeof replays, cudaMemcpyDeviceToHost));
  printf("after conditional %llu\n", replays);
  EXPECT(replays == 5 + 2 * 2);

  // A memory allocation node, a kernel filling the allocation, a copy out and the free node.
  cudaGraph_t g3;
  CHECK(cudaGraphCreate(&g3, 0));
  cudaMemAllocNodeParams ap{};
  ap.poolProps.allocType = cudaMemAllocationTypePinned;
  ap.poolProps.location.type = cudaMemLocationTypeDevice;
  ap.poolProps.location.id = 0;
  ap.bytesize = n * sizeof(int);
  cudaGraphNode_t alloc_node, fill_node, out_node, free_node;
  CHECK(cudaGraphAddMemAllocNode(&alloc_node, g3, nullptr, 0, &ap));
  EXPECT(ap.dptr != nullptr);
  int* scratch = static_cast<int*>(ap.dptr);
  int base = 1000;
  void* fill_args[] = {&scratch, &base, &count};
  cudaKernelNodeParams fill_params = kernel_params(fill_kernel(), n, fill_args);
  CHECK(cudaGraphAddKernelNode(&fill_node, g3, &alloc_node, 1, &fill_params));
  int* d_ints;
  CHECK(cudaMalloc(&d_ints, n * sizeof(int)));
  CHECK(cudaGraphAddMemcpyNode1D(&out_node, g3, &fill_node, 1, d_ints, scratch, n * sizeof(int), cudaMemcpyDefault));
  CHECK(cudaGraphAddMemFreeNode(&free_node, g3, &out_node, 1, scratch));
  cudaGraphExec_t exec3;
  CHECK(cudaGraphInstantiate(&exec3, g3, 0));
  CHECK(cudaGraphLaunch(exec3, stream));
  CHECK(cudaStreamSynchronize(stream));
  std::vector<int> ints(n), want_ints(n);
  CHECK(cudaMemcpy(ints.data(), d_ints, n * sizeof(int), cudaMemcpyDeviceToHost));
  for (int i = 0; i < n; ++i) want_ints[i] = 1000 + i;
  expect_equal("allocation node", ints, want_ints);
  report.line("alloc node", checksum(ints));

  // Capture: the frontier after a kernel is that kernel's node.
  cudaGraph_t captured;
  CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  CHECK(cudaLaunchKernel(bump_kernel(), dim3(1), dim3(1), bump_args, 0, stream));
  cudaStreamCaptureStatus status;
  unsigned long long capture_id;
  cudaGraph_t capturing;
  const cudaGraphNode_t* frontier;
  const cudaGraphEdgeData* edges;
  size_t n_frontier = 0;
  CHECK(cudaStreamGetCaptureInfo(stream, &status, &capture_id, &capturing, &frontier, &edges, &n_frontier));
  EXPECT(status == cudaStreamCaptureStatusActive && n_frontier == 1);
  cudaGraphNodeType frontier_type;
  CHECK(cudaGraphNodeGetType(frontier[0], &frontier_type));
  EXPECT(frontier_type == cudaGraphNodeTypeKernel);
  CHECK(cudaStreamEndCapture(stream, &captured));
  EXPECT(captured == capturing);
  printf("capture frontier %zu\n", n_frontier);

  for (cudaGraphExec_t e : {exec, exec2, exec3}) CHECK(cudaGraphExecDestroy(e));
  for (cudaGraph_t g : {graph, child, g2, g3, captured}) CHECK(cudaGraphDestroy(g));
  for (void* ptr : {(void*)d_x, (void*)d_copy, (void*)d_y, (void*)d_counter, (void*)d_ints}) CHECK(cudaFree(ptr));
  CHECK(cudaStreamDestroy(stream));
  report.done("graph_build");
  return 0;
}
