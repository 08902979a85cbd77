"""`astra mcp`: serve Astra's commands as MCP tools over stdio, for a coding agent (docs/mcp.md).

The tools read the user's files by the CLI's own rules, handed over here (astra.mcp_server.tools.Inputs)."""

from __future__ import annotations

from astra.cli.common import check_output, check_output_dir
from astra.cli.patches import read_verdict
from astra.cli.verify import read_source
from astra.errors import AstraError


def cmd_mcp(args) -> int:
    if not args.heartbeat > 0:
        raise AstraError(f"--heartbeat {args.heartbeat}: give a positive number of seconds, e.g. 10")
    from astra.mcp_server.server import serve
    from astra.mcp_server.tools import Inputs

    serve(Inputs(read_source=read_source, read_verdict=read_verdict,
                 check_output=check_output, check_output_dir=check_output_dir), heartbeat_s=args.heartbeat)
    return 0
