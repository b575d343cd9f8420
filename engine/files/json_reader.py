"""Safe reading of JSON (config files, --batch lines, records, SGLang's JSON options): the limits
of yaml_reader's module docstring, and the position of every top-level key, without PyYAML."""
from __future__ import annotations

import json
import math
import re

from engine.errors import EngineError, Problem
from engine.files.document import MAX_DEPTH, MAX_NODES, MAX_NUMBER_CHARS, Document
from engine.files.reading import ReadError, line_col
from engine.values import INT_MAX, INT_MIN, shown


class _JSONRefused(EngineError):
    def __init__(self, code: str, message: str, locate=None):
        super().__init__(message)
        self.code, self.message, self.locate = code, message, locate


def _json_object(items):
    out = {}
    for k, v in items:
        if k in out:
            raise _JSONRefused("E105", f"duplicate key {shown(k)}", ("key", k))
        out[k] = v
    return out


def _json_int(text: str) -> int:
    if len(text) > MAX_NUMBER_CHARS:
        raise _JSONRefused("E112", f"an integer written with {len(text)} digits; numbers are limited to "
                                   f"{MAX_NUMBER_CHARS} characters", ("token", text))
    value = int(text)
    if not INT_MIN <= value <= INT_MAX:
        raise _JSONRefused("E112", f"integer {text} does not fit in 64 bits", ("token", text))
    return value


def _json_float(text: str) -> float:
    if len(text) > MAX_NUMBER_CHARS:
        raise _JSONRefused("E112", f"a number written with {len(text)} characters; numbers are limited "
                                   f"to {MAX_NUMBER_CHARS} characters", ("token", text))
    value = float(text)
    if not math.isfinite(value):
        raise _JSONRefused("E112", f"{text} is not a finite number (it overflows)", ("token", text))
    return value


def _json_constant(name: str):
    raise _JSONRefused("E112", f"{name} is not JSON (NaN and infinities are not allowed)", ("token", name))


def parse_json(text: str, display: str, sha256: str = "") -> Document:
    """JSON with the YAML reader's limits: duplicate keys, NaN/Infinity, integers beyond 64 bits,
    nesting deeper than MAX_DEPTH, more than MAX_NODES values and lone surrogates are refused.
    Positions: the whole document, and the offending token of a refusal where it can be found."""
    if text.startswith("\ufeff"):
        text = text[1:]
    try:
        data = json.loads(text, object_pairs_hook=_json_object, parse_int=_json_int,
                          parse_float=_json_float, parse_constant=_json_constant)
    except json.JSONDecodeError as exc:
        raise ReadError([Problem("E104", f"JSON syntax: {exc.msg}", display, exc.lineno, exc.colno)]) from None
    except _JSONRefused as exc:
        line, col = _json_locate(text, exc.locate)
        raise ReadError([Problem(exc.code, exc.message, display, line, col)]) from None
    except RecursionError:
        line, col = _json_too_deep(text)
        raise ReadError([Problem("E108", f"nesting deeper than {MAX_DEPTH} levels", display, line, col)]) from None
    problem = _json_limits(data, text, display)
    if problem:
        raise ReadError([problem])
    doc = Document(data, display, sha256)
    doc.positions[()] = (1, 1)
    if isinstance(data, dict):
        _json_top_positions(text, doc)
    return doc


def _json_top_positions(text: str, doc: Document) -> None:
    """Positions of the top-level keys and their values (a config file is one flat object), so
    that a config problem points at its line and column in a JSON file too."""
    depth = 0
    for m in _JSON_TOKEN.finditer(text):
        token = m.group()
        if token in "[{":
            depth += 1
        elif token in "]}":
            depth -= 1
        elif depth == 1 and m.group("colon"):
            key = json.loads(m.group("string"))
            value_at = len(text) - len(text[m.end():].lstrip(" \t\r\n"))
            doc.key_positions[(key,)] = line_col(text, m.start())
            doc.positions[(key,)] = line_col(text, value_at)


_JSON_TOKEN = re.compile(r'(?P<string>"[^"\\]*(?:\\.[^"\\]*)*")(?P<colon>\s*:)?|[\[\]{}]', re.S)
_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_LONE_SURROGATE = re.compile(r"\\u[dD][89abAB][0-9a-fA-F]{2}(?!\\u[dD][c-fC-F])|"
                             r"(?<!\\u[dD][89abAB][0-9a-fA-F]{2})\\u[dD][c-fC-F][0-9a-fA-F]{2}")
_SURROGATE = re.compile("[\ud800-\udfff]")


def _json_limits(data, text: str, display: str) -> Problem | None:
    """The first limit the parsed data breaks (depth, nodes, lone surrogates), or None."""
    nodes, surrogate = 0, False
    todo = [(data, 1)]
    while todo:
        value, depth = todo.pop()
        nodes += 1
        if nodes > MAX_NODES:
            return Problem("E113", f"more than {MAX_NODES} values in the document", display)
        if isinstance(value, dict):
            if depth > MAX_DEPTH:
                return Problem("E108", f"nesting deeper than {MAX_DEPTH} levels", display, *_json_too_deep(text))
            for k, v in value.items():
                surrogate = surrogate or bool(_SURROGATE.search(k))
                todo.append((v, depth + 1))
        elif isinstance(value, list):
            if depth > MAX_DEPTH:
                return Problem("E108", f"nesting deeper than {MAX_DEPTH} levels", display, *_json_too_deep(text))
            todo.extend((v, depth + 1) for v in value)
        elif isinstance(value, str):
            surrogate = surrogate or bool(_SURROGATE.search(value))
    if surrogate:  # "\ud800" parses, but it is no character: it cannot even be printed
        m = _LONE_SURROGATE.search(text)
        line, col = line_col(text, m.start()) if m else (0, 0)
        return Problem("E103", "not Unicode text: a lone surrogate escape "
                               f"{m.group() if m else ''}".rstrip(), display, line, col)
    return None


def _blank_strings(text: str) -> str:
    """`text` with the inside of every JSON string blanked (same length): tokens found in it are
    tokens of the document, never text inside a string."""
    return _JSON_STRING.sub(lambda m: '"' + " " * (len(m.group()) - 2) + '"', text)


def _json_locate(text: str, what) -> tuple[int, int]:
    """(line, col) of a refused token or duplicate key; (0, 0) when it cannot be told."""
    if not what:
        return (0, 0)
    kind, value = what
    if kind == "key":  # a duplicate: its position only when the key occurs exactly twice as a key
        spelled = re.compile(re.escape(json.dumps(value, ensure_ascii=False)) + r"\s*:")
        hits = [m.start() for m in spelled.finditer(text)]
        return line_col(text, hits[1]) if len(hits) == 2 else (0, 0)
    m = re.search(r"(?<![\w.+-])" + re.escape(value) + r"(?![\w.])", _blank_strings(text))
    return line_col(text, m.start()) if m else (0, 0)


def _json_too_deep(text: str) -> tuple[int, int]:
    depth = 0
    for m in re.finditer(r"[\[\]{}]", _blank_strings(text)):
        depth += 1 if m.group() in "[{" else -1
        if depth > MAX_DEPTH:
            return line_col(text, m.start())
    return (1, 1)

