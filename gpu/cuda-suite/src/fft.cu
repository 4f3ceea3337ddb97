// cuFFT through its basic and Xt APIs, as CuPy, JAX and PyTorch make plans: cufftPlan1d,
// cufftPlanMany with and without embeds (NULL embeds mean the basic layout), a created handle
// with its own work area and stream (cufftMakePlanMany64, cufftGetSize, cufftSetWorkArea),
// PyTorch's cufftXtMakePlanMany with NULL embeds, and the size queries. Each transform's output
// bytes are printed (the same GPU and plan give the same bytes), and each round trip is checked
// against the input.
#include <cufft.h>
#include <cufftXt.h>

#include <cuda_fp16.h>

#include <cmath>

#include "common.h"

template <typename T>
static std::vector<T> download(const T* d, size_t n) {
  std::vector<T> out(n);
  CHECK(cudaMemcpy(out.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
  return out;
}

// The largest |a[i] * scale - b[i]| over two arrays of floats or doubles.
template <typename T>
static double max_error(const std::vector<T>& a, const std::vector<T>& b, double scale) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = fmax(worst, fabs((double)a[i] * scale - (double)b[i]));
  return worst;
}

int main() {
  Report report;
  int version = 0;
  CHECK_STATUS(cufftGetVersion(&version));
  int major = 0;
  CHECK_STATUS(cufftGetProperty(MAJOR_VERSION, &major));
  EXPECT(version > 0 && major > 0);

  // 1. cufftPlan1d: 8 complex transforms of 1024, forward then inverse, in place.
  {
    const int n = 1024, batch = 8;
    std::vector<float> host(2 * n * batch);
    for (size_t i = 0; i < host.size(); ++i) host[i] = (float)sin(0.01 * i) + (float)(i % 7) * 0.125f;
    cufftComplex* data;
    CHECK(cudaMalloc(&data, host.size() * sizeof(float)));
    CHECK(cudaMemcpy(data, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice));
    cufftHandle plan;
    CHECK_STATUS(cufftPlan1d(&plan, n, CUFFT_C2C, batch));
    CHECK_STATUS(cufftExecC2C(plan, data, data, CUFFT_FORWARD));
    std::vector<float> spectrum = download((float*)data, host.size());
    report.line("c2c forward", checksum(spectrum));
    CHECK_STATUS(cufftExecC2C(plan, data, data, CUFFT_INVERSE));
    std::vector<float> back = download((float*)data, host.size());
    EXPECT(max_error(back, host, 1.0 / n) < 1e-3);
    report.line("c2c inverse", checksum(back));
    CHECK_STATUS(cufftDestroy(plan));
    CHECK(cudaFree(data));
  }

  // 2. cufftPlanMany, 2-D real to complex, NULL embeds (the basic layout), 4 batches of 64 x 48.
  //    Then the complex-to-real inverse with explicit embeds and strides: every other element.
  {
    const int nx = 64, ny = 48, batch = 4, half = ny / 2 + 1;
    int dims[2] = {nx, ny};
    std::vector<float> host(nx * ny * batch);
    for (size_t i = 0; i < host.size(); ++i) host[i] = (float)cos(0.003 * i * i) - 0.25f * (float)(i % 3);
    float* real;
    cufftComplex* spectrum;
    CHECK(cudaMalloc(&real, host.size() * sizeof(float)));
    CHECK(cudaMalloc(&spectrum, (size_t)nx * half * batch * sizeof(cufftComplex)));
    CHECK(cudaMemcpy(real, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice));
    size_t estimate = 0, size = 0;
    CHECK_STATUS(cufftEstimateMany(2, dims, nullptr, 1, 0, nullptr, 1, 0, CUFFT_R2C, batch, &estimate));
    cufftHandle forward;
    CHECK_STATUS(cufftPlanMany(&forward, 2, dims, nullptr, 1, 0, nullptr, 1, 0, CUFFT_R2C, batch));
    CHECK_STATUS(cufftGetSizeMany(forward, 2, dims, nullptr, 1, 0, nullptr, 1, 0, CUFFT_R2C, batch, &size));
    report.line("work sizes", estimate * 1000003ull + size);
    CHECK_STATUS(cufftExecR2C(forward, real, spectrum));
    std::vector<cufftComplex> spec = download(spectrum, (size_t)nx * half * batch);
    report.line("r2c 2d", checksum(spec));

    // The inverse writes with stride 2 into a buffer twice the size: embeds name the storage.
    float* strided;
    CHECK(cudaMalloc(&strided, 2 * host.size() * sizeof(float)));
    CHECK(cudaMemset(strided, 0, 2 * host.size() * sizeof(float)));
    int inembed[2] = {nx, half}, onembed[2] = {nx, ny};
    cufftHandle inverse;
    CHECK_STATUS(cufftPlanMany(&inverse, 2, dims, inembed, 1, nx * half, onembed, 2, 2 * nx * ny, CUFFT_C2R, batch));
    CHECK_STATUS(cufftExecC2R(inverse, spectrum, strided));
    std::vector<float> wide = download(strided, 2 * host.size());
    std::vector<float> back(host.size());
    for (size_t i = 0; i < back.size(); ++i) back[i] = wide[2 * i];
    EXPECT(max_error(back, host, 1.0 / (nx * ny)) < 1e-3);
    report.line("c2r strided", checksum(wide));
    CHECK_STATUS(cufftDestroy(forward));
    CHECK_STATUS(cufftDestroy(inverse));
    CHECK(cudaFree(real));
    CHECK(cudaFree(spectrum));
    CHECK(cudaFree(strided));
  }

  // 3. A created handle with the caller's work area and stream (CuPy's and JAX's way):
  //    double precision, 3 transforms of 2,000 (not a power of two), 64-bit sizes.
  {
    const long long n = 2000, batch = 3;
    std::vector<double> host(2 * n * batch);
    for (size_t i = 0; i < host.size(); ++i) host[i] = sin(0.37 * i) * 3.0 + (double)(i % 11);
    cufftDoubleComplex *in, *out;
    CHECK(cudaMalloc(&in, host.size() * sizeof(double)));
    CHECK(cudaMalloc(&out, host.size() * sizeof(double)));
    CHECK(cudaMemcpy(in, host.data(), host.size() * sizeof(double), cudaMemcpyHostToDevice));
    cudaStream_t stream;
    CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    cufftHandle plan;
    CHECK_STATUS(cufftCreate(&plan));
    CHECK_STATUS(cufftSetAutoAllocation(plan, 0));
    long long dims[1] = {n};
    size_t work_size = 0, queried = 0;
    CHECK_STATUS(cufftMakePlanMany64(plan, 1, dims, nullptr, 1, n, nullptr, 1, n, CUFFT_Z2Z, batch, &work_size));
    CHECK_STATUS(cufftGetSize(plan, &queried));
    EXPECT(queried == work_size);
    void* work = nullptr;
    if (work_size > 0) CHECK(cudaMalloc(&work, work_size));
    CHECK_STATUS(cufftSetWorkArea(plan, work));
    CHECK_STATUS(cufftSetStream(plan, stream));
    CHECK_STATUS(cufftExecZ2Z(plan, in, out, CUFFT_FORWARD));
    CHECK_STATUS(cufftExecZ2Z(plan, out, in, CUFFT_INVERSE));
    CHECK(cudaStreamSynchronize(stream));
    std::vector<double> spectrum = download((double*)out, host.size());
    std::vector<double> back = download((double*)in, host.size());
    EXPECT(max_error(back, host, 1.0 / n) < 1e-9);
    report.line("z2z work area", checksum(spectrum));
    report.line("z2z inverse", checksum(back));
    CHECK_STATUS(cufftDestroy(plan));
    CHECK(cudaStreamDestroy(stream));
    if (work) CHECK(cudaFree(work));
    CHECK(cudaFree(in));
    CHECK(cudaFree(out));
  }

  // 4. PyTorch's way: cufftXtMakePlanMany with NULL embeds, half precision C2C of 256,
  //    then the same plan's work size asked again with cufftXtGetSizeMany.
  {
    const long long n = 256, batch = 5;
    std::vector<float> values(2 * n * batch);
    for (size_t i = 0; i < values.size(); ++i) values[i] = (float)((i * 37) % 101) / 101.0f - 0.5f;
    std::vector<__half> host(values.size());
    for (size_t i = 0; i < values.size(); ++i) host[i] = __float2half(values[i]);
    __half2* data;
    CHECK(cudaMalloc(&data, host.size() * sizeof(__half)));
    CHECK(cudaMemcpy(data, host.data(), host.size() * sizeof(__half), cudaMemcpyHostToDevice));
    cufftHandle plan;
    CHECK_STATUS(cufftCreate(&plan));
    long long dims[1] = {n};
    size_t work_size = 0, again = 0;
    CHECK_STATUS(cufftXtMakePlanMany(plan, 1, dims, nullptr, 1, 1, CUDA_C_16F, nullptr, 1, 1, CUDA_C_16F, batch,
                                  &work_size, CUDA_C_16F));
    CHECK_STATUS(cufftXtGetSizeMany(plan, 1, dims, nullptr, 1, 1, CUDA_C_16F, nullptr, 1, 1, CUDA_C_16F, batch,
                                 &again, CUDA_C_16F));
    EXPECT(again == work_size);
    CHECK_STATUS(cufftXtExec(plan, data, data, CUFFT_FORWARD));
    std::vector<__half> spectrum = download((__half*)data, host.size());
    report.line("xt c2c half", fnv1a(spectrum.data(), spectrum.size() * sizeof(__half)));
    CHECK_STATUS(cufftDestroy(plan));
    CHECK(cudaFree(data));
  }

  // 5. A plan of an invalid size and a size query on a handle that is none: cuFFT's own
  //    errors, not a lost session. (A transform on a wrong handle is sent without waiting,
  //    so remotely its error would come with a later call, as for a kernel launch.)
  {
    cufftHandle plan;
    EXPECT(cufftPlan1d(&plan, 0, CUFFT_C2C, 1) != CUFFT_SUCCESS);
    size_t size = 0;
    EXPECT(cufftGetSize(123456, &size) != CUFFT_SUCCESS);
  }
  report.done("fft");
  return 0;
}
