"""Files Astra keeps for itself (a run's candidates and verdicts, the build records `list` reads) and the
runtime files `list --why` reads go through the bounded reader too: a link to /dev/zero or a FIFO in their
place is one line or is passed over, never a read that does not end."""

from __future__ import annotations

import json
import os
from pathlib import Path

from astra.optimize.rundir import HistoryEntry, RunState
from tests.astra.robustness.run_astra import astra, checkout, home, loader, refused


def _run_with_best(astra_home: Path, run_id: str = "20250101-120000-rmsnorm") -> Path:
    """A run whose best is candidate 001 (state, source, meta); its verdict.json is left to the caller."""
    root = astra_home / "runs" / run_id
    folder = root / "candidates" / "001"
    folder.mkdir(parents=True)
    (root / "original.cuh").write_text("// original\n")
    (folder / "kernel.cuh").write_text("// faster\n")
    (folder / "meta.json").write_text(json.dumps({"name": "x", "description": "a change"}))
    state = RunState(run_id, "rmsnorm", "0.5.23", "offline", round=1, best=1, best_score=1.1, stopped="1 round(s) done",
                     history=[HistoryEntry(1, 0, "x", "correct", 1.1, True, "faster")])
    (root / "state.json").write_text(json.dumps(state.to_dict()))
    return root


def test_a_verdict_that_links_to_dev_zero_is_one_line(tmp_path):
    astra_home = home(tmp_path)
    root = _run_with_best(astra_home)
    os.symlink("/dev/zero", root / "candidates" / "001" / "verdict.json")
    answer = astra("show", root.name, env={"ASTRA_HOME": str(astra_home)})
    refused(answer, 14, "candidate 001 is unreadable", "a character device")


def test_a_kept_source_that_is_a_fifo_is_one_line(tmp_path):
    astra_home = home(tmp_path)
    root = _run_with_best(astra_home)
    (root / "candidates" / "001" / "verdict.json").write_text("{}")
    (root / "candidates" / "001" / "kernel.cuh").unlink()
    os.mkfifo(root / "candidates" / "001" / "kernel.cuh")
    answer = astra("show", root.name, env={"ASTRA_HOME": str(astra_home)})
    refused(answer, 14, "candidate 001 is unreadable", "FIFO")


def test_list_passes_over_a_build_record_that_is_a_fifo(tmp_path):
    from astra import paths
    from astra.sglang.tree import locate

    root = checkout(tmp_path / "sglang")
    loader(root, "scale", "from sglang.kernels.jit.utils import load_jit\n\n\ndef module():\n"
                          "    return load_jit('scale', cuda_files=['elementwise/scale.cuh'])\n")
    tree = locate(src=str(root))
    astra_home = home(tmp_path)
    (astra_home / "build-records").mkdir()
    os.mkfifo(astra_home / "build-records" / paths.safe_name(f"{tree.version}-{tree.origin}.json"))
    answer = astra("list", "--sglang-src", str(root), env={"ASTRA_HOME": str(astra_home)})
    assert answer.code == 0 and "Traceback" not in answer.err, answer.err
    assert "scale" in answer.out
