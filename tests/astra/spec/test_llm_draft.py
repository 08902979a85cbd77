"""astra.spec.llm_draft: the model proposes or repairs a draft, the probe decides.

Every model call goes through the real openai client to the real loopback OpenAI-compatible server
(tests/llm_server.py) with recorded replies. The stand-in SGLang checkout holds a host-only kernel whose
own check refuses a wrong `out` shape, its Python wrapper and a runtime call site under a gate; `astra
extract` drafts it with libclang, and the CPU probe (astra.verify.probing on device "cpu", nvcc build)
decides between the model's drafts: the first (a transposed `out`) is rejected with the kernel's message,
the repair prompt carries that message, and the repaired draft passes."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from astra.llm.client import Client, LLMConfig
from astra.sglang.tree import SglangTree, from_source
from astra.spec import extract
from astra.spec.extract import DRAFT_HEADER, PROBED_MARK, ExtractResult, dump_yaml
from astra.spec.llm_draft import (
    AGENT_MARK,
    PROTECTED,
    LlmRepairer,
    kernel_excerpt,
    probe_findings,
    propose_draft,
    write_draft,
)
from astra.spec.resolve import resolve
from astra.verify import probing
from tests.astra.sglang.test_sglang_tree import _fake_checkout
from tests.astra_home import cached_home
from tests.llm_server import KEY, MODEL, echo_key, reply
from tests.toolchain import needs_nvcc

SCALE = r"""
#include <tvm/ffi/container/tensor.h>
#include <cstdint>
#include <stdexcept>

namespace toy {

inline void check_same_shape(tvm::ffi::TensorView out, tvm::ffi::TensorView x) {
  if (out.ndim() != 2 || out.size(0) != x.size(0) || out.size(1) != x.size(1)) {
    throw std::runtime_error("Tensor match failed for out at scale.cuh:9\n- Root cause: out must have the shape of x");
  }
}

inline void debug_dump(const float* p, int64_t n) {  // not called by the entry
  for (int64_t i = 0; i < n; ++i) (void)p[i];
}

struct Scale {
  static void run(tvm::ffi::TensorView out, tvm::ffi::TensorView x, double alpha) {
    check_same_shape(out, x);
    float* dst = static_cast<float*>(out.data_ptr());
    const float* src = static_cast<const float*>(x.data_ptr());
    for (int64_t i = 0; i < x.numel(); ++i) dst[i] = src[i] * static_cast<float>(alpha);
  }
};

}  // namespace toy
"""

LOADER = '''
import torch

from sglang.kernels.jit.utils import cache_once, load_jit


@cache_once
def _jit_scale_module():
    return load_jit("toy_scale", cuda_files=["elementwise/scale.cuh"], cuda_wrappers=[("scale", "toy::Scale::run")])


def scale(x: torch.Tensor, alpha: float = 0.5) -> torch.Tensor:
    """out = x * alpha."""
    out = torch.empty_like(x)
    _jit_scale_module().scale(out, x, alpha)
    return out
'''

RUNTIME = '''
from sglang.kernels.ops.elementwise.scale import scale


class ToyLayer:
    def __init__(self, config):
        self.hidden_size = config.hidden_size

    def forward(self, x):
        if self.hidden_size % 4 == 0:
            return scale(x, 0.5)
        return x * 0.5
'''

# What the model writes; `name`, `module`, `source`, `build`, `entry` and `signature` it copies from the draft.
WRONG = """
category: elementwise
description: "out = alpha * x transposed (out[j, i] = alpha * x[i, j]). TODO(review): the layout of out"
dims: {tokens: number of tokens, hidden: hidden size}
derived: {}
dtypes: [float32]
arguments:
- {name: out, kind: tensor, shape: [hidden, tokens], dtype: float32, role: out, init: {dist: normal, mean: 0.0, std: 1.0}}
- {name: x, kind: tensor, shape: [tokens, hidden], dtype: float32, role: in, init: {dist: normal, mean: 0.0, std: 1.0}}
- {name: alpha, kind: scalar, dtype: float64, value: 0.5}
shapes:
  token_dim: tokens
  edge: [{tokens: 1, hidden: 64}, {tokens: 8, hidden: 128}, {tokens: 5, hidden: 4096}]
  constraints: ["hidden % 4 == 0"]
