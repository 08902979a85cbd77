"""The judge's builds, started before torch loads.

The judge process (`python -m harness run`) spends seconds importing torch before it builds, and nvcc needs
no torch. So `cmd_run` starts the job's builds first, in a thread of that process (`start`), and imports the
evaluation afterwards; the evaluation's build step then takes the thread's results (`take`) instead of building
again, and a build that failed is not repeated. What the evaluation decides before building is decided first
here too: where the OS sandbox is wanted and unavailable nothing is built, and a source the static scan
rejects is never given to nvcc. Nothing is loaded here, only built, into the same cache.

This module also holds the parts of the judge's build step that need no torch: the build cache's place
(`default_cache_dir`), the original's text (`original_source`) and the static scan (`scan`).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from harness.building.job_requests import build_requests
from harness.building.nvcc_build import BuildResult, build_jobs, build_many, cached
from harness.job import Job

PREPARE_WAIT_S = 5.0  # the longest the judge holds its torch import for the builds' planning (tenths of a second)


def default_cache_dir(job: Job) -> Path:
    """`job.options.cache_dir`, else $ASTRA_HOME/builds (ASTRA_HOME defaults to ~/.cache/astra)."""
    if job.options.cache_dir:
        return Path(job.options.cache_dir).expanduser()
    root = os.environ.get("ASTRA_HOME")
    return (Path(root).expanduser() if root else Path.home() / ".cache" / "astra") / "builds"


def cached_originals(job: Job) -> dict[str, BuildResult] | None:
    """The original's build of every variant the job uses, from the build cache and without building ({variant:
    result}); None where one is not built yet (a failed build is never cached)."""
    out = {}
    for side, key, request in build_requests(job):
        if side == "orig":
            result = cached(request, default_cache_dir(job))
            if result is None:
                return None
            out[key] = result
    return out


def original_source(job: Job) -> str:
    """The text of the file the candidate replaces ("" when it cannot be found: a new file)."""
    roots = [job.build.source_root, *job.build.include_dirs]
    for path in ([job.kernel_file] if os.path.isabs(job.kernel_file) else [os.path.join(r, job.kernel_file) for r in roots]):
        if os.path.isfile(path):
            return Path(path).read_text(errors="replace")
    return ""


def scan(job: Job) -> str | None:
    """The static scan's reason to reject the candidate's source, or None."""
    if job.candidate_source is None:
        return None
    from harness.scan.source_scan import scan_candidate

    return scan_candidate(original_source(job), job.candidate_source)


class _Early:
    """One job's builds in a thread: `results` once it ended (None: scanned out, or the build step raised);
    `prepared` is set once every build's own Python work is done (harness.building.nvcc_build.build's
    `prepared`: planned and overlaid, waiting on a lock or on its compilers) or the thread ended."""

    def __init__(self, job: Job) -> None:
        self.requests = [request for _, _, request in build_requests(job)]
        self.cache_dir = default_cache_dir(job)
        self.results: list[BuildResult] | None = None
        self.prepared = threading.Event()
        # the builds that start at once (build_many runs build_jobs() at a time): the rest wait for a compiler
        self._waiting, self._lock = min(len(self.requests), build_jobs()), threading.Lock()
        self.thread = threading.Thread(target=self._run, args=(job,), daemon=True, name="early-build")

    def _one_prepared(self) -> None:
        with self._lock:
            self._waiting -= 1
            if self._waiting <= 0:
                self.prepared.set()

    def _run(self, job: Job) -> None:
        from harness import sandbox

        try:  # what the evaluation decides before it builds: a sandbox it cannot have, a source the scan rejects
            if sandbox.decide(job.options.sandbox)[1] is None and scan(job) is None:
                self.results = build_many(self.requests, self.cache_dir, prepared=self._one_prepared)
        except Exception:  # the evaluation builds again and reports what fails, as it always has
            self.results = None
        finally:
            self.prepared.set()


_started: _Early | None = None


def start(job: Job, prepare_wait_s: float = PREPARE_WAIT_S) -> None:
    """Start `job`'s builds now (a job whose requests cannot even be planned is left to the evaluation), and
    return once their own Python work is done (at most `prepare_wait_s`): importing torch holds the
    interpreter for seconds, and a build thread planning beside it waited that long to start its compilers."""
    global _started
    try:
        early = _Early(job)
    except Exception:
        return
    _started = early
    early.thread.start()
    early.prepared.wait(prepare_wait_s)


def running() -> bool:
    """Whether the early builds are still going (nvcc at work, the GPU free for the judge's own measurements)."""
    early = _started
    return early is not None and early.thread.is_alive()


def take(requests: list, cache_dir: Path) -> list[BuildResult] | None:
    """The early builds' results, once they ended, when they were for exactly these requests into this
    cache; None: build now."""
    global _started
    early, _started = _started, None
    if early is None:
        return None
    early.thread.join()
    if early.results is None or early.cache_dir != Path(cache_dir) or early.requests != list(requests):
        return None
    return early.results
