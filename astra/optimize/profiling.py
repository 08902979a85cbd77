"""The profiling agent: what limits a kernel, per band, as typed symptoms the planner maps to rewrite passes.

    agent = ProfilingAgent(ncu=ncu_profile.Profiler(spec, tree, diagnose=True))   # ncu=None: no GPU
    profile = agent.profile(source, verdict, "cand", "best #3")    # the side of the verdict that source is
    profile.symptoms  # [Symptom("few_ctas", "decode", "grid of 4 CTAs x 64 threads on 132 SMs (0.03 waves)", "ncu"), ...]

Four kinds of evidence, each symptom naming its own (`source`):
- timing: the verdict's per-band times against the practical floor and the empty launch (`launch_bound`,
  `far_from_floor`);
- ptxas: registers, spills and static shared memory of the measured side's build (`spills`,
  `low_occupancy` with its limiter, computed for a 1024-thread SM budget of 64 warps);
- ncu: where Nsight Compute runs (a GPU and `ncu`), one representative shape per band (the one with the
  most microseconds above its practical floor), profiled once per (source, shape): achieved DRAM bandwidth,
  sectors per request and bytes used per sector of global loads and stores, achieved and theoretical
  occupancy with the limiter ncu names, CTAs against the SM count (waves), the top warp stalls, the
  instruction mix per pipe, registers and local-memory (spill) instructions;
- source: what the kernel text shows (`serial_loop`: a loop only thread 0 runs; `scalar_memory`: no 16-byte
  vector access anywhere while a band is far from its floor; a block-wide reduction for
  `block_reduce_small_row`; `serial_launches`: a launch after another launch of the same host function,
  without programmatic dependent launch; `loads_behind_stores`: an unrolled loop that loads, then stores,
  while a band is far from its floor).

The thresholds are this module's constants; a symptom's evidence always carries the numbers it rests on.
Without ncu the profile says why in `notes`, and the planner works from the other three.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Protocol

from astra import input_files
from astra.cxx import decls
from astra.cxx.text import blank
from astra.optimize.loop import source_id
from harness import BANDS, Verdict, geomean

FAR = 1.3  # a band at >= 1.3x its practical floor (geomean) is far from it
NEAR = 1.1  # ... and under 1.1x, close to done
LAUNCH_BOUND = 1.5  # a band whose median time is within 1.5x an empty launch is launch-bound
LOW_OCCUPANCY = 50.0  # % of the SM's warps, achieved (ncu) or theoretical (ptxas)
LOW_EFFICIENCY = 60.0  # % of each fetched 32-byte sector a global access uses
NARROW = 4.0  # sectors per global load request: <= 4 B per thread (a 16-byte vector load moves 16)
SMALL_CTA = 64  # threads per CTA
XU_SHARE = 10.0  # % of pipe instructions on the XU (transcendentals, conversions)
SM_WARPS, SM_REGISTERS, SM_SMEM = 64, 65536, 228 * 1024  # Hopper, per SM
_VECTOR = re.compile(r"\b(?:u?int4|float4|double2|longlong2|AlignedVector|aligned_vector|vec_t|Vec(?:tor)?<|"
                     r"ld\.global(?:\.\w+)*\.v[248]|load_128|uint128_t|__ldg\s*\(\s*reinterpret_cast\s*<\s*const\s+u?int4)")
_BLOCK_REDUCE = re.compile(r"\b(?:block_?[Rr]educe|BlockReduce|blockReduce\w*|block_reduce\w*)\b")
_LAUNCH = re.compile(r"\bLaunchKernel\s*\(")
_UNROLLED_FOR = re.compile(r"#pragma\s+unroll[ \t]*\n\s*for\s*\(")
_LOAD_CALL = re.compile(r"\.\s*load\s*\(|::load\s*\(|\b__ldg\s*\(|\bload_as\s*<|=\s*\*\s*reinterpret_cast\s*<")
_STORE = re.compile(r"\.\s*store\s*\(|\bstore_as\s*<|\b(?!auto\b)(\w+)\s*\[[^\]\n,]*\]\s*=(?!=)")  # not `auto [a, b] =`
# a thread's own array (`float acc[kCount];`, not `__shared__`): a store into it holds no load back
_LOCAL_ARRAY = re.compile(r"^(?![^\n]*__shared__)[ \t]*(?:const\s+)?[\w:<>, ]+?\s+(\w+)\s*\[[^\]\n]+\](?:\s*\[[^\]\n]+\])*\s*;",
                          re.M)
_THREAD0 = re.compile(r"if\s*\(\s*threadIdx\.x\s*==\s*0\s*\)\s*")
# a remainder (integers only) by a run-time value: a name or a member, not a literal, a `kConstant` or a call
_REMAINDER = re.compile(r"[\w)\]]\s*%\s*\(?\s*(?!k[A-Z])([a-z_][\w.]*)\b(?!\s*[(<])")


@dataclass(frozen=True)
class Symptom:
    """One finding that decides what to do: `id` (few_ctas, low_occupancy, uncoalesced_loads, ...), the band
    it was seen in ("all" for the whole kernel), the evidence with its numbers, where it came from
    (timing | ptxas | ncu | source) and the numbers as data (`facts`: the planner's rules may test them)."""

    id: str
    band: str
    evidence: str
    source: str
    facts: dict = field(default_factory=dict)

    @property
    def key(self) -> str:
        """The id with its band: `low_occupancy_decode`."""
        return f"{self.id}_{self.band}"

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class BandFacts:
    """One band of one side of a verdict: its timing against the floors and, where ncu ran, the profile of
    its representative shape (ncu_profile.summarize's dict, or {"available": False, "why": ...})."""

    band: str
    case: str | None  # the representative shape: most microseconds above its practical floor
    shapes: int = 0
    x_practical: float | None = None  # geomean of time / practical floor (graph view, else cold)
    us_above: float | None = None  # microseconds above the practical floor, summed (None: no floor recorded)
    median_us: float | None = None  # the representative shape's time
    launch_us: float | None = None  # an empty launch in the same view
    ncu: dict = field(default_factory=dict)


@dataclass
class Profile:
    """What limits one source, per band: the facts and the symptoms found in them (worst band first)."""

    label: str  # "original", "best #3"
    source_id: str
    bands: dict[str, BandFacts] = field(default_factory=dict)
    ptxas: list[dict] = field(default_factory=list)  # KernelResources dicts of the measured side
    symptoms: list[Symptom] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what was not available, and why

    def headroom(self, band: str) -> float:
        """Microseconds above the practical floor in `band` (all bands for "all")."""
        if band == "all":
            return sum(b.us_above or 0.0 for b in self.bands.values())
        facts = self.bands.get(band)
        return (facts.us_above or 0.0) if facts else 0.0

    def near_floor(self, band: str) -> bool:
        facts = self.bands.get(band)
        return facts is not None and facts.x_practical is not None and facts.x_practical < NEAR

    def text(self) -> str:
        """One line per symptom, for a log or a prompt."""
        lines = [f"{s.band}: {s.id}: {s.evidence} ({s.source})" for s in self.symptoms]
        return "\n".join(lines + [f"note: {n}" for n in self.notes]) or "no symptom found"


class NcuProfiler(Protocol):
    """What the profiling agent asks of a profiler (ncu_profile.Profiler): several shapes of one source at once."""

    def many(self, source: str | None, case_ids: list[str], extra_shapes: list) -> dict[str, dict]: ...



class ProfilingAgent:
    """Profiles sources for the planner. `ncu`: an ncu_profile.Profiler (with `diagnose=True`), None where
    no GPU or no ncu is at hand; `cache_dir`: where ncu results are kept per (source hash, shape), so a
    resumed run does not profile again (None: in memory only); `extra_shapes`: the suite's added shapes."""

    def __init__(self, ncu: NcuProfiler | None = None, *, cache_dir: Path | None = None,
                 extra_shapes: Callable[[], list] = lambda: []):
        self.ncu = ncu
        self.cache_dir = cache_dir
        self.extra_shapes = extra_shapes
        self._cache: dict[tuple[str, str], dict] = {}

    def profile(self, source: str, verdict: Verdict | None, side: str = "cand", label: str = "",
                *, original: bool = False) -> Profile:
        """The profile of `source`, the `side` ("orig" or "cand") of `verdict`; `original`: it is the
        original kernel (ncu profiles the original build then, not a candidate)."""
        sid = source_id(source)
        profile = Profile(label or ("original" if original else "candidate"), sid)
        profile.bands = band_facts(verdict, side)
        profile.ptxas = ptxas_facts(verdict, side)
        if self.ncu is None:
            profile.notes.append("no Nsight Compute profile (no GPU or no ncu here): timing, ptxas and source only")
        else:
            found = self._ncu(None if original else source, sid, [facts.case for facts in profile.bands.values()])
            for facts in profile.bands.values():
                facts.ncu = found[facts.case]
            missing = {f.ncu.get("why") for f in profile.bands.values() if not f.ncu.get("available")}
            profile.notes.extend(f"ncu: {why}" for why in sorted(w for w in missing if w))
        profile.symptoms = symptoms(profile, source)
        return profile

    def _ncu(self, source: str | None, sid: str, cases: list[str | None]) -> dict[str | None, dict]:
        """The ncu profiles of `cases` (a band's representative shape, None: the band has none): from memory or
        the cache directory, the rest from one profiled process (`NcuProfiler.many`)."""
        found: dict[str | None, dict] = {None: {"available": False, "why": "no timed shape in this band"}}
        wanted: list[str] = []
        for case in dict.fromkeys(c for c in cases if c is not None):
            kept = self._kept(sid, case)
            if kept is None:
                wanted.append(case)
            else:
                found[case] = kept
        if wanted:
            fresh = self.ncu.many(source, wanted, self.extra_shapes())
            for case in wanted:
                found[case] = self._keep(sid, case, fresh[case])
        return found

    def _path(self, sid: str, case: str) -> Path | None:
        return self.cache_dir / f"{sid[:16]}-{re.sub(r'[^A-Za-z0-9_.=-]+', '_', case)[:120]}.json" if self.cache_dir else None

    def _kept(self, sid: str, case: str) -> dict | None:
        """A profile of (source, shape) made earlier: in memory, else in the cache directory (None: none)."""
        key = (sid, case)
        if key in self._cache:
            return self._cache[key]
        path = self._path(sid, case)
        if path is not None and path.is_file():
            try:
                self._cache[key] = json.loads(input_files.read_text(path, input_files.RECORD_BYTES, what="a profile"))
                return self._cache[key]
            except (OSError, ValueError, input_files.Refused):  # a damaged cache file: profile again
                pass
        return None

    def _keep(self, sid: str, case: str, result: dict) -> dict:
        self._cache[(sid, case)] = result
        path = self._path(sid, case)
        if path is not None and result.get("available"):  # a failure is not kept: the next round may succeed
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(result))
        return result


