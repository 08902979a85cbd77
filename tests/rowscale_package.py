"""Our own kernel, RowScale, in a stand-in SGLang package: the tree, its reviewed-style spec (with a float64
reference) hashed against the kernel file, and an empty ASTRA_HOME. Used by the MCP and exec-agent tests."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
ADVERSARIAL = REPO / "tests" / "adversarial"
ROWSCALE = ADVERSARIAL / "kernels" / "base" / "rowscale.cuh"
VECTORIZED = ADVERSARIAL / "kernels" / "candidates" / "m_vectorized.cuh"  # a candidate that must be accepted


ROWSCALE_SPEC = {
    "name": "rowscale", "module": "rowscale", "category": "test",
    "description": "out[r, c] = x[r, c] * w[c] in float32, rounded to the dtype (Astra's own test kernel).",
    "source": {"sglang_version": "0.0.1", "kernel_file": "test/rowscale.cuh",
               "repo_path": "python/sglang/kernels/jit/csrc/test/rowscale.cuh", "sha256": None},
    "build": {"cuda_files": ["test/rowscale.cuh"],
              "wrappers": [{"export": "rowscale", "entry": "RowScaleKernel<{cpp_dtype(dtype)}>::run"}]},
    "entry": "rowscale", "signature": None,
    "dims": {"tokens": "rows", "width": "columns"}, "derived": {},
    "dtypes": ["bfloat16", "float32"],
    "arguments": [
        {"name": "x", "kind": "tensor", "shape": ["tokens", "width"], "dtype": "{dtype}", "role": "in"},
        {"name": "w", "kind": "tensor", "shape": ["width"], "dtype": "{dtype}", "role": "in"},
        {"name": "out", "kind": "tensor", "shape": ["tokens", "width"], "dtype": "{dtype}", "role": "out"},
    ],
    "shapes": {"tokens": [1, 128, 1024], "models": [{"model": "Llama-3.1-8B", "tp": 1, "dims": {"width": "hidden_size"}}],
               "edge": [{"tokens": 1, "width": 1000}, {"tokens": 127, "width": 256}]},
    "tolerance": {"bfloat16": {"atol": 1.0e-2, "rtol": 1.0e-2, "floor": 1.0e-2},
                  "float32": {"atol": 1.0e-5, "rtol": 1.0e-5, "floor": 1.0e-5}},
    "bytes": "(2 * tokens * width + width) * elt(dtype)",
    "reference": "reference.py",
}


def make_rowscale(tmp_path: Path) -> dict:
    """An unpacked SGLang-like package holding rowscale.cuh where JIT kernels live (sglang/kernels/jit/csrc/),
    the RowScale spec (with its float64 reference) hashed against it, and an empty ASTRA_HOME."""
    package = tmp_path / "package"
    csrc = package / "sglang" / "kernels" / "jit" / "csrc" / "test"
    csrc.mkdir(parents=True)
    (package / "sglang" / "kernels" / "jit" / "include").mkdir()
    (package / "sglang" / "__init__.py").write_text("")
    (package / "sglang" / "_version.py").write_text('__version__ = "0.0.1"\n')
    shutil.copy(ROWSCALE, csrc / "rowscale.cuh")
    spec_dir = tmp_path / "specs" / "rowscale"
    spec_dir.mkdir(parents=True)
    raw = json.loads(json.dumps(ROWSCALE_SPEC))
    raw["source"]["sha256"] = hashlib.sha256(ROWSCALE.read_bytes()).hexdigest()
    (spec_dir / "kernel.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    shutil.copy(ADVERSARIAL / "rowscale_reference.py", spec_dir / "reference.py")
    return {"package": package, "spec": spec_dir / "kernel.yaml", "home": tmp_path / "home"}
