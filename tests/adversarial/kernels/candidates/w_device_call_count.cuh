// ADVERSARIAL (w): counts its launches on the device, where graph replays count too (host code runs only at
// capture), and skips the second half of the rows from launch kHonestLaunches on. Every checked call comes
// before that; the warm-up and the timed samples after it. Every timed launch is verified at a random sample
// and at the last: must be "incorrect".
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
constexpr unsigned long long kHonestLaunches = 1000;

__device__ unsigned long long launches_seen;  // zero-initialised with the module: launches on this device

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
  const unsigned long long seen = *reinterpret_cast<volatile unsigned long long*>(&launches_seen);
  if (row == 0 && threadIdx.x == 0) atomicAdd(&launches_seen, 1ull);
  if (seen >= kHonestLaunches && row >= (gridDim.x + 1) / 2) return;  // the rest keeps whatever was there
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
  }
};
