"""What a measurement ran on, as `python -m harness env` prints it and the probe records it.

`environment_report()` is the static facts (harness.environment.static_facts) and, on a GPU box, device 0:
with `measure`, the measured environment a verdict records (harness.environment.measured: the performance
model measured afresh, not taken from a cache), so both report the same numbers; without it, the device's
properties only. It works without a GPU or without torch: the GPU fields are then None, with the reason
under "notes".
"""

from __future__ import annotations

from harness.environment.static_facts import gpu_properties, host_facts


def environment_report(measure: bool = True) -> dict:
    """The static facts plus device 0 (measured with `measure`) as one JSON-able dict."""
    env = host_facts()
    try:
        import torch
    except ImportError as error:
        env["notes"].append(f"torch not importable: {error}")
        return env
    env["torch_cuda"] = torch.version.cuda
    if not torch.cuda.is_available():
        env["notes"].append("no CUDA device visible to torch")
        return env
    device = torch.device("cuda", 0)
    if measure:
        from harness.environment.measured import measured_environment

        env.update(measured_environment(device))
    else:
        env.update(gpu_properties(device))
    return env
