"""Stored baselines: a run reuses the original's baseline from an earlier run while nothing that decides it
changed (the evaluator's job and GPU, the original, the judge, its age), and times it again otherwise. The
store is real (a folder per test); the evaluator is the loop tests' kind, one written here that counts how
often it timed the original. Verdicts are SYNTHETIC (tests.verdicts): no GPU ran."""

from __future__ import annotations

import json
import time

import pytest

from astra.optimize.baseline_store import MAX_AGE_S, BaselineStore, job_identity
from astra.optimize.evaluator import Evaluator
from astra.optimize.loop import Agent, Budget, run_loop
from astra.optimize.rundir import RunDir
from tests.verdicts import make_verdict

H100 = "NVIDIA H100 80GB HBM3"
JOB = {"name": "demo", "tolerance": {"bfloat16": {"atol": 0.01, "rtol": 0.01}}, "cases": ["tokens=1", "tokens=8192"]}


class NoIdeas(Agent):
    name = "none"

    def propose(self, ctx):
        return []


class Timer:
    """An evaluator's judge that times the original (a synthetic "timed" self-check on `gpu`) and counts it."""

    def __init__(self, gpu: str = H100, status: str = "timed"):
        self.gpu, self.status, self.originals = gpu, status, 0

    def __call__(self, source: str, label: str):
        assert label == "original"
        self.originals += 1
        verdict = make_verdict({"decode": 1.0, "prefill": 1.0})
        verdict.status, verdict.env = self.status, {"gpu": self.gpu}
        return verdict


def start(store: BaselineStore | None, timer: Timer, *, job: dict = JOB, gpu: str = H100,
          original: str = "// original kernel", identity: bool = True) -> RunDir:
    """A new run of `original` through the loop (no candidate: the baseline only) with `store`."""
    run = RunDir.create("demo", "0.5.23", "none", original)
    evaluator = Evaluator(timer, identity={"job": job, "gpu": gpu} if identity else None)
    run_loop(run, NoIdeas(), evaluator, Budget(rounds=1), baselines=store)
    return run


@pytest.fixture
def store(tmp_path):
    return BaselineStore(tmp_path / "baselines", harness="judge-1")


def test_a_second_run_reuses_the_stored_baseline_without_timing_the_original(store):
    from astra.report import run_html
    from astra.report.run_text import summary

    timer = Timer()
    first = start(store, timer)
    assert timer.originals == 1
    origin = first.state().baseline_origin
    assert origin["how"] == "timed" and origin["file"] and origin["gpu"] == H100
    assert [p.name for p in store.root.iterdir()] == [f"{store.key({'job': JOB, 'gpu': H100, 'original': _id()})}.json"]

    second = start(store, timer)
    assert timer.originals == 1  # not timed again
    reused = second.state().baseline_origin
    assert reused["how"] == "reused" and reused["file"] == origin["file"] and reused["timed_by"] == first.root.name
    assert second.baseline().to_dict() == first.baseline().to_dict()
    text = summary(second)
    assert "baseline reused from " in text and "(same original, GPU and judge; timed by run" in text
    assert "baseline timed by this run on " in summary(first) and "stored for later runs" in summary(first)
    assert "baseline reused from " in run_html.render(second)


def _id(original: str = "// original kernel") -> str:
    from astra.optimize.loop import source_id

    return source_id(original)


@pytest.mark.parametrize("change", [  # not "gpu": that keyword marks a GPU test
    "tolerance", "cases", "gpu_model", "original", "harness"])
def test_anything_that_decides_the_baseline_changed_times_it_again(store, change):
    timer = Timer()
    start(store, timer)
    job = json.loads(json.dumps(JOB))
    gpu, original, judge = H100, "// original kernel", store
    if change == "tolerance":
        job["tolerance"]["bfloat16"]["atol"] = 0.02
    elif change == "cases":
        job["cases"].append("tokens=64")
    elif change == "gpu_model":
        gpu = "NVIDIA H200"
        timer.gpu = gpu
    elif change == "original":
        original = "// original kernel, edited"
    else:
        judge = BaselineStore(store.root, harness="judge-2")
    run = start(judge, timer, job=job, gpu=gpu, original=original)
    assert timer.originals == 2
    assert run.state().baseline_origin["how"] == "timed"
    assert run.state().baseline_origin["why"] == "no stored baseline of this original, GPU and judge"
    assert len(list(store.root.glob("*.json"))) == 2  # the first one stays for its own key


