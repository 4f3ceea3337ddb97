// Managed memory (cudaMallocManaged): kernels and the host take turns on the same arrays; a
// linked list whose nodes reach each other only through managed pointers stored in managed
// memory; a kernel without parameters that finds its array through a __device__ pointer;
// prefetch and advise hints, pointer attributes, memset and copies on managed memory.
#include "common.h"

__global__ void scale(float* x, int n, float a) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] = x[i] * a + 1.0f;
}

struct Node {
  int value;
  Node* next;
};

// Sums the list and doubles every value: only the head is a parameter.
__global__ void walk(Node* head, int* sum) {
  int s = 0;
  for (Node* p = head; p; p = p->next) {
    s += p->value;
    p->value *= 2;
  }
  *sum = s;
}

__device__ float* g_data;

// No parameters: the array comes from a __device__ pointer the host set.
__global__ void bump() { g_data[threadIdx.x] += 1.0f; }

int main() {
  Report report;
  const int n = 1 << 20;
  float* x = nullptr;
  CHECK(cudaMallocManaged(&x, n * sizeof(float)));
  for (int i = 0; i < n; ++i) x[i] = i * 0.5f;

  // 1. The GPU reads what the host wrote and writes what the host then reads.
  scale<<<blocks_for(n, 256), 256>>>(x, n, 2.0f);
  CHECK_LAUNCH();
  CHECK(cudaDeviceSynchronize());
  for (int i = 0; i < n; ++i) EXPECT(x[i] == i * 1.0f + 1.0f);
  // 2. Again, after the host changed part of it.
  for (int i = 0; i < 100; ++i) x[i] = -1.0f;
  scale<<<blocks_for(n, 256), 256>>>(x, n, 3.0f);
  CHECK_LAUNCH();
  CHECK(cudaDeviceSynchronize());
  EXPECT(x[0] == -2.0f && x[99] == -2.0f && x[100] == 304.0f);  // (i + 1) * 3 + 1
  report.line("scaled", fnv1a(x, n * sizeof(float)));

  // 3. A list of separately allocated nodes.
  const int nodes = 64;
  Node* list[nodes];
  for (int i = 0; i < nodes; ++i) {
    CHECK(cudaMallocManaged(&list[i], sizeof(Node)));
    list[i]->value = i;
    list[i]->next = nullptr;
    if (i > 0) list[i - 1]->next = list[i];
  }
  int* sum = nullptr;
  CHECK(cudaMallocManaged(&sum, sizeof(int)));
  *sum = -1;
  walk<<<1, 1>>>(list[0], sum);
  CHECK_LAUNCH();
  CHECK(cudaDeviceSynchronize());
  EXPECT(*sum == nodes * (nodes - 1) / 2);
  for (int i = 0; i < nodes; ++i) EXPECT(list[i]->value == 2 * i);
  report.line("list sum", (unsigned long long)*sum);

  // 4. A kernel without parameters, through a __device__ pointer to managed memory.
  CHECK(cudaMemcpyToSymbol(g_data, &x, sizeof(x)));
  bump<<<1, 128>>>();
  CHECK_LAUNCH();
  CHECK(cudaDeviceSynchronize());
  EXPECT(x[0] == -1.0f && x[127] == 3.0f * 127 + 4 + 1 && x[128] == 3.0f * 128 + 4);
  report.line("bumped", fnv1a(x, 256 * sizeof(float)));

  // 5. Hints succeed; attributes say managed.
  int device = 0;
  CHECK(cudaGetDevice(&device));
  cudaMemLocation here = {};
  here.type = cudaMemLocationTypeDevice;
  here.id = device;
  CHECK(cudaMemAdvise(x, n * sizeof(float), cudaMemAdviseSetPreferredLocation, here));
  CHECK(cudaMemPrefetchAsync(x, n * sizeof(float), here, 0, 0));
  CHECK(cudaStreamAttachMemAsync(0, sum, 0, cudaMemAttachGlobal));
  CHECK(cudaDeviceSynchronize());
  cudaPointerAttributes attributes;
  CHECK(cudaPointerGetAttributes(&attributes, x + 10));
  EXPECT(attributes.type == cudaMemoryTypeManaged);
  EXPECT(attributes.devicePointer == x + 10 && attributes.hostPointer == x + 10);

  // 6. Memset and copies to and from device memory.
  float* d = nullptr;
  CHECK(cudaMalloc(&d, n * sizeof(float)));
  CHECK(cudaMemcpy(d, x, n * sizeof(float), cudaMemcpyDefault));
  CHECK(cudaMemset(x, 0, n * sizeof(float)));
  CHECK(cudaDeviceSynchronize());
  for (int i = 0; i < n; i += 4099) EXPECT(x[i] == 0.0f);
  CHECK(cudaMemcpy(x, d, n * sizeof(float), cudaMemcpyDefault));
  CHECK(cudaDeviceSynchronize());
  report.line("copied back", fnv1a(x, n * sizeof(float)));

  CHECK(cudaFree(d));
  for (int i = 0; i < nodes; ++i) CHECK(cudaFree(list[i]));
  CHECK(cudaFree(sum));
  CHECK(cudaFree(x));
  report.done("managed");
  return 0;
}
