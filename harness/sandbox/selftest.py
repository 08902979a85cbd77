"""The sandbox proves itself: a C payload of our own tries every forbidden action, and nothing happens.

    result = run_self_test()        # {"enforced", "landlock_abi", "seccomp", "self_test": {...}, ...}

Three processes, so that nothing the payload tries can reach the caller:

    caller       run_self_test(): starts the watcher, reads its JSON
    watcher      python -m harness.sandbox.selftest   builds payload.c, other.c and clean.c with the C
                 compiler, lays out a scratch directory (a writable directory for the worker, an
                 "outside" directory, a secret file, the other library), listens on a TCP port of
                 127.0.0.1, catches SIGUSR2, starts the worker and, once it has ended, checks every
                 effect itself
    worker       python -m harness.sandbox.selftest --worker ...   a sandboxed worker exactly as a candidate
                 process is one (harness.sandbox.confine): floor, warm-up, seal; loads the clean library
                 and the payload (whose constructor tries everything), locks executable mappings, calls
                 the clean library and the payload's exported function (which tries everything again)

Each action of each phase ("constructor.execve", "call.read_secret", ...) is "blocked" when the payload
reports that it failed AND the watcher finds no effect: no directory or file made outside, the secret
nowhere in the worker's output, no TCP connection queued, no marker left by a program, library or
process that should never have run, no signal received. Otherwise it is "ALLOWED". `errors` names the
errno each attempt got: EPERM is seccomp's answer, EACCES Landlock's.

`sandbox="off"` runs the same worker unsandboxed (skipping the exec attempts, which would replace it):
the control that shows every check can see an effect when there is one.
"""

from __future__ import annotations

import argparse
import ctypes
import errno
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCES = {"payload": "payload.c", "other": "other.c", "clean": "clean.c"}
SECRET = "astra-selftest-secret-4d1f0c"
REPORT_BYTES = 1 << 16
EXEC_ACTIONS = ("execve", "raw_syscall_execve")  # replace the process when allowed: skipped by the control run
TIMEOUT_S = 300.0
# what each action leaves behind when it is allowed: (where, name) with {phase} filled in; checked by the watcher
OUTSIDE_EFFECTS = {"raw_syscall_mkdir": "raw-mkdir-{phase}", "int80_mkdir": "int80-mkdir-{phase}",
                   "write_outside": "written-{phase}"}
MARKERS = {"execve_shell": "exec-ran-{phase}", "raw_syscall_execve": "raw-exec-ran-{phase}",
           "dlopen_outside": "other-ran-{phase}", "dlopen_written": "nested-written-{phase}",
           "memfd_dlopen": "nested-memfd-{phase}", "tmpfile_dlopen": "nested-tmpfile-{phase}",
           "fork": "fork-ran-{phase}"}
ACTIONS = ("execve", "execve_shell", "raw_syscall_mkdir", "raw_syscall_execve", "int80_mkdir", "write_outside",
           "read_secret", "connect_tcp", "dlopen_outside", "dlopen_written", "read_written", "memfd_dlopen",
           "tmpfile_dlopen", "fork", "kill_parent", "ptrace_parent", "io_uring", "unshare")
CALL_ONLY = ("mmap_exec", "mprotect_exec")  # allowed by design while the module loads (stage 1)


class SelfTestError(RuntimeError):
    """The self-test could not run (no C compiler, the worker did not start): not a verdict on the sandbox."""


def c_compiler() -> list[str]:
    """$CC, else cc or gcc, else the host C++ compiler nvcc uses (told the source is C)."""
    for name in (os.environ.get("CC"), "cc", "gcc"):
        found = shutil.which(name) if name else None
        if found:
            return [found]
    from harness.building.toolchain import BuildFailure, host_compiler

    try:
        return [host_compiler(), "-x", "c"]
    except BuildFailure as error:
        raise SelfTestError(f"no C compiler to build the self-test payload: {error}") from None


