"""One side of the paired timing: one kernel (the original in the judge, the candidate in the candidate
process) timed on one case, a few samples at a time, as the judge's coordinator asks (harness.paired_timing).

Both sides run exactly this code, so what one side's sample contains the other's contains too:

- `estimate(seed)`: one eager launch timed after an untimed one (sizes the graph view's replay);
- `prepare(view, seeds, layout)`: the timed sets (harness.timed_sets), one per seed, placed behind the pads of
  `layout` (harness.timing.placement); for `graph`, a CUDA graph
  holding one launch per set (each launch its own set: no set is read twice within a replay), then two
  warm-up replays (cold: a warm-up launch of every set, at least three), each after a restore;
- `sample(count)`: per sample, OUTSIDE the events: restore what it launches (graph: every set; cold: the next
  set in turn; outputs poisoned, in-place tensors back to their drawn inputs) and flush L2 by reading 2 x L2
  bytes (cold: one CUDA graph per set holds both, captured in `prepare`, so the host enqueues a sample in a
  few calls); then the replay (or the launch of that one set) between two CUDA events, a pair kept for the
  side's life. A cold side cycles through
  its sets, so every set holds the outputs of its latest launch: a verification sees the side's last
  `len(sets)` launches. The samples are enqueued behind a spin sized to the host's enqueue time (as
  harness.timing does), with the garbage collector paused; then the WHOLE DEVICE is synchronised
  (`torch.cuda.synchronize`, cudaDeviceSynchronize: every stream of the process, private ones included),
  so nothing this side queued is left running when it hands the GPU back. Returns us per launch.
- `digests()`: the sets' output digests as the last sample left them (what the judge verifies). A side made
  with `reuse_digests` (the judge's original, once phase `outputs` found it deterministic) digests each seed's
  set once per view for the side's life: a deterministic kernel leaves the same outputs on the same inputs
  whatever block or sample launched it, so the later verifications of a view compare the candidate's digests
  with the ones the original gave first (per view: a kernel may run otherwise when captured in a graph). A
  reused digest is always a real result of the original on those inputs; the candidate's side never reuses:
  its digests are what is verified;
- `close()`: frees the graph and the sets.

On the CPU (tests) a "graph" is the launches called in order and times come from the host clock.
"""

from __future__ import annotations

import gc
import time
from typing import Any, Callable, Sequence

import torch

from harness.job import Case
from harness.timing.modes import CaptureError, event_pair, keep_busy, l2_bytes, l2_flush, spin_us
from harness.timing.placement import layout_pads
from harness.timing.timed_sets import TimedSets

WARMUP_REPLAYS = 2
WARMUP_LAUNCHES = 3
MIN_ESTIMATE_US = 0.5

Launch = Callable[[Sequence[Any]], Any]


