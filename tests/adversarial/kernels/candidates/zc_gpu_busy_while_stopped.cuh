// ADVERSARIAL (zc): from its kBusyAfter-th call on (the timing process: every checked call comes before),
// a thread of its own keeps long spin kernels queued on a private stream, one always running after the
// process synchronised its device, and stopping the process does not stop the GPU: the spin runs into the
// original's timing (contexts share the GPU by time slices, so the original's samples would include the
// spin's slices). The judge checks the GPU is quiet before each of the original's turns (an empty kernel's
// latency) and rejects work that keeps it busy past a bound: must be "interferes".
#pragma once

#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/c_env_api.h>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <thread>

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

constexpr int kBusyAfter = 128;
constexpr unsigned long long kSpinNs = 300000000ull;  // 300 ms per spin

__global__ void spin_kernel(unsigned long long ns) {
  unsigned long long start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    __nanosleep(100000);
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < ns);
}

// Starts (once, outside a graph capture) a thread that keeps two spin kernels queued on a private stream:
// whenever one ends it queues the next, so when the caller's device synchronisation returns (it waits for the
// work queued before it), the spin queued after it is already running.
inline void keep_the_gpu_busy(cudaStream_t caller) {
  static int calls = 0;
  static bool started = false;
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (started || ++calls < kBusyAfter || cudaStreamIsCapturing(caller, &status) != cudaSuccess ||
      status != cudaStreamCaptureStatusNone) {
    return;
  }
  started = true;
  int device = 0;
  check_cuda(cudaGetDevice(&device), "device");
  std::thread([device] {
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;  // never in the way of the caller's captures
    cudaThreadExchangeStreamCaptureMode(&mode);
    cudaSetDevice(device);
    cudaStream_t side = nullptr;
    cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking);
    cudaEvent_t done[2];
    for (cudaEvent_t& event : done) cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
    for (int k = 0;; ++k) {
      if (k >= 2) cudaEventSynchronize(done[k % 2]);  // the spin queued two launches ago has ended
      spin_kernel<<<1, 1, 0, side>>>(kSpinNs);
      cudaEventRecord(done[k % 2], side);
    }
  }).detach();
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
    keep_the_gpu_busy(current_stream(x));
  }
};
