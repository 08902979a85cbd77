"""Runtime call sites and their gates: on a checkout written here, and on real SGLang wheels."""

import json
import shutil
import subprocess
import sys
import time
from dataclasses import asdict

import pytest

from astra.sglang import srt_gates
from astra.sglang import tree as sglang_tree
from astra.sglang.tree import SglangTree, ensure_srt

LOADER = '''
from sglang.kernels.jit.utils import cache_once, load_jit, make_cpp_args
from sglang.srt.utils.custom_op import register_custom_op


@cache_once
def _jit_scale_module(dtype, width: int = 256):
    args = make_cpp_args(width, dtype)
    return load_jit("scale", *args, cuda_files=["elementwise/scale.cuh"],
                    cuda_wrappers=[("scale", f"ScaleKernel<{args}>::run")])


def _launch(x, out, alpha):
    _jit_scale_module(x.dtype, x.shape[-1] * x.element_size()).scale(x, out, alpha)


@register_custom_op(mutates_args=["out"])
def scale(x, out, alpha: float = 1.0) -> None:
    _launch(x, out, alpha)


def can_scale(head_dim):
    if head_dim not in (64, 128):
        return False
    return head_dim % 16 == 0


def unrelated(x):
    return x
'''
RUNTIME = '''
import sglang.kernels.ops.demo.scale as ops
from sglang.kernels.ops.demo import scale
from sglang.kernels.ops.demo.scale import can_scale, unrelated

_SIZES = frozenset({64, 128, 256})


class Layer:
    def forward(self, x, out):
        if self.config.head_size in _SIZES and self.tp_size == 1:
            if x.is_contiguous():
                return ops.scale(x, out)
            elif _is_cuda:
                return scale(x, out) if self.hidden_size % 16 == 0 else None
            else:
                return unrelated(x)

    def other(self, x, out):
        if not can_scale(self.head_dim):
            return None
        scale(x, out, 2.0)
'''


