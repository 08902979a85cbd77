"""A built module's code digest (astra.optimize.machine_code): the same for an edit the code never reaches,
different for one it does; the overlay folder in __FILE__ strings does not count. Real harness builds."""

from __future__ import annotations

import pytest

from astra.optimize.machine_code import code_digest, sections
from tests.rowscale_package import ROWSCALE, make_rowscale
from tests.toolchain import needs_nvcc


@needs_nvcc
def test_the_search_skips_an_edit_that_builds_to_the_base_code(tmp_path):
    """The search's prebuild (astra.optimize.evaluator.HarnessEvaluator.prebuild) builds through the harness, as the workers
    will: an unused constant changed builds to the base's module (in another overlay folder, with another
    __FILE__), a launch constant changed does not."""
    from astra.optimize.evaluator import HarnessEvaluator
    from astra.sglang.tree import from_source
    from astra.spec import jobs
    from astra.spec.resolve import resolve

    rowscale = make_rowscale(tmp_path)
    spec, tree = resolve(str(rowscale["spec"])), from_source(rowscale["package"])
    base = ROWSCALE.read_text().replace("constexpr int kThreads = 256;",
                                        "constexpr int kThreads = 256;\nconstexpr int kSpareVec = 4;")
    dead = base.replace("kSpareVec = 4", "kSpareVec = 1")
    live = base.replace("kThreads = 256", "kThreads = 128")
    case = next(c.id for c in jobs.make_job(spec, tree).cases if c.timed)  # bf16: one variant to build
    prebuild = HarnessEvaluator(spec, tree).prebuild
    assert prebuild([dead, live], [case], base) == {dead: "builds to the base's machine code"}
    assert prebuild([dead], [case]) == {}  # no base named: nothing is called the same
    broken = base.replace("constexpr int kThreads = 256;", "constexpr int kThreads = 256;\nstatic_assert(kThreads < 0);")
    found = prebuild([broken, live], [case], base)
    assert list(found) == [broken] and found[broken].startswith("build_failed: ")
    assert "error" in found[broken]


def test_a_file_that_is_not_a_module_has_no_digest(tmp_path):
    text = tmp_path / "notes.txt"
    text.write_text("not an ELF file")
    assert sections(text) == {} and code_digest(text) is None
    assert code_digest(tmp_path / "missing.so") is None


@pytest.mark.parametrize("cut", [20, 100])
def test_a_truncated_module_has_no_digest(tmp_path, cut):
    elf = tmp_path / "cut.so"
    elf.write_bytes(b"\x7fELF\x02\x01" + b"\0" * cut)
    assert code_digest(elf) is None
