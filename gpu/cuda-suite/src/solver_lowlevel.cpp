// cuSolverSP's low-level preview API (cusolverSp_LOWLEVEL_PREVIEW.h; NVIDIA's
// cuSolverSp_LowlevelQR and cuSolverSp_LowlevelCholesky samples) on one sparse SPD matrix (a
// 6 x 6 grid's five-point Laplacian with a varied diagonal, n = 36):
//   1. the CPU path: Cholesky and QR, each as analysis, workspace query, setup (QR),
//      factorization into the program's workspace, zero-pivot check and solve; then LU's
//      analysis, factorization, factor sizes and extraction (cuSolverRf's first half);
//   2. the GPU path: the same Cholesky and QR with device arrays, and the Cholesky factor's
//      diagonal.
// Each solve is checked against the matrix (residual below 1e-9); printed values are rounded
// to 1e-6, so runs on one GPU print the same lines. Host code only.
#include <cusolverSp.h>
#include <cusolverSp_LOWLEVEL_PREVIEW.h>
#include <cusparse.h>

#include <cmath>

#include "common.h"

namespace {

const int kGrid = 6;
const int kN = kGrid * kGrid;

struct Csr {
  std::vector<int> row_ptr, col_ind;
  std::vector<double> val;
  int nnz() const { return (int)col_ind.size(); }
};

Csr laplacian() {
  Csr a;
  a.row_ptr.push_back(0);
  for (int i = 0; i < kN; ++i) {
    int r = i / kGrid, c = i % kGrid;
    int neighbors[5] = {r > 0 ? i - kGrid : -1, c > 0 ? i - 1 : -1, i, c + 1 < kGrid ? i + 1 : -1,
                        r + 1 < kGrid ? i + kGrid : -1};
    for (int j : neighbors) {
      if (j < 0) continue;
      a.col_ind.push_back(j);
      a.val.push_back(j == i ? 4.5 + 0.25 * (i % 3) : -1.0);
    }
    a.row_ptr.push_back((int)a.col_ind.size());
  }
  return a;
}

// max |A x - b|.
double residual(const Csr& a, const std::vector<double>& x, const std::vector<double>& b) {
  double worst = 0;
  for (int i = 0; i < kN; ++i) {
    double s = 0;
    for (int k = a.row_ptr[i]; k < a.row_ptr[i + 1]; ++k) s += a.val[k] * x[a.col_ind[k]];
    worst = std::max(worst, std::fabs(s - b[i]));
  }
  return worst;
}

long long rounded(double v) { return std::llround(v * 1e6); }

}  // namespace

