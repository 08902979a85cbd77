"""`astra survey`: bench every selected spec on its suite, one record per kernel in the store, resumable.

`select` picks the specs (reviewed ones, and drafts whose probe passed for their exact bytes); `plan`
splits them into those whose record is current (skipped) and those to bench; `survey` hands the latter
to a `Run` (bench.serial_run by default) and writes each kernel's record the moment its result
arrives, with the kernel's srt reach (reach.reach_of), so a survey killed halfway resumes where it
stopped.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from astra import input_files, paths
from astra.errors import AstraError
from astra.spec import model as spec_mod
from astra.spec import trees
from astra.spec.model import KernelSpec
from astra.spec.resolve import draft_path, draft_problem, resolve, spec_sha256
from astra.survey import bench as bench_mod
from astra.survey import reach as reach_mod
from astra.survey.store import Store, make_record, stale_reason
from astra.text import one_line

Say = Callable[[str], None]


@dataclass(frozen=True)
class Target:
    """One spec to survey."""

    name: str
    spec_file: Path
    kind: str  # "reviewed" | "draft"


@dataclass
class Plan:
    todo: list[tuple[Target, KernelSpec, str]] = field(default_factory=list)  # (target, spec, why)
    current: list[str] = field(default_factory=list)


@dataclass
class Outcome:
    """What one survey call did: kernels benched, skipped as current, failed (no verdict), skipped drafts."""

    benched: list[str] = field(default_factory=list)
    current: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)


def select(names: list[str], *, all_drafts: bool = False, reviewed: bool = False,
           say: Say = lambda _: None) -> list[Target]:
    """Named specs (reviewed first, else a probed draft, as `astra bench` resolves them); with `all_drafts`
    every probed draft (unprobed or edited ones are skipped, with why); with `reviewed` every reviewed
    spec. One target per name: a reviewed spec wins over a draft of the same name."""
    if not names and not all_drafts and not reviewed:
        raise AstraError("name the kernels to survey (`astra survey NAME...`), or give --all (every probed draft) "
                         "and/or --reviewed (every reviewed spec)")
    found: dict[str, Target] = {}
    if reviewed:
        for name in spec_mod.available():
            found[name] = Target(name, spec_mod.spec_path(name), "reviewed")
    if all_drafts:
        for path in sorted(paths.drafts_dir().glob("*/kernel.yaml")):
            problem = draft_problem(path)
            if problem is not None:
                say(f"skip {path.parent.name}: {problem}; run `astra probe {path.parent.name}` first")
            elif path.parent.name not in found:
                found[path.parent.name] = Target(path.parent.name, path, "draft")
    for name in names:
        spec = resolve(name)  # UnknownKernel for an unknown name or an unprobed draft, as bench
        kind = "draft" if spec.path.resolve() == draft_path(spec.name).resolve() else "reviewed"
        found.setdefault(spec.name, Target(spec.name, spec.path, kind))
    if not found:
        raise AstraError(f"nothing to survey: no probed draft under {paths.drafts_dir()} (run `astra extract --all` "
                         "and `astra probe --all`), and no reviewed spec selected")
    return sorted(found.values(), key=lambda t: t.name)


def sglang_label_version(targets: list[Target], version: str | None, src: str | None) -> str:
    """The SGLang version a default store label names: the tree the user gives, else the specs' own
    (the most common one; a tie goes to the newest)."""
    if version or src:
        return trees.tree_version(None, version, src)
    counts = Counter(trees.spec_version(resolve(str(t.spec_file))) for t in targets)
    return max(counts, key=lambda v: (counts[v], v)) if counts else "unknown"


def plan(targets: list[Target], store: Store, *, sglang_version: str | None, sglang_src: str | None,
         gpu: str | None, force: bool, views: tuple[str, ...] = ()) -> Plan:
    """Which targets to bench (with why) and which are current in the store."""
    out = Plan()
    for target in targets:
        spec = resolve(str(target.spec_file))
        why = "--force" if force else stale_reason(
            store.read(target.name), spec_sha256=spec_sha256(spec.path),
            sglang_version=trees.tree_version(spec, sglang_version, sglang_src), gpu=gpu, views=views)
        if why is None:
            out.current.append(target.name)
        else:
            out.todo.append((target, spec, why))
    return out


def survey(targets: list[Target], store: Store, *, sglang_version: str | None = None, sglang_src: str | None = None,
           gpu: str | None = None, force: bool = False, settings: bench_mod.BenchSettings = bench_mod.BenchSettings(),
           run: bench_mod.Run = bench_mod.serial_run, reach_of: reach_mod.ReachOf | None = None,
           say: Say = lambda _: None, prebuild: Callable | None = None) -> Outcome:
    """Bench what `plan` says is not current; write each record as its result arrives. `prebuild(tasks,
    say)` (astra.survey.bench.prebuild) first builds every module to bench on every CPU core."""
    work = plan(targets, store, sglang_version=sglang_version, sglang_src=sglang_src, gpu=gpu, force=force,
                views=settings.modes)
    outcome = Outcome(current=list(work.current))
    for name in work.current:
        say(f"{name}: current in {store.root} (skipped; --force redoes it)")
    by_name = {target.name: (target, spec) for target, spec, _ in work.todo}
    for target, _, why in work.todo:
        say(f"{target.name}: to bench ({why})")
    tasks = [bench_mod.BenchTask(t.name, str(t.spec_file), sglang_version, sglang_src, settings)
             for t, _, _ in work.todo]
    if prebuild is not None and tasks:
        prebuild(tasks, say)
    reach_cache: dict[tuple, dict] = {}
    for result in run(tasks):
        target, spec = by_name[result.name]
        reach = _reach(spec, sglang_version, sglang_src, reach_of or reach_mod.reach_of, reach_cache)
        wall = result.wall_s
        if wall is None and result.verdict:
            wall = (result.verdict.get("phases") or {}).get("total_s")
        record = make_record(
            name=target.name, kind=target.kind, spec_file=str(spec.path), spec_sha256=spec_sha256(spec.path),
            module=spec.module, token_dim=str(spec.raw["shapes"].get("token_dim", "tokens")),
            sglang_version=trees.tree_version(spec, sglang_version, sglang_src), gpu=gpu, wall_s=wall,
            verdict=result.verdict, error=result.error, reach=reach, guesses=review_markers(spec.path))
        store.write(record)
        if result.verdict is None:
            outcome.failed.append(target.name)
            say(f"{target.name}: no verdict ({result.error})")
        else:
            outcome.benched.append(target.name)
            took = f" in {wall:.0f} s" if wall is not None else ""
            say(f"{target.name}: {result.verdict.get('status')}{took} -> {store.path(target.name)}")
    return outcome


def review_markers(path: Path | str) -> int | None:
    """How many `TODO(review)` markers the spec file holds (None when it cannot be read)."""
    try:
        return input_files.read_text(path, input_files.SPEC_BYTES).count("TODO(review)")
    except input_files.Refused:
        return None


def _reach(spec: KernelSpec, version: str | None, src: str | None, reach_of: reach_mod.ReachOf,
           cache: dict[tuple, dict]) -> dict:
    key = (spec.module, version, src, None if (version or src) else trees.spec_version(spec))
    if key not in cache:
        try:
            cache[key] = reach_of(spec, version, src)
        except AstraError as err:
            cache[key] = reach_mod.unknown(f"gates unknown: {one_line(err, 200)}")
    return cache[key]


def refresh_unknown_reach(records: dict[str, dict], store: Store, reach_of: reach_mod.ReachOf | None = None,
                          say: Callable[[str], None] = lambda _: None) -> dict[str, dict]:
    """Records whose reach was unknown when benched (a GPU machine with no network cannot fetch SGLang's
    runtime sources) looked up again here, where the tree may have them; a found reach is written back
    to the store, so the next report has it too. Records of specs no longer found keep what they have."""
    out, cache, found = dict(records), {}, 0
    for name, record in records.items():
        if reach_mod.status_of(record.get("reach")) != "unknown":
            continue
        try:
            spec = resolve(record.get("spec_file") or name)
        except AstraError:
            continue
        reach = _reach(spec, record.get("sglang_version"), None, reach_of or reach_mod.reach_of, cache)
        if reach_mod.status_of(reach) != "unknown":
            out[name] = {**record, "reach": reach}
            store.write(out[name])
            found += 1
    if found:
        say(f"reach looked up for {found} record(s) benched without it")
    return out

