"""Compile a pass's output with the real nvcc (sm_90a, SGLang's C++ standard and -O3; no GPU needed)."""

from __future__ import annotations

import subprocess

import pytest


def compiles(tmp_path, source: str, instantiate: str = "") -> str:
    """nvcc's output when `source` (plus `instantiate`, explicit instantiations of its templates) fails to
    compile for sm_90a; "" when it compiles. Skips without nvcc."""
    from harness import BuildFailure, nvcc_path

    try:
        nvcc = nvcc_path()
    except BuildFailure as err:
        pytest.skip(str(err))
    path = tmp_path / "candidate.cu"
    path.write_text(source + "\n" + instantiate + "\n")
    proc = subprocess.run([nvcc, "-std=c++20", "-O3", "--expt-relaxed-constexpr",
                           "-gencode=arch=compute_90a,code=sm_90a", "-c", str(path), "-o", str(tmp_path / "k.o")],
                          capture_output=True, text=True, timeout=300)
    return "" if proc.returncode == 0 else proc.stdout + proc.stderr
