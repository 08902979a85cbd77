"""Reading the files a user gives Astra, within bounds: every reader of a user's file goes through here.

A user's file is anything Astra did not write itself this run: a kernel spec, a patch, a verdict, a
survey record, a serving mix, `$ASTRA_HOME/config.yaml`, a run's `state.json`, a loader file of an SGLang
tree. Before a byte is read, the path must name a regular file (a FIFO would block the command forever,
a device such as /dev/zero never ends, a directory is no file) no larger than the bound of its kind;
what is read is then at most that bound, even if the file grows meanwhile. Parsed data is bounded too:
JSON and YAML nest at most `MAX_NESTING` levels (deeper input is refused before it can exhaust the
stack), and YAML may hold no anchors or aliases (an alias bomb expands to gigabytes from a few hundred
bytes) and no key twice in one mapping (the later value would silently win).

Every refusal is a `Refused` (a `BadInput`, exit 12) whose message names the file and says why; `why`
alone is there for readers that report a problem in their own words (a spec's problems are exit 5).
The bounds, per kind of file, are listed in docs/exit-codes.md.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable, Iterable

import yaml

from astra.errors import BadInput

MAX_NESTING = 64  # levels of lists and mappings in a JSON or YAML document
CONFIG_BYTES = 64 << 10  # $ASTRA_HOME/config.yaml
SPEC_BYTES = 1 << 20  # a kernel spec
PATCH_BYTES = 16 << 20  # an Astra patch (its kernel file and the evidence in its message)
SOURCE_BYTES = 8 << 20  # a CUDA or Python source file (a candidate, an SGLang loader file)
MIX_BYTES = 4 << 20  # a serving mix (`survey --mix FILE`)
RECORD_BYTES = 64 << 20  # a JSON record: a verdict, a survey or probe record, a run's state.json

_NOT_REGULAR = ((stat.S_ISDIR, "a directory, not a file"),
                (stat.S_ISFIFO, "a FIFO (named pipe), not a regular file"),
                (stat.S_ISCHR, "a character device, not a regular file"),
                (stat.S_ISBLK, "a block device, not a regular file"),
                (stat.S_ISSOCK, "a socket, not a regular file"))


class Refused(BadInput):
    """A user's file Astra will not read or cannot parse. `why` is the reason without the file's name."""

    def __init__(self, label: str | os.PathLike, why: str):
        self.label, self.why = str(label), why
        super().__init__(f"{label}: {why}")


def size_text(limit: int) -> str:
    """A bound as people read it: "1,048,576 bytes (1 MiB)"."""
    unit = f" ({limit >> 20} MiB)" if limit >= 1 << 20 and not limit % (1 << 20) else \
        f" ({limit >> 10} KiB)" if limit >= 1 << 10 and not limit % (1 << 10) else ""
    return f"{limit:,} bytes{unit}"


def _kind_problem(mode: int) -> str | None:
    return next((why for test, why in _NOT_REGULAR if test(mode)), None if stat.S_ISREG(mode) else
                "not a regular file")


def check_file(path: str | os.PathLike, limit: int | None = None, *, what: str = "the file",
               label: str | None = None) -> os.stat_result:
    """`path`'s stat (links followed) if it is a regular file of at most `limit` bytes (None: any size), else
    Refused saying what it is. `what` names the kind in a size refusal ("a kernel spec is at most ..."); `label`
    is how the message names the file (default: its path; `--verdict v.json` reads better at the command line)."""
    label = label or str(path)
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise Refused(label, "no such file") from None
    except OSError as err:  # a symlink loop, a path through a file, no permission
        raise Refused(label, f"cannot read ({err.strerror or err})") from None
    problem = _kind_problem(info.st_mode)
    if problem:
        raise Refused(label, problem)
    if limit is not None and info.st_size > limit:
        raise Refused(label, f"the file is {info.st_size:,} bytes; {what} is at most {size_text(limit)}")
    return info


def read_bytes(path: str | os.PathLike, limit: int, *, what: str = "the file", label: str | None = None) -> bytes:
    """The bytes of `path` if it is a regular file (a symlink to one is fine) of at most `limit` bytes
    (`check_file`); what is read is at most `limit` bytes even if the file grows meanwhile."""
    label = label or str(path)
    check_file(path, limit, what=what, label=label)
    try:  # O_NONBLOCK: a FIFO swapped in after the check must not block the open
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    except OSError as err:
        raise Refused(label, f"cannot read ({err.strerror or err})") from None
    with os.fdopen(fd, "rb") as fh:
        problem = _kind_problem(os.fstat(fh.fileno()).st_mode)
        if problem:
            raise Refused(label, problem)
        try:
            data = fh.read(limit + 1)
        except OSError as err:
            raise Refused(label, f"cannot read ({err.strerror or err})") from None
    if len(data) > limit:
        raise Refused(label, f"the file grew past {size_text(limit)} while it was read; {what} is at most that")
    return data


def decode(data: bytes, label: str) -> str:
    """`data` as UTF-8 text, or a Refused naming the first bad byte."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise Refused(label, f"not UTF-8 text ({err.reason} at byte {err.start})") from None


