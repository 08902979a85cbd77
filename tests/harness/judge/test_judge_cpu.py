"""The judge and its candidate process, end to end on the CPU: a host-only kernel of our own (y = x * alpha,
looping on CPU tensors) built with nvcc, judged by `harness.judge.evaluate.evaluate(job, device="cpu")`, which
runs the candidate only in a separate, scrubbed process and reads its raw outputs back. Also the raw
output reader's validation (harness.candidate.exchange) on its own."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
import torch

import harness.judge.evaluate as judge
from harness.candidate.exchange import (
    GO,
    CaseWriter,
    Malformed,
    case_dir,
    read_manifest,
    read_trial,
    tensor_file,
    write_json_atomic,
)
from harness.candidate.process import module_paths
from harness.job import ArgSpec, BuildBase, Case, Job, Options, Variant
from harness.sandbox import Confinement
from tests.toolchain import needs_nvcc

KERNEL = r"""
#include <tvm/ffi/container/tensor.h>
#include <cstdint>
#include <cstdlib>

namespace toy {
struct Scale {
  static void run(tvm::ffi::TensorView y, tvm::ffi::TensorView x, double alpha) {
    const int64_t n = x.numel();
    float* out = static_cast<float*>(y.data_ptr());
    float* in = static_cast<float*>(x.data_ptr());
    for (int64_t i = 0; i < n; ++i) out[i] = in[i] * static_cast<float>(alpha);  // BODY
  }
};
}  // namespace toy
"""



def _case(tokens: int = 4, hidden: int = 32) -> Case:
    return Case(id=f"toy/float32/tokens={tokens}", band="decode", label="toy", dtype="float32",
                dims={"tokens": tokens, "hidden": hidden}, variant="v", bytes=2 * tokens * hidden * 4, timed=False,
                args=[ArgSpec("y", "tensor", "out", [tokens, hidden], "float32"),
                      ArgSpec("x", "tensor", "in", [tokens, hidden], "float32"),
                      ArgSpec("alpha", "scalar", "in", [], "float32", value=0.5)])


# ---------------------------------------------------------------- the raw output reader


def _written(tmp_path: Path) -> tuple[Path, Case, list]:
    case = _case()
    trials = [("seed", 0), ("large", 1000)]
    writer = CaseWriter(tmp_path, 0, case)
    for kind, seed in trials:
        args = {"y": torch.full((4, 32), float(seed)), "x": torch.ones(4, 32), "alpha": 0.5}
        writer.add_trial(kind, seed, None, args)
    writer.finish(["a" * 64, "a" * 64])
    return case_dir(tmp_path, 0), case, trials


def test_raw_outputs_round_trip(tmp_path):
    directory, case, trials = _written(tmp_path)
    assert not list(tmp_path.glob(".tmp-*"))  # renamed into place complete
    manifest = read_manifest(directory, case, trials)
    out = read_trial(directory, 1, manifest["trials"][1], case, torch.device("cpu"))
    assert torch.equal(out["y"], torch.full((4, 32), 1000.0)) and out["x"].dtype == torch.float32


@pytest.mark.parametrize("tamper, message", [
    (lambda d, m: (d / tensor_file(0, 0)).write_bytes(b"\0" * 12), "holds 12 bytes"),
    (lambda d, m: m["trials"][0]["tensors"]["y"].update(dtype="float16"), "dtype float16"),
    (lambda d, m: m["trials"][0]["tensors"]["y"].update(shape=[32, 4]), "shape [32, 4]"),
    (lambda d, m: m["trials"][0]["tensors"].pop("x"), "are not the case's"),
    (lambda d, m: (d / tensor_file(0, 0)).unlink(), "holds -1 bytes"),
])
def test_raw_output_reader_rejects_what_does_not_match_the_job(tmp_path, tamper, message):
    directory, case, trials = _written(tmp_path)
    manifest = json.loads((directory / "manifest.json").read_text())
    tamper(directory, manifest)
    (directory / "manifest.json").write_text(json.dumps(manifest))
    entry = read_manifest(directory, case, trials)["trials"][0]
    with pytest.raises(Malformed, match=message.replace("[", r"\[").replace("]", r"\]")):
        read_trial(directory, 0, entry, case, torch.device("cpu"))


@pytest.mark.parametrize("shared", [{"handle": "ab" * 64, "offset": 0}, {"handle": "zz", "offset": 0}, "x"])
def test_outputs_named_on_the_gpu_are_refused_where_a_file_is_expected(tmp_path, shared):
    directory, case, trials = _written(tmp_path)
    manifest = json.loads((directory / "manifest.json").read_text())
    manifest["trials"][0]["tensors"]["y"]["ipc"] = shared
    (directory / "manifest.json").write_text(json.dumps(manifest))
    entry = read_manifest(directory, case, trials)["trials"][0]
    with pytest.raises(Malformed, match="shared on the GPU"):  # no CUDA IPC on the CPU, whatever the entry says
        read_trial(directory, 0, entry, case, torch.device("cpu"))


def test_a_writer_keeps_its_tensors_until_the_judge_deletes_the_case(tmp_path):
    directory, case, trials = _written(tmp_path)
    writer = CaseWriter(tmp_path, 1, case, ipc=True)
    writer.add_trial("seed", 0, None, {"y": torch.zeros(4, 32), "x": torch.ones(4, 32), "alpha": 0.5})
    assert (writer.tmp / tensor_file(0, 0)).is_file()  # CPU tensors are never shared: a file, as before
    assert not writer.released()
    writer.finish(None)
    assert not writer.released()
    import shutil

    shutil.rmtree(case_dir(tmp_path, 1))
    assert writer.released()


def test_manifest_must_follow_the_judges_trials(tmp_path):
    directory, case, trials = _written(tmp_path)
    with pytest.raises(Malformed, match="trial list"):
        read_manifest(directory, case, trials[:1])
    with pytest.raises(Malformed, match="another case"):
        read_manifest(directory, _case(tokens=8), trials)


# ---------------------------------------------------------------- the judge end to end (nvcc, no GPU)



@pytest.fixture(scope="module")
def source_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("toy_cpu_src")
    (root / "toy.cuh").write_text(KERNEL)
    return root


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("toy_cpu_builds")


@pytest.fixture(autouse=True)
def no_scan(monkeypatch):
    """The static scan is tested on its own: here the candidates must reach the candidate process."""
    monkeypatch.setattr(judge, "scan", lambda job: None)
    monkeypatch.setattr("harness.scan.elf_scan.scan_shared_object", lambda orig, cand: None)


def _job(root: Path, cache: Path, candidate: str | None = None, **options) -> Job:
    return Job(name="toy_cpu", entry="scale", kernel_file="toy.cuh",
               build=BuildBase(source_root=str(root), include_dirs=[], cuda_files=["toy.cuh"]),
               variants={"v": Variant("v", [["scale", "toy::Scale::run"]])}, cases=[_case(), _case(tokens=3)],
               tolerance={"float32": {"atol": 1e-6, "rtol": 1e-6, "floor": 1e-6}}, candidate_source=candidate,
               options=Options(cache_dir=str(cache), seeds=[0, 1], modes=[], **options))


def _mutate(old: str, new: str) -> str:
    assert old in KERNEL
    return KERNEL.replace(old, new)


@needs_nvcc
def test_self_check_is_correct(source_root, cache):
    verdict = judge.evaluate(_job(source_root, cache), device="cpu")
    assert verdict.status == "correct", verdict.reason
    assert all(c.trials == 5 for c in verdict.cases)  # two seeds, large, small, extreme
    assert all(c.deterministic_orig and c.deterministic_cand for c in verdict.cases)
    assert verdict.signatures["v"]["scale"]["orig"] == verdict.signatures["v"]["scale"]["cand"]
    assert verdict.phases["outputs_process_beside_build"] == 1.0  # its start overlapped the build


@needs_nvcc
def test_a_build_cache_holding_the_exchange_starts_the_process_after_the_build(source_root, cache, monkeypatch):
    """The sandbox lets no process read a directory holding its writable ones: the process then starts late."""
    monkeypatch.setattr(judge, "exchange_base", lambda: str(cache / "exchange"))
    verdict = judge.evaluate(_job(source_root, cache), device="cpu")
    assert verdict.status == "correct", verdict.reason
    assert verdict.phases["outputs_process_beside_build"] == 0.0


def test_a_process_started_beside_the_build_waits_for_its_modules(tmp_path):
    modules, control = tmp_path / "builds", tmp_path / "control"
    modules.mkdir()
    control.mkdir()
    request = {"cand_so": None, "modules_dir": str(modules), "control": str(control)}
    box = Confinement("off", writable=[tmp_path / "home"], readable=[modules, control])
    go = {"cand_so": {"v": str(modules / "key" / "toy.so")}}
    timer = threading.Timer(0.2, lambda: write_json_atomic(control / GO, go))
    timer.start()
    assert module_paths(request, box) == go["cand_so"]  # waited for the judge's go
    assert box.readable == [modules / "key" / "toy.so"]  # the seal's list: the module alone
    write_json_atomic(control / GO, {"cand_so": {"v": str(tmp_path / "elsewhere.so")}})
    with pytest.raises(SystemExit, match="not in the modules' directory"):
        module_paths(request, box)


@needs_nvcc
def test_wrong_values_and_a_scribbled_input_are_caught_from_raw_outputs(source_root, cache):
    wrong = judge.evaluate(_job(source_root, cache, _mutate("* static_cast<float>(alpha)", "* 0.51f")), device="cpu")
    assert wrong.status == "incorrect" and "y" in wrong.reason
    scribble = _mutate("// BODY", "\n    if (n > 0) in[0] = 7.0f;")
    verdict = judge.evaluate(_job(source_root, cache, scribble), device="cpu")
    assert verdict.status == "incorrect" and "read-only argument x" in verdict.reason
    paths, _, failure = judge.build_all(_job(source_root, cache, scribble), cache)
    assert failure is None and paths[("cand", "v")] != paths[("orig", "v")]
    mapped = Path("/proc/self/maps").read_text()
    assert paths[("orig", "v")] in mapped and paths[("cand", "v")] not in mapped  # the judge never loaded it


@needs_nvcc
def test_small_magnitude_trial_catches_a_changed_clamp(source_root, cache):
    clamp = _mutate("out[i] = in[i] * static_cast<float>(alpha);",
                    "out[i] = (in[i] > -1e-5f && in[i] < 1e-5f ? 0.0f : in[i]) * static_cast<float>(alpha);")
    verdict = judge.evaluate(_job(source_root, cache, clamp), device="cpu")
    assert verdict.status == "incorrect" and "(small)" in verdict.reason, verdict.reason


@needs_nvcc
def test_candidate_process_gets_no_secrets(source_root, cache, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    monkeypatch.setenv("ASTRA_API_KEY", "astra-test")
    spy = _mutate("namespace toy {", "namespace toy {\nstatic const int leak = [] { if (std::getenv(\"OPENAI_API_KEY\") "
                  "|| std::getenv(\"ASTRA_API_KEY\")) std::abort(); return 0; }();")
    verdict = judge.evaluate(_job(source_root, cache, spy), device="cpu")
    assert verdict.status == "correct", verdict.reason


@needs_nvcc
def test_candidate_crash_and_hang_are_verdicts(source_root, cache, monkeypatch):
    crash = _mutate("// BODY", "\n    if (n == 96) *static_cast<volatile int*>(nullptr) = 1;")
    verdict = judge.evaluate(_job(source_root, cache, crash), device="cpu")
    assert verdict.status == "crashed" and "SIGSEGV" in verdict.reason, verdict.reason
    monkeypatch.setattr(judge, "FIRST_CASE_EXTRA_S", 0.0)
    hang = _mutate("// BODY", "\n    static volatile int spin = 0;\n    while (n == 96) spin = spin + 1;")
    verdict = judge.evaluate(_job(source_root, cache, hang, case_timeout_s=3.0), device="cpu")
    assert verdict.status == "timeout" and "toy/float32/tokens=3" in verdict.reason, verdict.reason


@needs_nvcc
def test_fail_closed_statuses(source_root, cache, tmp_path):
    broken = tmp_path / "reference.py"
    broken.write_text("raise ImportError('no such module: numpy2')\n")
    job = _job(source_root, cache)
    job.reference = str(broken)
    assert judge.evaluate(job, device="cpu").status == "reference_error"
    raising = tmp_path / "raising.py"
    raising.write_text("def reference(args, dims):\n    raise ValueError('bad dims')\n")
    job.reference = str(raising)
    verdict = judge.evaluate(job, device="cpu")
    assert verdict.status == "reference_error" and "bad dims" in verdict.reason, verdict.reason
    original = tmp_path / "orig"
    original.mkdir()
    (original / "toy.cuh").write_text(_mutate("// BODY", "\n    if (n == 96) throw std::runtime_error(\"no\");"))
    verdict = judge.evaluate(_job(original, cache), device="cpu")
    assert verdict.status == "original_failed" and "original raised" in verdict.reason, verdict.reason
    (original / "toy.cuh").write_text("this is not C++\n")
    assert judge.evaluate(_job(original, cache), device="cpu").status == "original_failed"


def test_disk_full_build_is_an_environment_error(monkeypatch, tmp_path):
    from harness.building.nvcc_build import BuildResult

    def full(requests, cache_dir, **kwargs):
        return [BuildResult(ok=False, so_path=None, cache_hit=False, seconds=0.0, command=[], log="", resources=[],
                            key="", error="fatal error: cannot write: No space left on device") for _ in requests]
    monkeypatch.setattr(judge, "build_many", full)
    verdict = judge.evaluate(_job(tmp_path, tmp_path, "// candidate\n"), device="cpu")
    assert verdict.status == "environment_error" and "disk is full" in verdict.reason


def test_rejected_source_comes_first(monkeypatch, tmp_path):
    monkeypatch.setattr(judge, "scan", lambda job: "line 3: PyRun_SimpleString is not allowed")
    monkeypatch.setattr(judge, "build_many", lambda *a, **k: pytest.fail("built a rejected source"))
    verdict = judge.evaluate(_job(tmp_path, tmp_path, "// candidate\n"), device="cpu")
    assert verdict.status == "rejected_source" and "PyRun_SimpleString" in verdict.reason


# ---------------------------------------------------------------- untrusted timings


def test_untrusted_timings_are_validated_by_the_judge():
    from harness.judge.timings import apply_mode
    from harness.judge.verdict import CaseResult
    from harness.timing.perf_model import PerfModel

    model = PerfModel(read_Bps=2.9e12, write_Bps=2.8e12, copy_Bps=2.7e12, launch_graph_us=0.8, launch_cold_us=2.5,
                      peak_dram_Bps=3.0e12, l2_bytes=1 << 18)
    env = {"perf_model": model.to_dict(), "copy_bandwidth_Bps": 2.7e12, "launch_floor_us": 0.8}

    def fresh() -> CaseResult:
        return CaseResult(id="c", band="decode", label="t", dtype="float32", dims={}, timed=True, bytes=3_000_000)

    good = {"median_us": 10.0, "p10_us": 9.0, "p90_us": 11.0, "n": 20, "rel_stderr": 0.01}
    result = fresh()
    assert apply_mode(result, "graph", {"orig": good, "cand": {**good, "median_us": 5.0, "p10_us": 4.0}}, env) is None
    assert result.timings["graph"].speedup == pytest.approx(2.0) and "graph" in result.roofline
    assert result.suspect == []  # 5 us for 3 MB at 3 TB/s (a 1 us floor less what L2 may keep) is plausible
    assert result.floors["graph"]["orig_us"] == 10.0 and result.floors["graph"]["cand_us"] == 5.0
    result = fresh()
    apply_mode(result, "graph", {"orig": good, "cand": {**good, "median_us": 0.5, "p10_us": 0.4}}, env)
    assert result.suspect and "physical floor" in result.suspect[0]  # computed by the judge, not the candidate
    assert "3.00 TB/s" in result.suspect[0] and "3000000 bytes" in result.suspect[0]
    for bad in ({**good, "median_us": -1.0}, {**good, "median_us": float("nan")}, {**good, "p10_us": 99.0},
                {**good, "n": 0}, "fast", {**good, "extra": 1}):
        why = apply_mode(fresh(), "cold", {"orig": good, "cand": bad}, env)
        assert why and why.startswith("c: cold"), bad
    assert "out of memory" in apply_mode(fresh(), "cold", {"error": "CUDA out of memory", "kind": "oom"}, env)
    assert "no timing" in apply_mode(fresh(), "cold", None, env)
    result = fresh()
    assert apply_mode(result, "graph", {"error": "cand: capture failed", "kind": "capture", "side": "cand"}, env) is None
    assert not result.correct
    assert apply_mode(fresh(), "graph", {"error": "orig: capture failed", "kind": "capture", "side": "orig"}, env)


REFERENCE_EXTRA = '''
import torch

def reference(args, dims):
    y = args["x"] * 0.5
    return {"y": y, "stats": torch.stack([y, y, y, y])}  # more than the outputs: 4 x y beside it
'''

REFERENCE_RAISES_ON_3_TOKENS = '''
def reference(args, dims):
    if dims["tokens"] == 3:
        raise ValueError("no reference for 3 tokens")
    return {"y": args["x"] * 0.5}
'''


@needs_nvcc
def test_the_trials_beside_the_build_keep_within_the_budget_what_they_hold(source_root, cache, tmp_path):
    """A reference may return more than the outputs: a trial is kept only where what it holds fits, whatever
    its case's bound said; a reference that raises ends the work there (phase `outputs` meets it again)."""
    from harness.judge.original_beside_build import prepare, trial_bytes

    job = _job(source_root, cache)
    judge.build_all(job, cache)  # the original built, as for every check of a run after its first
    trials = judge._trials(job)
    room = sum(trial_bytes(case) * len(trials[i]) for i, case in enumerate(job.cases))
    (tmp_path / "extra.py").write_text(REFERENCE_EXTRA)
    job.reference = str(tmp_path / "extra.py")
    prepared = prepare(job, torch.device("cpu"), lambda: True, trials, judge._launch, room)
    assert 0 < len(prepared) < sum(len(t) for t in trials) and prepared.kept_bytes <= room
    (tmp_path / "plain.py").write_text(REFERENCE_EXTRA.replace(', "stats": torch.stack([y, y, y, y])', ""))
    job.reference = str(tmp_path / "plain.py")
    prepared = prepare(job, torch.device("cpu"), lambda: True, trials, judge._launch, room)
    assert len(prepared) == sum(len(t) for t in trials)  # the bound holds for what a reference should return
    for index, case_trials in enumerate(trials):
        for t in range(len(case_trials)):
            assert prepared.take(index, t) is not None
    prepared.release_when_taken()
    assert prepared.kept_bytes == 0
    (tmp_path / "raises.py").write_text(REFERENCE_RAISES_ON_3_TOKENS)
    job.reference = str(tmp_path / "raises.py")
    prepared = prepare(job, torch.device("cpu"), lambda: True, trials, judge._launch, room)
    assert len(prepared) == len(trials[0])  # the second case (3 tokens) stopped it
