"""Jobs for the adversarial suite: the RowScale kernel (kernels/base/rowscale.cuh), its in-place twin
(kernels/base/rowscale_inplace.cuh) and their candidates.

`rowscale_job(candidate)` builds a `harness.job.Job` exactly as `astra` would resolve a spec: the
original file under `source_root` (the candidate's base, `BASES`), one variant per dtype, cases over
tokens x widths, tolerances. `CANDIDATES` lists every candidate file with the verdict status(es) it must
get; `SCAN_EVADING` names those that pass harness.scan (text and shared object) and are stopped only by the
judge/candidate process split.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from harness.job import ArgSpec, BuildBase, Case, Job, Options, Variant, band_of

HERE = Path(__file__).resolve().parent
KERNELS = HERE / "kernels"
BASE_ROOT = KERNELS / "base"
CANDIDATE_DIR = KERNELS / "candidates"
KERNEL_FILE = "rowscale.cuh"
EXPORT = "rowscale"


@dataclass(frozen=True)
class Base:
    """An original of the suite: its file under BASE_ROOT, its export and the struct whose `run` it exports."""

    kernel_file: str
    export: str
    struct: str
    in_place: bool = False


BASES = {"rowscale": Base(KERNEL_FILE, EXPORT, "RowScaleKernel"),
         "rowscale_inplace": Base("rowscale_inplace.cuh", "rowscale_inplace", "RowScaleInplaceKernel", in_place=True)}
TOKENS = (1, 127, 1025, 4096)
WIDTHS = (256, 1000, 4096)  # 1000: not a multiple of any vector width
DTYPES = ("bfloat16", "float32")  # the first is timed, the second only checked
CPP_TYPE = {"bfloat16": "bf16_t", "float32": "fp32_t"}
ELEMENT_BYTES = {"bfloat16": 2, "float32": 4}
TOLERANCE = {
    "bfloat16": {"atol": 1e-2, "rtol": 1e-2, "floor": 1e-2},
    "float32": {"atol": 1e-5, "rtol": 1e-5, "floor": 1e-5},
}


@dataclass(frozen=True)
class Expectation:
    """What one candidate must get: the allowed statuses of `run_job` (after `verify_job` where the
    sanitizer decides) and, for sanitizer cases, the tool and the finding kind prefix it must report."""

    name: str
    statuses: tuple[str, ...]
    sanitizer_tool: str | None = None
    finding_kind: str | None = None
    compiles: bool = True
    base: str = "rowscale"  # the original it replaces (BASES)
    faster: bool | None = None  # what `verdict.faster` must be, where it matters
    reason: str | None = None  # a fragment the verdict's reason must hold

    @property
    def path(self) -> Path:
        return CANDIDATE_DIR / f"{self.name}.cuh"


CANDIDATES = (
    Expectation("a_unwritten", ("incorrect",)),
    Expectation("b_partial_rows", ("incorrect",)),
    Expectation("c_side_stream", ("incorrect",)),  # stream-ordered checks overwrite its hidden writes
    Expectation("d_writes_input", ("incorrect",)),
    Expectation("e_cached", ("incorrect",)),
    Expectation("f_oob_read", ("sanitizer", "crashed"), "memcheck", "invalid_global_read"),
    Expectation("g_smem_race", ("sanitizer", "incorrect"), "racecheck", "race"),
    Expectation("h_extra_param", ("signature_mismatch",)),
    Expectation("i_renamed_export", ("missing_export", "build_failed")),
    Expectation("j_compile_error", ("build_failed",), compiles=False),
    Expectation("k_null_write", ("crashed",)),
    Expectation("l_hang", ("timeout",)),
    Expectation("m_vectorized", ("correct",)),
    # Rejected by the static scan (harness.scan) before the judge builds anything:
    Expectation("n_ctor_forges_verdict", ("rejected_source",)),  # static ctor running Python via dlsym
    Expectation("o_reads_env", ("rejected_source",)),  # getenv("OPENAI_API_KEY") encoded into the output
    Expectation("p_spawns_process", ("rejected_source",)),  # std::system
    Expectation("q_writes_file", ("rejected_source",)),  # fopen("/tmp/astra-pwned", "w")
    Expectation("r_dlsym", ("rejected_source",)),  # dlsym(RTLD_DEFAULT, "getenv")
    Expectation("s_small_magnitude", ("incorrect",)),  # |x*w| < 1e-6 flushed: only the small-magnitude trial
    # Evades the text scan and the .so backstop; only the judge/candidate split keeps it from forging:
    Expectation("t_ctor_obfuscated", ("rejected_source", "crashed", "incorrect")),
    # Right outputs while checked, half the rows while timed (above the physical floor in cold, where
    # writes may stay in L2): caught because a call made as it is timed must give the checked outputs:
    Expectation("u_half_when_timed", ("incorrect",)),
    # Timing counts only checked work (harness.paired_timing, harness.timed_outputs; docs/threat-model.md):
    # every launch of a graph replay has its own checked set, verified: the later launches of a capture skip rows
    Expectation("v_capture_first_only", ("incorrect",), reason="graph view, timed launch"),
    # a device-side launch count (replays count): rows skipped from launch 1000 on, caught by the verification
    Expectation("w_device_call_count", ("incorrect",)),
    # in place: skips rows holding its own (marked) result; restored sets and two launches back to back
    Expectation("x_inplace_skips_own_result", ("incorrect",), base="rowscale_inplace", reason="back to back"),
    # a bandwidth load on a private stream after each call: the original is timed in its own process while
    # this one is stopped after synchronising its device, so the load only slows the candidate itself
    Expectation("y_private_stream_load", ("correct",), faster=False),
    # one ulp of non-determinism (it used to switch the timed check off) and half the rows while captured
    Expectation("z_nondeterministic_ulp", ("incorrect",), reason="not deterministic"),
    # PDL: triggers its dependents at entry and never waits; two launches back to back catch the race
    Expectation("za_pdl_no_wait", ("incorrect",)),
    # an out-of-bounds read from 128 rows on: compute-sanitizer covers every band now
    Expectation("zb_oob_from_128_rows", ("sanitizer", "crashed"), "memcheck", "invalid_global_read"),
    # a thread keeps a spin kernel running while the process is stopped for the original's turns
    Expectation("zc_gpu_busy_while_stopped", ("interferes",)),
)
# The candidates of timing that only counts checked work: tests/adversarial/test_timed_work.py runs them (on
# a smaller job than test_adversarial.py's, which leaves them out).
TIMED_WORK = ("v_capture_first_only", "w_device_call_count", "x_inplace_skips_own_result", "y_private_stream_load",
              "z_nondeterministic_ulp", "za_pdl_no_wait", "zb_oob_from_128_rows", "zc_gpu_busy_while_stopped")
# Candidates the static scan cannot see (the defence-in-depth demonstration): with the scan bypassed they still
# must not get "correct", because their code runs only in the candidate process.
SCAN_EVADING = ("t_ctor_obfuscated",)


def tvm_ffi_include_dirs() -> list[str]:
    """tvm-ffi's include directories (its own headers and dlpack), as the build passes them."""
    from tvm_ffi import libinfo

    return list(dict.fromkeys([libinfo.find_include_path(), libinfo.find_dlpack_include_path()]))


