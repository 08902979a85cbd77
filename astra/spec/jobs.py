"""Resolving a kernel spec into the harness's Job: every shape, dtype, wrapper and flag concrete.

This is the one path from a spec to what gets built: `make_job` here, then `harness.build_requests(job)`.
`astra build`, `optimize --dry-run`, the worker and `recheck` all go through it."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

from astra.errors import AstraError
from astra.sglang import registry
from astra.sglang.tree import SglangTree
from astra.spec.expr import evaluate, render
from astra.spec.model import KernelSpec, arg_present, arg_row_stride
from harness import ArgSpec, BuildBase, BuildRequest, Case, Job, Options, Variant, band_of, build_requests
from harness.job import split_bytes


def _variant(spec: KernelSpec, names: dict) -> Variant:
    build = spec.raw["build"]
    wrappers = [[w["export"], render(w["entry"], names)] for w in build.get("wrappers", [])
                if w.get("lang", "cuda") == "cuda"]
    cpp = [[w["export"], render(w["entry"], names)] for w in build.get("wrappers", [])
           if w.get("lang") == "cpp"]
    flags = [render(str(f), names) for f in build.get("extra_cuda_cflags", [])]
    key = " | ".join([e for _, e in wrappers + cpp] + flags)
    return Variant(key=key, cuda_wrappers=wrappers, cpp_wrappers=cpp, extra_cuda_cflags=flags)


def _arg(arg, names: dict) -> ArgSpec:
    if arg.kind != "tensor":
        value = arg.value
        if arg.kind == "scalar" and isinstance(value, str):
            value = evaluate(value, names)  # a scalar may be an expression over dims
        return ArgSpec(name=arg.name, kind=arg.kind, role="in", dtype=str(arg.dtype), value=value)
    role = "alias" if arg.alias else arg.role
    if not arg_present(arg, names):  # an absent optional tensor: the call passes None
        return ArgSpec(name=arg.name, kind="tensor", role=role, dtype=render(str(arg.dtype), names), init={},
                       alias=arg.alias, present=False)
    init = {k: (evaluate(v, names) if isinstance(v, str) and k not in ("dist",) else v)
            for k, v in (arg.init or {"dist": "normal"}).items()}
    shape = [int(evaluate(e, names)) for e in arg.shape]
    return ArgSpec(name=arg.name, kind="tensor", role=role, shape=shape, dtype=render(str(arg.dtype), names),
                   init=init, alias=arg.alias, row_stride=arg_row_stride(arg, shape, names),
                   unordered=bool(arg.unordered))


def _in_place(args: list[ArgSpec]) -> list[ArgSpec]:
    """An argument that an output aliases is written by the call: it is compared as an inout. The alias
    is that very tensor: present and strided exactly when its target is."""
    by_name = {a.name: a for a in args}
    for a in args:
        if a.alias:
            target = by_name[a.alias]
            a.present, a.row_stride = target.present, target.row_stride
            if target.role == "in":
                target.role = "inout"
    return args


def traffic(spec: KernelSpec, names: dict, args: list[ArgSpec]) -> tuple[int, int, int, str]:
    """(bytes, bytes read, bytes written, how they were split) of one case: the spec's `bytes_read` and
    `bytes_written` where it gives them (validation holds them to add up to `bytes`), else `bytes` split
    by the arguments' roles (harness.job.split_bytes: in read, out written, inout both, scratch neither)."""
    total = int(evaluate(spec.raw["bytes"], names))
    if spec.raw.get("bytes_read") is not None and spec.raw.get("bytes_written") is not None:
        return total, int(evaluate(spec.raw["bytes_read"], names)), int(evaluate(spec.raw["bytes_written"], names)), "spec"
    return (total, *split_bytes(total, args))


