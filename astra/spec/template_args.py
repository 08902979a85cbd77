"""The template arguments of a draft's wrapper entry, as astra.spec.template_search searches them.

An entry such as `ns::Kernel<{vec}, 32, false>::run` has argument lists (`arg_lists`, `rebuild`);
`lists_with_params` maps them onto the parameters the kernel's sources declare and repairs a list that
is missing, too long or too short; `slots` picks the arguments the search may change (a `{dim}` hole or
one of a derived name renaming a dim, the sweep's dim (computed only), an enum parameter given a
number, a template template parameter (the kernel's class templates that fit), a bool or type guessed
from a symbol's name, a literal in a repaired list) with their candidate values, and `render_entry`
writes an assignment of values back into the entry.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from astra.cxx import entry as cxx_entry
from astra.sglang import registry, variants
from astra.sglang.assert_solver import numeric_candidates
from astra.sglang.discovery import CallSite
from astra.sglang.includes import include_closure
from astra.sglang.source_facts import SourceFacts
from astra.sglang.template_params import TemplateParam
from astra.sglang.tree import SglangTree
from astra.spec import meanings
from astra.spec.expr import render
from astra.spec.model import load_models

_HOLE = re.compile(r"^\{(\w+)\}$")
TYPES = {"int32_t": "int32", "int64_t": "int64", "bf16_t": "bfloat16", "fp16_t": "float16", "fp32_t": "float32",
         "uint8_t": "uint8"}  # a guessed type argument's alternatives, with the spec's dtype of each


@dataclass
class EntrySources:
    """What the slots are read from: the draft spec, its module's call site and the sources' facts."""

    spec: dict
    site: CallSite
    facts: SourceFacts

    @classmethod
    def read(cls, tree: SglangTree, module: registry.JitModule, spec: dict) -> "EntrySources":
        site = module.call_sites[0]
        kernel_files = [registry.resolve_source(tree, f) for f in site.cuda_files]
        kernel_files = [f for f in kernel_files if f is not None]
        texts = {str(f): f.read_text(errors="replace") for f in kernel_files}
        texts.update({str(f): f.read_text(errors="replace") for f in include_closure(tree, kernel_files)
                      if str(f) not in texts})
        facts = SourceFacts.read(texts, {str(f) for f in kernel_files})
        entry = (spec["build"].get("wrappers") or [{}])[0].get("entry", "")
        return cls(spec, site, facts.for_entry(cxx_entry.owner_names(entry)))


@dataclass
class ArgList:
    owner: str  # the class or function template the list belongs to
    start: int  # span of the text between < and > in the entry (-1: a list the entry lacks)
    end: int
    args: list[str]
    params: list[TemplateParam] | None = None
    repaired: bool = False  # filled or completed by lists_with_params: its literals are guesses

    def copy(self) -> "ArgList":
        return ArgList(self.owner, self.start, self.end, list(self.args), self.params, self.repaired)


@dataclass
class Slot:
    """One template argument the search may change."""

    list_index: int
    arg_index: int
    param: TemplateParam
    kind: str  # "dim" | "number" | "bool" | "enum" | "template" | "type" | "token" (the sweep's dim: computed)
    current: str  # as drafted (a `{dim}` hole or a literal)
    candidates: list = field(default_factory=list)
    dim: str | None = None  # the hole's dim (a "type" slot: the loader's symbol it was guessed for)
    value: object = None  # the drafted value (rendered for the reference case)


def arg_lists(entry: str) -> list[ArgList]:
    """The top-level template argument lists of an entry (`ns::Cls<a, b>::run<c>`), in order."""
    return [ArgList(_owner(s.name), s.start, s.end, list(s.args)) for s in cxx_entry.segments(entry)
            if s.args is not None]


def _owner(name: str) -> str:
    """The name right before an argument list (`Cls` of `Cls<...>`; "" when none)."""
    m = re.search(r"(\w+)\s*$", name)
    return m.group(1) if m else ""


def rebuild(entry: str, lists: list[ArgList]) -> str:
    """The entry with each list's arguments as they are now in `lists`."""
    out, pos = [], 0
    for lst in lists:
        if lst.start < 0:  # a list that was missing: goes right after its owner's name
            at = re.search(rf"\b{re.escape(lst.owner)}\b", entry[pos:])
            cut = pos + at.end() if at else pos
            out.append(entry[pos:cut] + "<" + ", ".join(lst.args) + ">")
            pos = cut
            continue
        out.append(entry[pos:lst.start] + ", ".join(lst.args))
        pos = lst.end
    return "".join(out) + entry[pos:]


