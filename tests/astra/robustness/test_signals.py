"""A command told to stop (SIGTERM, SIGINT) stops cleanly: every child it started (nvcc and what nvcc started)
is gone, its temporary folders are removed, it says why in one line with the shell's exit status (143, 130),
and an optimize run's state records the reason. The real `astra` runs in a child process; nvcc is a slow
stand-in first in a fake CUDA_HOME that starts a grandchild of its own and records both ids."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.astra.robustness.run_astra import REPO, home

SLOW_NVCC = """#!/bin/sh
if [ "$1" = "--version" ]; then
  echo "Cuda compilation tools, release 13.0, V13.0.0 (a slow stand-in for tests)"
  exit 0
fi
sleep 300 &
echo "$$ $!" >> "$ASTRA_TEST_PIDS"
wait
"""


def _fake_cuda(tmp_path: Path) -> Path:
    """A CUDA_HOME whose nvcc never finishes (the real headers, so the build plan is the real one)."""
    cuda = tmp_path / "cuda"
    (cuda / "bin").mkdir(parents=True)
    nvcc = cuda / "bin" / "nvcc"
    nvcc.write_text(SLOW_NVCC)
    nvcc.chmod(0o755)
    real = Path(os.environ.get("CUDA_HOME") or "/usr/local/cuda")
    for name in ("include", "lib64", "targets", "nvvm"):
        if (real / name).exists():
            (cuda / name).symlink_to(real / name)
    return cuda


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for a reaper counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state != "Z"


def _stopped_mid_build(tmp_path: Path, signum: int, *args: str) -> tuple[subprocess.CompletedProcess, list[int], Path]:
    """Start `astra ARGS`, wait until nvcc runs, send `signum`; the finished command, nvcc's and its child's
    ids, and the home."""
    if not (Path(os.environ.get("CUDA_HOME") or "/usr/local/cuda") / "include").is_dir():
        pytest.skip("needs the CUDA headers (the build plan includes them)")
    astra_home, pids, tmp = home(tmp_path), tmp_path / "pids", tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "ASTRA_HOME": str(astra_home), "CUDA_HOME": str(_fake_cuda(tmp_path)), "TMPDIR": str(tmp),
           "ASTRA_TEST_PIDS": str(pids)}
    proc = subprocess.Popen([sys.executable, "-m", "astra.cli", *args], cwd=REPO, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 180
        while not (pids.exists() and pids.read_text().strip()) and proc.poll() is None:
            assert time.monotonic() < deadline, "nvcc was never started"
            time.sleep(0.1)
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.3)  # nvcc's own child started too
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    started = [int(p) for p in pids.read_text().split()]
    return subprocess.CompletedProcess(args, proc.returncode, out, err), started, astra_home


def _no_leftovers(started: list[int], astra_home: Path, tmp: Path) -> None:
    deadline = time.monotonic() + 5  # SIGKILL is delivered at once; reaping may take a moment
    while any(_alive(pid) for pid in started) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [pid for pid in started if _alive(pid)], "a child outlived the command"
    assert not list(astra_home.glob("builds/.staging-*")), "a build's staging folder was left behind"
    assert not [p.name for p in tmp.iterdir() if p.name.startswith("astra-")], "a temporary folder was left"


@pytest.mark.parametrize("signum,status,reason", [(signal.SIGTERM, 143, "terminated (SIGTERM)"),
                                                  (signal.SIGINT, 130, "interrupted (Ctrl-C)")])
def test_a_stopped_build_leaves_no_child_and_no_temporary_folder(tmp_path, signum, status, reason):
    done, started, astra_home = _stopped_mid_build(tmp_path, signum, "build", "rmsnorm")
    assert done.returncode == status, (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [f"astra build: {reason}"]
    assert started and len(started) % 2 == 0  # each nvcc and its child
    _no_leftovers(started, astra_home, tmp_path / "tmp")


def test_a_terminated_optimize_run_is_marked_stopped_with_its_reason(tmp_path):
    done, started, astra_home = _stopped_mid_build(tmp_path, signal.SIGTERM, "optimize", "rmsnorm", "--dry-run",
                                                   "--offline")
    assert done.returncode == 143, (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1] == "astra optimize: terminated (SIGTERM)"
    _no_leftovers(started, astra_home, tmp_path / "tmp")
    (state_file,) = astra_home.glob("runs/*/state.json")
    assert json.loads(state_file.read_text())["stopped"] == "terminated (SIGTERM)"
