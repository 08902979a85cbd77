"""The `astra` argument parser: every command, its flags and their help. No behaviour lives here."""

from __future__ import annotations

import argparse


def _sglang_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("which SGLang (default: the installed package, else the pinned default wheel)")
    g.add_argument("--sglang", metavar="VERSION", help="download (once) and use this SGLang release's wheel")
    g.add_argument("--sglang-src", metavar="PATH", help="a git checkout of SGLang, or an unpacked package")


def _loop_options(p: argparse.ArgumentParser) -> None:
    """What `optimize` and `eval` share: the agent, the endpoint, the budgets."""
    p.add_argument("--rounds", type=int, default=5, metavar="N",
                   help="rounds of propose-and-verify at most (default 5); the run also stops when a budget is "
                        "spent or two rounds in a row verify nothing better")
    p.add_argument("--offline", action="store_true", help="use the built-in search agent even if an LLM is configured")
    p.add_argument("--model", help="LLM model name (OpenAI-compatible endpoint)")
    p.add_argument("--base-url", help="OpenAI-compatible endpoint, e.g. http://localhost:30000/v1")
    p.add_argument("--budget-tokens", type=int, default=None, metavar="N",
                   help="LLM agent: stop once the model has used this many tokens (prompt and reply; default: no "
                        "limit; `budget_tokens:` in $ASTRA_HOME/config.yaml)")
    p.add_argument("--budget-usd", type=float, default=None, metavar="USD",
                   help="LLM agent: stop once the calls cost this many dollars (prices in astra/data/prices.yaml; "
                        "default: no limit; `budget_usd:` in $ASTRA_HOME/config.yaml)")
    p.add_argument("--wall-min", type=float, default=60.0, metavar="MIN",
                   help="wall-time budget in minutes (default 60): no verification starts that cannot end in time")
    p.add_argument("--no-sanitizer", action="store_true",
                   help="verify candidates without compute-sanitizer memcheck (faster; a patch of such a run says "
                        "so)")
    _sandbox_option(p)
    p.add_argument("--dry-run", action="store_true",
                   help="no GPU: one round; the candidates the agent proposes first are each built with nvcc "
                        "(registers, spills), none verified, and the run stops (nothing to improve on)")
    p.add_argument("--quick-search", action="store_true",
                   help="search on the timed dtype only; verify the best on the full suite at the end")
    p.add_argument("--agent", metavar="exec:CMD",
                   help="run CMD as the agent: each round, in a folder of context files, it edits candidate.cuh "
                        "(Claude Code, Codex CLI, aider, a script; docs/agents.md)")
    p.add_argument("--samples", type=int, default=1, metavar="N",
                   help="LLM agent: candidates the coder writes per round, asked for at once and judged one per GPU")
    p.add_argument("--agent-timeout", type=float, default=900.0, metavar="S",
                   help="seconds the --agent command may run per round (default 900)")
    p.add_argument("--rebaseline", action="store_true",
                   help="time the original against itself again and replace the stored baseline (default: reuse "
                        "the one in $ASTRA_HOME/baselines timed within 7 days for the same original, job, GPU "
                        "model and judge); a resumed run keeps its own, and `astra eval` reuses a finished run "
                        "without timing anything (add --fresh to run it again)")


def _sandbox_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--no-sandbox", action="store_true",
                   help="run candidate code without the OS sandbox (Landlock + seccomp); the verdict records it. "
                        "Only for a kernel that cannot sandbox (`astra doctor` says) and code you trust")


