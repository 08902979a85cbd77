"""A long step draws a progress line (counts, time spent, time left) on stderr only when stderr is a terminal
and `--quiet` is not given: a log file or a pipe gets none, and stdout (the result) never does. The real
`astra list` runs with its stderr on a pseudo-terminal (the pty module) or on a pipe."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

from astra.report.progress import Progress
from tests.astra.robustness.run_astra import REPO, checkout, home, loader, with_stderr_on_terminal

LINE = "astra list: reading SGLang's loader files"


def _tree(tmp_path: Path) -> Path:
    root = checkout(tmp_path / "sglang")
    for k in range(12):
        loader(root, f"op{k}", "from sglang.kernels.jit.utils import load_jit\n\n\ndef module():\n"
                               f"    return load_jit('op{k}', cuda_files=['elementwise/op{k}.cuh'])\n")
    return root


def _list(tmp_path: Path, *extra: str, terminal: bool) -> tuple[int, str, str]:
    """`astra list --sglang-src TREE` with stderr on a pseudo-terminal or a pipe: (exit code, stdout, stderr)."""
    command = [sys.executable, "-m", "astra.cli", "list", "--sglang-src", str(_tree(tmp_path)), *extra]
    env = {**os.environ, "ASTRA_HOME": str(home(tmp_path))}
    if not terminal:
        done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
        return done.returncode, done.stdout, done.stderr
    return with_stderr_on_terminal(command, env, 240)


def test_progress_is_drawn_on_a_terminal_and_never_on_stdout(tmp_path):
    code, out, err = _list(tmp_path, terminal=True)
    assert code == 0, err
    assert LINE in err and "/" in err.split(LINE, 1)[1].split("(", 1)[0], err
    assert err.rstrip().endswith("\x1b[K"), repr(err[-200:])  # the line is cleared before the result
    assert LINE not in out and "\r" not in out


def test_no_progress_when_stderr_is_not_a_terminal(tmp_path):
    code, out, err = _list(tmp_path, terminal=False)
    assert code == 0, err
    assert err == "", err
    assert LINE not in out and "\r" not in out and "\x1b" not in out


def test_quiet_keeps_a_terminal_free_of_progress(tmp_path):
    code, _, err = _list(tmp_path, "--quiet", terminal=True)
    assert code == 0, err
    assert LINE not in err and "\x1b" not in err, err


def test_the_line_counts_and_says_the_time_left():
    drawn = io.StringIO()
    progress = Progress("astra build: building", enabled=True, stream=drawn, every_s=0.0)
    assert progress.line(3, 12, 6.0) == "astra build: building: 3/12 (6s, about 18s left)"
    assert progress.line(12, 12, 30.0) == "astra build: building: 12/12 (30s)"
    progress(1, 2)
    progress.close()
    assert drawn.getvalue().startswith("\r\x1b[Kastra build: building: 1/2 (") and drawn.getvalue().endswith("\r\x1b[K")
    quiet = io.StringIO()
    Progress("x", enabled=False, stream=quiet)(1, 2)
    assert quiet.getvalue() == ""
