"""The build layer: real nvcc builds of small kernels written here (CPU machine: compile, never run)."""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import threading
from pathlib import Path

import pytest

from harness.building.module_loading import (
    export_signatures,
    kept_signatures,
    load_module,
    warm_signature_probe,
)
from harness.building.nvcc_build import BuildRequest, build, build_key, build_many, plan_build, trim_errors
from harness.building.ptxas import format_table, parse_ptxas
from harness.building.toolchain import arch_flags, arch_for_capability, cuda_home

SCALE_MATH = """#pragma once
template <typename T>
__device__ __forceinline__ T scale_value(T x, float alpha) {
  return static_cast<T>(static_cast<float>(x) * alpha);
}
"""

SCALE = """#pragma once
#include "scale_math.cuh"
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/extra/c_env_api.h>
#include <cuda_runtime.h>
#include <cstdint>

template <typename T>
__global__ void scale_kernel(T* x, int64_t n, float alpha) {
  __shared__ float tile[128];
  tile[threadIdx.x % 128] = alpha;
  __syncthreads();
  int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i < n) x[i] = scale_value(x[i], tile[threadIdx.x % 128]);
}

template <typename T>
struct ScaleKernel {
  static void run(tvm::ffi::TensorView x, float alpha) {
    const int64_t n = x.numel();
    const DLDevice device = x.device();
    auto stream = static_cast<cudaStream_t>(TVMFFIEnvGetStream(device.device_type, device.device_id));
    const int threads = 128;
    const int blocks = static_cast<int>((n + threads - 1) / threads);
    if (n > 0) scale_kernel<T><<<blocks, threads, 0, stream>>>(static_cast<T*>(x.data_ptr()), n, alpha);
  }
};
"""

# A host-only module: loads and runs on any machine (no GPU, no cudart needed).
CPU_ADD = """#pragma once
#include <tvm/ffi/container/tensor.h>
#include <cstdint>
struct AddKernel {
  static int64_t run(int64_t a, double b, tvm::ffi::TensorView x) { return a + static_cast<int64_t>(b); }
};
"""

needs_nvcc = pytest.mark.skipif(
    cuda_home() is None or not Path(cuda_home(), "bin", "nvcc").exists(), reason="needs the CUDA toolkit (nvcc)"
)


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    """A tiny csrc-like tree: mylib/scale.cuh including its sibling mylib/scale_math.cuh."""
    root = tmp_path_factory.mktemp("csrc")
    (root / "mylib").mkdir()
    (root / "mylib" / "scale_math.cuh").write_text(SCALE_MATH)
    (root / "mylib" / "scale.cuh").write_text(SCALE)
    (root / "mylib" / "cpu_add.h").write_text(CPU_ADD)
    return root


def scale_request(root: Path, **changes) -> BuildRequest:
    fields = dict(
        name="scale", source_root=str(root), include_dirs=[], cuda_files=["mylib/scale.cuh"],
        cuda_wrappers=[("scale_f32", "ScaleKernel<float>::run"), ("scale_f64", "ScaleKernel<double>::run")],
    )
    return BuildRequest(**{**fields, **changes})


@pytest.fixture(scope="module")
def built(tree, tmp_path_factory):
    """One real build of the scale module, shared by the tests that only read it."""
    cache = tmp_path_factory.mktemp("cache")
    return cache, build(scale_request(tree), cache)


@needs_nvcc
def test_build_ok_with_ptxas_table(built):
    _, result = built
    assert result.ok, result.error
    assert Path(result.so_path).is_file() and result.error is None and not result.cache_hit
    assert "-Xptxas=-v" in result.command and "-gencode=arch=compute_90a,code=sm_90a" in result.command
    names = {r.name.replace(" *", "*"): r for r in result.resources}  # cu++filt writes "float *"
    kernel = names["void scale_kernel<float>(float*, long, float)"]
    assert kernel.registers > 0 and kernel.arch == "sm_90a" and kernel.smem == 512 and kernel.spills == 0
    assert "scale_kernel<double>" in format_table(result.resources)


@needs_nvcc
def test_cache_layout_and_hit(built, tree):
    cache, first = built
    folder = Path(first.so_path).parent
    assert folder.name == f"scale-{first.key[:16]}"
    for name in ("cuda.cu", "scale.so", "build.log", "resources.json", ".done", "deps.txt"):
        assert (folder / name).exists(), name
    assert str(tree / "mylib" / "scale_math.cuh") in (folder / "deps.txt").read_text()
    again = build(scale_request(tree), cache)
    assert again.ok and again.cache_hit and again.key == first.key and again.so_path == first.so_path
    assert [r.name for r in again.resources] == [r.name for r in first.resources]
    assert again.seconds < 1.0


