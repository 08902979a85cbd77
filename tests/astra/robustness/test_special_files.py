"""Input files that are FIFOs (the read would wait forever) or links to /dev/zero (the read would never end):
every reader of a user's file goes through astra.input_files, which reads only a regular file under the size
bound of its kind, so each command answers at once with its documented code."""

import os

import pytest

from tests.astra.robustness.run_astra import ANSWER_S, astra, checkout, home, refused

KINDS = {"fifo": "a FIFO (named pipe), not a regular file", "zero": "a character device, not a regular file"}


def special(path, kind):
    """`path` made a FIFO or a link to /dev/zero."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/zero")
    return path


@pytest.fixture(params=list(KINDS))
def kind(request):
    return request.param


def test_spec_check_and_check(tmp_path, kind):
    special(tmp_path / "specs" / "rmsnorm" / "kernel.yaml", kind)
    env = {"ASTRA_SPECS": str(tmp_path / "specs")}
    answer = astra("spec-check", "rmsnorm", env=env)
    assert answer.code == 1 and answer.err == "" and KINDS[kind] in answer.out, answer.out + answer.err
    assert answer.seconds < ANSWER_S
    refused(astra("check", "rmsnorm", "--candidate", "/nonexistent.cuh", env=env), 5, KINDS[kind])


@pytest.mark.parametrize("command", [["apply", "--sglang-src"], ["recheck", "--no-gpu", "--sglang-src"]])
def test_apply_and_recheck(tmp_path, kind, command):
    patch = special(tmp_path / "k.patch", kind)
    answer = astra(command[0], str(patch), *command[1:], str(checkout(tmp_path / "tree")))
    refused(answer, 9, f"{patch}: {KINDS[kind]}")


def test_runs_and_show(tmp_path, kind):
    root = home(tmp_path)
    special(root / "runs" / "20260101-000000-rmsnorm" / "state.json", kind)
    answer = astra("runs", env={"ASTRA_HOME": str(root)})
    assert answer.code == 0 and answer.err == "", answer.err
    assert f"unreadable: {KINDS[kind][:20]}" in answer.out and answer.seconds < ANSWER_S
    refused(astra("show", "20260101-000000-rmsnorm", env={"ASTRA_HOME": str(root)}), 14,
            f"state.json is unreadable ({KINDS[kind]})")


def test_survey_store_and_mix(tmp_path, kind):
    special(tmp_path / "store" / "rmsnorm.json", kind)
    refused(astra("survey", "--report-only", "--out", str(tmp_path / "store")), 12,
            f"rmsnorm.json: not a survey record ({KINDS[kind]})")
    mix = special(tmp_path / "mix.yaml", kind)
    refused(astra("survey", "--report-only", "--out", str(tmp_path / "store"), "--mix", str(mix)), 12,
            f"--mix {mix}: {KINDS[kind]}")


def test_candidate_and_verdict(tmp_path, kind):
    odd = special(tmp_path / "odd", kind)
    real = tmp_path / "k.cuh"
    real.write_text("// kernel\n")
    refused(astra("check", "rmsnorm", "--candidate", str(odd)), 12, f"--candidate {odd}: {KINDS[kind]}")
    refused(astra("patch", "rmsnorm", "--candidate", str(real), "--verdict", str(odd), "--out", str(tmp_path / "p")),
            12, f"--verdict {odd}: {KINDS[kind]}")


def test_a_file_over_its_bound_is_refused_by_size(tmp_path):
    patch = tmp_path / "big.patch"
    with open(patch, "wb") as fh:
        fh.truncate((16 << 20) + 1)  # sparse: 16 MiB and a byte, nothing written
    refused(astra("apply", str(patch), "--sglang-src", str(checkout(tmp_path / "tree"))), 9,
            "the file is 16,777,217 bytes; an Astra patch is at most 16,777,216 bytes (16 MiB)")
