"""`astra mcp`: Astra's tools over the Model Context Protocol (the official Python SDK's `MCPServer`, stdio).

Seven tools, one per command (list, extract, probe, check, bench, profile, patch); each call runs the library in
a worker thread (`astra.mcp_server.tools`), so the server keeps answering (tool lists, pings, other calls) while a
check builds and times. GPU tools (probe, check, bench, profile) take turns: one holds the GPU at a time, so
that no timing measures another's load. While a call runs, a progress notification every `heartbeat_s` says
it is alive (to a client that asked for progress).

A call's result is the JSON document the command writes with --json, then the lines it prints. An `AstraError`
is a tool error (isError) whose text is its message, which says what to do next; so is an OSError (the
machine, not the input). Anything else is the SDK's "Error executing tool": the server logs it and goes on.
"""

from __future__ import annotations

import time
from contextlib import suppress
from typing import Annotated, Callable, Literal

import anyio
import anyio.to_thread
from mcp.server.mcpserver import Context, MCPServer
from mcp.types import CallToolResult, TextContent
from pydantic import Field

from astra import __version__
from astra.errors import AstraError
from astra.mcp_server import tools
from astra.mcp_server.tools import Answer, Inputs, Say, Tree

INSTRUCTIONS = """Astra judges CUDA kernels of SGLang: a candidate version of a kernel file passes `check` only if
it builds with SGLang's exact flags, keeps the typed exports, matches the original on every shape of the spec's
suite, leaves inputs untouched and is clean under compute-sanitizer; its verdict says how much faster it is.
Start with `list` (modules and the specs there are), write a candidate of the spec's kernel_file, `check` it
(verdict_out keeps the verdict), and turn a verified faster one into a patch with `patch`. check, bench,
profile and probe need a CUDA GPU on the machine that runs this server."""

# ---- arguments shared by several tools (their JSON schema descriptions)
Name = Annotated[str, Field(description="a spec: a reviewed one (extracted_kernels/NAME, see `list`), a probed "
                                        "draft ($ASTRA_HOME/drafts/NAME), or the path of a kernel.yaml")]
Names = Annotated[list[str], Field(description="spec names (as for `name`)", min_length=1)]
Sglang = Annotated[str | None, Field(description="an SGLang release such as 0.5.23 (its wheel is downloaded "
                                                 "once); default: the spec's own version, else the installed "
                                                 "package, else 0.5.23")]
SglangSrc = Annotated[str | None, Field(description="instead of `sglang`: the path of a git checkout of SGLang "
                                                    "or of an unpacked package")]
Candidate = Annotated[str | None, Field(description="path of your version of the spec's kernel_file (relative "
                                                    "paths: to the server's working directory)")]
Source = Annotated[str | None, Field(description="instead of `candidate`: the candidate's source text (saved "
                                                 "under $ASTRA_HOME/mcp/candidates/; the result says where)")]
Modes = Annotated[list[Literal["graph", "cold"]], Field(
    description="timing views: graph (CUDA-graph replay) and/or cold (L2 flushed before each call)", min_length=1)]
BudgetMs = Annotated[float | None, Field(description="timing budget per shape and side, in ms (default: the "
                                                     "harness's)", gt=0)]

GPU = True
BOTH = ["graph", "cold"]  # the default timing views (never mutated)


def _blank(value: str | None) -> str | None:
    """An empty or blank optional string is an absent one (clients fill optional fields with "")."""
    return value if value is not None and value.strip() else None


def _tree(sglang: str | None, sglang_src: str | None) -> Tree:
    return Tree(_blank(sglang), _blank(sglang_src))


def _error(message: str) -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text=message)], is_error=True)


class Calls:
    """Runs one tool call: its work in a worker thread (GPU work one at a time), a heartbeat beside it, and
    its outcome as a CallToolResult."""

    def __init__(self, heartbeat_s: float) -> None:
        self.heartbeat_s = heartbeat_s
        self.gpu = anyio.Lock()

    async def run(self, ctx: Context, tool: str, work: Callable[[Say], Answer], *, gpu: bool = False) -> CallToolResult:
        last = [""]

        def say(line: str) -> None:
            last[0] = line

        outcome: list[CallToolResult] = []
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._beat, ctx, tool, last)
            try:
                answer = await self._work(work, say, gpu)
            except AstraError as err:
                outcome.append(_error(str(err)))
            except OSError as err:  # the machine, not the input: a full disk, a path that cannot be written
                where = f" ({err.filename})" if err.filename else ""
                outcome.append(_error(f"{tool}: {err.strerror or err}{where}"))
            else:
                content = [TextContent(type="text", text=answer.document)]
                if answer.summary:
                    content.append(TextContent(type="text", text=answer.summary))
                outcome.append(CallToolResult(content=content))
            finally:
                tg.cancel_scope.cancel()
        return outcome[0]

    async def _work(self, work: Callable[[Say], Answer], say: Say, gpu: bool) -> Answer:
        if not gpu:
            return await anyio.to_thread.run_sync(work, say)
        async with self.gpu:
            return await anyio.to_thread.run_sync(work, say)

    async def _beat(self, ctx: Context, tool: str, last: list[str]) -> None:
        start = time.monotonic()
        while True:
            await anyio.sleep(self.heartbeat_s)
            elapsed = time.monotonic() - start
            with suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
                await ctx.report_progress(round(elapsed, 1), message=f"{tool}: running for {elapsed:.0f}s"
                                          + (f"; {last[0]}" if last[0] else ""))


