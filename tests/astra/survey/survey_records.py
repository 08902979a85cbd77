"""Recorded bench verdicts built here for the survey tests (CPU only): per-case times shaped like an H100's
against their floors, so the ranking formula, the store and the reports have something to read. The
numbers are SYNTHETIC: no GPU ran."""

from __future__ import annotations

from astra.survey.store import make_record
from harness.judge.verdict import CaseResult, ModeTiming, Verdict
from harness.timing.stats import Stats

GPU = "NVIDIA H100 80GB HBM3"
TOKENS = [1, 8, 32, 128, 256, 1024, 4096, 16384]
PEAK_BPS, COPY_BPS = 3.35e12, 2.9e12  # H100: HBM3 peak; measured read+write (practical)
LAUNCH_US = {"graph": 0.84, "cold": 2.3}
FAMILIES = {"rmsnorm": [("Llama-3.1-8B/tp1", {"hidden": 4096}), ("DeepSeek-V3/tp8", {"hidden": 7168})],
            "silu_and_mul": [("Llama-3.1-8B/tp1", {"d": 14336}), ("Qwen3-32B/tp1", {"d": 25600})],
            "qknorm": [("Qwen3-32B/tp1", {"q_heads": 64, "kv_heads": 8, "head_dim": 128})]}


def _bytes(name: str, tokens: int, dims: dict) -> int:
    if name == "silu_and_mul":
        return 3 * tokens * dims["d"] * 2
    width = dims.get("hidden") or (dims.get("q_heads", 0) + dims.get("kv_heads", 0)) * dims.get("head_dim", 0)
    return 2 * tokens * width * 2


def verdict(name: str, slowdown, *, floors: bool = True, tokens=TOKENS, dtypes=("bfloat16", "float16"),
            status: str = "correct") -> dict:
    """A bench verdict as `astra bench --json` writes it, plus per-case floors (bytes at peak / at the measured
    copy rate, plus the empty launch); time = practical floor x slowdown(tokens, view)."""
    cases = []
    for label, dims in FAMILIES[name]:
        for dtype in dtypes:
            for t in tokens:
                nbytes = _bytes(name, t, dims)
                case = CaseResult(id=f"{label}/{dtype}/" + ",".join(f"{k}={v}" for k, v in {"tokens": t, **dims}.items()),
                                  band="decode" if t <= 256 else "prefill" if t >= 4096 else "middle", label=label,
                                  dtype=dtype, dims={"tokens": t, **dims}, timed=True, bytes=nbytes)
                extra = {}
                for view in ("graph", "cold"):
                    practical = LAUNCH_US[view] + nbytes / COPY_BPS * 1e6
                    time_us = practical * slowdown(t, view)
                    case.timings[view] = ModeTiming(orig=Stats(time_us, time_us * 0.98, time_us * 1.03, 200, 0.002),
                                                    cand=Stats(time_us, time_us * 0.98, time_us * 1.03, 200, 0.002),
                                                    speedup=1.0)
                    extra[view] = {"physical_us": max(LAUNCH_US[view] * 0.8, nbytes / PEAK_BPS * 1e6),
                                   "practical_us": practical, "orig_us": time_us, "cand_us": time_us,
                                   "orig_x_practical": time_us / practical, "cand_x_practical": time_us / practical}
                data = case.to_dict()
                if floors:
                    data.update(floors=extra, bytes_read=nbytes * 2 // 3, bytes_written=nbytes // 3)
                cases.append(data)
    v = Verdict(status=status, reason="original against itself", correct=status == "correct", name=name,
                env={"gpu": GPU, "copy_bandwidth_Bps": COPY_BPS}, phases={"total_s": 42.0}).to_dict()
    v["cases"] = cases
    return v


def record(name: str, slowdown, *, reach_status: str = "warm", sha: str = "0" * 64, **kw) -> dict:
    gates = {"warm": [], "gated": ["can_use_fused_inplace_qknorm: head_dim in [64, 128, 256, 512, 1024]"],
             "cold": [], "unknown": []}[reach_status]
    return make_record(name=name, kind="reviewed", spec_file=f"extracted_kernels/{name}/kernel.yaml",
                       spec_sha256=sha, module=name, token_dim="tokens", sglang_version="0.5.23", gpu=GPU,
                       wall_s=40.0, verdict=verdict(name, slowdown, **kw), error=None,
                       reach={"status": reach_status, "verdict": f"{reach_status} (recorded)", "sites": 1, "calls": 1,
                              "gates": gates, "more_gates": 0, "sites_at": []})


def decode_heavy(t, view):  # far from the floor at small batches (latency-bound), near it at large ones
    return 4.0 if t <= 64 else 1.1


def prefill_heavy(t, view):  # at the floor for decode batches, 10% above it on large prefill chunks
    return 1.0 if t <= 1024 else 1.1


def near(t, view):
    return 1.02

