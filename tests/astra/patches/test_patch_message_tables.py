"""The timing tables and correctness lines of a patch message (astra.patches.message) on SYNTHETIC verdicts
(tests/verdicts.py, or a case written here)."""

from __future__ import annotations

from astra.patches.message import OVER_FLOOR, OVER_FLOOR_NOTE, correctness_lines, timing_tables
from harness import Verdict
from harness.judge.verdict import CaseResult
from tests.verdicts import make_verdict


def test_roofline_shares_are_printed_and_none_above_the_whole_is_claimed():
    verdict = make_verdict({"decode": [1.5, 3.0], "prefill": 1.0})  # cand share 0.5 x speedup: 75%, 150%, 50%
    text = "\n".join(timing_tables(verdict))
    rows = [line for line in text.splitlines() if line.startswith("| test ")]
    assert [row.rsplit("|", 2)[-2].strip() for row in rows] == ["50% -> 75%", f"50% -> {OVER_FLOOR}", "50% -> 50%"]
    assert OVER_FLOOR_NOTE in text and "150%" not in text


def test_no_note_when_every_share_is_at_most_the_whole():
    text = "\n".join(timing_tables(make_verdict({"decode": 1.2, "prefill": 1.0})))
    assert "50% -> 60%" in text and OVER_FLOOR_NOTE not in text


def test_astra_patch_takes_drafts_as_check_does(tmp_path, monkeypatch, capsys):
    """`astra patch` resolves a name like check and optimize: a draft is looked up (and refused until probed),
    not reported missing from extracted_kernels/."""
    from astra.cli import main

    monkeypatch.setenv("ASTRA_HOME", str(tmp_path))
    (tmp_path / "drafts" / "mydraft").mkdir(parents=True)
    (tmp_path / "drafts" / "mydraft" / "kernel.yaml").write_text("name: mydraft\n")
    (tmp_path / "c.cuh").write_text("// candidate\n")
    (tmp_path / "v.json").write_text("{}")
    assert main(["patch", "mydraft", "--candidate", str(tmp_path / "c.cuh"), "--verdict", str(tmp_path / "v.json")]) == 4
    err = capsys.readouterr().err
    assert "unprobed draft" in err and "astra probe mydraft" in err


def test_the_patch_says_exact_where_a_dtype_has_no_tolerance():
    """An integer suite is compared bit for bit: the message says so rather than `atol ?, rtol ?`."""
    case = CaseResult(id="edge/int32/n=1", band="decode", label="edge", dtype="int32", dims={"n": 1}, timed=True,
                      bytes=4, trials=3)
    lines = correctness_lines(Verdict(status="correct", reason="", correct=True, cases=[case]), {})
    assert "- int32 outputs: compared exactly (no tolerance)" in lines
    assert not any("?" in line for line in lines)
