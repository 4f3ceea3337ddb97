// Copies in two and three dimensions: cudaMalloc3D and cudaMemset3D, boxes between host
// memory and a pitched allocation at offsets (synchronous and on a stream, into pinned
// memory), a kernel reading the pitched layout, cudaMallocPitch with cudaMemset2D, 3D arrays
// filled from device memory and read into host memory at an offset, the 1D array copies,
// cudaMemcpy2DToArrayAsync/FromArrayAsync, and batches of copies (cudaMemcpyBatchAsync,
// cudaMemcpy3DBatchAsync). Every result is checked against a host model.
#include "common.h"
#include "copies_3d/kernels.h"

int main() {
  Report report;
  const int W = 37, H = 9, D = 5;
  cudaExtent extent = make_cudaExtent(W, H, D);
  cudaPitchedPtr pitched;
  CHECK(cudaMalloc3D(&pitched, extent));
  EXPECT(pitched.pitch >= size_t(W) && pitched.xsize == size_t(W) && pitched.ysize == size_t(H));
  CHECK(cudaMemset3D(pitched, 0x3c, extent));
  std::vector<unsigned char> model(W * H * D, 0x3c);

  // A box of host memory at an offset into the allocation.
  std::vector<unsigned char> box(W * H * D);
  for (size_t i = 0; i < box.size(); ++i) box[i] = (unsigned char)(i * 31 + 7);
  cudaMemcpy3DParms p{};
  p.srcPtr = make_cudaPitchedPtr(box.data(), W, W, H);
  p.srcPos = make_cudaPos(2, 1, 0);
  p.dstPtr = pitched;
  p.dstPos = make_cudaPos(5, 3, 1);
  p.extent = make_cudaExtent(20, 4, 3);
  p.kind = cudaMemcpyHostToDevice;
  CHECK(cudaMemcpy3D(&p));
  for (int z = 0; z < 3; ++z)
    for (int y = 0; y < 4; ++y)
      for (int x = 0; x < 20; ++x) model[((z + 1) * H + y + 3) * W + x + 5] = box[(z * H + y + 1) * W + x + 2];

  // The whole volume back, on a stream into pinned memory.
  cudaStream_t stream;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  unsigned char* pinned;
  CHECK(cudaMallocHost(&pinned, W * H * D));
  p = cudaMemcpy3DParms{};
  p.srcPtr = pitched;
  p.dstPtr = make_cudaPitchedPtr(pinned, W, W, H);
  p.extent = extent;
  p.kind = cudaMemcpyDeviceToHost;
  CHECK(cudaMemcpy3DAsync(&p, stream));
  CHECK(cudaStreamSynchronize(stream));
  std::vector<unsigned char> volume(pinned, pinned + W * H * D);
  expect_equal("3D box", volume, model);
  report.line("3d box", checksum(volume));

  // The device sees the same layout.
  unsigned int* d_sums;
  CHECK(cudaMalloc(&d_sums, D * sizeof(unsigned int)));
  slice_sums(pitched, W, H, D, d_sums);
  CHECK_LAUNCH();
  std::vector<unsigned int> sums(D), want_sums(D, 0);
  CHECK(cudaMemcpy(sums.data(), d_sums, D * sizeof(unsigned int), cudaMemcpyDeviceToHost));
  for (int z = 0; z < D; ++z)
    for (int i = 0; i < W * H; ++i) want_sums[z] += model[z * W * H + i];
  expect_equal("slice sums", sums, want_sums);
  report.line("slice sums", checksum(sums));

  // 2D pitched memory and a 2D memset.
  void* plane;
  size_t plane_pitch;
  CHECK(cudaMallocPitch(&plane, &plane_pitch, 100, 6));
  CHECK(cudaMemset2D(plane, plane_pitch, 0x11, 100, 6));
  CHECK(cudaMemset2DAsync(static_cast<char*>(plane) + plane_pitch + 10, plane_pitch, 0x22, 30, 3, stream));
  std::vector<unsigned char> rows(100 * 6), want_rows(100 * 6, 0x11);
  for (int y = 1; y < 4; ++y)
    for (int x = 10; x < 40; ++x) want_rows[y * 100 + x] = 0x22;
  CHECK(cudaStreamSynchronize(stream));
  CHECK(cudaMemcpy2D(rows.data(), 100, plane, plane_pitch, 100, 6, cudaMemcpyDeviceToHost));
  expect_equal("2D memset", rows, want_rows);
  report.line("2d memset", checksum(rows));

  // A 3D array of bytes: from device memory, then a box of it into host memory.
  cudaChannelFormatDesc u8 = cudaCreateChannelDesc<unsigned char>();
  cudaArray_t array;
  CHECK(cudaMalloc3DArray(&array, &u8, extent));
  p = cudaMemcpy3DParms{};
  p.srcPtr = pitched;
  p.dstArray = array;
  p.extent = extent;
  p.kind = cudaMemcpyDeviceToDevice;
  CHECK(cudaMemcpy3D(&p));
  std::vector<unsigned char> sub(10 * 3 * 2);
  p = cudaMemcpy3DParms{};
  p.srcArray = array;
  p.srcPos = make_cudaPos(4, 2, 3);
  p.dstPtr = make_cudaPitchedPtr(sub.data(), 10, 10, 3);
  p.extent = make_cudaExtent(10, 3, 2);
  p.kind = cudaMemcpyDeviceToHost;
  CHECK(cudaMemcpy3D(&p));
  for (int z = 0; z < 2; ++z)
    for (int y = 0; y < 3; ++y)
      for (int x = 0; x < 10; ++x) EXPECT(sub[(z * 3 + y) * 10 + x] == model[((z + 3) * H + y + 2) * W + x + 4]);
  report.line("array box", checksum(sub));
  CHECK(cudaFreeArray(array));

  // 2D arrays: asynchronous row copies and the 1D copies (deprecated, still exported).
  cudaArray_t flat;
  CHECK(cudaMallocArray(&flat, &u8, 64, 8));
  std::vector<unsigned char> tile(64 * 8), tile_back(64 * 8);
  for (size_t i = 0; i < tile.size(); ++i) tile[i] = (unsigned char)(i ^ 0x5a);
  CHECK(cudaMemcpy2DToArrayAsync(flat, 0, 0, tile.data(), 64, 64, 8, cudaMemcpyHostToDevice, stream));
  CHECK(cudaMemcpy2DFromArrayAsync(tile_back.data(), 64, flat, 0, 0, 64, 8, cudaMemcpyDeviceToHost, stream));
  CHECK(cudaStreamSynchronize(stream));
  expect_equal("array rows", tile_back, tile);
  std::vector<unsigned char> run(40);
  for (size_t i = 0; i < run.size(); ++i) run[i] = (unsigned char)(200 + i);
  CHECK(cudaMemcpyToArray(flat, 16, 2, run.data(), run.size(), cudaMemcpyHostToDevice));
  std::vector<unsigned char> run_back(40);
  CHECK(cudaMemcpyFromArray(run_back.data(), flat, 16, 2, run_back.size(), cudaMemcpyDeviceToHost));
  expect_equal("array run", run_back, run);
  report.line("array rows", checksum(tile_back));

  // A batch of copies in stream order: host to device, device to device, device to host.
  std::vector<unsigned char> a(4096), b(4096);
  for (size_t i = 0; i < a.size(); ++i) a[i] = (unsigned char)(i * 13);
  void *d_a, *d_b;
  CHECK(cudaMalloc(&d_a, a.size()));
  CHECK(cudaMalloc(&d_b, a.size()));
  void* dsts[3] = {d_a, d_b, b.data()};
  const void* srcs[3] = {a.data(), d_a, d_b};
  size_t sizes[3] = {a.size(), a.size(), a.size()};
  cudaMemcpyAttributes attrs{};
  attrs.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
  size_t attr_index = 0;
  CHECK(cudaMemcpyBatchAsync(dsts, srcs, sizes, 3, &attrs, &attr_index, 1, stream));
  CHECK(cudaStreamSynchronize(stream));
  expect_equal("batch", b, a);
  report.line("batch", checksum(b));

  // A 3D batch of one copy: pinned host bytes into a box of a byte array.
  CHECK(cudaMalloc3DArray(&array, &u8, extent));
  CHECK(cudaMemset3D(pitched, 0, extent));
  p = cudaMemcpy3DParms{};
  p.srcPtr = pitched;
  p.dstArray = array;
  p.extent = extent;
  p.kind = cudaMemcpyDeviceToDevice;
  CHECK(cudaMemcpy3D(&p));
  for (int i = 0; i < 8 * 2 * 2; ++i) pinned[i] = (unsigned char)(i + 1);
  cudaMemcpy3DBatchOp op{};
  op.src.type = cudaMemcpyOperandTypePointer;
  op.src.op.ptr.ptr = pinned;
  op.src.op.ptr.rowLength = 8;
  op.src.op.ptr.layerHeight = 2;
  op.src.op.ptr.locHint.type = cudaMemLocationTypeHost;
  op.dst.type = cudaMemcpyOperandTypeArray;
  op.dst.op.array.array = array;
  op.dst.op.array.offset.x = 3;
  op.dst.op.array.offset.y = 1;
  op.dst.op.array.offset.z = 2;
  op.extent = make_cudaExtent(8, 2, 2);
  op.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
  CHECK(cudaMemcpy3DBatchAsync(1, &op, 0, stream));
  CHECK(cudaStreamSynchronize(stream));
  std::vector<unsigned char> whole(W * H * D), want_whole(W * H * D, 0);
  for (int z = 0; z < 2; ++z)
    for (int y = 0; y < 2; ++y)
      for (int x = 0; x < 8; ++x) want_whole[((z + 2) * H + y + 1) * W + x + 3] = (unsigned char)((z * 2 + y) * 8 + x + 1);
  p = cudaMemcpy3DParms{};
  p.srcArray = array;
  p.dstPtr = make_cudaPitchedPtr(whole.data(), W, W, H);
  p.extent = extent;
  p.kind = cudaMemcpyDeviceToHost;
  CHECK(cudaMemcpy3D(&p));
  expect_equal("3D batch", whole, want_whole);
  report.line("3d batch", checksum(whole));

  CHECK(cudaFreeArray(array));
  CHECK(cudaFreeArray(flat));
  for (void* ptr : {pitched.ptr, plane, d_a, d_b, (void*)d_sums}) CHECK(cudaFree(ptr));
  CHECK(cudaFreeHost(pinned));
  CHECK(cudaStreamDestroy(stream));
  report.done("copies_3d");
  return 0;
}
