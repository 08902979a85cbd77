"""The job a GPU worker takes (JSON in) and the verdict it gives back (JSON out).

`astra` resolves a kernel spec (YAML, expressions, model configurations) into a `Job` with every
shape, dtype, wrapper and flag concrete, so the harness needs no YAML and no expression language:
it runs on a GPU box with only torch, apache-tvm-ffi and nvcc.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, dataclass, field
from typing import Any

BANDS = ("decode", "middle", "prefill")
TIMING_MODES = ("graph", "cold")  # graph: back-to-back in a CUDA graph; cold: events around one launch


def band_of(tokens: int) -> str:
    """decode: up to 256 tokens; prefill: 4096 and more; middle: between."""
    if tokens <= 256:
        return "decode"
    if tokens >= 4096:
        return "prefill"
    return "middle"


@dataclass
class ArgSpec:
    name: str
    kind: str  # "tensor" | "scalar" | "string"
    # "in" | "out" | "inout" | "scratch" (written, never compared, keeps its init) | "alias" (the same
    # tensor as argument `alias`)
    role: str = "in"
    shape: list[int] = field(default_factory=list)
    dtype: str = "float32"  # torch dtype name
    init: dict = field(default_factory=lambda: {"dist": "normal", "mean": 0.0, "std": 1.0})
    value: Any = None  # scalars and strings
    alias: str | None = None  # role "alias": pass the tensor of this earlier argument (in-place calls)
    present: bool = True  # False: the call passes None (an absent tvm::ffi::Optional<TensorView>)
    row_stride: int | None = None  # stride of dim 0 in elements (a strided view); None: contiguous
    # True: the order of values along the last dim is not part of the result (a top-k's indices); sorted,
    # together with the case's other unordered outputs of the same shape, before any comparison
    unordered: bool = False


@dataclass
class Case:
    id: str  # stable, e.g. "Llama-3.1-8B/tp1/bfloat16/tokens=128,hidden=4096"
    band: str
    label: str  # model/tp or "edge"
    dtype: str
    dims: dict[str, int]
    variant: str  # key into Job.variants
    bytes: int  # bytes the kernel must move, read + written (the floors of harness.timing.roofline)
    args: list[ArgSpec]
    timed: bool = True  # edge cases and secondary dtypes are checked, not timed
    bytes_read: int | None = None  # of `bytes`: read and written; None: split by roles (`traffic`)
    bytes_written: int | None = None
    bytes_split: str = ""  # how `bytes` was split: "spec", "roles", ... (see split_bytes)

    def tensors(self) -> list[ArgSpec]:
        """The tensor arguments this case passes (an absent optional tensor is None, not a tensor)."""
        return [a for a in self.args if a.kind == "tensor" and a.present]

    def traffic(self) -> tuple[int, int, str]:
        """(bytes read, bytes written, how they were split): the job's own split where it gives both,
        else `split_bytes(self.bytes, self.args)`."""
        if self.bytes_read is not None and self.bytes_written is not None:
            return self.bytes_read, self.bytes_written, self.bytes_split or "job"
        return split_bytes(self.bytes, self.args)

    def in_place(self) -> bool:
        """Whether a tensor is both read and written (an inout, or the target of an alias)."""
        return any(a.role in ("inout", "alias") for a in self.tensors())


DTYPE_SIZES = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "float8_e4m3fn": 1, "float8_e5m2": 1,
    "int64": 8, "int32": 4, "int16": 2, "int8": 1, "uint8": 1, "bool": 1,
}


def dtype_size(name: str) -> int:
    """Bytes per element of a torch dtype name: the table above, else the bit count the name carries
    (uint64: 8, complex64: 8, float4_e2m1fn_x2: 1), else 1."""
    name = name.removeprefix("torch.")
    if name in DTYPE_SIZES:
        return DTYPE_SIZES[name]
    bits = re.search(r"\d+", name)
    return max(1, int(bits.group()) // 8) if bits else 1


def role_bytes(args: list[ArgSpec]) -> tuple[int, int]:
    """(read, written) bytes by argument roles: an `in` tensor is read once, an `out` written once, an
    `inout` (or the target of an alias) both; scratch, absent tensors and scalars count nothing. Sizes
    are the views' (shape x element size), not the storage behind a strided view."""
    targets = {a.alias for a in args if a.role == "alias" and a.alias}
    read = written = 0
    for a in args:
        if a.kind != "tensor" or not a.present or a.role in ("alias", "scratch"):
            continue
        size = math.prod(int(d) for d in a.shape) * dtype_size(a.dtype)
        inout = a.role == "inout" or a.name in targets
        read += size if a.role == "in" or inout else 0
        written += size if a.role == "out" or inout else 0
    return read, written


