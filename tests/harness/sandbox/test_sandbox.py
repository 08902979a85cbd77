"""The OS sandbox of the processes that load candidate code (harness.sandbox), on this machine's kernel,
with no mocks: a C payload of our own tries every forbidden action at load time and inside a call, and
the filesystem, a TCP listener and a signal handler show that nothing happened; the same payload with
the sandbox off shows that each check would have seen it. Then the workers: a real tvm-ffi module built
with nvcc loads and is judged inside the sandbox, a hostile one's escapes have no effect, and a worker
told its kernel lacks the sandbox refuses to load anything unless the user opted out."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import harness.judge.evaluate as judge
from harness.candidate.process import SANDBOX_REFUSED
from harness.sandbox import MODE_ENV, SIMULATE_ENV, decide
from harness.sandbox.selftest import SECRET, run_self_test
from harness.worker.process_group import harness_env
from tests.harness.sandbox import sandbox_job
from tests.toolchain import needs_nvcc

SECCOMP = {"execve", "execve_shell", "raw_syscall_execve", "int80_mkdir", "connect_tcp", "memfd_dlopen", "fork",
           "kill_parent", "ptrace_parent", "io_uring", "unshare", "mmap_exec", "mprotect_exec"}
LANDLOCK = {"raw_syscall_mkdir", "write_outside", "read_secret", "dlopen_outside", "dlopen_written", "read_written",
            "tmpfile_dlopen"}
MARKER_PREFIXES = ("exec-ran", "raw-exec-ran", "fork-ran", "other-ran", "nested-")


# ---------------------------------------------------------------- the payload


def test_every_forbidden_action_is_stopped_at_load_time_and_in_a_call(tmp_path):
    result = run_self_test("enforce", keep=tmp_path)
    assert result["clean_library"] == "ran", result["worker_output"]  # an honest library loads and runs
    assert [step.split(" (")[0] for step in result["sandbox"]["steps"]] == [
        "landlock floor", "landlock tight", "seccomp stage 1", "seccomp stage 2"]
    tried = result["self_test"]
    assert len(tried) == 2 * 18 + 2 and set(tried.values()) == {"blocked"}, tried
    assert list((tmp_path / "outside").iterdir()) == []  # no directory made, no file written outside
    left = sorted(p.name for p in (tmp_path / "writable").iterdir())
    assert not [name for name in left if name.startswith(MARKER_PREFIXES)], left  # no program, library, child ran
    assert set(left) <= {"copy-constructor.so", "copy-call.so"}, left  # written there, never mapped
    assert SECRET not in result["worker_output"] and SECRET in (tmp_path / "secret.txt").read_text()
    assert result["worker_returncode"] == 0  # execve of /bin/true did not replace the worker
    for key, errno_name in result["errors"].items():  # which layer stopped each: seccomp EPERM, Landlock EACCES
        action = key.split(".", 1)[1]
        assert errno_name == ("EPERM" if action in SECCOMP else "EACCES"), (key, errno_name)
        assert action in SECCOMP | LANDLOCK


def test_the_same_payload_without_the_sandbox_does_what_the_checks_look_for(tmp_path):
    """The control: every check of the test above would have seen the action had it happened."""
    result = run_self_test("off", keep=tmp_path)
    outside = sorted(p.name for p in (tmp_path / "outside").iterdir())
    assert {"raw-mkdir-constructor", "written-constructor", "raw-mkdir-call", "written-call"} <= set(outside)
    left = {p.name for p in (tmp_path / "writable").iterdir()}
    for marker in ("fork-ran", "other-ran", "nested-written", "nested-memfd", "nested-tmpfile"):
        assert f"{marker}-constructor" in left, (marker, left)
    assert SECRET in result["worker_output"]
    for action in ("raw_syscall_mkdir", "write_outside", "read_secret", "connect_tcp", "dlopen_outside",
                   "dlopen_written", "memfd_dlopen", "tmpfile_dlopen", "fork", "kill_parent", "mmap_exec"):
        assert result["self_test"][f"call.{action}"] == "ALLOWED", action


def test_the_decision_and_its_label(monkeypatch):
    monkeypatch.delenv(MODE_ENV, raising=False)
    monkeypatch.delenv(SIMULATE_ENV, raising=False)
    assert decide(True) == ("enforced", None)
    assert decide(False) == ("off (--no-sandbox)", None)
    monkeypatch.setenv(MODE_ENV, "off")
    assert decide(True) == ("off (ASTRA_SANDBOX=off)", None)
    monkeypatch.delenv(MODE_ENV)
    monkeypatch.setenv(SIMULATE_ENV, "seccomp")
    label, refusal = decide(True)
    assert label.startswith("unavailable (seccomp is missing") and "--no-sandbox" in refusal
    assert decide(False) == ("off (--no-sandbox)", None)  # opting out needs no sandbox


def test_the_allow_lists_never_open_dev_or_a_parent_of_the_writable_directory(tmp_path):
    """A device mapping (the CUDA driver maps /dev/nvidia*) must not make /dev readable, and nothing readable
    may contain the writable directory (a library written there could then be mapped)."""
    import mmap

    from harness.sandbox import allowlist
    from harness.sandbox.landlock import READ_FILE

    with open("/dev/zero", "rb") as zero:
        mapping = mmap.mmap(zero.fileno(), 4096, prot=mmap.PROT_READ, flags=mmap.MAP_PRIVATE)
        assert "/dev/zero" in Path("/proc/self/maps").read_text()
        for rules in (allowlist.floor([tmp_path], []), allowlist.tight([tmp_path], [])):
            readable = [path for path, access in rules if access & READ_FILE]
            assert "/dev" not in readable and "/" not in readable and "/tmp" not in readable
            assert not [p for p in readable if tmp_path.is_relative_to(os.path.realpath(p))], readable
        mapping.close()


# ---------------------------------------------------------------- the workers, with a real module


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    """(source root with toy.cuh, build cache, the built module of the plain kernel)."""
    from harness.judge.evaluate import build_all

    root = tmp_path_factory.mktemp("toy_sandbox_src")
    (root / "toy.cuh").write_text(sandbox_job.KERNEL)
    cache = tmp_path_factory.mktemp("toy_sandbox_builds")
    paths, _, failure = build_all(sandbox_job.job(root, cache), cache)
    assert failure is None, failure
    return root, cache, paths[("orig", "v")]


@pytest.fixture
def no_scan(monkeypatch):
    """The static scan would refuse the hostile source first; here the sandbox alone must stop it."""
    monkeypatch.setattr(judge, "scan", lambda job: None)
    monkeypatch.setattr("harness.scan.elf_scan.scan_shared_object", lambda orig, cand: None)


def candidate_process(tmp_path: Path, so: str, sandbox: str | None, env: dict[str, str] | None = None):
    """`python -m harness candidate` (phase outputs) on `so` with no cases: it loads the module, writes its
    export signatures, and is done. Returns (process, work directory, home directory)."""
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    job = sandbox_job.job(tmp_path, tmp_path, cases=[])
    request = {"job": json.loads(job.to_json()), "device": "cpu", "cand_so": {"v": so}, "orig_so": {},
               "exports": {"v": ["scale"]}, "trials": [], "timed": []}
    if sandbox is not None:
        request["sandbox"] = sandbox
    (tmp_path / "request.json").write_text(json.dumps(request))
    done = subprocess.run([sys.executable, "-m", "harness", "candidate", str(tmp_path / "request.json"), "--work",
                           str(work), "--phase", "outputs"], cwd=home, env=harness_env(env), capture_output=True,
                          text=True, timeout=300)
    return done, work, home


@needs_nvcc
def test_a_real_tvm_ffi_module_loads_in_the_sandboxed_candidate_process(toy, tmp_path):
    done, work, _ = candidate_process(tmp_path, toy[2], None)  # no "sandbox" in the request: enforced
    assert done.returncode == 0, done.stderr[-2000:]
    assert "seccomp stage 2" in done.stderr and "landlock floor" in done.stderr
    signatures = json.loads((work / "signatures.json").read_text())
    assert signatures["v"]["scale"].startswith("scale(0: DLTensor*, 1: DLTensor*, 2: float)"), signatures
    assert (work / "done").exists()


@needs_nvcc
def test_a_worker_without_the_sandbox_refuses_to_load_unless_opted_out(toy, tmp_path):
    env = {**os.environ, SIMULATE_ENV: "all"}
    (tmp_path / "a").mkdir()
    refused, work, _ = candidate_process(tmp_path / "a", toy[2], "enforce", env)
    assert refused.returncode == SANDBOX_REFUSED and "SandboxUnavailable" in refused.stderr
    assert not (work / "signatures.json").exists()  # nothing was loaded
    (tmp_path / "b").mkdir()
    allowed, work, _ = candidate_process(tmp_path / "b", toy[2], "off", env)
    assert allowed.returncode == 0 and "sandbox: off" in allowed.stderr, allowed.stderr[-2000:]
    assert (work / "signatures.json").exists()


@needs_nvcc
def test_the_judge_refuses_without_the_sandbox_and_records_an_opt_out(toy, monkeypatch):
    root, cache, _ = toy
    monkeypatch.setenv(SIMULATE_ENV, "all")
    verdict = judge.evaluate(sandbox_job.job(root, cache), device="cpu")
    assert verdict.status == "sandbox_unavailable" and "--no-sandbox" in verdict.reason, verdict.reason
    assert verdict.sandbox.startswith("unavailable (") and not verdict.builds and not verdict.cases
    verdict = judge.evaluate(sandbox_job.job(root, cache, sandbox=False), device="cpu")
    assert verdict.status == "correct" and verdict.sandbox == "off (--no-sandbox)", verdict.reason
    monkeypatch.setenv(MODE_ENV, "off")
    assert judge.evaluate(sandbox_job.job(root, cache), device="cpu").sandbox == "off (ASTRA_SANDBOX=off)"


@needs_nvcc
def test_a_hostile_candidates_escapes_have_no_effect(toy, tmp_path, no_scan):
    root, cache, _ = toy
    outside = tmp_path / "outside"
    outside.mkdir()
    verdict = judge.evaluate(sandbox_job.job(root, cache, sandbox_job.hostile(outside)), device="cpu")
    assert verdict.status == "correct" and verdict.sandbox == "enforced", verdict.reason
    assert list(outside.iterdir()) == []
    unsandboxed = judge.evaluate(sandbox_job.job(root, cache, sandbox_job.hostile(outside), sandbox=False),
                                 device="cpu")
    assert unsandboxed.sandbox == "off (--no-sandbox)"
    assert {"load-raw-mkdir", "load-written", "load-forked", "call-written"} <= {p.name for p in outside.iterdir()}