def build_libraries(out: Path) -> dict[str, Path]:
    """payload.so, other.so and clean.so built into `out`."""
    compiler = c_compiler()
    built = {}
    for name, source in SOURCES.items():
        target = out / f"{name}.so"
        done = subprocess.run([*compiler, "-shared", "-fPIC", "-O1", "-o", str(target), str(HERE / source)],
                              capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise SelfTestError(f"building {source} failed: {(done.stderr or done.stdout).strip()[:400]}")
        built[name] = target
    return built


# ---------------------------------------------------------------- the worker (sandboxed)


def worker(payload: str, clean: str, writable: str, sandbox: str) -> int:
    """The sandboxed worker: report on stdout as one JSON line (the payload's records, the clean value)."""
    from harness.sandbox.confine import Confinement

    box = Confinement(sandbox, writable=[writable], readable=[payload, clean])
    box.begin()
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    box.warm_up(device)
    box.seal()
    clean_lib = ctypes.CDLL(clean)
    payload_lib = ctypes.CDLL(payload)  # its constructor tries everything here
    box.lock_exec()
    value = clean_lib.astra_clean_value()
    payload_lib.astra_selftest_call()
    buffer = ctypes.create_string_buffer(REPORT_BYTES)
    used = payload_lib.astra_selftest_report(buffer, REPORT_BYTES)
    print(json.dumps({"records": buffer.raw[:used].decode(errors="replace"), "clean": value, "device": device,
                      "sandbox": box.report()}), flush=True)
    return 0


# ---------------------------------------------------------------- the watcher


def parse_records(text: str) -> dict[str, dict]:
    """{"phase.action": {"did": bool, "errno": int, "detail": str}} from the payload's report lines."""
    records = {}
    for line in text.splitlines():
        parts = line.split(" ", 4)
        if len(parts) < 4:
            continue
        phase, action, did, err = parts[:4]
        records[f"{phase}.{action}"] = {"did": did == "did=1", "errno": int(err.removeprefix("errno=") or 0),
                                        "detail": parts[4] if len(parts) > 4 else ""}
    return records


def _errno_name(code: int) -> str:
    return errno.errorcode.get(code, str(code)) if code else "no error"


def judge(records: dict[str, dict], scratch: Path, output: str, connections: int, signals: int,
          sandbox: str) -> tuple[dict[str, str], dict[str, str]]:
    """(result per action, errno per action): see the module docstring."""
    skipped = {"execve", "execve_shell", "raw_syscall_execve"} if sandbox == "off" else set()
    results, errors = {}, {}
    for phase in ("constructor", "call"):
        for action in ACTIONS + (CALL_ONLY if phase == "call" else ()):
            if action in skipped:
                continue
            key = f"{phase}.{action}"
            record = records.get(key)
            effect = False
            if action in OUTSIDE_EFFECTS:
                effect = (scratch / "outside" / OUTSIDE_EFFECTS[action].format(phase=phase)).exists()
            elif action in MARKERS:
                effect = (scratch / "writable" / MARKERS[action].format(phase=phase)).exists()
            elif action == "read_secret":
                effect = SECRET in output
            elif action == "connect_tcp":
                effect = connections > 0
            elif action == "kill_parent":
                effect = signals > 0
            blocked = record is not None and not record["did"] and not effect
            results[key] = "blocked" if blocked else ("ALLOWED" if record is not None or effect else "not tried")
            errors[key] = _errno_name(record["errno"]) if record else "no record"
    return results, errors


def _queued_connections(listener: socket.socket) -> int:
    listener.setblocking(False)
    count = 0
    while True:
        try:
            conn, _ = listener.accept()
        except (BlockingIOError, OSError):
            return count
        conn.close()
        count += 1


def watch(sandbox: str = "enforce", keep: Path | None = None) -> dict:
    """Build, lay out, run the worker, check the effects; the result as a dict (see run_self_test). With
    `keep`, the scratch directory is that (empty) directory and stays, for a test to look at."""
    received = []
    previous = signal.signal(signal.SIGUSR2, lambda *_: received.append(1))
    scratch = keep or Path(tempfile.mkdtemp(prefix="astra-sandbox-selftest-"))
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        libs = build_libraries(scratch)
        (scratch / "writable").mkdir()
        (scratch / "outside").mkdir()
        secret = scratch / "secret.txt"
        secret.write_text(SECRET + "\n")
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        env = dict(os.environ, ASTRA_SELFTEST_OUTSIDE=str(scratch / "outside"), ASTRA_SELFTEST_SECRET=str(secret),
                   ASTRA_SELFTEST_WRITABLE=str(scratch / "writable"), ASTRA_SELFTEST_OTHER=str(libs["other"]),
                   ASTRA_SELFTEST_SELF=str(libs["payload"]), ASTRA_SELFTEST_PORT=str(listener.getsockname()[1]),
                   ASTRA_SELFTEST_SKIP=",".join(EXEC_ACTIONS) if sandbox == "off" else "")
        env.pop("ASTRA_SELFTEST_NESTED", None)
        command = [sys.executable, "-m", "harness.sandbox.selftest", "--worker", "--payload", str(libs["payload"]),
                   "--clean", str(libs["clean"]), "--writable", str(scratch / "writable"), "--sandbox", sandbox]
        try:
            done = subprocess.run(command, cwd=scratch / "writable", env=env, capture_output=True, text=True,
                                  timeout=TIMEOUT_S, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise SelfTestError(f"the sandboxed worker did not finish within {TIMEOUT_S:g} s") from None
        report = _last_json(done.stdout)
        output = done.stdout + done.stderr
        records = parse_records(report.get("records", "")) if report else {}
        results, errors = judge(records, scratch, output, _queued_connections(listener), len(received), sandbox)
        return {"worker_returncode": done.returncode, "worker_output": output[-4000:],
                "clean_library": "ran" if report and report.get("clean") == 42 else "FAILED",
                "device": (report or {}).get("device"), "sandbox": (report or {}).get("sandbox"),
                "self_test": results, "errors": errors}
    finally:
        listener.close()
        signal.signal(signal.SIGUSR2, previous)
        if keep is None:
            shutil.rmtree(scratch, ignore_errors=True)


def _last_json(stdout: str) -> dict | None:
    for line in reversed(stdout.splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                return None
    return None


# ---------------------------------------------------------------- the caller


def run_self_test(sandbox: str = "enforce", keep: Path | None = None, timeout_s: float = TIMEOUT_S + 60) -> dict:
    """Run the watcher in a child process and return its result:
    {"worker_returncode", "worker_output" (its stdout and stderr, the end), "clean_library": "ran"|"FAILED",
     "device", "sandbox": the worker's report, "self_test": {"constructor.execve": "blocked"|"ALLOWED"|
     "not tried", ...}, "errors": {...: "EPERM"}}. `keep`: an empty directory the watcher works in and
    leaves (outside/, writable/, secret.txt, the built libraries). Raises SelfTestError when it could not
    run at all."""
    from harness.worker.process_group import harness_env

    command = [sys.executable, "-m", "harness.sandbox.selftest", "--sandbox", sandbox]
    command += ["--keep", str(keep)] if keep else []
    with tempfile.TemporaryDirectory(prefix="astra-sandbox-watch-") as cwd:
        done = subprocess.run(command, cwd=cwd, env=harness_env(), capture_output=True, text=True, timeout=timeout_s,
                              stdin=subprocess.DEVNULL)
    result = _last_json(done.stdout)
    if result is None or "self_test" not in result:
        raise SelfTestError(result.get("error") if result else
                            f"the self-test watcher exited with {done.returncode}: {done.stderr.strip()[-400:]}")
    return result


def all_blocked(result: dict) -> bool:
    """Every action blocked and the clean library ran."""
    return result.get("clean_library") == "ran" and bool(result.get("self_test")) and all(
        value == "blocked" for value in result["self_test"].values())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.sandbox.selftest", description=__doc__.split("\n\n")[0])
    parser.add_argument("--worker", action="store_true", help="(started by the watcher) be the sandboxed worker")
    parser.add_argument("--payload")
    parser.add_argument("--clean")
    parser.add_argument("--writable")
    parser.add_argument("--sandbox", default="enforce", choices=("enforce", "off"))
    parser.add_argument("--keep", help="work in this empty directory and leave it (tests look at it)")
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args.payload, args.clean, args.writable, args.sandbox)
    try:
        result = watch(args.sandbox, Path(args.keep) if args.keep else None)
    except SelfTestError as error:
        print(json.dumps({"error": str(error)}))
        return 2
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
