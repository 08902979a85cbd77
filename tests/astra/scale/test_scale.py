"""astra.scale on CPU only: the local pool with fake GPU slots, and Ray's local cluster with fake GPUs.

The task functions are top-level so that spawned workers and Ray workers can import them.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from astra.errors import BadInput, NoGpu, ToolMissing
from astra.scale import Artifacts, Executor, LocalExecutor, Task, collect_files, make_executor, write_files
from astra.scale.local import default_cpus, gpu_devices

# ---- task functions (run in workers) ----

def fake_eval(seconds: float) -> dict:
    """A stand-in for one GPU evaluation: which device it saw, which process, when."""
    start = time.time()
    time.sleep(seconds)
    return {"cvd": os.environ.get("CUDA_VISIBLE_DEVICES"), "pid": os.getpid(), "start": start, "end": time.time(),
            "build_jobs": os.environ.get("ASTRA_BUILD_JOBS")}


def die_once(marker: str) -> str:
    if not os.path.exists(marker):
        Path(marker).write_text("died")
        os._exit(3)
    return "second try"


def always_die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def raise_value_error() -> None:
    raise ValueError("bad shape 3x5\nsecond line")


def write_report(folder: str) -> Artifacts:
    root = Path(folder)
    (root / "logs").mkdir(parents=True, exist_ok=True)
    (root / "verdict.json").write_text('{"status": "ok"}')
    (root / "logs" / "build.log").write_bytes(b"nvcc \x00 done")
    return Artifacts({"status": "ok"}, collect_files(root))


# ---- helpers ----

def _overlap(values: list[dict]) -> bool:
    return max(v["start"] for v in values) < min(v["end"] for v in values)


def _by_key(executor: Executor, tasks: list[Task]) -> dict:
    return {o.key: o for o in executor.map(tasks)}


def _check_failures(executor: Executor, tmp_path: Path) -> None:
    tasks = [Task("once", die_once, (str(tmp_path / "marker"),)), Task("always", always_die),
             Task("raises", raise_value_error)]
    out = _by_key(executor, tasks)
    assert out["once"].ok and out["once"].value == "second try" and out["once"].attempts == 2, out["once"]
    assert not out["always"].ok and out["always"].attempts == 2, out["always"]
    assert out["always"].error.startswith("worker died twice"), out["always"].error
    assert not out["raises"].ok and out["raises"].attempts == 1
    assert out["raises"].error == "ValueError: bad shape 3x5 | second line"
    assert "raise_value_error" in out["raises"].traceback


def _check_artifacts(executor: Executor, tmp_path: Path) -> None:
    (outcome,) = executor.map([Task("report", write_report, (str(tmp_path / "worker"),))])
    assert outcome.ok and outcome.value == {"status": "ok"}
    assert set(outcome.artifacts) == {"verdict.json", "logs/build.log"}
    written = outcome.write_artifacts(tmp_path / "driver")
    assert sorted(p.relative_to(tmp_path / "driver").as_posix() for p in written) == ["logs/build.log", "verdict.json"]
    assert (tmp_path / "driver" / "logs" / "build.log").read_bytes() == b"nvcc \x00 done"


# ---- local pool ----

@pytest.fixture(scope="module")
def local():
    with LocalExecutor(cpus=2, gpus=2) as executor:
        yield executor


def test_local_gpu_tasks_get_their_own_device_and_run_beside_cpu_tasks(local):
    assert isinstance(local, Executor) and local.gpus == 2
    tasks = [Task(f"gpu{i}", fake_eval, (1.0,), "gpu") for i in range(2)]
    tasks += [Task(f"cpu{i}", fake_eval, (1.0,)) for i in range(2)]
    out = _by_key(local, tasks)
    assert all(o.ok and o.attempts == 1 for o in out.values()), out
    gpu = [out["gpu0"].value, out["gpu1"].value]
    assert {v["cvd"] for v in gpu} == {"0", "1"} and _overlap(gpu)
    assert {out["gpu0"].where[-4:], out["gpu1"].where[-4:]} == {"gpu0", "gpu1"}
    cpu = [out["cpu0"].value, out["cpu1"].value]
    assert _overlap(cpu) and len({v["pid"] for v in cpu + gpu}) == 4
    # each GPU worker's builds get an equal share of the host's cores; a CPU worker's are left as they were
    share = str(max(1, default_cpus() // 2))
    assert [v["build_jobs"] for v in gpu] == [share, share]
    assert {v["build_jobs"] for v in cpu} == {os.environ.get("ASTRA_BUILD_JOBS")}


def test_local_worker_death_is_retried_once_and_exceptions_are_results(local, tmp_path):
    _check_failures(local, tmp_path)
    (again,) = local.map([Task("after", fake_eval, (0.0,))])  # the pool still works
    assert again.ok


def test_local_death_reason_names_the_signal(local):
    (out,) = local.map([Task("killed", always_die, (), "gpu")])
    assert out.error == "worker died twice: exit code -9 (SIGKILL), then exit code -9 (SIGKILL)"


def test_local_artifacts_come_back(local, tmp_path):
    _check_artifacts(local, tmp_path)


def test_local_refuses_what_it_cannot_run(local):
    with pytest.raises(BadInput, match="share the key"):
        local.map([Task("a", fake_eval, (0,)), Task("a", fake_eval, (0,))])
    with pytest.raises(NoGpu):
        LocalExecutor(cpus=1, gpus=0).map([Task("g", fake_eval, (0,), "gpu")])
    with pytest.raises(BadInput, match="kind"):
        Task("x", fake_eval, kind="tpu")
    (out,) = local.map([Task("lambda", lambda: 1)])
    assert not out.ok and out.attempts == 0 and out.error.startswith("task is not picklable")


def test_local_stopping_early_ends_the_running_tasks(local):
    start = time.monotonic()
    for outcome in local.map([Task("fast", fake_eval, (0.0,)), Task("slow", fake_eval, (60.0,))]):
        assert outcome.key == "fast"
        break
    (after,) = local.map([Task("next", fake_eval, (0.0,))])
    assert after.ok and time.monotonic() - start < 20


def test_gpu_slots_follow_the_visible_devices(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5")
    assert gpu_devices(2) == ["4", "5"] and gpu_devices(1) == ["4"]
    with pytest.raises(BadInput, match="names 2"):
        gpu_devices(3)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert gpu_devices(2) == ["0", "1"]


def test_artifact_paths_stay_inside_the_folder(tmp_path):
    for bad in ("../escape", "/etc/passwd", ""):
        with pytest.raises(BadInput):
            write_files({bad: b"x"}, tmp_path)
    assert not (tmp_path.parent / "escape").exists()


def test_ray_missing_is_an_astra_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now raises ImportError
    with pytest.raises(ToolMissing, match=r"pip install 'astra\[ray\]'"):
        make_executor(ray="auto")


# ---- Ray's local cluster, started on CPU with two declared (fake) GPUs ----

@pytest.fixture(scope="module")
def ray_executor():
    ray = pytest.importorskip("ray")
    if ray.is_initialized():
        ray.shutdown()
    ray.init(num_cpus=2, num_gpus=2, include_dashboard=False, logging_level="WARNING")
    # ship this module's task functions by value: Ray workers need not find tests/ on their path
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    try:
        executor = make_executor(ray="auto")  # reuses the session above and leaves it open on close
        yield executor
        executor.close()
        assert ray.is_initialized()
    finally:
        ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
        ray.shutdown()


def test_ray_gpu_tasks_get_distinct_devices_and_cpu_tasks_run_in_parallel(ray_executor):
    out = _by_key(ray_executor, [Task(f"gpu{i}", fake_eval, (1.5,), "gpu") for i in range(2)])
    gpu = [o.value for o in out.values()]
    assert all(o.ok and o.attempts == 1 for o in out.values()), out
    assert {v["cvd"] for v in gpu} == {"0", "1"} and _overlap(gpu)
    out = _by_key(ray_executor, [Task(f"cpu{i}", fake_eval, (1.5,)) for i in range(2)])
    cpu = [o.value for o in out.values()]
    assert all(o.ok for o in out.values()) and _overlap(cpu) and cpu[0]["pid"] != cpu[1]["pid"]


def test_ray_worker_death_is_retried_once_and_exceptions_are_results(ray_executor, tmp_path):
    _check_failures(ray_executor, tmp_path)


def test_ray_artifacts_come_back(ray_executor, tmp_path):
    _check_artifacts(ray_executor, tmp_path)
