"""reuse: loop-invariant reads of read-only memory move above the loop; anything else stays."""

from astra.optimize.passes import all_passes
from astra.optimize.passes.syntax import assignment, parse, refers_to, stepped, walk, written
from tests.astra.optimize.passes.nvcc import compiles

KERNEL = """
#include <cstdint>
template <typename T>
__global__ void scale_rows(T* __restrict__ out, const T* __restrict__ in, const float* __restrict__ scale,
                           const float* bias, int rows, int n) {
  for (int row = blockIdx.x; row < rows; row += gridDim.x) {
    const float bias_v = bias[row] * 2.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
      out[row * n + i] = static_cast<T>(static_cast<float>(in[row * n + i]) * scale[row] + __ldg(&bias[0]));
    }
    out[row * n] = static_cast<T>(bias_v);
  }
}
"""


def test_invariant_loads_move_above_the_innermost_loop_and_it_builds(tmp_path):
    result = all_passes()["reuse"].apply(KERNEL)
    assert result.applies, result.reason
    out = result.source
    hoisted = out.index("const auto scale_v = scale[row];")
    assert hoisted < out.index("for (int i = threadIdx.x")
    assert "* scale_v + " in out and "scale[row] +" not in out
    assert "const auto bias_v2 = __ldg(&bias[0]);" in out  # named apart from the kernel's own bias_v
    assert "in[row * n + i]" in out  # varies with i: stays
    assert "const float bias_v = bias[row] * 2.0f;" in out  # its loop (over rows) holds another loop
    assert compiles(tmp_path, out, "template __global__ void scale_rows<float>(float*, const float*, const float*, "
                                   "const float*, int, int);") == ""


def test_a_const_declaration_moves_out_whole():
    source = """
__global__ void k(float* __restrict__ out, const float* w, const float* x, int rows, int n) {
  for (int r = blockIdx.x; r < rows; r += gridDim.x) {
    const float w0 = w[threadIdx.x] * 0.5f;
    out[r * n + threadIdx.x] = x[r * n + threadIdx.x] * w0;
  }
}
"""
    result = all_passes()["reuse"].apply(source)
    assert result.applies, result.reason
    assert result.source.index("const float w0 = w[threadIdx.x] * 0.5f;") < result.source.index("for (int r")
    assert result.source.count("const float w0") == 1


def test_refusals_name_the_reason():
    written_in_loop = """
__global__ void k(float* out, float* acc, int n) {
  for (int i = threadIdx.x; i < n; i += blockDim.x) { acc[0] += out[i]; out[i] = acc[0]; }
}
"""
    shared = """
__global__ void k(float* out, int n) {
  __shared__ float s[32];
  const float* t = s;
  for (int i = threadIdx.x; i < n; i += blockDim.x) out[i] = t[0];
}
"""
    # a pointer to const may read what another pointer writes: without __restrict__ on either, out may be w
    may_alias = """
__global__ void k(float* out, const float* w, const float* x, int rows, int n) {
  for (int r = blockIdx.x; r < rows; r += gridDim.x) {
    const float w0 = w[threadIdx.x] * 0.5f;
    out[r * n + threadIdx.x] = x[r * n + threadIdx.x] * w0;
  }
}
"""
    # nor does an element type the loop stores nowhere: a store through an int pointer may write the floats
    other_type = """
__global__ void k(int* __restrict__ idx, float* out, const float* w, int n) {
  for (int i = threadIdx.x; i < n; i += blockDim.x) { idx[i] = i; out[i] = w[0]; }
}
"""
    # a call given a pointer may store through it
    through_call = """
__device__ void put(float* p, float v);
__global__ void k(float* __restrict__ out, const float* __restrict__ w, int n) {
  for (int i = threadIdx.x; i < n; i += blockDim.x) put(out + i, w[0]);
}
"""
    for source in (written_in_loop, shared, may_alias, other_type, through_call):
        result = all_passes()["reuse"].apply(source)
        assert not result.applies and "loop-invariant" in result.reason, source


def test_loads_move_where_nothing_else_may_write_them(tmp_path):
    source = """
__global__ void k(float* __restrict__ out, const float* w, const float* x, int rows, int n) {
  for (int r = blockIdx.x; r < rows; r += gridDim.x) {
    float acc[4];
    for (int j = 0; j < 4; ++j) acc[j] = x[r * n + j] * w[0];
    out[r] = acc[0] + acc[3];
  }
}
"""
    result = all_passes()["reuse"].apply(source)
    assert result.applies, result.reason
    out = result.source
    # the inner loop stores into a local array only; the outer one through out, which is __restrict__
    assert out.count("const auto w_v = w[0];") == 1 and "* w_v;" in out
    assert out.index("const auto w_v = w[0];") < out.index("for (int r = blockIdx.x")
    assert compiles(tmp_path, out) == ""


