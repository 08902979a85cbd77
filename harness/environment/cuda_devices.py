"""Whether this host can run the judge's GPU work, answered without importing torch.

`astra check`, `bench`, `optimize` and `eval` ask first, in the process the user started; importing torch
there only to ask took 1.5 to 2 s of a check whose judge runs in a process of its own anyway (a `--quick`
check is about 10 s). So:

- `device_count()`: the CUDA driver's count of the devices this process may use (libcuda.so.1's
  cuInit and cuDeviceGetCount, which honour CUDA_VISIBLE_DEVICES as torch does); 0 without a driver or a
  device. cuInit creates no context.
- `device_name(index)`: that device's name as the driver gives it (cuDeviceGetName: what torch's
  get_device_name reports, e.g. "NVIDIA H100 80GB HBM3"); None without it.
- `device_capability(index)`: that device's compute capability (cuDeviceGetAttribute: what torch's
  get_device_capability reports, e.g. (9, 0)); None without it.
- `torch_cuda()`: the CUDA version the installed torch was built with, read from torch/version.py; None for
  a CPU build, False when torch is not installed.
"""

from __future__ import annotations

import ast
import ctypes
import importlib.util
from pathlib import Path


def _driver():
    """libcuda.so.1, initialised; None without it (or when cuInit fails: no device, a broken driver)."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        return lib if lib.cuInit(0) == 0 else None
    except (OSError, AttributeError):  # no driver, or not a CUDA driver
        return None


def device_count() -> int:
    """CUDA devices visible to this process; 0 when the driver or a device is missing."""
    lib = _driver()
    count = ctypes.c_int(0)
    if lib is None or lib.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return 0
    return count.value


def device_name(index: int = 0) -> str | None:
    """The name of visible device `index` as the driver gives it; None without it."""
    lib = _driver()
    device, name = ctypes.c_int(0), ctypes.create_string_buffer(256)
    if lib is None or lib.cuDeviceGet(ctypes.byref(device), index) != 0:
        return None
    if lib.cuDeviceGetName(name, len(name), device) != 0:
        return None
    return name.value.decode(errors="replace") or None


_CAPABILITY_MAJOR, _CAPABILITY_MINOR = 75, 76  # CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_{MAJOR,MINOR}


def device_capability(index: int = 0) -> tuple[int, int] | None:
    """The compute capability of visible device `index` as the driver gives it; None without it."""
    lib = _driver()
    device, major, minor = ctypes.c_int(0), ctypes.c_int(0), ctypes.c_int(0)
    if lib is None or lib.cuDeviceGet(ctypes.byref(device), index) != 0:
        return None
    if (lib.cuDeviceGetAttribute(ctypes.byref(major), _CAPABILITY_MAJOR, device) != 0
            or lib.cuDeviceGetAttribute(ctypes.byref(minor), _CAPABILITY_MINOR, device) != 0):
        return None
    return major.value, minor.value


def torch_cuda() -> str | None | bool:
    """torch.version.cuda of the installed torch, without importing it: a version string, None for a CPU
    build, False when torch is not installed (or its version file cannot be read)."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return False
    path = Path(next(iter(spec.submodule_search_locations))) / "version.py"
    try:
        return cuda_in(path.read_text())
    except (OSError, ValueError):
        return False


def cuda_in(version_py: str) -> str | None | bool:
    """The `cuda` of a torch/version.py text: a version string, None, or False when it says neither."""
    try:
        tree = ast.parse(version_py)
    except SyntaxError:
        return False
    for node in tree.body:
        target, value = None, None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign):
            target, value = node.target, node.value
        if isinstance(target, ast.Name) and target.id == "cuda" and isinstance(value, ast.Constant):
            return value.value if isinstance(value.value, str) else None
    return False
