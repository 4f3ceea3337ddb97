// cuSPARSE beyond what PyTorch imports, where a pointer's side is easy to get wrong:
//   1. descriptor queries (CsrGet, CscGet, SpVecGet, DnVecGet, SpMatGetValues, the format and
//      index base), which write sizes, types and device addresses into host variables;
//   2. CSR to CSC (Csr2cscEx2) of a non-symmetric matrix, a CSC descriptor, and Xcscsort;
//   3. sparse vectors: SpVV with its result on the host and, in device pointer mode, on the
//      device; Rot with host scalars; gemvi;
//   4. SpGEMM (C = A * A), whose buffer sizes go in and out of each call;
//   5. the tridiagonal solvers (gtsv2, gtsv2_nopivot, gtsv2StridedBatch);
//   6. incomplete Cholesky and LU without fill (csric02, csrilu02 with a numeric boost) of a
//      tridiagonal matrix, where they are exact;
//   7. pruning a dense matrix by a host threshold (pruneDense2csr), counting its nonzeros
//      (nnz), and coloring a matrix's rows (csrcolor).
// Every result is checked against a host model; printed values are exact or rounded to 1e-6.
#include <cusparse.h>

#include <algorithm>
#include <cmath>

#include "common.h"

#define SPARSE(call) CHECK_STATUS(call)