def band_facts(verdict: Verdict | None, side: str = "cand") -> dict[str, BandFacts]:
    """Per band with timed shapes: its shapes against the practical floor on `side`, graph view else cold."""
    out: dict[str, BandFacts] = {}
    cases = [c for c in (verdict.timed_cases() if verdict else []) if c.timings]
    for band in BANDS:
        rows = [c for c in cases if c.band == band]
        if not rows:
            continue
        facts = BandFacts(band, None, len(rows))
        xs, best = [], (-math.inf, None)
        for case in rows:
            view = "graph" if "graph" in case.timings else "cold"
            floor, time = case.floors.get(view) or {}, case.median_us(view, side)
            practical = floor.get("practical_us")
            if time is None:
                continue
            if practical:
                xs.append(time / practical)
                facts.us_above = (facts.us_above or 0.0) + max(0.0, time - practical)
            else:  # an older verdict: the roofline fraction (practical / time) only
                fraction = (case.roofline.get(view) or {}).get(f"{side}_fraction")
                if fraction:
                    xs.append(1.0 / fraction)
            above = time - practical if practical else -1.0
            if above > best[0]:
                best = (above, case)
        chosen = best[1]
        if chosen is not None:
            view = "graph" if "graph" in chosen.timings else "cold"
            facts.case, facts.median_us = chosen.id, chosen.median_us(view, side)
            facts.launch_us = (chosen.floors.get(view) or {}).get("launch_us")
        facts.x_practical = geomean(xs) if xs and all(x > 0 for x in xs) else None
        out[band] = facts
    return out