tolerance: {float32: {atol: 1.0e-5, rtol: 1.0e-5, floor: 1.0e-5}}
bytes: "2 * tokens * hidden * elt('float32')"
"""
RIGHT = """
category: elementwise
description: "out = alpha * x, elementwise over [tokens, hidden]; out is written without being read."
dims: {tokens: number of tokens, hidden: hidden size (a multiple of 4 at the runtime's call site)}
derived: {}
dtypes: [float32]
arguments:
- {name: out, kind: tensor, shape: [tokens, hidden], dtype: float32, role: out, init: {dist: normal, mean: 0.0, std: 1.0}}
- {name: x, kind: tensor, shape: [tokens, hidden], dtype: float32, role: in, init: {dist: normal, mean: 0.0, std: 1.0}}
- {name: alpha, kind: scalar, dtype: float64, value: 0.5}
shapes:
  token_dim: tokens
  models: [{model: Llama-3.1-8B, tp: 1, dims: {hidden: hidden_size}, tokens: [1, 8]}]
  edge: [{tokens: 3, hidden: 4}, {tokens: 127, hidden: 8}]
  constraints: ["hidden % 4 == 0"]
tolerance: {float32: {atol: 1.0e-5, rtol: 1.0e-5, floor: 1.0e-5}}
bytes: "2 * tokens * hidden * elt('float32')"
"""


@dataclass
class Toy:
    tree: SglangTree
    result: ExtractResult
    inferred: dict


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    """A stand-in checkout with the kernel, its wrapper and a runtime call site, drafted by `astra extract`
    under a home of this module's own."""
    root = tmp_path_factory.mktemp("toy")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ASTRA_HOME", str(cached_home(root / "home")))
        pkg = _fake_checkout(root / "sglang") / "python" / "sglang"
        (pkg / "kernels" / "jit" / "csrc" / "elementwise" / "scale.cuh").write_text(SCALE)
        (pkg / "kernels" / "ops" / "elementwise").mkdir(parents=True)
        (pkg / "kernels" / "ops" / "elementwise" / "scale.py").write_text(LOADER)
        (pkg / "srt" / "layers").mkdir(parents=True)
        (pkg / "srt" / "layers" / "toy_layer.py").write_text(RUNTIME)
        tree = from_source(root / "sglang")
        result = extract.extract(tree, "toy_scale")
        yield Toy(tree, result, yaml.safe_load(result.draft.read_text()))


def model_reply(base: dict, body: str | dict, changes: str) -> str:
    """A reply as a model writes it: the CHANGES line, then the whole spec in one fenced yaml block."""
    written = yaml.safe_load(body) if isinstance(body, str) else body
    spec = {**{k: base[k] for k in PROTECTED}, **written}
    return f"CHANGES: {changes}\n\n```yaml\n{dump_yaml(spec)}```\n"


def client_for(server, transcript: Path | None = None) -> Client:
    return Client(LLMConfig(base_url=server.url, model=MODEL, api_key=KEY, timeout_s=10.0, max_retries=0),
                  transcript=transcript)


def user_message(request) -> str:
    return next(m["content"] for m in request.body["messages"] if m["role"] == "user")


# ---------------------------------------------------------------- the evidence the model sees

CXX = r"""// Copyright: a header comment
#include <cstdint>
#define VEC 4
#define UNUSED_MACRO 7

namespace demo {
namespace detail {

// doubles a value (used by the entry)
template <typename T>
inline T twice(T v) { return v * 2; }

inline void lonely() { const char* s = "}{ not a brace"; (void)s; }

}  // namespace detail

constexpr int kWidth = VEC * 2;
constexpr int kBig = 1'000'000;

struct Unrelated {
  static void run() {}
};

/* the entry */
template <int N>
struct Entry {
  static void run(int x) {
    char c = '{';
    (void)c;
    detail::twice(x + kWidth);
  }
};

}  // namespace demo
"""


def test_kernel_excerpt_keeps_the_entry_and_what_it_uses():
    text = kernel_excerpt(CXX, "demo::Entry<{hidden}>::run")
    for kept in ("// Copyright", "#include <cstdint>", "#define VEC 4", "// doubles a value", "inline T twice(T v)",
                 "constexpr int kWidth = VEC * 2;", "/* the entry */", "struct Entry {", "namespace demo {",
                 "namespace detail {", "}  // namespace demo"):
        assert kept in text, kept
    for dropped in ("UNUSED_MACRO", "lonely", "kBig", "Unrelated"):
        assert dropped not in text, dropped
    assert text.count("// [... 1 line(s) not shown ...]") == 2 and text.count("// [... 4 line(s) not shown ...]") == 1
    entry_only = kernel_excerpt(CXX, "demo::Entry<8>::run", limit=CXX.index("}  // namespace demo") - CXX.index("/*"))
    assert "struct Entry {" in entry_only and "twice(T v)" not in entry_only  # the budget keeps the entry first
    assert kernel_excerpt(CXX, "demo::Missing::run") == CXX  # entry not found: the whole file
    assert kernel_excerpt(CXX + "}\n", "demo::Entry<8>::run") == CXX + "}\n"  # unbalanced: the whole file
    cut = kernel_excerpt(CXX * 40, "nowhere", limit=500)
    assert cut.startswith(CXX[:500]) and cut.endswith("// [... cut at 500 characters ...]\n")


def test_probe_findings_group_the_kernels_messages():
    def case(i: int, status: str, message: str = "", **extra) -> dict:
        return {"id": f"edge/float32/tokens={i},hidden=8", "status": status, "message": message, **extra}

    refused = "RuntimeError: Tensor match failed for out (Root cause: out must have the shape of x)"
    record = {"status": "failed", "reason": f"kernel rejects every drafted case: {refused}",
              "cases": [case(i, "rejected", refused) for i in range(1, 6)]
              + [case(9, "crashed", "the probe process died (signal 11)"),
                 case(10, "kept", notes=["out: constant output"], roles={"out": "out", "x": "in"})],
              "roles": {"out": "out", "x": "in"},
              "sanitizer": {"findings": [{"tool": "memcheck", "message": "Invalid __global__ read of size 4"}]},
              "builds": [{"variant": "float32", "ok": False, "error": "scale.cuh(3): error: expected a ;"}]}
    text = probe_findings(record)
    assert text.splitlines()[:3] == ["status: failed", f"reason: kernel rejects every drafted case: {refused}",
                                     "cases: 7: 5 rejected, 1 crashed, 1 kept"]
    assert (f"- rejected (edge/float32/tokens=1,hidden=8, edge/float32/tokens=2,hidden=8, "
            f"edge/float32/tokens=3,hidden=8 and 2 more): {refused}") in text
    assert "- crashed (edge/float32/tokens=9,hidden=8): the probe process died (signal 11)" in text
    assert "kept (1), e.g. edge/float32/tokens=10,hidden=8; roles observed: {'out': 'out', 'x': 'in'}" in text
    assert "- note: out: constant output" in text and "- memcheck: Invalid __global__ read of size 4" in text
    assert "- build float32: scale.cuh(3): error: expected a ;" in text
    assert len(probe_findings(record, limit=100)) < 160


# ---------------------------------------------------------------- refused replies


def test_a_refused_reply_goes_back_once_with_its_problems(toy, llm_server):
    bad = {**yaml.safe_load(RIGHT), "shapes": {**yaml.safe_load(RIGHT)["shapes"],
                                                "exclude": [{"case": "edge/float32/tokens=3,hidden=4", "reason": "x"}]}}
    first = model_reply(toy.inferred, bad, "excluded the odd case")
    first = first.replace("extra_cuda_cflags: []", "extra_cuda_cflags: [-DTOY_FAST]")
    leaky = {**yaml.safe_load(RIGHT), "description": "out = alpha * x; endpoint key {key}"}  # an endpoint echoing it
    llm_server.push(reply(first, 3000, 500), echo_key(model_reply(toy.inferred, leaky, "out has the shape of x")))
    client = client_for(llm_server)
    spec, note = propose_draft(toy.tree, "toy_scale", toy.inferred, toy.result.notes, client)
    assert spec["arguments"] == yaml.safe_load(RIGHT)["arguments"] and spec["build"] == toy.inferred["build"]
    assert spec["description"] == "out = alpha * x; endpoint key ***" and KEY not in dump_yaml(spec)
    assert note == f"llm:{MODEL}: out has the shape of x (second reply; the first was refused)"
    retry = llm_server.chat_requests()[1].body["messages"]
    assert [m["role"] for m in retry] == ["system", "user", "assistant", "user"] and retry[2]["content"] == first
    assert "- `build` differs from the draft's; copy it unchanged" in retry[3]["content"]
    assert "- shapes.exclude: 'edge/float32/tokens=3,hidden=4' is new; only the probe adds exclusions" in retry[3]["content"]
    tally = client.usage.by_role["testing"]
    assert (tally.calls, tally.prompt_tokens, tally.completion_tokens) == (2, 3010, 505)  # echo_key: 10 in, 5 out
    assert not list(toy.result.draft.parent.glob(".reply-*"))  # the validation copies are gone


def test_twice_refused_gives_up_with_a_note(toy, llm_server):
    invalid = {**yaml.safe_load(RIGHT), "dtypes": ["float33"]}
    llm_server.push(reply(model_reply(toy.inferred, toy.inferred, "nothing to change")),
                    reply(model_reply(toy.inferred, invalid, "a wider dtype")),
                    reply("The draft looks right to me."), reply("```cuda\n// still no spec\n```"))
    repairer = LlmRepairer(client_for(llm_server))
    assert repairer.repair("toy_scale", toy.inferred, {"status": "failed", "reason": "x"}, toy.tree) is None
    retry = llm_server.chat_requests()[1].body["messages"][-1]["content"]
    assert "- the spec is the draft the probe rejected, unchanged; fix what the probe's findings point at" in retry
    (note,) = repairer.notes
    assert note.startswith(f"llm:{MODEL}: both replies refused; the second: dtypes: unknown dtype 'float33' (known: ")
    spec, note = propose_draft(toy.tree, "toy_scale", toy.inferred, [], repairer.client)
    assert spec is toy.inferred  # nothing usable: the inferred draft stays
    assert note == (f"llm:{MODEL}: both replies refused; the second: the reply holds 0 fenced yaml blocks; "
                    "give exactly one, holding the whole spec")


# ---------------------------------------------------------------- end to end: the probe decides


@needs_nvcc
def test_the_probe_rejects_the_wrong_draft_and_passes_the_repair(toy, llm_server):
    draft = toy.result.draft
    llm_server.push(reply(model_reply(toy.inferred, WRONG, "out is x transposed; small edge shapes"), 4100, 700),
                    reply(model_reply(toy.inferred, RIGHT, "out has the shape of x, as check_same_shape demands"),
                          5200, 650))
    client = client_for(llm_server, transcript=draft.parent / "llm.jsonl")
    spec, note = propose_draft(toy.tree, "toy_scale", toy.inferred, toy.result.notes, client)
    assert spec["arguments"][0]["shape"] == ["hidden", "tokens"]  # valid as a spec: only the probe can tell
    write_draft(draft, spec, note)
    propose_prompt = user_message(llm_server.chat_requests()[0])
    assert dump_yaml(toy.inferred) in propose_prompt and all(n in propose_prompt for n in toy.result.notes)

    targets = probing.select(["toy_scale"])
    opts = probing.ProbeOptions(device="cpu", per_gpu=2, sanitizer=False, timeout_case_s=60)
    (first,) = probing.probe_modules(targets, lambda spec: toy.tree, opts)
    record = json.loads((draft.parent / "probe.json").read_text())
    assert first.status == "failed" and [c["status"] for c in record["cases"]] == ["rejected"] * 3
    refusal = record["cases"][0]["message"]
    assert "out must have the shape of x" in refusal and refusal in first.reason

    fixed = LlmRepairer(client).repair("toy_scale", yaml.safe_load(draft.read_text()), record, toy.tree)
    assert fixed is not None and fixed[1] == f"llm:{MODEL}: out has the shape of x, as check_same_shape demands"
    repair_prompt = user_message(llm_server.chat_requests()[1])
    assert f"reason: {first.reason}" in repair_prompt and refusal in repair_prompt
    assert "check_same_shape(out, x);" in repair_prompt and "debug_dump" not in repair_prompt  # the trimmed source
    assert "def scale(x: torch.Tensor, alpha: float = 0.5)" in repair_prompt  # the wrapper
    assert "sglang/srt/layers/toy_layer.py:11  scale in ToyLayer.forward" in repair_prompt  # the call site
    assert "gate self.hidden_size % 4 == 0" in repair_prompt
    write_draft(draft, *fixed)

    (second,) = probing.probe_modules(targets, lambda spec: toy.tree, opts)
    assert second.status == "probed", second.reason
    assert (second.kept, second.total, second.written) == (4, 4, ["out (out)"])
    assert resolve("toy_scale").path == draft  # the gate accepts the probed draft
    header = draft.read_text().split("\nname: ")[0]
    assert header.startswith(DRAFT_HEADER) and all(f"# TODO(review): {n}" in header for n in toy.result.notes)
    assert f"{AGENT_MARK}: {fixed[1]}" in header and header.count(AGENT_MARK) == 1 and PROBED_MARK in header
    exchanges = [json.loads(line) for line in (draft.parent / "llm.jsonl").read_text().splitlines()]
    assert [e["role"] for e in exchanges] == ["testing", "testing"] and KEY not in json.dumps(exchanges)
    assert client.usage.summary() == "2 calls, 10,650 tokens (9,300 in, 1,350 out), unpriced"


# ---------------------------------------------------------------- the same at the command line


@needs_nvcc
def test_extract_and_probe_with_agent_llm_on_the_command_line(toy, llm_server, tmp_path):
    """`astra extract --agent llm` writes the model's (wrong) draft; `astra probe --agent llm` sees the kernel
    refuse it, the message rules have nothing, the model repairs it and the re-probe keeps every case."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "ASTRA_HOME": str(cached_home(tmp_path / "home")), "OPENAI_API_KEY": KEY}
    endpoint = ["--agent", "llm", "--base-url", llm_server.url, "--model", MODEL]
    llm_server.push(reply(model_reply(toy.inferred, WRONG, "out is x transposed"), 4100, 700),
                    reply(model_reply(toy.inferred, RIGHT, "out has the shape of x, as check_same_shape demands"),
                          5200, 650))

    def astra(*args):
        proc = subprocess.run([sys.executable, "-m", "astra.cli", *args], capture_output=True, text=True, env=env,
                              timeout=600)
        return proc.returncode, proc.stdout + proc.stderr

    code, out = astra("extract", "toy_scale", "--sglang-src", str(toy.tree.root), *endpoint)
    assert code == 0, out
    draft = tmp_path / "home" / "drafts" / "toy_scale" / "kernel.yaml"
    assert f"agent  toy_scale: llm:{MODEL}: out is x transposed" in out
    assert yaml.safe_load(draft.read_text())["arguments"][0]["shape"] == ["hidden", "tokens"]

    code, out = astra("probe", "toy_scale", "--device", "cpu", "--no-sanitizer", "--timeout-case", "60",
                      "--sglang-src", str(toy.tree.root), *endpoint)
    assert code == 0, out
    assert f"toy_scale: repaired by llm:{MODEL} (round 1): llm:{MODEL}: out has the shape of x" in out
    record = json.loads((draft.parent / "probe.json").read_text())
    assert record["status"] == "probed" and [r["repairer"] for r in record["repairs"]] == [f"llm:{MODEL}"]
    assert "out must have the shape of x" in record["repairs"][0]["message"]
    assert yaml.safe_load(draft.read_text())["arguments"][0]["shape"] == ["tokens", "hidden"]
    prompts = [user_message(r) for r in llm_server.chat_requests()]
    assert len(prompts) == 2 and "out must have the shape of x" in prompts[1]
