"""What a measurement ran on: GPU, capability, driver, CUDA, torch, tvm-ffi, nvcc, L2, performance model.

`python -m harness env` prints `collect_env()` as JSON. It works without a GPU (the GPU fields are then
None, with the reason under "notes"); on a GPU box the measured part is `harness.evaluate.collect_env`,
the same numbers a verdict records (the performance model of harness.perf_model: peak, read, write and
copy bandwidths, empty launches; measured afresh here, not taken from a cache).
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import platform
import shutil
import subprocess


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def driver_version() -> str | None:
    """The NVIDIA driver version from nvidia-smi (e.g. "570.124.06"), else None."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return None
    try:
        done = subprocess.run([smi, "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True,
                              text=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = done.stdout.strip().splitlines()
    return lines[0].strip() if done.returncode == 0 and lines else None


def driver_cuda_version() -> str | None:
    """The CUDA version the driver supports (cuDriverGetVersion, e.g. "12.8"), else None."""
    try:
        libcuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    value = ctypes.c_int(0)
    if libcuda.cuDriverGetVersion(ctypes.byref(value)) != 0:
        return None
    return f"{value.value // 1000}.{value.value % 1000 // 10}"


def nvcc_version() -> str | None:
    """The release of the nvcc that builds use (e.g. "13.0"), else None."""
    from harness.toolchain import BuildFailure, nvcc_release

    try:
        major, minor = nvcc_release()
    except (BuildFailure, OSError, subprocess.SubprocessError):
        return None
    return f"{major}.{minor}"


def gpu_info(measure: bool = True) -> dict:
    """Device 0: name, capability, SMs, memory, L2; with `measure`, also what `harness.evaluate`
    measures for a verdict (the performance model: bandwidths, empty launches), so both report the same
    numbers."""
    import torch

    device = torch.device("cuda", 0)
    if measure:
        from harness.evaluate import collect_env as measured_env

        return measured_env(device)
    props = torch.cuda.get_device_properties(device)
    return {"gpu": props.name, "capability": f"{props.major}.{props.minor}", "sm_count": props.multi_processor_count,
            "memory_bytes": props.total_memory, "l2_bytes": getattr(props, "L2_cache_size", None)}


def collect_env(measure: bool = True) -> dict:
    """Everything above as one JSON-able dict; without a CUDA device the GPU fields are None."""
    env: dict = {
        "host": platform.node(),
        "python": platform.python_version(),
        "torch": _version("torch"),
        "torch_cuda": None,
        "tvm_ffi": _version("apache-tvm-ffi"),
        "nvcc": nvcc_version(),
        "driver": driver_version(),
        "driver_cuda": driver_cuda_version(),
        "gpu": None,
        "notes": [],
    }
    try:
        import torch
    except ImportError as error:
        env["notes"].append(f"torch not importable: {error}")
        return env
    env["torch_cuda"] = torch.version.cuda
    if not torch.cuda.is_available():
        env["notes"].append("no CUDA device visible to torch")
        return env
    env.update(gpu_info(measure))
    return env