def ptxas_facts(verdict: Verdict | None, side: str = "cand") -> list[dict]:
    """ptxas per compiled kernel of `side`'s build (the original's in a self-check, where only it is built)."""
    builds = verdict.builds if verdict else []
    if not any(b.get("side") == side and b.get("resources") for b in builds):
        side = "orig"
    seen, out = set(), []
    for build in builds:
        if build.get("side") != side:
            continue
        for r in build.get("resources") or []:
            if r.get("name") not in seen:
                seen.add(r.get("name"))
                out.append(r)
    return out


def symptoms(profile: Profile, source: str = "") -> list[Symptom]:
    """Every symptom of a profile: timing, ptxas, ncu and source evidence, the band furthest from its floor
    first."""
    found: list[Symptom] = []
    for facts in profile.bands.values():
        found += _timing(facts)
        if facts.ncu.get("available"):
            found += _ncu(facts)
    found += _ptxas(profile.ptxas)
    found += _source(profile, source)
    unique: dict[tuple[str, str], Symptom] = {}
    for s in found:  # ncu's finding wins over the same finding from ptxas or the source
        unique.setdefault((s.id, s.band), s)
    return sorted(unique.values(), key=lambda s: -profile.headroom(s.band))


def _timing(f: BandFacts) -> list[Symptom]:
    out = []
    if f.median_us is not None and f.launch_us and f.median_us <= LAUNCH_BOUND * f.launch_us:
        out.append(Symptom("launch_bound", f.band, f"{f.case}: {f.median_us:.2f} us against an empty launch of "
                           f"{f.launch_us:.2f} us (x{f.median_us / f.launch_us:.2f})", "timing",
                           {"median_us": f.median_us, "launch_us": f.launch_us}))
    elif f.x_practical is not None and f.x_practical >= FAR:
        above = f", {f.us_above:.1f} us above it" if f.us_above is not None else ""
        out.append(Symptom("far_from_floor", f.band, f"x{f.x_practical:.2f} its practical floor (geomean of "
                           f"{f.shapes} shape(s)){above}", "timing",
                           {"x_practical": f.x_practical, "us_above": f.us_above}))
    return out


