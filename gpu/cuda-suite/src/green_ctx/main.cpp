// Green contexts (CUDA 12.4+): the device's SM resource, split into groups of a minimum size
// (cuDevSmResourceSplitByCount, first asked for the number of groups with a NULL result
// array, then filled), a resource descriptor of one group, a green context made from it with
// its own stream, the resource the context reports, and a kernel run on that stream whose
// blocks must all land on as many distinct SMs as the group holds at most. Host code only:
// the kernel is in kernels.cu.
#include <set>
#include <cuda.h>
#include "common.h"
#include "green_ctx/kernels.h"

#include "driver_check.h"

int main() {
  Report report;
  CU_CHECK(cuInit(0));
  CUdevice dev;
  CU_CHECK(cuDeviceGet(&dev, 0));
  CUdevResource all{};
  CU_CHECK(cuDeviceGetDevResource(dev, &all, CU_DEV_RESOURCE_TYPE_SM));
  report.line("sms", all.sm.smCount);

  // How many groups of at least 16 SMs: asked with a NULL array, then filled.
  const unsigned min_count = 16;
  unsigned groups = 0;
  CU_CHECK(cuDevSmResourceSplitByCount(nullptr, &groups, &all, nullptr, 0, min_count));
  EXPECT(groups >= 1);
  report.line("groups", groups);
  std::vector<CUdevResource> split(groups + 2);
  CUdevResource rest{};
  unsigned filled = groups + 2;
  CU_CHECK(cuDevSmResourceSplitByCount(split.data(), &filled, &all, &rest, 0, min_count));
  EXPECT(filled == groups);
  unsigned total = rest.sm.smCount;
  for (unsigned g = 0; g < filled; ++g) {
    EXPECT(split[g].type == CU_DEV_RESOURCE_TYPE_SM && split[g].sm.smCount >= min_count);
    total += split[g].sm.smCount;
  }
  EXPECT(total == all.sm.smCount);
  report.line("first group", split[0].sm.smCount);
  report.line("remainder", rest.sm.smCount);

  // A green context of the first group, with a stream of its own.
  CUdevResourceDesc desc;
  CU_CHECK(cuDevResourceGenerateDesc(&desc, &split[0], 1));
  CUgreenCtx green;
  CU_CHECK(cuGreenCtxCreate(&green, desc, dev, CU_GREEN_CTX_DEFAULT_STREAM));
  CUdevResource got{};
  CU_CHECK(cuGreenCtxGetDevResource(green, &got, CU_DEV_RESOURCE_TYPE_SM));
  EXPECT(got.sm.smCount == split[0].sm.smCount);
  CUcontext ctx;
  CU_CHECK(cuCtxFromGreenCtx(&ctx, green));
  CU_CHECK(cuCtxSetCurrent(ctx));
  CUstream stream;
  CU_CHECK(cuGreenCtxStreamCreate(&stream, green, CU_STREAM_NON_BLOCKING, 0));

  const int n = 1 << 16, blocks = n / 256;
  int* out;
  unsigned* sms;
  CHECK(cudaMalloc(&out, n * sizeof(int)));
  CHECK(cudaMalloc(&sms, blocks * sizeof(unsigned)));
  fill_and_record_sms(out, sms, 3, n, reinterpret_cast<cudaStream_t>(stream));
  CHECK_LAUNCH();
  CU_CHECK(cuStreamSynchronize(stream));
  std::vector<int> values(n), want(n);
  std::vector<unsigned> ran_on(blocks);
  CHECK(cudaMemcpy(values.data(), out, n * sizeof(int), cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(ran_on.data(), sms, blocks * sizeof(unsigned), cudaMemcpyDeviceToHost));
  for (int i = 0; i < n; ++i) want[i] = 3 * 7 + i;
  expect_equal("green context kernel", values, want);
  std::set<unsigned> distinct(ran_on.begin(), ran_on.end());
  EXPECT(distinct.size() <= got.sm.smCount);
  report.line("values", checksum(values));
  report.line("at most group", distinct.size() <= got.sm.smCount);

  CHECK(cudaFree(out));
  CHECK(cudaFree(sms));
  CU_CHECK(cuStreamDestroy(stream));
  CU_CHECK(cuGreenCtxDestroy(green));
  report.done("green_ctx");
  return 0;
}
