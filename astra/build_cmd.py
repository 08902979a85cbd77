"""`astra build`: compile the original module with nvcc exactly as SGLang would, and show ptxas's
resource use per kernel. Works on a machine without a GPU."""

from __future__ import annotations

import json
from dataclasses import asdict

from astra import paths, registry, spec as spec_mod, table, variants
from astra.errors import AstraError, ToolMissing
from astra.sglang_tree import SglangTree


def _arch(text: str) -> str:
    arch = text.lower().removeprefix("sm_").removeprefix("sm")
    if not arch[:2].isdigit():
        raise AstraError(f"--arch {text}: expected a target such as sm_90a, sm_80 or sm_100a")
    return arch


def requests_for(tree: SglangTree, name: str, arch: str, variant: str | None, overrides: dict[str, str]):
    """(label, BuildRequest) pairs: a spec's variants when a spec names this module, else a guessed one."""
    from harness.build import BuildRequest

    spec = _spec_for(name)
    if spec is not None and not overrides:
        from astra.jobs import cases

        _, spec_variants = cases(spec)
        chosen = list(spec_variants.values())
        if variant is not None:
            chosen = ([chosen[int(variant)]] if variant.isdigit() and int(variant) < len(chosen)
                      else [v for v in chosen if variant in v.key])
            if not chosen:
                raise AstraError(f"--variant {variant}: no variant of {name} matches; variants: "
                                 + "; ".join(v.key for v in spec_variants.values()))
        build = spec.raw["build"]
        return [(v.key, BuildRequest(
            name=f"{spec.module}", source_root=str(tree.csrc_dir), include_dirs=[str(tree.include_dir)],
            cuda_files=list(build.get("cuda_files", [])), cpp_files=list(build.get("cpp_files", [])),
            cuda_wrappers=[tuple(w) for w in v.cuda_wrappers], cpp_wrappers=[tuple(w) for w in v.cpp_wrappers],
            extra_cuda_cflags=v.extra_cuda_cflags, extra_cflags=list(build.get("extra_cflags", [])),
            extra_ldflags=list(build.get("extra_ldflags", [])), header_only=build.get("header_only", True),
            arch=arch)) for v in chosen], []
    module = registry.find(tree, name)
    site = module.call_sites[0]
    guess = variants.guess(site, overrides)
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
        include_dirs=[str(tree.include_dir)] + [i for i in site.extra_include_paths if "{" not in i],
        cuda_files=cuda, cpp_files=cpp,
        cuda_wrappers=[(e, en) for e, en, lang in guess.wrappers if lang == "cuda"],
        cpp_wrappers=[(e, en) for e, en, lang in guess.wrappers if lang == "cpp"],
        extra_cuda_cflags=guess.extra_cuda_cflags, extra_cflags=site.extra_cflags,
        extra_ldflags=site.extra_ldflags, header_only=site.header_only, arch=arch)
    notes = [f"guessed {s}={guess.values[s]} (override with --set {s}=...)" for s in guess.guessed]
    return [("guessed template arguments" if guess.guessed else "default", req)], notes


def tvm_ffi_mismatch(tree: SglangTree) -> str | None:
    """A line when the installed apache-tvm-ffi is not the version this SGLang pins (its headers and
    library are part of the build), else None."""
    from harness.toolchain import tvm_ffi_version

    pin = tree.requirement("apache-tvm-ffi")
    have = tvm_ffi_version()
    if not pin or not pin.startswith("==") or have in (None, "unknown"):
        return None
    want = pin[2:].split(",")[0].strip()
    if have == want:
        return None
    return (f"SGLang {tree.version} pins apache-tvm-ffi {want} but {have} is installed; builds use {have}'s "
            f"headers (`pip install apache-tvm-ffi=={want}` to build exactly as SGLang does)")


def _spec_for(name: str):
    for spec_name in spec_mod.available():
        spec = spec_mod.load(spec_name)
        if spec.name == name or spec.module == name:
            return spec
    return None


def run(args, tree: SglangTree) -> int:
    from harness import toolchain
    from harness.build import build_many
    from harness.ptxas import format_table

    try:
        toolchain.nvcc_path()
    except toolchain.BuildFailure as err:
        raise ToolMissing(str(err)) from None
    arch = _arch(args.arch)
    mismatch = tvm_ffi_mismatch(tree)
    if mismatch:
        print(f"note: {mismatch}")
    overrides = dict(kv.split("=", 1) for kv in args.set if "=" in kv)
    if args.all:
        names = [m.name for m in registry.modules(tree) if m.sm90a in ("yes", "built", "build-failed")]
    elif args.name:
        names = [args.name]
    else:
        raise AstraError("name a module (see `astra list`) or pass --all")
    planned, skipped = [], []
    for name in names:
        try:
            reqs, notes = requests_for(tree, name, arch, args.variant, overrides)
        except AstraError as err:
            if not args.all:
                raise
            skipped.append((name, str(err)))
            continue
        planned += [(name, label, req, notes) for label, req in reqs]
    results = build_many([p[2] for p in planned], paths.sub("builds"), jobs=args.jobs)
    failed = 0
    summary = []
    for (name, label, req, notes), res in zip(planned, results):
        registry.record_build(tree, name, f"sm_{arch}", res.ok, "built" if res.ok else (res.error or "failed")[:200])
        summary.append({"module": name, "variant": label, "ok": res.ok, "seconds": round(res.seconds, 2),
                        "cache_hit": res.cache_hit, "error": res.error,
                        "resources": [asdict(r) for r in res.resources]})
        if not args.all:
            state = "ok" if res.ok else "FAILED"
            print(f"{name} [{label}] sm_{arch}: {state} in {res.seconds:.1f}s{' (cached)' if res.cache_hit else ''}")
            for note in notes:
                print(f"  note: {note}")
            if res.ok:
                print(format_table(res.resources))
            else:
                print(res.error or res.log[-2000:])
        failed += not res.ok
    if args.all:
        rows = [[s["module"], "ok" if s["ok"] else "FAILED", s["seconds"],
                 max((r["registers"] or 0 for r in s["resources"]), default=0),
                 sum(r.get("spill_stores", 0) + r.get("spill_loads", 0) for r in s["resources"]),
                 (s["error"] or "").splitlines()[0][:70] if s["error"] else ""] for s in summary]
        print(table.render(["module", "build", "s", "max regs", "spill B", "error"], rows))
        print(f"\n{len(summary) - failed}/{len(summary)} modules built for sm_{arch}; "
              f"{len(skipped)} skipped (template arguments unknown)")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"sglang": tree.version, "arch": arch, "results": summary,
                       "skipped": [{"module": n, "reason": r} for n, r in skipped]}, fh, indent=1)
    return 1 if failed else 0
