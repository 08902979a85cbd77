"""`astra passes`: every rewrite pass over the kernel file of every sm_90a-buildable module of a tree, and
(unless told not to) each candidate built with nvcc exactly as `astra build` builds the original.

Per module, the build `astra build` would run is planned (a reviewed spec's first variant, else the
guessed template arguments); each pass is applied to the module's own CUDA files in order, parsed with
the tree's headers and the call site's -D flags, and the first file it rewrites is the candidate, built
as an override of that file (harness.build_many, the shared build cache). The result says, per pass,
where it applies, where its candidate builds, why it refuses elsewhere and the first error of a build
that failed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

from astra import paths
from astra.errors import AstraError
from astra.optimize.passes import catalog
from astra.optimize.passes.syntax import Headers
from astra.sglang.tree import SglangTree

_CUDA = (".cu", ".cuh")


@dataclass
class SurveyOptions:
    passes: tuple[str, ...] = ()  # empty: every pass
    build: bool = True
    jobs: int = 1  # parallel nvcc builds
    modules: tuple[str, ...] = ()  # empty: every sm_90a-buildable module


@dataclass
class PassOutcome:
    applies: list[str] = field(default_factory=list)
    builds: list[str] = field(default_factory=list)
    refused: dict[str, str] = field(default_factory=dict)
    build_failed: dict[str, str] = field(default_factory=dict)
    what: dict[str, str] = field(default_factory=dict)  # module -> what the pass did there


@dataclass
class Survey:
    sglang: str
    modules: list[str]
    skipped: dict[str, str]  # module -> why no build could be planned
    passes: dict[str, PassOutcome]
    built: bool

    def as_json(self) -> dict:
        reach = sorted({m for o in self.passes.values() for m in (o.builds if self.built else o.applies)})
        return {"sglang": self.sglang, "built": self.built, "modules": len(self.modules),
                "reach": reach, "skipped": self.skipped,
                "passes": {name: {"applies": o.applies, "builds": o.builds, "refused": o.refused,
                                  "build_failed": o.build_failed, "what": o.what}
                           for name, o in self.passes.items()}}


def run(tree: SglangTree, opts: SurveyOptions, progress: Callable[[int, int], None] | None = None,
        build_progress: Callable[[int, int], None] | None = None) -> Survey:
    from astra.sglang import registry
    from astra.sglang.clang_env import tree_include_dirs
    from astra.sglang.cuda_parse import module_defines
    from astra.spec import builds

    known = catalog()
    unknown = [n for n in opts.passes if n not in known]
    if unknown:
        raise AstraError(f"no pass named {', '.join(unknown)} (passes: {', '.join(known)})")
    names = list(opts.passes or known)
    mods = [m for m in registry.modules(tree) if m.sm90a in ("yes", "built")]
    if opts.modules:
        missing = set(opts.modules) - {m.name for m in mods}
        if missing:
            raise AstraError(f"not an sm_90a-buildable module of {tree.describe()}: {', '.join(sorted(missing))}")
        mods = [m for m in mods if m.name in opts.modules]
    outcomes = {n: PassOutcome() for n in names}
    skipped: dict[str, str] = {}
    candidates: list[tuple[str, str, object]] = []  # (pass, module, build request)
    tree_dirs = tuple(tree_include_dirs(tree))
    for done, module in enumerate(mods):
        try:
            planned = builds.plan(tree, module.name, builds.BuildOptions())[0]
        except AstraError as err:
            skipped[module.name] = str(err)
        else:
            files = [s for s in module.sources if Path(s).suffix in _CUDA and not Path(s).is_absolute()]
            defines = tuple(sorted(module_defines(module).items()))
            texts = _texts(tree, files)
            for name in names:
                outcome = outcomes[name]
                found, why = _first_rewrite(name, texts, tree_dirs + tuple(planned.request.include_dirs), defines)
                if found is None:
                    outcome.refused[module.name] = why
                    continue
                rel, source, what = found
                outcome.applies.append(module.name)
                outcome.what[module.name] = what
                candidates.append((name, module.name, replace(planned.request, overrides={rel: source})))
        if progress is not None:
            progress(done + 1, len(mods))
    if opts.build and candidates:
        from harness import build_many

        results = build_many([req for _, _, req in candidates], paths.sub("builds"), jobs=opts.jobs,
                             progress=build_progress)
        failed = {module: replace(req, overrides={}) for (_, module, req), res in zip(candidates, results)
                  if not res.ok}
        # where a candidate fails, the original is built too: a failure of the guessed template arguments
        # is the module's, not the pass's
        originals = dict(zip(failed, build_many(list(failed.values()), paths.sub("builds"), jobs=opts.jobs)))
        for (name, module, _), res in zip(candidates, results):
            if res.ok:
                outcomes[name].builds.append(module)
            elif not originals[module].ok:
                outcomes[name].build_failed[module] = ("the original does not build either: " + _first_error(
                    originals[module].error or originals[module].log, tree))
            else:
                outcomes[name].build_failed[module] = _first_error(res.error or res.log, tree)
    return Survey(tree.version, [m.name for m in mods], skipped, outcomes, opts.build)


def _texts(tree: SglangTree, files: list[str]) -> list[tuple[str, str, str]]:
    """(relative path, absolute path, text) of each of the module's own CUDA files."""
    from astra.sglang import registry

    out = []
    for rel in files:
        path = registry.resolve_source(tree, rel)
        if path is not None:
            out.append((rel, str(path), path.read_text(errors="replace")))
    return out


def _first_rewrite(name: str, texts: list, include_dirs: tuple, defines: tuple) -> tuple[tuple | None, str]:
    """((relative path, new text, what was done) of the first file the pass rewrites, or None; why it
    refused each file before that, one line)."""
    refusals = []
    for rel, path, text in texts:
        result = catalog(Headers(include_dirs, defines, path), (name,))[name].apply(text)
        if result.applies and result.source is not None:
            return (rel, result.source, result.reason), ""
        refusals.append((rel, result.reason))
    if not refusals:
        return None, "no CUDA source of its own under the tree's csrc"
    if len(refusals) == 1:
        return None, refusals[0][1]
    return None, "; ".join(f"{rel}: {why}" for rel, why in refusals)


def _first_error(log: str, tree: SglangTree) -> str:
    """The first line of a build log that says `error`, paths shown relative to the tree, with what the compiler
    quotes of the source (a static_assert's message, a declaration in quotes) left out: the report names where
    and what kind of error, it does not copy SGLang's text."""
    lines = [line.strip().replace(f"{tree.root}/", "") for line in log.splitlines() if line.strip()]
    line = next((line for line in lines if "error" in line.lower()), lines[0] if lines else "build failed")
    return without_quotes(line)[:300]


def without_quotes(text: str) -> str:
    """`text` with every double-quoted part replaced by "...": compiler lines quote the source."""
    return re.sub(r'"[^"]*"', '"..."', text)
