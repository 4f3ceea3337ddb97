// cuSOLVER beyond what PyTorch imports, on one small sparse SPD matrix (a 4 x 4 grid's
// five-point Laplacian with a varied diagonal, n = 16) and its dense copy:
//   1. cuSolverSP's CPU path: the symmetry check, the four fill-reducing orderings, the
//      permutation's workspace query, zero-free diagonal, LU / QR / Cholesky solves, the
//      least-squares solve, the shift-inverse eigen solver and the eigenvalue count in a box;
//   2. cuSolverSP's GPU path: QR and Cholesky solves, the shift-inverse eigen solver, and the
//      batched QR of three matrices of the same pattern;
//   3. cuSolverRF: the LU factors (computed here on the host) set up from the host, analysed,
//      refactored and solved; then a second matrix of the same pattern reset from the device,
//      refactored and solved, and the handle's settings read back;
//   4. cuSolverDN: syevdx (the five smallest eigenvalues), sygvdx (a range of values), gebrd,
//      sytrd, and mixed-precision iterative refinement (DDgesv, DHgesv, IRSXgesv).
// Every result is checked against a host model; the printed values are rounded to 1e-6 (and
// permutations and counts are exact), so runs on one GPU print the same lines.
//
// cusolverSpXcsrpermHost's host workspace has a size no parameter carries (Chidori asks
// cusolverSpXcsrperm_bufferSizeHost itself); its B = Q*A*Q^T is checked against the host's.
#include <cusolverDn.h>
#include <cusolverRf.h>
#include <cusolverSp.h>
#include <cusparse.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "common.h"

// A cuSOLVER call: CHECK_STATUS names it and its status.
#define SOLVER(call) CHECK_STATUS(call)

namespace {

const int kGrid = 4;
const int kN = kGrid * kGrid;

// A CSR matrix with 0-based indices.
struct Csr {
  int n = 0;
  std::vector<int> row_ptr, col_ind;
  std::vector<double> val;
  int nnz() const { return (int)col_ind.size(); }
};

// The grid's five-point Laplacian with diagonal 4 + shift + (i % 3) / 4: symmetric, strictly
// diagonally dominant for shift > 0, so SPD.
Csr laplacian(double shift) {
  Csr a;
  a.n = kN;
  a.row_ptr.push_back(0);
  for (int i = 0; i < kN; ++i) {
    int r = i / kGrid, c = i % kGrid;
    int neighbors[5] = {r > 0 ? i - kGrid : -1, c > 0 ? i - 1 : -1, i, c + 1 < kGrid ? i + 1 : -1,
                        r + 1 < kGrid ? i + kGrid : -1};
    for (int j : neighbors) {
      if (j < 0) continue;
      a.col_ind.push_back(j);
      a.val.push_back(j == i ? 4.0 + shift + 0.25 * (i % 3) : -1.0);
    }
    a.row_ptr.push_back((int)a.col_ind.size());
  }
  return a;
}

std::vector<double> dense(const Csr& a) {
  std::vector<double> d((size_t)a.n * a.n, 0.0);
  for (int i = 0; i < a.n; ++i)
    for (int k = a.row_ptr[i]; k < a.row_ptr[i + 1]; ++k) d[(size_t)i * a.n + a.col_ind[k]] = a.val[k];
  return d;
}

// Row-major dense solve by Gaussian elimination with partial pivoting.
std::vector<double> solve(std::vector<double> m, std::vector<double> b, int n) {
  for (int k = 0; k < n; ++k) {
    int p = k;
    for (int i = k + 1; i < n; ++i)
      if (fabs(m[(size_t)i * n + k]) > fabs(m[(size_t)p * n + k])) p = i;
    for (int j = 0; j < n; ++j) std::swap(m[(size_t)k * n + j], m[(size_t)p * n + j]);
    std::swap(b[k], b[p]);
    for (int i = k + 1; i < n; ++i) {
      double f = m[(size_t)i * n + k] / m[(size_t)k * n + k];
      for (int j = k; j < n; ++j) m[(size_t)i * n + j] -= f * m[(size_t)k * n + j];
      b[i] -= f * b[k];
    }
  }
  std::vector<double> x(n);
  for (int i = n - 1; i >= 0; --i) {
    double s = b[i];
    for (int j = i + 1; j < n; ++j) s -= m[(size_t)i * n + j] * x[j];
    x[i] = s / m[(size_t)i * n + i];
  }
  return x;
}

// The eigenvalues of a symmetric row-major matrix, ascending (cyclic Jacobi rotations).
std::vector<double> eigenvalues(std::vector<double> m, int n) {
  for (int sweep = 0; sweep < 100; ++sweep) {
    double off = 0;
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j)
        if (i != j) off += m[(size_t)i * n + j] * m[(size_t)i * n + j];
    if (off < 1e-26) break;
    for (int p = 0; p < n; ++p)
      for (int q = p + 1; q < n; ++q) {
        double apq = m[(size_t)p * n + q];
        if (fabs(apq) < 1e-300) continue;
        double theta = (m[(size_t)q * n + q] - m[(size_t)p * n + p]) / (2 * apq);
        double t = (theta >= 0 ? 1.0 : -1.0) / (fabs(theta) + sqrt(theta * theta + 1));
        double c = 1 / sqrt(t * t + 1), s = t * c;
        for (int k = 0; k < n; ++k) {
          double mkp = m[(size_t)k * n + p], mkq = m[(size_t)k * n + q];
          m[(size_t)k * n + p] = c * mkp - s * mkq;
          m[(size_t)k * n + q] = s * mkp + c * mkq;
        }
        for (int k = 0; k < n; ++k) {
          double mpk = m[(size_t)p * n + k], mqk = m[(size_t)q * n + k];
          m[(size_t)p * n + k] = c * mpk - s * mqk;
          m[(size_t)q * n + k] = s * mpk + c * mqk;
        }
      }
  }
  std::vector<double> w(n);
  for (int i = 0; i < n; ++i) w[i] = m[(size_t)i * n + i];
  std::sort(w.begin(), w.end());
  return w;
}

