"""CPU half of the adversarial suite: every candidate compiles with nvcc (except the one that must not),
and the drop-in checks that need no GPU (build_failed, missing_export, signature_mismatch) give the
expected status through `harness.judge.evaluate.evaluate` on the CPU."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from rowscale_job import (
    BASE_ROOT,
    BASES,
    CANDIDATES,
    CPP_TYPE,
    SCAN_EVADING,
    base_of,
    candidate_text,
    rowscale_cases,
    rowscale_job,
    tvm_ffi_include_dirs,
)

from harness.building.module_loading import export_signatures, load_module
from harness.building.nvcc_build import BuildRequest, build_many
from harness.scan.elf_scan import elf_tools_available, scan_shared_object
from harness.scan.source_scan import scan_candidate
from tests.toolchain import needs_nvcc

pytestmark = needs_nvcc
BY_NAME = {expect.name: expect for expect in CANDIDATES}


def exports(base: str = "rowscale") -> list[tuple[str, str]]:
    """Both dtypes' exports of a base's module: (export name, entry)."""
    spec = BASES[base]
    return [(f"{spec.export}_{CPP_TYPE[dtype]}", f"{spec.struct}<{CPP_TYPE[dtype]}>::run") for dtype in CPP_TYPE]


EXPORTS = exports()


def cache_dir() -> Path:
    """The test build cache (content-keyed, so it is safe to keep between runs)."""
    return Path(os.environ["ASTRA_HOME"]) / "builds"


def request(name: str | None, base: str | None = None) -> BuildRequest:
    """One module with both dtypes' exports, for an original (None: `base`, default "rowscale") or a candidate
    (against its own base)."""
    spec = BASES[base or base_of(name)]
    overrides = {} if name is None else {spec.kernel_file: candidate_text(name)}
    return BuildRequest(name=f"adv_{name or 'base_' + spec.export}", source_root=str(BASE_ROOT),
                        include_dirs=tvm_ffi_include_dirs(), cuda_files=[spec.kernel_file],
                        cuda_wrappers=exports(base or base_of(name)), arch="90a", overrides=overrides)


@pytest.fixture(scope="module")
def builds() -> dict:
    """Every candidate and every original (key None: rowscale; "base:<name>" for each base), built in parallel
    once for the module."""
    names = [None, *BY_NAME]
    extra = [base for base in BASES if base != "rowscale"]
    results = build_many([request(name) for name in names] + [request(None, base) for base in extra], cache_dir())
    built = dict(zip(names, results))
    built.update({f"base:{base}": result for base, result in zip(extra, results[len(names):])})
    return built


def base_build(builds: dict, name: str):
    """The build of the original `name` replaces."""
    base = base_of(name)
    return builds[None] if base == "rowscale" else builds[f"base:{base}"]


@pytest.mark.parametrize("name", list(BY_NAME))
def test_candidate_compiles_or_not(builds, name):
    result = builds[name]
    if BY_NAME[name].compiles:
        assert result.ok, result.error
    else:
        assert not result.ok
        assert "error" in (result.error or ""), result.error


def test_original_compiles_and_exports_both_dtypes(builds):
    assert builds[None].ok, builds[None].error
    signatures = export_signatures(load_module(builds[None].so_path), [e for e, _ in EXPORTS])
    assert all(sig and sig.count("DLTensor*") == 3 for sig in signatures.values()), signatures
    in_place = builds["base:rowscale_inplace"]
    assert in_place.ok, in_place.error
    signatures = export_signatures(load_module(in_place.so_path), [e for e, _ in exports("rowscale_inplace")])
    assert all(sig and sig.count("DLTensor*") == 2 for sig in signatures.values()), signatures


def test_extra_parameter_changes_the_signature(builds):
    names = [e for e, _ in EXPORTS]
    base = export_signatures(load_module(builds[None].so_path), names)
    cand = export_signatures(load_module(builds["h_extra_param"].so_path), names)
    assert all(cand[n] and cand[n] != base[n] for n in names), (base, cand)


def test_renamed_export_lacks_the_expected_name(builds):
    module = load_module(builds["i_renamed_export"].so_path)
    signatures = export_signatures(module, [e for e, _ in EXPORTS] + [f"{e}_v2" for e, _ in EXPORTS])
    assert [signatures[e] for e, _ in EXPORTS] == [None, None]
    assert all(signatures[f"{e}_v2"] for e, _ in EXPORTS)


@pytest.mark.parametrize("name", ["h_extra_param", "i_renamed_export", "j_compile_error"])
def test_drop_in_failures_are_verdicts_without_a_gpu(name):
    """These are decided before any kernel runs, so `evaluate` reaches them on the CPU too."""
    from harness.judge.evaluate import evaluate

    job = rowscale_job(name, cases=rowscale_cases(tokens=(1,), widths=(256,), dtypes=("bfloat16",)))
    verdict = evaluate(job, device="cpu")
    assert verdict.status in BY_NAME[name].statuses, verdict.reason
    assert verdict.reason.strip() and not verdict.correct


def test_job_round_trips_through_json():
    from harness.job import Job

    job = rowscale_job("m_vectorized")
    assert Job.from_json(job.to_json()) == job
    assert {case.variant for case in job.cases} == set(job.variants)
    assert job.candidate_source == candidate_text("m_vectorized")


SOURCE_REJECTED = [e.name for e in CANDIDATES if e.statuses == ("rejected_source",)]


@pytest.mark.parametrize("name", [e.name for e in CANDIDATES])
def test_static_scan_rejects_exactly_the_source_attacks(name):
    """rejected_source candidates are named by the text scan; every other candidate (including the
    scan-evading one, by design) passes it."""
    reason = scan_candidate((BASE_ROOT / BASES[base_of(name)].kernel_file).read_text(), candidate_text(name))
    if name in SOURCE_REJECTED:
        assert reason and reason.startswith("line ") and "\n" not in reason, reason
    else:
        assert reason is None, reason


@pytest.mark.skipif(not elf_tools_available(), reason="needs binutils (nm or readelf)")
@pytest.mark.parametrize("name", [e.name for e in CANDIDATES if e.compiles])
def test_shared_object_backstop_on_candidates(builds, name):
    """Every source attack also shows in the built module (a new dangerous import or a larger .init_array);
    the scan-evading candidate shows in neither, which is the point of it."""
    reason = scan_shared_object(base_build(builds, name).so_path, builds[name].so_path)
    if name in SOURCE_REJECTED:
        assert reason, name
    else:
        assert reason is None, reason


@pytest.mark.parametrize("name", SCAN_EVADING)
def test_scan_evading_candidate_takes_over_any_python_process_that_loads_it(builds, name):
    """Why the judge must never load candidate code: loading the module (no kernel launched, no GPU needed)
    runs its payload, which patches json.dumps in the loading process to report "correct". Run in a
    throwaway subprocess."""
    probe = ("import json, sys\nfrom harness.building.module_loading import load_module\nload_module(sys.argv[1])\n"
             "print(json.dumps({'status': 'incorrect'}))")
    done = subprocess.run([sys.executable, "-c", probe, builds[name].so_path], capture_output=True, text=True,
                          timeout=120, cwd=Path(__file__).resolve().parents[2])
    if done.returncode != 0:
        pytest.skip(f"the module does not load on this machine: {done.stderr[-500:]}")
    assert '"status": "correct"' in done.stdout, done.stdout
