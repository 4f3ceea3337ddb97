// Graphs that copy the program's own memory, as NVIDIA's simpleCudaGraphs, jacobiCudaGraphs and
// conjugateGradientCudaGraphs do: a graph built call by call whose memcpy nodes read pinned and
// pageable (malloc'ed) input and write a stack variable that a host node then reads; the same
// reduction captured from a stream (cudaMemcpyAsync with cudaMemcpyDefault from pinned memory,
// into a stack variable, then cudaLaunchHostFunc), instantiated, cloned and replayed; the input
// changed between replays (each launch copies it as it is then); a 2D copy of pageable rows on a
// capturing stream. Sums are of small integers in double, so they are exact.
#include "common.h"

constexpr int kThreads = 256;
constexpr int kBlocks = 128;
constexpr int kReplays = 3;

// Block sums of `in` (a grid-stride loop) into `partial`, then their sum into `result`.
__global__ void reduce(const float* in, double* partial, int n) {
  __shared__ double cache[kThreads];
  double sum = 0;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) sum += in[i];
  cache[threadIdx.x] = sum;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) cache[threadIdx.x] += cache[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) partial[blockIdx.x] = cache[0];
}

__global__ void reduce_final(const double* partial, double* result, int blocks) {
  if (threadIdx.x == 0 && blockIdx.x == 0) {
    double sum = 0;
    for (int b = 0; b < blocks; ++b) sum += partial[b];
    *result = sum;
  }
}

struct Seen {
  const double* result;  // the stack variable the D2H copy writes
  std::vector<double> values;
};

void CUDART_CB record(void* user) {
  Seen& seen = *static_cast<Seen*>(user);
  seen.values.push_back(*seen.result);
}

double host_sum(const float* v, int n) {
  double s = 0;
  for (int i = 0; i < n; ++i) s += v[i];
  return s;
}

static cudaPitchedPtr pitched(void* p, size_t bytes) { return make_cudaPitchedPtr(p, bytes, bytes, 1); }

// Call by call: in from `input` (pinned, 1D node) or from `pageable` (3D node), the reduction,
// out into a stack variable, a host node reading it. Returns what the host node saw.
std::vector<double> built(float* input, bool pinned_input, float* d_in, double* d_partial, double* d_result,
                          int n, cudaStream_t s, float* change) {
  double result = 0;
  Seen seen{&result, {}};
  cudaGraph_t g;
  CHECK(cudaGraphCreate(&g, 0));
  cudaGraphNode_t in, zero, k1, k2, out, host;
  if (pinned_input) {
    CHECK(cudaGraphAddMemcpyNode1D(&in, g, nullptr, 0, d_in, input, n * sizeof(float), cudaMemcpyHostToDevice));
  } else {
    cudaMemcpy3DParms p = {};
    p.srcPtr = pitched(input, n * sizeof(float));
    p.dstPtr = pitched(d_in, n * sizeof(float));
    p.extent = make_cudaExtent(n * sizeof(float), 1, 1);
    p.kind = cudaMemcpyHostToDevice;
    CHECK(cudaGraphAddMemcpyNode(&in, g, nullptr, 0, &p));
  }
  cudaMemsetParams m = {};
  m.dst = d_partial;
  m.elementSize = 4;
  m.width = kBlocks * 2;
  m.height = 1;
  CHECK(cudaGraphAddMemsetNode(&zero, g, nullptr, 0, &m));
  int count = n, blocks = kBlocks;
  void* a1[] = {&d_in, &d_partial, &count};
  cudaKernelNodeParams kp = {};
  kp.func = (void*)reduce;
  kp.gridDim = dim3(kBlocks);
  kp.blockDim = dim3(kThreads);
  kp.kernelParams = a1;
  cudaGraphNode_t deps[] = {in, zero};
  CHECK(cudaGraphAddKernelNode(&k1, g, deps, 2, &kp));
  void* a2[] = {&d_partial, &d_result, &blocks};
  kp.func = (void*)reduce_final;
  kp.gridDim = dim3(1);
  kp.blockDim = dim3(1);
  kp.kernelParams = a2;
  CHECK(cudaGraphAddKernelNode(&k2, g, &k1, 1, &kp));
  cudaMemcpy3DParms back = {};
  back.srcPtr = pitched(d_result, sizeof(double));
  back.dstPtr = pitched(&result, sizeof(double));
  back.extent = make_cudaExtent(sizeof(double), 1, 1);
  back.kind = cudaMemcpyDeviceToHost;
  CHECK(cudaGraphAddMemcpyNode(&out, g, &k2, 1, &back));
  cudaHostNodeParams hp = {record, &seen};
  CHECK(cudaGraphAddHostNode(&host, g, &out, 1, &hp));

  cudaGraphExec_t x, cx;
  cudaGraph_t clone;
  CHECK(cudaGraphInstantiate(&x, g, 0));
  CHECK(cudaGraphClone(&clone, g));
  CHECK(cudaGraphInstantiate(&cx, clone, 0));
  for (int r = 0; r < kReplays; ++r) CHECK(cudaGraphLaunch(x, s));
  CHECK(cudaStreamSynchronize(s));
  EXPECT(result == host_sum(input, n));
  *change += 1000.0f;  // the next launch copies the input as it is now
  CHECK(cudaGraphLaunch(cx, s));
  CHECK(cudaStreamSynchronize(s));
  EXPECT(result == host_sum(input, n));
  seen.values.push_back(result);
  CHECK(cudaGraphExecDestroy(x));
  CHECK(cudaGraphExecDestroy(cx));
  CHECK(cudaGraphDestroy(clone));
  CHECK(cudaGraphDestroy(g));
  return seen.values;
}

