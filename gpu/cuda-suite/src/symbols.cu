// __constant__ and __device__ variables through the symbol APIs: cudaMemcpyToSymbol(Async),
// cudaMemcpyFromSymbol(Async), cudaGetSymbolAddress and cudaGetSymbolSize.
#include "common.h"

__constant__ int c_coeffs[16];
__constant__ int c_bias;
__device__ int d_table[256];
__device__ unsigned long long d_total;

__host__ __device__ int evaluate_one(int x, int coeff, int table_entry, int bias) {
  return coeff * x + table_entry + bias;
}

__global__ void evaluate(const int* x, int* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    int v = evaluate_one(x[i], c_coeffs[i % 16], d_table[x[i] % 256], c_bias);
    y[i] = v;
    atomicAdd(&d_total, (unsigned long long)v);
  }
}

int main() {
  const int n = 1 << 20;
  cudaStream_t stream;
  CHECK(cudaStreamCreate(&stream));
  Report report;

  std::vector<int> coeffs(16), coeffs_back(16);
  for (int k = 0; k < 16; ++k) coeffs[k] = k + 1;
  CHECK(cudaMemcpyToSymbol(c_coeffs, coeffs.data(), 8 * sizeof(int)));
  CHECK(cudaMemcpyToSymbol(c_coeffs, coeffs.data() + 8, 8 * sizeof(int), 8 * sizeof(int)));
  const int bias = 5;
  CHECK(cudaMemcpyToSymbolAsync(c_bias, &bias, sizeof bias, 0, cudaMemcpyHostToDevice, stream));
  CHECK(cudaStreamSynchronize(stream));
  CHECK(cudaMemcpyFromSymbol(coeffs_back.data(), c_coeffs, 16 * sizeof(int)));
  expect_equal("c_coeffs", coeffs_back, coeffs);

  int* table;
  size_t table_size;
  CHECK(cudaGetSymbolAddress((void**)&table, d_table));
  CHECK(cudaGetSymbolSize(&table_size, d_table));
  EXPECT(table_size == 256 * sizeof(int));
  printf("d_table size     %zu\n", table_size);
  std::vector<int> host_table(256), table_back(256);
  for (int k = 0; k < 256; ++k) host_table[k] = k * 3;
  CHECK(cudaMemcpy(table, host_table.data(), table_size, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpyFromSymbol(table_back.data(), d_table, table_size));
  expect_equal("d_table", table_back, host_table);

  const unsigned long long zero = 0;
  CHECK(cudaMemcpyToSymbol(d_total, &zero, sizeof zero));
  std::vector<int> x(n), got(n), want(n);
  for (int i = 0; i < n; ++i) x[i] = i % 1000;
  int *d_x, *d_y;
  CHECK(cudaMalloc(&d_x, n * sizeof(int)));
  CHECK(cudaMalloc(&d_y, n * sizeof(int)));
  CHECK(cudaMemcpy(d_x, x.data(), n * sizeof(int), cudaMemcpyHostToDevice));
  evaluate<<<blocks_for(n, 256), 256, 0, stream>>>(d_x, d_y, n);
  CHECK_LAUNCH();
  unsigned long long total = 0, want_total = 0;
  CHECK(cudaMemcpyFromSymbolAsync(&total, d_total, sizeof total, 0, cudaMemcpyDeviceToHost, stream));
  CHECK(cudaStreamSynchronize(stream));
  CHECK(cudaMemcpy(got.data(), d_y, n * sizeof(int), cudaMemcpyDeviceToHost));
  for (int i = 0; i < n; ++i) {
    want[i] = evaluate_one(x[i], coeffs[i % 16], host_table[x[i] % 256], bias);
    want_total += want[i];
  }
  expect_equal("evaluate", got, want);
  EXPECT(total == want_total);
  report.line("evaluate", checksum(got));
  report.line("d_total", total);

  CHECK(cudaFree(d_x));
  CHECK(cudaFree(d_y));
  CHECK(cudaStreamDestroy(stream));
  report.done("symbols");
  return 0;
}
