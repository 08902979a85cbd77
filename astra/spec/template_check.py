"""Does a draft's build compile? nvcc `--cubin` on the CPU machine, cached.

`check_request(request)` compiles a harness BuildRequest's generated CUDA unit for the device only:
the device front end instantiates every template and evaluates every static_assert, then ptxas; no
host compile and no link, about a fifth of a full build. Results are cached under
$ASTRA_HOME/template-checks, keyed by the sources' digest, the command, the generated unit and the
tool versions. `check_variants(spec, tree)` checks a draft spec's build variants, `first_error` and
`failed_assert` read what a failed compile says.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from astra import paths
from astra.cxx.text import blank
from astra.sglang.constexpr_eval import evaluate
from astra.sglang.template_params import call_condition
from astra.sglang.tree import SglangTree
from astra.spec import jobs
from astra.spec.model import KernelSpec
from astra.text import one_line
from harness import Options, build_requests
from harness.building.nvcc_build import BuildRequest, plan_build, trim_errors
from harness.building.toolchain import BuildFailure, nvcc_path, tool_version, tvm_ffi_version
from harness.worker import children

CHECK_VERSION = "astra-template-check-1"
CHECK_TIMEOUT_S = 300.0
CHECK_ARCH = "90a"


@dataclass
class CheckResult:
    ok: bool
    error: str  # the first compiler diagnostic, one line ("" when ok)
    log: str
    seconds: float
    cached: bool = False


def nvcc_available() -> bool:
    try:
        nvcc_path()
    except BuildFailure:
        return False
    return True


def check_command(request: BuildRequest, workdir: Path) -> tuple[list[str], str, str]:
    """(the device-only nvcc command, the generated unit's text, the sources' digest) of `request`."""
    plan = plan_build(request, workdir)
    for (filename, is_cuda, text), command in zip(plan.units, plan.commands):
        if is_cuda and text is not None:
            fast = []
            skip = 0
            for arg in command:
                if skip:
                    skip -= 1
                    continue
                if arg in ("-MD", "-Xptxas=-v"):
                    continue
                if arg in ("-MF", "-o"):
                    skip = 1
                    continue
                fast.append("--cubin" if arg == "-c" else arg)
            return [*fast, "-o", "check.cubin"], text, plan.tree_digest
    raise BuildFailure("no generated CUDA unit to check (a module with its own .cu files)")


def check_request(request: BuildRequest, timeout_s: float = CHECK_TIMEOUT_S) -> CheckResult:
    """Compile `request`'s CUDA unit for the device only (cached)."""
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="astra-tcheck-") as tmp:
        work = Path(tmp)
        try:
            command, text, digest = check_command(request, work)
        except BuildFailure as err:
            return CheckResult(False, one_line(str(err), 300), str(err), time.monotonic() - start)
        key = hashlib.sha256(json.dumps([CHECK_VERSION, command, text, digest, tool_version(command[0]),
                                         tvm_ffi_version()]).encode()).hexdigest()
        cache = paths.sub("template-checks") / key[:2] / f"{key}.json"
        try:
            hit = json.loads(cache.read_text())
            error = (arch_limit(hit["log"]) or hit["error"]) if hit["error"].startswith("ptxas") else hit["error"]
            return CheckResult(hit["ok"], error, hit["log"], hit["seconds"], cached=True)
        except (OSError, ValueError, KeyError):
            pass
        (work / "cuda.cu").write_text(text)
        try:
            proc = children.run(command, cwd=work, text=True, errors="replace", timeout=timeout_s)
            log, ok = proc.stdout + proc.stderr, proc.returncode == 0
            error = "" if ok else first_error(log, [request.source_root, *request.include_dirs])
        except subprocess.TimeoutExpired:
            log, ok, error = "", False, f"the check timed out after {timeout_s:g} s"
        result = CheckResult(ok, error, log[-20000:], round(time.monotonic() - start, 2))
    if "timed out" not in result.error:
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp_file = cache.with_name(f".{cache.name}.{os.getpid()}.tmp")
        tmp_file.write_text(json.dumps({"ok": result.ok, "error": result.error, "log": result.log,
                                        "seconds": result.seconds, "command": command}))
        os.replace(tmp_file, cache)
    return result


