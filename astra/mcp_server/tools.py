"""The seven tools of `astra mcp` as library calls: typed arguments in, an `Answer` out, `AstraError` raised.

Each tool does what one command does (astra/cli/*.py) through the same library functions; where the command
writes JSON (`--json`), the tool's document is exactly that JSON. Printing, MCP and error translation are the
server's (`astra.mcp_server.server`).

The rules for the user's input files are the CLI's: reading a candidate source (`astra.cli.verify.read_source`),
a verdict (`astra.cli.patches.read_verdict`) and refusing an output path before the work
(`astra.cli.common.check_output`, `check_output_dir`). A library module may not import the CLI
(docs/architecture.md), so `astra mcp` hands them over as `Inputs`; each rule stays written once.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from astra import paths
from astra.errors import AstraError, ToolMissing
from astra.report import text
from astra.sglang import discovery, registry
from astra.sglang import tree as sglang_tree
from astra.spec import model as spec_mod
from astra.spec.model import KernelSpec
from astra.spec.resolve import draft_problem, resolve
from astra.spec.source_check import require_same_source
from astra.spec.trees import tree_for
from astra.verify import runner
from harness import Verdict

Say = Callable[[str], None]


@dataclass(frozen=True)
class Inputs:
    """The CLI's rules for the user's files (see the module docstring)."""

    read_source: Callable[[Path, str], str]  # (path, what to call it in a message) -> the text
    read_verdict: Callable[[Path], Verdict]
    check_output: Callable[[str | None, str], None]  # (path, name) -> raises unless it can be written
    check_output_dir: Callable[[str | None, str], None]


@dataclass(frozen=True)
class Answer:
    """A tool's result: `document`, the JSON the command writes with --json (or the tool's own JSON where the
    command has none), and `summary`, the few lines the command prints (None: nothing to add)."""

    document: str
    summary: str | None = None


@dataclass(frozen=True)
class Tree:
    """Which SGLang: `sglang` (a release, its wheel downloaded once) or `sglang_src` (a checkout or an unpacked
    package); neither: the spec's own version (for a spec), else the installed package, else the pinned one."""

    sglang: str | None = None
    sglang_src: str | None = None

    def any(self) -> sglang_tree.SglangTree:
        return sglang_tree.locate(version=self.sglang, src=self.sglang_src)

    def for_spec(self, spec: KernelSpec) -> sglang_tree.SglangTree:
        return tree_for(spec, self.sglang, self.sglang_src)


def _json(value) -> str:
    return json.dumps(value, indent=1)


# ---------------------------------------------------------------- list, extract (no GPU)


def specs_index() -> dict:
    """The specs `check`, `bench` and `profile` take: reviewed ones, and drafts with what keeps them unusable."""
    drafts = [{"name": p.parent.name, "path": str(p), "usable": (problem := draft_problem(p)) is None,
               "problem": problem} for p in sorted(paths.drafts_dir().glob("*/kernel.yaml"))]
    return {"reviewed": spec_mod.available(), "specs_dir": str(paths.specs_dir()), "drafts": drafts}


def list_modules(tree: Tree, *, buildable: bool = False, why: str | None = None) -> Answer:
    """`astra list --json` (plus the specs there are), or `astra list --why NAME --json`."""
    t = tree.any()
    if why:
        from astra.sglang import srt_gates
        from astra.sglang.srt_gates_text import format_reach

        reach = srt_gates.why(t, why)
        return Answer(_json(asdict(reach)), format_reach(reach))
    mods = registry.modules(t)
    if buildable:
        mods = [m for m in mods if m.sm90a in ("yes", "built")]
    skipped = [asdict(s) for s in discovery.unparsable(t)]
    document = {
        "sglang": {"version": t.version, "origin": t.origin, "root": str(t.root), "layout": t.layout},
        "modules": [registry.module_record(t, m) for m in mods],
        "specs": specs_index(),
        "skipped": skipped,
    }
    reviewed = ", ".join(document["specs"]["reviewed"]) or "none"
    usable = [d["name"] for d in document["specs"]["drafts"] if d["usable"]]
    return Answer(_json(document), f"{len(mods)} JIT modules in {t.describe()}; reviewed specs: {reviewed}; "
                                   f"probed drafts: {', '.join(usable) or 'none'}")


def extract_draft(tree: Tree, inputs: Inputs, name: str, *, export: str | None = None, build_check: bool = True,
                  out: str | None = None) -> Answer:
    """`astra extract NAME`: the draft's path, its notes to review and its text."""
    from astra.spec import extract

    inputs.check_output_dir(out, "out")
    result = extract.extract(tree.any(), name, out_dir=Path(out) if out else None, export=export,
                             build_check=build_check)
    document = {"draft": str(result.draft), "snapshot": str(result.snapshot), "files": list(result.files),
                "notes": list(result.notes), "spec": Path(result.draft).read_text(errors="replace")}
    return Answer(_json(document), f"spec draft: {result.draft} ({len(result.notes)} note(s) to review); probe it "
                                   "on a GPU (`probe`) before `check` takes it")


# ---------------------------------------------------------------- probe, check, bench, profile (GPU)


def probe_specs(tree: Tree, names: list[str], *, reviewed: bool = False, force: bool = False,
                sanitizer: bool = True, per_gpu: int = 4, timeout_case: float = 120.0, repair_rounds: int = 2,
                report_only: bool = False, say: Say = lambda line: None) -> Answer:
    """`astra probe NAME... --json`: each draft's original on its suite, rule-repaired where the kernel's
    messages show the draft wrong (the model-driven repairer of `--agent llm` is the CLI's)."""
    from astra.verify import probe_repair, probing
    from astra.verify.message_repair import MessageRepairer
    from astra.verify.probe_record import markdown

    opts = probing.ProbeOptions(per_gpu=per_gpu, timeout_case_s=timeout_case, sanitizer=sanitizer, force=force,
                              report_only=report_only)
    targets = probing.select(list(names), reviewed=reviewed)
    results = probe_repair.probe_with_repair(targets, tree.for_spec, opts, [MessageRepairer()],
                                             rounds=repair_rounds, say=say)
    return Answer(_json([r.to_dict() for r in results]), markdown(results))