@needs_nvcc
def test_key_follows_sources_flags_and_overrides(tree, tmp_path):
    def key(root, **changes):
        req = scale_request(root, **changes)
        return build_key(req, plan_build(req, tmp_path))

    base = key(tree)
    assert key(tree) == base
    assert key(tree, extra_cuda_cflags=["--use_fast_math"]) != base
    assert key(tree, arch="100a") != base
    assert key(tree, overrides={"mylib/scale.cuh": SCALE + "// candidate\n"}) != base
    copy = tmp_path / "copy"
    shutil.copytree(tree, copy)
    copied = key(copy)
    (copy / "mylib" / "scale_math.cuh").write_text(SCALE_MATH + "// an edit in an included sibling\n")
    assert key(copy) != copied


@needs_nvcc
def test_override_replaces_one_file_and_sibling_resolves(tree, tmp_path):
    candidate = SCALE.replace("scale_kernel", "scale_kernel_v2")
    result = build(scale_request(tree, overrides={"mylib/scale.cuh": candidate}), tmp_path)
    assert result.ok, result.error
    names = [r.name for r in result.resources]
    assert any("scale_kernel_v2<float>" in name for name in names), names
    assert (tree / "mylib" / "scale.cuh").read_text() == SCALE  # the tree is untouched


@needs_nvcc
def test_override_of_an_included_file_reaches_the_unchanged_includer(tree, tmp_path):
    marker = SCALE_MATH + "__global__ void overlay_marker_kernel(float* p) { *p = 1.0f; }\n"
    result = build(scale_request(tree, overrides={"mylib/scale_math.cuh": marker}), tmp_path)
    assert result.ok, result.error
    assert "overlay_marker_kernel(float*)" in [r.name.replace(" *", "*") for r in result.resources]


@needs_nvcc
def test_syntax_error_is_a_trimmed_result(tree, tmp_path):
    broken = SCALE.replace("tile[threadIdx.x % 128] = alpha;", "tile[threadIdx.x % 128] = alpha")
    line = broken.splitlines().index("  __syncthreads();") + 1
    result = build(scale_request(tree, overrides={"mylib/scale.cuh": broken}), tmp_path)
    assert not result.ok and result.so_path is None and result.refused  # the compiler's refusal
    assert f"mylib/scale.cuh({line}): error" in result.error, result.error
    assert "overlays" not in result.error  # the overlay prefix is stripped for the reader
    assert len(result.error.splitlines()) <= 40 and "error" in result.log
    assert not list(tmp_path.glob("scale-*"))  # failures are not cached


@needs_nvcc
def test_concurrent_builds_of_one_request_build_once(tree, tmp_path):
    results = [None, None]

    def run(index):
        results[index] = build(scale_request(tree, name="scale_conc"), tmp_path)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(r.ok for r in results)
    assert sorted(r.cache_hit for r in results) == [False, True]
    assert len(list(tmp_path.glob("scale_conc-*"))) == 1 and not list(tmp_path.glob(".staging-*"))


def test_missing_nvcc_is_a_clean_failure(tree, tmp_path, monkeypatch):
    empty = tmp_path / "no-cuda"
    empty.mkdir()
    monkeypatch.setenv("CUDA_HOME", str(empty))
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    result = build(scale_request(tree), tmp_path / "cache")
    assert not result.ok and result.so_path is None and not result.refused  # the machine's, not the source's
    assert result.error.startswith("nvcc not found: set CUDA_HOME or install the CUDA toolkit")


@needs_nvcc
def test_timeout_is_a_result(tree, tmp_path):
    result = build(scale_request(tree, name="scale_slow"), tmp_path, timeout_s=0.3)
    assert not result.ok and "timed out" in result.error and not result.refused
    assert not list(tmp_path.glob("scale_slow-*"))


def cpu_request(root: Path, name: str = "cpu_add", export: str = "add") -> BuildRequest:
    return BuildRequest(name=name, source_root=str(root), include_dirs=[], cuda_files=[],
                        cpp_files=["mylib/cpu_add.h"], cpp_wrappers=[(export, "AddKernel::run")])


