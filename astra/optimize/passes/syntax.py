"""libclang's view of one kernel file for the rewrite passes: the tree of a source text, where each node
stands in that text, and edits spliced back into it.

A pass reads the source as libclang parses it (astra.sglang.clang_env: the same arguments, prelude and
precompiled tvm-ffi prefix as every other parse in Astra), finds the statements it rewrites by their
kind and their references (a loop variable is the declaration a `DECL_REF_EXPR` names, not a word in
the text), and replaces the bytes of their extents. The text is parsed as an unsaved file at the path
it would have in the tree (`Headers.path`), so its relative includes resolve against the real folder;
nothing is written to disk.

Where the headers come from: a caller that knows the tree (`astra passes`, the offline agent) gives
`Headers`; a spec names its SGLang version and kernel file, which give the same (`headers_for_spec`);
without either the file is parsed alone and every pass that needs a resolved type refuses.
"""

from __future__ import annotations

import hashlib
import re
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

from astra.errors import AstraError, ToolMissing

# Kinds of cursors, as libclang names them.
FUNCTIONS = ("FUNCTION_DECL", "FUNCTION_TEMPLATE", "CXX_METHOD")
LOOPS = ("FOR_STMT", "WHILE_STMT", "DO_STMT", "CXX_FOR_RANGE_STMT")
_SCOPES = ("NAMESPACE", "LINKAGE_SPEC", "UNEXPOSED_DECL", "STRUCT_DECL", "CLASS_DECL", "CLASS_TEMPLATE",
           "CLASS_TEMPLATE_PARTIAL_SPECIALIZATION")


@dataclass(frozen=True)
class Headers:
    """What a parse of a kernel file needs besides its text: the -I folders, the -D flags its call site
    passes, and the path the file has in its tree (its relative includes resolve next to it)."""

    include_dirs: tuple[str, ...] = ()
    defines: tuple[tuple[str, str], ...] = ()
    path: str | None = None


def headers_for_spec(spec: dict | None) -> Headers:
    """The headers of the tree a spec names (`source.sglang_version`, `source.kernel_file`), from the
    wheel cache; empty headers when the spec names none or the tree cannot be had."""
    source = (spec or {}).get("source") or {}
    version, kernel_file = source.get("sglang_version"), source.get("kernel_file")
    if not version or not kernel_file:
        return Headers()
    from astra.sglang.clang_env import tree_include_dirs
    from astra.sglang.tree import from_wheel

    try:
        tree = from_wheel(str(version))
    except AstraError:
        return Headers()
    return Headers(tuple(tree_include_dirs(tree)), (), str(Path(tree.csrc_dir) / kernel_file))


class Unit:
    """One parsed source text. Offsets are byte offsets into `data` (the UTF-8 text), as libclang's are."""

    def __init__(self, text: str, tu, path: str):
        self.text, self.tu, self.path = text, tu, path
        self.data = text.encode()

    def in_main(self, cursor) -> bool:
        loc = cursor.location
        return loc.file is not None and loc.file.name == self.path

    def span(self, cursor) -> tuple[int, int]:
        return cursor.extent.start.offset, cursor.extent.end.offset

    def code(self, cursor) -> str:
        start, end = self.span(cursor)
        return self.data[start:end].decode()

    def line_of(self, offset: int) -> int:
        return self.data.count(b"\n", 0, offset) + 1

    def indent(self, offset: int) -> str:
        """The leading white space of the line holding `offset`."""
        begin = self.data.rfind(b"\n", 0, offset) + 1
        line = self.data[begin:offset].decode()
        return line[: len(line) - len(line.lstrip())]

    def line_start(self, offset: int) -> int:
        return self.data.rfind(b"\n", 0, offset) + 1

    def top(self) -> list:
        """The declarations of this file at the top level of the translation unit (headers left out)."""
        return [c for c in self.tu.cursor.get_children() if self.in_main(c)]

    def nodes(self):
        """Every node of this file's own declarations, in order (never the included headers')."""
        for cursor in self.top():
            yield from walk(cursor)

    def parents(self) -> dict:
        """`parents` over this file's own declarations."""
        out: dict = {}
        for cursor in self.top():
            out.update(parents(cursor))
        return out

    def functions(self) -> list:
        """Every function defined in this file (in namespaces and classes too), in order."""
        out: list = []

        def visit(cursor) -> None:
            for child in cursor.get_children():
                if not self.in_main(child):
                    continue
                kind = child.kind.name
                if kind in FUNCTIONS and child.is_definition():
                    out.append(child)
                elif kind in _SCOPES:
                    visit(child)

        visit(self.tu.cursor)
        return out

    def kernels(self) -> list:
        return [f for f in self.functions() if is_global(f)]

    def device_functions(self) -> list:
        """Functions compiled for the GPU: `__global__` and `__device__` ones."""
        return [f for f in self.functions() if attrs(f) & {"CUDAGLOBAL_ATTR", "CUDADEVICE_ATTR"}]

    def host_functions(self) -> list:
        return [f for f in self.functions() if not attrs(f) & {"CUDAGLOBAL_ATTR", "CUDADEVICE_ATTR"}
                or "CUDAHOST_ATTR" in attrs(f)]


