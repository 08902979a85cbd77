"""`astra` command line. Errors become one line and an exit code here, at the edge, and nowhere else."""

from __future__ import annotations

import argparse
import sys

from astra.errors import AstraError


def _sglang_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("which SGLang (default: the installed package, else the pinned default wheel)")
    g.add_argument("--sglang", metavar="VERSION", help="download (once) and use this SGLang release's wheel")
    g.add_argument("--sglang-src", metavar="PATH", help="a git checkout of SGLang, or an unpacked package")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="astra", description="Find, verify and speed up the CUDA kernels of SGLang.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("list", help="list SGLang's JIT modules")
    _sglang_options(p)
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--buildable", action="store_true", help="only modules that build for sm_90a")

    p = sub.add_parser("extract", help="write a spec draft and snapshot a module's sources")
    p.add_argument("name")
    _sglang_options(p)
    p.add_argument("--out", help="directory for the draft (default extracted_kernels/NAME/)")

    p = sub.add_parser("build", help="compile a module with nvcc exactly as SGLang does (no GPU needed)")
    p.add_argument("name", nargs="?")
    _sglang_options(p)
    p.add_argument("--arch", default="sm_90a", help="target, e.g. sm_90a (default), sm_80, sm_100a")
    p.add_argument("--variant", help="a spec variant: its index or a substring of its entry")
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                   help="template argument value for a module without a spec (repeatable)")
    p.add_argument("--all", action="store_true", help="build every module that `list` shows as buildable")
    p.add_argument("--jobs", type=int, default=None, help="parallel builds (default: CPU count)")
    p.add_argument("--json", metavar="OUT", help="also write the results as JSON")

    p = sub.add_parser("parse-check", help="parse every CUDA source with libclang and report failures")
    _sglang_options(p)
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("spec-check", help="validate kernel specs (all, or the named ones)")
    p.add_argument("names", nargs="*")

    p = sub.add_parser("check", help="verify and time a candidate against the original kernel (GPU)")
    p.add_argument("name")
    p.add_argument("--candidate", required=True, help="the candidate's version of the spec's kernel_file")
    _sglang_options(p)
    p.add_argument("--modes", default="graph,cold", help="timing modes: graph, cold, or both")
    p.add_argument("--no-sanitizer", action="store_true", help="skip compute-sanitizer")
    p.add_argument("--json", metavar="OUT", help="write the full verdict as JSON")
    p.add_argument("--quick", action="store_true", help="one seed, fewer shapes (for iteration)")

    p = sub.add_parser("bench", help="time the original kernel over its shape suite with roofline (GPU)")
    p.add_argument("names", nargs="+", metavar="NAME")
    _sglang_options(p)
    p.add_argument("--modes", default="graph,cold")
    p.add_argument("--budget-ms", type=float, default=None, help="timing budget per shape and side")
    p.add_argument("--json", metavar="OUT", help="write the verdicts as JSON")
    p.add_argument("--report", metavar="DIR", help="write baseline.md, baseline.json and roofline.svg there")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help()
        return 2
    from astra import commands

    handler = getattr(commands, "cmd_" + args.command.replace("-", "_"))
    try:
        return int(handler(args) or 0)
    except AstraError as err:
        print(f"astra {args.command}: {err}", file=sys.stderr)
        return err.exit_code
    except BrokenPipeError:
        return 0
    except KeyboardInterrupt:
        print(f"astra {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
