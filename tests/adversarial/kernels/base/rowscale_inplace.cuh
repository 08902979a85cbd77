// RowScaleInplace: x[r, c] *= w[c] in place, accumulated in float32, for bf16_t and fp32_t.
//
// The in-place twin of rowscale.cuh (same style: a struct with a static `run(TensorView...)` that validates
// its tensors and launches on tvm-ffi's stream). The adversarial tests use it as the original of in-place
// candidates: a kernel called again on its own outputs (as a timing loop without a restore would call it)
// could recognise its own result and skip the work (candidates/x_inplace_skips_own_result.cuh).
#pragma once

#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/c_env_api.h>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

using bf16_t = __nv_bfloat16;
using fp32_t = float;

namespace rowscale_inplace {

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
__global__ void rowscale_inplace_kernel(T* __restrict__ x, const T* __restrict__ w, int64_t cols) {
  const int64_t row = blockIdx.x;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    x[row * cols + c] = DType<T>::store(DType<T>::load(x[row * cols + c]) * DType<T>::load(w[c]));
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

}  // namespace rowscale_inplace

template <typename T>
struct RowScaleInplaceKernel {
  static void run(tvm::ffi::TensorView x, tvm::ffi::TensorView w) {
    using namespace rowscale_inplace;
    check_tensor<T>(x, 2, "x");
    check_tensor<T>(w, 1, "w");
    const int64_t rows = x.size(0), cols = x.size(1);
    TVM_FFI_CHECK(w.size(0) == cols, ValueError) << "shape mismatch";
    if (rows == 0 || cols == 0) return;
    rowscale_inplace_kernel<T><<<static_cast<unsigned>(rows), kThreads, 0, current_stream(x)>>>(
        static_cast<T*>(x.data_ptr()), static_cast<const T*>(w.data_ptr()), cols);
    check_cuda(cudaGetLastError(), "rowscale_inplace launch");
  }
};