double max_diff(const std::vector<double>& a, const std::vector<double>& b) {
  EXPECT(a.size() == b.size());
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = fmax(worst, fabs(a[i] - b[i]));
  return worst;
}

// Values rounded to 1e-6: what a run prints of floating-point results.
unsigned long long rounded(const std::vector<double>& v) {
  std::vector<long long> r(v.size());
  for (size_t i = 0; i < v.size(); ++i) r[i] = llround(v[i] * 1e6);
  return checksum(r);
}

bool is_permutation(const std::vector<int>& p, int n) {
  std::vector<int> sorted = p;
  std::sort(sorted.begin(), sorted.end());
  for (int i = 0; i < n; ++i)
    if (sorted[i] != i) return false;
  return (int)p.size() == n;
}

std::vector<double> times(const Csr& a, const std::vector<double>& x) {
  std::vector<double> y(a.n, 0.0);
  for (int i = 0; i < a.n; ++i)
    for (int k = a.row_ptr[i]; k < a.row_ptr[i + 1]; ++k) y[i] += a.val[k] * x[a.col_ind[k]];
  return y;
}

template <typename T>
T* upload(const std::vector<T>& host) {
  T* d = nullptr;
  CHECK(cudaMalloc(&d, host.size() * sizeof(T)));
  CHECK(cudaMemcpy(d, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

template <typename T>
std::vector<T> download(const T* d, size_t n) {
  std::vector<T> out(n);
  CHECK(cudaMemcpy(out.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
  return out;
}

std::vector<double> right_hand_side(int n, double scale) {
  std::vector<double> b(n);
  for (int i = 0; i < n; ++i) b[i] = scale * (1.0 + (double)i / n);
  return b;
}

// 1. cuSolverSP, CPU path.
void sparse_host(cusolverSpHandle_t sp, cusparseMatDescr_t descr, const Csr& a, Report& report) {
  const int n = a.n, nnz = a.nnz();
  int issym = 0;
  SOLVER(cusolverSpXcsrissymHost(sp, n, nnz, descr, a.row_ptr.data(), a.row_ptr.data() + 1, a.col_ind.data(),
                                 &issym));
  EXPECT(issym == 1);

  std::vector<int> rcm(n), amd(n), mdq(n), metis(n);
  SOLVER(cusolverSpXcsrsymrcmHost(sp, n, nnz, descr, a.row_ptr.data(), a.col_ind.data(), rcm.data()));
  SOLVER(cusolverSpXcsrsymamdHost(sp, n, nnz, descr, a.row_ptr.data(), a.col_ind.data(), amd.data()));
  SOLVER(cusolverSpXcsrsymmdqHost(sp, n, nnz, descr, a.row_ptr.data(), a.col_ind.data(), mdq.data()));
  SOLVER(cusolverSpXcsrmetisndHost(sp, n, nnz, descr, a.row_ptr.data(), a.col_ind.data(), nullptr, metis.data()));
  EXPECT(is_permutation(rcm, n) && is_permutation(amd, n) && is_permutation(mdq, n) && is_permutation(metis, n));
  report.line("sp symrcm", checksum(rcm));
  report.line("sp symamd", checksum(amd));
  report.line("sp symmdq", checksum(mdq));
  report.line("sp metisnd", checksum(metis));

  size_t perm_bytes = 0;
  SOLVER(cusolverSpXcsrperm_bufferSizeHost(sp, n, n, nnz, descr, a.row_ptr.data(), a.col_ind.data(), rcm.data(),
                                           rcm.data(), &perm_bytes));
  EXPECT(perm_bytes > 0);

  // B = Q*A*Q^T with Q = symrcm(A): B(i, j) = A(q[i], q[j]), formed here.
  std::vector<int> inverse(n);
  for (int i = 0; i < n; ++i) inverse[rcm[i]] = i;
  Csr b_matrix;
  b_matrix.n = n;
  b_matrix.row_ptr.push_back(0);
  for (int i = 0; i < n; ++i) {
    int src = rcm[i];
    std::vector<std::pair<int, double>> row;
    for (int k = a.row_ptr[src]; k < a.row_ptr[src + 1]; ++k) row.push_back({inverse[a.col_ind[k]], a.val[k]});
    std::sort(row.begin(), row.end());
    for (auto& [col, value] : row) {
      b_matrix.col_ind.push_back(col);
      b_matrix.val.push_back(value);
    }
    b_matrix.row_ptr.push_back((int)b_matrix.col_ind.size());
  }

  // The library's permutation of the pattern, and the map that carries the values along.
  std::vector<int> perm_rows = a.row_ptr, perm_cols = a.col_ind, perm_map(nnz);
  for (int k = 0; k < nnz; ++k) perm_map[k] = k;
  std::vector<unsigned char> perm_buffer(perm_bytes);
  SOLVER(cusolverSpXcsrpermHost(sp, n, n, nnz, descr, perm_rows.data(), perm_cols.data(), rcm.data(), rcm.data(),
                                perm_map.data(), perm_buffer.data()));
  std::vector<double> perm_val(nnz);
  for (int k = 0; k < nnz; ++k) perm_val[k] = a.val[perm_map[k]];
  EXPECT(perm_rows == b_matrix.row_ptr && perm_cols == b_matrix.col_ind && perm_val == b_matrix.val);
  report.line("sp csrperm", checksum(perm_cols) + checksum(perm_map));

  std::vector<int> zfd(n);
  int numnz = 0;
  SOLVER(cusolverSpDcsrzfdHost(sp, n, nnz, descr, a.val.data(), a.row_ptr.data(), a.col_ind.data(), zfd.data(),
                               &numnz));
  EXPECT(numnz == n && is_permutation(zfd, n));
  report.line("sp zfd", checksum(zfd));

  // Solves: A x = b by LU (with symrcm inside), QR and Cholesky, and B z = Q b by Cholesky.
  std::vector<double> rhs = right_hand_side(n, 1.0);
  std::vector<double> want = solve(dense(a), rhs, n);
  const double tol = 1e-12;
  std::vector<double> x(n);
  int singularity = 0;
  SOLVER(cusolverSpDcsrlsvluHost(sp, n, nnz, descr, a.val.data(), a.row_ptr.data(), a.col_ind.data(), rhs.data(), tol,
                                 1, x.data(), &singularity));
  EXPECT(singularity == -1 && max_diff(x, want) < 1e-10);
  report.line("sp lu host", rounded(x));
  SOLVER(cusolverSpDcsrlsvqrHost(sp, n, nnz, descr, a.val.data(), a.row_ptr.data(), a.col_ind.data(), rhs.data(), tol,
                                 0, x.data(), &singularity));
  EXPECT(singularity == -1 && max_diff(x, want) < 1e-10);
  report.line("sp qr host", rounded(x));
  SOLVER(cusolverSpDcsrlsvcholHost(sp, n, nnz, descr, a.val.data(), a.row_ptr.data(), a.col_ind.data(), rhs.data(),
                                   tol, 0, x.data(), &singularity));
  EXPECT(singularity == -1 && max_diff(x, want) < 1e-10);
  report.line("sp chol host", rounded(x));
  std::vector<double> q_rhs(n), z(n);
  for (int i = 0; i < n; ++i) q_rhs[i] = rhs[rcm[i]];
  SOLVER(cusolverSpDcsrlsvcholHost(sp, n, nnz, descr, b_matrix.val.data(), b_matrix.row_ptr.data(),
                                   b_matrix.col_ind.data(), q_rhs.data(), tol, 0, z.data(), &singularity));
  for (int i = 0; i < n; ++i) x[rcm[i]] = z[i];
  EXPECT(singularity == -1 && max_diff(x, want) < 1e-10);

  // Least squares on a square full-rank matrix: rank n, the solution, no residual.
  int rank = 0;
  double min_norm = 1;
  std::vector<int> column_perm(n);
  SOLVER(cusolverSpDcsrlsqvqrHost(sp, n, n, nnz, descr, a.val.data(), a.row_ptr.data(), a.col_ind.data(), rhs.data(),
                                  tol, &rank, x.data(), column_perm.data(), &min_norm));
  EXPECT(rank == n && min_norm < 1e-10 && is_permutation(column_perm, n) && max_diff(x, want) < 1e-10);
  report.line("sp lsq host", rounded(x));

  // The eigenvalue nearest 0 (the smallest) by shift-inverse, checked by its residual.
  std::vector<double> lambda = eigenvalues(dense(a), n);
  std::vector<double> x0(n, 1.0);
  double mu = 0;
  SOLVER(cusolverSpDcsreigvsiHost(sp, n, nnz, descr, a.val.data(), a.row_ptr.data(), a.col_ind.data(), 0.0, x0.data(),
                                  1000, 1e-12, &mu, x.data()));
  std::vector<double> ax = times(a, x);
  double residual = 0, norm = 0;
  for (int i = 0; i < n; ++i) {
    residual = fmax(residual, fabs(ax[i] - mu * x[i]));
    norm = fmax(norm, fabs(x[i]));
  }
  EXPECT(fabs(mu - lambda[0]) < 1e-8 && residual < 1e-6 * norm);
  report.line("sp eigvsi host", rounded({mu}));

  // How many eigenvalues lie in a box from 0 to the middle of the widest gap among the
  // smallest nine: the host's eigenvalues say.
  int below = 1;
  for (int k = 2; k < 9; ++k)
    if (lambda[k] - lambda[k - 1] > lambda[below] - lambda[below - 1]) below = k;
  double edge = 0.5 * (lambda[below - 1] + lambda[below]);
  int num_eigs = 0;
  SOLVER(cusolverSpDcsreigsHost(sp, n, nnz, descr, a.val.data(), a.row_ptr.data(), a.col_ind.data(),
                                make_cuDoubleComplex(0.0, -1.0), make_cuDoubleComplex(edge, 1.0), &num_eigs));
  EXPECT(num_eigs == below);
  report.line("sp eigs count", (unsigned long long)num_eigs);
}

// 2. cuSolverSP, GPU path.
void sparse_device(cusolverSpHandle_t sp, cusparseMatDescr_t descr, const Csr& a, Report& report) {
  const int n = a.n, nnz = a.nnz();
  int* d_row_ptr = upload(a.row_ptr);
  int* d_col_ind = upload(a.col_ind);
  double* d_val = upload(a.val);
  std::vector<double> rhs = right_hand_side(n, 2.0);
  std::vector<double> want = solve(dense(a), rhs, n);
  double* d_b = upload(rhs);
  double* d_x = upload(std::vector<double>(n, 0.0));
  int singularity = 0;
  SOLVER(cusolverSpDcsrlsvqr(sp, n, nnz, descr, d_val, d_row_ptr, d_col_ind, d_b, 1e-12, 0, d_x, &singularity));
  std::vector<double> x = download(d_x, n);
  EXPECT(singularity == -1 && max_diff(x, want) < 1e-10);
  report.line("sp qr device", rounded(x));
  SOLVER(cusolverSpDcsrlsvchol(sp, n, nnz, descr, d_val, d_row_ptr, d_col_ind, d_b, 1e-12, 1, d_x, &singularity));
  x = download(d_x, n);
  EXPECT(singularity == -1 && max_diff(x, want) < 1e-10);
  report.line("sp chol device", rounded(x));

  // Shift-inverse on the GPU: the eigenvalue lands in device memory too.
  std::vector<double> lambda = eigenvalues(dense(a), n);
  double* d_x0 = upload(std::vector<double>(n, 1.0));
  double* d_mu = upload(std::vector<double>(1, 0.0));
  SOLVER(cusolverSpDcsreigvsi(sp, n, nnz, descr, d_val, d_row_ptr, d_col_ind, 0.0, d_x0, 1000, 1e-12, d_mu, d_x));
  double mu = download(d_mu, 1)[0];
  EXPECT(fabs(mu - lambda[0]) < 1e-8);
  report.line("sp eigvsi device", rounded({mu}));

  // Batched QR: three matrices of A's pattern (diagonal shifted by 0, 1/2, 1) and right-hand
  // sides, packed one after the other.
  const int batch = 3;
  std::vector<double> values, rhs_all, want_all;
  for (int j = 0; j < batch; ++j) {
    Csr aj = laplacian(0.5 + 0.5 * j);
    std::vector<double> bj = right_hand_side(n, 1.0 + j);
    std::vector<double> xj = solve(dense(aj), bj, n);
    values.insert(values.end(), aj.val.begin(), aj.val.end());
    rhs_all.insert(rhs_all.end(), bj.begin(), bj.end());
    want_all.insert(want_all.end(), xj.begin(), xj.end());
  }
  double* d_values = upload(values);
  double* d_rhs_all = upload(rhs_all);
  double* d_x_all = upload(std::vector<double>((size_t)n * batch, 0.0));
  csrqrInfo_t info = nullptr;
  SOLVER(cusolverSpCreateCsrqrInfo(&info));
  SOLVER(cusolverSpXcsrqrAnalysisBatched(sp, n, n, nnz, descr, d_row_ptr, d_col_ind, info));
  size_t internal_bytes = 0, workspace_bytes = 0;
  SOLVER(cusolverSpDcsrqrBufferInfoBatched(sp, n, n, nnz, descr, d_values, d_row_ptr, d_col_ind, batch, info,
                                           &internal_bytes, &workspace_bytes));
  void* workspace = nullptr;
  CHECK(cudaMalloc(&workspace, workspace_bytes > 0 ? workspace_bytes : 1));
  SOLVER(cusolverSpDcsrqrsvBatched(sp, n, n, nnz, descr, d_values, d_row_ptr, d_col_ind, d_rhs_all, d_x_all, batch,
                                   info, workspace));
  std::vector<double> x_all = download(d_x_all, (size_t)n * batch);
  EXPECT(max_diff(x_all, want_all) < 1e-10);
  report.line("sp qr batched", rounded(x_all));
  SOLVER(cusolverSpDestroyCsrqrInfo(info));
  for (void* p : {(void*)d_row_ptr, (void*)d_col_ind, (void*)d_val, (void*)d_b, (void*)d_x, (void*)d_x0, (void*)d_mu,
                  (void*)d_values, (void*)d_rhs_all, (void*)d_x_all, workspace})
    CHECK(cudaFree(p));
}

// The LU factors of an SPD matrix without pivoting, on the pattern symbolic elimination
// gives (so that a matrix of the same pattern refactors into it): L strictly lower (its unit
// diagonal implied), U upper with the diagonal.
void host_lu(const Csr& a, Csr& l, Csr& u) {
  const int n = a.n;
  std::vector<double> m = dense(a);
  std::vector<char> pattern((size_t)n * n, 0);
  for (int i = 0; i < n; ++i)
    for (int k = a.row_ptr[i]; k < a.row_ptr[i + 1]; ++k) pattern[(size_t)i * n + a.col_ind[k]] = 1;
  for (int k = 0; k < n; ++k)
    for (int i = k + 1; i < n; ++i) {
      if (!pattern[(size_t)i * n + k]) continue;
      double f = m[(size_t)i * n + k] / m[(size_t)k * n + k];
      m[(size_t)i * n + k] = f;
      for (int j = k + 1; j < n; ++j) {
        if (!pattern[(size_t)k * n + j]) continue;
        m[(size_t)i * n + j] -= f * m[(size_t)k * n + j];
        pattern[(size_t)i * n + j] = 1;
      }
    }
  l = Csr();
  u = Csr();
  l.n = u.n = n;
  l.row_ptr.push_back(0);
  u.row_ptr.push_back(0);
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j) {
      if (!pattern[(size_t)i * n + j]) continue;
      Csr& side = j < i ? l : u;
      side.col_ind.push_back(j);
      side.val.push_back(m[(size_t)i * n + j]);
    }
    l.row_ptr.push_back(l.nnz());
    u.row_ptr.push_back(u.nnz());
  }
}

// 3. cuSolverRF.
void refactor(const Csr& a, Report& report) {
  const int n = a.n;
  Csr l, u;
  host_lu(a, l, u);
  std::vector<int> identity(n);
  std::iota(identity.begin(), identity.end(), 0);

  cusolverRfHandle_t rf = nullptr;
  SOLVER(cusolverRfCreate(&rf));
  SOLVER(cusolverRfSetNumericProperties(rf, 0.0, 0.0));
  SOLVER(cusolverRfSetAlgs(rf, CUSOLVERRF_FACTORIZATION_ALG0, CUSOLVERRF_TRIANGULAR_SOLVE_ALG1));
  SOLVER(cusolverRfSetMatrixFormat(rf, CUSOLVERRF_MATRIX_FORMAT_CSR, CUSOLVERRF_UNIT_DIAGONAL_ASSUMED_L));
  SOLVER(cusolverRfSetResetValuesFastMode(rf, CUSOLVERRF_RESET_VALUES_FAST_MODE_ON));
  Csr a_copy = a;  // SetupHost takes non-const pointers
  SOLVER(cusolverRfSetupHost(n, a_copy.nnz(), a_copy.row_ptr.data(), a_copy.col_ind.data(), a_copy.val.data(), l.nnz(),
                             l.row_ptr.data(), l.col_ind.data(), l.val.data(), u.nnz(), u.row_ptr.data(),
                             u.col_ind.data(), u.val.data(), identity.data(), identity.data(), rf));
  SOLVER(cusolverRfAnalyze(rf));
  SOLVER(cusolverRfRefactor(rf));

  int* d_p = upload(identity);
  int* d_q = upload(identity);
  double* d_temp = upload(std::vector<double>(n, 0.0));
  std::vector<double> rhs = right_hand_side(n, 3.0);
  double* d_x = upload(rhs);
  SOLVER(cusolverRfSolve(rf, d_p, d_q, 1, d_temp, n, d_x, n));
  std::vector<double> x = download(d_x, n);
  EXPECT(max_diff(x, solve(dense(a), rhs, n)) < 1e-10);
  report.line("rf solve", rounded(x));

  // A second matrix of the same pattern, from the device: reset, refactor, solve.
  Csr a2 = laplacian(1.75);
  int* d_row_ptr = upload(a2.row_ptr);
  int* d_col_ind = upload(a2.col_ind);
  double* d_val = upload(a2.val);
  SOLVER(cusolverRfResetValues(n, a2.nnz(), d_row_ptr, d_col_ind, d_val, d_p, d_q, rf));
  SOLVER(cusolverRfRefactor(rf));
  CHECK(cudaMemcpy(d_x, rhs.data(), n * sizeof(double), cudaMemcpyHostToDevice));
  SOLVER(cusolverRfSolve(rf, d_p, d_q, 1, d_temp, n, d_x, n));
  x = download(d_x, n);
  EXPECT(max_diff(x, solve(dense(a2), rhs, n)) < 1e-10);
  report.line("rf refactor", rounded(x));

  // The settings read back.
  double zero = -1, boost = -1;
  SOLVER(cusolverRfGetNumericProperties(rf, &zero, &boost));
  cusolverRfFactorization_t fact = CUSOLVERRF_FACTORIZATION_ALG2;
  cusolverRfTriangularSolve_t tri = CUSOLVERRF_TRIANGULAR_SOLVE_ALG3;
  SOLVER(cusolverRfGetAlgs(rf, &fact, &tri));
  cusolverRfMatrixFormat_t format = CUSOLVERRF_MATRIX_FORMAT_CSC;
  cusolverRfUnitDiagonal_t diag = CUSOLVERRF_UNIT_DIAGONAL_STORED_L;
  SOLVER(cusolverRfGetMatrixFormat(rf, &format, &diag));
  cusolverRfResetValuesFastMode_t fast = CUSOLVERRF_RESET_VALUES_FAST_MODE_OFF;
  SOLVER(cusolverRfGetResetValuesFastMode(rf, &fast));
  cusolverRfNumericBoostReport_t boosted = CUSOLVERRF_NUMERIC_BOOST_USED;
  SOLVER(cusolverRfGetNumericBoostReport(rf, &boosted));
  EXPECT(zero == 0.0 && boost == 0.0 && fact == CUSOLVERRF_FACTORIZATION_ALG0 &&
         tri == CUSOLVERRF_TRIANGULAR_SOLVE_ALG1 && format == CUSOLVERRF_MATRIX_FORMAT_CSR &&
         diag == CUSOLVERRF_UNIT_DIAGONAL_ASSUMED_L && fast == CUSOLVERRF_RESET_VALUES_FAST_MODE_ON &&
         boosted == CUSOLVERRF_NUMERIC_BOOST_NOT_USED);
  SOLVER(cusolverRfDestroy(rf));
  for (void* p : {(void*)d_p, (void*)d_q, (void*)d_temp, (void*)d_x, (void*)d_row_ptr, (void*)d_col_ind, (void*)d_val})
    CHECK(cudaFree(p));
}

// Column-major copy of a row-major matrix (the same for a symmetric one).
std::vector<double> column_major(const std::vector<double>& row_major, int rows, int cols) {
  std::vector<double> out((size_t)rows * cols);
  for (int i = 0; i < rows; ++i)
    for (int j = 0; j < cols; ++j) out[(size_t)j * rows + i] = row_major[(size_t)i * cols + j];
  return out;
}

int device_info(const int* d_info) { return download(d_info, 1)[0]; }

// 4. cuSolverDN.
void dense_solvers(const Csr& a, Report& report) {
  const int n = a.n;
  cusolverDnHandle_t dn = nullptr;
  SOLVER(cusolverDnCreate(&dn));
  std::vector<double> a_dense = dense(a);  // symmetric: row- and column-major alike
  std::vector<double> lambda = eigenvalues(a_dense, n);
  int* d_info = upload(std::vector<int>(1, 0));

  // syevdx: the five smallest eigenvalues and their vectors.
  {
    double* d_a = upload(a_dense);
    double* d_w = upload(std::vector<double>(n, 0.0));
    int meig = -1, lwork = 0;
    SOLVER(cusolverDnDsyevdx_bufferSize(dn, CUSOLVER_EIG_MODE_VECTOR, CUSOLVER_EIG_RANGE_I, CUBLAS_FILL_MODE_LOWER, n,
                                        d_a, n, 0.0, 0.0, 1, 5, &meig, d_w, &lwork));
    double* d_work = upload(std::vector<double>(lwork > 0 ? lwork : 1, 0.0));
    SOLVER(cusolverDnDsyevdx(dn, CUSOLVER_EIG_MODE_VECTOR, CUSOLVER_EIG_RANGE_I, CUBLAS_FILL_MODE_LOWER, n, d_a, n,
                             0.0, 0.0, 1, 5, &meig, d_w, d_work, lwork, d_info));
    EXPECT(device_info(d_info) == 0 && meig == 5);
    std::vector<double> w = download(d_w, 5);
    EXPECT(max_diff(w, std::vector<double>(lambda.begin(), lambda.begin() + 5)) < 1e-10);
    report.line("dn syevdx", rounded(w));
    for (void* p : {(void*)d_a, (void*)d_w, (void*)d_work}) CHECK(cudaFree(p));
  }

  // sygvdx: A x = lambda B x with B = diag(1 + i / n) for the eigenvalues in (2, 5]. With
  // B = D^2, the eigenvalues are those of D^-1 A D^-1.
  {
    std::vector<double> b_dense((size_t)n * n, 0.0), scaled = a_dense;
    for (int i = 0; i < n; ++i) b_dense[(size_t)i * n + i] = 1.0 + (double)i / n;
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j) scaled[(size_t)i * n + j] /= sqrt(b_dense[(size_t)i * n + i] * b_dense[(size_t)j * n + j]);
    std::vector<double> general = eigenvalues(scaled, n), inside;
    for (double v : general)
      if (v > 2.0 && v <= 5.0) inside.push_back(v);
    double* d_a = upload(a_dense);
    double* d_b = upload(b_dense);
    double* d_w = upload(std::vector<double>(n, 0.0));
    int meig = -1, lwork = 0;
    SOLVER(cusolverDnDsygvdx_bufferSize(dn, CUSOLVER_EIG_TYPE_1, CUSOLVER_EIG_MODE_NOVECTOR, CUSOLVER_EIG_RANGE_V,
                                        CUBLAS_FILL_MODE_UPPER, n, d_a, n, d_b, n, 2.0, 5.0, 0, 0, &meig, d_w, &lwork));
    double* d_work = upload(std::vector<double>(lwork > 0 ? lwork : 1, 0.0));
    SOLVER(cusolverDnDsygvdx(dn, CUSOLVER_EIG_TYPE_1, CUSOLVER_EIG_MODE_NOVECTOR, CUSOLVER_EIG_RANGE_V,
                             CUBLAS_FILL_MODE_UPPER, n, d_a, n, d_b, n, 2.0, 5.0, 0, 0, &meig, d_w, d_work, lwork,
                             d_info));
    EXPECT(device_info(d_info) == 0 && meig == (int)inside.size());
    std::vector<double> w = download(d_w, meig);
    EXPECT(max_diff(w, inside) < 1e-10);
    report.line("dn sygvdx", rounded(w));
    for (void* p : {(void*)d_a, (void*)d_b, (void*)d_w, (void*)d_work}) CHECK(cudaFree(p));
  }

  // gebrd: a 10 x 6 matrix to bidiagonal form; its singular values are those of the
  // bidiagonal matrix (compared through the eigenvalues of B^T B and A^T A).
  {
    const int m = 10, k = 6;
    std::vector<double> g((size_t)m * k);  // row-major
    for (int i = 0; i < m; ++i)
      for (int j = 0; j < k; ++j) g[(size_t)i * k + j] = sin(1.0 + i * 0.7 + j * 1.3) + (i == j ? 2.0 : 0.0);
    std::vector<double> gtg((size_t)k * k, 0.0);
    for (int i = 0; i < k; ++i)
      for (int j = 0; j < k; ++j)
        for (int r = 0; r < m; ++r) gtg[(size_t)i * k + j] += g[(size_t)r * k + i] * g[(size_t)r * k + j];
    double* d_a = upload(column_major(g, m, k));
    double* d_d = upload(std::vector<double>(k, 0.0));
    double* d_e = upload(std::vector<double>(k - 1, 0.0));
    double* d_tauq = upload(std::vector<double>(k, 0.0));
    double* d_taup = upload(std::vector<double>(k, 0.0));
    int lwork = 0;
    SOLVER(cusolverDnDgebrd_bufferSize(dn, m, k, &lwork));
    double* d_work = upload(std::vector<double>(lwork > 0 ? lwork : 1, 0.0));
    SOLVER(cusolverDnDgebrd(dn, m, k, d_a, m, d_d, d_e, d_tauq, d_taup, d_work, lwork, d_info));
    EXPECT(device_info(d_info) == 0);
    std::vector<double> d = download(d_d, k), e = download(d_e, k - 1);
    std::vector<double> btb((size_t)k * k, 0.0);  // B upper bidiagonal: B^T B is tridiagonal
    for (int i = 0; i < k; ++i) {
      btb[(size_t)i * k + i] = d[i] * d[i] + (i > 0 ? e[i - 1] * e[i - 1] : 0.0);
      if (i + 1 < k) btb[(size_t)i * k + i + 1] = btb[(size_t)(i + 1) * k + i] = d[i] * e[i];
    }
    std::vector<double> sv_b = eigenvalues(btb, k), sv_a = eigenvalues(gtg, k);
    EXPECT(max_diff(sv_b, sv_a) < 1e-9);
    std::vector<double> magnitudes(d.size() + e.size());
    for (size_t i = 0; i < d.size(); ++i) magnitudes[i] = fabs(d[i]);
    for (size_t i = 0; i < e.size(); ++i) magnitudes[d.size() + i] = fabs(e[i]);
    report.line("dn gebrd", rounded(magnitudes));
    for (void* p : {(void*)d_a, (void*)d_d, (void*)d_e, (void*)d_tauq, (void*)d_taup, (void*)d_work}) CHECK(cudaFree(p));
  }

  // sytrd: A to tridiagonal form, whose eigenvalues are A's.
  {
    double* d_a = upload(a_dense);
    double* d_d = upload(std::vector<double>(n, 0.0));
    double* d_e = upload(std::vector<double>(n - 1, 0.0));
    double* d_tau = upload(std::vector<double>(n - 1, 0.0));
    int lwork = 0;
    SOLVER(cusolverDnDsytrd_bufferSize(dn, CUBLAS_FILL_MODE_LOWER, n, d_a, n, d_d, d_e, d_tau, &lwork));
    double* d_work = upload(std::vector<double>(lwork > 0 ? lwork : 1, 0.0));
    SOLVER(cusolverDnDsytrd(dn, CUBLAS_FILL_MODE_LOWER, n, d_a, n, d_d, d_e, d_tau, d_work, lwork, d_info));
    EXPECT(device_info(d_info) == 0);
    std::vector<double> d = download(d_d, n), e = download(d_e, n - 1);
    std::vector<double> t((size_t)n * n, 0.0);
    for (int i = 0; i < n; ++i) {
      t[(size_t)i * n + i] = d[i];
      if (i + 1 < n) t[(size_t)i * n + i + 1] = t[(size_t)(i + 1) * n + i] = e[i];
    }
    EXPECT(max_diff(eigenvalues(t, n), lambda) < 1e-10);
    std::vector<double> magnitudes(d.size() + e.size());
    for (size_t i = 0; i < d.size(); ++i) magnitudes[i] = d[i];
    for (size_t i = 0; i < e.size(); ++i) magnitudes[d.size() + i] = fabs(e[i]);
    report.line("dn sytrd", rounded(magnitudes));
    for (void* p : {(void*)d_a, (void*)d_d, (void*)d_e, (void*)d_tau, (void*)d_work}) CHECK(cudaFree(p));
  }

  // Mixed-precision iterative refinement: two right-hand sides, double result, factored in
  // double (DDgesv), in half (DHgesv), and through the IRS API in single.
  {
    const int nrhs = 2;
    std::vector<double> rhs((size_t)n * nrhs), want((size_t)n * nrhs);
    for (int c = 0; c < nrhs; ++c) {
      std::vector<double> b = right_hand_side(n, 1.0 + c);
      std::vector<double> x = solve(a_dense, b, n);
      std::copy(b.begin(), b.end(), rhs.begin() + (size_t)c * n);
      std::copy(x.begin(), x.end(), want.begin() + (size_t)c * n);
    }
    int* d_ipiv = upload(std::vector<int>(n, 0));
    double* d_b = upload(rhs);
    double* d_x = upload(std::vector<double>((size_t)n * nrhs, 0.0));
    for (int half = 0; half < 2; ++half) {
      double* d_a = upload(a_dense);
      size_t bytes = 0;
      int iter = 0;
      if (half) {
        SOLVER(cusolverDnDHgesv_bufferSize(dn, n, nrhs, d_a, n, d_ipiv, d_b, n, d_x, n, nullptr, &bytes));
      } else {
        SOLVER(cusolverDnDDgesv_bufferSize(dn, n, nrhs, d_a, n, d_ipiv, d_b, n, d_x, n, nullptr, &bytes));
      }
      void* d_work = nullptr;
      CHECK(cudaMalloc(&d_work, bytes > 0 ? bytes : 1));
      if (half) {
        SOLVER(cusolverDnDHgesv(dn, n, nrhs, d_a, n, d_ipiv, d_b, n, d_x, n, d_work, bytes, &iter, d_info));
      } else {
        SOLVER(cusolverDnDDgesv(dn, n, nrhs, d_a, n, d_ipiv, d_b, n, d_x, n, d_work, bytes, &iter, d_info));
      }
      std::vector<double> x = download(d_x, (size_t)n * nrhs);
      EXPECT(device_info(d_info) == 0 && max_diff(x, want) < 1e-10);
      report.line(half ? "dn DHgesv" : "dn DDgesv", rounded(x));
      CHECK(cudaFree(d_work));
      CHECK(cudaFree(d_a));
    }

    cusolverDnIRSParams_t params = nullptr;
    cusolverDnIRSInfos_t infos = nullptr;
    SOLVER(cusolverDnIRSParamsCreate(&params));
    SOLVER(cusolverDnIRSParamsSetSolverPrecisions(params, CUSOLVER_R_64F, CUSOLVER_R_32F));
    SOLVER(cusolverDnIRSParamsSetRefinementSolver(params, CUSOLVER_IRS_REFINE_CLASSICAL));
    SOLVER(cusolverDnIRSParamsSetMaxIters(params, 40));
    cusolver_int_t max_iters = 0;
    SOLVER(cusolverDnIRSParamsGetMaxIters(params, &max_iters));
    EXPECT(max_iters == 40);
    SOLVER(cusolverDnIRSInfosCreate(&infos));
    size_t bytes = 0;
    SOLVER(cusolverDnIRSXgesv_bufferSize(dn, params, n, nrhs, &bytes));
    void* d_work = nullptr;
    CHECK(cudaMalloc(&d_work, bytes > 0 ? bytes : 1));
    double* d_a = upload(a_dense);
    cusolver_int_t niters = 0, queried = -1, outer = -1, info_max = 0;
    SOLVER(cusolverDnIRSXgesv(dn, params, infos, n, nrhs, d_a, n, d_b, n, d_x, n, d_work, bytes, &niters, d_info));
    std::vector<double> x = download(d_x, (size_t)n * nrhs);
    EXPECT(device_info(d_info) == 0 && max_diff(x, want) < 1e-10);
    SOLVER(cusolverDnIRSInfosGetNiters(infos, &queried));
    SOLVER(cusolverDnIRSInfosGetOuterNiters(infos, &outer));
    SOLVER(cusolverDnIRSInfosGetMaxIters(infos, &info_max));
    EXPECT(queried == niters && outer >= 0 && info_max == 40);
    report.line("dn IRSXgesv", rounded(x));
    SOLVER(cusolverDnIRSInfosDestroy(infos));
    SOLVER(cusolverDnIRSParamsDestroy(params));
    for (void* p : {(void*)d_ipiv, (void*)d_b, (void*)d_x, d_work, (void*)d_a}) CHECK(cudaFree(p));
  }
  CHECK(cudaFree(d_info));
  SOLVER(cusolverDnDestroy(dn));
}

}  // namespace

int main() {
  Report report;
  const Csr a = laplacian(0.5);
  EXPECT(a.nnz() == 5 * kN - 4 * kGrid);

  cusolverSpHandle_t sp = nullptr;
  SOLVER(cusolverSpCreate(&sp));
  cusparseMatDescr_t descr = nullptr;
  CHECK_STATUS(cusparseCreateMatDescr(&descr));
  CHECK_STATUS(cusparseSetMatType(descr, CUSPARSE_MATRIX_TYPE_GENERAL));
  CHECK_STATUS(cusparseSetMatIndexBase(descr, CUSPARSE_INDEX_BASE_ZERO));

  sparse_host(sp, descr, a, report);
  sparse_device(sp, descr, a, report);
  refactor(a, report);
  dense_solvers(a, report);

  CHECK_STATUS(cusparseDestroyMatDescr(descr));
  SOLVER(cusolverSpDestroy(sp));
  report.done("solver_sparse");
  return 0;
}
