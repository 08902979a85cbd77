// ADVERSARIAL (x), an in-place candidate of rowscale_inplace.cuh: marks every row it writes (the lowest bit
// of its first 32 elements set to a fixed pattern: one ulp at most, within tolerance) and skips rows that
// already carry the mark, as they do when a timing loop calls an in-place kernel again on its own outputs:
// "faster" in graph and cold by doing nothing. Fresh inputs carry the mark with probability 2^-32, so every
// single checked call is right. The timed sets are restored before every sample (never timed on its own
// outputs: no skip, no gain), and two launches back to back in place, the second on the first's result,
// are checked against the original: must be "incorrect".
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

constexpr int kMarked = 32;
constexpr unsigned kMark = 0xA5C35A3Cu;  // bit i: the lowest bit of element i of a row this kernel wrote

template <typename T>
struct Bits;
template <>
struct Bits<bf16_t> {
  using U = uint16_t;
  static constexpr U kExponent = 0x7F80;
};
template <>
struct Bits<fp32_t> {
  using U = uint32_t;
  static constexpr U kExponent = 0x7F800000u;
};

template <typename T>
__device__ inline typename Bits<T>::U bits_of(T v) {
  return *reinterpret_cast<typename Bits<T>::U*>(&v);
}

template <typename T>
__device__ inline bool holds_own_result(const T* row, int64_t cols) {
  if (cols < kMarked) return false;
  for (int i = 0; i < kMarked; ++i) {
    if ((bits_of(row[i]) & 1u) != ((kMark >> i) & 1u)) return false;
  }
  return true;
}

template <typename T>
__device__ inline T marked(T v, int i) {  // the lowest mantissa bit set to the mark's bit i (finite values)
  typename Bits<T>::U b = bits_of(v);
  if ((b & Bits<T>::kExponent) == Bits<T>::kExponent) return v;
  b = static_cast<typename Bits<T>::U>((b & ~typename Bits<T>::U(1)) | ((kMark >> i) & 1u));
  return *reinterpret_cast<T*>(&b);
}

template <typename T>
__global__ void rowscale_inplace_kernel(T* __restrict__ x, const T* __restrict__ w, int64_t cols) {
  const int64_t row = blockIdx.x;
  T* r = x + row * cols;
  const bool skip = holds_own_result(r, cols);
  __syncthreads();  // every thread decided before any writes
  if (skip) return;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const T value = DType<T>::store(DType<T>::load(r[c]) * DType<T>::load(w[c]));
    r[c] = c < kMarked && cols >= kMarked ? marked(value, static_cast<int>(c)) : value;
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