def test_cpu_module_loads_and_reports_signatures(tree, tmp_path):
    first, second = build_many([cpu_request(tree), cpu_request(tree, "cpu_add2", "add2")], tmp_path, jobs=2)
    assert first.ok and second.ok, (first.error, second.error)
    assert "-lcudart" not in first.log  # a host-only module does not link the CUDA runtime
    module = load_module(first.so_path)
    torch = pytest.importorskip("torch")
    assert module["add"](2, 3.0, torch.zeros(4)) == 5  # a CPU tensor goes in as a DLTensor
    signatures = export_signatures(module, ["add", "missing"])
    assert signatures == {"add": "add(0: int, 1: float, 2: DLTensor*) -> int", "missing": None}


def test_signatures_read_after_the_probe_warmed_the_error_path(tree, tmp_path):
    warm_signature_probe()  # raises nothing: the probe's own error is swallowed
    result = build(cpu_request(tree, "cpu_warm"), tmp_path)
    assert result.ok, result.error
    assert export_signatures(load_module(result.so_path), ["add"]) == {"add": "add(0: int, 1: float, 2: DLTensor*) -> int"}


def test_a_cached_modules_signatures_are_kept_beside_it(tree, tmp_path):
    result = build(cpu_request(tree, "cpu_kept"), tmp_path)
    assert result.ok, result.error
    module = load_module(result.so_path)
    first = kept_signatures(module, result.so_path, ["add"])
    assert first == export_signatures(module, ["add"]) == {"add": "add(0: int, 1: float, 2: DLTensor*) -> int"}
    kept = Path(f"{result.so_path}.signatures.json")
    assert json.loads(kept.read_text()) == first
    kept.write_text(json.dumps({"add": "as kept"}))  # read back, not computed again
    assert kept_signatures(module, result.so_path, ["add"]) == {"add": "as kept"}
    assert kept_signatures(module, result.so_path, ["add", "missing"]) == {"add": first["add"], "missing": None}
    kept.write_text("{not json")  # unreadable: computed again
    assert kept_signatures(module, result.so_path, ["add"]) == first


@needs_nvcc
def test_cuda_module_signatures(built):
    _, result = built
    try:
        module = load_module(result.so_path)
    except (OSError, RuntimeError) as error:  # no libcudart on the loader path
        pytest.skip(f"cannot load a CUDA module here: {error}")
    assert export_signatures(module, ["scale_f32", "scale_f64"]) == {
        "scale_f32": "scale_f32(0: DLTensor*, 1: float) -> void",
        "scale_f64": "scale_f64(0: DLTensor*, 1: float) -> void",
    }


def _elf_sections(data: bytes) -> dict[str, bytes]:
    """Section name -> bytes of a 64-bit little-endian ELF (a cubin)."""
    shoff = struct.unpack_from("<Q", data, 0x28)[0]
    entsize, count, names_index = struct.unpack_from("<HHH", data, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * entsize) for i in range(count)]
    base = headers[names_index][4]

    def name(offset):
        return data[base + offset : data.index(b"\0", base + offset)].decode()

    return {name(h[0]): (b"" if h[1] == 8 else data[h[4] : h[4] + h[5]]) for h in headers}


@needs_nvcc
def test_ptxas_verbose_does_not_change_code(built, tmp_path):
    """-Xptxas=-v only adds a report: every cubin section but the toolkit-info note is identical."""
    cache, result = built
    folder = Path(result.so_path).parent
    command = [a for a in result.command if a not in ("-MD", "-MF", "cuda_0.o.d", "-c", "-o", "cuda_0.o")]
    cubins = []
    for verbose in (False, True):
        args = [a for a in command if verbose or a != "-Xptxas=-v"]
        out = tmp_path / f"v{int(verbose)}.cubin"
        subprocess.run([*args, "-cubin", "-o", str(out)], cwd=folder, check=True, capture_output=True)
        cubins.append(_elf_sections(out.read_bytes()))
    assert any(name.startswith(".text.") for name in cubins[0])
    differing = {n for n in cubins[0].keys() | cubins[1].keys() if cubins[0].get(n) != cubins[1].get(n)}
    assert differing <= {".note.nv.tkinfo"}


PTXAS_SAMPLE = """ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function '_Z3fooPf' for 'sm_90a'
ptxas info    : Function properties for _Z3fooPf
    16 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 2048 bytes smem, 360 bytes cmem[0], 8 bytes cmem[2]
ptxas info    : Function properties for _Z6helperv
    32 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Compiling entry function 'bar_kernel' for 'sm_80'
ptxas info    : Used 12 registers, 352 bytes cmem[0]
"""


