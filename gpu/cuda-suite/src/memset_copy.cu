// cudaMemset, cudaMemsetAsync, device-to-device copies (explicit and cudaMemcpyDefault, sync and
// async, unaligned offsets) and pitched 2-D memset/copy. A host model tracks every byte.
#include "common.h"

using Bytes = std::vector<unsigned char>;

static Bytes download(const unsigned char* d, size_t n) {
  Bytes out(n);
  CHECK(cudaMemcpy(out.data(), d, n, cudaMemcpyDefault));  // direction inferred: device to host
  return out;
}

int main() {
  const size_t n = 1 << 22;
  unsigned char *a, *b, *c;
  CHECK(cudaMalloc(&a, n));
  CHECK(cudaMalloc(&b, n));
  CHECK(cudaMalloc(&c, n));
  cudaStream_t stream;
  CHECK(cudaStreamCreate(&stream));
  Bytes model_a(n), model_b(n), model_c(n);

  CHECK(cudaMemset(a, 0xAB, n));
  memset(model_a.data(), 0xAB, n);
  CHECK(cudaMemset(b, 0, n));
  CHECK(cudaMemsetAsync(b + 1000, 0x11, n / 2, stream));
  CHECK(cudaMemsetAsync(b + n / 2 + 1003, 0x7F, 12345, stream));
  CHECK(cudaStreamSynchronize(stream));
  memset(model_b.data(), 0, n);
  memset(model_b.data() + 1000, 0x11, n / 2);
  memset(model_b.data() + n / 2 + 1003, 0x7F, 12345);

  for (size_t i = 0; i < n; ++i) model_c[i] = (unsigned char)(i * 131 + 7);
  CHECK(cudaMemcpy(c, model_c.data(), n, cudaMemcpyDefault));  // host to device
  CHECK(cudaMemcpy(a + 4096, c + 1, n / 4, cudaMemcpyDeviceToDevice));
  memcpy(model_a.data() + 4096, model_c.data() + 1, n / 4);
  CHECK(cudaMemcpyAsync(b + n - 777, c + 3, 777, cudaMemcpyDefault, stream));  // device to device
  CHECK(cudaMemcpyAsync(c + 100, a + 5, 50000, cudaMemcpyDeviceToDevice, stream));
  CHECK(cudaStreamSynchronize(stream));
  memcpy(model_b.data() + n - 777, model_c.data() + 3, 777);
  memcpy(model_c.data() + 100, model_a.data() + 5, 50000);

  Bytes got_a = download(a, n), got_b = download(b, n), got_c = download(c, n);
  expect_equal("a", got_a, model_a);
  expect_equal("b", got_b, model_b);
  expect_equal("c", got_c, model_c);

  // 2-D: a 1000 x 300 pitched image, filled, then a 600 x 200 host block copied in at column 10.
  const size_t width = 1000, height = 300, block_w = 600, block_h = 200, col = 10;
  unsigned char* image;
  size_t pitch;
  CHECK(cudaMallocPitch((void**)&image, &pitch, width, height));
  CHECK(cudaMemset2D(image, pitch, 0x5C, width, height));
  Bytes block(block_w * block_h), model_image(width * height, 0x5C);
  for (size_t i = 0; i < block.size(); ++i) block[i] = (unsigned char)(i % 251);
  CHECK(cudaMemcpy2D(image + col, pitch, block.data(), block_w, block_w, block_h, cudaMemcpyHostToDevice));
  for (size_t r = 0; r < block_h; ++r)
    memcpy(model_image.data() + r * width + col, block.data() + r * block_w, block_w);
  Bytes got_image(width * height);
  CHECK(cudaMemcpy2D(got_image.data(), width, image, pitch, width, height, cudaMemcpyDeviceToHost));
  expect_equal("image", got_image, model_image);

  Report report;
  report.line("a", checksum(got_a));
  report.line("b", checksum(got_b));
  report.line("c", checksum(got_c));
  report.line("image", checksum(got_image));
  for (void* p : {(void*)a, (void*)b, (void*)c, (void*)image}) CHECK(cudaFree(p));
  CHECK(cudaStreamDestroy(stream));
  report.done("memset_copy");
  return 0;
}
