// cuBLASXt (NVIDIA's simpleCUBLASXT): device selection, then GEMM, SYRK and TRSM whose
// matrices are the program's host memory (the library tiles them onto the GPU), once with a
// device matrix among them; results checksummed (they must equal the native run's bytes).
// Host code only.
#include <cublasXt.h>
#include "common.h"

int main() {
  Report report;
  cublasXtHandle_t xt;
  CHECK_STATUS(cublasXtCreate(&xt));
  int devices[1] = {0};
  CHECK_STATUS(cublasXtDeviceSelect(xt, 1, devices));
  int block = 0;
  CHECK_STATUS(cublasXtGetBlockDim(xt, &block));
  report.line("block dim", block);

  const size_t m = 1000, n = 700, k = 500;
  std::vector<float> a(m * k), b(k * n), c(m * n, 1.0f);
  for (size_t i = 0; i < a.size(); ++i) a[i] = float(i % 13) * 0.25f - 1.5f;
  for (size_t i = 0; i < b.size(); ++i) b[i] = float(i % 7) * 0.5f;
  const float alpha = 1.5f, beta = 0.25f;
  CHECK_STATUS(cublasXtSgemm(xt, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &alpha, a.data(), m, b.data(), k, &beta,
                             c.data(), m));
  report.line("sgemm host", checksum(c));
  CHECK_STATUS(cublasXtSgemm(xt, CUBLAS_OP_T, CUBLAS_OP_N, k, n, m, &alpha, a.data(), m, c.data(), m, &beta,
                             b.data(), k));
  report.line("sgemm transposed", checksum(b));

  // B on the device, A and C on the host.
  float* d_b;
  CHECK(cudaMalloc(&d_b, b.size() * sizeof(float)));
  CHECK(cudaMemcpy(d_b, b.data(), b.size() * sizeof(float), cudaMemcpyHostToDevice));
  CHECK_STATUS(cublasXtSgemm(xt, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &alpha, a.data(), m, d_b, k, &beta, c.data(),
                             m));
  report.line("sgemm device B", checksum(c));
  CHECK(cudaFree(d_b));

  // SYRK (C = alpha A Aᵀ + beta C, lower) and a triangular solve, in double.
  const size_t order = 400;
  std::vector<double> da(order * k), dc(order * order, 0.0);
  for (size_t i = 0; i < da.size(); ++i) da[i] = double(i % 11) / 11.0;
  const double one = 1.0, zero = 0.0;
  CHECK_STATUS(cublasXtDsyrk(xt, CUBLAS_FILL_MODE_LOWER, CUBLAS_OP_N, order, k, &one, da.data(), order, &zero,
                             dc.data(), order));
  report.line("dsyrk", checksum(dc));
  // A well-conditioned lower triangle: the SYRK result plus a large diagonal.
  for (size_t i = 0; i < order; ++i) dc[i + i * order] += double(order);
  std::vector<double> rhs(order * 3);
  for (size_t i = 0; i < rhs.size(); ++i) rhs[i] = double(i % 17);
  CHECK_STATUS(cublasXtDtrsm(xt, CUBLAS_SIDE_LEFT, CUBLAS_FILL_MODE_LOWER, CUBLAS_OP_N, CUBLAS_DIAG_NON_UNIT, order,
                             3, &one, dc.data(), order, rhs.data(), order));
  report.line("dtrsm", checksum(rhs));

  CHECK_STATUS(cublasXtDestroy(xt));
  report.done("blas_xt");
  return 0;
}