DIVIDE = """
__global__ void normalise(float* __restrict__ out, const float* __restrict__ in, const float* __restrict__ sums,
                          float eps, int rows, int n) {
  for (int row = blockIdx.x; row < rows; row += gridDim.x) {
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
      float v = in[row * n + i] / (sums[row] + eps);
      v /= eps;
      out[row * n + i] = v / 3.0f;
    }
  }
}
"""


def test_a_division_by_an_invariant_becomes_a_reciprocal_multiplication_under_a_tolerance(tmp_path):
    spec = {"tolerance": {"float32": {"atol": 1e-5, "rtol": 1e-5}}}
    result = all_passes()["reuse"].apply(DIVIDE, spec)
    assert result.applies, result.reason
    out = result.source
    # the reciprocal of an expression that loads goes above the innermost loop, where the load is in range
    assert out.index("const float eps_rcp = 1.0f / (eps);") < out.index("for (int row")  # invariant in both loops
    assert out.index("for (int row") < out.index("const float sums_rcp = 1.0f / ((sums[row] + eps));") < out.index(
        "for (int i = threadIdx.x")
    assert "float v = in[row * n + i] * sums_rcp;" in out and "v *= eps_rcp;" in out
    assert "v / 3.0f" in out  # a literal divisor: the compiler's business
    assert compiles(tmp_path, out) == ""


def test_no_reciprocal_under_a_bit_exact_spec():
    exact = {"tolerance": {"float32": {"atol": 0, "rtol": 0}}}
    result = all_passes()["reuse"].apply(DIVIDE, exact)
    assert result.applies, result.reason  # the load of sums[row] still moves; the divisions stay divisions
    assert "in[row * n + i] / (sums_v + eps)" in result.source and "v /= eps;" in result.source
    assert "_rcp" not in result.source


def test_a_class_element_stored_through_its_assignment_is_not_read_once():
    source = """
#include <cuda_bf16.h>
__global__ void k(__nv_bfloat16* __restrict__ out, int n) {
  for (int i = threadIdx.x; i < n; i += blockDim.x) out[i + 1] = out[0];
}
"""
    result = all_passes()["reuse"].apply(source)  # the loop stores through out (bf16's operator=): out[0] may change
    assert not result.applies and "loop-invariant" in result.reason


def test_no_load_moves_out_of_a_synchronising_loop_or_through_volatile():
    # thread 0 of another branch may store flags[0] between the barriers: each iteration reads it again
    barrier = """
__global__ void k(float* __restrict__ out, const int* __restrict__ flags, int n) {
  for (int i = 0; i < n; ++i) {
    __syncthreads();
    out[i * blockDim.x + threadIdx.x] = flags[0];
  }
}
"""
    polled = """
__global__ void k(const volatile int* flag, int* __restrict__ out) {
  int seen = 0;
  for (int tries = 0; tries < 100; ++tries) seen += flag[0];
  out[threadIdx.x] = seen;
}
"""
    for source in (barrier, polled):
        result = all_passes()["reuse"].apply(source)
        assert not result.applies and "loop-invariant" in result.reason, source


PACKED = """
struct Pack {
  float v[4];
  __device__ void load(const float* p, int k) { for (int j = 0; j < 4; ++j) v[j] = p[4 * k + j]; }
  __device__ void store(float* p, int k) const { for (int j = 0; j < 4; ++j) p[4 * k + j] = v[j]; }
};
__global__ void scale_packs(float* __restrict__ out, const float* __restrict__ in, const float* __restrict__ scale,
                            int packs) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < packs; i += gridDim.x * blockDim.x) {
    Pack x;
    x.load(in, i);
    for (int j = 0; j < 4; ++j) x.v[j] *= scale[0];
    x.store(out, i);
  }
}
"""


def test_a_store_call_writes_through_its_first_argument_alone(tmp_path):
    result = all_passes()["reuse"].apply(PACKED)
    assert result.applies, result.reason
    out = result.source
    # the inner loop writes a local pack; the outer one stores through out (restrict) with `x.store(out, i)`
    assert out.count("const auto scale_v = scale[0];") == 1
    assert out.index("const auto scale_v = scale[0];") < out.index("for (int i = blockIdx.x")
    assert "x.v[j] *= scale_v;" in out
    assert compiles(tmp_path, out) == ""