def attrs(cursor) -> set[str]:
    return {c.kind.name for c in cursor.get_children() if c.kind.name.endswith("_ATTR")}


def is_global(cursor) -> bool:
    return "CUDAGLOBAL_ATTR" in attrs(cursor)


def body(function):
    """The compound statement of a function definition, or None."""
    return next((c for c in function.get_children() if c.kind.name == "COMPOUND_STMT"), None)


def walk(cursor):
    """`cursor` and everything under it, in order (libclang's preorder)."""
    return cursor.walk_preorder()


def parents(root) -> dict:
    """Each node under `root` mapped to its parent (libclang gives expressions no parent link)."""
    out = {}
    stack = [root]
    while stack:
        node = stack.pop()
        for child in node.get_children():
            out[child] = node
            stack.append(child)
    return out


def refers_to(cursor):
    """The declaration a `DECL_REF_EXPR` names, or None."""
    if cursor.kind.name == "DECL_REF_EXPR":
        return cursor.referenced
    return None


def operator(unit: Unit, cursor) -> str:
    """The spelling of a binary, compound-assignment or unary operator (libclang's own when it has one,
    else the token between the operands)."""
    spelled = getattr(cursor, "binary_operator", None)
    name = getattr(spelled, "name", "")
    if name and name != "Invalid":
        return _BINARY.get(name, "")
    children = list(cursor.get_children())
    if cursor.kind.name == "UNARY_OPERATOR":
        tokens = [t.spelling for t in cursor.get_tokens()]
        return tokens[0] if tokens and tokens[0] in ("*", "&", "-", "!", "~", "++", "--", "+") else (
            tokens[-1] if tokens and tokens[-1] in ("++", "--") else "")
    if len(children) == 2:
        gap = unit.data[children[0].extent.end.offset:children[1].extent.start.offset].decode().strip()
        return gap.strip("()").strip()
    return ""


_BINARY = {"PtrMemD": ".*", "PtrMemI": "->*", "Mul": "*", "Div": "/", "Rem": "%", "Add": "+", "Sub": "-",
           "Shl": "<<", "Shr": ">>", "Cmp": "<=>", "LT": "<", "GT": ">", "LE": "<=", "GE": ">=", "EQ": "==",
           "NE": "!=", "And": "&", "Xor": "^", "Or": "|", "LAnd": "&&", "LOr": "||", "Assign": "=",
           "MulAssign": "*=", "DivAssign": "/=", "RemAssign": "%=", "AddAssign": "+=", "SubAssign": "-=",
           "ShlAssign": "<<=", "ShrAssign": ">>=", "AndAssign": "&=", "XorAssign": "^=", "OrAssign": "|=",
           "Comma": ","}


def splice(unit: Unit, edits: list[tuple[int, int, str]]) -> str:
    """The text with each (start, end, new) byte range replaced; ranges must not overlap."""
    data = unit.data
    last = len(data) + 1
    for start, end, new in sorted(edits, key=lambda e: (e[0], e[1]), reverse=True):
        if end > last:
            raise ValueError(f"overlapping edits at byte {start}")
        data = data[:start] + new.encode() + data[end:]
        last = start
    return data.decode()


_CACHE: OrderedDict[str, Unit] = OrderedDict()
_CACHE_SIZE = 8


def parse(text: str, headers: Headers | None = None) -> Unit:
    """libclang's tree of `text` as the file `headers.path` (a name in a scratch folder without one).
    The last few parses are kept: the passes of one survey parse each source once.
    Raises ToolMissing without libclang, AstraError when it cannot parse the text at all."""
    from astra.sglang.clang_env import clang_env, load_cindex, prefix_pch

    headers = headers or Headers()
    key = hashlib.sha256(repr((text, headers)).encode()).hexdigest()
    if key in _CACHE:
        _CACHE.move_to_end(key)
        return _CACHE[key]
    cindex = load_cindex()
    env = clang_env()
    path = str(Path(headers.path).resolve()) if headers.path else "/astra-pass/kernel.cuh"
    dirs = [str(Path(path).parent), *headers.include_dirs]
    defines = dict(headers.defines) or None
    args = env.args(dirs, defines)
    prefix = prefix_pch(env.args([], defines))
    if prefix is not None:
        args += ["-include-pch", str(prefix)]
    try:
        tu = cindex.Index.create().parse(path, args=args, unsaved_files=[(path, text)],
                                         options=cindex.TranslationUnit.PARSE_INCOMPLETE)
    except cindex.TranslationUnitLoadError as exc:
        raise AstraError(f"libclang could not parse the source ({exc})") from exc
    unit = Unit(text, tu, path)
    _CACHE[key] = unit
    while len(_CACHE) > _CACHE_SIZE:
        _CACHE.popitem(last=False)
    return unit