def first_error(log: str, roots: list[str]) -> str:
    """The compiler's first diagnostic with the line that follows it (the failing source), one line;
    PTX the target lacks is said as such (see `arch_limit`)."""
    if limit := arch_limit(log):
        return limit
    lines = trim_errors(log, roots, max_errors=1, max_lines=3).splitlines()
    return one_line(" ".join(line.strip() for line in lines[:2]), 300)


_PTX_TARGET = re.compile(r"error\s*:\s*(?:Instruction|Feature) '([^']+)' not supported on \.target '(\w+)'")


def arch_limit(log: str) -> str | None:
    """ptxas refusing instructions the target lacks (`tcgen05.mma` on sm_90a): why no template argument
    helps, one line; None when the log says no such thing."""
    found = list(dict.fromkeys(m.group(1) for m in _PTX_TARGET.finditer(log)))
    if not found:
        return None
    target = _PTX_TARGET.search(log).group(2)
    return (f"ptxas: {', '.join(found[:4])}{' ...' if len(found) > 4 else ''} not supported on .target "
            f"{target} (PTX of a newer architecture, e.g. sm_100a)")


def loader_refusal(source: str, loader: str) -> str | None:
    """The Python loader's own refusal of the target: `if major < 10 ...: raise` in the body of function
    `loader` of `source`, true for sm_90 (major 9, minor 0)."""
    body = re.search(rf"^def {re.escape(loader)}\(.*?(?=^[^\s)])", source + "\nEND", re.M | re.S)
    for m in re.finditer(r"^\s*if\s+(.+?):\s*\n\s*raise\b", body.group(0) if body else "", re.M):
        cond = m.group(1).replace(" or ", " || ").replace(" and ", " && ").replace("not ", "!")
        if re.search(r"\b(major|minor)\b", cond) and evaluate(cond, {"major": 9, "minor": 0}) is True:
            return f"the loader {loader} refuses it (`if {m.group(1)}: raise`, with major=9)"
    return None


def failed_condition(log: str) -> str | None:
    """What a failed compile names: the condition of its failed static_assert, else the expression of the
    constexpr definition its first error points at (`division by zero` in `N / NUM_WARPS`)."""
    cond = failed_assert(log)
    if cond is not None:
        return cond
    m = re.search(r"^(\S+?)\((\d+)\): error:", log, re.M)
    if not m:
        return None
    try:
        line = Path(m.group(1)).read_text(errors="replace").splitlines()[int(m.group(2)) - 1]
    except (OSError, IndexError):
        return None
    d = re.search(r"\bconstexpr\b[^=;]*=\s*([^;]+);", blank(line, literals=False))
    return d.group(1).strip() if d else None


def failed_assert(log: str) -> str | None:
    """The condition of the first static_assert that failed, read from its source line."""
    m = re.search(r"^(\S+?)\((\d+)\): error: static assertion failed", log, re.M)
    if not m:
        return None
    try:
        lines = Path(m.group(1)).read_text(errors="replace").splitlines()
    except OSError:
        return None
    text = blank("\n".join(lines[int(m.group(2)) - 1:int(m.group(2)) + 8]), literals=False)
    at = re.search(r"\bstatic_assert\s*\(", text)
    return call_condition(text, at.end() - 1) if at else None


def spec_requests(spec: dict, tree: SglangTree) -> list[tuple[str, BuildRequest]]:
    """(variant key, build request) of every build variant of the draft `spec`, for sm_90a."""
    job = jobs.make_job(KernelSpec(path=Path("draft.yaml"), raw=spec), tree, options=Options(seeds=[0], modes=[]),
                        label="template-check")
    return [(key, req) for _, key, req in build_requests(job, arch=CHECK_ARCH)]


def check_variants(spec: dict, tree: SglangTree, keys: list[str] | None = None,
                   workers: int = 1) -> dict[str, CheckResult]:
    """{variant key: result} for the spec's variants (all, or `keys`), `workers` compiles at once."""
    requests = [(key, req) for key, req in spec_requests(spec, tree) if keys is None or key in keys]
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        results = list(pool.map(lambda item: check_request(item[1]), requests))
    return {key: result for (key, _), result in zip(requests, results)}
