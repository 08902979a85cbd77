"""A job's build requests: the one path from a Job (a spec made concrete) to what nvcc builds.

Used by the worker (`harness.judge.evaluate`), by `astra build` and by `astra optimize --dry-run`, so the
flags, wrappers, include paths and overlay of a candidate are decided in one place.
"""

from __future__ import annotations

import re
import zlib

from harness.building.nvcc_build import BuildRequest
from harness.job import Job

SIDES = ("orig", "cand")


def _module_name(job: Job, variant: str, side: str) -> str:
    base = re.sub(r"[^A-Za-z0-9_]", "_", f"{job.name}_{variant}")[:80]
    return f"{base}_{zlib.crc32(variant.encode()):08x}_{side}"


def variants_used(job: Job) -> list[str]:
    """Variant keys the cases use, in first-use order."""
    return list(dict.fromkeys(case.variant for case in job.cases))


def build_requests(job: Job, *, arch: str | None = None) -> list[tuple[str, str, BuildRequest]]:
    """(side, variant, request) for the original and, when there is one, the candidate. `arch`
    overrides the job's target (e.g. "90a" to build for Hopper on a machine without a GPU)."""
    requests = []
    sides = SIDES if job.candidate_source is not None else ("orig",)
    for key in variants_used(job):
        variant = job.variants[key]
        for side in sides:
            overrides = {job.kernel_file: job.candidate_source} if side == "cand" else {}
            requests.append((side, key, BuildRequest(
                name=_module_name(job, key, side), source_root=job.build.source_root,
                include_dirs=list(job.build.include_dirs), cuda_files=list(job.build.cuda_files),
                cpp_files=list(job.build.cpp_files), cuda_wrappers=[tuple(w) for w in variant.cuda_wrappers],
                cpp_wrappers=[tuple(w) for w in variant.cpp_wrappers],
                extra_cuda_cflags=list(variant.extra_cuda_cflags), extra_cflags=list(job.build.extra_cflags),
                extra_ldflags=list(job.build.extra_ldflags), header_only=job.build.header_only,
                arch=arch or job.build.arch, overrides=overrides)))
    return requests
