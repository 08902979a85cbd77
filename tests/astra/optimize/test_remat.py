"""Rematerialization of per-thread copies of read-only memory (astra.optimize.remat), on kernels written
here: what is rewritten, how each read becomes the load it copied, and every rule that refuses."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from astra.optimize import remat, transforms

# Gather a row into a per-thread array, sum it, then pick an element at a computed index. `gain` is also
# a copy of read-only memory, but it is written twice, so it stays.
KERNEL = r"""#include <cstdint>

constexpr int kSlots = 8;

__global__ void pick_slot(const int32_t* __restrict__ table, const float* __restrict__ weights,
                          float* __restrict__ out, int rows) {
  const int row = blockIdx.x * blockDim.x + threadIdx.x;
  if (row >= rows) return;
  const int32_t* slot_ids = table + row * kSlots;
  const float* row_w = weights + row * kSlots;
  int32_t ids[kSlots];
  float gain[kSlots];
  for (int c = 0; c < kSlots; c++) {
    ids[c] = slot_ids[c];
  }
  for (int c = 0; c < kSlots; c++) {
    gain[c] = row_w[c];
  }
  int total = 0;
  for (int c = 0; c < kSlots; c++) total += ids[c];
  const int pick = (total & 0x7fffffff) % kSlots;
  gain[pick] *= 2.f;
  out[row] = gain[pick] * static_cast<float>(ids[pick]);
}
"""


def _small(mid: str = "", read: str = "a[2]", decl: str = "int a[4];", bound: str = "4",
           src_decl: str = "const int* p = q;") -> str:
    """A one-array kernel: `a` copies p[0..4), then `mid` runs, then `read` is stored to out[0]."""
    return f"""struct Acc {{ int x; }};
