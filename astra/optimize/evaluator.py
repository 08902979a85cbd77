"""The judge as the optimize loop and its agents see it: one `Evaluator` object, built once per run and
handed to the loop (`run_loop`) and to every agent's constructor that needs it.

What it offers:
- `verify(source, label, gpu=None)`: a candidate's verdict against the original, the run's way (the timed
  dtype only in a quick search; label "original": the baseline, the original timed against itself);
  `gpu` pins the worker to that GPU;
- `full(source, label)`: the full suite, whatever the run's way (a quick search's best must pass it);
- `screen(source, label, case_ids)`: a cheap look on those cases only (the offline search's rungs), where
  `screens` says it can (a GPU run);
- `prebuild(sources, case_ids, base)`: those sources' variants built at once, on every CPU core, into the
  cache the workers read; returns {source: why it need not be screened}: it builds to the base's machine
  code, or it failed to build (with nvcc's first error line);
- `gpus`: the host's GPU indices: the loop judges a round's candidates side by side, one per GPU;
- `timed_dtype`: the dtype the quick suite and the search's representative shapes use;
- `extra_shapes`: shapes added to the spec's suite (the LLM agent's testing role, `add_shapes`), judged
  from then on;
- `baseline_identity()`: what decides its verdict of the original (the key of a stored baseline,
  astra.optimize.baseline_store), or None when it cannot say (its baselines are then never stored).

`Evaluator` itself judges with the functions it is given (tests, a one-off loop); a run uses
`HarnessEvaluator` (each candidate in its own worker on a GPU) or `BuildOnlyEvaluator` (a dry run:
nvcc builds, nothing verified).
"""

from __future__ import annotations

import os
from typing import Callable, Sequence

from astra import paths
from astra.errors import AstraError
from astra.optimize.param_search import Prebuild, Screen
from astra.sglang.tree import SglangTree
from astra.spec import jobs
from astra.spec.model import KernelSpec
from astra.text import one_line
from astra.verify.runner import timeout_for
from harness import Job, Options, Verdict, build_many, run_job, verify_job

Judge = Callable[..., Verdict]  # (source, label[, gpu=i]) -> its verdict against the original


class Evaluator:
    """Judges candidates with the functions it is given: `verify` (and `full`, by default the same),
    `screen` and `prebuild` where given. Subclasses (`HarnessEvaluator`, `BuildOnlyEvaluator`) override
    the methods instead."""

    def __init__(self, verify: Judge | None = None, *, full: Judge | None = None, screen: Screen | None = None,
                 prebuild: Prebuild | None = None, gpus: Sequence[int] = (), timed_dtype: str | None = None,
                 identity: dict | None = None):
        self._verify, self._full, self._screen, self._prebuild = verify, full, screen, prebuild
        self._identity = identity
        self.gpus = list(gpus)
        self.timed_dtype = timed_dtype
        self.extra_shapes: list[dict] = []

    @property
    def screens(self) -> bool:
        """Whether `screen` can run (the offline agent searches the parameter space only then)."""
        return self._screen is not None

    def verify(self, source: str, label: str, *, gpu: int | None = None) -> Verdict:
        if self._verify is None:
            raise AstraError("this evaluator only screens; it cannot verify a candidate")
        return self._verify(source, label) if gpu is None else self._verify(source, label, gpu=gpu)

    def full(self, source: str, label: str) -> Verdict:
        return self._full(source, label) if self._full is not None else self.verify(source, label)

    def screen(self, source: str, label: str, cases: list[str]) -> Verdict:
        if self._screen is None:
            raise AstraError("this evaluator cannot screen (no GPU)")
        return self._screen(source, label, cases)

    def prebuild(self, sources: list[str], cases: list[str], base: str | None = None) -> dict[str, str]:
        return {} if self._prebuild is None else dict(self._prebuild(sources, cases, base) or {})

    def add_shapes(self, shapes: list[dict]) -> None:
        """Shapes every later judgement adds to the spec's suite."""
        self.extra_shapes.extend(shapes)

    def baseline_identity(self) -> dict | None:
        """What decides this evaluator's verdict of the original: the job it judges it with ("job") and the
        name of the GPU it runs on ("gpu"), as astra.optimize.baseline_store keys a stored baseline by;
        None when it cannot say (no GPU named): the baseline is then timed and never stored."""
        return None if self._identity is None else dict(self._identity)


