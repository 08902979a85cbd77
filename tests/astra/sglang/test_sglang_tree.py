"""Locating SGLang trees: checkouts and unpacked packages (built here), wheels (downloaded)."""

import pytest

from astra.errors import AstraError, SglangNotFound
from astra.sglang import tree as sglang_tree


def _fake_checkout(root, layout="kernels/jit"):
    pkg = root / "python" / "sglang"
    (pkg / layout / "csrc" / "elementwise").mkdir(parents=True)
    (pkg / layout / "include").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (root / "python" / "pyproject.toml").write_text('[project]\nname = "sglang"\nversion = "9.1.2"\n')
    return root


def test_checkout_layout_and_version(tmp_path):
    tree = sglang_tree.from_source(_fake_checkout(tmp_path))
    assert tree.layout == "kernels/jit"
    assert tree.version == "9.1.2"
    assert tree.origin == "checkout"
    kernel = tree.csrc_dir / "elementwise" / "k.cuh"
    kernel.write_text("// mine\n")
    assert tree.repo_path(kernel) == "python/sglang/kernels/jit/csrc/elementwise/k.cuh"
    assert tree.package_path(kernel) == "sglang/kernels/jit/csrc/elementwise/k.cuh"


def test_old_layout(tmp_path):
    tree = sglang_tree.from_source(_fake_checkout(tmp_path, "jit_kernel"))
    assert tree.layout == "jit_kernel"
    assert tree.loader_dirs == [tree.root / "sglang" / "jit_kernel"]


def test_not_sglang(tmp_path):
    with pytest.raises(SglangNotFound, match="not an SGLang tree"):
        sglang_tree.from_source(tmp_path)


def test_no_jit_kernels(tmp_path):
    (tmp_path / "python" / "sglang").mkdir(parents=True)
    (tmp_path / "python" / "sglang" / "__init__.py").write_text("")
    with pytest.raises(SglangNotFound, match="no JIT CUDA kernels"):
        sglang_tree.from_source(tmp_path).layout


def test_bad_version_string():
    with pytest.raises(AstraError, match="not a version number"):
        sglang_tree.from_wheel("latest; rm -rf /")


def test_both_options_rejected(tmp_path):
    with pytest.raises(AstraError, match="not both"):
        sglang_tree.locate(version="0.5.23", src=tmp_path)


@pytest.mark.network
def test_wheel_unpacks_only_kernel_sources(sglang_0523):
    assert sglang_0523.origin == "wheel" and sglang_0523.version == "0.5.23"
    assert (sglang_0523.csrc_dir / "elementwise" / "fused_add_rmsnorm.cuh").is_file()
    srt = sglang_tree.ensure_srt(sglang_0523)  # and the runtime's call sites: sglang/srt, .py files only
    assert srt is not None and all(p.suffix == ".py" for p in srt.rglob("*") if p.is_file())


@pytest.mark.network
def test_version_not_in_index():
    with pytest.raises(SglangNotFound, match="not in the package index"):
        sglang_tree.from_wheel("0.0.999")


def test_requirement_and_tvm_ffi_pin(tmp_path, monkeypatch):
    from astra.spec import builds as build_cmd

    root = _fake_checkout(tmp_path)
    meta = root / "python" / "sglang-9.1.2.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text("Name: sglang\nRequires-Dist: apache-tvm-ffi==0.1.11\nRequires-Dist: torch\n")
    tree = sglang_tree.from_source(root)
    assert tree.requirement("apache-tvm-ffi") == "==0.1.11"
    assert tree.requirement("flashinfer") is None
    monkeypatch.setattr(build_cmd, "tvm_ffi_version", lambda: "0.1.15")
    assert "pins apache-tvm-ffi 0.1.11 but 0.1.15 is installed" in build_cmd.tvm_ffi_mismatch(tree)
    monkeypatch.setattr(build_cmd, "tvm_ffi_version", lambda: "0.1.11")
    assert build_cmd.tvm_ffi_mismatch(tree) is None
