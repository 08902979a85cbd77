"""The GPU's performance model: the bandwidths and launch costs every floor is computed from.

Per GPU, measured once and cached on disk (`<cache_dir>/perf-model-<digest>.json`, keyed by the GPU's
name and UUID, the driver, the torch version and `MODEL_VERSION`), and once per process in memory. A
file that is missing, malformed, written for another key or implausible against the device's peak (a
measured rate over `PLAUSIBLE_OVER_PEAK` x the peak) is re-measured and rewritten. The peak itself is
always read from the device, never taken from the file.

- `peak_dram_Bps`: memory clock (kHz) x bus width (bits) x 2 (double data rate) / 8, from torch's device
  properties where it exposes them, else the driver's attributes (cuDeviceGetAttribute through ctypes),
  else NVML (pynvml, when importable); None when nothing answers. An H100 SXM reports 2619 MHz x 5120
  bits: 3.35 TB/s. The physical floor divides by `floor_Bps`: the peak, or where it is unknown 1.10 x the
  best measured rate (`floor_source` says which).
- `read_Bps`: the best of two reductions over a 1 GiB buffer, torch.sum over float32 and torch.amax over
  int32 (vectorised loads, one scalar written): a streaming read as good as torch's kernels get.
- `write_Bps`: the best of fill_ and zero_ of the same buffer.
- `copy_Bps`: the best of the elementwise copy kernel of harness.timing.copy_reference and a cudaMemcpy device to
  device, 512 MiB each way, read + write counted.
- `launch_graph_us` / `launch_cold_us`: an empty kernel in a CUDA graph (harness.timing.modes.
  launch_overhead_floor) and cold, between events after an L2 flush (harness.timing.modes.cold_launch_floor).

Every rate is the median of `REPEATS` event-timed calls after 2 warm-ups; `rates` keeps each method's.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import math
import os
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

MODEL_VERSION = 1
BUFFER_BYTES = 1 << 30  # the read / write buffer; the copy moves half of it each way
REPEATS = 10
PEAK_FALLBACK_FACTOR = 1.10  # the physical floor's bandwidth where the device's peak is unknown
PLAUSIBLE_OVER_PEAK = 1.05  # a cached rate over 1.05 x the device's peak is not believed
_RATES = ("read_Bps", "write_Bps", "copy_Bps")
_TIMES = ("launch_graph_us", "launch_cold_us")
_MEMO: dict[str, "PerfModel"] = {}


class MalformedModel(ValueError):
    """A cached model that cannot be used (the reason is the message)."""


@dataclass
class PerfModel:
    read_Bps: float
    write_Bps: float
    copy_Bps: float
    launch_graph_us: float
    launch_cold_us: float
    peak_dram_Bps: float | None = None
    peak_source: str | None = None  # where the peak came from; None: unknown
    l2_bytes: int = 0
    key: dict[str, Any] = field(default_factory=dict)
    rates: dict[str, dict[str, float]] = field(default_factory=dict)  # quantity -> method -> bytes/s
    cache: str = ""  # "hit", "measured", "measured (why the file was not used)", "legacy env"

    @property
    def best_measured_Bps(self) -> float:
        return max(self.read_Bps, self.write_Bps, self.copy_Bps)

    @property
    def floor_Bps(self) -> float:
        """The bandwidth of the physical floor: the device's peak (or a measured rate above it), else
        PEAK_FALLBACK_FACTOR x the best measured rate."""
        if self.peak_dram_Bps:
            return max(self.peak_dram_Bps, self.best_measured_Bps)
        return PEAK_FALLBACK_FACTOR * self.best_measured_Bps

    @property
    def floor_source(self) -> str:
        if self.peak_dram_Bps and self.peak_dram_Bps >= self.best_measured_Bps:
            return "device peak"
        if self.peak_dram_Bps:
            return "best measured rate (above the device's reported peak)"
        return f"{PEAK_FALLBACK_FACTOR:.2f} x the best measured rate (the device's peak is unknown)"

    def launch_us(self, view: str) -> float:
        return self.launch_graph_us if view == "graph" else self.launch_cold_us

    def to_dict(self) -> dict[str, Any]:
        """The verdict's env["perf_model"]: the fields plus the floor's bandwidth and where it came from."""
        return {"version": MODEL_VERSION, **asdict(self), "floor_Bps": self.floor_Bps,
                "floor_source": self.floor_source}

    @classmethod
    def from_dict(cls, data: Any) -> "PerfModel":
        """A model from `to_dict()`'s output; MalformedModel when a number is missing or implausible."""
        if not isinstance(data, dict) or data.get("version") != MODEL_VERSION:
            raise MalformedModel(f"not a version {MODEL_VERSION} performance model")
        values: dict[str, Any] = {}
        for name in _RATES + _TIMES:
            value = data.get(name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise MalformedModel(f"{name} is {value!r}, not a positive number")
            values[name] = float(value)
        peak = data.get("peak_dram_Bps")
        if peak is not None and (isinstance(peak, bool) or not isinstance(peak, (int, float))
                                 or not math.isfinite(peak) or peak <= 0):
            raise MalformedModel(f"peak_dram_Bps is {peak!r}")
        rates, key = data.get("rates") or {}, data.get("key") or {}
        if not isinstance(rates, dict) or not isinstance(key, dict):
            raise MalformedModel("rates and key must be mappings")
        l2 = data.get("l2_bytes") or 0
        return cls(**values, peak_dram_Bps=None if peak is None else float(peak),
                   peak_source=data.get("peak_source") if isinstance(data.get("peak_source"), str) else None,
                   l2_bytes=int(l2) if isinstance(l2, int) else 0, key=key, rates=rates)

    @classmethod
    def from_env(cls, env: dict[str, Any]) -> "PerfModel":
        """The model of a verdict's environment; an older one without "perf_model" gives its copy bandwidth
        and launch floors (read = write = copy, peak unknown)."""
        if isinstance(env.get("perf_model"), dict):
            model = cls.from_dict(env["perf_model"])
            model.cache = str(env["perf_model"].get("cache") or "")
            return model
        copy = float(env.get("copy_bandwidth_Bps") or 0.0)
        return cls(read_Bps=copy, write_Bps=copy, copy_Bps=copy, launch_graph_us=float(env.get("launch_floor_us") or 0.0),
                   launch_cold_us=float(env.get("cold_launch_floor_us") or 0.0), l2_bytes=int(env.get("l2_bytes") or 0),
                   cache="legacy env")


# ---------------------------------------------------------------- the cache (no GPU needed)


def digest(key: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps({**key, "version": MODEL_VERSION}, sort_keys=True).encode()).hexdigest()[:16]


def cache_path(cache_dir: str | Path, key: dict[str, Any]) -> Path:
    return Path(cache_dir).expanduser() / f"perf-model-{digest(key)}.json"


def _read(path: Path, key: dict[str, Any], peak: float | None) -> tuple[PerfModel | None, str]:
    """(the cached model, "") or (None, why it is not used)."""
    if not path.is_file():
        return None, ""
    try:
        data = json.loads(path.read_text())
        model = PerfModel.from_dict(data)
    except (OSError, ValueError) as error:  # json.JSONDecodeError and MalformedModel are ValueErrors
        return None, f"cache file malformed: {str(error)[:120]}"
    if model.key != key:
        return None, "cache file written for another GPU, driver or torch"
    if peak and model.best_measured_Bps > PLAUSIBLE_OVER_PEAK * peak:
        return None, (f"cached rate {model.best_measured_Bps / 1e12:.2f} TB/s is over the device's peak "
                      f"{peak / 1e12:.2f} TB/s")
    return model, ""


def _write(path: Path, model: PerfModel) -> str:
    """Write atomically; "" or why it could not be written (the model is used either way)."""
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, tmp = tempfile.mkstemp(dir=path.parent, prefix=".perf-model-", suffix=".tmp")
        with os.fdopen(handle, "w") as out:
            json.dump(model.to_dict(), out, indent=1)
        os.replace(tmp, path)
    except OSError as error:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        return f"; not cached: {error}"
    return ""


def cached(key: dict[str, Any], cache_dir: str | Path | None, measure: Callable[[], PerfModel], *,
           peak: float | None = None) -> PerfModel:
    """The model for `key`: from this process's memory, else `cache_dir`'s file, else `measure()` (then
    written there). `peak`: the device's peak, against which a cached model must be plausible."""
    name = digest(key)
    path = cache_path(cache_dir, key) if cache_dir is not None else None
    if name in _MEMO:
        if path is not None and not path.exists():  # measured in this process for another directory
            _write(path, _MEMO[name])
        return _MEMO[name]
    model, why = _read(path, key, peak) if path is not None else (None, "")
    if model is not None:
        model.cache = "hit"
    else:
        model = measure()
        model.key = dict(key)
        model.cache = "measured" + (f" ({why})" if why else "")
        if path is not None:
            model.cache += _write(path, model)
    _MEMO[name] = model
    return model


def forget() -> None:
    """Drop the in-process models (tests; a new measurement on the next call)."""
    _MEMO.clear()


# ---------------------------------------------------------------- the device (GPU)


def device_key(device) -> dict[str, Any]:
    """What a cached model must match: GPU name and UUID (PCI bus id where torch has no UUID), driver, torch."""
    import torch

    from harness.environment.static_facts import driver_version

    props = torch.cuda.get_device_properties(device)
    uuid = getattr(props, "uuid", None)
    ident = str(uuid) if uuid is not None else f"pci {getattr(props, 'pci_bus_id', '?')}"
    return {"gpu": props.name, "uuid": ident, "driver": driver_version(), "torch": torch.__version__}


def _peak(clock_khz: Any, bus_bits: Any) -> float | None:
    if isinstance(clock_khz, int) and isinstance(bus_bits, int) and clock_khz > 0 and bus_bits > 0:
        return clock_khz * 1e3 * bus_bits * 2 / 8
    return None


def _driver_attributes(index: int) -> tuple[int, int] | None:
    """(memory clock kHz, bus width bits) from cuDeviceGetAttribute (36, 37), or None."""
    try:
        libcuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    dev, clock, width = ctypes.c_int(0), ctypes.c_int(0), ctypes.c_int(0)
    if libcuda.cuInit(0) != 0 or libcuda.cuDeviceGet(ctypes.byref(dev), index) != 0:
        return None
    if (libcuda.cuDeviceGetAttribute(ctypes.byref(clock), 36, dev) != 0
            or libcuda.cuDeviceGetAttribute(ctypes.byref(width), 37, dev) != 0):
        return None
    return clock.value, width.value


def _nvml_attributes(uuid: str | None) -> tuple[int, int] | None:
    """(max memory clock kHz, bus width bits) from NVML, looked up by UUID, or None."""
    try:
        import pynvml  # optional: not a dependency of the harness
    except ImportError:
        return None
    if not uuid:
        return None
    try:
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else f"GPU-{uuid}")
        return (int(pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_MEM)) * 1000,
                int(pynvml.nvmlDeviceGetMemoryBusWidth(handle)))
    except pynvml.NVMLError:
        return None


