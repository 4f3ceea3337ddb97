// Texture and surface objects over arrays and linear memory: a 2D float array read through a
// point-sampled texture, a 3D array filled by cudaMemcpy3D and read through tex3D, a texture
// over linear device memory (tex1Dfetch), a surface written by a kernel and read back with
// cudaMemcpy2DFromArray, descriptor queries, and a mipmapped array's level. Host code only:
// the kernels are in kernels.cu.
#include "common.h"
#include "textures/kernels.h"

static cudaTextureObject_t texture_over(const cudaResourceDesc& res) {
  cudaTextureDesc td{};
  td.addressMode[0] = td.addressMode[1] = td.addressMode[2] = cudaAddressModeClamp;
  td.filterMode = cudaFilterModePoint;
  td.readMode = cudaReadModeElementType;
  cudaTextureObject_t tex;
  CHECK(cudaCreateTextureObject(&tex, &res, &td, nullptr));
  return tex;
}

int main() {
  const int width = 64, height = 48, depth = 4;
  Report report;
  cudaChannelFormatDesc f32 = cudaCreateChannelDesc<float>();

  // A 2D array, rows in from host memory, read through a texture.
  cudaArray_t array;
  CHECK(cudaMallocArray(&array, &f32, width, height));
  std::vector<float> image(width * height);
  for (int y = 0; y < height; ++y)
    for (int x = 0; x < width; ++x) image[y * width + x] = float((x * 7 + y * 13) % 101);
  const size_t row = width * sizeof(float);
  CHECK(cudaMemcpy2DToArray(array, 0, 0, image.data(), row, row, height, cudaMemcpyHostToDevice));
  cudaChannelFormatDesc got_desc;
  cudaExtent extent;
  unsigned int flags;
  CHECK(cudaArrayGetInfo(&got_desc, &extent, &flags, array));
  EXPECT(got_desc.x == 32 && got_desc.f == cudaChannelFormatKindFloat && extent.width == size_t(width) &&
         extent.height == size_t(height));
  cudaResourceDesc res{};
  res.resType = cudaResourceTypeArray;
  res.res.array.array = array;
  cudaTextureObject_t tex = texture_over(res);
  cudaResourceDesc back{};
  CHECK(cudaGetTextureObjectResourceDesc(&back, tex));
  EXPECT(back.resType == cudaResourceTypeArray && back.res.array.array == array);
  cudaTextureDesc back_td{};
  CHECK(cudaGetTextureObjectTextureDesc(&back_td, tex));
  EXPECT(back_td.filterMode == cudaFilterModePoint && back_td.addressMode[0] == cudaAddressModeClamp);
  float* d_out;
  CHECK(cudaMalloc(&d_out, width * height * depth * sizeof(float)));
  read_texture_2d(tex, d_out, width, height);
  CHECK_LAUNCH();
  std::vector<float> got(width * height), want(width * height);
  CHECK(cudaMemcpy(got.data(), d_out, got.size() * sizeof(float), cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < want.size(); ++i) want[i] = 2.0f * image[i] + 1.0f;
  expect_equal("texture 2D", got, want);
  report.line("tex2d", checksum(got));
  // A block of the array, by offsets.
  std::vector<float> block(8 * 4);
  CHECK(cudaMemcpy2DFromArray(block.data(), 8 * sizeof(float), array, 10 * sizeof(float), 5, 8 * sizeof(float), 4,
                              cudaMemcpyDeviceToHost));
  for (int y = 0; y < 4; ++y)
    for (int x = 0; x < 8; ++x) EXPECT(block[y * 8 + x] == image[(y + 5) * width + x + 10]);
  report.line("block", checksum(block));
  CHECK(cudaDestroyTextureObject(tex));

  // A 3D array filled from host memory by cudaMemcpy3D, read through tex3D.
  cudaArray_t volume;
  CHECK(cudaMalloc3DArray(&volume, &f32, make_cudaExtent(width, height, depth)));
  std::vector<float> voxels(width * height * depth);
  for (size_t i = 0; i < voxels.size(); ++i) voxels[i] = float((i * 2654435761u) % 1000);
  cudaMemcpy3DParms p{};
  p.srcPtr = make_cudaPitchedPtr(voxels.data(), row, width, height);
  p.dstArray = volume;
  p.extent = make_cudaExtent(width, height, depth);
  p.kind = cudaMemcpyHostToDevice;
  CHECK(cudaMemcpy3D(&p));
  res.res.array.array = volume;
  tex = texture_over(res);
  read_texture_3d(tex, d_out, width, height, depth);
  CHECK_LAUNCH();
  std::vector<float> got3(voxels.size());
  CHECK(cudaMemcpy(got3.data(), d_out, got3.size() * sizeof(float), cudaMemcpyDeviceToHost));
  expect_equal("texture 3D", got3, voxels);
  report.line("tex3d", checksum(got3));
  CHECK(cudaDestroyTextureObject(tex));

  // A texture over linear device memory.
  const int n = 1000;
  std::vector<int> values(n), reversed(n), want_rev(n);
  for (int i = 0; i < n; ++i) values[i] = i * i - 7 * i;
  int *d_values, *d_reversed;
  CHECK(cudaMalloc(&d_values, n * sizeof(int)));
  CHECK(cudaMalloc(&d_reversed, n * sizeof(int)));
  CHECK(cudaMemcpy(d_values, values.data(), n * sizeof(int), cudaMemcpyHostToDevice));
  cudaResourceDesc linear{};
  linear.resType = cudaResourceTypeLinear;
  linear.res.linear.devPtr = d_values;
  linear.res.linear.desc = cudaCreateChannelDesc<int>();
  linear.res.linear.sizeInBytes = n * sizeof(int);
  tex = texture_over(linear);
  read_linear(tex, d_reversed, n);
  CHECK_LAUNCH();
  CHECK(cudaMemcpy(reversed.data(), d_reversed, n * sizeof(int), cudaMemcpyDeviceToHost));
  for (int i = 0; i < n; ++i) want_rev[i] = values[n - 1 - i];
  expect_equal("linear texture", reversed, want_rev);
  report.line("linear", checksum(reversed));
  CHECK(cudaDestroyTextureObject(tex));

  // A surface over an array, written by a kernel.
  cudaChannelFormatDesc u32 = cudaCreateChannelDesc<unsigned int>();
  cudaArray_t surface_array;
  CHECK(cudaMallocArray(&surface_array, &u32, width, height, cudaArraySurfaceLoadStore));
  cudaResourceDesc sres{};
  sres.resType = cudaResourceTypeArray;
  sres.res.array.array = surface_array;
  cudaSurfaceObject_t surf;
  CHECK(cudaCreateSurfaceObject(&surf, &sres));
  CHECK(cudaGetSurfaceObjectResourceDesc(&back, surf));
  EXPECT(back.res.array.array == surface_array);
  write_surface(surf, width, height);
  CHECK_LAUNCH();
  std::vector<unsigned int> texels(width * height);
  CHECK(cudaMemcpy2DFromArray(texels.data(), width * sizeof(unsigned int), surface_array, 0, 0,
                              width * sizeof(unsigned int), height, cudaMemcpyDeviceToHost));
  for (int y = 0; y < height; ++y)
    for (int x = 0; x < width; ++x) EXPECT(texels[y * width + x] == unsigned(y * 1000 + x));
  report.line("surface", checksum(texels));
  CHECK(cudaDestroySurfaceObject(surf));

  // A mipmapped array: level 1 is half the size; its bytes go in and out.
  cudaMipmappedArray_t mipmap;
  CHECK(cudaMallocMipmappedArray(&mipmap, &f32, make_cudaExtent(width, height, 0), 3));
  cudaArray_t level;
  CHECK(cudaGetMipmappedArrayLevel(&level, mipmap, 1));
  CHECK(cudaArrayGetInfo(&got_desc, &extent, &flags, level));
  EXPECT(extent.width == size_t(width / 2) && extent.height == size_t(height / 2));
  const size_t half_row = (width / 2) * sizeof(float);
  CHECK(cudaMemcpy2DToArray(level, 0, 0, image.data(), row, half_row, height / 2, cudaMemcpyHostToDevice));
  std::vector<float> level_back((width / 2) * (height / 2));
  CHECK(cudaMemcpy2DFromArray(level_back.data(), half_row, level, 0, 0, half_row, height / 2, cudaMemcpyDeviceToHost));
  for (int y = 0; y < height / 2; ++y)
    for (int x = 0; x < width / 2; ++x) EXPECT(level_back[y * (width / 2) + x] == image[y * width + x]);
  report.line("mip level 1", checksum(level_back));
  CHECK(cudaFreeMipmappedArray(mipmap));

  CHECK(cudaFreeArray(array));
  CHECK(cudaFreeArray(volume));
  CHECK(cudaFreeArray(surface_array));
  for (void* ptr : {(void*)d_out, (void*)d_values, (void*)d_reversed}) CHECK(cudaFree(ptr));
  report.done("textures");
  return 0;
}
