// LEGITIMATE (m): same results, 16-byte vector loads and stores. Rows whose width is a multiple of the
// vector width (and 16-byte aligned pointers) take the vector path; anything else the scalar one.
// Must be ACCEPTED: status "correct" (bit-identical to the original).
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
__global__ void rowscale_vec_kernel(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ out,
                                    int64_t cols) {
  constexpr int kVec = 16 / sizeof(T);
  struct alignas(16) Pack {
    T v[kVec];
  };
  const int64_t row = blockIdx.x;
  const Pack* xs = reinterpret_cast<const Pack*>(x + row * cols);
  const Pack* ws = reinterpret_cast<const Pack*>(w);
  Pack* outs = reinterpret_cast<Pack*>(out + row * cols);
  for (int64_t p = threadIdx.x; p < cols / kVec; p += blockDim.x) {
    const Pack xv = xs[p], wv = ws[p];
    Pack ov;
#pragma unroll
    for (int i = 0; i < kVec; ++i) ov.v[i] = DType<T>::store(DType<T>::load(xv.v[i]) * DType<T>::load(wv.v[i]));
    outs[p] = ov;
  }
}

inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

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
    constexpr int kVec = 16 / sizeof(T);
    const bool vec = cols % kVec == 0 && aligned16(x.data_ptr()) && aligned16(w.data_ptr()) &&
                     aligned16(out.data_ptr());
    const auto kernel = vec ? rowscale_vec_kernel<T> : rowscale_kernel<T>;
    kernel<<<static_cast<unsigned>(rows), kThreads, 0, current_stream(x)>>>(
        static_cast<const T*>(x.data_ptr()), static_cast<const T*>(w.data_ptr()), static_cast<T*>(out.data_ptr()),
        cols);
    check_cuda(cudaGetLastError(), "rowscale launch");
  }
};
