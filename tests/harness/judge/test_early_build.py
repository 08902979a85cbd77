"""harness.judge.early_build: the judge's builds start before torch loads, the evaluation takes their results
instead of building again, and a source the static scan rejects never reaches nvcc. Real nvcc builds."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.building.job_requests import build_requests
from harness.building.toolchain import cuda_home
from harness.job import ArgSpec, BuildBase, Case, Job, Options, Variant
from harness.judge import early_build
from harness.judge.evaluate import build_all

needs_nvcc = pytest.mark.skipif(
    cuda_home() is None or not Path(cuda_home(), "bin", "nvcc").exists(), reason="needs the CUDA toolkit (nvcc)")

SCALE = """#pragma once
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/extra/c_env_api.h>
#include <cuda_runtime.h>
#include <cstdint>

__global__ void scale_kernel(float* x, int64_t n, float alpha) {
  int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i < n) x[i] *= alpha;
}

struct ScaleKernel {
  static void run(tvm::ffi::TensorView x, float alpha) {
    const int64_t n = x.numel();
    const DLDevice device = x.device();
    auto stream = static_cast<cudaStream_t>(TVMFFIEnvGetStream(device.device_type, device.device_id));
    if (n > 0) scale_kernel<<<static_cast<int>((n + 127) / 128), 128, 0, stream>>>(
        static_cast<float*>(x.data_ptr()), n, alpha);
  }
};
"""


def scale_job(root: Path, cache: Path, candidate: str | None) -> Job:
    case = Case(id="s/float32/n=8", band="decode", label="s", dtype="float32", dims={"n": 8}, variant="v",
                bytes=64, args=[ArgSpec("x", "tensor", "inout", [8], "float32"),
                                ArgSpec("alpha", "scalar", "in", [], "float32", value=2.0)])
    return Job(name="scale", entry="scale", kernel_file="scale.cuh",
               build=BuildBase(source_root=str(root), include_dirs=[], cuda_files=["scale.cuh"]),
               variants={"v": Variant("v", [["scale", "ScaleKernel::run"]])}, cases=[case],
               tolerance={"float32": {"atol": 0.0, "rtol": 0.0, "floor": 0.0}}, candidate_source=candidate,
               options=Options(cache_dir=str(cache)))


@pytest.fixture
def tree(tmp_path) -> Path:
    root = tmp_path / "csrc"
    root.mkdir()
    (root / "scale.cuh").write_text(SCALE)
    return root


@needs_nvcc
def test_the_evaluation_takes_the_early_builds_instead_of_building_again(tree, tmp_path):
    job = scale_job(tree, tmp_path / "cache", SCALE + "// a candidate\n")
    early_build.start(job)
    paths, builds, failure = build_all(job, Path(job.options.cache_dir))
    assert failure is None and set(paths) == {("orig", "v"), ("cand", "v")}
    assert [b["cache_hit"] for b in builds] == [False, False]  # built once, by the early thread: not found again
    assert early_build.take([], tmp_path) is None  # taken once


@needs_nvcc
def test_a_failed_early_build_is_not_repeated(tree, tmp_path):
    job = scale_job(tree, tmp_path / "cache", SCALE + "\nthis is not C++;\n")
    early_build.start(job)
    _, builds, failure = build_all(job, Path(job.options.cache_dir))
    assert failure is not None and failure.status == "build_failed"
    failed = [b for b in builds if not b["ok"]]
    assert len(failed) == 1 and failed[0]["side"] == "cand"


def test_a_source_the_scan_rejects_never_reaches_nvcc(tree, tmp_path):
    cache = tmp_path / "cache"
    job = scale_job(tree, cache, SCALE + "#include <stdlib.h>\nint g() { return system(\"ls\"); }\n")
    assert early_build.scan(job) is not None
    early_build.start(job)
    requests = [r for _, _, r in build_requests(job)]
    assert early_build.take(requests, cache) is None  # nothing built: the evaluation's own scan rejects it
    assert not cache.exists() or not any(cache.iterdir())


def test_results_for_other_requests_or_another_cache_are_not_taken(tree, tmp_path, monkeypatch):
    job = scale_job(tree, tmp_path / "cache", None)
    calls = []
    monkeypatch.setattr(early_build, "build_many",
                        lambda requests, cache, prepared: calls.append(requests) or ["built"])
    requests = [r for _, _, r in build_requests(job)]
    early_build.start(job)
    assert early_build.take(requests, tmp_path / "elsewhere") is None
    early_build.start(job)
    assert early_build.take(requests[:0], tmp_path / "cache") is None
    early_build.start(job)
    assert early_build.take(requests, tmp_path / "cache") == ["built"] and len(calls) == 3


def test_running_holds_while_the_early_builds_go_and_ends_with_them(tree, tmp_path, monkeypatch):
    import threading

    job = scale_job(tree, tmp_path / "cache", None)
    release = threading.Event()
    monkeypatch.setattr(early_build, "build_many", lambda requests, cache, prepared: release.wait(30) and ["built"])
    assert not early_build.running()  # nothing started
    early_build.start(job, prepare_wait_s=0.0)
    assert early_build.running()
    release.set()
    assert early_build.take([r for _, _, r in build_requests(job)], tmp_path / "cache") == ["built"]
    assert not early_build.running()


def test_start_returns_once_every_build_is_prepared_while_the_compilers_run(tree, tmp_path, monkeypatch):
    import threading
    import time

    job = scale_job(tree, tmp_path / "cache", SCALE + "// a candidate\n")
    requests = [r for _, _, r in build_requests(job)]
    release, told = threading.Event(), []

    def fake_build_many(requests, cache, prepared):
        for _ in requests:  # planning, one request after the other, then the compilers
            time.sleep(0.2)
            told.append(time.monotonic())
            prepared()
        release.wait(30)
        return ["built"]

    monkeypatch.setattr(early_build, "build_many", fake_build_many)
    monkeypatch.setattr(early_build, "build_jobs", lambda: 8)  # both start at once, whatever this machine's cores
    early_build.start(job)
    returned = time.monotonic()
    assert len(told) == len(requests) == 2 and told[-1] <= returned  # not before the last build was prepared
    assert early_build.running()  # and not after: the compilers still run
    release.set()
    assert early_build.take(requests, tmp_path / "cache") == ["built"]


def test_start_waits_only_for_the_builds_that_start_at_once(tree, tmp_path, monkeypatch):
    import threading

    job = scale_job(tree, tmp_path / "cache", SCALE + "// a candidate\n")
    release = threading.Event()

    def one_compiler_at_a_time(requests, cache, prepared):
        prepared()  # the first build planned; the second waits for a compiler
        release.wait(30)
        return ["built"]

    monkeypatch.setattr(early_build, "build_many", one_compiler_at_a_time)
    monkeypatch.setattr(early_build, "build_jobs", lambda: 1)
    early_build.start(job, prepare_wait_s=20.0)
    assert early_build.running()  # returned on the first build's word, not after the 20 s bound
    release.set()
    early_build.take([r for _, _, r in build_requests(job)], tmp_path / "cache")


@needs_nvcc
def test_the_original_kernels_are_read_from_its_cached_build_without_building(tree, tmp_path):
    from harness.judge.evaluate import original_kernels

    job = scale_job(tree, tmp_path / "cache", SCALE.replace("scale_kernel", "scaled_kernel"))
    assert original_kernels(job) is None  # nothing built yet, and looking builds nothing
    assert not (tmp_path / "cache").exists() or not any(p.name.startswith("scale-") for p in (tmp_path / "cache").iterdir())
    _, builds, failure = build_all(job, Path(job.options.cache_dir))
    assert failure is None
    names = original_kernels(job)
    assert names == [r["mangled"] for b in builds if b["side"] == "orig" for r in b["resources"]]
    assert len(names) == 1 and "scale_kernel" in names[0] and "scaled_kernel" not in names[0]  # the original's only


@needs_nvcc
def test_the_original_is_loaded_beside_the_build_only_from_its_cached_build(tree, tmp_path):
    from harness.judge.original_beside_build import Prepared, original_modules, prepare

    job = scale_job(tree, tmp_path / "cache", SCALE + "// a candidate\n")
    never = [[("seed", 0)]]
    assert original_modules(job) is None  # not built: nothing is loaded, and nothing is built by looking
    assert prepare(job, "cpu", lambda: True, never, lambda module, entry: None, 1 << 20) is None
    _, _, failure = build_all(job, Path(job.options.cache_dir))
    assert failure is None
    modules = original_modules(job)
    assert set(modules) == {"v"} and modules["v"].get_function("scale") is not None
    assert prepare(job, "cpu", lambda: False, never, lambda module, entry: None, 1 << 20) is None  # the build ended
    prepared = Prepared(modules)
    prepared.trials[(0, 0)] = ({}, {}, None)
    assert len(prepared) == 1 and prepared.take(0, 0) == ({}, {}, None) and prepared.take(0, 0) is None