def _checkout(root, runtime=True):
    pkg = root / "python" / "sglang"
    (pkg / "kernels" / "jit" / "csrc" / "elementwise").mkdir(parents=True)
    (pkg / "kernels" / "jit" / "csrc" / "elementwise" / "scale.cuh").write_text("// scale\n")
    (pkg / "kernels" / "jit" / "include").mkdir()
    (pkg / "kernels" / "ops" / "demo").mkdir(parents=True)
    (pkg / "kernels" / "ops" / "demo" / "__init__.py").write_text("from .scale import scale\n")
    (pkg / "kernels" / "ops" / "demo" / "scale.py").write_text(LOADER)
    (pkg / "__init__.py").write_text("")
    (root / "python" / "pyproject.toml").write_text('[project]\nname = "sglang"\nversion = "9.9.9"\n')
    if runtime:
        (pkg / "srt" / "layers").mkdir(parents=True)
        (pkg / "srt" / "layers" / "demo.py").write_text(RUNTIME)
    return sglang_tree.from_source(root)


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("ASTRA_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def test_sites_chains_gates_and_constraints(tmp_path, home):
    tree = _checkout(tmp_path / "repo")
    assert tree.srt_dir == tree.root / "sglang" / "srt"
    reach = srt_gates.why(tree, "scale")
    assert {(ep.name, ep.kind) for ep in reach.entry_points} == {
        ("_launch", "function"), ("scale", "function"), ("_jit_scale_module", "loader")}
    sites = {(s.line, s.name): s for s in reach.sites}
    assert set(sites) == {(13, "ops.scale"), (15, "scale"), (22, "scale")}  # not can_scale, not unrelated
    direct = sites[(13, "ops.scale")]
    assert direct.function == "Layer.forward" and direct.kind == "call"
    assert direct.target == "sglang.kernels.ops.demo.scale:scale"
    assert direct.chain == ["self.config.head_size in _SIZES", "self.tp_size == 1", "x.is_contiguous()"]
    assert direct.gates == ["self.config.head_size in _SIZES", "self.tp_size == 1"]
    ternary = sites[(15, "scale")]  # re-exported by the package; elif; ternary
    assert ternary.target == "sglang.kernels.ops.demo.scale:scale"
    assert ternary.chain == ["self.config.head_size in _SIZES", "self.tp_size == 1", "not x.is_contiguous()",
                             "_is_cuda", "self.hidden_size % 16 == 0"]
    guarded = sites[(22, "scale")]  # an early-return guard, and what the kernels predicate tests
    assert guarded.chain == ["can_scale(self.head_dim)"]
    assert guarded.requires == ["can_scale: self.head_dim in (64, 128)", "can_scale: self.head_dim % 16 == 0"]
    found = {(c.name, c.op, tuple(c.values)) for c in reach.constraints}
    assert found == {("head_size", "in", (64, 128, 256)), ("tp_size", "==", (1,)),
                     ("hidden_size", "multiple_of", (16,)), ("head_dim", "in", (64, 128)),
                     ("head_dim", "multiple_of", (16,))}
    assert reach.reached and reach.verdict.startswith("reached from 3 runtime sites in 1 file(s)")
    json.dumps(asdict(reach))
    assert asdict(srt_gates.why(tree, "scale")) == asdict(reach)  # asking again changes nothing


def test_index_is_cached_and_follows_edits(tmp_path, home):
    tree = _checkout(tmp_path / "repo")
    first = srt_gates.index(tree)
    assert len(list((home / "srt-index").glob("*.json"))) == 1
    srt_gates._INDEXES.clear()
    assert srt_gates.index(tree) == first  # read back from disk
    (tree.srt_dir / "layers" / "more.py").write_text("from sglang.kernels.ops.demo.scale import scale\nscale(1, 2)\n")
    assert len(srt_gates.index(tree)) == len(first) + 1
    assert len(list((home / "srt-index").glob("*.json"))) == 2


REGISTRY_PACKAGE = '''
from sglang.kernels.registry import register_kernel
from sglang.kernels.selector import get_kernel
from sglang.kernels.spec import KernelBackend, KernelSpec

register_kernel(KernelSpec(op="demo.scale", backend=KernelBackend.TRITON, target="sglang.kernels.ops.demo.tri:scale"))
register_kernel(KernelSpec(op="demo.scale", backend=KernelBackend.JIT, target="sglang.kernels.ops.demo.scale:scale"))
register_kernel(KernelSpec(op="demo.scale", backend=KernelBackend.AOT, target="sgl_kernel:scale"))


def scale_any(x, out, alpha=1.0):
    """The package's entry: the registry picks a backend."""
    return get_kernel("demo.scale", KernelBackend.JIT)(x, out, alpha)


def not_a_dispatcher(x):
    return x
'''


def test_a_package_function_dispatching_through_the_kernel_registry_reaches_the_jit_target(tmp_path, home):
    """SGLang 0.5.23's packages wrap kernels in functions that call `get_kernel("op")`, with the op's backends
    registered as `KernelSpec(op=..., target="module:function")` (kernels/ops/mamba/__init__.py): a runtime
    call of the package function, under any alias, is a site of the JIT target's module (registered between
    two other backends, so neither "first wins" nor "last wins" passes)."""
    tree = _checkout(tmp_path / "repo")
    (tree.root / "sglang" / "kernels" / "ops" / "demo" / "__init__.py").write_text(REGISTRY_PACKAGE)
    (tree.srt_dir / "layers" / "demo.py").write_text(
        "from sglang.kernels.ops.demo import scale_any as scale_kernel, not_a_dispatcher\n\n\n"
        "def decode(x, out):\n    if x.dim() == 2:\n        scale_kernel(x, out)\n    return not_a_dispatcher(x)\n")
    reach = srt_gates.why(tree, "scale")
    (site,) = reach.sites
    assert (site.line, site.name, site.kind, site.function) == (6, "scale_kernel", "call", "decode")
    assert site.target == "sglang.kernels.ops.demo.scale:scale" and site.chain == ["x.dim() == 2"]
    assert reach.reached


def test_no_runtime_tree_and_no_site(tmp_path, home):
    tree = _checkout(tmp_path / "bare", runtime=False)
    assert tree.srt_dir is None and ensure_srt(tree) is None
    assert srt_gates.why(tree, "scale").verdict.startswith("sglang/srt is not in this tree")
    tree = _checkout(tmp_path / "cold")
    (tree.srt_dir / "layers" / "demo.py").write_text("from sglang.kernels.ops.demo.scale import unrelated\n")
    reach = srt_gates.why(tree, "scale")
    assert not reach.reached and reach.verdict == (
        "no call site in sglang/srt: reached only from tests/benchmarks or by plugins")


def test_a_runtime_that_cannot_be_fetched_is_asked_for_once(tmp_path, home, monkeypatch):
    """On a machine with no network (the GPU box), a wheel tree without sglang/srt fails the same way for
    every kernel a survey looks up: pip is run once per process, not once per kernel."""
    from astra.errors import SglangNotFound

    checkout = _checkout(tmp_path / "repo", runtime=False)
    tree = SglangTree(checkout.root, "9.9.8", "wheel")
    calls: list[str] = []

    def offline(version, dest):
        calls.append(version)
        raise SglangNotFound("could not download SGLang 9.9.8 with pip: no network")

    monkeypatch.setattr(sglang_tree, "_pip_download", offline)
    for _ in range(3):
        with pytest.raises(SglangNotFound, match="no network"):
            ensure_srt(tree)
    assert calls == ["9.9.8"]


def test_cli_list_why(tmp_path, home):
    _checkout(tmp_path / "repo")
    proc = subprocess.run([sys.executable, "-m", "astra.cli", "list", "--sglang-src", str(tmp_path / "repo"),
                           "--why", "scale"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "loader:   sglang/kernels/ops/demo/scale.py:_jit_scale_module" in proc.stdout
    assert "sglang/srt/layers/demo.py:13  ops.scale in Layer.forward" in proc.stdout
    assert "gate self.tp_size == 1" in proc.stdout
    assert proc.stdout.rstrip().endswith("verdict: reached from 3 runtime sites in 1 file(s) (3 calls)")


@pytest.mark.network
def test_wheel_tree_gets_srt_python_files_lazily(sglang_0510, tmp_path, home):
    # a wheel tree unpacked before srt existed: only kernels, no marker
    old = tmp_path / "0.5.10"
    shutil.copytree(sglang_0510.root / "sglang" / "jit_kernel", old / "sglang" / "jit_kernel")
    tree = SglangTree(old, "0.5.10", "wheel")
    assert tree.srt_dir is None
    srt = ensure_srt(tree)
    assert srt == old / "sglang" / "srt" and tree.srt_dir == srt
    files = [p for p in srt.rglob("*") if p.is_file()]
    assert len(files) > 500 and all(p.suffix == ".py" for p in files)


@pytest.mark.network
def test_0523_sites(sglang_0523):
    srt_gates.index(sglang_0523)  # built once per tree (a few seconds), then read from $ASTRA_HOME
    srt_gates._INDEXES.clear()
    start = time.monotonic()
    assert len(srt_gates.index(sglang_0523)) > 1000
    assert time.monotonic() - start < 1.0
    clamp = srt_gates.why(sglang_0523, "clamp_position")
    (site,) = clamp.sites
    assert (site.file, site.function) == ("sglang/srt/model_executor/forward_batch_info.py", "ForwardBatch.init_new")
    assert site.chain == ["not ret.forward_mode.is_idle()",  # `if ret.forward_mode.is_idle(): ... return ret`
                          "ret.forward_mode.is_decode() or ret.forward_mode.is_target_verify()",
                          "ret.positions is None"]
    qknorm = srt_gates.why(sglang_0523, "qknorm")
    call = next(s for s in qknorm.sites if s.kind == "call")
    assert (call.file, call.function) == ("sglang/srt/models/utils.py", "apply_qk_norm")
    assert "_is_cuda" in call.gates and "can_use_fused_inplace_qknorm(head_dim, q.dtype)" in call.chain
    assert [(c.name, c.op, c.values) for c in qknorm.constraints] == [("head_dim", "in", [64, 128, 256, 512, 1024])]
    add = srt_gates.why(sglang_0523, "fused_add_rmsnorm")
    (site,) = add.sites
    assert site.function == "RMSNorm.forward_cuda" and site.import_chain == ["_is_cuda"]
    assert ("hidden_size", "multiple_of", [16]) in [(c.name, c.op, c.values) for c in add.constraints]
    assert not srt_gates.why(sglang_0523, "rmsnorm").reached  # the runtime uses sgl_kernel's rmsnorm


@pytest.mark.network
def test_0510_rope_gated_on_head_size(sglang_0510):
    ensure_srt(sglang_0510)
    rope = srt_gates.why(sglang_0510, "rotary_embedding")
    (site,) = rope.sites
    assert site.file == "sglang/srt/layers/rotary_embedding/base.py" and site.function == "RotaryEmbedding.__init__"
    assert "not _is_cuda or self.head_size not in [64, 128, 256, 512]" in site.gates
    (c,) = rope.constraints
    assert (c.name, c.op, c.values, c.certain) == ("head_size", "not in", [64, 128, 256, 512], False)
    clamp = srt_gates.why(sglang_0510, "clamp_position")
    assert [s.name for s in clamp.sites] == ["clamp_position_cuda"]  # imported inside the function