def show(value) -> str:
    """A value as a C++ template argument (`true`, `8`, an enumerator's name)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def enum_literal(slot: Slot, value: str) -> str:
    return f"{slot.param.type}::{value}"


def cxx_value(slot: Slot, value) -> str:
    return enum_literal(slot, value) if slot.kind == "enum" else show(value)


def render_entry(entry: str, lists: list[ArgList], slots: list[Slot], assignment: dict) -> str:
    """The entry with the assignment's values in place of the slots' arguments."""
    copies = [lst.copy() for lst in lists]
    for slot in slots:
        copies[slot.list_index].args[slot.arg_index] = cxx_value(slot, assignment[slot.param.name])
    return rebuild(entry, copies)


# ---------------------------------------------------------------- lists and their declared parameters


def lists_with_params(src: EntrySources, entry: str) -> tuple[list[ArgList], list[str]]:
    """The entry's argument lists with their declared parameters; lists that are missing, too long or
    too short are repaired (what was done, as notes)."""
    lists = arg_lists(entry)
    repairs: list[str] = []
    for lst in lists:
        lst.params = src.facts.params_of(lst.owner)
    owners = {lst.owner for lst in lists}
    for name in cxx_entry.owner_names(entry):
        if name in owners:
            continue
        params = src.facts.params_of(name)
        if params and all(p.default is None for p in params if p.kind != "pack"):
            args = _site_args(src, len(params)) or [_by_name(src, p) or _default_arg(p) for p in params]
            lists.append(ArgList(name, -1, -1, args, params, repaired=True))
            repairs.append(f"the argument list of `{name}` was missing: filled as <{', '.join(args)}>")
            lists.sort(key=lambda lst: entry.find(lst.owner) if lst.start < 0 else lst.start)
    for lst in lists:
        if not lst.params or any(p.kind == "pack" for p in lst.params):
            continue
        need = [p for p in lst.params if p.default is None]
        if len(lst.args) > len(lst.params):
            repairs.append(f"`{lst.owner}` takes {len(lst.params)} template argument(s): dropped "
                           f"{', '.join(lst.args[len(lst.params):])}")
            lst.args = lst.args[:len(lst.params)]
        elif len(lst.args) < len(need):
            args = [lst.args[i] if i < len(lst.args) and _fits(lst.args[i], p) else _by_name(src, p) or _default_arg(p)
                    for i, p in enumerate(lst.params[:len(need)])]
            repairs.append(f"`{lst.owner}` needs {len(need)} template argument(s): <{', '.join(lst.args)}> became "
                           f"<{', '.join(args)}>")
            lst.args, lst.repaired = args, True
    return lists, repairs


def _site_args(src: EntrySources, count: int) -> list[str] | None:
    """The call site's one template-argument list, rendered with the guessed values, when its length fits."""
    lists = [args for args in src.site.template_args.values()]
    if len(lists) != 1 or len([a for a in lists[0] if not a.startswith("*")]) != count:
        return None
    guess = variants.guess(src.site)
    out = []
    for symbol in lists[0]:
        value = guess.values.get(symbol)
        if value in ("bf16_t", "fp16_t") and "{dtype}" in json.dumps(src.spec["arguments"]):
            value = "{cpp_dtype(dtype)}"
        dim = _dim_for(src.spec, symbol)
        out.append(f"{{{dim}}}" if dim and re.fullmatch(r"\d+", value or "") else (value or "0"))
    return out


def _fits(arg: str, param: TemplateParam) -> bool:
    """Whether a drafted argument may be meant for `param` (a bool for a bool, a number for a number)."""
    if arg.startswith("{"):
        return True
    is_bool, is_number = arg in ("true", "false"), re.fullmatch(r"-?\d+[uUlL]*", arg) is not None
    if param.kind != "value":
        return not (is_bool or is_number)
    return (param.type == "bool") == is_bool if is_bool or is_number else True


def _norm(name: str) -> str:
    return re.sub(r"^k(?=[A-Z])", "", name.rstrip("()").split(".")[-1]).replace("_", "").lower()


def _by_name(src: EntrySources, param: TemplateParam) -> str | None:
    """The guessed value of the call site's template-argument symbol named like `param` (`block_size`
    for BLOCK_SIZE, `is_mla` for IsMLA)."""
    guess = variants.guess(src.site)
    for args in src.site.template_args.values():
        for symbol in args:
            if _norm(symbol) == _norm(param.name) and guess.values.get(symbol):
                return guess.values[symbol]
    return None


def _dim_for(spec: dict, symbol: str) -> str | None:
    """A dim of the spec that means what `symbol` means."""
    wanted = meanings.meaning_of(symbol.rstrip("()").split(".")[-1])
    token = spec["shapes"].get("token_dim")
    for dim in spec["dims"]:
        if dim != token and wanted is not None and meanings.meaning_of(dim) == wanted:
            return dim
    return None


def _default_arg(param: TemplateParam) -> str:
    if param.kind == "type":
        return "bf16_t"
    if param.type == "bool":
        return "true" if re.search(r"pdl", param.name, re.I) else "false"
    return "1"


# ---------------------------------------------------------------- the slots