def variant_key(dtype: str, base: str = "rowscale") -> str:
    return f"{BASES[base].struct}<{CPP_TYPE[dtype]}>::run"


def rowscale_case(tokens: int, width: int, dtype: str, timed: bool, base: str = "rowscale") -> Case:
    """One case: x [tokens, width], w [width], out [tokens, width], all of `dtype`; in place (the
    rowscale_inplace base): x [tokens, width] updated, w [width]."""
    x_role = "inout" if BASES[base].in_place else "in"
    args = [
        ArgSpec(name="x", kind="tensor", role=x_role, shape=[tokens, width], dtype=dtype),
        ArgSpec(name="w", kind="tensor", role="in", shape=[width], dtype=dtype),
    ]
    if not BASES[base].in_place:
        args.append(ArgSpec(name="out", kind="tensor", role="out", shape=[tokens, width], dtype=dtype))
    return Case(id=f"{base}/{dtype}/tokens={tokens},width={width}", band=band_of(tokens), label="synthetic",
                dtype=dtype, dims={"tokens": tokens, "width": width}, variant=variant_key(dtype, base),
                bytes=(2 * tokens * width + width) * ELEMENT_BYTES[dtype], args=args, timed=timed)


def rowscale_cases(tokens=TOKENS, widths=WIDTHS, dtypes=DTYPES, base: str = "rowscale") -> list[Case]:
    """Every (dtype, tokens, width); only the first dtype's aligned widths are timed."""
    return [rowscale_case(t, h, dtype, timed=index == 0 and h % 8 == 0, base=base)
            for index, dtype in enumerate(dtypes) for t in tokens for h in widths]