// Captured: fork and join through two side streams, the copies with cudaMemcpyDefault.
std::vector<double> captured(float* input, float* d_in, double* d_partial, double* d_result, int n,
                             cudaStream_t s) {
  cudaStream_t side1, side2;
  cudaEvent_t fork, done1, done2;
  CHECK(cudaStreamCreateWithFlags(&side1, cudaStreamNonBlocking));
  CHECK(cudaStreamCreateWithFlags(&side2, cudaStreamNonBlocking));
  for (cudaEvent_t* e : {&fork, &done1, &done2}) CHECK(cudaEventCreateWithFlags(e, cudaEventDisableTiming));
  double result = 0;
  Seen seen{&result, {}};
  cudaGraph_t g;
  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  CHECK(cudaEventRecord(fork, s));
  CHECK(cudaStreamWaitEvent(side1, fork, 0));
  CHECK(cudaStreamWaitEvent(side2, fork, 0));
  CHECK(cudaMemcpyAsync(d_in, input, n * sizeof(float), cudaMemcpyDefault, s));
  CHECK(cudaMemsetAsync(d_partial, 0, kBlocks * sizeof(double), side1));
  CHECK(cudaEventRecord(done1, side1));
  CHECK(cudaMemsetAsync(d_result, 0, sizeof(double), side2));
  CHECK(cudaEventRecord(done2, side2));
  CHECK(cudaStreamWaitEvent(s, done1, 0));
  reduce<<<kBlocks, kThreads, 0, s>>>(d_in, d_partial, n);
  CHECK_LAUNCH();
  CHECK(cudaStreamWaitEvent(s, done2, 0));
  reduce_final<<<1, 1, 0, s>>>(d_partial, d_result, kBlocks);
  CHECK_LAUNCH();
  CHECK(cudaMemcpyAsync(&result, d_result, sizeof(double), cudaMemcpyDefault, s));
  CHECK(cudaLaunchHostFunc(s, record, &seen));
  CHECK(cudaStreamEndCapture(s, &g));
  EXPECT(result == 0 && seen.values.empty());  // nothing ran while capturing
  cudaGraphExec_t x;
  CHECK(cudaGraphInstantiate(&x, g, 0));
  for (int r = 0; r < kReplays; ++r) CHECK(cudaGraphLaunch(x, s));
  CHECK(cudaStreamSynchronize(s));
  EXPECT(result == host_sum(input, n));
  input[n - 1] = -7.0f;
  CHECK(cudaGraphLaunch(x, s));
  CHECK(cudaStreamSynchronize(s));
  EXPECT(result == host_sum(input, n));
  seen.values.push_back(result);
  CHECK(cudaGraphExecDestroy(x));
  CHECK(cudaGraphDestroy(g));
  for (cudaEvent_t e : {fork, done1, done2}) CHECK(cudaEventDestroy(e));
  CHECK(cudaStreamDestroy(side1));
  CHECK(cudaStreamDestroy(side2));
  return seen.values;
}

