"""A spec'd kernel on the GPU: `check` (a candidate against the original) and `bench` (the original
against itself), each job in an isolated harness worker. Library code: typed options in, Verdicts out;
printing is the CLI's and the report package's business."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from astra.errors import AstraError, NoGpu
from astra.sglang.tree import SglangTree
from astra.spec import jobs
from astra.spec.model import KernelSpec
from astra.spec.source_check import require_same_source
from harness import TIMING_MODES, Job, Options, Verdict, run_job, verify_job

MODES = TIMING_MODES


@dataclass
class CheckOptions:
    """How `check` and `bench` judge and time. `quick`: a screen (`quick_cases`), not evidence."""

    modes: list[str] = field(default_factory=lambda: list(MODES))
    sanitizer: bool = True
    quick: bool = False
    budget_ms: float | None = None  # timing budget per shape and side (None: the harness default)
    ncu: bool = False  # bench: also measure each shape with Nsight Compute
    outputs_checked: bool = True  # bench: False times the original without its outputs phase (status "timed")
    sandbox: bool = True  # False: candidate code runs without the OS sandbox (--no-sandbox; the verdict says so)

    def __post_init__(self) -> None:
        bad = [m for m in self.modes if m not in MODES]
        if bad or not self.modes:
            raise AstraError(f"--modes: unknown mode(s) {bad or self.modes}; use graph, cold or graph,cold")
        if self.budget_ms is not None and (isinstance(self.budget_ms, bool) or not isinstance(self.budget_ms, (int, float))
                                           or not 0 < self.budget_ms < float("inf")):
            raise AstraError(f"--budget-ms {self.budget_ms}: must be a positive number of milliseconds")

    def harness_options(self, *, sanitizer: bool | None = None) -> Options:
        opts = Options(modes=list(self.modes), sanitizer=self.sanitizer if sanitizer is None else sanitizer,
                       outputs_checked=self.outputs_checked, sandbox=self.sandbox)
        if self.quick:
            opts.seeds = [0]
            opts.budget_ms_per_case = 100.0
        if self.budget_ms:
            opts.budget_ms_per_case = self.budget_ms
        return opts


def require_gpu() -> None:
    """Raise (exit 7) with what to do instead when no CUDA GPU is usable here. Asked of the driver and of
    torch's version file, without importing torch (harness.environment.cuda_devices): the judge runs in a
    process of its own, and the import alone cost this process 1.5 to 2 s."""
    from harness.environment.cuda_devices import device_count, torch_cuda

    if device_count() == 0:
        raise NoGpu(
            "no CUDA GPU here: `astra check` and `astra bench` need one. Without a GPU you can still run "
            "`astra list`, `astra extract`, `astra build` (nvcc + ptxas report) and `astra spec-check`.")
    built = torch_cuda()
    if built is False:
        raise NoGpu("torch is not installed; `astra check`/`bench` need torch with CUDA")
    if built is None:
        raise NoGpu("the torch installed here is a CPU build; `astra check`/`bench` need torch with CUDA "
                    "(install the CUDA build of torch that matches this machine's driver)")


def timeout_for(job: Job) -> float:
    """Generous: builds, every case's checks and timing, with slack for a cold build cache."""
    return 300.0 + 10.0 * len(job.cases)


SCREEN_NOTE = ("a --quick screen (the median shape of each band, one seed, the graph view, no sanitizer): for "
               "iterating, not evidence for a patch")


def quick_cases(job: Job) -> Job:
    """A screen for iteration, not evidence: the first dtype's cases, of its timed shapes only the median by
    bytes of each band (its untimed edge shapes all kept), one seed without the large/small/extreme trials,
    the graph view only, no compute-sanitizer (what the optimize loop screens a candidate with)."""
    first = job.cases[0].dtype
    cases = [c for c in job.cases if c.dtype == first]
    bands: dict[str, list] = {}
    for case in cases:
        if case.timed:
            bands.setdefault(case.band, []).append(case)
    medians = {id(sorted(group, key=lambda c: c.bytes)[len(group) // 2]) for group in bands.values()}
    job.cases = [c for c in cases if not c.timed or id(c) in medians]
    job.options.seeds, job.options.extra_trials = job.options.seeds[:1] or [0], False
    job.options.modes = [m for m in job.options.modes if m == "graph"] or job.options.modes[:1]
    job.options.sanitizer = False
    return job


def check_candidate(spec: KernelSpec, tree: SglangTree, source: str, label: str, opts: CheckOptions,
                    progress: Callable[[str], None] | None = None) -> Verdict:
    """The verdict on `source` (the candidate's version of `spec.kernel_file`) against the original;
    `progress` gets the judge's phase lines as it runs."""
    require_same_source(spec, tree)  # the original checked against is the kernel the spec was reviewed for
    require_gpu()
    job = jobs.make_job(spec, tree, candidate_source=source, label=label, options=opts.harness_options())
    if opts.quick:
        job = quick_cases(job)
    verdict = verify_job(job, timeout_s=timeout_for(job), progress=progress)
    if opts.quick:
        verdict.notes.append(SCREEN_NOTE)  # the patch emitter refuses it (astra.patches.emit.refusal)
    return verdict


def bench_original(spec: KernelSpec, tree: SglangTree, opts: CheckOptions, kernel_rel: str | None = None) -> Verdict:
    """The original over its timed shapes, against itself (self-ratios measure the noise)."""
    require_gpu()
    job = jobs.make_job(spec, tree, options=opts.harness_options(sanitizer=False), kernel_rel=kernel_rel)
    job.cases = [c for c in job.cases if c.timed]
    job.options.seeds, job.options.extra_trials = job.options.seeds[:1] or [0], False  # itself: one trial each
    verdict = run_job(job, timeout_s=timeout_for(job))
    if opts.ncu:
        from astra.verify.ncu import ncu_comparison

        verdict.ncu = ncu_comparison(job, verdict)
    return verdict
