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


def _message(err: AstraError) -> str:
    """The error as the user reads it: a spec with one problem is one line."""
    if isinstance(err, SpecError) and len(err.problems) == 1:
        return f"{err.path}: {err.problems[0]}"
    return str(err)


# command -> (module of astra.cli, function). Only the command's own module is imported: the probe and survey
# modules bring in torch (through the harness), seconds that `astra list` or a refused spec need not wait.
_COMMANDS = {
    "list": ("kernels", "cmd_list"), "extract": ("kernels", "cmd_extract"), "build": ("kernels", "cmd_build"),
    "parse-check": ("kernels", "cmd_parse_check"), "spec-check": ("kernels", "cmd_spec_check"),
    "check": ("verify", "cmd_check"), "bench": ("verify", "cmd_bench"),
    "optimize": ("optimize", "cmd_optimize"), "eval": ("optimize", "cmd_eval"), "runs": ("optimize", "cmd_runs"),
    "show": ("optimize", "cmd_show"),
    "patch": ("patches", "cmd_patch"), "apply": ("patches", "cmd_apply"), "recheck": ("patches", "cmd_recheck"),
    "diff-versions": ("patches", "cmd_diff_versions"), "probe": ("probe", "cmd_probe"),
    "survey": ("survey", "cmd_survey"), "mcp": ("mcp", "cmd_mcp"),
}


def _handler(command: str):
    module, name = _COMMANDS[command]
    return getattr(importlib.import_module(f"astra.cli.{module}"), name)


def main(argv: list[str] | None = None) -> int:
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
    except KeyboardInterrupt:
        print(f"astra {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
