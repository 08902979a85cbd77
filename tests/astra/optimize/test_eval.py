"""`astra eval`'s table rows from run directories (verdicts built here; CI has no GPU)."""

from astra.optimize.optimizer_eval import row
from astra.optimize.rundir import HistoryEntry, RunDir
from astra.spec import model as spec_mod
from tests.astra.report.test_check_report import _verdict


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


def test_row_has_bands_lines_changed_and_the_agent():
    spec = spec_mod.load("rmsnorm")
    run = RunDir.create("rmsnorm", "0.5.23", "offline", "a\nb\nc\n")
    n = run.add_candidate("a\nB\nc\nd\n", {"description": "x"})
    run.save_verdict(n, _verdict())
    state = run.state()
    state.best = n
    run.save(state)
    r = row(run, spec)
    assert r["lines_changed"] == 3  # b -> B (one removed, one added), d added
    assert r["agent"] == "offline" and r["patch"] is None
    assert r["bands"]["decode"] == {"us_before": 2.0, "us_after": 1.6, "speedup": 2.0 / 1.6}
    assert set(r["bands"]) == {"decode", "middle", "prefill"}


def test_survey_targets_rank_by_recoverable_time(tmp_path):
    import pytest

    from astra.errors import BadInput
    from astra.survey.store import Store, make_record
    from astra.survey.targets import survey_targets

    store = Store(tmp_path / "survey")
    for name, scale in (("small_gap", 1.0), ("big_gap", 40.0)):
        verdict = _verdict()
        for case in verdict.cases:
            for timing in case.timings.values():
                timing.orig.median_us *= scale
                timing.cand.median_us *= scale
        store.write(make_record(name=name, kind="draft", spec_file=f"/x/{name}.yaml", spec_sha256="0" * 64, module=name,
                                token_dim="tokens", sglang_version="0.5.23", gpu="Test GPU", wall_s=1.0,
                                verdict=verdict.to_dict(), error=None, reach=None))
    assert survey_targets(1, str(store.root)) == ["big_gap"]
    assert survey_targets(10, str(store.root)) == ["big_gap", "small_gap"]
    with pytest.raises(BadInput, match="astra survey"):
        survey_targets(10, str(tmp_path / "none"))


def _runs_of(spec, tree, stopped: str | None, history: int, opts=None, baseline=None) -> RunDir:
    from astra.optimize.driver import run_identity
    from astra.optimize.options import OptimizeOptions

    original = (tree.csrc_dir / spec.kernel_file).read_text()
    run = RunDir.create(spec.name, tree.version, "offline", original)
    run.save_baseline(baseline or _verdict())
    state = run.state()
    state.stopped = stopped
    state.identity = run_identity(spec, opts or OptimizeOptions(offline=True, wall_min=1))
    state.history = [HistoryEntry(n=i, round=0, name=f"c{i}", status="incorrect", score=0.0, accepted=False, why="")
                     for i in range(history)]
    run.save(state)
    return run


def test_eval_reuses_a_finished_run_and_continues_a_cut_off_one(sglang_0523, monkeypatch):
    from astra.optimize import optimizer_eval
    from astra.optimize.options import OptimizeOptions

    spec = spec_mod.load("rmsnorm")
    opts = OptimizeOptions(offline=True, wall_min=1)
    called: list[str | None] = []

    def loop(spec_, tree_, opts_, **_):  # the loop itself needs a GPU: record what eval asked of it
        called.append(opts_.resume)
        run = RunDir.open(opts_.resume) if opts_.resume else _runs_of(spec_, tree_, "wall-time budget spent", 0)
        return run, run.state()

    monkeypatch.setattr(optimizer_eval, "run_optimize", loop)
    cut = _runs_of(spec, sglang_0523, None, 3)  # killed mid-run: stopped never written
    said: list[str] = []
    optimizer_eval.run_eval([spec], opts, sglang_version=sglang_0523.version, say=said.append)
    assert called == [cut.root.name] and "cut off after 3 candidate(s)" in said[0]

    done = _runs_of(spec, sglang_0523, "wall-time budget of 60s spent", 5)
    said.clear()
    result = optimizer_eval.run_eval([spec], opts, sglang_version=sglang_0523.version, say=said.append)
    assert called == [cut.root.name] and result["rows"][0]["run"] == done.root.name
    assert "finished earlier (wall-time budget of 60s spent): reused" in said[0]
    assert (result["candidates"], result["judged"]) == (5, 0)  # a reused run judged nothing in this evaluation

    failed = _runs_of(spec, sglang_0523, "stopped by the agent: the exec command exited 1", 1)
    said.clear()
    optimizer_eval.run_eval([spec], opts, sglang_version=sglang_0523.version, say=said.append)
    assert called[-1] == failed.root.name and "(stopped by the agent" in said[0]  # an agent error is resumed

    optimizer_eval.run_eval([spec], opts, sglang_version=sglang_0523.version, fresh=True, say=said.append)
    assert called[-1] is None  # --fresh: a new run, nothing reused


