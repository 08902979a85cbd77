"""Per-band winners combined into one candidate that dispatches on shape in the host entry.

A search often finds a change that wins on small token counts and another (or the original) that wins
on large ones; neither alone is verified faster everywhere, so neither is a patch. `combine` writes
one kernel file holding both, readable C++, in the smallest form that holds them:

- small (`minimal_combine`), when both versions declare the same things in the same order
  (astra.cxx.decls): the high-band version whole, a copy of each declaration the low-band
  version changes (and of each that uses one, up to the entry) renamed `*_astra_low` just before its
  original, and an early return at the top of the entry:

    if (x.size(0) <= T) {  // Astra band dispatch: the version for up to T tokens
      return X_astra_low<...>::run(...);
    }

  Against the original (the usual high side) the patch only adds lines: what the low band runs.
- whole, otherwise: the low-band version with its entry renamed X_astra_low, the high-band version with
  every name it declares at namespace scope suffixed _astra_high, and a new entry X that dispatches.

Names come from libclang (astra.sglang.cuda_parse: the entry's class and template parameters, its
`run` parameters, the names the file declares at namespace scope); the token count is the size of
the entry argument whose spec shape holds the token dim. Nothing is assumed to work: the combined
file is judged like any candidate (`try_band_dispatch`), on the full suite, against the original.
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

from astra.cxx import decls
from astra.cxx.brackets import closing
from astra.cxx.text import blank
from astra.errors import AstraError
from astra.optimize.evaluator import Evaluator
from astra.optimize.loop import band_leaders, band_wins
from astra.optimize.rundir import HistoryEntry, RunDir
from harness import Verdict, improves_on, score

LOW_BANDS = ("decode", "middle")
SUFFIX_LOW, SUFFIX_HIGH = "_astra_low", "_astra_high"


class CannotCombine(AstraError):
    """The two sources cannot be put behind one entry (the reason says why)."""


def _parse(source: str, kernel_file: str, parse_dir: Path, include_dirs: list[str]):
    from astra.sglang import cuda_parse

    with tempfile.TemporaryDirectory(prefix="astra-band-", dir=parse_dir if parse_dir.is_dir() else None) as tmp:
        path = Path(tmp) / Path(kernel_file).name
        path.write_text(source)
        return cuda_parse.parse_source(path, [str(parse_dir), *include_dirs])


def _rename(text: str, names: list[str], suffix: str) -> str:
    if not names:
        return text
    pattern = re.compile(r"(?<![\w.])(?:" + "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True))
                         + r")\b")
    out, pos = [], 0
    for m in pattern.finditer(blank(text)):  # comments and string literals left as they are
        before = text[max(0, m.start() - 9):m.start()]
        if before.endswith(("#include ", "->")):
            continue
        out.append(text[pos:m.end()] + suffix)
        pos = m.end()
    return "".join(out) + text[pos:]


def _template_head(params) -> str:
    parts = []
    for p in params:
        if p.kind == "type":
            parts.append(f"typename {p.name}")
        elif p.kind == "non-type" and p.type:
            parts.append(f"{p.type} {p.name}")
        else:
            raise CannotCombine(f"template parameter {p.name} ({p.kind}) cannot be forwarded")
        if p.default:
            parts[-1] += f" = {p.default}"
    return f"template <{', '.join(parts)}>\n" if parts else ""


class _Entry:
    """The spec's host entry as the low-band source declares it: what a dispatch forwards to."""

    def __init__(self, low: str, entry: str, token_arg: tuple[str, int], kernel_file: str, parse_dir: Path,
                 include_dirs: list[str]):
        parsed = _parse(low, kernel_file, parse_dir, include_dirs)
        base = re.sub(r"<.*", "", entry.rsplit("::run", 1)[0] if entry.endswith("::run") else entry)
        self.owner = base.rsplit("::", 1)[-1]
        self.namespace = base.rsplit("::", 1)[0] if "::" in base else ""
        host = next((h for h in parsed.host_entries if (h.class_name or h.name) == self.owner
                     and (h.name == "run" or h.class_name is None)), None)
        if host is None:
            raise CannotCombine(f"no host entry {self.owner} in the low-band source")
        if host.class_name and host.template_params:
            raise CannotCombine(f"{self.owner}: a templated run() cannot be forwarded")
        self.host, self.names = host, [p.name for p in host.params]
        arg, self.dim = token_arg
        if arg not in self.names:
            raise CannotCombine(f"{self.owner}: no parameter {arg} to read the token count from "
                                f"(parameters: {self.names})")
        self.arg = arg
        self.targs = ", ".join(p.name for p in (host.class_template_params if host.class_name
                                                else host.template_params))
        if not self.namespace:  # the spec names the entry as the export sees it (inside `namespace sglang`)
            parts = [p for p in host.qualified_name.split("::")[: -2 if host.class_name else -1] if p]
            outer = [p for p in parts if not re.search(rf"\bnamespace\s+{re.escape(p)}\b", low)]
            if outer:
                raise CannotCombine(f"{self.owner} is nested in {'::'.join(outer)}, not a namespace: name its entry "
                                    "fully qualified in the spec (build.wrappers[].entry)")
            self.namespace = "::".join(parts)

    def use(self, suffix: str) -> str:
        """How to call the entry renamed with `suffix` (a function template's arguments are not deduced from
        TensorViews: they are forwarded explicitly)."""
        if self.host.class_name:
            return f"{self.owner}{suffix}<{self.targs}>::run" if self.targs else f"{self.owner}{suffix}::run"
        return f"{self.owner}{suffix}<{self.targs}>" if self.targs else f"{self.owner}{suffix}"

    def call(self, suffix: str) -> str:
        return f"{self.use(suffix)}({', '.join(self.names)})"

    def condition(self, threshold: int) -> str:
        return f"{self.arg}.size({self.dim}) <= {threshold}"


