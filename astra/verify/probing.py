"""`astra probe`: run the ORIGINAL kernel of each drafted spec on its drafted suite and record the evidence.

A draft's roles and shapes are guesses; a probed spec is one whose original kernel was seen, on a GPU,
to accept its cases, write what the roles say, be deterministic and finite, and run clean under
compute-sanitizer memcheck (harness.probe.observation holds that rule, harness.probe.processes the processes).

`probe_modules` does, for the selected targets (`select`):
1. skip every module whose record already matches its spec's bytes (unless `force`): resumable;
2. load each spec and make its job (seed 0, no timing, the shared build cache);
3. build every module's variants first, on every CPU core (`harness.build_many`);
4. probe the modules concurrently: one slot per GPU of the host (CUDA_VISIBLE_DEVICES per probe
   process), `per_gpu` probe processes on each (probing is not timing, so GPUs are shared);
5. apply each result (astra.verify.probe_record): a passing draft is rewritten with the observed roles
   and its excluded cases, and probe.json is written; reviewed specs are only recorded.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from queue import Queue
from typing import Callable

from astra import paths
from astra.errors import AstraError, NoGpu, SpecError, UnknownKernel
from astra.sglang.tree import SglangTree
from astra.spec import jobs
from astra.spec import model as spec_mod
from astra.spec.expr import ExprError
from astra.spec.model import KernelSpec
from astra.spec.resolve import PROBE_FILE, draft_path, read_record, spec_sha256
from astra.text import one_line
from astra.verify.probe_record import ModuleProbe, finish, summary, write_record
from harness import Job, Options, build_many, build_requests, default_arch
from harness.probe.processes import default_timeout, probe_isolated
from harness.worker.process_group import Isolated, kill_group

Say = Callable[[str], None]


@dataclass
class ProbeOptions:
    """How `astra probe` runs. `device` "cpu" is for host-only test kernels (no GPU slots)."""

    per_gpu: int = 4
    timeout_case_s: float = 120.0
    sanitizer: bool = True
    sanitizer_timeout_s: float = 900.0
    force: bool = False
    device: str = "cuda"
    report_only: bool = False  # no GPU: summarise the records there are, probe nothing
    sandbox: bool = True  # False: the original runs without the OS sandbox (--no-sandbox; the record says so)

    def __post_init__(self) -> None:
        if isinstance(self.per_gpu, bool) or not isinstance(self.per_gpu, int) or self.per_gpu < 1:
            raise AstraError(f"--per-gpu {self.per_gpu}: give a whole number of probe processes per GPU, 1 or more")
        if not isinstance(self.timeout_case_s, (int, float)) or not 0 < self.timeout_case_s < float("inf"):
            raise AstraError(f"--timeout-case {self.timeout_case_s}: give a positive number of seconds, e.g. 120")


@dataclass(frozen=True)
class Target:
    """One spec to probe: a draft (rewritable) or a reviewed spec (read-only)."""

    name: str
    spec_file: Path
    reviewed: bool

    @property
    def kind(self) -> str:
        return "reviewed" if self.reviewed else "draft"

    @property
    def record_path(self) -> Path:
        return paths.sub("probes") / f"{self.name}.json" if self.reviewed else self.spec_file.parent / PROBE_FILE


def select(names: list[str], *, all_drafts: bool = False, reviewed: bool = False) -> list[Target]:
    """The targets: every draft with `all_drafts` (plus every reviewed spec with `reviewed`), and each
    name: its draft, else (or with `reviewed`) its reviewed spec."""
    if not names and not all_drafts:
        raise AstraError("name the drafts to probe (`astra probe NAME...`), or give --all for every draft under "
                         f"{paths.drafts_dir()}")
    targets: list[Target] = []
    if all_drafts:
        targets += [Target(p.parent.name, p, False) for p in sorted(paths.drafts_dir().glob("*/kernel.yaml"))]
        if reviewed:
            targets += [Target(n, spec_mod.spec_path(n), True) for n in spec_mod.available()]
        if not targets:
            raise AstraError(f"no drafts under {paths.drafts_dir()}; write one with `astra extract NAME`")
    for name in names:
        draft, spec = draft_path(name), spec_mod.spec_path(name)
        if not reviewed and "/" not in name and draft.exists():
            targets.append(Target(name, draft, False))
        elif spec.exists():
            targets.append(Target(name, spec, True))
        else:
            where = f"{spec}" if reviewed else f"{draft} or {spec}"
            raise UnknownKernel(f"no spec {name!r} to probe (looked for {where}); write a draft with "
                                f"`astra extract {name}`")
    return list(dict.fromkeys(targets))


def gpu_slots(opts: ProbeOptions) -> list[str | None]:
    """CUDA_VISIBLE_DEVICES for each concurrent probe process: every GPU `per_gpu` times, interleaved so the
    first modules spread over the GPUs (None: no GPU, for device "cpu"). Raises NoGpu when there is none."""
    if opts.device == "cpu":
        return [None] * opts.per_gpu
    count = gpu_count()
    if count == 0:
        raise NoGpu("no CUDA GPU here: `astra probe` runs each draft's original kernel on a GPU; run it on a GPU "
                    "machine (without one you can still `astra extract`, `astra build` and `astra spec-check`)")
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [v.strip() for v in visible.split(",") if v.strip()][:count] if visible else [str(i) for i in range(count)]
    return [gpu for _ in range(opts.per_gpu) for gpu in ids]


def gpu_count() -> int:
    """CUDA devices usable here (0 without a CUDA build of torch or a device; asked without importing torch)."""
    from harness.environment.cuda_devices import device_count, torch_cuda

    return device_count() if torch_cuda() else 0


def require_gpu(opts: ProbeOptions) -> None:
    """Raise NoGpu (exit 7) with what to do when the probe has no device to run on."""
    gpu_slots(opts)


def probe_job(spec: KernelSpec, tree: SglangTree, opts: ProbeOptions) -> Job:
    """The spec's whole drafted suite, original only, one seed, no timing, the shared build cache."""
    options = Options(seeds=[0], modes=[], sanitizer=False, case_timeout_s=opts.timeout_case_s,
                      cache_dir=str(paths.sub("builds")), sandbox=opts.sandbox)
    return jobs.make_job(spec, tree, options=options, label="probe")


