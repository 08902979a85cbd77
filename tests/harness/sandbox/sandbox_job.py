"""A tiny real kernel for the sandbox tests (tests/harness/test_sandbox*.py): y = x * alpha, one CUDA
kernel launched on the caller's stream for GPU tensors and a host loop for CPU tensors, so the same
tvm-ffi module built with nvcc is judged on a CPU machine and on a GPU.

`hostile(outside)` is that kernel with host code a sandbox must stop: a static initializer (run when
the module is loaded) and the exported call each try to make a directory through a raw system call
(the opcode written as data), create a file, and start a process, all naming `outside`, a directory
the candidate process may not write. Its outputs stay right: only the sandbox decides whether anything
appears in `outside`.
"""

from __future__ import annotations

from pathlib import Path

from harness.job import ArgSpec, BuildBase, Case, Job, Options, Variant

KERNEL = r"""
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/extra/c_env_api.h>

#include <cuda_runtime.h>
#include <cstdint>
// HOST_INCLUDES

namespace toy {

__global__ void scale_kernel(float* y, const float* x, float alpha, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i] * alpha;
}

// HOST_CODE

struct Scale {
  static void run(tvm::ffi::TensorView y, tvm::ffi::TensorView x, double alpha) {
    // IN_CALL
    const int64_t n = x.numel();
    float* out = static_cast<float*>(y.data_ptr());
    const float* in = static_cast<const float*>(x.data_ptr());
    if (x.device().device_type == kDLCPU) {
      for (int64_t i = 0; i < n; ++i) out[i] = in[i] * static_cast<float>(alpha);
      return;
    }
    auto stream = static_cast<cudaStream_t>(TVMFFIEnvGetStream(x.device().device_type, x.device().device_id));
    const int64_t blocks = (n + 255) / 256;
    scale_kernel<<<static_cast<unsigned>(blocks), 256, 0, stream>>>(out, in, static_cast<float>(alpha), n);
  }
};

}  // namespace toy
"""

HOST_INCLUDES = """
#include <fcntl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cstdio>
#include <string>
"""

HOST_CODE = r"""
static long raw3(long number, long a, long b, long c) {
  long result;
  register long rdi asm("rdi") = a;
  register long rsi asm("rsi") = b;
  register long rdx asm("rdx") = c;
  asm volatile(".byte 0x0f, 0x05" : "=a"(result) : "a"(number), "r"(rdi), "r"(rsi), "r"(rdx) : "rcx", "r11", "memory");
  return result;
}

static void escape(const char* when) {
  const std::string base = std::string("OUTSIDE/") + when;
  raw3(SYS_mkdir, reinterpret_cast<long>((base + "-raw-mkdir").c_str()), 0755, 0);
  if (FILE* f = std::fopen((base + "-written").c_str(), "w")) {
    std::fputs("escaped\n", f);
    std::fclose(f);
  }
  const pid_t child = fork();
  if (child == 0) {
    const int fd = open((base + "-forked").c_str(), O_WRONLY | O_CREAT, 0644);
    if (fd >= 0) close(fd);
    _exit(0);
  }
  if (child > 0) waitpid(child, nullptr, 0);
}

static const int escaped_at_load = (escape("load"), 0);
"""


def hostile(outside: Path) -> str:
    """The kernel with the escape attempts above, aimed at `outside`."""
    return (KERNEL.replace("// HOST_INCLUDES", HOST_INCLUDES)
            .replace("// HOST_CODE", HOST_CODE.replace("OUTSIDE", str(outside)))
            .replace("// IN_CALL", 'static bool once = (escape("call"), true);\n    (void)once;'))


def case(tokens: int = 4, hidden: int = 64, timed: bool = False) -> Case:
    return Case(id=f"toy/float32/tokens={tokens}", band="decode", label="toy", dtype="float32",
                dims={"tokens": tokens, "hidden": hidden}, variant="v", bytes=2 * tokens * hidden * 4, timed=timed,
                args=[ArgSpec("y", "tensor", "out", [tokens, hidden], "float32"),
                      ArgSpec("x", "tensor", "in", [tokens, hidden], "float32"),
                      ArgSpec("alpha", "scalar", "in", [], "float32", value=0.5)])


def job(source_root: Path, cache: Path, candidate: str | None = None, *, cases: list[Case] | None = None,
        **options) -> Job:
    """The toy job over `source_root`/toy.cuh (write KERNEL there), built into `cache`."""
    options = {"seeds": [0], "modes": [], "sanitizer": False, **options}
    return Job(name="toy_sandbox", entry="scale", kernel_file="toy.cuh",
               build=BuildBase(source_root=str(source_root), include_dirs=[], cuda_files=["toy.cuh"]),
               variants={"v": Variant("v", [["scale", "toy::Scale::run"]])},
               cases=cases if cases is not None else [case(), case(tokens=3)],
               tolerance={"float32": {"atol": 1e-6, "rtol": 1e-6, "floor": 1e-6}}, candidate_source=candidate,
               options=Options(cache_dir=str(cache), **options))