def _ncu(f: BandFacts) -> list[Symptom]:
    n, band, out = f.ncu, f.band, []
    where = f"{f.case}"
    ctas = max(n.get("grid") or [0]) or None  # the largest grid of the shape's kernels
    block = max(n.get("block") or [0]) or None
    sms = n.get("sm_count")
    if ctas is not None and sms and ctas < sms:
        out.append(Symptom("few_ctas", band, f"{where}: grid of {ctas} CTA(s) x {block} threads on {sms:.0f} SMs "
                           f"({ctas / sms:.2f} waves)", "ncu", {"ctas": ctas, "block": block, "sm_count": sms}))
    if block is not None and block <= SMALL_CTA:
        out.append(Symptom("small_ctas", band, f"{where}: {block} threads ({block // 32 or 1} warp(s)) per CTA, "
                           f"{ctas} CTA(s)", "ncu", {"block": block, "ctas": ctas}))
    achieved = n.get("occupancy_pct")
    if achieved is not None and achieved < LOW_OCCUPANCY:
        limiter, per_sm = _limiter(n)
        theoretical = n.get("theoretical_occupancy_pct")
        said = f"{where}: achieved occupancy {achieved:.0f}% of the SM's warps"
        if theoretical is not None:
            said += f" (theoretical {theoretical:.0f}%)"
        if limiter:
            said += f"; limited by {limiter} ({per_sm:.0f} CTA(s) per SM)"
        out.append(Symptom("low_occupancy", band, said, "ncu",
                           {"achieved_pct": achieved, "theoretical_pct": theoretical, "limiter": limiter or "grid"}))
    for kind, what in (("ld", "loads"), ("st", "stores")):
        efficiency, sectors, requests = n.get(f"{kind}_efficiency_pct"), n.get(f"{kind}_sectors"), n.get(f"{kind}_requests")
        per = sectors / requests if sectors and requests else None
        if efficiency is not None and efficiency < LOW_EFFICIENCY:
            out.append(Symptom(f"uncoalesced_{what}", band, f"{where}: global {what} use {efficiency:.0f}% of each "
                               f"32-byte sector" + (f" ({per:.1f} sectors per request)" if per else ""), "ncu",
                               {"efficiency_pct": efficiency, "sectors_per_request": per}))
        elif kind == "ld" and per is not None and per <= NARROW and (f.x_practical or 0) >= FAR:
            dram = n.get("dram_pct")
            out.append(Symptom("scalar_memory", band, f"{where}: {per:.1f} sectors per global load request (<= 4 B "
                               f"per thread)" + (f", DRAM {dram:.0f}% of peak" if dram is not None else ""), "ncu",
                               {"sectors_per_request": per, "dram_pct": dram}))
    local = (n.get("local_loads") or 0) + (n.get("local_stores") or 0)
    if local > 0:
        out.append(Symptom("spills", band, f"{where}: {n.get('local_loads', 0):.0f} local-memory load and "
                           f"{n.get('local_stores', 0):.0f} store instructions at {n.get('registers')} registers",
                           "ncu", {"local": local, "registers": n.get("registers")}))
    stalls = [s[0] for s in n.get("top_stalls") or []]
    if stalls[:2] and any(s in ("barrier", "membar") for s in stalls[:2]):
        out.append(Symptom("barrier_stalls", band, f"{where}: top warp stalls {', '.join(stalls)}", "ncu",
                           {"top_stalls": stalls}))
    xu = (n.get("inst_mix_pct") or {}).get("xu")
    if xu is not None and xu >= XU_SHARE:
        out.append(Symptom("transcendental_heavy", band, f"{where}: {xu:.0f}% of pipe instructions on the XU "
                           "(transcendentals, conversions)", "ncu", {"xu_pct": xu}))
    return out


