"""`astra doctor` on this machine (it needs no GPU), and where the sandbox shows on the astra side: the
--no-sandbox flag of the judging commands reaches the job's options, and a patch's evidence says
whether the candidate ran sandboxed."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from astra.cli.parser import build_parser
from astra.patches.message import correctness_lines
from astra.verify.runner import CheckOptions
from harness.judge.verdict import Verdict
from harness.sandbox import MODE_ENV, SIMULATE_ENV


def doctor(*args: str, **env: str) -> tuple[int, str, str]:
    environment = {k: v for k, v in os.environ.items() if k not in (MODE_ENV, SIMULATE_ENV)}
    proc = subprocess.run([sys.executable, "-m", "astra.cli", "doctor", *args], capture_output=True, text=True,
                          env={**environment, **env}, timeout=600)
    return proc.returncode, proc.stdout, proc.stderr


def test_doctor_proves_the_sandbox_here():
    code, out, err = doctor("--json")
    report = json.loads(out)
    box = report["sandbox"]
    assert code == 0, (out, err)
    assert box["enforced"] is True and box["landlock_abi"] >= 1 and box["seccomp"] is True, box
    assert box["self_test"] and set(box["self_test"].values()) == {"blocked"}, box["self_test"]
    assert "constructor.execve" in box["self_test"] and "call.mmap_exec" in box["self_test"]
    assert box["clean_library"] == "ran"
    assert set(report) >= {"nvcc", "gpu", "compute_sanitizer", "ncu", "libclang", "can_judge"}
    assert report["libclang"] == {"found": True, "problem": None}  # libclang-ng is a dependency
    assert report["can_judge"] is (report["nvcc"]["found"] and report["gpu"]["available"])


def test_doctor_fails_where_the_kernel_cannot_sandbox():
    code, out, _ = doctor("--json", **{SIMULATE_ENV: "landlock"})
    report = json.loads(out)
    assert code == 16 and report["sandbox"]["enforced"] is False and report["can_judge"] is False
    assert "Landlock" in report["sandbox"]["problems"][0]
    code, out, _ = doctor()
    assert code == 0 and out.startswith("sandbox            enforced (Landlock ABI")


@pytest.mark.parametrize("command", [
    ["check", "k", "--candidate", "c.cuh"], ["bench", "k"], ["probe", "k"], ["optimize", "k"], ["eval"], ["survey"]])
def test_every_judging_command_takes_no_sandbox(command):
    assert build_parser().parse_args([*command, "--no-sandbox"]).no_sandbox is True
    assert build_parser().parse_args(command).no_sandbox is False


def test_the_option_reaches_the_job_and_the_patch_says_it():
    assert CheckOptions().harness_options().sandbox is True
    assert CheckOptions(sandbox=False).harness_options().sandbox is False
    verdict = Verdict(status="correct", reason="", correct=True, sandbox="enforced")
    assert "- OS sandbox (Landlock + seccomp): enforced on every process that ran the candidate" in \
        correctness_lines(verdict, {})
    verdict.sandbox = "off (--no-sandbox)"
    assert "- OS sandbox: off (--no-sandbox)" in correctness_lines(verdict, {})