def test_an_expired_baseline_is_timed_again_and_replaced(store):
    timer = Timer()
    first = start(store, timer)
    path = store.root / first.state().baseline_origin["file"].rsplit("/", 1)[-1]
    record = json.loads(path.read_text())
    record["timed_at"] = time.time() - MAX_AGE_S - 60
    path.write_text(json.dumps(record))
    run = start(store, timer)
    assert timer.originals == 2 and "days ago: timed again" in run.state().baseline_origin["why"]
    assert json.loads(path.read_text())["timed_by"] == run.root.name  # replaced
    start(store, timer)
    assert timer.originals == 2  # the fresh one is reused


def test_rebaseline_times_again_and_replaces_the_stored_one(store):
    timer = Timer()
    start(store, timer)
    again = start(BaselineStore(store.root, harness="judge-1", rebaseline=True), timer)
    assert timer.originals == 2 and again.state().baseline_origin["why"].startswith("--rebaseline")
    start(store, timer)
    assert timer.originals == 2
    assert start(store, timer).state().baseline_origin["timed_by"] == again.root.name


@pytest.mark.parametrize("damage", ["truncated", "not an object", "other key", "bad verdict", "a directory"])
def test_an_unreadable_stored_baseline_is_a_miss_and_is_replaced(store, damage):
    timer = Timer()
    first = start(store, timer)
    path = store.root / first.state().baseline_origin["file"].rsplit("/", 1)[-1]
    text = path.read_text()
    if damage == "truncated":
        path.write_text(text[: len(text) // 2])
    elif damage == "not an object":
        path.write_text("[1, 2]")
    elif damage == "other key":
        path.write_text(json.dumps({**json.loads(text), "key": "0" * 64}))
    elif damage == "bad verdict":
        path.write_text(json.dumps({**json.loads(text), "verdict": {"status": "no such status"}}))
    else:
        path.unlink()
        path.mkdir()
    run = start(store, timer)
    assert timer.originals == 2
    assert "unreadable" in run.state().baseline_origin["why"]
    if damage != "a directory":  # a folder in its place cannot be replaced; the run goes on, unstored
        assert json.loads(path.read_text())["timed_by"] == run.root.name
        start(store, timer)
        assert timer.originals == 2
    else:
        assert run.state().baseline_origin["file"] == "" and "could not write" in run.state().baseline_origin["note"]


@pytest.mark.parametrize("status", ["crashed", "original_failed", "timeout"])
def test_a_baseline_that_is_not_a_timed_self_check_is_never_stored(store, status):
    timer = Timer(status=status)
    run = start(store, timer)
    origin = run.state().baseline_origin
    assert origin["file"] == "" and origin["note"] == f"status {status}"
    assert not store.root.exists() or not list(store.root.glob("*.json"))
    start(store, timer)
    assert timer.originals == 2


def test_a_baseline_measured_on_another_gpu_than_its_key_is_not_stored(store):
    timer = Timer(gpu="NVIDIA H200")
    run = start(store, timer, gpu=H100)
    assert run.state().baseline_origin["note"] == f"measured on NVIDIA H200, not on {H100}"


def test_without_a_store_or_a_gpu_name_every_run_times_the_original(store):
    timer = Timer()
    run = start(None, timer)
    start(None, timer)
    assert timer.originals == 2 and run.state().baseline_origin == {}  # as before the store
    unnamed = start(store, timer, identity=False)
    assert timer.originals == 3 and unnamed.state().baseline_origin["note"] == "the evaluator names no GPU"
    assert not store.root.exists()


def test_a_resumed_run_keeps_its_own_baseline(store):
    timer = Timer()
    run = start(store, timer)
    resumed = RunDir.open(run.root.name)
    state = resumed.state()
    state.stopped = None
    resumed.save(state)
    run_loop(resumed, NoIdeas(), Evaluator(timer, identity={"job": JOB, "gpu": H100}), Budget(rounds=1),
             baselines=BaselineStore(store.root, harness="judge-1", rebaseline=True))
    assert timer.originals == 1 and resumed.state().baseline_origin["how"] == "timed"


def test_the_job_identity_follows_the_spec_and_not_what_is_drawn_per_evaluation(sglang_0523):
    from astra.optimize.evaluator import evaluation_options
    from astra.spec import jobs
    from astra.spec import model as spec_mod

    spec = spec_mod.load("rmsnorm")
    job = jobs.make_job(spec, sglang_0523, label="original", options=evaluation_options("original"))
    same = jobs.make_job(spec, sglang_0523, label="original", options=evaluation_options("original"))
    same.options.digest_key, same.options.timing_gate = 12345, "/tmp/gate"
    assert job_identity(same) == job_identity(job)
    looser = jobs.make_job(spec, sglang_0523, label="original", options=evaluation_options("original"))
    dtype = next(iter(looser.tolerance))
    looser.tolerance[dtype] = {**looser.tolerance[dtype], "atol": 1.0}
    assert job_identity(looser) != job_identity(job)
    fewer = jobs.make_job(spec, sglang_0523, label="original", options=evaluation_options("original"))
    fewer.cases = fewer.cases[1:]
    assert job_identity(fewer) != job_identity(job)
    assert job_identity(job)["sources"]["trees"]  # the sources' digest, not only their paths


def test_the_harness_evaluator_keys_the_original_by_its_job_and_gpu(sglang_0523, monkeypatch):
    from astra.optimize.evaluator import HarnessEvaluator, evaluation_options
    from astra.spec import jobs
    from astra.spec import model as spec_mod
    from astra.survey import bench

    spec = spec_mod.load("rmsnorm")
    monkeypatch.setattr(bench, "gpu_name", lambda: H100)
    identity = HarnessEvaluator(spec, sglang_0523).baseline_identity()
    job = jobs.make_job(spec, sglang_0523, label="original", options=evaluation_options("original"))
    assert identity == {"job": job_identity(job), "gpu": H100}
    assert identity["job"]["options"]["outputs_checked"] is False  # the job the original is timed with
    quick = HarnessEvaluator(spec, sglang_0523, quick=True).baseline_identity()
    assert quick["job"]["cases"] != identity["job"]["cases"]  # a quick search times the timed dtype only
    monkeypatch.setattr(bench, "gpu_name", lambda: None)
    assert HarnessEvaluator(spec, sglang_0523).baseline_identity() is None  # no GPU: nothing stored


def test_rebaseline_is_an_option_of_optimize_and_eval():
    from astra.cli.optimize import loop_options
    from astra.cli.parser import build_parser
    from astra.optimize.driver import baseline_store

    parser = build_parser()
    for argv in (["optimize", "rmsnorm", "--rebaseline"], ["eval", "--kernels", "rmsnorm", "--rebaseline"]):
        opts = loop_options(parser.parse_args(argv))
        assert opts.rebaseline and baseline_store(opts).rebaseline
    opts = loop_options(parser.parse_args(["eval", "--kernels", "rmsnorm", "--fresh"]))
    assert not opts.rebaseline and not baseline_store(opts).rebaseline  # --fresh keeps stored baselines
    assert baseline_store(loop_options(parser.parse_args(["optimize", "rmsnorm", "--dry-run"]))) is None


def test_the_progress_line_says_the_baseline_was_reused(capsys):
    from astra.cli.optimize import _printer

    _printer("baseline", {"how": "reused", "file": "/h/baselines/k.json", "timed_at": 0.0, "timed_by": "r1",
                          "gpu": H100})
    _printer("baseline", {"how": "timing", "why": "--rebaseline: the stored baseline is timed again"})
    out = capsys.readouterr().out.splitlines()
    assert "baseline reused from 1970-01-01 00:00 UTC (same original, GPU and judge; timed by run r1" in out[0]
    assert out[1].endswith("timing the original against itself (baseline profile; --rebaseline: the stored "
                           "baseline is timed again)")
