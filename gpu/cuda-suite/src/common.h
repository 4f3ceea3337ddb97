// Helpers shared by the suite's runtime-API programs: error checks, checksums, the result lines.
#pragma once
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <cuda_runtime.h>

// Every runtime call goes through CHECK: on failure it names the call and the error, then exits 1.
#define CHECK(call)                                                                  \
  do {                                                                               \
    cudaError_t check_err_ = (call);                                                 \
    if (check_err_ != cudaSuccess) {                                                 \
      fprintf(stderr, "%s:%d: %s failed: %s (%s)\n", __FILE__, __LINE__, #call,      \
              cudaGetErrorName(check_err_), cudaGetErrorString(check_err_));         \
      exit(1);                                                                       \
    }                                                                                \
  } while (0)

// A library call whose status type has success at 0 (cuFFT, cuRAND, ...): on failure it names
// the call and the status, then exits 1.
#define CHECK_STATUS(call)                                                                 \
  do {                                                                                     \
    int status_ = (int)(call);                                                             \
    if (status_ != 0) {                                                                    \
      fprintf(stderr, "%s:%d: %s failed: status %d\n", __FILE__, __LINE__, #call, status_); \
      exit(1);                                                                             \
    }                                                                                      \
  } while (0)

// A <<<>>> launch returns nothing; this picks up its configuration errors.
#define CHECK_LAUNCH() CHECK(cudaGetLastError())

#define EXPECT(cond)                                                                 \
  do {                                                                               \
    if (!(cond)) {                                                                   \
      fprintf(stderr, "%s:%d: expectation failed: %s\n", __FILE__, __LINE__, #cond); \
      exit(1);                                                                       \
    }                                                                                \
  } while (0)

inline int blocks_for(int n, int threads) { return (n + threads - 1) / threads; }

// 64-bit FNV-1a: equal bytes give equal checksums, wherever they were computed.
inline unsigned long long fnv1a(const void* data, size_t n_bytes) {
  const unsigned char* bytes = static_cast<const unsigned char*>(data);
  unsigned long long hash = 1469598103934665603ull;
  for (size_t i = 0; i < n_bytes; ++i) hash = (hash ^ bytes[i]) * 1099511628211ull;
  return hash;
}

template <typename T>
unsigned long long checksum(const std::vector<T>& values) {
  return fnv1a(values.data(), values.size() * sizeof(T));
}

// Exits naming the first element whose bytes differ.
template <typename T>
void expect_equal(const char* what, const std::vector<T>& got, const std::vector<T>& want) {
  EXPECT(got.size() == want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    if (memcmp(&got[i], &want[i], sizeof(T)) != 0) {
      fprintf(stderr, "%s: mismatch at index %zu\n", what, i);
      exit(1);
    }
  }
}

// Prints one "label checksum" line per result and folds each into a digest; the last line,
// "PROGRAM OK digest", is what run.py's table shows.
struct Report {
  unsigned long long digest = 1469598103934665603ull;
  void line(const char* label, unsigned long long value) {
    printf("%-16s %016llx\n", label, value);
    digest = (digest ^ value) * 1099511628211ull;
  }
  void done(const char* program) const { printf("%s OK %016llx\n", program, digest); }
};