def cases(spec: KernelSpec, extra_shapes: list[dict] | None = None) -> tuple[list[Case], dict[str, Variant]]:
    """All cases of the suite but those `shapes.exclude` names (plus `extra_shapes` proposed by a testing
    agent) and their variants."""
    variants: dict[str, Variant] = {}
    out: list[Case] = []
    excluded = spec.excluded
    shape_cases = spec.shape_cases()
    for dims in extra_shapes or []:
        shape_cases.append(replace(shape_cases[0], label="extra", dims=dict(dims), edge=True))
    for index, dtype in enumerate(spec.dtypes):
        for sc in shape_cases:
            case_id = sc.case_id(dtype)
            if case_id in excluded:
                continue
            names = spec.names_for(sc.dims, dtype)
            variant = _variant(spec, names)
            variants.setdefault(variant.key, variant)
            args = _in_place([_arg(a, names) for a in spec.arguments])
            total, read, written, split = traffic(spec, names, args)
            out.append(Case(
                id=case_id,
                band=band_of(spec.token_count(sc.dims)),
                label=sc.label, dtype=dtype, dims=dict(sc.dims), variant=variant.key,
                bytes=total, args=args, timed=index == 0 and not sc.edge,
                bytes_read=read, bytes_written=written, bytes_split=split,
            ))
    return out, variants


def make_job(spec: KernelSpec, tree: SglangTree, *, candidate_source: str | None = None,
             options: Options | None = None, extra_shapes: list[dict] | None = None,
             label: str = "candidate", kernel_rel: str | None = None) -> Job:
    """The harness job of `spec` against `tree`. `kernel_rel`: where the kernel file lives below csrc/
    when it moved in this tree (recheck, diff-versions)."""
    build = spec.raw["build"]
    case_list, variants = cases(spec, extra_shapes)
    kernel_file = spec.kernel_file
    if ".." in Path(kernel_file).parts:  # outside the jit csrc (kda_kernels/csrc): the path on this machine
        kernel_file = os.path.normpath(os.path.join(tree.csrc_dir, kernel_file))
    job = Job(
        name=spec.name,
        entry=spec.entry,
        kernel_file=kernel_file,
        build=BuildBase(
            source_root=str(tree.csrc_dir),
            include_dirs=[str(tree.include_dir)] + registry.source_roots(
                tree, list(build.get("cuda_files", [])) + list(build.get("cpp_files", [])))
            + list(build.get("extra_include_paths", [])),
            cuda_files=list(build.get("cuda_files", [])),
            cpp_files=list(build.get("cpp_files", [])),
            extra_cflags=list(build.get("extra_cflags", [])),
            extra_ldflags=list(build.get("extra_ldflags", [])),
            header_only=bool(build.get("header_only", True)),
        ),
        variants=variants,
        cases=case_list,
        tolerance={dt: dict(v) for dt, v in spec.raw["tolerance"].items()},
        reference=str(spec.reference_path) if spec.reference_path else None,
        candidate_source=candidate_source,
        candidate_label=label,
        options=options or Options(),
    )
    if kernel_rel and kernel_rel != spec.kernel_file:
        job.kernel_file = kernel_rel
        job.build.cuda_files = [kernel_rel if f == spec.kernel_file else f for f in job.build.cuda_files]
        job.build.cpp_files = [kernel_rel if f == spec.kernel_file else f for f in job.build.cpp_files]
    return job


def spec_build_requests(spec: KernelSpec, tree: SglangTree, *, arch: str | None = None, variant: str | None = None,
                        candidate_source: str | None = None) -> list[tuple[str, str, BuildRequest]]:
    """(side, variant key, request) of the spec's build variants; `variant` picks one by index or by a
    substring of its key."""
    job = make_job(spec, tree, candidate_source=candidate_source, label="dry-run")
    keys = list(dict.fromkeys(case.variant for case in job.cases))
    if variant is not None:
        chosen = ([keys[int(variant)]] if variant.isdigit() and int(variant) < len(keys)
                  else [k for k in keys if variant in k])
        if not chosen:
            raise AstraError(f"--variant {variant}: no variant of {spec.name} matches; variants: " + "; ".join(keys))
        job.cases = [case for case in job.cases if case.variant in chosen]
    return build_requests(job, arch=arch)
