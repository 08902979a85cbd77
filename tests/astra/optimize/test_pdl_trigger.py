"""The offline catalog's early PDL trigger (astra.optimize.transforms.early_pdl_trigger) on kernels written
here, and the proposal built with nvcc; the catalog keeps to the code the spec's entry reaches."""

from __future__ import annotations

import subprocess

from astra.optimize.offline import _changed_lines
from astra.optimize.transforms import early_pdl_trigger
from harness.building.toolchain import nvcc_path
from tests.toolchain import needs_nvcc

KERNELS = """#include <cuda_runtime.h>

__global__ void scale(float* out, const float* x, int n, float f) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  cudaGridDependencySynchronize();  // x comes from the previous kernel
  if (i >= n) {
    cudaTriggerProgrammaticLaunchCompletion();
    return;
  }
  out[i] = x[i] * f;
  cudaTriggerProgrammaticLaunchCompletion();
}

__global__ void guarded(float* out, const float* x, int n) {
  cudaGridDependencySynchronize();
  out[0] = x[0];
  if (n > 1)
    cudaTriggerProgrammaticLaunchCompletion();
}

__global__ void early(float* out, const float* x) {
  cudaGridDependencySynchronize();
  cudaTriggerProgrammaticLaunchCompletion();
  out[0] = x[0];
}

__global__ void no_wait(float* out) {
  out[0] = 1.0f;
  cudaTriggerProgrammaticLaunchCompletion();
}
"""


def test_the_trigger_moves_up_to_just_after_the_wait_in_each_kernel_that_waits():
    proposals = early_pdl_trigger(KERNELS)
    assert [p.name for p in proposals] == ["pdl:early-trigger:scale"]  # guarded: an if owns it; early, no_wait: as is
    source = proposals[0].source
    body = source[source.index("void scale("):source.index("void guarded(")]
    assert body.count("cudaTriggerProgrammaticLaunchCompletion();") == 1
    wait = body.index("cudaGridDependencySynchronize();")
    assert body.index("cudaTriggerProgrammaticLaunchCompletion();") < body.index("if (i >= n)")
    assert body[wait:].splitlines()[1].strip().startswith("cudaTriggerProgrammaticLaunchCompletion();  // trigger")
    assert "  if (i >= n) {\n    return;\n  }\n  out[i] = x[i] * f;\n}" in body  # both later triggers gone
    assert source[source.index("void guarded("):] == KERNELS[KERNELS.index("void guarded("):]  # others untouched
    assert "2 later trigger(s) removed" in proposals[0].description


def test_changed_lines_are_those_of_the_moved_calls():
    proposal = early_pdl_trigger(KERNELS)[0]
    lines = KERNELS.splitlines()
    changed = _changed_lines(KERNELS, proposal.source)
    assert changed and all(3 <= n <= 12 for n in changed)  # inside scale(), nothing of the other kernels
    assert any("cudaTriggerProgrammaticLaunchCompletion" in lines[n - 1] for n in changed)


@needs_nvcc
def test_the_proposal_builds(tmp_path):
    source = tmp_path / "k.cu"
    source.write_text(early_pdl_trigger(KERNELS)[0].source)
    done = subprocess.run([nvcc_path(), "-arch=sm_90a", "--cubin", str(source), "-o", str(tmp_path / "k.cubin")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-1500:]


def test_the_catalog_keeps_to_the_kernels_the_entry_launches(tmp_path):
    """Two kernels wait and trigger late; the spec's entry launches one: only its move is proposed."""
    import pytest

    pytest.importorskip("clang.cindex")
    from astra.optimize.offline import OfflineAgent

    text = KERNELS.replace("__global__ void guarded", "__global__ void scale_too") + """
void launch_scale(float* out, const float* x, int n) {
  scale<<<(n + 255) / 256, 256>>>(out, x, n, 2.0f);
}
"""
    text = text.replace("  out[0] = x[0];\n  if (n > 1)\n    cudaTriggerProgrammaticLaunchCompletion();",
                        "  out[0] = x[0];\n  out[1] = x[1];\n  cudaTriggerProgrammaticLaunchCompletion();")
    (tmp_path / "k.cuh").write_text(text)
    every = [p.name for p in early_pdl_trigger(text)]
    assert every == ["pdl:early-trigger:scale", "pdl:early-trigger:scale_too"]
    agent = OfflineAgent("k.cuh", tmp_path, [], entries=["launch_scale"])
    kept = [p.name for p in agent._reached(text, early_pdl_trigger(text))]
    assert kept == ["pdl:early-trigger:scale"]