def evaluation_options(kind: str, sanitizer: bool = True) -> Options:
    """The harness options of each kind of evaluation in a run:
    - "original": the baseline, timed without its outputs phase. The probe (or the review) already
      established that the original runs correctly and deterministically on these cases; its checks
      against itself took most of a baseline (on the H100, 36 of 45 s for channel_rmsnorm_finish_silu).
    - "screen": a point of the offline search on a rung's few shapes: one seed, no large/small/extreme
      trials, graph view only (the search ranks by the graph geomean), no sanitizer. A screened point is
      a guess; the survivors are verified in full like any candidate before they count.
    - "candidate": the full verification (every trial, both views, compute-sanitizer unless disabled)."""
    if kind == "original":
        return Options(sanitizer=False, outputs_checked=False)
    if kind == "screen":
        return Options(sanitizer=False, seeds=[0], extra_trials=False, modes=["graph"])
    if kind == "candidate":
        return Options(sanitizer=sanitizer)
    raise ValueError(f"unknown evaluation kind {kind!r}")


class HarnessEvaluator(Evaluator):
    """Each candidate in its own worker against the original (GPU). `quick`: the loop's verifications
    check the timed dtype only (fewer builds and checks); the run's best is then verified on the full
    suite before it counts."""

    def __init__(self, spec: KernelSpec, tree: SglangTree, *, sanitizer: bool = True, quick: bool = False,
                 sandbox: bool = True):
        super().__init__(gpus=visible_gpus(), timed_dtype=spec.dtypes[0])
        self.spec, self.tree, self.sanitizer, self.quick, self.sandbox = spec, tree, sanitizer, quick, sandbox
        self._variants: dict[str, str] | None = None  # case id -> the build variant it needs

    @property
    def screens(self) -> bool:
        return True

    def verify(self, source: str, label: str, *, gpu: int | None = None) -> Verdict:
        return self._judge(source, label, full=False, gpu=gpu)

    def full(self, source: str, label: str) -> Verdict:
        return self._judge(source, label, full=True)

    def screen(self, source: str, label: str, cases: list[str]) -> Verdict:
        """On those case ids only, without the sanitizer (the offline search's rungs)."""
        return self._judge(source, label, cases=cases)

    def baseline_identity(self) -> dict | None:
        """The original's job as `verify(..., "original")` builds it (astra.optimize.baseline_store.job_identity)
        and the name of CUDA device 0, the one the original's worker runs on; None without a GPU."""
        from astra.optimize.baseline_store import job_identity
        from astra.survey.bench import gpu_name

        gpu = gpu_name()
        return None if gpu is None else {"job": job_identity(self._job(None, "original")), "gpu": gpu}

    def _job(self, source: str | None, label: str, *, full: bool = False, cases: list[str] | None = None) -> Job:
        """The job `_judge` runs for `source` under `label` ("original": the original against itself)."""
        is_original = label == "original"
        kind = "original" if is_original else "screen" if cases is not None else "candidate"
        job = jobs.make_job(self.spec, self.tree, candidate_source=None if is_original else source, label=label,
                            options=evaluation_options(kind, self.sanitizer), extra_shapes=list(self.extra_shapes))
        job.options.sandbox = self.sandbox
        if self.quick and not full:
            job.cases = [c for c in job.cases if c.dtype == self.spec.dtypes[0]]
        if cases is not None:
            job.cases = [c for c in job.cases if c.id in set(cases)]
        return job

    def _judge(self, source: str, label: str, *, full: bool = False, cases: list[str] | None = None,
               gpu: int | None = None) -> Verdict:
        job = self._job(source, label, full=full, cases=cases)
        runner = run_job if label == "original" else verify_job
        env = None if gpu is None else {**os.environ, "CUDA_VISIBLE_DEVICES": str(gpu)}
        return runner(job, timeout_s=timeout_for(job), env=env)

    def prebuild(self, sources: list[str], cases: list[str], base: str | None = None) -> dict[str, str]:
        """Builds the candidate variants those sources (and the search's base) need on every CPU core into
        the cache the workers read, so a rung's builds run side by side instead of one per worker, and
        returns {source: why a worker need not screen it}: the compiler refused a variant ("build_failed: " and
        the first line of nvcc's errors; a full disk or a timed-out build is left to the worker, which builds
        again), or every built variant is the base's machine code (astra.optimize.machine_code): screening those
        could only measure x1.000. The base is built as a candidate too, so both sit in an overlay folder of the
        same length and their modules compare."""
        from astra.optimize.machine_code import code_digest
        from astra.optimize.param_search import BUILD_FAILED, SAME_CODE

        if self._variants is None:
            self._variants = {c.id: c.variant for c in jobs.make_job(self.spec, self.tree, label="screen").cases}
        wanted = {self._variants.get(c) for c in cases}
        every = [base, *sources] if base is not None else list(sources)
        owners, requests = [], []
        for i, source in enumerate(every):
            for side, key, req in jobs.spec_build_requests(self.spec, self.tree, candidate_source=source):
                if side == "cand" and key in wanted:
                    owners.append((i, key))
                    requests.append(req)
        digests: dict[int, dict[str, str | None]] = {}
        skipped: dict[str, str] = {}
        offset = 1 if base is not None else 0  # every[0] is the base when one is named
        for (i, key), result in zip(owners, build_many(requests, paths.sub("builds"))):
            digests.setdefault(i, {})[key] = code_digest(result.so_path) if result.ok and result.so_path else None
            if not result.ok and i >= offset and result.refused:
                # the line the worker's verdict would give (harness.judge.evaluate's build_failed reason)
                lines = (result.error or "").strip().splitlines()
                first = one_line(lines[0] if lines else "the build failed", 300)
                skipped.setdefault(every[i], f"{BUILD_FAILED}: {first}")
        if base is None or not digests.get(0):
            return skipped
        reference = digests[0]
        for i, found in digests.items():
            if i > 0 and found == reference and all(d is not None for d in found.values()):
                skipped.setdefault(every[i], SAME_CODE)
        return skipped


