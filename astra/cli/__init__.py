"""`astra` command line. Errors become one line and an exit code here, at the edge, and nowhere else.

Each command is a small function in one of the command-group modules (kernels, verify, optimize,
patches) that turns arguments into typed options, calls the library, and prints.
"""

from __future__ import annotations

import errno
import importlib
import sys

from astra.cli.parser import build_parser
from astra.errors import AstraError, SpecError
from harness.worker import children


def _message(err: AstraError) -> str:
    """The error as the user reads it: a spec with one problem is one line."""
    if isinstance(err, SpecError) and len(err.problems) == 1:
        return f"{err.path}: {err.problems[0]}"
    return str(err)


_HANDLERS = {  # command -> (module of astra.cli, function); only the command's own module is imported
    "list": ("kernels", "cmd_list"), "extract": ("kernels", "cmd_extract"), "build": ("kernels", "cmd_build"),
    "parse-check": ("kernels", "cmd_parse_check"), "spec-check": ("kernels", "cmd_spec_check"),
    "passes": ("passes", "cmd_passes"),
    "check": ("verify", "cmd_check"), "bench": ("verify", "cmd_bench"),
    "optimize": ("optimize", "cmd_optimize"), "eval": ("optimize", "cmd_eval"), "runs": ("optimize", "cmd_runs"),
    "show": ("optimize", "cmd_show"),
    "patch": ("patches", "cmd_patch"), "apply": ("patches", "cmd_apply"), "recheck": ("patches", "cmd_recheck"),
    "diff-versions": ("patches", "cmd_diff_versions"), "probe": ("probe_drafts", "cmd_probe"),
    "survey": ("survey", "cmd_survey"), "mcp": ("mcp", "cmd_mcp"), "doctor": ("doctor", "cmd_doctor"),
}


def _handler(command: str):
    module, function = _HANDLERS[command]
    return getattr(importlib.import_module(f"astra.cli.{module}"), function)


def _encoding_safe_output() -> None:
    """Print whatever the terminal's encoding cannot show as escapes (`…` as `\\u2026` under LC_ALL=C or
    PYTHONIOENCODING=ascii) instead of failing with UnicodeEncodeError halfway through the output."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(errors="backslashreplace")


def main(argv: list[str] | None = None) -> int:
    _encoding_safe_output()
    children.stop_on_signals()  # SIGTERM, SIGHUP, Ctrl-C: children killed, then the command unwinds
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help()
        return 2
    try:
        return int(_handler(args.command)(args) or 0)
    except AstraError as err:
        print(f"astra {args.command}: {_message(err)}", file=sys.stderr)
        return err.exit_code
    except BrokenPipeError:
        return 0
    except MemoryError:
        print(f"astra {args.command}: out of memory", file=sys.stderr)
        return 15
    except OSError as err:  # the machine, not the input: a full disk, a read-only home, too many files
        where = f" ({err.filename})" if err.filename else ""
        print(f"astra {args.command}: {err.strerror or err}{where}", file=sys.stderr)
        return 15 if err.errno in (errno.ENOSPC, errno.ENOMEM, errno.EDQUOT, errno.EROFS, errno.EMFILE) else 12
    except KeyboardInterrupt as stop:  # Ctrl-C, or SIGTERM/SIGHUP (children.Terminated)
        print(f"astra {args.command}: {children.stop_reason(stop)}", file=sys.stderr)
        return children.exit_status(stop)


if __name__ == "__main__":
    sys.exit(main())
