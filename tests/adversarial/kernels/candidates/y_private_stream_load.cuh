// ADVERSARIAL (y): after each of its own calls (outside a graph capture) queues a bandwidth-heavy kernel on a
// private stream that nobody waits for. When both sides were timed in one process, that kernel ran during the
// original's next cold sample: x1.235 in cold on an H100 for a kernel that is no faster. The original is now
// timed in the judge's process while this process is stopped after synchronising its device, so the load
// only slows the candidate itself: must be "correct" and not faster.
#pragma once

#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/c_env_api.h>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

using bf16_t = __nv_bfloat16;
using fp32_t = float;

namespace rowscale {

constexpr int kThreads = 256;

template <typename T>
struct DType;
template <>
struct DType<bf16_t> {
  static constexpr uint8_t code = kDLBfloat;
  __device__ static float load(bf16_t v) { return __bfloat162float(v); }
  __device__ static bf16_t store(float v) { return __float2bfloat16_rn(v); }
};
template <>
struct DType<fp32_t> {
  static constexpr uint8_t code = kDLFloat;
  __device__ static float load(fp32_t v) { return v; }
  __device__ static fp32_t store(float v) { return v; }
};

template <typename T>
__global__ void rowscale_kernel(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ out,
                                int64_t cols) {
  const int64_t row = blockIdx.x;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const float value = DType<T>::load(x[row * cols + c]) * DType<T>::load(w[c]);
    out[row * cols + c] = DType<T>::store(value);
  }
}

template <typename T>
inline void check_tensor(const tvm::ffi::TensorView& t, int ndim, const char* name) {
  TVM_FFI_CHECK(t.ndim() == ndim, ValueError) << name << " must have " << ndim << " dimensions";
  TVM_FFI_CHECK(t.dtype().code == DType<T>::code && t.dtype().bits == 8 * sizeof(T), TypeError)
      << name << " has the wrong dtype";
  TVM_FFI_CHECK(t.device().device_type == kDLCUDA, ValueError) << name << " must be a CUDA tensor";
  TVM_FFI_CHECK(t.IsContiguous(), ValueError) << name << " must be contiguous";
}

inline void check_cuda(cudaError_t status, const char* what) {
  TVM_FFI_CHECK(status == cudaSuccess, RuntimeError) << what << ": " << cudaGetErrorString(status);
}

inline cudaStream_t current_stream(const tvm::ffi::TensorView& t) {
  return static_cast<cudaStream_t>(TVMFFIEnvGetStream(t.device().device_type, t.device().device_id));
}

constexpr int64_t kLoadWords = int64_t{64} << 20;  // 256 MiB of int32 read per call

__global__ void load_kernel(const int* __restrict__ data, int64_t words, int* __restrict__ sink) {
  int acc = 0;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < words;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    acc ^= data[i];
  }
  if (acc == 0x7fffffff) *sink = acc;  // keeps the reads
}

// Reads kLoadWords words on a private non-blocking stream, after the caller's work was queued.
inline void queue_private_load(cudaStream_t caller) {
  static cudaStream_t side = nullptr;
  static int* data = nullptr;
  if (side == nullptr) {
    check_cuda(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking), "private stream");
    check_cuda(cudaMalloc(&data, kLoadWords * sizeof(int) + sizeof(int)), "load buffer");
    check_cuda(cudaMemset(data, 1, kLoadWords * sizeof(int) + sizeof(int)), "load buffer");
  }
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(caller, &status) != cudaSuccess || status != cudaStreamCaptureStatusNone) return;
  load_kernel<<<1024, 256, 0, side>>>(data, kLoadWords, data + kLoadWords);
}

}  // namespace rowscale

template <typename T>
struct RowScaleKernel {
  static void run(tvm::ffi::TensorView x, tvm::ffi::TensorView w, tvm::ffi::TensorView out) {
    using namespace rowscale;
    check_tensor<T>(x, 2, "x");
    check_tensor<T>(w, 1, "w");
    check_tensor<T>(out, 2, "out");
    const int64_t rows = x.size(0), cols = x.size(1);
    TVM_FFI_CHECK(w.size(0) == cols && out.size(0) == rows && out.size(1) == cols, ValueError)
        << "shape mismatch";
    if (rows == 0 || cols == 0) return;
    rowscale_kernel<T><<<static_cast<unsigned>(rows), kThreads, 0, current_stream(x)>>>(
        static_cast<const T*>(x.data_ptr()), static_cast<const T*>(w.data_ptr()), static_cast<T*>(out.data_ptr()),
        cols);
    check_cuda(cudaGetLastError(), "rowscale launch");
    queue_private_load(current_stream(x));
    check_cuda(cudaGetLastError(), "rowscale launch");
  }
};