def build(inputs: Inputs, *, heartbeat_s: float = 10.0) -> MCPServer:
    """The server with its seven tools; `inputs`: the CLI's rules for the user's files."""
    server = MCPServer(name="astra", version=__version__, instructions=INSTRUCTIONS)
    calls = Calls(heartbeat_s)

    @server.tool(name="list", structured_output=False, description=(
        "SGLang's JIT kernel modules as `astra list --json` shows them (name, sources, exports, sm_90a "
        "buildability, file hashes), plus `specs`: the reviewed specs and the drafts with whether they are "
        "usable. With `why`: where SGLang's runtime calls that module and under which conditions."))
    async def list_(ctx: Context, sglang: Sglang = None, sglang_src: SglangSrc = None,
                    buildable: Annotated[bool, Field(description="only modules that build for sm_90a")] = False,
                    why: Annotated[str | None, Field(description="a module name: its srt call sites")] = None,
                    ) -> CallToolResult:
        tree = _tree(sglang, sglang_src)
        return await calls.run(ctx, "list", lambda say: tools.list_modules(tree, buildable=buildable,
                                                                           why=_blank(why)))

    @server.tool(name="extract", structured_output=False, description=(
        "Draft a spec for an SGLang JIT module (as `astra extract NAME`): infers arguments, roles, shapes and "
        "template values from the C++ checks, the Python wrapper and the runtime's call sites, compiles the "
        "variants with nvcc where it can (no GPU needed). Returns the draft's path, its text and the notes to "
        "review. A draft becomes usable by check/bench once `probe` has run it on a GPU."))
    async def extract(ctx: Context, name: Annotated[str, Field(description="the module name (see `list`)")],
                      sglang: Sglang = None, sglang_src: SglangSrc = None,
                      export: Annotated[str | None, Field(description="which export of the module the spec calls "
                                                                      "(default: the best described)")] = None,
                      build_check: Annotated[bool, Field(description="compile the draft's variants with nvcc to "
                                                                     "settle template values")] = True,
                      out: Annotated[str | None, Field(description="directory for the draft (default "
                                                                   "$ASTRA_HOME/drafts/NAME/)")] = None,
                      ) -> CallToolResult:
        tree = _tree(sglang, sglang_src)
        return await calls.run(ctx, "extract", lambda say: tools.extract_draft(
            tree, inputs, name, export=_blank(export), build_check=build_check, out=_blank(out)))

    @server.tool(name="probe", structured_output=False, description=(
        "GPU: run the ORIGINAL kernel of drafted specs on their suites (as `astra probe NAME... --json`): keep "
        "the cases it accepts, observe which tensors it writes, run compute-sanitizer, repair drafts the kernel "
        "rejects from its messages and probe again. A probed draft becomes usable by check and bench. Returns "
        "one record per spec. report_only: no GPU, summarise the records there are."))
    async def probe(ctx: Context, names: Names, sglang: Sglang = None, sglang_src: SglangSrc = None,
                    reviewed: Annotated[bool, Field(description="probe the reviewed specs of these names "
                                                                "(read-only)")] = False,
                    force: Annotated[bool, Field(description="probe again even if up to date")] = False,
                    sanitizer: Annotated[bool, Field(description="run compute-sanitizer memcheck")] = True,
                    per_gpu: Annotated[int, Field(description="concurrent probe processes per GPU", ge=1)] = 4,
                    timeout_case: Annotated[float, Field(description="seconds per case before it counts as hung",
                                                         gt=0)] = 120.0,
                    repair_rounds: Annotated[int, Field(description="rounds of repair and re-probe", ge=0)] = 2,
                    report_only: Annotated[bool, Field(description="probe nothing: the records there are")] = False,
                    ) -> CallToolResult:
        tree = _tree(sglang, sglang_src)
        return await calls.run(ctx, "probe", lambda say: tools.probe_specs(
            tree, names, reviewed=reviewed, force=force, sanitizer=sanitizer, per_gpu=per_gpu,
            timeout_case=timeout_case, repair_rounds=repair_rounds, report_only=report_only, say=say), gpu=GPU)

    @server.tool(name="check", structured_output=False, description=(
        "GPU: judge a candidate version of a spec's kernel_file against the ORIGINAL kernel (as `astra check NAME "
        "--candidate FILE --json OUT`). Returns the verdict JSON exactly as that writes it (status: correct, "
        "incorrect, build_failed, signature_mismatch, sanitizer, crashed, timeout, ...; reason; per-shape "
        "speedups; faster), then the printed table. A candidate that fails is a verdict, not a tool error."))
    async def check(ctx: Context, name: Name, candidate: Candidate = None, source: Source = None,
                    sglang: Sglang = None, sglang_src: SglangSrc = None, modes: Modes = BOTH,
                    sanitizer: Annotated[bool, Field(description="run compute-sanitizer")] = True,
                    quick: Annotated[bool, Field(description="one seed, the first dtype only: for iteration, "
                                                             "not evidence")] = False,
                    label: Annotated[str | None, Field(description="the candidate's label in the verdict "
                                                                   "(default: its file name)")] = None,
                    verdict_out: Annotated[str | None, Field(description="also write the verdict JSON to this "
                                                                         "file (what `patch` takes)")] = None,
                    ) -> CallToolResult:
        tree = _tree(sglang, sglang_src)
        return await calls.run(ctx, "check", lambda say: tools.check_candidate(
            tree, inputs, name, candidate=_blank(candidate), source=source, label=_blank(label), modes=modes,
            sanitizer=sanitizer, quick=quick, verdict_out=_blank(verdict_out)), gpu=GPU)

    @server.tool(name="bench", structured_output=False, description=(
        "GPU: time the ORIGINAL kernels of specs over their timed shapes against their physical and practical "
        "floors (as `astra bench NAME... --json OUT`). Returns {name: verdict JSON}, then the printed tables."))
    async def bench(ctx: Context, names: Names, sglang: Sglang = None, sglang_src: SglangSrc = None,
                    modes: Modes = BOTH, budget_ms: BudgetMs = None) -> CallToolResult:
        tree = _tree(sglang, sglang_src)
        return await calls.run(ctx, "bench", lambda say: tools.bench_originals(
            tree, names, modes=modes, budget_ms=budget_ms), gpu=GPU)

    @server.tool(name="profile", structured_output=False, description=(
        "GPU + Nsight Compute: the ORIGINAL kernel's cold time per timed shape against ncu's gpu__time_duration "
        "(as `astra bench NAME --ncu`, cold view). Returns the bench verdict JSON whose `ncu` holds {rows: [{id, "
        "cold_us, ncu_us, ratio, net_ratio}], launch_overhead_us, skipped}, then the printed table."))
    async def profile(ctx: Context, name: Name, sglang: Sglang = None, sglang_src: SglangSrc = None,
                      budget_ms: BudgetMs = None) -> CallToolResult:
        tree = _tree(sglang, sglang_src)
        return await calls.run(ctx, "profile", lambda say: tools.profile_original(tree, name, budget_ms=budget_ms),
                               gpu=GPU)

    @server.tool(name="patch", structured_output=False, description=(
        "Emit a verified candidate as git patches for SGLang, repository and package layout, with its evidence "
        "(as `astra patch NAME --candidate FILE --verdict JSON`). Refused (the result's `refused` says why) "
        "unless the verdict is correct and verified faster. Returns {refused, repo_patch, package_patch}."))
    async def patch(ctx: Context, name: Name,
                    verdict: Annotated[str, Field(description="the verdict JSON file (check's verdict_out)")],
                    candidate: Candidate = None, source: Source = None,
                    sglang: Sglang = None, sglang_src: SglangSrc = None,
                    why: Annotated[str | None, Field(description="what changed and why")] = None,
                    out: Annotated[str, Field(description="where the patches go")] = "patches",
                    threshold: Annotated[float, Field(description="refuse if any shape is slower than 1 - this",
                                                      ge=0, lt=1)] = 0.02,
                    sanitizer_required: Annotated[bool, Field(description="refuse unless compute-sanitizer ran "
                                                                          "cleanly")] = True,
                    ) -> CallToolResult:
        tree = _tree(sglang, sglang_src)
        return await calls.run(ctx, "patch", lambda say: tools.emit(
            tree, inputs, name, verdict=verdict, candidate=_blank(candidate), source=source, why=_blank(why),
            out=out, threshold=threshold, sanitizer_required=sanitizer_required))

    return server


def serve(inputs: Inputs, *, heartbeat_s: float = 10.0) -> None:
    """Serve over stdio until the client closes the stream."""
    build(inputs, heartbeat_s=heartbeat_s).run("stdio")
