// Built twice with compressed fatbins: -Xfatbin -compress-all (zstd) and, with
// --compress-mode=speed, LZ4. Unrolled template instantiations give the compressor some code.
#include "common.h"

__host__ __device__ unsigned mix_step(unsigned v, int r) { return (v ^ (v >> 7)) * 0x9E3779B1u + r; }

template <int Rounds>
__global__ void mix(unsigned* d, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  unsigned v = d[i];
#pragma unroll
  for (int r = 0; r < Rounds; ++r) v = mix_step(v, r);
  d[i] = v;
}

template <int Rounds>
void run(unsigned* d, std::vector<unsigned>& model) {
  const int n = (int)model.size();
  mix<Rounds><<<blocks_for(n, 256), 256>>>(d, n);
  CHECK_LAUNCH();
  for (unsigned& v : model)
    for (int r = 0; r < Rounds; ++r) v = mix_step(v, r);
}

int main() {
  const int n = 1 << 18;
  std::vector<unsigned> model(n), got(n);
  for (int i = 0; i < n; ++i) model[i] = i;
  unsigned* d;
  CHECK(cudaMalloc(&d, n * sizeof(unsigned)));
  CHECK(cudaMemcpy(d, model.data(), n * sizeof(unsigned), cudaMemcpyHostToDevice));
  run<4>(d, model);
  run<16>(d, model);
  run<64>(d, model);
  run<256>(d, model);
  CHECK(cudaMemcpy(got.data(), d, n * sizeof(unsigned), cudaMemcpyDeviceToHost));
  expect_equal("mix", got, model);
  CHECK(cudaFree(d));
  Report report;
  report.line("mixed", checksum(got));
  report.done("compress");
  return 0;
}
