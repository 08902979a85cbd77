"""`astra doctor [--json]`: can this machine judge candidates? One look at everything judging needs.

    sandbox            Landlock (its ABI) and seccomp, and the self-test (harness.sandbox.selftest): a C
                       payload of our own tries every forbidden action in a sandboxed child process, at
                       load time and inside a call; each must be blocked, and a clean library must run
    nvcc               found, and its version (candidates are built with it)
    gpu                torch, and whether it sees a CUDA GPU (which one)
    compute_sanitizer  found (checking a candidate needs it unless --no-sanitizer)
    ncu                found (`bench --ncu` and the LLM agent's profiles; optional)
    libclang           loads (`astra extract` and the optimizer's rewrite passes parse with it; judging does not)
    can_judge          the sandbox enforced with every action blocked, nvcc, a GPU

Exit 0 when the sandbox is enforced here and every self-test action is blocked (the machine may still
lack a GPU: `can_judge` says so); 16 otherwise (docs/exit-codes.md). Runs on a machine without a GPU.
"""

from __future__ import annotations

import json

from astra.errors import SandboxMissing


def sandbox_report() -> dict:
    from harness.sandbox import support
    from harness.sandbox.selftest import SelfTestError, all_blocked, run_self_test
    from harness.sandbox.support import opted_out

    found = support()
    report = {"enforced": False, "landlock_abi": found.landlock_abi, "seccomp": found.seccomp,
              "problems": list(found.problems), "opted_out": opted_out(), "self_test": {}}
    if not found.usable:
        return report
    try:
        result = run_self_test()
    except SelfTestError as error:
        report["problems"].append(f"the self-test did not run: {error}")
        return report
    report.update(self_test=result["self_test"], errors=result["errors"], clean_library=result["clean_library"],
                  steps=(result.get("sandbox") or {}).get("steps", []), device=result.get("device"))
    allowed = sorted(action for action, value in result["self_test"].items() if value != "blocked")
    if allowed:
        report["problems"].append(f"not blocked: {', '.join(allowed)}")
    if result["clean_library"] != "ran":
        report["problems"].append("the clean library did not load and run inside the sandbox: "
                                  + result.get("worker_output", "")[-300:])
    report["enforced"] = all_blocked(result) and not report["opted_out"]
    if report["opted_out"]:
        report["problems"].append(f"turned off by {report['opted_out']}: candidates would run unsandboxed")
    return report


def tool_report(name: str) -> dict:
    from harness.building.toolchain import cuda_tool

    path = cuda_tool(name)
    return {"found": path is not None, "path": path}


def nvcc_report() -> dict:
    from harness.building.toolchain import BuildFailure, nvcc_path, nvcc_release

    try:
        path = nvcc_path()
        major, minor = nvcc_release()
    except BuildFailure as error:
        return {"found": False, "path": None, "version": None, "problem": str(error)}
    return {"found": True, "path": path, "version": f"{major}.{minor}"}


def libclang_report() -> dict:
    from astra.sglang.clang_env import libclang_missing

    problem = libclang_missing()
    return {"found": problem is None, "problem": problem}


def gpu_report() -> dict:
    try:
        import torch
    except ImportError as error:
        return {"available": False, "torch": None, "name": None, "problem": f"torch not importable: {error}"}
    available = torch.cuda.is_available()
    return {"available": available, "torch": torch.__version__, "torch_cuda": torch.version.cuda,
            "name": torch.cuda.get_device_name(0) if available else None}


def diagnose() -> dict:
    report = {"sandbox": sandbox_report(), "nvcc": nvcc_report(), "gpu": gpu_report(),
              "compute_sanitizer": tool_report("compute-sanitizer"), "ncu": tool_report("ncu"),
              "libclang": libclang_report()}
    missing = [what for what, ok in (("the sandbox", report["sandbox"]["enforced"]), ("nvcc", report["nvcc"]["found"]),
                                     ("a CUDA GPU", report["gpu"]["available"])) if not ok]
    report["can_judge"] = not missing
    report["missing"] = missing
    return report


def _line(name: str, text: str) -> str:
    return f"{name:<18} {text}"


def format_text(report: dict) -> str:
    box = report["sandbox"]
    tests = box.get("self_test") or {}
    blocked = sum(value == "blocked" for value in tests.values())
    if box["enforced"]:
        state = (f"enforced (Landlock ABI {box['landlock_abi']}, seccomp): {blocked}/{len(tests)} self-test actions "
                 f"blocked, a clean library loaded and ran")
    else:
        state = "NOT enforced: " + ("; ".join(box["problems"]) or "unknown")
    nvcc, gpu = report["nvcc"], report["gpu"]
    lines = [_line("sandbox", state),
             _line("nvcc", f"{nvcc['version']} ({nvcc['path']})" if nvcc["found"] else f"not found: {nvcc.get('problem')}"),
             _line("GPU", gpu["name"] if gpu["available"] else f"none visible to torch {gpu.get('torch') or '(missing)'}"),
             _line("compute-sanitizer", report["compute_sanitizer"]["path"] or "not found"),
             _line("ncu", report["ncu"]["path"] or "not found (optional)"),
             _line("libclang", "loads" if report["libclang"]["found"]
                   else f"missing: extract and the rewrite passes need it: {report['libclang']['problem']}"),
             _line("can judge", "yes" if report["can_judge"] else f"no: missing {', '.join(report['missing'])}")]
    return "\n".join(lines)


def cmd_doctor(args) -> int:
    report = diagnose()
    print(json.dumps(report, indent=1) if args.json else format_text(report))
    return 0 if report["sandbox"]["enforced"] else SandboxMissing.exit_code
