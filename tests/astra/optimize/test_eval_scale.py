"""`astra eval` over an astra.scale executor, on CPU: the per-kernel work is a fake (`fake_kernel`, in the
place of `eval_one`: no GPU, no nvcc), the distribution is the real one (`run_eval` with a LocalExecutor of
two fake GPU slots, or Ray's local cluster with two declared GPUs).

A fake kernel's behaviour is its name: "sleep-*" sleeps SLEEP_S, "dies-once-*" kills its worker on the first
attempt (a marker file beside its spec), "always-dies-*" on every attempt, "raises-*" raises. The task
functions are top-level so that spawned workers and Ray workers can import them.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from astra.optimize.optimizer_eval import error_row, eval_executor, run_eval
from astra.optimize.options import OptimizeOptions
from astra.optimize.rundir import HistoryEntry, RunState, per_hour
from astra.scale import LocalExecutor

SLEEP_S = 1.5
OPTS = OptimizeOptions(offline=True, wall_min=1)


def fake_kernel(spec_file: str, sglang_version, sglang_src, opts, fresh, *, say, events) -> dict:
    """Stands in for eval_one: a row shaped like the real one, plus when and on which GPU it ran."""
    folder = Path(spec_file).parent
    name = folder.name
    say(f"{name}: fake run of {opts.wall_min} min")
    if events is not None:
        events("stopped", {"reason": "fake"})
    if name.startswith("dies-once") and not (folder / "died").exists():
        (folder / "died").write_text("")
        os._exit(3)
    if name.startswith("always-dies"):
        os._exit(3)
    if name.startswith("raises"):
        raise ValueError(f"{name}: bad spec")
    start = time.time()
    time.sleep(SLEEP_S if name.startswith("sleep") else 0.0)
    judged = 2 + len(name) % 3
    return {**error_row(name, None), "speedup": 1.25, "candidates": judged + 1, "judged": judged,
            "wall_s": time.time() - start, "start": start, "end": time.time(),
            "cvd": os.environ.get("CUDA_VISIBLE_DEVICES")}


def warm(_: int) -> int:
    """Starts a worker with this module (and astra) imported, so the timings below measure the kernels only."""
    return os.getpid()


def quiet_printer(kind: str, data: dict) -> None:
    """A picklable events printer (the CLI's is astra.cli.optimize._printer)."""
    assert data["kernel"]


def _specs(tmp_path: Path, names: list[str]) -> list[SimpleNamespace]:
    """Stand-ins for KernelSpec: run_eval reads only the name and the path."""
    out = []
    for name in names:
        (tmp_path / name).mkdir()
        (tmp_path / name / "kernel.yaml").write_text("")
        out.append(SimpleNamespace(name=name, path=tmp_path / name / "kernel.yaml"))
    return out


def _overlap(a: dict, b: dict) -> bool:
    return max(a["start"], b["start"]) < min(a["end"], b["end"])


@pytest.fixture(scope="module")
def local():
    from astra.scale import Task

    with LocalExecutor(cpus=1, gpus=2) as executor:
        warmed = list(executor.map([Task(f"warm{i}", warm, (i,), "gpu") for i in range(2)]))
        assert all(o.ok for o in warmed), warmed
        yield executor


def test_four_kernels_on_two_gpu_workers_run_at_once_and_come_back_in_order(local, tmp_path):
    names = ["sleep-d", "sleep-a", "sleep-c", "sleep-bb"]
    said: list[str] = []
    result = run_eval(_specs(tmp_path, names), OPTS, executor=local, evaluate=fake_kernel, say=said.append,
                      events=quiet_printer)
    rows = result["rows"]
    assert [r["kernel"] for r in rows] == names  # the order given, whatever order they finished in
    assert {r["cvd"] for r in rows} == {"0", "1"} and all(r["where"].endswith(("gpu0", "gpu1")) for r in rows)
    assert sum(_overlap(a, b) for i, a in enumerate(rows) for b in rows[i + 1:]) >= 2
    sequential = SLEEP_S * len(names)
    assert result["wall_s"] < 0.8 * sequential, result["wall_s"]  # about half, with generous slack
    assert result["failed"] == [] and result["geomean_speedup"] == pytest.approx(1.25)
    assert sorted(line.split(":")[0] for line in said if "finished on" in line) == sorted(names)


def test_a_worker_death_is_retried_once_and_a_second_one_is_an_error_row(local, tmp_path):
    names = ["dies-once-a", "always-dies-b", "raises-c", "sleep-d"]
    said: list[str] = []
    result = run_eval(_specs(tmp_path, names), OPTS, executor=local, evaluate=fake_kernel, say=said.append)
    rows = {r["kernel"]: r for r in result["rows"]}
    assert [r["kernel"] for r in result["rows"]] == names
    assert rows["dies-once-a"]["error"] is None and rows["dies-once-a"]["speedup"] == 1.25
    assert any(line.startswith("dies-once-a: finished on") and "(attempt 2)" in line for line in said), said
    assert rows["always-dies-b"]["error"].startswith("worker died twice: exit code 3, then exit code 3")
    assert "2 attempt(s)" in rows["always-dies-b"]["error"]
    assert rows["raises-c"]["error"].startswith("ValueError: raises-c: bad spec")
    assert rows["sleep-d"]["error"] is None
    assert result["failed"] == ["always-dies-b", "raises-c"]
    assert result["geomean_speedup"] == pytest.approx(1.25)  # error rows have no speedup to average


def test_candidates_per_hour_come_from_the_rows_counts(local, tmp_path):
    names = ["sleep-x", "sleep-yy", "sleep-zzz"]
    result = run_eval(_specs(tmp_path, names), OPTS, executor=local, evaluate=fake_kernel, say=lambda _: None)
    judged = sum(2 + len(n) % 3 for n in names)
    assert result["judged"] == judged and result["candidates"] == judged + len(names)
    assert result["judged_per_hour"] == pytest.approx(judged * 3600 / result["wall_s"])


def test_in_process_without_an_executor_runs_one_after_another(tmp_path):
    names = ["quick-a", "quick-b"]
    result = run_eval(_specs(tmp_path, names), OPTS, evaluate=fake_kernel, say=lambda _: None)
    assert [r["kernel"] for r in result["rows"]] == names
    assert all(r["where"] is None and r["cvd"] == os.environ.get("CUDA_VISIBLE_DEVICES") for r in result["rows"])


def test_judged_counts_verdicts_not_dry_run_builds_and_per_hour():
    def entry(n: int, status: str) -> HistoryEntry:
        return HistoryEntry(n=n, round=0, name=f"c{n}", status=status, score=0.0, accepted=False, why="")

    state = RunState(run_id="r", kernel="k", sglang_version="0.5.23", agent="offline",
                     history=[entry(1, "correct"), entry(2, "build_failed"), entry(3, "built"), entry(4, "incorrect")])
    assert state.judged() == 3 and state.judged(since=2) == 1
    assert per_hour(3, 1800.0) == pytest.approx(6.0) and per_hour(3, 0.0) is None and per_hour(0, None) is None
    from astra.report.run_text import throughput_line

    assert throughput_line(state) == "judged 3 candidate(s); run time not recorded"
    state.wall_s = 1800.0
    assert throughput_line(state) == "judged 3 candidate(s) in 30.0 min of run time: 6.0 per hour"
    assert RunState.from_dict(state.to_dict()).wall_s == 1800.0


def test_eval_runs_in_process_with_one_gpu_or_one_kernel(monkeypatch):
    from astra.errors import BadInput
    from astra.optimize import optimizer_eval

    monkeypatch.setattr(optimizer_eval, "visible_gpus", lambda: [0])
    assert eval_executor(None, None, 4) is None
    monkeypatch.setattr(optimizer_eval, "visible_gpus", lambda: [0, 1])
    assert eval_executor(None, 1, 4) is None and eval_executor(None, None, 1) is None
    with pytest.raises(BadInput, match="--gpus 0"):
        eval_executor(None, 0, 4)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    executor = eval_executor(None, 8, 4)  # at most the GPUs visible
    try:
        assert isinstance(executor, LocalExecutor) and executor.gpus == 2
    finally:
        executor.close()


# ---- Ray's local cluster, started on CPU with two declared (fake) GPUs ----

@pytest.fixture(scope="module")
def ray_executor():
    ray = pytest.importorskip("ray")
    from astra.scale import make_executor

    if ray.is_initialized():
        ray.shutdown()
    ray.init(num_cpus=2, num_gpus=2, include_dashboard=False, logging_level="WARNING")
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers need not find tests/
    try:
        executor = make_executor(ray="auto")
        yield executor
        executor.close()
    finally:
        ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
        ray.shutdown()


def test_ray_runs_the_kernels_on_distinct_gpus_in_order_and_reports_failures(ray_executor, tmp_path):
    names = ["sleep-b", "dies-once-c", "sleep-a", "always-dies-d", "raises-e"]
    said: list[str] = []
    result = run_eval(_specs(tmp_path, names), OPTS, executor=ray_executor, evaluate=fake_kernel, say=said.append,
                      events=quiet_printer)
    rows = {r["kernel"]: r for r in result["rows"]}
    assert [r["kernel"] for r in result["rows"]] == names
    assert rows["sleep-a"]["error"] is None and rows["sleep-b"]["error"] is None
    assert {rows["sleep-a"]["cvd"], rows["sleep-b"]["cvd"]} <= {"0", "1"}
    assert rows["dies-once-c"]["error"] is None, rows["dies-once-c"]
    assert rows["always-dies-d"]["error"].startswith("worker died twice")
    assert rows["raises-e"]["error"].startswith("ValueError: raises-e: bad spec")
    assert result["failed"] == ["always-dies-d", "raises-e"]
    assert result["judged"] == sum(rows[n]["judged"] for n in ("sleep-b", "dies-once-c", "sleep-a"))
