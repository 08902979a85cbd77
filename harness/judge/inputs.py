"""Input generation for one case: fresh random data per seed, clones per side, poisoned outputs.

Each tensor argument is drawn from its `ArgSpec.init` distribution (docs/spec-format.md):

    normal {mean, std}     uniform {low, high}     randint {low, high (exclusive)}
    perm {high}            arange {start, step}    const {value}

Random draws use a generator seeded from (case id, argument name, seed) through crc32, so the same
seed gives the same data in every process and different arguments get different data. Floating
values are drawn in float32 (float64 for float64 tensors) and then cast, which is how float8 tensors
are made; casts to a float8 type clamp to its finite range first (e4m3fn has no infinity, so an
out-of-range value would become NaN).

Trials (`trial=`, the judge picks the list, both processes generate the same data from (case, seed,
trial)): "seed" draws as specified; "large" multiplies normal and uniform float tensors by
`init["large"]` (default 64): mixed signs come from the distribution itself; "small" multiplies them
by `init["small"]` (default 1e-4), so a candidate that changes an epsilon or a clamp differs from the
original; "extreme" (float16, bfloat16, float32, float64 only) keeps the draw's signs but gives every
element a magnitude from a deterministic mix of subnormals, the smallest normals and, for float16 whose
whole range is reachable from float32 arithmetic, values near its largest finite value (the range of
bfloat16, float32 and float64 reaches float32's own overflow, so there they stay at the drawn scale).

An absent optional tensor (`ArgSpec.present` False) is passed as None. A strided view (`row_stride`)
is drawn over its whole storage, shape[0] * row_stride elements, gaps included, and passed as that
view; clones copy the whole storage and keep the strides.

Unsigned 16/32/64-bit tensors (pointer tables SGLang checks as uint64) are drawn as their signed twin
and reinterpreted, and poisoned with all bits set, so no unsigned kernel of torch is needed.

The harness never fills an input with zeros on its own (zeros hide unwritten outputs and wrong
indexing); a spec may still ask for `const` 0 explicitly.
"""

from __future__ import annotations

import math
import zlib
from typing import Any

import torch

from harness.job import ArgSpec, Case

DEFAULT_LARGE = 64.0
DEFAULT_SMALL = 1e-4
TRIALS = ("seed", "large", "small", "extreme")
_EXTREME_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_RANDOM_FLOAT_DISTS = ("normal", "uniform")
_INT_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
# torch.uint16/32/64 have few kernels (on CUDA especially): tensors of them are made and filled
# through their signed twin of the same size, whose bits they share.
_SIGNED_TWIN = {getattr(torch, f"uint{b}"): getattr(torch, f"int{b}") for b in (16, 32, 64)
                if hasattr(torch, f"uint{b}")}