def test_parse_ptxas_both_formats():
    foo, bar = parse_ptxas(PTXAS_SAMPLE, demangle_names=False)
    assert (foo.mangled, foo.arch, foo.registers, foo.barriers) == ("_Z3fooPf", "sm_90a", 255, 1)
    assert (foo.stack_frame, foo.spill_stores, foo.spill_loads, foo.smem, foo.cmem) == (16, 8, 4, 2048, 368)
    assert (bar.name, bar.registers, bar.cmem, bar.stack_frame) == ("bar_kernel", 12, 352, 0)
    assert parse_ptxas("ptxas info : Compiling entry function 'k' for 'sm_90a'\n"
                       "ptxas info    : Used 8 registers, used 0 barriers", demangle_names=False)[0].cmem is None
    if shutil.which("c++filt") or shutil.which("cu++filt"):
        assert parse_ptxas(PTXAS_SAMPLE)[0].name.replace(" *", "*") == "foo(float*)"
    table = format_table([foo, bar]).splitlines()
    assert table[0].split()[:3] == ["kernel", "arch", "regs"] and len({len(line) for line in table[:2]}) == 1


def test_trim_errors_keeps_first_errors_with_context():
    log = "\n".join(
        ["$ nvcc ...", "/ov/root0/a/k.cuh(7): error: expected a \";\"", "    int x = 1", "            ^", ""]
        + [f"/ov/root0/a/k.cuh({i}): error: identifier \"y\" is undefined" for i in range(10, 20)]
        + ["11 errors detected in the compilation of \"cuda.cu\"."]
    )
    trimmed = trim_errors(log, ["/ov/root0"])
    lines = trimmed.splitlines()
    assert lines[0] == 'a/k.cuh(7): error: expected a ";"' and lines[1] == "    int x = 1"
    assert "more error lines" in lines[-1] and len(lines) <= 40


def test_arch_rules():
    assert arch_for_capability(9, 0) == "90a" and arch_for_capability(10, 0) == "100a"
    assert arch_for_capability(12, 0, (12, 9)) == "120f" and arch_for_capability(12, 0, (12, 8)) == "120a"
    assert arch_for_capability(8, 9) == "89"
    assert arch_flags("90a") == ["-gencode=arch=compute_90a,code=sm_90a", "-DSGL_CUDA_ARCH=900"]
    assert arch_flags("100a")[1] == "-DSGL_CUDA_ARCH=1000"


@pytest.mark.network
@needs_nvcc
def test_sglang_fused_add_rmsnorm_builds_without_spills(sglang_0523, tmp_path):
    tree = sglang_0523
    req = BuildRequest(
        name="fused_add_rmsnorm", source_root=str(tree.csrc_dir), include_dirs=[str(tree.include_dir)],
        cuda_files=["elementwise/fused_add_rmsnorm.cuh"],
        cuda_wrappers=[("fused_add_rmsnorm", "FusedAddRMSNormKernel<false, bf16_t>::run")],
    )
    result = build(req, tmp_path)
    assert result.ok, result.error
    assert result.resources and all(r.spills == 0 for r in result.resources), format_table(result.resources)


def _symlinked_tree(tmp_path: Path) -> tuple[Path, Path]:
    """csrc/ whose `elementwise` directory is a symlink to a directory outside it (as some installs have)."""
    real = tmp_path / "elsewhere" / "elementwise"
    real.mkdir(parents=True)
    (real / "scale_math.cuh").write_text(SCALE_MATH)
    (real / "scale.cuh").write_text(SCALE)
    root = tmp_path / "csrc"
    root.mkdir()
    (root / "elementwise").symlink_to(real, target_is_directory=True)
    return root, real


