"""Integer constants of a loader's module (astra.sglang.py_constants), and how a draft binds them: a
template argument SGLang fixes in Python is a number in the spec's entry, not a swept dim."""

from __future__ import annotations

import ast

import pytest

from astra.sglang.discovery import _Scope
from astra.sglang.py_constants import int_constants
from tests.astra_home import cached_home

LOADER = """
_THREADS: int = 256
_SHIFT = 5
_N = 1 << _SHIFT
TMA_STAGE_BYTES = 32 * 1024
_NEG = -(4)
_TWICE = 1
_TWICE = 2          # assigned twice: not a constant
_FROM_ENV = int(os.environ.get("X", "8"))
_NAME = "kernel"
if CUDA:
    _GATED = 64
def loader():
    _LOCAL = 16     # a function's own names are not the module's
"""


def test_module_integer_constants_are_read_without_importing():
    found = int_constants(_Scope(ast.parse(LOADER).body).assigns)
    assert found == {"_THREADS": "256", "_SHIFT": "5", "_N": "32", "TMA_STAGE_BYTES": "32768", "_NEG": "-4",
                     "_GATED": "64"}


@pytest.mark.network
def test_template_arguments_sglang_fixes_are_numbers_in_the_draft(sglang_0523, tmp_path, monkeypatch):
    """moe_topk_sum passes `_THREADS: int = 256`, the kda packed decode `_WARPS = 8`, hicache a literal
    1024: drafted before as dims given 128 (a 64-warp block of 2048 threads for the kda decode)."""
    from astra.spec import extract
    from astra.spec import model as spec

    monkeypatch.setenv("ASTRA_HOME", str(cached_home(tmp_path / "home")))
    expected = {"moe_topk_sum_256": "TopkSumKernel<256, true>::run",
                "kda_packed_decode_8": "KdaPackedDecodeKernel<8, true>::run"}
    for name, entry in expected.items():
        loaded = spec.load(extract.extract(sglang_0523, name, build_check=False).draft)
        assert loaded.raw["build"]["wrappers"][0]["entry"] == entry
        assert not {"threads", "warps"} & set(loaded.raw["dims"])
        assert "a constant of the loader's module" in loaded.path.read_text()