def device_peak(device) -> tuple[float | None, str | None]:
    """(peak DRAM bytes/s, where it came from) or (None, None); see the module docstring."""
    import torch

    props = torch.cuda.get_device_properties(device)
    peak = _peak(getattr(props, "memory_clock_rate", None), getattr(props, "memory_bus_width", None))
    if peak:
        return peak, "torch device properties: memory_clock_rate x memory_bus_width x 2 / 8"
    attrs = _driver_attributes(torch.device(device).index or 0)
    if attrs and _peak(*attrs):
        return _peak(*attrs), "driver attributes: MEMORY_CLOCK_RATE x GLOBAL_MEMORY_BUS_WIDTH x 2 / 8"
    uuid = getattr(props, "uuid", None)
    attrs = _nvml_attributes(str(uuid) if uuid is not None else None)
    if attrs and _peak(*attrs):
        return _peak(*attrs), "NVML: max memory clock x memory bus width x 2 / 8"
    return None, None


def _rate(run: Callable[[], Any], nbytes: int) -> float:
    """Bytes per second of `run` moving `nbytes`: the median of REPEATS event-timed calls after 2 warm-ups."""
    import torch

    from harness.timing.stats import median

    for _ in range(2):
        run()
    times_ms = []
    for _ in range(REPEATS):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        run()
        end.record()
        end.synchronize()
        times_ms.append(begin.elapsed_time(end))
    return nbytes / (median(times_ms) / 1000.0)