def test_eval_never_reuses_a_run_of_another_source_agent_spec_or_setting(sglang_0523, tmp_path):
    from astra.optimize.driver import run_identity
    from astra.optimize.optimizer_eval import earlier_run
    from astra.optimize.options import OptimizeOptions
    from harness import Verdict

    spec = spec_mod.load("rmsnorm")
    opts = OptimizeOptions(offline=True, wall_min=1)
    ident = run_identity(spec, opts)
    run = _runs_of(spec, sglang_0523, "wall-time budget spent", 1)
    original = run.original()
    assert earlier_run(spec.name, sglang_0523.version, "offline", original, ident).root == run.root
    assert earlier_run(spec.name, sglang_0523.version, "llm:some-model", original, ident) is None
    assert earlier_run(spec.name, sglang_0523.version, "offline", original + "// edited upstream\n", ident) is None
    assert earlier_run(spec.name, "0.5.10", "offline", original, ident) is None
    no_sanitizer = run_identity(spec, OptimizeOptions(offline=True, wall_min=1, sanitizer=False))
    assert earlier_run(spec.name, sglang_0523.version, "offline", original, no_sanitizer) is None
    edited = tmp_path / "kernel.yaml"  # the spec corrected (its bytes, say) after the run
    edited.write_text(spec.path.read_text() + "# bytes corrected\n")
    spec.path = edited
    assert earlier_run(spec.name, sglang_0523.version, "offline", original, run_identity(spec, opts)) is None

    spec = spec_mod.load("rmsnorm")  # a dry run's baseline times nothing: never reused on a GPU
    dry = OptimizeOptions(offline=True, wall_min=1, dry_run=True)
    _runs_of(spec, sglang_0523, "1 round(s) done", 0, opts=dry,
             baseline=Verdict(status="built", reason="", correct=False, faster=False, cases=[]))
    assert earlier_run(spec.name, sglang_0523.version, "offline", original, run_identity(spec, dry)) is None
    (run.root / "baseline.json").write_text('{"status": "correct", "cases": [')  # cut off mid-write
    found = earlier_run(spec.name, sglang_0523.version, "offline", original, ident)  # passed over, no crash
    assert found is None or found.root != run.root


def test_steps_after_the_loop_leave_a_killed_run_to_be_continued(sglang_0523):
    import pytest

    from astra.optimize.driver import held_open
    from astra.optimize.optimizer_eval import finished

    spec = spec_mod.load("rmsnorm")
    run = _runs_of(spec, sglang_0523, "wall-time budget of 60s spent", 2)
    with held_open(run):  # band dispatch or the quick search's full check would run here
        assert run.state().stopped is None and not finished(run.state())
    assert run.state().stopped == "wall-time budget of 60s spent" and finished(run.state())
    with pytest.raises(RuntimeError), held_open(run):
        raise RuntimeError("killed mid-verification")
    assert run.state().stopped is None  # run_optimize then marks it failed; eval continues it


def test_a_patch_names_every_accepted_step_the_best_was_built_on():
    from astra.optimize.driver import found_by
    from astra.optimize.loop import source_id

    original = "a\n"
    run = RunDir.create("rmsnorm", "0.5.23", "offline", original)
    first = run.add_candidate("a\nfirst\n", {"description": "drop the copy"})
    loser = run.add_candidate("a\nloser\n", {"description": "a slower idea"})
    second = run.add_candidate("a\nfirst\nsecond\n", {"description": "BLOCK_DIM 256 -> 64"})
    state = run.state()
    state.best = second
    state.history = [
        HistoryEntry(n=first, round=0, name="remat", status="correct", score=2.4, accepted=True, why="",
                     base=source_id(original)),
        HistoryEntry(n=loser, round=0, name="x", status="correct", score=1.2, accepted=False, why="",
                     base=source_id(original)),
        HistoryEntry(n=second, round=1, name="param", status="correct", score=4.1, accepted=True, why="",
                     base=source_id("a\nfirst\n")),
    ]
    run.save(state)
    assert [n for n, _ in run.lineage(second)] == [first, second]
    text = found_by(run, second, "offline")
    assert "2 accepted steps" in text and "a slower idea" not in text
    assert text.index("drop the copy (verified x2.400") < text.index("BLOCK_DIM 256 -> 64 (verified x4.100")
    # a best found in one step reads as before
    assert found_by(run, first, "offline") == "Found by `astra optimize` (offline): drop the copy."


def test_a_run_records_the_seconds_of_each_session(sglang_0523, monkeypatch):
    from dataclasses import replace
    from types import SimpleNamespace

    import pytest

    from astra.optimize import driver
    from astra.optimize.options import OptimizeOptions

    def session(run, spec, tree, opts, events, say):  # the loop itself needs a GPU
        if opts.resume:
            raise RuntimeError("killed")
        state = run.state()
        state.stopped = "1 round(s) done"
        return state

    clock = iter([100.0, 130.0, 200.0, 260.0])  # the start and the end of each session
    monkeypatch.setattr(driver, "time", SimpleNamespace(monotonic=lambda: next(clock)))
    monkeypatch.setattr(driver, "_run", session)
    spec = spec_mod.load("rmsnorm")
    opts = OptimizeOptions(offline=True, wall_min=1)
    run, state = driver.run_optimize(spec, sglang_0523, opts)
    assert state.wall_s == pytest.approx(30.0)
    with pytest.raises(RuntimeError):
        driver.run_optimize(spec, sglang_0523, replace(opts, resume=run.root.name))
    assert RunDir.open(run.root.name).state().wall_s == pytest.approx(90.0)  # a failed session counts too
