"""Test set-up shared by every test.

- ASTRA_HOME points at a test directory inside the checkout (`.astra-test-home`, git-ignored) so
  tests never touch a user's real directory; downloaded SGLang wheels are cached there between runs.
- `gpu`-marked tests skip cleanly when CUDA is not available.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.llm_server import llm_server  # noqa: F401  (the loopback OpenAI-compatible server fixture)

REPO = Path(__file__).resolve().parent.parent
os.environ["ASTRA_HOME"] = os.environ.get("ASTRA_TEST_HOME", str(REPO / ".astra-test-home"))
os.environ.setdefault("CUDA_HOME", "/usr/local/cuda" if Path("/usr/local/cuda/bin/nvcc").exists() else "")
if not os.environ["CUDA_HOME"]:
    del os.environ["CUDA_HOME"]


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    if _cuda_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run `make test-gpu` on a GPU machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def sglang_0523():
    from astra.sglang.tree import from_wheel

    return from_wheel("0.5.23")


@pytest.fixture(scope="session")
def sglang_0510():
    from astra.sglang.tree import from_wheel

    return from_wheel("0.5.10")