def _testing_agent_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("the testing agent (the probe decides what it writes)")
    g.add_argument("--agent", choices=["rules", "llm"], default="rules",
                   help="rules: inference and the kernel-message repairs only (default); llm: a model also "
                        "proposes drafts (extract) and repairs rejected ones (probe)")
    g.add_argument("--model", help="LLM model name (OpenAI-compatible endpoint)")
    g.add_argument("--base-url", help="OpenAI-compatible endpoint, e.g. http://localhost:30000/v1")
    g.add_argument("--budget-tokens", type=int, default=None, metavar="N",
                   help="--agent llm: stop calling the model after this many tokens (default: no limit)")
    g.add_argument("--budget-usd", type=float, default=None, metavar="USD",
                   help="--agent llm: stop calling the model once it cost this many dollars (default: no limit)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="astra", description="Find, verify and speed up the CUDA kernels of SGLang.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("list", help="list SGLang's JIT modules")
    _sglang_options(p)
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--buildable", action="store_true", help="only modules that build for sm_90a")
    p.add_argument("--why", metavar="NAME",
                   help="where SGLang's runtime (sglang/srt) calls module NAME, and under which conditions")
    p.add_argument("--quiet", action="store_true",
                   help="no progress line on stderr (it is drawn only when stderr is a terminal)")

    p = sub.add_parser("extract", help="draft specs from the sources (C++ checks, wrapper, srt call sites)")
    p.add_argument("names", nargs="*", metavar="NAME", help="JIT modules to draft (as `astra list` names them)")
    p.add_argument("--all", action="store_true", help="every single-GPU module that builds for sm_90a")
    p.add_argument("--export", help="which export of the module the spec calls (default: the best described)")
    p.add_argument("--jobs", type=int, help="parallel libclang parses (default: every CPU core)")
    p.add_argument("--no-build-check", action="store_true",
                   help="skip compiling the draft's variants with nvcc (template values stay as guessed)")
    _testing_agent_options(p)
    _sglang_options(p)
    p.add_argument("--out", help="directory for the draft (default $ASTRA_HOME/drafts/NAME/; one NAME only)")
    p.add_argument("--quiet", action="store_true",
                   help="no progress line on stderr (it is drawn only when stderr is a terminal)")

    p = sub.add_parser("build", help="compile a module with nvcc exactly as SGLang does (no GPU needed)")
    p.add_argument("name", nargs="?", help="the JIT module to build (as `astra list` names it)")
    _sglang_options(p)
    p.add_argument("--arch", default="sm_90a", help="target, e.g. sm_90a (default), sm_80, sm_100a")
    p.add_argument("--variant", help="a spec variant: its index or a substring of its entry")
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                   help="template argument value for a module without a spec (repeatable)")
    p.add_argument("--all", action="store_true", help="build every module that `list` shows as buildable")
    p.add_argument("--jobs", type=int, default=None, help="parallel builds (default: CPU count)")
    p.add_argument("--json", metavar="OUT", help="also write the results as JSON")
    p.add_argument("--quiet", action="store_true",
                   help="no progress line on stderr (it is drawn only when stderr is a terminal)")

    p = sub.add_parser("passes", help="apply the rewrite passes to every buildable module and build the candidates "
                       "(no GPU needed)")
    p.add_argument("names", nargs="*", metavar="NAME",
                   help="passes to run (vectorize, reuse, warp_reduce, fast_math, coarsen, split, parallelize, "
                        "launch_bounds, fastdiv, pdl_chain, batch_loads; default: every pass)")
    _sglang_options(p)
    p.add_argument("--module", action="append", default=[], metavar="MODULE",
                   help="only this module (repeatable; default: every sm_90a-buildable module)")
    p.add_argument("--no-build", action="store_true",
                   help="only apply the passes: say where each applies and why it refuses, build nothing")
    p.add_argument("--jobs", type=int, default=1, help="parallel nvcc builds (default 1: builds are CPU-heavy)")
    p.add_argument("--json", metavar="OUT", help="also write the per-pass results as JSON")
    p.add_argument("--quiet", action="store_true",
                   help="no progress line on stderr (it is drawn only when stderr is a terminal)")

    p = sub.add_parser("parse-check", help="parse every CUDA source with libclang and report failures")
    _sglang_options(p)
    p.add_argument("--json", action="store_true", help="print every file's result as JSON instead of the failures")
    p.add_argument("--quiet", action="store_true",
                   help="no progress line on stderr (it is drawn only when stderr is a terminal)")

    p = sub.add_parser("spec-check", help="validate kernel specs (all, or the named ones)")
    p.add_argument("names", nargs="*", metavar="NAME", help="specs to check (default: every spec)")
    p.add_argument("--draft", action="store_true",
                   help="a draft: report TODO(review) markers as notes instead of refusing the spec")

    p = sub.add_parser("check", help="verify and time a candidate against the original kernel (GPU)")
    p.add_argument("name", help="the kernel's spec (reviewed, or a probed draft)")
    p.add_argument("--candidate", required=True, help="the candidate's version of the spec's kernel_file")
    _sglang_options(p)
    p.add_argument("--modes", default="graph,cold", help="timing modes: graph, cold, or both")
    p.add_argument("--no-sanitizer", action="store_true", help="skip compute-sanitizer")
    _sandbox_option(p)
    p.add_argument("--json", metavar="OUT", help="write the full verdict as JSON")
    p.add_argument("--quick", action="store_true",
                   help="a screen for iteration, not evidence: the first dtype, one timed shape per band (the "
                        "median) plus the edge shapes, one seed, graph view only, no compute-sanitizer")

    p = sub.add_parser("optimize", help="run the optimize loop on a spec'd kernel (GPU; --dry-run without)")
    p.add_argument("name", help="the kernel's spec (reviewed, or a probed draft)")
    _sglang_options(p)
    _loop_options(p)
    p.add_argument("--resume", metavar="RUN", help="continue a run from its directory")

    p = sub.add_parser("eval", help="optimize several kernels and print a table like the Astra paper's Table 2")
    p.add_argument("--kernels", help="comma-separated spec names (default: the survey's top kernels)")
    p.add_argument("--top", type=int, default=10, help="without --kernels: this many from the survey (default 10)")
    p.add_argument("--survey", metavar="DIR", help="the survey store to rank (default: the latest under $ASTRA_HOME)")
    p.add_argument("--fresh", action="store_true", help="start every kernel over (default: reuse a finished run of "
                   "the same kernel, SGLang version, agent and source, and continue one that was cut off); a new "
                   "run still reuses a stored baseline of the original (--rebaseline times it again)")
    _sglang_options(p)
    _loop_options(p)
    p.add_argument("--gpus", type=int, default=None, metavar="N",
                   help="kernels at once on this host, one GPU each (default: every visible GPU; 1: one after "
                        "another in this process, each kernel judging its candidates on every GPU)")
    p.add_argument("--ray", metavar="auto|ADDRESS",
                   help="run each kernel as a one-GPU Ray task on a cluster (pip install 'astra[ray]'); --gpus "
                        "then caps the kernels in flight")
    p.add_argument("--json", metavar="OUT", help="also write the table's rows, the average speedup and the "
                                                 "candidates judged per hour as JSON")

    p = sub.add_parser("runs", help="list optimize runs")

    p = sub.add_parser("show", help="print one optimize run")
    p.add_argument("run", help="the run's id, as `astra runs` lists it")
    p.add_argument("--json", action="store_true", help="print the run's state as JSON")
    p.add_argument("--html", action="store_true", help="write the run's static HTML report and print its path")

    p = sub.add_parser("bench", help="time the original kernel over its shape suite against its physical and practical floors (GPU)")
    p.add_argument("names", nargs="+", metavar="NAME", help="kernel specs to bench (reviewed, or probed drafts)")
    _sglang_options(p)
    p.add_argument("--modes", default="graph,cold", help="timing views: graph, cold, or both (default)")
    p.add_argument("--budget-ms", type=float, default=None, help="timing budget per shape and side")
    p.add_argument("--json", metavar="OUT", help="write the verdicts as JSON")
    p.add_argument("--report", metavar="DIR", help="write baseline.md, baseline.json and roofline.svg there")
    p.add_argument("--ncu", action="store_true",
                   help="also measure each shape with Nsight Compute (gpu__time_duration) and compare with cold")
    p.add_argument("--time-only", action="store_true",
                   help="time the original without comparing its outputs with itself (status 'timed'; much faster)")
    _sandbox_option(p)
    p = sub.add_parser("probe", help="run the ORIGINAL kernel of drafted specs on their suites and record it (GPU)")
    p.add_argument("names", nargs="*", metavar="NAME", help="drafts under $ASTRA_HOME/drafts (else reviewed specs)")
    p.add_argument("--all", action="store_true", help="every draft under $ASTRA_HOME/drafts")
    p.add_argument("--reviewed", action="store_true",
                   help="the reviewed specs of extracted_kernels/ (with --all: as well), probed read-only: results "
                        "go to $ASTRA_HOME/probes/NAME.json")
    p.add_argument("--force", action="store_true", help="probe again even if probe.json matches the spec")
    p.add_argument("--report-only", action="store_true",
                   help="probe nothing: summarise the probe records there are (no GPU needed); with --all and "
                        "--sglang/--sglang-src the report also lists the tree's modules that have no spec")
    p.add_argument("--per-gpu", type=int, default=4, metavar="K", help="concurrent probe processes per GPU (default 4)")
    p.add_argument("--timeout-case", type=float, default=120.0, metavar="S",
                   help="seconds per case before it counts as hung (default 120)")
    p.add_argument("--no-sanitizer", action="store_true", help="skip compute-sanitizer memcheck (recorded as such)")
    _sandbox_option(p)
    p.add_argument("--repair-rounds", type=int, default=2, metavar="N",
                   help="rounds of repairing the drafts whose every case the kernel rejected (from its messages) "
                        "and probing them again (default 2; 0: no repair)")
    p.add_argument("--repair-dry-run", action="store_true",
                   help="probe nothing: print what a repair would change in each failed draft, write nothing "
                        "(no GPU needed)")
    p.add_argument("--report", metavar="PATH.md", help="write the summary as markdown")
    p.add_argument("--json", metavar="PATH", help="write the summary as JSON (with --repair-dry-run: the proposals)")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                   help="cpu: host-only kernels (Astra's own tests); default cuda")
    _testing_agent_options(p)
    _sglang_options(p)
    _patch_commands(sub)
    _survey_command(sub)
    p = sub.add_parser("doctor", help="can this machine judge? nvcc, GPU, compute-sanitizer, ncu, and the OS "
                                      "sandbox proven by a self-test (exit 16 when it cannot be enforced)")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p = sub.add_parser("mcp", help="serve list, extract, probe, check, bench, profile and patch as MCP tools over "
                                   "stdio, for a coding agent (docs/mcp.md)")
    p.add_argument("--heartbeat", type=float, default=10.0, metavar="S",
                   help="seconds between progress notifications while a tool runs (default 10)")
    return parser


