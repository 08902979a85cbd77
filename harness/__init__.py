"""GPU side of Astra: build, check and time one candidate kernel (stdlib, torch, tvm_ffi, pyseccomp only).

One job runs in a JUDGE process (`python -m harness run`, started by `run_job`) that never loads
candidate code; the candidate runs only in a scrubbed CANDIDATE process the judge starts, which hands
back raw outputs and timings that the judge validates. The verdict is signed with a key only the
judge holds (docs/threat-model.md). Every process that loads candidate code closes itself in with the
OS sandbox of harness.sandbox (Landlock + seccomp) before it loads anything.

The public API, which `astra` uses instead of reaching into the modules (importing it needs no torch):

    Job, Options, Case, ArgSpec, Variant, BuildBase, band_of, BANDS   the job a worker takes (harness.job)
    Verdict, CaseResult, ModeTiming, STATUSES                          what comes back (harness.judge.verdict)
    run_job, verify_job                                                one job, one isolated worker
    build_requests, BuildRequest, BuildResult, build, build_many       a job's builds, nvcc as SGLang
    verified_faster, improves_on, score, Decision, policy_text         the one acceptance rule
    geomean, format_table, BuildFailure, nvcc_path, tvm_ffi_version, default_arch
"""

from harness.building.job_requests import build_requests
from harness.building.nvcc_build import BuildRequest, BuildResult, build, build_many
from harness.building.ptxas import format_table
from harness.building.toolchain import BuildFailure, default_arch, nvcc_path, tvm_ffi_version
from harness.job import BANDS, TIMING_MODES, ArgSpec, BuildBase, Case, Job, Options, Variant, band_of
from harness.judge.acceptance import Decision, improves_on, policy_text, score, verified_faster
from harness.judge.verdict import STATUSES, CaseResult, ModeTiming, Verdict
from harness.timing.stats import geomean
from harness.worker.judge_process import run_job, verify_job

__all__ = [
    "BANDS", "ArgSpec", "BuildBase", "BuildFailure", "BuildRequest", "BuildResult", "Case", "CaseResult",
    "Decision", "Job", "ModeTiming", "Options", "STATUSES", "TIMING_MODES", "Variant", "Verdict", "band_of", "build",
    "build_many", "build_requests", "default_arch", "format_table", "geomean", "improves_on", "nvcc_path",
    "policy_text", "run_job", "score", "tvm_ffi_version", "verified_faster", "verify_job",
]