def combine(low: str, high: str, *, entry: str, token_arg: tuple[str, int], threshold: int, kernel_file: str,
            parse_dir: Path, include_dirs: list[str], note: str = "") -> str:
    """One file: `low`'s entry for token counts <= `threshold`, `high`'s above. `entry` is the spec's
    C++ entry ("ns::Class<args>::run" or "ns::function"); `token_arg` (C++ parameter name, dim index)
    says where the token count is. The smallest form that holds both: `minimal_combine` when the two
    differ in a few declarations, else both files whole. Raises CannotCombine with the reason."""
    ent = _Entry(low, entry, token_arg, kernel_file, parse_dir, include_dirs)
    try:
        return minimal_combine(low, high, ent, threshold, note)
    except CannotCombine:
        pass
    parsed_high = _parse(high, kernel_file, parse_dir, include_dirs)
    owner, host = ent.owner, ent.host
    renamed_high = _rename(high, parsed_high.scope_names, SUFFIX_HIGH)
    renamed_low = _rename(low, [owner], SUFFIX_LOW)
    signature = ", ".join(f"{p.type} {p.name}" for p in host.params)
    body = (f"    if ({ent.condition(threshold)}) {{\n      {ent.call(SUFFIX_LOW)};\n    }} else {{\n"
            f"      {ent.call(SUFFIX_HIGH)};\n    }}\n")
    if host.class_name:
        dispatcher = (f"{_template_head(host.class_template_params)}struct {owner} {{\n"
                      f"  static void run({signature}) {{\n{body}  }}\n}};\n")
    else:
        dispatcher = f"{_template_head(host.template_params)}inline void {owner}({signature}) {{\n{body}}}\n"
    if ent.namespace:
        dispatcher = f"namespace {ent.namespace} {{\n\n{dispatcher}\n}}  // namespace {ent.namespace}\n"
    header = (f"// Astra band dispatch: {owner} runs the first version ({owner}{SUFFIX_LOW}) for "
              f"{ent.arg}.size({ent.dim}) <= {threshold} tokens and the second ({owner}{SUFFIX_HIGH}) above."
              f"{(' ' + note) if note else ''}\n")
    return (f"{renamed_low.rstrip()}\n\n// ---- Astra: the high-band version (its names end in {SUFFIX_HIGH}) ----\n"
            f"{renamed_high.replace('#pragma once', '').rstrip()}\n\n{header}{dispatcher}")


