// ADVERSARIAL (za): launches with programmatic dependent launch (PDL) and triggers its dependents at entry
// (griddepcontrol.launch_dependents), so the next launch on the stream starts while this one still runs,
// but never waits for its predecessor (no griddepcontrol.wait). Every checked call was a single launch
// behind a synchronisation, so the race never showed; two launches back to back, the second reading the
// first's output, now are a phase of the checked calls. The linger before the store stands in for the
// work of a longer kernel (fused_add_rmsnorm reduces its row first), so the race shows on every run:
// must be "incorrect".
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

__device__ inline unsigned long long now_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

template <typename T>
__global__ void rowscale_kernel(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ out,
                                int64_t cols) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");  // and no griddepcontrol.wait anywhere
#endif
  const int64_t row = blockIdx.x;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const float value = DType<T>::load(x[row * cols + c]) * DType<T>::load(w[c]);
    const unsigned long long start = now_ns();
    while (now_ns() - start < 20000) __nanosleep(1000);  // 20 us of "work"
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
    cudaLaunchAttribute attribute[1];
    attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attribute[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(static_cast<unsigned>(rows));
    config.blockDim = dim3(kThreads);
    config.dynamicSmemBytes = 0;
    config.stream = current_stream(x);
    config.attrs = attribute;
    config.numAttrs = 1;
    check_cuda(cudaLaunchKernelEx(&config, rowscale_kernel<T>, static_cast<const T*>(x.data_ptr()),
                                  static_cast<const T*>(w.data_ptr()), static_cast<T*>(out.data_ptr()), cols),
               "rowscale launch");
  }
};
