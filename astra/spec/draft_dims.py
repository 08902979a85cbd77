"""The dims of a drafted spec, read from the C++ entry and its call site.

Each `SymbolicSize` of the checks becomes a spec dim (named by its label), fixed ones
(`set_value(kDim)`) become `derived` expressions over the template-argument dims; wildcard sizes
(`-1`) get a dim of their own. `bind_template` maps the entry's template parameters to spec names (a
numeric argument becomes a dim, the main element type `{dtype}`), `translate` reads a C++ size
expression in those names, and the token dim is the free dim named like a token count that leads
the most tensors.
"""

from __future__ import annotations

import re

from astra.cxx.entry import entry_parts
from astra.sglang.cxx_facts import EntryFacts
from astra.spec import meanings
from astra.spec.argument_kinds import CPP_TO_DTYPE, MAIN_DTYPES


def ident(text: str) -> str:
    """`text` as a spec name: lower case, runs of other characters as `_`, never a leading digit."""
    name = re.sub(r"\W+", "_", text.strip()).strip("_").lower() or "d"
    return name if not name[0].isdigit() else f"d_{name}"


class Dims:
    """The spec's dims: free ones (values from models), derived ones (expressions), by C++ name."""

    def __init__(self):
        self.free: dict[str, str] = {}  # dim -> meaning text
        self.derived: dict[str, str] = {}  # dim -> expr over free dims
        self.by_cpp: dict[str, str] = {}  # C++ symbol or template parameter -> spec name / expr

    def add_free(self, name: str, why: str) -> str:
        name = ident(name)
        base, i = name, 2
        while name in self.derived or (name in self.free and self.free[name] != why):
            name, i = f"{base}_{i}", i + 1
        self.free.setdefault(name, why)
        return name


def translate(expr: str, table: dict[str, str]) -> str | None:
    """A C++ size expression as a spec expression over `table`'s names, or None when it uses
    anything else (a tensor's size at run time, a function call)."""
    text = expr.strip()
    if re.search(r"\.|->|\(|\[|\?|::", text.replace("static_cast<int64_t>(", "(")):
        return None
    out = []
    for token in re.findall(r"[A-Za-z_]\w*|\d+|\S", text):
        if re.fullmatch(r"[A-Za-z_]\w*", token):
            if token not in table:
                return None
            out.append(f"({table[token]})" if not re.fullmatch(r"\w+", table[token]) else table[token])
        elif token == "/":
            out.append("//")
        elif token in "+-*%()&|^<>" or token.isdigit():
            out.append(token)
        else:
            return None
    return " ".join(out)


def bind_template(facts: EntryFacts, raw_entry: str, template_args: dict[str, list[str]],
                  values: dict[str, str], fixed: list[str] = ()) -> tuple[str, dict[str, str], dict[str, str], list[str]]:
    """(entry template for the spec, C++ param -> spec name/expr, spec dim -> Python symbol, notes).

    `raw_entry` is the call site's entry with `{var}` holes; `template_args` maps each var to the
    Python symbols given to `make_cpp_args`; `values` are the guessed C++ values of those symbols; `fixed`
    the symbols that are integer literals or constants of the loader's module, bound as those numbers
    (as a swept dim they would take a model's value, or 128)."""
    notes: list[str] = []

    def expand(m: re.Match) -> str:
        inner = m.group(1)
        return ", ".join(f"@{a}@" for a in template_args[inner]) if inner in template_args else f"@{inner}@"

    holed = re.sub(r"\{([^{}]+)\}", expand, raw_entry)
    cls, fn, cls_args, fn_args = entry_parts(holed)
    cls_params = len(facts.template_params) - len(fn_args) if facts.template_params else 0
    args = (cls_args + [""] * max(0, cls_params - len(cls_args)))[:max(cls_params, 0)] + fn_args
    binding: dict[str, str] = {}
    dim_symbols: dict[str, str] = {}
    main_dtype_taken = False
    rendered: dict[str, str] = {}
    for param, arg in zip(facts.template_params, args):
        holes = re.findall(r"@([^@]+)@", arg)
        if not holes:
            binding[param.name] = arg
            continue
        symbol = holes[0]
        value = values.get(symbol, "")
        if param.kind == "type":
            if value in MAIN_DTYPES and not main_dtype_taken:
                main_dtype_taken = True
                rendered[symbol] = "{cpp_dtype(dtype)}"
                binding[param.name] = "{dtype}"
            else:
                rendered[symbol] = value
                binding[param.name] = CPP_TO_DTYPE.get(value, value)
        elif (param.type or "").strip() == "bool" or value in ("true", "false"):
            rendered[symbol] = value or "false"
            binding[param.name] = "1" if value == "true" else "0"
        elif symbol in fixed and re.fullmatch(r"-?\d+", value or ""):
            rendered[symbol] = value
            binding[param.name] = value
            if not re.fullmatch(r"-?\d+", symbol):
                notes.append(f"template argument `{symbol}` = {value}: a constant of the loader's module")
        elif re.fullmatch(r"-?\d+", value or "") or not value:
            dim = ident(symbol.split(".")[-1].rstrip("()"))
            dim_symbols[dim] = symbol
            rendered[symbol] = "{" + dim + "}"
            binding[param.name] = dim
        else:
            rendered[symbol] = value
            binding[param.name] = value
            notes.append(f"template argument `{symbol}` = {value} was taken as a constant")
    def final(m: re.Match) -> str:
        symbol = m.group(1)
        if symbol in rendered or symbol in values:
            return rendered.get(symbol, values.get(symbol, symbol))
        return facts.class_name or symbol  # a class chosen in Python at run time: the one found

    entry = re.sub(r"@([^@]+)@", final, holed)
    return entry, binding, dim_symbols, notes