def minimal_combine(low: str, high: str, ent: _Entry, threshold: int, note: str = "") -> str:
    """`high` whole, with a copy of each namespace-scope declaration that `low` changes (and of those that
    use them, up to the entry) renamed `*_astra_low` beside its original, and the entry returning early
    into its low copy for small token counts: the patch shows only what the low band runs differently.
    Raises CannotCombine when the two versions do not declare the same things in the same order."""
    lows, highs = decls.chunks(low), decls.chunks(high)
    if [c.name for c in lows] != [c.name for c in highs]:
        raise CannotCombine("the two versions do not declare the same things in the same order")
    changed = {c.name for c, h in zip(lows, highs) if low[c.start:c.end] != high[h.start:h.end]}
    if "" in changed:
        raise CannotCombine("a declaration whose name the scan cannot tell differs")
    copied = changed | {ent.owner}
    while True:  # whatever uses a copied declaration is copied too, so the low copies call each other
        grown = copied | {c.name for c in lows if c.name and decls.references(low[c.start:c.end], copied)}
        if grown == copied:
            break
        copied = grown
    owner_chunk = next((h for h in highs if h.name == ent.owner and _body_start(high, h, ent) is not None), None)
    if owner_chunk is None:
        raise CannotCombine(f"no definition of {ent.owner} in the high-band source")
    at = _body_start(high, owner_chunk, ent)
    indent = (re.match(r"\n*([ \t]*)", high[at:]).group(1) or "  ")
    early = (f"\n{indent}if ({ent.condition(threshold)}) {{  // Astra band dispatch: the version for up to "
             f"{threshold} tokens\n{_wrapped(f'return {ent.call(SUFFIX_LOW)};', indent + '  ')}\n{indent}}}")
    edits = [(at, early)]
    why = f"Astra band dispatch: the version of this declaration that runs for up to {threshold} tokens" + (
        f" ({note.rstrip('.')})" if note else "")
    code = blank(high)
    for c, h in zip(lows, highs):  # each copy goes before its original (and its comment): the entry calls it
        if c.name in copied:
            edits.append((_comment_start(high, code, h.start),
                          f"// {why}.\n{_rename(low[c.start:c.end], sorted(copied), SUFFIX_LOW)}\n\n"))
    out, pos = [], 0
    for at, text in sorted(edits):
        out.append(high[pos:at] + text)
        pos = at
    return "".join(out) + high[pos:]


def _comment_start(text: str, code: str, start: int) -> int:
    """Where the comment lines just above the declaration at `start` begin (`code`: `text` with comments
    blanked)."""
    p = start
    while p > 0 and code[p - 1].isspace():
        p -= 1
    newline = text.find("\n", p, start)
    if newline == -1:
        return start
    at = newline + 1
    while at < start and text[at] == "\n":
        at += 1
    return at


def _wrapped(statement: str, indent: str, width: int = 120) -> str:
    """`statement` (a call ending in `);`) at `indent`, its arguments continued on lines of at most `width`
    columns (clang-format's limit in SGLang) when it is longer."""
    if len(indent) + len(statement) <= width:
        return indent + statement
    open_ = statement.rindex("(")  # the arguments are parameter names: no parentheses inside
    lines, line = [indent + statement[: open_ + 1]], ""
    for arg in statement[open_ + 1:-2].split(", "):
        if line and len(indent) + 4 + len(line) + len(arg) + 2 > width:
            lines.append(indent + "    " + line + ",")
            line = ""
        line += (", " if line else "") + arg
    return "\n".join(lines + [indent + "    " + line + ");"])


def _body_start(text: str, chunk, ent: _Entry) -> int | None:
    """Just after the `{` that opens the entry function's body within `chunk`."""
    code = blank(text)
    name = "run" if ent.host.class_name else ent.owner
    for m in re.finditer(rf"\b{re.escape(name)}\s*\(", code[chunk.start:chunk.end]):
        close = closing(code, chunk.start + m.end() - 1, chunk.end)
        if close is None:
            continue
        i = close + 1
        rest = re.match(r"[\s\w:&*<>,-]*\{", code[i:chunk.end])  # const, noexcept, -> type
        if rest and ";" not in rest.group():
            return i + rest.end()
    return None


