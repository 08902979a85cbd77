"""Reading `TensorMatcher({dims}).with_dtype<T>().with_device(...).verify(x)` chains from the tokens
of a host function: the shape and dtype contracts SGLang's kernels check on their arguments."""

from __future__ import annotations

from dataclasses import dataclass

from astra.cxx.brackets import closing, spans


@dataclass
class MatcherCall:
    name: str  # with_dtype, with_device, with_strides, verify, ...
    template_args: str | None  # `DType` in `.with_dtype<DType>()`
    args: str  # the call's arguments as written


@dataclass
class TensorConstraint:
    function: str  # qualified name of the function holding the chain
    line: int
    dims: list[str]  # `TensorMatcher({N, D})` -> ["N", "D"]
    calls: list[MatcherCall]
    verify: str | None  # the tensor given to `.verify(...)`
    text: str  # the whole chain, whitespace collapsed


_TIGHT_AFTER = {"(", "[", "{", ".", "::", "->", "~", "!"}
_TIGHT_BEFORE = {")", "]", "}", ".", ",", "::", "->", ";", "(", "["}


def find_tensor_matchers(tokens: list, function: str) -> list[TensorConstraint]:
    """Every `TensorMatcher(...)` followed by a chain of `.name<...>(...)` calls in `tokens`."""
    found = []
    i = 0
    while i < len(tokens) - 1:
        if tokens[i].spelling == "TensorMatcher" and tokens[i + 1].spelling == "(":
            constraint, i = _matcher_chain(tokens, i, function)
            found.append(constraint)
        else:
            i += 1
    return found


def _matcher_chain(tokens: list, start: int, function: str) -> tuple[TensorConstraint, int]:
    spellings = [t.spelling for t in tokens]
    last = len(tokens) - 1  # a bracket that does not close runs to the last token
    close = closing(spellings, start + 1) or last
    dims = _dims(tokens[start + 2:close])
    calls: list[MatcherCall] = []
    i = close + 1
    while i + 1 < len(tokens) and tokens[i].spelling == ".":
        j = i + 1
        if tokens[j].spelling == "template":  # `.template with_dtype<T>()` in dependent code
            j += 1
        name, j = tokens[j].spelling, j + 1
        template_args = None
        if j < len(tokens) and tokens[j].spelling == "<":
            end = closing(spellings, j) or last
            template_args, j = join_tokens(tokens[j + 1:end]), end + 1
        if j >= len(tokens) or tokens[j].spelling != "(":
            break
        end = closing(spellings, j) or last
        calls.append(MatcherCall(name, template_args, join_tokens(tokens[j + 1:end])))
        i = end + 1
    verify = next((c.args for c in reversed(calls) if c.name == "verify"), None)
    text = join_tokens(tokens[start:i])
    return TensorConstraint(function, tokens[start].location.line, dims, calls, verify, text), i


def _dims(arg_tokens: list) -> list[str]:
    """`{N, D}` -> ["N", "D"]; any other argument is kept whole."""
    if len(arg_tokens) >= 2 and arg_tokens[0].spelling == "{" and arg_tokens[-1].spelling == "}":
        inner = arg_tokens[1:-1]
        return [join_tokens(inner[a:b]) for a, b in spans([t.spelling for t in inner]) if b > a]
    return [join_tokens(arg_tokens)] if arg_tokens else []


def join_tokens(tokens: list) -> str:
    """Source text of `tokens`: a single space where the source had whitespace, except inside
    brackets' edges and around `.`/`::` (so a chain split over lines reads as one line)."""
    out = []
    prev = None
    for token in tokens:
        if prev is not None:
            gap = (token.extent.start.offset > prev.extent.end.offset
                   or token.location.line != prev.location.line)
            if gap and prev.spelling not in _TIGHT_AFTER and token.spelling not in _TIGHT_BEFORE:
                out.append(" ")
        out.append(token.spelling)
        prev = token
    return "".join(out)
