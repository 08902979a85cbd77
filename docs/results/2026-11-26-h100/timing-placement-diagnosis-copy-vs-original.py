"""Where does the cross-process cold bias come from? copy vs original, decode rows."""
import random, sys, json, os
sys.path.insert(0, "tests/adversarial")
import torch
from rowscale_job import BASE_ROOT, BASES, rowscale_case, rowscale_cases, rowscale_job
from harness.judge.evaluate import build_all, default_cache_dir
from harness.building.module_loading import load_module
from harness.judge.paired_timing import Pair, time_view
from harness.timing.stats import Stats, speedup
from harness.timing.timing_side import TimingSide
from harness.timing.quiet_gpu import QuietGpu
from harness.worker.judge_process import run_job

COPY = (BASE_ROOT / BASES["rowscale"].kernel_file).read_text() + "\n// an unchanged copy of the original\n"
cases = rowscale_cases(tokens=(1, 1025), widths=(256, 4096), dtypes=("bfloat16",))
def job_of(budget=150.0):
    job = rowscale_job(None, cases=cases, seeds=[0, 1], modes=["graph", "cold"], budget_ms_per_case=budget, case_timeout_s=30.0)
    job.candidate_source, job.candidate_label = COPY, "unchanged copy"
    return job

def show(tag, cid, mode, o, c):
    print(f"{tag:10s} {cid:28s} {mode:5s} orig med {o['median_us']:8.3f} p10 {o['p10_us']:8.3f} n {o['n']:4d} | cand med {c['median_us']:8.3f} p10 {c['p10_us']:8.3f} | x{o['median_us']/c['median_us']:.4f} p10 x{o['p10_us']/c['p10_us']:.4f}", flush=True)

# A: the real paired run, twice
for rep in range(2):
    v = run_job(job_of(), timeout_s=300)
    print("A verdict", v.status, v.faster, v.band_speedups)
    for case in v.cases:
        for mode, t in case.timings.items():
            e = t.__dict__
            o, c = t.orig, t.cand
            show(f"A{rep}", case.id, mode, o if isinstance(o, dict) else o.to_dict(), c if isinstance(c, dict) else c.to_dict())
        
# B: both sides local in this process
job = job_of()
paths, _, failure = build_all(job, default_cache_dir(job))
assert failure is None, failure
device = torch.device("cuda", 0)
def launch(path):
    f = load_module(path).get_function(job.entry)
    return lambda args: f(*args)
class NoCheck:
    def verify(self, *a): return []
for quiet_on in (False, True):
    quiet = QuietGpu(device) if quiet_on else None
    for case in job.cases:
        if not case.timed: continue
        for view in ("cold", "graph"):
            for swap in (False, True):
                a, b = ("orig", "cand") if not swap else ("cand", "orig")
                o = TimingSide("orig", launch(paths[(a, case.variant)]), case, device)
                c = TimingSide("cand", launch(paths[(b, case.variant)]), case, device)
                out = time_view(case, view, Pair(o, c, None, quiet), job.options, lambda seeds: NoCheck(), device, random.Random(1))
                show(f"B q{int(quiet_on)} s{int(swap)}", case.id, view, out.entry["orig"], out.entry["cand"])