def token_argument(spec) -> tuple[str, int] | None:
    """(argument name, dim index) of the first tensor argument whose shape holds the spec's token dim."""
    token = str(spec.raw["shapes"].get("token_dim", "tokens"))
    for arg in spec.raw.get("arguments", []):
        shape = arg.get("shape") or []
        if token in [str(s) for s in shape]:
            return str(arg["name"]), [str(s) for s in shape].index(token)
    return None


def split_point(verdict: Verdict, spec, bands: tuple[str, ...] = LOW_BANDS) -> int | None:
    """The largest token count among `bands`' cases: the dispatch threshold."""
    token = str(spec.raw["shapes"].get("token_dim", "tokens"))
    counts = [c.dims.get(token) for c in verdict.cases if c.band in bands and isinstance(c.dims.get(token), int)]
    return max(counts) if counts else None


def try_band_dispatch(run: RunDir, spec, tree, evaluator: Evaluator, say=print) -> int | None:
    """When the run's best small-token winner and its best (or large-token winner) are different
    candidates, judge their combination like any candidate; returns its number when it became the best."""
    leaders = {band: leader for band, leader in band_leaders(run).items()  # never a dispatch inside a dispatch
               if run.candidate(leader[0])[1].get("family") != "dispatch"}
    state = run.state()
    low = next((leaders[b] for b in LOW_BANDS if b in leaders), None)
    # above the split: the run's best, else the large-token winner, else the original itself (a win on small
    # token counts that loses on large ones is still a patch once the large ones keep the original's code)
    high_n = state.best if state.best is not None else (leaders.get("prefill") or (None,))[0]
    if low is None or low[0] == high_n:
        return None
    low_source, _, low_verdict = run.candidate(low[0])
    high_source = run.candidate(high_n)[0] if high_n is not None else run.original()
    high_name = f"#{high_n:03d}" if high_n is not None else "the original"
    wins = band_wins(low_verdict) if low_verdict else {}
    won = ("decode", "middle") if "middle" in wins else ("decode",)  # the low side: consecutive bands from decode
    if "decode" not in wins:
        say(f"band dispatch: skipped (candidate #{low[0]:03d} is not verified faster on decode, which the "
            "small-token side would run)")
        return None
    where, threshold = token_argument(spec), split_point(low_verdict, spec, won)
    if where is None or threshold is None:
        say("band dispatch: skipped (" + ("no argument of the spec has the token dim in its shape" if where is None
             else f"candidate #{low[0]:03d}'s verdict has no {'/'.join(won)} case with an integer token count")
            + "; set shapes.token_dim in the spec)")
        return None
    try:
        source = combine(low_source, high_source, entry=_entry(spec), token_arg=where, threshold=threshold,
                         kernel_file=spec.kernel_file, parse_dir=Path(tree.csrc_dir) / Path(spec.kernel_file).parent,
                         include_dirs=[str(tree.include_dir), str(tree.csrc_dir)],
                         note=f"Low: candidate #{low[0]:03d}; high: {'candidate ' if high_n is not None else ''}{high_name}.")
    except AstraError as err:
        say(f"band dispatch: skipped ({err})")
        return None
    name = f"band-dispatch:#{low[0]:03d}<= {threshold}<{high_name.replace('the ', '')}"
    n = run.add_candidate(source, {"name": name, "family": "dispatch", "round": state.round,
                                   "description": f"#{low[0]:03d} up to {threshold} tokens, {high_name} above"})
    verdict = evaluator.verify(source, name)
    run.save_verdict(n, verdict)
    best = run.candidate(state.best)[2] if state.best is not None else None
    decision = improves_on(verdict, best)
    state.history.append(HistoryEntry(n=n, round=state.round, name=name, status=verdict.status, score=score(verdict),
                                      accepted=decision.ok, why=decision.reason))
    if decision.ok:
        state.best, state.best_score = n, score(verdict)
    run.save(state)
    say(f"band dispatch #{n:03d}: {'ACCEPTED' if decision.ok else 'rejected'}: {decision.reason}")
    return n if decision.ok else None


def _entry(spec) -> str:
    wrappers = spec.raw["build"].get("wrappers") or []
    if not wrappers:
        raise CannotCombine("the spec names no entry")
    return str(wrappers[0]["entry"])