namespace {

struct Csr {
  int rows = 0, cols = 0;
  std::vector<int> row_ptr, col_ind;
  std::vector<double> val;
  int nnz() const { return (int)col_ind.size(); }
};

// A 4 x 4 grid's five-point stencil: diagonal 4 + (i % 3) / 4, the left/upper neighbors -1,
// the right/lower ones -1.125 (not symmetric, so its transpose differs).
Csr stencil() {
  const int grid = 4, n = grid * grid;
  Csr a;
  a.rows = a.cols = n;
  a.row_ptr.push_back(0);
  for (int i = 0; i < n; ++i) {
    int r = i / grid, c = i % grid;
    int neighbors[5] = {r > 0 ? i - grid : -1, c > 0 ? i - 1 : -1, i, c + 1 < grid ? i + 1 : -1,
                        r + 1 < grid ? i + grid : -1};
    for (int j : neighbors) {
      if (j < 0) continue;
      a.col_ind.push_back(j);
      a.val.push_back(j == i ? 4.0 + 0.25 * (i % 3) : (j < i ? -1.0 : -1.125));
    }
    a.row_ptr.push_back(a.nnz());
  }
  return a;
}

Csr transpose(const Csr& a) {
  Csr t;
  t.rows = a.cols;
  t.cols = a.rows;
  t.row_ptr.assign(t.rows + 1, 0);
  for (int j : a.col_ind) t.row_ptr[j + 1]++;
  for (int i = 0; i < t.rows; ++i) t.row_ptr[i + 1] += t.row_ptr[i];
  t.col_ind.resize(a.nnz());
  t.val.resize(a.nnz());
  std::vector<int> next(t.row_ptr.begin(), t.row_ptr.end() - 1);
  for (int i = 0; i < a.rows; ++i)
    for (int k = a.row_ptr[i]; k < a.row_ptr[i + 1]; ++k) {
      int slot = next[a.col_ind[k]]++;
      t.col_ind[slot] = i;
      t.val[slot] = a.val[k];
    }
  return t;
}

std::vector<double> dense(const Csr& a) {
  std::vector<double> d((size_t)a.rows * a.cols, 0.0);
  for (int i = 0; i < a.rows; ++i)
    for (int k = a.row_ptr[i]; k < a.row_ptr[i + 1]; ++k) d[(size_t)i * a.cols + a.col_ind[k]] = a.val[k];
  return d;
}

double max_diff(const std::vector<double>& a, const std::vector<double>& b) {
  EXPECT(a.size() == b.size());
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = fmax(worst, fabs(a[i] - b[i]));
  return worst;
}

unsigned long long rounded(const std::vector<double>& v) {
  std::vector<long long> r(v.size());
  for (size_t i = 0; i < v.size(); ++i) r[i] = llround(v[i] * 1e6);
  return checksum(r);
}

template <typename T>
T* upload(const std::vector<T>& host) {
  T* d = nullptr;
  CHECK(cudaMalloc(&d, (host.empty() ? 1 : host.size()) * sizeof(T)));
  if (!host.empty()) CHECK(cudaMemcpy(d, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

template <typename T>
std::vector<T> download(const T* d, size_t n) {
  std::vector<T> out(n);
  if (n) CHECK(cudaMemcpy(out.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
  return out;
}

void* device_bytes(size_t bytes) {
  void* d = nullptr;
  CHECK(cudaMalloc(&d, bytes > 0 ? bytes : 1));
  return d;
}

// 1 and 2: descriptor queries, CSR to CSC, a CSC descriptor, Xcscsort.
void descriptors(cusparseHandle_t handle, const Csr& a, Report& report) {
  const int n = a.rows, nnz = a.nnz();
  int* d_row_ptr = upload(a.row_ptr);
  int* d_col_ind = upload(a.col_ind);
  double* d_val = upload(a.val);
  cusparseSpMatDescr_t csr = nullptr;
  SPARSE(cusparseCreateCsr(&csr, n, n, nnz, d_row_ptr, d_col_ind, d_val, CUSPARSE_INDEX_32I, CUSPARSE_INDEX_32I,
                           CUSPARSE_INDEX_BASE_ZERO, CUDA_R_64F));
  // Attributes are host values (conjugateGradientPrecond sets the fill mode so).
  cusparseFillMode_t fill = CUSPARSE_FILL_MODE_LOWER, fill_back = CUSPARSE_FILL_MODE_UPPER;
  SPARSE(cusparseSpMatSetAttribute(csr, CUSPARSE_SPMAT_FILL_MODE, &fill, sizeof fill));
  SPARSE(cusparseSpMatGetAttribute(csr, CUSPARSE_SPMAT_FILL_MODE, &fill_back, sizeof fill_back));
  if (fill_back != CUSPARSE_FILL_MODE_LOWER) {
    fprintf(stderr, "fill mode read back as %d\n", (int)fill_back);
    exit(1);
  }
  int64_t rows = 0, cols = 0, count = 0;
  void *row_ptr = nullptr, *col_ind = nullptr, *values = nullptr;
  cusparseIndexType_t row_type = CUSPARSE_INDEX_64I, col_type = CUSPARSE_INDEX_64I;
  cusparseIndexBase_t base = CUSPARSE_INDEX_BASE_ONE;
  cudaDataType value_type = CUDA_R_32F;
  SPARSE(cusparseCsrGet(csr, &rows, &cols, &count, &row_ptr, &col_ind, &values, &row_type, &col_type, &base,
                        &value_type));
  EXPECT(rows == n && cols == n && count == nnz && row_ptr == d_row_ptr && col_ind == d_col_ind && values == d_val);
  EXPECT(row_type == CUSPARSE_INDEX_32I && col_type == CUSPARSE_INDEX_32I && base == CUSPARSE_INDEX_BASE_ZERO &&
         value_type == CUDA_R_64F);
  cusparseFormat_t format = CUSPARSE_FORMAT_COO;
  SPARSE(cusparseSpMatGetFormat(csr, &format));
  base = CUSPARSE_INDEX_BASE_ONE;
  SPARSE(cusparseSpMatGetIndexBase(csr, &base));
  void* got_values = nullptr;
  SPARSE(cusparseSpMatGetValues(csr, &got_values));
  EXPECT(format == CUSPARSE_FORMAT_CSR && base == CUSPARSE_INDEX_BASE_ZERO && got_values == d_val);

  // CSR to CSC: the transpose's CSR.
  int* d_csc_col_ptr = upload(std::vector<int>(n + 1, 0));
  int* d_csc_row_ind = upload(std::vector<int>(nnz, 0));
  double* d_csc_val = upload(std::vector<double>(nnz, 0.0));
  size_t bytes = 0;
  SPARSE(cusparseCsr2cscEx2_bufferSize(handle, n, n, nnz, d_val, d_row_ptr, d_col_ind, d_csc_val, d_csc_col_ptr,
                                       d_csc_row_ind, CUDA_R_64F, CUSPARSE_ACTION_NUMERIC, CUSPARSE_INDEX_BASE_ZERO,
                                       CUSPARSE_CSR2CSC_ALG1, &bytes));
  void* buffer = device_bytes(bytes);
  SPARSE(cusparseCsr2cscEx2(handle, n, n, nnz, d_val, d_row_ptr, d_col_ind, d_csc_val, d_csc_col_ptr, d_csc_row_ind,
                            CUDA_R_64F, CUSPARSE_ACTION_NUMERIC, CUSPARSE_INDEX_BASE_ZERO, CUSPARSE_CSR2CSC_ALG1,
                            buffer));
  Csr t = transpose(a);
  std::vector<int> col_ptr = download(d_csc_col_ptr, n + 1), row_ind = download(d_csc_row_ind, nnz);
  std::vector<double> csc_val = download(d_csc_val, nnz);
  EXPECT(col_ptr == t.row_ptr && row_ind == t.col_ind && max_diff(csc_val, t.val) == 0.0);
  report.line("csr2csc", checksum(col_ptr) ^ checksum(row_ind) ^ rounded(csc_val));

  cusparseSpMatDescr_t csc = nullptr;
  SPARSE(cusparseCreateCsc(&csc, n, n, nnz, d_csc_col_ptr, d_csc_row_ind, d_csc_val, CUSPARSE_INDEX_32I,
                           CUSPARSE_INDEX_32I, CUSPARSE_INDEX_BASE_ZERO, CUDA_R_64F));
  void *offsets = nullptr, *indices = nullptr;
  SPARSE(cusparseCscGet(csc, &rows, &cols, &count, &offsets, &indices, &values, &row_type, &col_type, &base,
                        &value_type));
  EXPECT(rows == n && count == nnz && offsets == d_csc_col_ptr && indices == d_csc_row_ind && values == d_csc_val);
  format = CUSPARSE_FORMAT_CSR;
  SPARSE(cusparseSpMatGetFormat(csc, &format));
  EXPECT(format == CUSPARSE_FORMAT_CSC);

  // Xcscsort: reverse the row indices inside every column, then sort them back; P says where
  // each entry came from.
  std::vector<int> shuffled = t.col_ind;
  for (int j = 0; j < n; ++j) std::reverse(shuffled.begin() + t.row_ptr[j], shuffled.begin() + t.row_ptr[j + 1]);
  int* d_shuffled = upload(shuffled);
  int* d_perm = upload(std::vector<int>(nnz, 0));
  cusparseMatDescr_t descr = nullptr;
  SPARSE(cusparseCreateMatDescr(&descr));
  size_t sort_bytes = 0;
  SPARSE(cusparseXcscsort_bufferSizeExt(handle, n, n, nnz, d_csc_col_ptr, d_shuffled, &sort_bytes));
  void* sort_buffer = device_bytes(sort_bytes);
  SPARSE(cusparseCreateIdentityPermutation(handle, nnz, d_perm));
  SPARSE(cusparseXcscsort(handle, n, n, nnz, descr, d_csc_col_ptr, d_shuffled, d_perm, sort_buffer));
  std::vector<int> sorted = download(d_shuffled, nnz), perm = download(d_perm, nnz);
  EXPECT(sorted == t.col_ind);
  for (int k = 0; k < nnz; ++k) EXPECT(shuffled[perm[k]] == sorted[k]);
  report.line("cscsort", checksum(perm));

  SPARSE(cusparseDestroyMatDescr(descr));
  SPARSE(cusparseDestroySpMat(csr));
  SPARSE(cusparseDestroySpMat(csc));
  for (void* p : {(void*)d_row_ptr, (void*)d_col_ind, (void*)d_val, (void*)d_csc_col_ptr, (void*)d_csc_row_ind,
                  (void*)d_csc_val, buffer, (void*)d_shuffled, (void*)d_perm, sort_buffer})
    CHECK(cudaFree(p));
}

// 3. Sparse vectors: SpVV (host and device result), Rot, gemvi.
void vectors(cusparseHandle_t handle, Report& report) {
  const int size = 40, nnz = 6;
  std::vector<int> ind = {1, 4, 9, 16, 25, 36};
  std::vector<double> xval = {0.5, -1.25, 2.0, 0.75, -0.5, 1.5}, y(size);
  for (int i = 0; i < size; ++i) y[i] = 0.25 * (i % 5) - 0.5;
  int* d_ind = upload(ind);
  double* d_xval = upload(xval);
  double* d_y = upload(y);
  cusparseSpVecDescr_t vec_x = nullptr;
  cusparseDnVecDescr_t vec_y = nullptr;
  SPARSE(cusparseCreateSpVec(&vec_x, size, nnz, d_ind, d_xval, CUSPARSE_INDEX_32I, CUSPARSE_INDEX_BASE_ZERO,
                             CUDA_R_64F));
  SPARSE(cusparseCreateDnVec(&vec_y, size, d_y, CUDA_R_64F));
  int64_t got_size = 0, got_nnz = 0;
  void *indices = nullptr, *values = nullptr;
  cusparseIndexType_t index_type = CUSPARSE_INDEX_64I;
  cusparseIndexBase_t base = CUSPARSE_INDEX_BASE_ONE;
  cudaDataType value_type = CUDA_R_32F;
  SPARSE(cusparseSpVecGet(vec_x, &got_size, &got_nnz, &indices, &values, &index_type, &base, &value_type));
  EXPECT(got_size == size && got_nnz == nnz && indices == d_ind && values == d_xval &&
         index_type == CUSPARSE_INDEX_32I && base == CUSPARSE_INDEX_BASE_ZERO && value_type == CUDA_R_64F);
  SPARSE(cusparseDnVecGet(vec_y, &got_size, &values, &value_type));
  EXPECT(got_size == size && values == d_y && value_type == CUDA_R_64F);

  double want = 0;
  for (int k = 0; k < nnz; ++k) want += xval[k] * y[ind[k]];
  // The dot product on the host (the default pointer mode), then into device memory.
  double result = 0;
  size_t bytes = 0;
  SPARSE(cusparseSpVV_bufferSize(handle, CUSPARSE_OPERATION_NON_TRANSPOSE, vec_x, vec_y, &result, CUDA_R_64F, &bytes));
  void* buffer = device_bytes(bytes);
  SPARSE(cusparseSpVV(handle, CUSPARSE_OPERATION_NON_TRANSPOSE, vec_x, vec_y, &result, CUDA_R_64F, buffer));
  EXPECT(fabs(result - want) < 1e-12);
  cusparsePointerMode_t mode = CUSPARSE_POINTER_MODE_DEVICE;
  SPARSE(cusparseGetPointerMode(handle, &mode));
  EXPECT(mode == CUSPARSE_POINTER_MODE_HOST);
  SPARSE(cusparseSetPointerMode(handle, CUSPARSE_POINTER_MODE_DEVICE));
  SPARSE(cusparseGetPointerMode(handle, &mode));
  EXPECT(mode == CUSPARSE_POINTER_MODE_DEVICE);
  double* d_result = upload(std::vector<double>(1, 0.0));
  SPARSE(cusparseSpVV(handle, CUSPARSE_OPERATION_NON_TRANSPOSE, vec_x, vec_y, d_result, CUDA_R_64F, buffer));
  double device_result = download(d_result, 1)[0];
  EXPECT(fabs(device_result - want) < 1e-12);
  SPARSE(cusparseSetPointerMode(handle, CUSPARSE_POINTER_MODE_HOST));
  report.line("spvv", rounded({result, device_result}));

  // Rot: x_k, y_ind[k] <- c x_k + s y, c y - s x_k.
  const double c = 0.6, s = 0.8;
  SPARSE(cusparseRot(handle, &c, &s, vec_x, vec_y));
  std::vector<double> want_x = xval, want_y = y;
  for (int k = 0; k < nnz; ++k) {
    want_x[k] = c * xval[k] + s * y[ind[k]];
    want_y[ind[k]] = c * y[ind[k]] - s * xval[k];
  }
  std::vector<double> got_x = download(d_xval, nnz), got_y = download(d_y, size);
  EXPECT(max_diff(got_x, want_x) < 1e-12 && max_diff(got_y, want_y) < 1e-12);
  report.line("rot", rounded(got_x) ^ rounded(got_y));

  // gemvi: y2 = 2 * A * x + 0.5 * y2 with a dense 8 x 40 A (column-major) and the sparse x.
  const int m = 8;
  std::vector<double> a_dense((size_t)m * size), y2(m);
  for (int j = 0; j < size; ++j)
    for (int i = 0; i < m; ++i) a_dense[(size_t)j * m + i] = sin(0.1 * (i + 1) * (j + 2));
  for (int i = 0; i < m; ++i) y2[i] = 1.0 - 0.125 * i;
  std::vector<double> want_y2(m);
  for (int i = 0; i < m; ++i) {
    double sum = 0;
    for (int k = 0; k < nnz; ++k) sum += a_dense[(size_t)ind[k] * m + i] * got_x[k];
    want_y2[i] = 2.0 * sum + 0.5 * y2[i];
  }
  double* d_a = upload(a_dense);
  double* d_y2 = upload(y2);
  int gemvi_bytes = 0;
  SPARSE(cusparseDgemvi_bufferSize(handle, CUSPARSE_OPERATION_NON_TRANSPOSE, m, size, nnz, &gemvi_bytes));
  void* gemvi_buffer = device_bytes((size_t)gemvi_bytes);
  const double alpha = 2.0, beta = 0.5;
  SPARSE(cusparseDgemvi(handle, CUSPARSE_OPERATION_NON_TRANSPOSE, m, size, &alpha, d_a, m, nnz, d_xval, d_ind, &beta,
                        d_y2, CUSPARSE_INDEX_BASE_ZERO, gemvi_buffer));
  std::vector<double> got_y2 = download(d_y2, m);
  EXPECT(max_diff(got_y2, want_y2) < 1e-12);
  report.line("gemvi", rounded(got_y2));

  SPARSE(cusparseDestroySpVec(vec_x));
  SPARSE(cusparseDestroyDnVec(vec_y));
  for (void* p : {(void*)d_ind, (void*)d_xval, (void*)d_y, buffer, (void*)d_result, (void*)d_a, (void*)d_y2, gemvi_buffer})
    CHECK(cudaFree(p));
}

// 4. SpGEMM: C = A * A.
void spgemm(cusparseHandle_t handle, const Csr& a, Report& report) {
  const int n = a.rows, nnz = a.nnz();
  int* d_row_ptr = upload(a.row_ptr);
  int* d_col_ind = upload(a.col_ind);
  double* d_val = upload(a.val);
  int* d_c_row_ptr = upload(std::vector<int>(n + 1, 0));
  cusparseSpMatDescr_t mat_a = nullptr, mat_c = nullptr;
  SPARSE(cusparseCreateCsr(&mat_a, n, n, nnz, d_row_ptr, d_col_ind, d_val, CUSPARSE_INDEX_32I, CUSPARSE_INDEX_32I,
                           CUSPARSE_INDEX_BASE_ZERO, CUDA_R_64F));
  SPARSE(cusparseCreateCsr(&mat_c, n, n, 0, d_c_row_ptr, nullptr, nullptr, CUSPARSE_INDEX_32I, CUSPARSE_INDEX_32I,
                           CUSPARSE_INDEX_BASE_ZERO, CUDA_R_64F));
  cusparseSpGEMMDescr_t descr = nullptr;
  SPARSE(cusparseSpGEMM_createDescr(&descr));
  const double alpha = 1.0, beta = 0.0;
  const cusparseOperation_t op = CUSPARSE_OPERATION_NON_TRANSPOSE;
  // Each phase is asked its size with a NULL buffer, then run with the size it answered.
  size_t bytes1 = 0, bytes2 = 0;
  SPARSE(cusparseSpGEMM_workEstimation(handle, op, op, &alpha, mat_a, mat_a, &beta, mat_c, CUDA_R_64F,
                                       CUSPARSE_SPGEMM_DEFAULT, descr, &bytes1, nullptr));
  void* buffer1 = device_bytes(bytes1);
  SPARSE(cusparseSpGEMM_workEstimation(handle, op, op, &alpha, mat_a, mat_a, &beta, mat_c, CUDA_R_64F,
                                       CUSPARSE_SPGEMM_DEFAULT, descr, &bytes1, buffer1));
  SPARSE(cusparseSpGEMM_compute(handle, op, op, &alpha, mat_a, mat_a, &beta, mat_c, CUDA_R_64F, CUSPARSE_SPGEMM_DEFAULT,
                                descr, &bytes2, nullptr));
  void* buffer2 = device_bytes(bytes2);
  SPARSE(cusparseSpGEMM_compute(handle, op, op, &alpha, mat_a, mat_a, &beta, mat_c, CUDA_R_64F, CUSPARSE_SPGEMM_DEFAULT,
                                descr, &bytes2, buffer2));
  int64_t rows = 0, cols = 0, nnz_c = 0;
  SPARSE(cusparseSpMatGetSize(mat_c, &rows, &cols, &nnz_c));
  int* d_c_col_ind = upload(std::vector<int>(nnz_c, 0));
  double* d_c_val = upload(std::vector<double>(nnz_c, 0.0));
  SPARSE(cusparseCsrSetPointers(mat_c, d_c_row_ptr, d_c_col_ind, d_c_val));
  SPARSE(cusparseSpGEMM_copy(handle, op, op, &alpha, mat_a, mat_a, &beta, mat_c, CUDA_R_64F, CUSPARSE_SPGEMM_DEFAULT,
                             descr));
  Csr c;
  c.rows = c.cols = n;
  c.row_ptr = download(d_c_row_ptr, n + 1);
  c.col_ind = download(d_c_col_ind, nnz_c);
  c.val = download(d_c_val, nnz_c);
  std::vector<double> a_dense = dense(a), want((size_t)n * n, 0.0);
  for (int i = 0; i < n; ++i)
    for (int k = 0; k < n; ++k)
      for (int j = 0; j < n; ++j) want[(size_t)i * n + j] += a_dense[(size_t)i * n + k] * a_dense[(size_t)k * n + j];
  EXPECT(rows == n && cols == n && max_diff(dense(c), want) < 1e-12);
  report.line("spgemm", (unsigned long long)nnz_c ^ rounded(dense(c)));
  SPARSE(cusparseSpGEMM_destroyDescr(descr));
  SPARSE(cusparseDestroySpMat(mat_a));
  SPARSE(cusparseDestroySpMat(mat_c));
  for (void* p : {(void*)d_row_ptr, (void*)d_col_ind, (void*)d_val, (void*)d_c_row_ptr, (void*)d_c_col_ind,
                  (void*)d_c_val, buffer1, buffer2})
    CHECK(cudaFree(p));
}

// The tridiagonal system's solution by the Thomas algorithm.
std::vector<double> thomas(const std::vector<double>& dl, const std::vector<double>& d, const std::vector<double>& du,
                           std::vector<double> b) {
  const size_t m = d.size();
  std::vector<double> diag = d;
  for (size_t i = 1; i < m; ++i) {
    double f = dl[i] / diag[i - 1];
    diag[i] -= f * du[i - 1];
    b[i] -= f * b[i - 1];
  }
  std::vector<double> x(m);
  x[m - 1] = b[m - 1] / diag[m - 1];
  for (size_t i = m - 1; i-- > 0;) x[i] = (b[i] - du[i] * x[i + 1]) / diag[i];
  return x;
}

// 5. Tridiagonal solvers: two right-hand sides (gtsv2, gtsv2_nopivot), then three systems
//    stored one after the other (gtsv2StridedBatch).
void tridiagonal(cusparseHandle_t handle, Report& report) {
  const int m = 32, nrhs = 2;
  std::vector<double> dl(m), d(m), du(m), b((size_t)m * nrhs), want((size_t)m * nrhs);
  for (int i = 0; i < m; ++i) {
    dl[i] = i == 0 ? 0.0 : -1.0 - 0.01 * i;
    du[i] = i == m - 1 ? 0.0 : -0.5 + 0.02 * i;
    d[i] = 3.0 + 0.1 * (i % 4);
  }
  for (int c = 0; c < nrhs; ++c) {
    std::vector<double> rhs(m);
    for (int i = 0; i < m; ++i) rhs[i] = 1.0 + c + 0.25 * (i % 3);
    std::vector<double> x = thomas(dl, d, du, rhs);
    std::copy(rhs.begin(), rhs.end(), b.begin() + (size_t)c * m);
    std::copy(x.begin(), x.end(), want.begin() + (size_t)c * m);
  }
  double* d_dl = upload(dl);
  double* d_d = upload(d);
  double* d_du = upload(du);
  for (int pivot = 1; pivot >= 0; --pivot) {
    double* d_b = upload(b);
    size_t bytes = 0;
    if (pivot) {
      SPARSE(cusparseDgtsv2_bufferSizeExt(handle, m, nrhs, d_dl, d_d, d_du, d_b, m, &bytes));
    } else {
      SPARSE(cusparseDgtsv2_nopivot_bufferSizeExt(handle, m, nrhs, d_dl, d_d, d_du, d_b, m, &bytes));
    }
    void* buffer = device_bytes(bytes);
    if (pivot) {
      SPARSE(cusparseDgtsv2(handle, m, nrhs, d_dl, d_d, d_du, d_b, m, buffer));
    } else {
      SPARSE(cusparseDgtsv2_nopivot(handle, m, nrhs, d_dl, d_d, d_du, d_b, m, buffer));
    }
    std::vector<double> x = download(d_b, (size_t)m * nrhs);
    EXPECT(max_diff(x, want) < 1e-12);
    report.line(pivot ? "gtsv2" : "gtsv2 nopivot", rounded(x));
    CHECK(cudaFree(buffer));
    CHECK(cudaFree(d_b));
  }

  const int batch = 3;
  std::vector<double> dls, ds, dus, xs, wants;
  for (int k = 0; k < batch; ++k) {
    std::vector<double> dk = d, rhs(m);
    for (int i = 0; i < m; ++i) {
      dk[i] += 0.5 * k;
      rhs[i] = 2.0 - 0.125 * ((i + k) % 5);
    }
    std::vector<double> x = thomas(dl, dk, du, rhs);
    dls.insert(dls.end(), dl.begin(), dl.end());
    ds.insert(ds.end(), dk.begin(), dk.end());
    dus.insert(dus.end(), du.begin(), du.end());
    xs.insert(xs.end(), rhs.begin(), rhs.end());
    wants.insert(wants.end(), x.begin(), x.end());
  }
  double* d_dls = upload(dls);
  double* d_ds = upload(ds);
  double* d_dus = upload(dus);
  double* d_xs = upload(xs);
  size_t bytes = 0;
  SPARSE(cusparseDgtsv2StridedBatch_bufferSizeExt(handle, m, d_dls, d_ds, d_dus, d_xs, batch, m, &bytes));
  void* buffer = device_bytes(bytes);
  SPARSE(cusparseDgtsv2StridedBatch(handle, m, d_dls, d_ds, d_dus, d_xs, batch, m, buffer));
  std::vector<double> x = download(d_xs, (size_t)m * batch);
  EXPECT(max_diff(x, wants) < 1e-12);
  report.line("gtsv2 batched", rounded(x));
  for (void* p : {(void*)d_dl, (void*)d_d, (void*)d_du, (void*)d_dls, (void*)d_ds, (void*)d_dus, (void*)d_xs, buffer})
    CHECK(cudaFree(p));
}

// 6. csric02 and csrilu02 of a symmetric tridiagonal matrix: no fill, so the incomplete
//    factors are the exact Cholesky and LU factors.
void incomplete(cusparseHandle_t handle, Report& report) {
  const int m = 24;
  Csr a;
  a.rows = a.cols = m;
  a.row_ptr.push_back(0);
  for (int i = 0; i < m; ++i) {
    for (int j = i - 1; j <= i + 1; ++j) {
      if (j < 0 || j >= m) continue;
      a.col_ind.push_back(j);
      a.val.push_back(j == i ? 2.5 + 0.125 * (i % 4) : -1.0);
    }
    a.row_ptr.push_back(a.nnz());
  }
  const int nnz = a.nnz();
  // Host Cholesky of the tridiagonal: L(i,i), L(i,i-1).
  std::vector<double> diag(m), sub(m, 0.0);
  for (int i = 0; i < m; ++i) {
    double d = a.val[a.row_ptr[i] + (i > 0 ? 1 : 0)];
    if (i > 0) {
      sub[i] = -1.0 / diag[i - 1];
      d -= sub[i] * sub[i];
    }
    diag[i] = sqrt(d);
  }
  // csric02 leaves L in the lower triangle (the upper one it ignores): compared there.
  std::vector<double> want_ic;
  for (int i = 0; i < m; ++i) {
    if (i > 0) want_ic.push_back(sub[i]);
    want_ic.push_back(diag[i]);
  }
  // csrilu02 leaves U on and above the diagonal and L (unit diagonal) below it.
  std::vector<double> want_ilu = a.val, pivots(m);
  for (int i = 0; i < m; ++i) {
    int k = a.row_ptr[i];
    double d = a.val[k + (i > 0 ? 1 : 0)];
    if (i > 0) {
      double l = -1.0 / pivots[i - 1];
      want_ilu[k++] = l;
      d -= l * -1.0;
    }
    pivots[i] = d;
    want_ilu[k] = d;
  }

  int* d_row_ptr = upload(a.row_ptr);
  int* d_col_ind = upload(a.col_ind);
  cusparseMatDescr_t descr = nullptr;
  SPARSE(cusparseCreateMatDescr(&descr));
  SPARSE(cusparseSetMatType(descr, CUSPARSE_MATRIX_TYPE_GENERAL));
  SPARSE(cusparseSetMatIndexBase(descr, CUSPARSE_INDEX_BASE_ZERO));
  const cusparseSolvePolicy_t policy = CUSPARSE_SOLVE_POLICY_USE_LEVEL;

  double* d_val = upload(a.val);
  csric02Info_t ic = nullptr;
  SPARSE(cusparseCreateCsric02Info(&ic));
  // The int-sized query: cuSPARSE 12.6 (CUDA 13.0) declares the _bufferSizeExt forms of
  // csric02/csrilu02 but its library exports neither (nm -D), so a program using them does
  // not link.
  int ic_bytes = 0;
  SPARSE(cusparseDcsric02_bufferSize(handle, m, nnz, descr, d_val, d_row_ptr, d_col_ind, ic, &ic_bytes));
  void* buffer = device_bytes(size_t(ic_bytes));
  SPARSE(cusparseDcsric02_analysis(handle, m, nnz, descr, d_val, d_row_ptr, d_col_ind, ic, policy, buffer));
  int position = 0;
  EXPECT(cusparseXcsric02_zeroPivot(handle, ic, &position) == CUSPARSE_STATUS_SUCCESS);
  SPARSE(cusparseDcsric02(handle, m, nnz, descr, d_val, d_row_ptr, d_col_ind, ic, policy, buffer));
  EXPECT(cusparseXcsric02_zeroPivot(handle, ic, &position) == CUSPARSE_STATUS_SUCCESS);
  std::vector<double> all = download(d_val, nnz), got;
  for (int i = 0; i < m; ++i)
    for (int k = a.row_ptr[i]; k < a.row_ptr[i + 1]; ++k)
      if (a.col_ind[k] <= i) got.push_back(all[k]);
  EXPECT(max_diff(got, want_ic) < 1e-12);
  report.line("csric02", rounded(got));
  SPARSE(cusparseDestroyCsric02Info(ic));
  CHECK(cudaFree(buffer));
  CHECK(cudaFree(d_val));

  // ILU(0) with a numeric boost that never fires (no pivot is below the tolerance).
  d_val = upload(a.val);
  csrilu02Info_t ilu = nullptr;
  SPARSE(cusparseCreateCsrilu02Info(&ilu));
  double tol = 1e-8, boost = 1e-4;
  SPARSE(cusparseDcsrilu02_numericBoost(handle, ilu, 1, &tol, &boost));
  int ilu_bytes = 0;
  SPARSE(cusparseDcsrilu02_bufferSize(handle, m, nnz, descr, d_val, d_row_ptr, d_col_ind, ilu, &ilu_bytes));
  buffer = device_bytes(size_t(ilu_bytes));
  SPARSE(cusparseDcsrilu02_analysis(handle, m, nnz, descr, d_val, d_row_ptr, d_col_ind, ilu, policy, buffer));
  SPARSE(cusparseDcsrilu02(handle, m, nnz, descr, d_val, d_row_ptr, d_col_ind, ilu, policy, buffer));
  EXPECT(cusparseXcsrilu02_zeroPivot(handle, ilu, &position) == CUSPARSE_STATUS_SUCCESS);
  got = download(d_val, nnz);
  EXPECT(max_diff(got, want_ilu) < 1e-12);
  report.line("csrilu02", rounded(got));
  SPARSE(cusparseDestroyCsrilu02Info(ilu));
  SPARSE(cusparseDestroyMatDescr(descr));
  for (void* p : {(void*)d_row_ptr, (void*)d_col_ind, (void*)d_val, buffer}) CHECK(cudaFree(p));
}

// 7. Pruning by a host threshold, counting nonzeros per row, coloring.
void prune_count_color(cusparseHandle_t handle, const Csr& a, Report& report) {
  const int m = 10, n = 7;
  std::vector<double> dense_a((size_t)m * n);  // column-major
  for (int j = 0; j < n; ++j)
    for (int i = 0; i < m; ++i) dense_a[(size_t)j * m + i] = ((i * 7 + j * 3) % 11 - 5) * 0.125;
  const double threshold = 0.3;
  Csr want;
  want.rows = m;
  want.cols = n;
  want.row_ptr.push_back(0);
  std::vector<int> want_per_row(m, 0);
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      double v = dense_a[(size_t)j * m + i];
      if (v != 0.0) want_per_row[i]++;
      if (fabs(v) > threshold) {
        want.col_ind.push_back(j);
        want.val.push_back(v);
      }
    }
    want.row_ptr.push_back(want.nnz());
  }
  double* d_a = upload(dense_a);
  cusparseMatDescr_t descr = nullptr;
  SPARSE(cusparseCreateMatDescr(&descr));
  SPARSE(cusparseSetMatType(descr, CUSPARSE_MATRIX_TYPE_GENERAL));
  SPARSE(cusparseSetMatIndexBase(descr, CUSPARSE_INDEX_BASE_ZERO));

  int* d_per_row = upload(std::vector<int>(m, 0));
  int total = 0;
  SPARSE(cusparseDnnz(handle, CUSPARSE_DIRECTION_ROW, m, n, descr, d_a, m, d_per_row, &total));
  std::vector<int> per_row = download(d_per_row, m);
  EXPECT(per_row == want_per_row);
  report.line("nnz per row", checksum(per_row) ^ (unsigned long long)total);

  int* d_row_ptr = upload(std::vector<int>(m + 1, 0));
  size_t bytes = 0;
  SPARSE(cusparseDpruneDense2csr_bufferSizeExt(handle, m, n, d_a, m, &threshold, descr, nullptr, d_row_ptr, nullptr,
                                               &bytes));
  void* buffer = device_bytes(bytes);
  int nnz_c = -1;
  SPARSE(cusparseDpruneDense2csrNnz(handle, m, n, d_a, m, &threshold, descr, d_row_ptr, &nnz_c, buffer));
  EXPECT(nnz_c == want.nnz());
  int* d_col_ind = upload(std::vector<int>(nnz_c, 0));
  double* d_val = upload(std::vector<double>(nnz_c, 0.0));
  SPARSE(cusparseDpruneDense2csr(handle, m, n, d_a, m, &threshold, descr, d_val, d_row_ptr, d_col_ind, buffer));
  std::vector<int> row_ptr = download(d_row_ptr, m + 1), col_ind = download(d_col_ind, nnz_c);
  std::vector<double> val = download(d_val, nnz_c);
  EXPECT(row_ptr == want.row_ptr && col_ind == want.col_ind && max_diff(val, want.val) == 0.0);
  report.line("prune dense", checksum(row_ptr) ^ checksum(col_ind) ^ rounded(val));

  // Coloring of the stencil: rows that share a column get different colors.
  const int rows = a.rows, nnz = a.nnz();
  int* d_s_row_ptr = upload(a.row_ptr);
  int* d_s_col_ind = upload(a.col_ind);
  double* d_s_val = upload(a.val);
  int* d_coloring = upload(std::vector<int>(rows, -1));
  int* d_reordering = upload(std::vector<int>(rows, -1));
  cusparseColorInfo_t info = nullptr;
  SPARSE(cusparseCreateColorInfo(&info));
  const double fraction = 1.0;
  int ncolors = 0;
  SPARSE(cusparseDcsrcolor(handle, rows, nnz, descr, d_s_val, d_s_row_ptr, d_s_col_ind, &fraction, &ncolors,
                           d_coloring, d_reordering, info));
  std::vector<int> coloring = download(d_coloring, rows), reordering = download(d_reordering, rows);
  EXPECT(ncolors >= 2);
  for (int i = 0; i < rows; ++i) {
    EXPECT(coloring[i] >= 0 && coloring[i] < ncolors);
    for (int k = a.row_ptr[i]; k < a.row_ptr[i + 1]; ++k)
      if (a.col_ind[k] != i) EXPECT(coloring[a.col_ind[k]] != coloring[i]);
  }
  std::sort(reordering.begin(), reordering.end());
  for (int i = 0; i < rows; ++i) EXPECT(reordering[i] == i);
  SPARSE(cusparseDestroyColorInfo(info));
  SPARSE(cusparseDestroyMatDescr(descr));
  for (void* p : {(void*)d_a, (void*)d_per_row, (void*)d_row_ptr, buffer, (void*)d_col_ind, (void*)d_val,
                  (void*)d_s_row_ptr, (void*)d_s_col_ind, (void*)d_s_val, (void*)d_coloring, (void*)d_reordering})
    CHECK(cudaFree(p));
}

}  // namespace

int main() {
  Report report;
  cusparseHandle_t handle = nullptr;
  SPARSE(cusparseCreate(&handle));
  const Csr a = stencil();
  descriptors(handle, a, report);
  vectors(handle, report);
  spgemm(handle, a, report);
  tridiagonal(handle, report);
  incomplete(handle, report);
  prune_count_color(handle, a, report);
  SPARSE(cusparseDestroy(handle));
  report.done("sparse");
  return 0;
}