# ---- patches: patch / apply / recheck / diff-versions (astra/patches/)
def _patch_commands(sub) -> None:
    p = sub.add_parser("patch", help="emit a verified candidate as a git patch for SGLang (repo and package layout)")
    p.add_argument("name", help="the kernel's spec")
    p.add_argument("--candidate", required=True, help="the candidate's version of the spec's kernel_file")
    p.add_argument("--verdict", required=True, metavar="JSON", help="its verdict (`astra check --json`)")
    p.add_argument("--why", metavar="TEXT", help="what changed and why (default: from the candidate label)")
    p.add_argument("--out", default="patches", metavar="DIR", help="where the patches go (default patches/)")
    p.add_argument("--threshold", type=float, default=0.02,
                   help="refuse if any shape is slower than 1 - this (0 to 0.1; default 0.02)")
    p.add_argument("--no-sanitizer", action="store_true",
                   help="emit even though compute-sanitizer did not run cleanly (the patch says so; findings "
                        "still refuse)")
    _sglang_options(p)

    p = sub.add_parser("apply", help="apply an Astra patch to an SGLang checkout or installed package")
    p.add_argument("patch", help="the patch file (`astra patch` or `astra optimize` wrote it)")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--sglang-src", metavar="DIR", help="a git checkout of SGLang, or an unpacked package")
    where.add_argument("--installed", action="store_true", help="the sglang package importable from this Python")
    p.add_argument("--force", action="store_true", help="try even if the file's sha256 is not the patch's base")
    p.add_argument("--check", action="store_true", help="only check that the patch would apply")

    p = sub.add_parser("recheck", help="after an SGLang upgrade: does each patch still apply, pass and win?")
    p.add_argument("patches", nargs="+", metavar="PATCH", help="Astra patches to recheck")
    _sglang_options(p)
    p.add_argument("--json", metavar="OUT", help="write the report as JSON")
    p.add_argument("--markdown", metavar="OUT", help="write the report as markdown (it is also printed)")
    p.add_argument("--no-gpu", action="store_true",
                   help="accept a source-only recheck: skip the GPU checks (without it, GPU checks that did not "
                        "run exit 11, could not verify)")

    p = sub.add_parser("diff-versions",
                       help="did a kernel's sources (and, on a GPU, its speed) change between versions?")
    p.add_argument("name", help="the kernel's spec")
    p.add_argument("--from", dest="from_version", required=True, metavar="A", help="the older SGLang version")
    p.add_argument("--to", dest="to_version", required=True, metavar="B", help="the newer SGLang version")
    p.add_argument("--json", metavar="OUT", help="also write the comparison as JSON")