__global__ void k(const int* q, int* scratch, int* out, float4* vout, Acc* s, int n) {{
  {src_decl}
  {decl}
  for (int i = 0; i < {bound}; i++) {{
    a[i] = p[i];
  }}
  {mid}
  out[0] = {read};
}}
"""


def _arrays(text: str) -> list[str]:
    return [r.array for r in remat.find(text)]


def test_the_gathered_row_is_read_from_its_source():
    found = remat.find(KERNEL)
    assert [(r.array, r.src) for r in found] == [("ids", "slot_ids")]
    assert found[0].line == KERNEL.splitlines().index("  int32_t ids[kSlots];") + 1
    new = found[0].source
    assert "int32_t ids[kSlots];" not in new and "ids[c] = slot_ids[c];" not in new
    assert not re.search(r"\bids\b", new.replace("slot_ids", ""))  # no reference to the array is left
    assert "for (int c = 0; c < kSlots; c++) total += slot_ids[c];" in new
    assert "out[row] = gain[pick] * static_cast<float>(slot_ids[pick]);" in new  # same type: no cast added
    for kept in ("float gain[kSlots];", "    gain[c] = row_w[c];", "gain[pick] *= 2.f;"):  # written twice: left alone
        assert kept in new
    expected = re.sub(r"\bids\[", "slot_ids[", KERNEL.replace("  int32_t ids[kSlots];\n", "")
                      .replace("    ids[c] = slot_ids[c];\n", ""))
    assert new == expected  # nothing else changed


def test_catalog_lists_the_remat_first():
    proposals = transforms.catalog(KERNEL, [])
    assert proposals[0].name == "remat:ids" and proposals[0].family == "remat"
    assert proposals[0].source == remat.find(KERNEL)[0].source and "slot_ids[]" in proposals[0].description
    assert [p.name for p in proposals if p.family == "remat"] == ["remat:ids"]  # no remat:gain, no remat:all


def test_two_qualifying_arrays_also_give_remat_all():
    text = _small(decl="int a[4];\n  int b[4];", read="a[1] + b[2]").replace(
        "a[i] = p[i];", "a[i] = p[i];\n    b[i] = p[i + 4];")
    proposals = transforms.rematerialize(text)
    assert [p.name for p in proposals] == ["remat:a", "remat:b", "remat:all"]
    assert "out[0] = p[1] + p[(2) + 4];" in proposals[-1].source
    assert not re.search(r"\b[ab]\s*\[", proposals[-1].source)


def test_the_fill_index_is_substituted_into_the_source_expression():
    text = """__global__ void k(const int* rows, int* out, int base, int k) {
  const int* p = rows;
  int a[4];
  for (int i = 0; i < 4; i++) {
    a[i] = p[base + i];
  }
  out[0] = a[k + 1];
}
"""
    found = remat.find(text)
    assert [r.array for r in found] == ["a"]
    assert "out[0] = p[base + (k + 1)];" in found[0].source
    assert "int a[4];" not in found[0].source and "a[i] =" not in found[0].source


def test_a_different_element_type_gets_a_cast():
    text = _small(decl="double a[4];", read="a[3] * 2.0", src_decl="const float* p = reinterpret_cast<const float*>(q);")
    found = remat.find(text)
    assert [r.array for r in found] == ["a"]
    assert "out[0] = static_cast<double>(p[3]) * 2.0;" in found[0].source


def test_the_small_kernel_qualifies_as_written():
    """The refusals below each change one thing of this kernel."""
    found = remat.find(_small())
    assert [r.array for r in found] == ["a"] and "out[0] = p[2];" in found[0].source


@pytest.mark.parametrize("mid", ["a[1] = 7;", "a[3] += 1;", "a[0]++;"])
def test_written_twice_is_refused(mid):
    assert _arrays(_small(mid=mid)) == []


@pytest.mark.parametrize("mid", ["int* r = &a[0];", "int* r = a;", "helper(a);"])
def test_address_taken_or_passed_whole_is_refused(mid):
    assert _arrays(_small(mid=mid)) == []


@pytest.mark.parametrize(("decl", "bound"), [("int a[8];", "4"), ("int a[4];", "n")])
def test_a_loop_bound_other_than_the_size_is_refused(decl, bound):
    assert _arrays(_small(decl=decl, bound=bound)) == []


@pytest.mark.parametrize("src_decl", ["int* p = scratch;", "int* const p = scratch;"])
def test_a_source_not_pointing_to_const_is_refused(src_decl):
    assert _arrays(_small(src_decl=src_decl)) == []


@pytest.mark.parametrize("mid", [
    "p += 4;", "p = q + 4;", "p++;", "++p;",
])
def test_a_reassigned_source_is_refused(mid):
    assert _arrays(_small(mid=mid)) == []


@pytest.mark.parametrize("mid", [
    "out[1] = 1;", "*out = 1;", "s->x = 1;", "out[n] -= 3;",
    "*(out + 1) = 1;",
    "reinterpret_cast<int4*>(out)[0] = make_int4(0, 0, 0, 0);",
    "vout[0].x = 1.f;",
    "out[1]++;",
])
def test_a_global_store_between_fill_and_read_is_refused(mid):
    assert _arrays(_small(mid=mid)) == []


def test_a_store_later_in_a_loop_that_holds_a_read_is_refused():
    loop = "int t = 0;\n  for (int j = 0; j < n; j++) {\n    t += a[j & 3];\n    STORE\n  }"
    after_the_loop = _small(mid=loop.replace("STORE", "") + "\n  out[1] = t;", read="t")
    assert _arrays(after_the_loop) == ["a"]  # the store after the loop is after the last read: fine
    in_the_loop = _small(mid=loop.replace("STORE", "out[j + 1] = t;"), read="t")
    assert _arrays(in_the_loop) == []  # iteration j's store runs before iteration j + 1's read


@pytest.mark.parametrize("mid", ["__syncthreads();", "__syncwarp();"])
def test_a_barrier_in_between_is_refused(mid):
    assert _arrays(_small(mid=mid)) == []


@pytest.mark.parametrize("mid", ["__stcs(out + 1, 1);", "atomicAdd(out, 1);", 'asm volatile("membar.gl;");',
                                 "ptx::st_relaxed(out, 1);", "store_release(out, 1);"])
def test_a_store_intrinsic_atomic_or_asm_in_between_is_refused(mid):
    assert _arrays(_small(mid=mid)) == []


def test_a_read_indexed_by_the_array_leaves_no_reference_to_it():
    for r in remat.find(_small(read="a[a[0] & 3]")):
        assert not re.search(r"\ba\s*\[", r.source), r.source


def test_a_const_pointer_parameter_is_a_source():
    text = _small(src_decl="").replace("const int* q,", "const int* __restrict__ p,")
    assert _arrays(text) == ["a"]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not found")
def test_the_rewritten_kernel_compiles(tmp_path):
    source = tmp_path / "remat.cu"
    source.write_text(remat.find(KERNEL)[0].source)
    done = subprocess.run(["nvcc", "-std=c++17", "-c", "-x", "cu", str(source), "-o", str(tmp_path / "remat.o")],
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