int main() {
  Report report;
  Csr a = laplacian();
  std::vector<double> b(kN);
  for (int i = 0; i < kN; ++i) b[i] = 1.0 + (i % 5);
  cusolverSpHandle_t sp;
  cusparseMatDescr_t descr;
  CHECK_STATUS(cusolverSpCreate(&sp));
  CHECK_STATUS(cusparseCreateMatDescr(&descr));
  size_t internal = 0, workspace = 0;
  int singular = 0;

  // ---- CPU path: Cholesky ----
  csrcholInfoHost_t chol_h;
  CHECK_STATUS(cusolverSpCreateCsrcholInfoHost(&chol_h));
  CHECK_STATUS(cusolverSpXcsrcholAnalysisHost(sp, kN, a.nnz(), descr, a.row_ptr.data(), a.col_ind.data(), chol_h));
  CHECK_STATUS(cusolverSpDcsrcholBufferInfoHost(sp, kN, a.nnz(), descr, a.val.data(), a.row_ptr.data(),
                                                a.col_ind.data(), chol_h, &internal, &workspace));
  std::vector<char> chol_buffer(workspace);
  CHECK_STATUS(cusolverSpDcsrcholFactorHost(sp, kN, a.nnz(), descr, a.val.data(), a.row_ptr.data(),
                                            a.col_ind.data(), chol_h, chol_buffer.data()));
  CHECK_STATUS(cusolverSpDcsrcholZeroPivotHost(sp, chol_h, 1e-14, &singular));
  EXPECT(singular == -1);
  std::vector<double> x(kN, 0.0);
  CHECK_STATUS(cusolverSpDcsrcholSolveHost(sp, kN, b.data(), x.data(), chol_h, chol_buffer.data()));
  EXPECT(residual(a, x, b) < 1e-9);
  report.line("chol host x0", rounded(x[0]));
  report.line("chol host x35", rounded(x[kN - 1]));
  CHECK_STATUS(cusolverSpDestroyCsrcholInfoHost(chol_h));

  // ---- CPU path: QR ----
  csrqrInfoHost_t qr_h;
  CHECK_STATUS(cusolverSpCreateCsrqrInfoHost(&qr_h));
  CHECK_STATUS(cusolverSpXcsrqrAnalysisHost(sp, kN, kN, a.nnz(), descr, a.row_ptr.data(), a.col_ind.data(), qr_h));
  CHECK_STATUS(cusolverSpDcsrqrBufferInfoHost(sp, kN, kN, a.nnz(), descr, a.val.data(), a.row_ptr.data(),
                                              a.col_ind.data(), qr_h, &internal, &workspace));
  std::vector<char> qr_buffer(workspace);
  CHECK_STATUS(cusolverSpDcsrqrSetupHost(sp, kN, kN, a.nnz(), descr, a.val.data(), a.row_ptr.data(),
                                         a.col_ind.data(), 0.0, qr_h));
  CHECK_STATUS(cusolverSpDcsrqrFactorHost(sp, kN, kN, a.nnz(), nullptr, nullptr, qr_h, qr_buffer.data()));
  CHECK_STATUS(cusolverSpDcsrqrZeroPivotHost(sp, qr_h, 1e-14, &singular));
  EXPECT(singular == -1);
  std::vector<double> bq = b, xq(kN, 0.0);
  CHECK_STATUS(cusolverSpDcsrqrSolveHost(sp, kN, kN, bq.data(), xq.data(), qr_h, qr_buffer.data()));
  EXPECT(residual(a, xq, b) < 1e-9);
  report.line("qr host x0", rounded(xq[0]));
  CHECK_STATUS(cusolverSpDestroyCsrqrInfoHost(qr_h));

  // ---- CPU path: LU, factors extracted ----
  csrluInfoHost_t lu_h;
  CHECK_STATUS(cusolverSpCreateCsrluInfoHost(&lu_h));
  CHECK_STATUS(cusolverSpXcsrluAnalysisHost(sp, kN, a.nnz(), descr, a.row_ptr.data(), a.col_ind.data(), lu_h));
  CHECK_STATUS(cusolverSpDcsrluBufferInfoHost(sp, kN, a.nnz(), descr, a.val.data(), a.row_ptr.data(),
                                              a.col_ind.data(), lu_h, &internal, &workspace));
  std::vector<char> lu_buffer(workspace);
  CHECK_STATUS(cusolverSpDcsrluFactorHost(sp, kN, a.nnz(), descr, a.val.data(), a.row_ptr.data(), a.col_ind.data(),
                                          lu_h, 1.0, lu_buffer.data()));
  int nnz_l = 0, nnz_u = 0;
  CHECK_STATUS(cusolverSpXcsrluNnzHost(sp, &nnz_l, &nnz_u, lu_h));
  report.line("lu nnz", (unsigned long long)nnz_l * 100000 + nnz_u);
  std::vector<int> p(kN), q(kN), rows_l(kN + 1), cols_l(nnz_l), rows_u(kN + 1), cols_u(nnz_u);
  std::vector<double> vals_l(nnz_l), vals_u(nnz_u);
  cusparseMatDescr_t descr_l, descr_u;
  // L unit lower, U upper (as NVIDIA's cuSolverRf sets them).
  CHECK_STATUS(cusparseCreateMatDescr(&descr_l));
  CHECK_STATUS(cusparseSetMatFillMode(descr_l, CUSPARSE_FILL_MODE_LOWER));
  CHECK_STATUS(cusparseSetMatDiagType(descr_l, CUSPARSE_DIAG_TYPE_UNIT));
  CHECK_STATUS(cusparseCreateMatDescr(&descr_u));
  CHECK_STATUS(cusparseSetMatFillMode(descr_u, CUSPARSE_FILL_MODE_UPPER));
  CHECK_STATUS(cusparseSetMatDiagType(descr_u, CUSPARSE_DIAG_TYPE_NON_UNIT));
  CHECK_STATUS(cusolverSpDcsrluExtractHost(sp, p.data(), q.data(), descr_l, vals_l.data(), rows_l.data(),
                                           cols_l.data(), descr_u, vals_u.data(), rows_u.data(), cols_u.data(), lu_h,
                                           lu_buffer.data()));
  report.line("lu p q", checksum(p) ^ checksum(q));
  report.line("lu pattern", checksum(rows_l) ^ checksum(cols_l) ^ checksum(rows_u) ^ checksum(cols_u));
  double u_sum = 0;
  for (double v : vals_u) u_sum += v;
  report.line("lu u sum", rounded(u_sum));
  CHECK_STATUS(cusolverSpDestroyCsrluInfoHost(lu_h));

  // ---- GPU path: Cholesky and QR ----
  int *d_rows, *d_cols;
  double *d_vals, *d_b, *d_x;
  CHECK(cudaMalloc(&d_rows, (kN + 1) * sizeof(int)));
  CHECK(cudaMalloc(&d_cols, a.nnz() * sizeof(int)));
  CHECK(cudaMalloc(&d_vals, a.nnz() * sizeof(double)));
  CHECK(cudaMalloc(&d_b, kN * sizeof(double)));
  CHECK(cudaMalloc(&d_x, kN * sizeof(double)));
  CHECK(cudaMemcpy(d_rows, a.row_ptr.data(), (kN + 1) * sizeof(int), cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(d_cols, a.col_ind.data(), a.nnz() * sizeof(int), cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(d_vals, a.val.data(), a.nnz() * sizeof(double), cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(d_b, b.data(), kN * sizeof(double), cudaMemcpyHostToDevice));
  csrcholInfo_t chol_d;
  CHECK_STATUS(cusolverSpCreateCsrcholInfo(&chol_d));
  CHECK_STATUS(cusolverSpXcsrcholAnalysis(sp, kN, a.nnz(), descr, d_rows, d_cols, chol_d));
  CHECK_STATUS(cusolverSpDcsrcholBufferInfo(sp, kN, a.nnz(), descr, d_vals, d_rows, d_cols, chol_d, &internal,
                                            &workspace));
  void* d_buffer;
  CHECK(cudaMalloc(&d_buffer, workspace));
  CHECK_STATUS(cusolverSpDcsrcholFactor(sp, kN, a.nnz(), descr, d_vals, d_rows, d_cols, chol_d, d_buffer));
  CHECK_STATUS(cusolverSpDcsrcholZeroPivot(sp, chol_d, 1e-14, &singular));
  EXPECT(singular == -1);
  CHECK_STATUS(cusolverSpDcsrcholSolve(sp, kN, d_b, d_x, chol_d, d_buffer));
  CHECK(cudaMemcpy(x.data(), d_x, kN * sizeof(double), cudaMemcpyDeviceToHost));
  EXPECT(residual(a, x, b) < 1e-9);
  report.line("chol gpu x0", rounded(x[0]));
  double* d_diag;
  CHECK(cudaMalloc(&d_diag, kN * sizeof(double)));
  CHECK_STATUS(cusolverSpDcsrcholDiag(sp, chol_d, d_diag));
  std::vector<double> diag(kN);
  CHECK(cudaMemcpy(diag.data(), d_diag, kN * sizeof(double), cudaMemcpyDeviceToHost));
  double diag_sum = 0;
  for (double v : diag) diag_sum += v;
  report.line("chol gpu diag", rounded(diag_sum));
  CHECK_STATUS(cusolverSpDestroyCsrcholInfo(chol_d));
  CHECK(cudaFree(d_buffer));

  csrqrInfo_t qr_d;
  CHECK_STATUS(cusolverSpCreateCsrqrInfo(&qr_d));
  CHECK_STATUS(cusolverSpXcsrqrAnalysis(sp, kN, kN, a.nnz(), descr, d_rows, d_cols, qr_d));
  CHECK_STATUS(cusolverSpDcsrqrBufferInfo(sp, kN, kN, a.nnz(), descr, d_vals, d_rows, d_cols, qr_d, &internal,
                                          &workspace));
  CHECK(cudaMalloc(&d_buffer, workspace));
  CHECK_STATUS(cusolverSpDcsrqrSetup(sp, kN, kN, a.nnz(), descr, d_vals, d_rows, d_cols, 0.0, qr_d));
  CHECK_STATUS(cusolverSpDcsrqrFactor(sp, kN, kN, a.nnz(), nullptr, nullptr, qr_d, d_buffer));
  CHECK_STATUS(cusolverSpDcsrqrZeroPivot(sp, qr_d, 1e-14, &singular));
  EXPECT(singular == -1);
  CHECK_STATUS(cusolverSpDcsrqrSolve(sp, kN, kN, d_b, d_x, qr_d, d_buffer));
  CHECK(cudaMemcpy(x.data(), d_x, kN * sizeof(double), cudaMemcpyDeviceToHost));
  EXPECT(residual(a, x, b) < 1e-9);
  report.line("qr gpu x0", rounded(x[0]));
  CHECK_STATUS(cusolverSpDestroyCsrqrInfo(qr_d));

  for (void* ptr : {(void*)d_rows, (void*)d_cols, (void*)d_vals, (void*)d_b, (void*)d_x, (void*)d_diag, d_buffer})
    CHECK(cudaFree(ptr));
  CHECK_STATUS(cusparseDestroyMatDescr(descr_l));
  CHECK_STATUS(cusparseDestroyMatDescr(descr_u));
  CHECK_STATUS(cusparseDestroyMatDescr(descr));
  CHECK_STATUS(cusolverSpDestroy(sp));
  report.done("solver_lowlevel");
  return 0;
}