def split_bytes(total: int, args: list[ArgSpec]) -> tuple[int, int, str]:
    """`total` split into (read, written, how) in the proportion the roles give (`role_bytes`). The total
    stays the spec's: where the roles count otherwise (a kernel touching part of a tensor, a spec counting
    more), the split is scaled to it and says so; with no tensor to go by, half each way."""
    read, written = role_bytes(args)
    if read + written == 0:
        return total - total // 2, total // 2, "half/half (no tensor roles to split by)"
    if read + written == total:
        return read, written, "roles"
    share = round(total * read / (read + written))
    more = "less" if read + written > total else "more"
    return share, total - share, f"roles, scaled to bytes ({more} than the {read + written} the roles count)"


@dataclass
class Variant:
    key: str
    cuda_wrappers: list[list[str]]  # [[export, entry], ...] concrete
    cpp_wrappers: list[list[str]] = field(default_factory=list)
    extra_cuda_cflags: list[str] = field(default_factory=list)


@dataclass
class BuildBase:
    source_root: str  # csrc/ of the SGLang tree; cuda/cpp files resolve against it
    include_dirs: list[str]
    cuda_files: list[str]
    cpp_files: list[str] = field(default_factory=list)
    extra_cflags: list[str] = field(default_factory=list)
    extra_ldflags: list[str] = field(default_factory=list)
    header_only: bool = True
    arch: str | None = None  # None: from the device (compute_90a on Hopper)


@dataclass
class Options:
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    modes: list[str] = field(default_factory=lambda: ["graph", "cold"])
    sanitizer: bool = True
    sanitizer_max_cases: int = 2  # the smallest cases
    extra_trials: bool = True  # the large/small/extreme trials beside the seeds (False: `astra bench`)
    # False: time the original against itself without its outputs phase (`astra survey`, `bench --time-only`);
    # refused for a candidate, which is never timed unchecked
    outputs_checked: bool = True
    budget_ms_per_case: float = 400.0  # timing budget per case and side
    target_rel_stderr: float = 0.01
    slowdown_threshold: float = 0.02
    case_timeout_s: float = 60.0
    cache_dir: str | None = None  # build cache; default $ASTRA_HOME/builds or ~/.cache/astra/builds
    digest_key: int = 0  # the key of the keyed output digests (harness.judge.digest); the judge draws one per evaluation
    sandbox: bool = True  # False: candidate code runs without the OS sandbox (--no-sandbox; recorded)
    # A folder: the judge writes `measured` there once the idle GPU is measured (its builds still running), and
    # waits for `sanitized` before its timing phase (harness.worker.judge_process.verify_job runs
    # compute-sanitizer in between, beside the build and the outputs phase); None: no wait
    timing_gate: str | None = None


@dataclass
class Job:
    name: str
    entry: str  # the export the harness calls
    kernel_file: str  # relative to source_root: the file a candidate replaces
    build: BuildBase
    variants: dict[str, Variant]
    cases: list[Case]
    tolerance: dict[str, dict[str, float]]  # dtype -> {atol, rtol, floor}
    reference: str | None = None  # path of reference.py
    candidate_source: str | None = None  # None: the original checked against itself
    candidate_label: str = "candidate"
    options: Options = field(default_factory=Options)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    @classmethod
    def from_dict(cls, data: dict) -> "Job":
        data = dict(data)
        data["build"] = BuildBase(**data["build"])
        data["variants"] = {k: Variant(**v) for k, v in data["variants"].items()}
        data["cases"] = [Case(**{**c, "args": [ArgSpec(**a) for a in c["args"]]}) for c in data["cases"]]
        data["options"] = Options(**data.get("options", {}))
        return cls(**data)

    @classmethod
    def from_json(cls, text: str) -> "Job":
        return cls.from_dict(json.loads(text))