class BuildOnlyEvaluator(Evaluator):
    """No GPU: build each candidate with nvcc exactly as SGLang would (the same requests the worker
    builds, `jobs.spec_build_requests`); nothing is verified, nothing screened."""

    def __init__(self, spec: KernelSpec, tree: SglangTree):
        super().__init__()
        self.spec, self.tree = spec, tree

    def verify(self, source: str, label: str, *, gpu: int | None = None) -> Verdict:
        spec = self.spec
        requests = jobs.spec_build_requests(spec, self.tree, candidate_source=None if label == "original" else source)
        side = "orig" if label == "original" else "cand"
        chosen = [req for s, _, req in requests if s == side][:1]
        res = build_many(chosen, paths.sub("builds"))[0]
        regs = max((r.registers or 0 for r in res.resources), default=0)
        spills = sum(r.spills for r in res.resources)
        reason = (f"built in {res.seconds:.1f}s, max {regs} registers, {spills} B spills; not verified (no GPU)"
                  if res.ok else (res.error or "build failed").splitlines()[0])
        return Verdict(status="built" if res.ok else "build_failed", reason=reason, correct=False, faster=False,
                       name=spec.name, candidate_label=label,
                       builds=[{"side": side, "ok": res.ok, "error": res.error,
                                "resources": [r.__dict__ for r in res.resources]}])


def visible_gpus() -> list[int]:
    """Indices of this host's GPUs as CUDA numbers them (honouring CUDA_VISIBLE_DEVICES); [] without one."""
    from harness.environment.cuda_devices import device_count, torch_cuda

    count = device_count() if torch_cuda() else 0  # no torch import here: the judges run in their own processes
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible:
        ids = [v.strip() for v in visible.split(",") if v.strip()]
        return [int(v) for v in ids[:count] if v.isdigit()]
    return list(range(count))
