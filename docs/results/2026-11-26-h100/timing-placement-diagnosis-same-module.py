"""Within one process: which side-level factor makes the second-prepared side faster?"""
import random, sys
sys.path.insert(0, "tests/adversarial")
import torch
from rowscale_job import rowscale_cases, rowscale_job
from harness.judge.evaluate import build_all, default_cache_dir
from harness.building.module_loading import load_module
import harness.judge.paired_timing as pt
from harness.timing.timing_side import TimingSide
import harness.timing.timing_side as ts
from harness.timing.modes import l2_flush

cases = [c for c in rowscale_cases(tokens=(1,), widths=(256, 4096), dtypes=("bfloat16",)) if c.timed]
job = rowscale_job(None, cases=cases, seeds=[0, 1], modes=["graph", "cold"], budget_ms_per_case=150.0, case_timeout_s=30.0)
paths, _, failure = build_all(job, default_cache_dir(job))
assert failure is None, failure
device = torch.device("cuda", 0)
def launch(path):
    f = load_module(path).get_function(job.entry)
    return lambda args: f(*args)
class NoCheck:
    def verify(self, *a): return []

shared = {}
orig_prepare = TimingSide.prepare
def run(case, view, reverse=False, share_flush=False, pad_mb=0):
    o = TimingSide("orig", launch(paths[("orig", case.variant)]), case, device)
    c = TimingSide("cand", launch(paths[("orig", case.variant)]), case, device)
    pads = []
    def prep(self, v, seeds):
        if pad_mb: pads.append(torch.empty(pad_mb << 20, dtype=torch.uint8, device=device))
        info = orig_prepare(self, v, seeds)
        if share_flush:
            if "f" not in shared: shared["f"] = l2_flush(device)
            self._flush = shared["f"]
        return info
    TimingSide.prepare = prep
    try:
        pair = pt.Pair(c, o) if reverse else pt.Pair(o, c)
        out = pt.time_view(case, view, pair, job.options, lambda seeds: NoCheck(), device, random.Random(1))
    finally:
        TimingSide.prepare = orig_prepare
    e = out.entry
    a, b = (e["cand"], e["orig"]) if reverse else (e["orig"], e["cand"])  # a = first-constructed side "o"
    return a["median_us"], b["median_us"]

print("ratio = first-constructed side's median / second's (same module both sides)")
for case in cases:
    for view in ("cold", "graph"):
        for label, kw in [("plain", {}), ("plain again", {}), ("pair reversed", {"reverse": True}),
                          ("shared flush", {"share_flush": True}), ("pad 64MB", {"pad_mb": 64}), ("pad 3MB", {"pad_mb": 3})]:
            a, b = run(case, view, **kw)
            print(f"{case.id:38s} {view:5s} {label:14s} first {a:8.3f} second {b:8.3f} x{a/b:.4f}", flush=True)
