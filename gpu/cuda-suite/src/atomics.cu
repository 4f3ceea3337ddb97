// Atomics: atomicAdd on int (histogram) and float (sums), atomicCAS loops on 32 and 64 bits (sums
// and maxima over 4096 slots, few enough contenders per slot to stay fast). Every result is
// independent of the order the atomics land in.
#include "common.h"

constexpr int kBins = 256, kSlots = 4096;

__host__ __device__ unsigned bin_of(unsigned i) { return (i * 2654435761u) >> 24; }
// Multiples of 0.25 whose sums stay below 2^22: float additions are exact in any order.
__host__ __device__ float weight(int i) { return (i % 8) * 0.25f; }
__host__ __device__ double value(int i) { return (double)((i * 7919LL) % 1000003) / 3.0; }

__device__ void atomic_add_cas(int* addr, int v) {
  int old = *addr, assumed;
  do {
    assumed = old;
    old = atomicCAS(addr, assumed, assumed + v);
  } while (old != assumed);
}

__device__ void atomic_max_double(double* addr, double v) {
  unsigned long long* bits = reinterpret_cast<unsigned long long*>(addr);
  unsigned long long old = *bits, assumed;
  do {
    assumed = old;
    if (__longlong_as_double((long long)assumed) >= v) return;
    old = atomicCAS(bits, assumed, (unsigned long long)__double_as_longlong(v));
  } while (old != assumed);
}

__global__ void accumulate(int n, int* hist, float* bin_weight, float* total, int* slot_sum,
                           double* slot_max) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  unsigned b = bin_of(i);
  atomicAdd(&hist[b], 1);
  atomicAdd(&bin_weight[b], weight(i));
  atomicAdd(total, weight(i));
  atomic_add_cas(&slot_sum[i % kSlots], i % 5);
  atomic_max_double(&slot_max[i % kSlots], value(i));
}

int main() {
  const int n = 1 << 20;
  int *d_hist, *d_slot_sum;
  float *d_bin_weight, *d_total;
  double* d_slot_max;
  CHECK(cudaMalloc(&d_hist, kBins * sizeof(int)));
  CHECK(cudaMalloc(&d_bin_weight, kBins * sizeof(float)));
  CHECK(cudaMalloc(&d_total, sizeof(float)));
  CHECK(cudaMalloc(&d_slot_sum, kSlots * sizeof(int)));
  CHECK(cudaMalloc(&d_slot_max, kSlots * sizeof(double)));
  CHECK(cudaMemset(d_hist, 0, kBins * sizeof(int)));
  CHECK(cudaMemset(d_bin_weight, 0, kBins * sizeof(float)));
  CHECK(cudaMemset(d_total, 0, sizeof(float)));
  CHECK(cudaMemset(d_slot_sum, 0, kSlots * sizeof(int)));
  std::vector<double> want_slot_max(kSlots, -1.0);
  CHECK(cudaMemcpy(d_slot_max, want_slot_max.data(), kSlots * sizeof(double), cudaMemcpyHostToDevice));

  accumulate<<<blocks_for(n, 256), 256>>>(n, d_hist, d_bin_weight, d_total, d_slot_sum, d_slot_max);
  CHECK_LAUNCH();

  std::vector<int> hist(kBins), want_hist(kBins, 0), slot_sum(kSlots), want_slot_sum(kSlots, 0);
  std::vector<float> bin_weight(kBins), want_bin_weight(kBins, 0.0f);
  std::vector<double> slot_max(kSlots);
  float total, want_total = 0.0f;
  CHECK(cudaMemcpy(hist.data(), d_hist, kBins * sizeof(int), cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(bin_weight.data(), d_bin_weight, kBins * sizeof(float), cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(&total, d_total, sizeof total, cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(slot_sum.data(), d_slot_sum, kSlots * sizeof(int), cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(slot_max.data(), d_slot_max, kSlots * sizeof(double), cudaMemcpyDeviceToHost));
  for (int i = 0; i < n; ++i) {
    unsigned b = bin_of(i);
    want_hist[b] += 1;
    want_bin_weight[b] += weight(i);
    want_total += weight(i);
    want_slot_sum[i % kSlots] += i % 5;
    if (value(i) > want_slot_max[i % kSlots]) want_slot_max[i % kSlots] = value(i);
  }
  expect_equal("hist", hist, want_hist);
  expect_equal("bin_weight", bin_weight, want_bin_weight);
  EXPECT(total == want_total);
  expect_equal("slot_sum", slot_sum, want_slot_sum);
  expect_equal("slot_max", slot_max, want_slot_max);

  Report report;
  report.line("hist", checksum(hist));
  report.line("bin_weight", checksum(bin_weight));
  printf("total            %.2f\n", total);
  report.line("slot_sum", checksum(slot_sum));
  report.line("slot_max", checksum(slot_max));
  for (void* p : {(void*)d_hist, (void*)d_bin_weight, (void*)d_total, (void*)d_slot_sum, (void*)d_slot_max})
    CHECK(cudaFree(p));
  report.done("atomics");
  return 0;
}