def _limiter(n: dict) -> tuple[str, float]:
    """The resource that allows the fewest CTAs per SM, as ncu's launch__occupancy_limit_* give it."""
    limits = {name: n[key] for name, key in (("registers", "limit_registers"), ("shared memory", "limit_shared_mem"),
                                             ("warps", "limit_warps"), ("block size", "limit_blocks")) if n.get(key)}
    if not limits:
        return "", 0.0
    name = min(limits, key=limits.get)
    return name, limits[name]


def _ptxas(resources: list[dict]) -> list[Symptom]:
    out = []
    for r in resources:
        name = str(r.get("name") or r.get("mangled") or "?")[:80]
        spilled = (r.get("spill_stores") or 0) + (r.get("spill_loads") or 0)
        if spilled:
            out.append(Symptom("spills", "all", f"{name}: ptxas spills {r.get('spill_stores', 0)} B stored / "
                               f"{r.get('spill_loads', 0)} B loaded at {r.get('registers')} registers", "ptxas",
                               {"spill_bytes": spilled, "registers": r.get("registers")}))
        regs, smem = r.get("registers") or 0, r.get("smem") or 0
        by_regs = SM_REGISTERS // (regs * 32) if regs else SM_WARPS  # warps per SM the registers allow
        pct = 100.0 * min(SM_WARPS, by_regs) / SM_WARPS
        if pct < LOW_OCCUPANCY:
            out.append(Symptom("low_occupancy", "all", f"{name}: {regs} registers per thread allow at most "
                               f"{min(SM_WARPS, by_regs)} of {SM_WARPS} warps per SM ({pct:.0f}%)", "ptxas",
                               {"theoretical_pct": pct, "limiter": "registers", "registers": regs}))
        elif smem > SM_SMEM // 4:
            out.append(Symptom("low_occupancy", "all", f"{name}: {smem} B of static shared memory allow at most "
                               f"{SM_SMEM // smem} CTA(s) per SM", "ptxas",
                               {"limiter": "shared memory", "smem": smem}))
    return out