def candidate_file(spec: KernelSpec, candidate: str | None, source: str | None) -> Path:
    """The candidate as a file: `candidate` (a path), or `source` (its text) saved under
    $ASTRA_HOME/mcp/candidates/SHA/ with the kernel file's name, so that `patch` can take the same file."""
    if (candidate is None) == (source is None):
        raise AstraError(f"give `candidate` (the path of your version of {spec.kernel_file}) or `source` (its "
                         "text), one of the two")
    if candidate is not None:
        path = Path(candidate).expanduser()
        if not path.is_file():
            raise AstraError(f"candidate {path}: no such file (give your version of {spec.kernel_file})")
        return path
    digest = hashlib.sha256(source.encode("utf-8", errors="surrogatepass")).hexdigest()[:16]
    path = paths.sub("mcp") / "candidates" / digest / Path(spec.kernel_file).name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(source, encoding="utf-8", errors="surrogatepass")
    return path


def check_candidate(tree: Tree, inputs: Inputs, name: str, *, candidate: str | None = None,
                    source: str | None = None, label: str | None = None, modes: list[str] | None = None,
                    sanitizer: bool = True, quick: bool = False, verdict_out: str | None = None) -> Answer:
    """`astra check NAME --candidate FILE --json OUT`: the verdict, exactly as that writes it."""
    spec = resolve(name)
    path = candidate_file(spec, candidate, source)
    code = inputs.read_source(path, "candidate")
    opts = runner.CheckOptions(modes=list(modes or runner.MODES), sanitizer=sanitizer, quick=quick)
    inputs.check_output(verdict_out, "verdict_out")
    verdict = runner.check_candidate(spec, tree.for_spec(spec), code, label or path.name, opts)
    document = verdict.to_json()
    if verdict_out:
        Path(verdict_out).write_text(document)
    where = [f"candidate: {path}"] + ([f"verdict: {verdict_out}"] if verdict_out else [])
    return Answer(document, text.format_check(verdict) + "\n" + "\n".join(where))


def bench_originals(tree: Tree, names: list[str], *, modes: list[str] | None = None,
                    budget_ms: float | None = None) -> Answer:
    """`astra bench NAME... --json OUT`: {name: the original's verdict against itself}."""
    if not names:
        raise AstraError("name the specs to bench, e.g. [\"rmsnorm\"]")
    specs = [resolve(name) for name in names]
    opts = runner.CheckOptions(modes=list(modes or runner.MODES), sanitizer=False, budget_ms=budget_ms)
    trees = {spec.name: tree.for_spec(spec) for spec in specs}
    for spec in specs:
        require_same_source(spec, trees[spec.name])
    runner.require_gpu()
    verdicts = {spec.name: runner.bench_original(spec, trees[spec.name], opts) for spec in specs}
    summary = "\n".join(f"== {name}\n{text.format_bench(v)}" for name, v in verdicts.items())
    return Answer(_json({name: v.to_dict() for name, v in verdicts.items()}), summary)


def profile_original(tree: Tree, name: str, *, budget_ms: float | None = None) -> Answer:
    """`astra bench NAME --ncu`, cold view: the original's verdict whose `ncu` holds, per timed shape, the cold
    median against Nsight Compute's gpu__time_duration."""
    from harness.timing.ncu_cross_check import ncu_path

    spec = resolve(name)
    t = tree.for_spec(spec)
    require_same_source(spec, t)
    runner.require_gpu()
    if ncu_path() is None:
        raise ToolMissing("ncu (Nsight Compute) not found on PATH or in $CUDA_HOME/bin: `profile` measures with "
                          "it; install Nsight Compute (it comes with the CUDA toolkit) or set CUDA_HOME")
    opts = runner.CheckOptions(modes=["cold"], sanitizer=False, budget_ms=budget_ms, ncu=True)
    verdict = runner.bench_original(spec, t, opts)
    return Answer(verdict.to_json(), text.format_ncu(verdict.ncu) if verdict.ncu else None)


# ---------------------------------------------------------------- patch (no GPU)


def emit(tree: Tree, inputs: Inputs, name: str, *, verdict: str, candidate: str | None = None,
         source: str | None = None, why: str | None = None, out: str = "patches", threshold: float = 0.02,
         sanitizer_required: bool = True) -> Answer:
    """`astra patch NAME --candidate FILE --verdict JSON`: the two patches written, or why there are none."""
    from astra.patches.emit import emit_patch

    spec = spec_mod.load(name)
    code = inputs.read_source(candidate_file(spec, candidate, source), "candidate")
    judged = inputs.read_verdict(Path(verdict))
    result = emit_patch(spec, tree.for_spec(spec), code, judged, Path(out), slowdown_threshold=threshold, why=why,
                        sanitizer_required=sanitizer_required)
    document = {"refused": result.refused,
                "repo_patch": str(result.repo_patch) if result.repo_patch else None,
                "package_patch": str(result.package_patch) if result.package_patch else None}
    summary = (f"no patch: {result.refused}" if result.refused else
               f"wrote {result.repo_patch} (SGLang repository: git am / git apply) and {result.package_patch} "
               "(installed package: astra apply --installed)")
    return Answer(_json(document), summary)