def _failed(target: Target, reason: str) -> ModuleProbe:
    """Record a module that failed before the GPU (its spec untouched) and summarise it."""
    record = {"status": "failed", "reason": reason, "name": target.name, "kind": target.kind,
              "spec": str(target.spec_file), "spec_sha256": spec_sha256(target.spec_file), "cases": []}
    write_record(target.record_path, record)
    return summary(target.name, target.kind, record, target.record_path)


def probe_modules(targets: list[Target], tree_for: Callable[[KernelSpec], SglangTree], opts: ProbeOptions,
                  say: Say = lambda line: None) -> list[ModuleProbe]:
    """Probe every target (see the module docstring); one ModuleProbe per target, in order."""
    done: dict[Target, ModuleProbe] = {}
    pending: list[tuple[Target, KernelSpec]] = []
    for target in targets:
        record = read_record(target.record_path)
        if not opts.force and record and record.get("spec_sha256") == spec_sha256(target.spec_file):
            done[target] = summary(target.name, target.kind, record, target.record_path, up_to_date=True)
            continue
        if opts.report_only:
            done[target] = ModuleProbe(name=target.name, kind=target.kind, status="not probed",
                                       reason="no probe record for this spec's current bytes; run `astra probe "
                                              f"{target.name}` on a GPU machine", kept=0, total=0, written=[])
            continue
        try:
            pending.append((target, spec_mod.load(target.spec_file)))
        except (SpecError, UnknownKernel) as err:
            done[target] = _failed(target, f"the spec does not load: {one_line(err, 300)}")
    if pending:
        slots = gpu_slots(opts)  # before any tree is fetched: without a GPU there is nothing more to do
        arch = default_arch()  # once, here: no probe process needs the device just to pick nvcc's target
        work: list[tuple[Target, KernelSpec, SglangTree, Job]] = []
        for target, spec in pending:
            tree = tree_for(spec)
            try:
                job = probe_job(spec, tree, opts)
            except (AstraError, ExprError, ValueError) as err:
                done[target] = _failed(target, f"the spec's suite cannot be made: {one_line(err, 300)}")
                continue
            job.build.arch = job.build.arch or arch
            work.append((target, spec, tree, job))
        for target, reason in (_build_all(work, say) if work else {}).items():
            done[target] = _failed(target, reason)
        todo = [item for item in work if item[0] not in done]

        def record(index: int, result: dict) -> None:  # as each module ends: an interrupted run keeps them
            target, _, tree, _ = todo[index]
            done[target] = finish(target.name, target.kind, target.spec_file, target.record_path, result, tree.version)
            say(f"{target.name}: {done[target].status}: {done[target].reason}")

        _probe_all([job for *_, job in todo], slots, opts, say, record)
    return [done[target] for target in targets]


