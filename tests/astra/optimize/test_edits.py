"""astra.optimize.edits: parsing SEARCH/REPLACE blocks and whole files, applying them, messages for the model."""

from __future__ import annotations

import pytest

from astra.optimize.edits import EditFormatError, apply_edits, apply_reply, parse_edits

KERNEL = """\
#include <cuda_bf16.h>

template <int kHidden, typename T>
__global__ void rmsnorm_kernel(T* out, const T* in, const T* w, float eps) {
    float acc = 0.0f;
    for (int i = threadIdx.x; i < kHidden; i += blockDim.x) {
        float v = static_cast<float>(in[blockIdx.x * kHidden + i]);
        acc += v * v;
    }
    acc = block_reduce_sum(acc);
    __syncthreads();
    float scale = rsqrtf(acc / kHidden + eps);
    __syncthreads();
}
"""


def block(search: str, replace: str) -> str:
    return f"<<<<<<< SEARCH\n{search}\n=======\n{replace}\n>>>>>>> REPLACE\n"


def test_exact_blocks_apply_in_order():
    reply = ("Two changes:\n```cuda\n" + block("    float acc = 0.0f;", "    float acc = 0.f;  // fp32")
             + "```\n" + block("    float acc = 0.f;  // fp32\n    for (int i = threadIdx.x; i < kHidden; i += blockDim.x) {",
                               "    float acc = 0.f;\n#pragma unroll 4\n    for (int i = threadIdx.x; i < kHidden; i += blockDim.x) {"))
    result = apply_reply(KERNEL, reply)
    assert result.ok and result.applied == [1, 2] and result.feedback() == ""
    assert "    float acc = 0.f;\n#pragma unroll 4\n    for (int i" in result.new_text
    assert result.new_text.endswith("}\n")


def test_whitespace_insensitive_match_reindents():
    reply = block("float scale = rsqrtf(acc / kHidden + eps);\n__syncthreads();",
                  "float scale = rsqrtf(acc * (1.0f / kHidden) + eps);")
    result = apply_reply(KERNEL, reply)
    assert result.ok
    assert "\n    float scale = rsqrtf(acc * (1.0f / kHidden) + eps);\n}\n" in result.new_text


def test_ambiguous_block_asks_for_context():
    result = apply_reply(KERNEL, block("    __syncthreads();", ""))
    assert result.applied == [] and result.new_text == KERNEL
    [failure] = result.failed
    assert failure.reason == "ambiguous" and failure.index == 1
    assert "match 2 places (starting at lines 11, 13)" in failure.message
    assert "matches exactly one place" in result.feedback()


def test_failure_message_shows_nearest_lines_and_applied_blocks():
    reply = (block("    float acc = 0.0f;", "    float acc = 0.f;")
             + block("        float v = static_cast<float>(in[blockIdx.x * HIDDEN + i]);\n        acc += v * v;",
                     "        acc += sq(in[i]);")
             + block("#include <cuda_bf16.h>", "#include <cuda_bf16.h>\n#include <cuda_fp16.h>"))
    result = apply_reply(KERNEL, reply)
    assert result.applied == [1, 3]
    [failure] = result.failed
    assert failure.reason == "no_match" and failure.index == 2
    assert failure.first_line == "float v = static_cast<float>(in[blockIdx.x * HIDDEN + i]);"
    text = failure.message
    assert "Block 2 (first line `float v = static_cast<float>(in[blockIdx.x * HIDDEN + i]);`)" in text
    assert "lines 7-8" in text
    assert " 7 |         float v = static_cast<float>(in[blockIdx.x * kHidden + i]);" in text
    assert " 5 |" in text and "10 |" in text  # two lines of context each side
    assert "Already applied (do not send again): blocks 1, 3." in text
    assert "Send corrected blocks for the failed ones only" in result.feedback()
    assert "#include <cuda_fp16.h>" in result.new_text and "float acc = 0.f;" in result.new_text


def test_whole_file():
    reply = "Rewrite:\n\nFILE: elementwise/rmsnorm.cuh\n```cuda\n// new\nint x;\n```\n"
    [edit] = parse_edits(reply)
    assert edit.whole and edit.file == "elementwise/rmsnorm.cuh"
    result = apply_reply(KERNEL, reply, filename="elementwise/rmsnorm.cuh")
    assert result.ok and result.new_text == "// new\nint x;\n"
    wrong = apply_reply(KERNEL, reply.replace("rmsnorm.cuh", "norm.cuh"), filename="elementwise/rmsnorm.cuh")
    assert wrong.failed[0].reason == "wrong_file" and "only file you may edit is `elementwise/rmsnorm.cuh`" \
        in wrong.feedback()


def test_file_line_before_fenced_blocks():
    reply = "FILE: rmsnorm.cuh\n```cuda\n" + block("    float acc = 0.0f;", "    float acc = 1.0f;") + "```\n"
    [edit] = parse_edits(reply)
    assert not edit.whole and edit.file == "rmsnorm.cuh"
    assert apply_edits(KERNEL, [edit], filename="elementwise/rmsnorm.cuh").ok


@pytest.mark.parametrize("reply, expected", [
    ("I think the kernel is already optimal.", "your reply holds no edit. Give each edit as"),
    ("```cuda\nint x;\n```", "A whole file needs a line `FILE: <name>` right before its ``` fence"),
    ("<<<<<<< SEARCH\nint x;\n=======\nint y;\n", "block 1 is not terminated: no `>>>>>>> REPLACE` line"),
    ("<<<<<<< SEARCH\nint x;\n", "block 1 is not terminated: no `=======` line"),
    ("<<<<<<< SEARCH\nint x;\n<<<<<<< SEARCH\n", "block 1 has `<<<<<<< SEARCH` (line 3 of your reply) where"),
    ("=======\nint y;\n>>>>>>> REPLACE\n", "line 1 of your reply (`=======`) is outside any block"),
    ("FILE: a.cuh\n```cuda\nint x;\n", "no closing ``` fence; the reply was probably cut off"),
])
def test_malformed_replies(reply, expected):
    with pytest.raises(EditFormatError, match=None) as caught:
        parse_edits(reply)
    assert expected in str(caught.value)
    result = apply_reply(KERNEL, reply)
    assert result.failed[0].reason == "format" and result.new_text == KERNEL
    assert expected in result.feedback()


def test_empty_search_is_refused():
    result = apply_reply(KERNEL, block("", "int y;"))
    assert result.failed[0].reason == "empty_search" and "empty SEARCH section" in result.feedback()


def test_file_without_trailing_newline_and_deletion():
    result = apply_reply("a\nb\nc", block("b", ""))
    assert result.ok and result.new_text == "a\n\nc"
    result = apply_reply("a\nb\nc", "<<<<<<< SEARCH\nb\n=======\n>>>>>>> REPLACE\n")
    assert result.ok and result.new_text == "a\nc"
