"""`astra mcp` driven by the MCP Python SDK's own stdio client: the real server process (`python -m astra.cli
mcp`), the real protocol. The tool list and its schemas; `list` against SGLang 0.5.23 (the same modules as
`astra list --json`) while the server keeps answering and reports progress; errors as tool errors (an unknown
spec; no GPU for a real spec and for our own RowScale kernel, after its spec, tree and source checks passed);
on the CPU, the RowScale spec's job and its nvcc builds; on a GPU, `check` of a RowScale candidate: correct."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import anyio
import pytest
import yaml
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from tests.rowscale_package import VECTORIZED, make_rowscale
from tests.toolchain import needs_nvcc

REPO = Path(__file__).resolve().parents[3]
TOOLS = {"list", "extract", "probe", "check", "bench", "profile", "patch"}
NO_GPU = "no CUDA GPU here"


def _cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()



def call(steps, *, home: Path | None = None, heartbeat: float = 10.0, timeout: float = 600.0):
    """Start `astra mcp` (ASTRA_HOME=`home`, else the tests' one), open an SDK client session, run
    `await steps(session)` and return its result; the server ends when the session closes."""
    env = {**os.environ, "ASTRA_HOME": str(home or os.environ["ASTRA_HOME"]), "PYTHONUNBUFFERED": "1"}
    params = StdioServerParameters(command=sys.executable, env=env, cwd=str(REPO),
                                   args=["-m", "astra.cli", "mcp", "--heartbeat", str(heartbeat)])

    async def main():
        with anyio.fail_after(timeout):
            async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
                await session.initialize()
                return await steps(session)

    return anyio.run(main)


def texts(result) -> list[str]:
    return [block.text for block in result.content]


# ---------------------------------------------------------------- the tool list


def test_the_seven_tools_and_their_input_schemas(tmp_path):
    listed = call(lambda session: session.list_tools(), home=tmp_path)
    tools = {tool.name: tool for tool in listed.tools}
    assert set(tools) == TOOLS
    for tool in tools.values():
        assert tool.description and tool.input_schema["type"] == "object", tool.name
        assert all(p.get("description") for p in tool.input_schema["properties"].values()), tool.name
    schema = tools["check"].input_schema
    assert schema["required"] == ["name"]
    assert {"name", "candidate", "source", "sglang", "sglang_src", "modes", "sanitizer", "quick",
            "verdict_out"} <= set(schema["properties"])
    assert schema["properties"]["modes"]["items"]["enum"] == ["graph", "cold"]
    assert tools["bench"].input_schema["required"] == ["names"]
    assert "budget_ms" in tools["bench"].input_schema["properties"]
    assert sorted(tools["patch"].input_schema["required"]) == ["name", "verdict"]
    assert "ctx" not in json.dumps([t.input_schema for t in tools.values()])  # the SDK's Context is not an argument


# ---------------------------------------------------------------- list: real content, a responsive server


@pytest.mark.network
def test_list_shows_the_modules_of_sglang_0523_as_the_cli_does(sglang_0523):
    progress: list[str] = []

    async def steps(session):
        async def on_progress(value, total, message):
            progress.append(message)

        results = {}

        async def listing():
            results["list"] = await session.call_tool("list", {"sglang": "0.5.23"}, progress_callback=on_progress)
            results["done"] = time.monotonic()

        async with anyio.create_task_group() as tg:
            tg.start_soon(listing)
            await anyio.sleep(0.5)
            results["tools"] = await session.list_tools()  # answered while `list` runs in its worker thread
            results["tools_at"] = time.monotonic()
        return results

    results = call(steps, heartbeat=0.5)
    result = results["list"]
    assert not result.is_error, texts(result)
    document = json.loads(texts(result)[0])
    cli = subprocess.run([sys.executable, "-m", "astra.cli", "list", "--sglang", "0.5.23", "--json"],
                         capture_output=True, text=True, timeout=600, cwd=REPO)
    assert cli.returncode == 0, cli.stderr
    expected = json.loads(cli.stdout)
    assert document["sglang"] == expected["sglang"] and document["sglang"]["version"] == "0.5.23"
    assert document["modules"] == expected["modules"]
    names = {m["name"] for m in document["modules"]}
    assert {"rmsnorm", "fused_add_rmsnorm", "qknorm"} <= names
    assert {"rmsnorm", "qknorm"} <= set(document["specs"]["reviewed"])
    assert "JIT modules in SGLang 0.5.23" in texts(result)[1]
    assert len(results["tools"].tools) == len(TOOLS) and results["tools_at"] < results["done"]
    assert progress and all(message.startswith("list: running for ") for message in progress)


# ---------------------------------------------------------------- errors are tool errors


def test_an_unknown_spec_is_a_tool_error_with_the_astra_message(tmp_path):
    async def steps(session):
        unknown = await session.call_tool("check", {"name": "no_such_kernel", "source": "// mine\n"})
        neither = await session.call_tool("bench", {"names": ["rmsnorm"], "budget_ms": -1})
        alive = await session.list_tools()
        return unknown, neither, alive

    unknown, neither, alive = call(steps, home=tmp_path)
    assert unknown.is_error
    (message,) = texts(unknown)
    assert message.startswith("no kernel spec 'no_such_kernel' (looked for ")
    assert "Write a draft with `astra extract NAME`." in message
    assert neither.is_error and "budget_ms" in texts(neither)[0]  # the input schema refuses it
    assert {tool.name for tool in alive.tools} == TOOLS  # the server is still serving


@pytest.mark.network
@pytest.mark.skipif(_cuda(), reason="checks the answer of a machine without a CUDA GPU")
def test_check_of_a_real_spec_without_a_gpu_is_the_no_gpu_tool_error(sglang_0523, tmp_path):
    candidate = tmp_path / "rmsnorm.cuh"
    candidate.write_text((sglang_0523.csrc_dir / "elementwise" / "rmsnorm.cuh").read_text())
    result = call(lambda session: session.call_tool("check", {"name": "rmsnorm", "candidate": str(candidate),
                                                              "sglang": "0.5.23"}))
    assert result.is_error
    (message,) = texts(result)
    assert message.startswith(NO_GPU) and "astra check" in message


@pytest.mark.network
@pytest.mark.skipif(_cuda(), reason="checks the answers of a machine without a CUDA GPU")
def test_extract_probe_patch_bench_and_profile_answer_on_the_cpu(sglang_0523, tmp_path):
    from harness import Verdict

    original = (sglang_0523.csrc_dir / "elementwise" / "rmsnorm.cuh").read_text()
    incorrect = tmp_path / "incorrect.json"
    incorrect.write_text(Verdict(status="incorrect", reason="out differs at 3 shapes", correct=False,
                                 name="rmsnorm").to_json())
    (tmp_path / "notes.txt").write_text("not a verdict")
    out = tmp_path / "patches"

    async def steps(session):
        return {
            "extract": await session.call_tool("extract", {"name": "rmsnorm", "sglang": "0.5.23",
                                                           "build_check": False, "out": str(tmp_path / "draft")}),
            "probe": await session.call_tool("probe", {"names": ["rmsnorm"], "reviewed": True, "report_only": True}),
            "patch": await session.call_tool("patch", {"name": "rmsnorm", "source": original + "// faster?\n",
                                                       "verdict": str(incorrect), "out": str(out)}),
            "not_a_verdict": await session.call_tool("patch", {"name": "rmsnorm", "source": original,
                                                               "verdict": str(tmp_path / "notes.txt")}),
            "bench": await session.call_tool("bench", {"names": ["rmsnorm"], "budget_ms": 50}),
            "profile": await session.call_tool("profile", {"name": "rmsnorm"}),
        }

    answers = call(steps)
    extracted = json.loads(texts(answers["extract"])[0])
    assert not answers["extract"].is_error and Path(extracted["draft"]) == tmp_path / "draft" / "kernel.yaml"
    assert yaml.safe_load(extracted["spec"])["module"] == "rmsnorm" and extracted["notes"]
    assert extracted["spec"] == (tmp_path / "draft" / "kernel.yaml").read_text()
    (record,) = json.loads(texts(answers["probe"])[0])
    assert not answers["probe"].is_error and (record["name"], record["kind"]) == ("rmsnorm", "reviewed")
    patch = json.loads(texts(answers["patch"])[0])
    assert not answers["patch"].is_error and patch["repo_patch"] is None and patch["refused"]
    assert texts(answers["patch"])[1] == f"no patch: {patch['refused']}" and not out.exists()
    assert answers["not_a_verdict"].is_error and "not JSON" in texts(answers["not_a_verdict"])[0]
    for tool in ("bench", "profile"):
        assert answers[tool].is_error and texts(answers[tool])[0].startswith(NO_GPU), tool


def test_astra_mcp_refuses_a_heartbeat_that_is_not_positive():
    proc = subprocess.run([sys.executable, "-m", "astra.cli", "mcp", "--heartbeat", "0"], capture_output=True,
                          text=True, timeout=120, cwd=REPO, stdin=subprocess.DEVNULL)
    assert proc.returncode == 12
    assert proc.stderr.strip() == "astra mcp: --heartbeat 0.0: give a positive number of seconds, e.g. 10"


# ---------------------------------------------------------------- our own kernel: RowScale in a stand-in package


@pytest.fixture
def rowscale(tmp_path) -> dict:
    return make_rowscale(tmp_path)


def _check_arguments(rowscale: dict, **extra) -> dict:
    return {"name": str(rowscale["spec"]), "candidate": str(VECTORIZED), "sglang_src": str(rowscale["package"]),
            **extra}


def test_the_rowscale_spec_and_tree_make_a_job_on_the_cpu(rowscale):
    from astra.sglang.tree import from_source
    from astra.spec import jobs
    from astra.spec.resolve import resolve
    from astra.spec.source_check import require_same_source

    spec, tree = resolve(str(rowscale["spec"])), from_source(rowscale["package"])
    assert (tree.version, tree.layout) == ("0.0.1", "kernels/jit")
    require_same_source(spec, tree)  # what `check` does first: the tree's kernel is the one the spec hashed
    job = jobs.make_job(spec, tree, candidate_source=VECTORIZED.read_text(), label="m_vectorized.cuh")
    assert set(job.variants) == {"RowScaleKernel<bf16_t>::run", "RowScaleKernel<fp32_t>::run"}
    assert len(job.cases) == 10 and sum(case.timed for case in job.cases) == 3  # bf16 x the Llama sweep
    assert job.reference == str(rowscale["spec"].parent / "reference.py")
    assert job.build.source_root == str(tree.csrc_dir) and job.kernel_file == "test/rowscale.cuh"
    case = next(c for c in job.cases if c.id == "Llama-3.1-8B/tp1/bfloat16/tokens=128,width=4096")
    assert [(a.name, a.role, a.shape) for a in case.args] == [
        ("x", "in", [128, 4096]), ("w", "in", [4096]), ("out", "out", [128, 4096])]


@needs_nvcc
def test_the_rowscale_job_builds_with_nvcc_on_the_cpu(rowscale):
    """The builds the GPU check starts with: the original and the candidate, as SGLang would compile them."""
    from astra.sglang.tree import from_source
    from astra.spec import jobs
    from astra.spec.resolve import resolve
    from harness import build_many, build_requests

    spec, tree = resolve(str(rowscale["spec"])), from_source(rowscale["package"])
    job = jobs.make_job(spec, tree, candidate_source=VECTORIZED.read_text())
    bf16 = [(side, req) for side, key, req in build_requests(job, arch="90a") if "bf16_t" in key]
    assert sorted(side for side, _ in bf16) == ["cand", "orig"]
    results = build_many([req for _, req in bf16], Path(os.environ["ASTRA_HOME"]) / "builds", jobs=2)
    assert all(result.ok for result in results), [result.error for result in results]


@pytest.mark.skipif(_cuda(), reason="checks the answer of a machine without a CUDA GPU")
def test_check_of_our_rowscale_kernel_without_a_gpu_is_the_no_gpu_tool_error(rowscale):
    async def steps(session):
        checked = await session.call_tool("check", _check_arguments(rowscale, modes=["graph"]))
        edited = rowscale["package"] / "sglang" / "kernels" / "jit" / "csrc" / "test" / "rowscale.cuh"
        edited.write_text(edited.read_text() + "\n// edited\n")  # now not the kernel the spec hashed
        refused = await session.call_tool("check", _check_arguments(rowscale))
        return checked, refused

    checked, refused = call(steps, home=rowscale["home"])
    assert checked.is_error and texts(checked)[0].startswith(NO_GPU)  # spec, tree and source passed first
    assert refused.is_error
    assert "source.sha256 is" in texts(refused)[0] and "the spec was reviewed for another kernel" in texts(refused)[0]


@pytest.mark.gpu
def test_check_of_a_rowscale_candidate_on_the_gpu_is_correct(rowscale, tmp_path):
    verdict_file = tmp_path / "verdict.json"
    result = call(lambda session: session.call_tool("check", _check_arguments(
        rowscale, modes=["graph"], verdict_out=str(verdict_file))), home=rowscale["home"], timeout=540)
    assert not result.is_error, texts(result)
    verdict = json.loads(texts(result)[0])
    assert verdict["status"] == "correct" and verdict["correct"] is True, verdict["reason"]
    assert verdict["name"] == "rowscale" and verdict["candidate_label"] == "m_vectorized.cuh"
    assert len(verdict["cases"]) == 10
    assert json.loads(verdict_file.read_text()) == verdict  # what `astra check --json` writes
