"""`astra bench --ncu`: cold medians against Nsight Compute's gpu__time_duration, per timed shape."""

from __future__ import annotations

from harness import Job, Verdict


def ncu_comparison(job: Job, verdict: Verdict) -> dict:
    """Per timed shape: cold median, ncu time, their ratio, and the ratio net of the fixed cost that
    CUDA events add (the cold empty launch minus ncu's empty launch)."""
    from harness.timing.ncu_cross_check import cross_check

    result = cross_check(job)
    cold_empty = verdict.env.get("cold_launch_floor_us")
    overhead = cold_empty - result["empty_us"] if cold_empty and result.get("empty_us") else None
    rows = []
    for case in verdict.cases:
        ncu_us = result["cases"].get(case.id)
        cold = case.median_us("cold", "orig")
        if ncu_us and cold:
            row = {"id": case.id, "cold_us": cold, "ncu_us": ncu_us, "ratio": cold / ncu_us}
            if overhead is not None:
                row["net_ratio"] = (cold - overhead) / ncu_us
            rows.append(row)
    return {"skipped": result["skipped"], "rows": rows, "launch_overhead_us": overhead,
            "cold_empty_us": cold_empty, "ncu_empty_us": result.get("empty_us")}
