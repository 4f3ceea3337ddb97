// Template kernels: instantiations over types, non-type parameters and functor types.
#include "common.h"

template <typename T, int K>
__global__ void axpy_k(int n, T a, const T* x, T* y) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] * T(K) + y[i];
}

template <typename T>
struct Square {
  __host__ __device__ T operator()(T v) const { return v * v; }
};

template <typename T>
struct Affine {
  T mul, add;
  __host__ __device__ T operator()(T v) const { return v * mul + add; }
};

template <typename T, typename Op>
__global__ void apply(int n, Op op, const T* x, T* y) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = op(x[i]);
}

// Runs launch(d_x, d_y) over x[i] = i % 100, y[i] = i % 7 and checks y against host(x, y).
// All values are small integers or binary fractions, so float results are exact.
template <typename T, typename Launch, typename Host>
unsigned long long run(const char* what, int n, Launch launch, Host host) {
  std::vector<T> x(n), y(n), got(n);
  for (int i = 0; i < n; ++i) {
    x[i] = T(i % 100);
    y[i] = T(i % 7);
  }
  T *d_x, *d_y;
  CHECK(cudaMalloc(&d_x, n * sizeof(T)));
  CHECK(cudaMalloc(&d_y, n * sizeof(T)));
  CHECK(cudaMemcpy(d_x, x.data(), n * sizeof(T), cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(d_y, y.data(), n * sizeof(T), cudaMemcpyHostToDevice));
  launch(d_x, d_y);
  CHECK_LAUNCH();
  CHECK(cudaMemcpy(got.data(), d_y, n * sizeof(T), cudaMemcpyDeviceToHost));
  for (int i = 0; i < n; ++i) y[i] = host(x[i], y[i]);
  expect_equal(what, got, y);
  CHECK(cudaFree(d_x));
  CHECK(cudaFree(d_y));
  return checksum(got);
}

int main() {
  const int n = 1 << 20, g = blocks_for(n, 256);
  Report report;
  report.line("axpy<int,1>", run<int>("axpy<int,1>", n,
      [&](const int* x, int* y) { axpy_k<int, 1><<<g, 256>>>(n, 3, x, y); },
      [](int x, int y) { return 3 * x * 1 + y; }));
  report.line("axpy<int,4>", run<int>("axpy<int,4>", n,
      [&](const int* x, int* y) { axpy_k<int, 4><<<g, 256>>>(n, -2, x, y); },
      [](int x, int y) { return -2 * x * 4 + y; }));
  report.line("axpy<float,2>", run<float>("axpy<float,2>", n,
      [&](const float* x, float* y) { axpy_k<float, 2><<<g, 256>>>(n, 1.5f, x, y); },
      [](float x, float y) { return 1.5f * x * 2.0f + y; }));
  report.line("axpy<double,3>", run<double>("axpy<double,3>", n,
      [&](const double* x, double* y) { axpy_k<double, 3><<<g, 256>>>(n, 0.25, x, y); },
      [](double x, double y) { return 0.25 * x * 3.0 + y; }));
  report.line("axpy<ll,5>", run<long long>("axpy<ll,5>", n,
      [&](const long long* x, long long* y) { axpy_k<long long, 5><<<g, 256>>>(n, 1LL << 33, x, y); },
      [](long long x, long long y) { return (1LL << 33) * x * 5 + y; }));
  report.line("apply<f,Square>", run<float>("apply<f,Square>", n,
      [&](const float* x, float* y) { apply<float, Square<float>><<<g, 256>>>(n, Square<float>{}, x, y); },
      [](float x, float) { return x * x; }));
  report.line("apply<i,Affine>", run<int>("apply<i,Affine>", n,
      [&](const int* x, int* y) { apply<int, Affine<int>><<<g, 256>>>(n, Affine<int>{-2, 9}, x, y); },
      [](int x, int) { return x * -2 + 9; }));
  report.line("apply<d,Affine>", run<double>("apply<d,Affine>", n,
      [&](const double* x, double* y) { apply<double, Affine<double>><<<g, 256>>>(n, Affine<double>{0.5, 0.25}, x, y); },
      [](double x, double) { return x * 0.5 + 0.25; }));
  report.done("templates");
  return 0;
}
