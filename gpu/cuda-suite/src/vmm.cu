// The driver's virtual memory management from a runtime program (NVIDIA's vectorAddMMAP, and
// how PyTorch's expandable segments grow): a reserved range mapped chunk by chunk with
// cuMemCreate/cuMemMap/cuMemSetAccess, used by runtime copies and kernels across chunk
// boundaries, grown in place, a chunk unmapped and mapped again, the allocation handle found
// from an address, properties and access read back, everything released.
#include <cuda.h>

#include "common.h"
#include "driver_check.h"

__global__ void add_index(int* x, size_t n, int k) {
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] = x[i] * k + (int)(i % 1021);
}

int main() {
  Report report;
  CHECK(cudaFree(nullptr));  // the runtime's primary context, current on this thread
  CUdevice device;
  CU_CHECK(cuCtxGetDevice(&device));
  int vmm = 0;
  CU_CHECK(cuDeviceGetAttribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, device));
  EXPECT(vmm == 1);

  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  size_t granularity = 0;
  CU_CHECK(cuMemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  EXPECT(granularity > 0);
  size_t recommended = 0;
  CU_CHECK(cuMemGetAllocationGranularity(&recommended, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
  EXPECT(recommended >= granularity);

  // A range of eight chunks; four mapped at first.
  const int chunks = 8;
  const size_t chunk = 2 * granularity, total = chunks * chunk;
  CUdeviceptr base = 0;
  CU_CHECK(cuMemAddressReserve(&base, total, 0, 0, 0));
  EXPECT(base % granularity == 0);
  CUmemGenericAllocationHandle handles[chunks] = {};
  CUmemAccessDesc access = {};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  auto map_chunk = [&](int c) {
    CU_CHECK(cuMemCreate(&handles[c], chunk, &prop, 0));
    CU_CHECK(cuMemMap(base + c * chunk, chunk, 0, handles[c], 0));
    CU_CHECK(cuMemSetAccess(base + c * chunk, chunk, &access, 1));
  };
  for (int c = 0; c < 4; ++c) map_chunk(c);

  // 1. A copy and a kernel across the first four chunks' boundaries.
  size_t n = 4 * chunk / sizeof(int);
  std::vector<int> host(n), want(n);
  for (size_t i = 0; i < n; ++i) host[i] = want[i] = (int)(i * 2654435761u % 100003);
  int* x = reinterpret_cast<int*>(base);
  CHECK(cudaMemcpy(x, host.data(), n * sizeof(int), cudaMemcpyHostToDevice));
  add_index<<<blocks_for((int)n, 256), 256>>>(x, n, 3);
  CHECK_LAUNCH();
  for (size_t i = 0; i < n; ++i) want[i] = want[i] * 3 + (int)(i % 1021);
  CHECK(cudaMemcpy(host.data(), x, n * sizeof(int), cudaMemcpyDeviceToHost));
  expect_equal("four chunks", host, want);
  report.line("four chunks", checksum(host));

  // 2. Grown in place to eight chunks: the old data stays where it was.
  for (int c = 4; c < chunks; ++c) map_chunk(c);
  const size_t old_n = n;
  n = total / sizeof(int);
  host.resize(n);
  want.resize(n);
  CHECK(cudaMemset(x + old_n, 0x11, (n - old_n) * sizeof(int)));
  add_index<<<blocks_for((int)n, 256), 256>>>(x, n, 1);
  CHECK_LAUNCH();
  for (size_t i = 0; i < n; ++i) want[i] = (i < old_n ? want[i] : 0x11111111) + (int)(i % 1021);
  CHECK(cudaMemcpy(host.data(), x, n * sizeof(int), cudaMemcpyDeviceToHost));
  expect_equal("eight chunks", host, want);
  report.line("eight chunks", checksum(host));

  // 3. The handle behind an address, its properties, the access of the range.
  CUmemGenericAllocationHandle found = 0;
  CU_CHECK(cuMemRetainAllocationHandle(&found, reinterpret_cast<void*>(base + 5 * chunk + 64)));
  CUmemAllocationProp got = {};
  CU_CHECK(cuMemGetAllocationPropertiesFromHandle(&got, found));
  EXPECT(got.type == CU_MEM_ALLOCATION_TYPE_PINNED && got.location.id == device);
  CU_CHECK(cuMemRelease(found));
  unsigned long long flags = 0;
  CUmemLocation location = prop.location;
  CU_CHECK(cuMemGetAccess(&flags, &location, base + 7 * chunk));
  EXPECT(flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  CUdeviceptr range_base = 0;
  size_t range_size = 0;
  CU_CHECK(cuMemGetAddressRange(&range_base, &range_size, base + 3 * chunk + 8));
  EXPECT(range_base <= base + 3 * chunk && range_base + range_size > base + 3 * chunk + 8);
  report.line("address range", (range_base - base) / chunk * 1000 + range_size / chunk);

  // 4. Chunk 2 unmapped and its memory mapped again at the same place: the data is still there.
  CU_CHECK(cuMemUnmap(base + 2 * chunk, chunk));
  CU_CHECK(cuMemMap(base + 2 * chunk, chunk, 0, handles[2], 0));
  CU_CHECK(cuMemSetAccess(base + 2 * chunk, chunk, &access, 1));
  CHECK(cudaMemcpy(host.data(), x, n * sizeof(int), cudaMemcpyDeviceToHost));
  expect_equal("mapped again", host, want);
  // A kernel on a range that ends inside the range's last chunk.
  add_index<<<blocks_for((int)(n - 100), 256), 256>>>(x + 100, n - 100, 2);
  CHECK_LAUNCH();
  CHECK(cudaDeviceSynchronize());
  for (size_t i = 100; i < n; ++i) want[i] = want[i] * 2 + (int)((i - 100) % 1021);
  CHECK(cudaMemcpy(host.data(), x, n * sizeof(int), cudaMemcpyDeviceToHost));
  expect_equal("after remap", host, want);
  report.line("after remap", checksum(host));

  // 5. Everything back: unmap the whole range, release the handles, free the range.
  CU_CHECK(cuMemUnmap(base, total));
  for (CUmemGenericAllocationHandle h : handles) CU_CHECK(cuMemRelease(h));
  CU_CHECK(cuMemAddressFree(base, total));
  size_t free_bytes = 0, total_bytes = 0;
  CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  EXPECT(free_bytes > 0 && free_bytes <= total_bytes);
  report.done("vmm");
  return 0;
}