def _build_all(work: list[tuple[Target, KernelSpec, SglangTree, Job]], say: Say) -> dict[Target, str]:
    """Build every variant of every module at once; {target: reason} for the originals that fail to build."""
    requests = [(target, variant, request) for target, _, _, job in work for _, variant, request in build_requests(job)]
    cores = os.cpu_count() or 1
    say(f"building {len(requests)} variant(s) of {len(work)} module(s) on {cores} CPU core(s)")
    cache = Path(work[0][3].options.cache_dir or paths.sub("builds"))
    results = build_many([request for *_, request in requests], cache, jobs=cores)
    failures: dict[Target, str] = {}
    for (target, variant, request), result in zip(requests, results):
        if not result.ok and target not in failures:
            error = result.error or "no compiler output"
            for root in (request.source_root, *request.include_dirs):
                error = error.replace(root.rstrip("/") + "/", "")
            failures[target] = f"the original fails to build ({variant}): {one_line(error, 300)}"
    return failures


def _probe_all(jobs_list: list[Job], slots: list[str | None], opts: ProbeOptions, say: Say,
               on_result: Callable[[int, dict], None]) -> None:
    """Each job in a probe process of its own, at most one per slot at a time; `on_result(index, result)`
    as each ends. An interruption (Ctrl-C) kills the probe processes in flight and records none of them."""
    free: Queue = Queue()
    for slot in slots:
        free.put(slot)
    running: dict[int, Isolated] = {}
    stop = threading.Event()

    def one(index: int, job: Job) -> None:
        slot = free.get()
        try:
            if stop.is_set():
                return
            env = dict(os.environ)
            if slot is not None:
                env["CUDA_VISIBLE_DEVICES"] = slot
            say(f"probing {job.name} ({len(job.cases)} cases)" + (f" on GPU {slot}" if slot is not None else ""))
            result = probe_isolated(job, timeout_s=default_timeout(job, opts.timeout_case_s, opts.sanitizer_timeout_s),
                                    device=opts.device, timeout_case_s=opts.timeout_case_s, sanitizer=opts.sanitizer,
                                    sanitizer_timeout_s=opts.sanitizer_timeout_s, env=env,
                                    on_start=lambda proc: running.__setitem__(index, proc))
            if not stop.is_set():
                on_result(index, result)
        finally:
            running.pop(index, None)
            free.put(slot)

    pool = ThreadPoolExecutor(max_workers=max(1, min(len(slots), len(jobs_list))))
    futures = [pool.submit(one, index, job) for index, job in enumerate(jobs_list)]
    try:
        for future in futures:
            future.result()
    except BaseException:
        stop.set()
        for proc in list(running.values()):
            kill_group(proc.proc.pid)
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