def _snapshot(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def test_overlay_never_writes_through_a_symlinked_directory(tmp_path):
    from harness.building.sources import materialise_overlay

    root, real = _symlinked_tree(tmp_path)
    before = _snapshot(real)
    overlay = tmp_path / "overlay"
    materialise_overlay(overlay, [str(root)], {0: {"elementwise/scale.cuh": "// candidate\n"}})
    assert _snapshot(real) == before  # the source tree is byte-identical
    written = overlay / "root0" / "elementwise" / "scale.cuh"
    assert written.read_text() == "// candidate\n" and not written.is_symlink()
    assert not (overlay / "root0" / "elementwise").is_symlink()
    assert (overlay / "root0" / "elementwise" / "scale_math.cuh").is_symlink()  # siblings still resolve


@needs_nvcc
def test_candidate_build_leaves_a_symlinked_tree_byte_identical(tmp_path):
    root, real = _symlinked_tree(tmp_path)
    before = _snapshot(real)
    candidate = SCALE.replace("scale_kernel", "scale_kernel_v3")
    request = scale_request(root, cuda_files=["elementwise/scale.cuh"], overrides={"elementwise/scale.cuh": candidate})
    result = build(request, tmp_path / "cache")
    assert result.ok, result.error
    assert any("scale_kernel_v3<float>" in r.name for r in result.resources)
    assert _snapshot(real) == before


def test_build_many_starts_the_largest_source_first_and_keeps_the_order(tmp_path, monkeypatch):
    from harness.building import nvcc_build as build_mod
    (tmp_path / "small.cuh").write_text("// small\n")
    (tmp_path / "large.cuh").write_text("// large\n" * 500)
    started: list[str] = []
    monkeypatch.setattr(build_mod, "build", lambda req, cache, **kw: started.append(req.name) or req.name)
    reqs = [BuildRequest(name=name, source_root=str(tmp_path), include_dirs=[], cuda_files=[f"{size}.cuh"])
            for name, size in (("a", "small"), ("b", "large"), ("c", "small"))]
    reqs.append(BuildRequest(name="d", source_root=str(tmp_path), include_dirs=[], cuda_files=["small.cuh"],
                             overrides={"small.cuh": "x" * 100_000}))  # a candidate's text counts as given
    assert build_mod.build_many(reqs, tmp_path, jobs=1) == ["a", "b", "c", "d"]
    assert started == ["d", "b", "a", "c"]
    assert build_mod.source_size(reqs[1]) == len("// large\n" * 500)


@needs_nvcc
def test_prepared_is_told_once_per_build_before_its_compiler_runs(tree, tmp_path, monkeypatch):
    """A build tells `prepared` once, after planning and overlaying and before its compiler: for a fresh
    build, a candidate's overlaid build, a cache hit and a source nvcc refuses."""
    import harness.building.nvcc_build as nvcc_build

    order: list[str] = []
    real_run_all = nvcc_build._run_all
    monkeypatch.setattr(nvcc_build, "_run_all", lambda *a, **k: order.append("compiler") or real_run_all(*a, **k))
    cache = tmp_path / "cache"
    candidate = {"mylib/scale.cuh": SCALE + "// a candidate\n"}
    broken = {"mylib/scale.cuh": SCALE + "\nthis is not C++;\n"}
    for label, changes in (("fresh", {}), ("overlay", {"overrides": candidate}), ("hit", {}),
                           ("refused", {"overrides": broken})):
        order.clear()
        request = scale_request(tree, **changes)
        overlay = plan_build(request, cache).overlay

        def tell(overlay=overlay) -> None:
            order.append("prepared")
            assert overlay is None or (overlay / ".done").exists()  # the candidate's sources overlaid first

        result = build(request, cache, prepared=tell)
        assert result.ok == (label != "refused"), label
        expected = ["prepared"] if label == "hit" else ["prepared", "compiler"]
        assert order == expected, label


def test_prepared_is_told_before_the_lock_and_on_failures(tree, tmp_path, monkeypatch):
    """`prepared` comes before the key's lock (a builder waiting on another's compile has told it), and once on
    a failure before any compiler: a bad name, an overlay that cannot be written."""
    import fcntl
    import os

    import harness.building.nvcc_build as nvcc_build

    cache = tmp_path / "cache"
    request = scale_request(tree, overrides={"mylib/scale.cuh": SCALE + "// held\n"})
    plan = plan_build(request, cache)
    key = build_key(request, plan)
    cache.mkdir(parents=True, exist_ok=True)
    told = threading.Event()
    handle = os.open(cache / f".{request.name}-{key[:16]}.lock", os.O_CREAT | os.O_RDWR, 0o644)
    fcntl.flock(handle, fcntl.LOCK_EX)  # another builder of this key holds the lock
    monkeypatch.setattr(nvcc_build, "_run_all", lambda *a, **k: ("", "stopped here"))
    worker = threading.Thread(target=build, args=(request, cache), kwargs={"prepared": told.set})
    worker.start()
    try:
        assert told.wait(30)  # told while it waits for the lock
    finally:
        fcntl.flock(handle, fcntl.LOCK_UN)
        os.close(handle)
        worker.join(60)
    calls: list[str] = []
    assert not build(scale_request(tree, name="bad name"), cache, prepared=lambda: calls.append("bad")).ok

    def no_room(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(nvcc_build, "materialise_overlay", no_room)
    failed = build(scale_request(tree, overrides={"mylib/scale.cuh": SCALE + "// full\n"}), cache,
                   prepared=lambda: calls.append("full"))
    assert not failed.ok and "could not run" in failed.error
    assert calls == ["bad", "full"]
