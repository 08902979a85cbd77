"""Markdown for `astra recheck` results and `astra diff-versions` comparisons (the data is in their JSON)."""

from __future__ import annotations

from pathlib import Path

_RESULT = {0: "ok", 1: "REGRESSION", 2: "NO LONGER APPLIES", 11: "COULD NOT VERIFY"}


def _gpu_cell(gpu: dict) -> str:
    if not gpu.get("run"):
        return gpu.get("reason", "not run")
    if gpu.get("regression"):
        return gpu["regression"]
    bands = ", ".join(f"{mode} {b.get('all', 0):.3f}x" for mode, b in (gpu.get("band_speedups") or {}).items())
    return f"correct; {bands or 'no timings'}"


def _applies_cell(check: dict) -> str:
    if check["location"] == "gone":
        return "no: the kernel file is gone"
    how = {"exact": "applies there exactly", "fuzz": "applies there only with fuzz",
           "no": "does not apply there either"}[check["applies"]]
    if check["location"] == "moved":
        return f"no: the file moved to `{check['new_path']}` (the diff {how})"
    return {"exact": "yes", "fuzz": "no: only with fuzz"}.get(check["applies"], "no")


def markdown(result: dict) -> str:
    sg = result["sglang"]
    lines = [f"# Astra recheck against SGLang {sg['version']} ({sg['origin']})", "",
             f"Exit code {result['exit_code']} ({_RESULT.get(result['exit_code'], '?')}). GPU: {result['gpu']}."
             + (" Source-only recheck (--no-gpu)." if result.get("source_only") else ""), "",
             "| patch | kernel | made for | applies | file changed | kernel sources | GPU check | result |",
             "|---|---|---|---|---|---|---|---|"]
    for c in result["patches"]:
        sources = (c.get("sources") or {}).get("summary") or c.get("sources_note") or "-"
        changed = "-" if c["file_changed"] is None else ("yes" if c["file_changed"] else "no")
        lines.append(f"| {Path(c['patch']).name} | {c['spec']} | {c['base_version'] or '?'} | {_applies_cell(c)} | "
                     f"{changed} | {sources} | {_gpu_cell(c['gpu'])} | {_RESULT.get(c['exit_code'], '?')} |")
    for c in result["patches"]:
        lines += ["", f"## {Path(c['patch']).name}", "",
                  f"- kernel file: `{c['kernel_file']}` ({c['location']}"
                  + (f", now `{c['new_path']}`" if c["location"] == "moved" else "") + ")"]
        if c.get("apply_method"):
            lines.append(f"- applies: {c['applies']} (tried: {c['apply_method']})"
                         + (f"; git said: {c['apply_error']}" if c.get("apply_error") else ""))
        lines += _sources_lines(c.get("sources"), c.get("sources_note"))
        lines += _gpu_lines(c["gpu"])
        lines += [f"- problem: {p}" for p in c["problems"]]
        lines += [f"- could not verify: {reason}" for reason in c.get("unverified") or []]
    return "\n".join(lines) + "\n"


def _sources_lines(sources: dict | None, note: str | None) -> list[str]:
    if not sources:
        return [f"- sources: {note or 'not compared'}"]
    out = [f"- sources {sources['from']} -> {sources['to']}: {sources['summary']}"]
    out += [f"  - {f['role']} `{f['path']}`: {f['status']} (+{f['added']} -{f['removed']})"
            for f in sources["files"] if f["status"] != "same"]
    return out


def _gpu_lines(gpu: dict) -> list[str]:
    if not gpu.get("run"):
        return [f"- GPU check (patched vs new original): {gpu.get('reason', 'not run')}",
                f"- upstream speed change: {gpu.get('reason', 'not run')}"]
    out = [f"- GPU check on {gpu.get('gpu')}: {gpu.get('status')} ({gpu.get('reason')})"]
    out += [f"  - {s['id']} {s['mode']}: x{s['speedup']:.3f}" for s in gpu.get("speedups", [])
            if isinstance(s.get("speedup"), (int, float))]
    up = gpu.get("upstream") or {}
    if not up.get("run"):
        out.append(f"- upstream speed change: {up.get('reason', 'not run')}")
    else:
        out.append(f"- upstream speed change (new original / old original; {up['how']}):")
        out += [f"  - {s['id']} {s['mode']}: {s['old_us']:.2f} us -> {s['new_us']:.2f} us "
                f"(x{s['new_over_old']:.3f})" for s in up["shapes"]]
    return out


def diff_versions_markdown(result: dict) -> str:
    lines = [f"# {result['name']}: SGLang {result['from']} -> {result['to']}", ""]
    if result.get("sources") is None:
        lines.append(f"- sources: {result.get('note')}")
    else:
        src = result["sources"]
        kernel = src["kernel"]
        lines.append(f"- kernel file `{kernel['path']}`: {kernel['status']}"
                     + (f" (+{kernel['added']} -{kernel['removed']})" if kernel["status"] != "same" else "")
                     + f"; sha256 {str(kernel['old_sha256'])[:12]} -> {str(kernel['new_sha256'])[:12]}")
        lines.append(f"- the kernel with its include closure: {src['summary']}")
        lines += [f"  - `{f['path']}`: {f['status']} (+{f['added']} -{f['removed']})"
                  for f in src["files"][1:] if f["status"] != "same"]
    speed = result.get("speed") or {}
    if not speed.get("run"):
        lines.append(f"- per-shape speed: {speed.get('reason', 'not run')}")
    else:
        lines += [f"- per-shape speed on {speed.get('gpu')} ({speed['how']}); worker status "
                  f"{speed['status']['from']} / {speed['status']['to']}:", "",
                  f"| shape | mode | {result['from']} us | {result['to']} us | new / old |", "|---|---|---:|---:|---:|"]
        lines += [f"| {s['id']} | {s['mode']} | {s['old_us']:.2f} | {s['new_us']:.2f} | {s['new_over_old']:.3f} |"
                  for s in speed["shapes"]]
    return "\n".join(lines) + "\n"
