"""Running `astra` as a hostile user would, for the robustness tests.

`astra(...)` runs the real command line in a child process (a hang is caught by the process's time limit,
a memory blow-up stays in the child) and times the command's answer from the call of `astra.cli.main`:
the interpreter's start and the command's imports (torch, for some) are not the answer and vary with the
machine's load. `refused(...)` makes the checks every test makes: the documented exit code, one line on
stderr, no traceback, an answer within ANSWER_S seconds. `home(...)` is a private ASTRA_HOME that reuses
the test cache's SGLang wheels, so nothing is downloaded; `checkout(...)` a minimal SGLang checkout.
"""

from __future__ import annotations

import os
import pty
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
ANSWER_S = 5.0  # the command's answer, from `main()` on
LIMIT_S = 240.0  # the whole child process: interpreter start and imports on a loaded machine included

_RUNNER = """
import sys, time
from astra import cli
clock, argv = sys.argv[1], sys.argv[2:]
cli._handler(argv[0])  # the command's module is imported before the clock starts
began = time.monotonic()
try:
    code = cli.main(argv)
finally:
    with open(clock, "w") as fh:
        fh.write(str(time.monotonic() - began))
sys.exit(code)
"""


@dataclass
class Answer:
    code: int
    out: str
    err: str
    seconds: float  # from the call of astra.cli.main to its return


def astra(*args: str, env: dict | None = None, limit_s: float = LIMIT_S) -> Answer:
    """`astra ARGS...` in a child process with `env` added to this process's environment."""
    clock = Path(os.environ.get("TMPDIR", "/tmp")) / f"astra-answer-{os.getpid()}-{time.monotonic_ns()}"
    try:
        proc = subprocess.run([sys.executable, "-c", _RUNNER, str(clock), *args], capture_output=True, text=True,
                              env={**os.environ, **(env or {})}, timeout=limit_s, cwd=REPO)
        seconds = float(clock.read_text()) if clock.exists() else float("inf")
    finally:
        clock.unlink(missing_ok=True)
    return Answer(proc.returncode, proc.stdout, proc.stderr, seconds)


def with_stderr_on_terminal(command: list[str], env: dict, timeout_s: float) -> tuple[int, str, str]:
    """`command` (run in the repository) with stdout on a pipe and stderr on a pseudo-terminal, as a user at a
    terminal sees it: (exit code, stdout, what the terminal showed, CRLF as LF)."""
    main, side = pty.openpty()
    proc = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=side, text=True)
    os.close(side)
    seen: list[bytes] = []

    def read() -> None:
        while True:
            try:
                chunk = os.read(main, 4096)
            except OSError:  # EIO: the command closed the terminal
                return
            if not chunk:
                return
            seen.append(chunk)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    out, _ = proc.communicate(timeout=timeout_s)
    reader.join(10)
    os.close(main)
    return proc.returncode, out, b"".join(seen).decode(errors="replace").replace("\r\n", "\n")


def refused(answer: Answer, code: int, *needles: str) -> str:
    """The answer is exit `code` with one line on stderr holding every needle, no traceback, within ANSWER_S."""
    assert answer.code == code, (answer.code, answer.err, answer.out[-2000:])
    assert "Traceback" not in answer.err + answer.out, answer.err
    lines = answer.err.strip().splitlines()
    assert len(lines) == 1, answer.err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    assert answer.seconds < ANSWER_S, answer.seconds
    return lines[0]


def home(tmp_path: Path, *, name: str = "home") -> Path:
    """A private ASTRA_HOME under `tmp_path` whose `sglang/` (unpacked wheels) is the test cache's."""
    root = tmp_path / name
    root.mkdir(parents=True)
    cache = Path(os.environ["ASTRA_HOME"]) / "sglang"
    cache.mkdir(parents=True, exist_ok=True)
    (root / "sglang").symlink_to(cache)
    return root


def checkout(root: Path) -> Path:
    """A minimal SGLang checkout (`python/sglang/kernels/jit/{csrc,include}`, version 9.1.2) at `root`."""
    pkg = root / "python" / "sglang"
    (pkg / "kernels" / "jit" / "csrc" / "elementwise").mkdir(parents=True)
    (pkg / "kernels" / "jit" / "include").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (root / "python" / "pyproject.toml").write_text('[project]\nname = "sglang"\nversion = "9.1.2"\n')
    return root


def loader(root: Path, name: str, text: str) -> Path:
    """A loader file `sglang/kernels/ops/demo/NAME.py` of the checkout at `root`."""
    path = root / "python" / "sglang" / "kernels" / "ops" / "demo" / f"{name}.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def files_under(root: Path) -> set[Path]:
    """Every file and link below `root` (links not followed)."""
    return {p for p in root.rglob("*") if p.is_file() or p.is_symlink()}


def rmsnorm_raw() -> dict:
    """The committed rmsnorm spec, parsed: the base the spec tests change one thing of."""
    import yaml

    from astra.spec import model as spec_mod

    return yaml.safe_load(spec_mod.spec_path("rmsnorm").read_text())


def spec_folder(tmp_path: Path, raw: dict | None = None, *, text: str | None = None, name: str = "rmsnorm") -> dict:
    """A spec folder `tmp_path/specs/NAME` holding `raw` (or `text`) and a reference; the environment that makes
    it the only spec (`ASTRA_SPECS`)."""
    import yaml

    folder = tmp_path / "specs" / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "kernel.yaml").write_text(text if text is not None else yaml.safe_dump(raw, sort_keys=False))
    (folder / "reference.py").write_text("def reference(args, dims):\n    return {}\n")
    return {"ASTRA_SPECS": str(tmp_path / "specs")}