def try_parse(text: str, headers: Headers | None) -> tuple[Unit | None, str]:
    """(the unit, "") or (None, why not): a pass refuses with that reason."""
    try:
        return parse(text, headers), ""
    except ToolMissing as err:
        return None, f"libclang unavailable: {err}"
    except AstraError as err:
        return None, str(err)


def bare(node):
    """`node` without the implicit conversions and parentheses around it."""
    while node.kind.name in ("UNEXPOSED_EXPR", "PAREN_EXPR") and len(list(node.get_children())) == 1:
        node = next(node.get_children())
    return node


_WRITES = ("=", "+=", "-=", "*=", "/=", "%=", "&=", "|=", "^=", "<<=", ">>=")


def assignment(unit: Unit, node) -> str:
    """The assignment operator `node` applies (`=`, `+=`, ...), also where it is a class's operator call
    (`q[i] = x` on a `__nv_bfloat16` element is `operator=`: its first child is the target, as for a
    built-in assignment) or a template's unnamed one (`unresolved_operator`); "" when `node` assigns nothing."""
    kind = node.kind.name
    if kind in ("BINARY_OPERATOR", "COMPOUND_ASSIGNMENT_OPERATOR"):
        op = operator(unit, node)
        return op if op in _WRITES else ""
    if kind == "CALL_EXPR" and node.spelling.startswith("operator") and len(list(node.get_children())) == 3:
        op = node.spelling[len("operator"):].strip()
        return op if op in _WRITES else ""
    if kind == "CALL_EXPR" and not node.spelling:  # a template's unnamed `x += y` on a dependent type
        op = unresolved_operator(unit, node)
        return op if op in _WRITES else ""
    return ""


def stepped(unit: Unit, node):
    """The operand `node` increments, decrements or takes the address of (built-in, a class's operator, or a
    template's unnamed `++`/`--`)."""
    kind = node.kind.name
    if kind == "UNARY_OPERATOR" and operator(unit, node) in ("++", "--", "&"):
        children = list(node.get_children())
        return bare(children[0]) if children else None
    if kind == "CALL_EXPR" and (node.spelling in ("operator++", "operator--") or (
            not node.spelling and unresolved_operator(unit, node) in ("++", "--"))):
        return bare(next(node.get_children()))
    return None


def unresolved_operator(unit: Unit, node) -> str:
    """The operator of a call libclang leaves unnamed in a template (`x += y`, `++x`, `a * b` on an operand of a
    dependent type where some overload of the operator is in scope): a `CALL_EXPR` without a spelling, one of
    whose children is the operator's own token (`+=`, `++`, `*`); "" for anything else. Its first child is the
    left (or only) operand."""
    if node.kind.name != "CALL_EXPR" or node.spelling:
        return ""
    for child in list(node.get_children())[1:]:
        if child.kind.name in ("DECL_REF_EXPR", "OVERLOADED_DECL_REF"):
            text = unit.code(child).strip()
            if text and not re.search(r"[\w\s]", text):
                return text
    return ""


def written(unit: Unit, root) -> tuple[set, set]:
    """(declarations `root` assigns, increments or takes the address of; declarations made in `root`)."""
    out, made = set(), set()
    for node in walk(root):
        if node.kind.name == "VAR_DECL":
            made.add(node)
            continue
        target = bare(next(node.get_children())) if assignment(unit, node) else stepped(unit, node)
        if target is not None and refers_to(target) is not None:
            out.add(refers_to(target))
    return out, made


def stores(unit: Unit, root) -> list:
    """The assignments under `root` whose target is an element of memory (`p[i] = ...`, `*p += ...`), a
    class's assignment operator included."""
    out = []
    for node in walk(root):
        if assignment(unit, node):
            target = bare(next(node.get_children()))
            if target.kind.name == "ARRAY_SUBSCRIPT_EXPR" or (
                    target.kind.name == "UNARY_OPERATOR" and operator(unit, target) == "*"):
                out.append(node)
    return out


def pointer_base(node):
    """The declaration a pointer expression starts from (`p` of `p`, `p + k`), or None."""
    node = bare(node)
    if refers_to(node) is not None:
        return refers_to(node)
    return None


