// User objects: a destructor (the program's function) runs once, when the last reference
// goes: the program's (runtime and driver API), or a graph's and its executable graph's
// after a launch. Destructors run on another thread: the program waits for each.
#include <unistd.h>
#include <cuda.h>
#include "common.h"

static volatile int destroyed[3];
static void destroy(void* p) { destroyed[*static_cast<int*>(p)] += 1; }

// Wait for destructor `i` (at most 10 s); its count.
static int wait_for(int i) {
  for (int t = 0; t < 1000 && !destroyed[i]; ++t) usleep(10000);
  return destroyed[i];
}

__global__ void add_one(int* x) { *x += 1; }

int main() {
  Report report;
  static int ids[3] = {0, 1, 2};
  cudaUserObject_t a;
  CHECK(cudaUserObjectCreate(&a, &ids[0], destroy, 1, cudaUserObjectNoDestructorSync));
  CHECK(cudaUserObjectRetain(a, 2));
  CHECK(cudaUserObjectRelease(a, 2));
  usleep(50000);
  EXPECT(destroyed[0] == 0);
  CHECK(cudaUserObjectRelease(a, 1));
  report.line("runtime", wait_for(0));

  // The graph owns the reference (moved); its executable graph takes its own.
  int* d_x;
  CHECK(cudaMalloc(&d_x, sizeof(int)));
  CHECK(cudaMemset(d_x, 0, sizeof(int)));
  cudaStream_t stream;
  CHECK(cudaStreamCreate(&stream));
  cudaGraph_t graph;
  CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  add_one<<<1, 1, 0, stream>>>(d_x);
  CHECK(cudaStreamEndCapture(stream, &graph));
  cudaUserObject_t b;
  CHECK(cudaUserObjectCreate(&b, &ids[1], destroy, 1, cudaUserObjectNoDestructorSync));
  CHECK(cudaGraphRetainUserObject(graph, b, 1, cudaGraphUserObjectMove));
  cudaGraphExec_t exec;
  CHECK(cudaGraphInstantiate(&exec, graph, 0));
  CHECK(cudaGraphDestroy(graph));
  for (int i = 0; i < 3; ++i) CHECK(cudaGraphLaunch(exec, stream));
  CHECK(cudaStreamSynchronize(stream));
  usleep(50000);
  EXPECT(destroyed[1] == 0);
  CHECK(cudaGraphExecDestroy(exec));
  report.line("graph", wait_for(1));
  int x = 0;
  CHECK(cudaMemcpy(&x, d_x, sizeof(int), cudaMemcpyDeviceToHost));
  report.line("launches", x);

  CUuserObject c;
  EXPECT(cuUserObjectCreate(&c, &ids[2], destroy, 2, CU_USER_OBJECT_NO_DESTRUCTOR_SYNC) == CUDA_SUCCESS);
  EXPECT(cuUserObjectRelease(c, 2) == CUDA_SUCCESS);
  report.line("driver", wait_for(2));
  report.line("runs", destroyed[0] * 100 + destroyed[1] * 10 + destroyed[2]);
  CHECK(cudaFree(d_x));
  CHECK(cudaStreamDestroy(stream));
  report.done("user_objects");
  return 0;
}
