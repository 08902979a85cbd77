"""How many builds run at once by default: the host's cores, or the share a GPU worker was given."""

import os

from harness.building.nvcc_build import BUILD_JOBS_ENV, build_jobs


def test_builds_at_once_follow_the_share_a_worker_was_given(monkeypatch):
    monkeypatch.setenv(BUILD_JOBS_ENV, "3")
    assert build_jobs() == 3
    for wrong in ("", "zero", "0", "-2"):
        monkeypatch.setenv(BUILD_JOBS_ENV, wrong)
        assert build_jobs() == (os.cpu_count() or 1)
    monkeypatch.delenv(BUILD_JOBS_ENV)
    assert build_jobs() == (os.cpu_count() or 1)