# ---- survey (astra/survey/)
def _survey_command(sub) -> None:
    p = sub.add_parser("survey", help="bench every probed spec and rank kernels by time recoverable above their "
                                      "practical floor (GPU; --report-only without)")
    p.add_argument("names", nargs="*", metavar="NAME", help="specs to survey (reviewed, else a probed draft)")
    p.add_argument("--all", action="store_true", help="every probed draft under $ASTRA_HOME/drafts")
    p.add_argument("--reviewed", action="store_true", help="every reviewed spec of extracted_kernels/ (as well)")
    p.add_argument("--view", choices=["graph", "cold"], default="graph", help="timing view to rank by (default graph)")
    p.add_argument("--mix", default="decode", metavar="decode|prefill|balanced|FILE",
                   help="serving mix weighting token counts: a built-in (astra/data/serving_mixes.yaml; default "
                        "decode) or a YAML/JSON file of {tokens: weight} or {kernel: {tokens: count}}")
    p.add_argument("--out", metavar="DIR", help="the survey store (default $ASTRA_HOME/surveys/"
                                                "sglang-VERSION-GPU-DATE); a re-run resumes it")
    p.add_argument("--force", action="store_true", help="bench every kernel again, even those the store has")
    p.add_argument("--report-only", action="store_true",
                   help="bench nothing: rank what the store has (no GPU; default store: the latest survey)")
    p.add_argument("--report", metavar="DIR", help="write survey.md, survey.json and survey.html there")
    p.add_argument("--json", metavar="PATH", help="write the ranking as JSON")
    p.add_argument("--top", type=int, default=None, metavar="N", help="show only the N best-ranked kernels")
    p.add_argument("--budget-ms", type=float, default=None, help="timing budget per shape and side")
    p.add_argument("--modes", default="graph,cold", metavar="graph,cold",
                   help="timing views to bench (default both; `graph` alone takes about half the wall time, and "
                        "the ranking then has no cold view)")
    p.add_argument("--check-outputs", action="store_true",
                   help="also compare each original's outputs with itself before timing (as `astra bench` does; "
                        "slower: by default the survey only times, the probe has checked the outputs)")
    p.add_argument("--workers", type=int, default=None, metavar="N",
                   help="GPU workers on this host, one kernel each at a time (default: every GPU; 1: in this process)")
    p.add_argument("--ray", metavar="auto|ADDRESS",
                   help="run the benches as one-GPU Ray tasks on a cluster (pip install 'astra[ray]')")
    _sandbox_option(p)
    _sglang_options(p)