// A 2D copy of pageable rows into device memory and back out on a capturing stream.
std::vector<float> rows_2d(float* d_in, cudaStream_t s) {
  constexpr int kW = 40, kH = 6, kPitch = 64;
  std::vector<float> host(kPitch * kH), out(kW * kH, -1.0f);
  for (int i = 0; i < kPitch * kH; ++i) host[i] = (float)(i % 97);
  cudaGraph_t g;
  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  CHECK(cudaMemcpy2DAsync(d_in, kW * sizeof(float), host.data(), kPitch * sizeof(float), kW * sizeof(float), kH,
                          cudaMemcpyHostToDevice, s));
  CHECK(cudaMemcpyAsync(out.data(), d_in, out.size() * sizeof(float), cudaMemcpyDeviceToHost, s));
  CHECK(cudaStreamEndCapture(s, &g));
  cudaGraphExec_t x;
  CHECK(cudaGraphInstantiate(&x, g, 0));
  CHECK(cudaGraphLaunch(x, s));
  CHECK(cudaStreamSynchronize(s));
  for (int r = 0; r < kH; ++r)
    for (int c = 0; c < kW; ++c) EXPECT(out[r * kW + c] == host[r * kPitch + c]);
  CHECK(cudaGraphExecDestroy(x));
  CHECK(cudaGraphDestroy(g));
  return out;
}

int main() {
  const int n = 1 << 22;
  float *pinned, *d_in;
  double *d_partial, *d_result;
  CHECK(cudaMallocHost(&pinned, n * sizeof(float)));
  std::vector<float> pageable(n);
  for (int i = 0; i < n; ++i) pinned[i] = pageable[i] = (float)(i % 251);
  CHECK(cudaMalloc(&d_in, n * sizeof(float)));
  CHECK(cudaMalloc(&d_partial, 2 * kBlocks * sizeof(double)));
  CHECK(cudaMalloc(&d_result, sizeof(double)));
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

  Report report;
  std::vector<double> a = built(pinned, true, d_in, d_partial, d_result, n, s, &pinned[3]);
  std::vector<double> b = built(pageable.data(), false, d_in, d_partial, d_result, n, s, &pageable[5]);
  std::vector<double> c = captured(pinned, d_in, d_partial, d_result, n, s);
  std::vector<float> r = rows_2d(d_in, s);
  for (const auto* v : {&a, &b, &c}) {
    EXPECT(v->size() == kReplays + 2);  // every replay's host node, then the last result
    for (double x : *v) printf("%.1f ", x);
    printf("\n");
  }
  report.line("built_pinned", checksum(a));
  report.line("built_pageable", checksum(b));
  report.line("captured", checksum(c));
  report.line("rows_2d", checksum(r));
  CHECK(cudaStreamDestroy(s));
  CHECK(cudaFreeHost(pinned));
  for (void* p : {(void*)d_in, (void*)d_partial, (void*)d_result}) CHECK(cudaFree(p));
  report.done("graph_host_memory");
  return 0;
}
