"""The offline agent's transformation catalog (on a kernel written here) and its dry run (real nvcc)."""

import shutil
import subprocess
import sys

import pytest

from astra.optimize.offline import plan
from astra.optimize.transforms import catalog, launch_bounds, tunable_constants, unroll_loops
from tests.verdicts import make_verdict

KERNEL = """
#include <cuda_runtime.h>
constexpr int kBlockSize = 256;
constexpr int kOther = 3;

__global__ void scale(float* out, const float* in, float alpha, int n) {
  int i = blockIdx.x * kBlockSize + threadIdx.x;
  for (int k = 0; k < 4; ++k) {
    if (i * 4 + k < n) out[i * 4 + k] = expf(in[i * 4 + k]) * alpha;
  }
}

struct Launcher {
  static void run(float* out, const float* in, float alpha, int n) {
    for (int rep = 0; rep < 1; ++rep) scale<<<(n + 1023) / 1024, kBlockSize>>>(out, in, alpha, n);
  }
};
"""


def test_constants_are_halved_and_doubled_only_when_tunable():
    names = [p.name for p in tunable_constants(KERNEL)]
    assert names == ["const:kBlockSize=512", "const:kBlockSize=128"]
    assert "constexpr int kBlockSize = 512;" in tunable_constants(KERNEL)[0].source


def test_unroll_only_in_device_code():
    props = unroll_loops(KERNEL)
    assert [p.name for p in props] == ["unroll:line8"]
    assert "#pragma unroll\n  for (int k" in props[0].source


def test_launch_bounds():
    bounds = launch_bounds(KERNEL, kernels=[object()])
    assert "__global__ void __launch_bounds__(256) scale(" in bounds[0].source


def test_the_agent_proposes_the_rewrite_passes(tmp_path):
    from astra.optimize.loop import Context
    from astra.optimize.offline import OfflineAgent

    (tmp_path / "scale.cuh").write_text(KERNEL)
    agent = OfflineAgent("scale.cuh", tmp_path, [], spec={"tolerance": {"float32": {"atol": 1e-5, "rtol": 1e-5}}})
    props = agent.propose(Context(kernel="scale", round=0, base_source=KERNEL, base_verdict=None))
    fast = [p for p in props if p.name == "pass:fast_math"]
    assert fast and fast[0].family == "fastmath" and "__expf(in[" in fast[0].source
    exact = OfflineAgent("scale.cuh", tmp_path, [], spec={"tolerance": {"float32": {"atol": 0.0, "rtol": 0.0}}})
    props = exact.propose(Context(kernel="scale", round=0, base_source=KERNEL, base_verdict=None))
    assert not [p for p in props if p.name == "pass:fast_math"]


def test_catalog_is_deduplicated_and_never_returns_the_input():
    from astra.sglang.cuda_parse import KernelDecl, Param

    kernel = KernelDecl(name="scale", qualified_name="scale", template_params=[], start_line=6, end_line=11,
                        params=[Param("out", "float *"), Param("in", "const float *"), Param("alpha", "float")])
    props = catalog(KERNEL, kernels=[kernel])
    restrict = [p for p in props if p.family == "restrict"]
    assert restrict and "float* __restrict__ out" in restrict[0].source
    assert len({p.source for p in props}) == len(props)
    assert all(p.source != KERNEL for p in props)


def test_restrict_marks_parameters_only_in_the_signature():
    """A parameter clang already spells `__restrict` is left alone, and a body's `(*scale)` is no parameter."""
    from astra.optimize.transforms import restrict_pointers
    from astra.sglang.cuda_parse import KernelDecl, Param

    text = KERNEL.replace("float alpha, int n) {", "const float* __restrict__ scale, int n) {").replace(
        "* alpha;", "/ (*scale);")
    kernel = KernelDecl(name="scale", qualified_name="scale", template_params=[], start_line=6, end_line=11,
                        params=[Param("out", "float *"), Param("in", "const float *"),
                                Param("scale", "const float *__restrict"), Param("n", "int")])
    props = restrict_pointers(text, [kernel])
    assert len(props) == 1 and props[0].description == "__restrict__ on scale.out, scale.in"
    assert "/ (*scale);" in props[0].source and "const float* __restrict__ scale, int n)" in props[0].source
    assert "float* __restrict__ out, const float* __restrict__ in," in props[0].source


def test_plan_follows_the_gap():
    v = make_verdict({"decode": 1.0, "prefill": 1.0})
    v.cases[0].roofline["graph"]["cand_fraction"] = 0.1
    v.cases[1].roofline["graph"]["cand_fraction"] = 0.97
    order, why = plan(v)
    # a staged copy of read-only memory is dropped first wherever the gap is; then the launch shape
    assert order[:2] == ["remat", "launch"] and order[-1] == "pdl" and "decode" in why
    v = make_verdict({"prefill": 1.0})
    v.cases[0].roofline["graph"]["cand_fraction"] = 0.95
    order, why = plan(v)
    assert "little left to gain" in why


def test_optimize_without_gpu_says_what_runs_instead():
    proc = subprocess.run([sys.executable, "-m", "astra.cli", "optimize", "rmsnorm"], capture_output=True, text=True)
    assert proc.returncode == 7
    assert "no CUDA GPU" in proc.stderr and "--dry-run" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.network
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_dry_run_builds_every_proposal(sglang_0523, capsys):
    from astra.cli import main

    assert main(["optimize", "fused_add_rmsnorm", "--dry-run", "--rounds", "1"]) == 0
    out = capsys.readouterr().out
    assert "__launch_bounds__(256)" in out and "not verified (no GPU)" in out
    assert "best: the original" in out
    assert main(["runs"]) == 0
    assert "fused_add_rmsnorm" in capsys.readouterr().out


def test_a_run_without_libclang_says_the_rewrite_passes_are_off(monkeypatch):
    from astra.errors import ToolMissing
    from astra.sglang import clang_env

    assert clang_env.libclang_missing() is None  # installed here (pyproject: libclang-ng)

    def missing():
        raise ToolMissing("libclang's Python bindings are not installed; run: pip install 'libclang-ng>=22.1'")

    monkeypatch.setattr(clang_env, "clang_env", missing)
    assert "pip install 'libclang-ng" in clang_env.libclang_missing()
