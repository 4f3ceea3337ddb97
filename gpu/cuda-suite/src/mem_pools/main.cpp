// Memory pools and stream-ordered allocation: the device's default pool with a release
// threshold, cudaMallocAsync/cudaFreeAsync in a loop and across two streams ordered by an
// event, an explicit pool (cudaMemPoolCreate, cudaMallocFromPoolAsync, attributes, access,
// trimming), the device's current pool swapped with cudaDeviceSetMemPool, and pointer
// attributes of pool memory. Host code only: the kernels are in kernels.cu.
#include "common.h"
#include "mem_pools/kernels.h"

int main() {
  Report report;
  const int n = 1 << 18;
  const size_t bytes = n * sizeof(int);
  cudaMemPool_t default_pool;
  CHECK(cudaDeviceGetDefaultMemPool(&default_pool, 0));
  unsigned long long threshold = ~0ull;
  CHECK(cudaMemPoolSetAttribute(default_pool, cudaMemPoolAttrReleaseThreshold, &threshold));
  unsigned long long got_threshold = 0;
  CHECK(cudaMemPoolGetAttribute(default_pool, cudaMemPoolAttrReleaseThreshold, &got_threshold));
  EXPECT(got_threshold == threshold);
  cudaMemLocation location{};
  location.type = cudaMemLocationTypeDevice;
  location.id = 0;
  cudaMemPool_t by_location;
  CHECK(cudaMemGetDefaultMemPool(&by_location, &location, cudaMemAllocationTypePinned));
  EXPECT(by_location == default_pool);

  cudaStream_t s1, s2;
  CHECK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
  CHECK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
  int* host;
  CHECK(cudaMallocHost(&host, bytes));
  std::vector<int> all, want;
  // Allocate, fill, copy out, free: in stream order, ten times.
  for (int round = 0; round < 10; ++round) {
    int* p;
    CHECK(cudaMallocAsync(&p, bytes, s1));
    fill(p, round, n, s1);
    CHECK_LAUNCH();
    CHECK(cudaMemcpyAsync(host, p, bytes, cudaMemcpyDeviceToHost, s1));
    CHECK(cudaFreeAsync(p, s1));
    CHECK(cudaStreamSynchronize(s1));
    all.insert(all.end(), host, host + n);
    for (int i = 0; i < n; ++i) want.push_back(round * 31 + i);
  }
  expect_equal("stream-ordered rounds", all, want);
  report.line("rounds", checksum(all));

  // Made on one stream, used and freed on another after an event.
  int *made, *result;
  cudaEvent_t ready;
  CHECK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
  CHECK(cudaMallocAsync(&made, bytes, s1));
  CHECK(cudaMallocAsync(&result, bytes, s1));
  fill(made, 7, n, s1);
  CHECK_LAUNCH();
  CHECK(cudaEventRecord(ready, s1));
  CHECK(cudaStreamWaitEvent(s2, ready, 0));
  plus_one(result, made, n, s2);
  CHECK_LAUNCH();
  CHECK(cudaFreeAsync(made, s2));
  CHECK(cudaMemcpyAsync(host, result, bytes, cudaMemcpyDeviceToHost, s2));
  CHECK(cudaFreeAsync(result, s2));
  CHECK(cudaStreamSynchronize(s2));
  std::vector<int> cross(host, host + n), want_cross(n);
  for (int i = 0; i < n; ++i) want_cross[i] = 7 * 31 + i + 1;
  expect_equal("across streams", cross, want_cross);
  report.line("across streams", checksum(cross));

  // An explicit pool.
  cudaMemPoolProps props{};
  props.allocType = cudaMemAllocationTypePinned;
  props.location = location;
  cudaMemPool_t pool;
  CHECK(cudaMemPoolCreate(&pool, &props));
  cudaMemAccessDesc access{};
  access.location = location;
  access.flags = cudaMemAccessFlagsProtReadWrite;
  CHECK(cudaMemPoolSetAccess(pool, &access, 1));
  cudaMemAccessFlags flags;
  CHECK(cudaMemPoolGetAccess(&flags, pool, &location));
  EXPECT(flags == cudaMemAccessFlagsProtReadWrite);
  int* from_pool;
  CHECK(cudaMallocFromPoolAsync(reinterpret_cast<void**>(&from_pool), bytes, pool, s1));
  cudaPointerAttributes attrs;
  CHECK(cudaPointerGetAttributes(&attrs, from_pool + n - 1));
  EXPECT(attrs.type == cudaMemoryTypeDevice && attrs.device == 0);
  unsigned long long used = 0, reserved = 0;
  CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &used));
  CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &reserved));
  printf("pool in use      %d %d\n", used >= bytes, reserved >= used);
  fill(from_pool, 3, n, s1);
  CHECK_LAUNCH();
  CHECK(cudaMemcpyAsync(host, from_pool, bytes, cudaMemcpyDeviceToHost, s1));
  CHECK(cudaFreeAsync(from_pool, s1));
  CHECK(cudaStreamSynchronize(s1));
  std::vector<int> pooled(host, host + n), want_pooled(n);
  for (int i = 0; i < n; ++i) want_pooled[i] = 3 * 31 + i;
  expect_equal("explicit pool", pooled, want_pooled);
  report.line("explicit pool", checksum(pooled));
  CHECK(cudaMemPoolTrimTo(pool, 0));
  CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &used));
  CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &reserved));
  printf("pool trimmed     %llu %llu\n", used, reserved);

  // The device's current pool is the explicit one for a while.
  CHECK(cudaDeviceSetMemPool(0, pool));
  cudaMemPool_t current;
  CHECK(cudaDeviceGetMemPool(&current, 0));
  EXPECT(current == pool);
  int* p;
  CHECK(cudaMallocAsync(&p, bytes, s1));
  CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &used));
  EXPECT(used >= bytes);
  CHECK(cudaFreeAsync(p, s1));
  CHECK(cudaStreamSynchronize(s1));
  CHECK(cudaDeviceSetMemPool(0, default_pool));
  CHECK(cudaMemPoolDestroy(pool));

  CHECK(cudaFreeHost(host));
  CHECK(cudaEventDestroy(ready));
  CHECK(cudaStreamDestroy(s1));
  CHECK(cudaStreamDestroy(s2));
  report.done("mem_pools");
  return 0;
}