def test_a_store_call_through_the_loads_pointer_or_an_unrestricted_one_keeps_the_load():
    same_pointer = PACKED.replace("x.store(out, i);", "x.store(const_cast<float*>(scale), i);")
    unrestricted = PACKED.replace("const float* __restrict__ scale", "const float* scale").replace(
        "float* __restrict__ out", "float* out")
    for source in (same_pointer, unrestricted):
        result = all_passes()["reuse"].apply(source)
        assert not result.applies and "loop-invariant" in result.reason, source


DEPENDENT = """
struct Half2 { unsigned v; };
__device__ Half2 operator*(Half2 a, Half2 b);
__device__ Half2 operator+(Half2 a, Half2 b);
__device__ Half2& operator+=(Half2& a, int b);
template <typename To> __device__ To cast(float v) { return static_cast<To>(v); }
template <typename To> __device__ To cast(int v) { return static_cast<To>(v); }
template <typename T, int kBias>
__global__ void affine(T* __restrict__ out, const T* __restrict__ x, const T* __restrict__ w, int n) {
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const T bias = cast<T>(kBias) * w[2];
    out[i] = x[i] * w[0] + reinterpret_cast<const T*>(w)[kBias] + bias;
  }
}
"""


def test_a_templates_operators_and_constants_are_loop_invariant_where_their_operands_are(tmp_path):
    # with an overload of * and + in scope, `x[i] * w[0]` on T is an unnamed operator call in the template
    result = all_passes()["reuse"].apply(DEPENDENT)
    assert result.applies, result.reason
    out = result.source
    assert "const auto w_v = w[0];" in out and "const auto w_v2 = reinterpret_cast<const T*>(w)[kBias];" in out
    assert "out[i] = x[i] * w_v + w_v2 + bias;" in out
    assert out.index("const auto w_v2") < out.index("for (int i")
    # an overloaded template function (`cast<T>`) is a call like any other: the declaration moves whole
    assert out.count("const T bias = cast<T>(kBias) * w[2];") == 1
    assert out.index("const T bias") < out.index("for (int i")
    assert compiles(tmp_path, out, "template __global__ void affine<float, 1>(float*, const float*, const float*, "
                                   "int);") == ""


def test_writes_the_loop_makes_through_members_or_a_templates_operators_keep_the_load():
    # `j += 1` on a dependent type is an unnamed operator call: j changes every iteration
    dependent_step = """
struct Half2 { unsigned v; };
__device__ Half2& operator+=(Half2& a, int b);
template <typename T>
__global__ void k(float* __restrict__ out, const float* __restrict__ w, int n) {
  T j = 0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) { out[i] = w[j]; j += 1; }
}
"""
    # a member of a local struct assigned in the loop
    member_step = """
struct Cursor { int at; };
__global__ void k(float* __restrict__ out, const float* __restrict__ w, int n) {
  Cursor c{0};
  for (int i = threadIdx.x; i < n; i += blockDim.x) { out[i] = w[c.at]; c.at += 1; }
}
"""
    # a store into a member of an element: out may be w
    member_store = """
struct Cell { float x; };
__global__ void k(Cell* out, const float* w, int n) {
  for (int i = threadIdx.x; i < n; i += blockDim.x) { out[i].x = w[0]; }
}
"""
    arrow_store = member_store.replace("out[i].x = w[0];", "(out + i)->x = w[0];")
    through_reference = """
__global__ void k(float* out, const float* w, int n) {
  for (int i = threadIdx.x; i < n; i += blockDim.x) { float& r = out[i]; r = w[0]; }
}
"""
    for source in (dependent_step, member_step, member_store, arrow_store, through_reference):
        result = all_passes()["reuse"].apply(source)
        assert not result.applies and "loop-invariant" in result.reason, source


