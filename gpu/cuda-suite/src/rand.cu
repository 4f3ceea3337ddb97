// cuRAND's host API with device generators, as CuPy's random module uses it: pseudo-random
// (XORWOW, Philox, MRG32k3a, MT19937) and quasi-random (Sobol) generators, seeds, offsets,
// orderings and a stream, every distribution the host API has; host generators (the CPU
// generates into host memory) against a device generator of the same seed; the Sobol'
// direction-vector and scramble-constant tables. The output bytes
// are printed: a generator gives the same sequence for the same seed, wherever it runs.
#include <curand.h>

#include <cmath>
#include "common.h"

template <typename T>
static unsigned long long device_checksum(const T* d, size_t n) {
  std::vector<T> host(n);
  CHECK(cudaMemcpy(host.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
  return checksum(host);
}

int main() {
  Report report;
  int version = 0, major = 0;
  CHECK_STATUS(curandGetVersion(&version));
  CHECK_STATUS(curandGetProperty(MAJOR_VERSION, &major));
  EXPECT(version > 0 && major > 0);

  const size_t n = 1 << 20;
  void* buffer;
  CHECK(cudaMalloc(&buffer, n * sizeof(double)));
  float* f = static_cast<float*>(buffer);
  double* d = static_cast<double*>(buffer);
  unsigned int* u = static_cast<unsigned int*>(buffer);
  unsigned long long* ull = static_cast<unsigned long long*>(buffer);
  cudaStream_t stream;
  CHECK(cudaStreamCreate(&stream));

  // Pseudo-random generators: each seeded, on the stream, each distribution.
  const curandRngType_t kinds[] = {CURAND_RNG_PSEUDO_XORWOW, CURAND_RNG_PSEUDO_PHILOX4_32_10,
                                   CURAND_RNG_PSEUDO_MRG32K3A, CURAND_RNG_PSEUDO_MT19937};
  const char* names[] = {"xorwow", "philox", "mrg32k3a", "mt19937"};
  for (int k = 0; k < 4; ++k) {
    curandGenerator_t gen;
    CHECK_STATUS(curandCreateGenerator(&gen, kinds[k]));
    CHECK_STATUS(curandSetPseudoRandomGeneratorSeed(gen, 1234ull + k));
    CHECK_STATUS(curandSetStream(gen, stream));
    char label[32];
    CHECK_STATUS(curandGenerate(gen, u, n));
    CHECK(cudaStreamSynchronize(stream));
    snprintf(label, sizeof label, "%s bits", names[k]);
    report.line(label, device_checksum(u, n));
    CHECK_STATUS(curandGenerateUniform(gen, f, n));
    CHECK(cudaStreamSynchronize(stream));
    snprintf(label, sizeof label, "%s uniform", names[k]);
    report.line(label, device_checksum(f, n));
    CHECK_STATUS(curandGenerateNormal(gen, f, n, 1.5f, 0.25f));
    CHECK(cudaStreamSynchronize(stream));
    snprintf(label, sizeof label, "%s normal", names[k]);
    report.line(label, device_checksum(f, n));
    CHECK_STATUS(curandGenerateLogNormalDouble(gen, d, n, 0.0, 0.5));
    CHECK(cudaStreamSynchronize(stream));
    snprintf(label, sizeof label, "%s lognormal", names[k]);
    report.line(label, device_checksum(d, n));
    CHECK_STATUS(curandDestroyGenerator(gen));
  }

  // Offsets and orderings: Philox skipped ahead, XORWOW in its seeded ordering.
  {
    curandGenerator_t gen;
    CHECK_STATUS(curandCreateGenerator(&gen, CURAND_RNG_PSEUDO_PHILOX4_32_10));
    CHECK_STATUS(curandSetPseudoRandomGeneratorSeed(gen, 99));
    CHECK_STATUS(curandSetGeneratorOffset(gen, 1ull << 33));
    CHECK_STATUS(curandGenerateUniformDouble(gen, d, n));
    report.line("philox offset", device_checksum(d, n));
    CHECK_STATUS(curandGeneratePoisson(gen, u, n, 4.5));
    report.line("philox poisson", device_checksum(u, n));
    CHECK_STATUS(curandDestroyGenerator(gen));
    CHECK_STATUS(curandCreateGenerator(&gen, CURAND_RNG_PSEUDO_XORWOW));
    CHECK_STATUS(curandSetGeneratorOrdering(gen, CURAND_ORDERING_PSEUDO_SEEDED));
    CHECK_STATUS(curandSetPseudoRandomGeneratorSeed(gen, 7));
    CHECK_STATUS(curandGenerateSeeds(gen));
    CHECK_STATUS(curandGenerateNormalDouble(gen, d, n, -2.0, 3.0));
    report.line("xorwow seeded", device_checksum(d, n));
    CHECK_STATUS(curandDestroyGenerator(gen));
  }

  // Quasi-random: 4-dimensional Sobol, 32 and 64 bits.
  {
    curandGenerator_t gen;
    CHECK_STATUS(curandCreateGenerator(&gen, CURAND_RNG_QUASI_SCRAMBLED_SOBOL32));
    CHECK_STATUS(curandSetQuasiRandomGeneratorDimensions(gen, 4));
    CHECK_STATUS(curandGenerateUniform(gen, f, n));
    report.line("sobol32", device_checksum(f, n));
    CHECK_STATUS(curandDestroyGenerator(gen));
    CHECK_STATUS(curandCreateGenerator(&gen, CURAND_RNG_QUASI_SOBOL64));
    CHECK_STATUS(curandSetQuasiRandomGeneratorDimensions(gen, 2));
    CHECK_STATUS(curandGenerateLongLong(gen, ull, n));
    report.line("sobol64", device_checksum(ull, n));
    CHECK_STATUS(curandDestroyGenerator(gen));
  }

  // Host generators (curandCreateGeneratorHost): the CPU generates into host memory, and a
  // device generator of the same kind and seed gives the same numbers (NVIDIA's
  // MersenneTwisterGP11213 checks this).
  {
    const int hn = 10000;
    std::vector<float> host_u(hn), dev_u(hn);
    std::vector<double> host_d(hn);
    std::vector<unsigned int> host_p(hn);
    curandGenerator_t hgen, dgen;
    CHECK_STATUS(curandCreateGeneratorHost(&hgen, CURAND_RNG_PSEUDO_MTGP32));
    CHECK_STATUS(curandSetPseudoRandomGeneratorSeed(hgen, 777));
    CHECK_STATUS(curandGenerateUniform(hgen, host_u.data(), hn));
    CHECK_STATUS(curandCreateGenerator(&dgen, CURAND_RNG_PSEUDO_MTGP32));
    CHECK_STATUS(curandSetPseudoRandomGeneratorSeed(dgen, 777));
    CHECK_STATUS(curandGenerateUniform(dgen, f, hn));
    CHECK(cudaMemcpy(dev_u.data(), f, hn * sizeof(float), cudaMemcpyDeviceToHost));
    for (int i = 0; i < hn; ++i) EXPECT(std::fabs(host_u[i] - dev_u[i]) <= 1e-6f);
    report.line("host mtgp32", checksum(host_u));
    CHECK_STATUS(curandGenerateNormalDouble(hgen, host_d.data(), hn, 1.0, 2.0));
    report.line("host normal dbl", checksum(host_d));
    CHECK_STATUS(curandGeneratePoisson(hgen, host_p.data(), hn, 3.5));
    report.line("host poisson", checksum(host_p));
    CHECK_STATUS(curandDestroyGenerator(hgen));
    CHECK_STATUS(curandDestroyGenerator(dgen));
    CHECK_STATUS(curandCreateGeneratorHost(&hgen, CURAND_RNG_QUASI_SOBOL32));
    CHECK_STATUS(curandSetQuasiRandomGeneratorDimensions(hgen, 3));
    CHECK_STATUS(curandGenerate(hgen, host_p.data(), hn - 1));
    report.line("host sobol32", checksum(host_p));
    CHECK_STATUS(curandDestroyGenerator(hgen));
  }

  // The library's Sobol' tables, as the device API's quasi-random generators take them
  // (NVIDIA's MC_EstimatePiInlineQ copies them to the GPU): the first and the last dimension.
  {
    curandDirectionVectors32_t* v32;
    curandDirectionVectors64_t* v64;
    unsigned int* c32;
    unsigned long long* c64;
    CHECK_STATUS(curandGetDirectionVectors32(&v32, CURAND_DIRECTION_VECTORS_32_JOEKUO6));
    CHECK_STATUS(curandGetDirectionVectors64(&v64, CURAND_SCRAMBLED_DIRECTION_VECTORS_64_JOEKUO6));
    CHECK_STATUS(curandGetScrambleConstants32(&c32));
    CHECK_STATUS(curandGetScrambleConstants64(&c64));
    std::vector<unsigned int> first(v32[0], v32[0] + 32), last(v32[19999], v32[19999] + 32);
    std::vector<unsigned long long> last64(v64[19999], v64[19999] + 64);
    std::vector<unsigned int> consts(c32, c32 + 20000);
    std::vector<unsigned long long> consts64(c64 + 19000, c64 + 20000);
    report.line("dirvec32 first", checksum(first));
    report.line("dirvec32 last", checksum(last));
    report.line("dirvec64 last", checksum(last64));
    report.line("scramble32", checksum(consts));
    report.line("scramble64 tail", checksum(consts64));
    curandDirectionVectors32_t* again;
    CHECK_STATUS(curandGetDirectionVectors32(&again, CURAND_DIRECTION_VECTORS_32_JOEKUO6));
    EXPECT(again == v32);  // one table for the process, as natively
  }

  // A discrete distribution made by the library, then freed.
  {
    curandDiscreteDistribution_t poisson;
    CHECK_STATUS(curandCreatePoissonDistribution(12.0, &poisson));
    CHECK_STATUS(curandDestroyDistribution(poisson));
  }

  CHECK(cudaStreamDestroy(stream));
  CHECK(cudaFree(buffer));
  report.done("rand");
  return 0;
}