def read_text(path: str | os.PathLike, limit: int, *, what: str = "the file", label: str | None = None) -> str:
    """`read_bytes`, decoded as UTF-8 (strict)."""
    return decode(read_bytes(path, limit, what=what, label=label), label or str(path))


def depth(root: object, children: Callable[[object], Iterable | None], limit: int) -> int:
    """How many levels deep `root` goes, `children(node)` giving a node's children (None: the node is no level,
    as a scalar in data); counted without recursion, and never past `limit + 1`, so a deeper input costs no
    more than that. The one measure of nesting: data here, syntax trees in astra.spec.expr and astra.sglang."""
    deepest, stack = 0, [(root, 1)]
    while stack:
        node, level = stack.pop()
        below = children(node)
        if below is None:
            continue
        deepest = max(deepest, level)
        if level <= limit:
            stack.extend((child, level + 1) for child in below)
    return deepest


def _containers(value: object) -> Iterable | None:
    if isinstance(value, dict):
        return value.values()
    return value if isinstance(value, (list, tuple)) else None


def nesting(value: object) -> int:
    """How many levels of lists, tuples and mappings `value` has (0 for a scalar), counted to MAX_NESTING + 1."""
    return depth(value, _containers, MAX_NESTING)


def _too_deep() -> str:
    return f"nested more than {MAX_NESTING} levels deep (lists and mappings inside each other)"


def parse_json(text: str, label: str) -> object:
    """`text` as JSON nested at most MAX_NESTING levels, or a Refused saying what is wrong."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise Refused(label, f"not JSON ({err.msg} at line {err.lineno}, column {err.colno})") from None
    except RecursionError:
        raise Refused(label, _too_deep()) from None
    if nesting(data) > MAX_NESTING:
        raise Refused(label, _too_deep())
    return data


def read_json(path: str | os.PathLike, limit: int = RECORD_BYTES, *, what: str = "a JSON record",
              label: str | None = None) -> object:
    """A bounded regular file (`read_bytes`), as UTF-8 JSON (`parse_json`)."""
    label = label or str(path)
    data = read_bytes(path, limit, what=what, label=label)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise Refused(label, f"not JSON (not UTF-8 text: {err.reason} at byte {err.start})") from None
    return parse_json(text, label)


_BASE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's parser when PyYAML has it: 10x faster


class _StrictLoader(_BASE_LOADER):
    """The safe loader, refusing a key given twice in one mapping (anchors, aliases and depth are refused
    before it runs, by `_check_events`)."""

    def construct_mapping(self, node, deep=False):
        seen: dict = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            try:
                first = seen.get(key)
            except TypeError:  # an unhashable key: the base class says so
                continue
            if first is not None:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key `{key}` appears twice in one mapping (lines {first} and {line}); the later "
                    "value would silently win: keep one", key_node.start_mark)
            seen[key] = line
        return super().construct_mapping(node, deep)


def _check_events(text: str, what: str) -> None:
    """Refuse anchors, aliases (an alias bomb expands to gigabytes from a few hundred bytes) and nesting deeper
    than MAX_NESTING, from the parser's events: nothing is composed yet, and no recursion runs."""
    depth = 0
    for event in yaml.parse(text, Loader=_BASE_LOADER):
        if isinstance(event, yaml.AliasEvent):
            raise yaml.composer.ComposerError(
                None, None, f"YAML aliases (*{event.anchor}) are not allowed in {what}; write the value out",
                event.start_mark)
        if getattr(event, "anchor", None) is not None:
            raise yaml.composer.ComposerError(
                None, None, f"YAML anchors (&{event.anchor}) are not allowed in {what}; write the value out",
                event.start_mark)
        if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            depth += 1
            if depth > MAX_NESTING:
                raise yaml.composer.ComposerError(None, None, _too_deep(), event.start_mark)
        elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            depth -= 1


def parse_yaml(text: str, label: str, what: str = "this file") -> object:
    """`text` as strict YAML (no anchors, aliases or repeated keys; nested at most MAX_NESTING levels),
    or a Refused "not valid YAML at line N: why". `what` names the file's kind in the messages."""
    try:
        _check_events(text, what)
        loader = _StrictLoader(text)
        try:
            return loader.get_single_data()
        finally:
            loader.dispose()
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        problem = getattr(err, "problem", None) or " ".join(str(err).split())[:200]
        if "maximum nesting depth" in problem:  # libyaml's own limit, met while it reads ahead: the same refusal
            problem = _too_deep()
        raise Refused(label, f"not valid YAML{where}: {problem}") from None
    except RecursionError:
        raise Refused(label, f"not valid YAML: {_too_deep()}") from None


def read_yaml(path: str | os.PathLike, limit: int, *, what: str = "the file", label: str | None = None) -> object:
    """A bounded regular file (`read_bytes`), as UTF-8 strict YAML (`parse_yaml`)."""
    label = label or str(path)
    return parse_yaml(read_text(path, limit, what=what, label=label), label, what)
