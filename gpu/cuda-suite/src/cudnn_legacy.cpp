// cuDNN's legacy API beyond what PyTorch calls (NVIDIA's mnistCUDNN and conv samples use it):
// N-d tensor descriptors (cudnnSetTensorNdDescriptorEx), cudnnSetTensor, cudnnAddTensor,
// cudnnOpTensor, cudnnReduceTensor with its workspace and indices, an N-d convolution read
// back (cudnnGetConvolutionNdDescriptor), the algorithm search (cudnnFindConvolution-
// ForwardAlgorithm: only that it answers, its order is timing's), a forward convolution with
// the implicit-GEMM algorithm, its bias gradient (cudnnConvolutionBackwardBias), N-d pooling
// and a layout transform (cudnnTransformTensorEx). Results are checksummed; they must equal
// the native run's bytes on the same GPU. Host code only.
#include <cudnn.h>

#include "common.h"

namespace {

// A float tensor on the GPU with its descriptor.
struct Tensor {
  cudnnTensorDescriptor_t desc;
  float* data;
  std::vector<int> dims;
  size_t count() const {
    size_t n = 1;
    for (int d : dims) n *= d;
    return n;
  }
};

Tensor tensor(std::vector<int> dims, cudnnTensorFormat_t format = CUDNN_TENSOR_NCHW) {
  Tensor t;
  t.dims = dims;
  CHECK_STATUS(cudnnCreateTensorDescriptor(&t.desc));
  CHECK_STATUS(cudnnSetTensorNdDescriptorEx(t.desc, format, CUDNN_DATA_FLOAT, (int)dims.size(), dims.data()));
  CHECK(cudaMalloc(&t.data, t.count() * sizeof(float)));
  return t;
}

void fill(Tensor& t, float scale) {
  std::vector<float> v(t.count());
  for (size_t i = 0; i < v.size(); ++i) v[i] = scale * float((i * 7) % 11) - 1.0f;
  CHECK(cudaMemcpy(t.data, v.data(), v.size() * sizeof(float), cudaMemcpyHostToDevice));
}

unsigned long long sum_of(const Tensor& t) {
  std::vector<float> v(t.count());
  CHECK(cudaMemcpy(v.data(), t.data, v.size() * sizeof(float), cudaMemcpyDeviceToHost));
  return checksum(v);
}

}  // namespace