def slots(src: EntrySources, lists: list[ArgList], names: dict) -> tuple[list[Slot], dict]:
    """The arguments the search may change, and the values of the others (for the static_asserts)."""
    spec = src.spec
    token = spec["shapes"].get("token_dim")
    guessed = _guessed_args(src)
    owners = {lst.owner for lst in lists}
    out: list[Slot] = []
    fixed: dict = {}
    for li, lst in enumerate(lists):
        for ai, (arg, param) in enumerate(zip(lst.args, lst.params or [])):
            text = render(arg, names) if "{" in arg else arg
            value = _literal_value(text)
            enum = src.facts.enum_of(param.type) if param.kind == "value" else None
            hole = _HOLE.match(arg)
            dim = _hole_dim(spec, hole.group(1)) if hole else None
            if param.kind == "template":
                options = src.facts.templates_for(param, owners)
                if options and (hole or text not in options):
                    out.append(Slot(li, ai, param, "template", arg, options, hole.group(1) if hole else None))
            elif param.kind == "type" and (lst.owner, ai) in guessed and text in TYPES and "{" not in arg:
                symbol = guessed[(lst.owner, ai)]
                ints = re.search(r"ind|idx|loc|pos|seq|len|id\b", f"{param.name} {symbol}", re.I)
                order = sorted(TYPES, key=lambda t: (t != text, ("int" not in t) == bool(ints)))
                out.append(Slot(li, ai, param, "type", arg, order, symbol))
            elif param.kind != "value":
                if param.kind == "type":
                    fixed[param.name] = text
            elif enum is not None:
                current = text.split("::")[-1]
                if current not in enum.values:
                    order = sorted(enum.values, key=lambda e: enum.values[e])
                    out.append(Slot(li, ai, param, "enum", arg, order, hole.group(1) if hole else None))
                else:
                    fixed[param.name] = current
            elif isinstance(value, bool):
                if (lst.owner, ai) in guessed or lst.repaired:
                    out.append(Slot(li, ai, param, "bool", arg, [value, not value]))
                else:
                    fixed[param.name] = value
            elif dim and dim == token and isinstance(value, int):
                out.append(Slot(li, ai, param, "token", arg, [value], dim, value))
            elif dim and isinstance(value, int):
                cands = numeric_candidates(param.name, value, model_values(dim), src.facts)
                if used_outside_entry(spec, dim) or dim != hole.group(1):
                    cands = [v for v in cands if v > 0]
                out.append(Slot(li, ai, param, "dim", arg, cands, dim, value))
            elif isinstance(value, int) and lst.repaired:
                cands = numeric_candidates(param.name, value, [], src.facts)
                out.append(Slot(li, ai, param, "number", arg, cands))
            elif value is not None:
                fixed[param.name] = value
    return out, fixed


def _hole_dim(spec: dict, name: str) -> str | None:
    """The dim a `{name}` hole stands for: a dim, or the dim a derived name only renames
    (`num_steps: top_k_tokens_d1`)."""
    if name in spec["dims"]:
        return name
    expr = str((spec.get("derived") or {}).get(name, "")).strip()
    return expr if expr in spec["dims"] else None


def _literal_value(text: str):
    if text in ("true", "false"):
        return text == "true"
    if re.fullmatch(r"-?\d+[uUlL]*", text):
        return int(re.sub(r"[uUlL]+$", "", text))
    return None


def _guessed_args(src: EntrySources) -> dict[tuple[str, int], str]:
    """{(owner, position): symbol} of the entry's arguments that came from a symbol guessed by its name."""
    guess = variants.guess(src.site)
    export = src.spec["build"]["wrappers"][0]["export"]
    raw = next((w.entry for w in src.site.wrappers if w.export == export), src.site.wrappers[0].entry)

    def expand(m: re.Match) -> str:
        inner = m.group(1)
        args = src.site.template_args.get(inner)
        return ", ".join(f"@{a}@" for a in args if not a.startswith("*")) if args else f"@{inner}@"

    out = {}
    for lst in arg_lists(re.sub(r"\{([^{}]+)\}", expand, raw)):
        for i, arg in enumerate(lst.args):
            symbol = next((s for s in re.findall(r"@([^@]+)@", arg) if s in guess.guessed), None)
            if symbol:
                out[(lst.owner, i)] = symbol
    return out


def model_values(dim: str) -> list[int]:
    """The values the models give the dim's meaning (tp 1), in the models' order."""
    meaning = meanings.meaning_of(dim)
    if meaning is None:
        return []
    values = []
    for fields in load_models().values():
        value, _ = meanings.value_for(meaning, fields, 1)
        if isinstance(value, str):
            value = fields.get(value) if isinstance(fields.get(value), int) else None
        if isinstance(value, int) and value > 0:
            values.append(value)
    return list(dict.fromkeys(values))


def used_outside_entry(spec: dict, dim: str) -> bool:
    """Whether an argument, derived name or the bytes formula of the spec uses `dim`."""
    text = json.dumps({k: spec.get(k) for k in ("arguments", "derived", "bytes")})
    return re.search(rf"\b{re.escape(dim)}\b", text) is not None
