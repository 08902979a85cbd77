"""nvcc's target is resolved by the caller of the judge, so the judge's early builds never wait for torch."""

from __future__ import annotations

import os

import pytest

from harness.building import nvcc_build
from harness.building.toolchain import default_arch
from harness.job import BuildBase, Job
from harness.worker.judge_process import with_build_arch


def job(arch: str | None) -> Job:
    return Job(name="k", entry="f", kernel_file="k.cuh",
               build=BuildBase(source_root="/nonexistent", include_dirs=[], cuda_files=["k.cuh"], arch=arch),
               variants={}, cases=[], tolerance={})


def test_the_target_is_resolved_on_a_copy_and_a_given_one_is_kept():
    bare = job(None)
    resolved = with_build_arch(bare)
    assert resolved.build.arch == default_arch() and resolved.build.arch
    assert bare.build.arch is None  # the caller's job is not changed
    given = job("100a")
    assert with_build_arch(given) is given


def test_a_judge_shown_other_gpus_picks_its_own():
    other = dict(os.environ, CUDA_VISIBLE_DEVICES=(os.environ.get("CUDA_VISIBLE_DEVICES") or "") + ",7")
    assert with_build_arch(job(None), other).build.arch is None
    same = dict(os.environ)
    assert with_build_arch(job(None), same).build.arch == default_arch()


def test_a_build_with_a_target_never_asks_the_device(tmp_path, monkeypatch):
    def no_device():
        raise AssertionError("default_arch called: the early build would import torch and start CUDA")

    monkeypatch.setattr(nvcc_build, "default_arch", no_device)
    (tmp_path / "k.cuh").write_text("__global__ void k() {}\n")
    request = nvcc_build.BuildRequest(name="k", source_root=str(tmp_path), include_dirs=[], cuda_files=["k.cuh"], arch="90a",
                                      header_only=True)
    try:
        plan = nvcc_build.plan_build(request, tmp_path / "cache")
    except nvcc_build.BuildFailure as err:  # no nvcc or tvm-ffi here: nothing to plan with
        pytest.skip(str(err))
    assert any("sm_90a" in " ".join(command) for command in plan.commands)
    assert nvcc_build.build_key(request, plan)
