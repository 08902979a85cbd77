"""A progress line for a long step (`extract --all`, `parse-check`, `list`, `build`): counts, time spent and
time left, redrawn in place on stderr. Only a terminal gets it: stdout (the result) is never touched, and a
log file or a pipe on stderr stays free of it, as does a command run with `--quiet`.

    progress = Progress("astra parse-check: parsing sources", enabled=on_terminal(quiet=args.quiet))
    parse_buildable(tree, progress=progress)     # the library calls progress(done, total) as items finish
    progress.close()                             # the line is cleared before the result is printed
"""

from __future__ import annotations

import sys
import threading
import time
from typing import TextIO


def on_terminal(*, quiet: bool = False, stream: TextIO | None = None) -> bool:
    """Whether progress may be drawn: `stream` (stderr) is a terminal and the user did not ask for quiet."""
    stream = stream or sys.stderr
    return not quiet and bool(getattr(stream, "isatty", lambda: False)())


class Progress:
    """`progress(done, total)` redraws `WHAT: done/total (12s, about 30s left)`, at most every `every_s`
    seconds (and always for the last item); safe to call from several threads."""

    def __init__(self, what: str, *, enabled: bool, stream: TextIO | None = None, every_s: float = 0.2):
        self.what, self.enabled, self.every_s = what, enabled, every_s
        self.stream = stream or sys.stderr
        self._began = time.monotonic()
        self._drawn_at = 0.0
        self._drawn = False
        self._lock = threading.Lock()

    def __call__(self, done: int, total: int) -> None:
        if not self.enabled:
            return
        with self._lock:
            now = time.monotonic()
            if now - self._drawn_at < self.every_s and done < total:
                return
            self._drawn_at, self._drawn = now, True
            self.stream.write(f"\r\x1b[K{self.line(done, total, now - self._began)}")
            self.stream.flush()

    def line(self, done: int, total: int, elapsed: float) -> str:
        """The text of the line (no terminal codes): `astra parse-check: 12/189 files (3s, about 44s left)`."""
        left = f", about {elapsed / done * (total - done):.0f}s left" if 0 < done < total else ""
        return f"{self.what}: {done}/{total} ({elapsed:.0f}s{left})"

    def close(self) -> None:
        """Clear the line, so what follows starts on a clean one."""
        with self._lock:
            if self._drawn:
                self.stream.write("\r\x1b[K")
                self.stream.flush()
                self._drawn = False