BARRIERS = ("__syncthreads", "__syncwarp", "__threadfence", "__threadfence_block", "atomicAdd", "atomicMax",
            "atomicMin", "atomicCAS", "atomicExch", "atomicSub", "atomicAnd", "atomicOr", "atomicXor", "sync",
            "arrive", "wait", "__syncthreads_or", "__syncthreads_and", "__syncthreads_count")


def calls(root) -> list[str]:
    """The names of the functions called under `root`."""
    return [n.spelling for n in walk(root) if n.kind.name == "CALL_EXPR" and n.spelling]


def has_asm(unit: Unit, root) -> bool:
    return any(n.kind.name in ("ASM_STMT", "MS_ASM_STMT") for n in walk(root))


def callee(node) -> str:
    """The name a call calls, also where libclang leaves the call unnamed (a member or qualified
    template call in a template: `gmem.load(p)`, `device::load_as<V>(p, i)`)."""
    if node.spelling:
        return node.spelling
    children = list(node.get_children())
    if not children:
        return ""
    head = children[0]
    names = [t.spelling for t in head.get_tokens() if t.kind.name == "IDENTIFIER"]
    if head.kind.name == "MEMBER_REF_EXPR":
        return names[-1] if names else ""
    ref = next((c for c in walk(head) if c.kind.name == "OVERLOADED_DECL_REF"), None)
    if ref is not None:
        return ref.spelling
    return names[-1] if head.kind.name == "DECL_REF_EXPR" and names else ""


def statement_parent(node, up: dict):
    """The block a statement stands in, looking through the attributed statement a `#pragma unroll`
    wraps a loop in; None when it is not directly in a block."""
    parent = up.get(node)
    while parent is not None and parent.kind.name == "UNEXPOSED_STMT":
        parent = up.get(parent)
    return parent if parent is not None and parent.kind.name == "COMPOUND_STMT" else None


def pragmas_above(unit: Unit, offset: int) -> int:
    """The start of the line holding `offset`, moved up over the `#pragma` lines written right above it."""
    at = unit.line_start(offset)
    while at > 0:
        prev = unit.line_start(at - 1)
        if not unit.data[prev:at].strip().startswith(b"#pragma"):
            break
        at = prev
    return at


_CONDITIONAL = ("IF_STMT", "CONDITIONAL_OPERATOR", "SWITCH_STMT", "CASE_STMT", "DEFAULT_STMT")


def every_iteration(unit: Unit, node, loop_body, up: dict) -> bool:
    """Whether `node` runs on every pass through `loop_body` (no condition, `?:`, `&&` or `||` between)."""
    while node is not None and node != loop_body:
        parent = up.get(node)
        if parent is None:
            return False
        if parent.kind.name in _CONDITIONAL:
            children = list(parent.get_children())
            if not children or children[0] != node:  # the condition itself always runs
                return False
        if parent.kind.name == "BINARY_OPERATOR" and operator(unit, parent) in ("&&", "||"):
            if list(parent.get_children())[0] != node:
                return False
        node = parent
    return node == loop_body


def pointee(spelled: str) -> str | None:
    """The element type of a pointer type as clang spells it, `const`, `volatile` and `__restrict`
    dropped (`const T *__restrict` -> `T`); None for anything but a single pointer, or `void *`."""
    text = re.sub(r"\b(const|volatile|__restrict__|__restrict)\b", " ", spelled)
    if text.count("*") != 1 or text.split("*")[1].strip():
        return None
    element = re.sub(r"\s+", " ", text.split("*")[0]).strip()
    return None if element in ("void", "") else element


def const_pointee(spelled: str) -> bool:
    """Whether a pointer type points to const (`const T *`, `T const *__restrict`)."""
    spelled = re.sub(r"\b(__restrict__|__restrict)\b", " ", spelled).strip()
    head = spelled.split("*")[0].strip()
    return spelled.count("*") == 1 and (head.startswith("const ") or head.endswith(" const"))


def own_statement(unit: Unit, node, up: dict) -> bool:
    """Whether `node` is a statement of a block, alone at the start of its line (nothing guards it there)."""
    start = unit.span(node)[0]
    return statement_parent(node, up) is not None and not unit.data[unit.line_start(start):start].strip()


def fresh_name(stem: str, taken: set) -> str:
    """`stem`, or `stem2`, `stem3`, ... whichever is not in `taken` (which then holds it)."""
    name, k = stem, 2
    while name in taken:
        name, k = f"{stem}{k}", k + 1
    taken.add(name)
    return name


def pointer_stem(name: str) -> str:
    """A pointer's name without a `_ptr` suffix, to name what is read through it."""
    return name[:-4] if name.endswith("_ptr") else name