int main() {
  Report report;
  cudnnHandle_t h;
  CHECK_STATUS(cudnnCreate(&h));
  const float one = 1.0f, zero = 0.0f, two = 2.0f, half = 0.5f;

  Tensor x = tensor({2, 3, 16, 16}), bias = tensor({1, 3, 1, 1}), y = tensor({2, 3, 16, 16});
  fill(x, 0.25f);
  fill(bias, 1.0f);
  CHECK_STATUS(cudnnSetTensor(h, y.desc, y.data, &half));
  report.line("set", sum_of(y));
  CHECK_STATUS(cudnnAddTensor(h, &two, bias.desc, bias.data, &one, y.desc, y.data));
  report.line("add", sum_of(y));

  cudnnOpTensorDescriptor_t op;
  CHECK_STATUS(cudnnCreateOpTensorDescriptor(&op));
  CHECK_STATUS(cudnnSetOpTensorDescriptor(op, CUDNN_OP_TENSOR_MUL, CUDNN_DATA_FLOAT, CUDNN_PROPAGATE_NAN));
  Tensor product = tensor({2, 3, 16, 16});
  CHECK_STATUS(cudnnOpTensor(h, op, &one, x.desc, x.data, &two, y.desc, y.data, &zero, product.desc, product.data));
  report.line("op mul", sum_of(product));

  // The sum and the max (with its index) over everything but the channels.
  Tensor per_channel = tensor({1, 3, 1, 1});
  cudnnReduceTensorDescriptor_t reduce;
  CHECK_STATUS(cudnnCreateReduceTensorDescriptor(&reduce));
  CHECK_STATUS(cudnnSetReduceTensorDescriptor(reduce, CUDNN_REDUCE_TENSOR_MAX, CUDNN_DATA_FLOAT, CUDNN_PROPAGATE_NAN,
                                              CUDNN_REDUCE_TENSOR_FLATTENED_INDICES, CUDNN_32BIT_INDICES));
  size_t workspace_bytes = 0, indices_bytes = 0;
  CHECK_STATUS(cudnnGetReductionWorkspaceSize(h, reduce, x.desc, per_channel.desc, &workspace_bytes));
  CHECK_STATUS(cudnnGetReductionIndicesSize(h, reduce, x.desc, per_channel.desc, &indices_bytes));
  void *workspace = nullptr, *indices = nullptr;
  CHECK(cudaMalloc(&workspace, workspace_bytes + 16));
  CHECK(cudaMalloc(&indices, indices_bytes + 16));
  CHECK_STATUS(cudnnReduceTensor(h, reduce, indices, indices_bytes, workspace, workspace_bytes, &one, x.desc, x.data,
                                 &zero, per_channel.desc, per_channel.data));
  report.line("reduce max", sum_of(per_channel));
  std::vector<int> where(3);
  CHECK(cudaMemcpy(where.data(), indices, 3 * sizeof(int), cudaMemcpyDeviceToHost));
  report.line("reduce index", checksum(where));

  // A 3x3 convolution, 3 -> 4 channels, padding 1.
  cudnnFilterDescriptor_t w_desc;
  CHECK_STATUS(cudnnCreateFilterDescriptor(&w_desc));
  int w_dims[4] = {4, 3, 3, 3};
  CHECK_STATUS(cudnnSetFilterNdDescriptor(w_desc, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, 4, w_dims));
  float* w;
  CHECK(cudaMalloc(&w, 4 * 3 * 3 * 3 * sizeof(float)));
  std::vector<float> wv(4 * 3 * 3 * 3);
  for (size_t i = 0; i < wv.size(); ++i) wv[i] = float(int(i % 5) - 2) * 0.125f;
  CHECK(cudaMemcpy(w, wv.data(), wv.size() * sizeof(float), cudaMemcpyHostToDevice));
  cudnnConvolutionDescriptor_t conv;
  CHECK_STATUS(cudnnCreateConvolutionDescriptor(&conv));
  int pad[2] = {1, 1}, stride[2] = {1, 1}, dilation[2] = {1, 1};
  CHECK_STATUS(cudnnSetConvolutionNdDescriptor(conv, 2, pad, stride, dilation, CUDNN_CROSS_CORRELATION,
                                               CUDNN_DATA_FLOAT));
  int got_len = 0, got_pad[2], got_stride[2], got_dilation[2];
  cudnnConvolutionMode_t mode;
  cudnnDataType_t compute;
  CHECK_STATUS(cudnnGetConvolutionNdDescriptor(conv, 2, &got_len, got_pad, got_stride, got_dilation, &mode, &compute));
  EXPECT(got_len == 2 && got_pad[1] == 1 && got_stride[0] == 1 && mode == CUDNN_CROSS_CORRELATION);
  int out_dims[4];
  CHECK_STATUS(cudnnGetConvolutionNdForwardOutputDim(conv, x.desc, w_desc, 4, out_dims));
  Tensor out = tensor({out_dims[0], out_dims[1], out_dims[2], out_dims[3]});
  cudnnConvolutionFwdAlgoPerf_t perf[8];
  int returned = 0;
  CHECK_STATUS(cudnnFindConvolutionForwardAlgorithm(h, x.desc, w_desc, conv, out.desc, 8, &returned, perf));
  EXPECT(returned > 0 && perf[0].status == CUDNN_STATUS_SUCCESS);
  report.line("find answers", returned > 0);
  size_t conv_bytes = 0;
  CHECK_STATUS(cudnnGetConvolutionForwardWorkspaceSize(h, x.desc, w_desc, conv, out.desc,
                                                       CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, &conv_bytes));
  void* conv_space = nullptr;
  CHECK(cudaMalloc(&conv_space, conv_bytes + 16));
  CHECK_STATUS(cudnnConvolutionForward(h, &one, x.desc, x.data, w_desc, w, conv, CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM,
                                       conv_space, conv_bytes, &zero, out.desc, out.data));
  report.line("conv", sum_of(out));
  Tensor db = tensor({1, 4, 1, 1});
  CHECK_STATUS(cudnnConvolutionBackwardBias(h, &one, out.desc, out.data, &zero, db.desc, db.data));
  report.line("bias grad", sum_of(db));

  // 2x2 max pooling, stride 2, as an N-d pooling descriptor.
  cudnnPoolingDescriptor_t pool;
  CHECK_STATUS(cudnnCreatePoolingDescriptor(&pool));
  int window[2] = {2, 2}, no_pad[2] = {0, 0}, pool_stride[2] = {2, 2};
  CHECK_STATUS(cudnnSetPoolingNdDescriptor(pool, CUDNN_POOLING_MAX, CUDNN_PROPAGATE_NAN, 2, window, no_pad,
                                           pool_stride));
  Tensor pooled = tensor({2, 4, 8, 8});
  CHECK_STATUS(cudnnPoolingForward(h, pool, &one, out.desc, out.data, &zero, pooled.desc, pooled.data));
  report.line("pool", sum_of(pooled));

  // NCHW -> NHWC.
  cudnnTensorTransformDescriptor_t transform;
  CHECK_STATUS(cudnnCreateTensorTransformDescriptor(&transform));
  CHECK_STATUS(cudnnSetTensorTransformDescriptor(transform, 4, CUDNN_TENSOR_NHWC, nullptr, nullptr, nullptr,
                                                 CUDNN_TRANSFORM_FOLD));
  Tensor nhwc = tensor({2, 4, 8, 8}, CUDNN_TENSOR_NHWC);
  CHECK_STATUS(cudnnTransformTensorEx(h, transform, &one, pooled.desc, pooled.data, &zero, nhwc.desc, nhwc.data));
  report.line("nhwc", sum_of(nhwc));

  CHECK_STATUS(cudnnDestroy(h));
  report.done("cudnn_legacy");
  return 0;
}