class TimingSide:
    """`launch` timed on `case` (see the module docstring); `name` ("orig" or "cand") names it in errors."""

    def __init__(self, name: str, launch: Launch, case: Case, device: torch.device | str, key: int = 0,
                 reuse_digests: bool = False) -> None:
        self.name, self.launch, self.case, self.key = name, launch, case, key
        self.reused: dict[tuple[str, int], dict[str, str]] | None = {} if reuse_digests else None  # (view, seed)
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.view: str | None = None
        self.sets: TimedSets | None = None
        self.graph: Any = None
        self._flush: Callable[[], Any] | None = None
        self._pads: list[torch.Tensor] = []
        self._enqueue_us = 0.0
        self._next = 0  # cold: the set the next sample launches
        self._befores: list[Any] = []  # cold, on a GPU: per set, one CUDA graph of its restore and the flush
        self._events: list[tuple[Any, Any]] = []  # reused from sample to sample (read before the next)
        self.restore_mode = "eager"

    # ------------------------------------------------------------ set-up

    def estimate(self, seed: int) -> float:
        """Microseconds of one eager launch on a fresh set of `seed` (after an untimed launch)."""
        sets = TimedSets(self.case, [seed], self.device)
        self.launch(sets.call_args[0])
        sets.restore()
        self._synchronize()
        if self.cuda:
            begin, end = event_pair()
            begin.record()
            self.launch(sets.call_args[0])
            end.record()
            end.synchronize()
            elapsed = begin.elapsed_time(end) * 1000.0
        else:
            start = time.perf_counter()
            self.launch(sets.call_args[0])
            elapsed = (time.perf_counter() - start) * 1e6
        return max(elapsed, MIN_ESTIMATE_US)

    def prepare(self, view: str, seeds: list[int], layout: int = 0) -> dict[str, Any]:
        """The sets of `seeds` for `view`, placed by `layout`, captured (graph) and warmed up; raises
        CaptureError when the capture fails. Returns what the view's info records."""
        self.close()
        self.view = view
        self._pads = layout_pads(layout, self.device)
        self.sets = TimedSets(self.case, seeds, self.device, self.key)
        if self.cuda:
            self._flush = self._flush or l2_flush(self.device)  # one buffer for the side's life
            self._synchronize()
        if view == "graph" and self.cuda:
            graph = torch.cuda.CUDAGraph()
            try:
                with torch.cuda.graph(graph):
                    for args in self.sets.call_args:
                        self.launch(args)
            except Exception as error:  # the side's code ran during capture: any failure is a result
                raise CaptureError(self.name, error) from error
            self.graph = graph
        if view == "graph":
            for _ in range(WARMUP_REPLAYS):
                self.sets.restore()
                self._run()
        else:  # every set launched at least once, so each holds a launch's outputs from the start
            if self.cuda:
                self._befores = self._capture_befores()
            for index in range(max(WARMUP_LAUNCHES, len(self.sets))):
                self._before(index % len(self.sets))
                self._run(index % len(self.sets))
        self._next = 0
        self._synchronize()
        return {"input_sets": len(self.sets), "launches_per_sample": self.launches_per_sample(),
                "l2_bytes": l2_bytes(self.device) if self.cuda else 0, "restore": self.restore_mode}

    def _capture_befores(self) -> list[Any]:
        """Per cold set, a CUDA graph of what precedes its sample: the set's restore, then the L2 flush (the
        same kernels as eager, one host call instead of several). Where capturing them fails, none: the
        samples restore and flush eagerly (the same GPU work, more host time, which the spin covers)."""
        assert self.sets is not None and self._flush is not None
        graphs = []
        self.sets.restore(0)  # the kernels loaded before any capture
        self._flush()
        self._synchronize()
        try:
            for index in range(len(self.sets)):
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    self.sets.restore(index)
                    self._flush()
                graphs.append(graph)
        except RuntimeError:
            self.restore_mode = "eager"
            self._synchronize()
            return []
        self.restore_mode = "graph"
        return graphs

    def _before(self, index: int) -> None:
        """What precedes a sample, outside its events: restore what it launches (every set for a replay, set
        `index` for a cold launch) and, on a GPU, flush L2."""
        assert self.sets is not None
        if self._befores:
            self._befores[index].replay()
            return
        self.sets.restore(None if self.view == "graph" else index)
        if self.cuda:
            assert self._flush is not None
            self._flush()

    def launches_per_sample(self) -> int:
        return len(self.sets or []) if self.view == "graph" else 1

    # ------------------------------------------------------------ sampling

    def _run(self, index: int = 0) -> None:
        """One sample's launches: the replay, or the launches in order (CPU), or set `index`'s launch (cold)."""
        assert self.sets is not None
        if self.view == "graph":
            if self.graph is not None:
                self.graph.replay()
            else:
                for args in self.sets.call_args:
                    self.launch(args)
        else:
            self.launch(self.sets.call_args[index])

    def _next_set(self) -> int:
        """The set the next sample launches (a cold side's next in turn; 0 for a replay)."""
        assert self.sets is not None
        if self.view == "graph":
            return 0
        index = self._next
        self._next = (index + 1) % len(self.sets)
        return index

    def _event_pairs(self, count: int) -> list[tuple[Any, Any]]:
        while len(self._events) < count:
            self._events.append(event_pair())
        return self._events[:count]

    def sample(self, count: int) -> list[float]:
        """`count` samples (see the module docstring); microseconds per launch, one value per sample."""
        if self.sets is None:
            raise RuntimeError(f"{self.name}: sample before prepare")
        per = self.launches_per_sample()
        collecting = gc.isenabled()
        gc.disable()
        try:
            if not self.cuda:
                return [self._host_sample() / per for _ in range(count)]
            pending = self._event_pairs(count)
            keep_busy(spin_us(None, self._enqueue_us))
            start = time.perf_counter()
            for begin, end in pending:
                index = self._next_set()
                self._before(index)
                begin.record()
                self._run(index)
                end.record()
            self._enqueue_us = (time.perf_counter() - start) * 1e6
            self._synchronize()
            return [begin.elapsed_time(end) * 1000.0 / per for begin, end in pending]
        finally:
            if collecting:
                gc.enable()

    def _host_sample(self) -> float:
        index = self._next_set()
        self._before(index)
        start = time.perf_counter()
        self._run(index)
        return (time.perf_counter() - start) * 1e6

    def digests(self) -> list[dict[str, str]]:
        """The sets' digests as the last sample left them (harness.timed_sets.TimedSets.digests)."""
        if self.sets is None:
            raise RuntimeError(f"{self.name}: digests before prepare")
        self._synchronize()
        if self.reused is None:
            return self.sets.digests()
        keys = [(self.view or "", seed) for seed in self.sets.seeds]
        missing = [i for i, key in enumerate(keys) if key not in self.reused]
        for i, value in zip(missing, self.sets.digests(missing)):
            self.reused[keys[i]] = value
        return [self.reused[key] for key in keys]

    def set_args(self, index: int) -> dict[str, Any]:
        """Set `index`'s tensors by name, as the last sample left them."""
        if self.sets is None:
            raise RuntimeError(f"{self.name}: no sets")
        return self.sets.inputs[index]

    def close(self) -> None:
        self._befores, self.restore_mode = [], "eager"  # the graphs first: they copy into the sets
        self.graph, self.sets, self.view, self._pads = None, None, None, []  # the flush buffer and events stay
        if self.cuda:
            self._synchronize()
            torch.cuda.empty_cache()

    def _synchronize(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)  # cudaDeviceSynchronize: every stream of this process
