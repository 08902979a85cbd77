"""astra.optimize.decl_chunks: a CUDA file cut into its namespace-scope declarations (the kernel is ours)."""

from __future__ import annotations

from astra.optimize.decl_chunks import blank_code, chunks, references

SOURCE = """#pragma once
#include <cstdint>  // for int64_t {

namespace demo {
namespace detail {

constexpr int kThreads = 256;  // a comment with a brace {
constexpr float kTable[2] = {0.5f, 2.0f};
using Vec = float4;

template <typename T>
__device__ float widen(T x) { return static_cast<float>(x); }

template <>
__device__ float widen<double>(double x) {
  const char* s = "}";  // a brace in a string
  return static_cast<float>(x);
}

}  // namespace detail

enum class Mode : int { kA = 0, kB = 1 };

struct Pair { int a; int b; };
constexpr Pair operator|(Pair x, Pair y) { return Pair{x.a | y.a, x.b | y.b}; }

template <typename T, int kUnroll = 4, bool kFast = false>
__global__ __launch_bounds__(detail::kThreads) void scale_kernel(T* x, int64_t n) {
#if defined(FAST)
  if (kFast) {
#else
  if (!kFast) {
#endif
    x[threadIdx.x] *= detail::widen(x[0]);
  }
}

template <typename T>
struct Scale {
  static void run(T* x, int64_t n) { scale_kernel<T><<<1, detail::kThreads>>>(x, n); }
};

}  // namespace demo
"""


def _named(text: str) -> list[tuple[str, str]]:
    return [(c.name, text[c.start:c.end].splitlines()[0]) for c in chunks(text)]


def test_every_namespace_scope_declaration_is_one_chunk_with_its_name():
    assert [name for name, _ in _named(SOURCE)] == [
        "kThreads", "kTable", "Vec", "widen", "widen", "Mode", "Pair", "operator|", "scale_kernel", "Scale"]


def test_a_chunk_spans_its_template_head_and_whole_body():
    spans = {c.name: SOURCE[c.start:c.end] for c in chunks(SOURCE)}
    kernel = spans["scale_kernel"]
    assert kernel.startswith("template <typename T, int kUnroll = 4, bool kFast = false>")  # `=` in a default
    assert kernel.endswith("x[threadIdx.x] *= detail::widen(x[0]);\n  }\n}")  # braces in #if branches
    assert spans["kTable"] == "constexpr float kTable[2] = {0.5f, 2.0f};"  # an initializer ends at its `;`
    assert spans["Scale"].endswith("};") and spans["Pair"] == "struct Pair { int a; int b; };"
    specialization = [SOURCE[c.start:c.end] for c in chunks(SOURCE) if c.name == "widen"][1]
    assert specialization.startswith("template <>\n__device__ float widen<double>") and specialization.endswith("}")


def test_comments_and_strings_are_blanked_in_place_and_references_are_whole_words():
    code = blank_code(SOURCE)
    assert len(code) == len(SOURCE) and code.count("\n") == SOURCE.count("\n")
    assert "a comment" not in code and '"}"' not in code
    scale = next(SOURCE[c.start:c.end] for c in chunks(SOURCE) if c.name == "Scale")
    assert references(scale, {"scale_kernel", "kThreads", "scale", "Vec"}) == {"scale_kernel", "kThreads"}
    assert references("// kThreads\nint x;", {"kThreads"}) == set()