def _source(profile: Profile, source: str) -> list[Symptom]:
    """What the kernel text shows (comments and string literals blanked)."""
    if not source:
        return []
    code = blank(source)
    out = []
    far = [b for b, f in profile.bands.items() if f.x_practical is not None and f.x_practical >= FAR]
    if far and not _VECTOR.search(code):
        out += [Symptom("scalar_memory", b, f"no 16-byte vector access in the source, x{profile.bands[b].x_practical:.2f} "
                        "the practical floor", "source", {"x_practical": profile.bands[b].x_practical}) for b in far]
    remainder = _REMAINDER.search(code)
    if far and remainder is not None:
        line = code.count("\n", 0, remainder.start()) + 1
        out += [Symptom("index_division", b, f"line {line}: an integer remainder by a run-time value "
                        f"(`{remainder.group(0).strip()}`), x{profile.bands[b].x_practical:.2f} the practical floor",
                        "source", {"line": line, "x_practical": profile.bands[b].x_practical}) for b in far]
    for m in _THREAD0.finditer(code):
        if re.search(r"\bfor\s*\(", _guarded(code, m.end())):
            line = code.count("\n", 0, m.start()) + 1
            out.append(Symptom("serial_loop", "all", f"line {line}: a loop only thread 0 runs", "source", {"line": line}))
            break
    chained = _launch_after_launch(source, code)
    if chained is not None:
        line, count = chained
        out.append(Symptom("serial_launches", "all", f"line {line}: a launch after another launch of its function "
                           f"({count} there), without programmatic dependent launch", "source",
                           {"line": line, "launches": count}))
    behind = _loads_then_stores(code)
    if far and behind is not None:
        out += [Symptom("loads_behind_stores", b, f"line {behind}: an unrolled loop loads, then stores: the compiler "
                        "cannot move the next iteration's loads above a store through a pointer that may alias "
                        f"them, x{profile.bands[b].x_practical:.2f} the practical floor", "source",
                        {"line": behind, "x_practical": profile.bands[b].x_practical}) for b in far]
    reduce = _BLOCK_REDUCE.search(code)
    if reduce is not None and "__syncthreads" in code:
        line = code.count("\n", 0, reduce.start()) + 1
        for band, facts in profile.bands.items():
            block = max(facts.ncu.get("block") or [0]) if facts.ncu.get("available") else 0
            stalls = [s[0] for s in facts.ncu.get("top_stalls") or []][:2]
            if (block and block <= 128) or "barrier" in stalls:
                why = f"{block} threads per CTA" if block and block <= 128 else "barrier stalls on top"
                out.append(Symptom("block_reduce_small_row", band, f"line {line}: a block-wide reduction ({why}, "
                                   f"{facts.case})", "source", {"line": line, "block": block}))
    return out


def _launch_after_launch(source: str, code: str) -> tuple[int, int] | None:
    """(line, launches) of the first `LaunchKernel(...)` statement of a host function that follows another
    launch statement of that function and does not set `.enable_pdl(...)`: an op of several kernels whose next
    launch waits for the last one to end (pdl_chain's pattern; the pass reads the branches, this does not)."""
    for chunk in decls.chunks(source):
        text = code[chunk.start:chunk.end]
        if "__global__" in text:
            continue
        launches = [m.start() for m in _LAUNCH.finditer(text)]
        for at in launches[1:]:
            end = text.find(";", at)
            if ".enable_pdl(" not in text[at:end if end >= 0 else len(text)]:
                return code.count("\n", 0, chunk.start + at) + 1, len(launches)
    return None


def _loads_then_stores(code: str) -> int | None:
    """The line of the first `#pragma unroll` loop whose body loads global memory before it stores (batch_loads'
    pattern; the pass reads the loop's tree and its aliasing, this reads the text)."""
    local = set(_LOCAL_ARRAY.findall(code))
    for m in _UNROLLED_FOR.finditer(code):
        depth, at = 1, m.end()
        while at < len(code) and depth:
            depth += {"(": 1, ")": -1}.get(code[at], 0)
            at += 1
        loop = _guarded(code, at + len(code[at:]) - len(code[at:].lstrip()))
        load = _LOAD_CALL.search(loop)
        if load is not None and any(store.group(1) not in local for store in _STORE.finditer(loop, load.end())):
            return code.count("\n", 0, m.start()) + 2
    return None


def _guarded(code: str, start: int) -> str:
    """The statement an `if (...)` ending at `start` guards: its braced block, else up to the next `;`."""
    if not code.startswith("{", start):
        end = code.find(";", start)
        return code[start:end + 1 if end >= 0 else len(code)]
    depth = 0
    for i in range(start, len(code)):
        depth += {"{": 1, "}": -1}.get(code[i], 0)
        if depth == 0:
            return code[start:i + 1]
    return code[start:]
