"""What `astra build` compiles for a module: its spec's variants (the one spec-to-request path,
`jobs.spec_build_requests`), else one variant with guessed template arguments; and the builds
themselves, recorded in the registry so `astra list` shows "built". Works without a GPU."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from astra import paths
from astra.errors import AstraError
from astra.sglang import registry, variants
from astra.sglang.tree import SglangTree
from astra.spec import jobs
from astra.spec import model as spec_mod
from harness import BuildRequest, BuildResult, build_many, tvm_ffi_version


@dataclass
class BuildOptions:
    arch: str = "sm_90a"
    variant: str | None = None  # a spec variant: its index or a substring of its key
    overrides: dict[str, str] = field(default_factory=dict)  # template argument values (--set NAME=VALUE)
    jobs: int | None = None  # parallel builds (None: every CPU core)

    def __post_init__(self) -> None:
        if self.jobs is not None and self.jobs < 1:
            raise AstraError(f"--jobs {self.jobs}: give a positive number of parallel builds (or leave it out "
                             "for one per CPU core)")


@dataclass
class PlannedBuild:
    module: str
    label: str  # the variant key, or "default" / "guessed template arguments"
    request: BuildRequest
    notes: list[str] = field(default_factory=list)


def arch_of(text: str) -> str:
    """"sm_90a" -> "90a"; an error that says what a target looks like otherwise."""
    arch = text.lower().removeprefix("sm_").removeprefix("sm")
    if not arch[:2].isdigit():
        raise AstraError(f"--arch {text}: expected a target such as sm_90a, sm_80 or sm_100a")
    return arch


def spec_for(name: str):
    """The spec whose name or module is `name`, or None."""
    for spec_name in spec_mod.available():
        spec = spec_mod.load(spec_name)
        if spec.name == name or spec.module == name:
            return spec
    return None


def plan(tree: SglangTree, name: str, opts: BuildOptions) -> list[PlannedBuild]:
    """The builds of module `name`: a spec's variants when a spec names it (and no --set), else a guess."""
    arch = arch_of(opts.arch)
    spec = spec_for(name)
    if spec is not None and not opts.overrides:
        return [PlannedBuild(name, key, req) for _, key, req in
                jobs.spec_build_requests(spec, tree, arch=arch, variant=opts.variant)]
    module = registry.find(tree, name)
    site = module.call_sites[0]
    guess = variants.guess(site, opts.overrides)
    if guess.unresolved:
        raise AstraError(f"{name}: no value for template argument(s) {', '.join(guess.unresolved)}; "
                         f"give them with --set NAME=VALUE")
    files = [registry.resolve_source(tree, f) for f in site.cuda_files + site.cpp_files]
    if any(f is None for f in files):
        raise AstraError(f"{name}: source not found in {tree.describe()}")
    cuda = [str(f) for f in files[: len(site.cuda_files)]]
    cpp = [str(f) for f in files[len(site.cuda_files):]]
    req = BuildRequest(
        name=name.replace("{", "").replace("}", ""), source_root=str(tree.csrc_dir),
        include_dirs=[str(tree.include_dir)] + registry.source_roots(tree, site.cuda_files + site.cpp_files)
        + [i for i in site.extra_include_paths if "{" not in i],
        cuda_files=cuda, cpp_files=cpp,
        cuda_wrappers=[(e, en) for e, en, lang in guess.wrappers if lang == "cuda"],
        cpp_wrappers=[(e, en) for e, en, lang in guess.wrappers if lang == "cpp"],
        extra_cuda_cflags=guess.extra_cuda_cflags, extra_cflags=site.extra_cflags,
        extra_ldflags=site.extra_ldflags, header_only=site.header_only, arch=arch)
    notes = [f"guessed {s}={guess.values[s]} (override with --set {s}=...)" for s in guess.guessed]
    return [PlannedBuild(name, "guessed template arguments" if guess.guessed else "default", req, notes)]


def build_all(tree: SglangTree, planned: list[PlannedBuild], opts: BuildOptions,
              progress=None) -> list[BuildResult]:
    """Build every planned request (every CPU core), recording each module's outcome in the registry;
    `progress(done, total)` is called as each build ends."""
    results = build_many([p.request for p in planned], paths.sub("builds"), jobs=opts.jobs, progress=progress)
    for p, res in zip(planned, results):
        registry.record_build(tree, p.module, f"sm_{arch_of(opts.arch)}", res.ok,
                              "built" if res.ok else (res.error or "failed")[:200])
    return results


def summary(planned: PlannedBuild, res: BuildResult) -> dict:
    return {"module": planned.module, "variant": planned.label, "ok": res.ok, "seconds": round(res.seconds, 2),
            "cache_hit": res.cache_hit, "error": res.error, "resources": [asdict(r) for r in res.resources]}


def tvm_ffi_mismatch(tree: SglangTree) -> str | None:
    """A line when the installed apache-tvm-ffi is not the version this SGLang pins (its headers and
    library are part of the build), else None."""
    pin = tree.requirement("apache-tvm-ffi")
    have = tvm_ffi_version()
    if not pin or not pin.startswith("==") or have in (None, "unknown"):
        return None
    want = pin[2:].split(",")[0].strip()
    if have == want:
        return None
    return (f"SGLang {tree.version} pins apache-tvm-ffi {want} but {have} is installed; builds use {have}'s "
            f"headers (`pip install apache-tvm-ffi=={want}` to build exactly as SGLang does)")