def test_the_shared_readers_of_writes_see_a_templates_unnamed_assignments_and_increments():
    """syntax.written, assignment and stepped (every pass's readers of what a loop changes) count `j += 1` and
    `++k` on a dependent type, which libclang leaves unnamed calls."""
    source = """
struct Half2 { unsigned v; };
__device__ Half2& operator+=(Half2& a, int b);
__device__ Half2& operator++(Half2& a);
template <typename T>
__global__ void k(float* out, int n) {
  T j = 0, k2 = 0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) { j += 1; ++k2; out[i] = 0.0f; }
}
"""
    unit = parse(source)
    kernel = next(node for node in walk(unit.tu.cursor) if node.kind.name == "FUNCTION_TEMPLATE" and node.spelling == "k")
    loop = next(node for node in walk(kernel) if node.kind.name == "FOR_STMT")
    names = {declaration.spelling for declaration in written(unit, loop)[0]}
    assert {"j", "k2", "i"} <= names
    assert "+=" in {assignment(unit, node) for node in walk(loop)}
    steps = [stepped(unit, node) for node in walk(loop)]
    assert "k2" in {refers_to(t).spelling for t in steps if t is not None and refers_to(t) is not None}


OWN_ARRAY = """
__global__ void prefix(float* out, const float* in, int n) {
  float x[2][4];
  for (int r = 0; r < 2; ++r) {
    for (int j = 0; j < 4; ++j) x[r][j] = in[(blockIdx.x * 2 + r) * 4 + j];
  }
  for (int r = 0; r < 2; ++r) {
    float s = 0.0f;
    for (int j = 0; j < 4; ++j) {
      s += x[r][j] * x[r][0];
      out[(blockIdx.x * 2 + r) * 4 + j] = s;
    }
  }
}
"""


def test_an_element_of_a_threads_own_array_moves_out_past_stores_elsewhere(tmp_path):
    result = all_passes()["reuse"].apply(OWN_ARRAY)
    assert result.applies, result.reason
    out = result.source
    # out is no __restrict__ parameter, yet no pointer reaches x: only its name writes it, and the loop does not
    assert out.count("const auto x_v = x[r][0];") == 1
    assert out.index("float s = 0.0f;") < out.index("const auto x_v = x[r][0];") < out.index("for (int j = 0; j < 4; ++j) {")
    assert "s += x[r][j] * x_v;" in out
    assert "x[r][j] = in[" in out  # the loop that fills x writes it
    assert compiles(tmp_path, out) == ""


def test_an_own_array_the_loop_writes_or_a_pointer_reaches_keeps_its_reads():
    written = OWN_ARRAY.replace("s += x[r][j] * x[r][0];", "s += x[r][j] * x[r][0]; x[r][j] = s;")
    escapes = OWN_ARRAY.replace("float x[2][4];", "float x[2][4];\n  float* alias = &x[0][0];").replace(
        "out[(blockIdx.x * 2 + r) * 4 + j] = s;", "alias[j] = s;")
    member_call = """
struct Pack { float v[4]; __device__ void load(const float* p) { for (int j = 0; j < 4; ++j) v[j] = p[j]; } };
__global__ void k(float* out, const float* in, int n) {
  Pack x[2];
  for (int r = 0; r < 2; ++r) {
    for (int j = 0; j < 4; ++j) { x[r].load(in + j); out[j] = x[r].v[0]; }
  }
}
"""
    given_to_a_call = """
__device__ void fill(float* p);
__global__ void k(float* out, int n) {
  float x[4];
  for (int j = 0; j < n; ++j) { fill(x); out[j] = x[0]; }
}
"""
    # an array of pointers: p[0][1] reads what p[0] points to, which out may be
    pointers = """
__global__ void k(float* out, const float* a, int n) {
  const float* p[2] = {a, a + n};
  for (int j = 0; j < n; ++j) { out[j] = p[0][1]; }
}
"""
    # a row of x used whole decays to a pointer into x
    row_escapes = escapes.replace("float* alias = &x[0][0];", "float* alias = x[0];")
    # a member call other than a whole load or store may hand out a pointer into the element
    data_escapes = """
struct Pack { float v[4]; __device__ float* data() { return v; } };
__global__ void k(float* out, const float* in, int n) {
  Pack x[2];
  float* p = x[0].data();
  for (int j = 0; j < n; ++j) { p[j & 3] = in[j]; out[j] = x[0].v[1]; }
}
"""
    for source in (written, escapes, row_escapes, data_escapes, member_call, given_to_a_call):
        result = all_passes()["reuse"].apply(source)
        assert not result.applies and "loop-invariant" in result.reason, source
    result = all_passes()["reuse"].apply(pointers)
    assert result.applies, result.reason  # the pointer p[0] is the array's own; what it points to is not
    assert "const auto p_v = p[0];" in result.source and "out[j] = p_v[1];" in result.source
