"""Bad input gets one line saying what to do and a non-zero exit, never a traceback."""

import subprocess
import sys

import pytest

from tests.astra.sglang.test_sglang_tree import _fake_checkout


def astra(*args, env=None):
    proc = subprocess.run([sys.executable, "-m", "astra.cli", *args], capture_output=True, text=True, env=env)
    return proc.returncode, proc.stdout, proc.stderr


def assert_one_line_error(code, err, expected_code, needle):
    assert code == expected_code, err
    assert "Traceback" not in err
    assert needle in err
    assert len(err.strip().splitlines()) == 1 or err.startswith("astra")


def test_not_sglang_tree(tmp_path):
    code, _, err = astra("list", "--sglang-src", str(tmp_path))
    assert_one_line_error(code, err, 3, "not an SGLang tree")


def test_unknown_kernel_in_checkout(tmp_path):
    _fake_checkout(tmp_path)
    code, _, err = astra("extract", "no_such_kernel", "--sglang-src", str(tmp_path))
    assert_one_line_error(code, err, 4, "no JIT module named 'no_such_kernel'")


def test_malformed_spec(tmp_path, monkeypatch):
    spec_dir = tmp_path / "broken"
    spec_dir.mkdir()
    (spec_dir / "kernel.yaml").write_text("name: broken\nmodule: [unclosed\n")
    code, out, _ = astra("spec-check", "broken", env={**__import__("os").environ, "ASTRA_SPECS": str(tmp_path)})
    assert code == 1
    assert "not valid YAML at line" in out


@pytest.mark.network
def test_version_not_in_index():
    code, _, err = astra("list", "--sglang", "0.0.999")
    assert_one_line_error(code, err, 3, "not in the package index")


@pytest.mark.network
def test_list_0523_json():
    import json

    code, out, err = astra("list", "--sglang", "0.5.23", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["sglang"]["version"] == "0.5.23"
    assert len(data["modules"]) >= 150
    fused = next(m for m in data["modules"] if m["name"] == "fused_add_rmsnorm")
    (path, digest), = fused["files"].items()
    assert path == "python/sglang/kernels/jit/csrc/elementwise/fused_add_rmsnorm.cuh" and len(digest) == 64


def test_nvcc_missing(tmp_path):
    import os

    env = {**os.environ, "CUDA_HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    code, _, err = astra("build", "add_constant", "--sglang-src", str(_fake_checkout(tmp_path / "src")), env=env)
    assert_one_line_error(code, err, 6, "nvcc")
