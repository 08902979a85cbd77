"""The static facts of an environment: host, Python, driver, CUDA, torch, tvm-ffi and nvcc versions, and the
GPU's properties as its driver reports them (name, capability, SMs, memory, L2). Nothing here is measured;
the measured part (the performance model) is harness.environment.measured.

Every fact is None where it cannot be read (no nvidia-smi, no libcuda, no nvcc, no GPU), never an error.
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
    from harness.building.toolchain import BuildFailure, nvcc_release

    try:
        major, minor = nvcc_release()
    except (BuildFailure, OSError, subprocess.SubprocessError):
        return None
    return f"{major}.{minor}"


def gpu_properties(device) -> dict:
    """The device's name, capability, SM count, memory and L2 size (None where torch does not report it)."""
    import torch

    props = torch.cuda.get_device_properties(device)
    return {"gpu": props.name, "capability": f"{props.major}.{props.minor}", "sm_count": props.multi_processor_count,
            "memory_bytes": props.total_memory, "l2_bytes": getattr(props, "L2_cache_size", None)}


def host_facts() -> dict:
    """The versions of everything but the GPU, as one JSON-able dict; "gpu" is None and "notes" empty, for
    the caller to fill (harness.environment.report)."""
    return {
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