def dims_from_facts(facts: EntryFacts, binding: dict[str, str], dims: Dims) -> dict[str, list[str]]:
    """Every tensor's shape as spec expressions; dims registered in `dims`."""
    table = {p: v for p, v in binding.items() if re.fullmatch(r"[\w ()*/+-]+", v) and v != "{dtype}"}
    for param, value in binding.items():
        if re.fullmatch(r"[A-Za-z_]\w*", value) and value not in ("true", "false") and value != "{dtype}":
            dims.add_free(value, f"template argument {param}")
    for _ in range(3):  # constants defined from other constants
        for name, expr in facts.constants.items():
            if name not in table:
                value = translate(re.sub(r"static_cast<\w+>", "", expr), table)
                if value is not None:
                    table[name] = value
    same = {b: a for a, b in facts.equal_sizes if a in facts.sizes and b in facts.sizes}
    for var, size in facts.sizes.items():
        if var in same and same[var] in dims.by_cpp and size.value is None:
            dims.by_cpp[var] = dims.by_cpp[same[var]]
            continue
        if size.value is not None:
            expr = translate(size.value, {**table, **dims.by_cpp})
            if expr is not None:
                name = ident(size.label or var)
                if name in dims.free or name in dims.derived:
                    name = ident(var)
                dims.derived[name] = expr
                dims.by_cpp[var] = name
                continue
        dims.by_cpp[var] = dims.add_free(size.label or var, f"SymbolicSize {var}")
    for name, fact in facts.tensors.items():  # bare names in checks (locals such as `rows`) first
        for entry in (fact.shapes[0] if fact.shapes else []):
            entry = entry.strip()
            if re.fullmatch(r"[A-Za-z_]\w*", entry) and entry not in table and entry not in dims.by_cpp \
                    and entry != "kAnySize":
                dims.by_cpp[entry] = dims.add_free(entry, f"`{entry}` of {name}")
    shapes: dict[str, list[str]] = {}
    scalars = {p: ident(p) for p, ctype in facts.params  # integer scalars a shape names (`dim_t / 2`)
               if p not in facts.tensors and re.search(r"\b(u?int\w*|size_t|long)\b", ctype)}
    for name, fact in facts.tensors.items():
        if not fact.shapes:
            continue
        shape = []
        for i, entry in enumerate(fact.shapes[0]):
            entry = entry.strip()
            if entry in ("-1", "kAnySize"):
                shape.append(dims.add_free(f"{name}_d{i}", f"any size ({name} dim {i})"))
                continue
            expr = translate(entry, {**table, **dims.by_cpp})
            if expr is None and not re.fullmatch(r"\w+", entry):
                expr = _with_locals(entry, facts, {**scalars, **table, **dims.by_cpp})
                for p in dict.fromkeys(re.findall(r"\w+", expr or "")):
                    if p in scalars.values() and p not in dims.by_cpp.values():
                        dims.by_cpp[p] = dims.add_free(p, f"scalar {p}")
            if expr is None:
                expr = dims.add_free(entry, f"`{entry}` of {name}")
                dims.by_cpp.setdefault(entry, expr)
            shape.append(expr)
        shapes[name] = shape
    return shapes


def _with_locals(entry: str, facts: EntryFacts, base: dict[str, str]) -> str | None:
    """`entry` translated over `base` and the entry's locals (`dim_w = head_dim - dim_t - dim_h`,
    `head_dim = D.unwrap()`), each read the same way, a few levels deep."""
    texts: dict[str, str] = {}
    for check in facts.checks:
        for name, text in check.locals.items():
            texts.setdefault(name, re.sub(r"static_cast < \w+ >|\b(\w+) \. unwrap \( \)", lambda m: m.group(1) or "",
                                          text))
    table = dict(base)
    for _ in range(3):
        for name, text in texts.items():
            if name not in table:
                value = translate(text, table)
                if value is not None:
                    table[name] = value
    return translate(entry, table)


def token_dim_of(shapes: dict[str, list[str]], dims: Dims) -> str | None:
    """The free dim that counts tokens: named like one and leading most tensors."""
    lead: dict[str, int] = {}
    for shape in shapes.values():
        for i, d in enumerate(shape):
            if d in dims.free:
                lead[d] = lead.get(d, 0) + (3 if i == 0 else 1)
    named = [d for d in lead if meanings.is_token_name(d) or meanings.is_token_name(dims.free[d].split()[-1])]
    pool = named or [d for d in lead if meanings.meaning_of(d) is None]
    return max(pool, key=lambda d: lead[d]) if pool else None