def base_of(candidate: str | None) -> str:
    """The base a candidate replaces ("rowscale" for none)."""
    return next((e.base for e in CANDIDATES if e.name == candidate), "rowscale")


def candidate_text(name: str) -> str:
    """The text of candidates/<name>.cuh."""
    return (CANDIDATE_DIR / f"{name}.cuh").read_text()


def rowscale_job(candidate: str | None = None, *, label: str = "candidate", cases: list[Case] | None = None,
                 base: str | None = None, **options) -> Job:
    """The job checking `candidate` (a candidate's name, or None for the original against itself) against its
    base (`base`, default the candidate's own, else "rowscale"); `cases` default to `rowscale_cases` of it.

    `options` override `harness.job.Options` fields (e.g. modes=["graph"], cache_dir=...).
    """
    base = base or base_of(candidate)
    spec = BASES[base]
    cases = rowscale_cases(base=base) if cases is None else cases
    variants = {variant_key(dtype, base): Variant(key=variant_key(dtype, base),
                                                  cuda_wrappers=[[spec.export, variant_key(dtype, base)]])
                for dtype in sorted({case.dtype for case in cases})}
    return Job(
        name=base,
        entry=spec.export,
        kernel_file=spec.kernel_file,
        build=BuildBase(source_root=str(BASE_ROOT), include_dirs=tvm_ffi_include_dirs(),
                        cuda_files=[spec.kernel_file]),
        variants=variants,
        cases=cases,
        tolerance={dtype: dict(tol) for dtype, tol in TOLERANCE.items()},
        reference=str(HERE / "rowscale_reference.py"),
        candidate_source=None if candidate is None else candidate_text(candidate),
        candidate_label=label if candidate is None else candidate,
        options=Options(**options),
    )


def assert_verdict(verdict, expect: Expectation) -> None:
    """`verdict` (of `run_job`/`verify_job`) is what `expect` asks for, with a reason."""
    print(f"{expect.name}: {verdict.status}: {verdict.reason}")  # shown by -rA: the reasons, for review
    assert verdict.status in expect.statuses, f"{expect.name}: {verdict.status}: {verdict.reason}"
    assert verdict.reason.strip(), verdict
    if expect.statuses == ("correct",):
        assert verdict.correct is True
    elif "suspect" not in expect.statuses:  # a suspect verdict has right outputs but impossible timings
        assert verdict.correct is False
    if expect.faster is not None:
        assert verdict.faster is expect.faster, f"{expect.name}: faster={verdict.faster}: {verdict.band_speedups}"
    if expect.reason is not None:
        assert expect.reason in verdict.reason, f"{expect.name}: {verdict.reason}"
