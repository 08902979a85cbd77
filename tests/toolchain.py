"""Test markers for the tools a test needs on this machine (one definition for every test file)."""

from __future__ import annotations

import pytest

from harness.building.toolchain import BuildFailure, nvcc_path


def nvcc_missing() -> bool:
    """Whether nvcc cannot be found the way the harness finds it (CUDA_HOME, then PATH)."""
    try:
        nvcc_path()
    except BuildFailure:
        return True
    return False


needs_nvcc = pytest.mark.skipif(nvcc_missing(), reason="nvcc not found (set CUDA_HOME)")