def _rates(device) -> dict[str, dict[str, float]]:
    """Each method's rate (see the module docstring) on one BUFFER_BYTES buffer, freed on return."""
    import torch

    from harness.timing.copy_reference import COPY_METHODS

    buffer = torch.empty(BUFFER_BYTES, dtype=torch.uint8, device=device).fill_(1)
    as_float, as_int = buffer.view(torch.float32), buffer.view(torch.int32)
    sink_f, sink_i = torch.empty((), dtype=torch.float32, device=device), torch.empty((), dtype=torch.int32, device=device)
    half = as_int.numel() // 2
    pair = [as_int[:half], as_int[half:]]
    return {
        "read": {"sum_float32": _rate(lambda: torch.sum(as_float, dim=0, out=sink_f), BUFFER_BYTES),
                 "amax_int32": _rate(lambda: torch.amax(as_int, dim=0, out=sink_i), BUFFER_BYTES)},
        "write": {"fill": _rate(lambda: buffer.fill_(1), BUFFER_BYTES), "zero": _rate(buffer.zero_, BUFFER_BYTES)},
        "copy": {name: _rate(lambda f=f: f(pair), 2 * half * 4) for name, f in COPY_METHODS.items()},
    }


def measure(device, peak: float | None = None, peak_source: str | None = None) -> PerfModel:
    """Measure the model on `device` (see the module docstring): about a second and 1 GiB of memory."""
    import torch

    from harness.timing.modes import cold_launch_floor, l2_bytes, launch_overhead_floor

    device = torch.device(device)
    rates = _rates(device)
    torch.cuda.empty_cache()
    return PerfModel(read_Bps=max(rates["read"].values()), write_Bps=max(rates["write"].values()),
                     copy_Bps=max(rates["copy"].values()), launch_graph_us=launch_overhead_floor(device).median_us,
                     launch_cold_us=cold_launch_floor(device).median_us, peak_dram_Bps=peak, peak_source=peak_source,
                     l2_bytes=l2_bytes(device), rates=rates)


def for_device(device, cache_dir: str | Path | None = None) -> PerfModel:
    """The model of `device`: cached under `cache_dir` (None: measured once per process), with the peak
    read from the device now."""
    peak, source = device_peak(device)
    model = cached(device_key(device), cache_dir, lambda: measure(device, peak, source), peak=peak)
    model.peak_dram_Bps, model.peak_source = peak, source
    return model
