"""The measured environment a verdict records: the GPU's static facts plus its performance model.

`measured_environment(device, cache_dir)` is what the judge (harness.judge.evaluate) measures once per job and
writes into the verdict's `env`: the GPU's properties (L2 as harness.timing.modes sizes the rotation by), the
driver, CUDA runtime, nvcc, torch and tvm-ffi versions, and the performance model (harness.timing.perf_model:
peak, read, write and copy bandwidths, empty launches; cached per GPU under `cache_dir`), with its copy
bandwidth and launch floors also under their older names. `python -m harness env` prints the same numbers
(harness.environment.report).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from harness.building.toolchain import tvm_ffi_version
from harness.environment.static_facts import driver_version, gpu_properties, nvcc_version
from harness.timing.modes import l2_bytes
from harness.timing.perf_model import for_device


def measured_environment(device: torch.device, cache_dir: str | Path | None = None) -> dict[str, Any]:
    """GPU, toolkit and library versions, L2 size and the performance model (cached under `cache_dir`),
    with its copy bandwidth and launch floors also under their older names."""
    env = {**gpu_properties(device), "l2_bytes": l2_bytes(device), "driver": driver_version(),
           "cuda_runtime": torch.version.cuda, "nvcc": nvcc_version(), "torch": torch.__version__,
           "tvm_ffi": tvm_ffi_version()}
    model = for_device(device, cache_dir)
    env["perf_model"] = model.to_dict()
    env["copy_bandwidth_Bps"] = model.copy_Bps
    env["launch_floor_us"], env["cold_launch_floor_us"] = model.launch_graph_us, model.launch_cold_us
    return env
