// cuRAND's host API with device generators, as CuPy's random module uses it: pseudo-random
// (XORWOW, Philox, MRG32k3a, MT19937) and quasi-random (Sobol) generators, seeds, offsets,
// orderings and a stream, every distribution the host API has. The output bytes are printed:
// a generator gives the same sequence for the same seed, wherever it runs.
#include <curand.h>

#include "common.h"

#define RAND_CHECK(call)                                                                    \
  do {                                                                                      \
    curandStatus_t rand_err_ = (call);                                                      \
    if (rand_err_ != CURAND_STATUS_SUCCESS) {                                               \
      fprintf(stderr, "%s:%d: %s failed: curandStatus %d\n", __FILE__, __LINE__, #call,     \
              (int)rand_err_);                                                              \
      exit(1);                                                                              \
    }                                                                                       \
  } while (0)

template <typename T>
static unsigned long long device_checksum(const T* d, size_t n) {
  std::vector<T> host(n);
  CHECK(cudaMemcpy(host.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
  return checksum(host);
}

int main() {
  Report report;
  int version = 0, major = 0;
  RAND_CHECK(curandGetVersion(&version));
  RAND_CHECK(curandGetProperty(MAJOR_VERSION, &major));
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
    RAND_CHECK(curandCreateGenerator(&gen, kinds[k]));
    RAND_CHECK(curandSetPseudoRandomGeneratorSeed(gen, 1234ull + k));
    RAND_CHECK(curandSetStream(gen, stream));
    char label[32];
    RAND_CHECK(curandGenerate(gen, u, n));
    CHECK(cudaStreamSynchronize(stream));
    snprintf(label, sizeof label, "%s bits", names[k]);
    report.line(label, device_checksum(u, n));
    RAND_CHECK(curandGenerateUniform(gen, f, n));
    CHECK(cudaStreamSynchronize(stream));
    snprintf(label, sizeof label, "%s uniform", names[k]);
    report.line(label, device_checksum(f, n));
    RAND_CHECK(curandGenerateNormal(gen, f, n, 1.5f, 0.25f));
    CHECK(cudaStreamSynchronize(stream));
    snprintf(label, sizeof label, "%s normal", names[k]);
    report.line(label, device_checksum(f, n));
    RAND_CHECK(curandGenerateLogNormalDouble(gen, d, n, 0.0, 0.5));
    CHECK(cudaStreamSynchronize(stream));
    snprintf(label, sizeof label, "%s lognormal", names[k]);
    report.line(label, device_checksum(d, n));
    RAND_CHECK(curandDestroyGenerator(gen));
  }

  // Offsets and orderings: Philox skipped ahead, XORWOW in its seeded ordering.
  {
    curandGenerator_t gen;
    RAND_CHECK(curandCreateGenerator(&gen, CURAND_RNG_PSEUDO_PHILOX4_32_10));
    RAND_CHECK(curandSetPseudoRandomGeneratorSeed(gen, 99));
    RAND_CHECK(curandSetGeneratorOffset(gen, 1ull << 33));
    RAND_CHECK(curandGenerateUniformDouble(gen, d, n));
    report.line("philox offset", device_checksum(d, n));
    RAND_CHECK(curandGeneratePoisson(gen, u, n, 4.5));
    report.line("philox poisson", device_checksum(u, n));
    RAND_CHECK(curandDestroyGenerator(gen));
    RAND_CHECK(curandCreateGenerator(&gen, CURAND_RNG_PSEUDO_XORWOW));
    RAND_CHECK(curandSetGeneratorOrdering(gen, CURAND_ORDERING_PSEUDO_SEEDED));
    RAND_CHECK(curandSetPseudoRandomGeneratorSeed(gen, 7));
    RAND_CHECK(curandGenerateSeeds(gen));
    RAND_CHECK(curandGenerateNormalDouble(gen, d, n, -2.0, 3.0));
    report.line("xorwow seeded", device_checksum(d, n));
    RAND_CHECK(curandDestroyGenerator(gen));
  }

  // Quasi-random: 4-dimensional Sobol, 32 and 64 bits.
  {
    curandGenerator_t gen;
    RAND_CHECK(curandCreateGenerator(&gen, CURAND_RNG_QUASI_SCRAMBLED_SOBOL32));
    RAND_CHECK(curandSetQuasiRandomGeneratorDimensions(gen, 4));
    RAND_CHECK(curandGenerateUniform(gen, f, n));
    report.line("sobol32", device_checksum(f, n));
    RAND_CHECK(curandDestroyGenerator(gen));
    RAND_CHECK(curandCreateGenerator(&gen, CURAND_RNG_QUASI_SOBOL64));
    RAND_CHECK(curandSetQuasiRandomGeneratorDimensions(gen, 2));
    RAND_CHECK(curandGenerateLongLong(gen, ull, n));
    report.line("sobol64", device_checksum(ull, n));
    RAND_CHECK(curandDestroyGenerator(gen));
  }

  // A discrete distribution made by the library, then freed.
  {
    curandDiscreteDistribution_t poisson;
    RAND_CHECK(curandCreatePoissonDistribution(12.0, &poisson));
    RAND_CHECK(curandDestroyDistribution(poisson));
  }

  CHECK(cudaStreamDestroy(stream));
  CHECK(cudaFree(buffer));
  report.done("rand");
  return 0;
}
