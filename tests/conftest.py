"""Test set-up shared by every test.

- ASTRA_HOME points at a test directory inside the checkout (`.astra-test-home`, git-ignored) so
  tests never touch a user's real directory; downloaded SGLang wheels are cached there between runs.
  Under pytest-xdist each worker has a home of its own that shares the content-keyed caches
  (tests/astra_home.py), and the controller unpacks the wheels the session fixtures name before any
  worker starts, under a file lock, so no two processes unpack one wheel at once.
- `gpu`-marked tests skip cleanly when CUDA is not available.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

import pytest

from tests.astra_home import TEST_HOME, session_home
from tests.llm_server import llm_server  # noqa: F401  (the loopback OpenAI-compatible server fixture)

os.environ["ASTRA_HOME"] = str(session_home())
os.environ.setdefault("CUDA_HOME", "/usr/local/cuda" if Path("/usr/local/cuda/bin/nvcc").exists() else "")
if not os.environ["CUDA_HOME"]:
    del os.environ["CUDA_HOME"]


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


SESSION_WHEELS = ("0.5.23", "0.5.10")  # the versions of the session fixtures below


def pytest_sessionstart(session):
    """With xdist workers to come (this is the controller, which runs no test), unpack the session fixtures'
    wheels first: every worker then finds them complete instead of racing to unpack them."""
    if not getattr(session.config.option, "numprocesses", None) or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    from astra.errors import AstraError
    from astra.sglang.tree import from_wheel

    TEST_HOME.mkdir(parents=True, exist_ok=True)
    with open(TEST_HOME / ".wheels.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for version in SESSION_WHEELS:
            try:
                from_wheel(version)
            except AstraError as err:  # no network: the tests that need the wheel say so themselves
                print(f"note: SGLang {version} not unpacked before the workers start: {err}")


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