def torch_dtype(name: str) -> torch.dtype:
    """torch dtype from its name ("bfloat16", "float8_e4m3fn", "torch.int32", ...)."""
    attr = name.removeprefix("torch.")
    dtype = getattr(torch, attr, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown torch dtype {name!r}")
    return dtype


def is_float(dtype: torch.dtype) -> bool:
    """True for floating dtypes, float8 included."""
    return dtype.is_floating_point


def _seed_for(case: Case, arg: ArgSpec, seed: int) -> int:
    """A stable 63-bit seed per (case, argument, seed)."""
    return (zlib.crc32(f"{case.id}\0{arg.name}".encode()) << 20 ^ (seed & 0xFFFFF)) & (2**63 - 1)


def _generator(device: torch.device, seed: int) -> torch.Generator:
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    return gen


def _cast_float(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Cast drawn values to `dtype`, clamping to its finite range when it is narrower than float32."""
    if values.dtype == dtype:
        return values
    if dtype.itemsize < 4 and dtype.is_floating_point:
        limit = torch.finfo(dtype).max
        values = values.clamp(-limit, limit)
    return values.to(dtype)


EXTREME_PIECE = 1 << 24  # elements made at once: the temporaries of a large tensor's extreme values stay bounded


def _extreme(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Signs of `values`; magnitudes cycling through subnormal, smallest-normal, drawn and (float16 only)
    near-overflow values, by element index (deterministic, so both processes agree). Made EXTREME_PIECE
    elements at a time, each element as on its own: an input of 268M elements took 6 GiB of temporaries at once,
    which ran the judge out of memory on an H100 (concat_mla_k at 16,384 tokens, SGLang 0.5.23)."""
    flat = values.reshape(-1)
    if flat.numel() <= EXTREME_PIECE:
        return _extreme_piece(flat, 0, dtype).reshape(values.shape)
    out = torch.empty_like(flat)
    for start in range(0, flat.numel(), EXTREME_PIECE):
        piece = flat[start:start + EXTREME_PIECE]
        out[start:start + piece.numel()] = _extreme_piece(piece, start, dtype)
    return out.reshape(values.shape)


def _extreme_piece(flat: torch.Tensor, start: int, dtype: torch.dtype) -> torch.Tensor:
    """`_extreme` of the elements `start`, `start` + 1, ... of a flat tensor."""
    info = torch.finfo(dtype)
    index = torch.arange(start, start + flat.numel(), device=flat.device) % 4
    sign = torch.where(flat < 0, -1.0, 1.0).to(flat.dtype)
    frac = flat.abs().remainder(1.0) + 0.5  # in [0.5, 1.5): varied but bounded
    tiny = torch.full_like(flat, info.tiny)
    huge = torch.full_like(flat, info.max / 2 if dtype == torch.float16 else 1.0)
    magnitude = torch.stack([tiny * frac / 8, tiny * frac * 2, flat.abs(), huge * frac / 1.5 if dtype ==
                             torch.float16 else flat.abs()], dim=0)
    return sign * magnitude.gather(0, index.unsqueeze(0)).squeeze(0)


def view_strides(arg: ArgSpec) -> tuple[int, ...]:
    """Element strides of the tensor passed for `arg`: dim 0 strides by `row_stride` when given, every
    other dim is contiguous."""
    shape = [int(d) for d in arg.shape]
    strides = [1] * len(shape)
    for i in range(len(shape) - 2, -1, -1):
        strides[i] = strides[i + 1] * shape[i + 1]
    if arg.row_stride is not None and shape:
        if int(arg.row_stride) < strides[0]:
            raise ValueError(f"{arg.name}: row_stride {arg.row_stride} is below the {strides[0]} elements of a row")
        strides[0] = int(arg.row_stride)
    return tuple(strides)


def storage_numel(arg: ArgSpec) -> int:
    """Elements of the storage behind `arg`'s tensor: shape[0] * row_stride for a strided view."""
    shape = [int(d) for d in arg.shape]
    if arg.row_stride is not None and shape:
        return shape[0] * int(arg.row_stride)
    return math.prod(shape)


def make_tensor(arg: ArgSpec, gen: torch.Generator, device: torch.device, large: bool = False,
                trial: str = "seed") -> torch.Tensor:
    """One tensor argument drawn from `arg.init` (see the module docstring). With `row_stride`, the whole
    storage (shape[0] * row_stride elements, gaps between rows included) is drawn and the view returned."""
    dtype = torch_dtype(arg.dtype)
    view = tuple(int(d) for d in arg.shape)
    strided = arg.row_stride is not None and len(view) > 0
    strides = view_strides(arg) if strided else ()
    numel = storage_numel(arg)
    shape = (numel,) if strided else view
    init = dict(arg.init or {"dist": "normal", "mean": 0.0, "std": 1.0})
    dist = init.get("dist", "normal")
    work = torch.float64 if dtype == torch.float64 else torch.float32
    if dist == "normal":
        values = torch.randn(shape, generator=gen, device=device, dtype=work)
        values = values * float(init.get("std", 1.0)) + float(init.get("mean", 0.0))
    elif dist == "uniform":
        low, high = float(init.get("low", -1.0)), float(init.get("high", 1.0))
        values = torch.rand(shape, generator=gen, device=device, dtype=work) * (high - low) + low
    elif dist == "randint":
        low, high = int(init.get("low", 0)), int(init["high"])
        if high <= low:
            raise ValueError(f"{arg.name}: randint needs high > low, got [{low}, {high})")
        values = torch.randint(low, high, shape, generator=gen, device=device, dtype=torch.int64)
    elif dist == "perm":
        high = int(init["high"])
        if numel > high:
            raise ValueError(f"{arg.name}: perm needs {numel} distinct values below {high}")
        values = torch.randperm(high, generator=gen, device=device)[:numel].clone().reshape(shape)
    elif dist == "arange":
        start, step = init.get("start", 0), init.get("step", 1)
        values = (torch.arange(numel, device=device, dtype=torch.int64) * step + start).reshape(shape)
    elif dist == "const":
        if "value" not in init:
            raise ValueError(f"{arg.name}: const needs a value")
        values = torch.full(shape, init["value"], device=device, dtype=work if is_float(dtype) else torch.int64)
    else:
        raise ValueError(f"{arg.name}: unknown init dist {dist!r}")
    trial = "large" if large else trial
    if trial not in TRIALS:
        raise ValueError(f"unknown trial {trial!r}")
    if dist in _RANDOM_FLOAT_DISTS and is_float(dtype):
        if trial == "large":
            values = values * float(init.get("large", DEFAULT_LARGE))
        elif trial == "small":
            values = values * float(init.get("small", DEFAULT_SMALL))
        elif trial == "extreme" and dtype in _EXTREME_DTYPES:
            values = _extreme(values, dtype)
    if dtype == torch.bool:
        out = (values != 0).contiguous()
    elif is_float(dtype):
        out = _cast_float(values.to(work) if not values.is_floating_point() else values, dtype).contiguous()
    elif dtype in _SIGNED_TWIN:  # torch's unsigned 16/32/64-bit types: drawn signed, the same bits
        out = values.to(_SIGNED_TWIN[dtype]).contiguous().view(dtype)
    else:
        out = values.to(dtype).contiguous()
    return out.as_strided(view, strides) if strided else out


def make_inputs(case: Case, seed: int, device: torch.device | str, large: bool = False,
                trial: str = "seed") -> dict[str, Any]:
    """Every argument of `case` by name: tensors drawn for (`seed`, `trial`), scalars and strings as given.
    `large=True` is `trial="large"`."""
    device = torch.device(device)
    inputs: dict[str, Any] = {}
    for arg in case.args:
        if arg.kind == "tensor" and arg.alias:
            inputs[arg.name] = inputs[arg.alias]  # the very same tensor: an in-place call
        elif arg.kind == "tensor" and not arg.present:
            inputs[arg.name] = None  # an absent optional tensor
        elif arg.kind == "tensor":
            inputs[arg.name] = make_tensor(arg, _generator(device, _seed_for(case, arg, seed)), device, large, trial)
        elif arg.kind in ("scalar", "string"):
            if arg.value is None:
                raise ValueError(f"{arg.name}: {arg.kind} argument without a value")
            inputs[arg.name] = arg.value
        else:
            raise ValueError(f"{arg.name}: unknown argument kind {arg.kind!r}")
    return inputs


def has_large_trial(case: Case) -> bool:
    """Whether a `large` trial changes anything: a normal/uniform float tensor with a factor != 1."""
    for arg in case.tensors():
        if not is_float(torch_dtype(arg.dtype)):
            continue
        init = arg.init or {}
        if init.get("dist", "normal") in _RANDOM_FLOAT_DISTS and float(init.get("large", DEFAULT_LARGE)) != 1.0:
            return True
    return False


def has_small_trial(case: Case) -> bool:
    """Whether a `small` trial changes anything: a normal/uniform float tensor with a factor != 1."""
    return any(is_float(torch_dtype(arg.dtype)) and (arg.init or {}).get("dist", "normal") in _RANDOM_FLOAT_DISTS
               and float((arg.init or {}).get("small", DEFAULT_SMALL)) != 1.0 for arg in case.tensors())


def has_extreme_trial(case: Case) -> bool:
    """Whether an `extreme` trial applies: a normal/uniform tensor of float16/bfloat16/float32/float64."""
    return any(torch_dtype(arg.dtype) in _EXTREME_DTYPES
               and (arg.init or {}).get("dist", "normal") in _RANDOM_FLOAT_DISTS for arg in case.tensors())


def _storage_elements(tensor: torch.Tensor) -> int:
    return tensor.untyped_storage().nbytes() // tensor.element_size()


def clone_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """A copy with the same size, strides and storage offset, and its whole storage copied (a strided
    view's gaps included; `Tensor.clone` would make a non-dense view contiguous)."""
    if tensor.is_contiguous() and tensor.storage_offset() == 0 and _storage_elements(tensor) == tensor.numel():
        return tensor.clone()
    flat = tensor.as_strided((_storage_elements(tensor),), (1,), 0).clone()
    return flat.as_strided(tensor.size(), tensor.stride(), tensor.storage_offset())


def storage_of(tensor: torch.Tensor) -> torch.Tensor:
    """A flat 1-D view of the whole storage behind `tensor` (gaps of a strided view included)."""
    return tensor.as_strided((_storage_elements(tensor),), (1,), 0)


def clone_inputs(inputs: dict[str, Any]) -> dict[str, Any]:
    """A deep copy for one side: tensors cloned (same strides, whole storage), other values (None for
    an absent tensor) shared. Arguments that are one tensor (an alias) stay one tensor in the copy."""
    copies: dict[int, torch.Tensor] = {}
    out = {}
    for k, v in inputs.items():
        if isinstance(v, torch.Tensor):
            out[k] = copies.setdefault(id(v), clone_tensor(v))
        else:
            out[k] = v
    return out


def poison_value(dtype: torch.dtype) -> float | int | bool:
    """What an output of `dtype` is filled with before a call: NaN for floats, an unlikely integer else."""
    if is_float(dtype):
        return float("nan")
    if dtype == torch.bool:
        return True
    info = torch.iinfo(dtype)
    return info.min if info.min < 0 else info.max


def poison_(tensor: torch.Tensor) -> torch.Tensor:
    """Fill `tensor` in place with `poison_value` (bit pattern fill, so float8 works too)."""
    value = poison_value(tensor.dtype)
    if is_float(tensor.dtype):
        nan = torch.tensor([value], dtype=torch.float32).to(tensor.dtype)
        view_dtype = _INT_VIEW[tensor.element_size()]
        tensor.view(view_dtype).fill_(int(nan.view(view_dtype).item()))
    elif tensor.dtype in _SIGNED_TWIN:
        tensor.view(_SIGNED_TWIN[tensor.dtype]).fill_(-1)  # all bits set: the unsigned maximum
    else:
        tensor.fill_(value)
    return tensor


def poison_outputs(args: dict[str, Any], specs: list[ArgSpec]) -> dict[str, Any]:
    """Poison every `out` tensor in place; `inout` keeps its input values (they are the input) and
    `scratch` its init (a workspace may have to start zeroed). Only the view is poisoned."""
    for spec in specs:
        if spec.kind == "tensor" and spec.role == "out" and spec.present:
            poison_(args[spec.name])
    return args


def to_call_args(inputs: dict[str, Any], specs: list[ArgSpec]) -> list[Any]:
    """The positional arguments of the export, in the spec's call order."""
    return [inputs[spec.name] for spec in specs]


def set_bytes(inputs: dict[str, Any]) -> int:
    """Bytes held by the tensors of one input set (for sizing graph-mode rotation): whole storages (a
    strided view's gaps included); an aliased tensor counts once, an absent one not at all."""
    unique = {id(v): v for v in inputs.values() if isinstance(v, torch.Tensor)}
    return sum(v.untyped_storage().nbytes() for v in unique.values())
