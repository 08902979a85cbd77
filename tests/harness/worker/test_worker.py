"""Crash containment of harness.worker.judge_process, on the CPU: evaluations that segfault, abort, hang, raise or
succeed are stood in by tests/harness/worker/fake_evals.py through ASTRA_HARNESS_EVALUATE."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.job import BuildBase, Job
from harness.judge.verdict import Verdict
from harness.worker.judge_process import EVALUATE_ENV, collect_verdict, run_job
from harness.worker.process_group import ProcessOutcome, describe_exit, telling_line, write_json_atomic

FAKE = Path(__file__).with_name("fake_evals.py")
REPO = Path(__file__).resolve().parents[3]


def fake_job(behaviour: str) -> Job:
    """A job whose name tells fake_evals.dispatch what to do."""
    return Job(name=behaviour, entry="f", kernel_file="k.cuh",
               build=BuildBase(source_root="/nonexistent", include_dirs=[], cuda_files=[]),
               variants={}, cases=[], tolerance={}, candidate_label=f"label-{behaviour}")


@pytest.fixture
def fake_env(tmp_path) -> dict[str, str]:
    env = dict(os.environ)
    env[EVALUATE_ENV] = f"{FAKE}:dispatch"
    env["ASTRA_TEST_PIDFILE"] = str(tmp_path / "pids.json")
    return env


def alive(pid: int) -> bool:
    """True while `pid` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def wait_dead(pids: list[int], within_s: float = 5.0) -> list[int]:
    """The pids still alive after `within_s` (an orphan may take a moment to be reaped)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.05)
    return [p for p in pids if alive(p)]


def test_success_round_trips(fake_env):
    verdict = run_job(fake_job("succeed"), timeout_s=60, env=fake_env)
    assert verdict.status == "correct" and verdict.worker["returncode"] == 0
    expected = Verdict(status="correct", reason="succeed: all fine", correct=True, faster=True, name="succeed",
                       candidate_label="label-succeed", band_speedups={"graph": {"decode": 1.25, "all": 1.25}},
                       notes=["from fake_evals"]).to_dict()
    got = verdict.to_dict()
    assert {k: v for k, v in got.items() if k != "worker"} == {k: v for k, v in expected.items() if k != "worker"}


def test_segfault_is_crashed(fake_env):
    verdict = run_job(fake_job("segfault"), timeout_s=60, env=fake_env)
    assert verdict.status == "crashed" and verdict.correct is False
    assert "SIGSEGV" in verdict.reason
    assert "Segmentation fault" in verdict.reason  # faulthandler's line, from stderr
    assert verdict.worker["returncode"] < 0


def test_abort_is_crashed(fake_env):
    verdict = run_job(fake_job("abort"), timeout_s=60, env=fake_env)
    assert verdict.status == "crashed" and "SIGABRT" in verdict.reason


def test_hang_is_timeout_and_kills_the_group(fake_env, tmp_path):
    start = time.monotonic()
    # 10 s: the worker imports torch before it says anything, which took over 4 s on a loaded 2-core CI machine
    verdict = run_job(fake_job("hang"), timeout_s=10, env=fake_env)
    elapsed = time.monotonic() - start
    assert verdict.status == "timeout", verdict
    assert "10 s" in verdict.reason and "tokens=1" in verdict.reason  # the last thing it said
    assert elapsed < 10 + 10
    pids = json.loads((tmp_path / "pids.json").read_text())
    assert pids["pgid"] == pids["worker"]  # the worker leads its own group
    assert wait_dead([pids["worker"], pids["grandchild"]]) == []


def test_raise_is_crashed_with_the_message(fake_env):
    verdict = run_job(fake_job("raise"), timeout_s=60, env=fake_env)
    assert verdict.status == "crashed"
    assert "ValueError: the fake evaluation failed: bad tolerance table" in verdict.reason
    assert "exited with status 1" in verdict.reason


def test_cuda_error_is_caught_in_the_worker(fake_env):
    verdict = run_job(fake_job("cuda_error"), timeout_s=120, env=fake_env)
    assert verdict.status == "crashed"
    assert verdict.reason == "CUDA error: an illegal memory access was encountered"
    assert verdict.worker["returncode"] == 0  # the worker wrote this verdict itself


def test_the_judge_out_of_memory_is_an_environment_error(fake_env):
    verdict = run_job(fake_job("judge_out_of_memory"), timeout_s=120, env=fake_env)
    assert verdict.status == "environment_error" and verdict.correct is False
    assert verdict.reason.startswith("the judge ran out of GPU memory beside the candidate's process")
    assert "Tried to allocate 6.00 GiB" in verdict.reason and "lower it in the spec" in verdict.reason


def test_passing_verdict_then_nonzero_exit_is_crashed(fake_env):
    verdict = run_job(fake_job("exit_after_verdict"), timeout_s=60, env=fake_env)
    assert verdict.status == "crashed" and verdict.correct is False
    assert "exited with status 3 after writing its verdict" in verdict.reason
    assert "terminate called" in verdict.reason


def test_exit_without_verdict_is_crashed(fake_env):
    verdict = run_job(fake_job("silent_exit"), timeout_s=60, env=fake_env)
    assert verdict.status == "crashed" and "wrote no verdict" in verdict.reason


def test_run_jobs_isolates_each_job(fake_env):
    names = ["segfault", "succeed", "hang", "succeed", "raise", "succeed"]
    # 4 s brings the hang to its end; the others get room (a raise imports torch to tell a CUDA failure apart)
    verdicts = [run_job(fake_job(n), timeout_s=4 if n == "hang" else 60, env=fake_env) for n in names]
    assert [v.status for v in verdicts] == ["crashed", "correct", "timeout", "correct", "crashed", "correct"]


def test_verdict_file_is_the_only_channel(tmp_path):
    """Whatever a worker prints, only its verdict file counts."""
    job = fake_job("succeed")
    outcome = ProcessOutcome(returncode=0, seconds=0.1, stdout='{"status": "correct"}', stderr="")
    verdict = collect_verdict(job, tmp_path / "missing.json", outcome, timeout_s=10)
    assert verdict["status"] == "crashed"


def test_partial_verdict_file_is_crashed(tmp_path):
    (tmp_path / "verdict.json").write_text('{"status": "corr')
    outcome = ProcessOutcome(returncode=-9, seconds=0.1, stdout="", stderr="Killed\n")
    verdict = collect_verdict(fake_job("x"), tmp_path / "verdict.json", outcome, timeout_s=10)
    assert verdict["status"] == "crashed" and verdict["reason"] == "worker killed by SIGKILL: Killed"


def test_write_json_atomic_leaves_no_temporary(tmp_path):
    write_json_atomic(tmp_path / "sub" / "v.json", {"status": "correct"})
    assert json.loads((tmp_path / "sub" / "v.json").read_text()) == {"status": "correct"}
    assert [p.name for p in (tmp_path / "sub").iterdir()] == ["v.json"]


@pytest.mark.parametrize("stderr, expected", [
    ("Traceback (most recent call last):\n  File x\nRuntimeError: CUDA error: an illegal memory access was "
     "encountered\nCUDA kernel errors might be asynchronously reported\n",
     "CUDA error: an illegal memory access was encountered"),
    ("Traceback:\n  File y\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n",
     "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"),
    ("Traceback:\n  File z\nKeyError: 'x'\n", "KeyError: 'x'"),
    ("some\nlast words\n\n", "last words"),
    ("", ""),
])
def test_telling_line(stderr, expected):
    assert telling_line(stderr) == expected


def test_describe_exit():
    assert describe_exit(-11) == "killed by SIGSEGV"
    assert describe_exit(2) == "exited with status 2"


def test_env_subcommand_without_gpu():
    done = subprocess.run([sys.executable, "-m", "harness", "env", "--no-measure"], capture_output=True,
                          text=True, cwd=REPO, timeout=120, check=True)
    env = json.loads(done.stdout)
    assert {"gpu", "torch", "tvm_ffi", "nvcc", "driver", "notes"} <= set(env)
    if env["gpu"] is None:
        assert env["notes"]


# ---------------------------------------------------------------- the signed verdict, the scrubbed environment


def test_forged_verdict_is_crashed(fake_env):
    verdict = run_job(fake_job("forge"), timeout_s=60, env=fake_env)
    assert verdict.status == "crashed" and verdict.correct is False
    assert verdict.reason == ("verdict signature invalid (the verdict file was written by something other than "
                              "the judge)")


def test_key_reaches_the_judge_on_stdin_only(fake_env):
    verdict = run_job(fake_job("secrets"), timeout_s=60, env=fake_env)
    assert verdict.status == "correct" and verdict.reason == "key=yes leaked=False"


def test_tampered_verdict_file_fails_verification(tmp_path):
    from harness.worker.judge_channel import new_key, sign, verify

    key = new_key()
    signed = sign(Verdict(status="incorrect", reason="x", correct=False, faster=False).to_dict(), key)
    assert verify(signed, key) and not verify(signed, new_key())
    path = tmp_path / "verdict.json"
    write_json_atomic(path, {**signed, "status": "correct", "correct": True})
    outcome = ProcessOutcome(returncode=0, seconds=0.1, stdout="", stderr="")
    verdict = collect_verdict(fake_job("x"), path, outcome, timeout_s=10, key=key)
    assert verdict["status"] == "crashed" and "signature invalid" in verdict["reason"]
    write_json_atomic(path, signed)
    assert collect_verdict(fake_job("x"), path, outcome, timeout_s=10, key=key)["status"] == "incorrect"
    write_json_atomic(path, {k: v for k, v in signed.items() if k != "signature"})
    assert collect_verdict(fake_job("x"), path, outcome, timeout_s=10, key=key)["status"] == "crashed"


def test_scrub_env_drops_secrets_and_keeps_cuda(tmp_path):
    from harness.worker.process_group import scrub_env

    env = {"OPENAI_API_KEY": "sk-1", "ASTRA_API_KEY": "a", "HF_TOKEN": "h", "AWS_SECRET_ACCESS_KEY": "s",
           "ANTHROPIC_BASE_URL": "u", "ASTRA_HOME": "/h", "GITHUB_TOKEN": "g", "MY_PASSWORD": "p", "DB_CREDENTIALS": "c",
           "CUDA_VISIBLE_DEVICES": "1", "CUDA_HOME": "/usr/local/cuda", "PATH": "/usr/bin", "LD_LIBRARY_PATH": "/lib",
           "LANG": "C.UTF-8", "LC_ALL": "C", "HOME": "/root", "TMPDIR": "/tmp", "SSH_AUTH_SOCK": "/s",
           "ASTRA_TIMING_PAUSE_GC": "0", "PYTORCH_NO_CUDA_MEMORY_CACHING": "1", "NVIDIA_VISIBLE_DEVICES": "all"}
    scrubbed = scrub_env(env, tmp_path)
    for name in ("OPENAI_API_KEY", "ASTRA_API_KEY", "HF_TOKEN", "AWS_SECRET_ACCESS_KEY", "ANTHROPIC_BASE_URL",
                 "ASTRA_HOME", "GITHUB_TOKEN", "MY_PASSWORD", "DB_CREDENTIALS", "SSH_AUTH_SOCK"):
        assert name not in scrubbed, name
    for name in ("CUDA_VISIBLE_DEVICES", "CUDA_HOME", "PATH", "LD_LIBRARY_PATH", "LANG", "LC_ALL",
                 "ASTRA_TIMING_PAUSE_GC", "PYTORCH_NO_CUDA_MEMORY_CACHING", "NVIDIA_VISIBLE_DEVICES"):
        assert scrubbed[name] == env[name], name
    assert scrubbed["HOME"] == scrubbed["TMPDIR"] == str(tmp_path)
    assert scrubbed["PYTHONPATH"].split(os.pathsep)[0] == str(REPO)


def test_run_isolated_passes_stdin_data(tmp_path):
    from harness.worker.process_group import run_isolated

    command = [sys.executable, "-c", "import sys; sys.stdout.write(sys.stdin.read()[::-1])"]
    outcome = run_isolated(command, timeout_s=30, env=dict(os.environ), cwd=tmp_path, stdin_data=b"judge")
    assert outcome.returncode == 0 and outcome.stdout == "egduj"
    outcome = run_isolated(command, timeout_s=30, env=dict(os.environ), cwd=tmp_path)
    assert outcome.stdout == ""


def test_progress_lines_reach_the_caller_while_the_process_runs(tmp_path):
    """A long job says where it is: each `INFO harness` line of the process's stderr is handed over as it
    is written (not after the end), other lines are not, and the outcome still keeps all of stderr."""
    from harness.worker.process_group import Isolated

    script = ("import sys, time\n"
              "print('INFO harness.judge.evaluate: building 2 module(s)', file=sys.stderr, flush=True)\n"
              "print('noise from nvcc', file=sys.stderr, flush=True)\n"
              "time.sleep(1.5)\n"
              "print('INFO harness.judge.evaluate: judging case 1/1 x', file=sys.stderr, flush=True)\n")
    seen: list[tuple[float, str]] = []
    start = time.monotonic()
    proc = Isolated([sys.executable, "-c", script], env=dict(os.environ), cwd=tmp_path)
    outcome = proc.finish(30, progress=lambda line: seen.append((time.monotonic() - start, line)))
    assert outcome.returncode == 0
    assert [line for _, line in seen] == ["building 2 module(s)", "judging case 1/1 x"]
    assert seen[0][0] < seen[1][0] - 0.5  # the first line arrived before the process slept, not at its end
    assert "noise from nvcc" in outcome.stderr


def test_progress_still_times_out(tmp_path):
    from harness.worker.process_group import Isolated

    proc = Isolated([sys.executable, "-c", "import time; time.sleep(30)"], env=dict(os.environ), cwd=tmp_path)
    start = time.monotonic()
    outcome = proc.finish(1.0, progress=lambda line: None)
    assert outcome.returncode is None and time.monotonic() - start < 10


def test_a_failing_progress_callback_does_not_lose_the_outcome(tmp_path):
    from harness.worker.process_group import Isolated

    def broken(line: str) -> None:
        raise BrokenPipeError("stderr closed")

    script = "import sys; print('INFO harness.judge.evaluate: building', file=sys.stderr, flush=True); print('done')"
    outcome = Isolated([sys.executable, "-c", script], env=dict(os.environ), cwd=tmp_path).finish(30, progress=broken)
    assert outcome.returncode == 0 and outcome.stdout.strip() == "done"
