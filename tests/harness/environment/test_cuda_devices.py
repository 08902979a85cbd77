"""harness.environment.cuda_devices: the GPU question asked without importing torch, answered as torch answers it."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from harness.building.toolchain import arch_for_capability, default_arch, nvcc_release
from harness.environment.cuda_devices import cuda_in, device_capability, device_count, device_name, torch_cuda


def test_the_torch_build_is_read_from_its_version_file():
    assert torch_cuda() == torch.version.cuda  # a version string for a CUDA build, None for a CPU one


def test_version_file_forms():
    assert cuda_in("from typing import Optional\ncuda: Optional[str] = '13.0'\n") == "13.0"
    assert cuda_in("cuda = '12.8'\n") == "12.8"
    assert cuda_in("cuda: Optional[str] = None\n") is None
    assert cuda_in("__version__ = '2.13.0'\n") is False  # says neither
    assert cuda_in("cuda = (\n") is False  # unreadable


def test_the_driver_counts_what_torch_counts():
    assert device_count() == (torch.cuda.device_count() if torch.cuda.is_available() else 0)


def test_the_driver_names_the_device_as_torch_does():
    expected = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    assert device_name(0) == expected


def test_the_driver_gives_the_capability_torch_gives_and_nvcc_its_target():
    expected = torch.cuda.get_device_capability(0) if torch.cuda.is_available() else None
    assert device_capability(0) == expected
    assert default_arch() == (arch_for_capability(*expected, nvcc_release()) if expected else "90a")


def test_asking_does_not_import_torch():
    code = ("import sys; from harness.environment.cuda_devices import device_count, torch_cuda; "
            "device_count(); torch_cuda(); from harness.environment.cuda_devices import device_name; device_name(); "
            "from harness.building.toolchain import default_arch; default_arch(); "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


@pytest.mark.gpu
def test_a_hidden_gpu_is_not_counted():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    code = "from harness.environment.cuda_devices import device_count; print(device_count())"
    env = {**__import__("os").environ, "CUDA_VISIBLE_DEVICES": ""}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env).stdout
    assert out.strip() == "0"
