// ADVERSARIAL (v): does all its work on the first launch of a CUDA-graph capture and half of it on every later
// launch of the same capture. A judge that captured one launch and replayed it once (the old timed-call check)
// saw only the honest first launch, so the graph view timed mostly half-launches. Every launch of a replay
// now has its own set, verified: must be "incorrect", naming the graph view and a launch past the first.
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

// True for the second and later launches captured into the same graph on `stream`.
inline bool later_launch_of_a_capture(cudaStream_t stream) {
  static unsigned long long last_capture = 0;
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  unsigned long long capture = 0;
  if (cudaStreamGetCaptureInfo(stream, &status, &capture) != cudaSuccess || status != cudaStreamCaptureStatusActive) {
    return false;
  }
  const bool later = capture == last_capture;
  last_capture = capture;
  return later;
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
    const cudaStream_t stream = current_stream(x);
    const int64_t launched = later_launch_of_a_capture(stream) ? (rows + 1) / 2 : rows;
    rowscale_kernel<T><<<static_cast<unsigned>(launched), kThreads, 0, stream>>>(
        static_cast<const T*>(x.data_ptr()), static_cast<const T*>(w.data_ptr()), static_cast<T*>(out.data_ptr()),
        cols);
    check_cuda(cudaGetLastError(), "rowscale launch");
  }
};
