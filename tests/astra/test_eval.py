"""`astra eval`'s table rows from run directories (verdicts built here; CI has no GPU)."""

from astra.optimize.evaluation import row
from astra.optimize.rundir import HistoryEntry, RunDir
from astra.spec import model as spec_mod
from tests.astra.test_check_report import _verdict


def test_row_uses_the_best_verdicts_interleaved_medians():
    spec = spec_mod.load("rmsnorm")
    run = RunDir.create("rmsnorm", "0.5.23", "offline", "a\nb\nc\n")
    n = run.add_candidate("a\nb\nc\nd\n", {"description": "x"})
    run.save_verdict(n, _verdict())
    state = run.state()
    state.best = n
    state.history = [HistoryEntry(n=n, round=0, name="x", status="correct", score=1.0, accepted=True, why="")]
    run.save(state)
    r = row(run, spec)
    assert (r["lines_before"], r["lines_after"], r["correct"]) == (3, 4, True)
    # geomean of graph medians over the three timed shapes: orig (2, 10, 100), cand (1.6, 9, 101)
    assert abs(r["us_before"] - (2 * 10 * 100) ** (1 / 3)) < 1e-9
    assert abs(r["speedup"] - ((2 * 10 * 100) / (1.6 * 9 * 101)) ** (1 / 3)) < 1e-9


def test_row_without_a_verified_candidate_keeps_the_original():
    spec = spec_mod.load("rmsnorm")
    run = RunDir.create("rmsnorm", "0.5.23", "offline", "a\n")
    run.save_baseline(_verdict())
    r = row(run, spec)
    assert r["correct"] is None and r["speedup"] == 1.0 and r["lines_after"] == 1
