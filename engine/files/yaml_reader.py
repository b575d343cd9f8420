"""Safe reading of policy and config files, keeping the position of every node.

PyYAML's own loaders build objects recursively, expand aliases and, for unsafe loaders, run code.
Here the event stream is composed iteratively into plain data (dict, list, str, int, float, bool,
None), so nothing but data is ever built, nesting is bounded, anchors and aliases are refused (no
alias bombs), duplicate keys are caught, and a map of path -> (line, col) lets every later problem
(schema, names, values) point at its file:line:col.

Limits, so that a hostile file costs a bounded time and memory and gets one clear message:
- a file is a regular file (a FIFO would block the reader, a device never ends) of at most
  HISPARSE_MAX_FILE_BYTES bytes (1 MiB);
- UTF-8 text (a leading byte-order mark is skipped), no NUL bytes;
- at most MAX_DEPTH levels of nesting and MAX_NODES values (a policy file holds a few hundred);
- numbers are finite and integers fit in 64 bits (a number's text is at most MAX_NUMBER_CHARS
  characters: YAML's base-60 integers would otherwise cost quadratic time to build);
- only plain data tags; no merge keys (`<<`, they copy mappings like aliases do).
JSON files (configs, --batch lines) get the same limits.
"""
from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass, field

import yaml
from yaml import events as ev

from engine.errors import EngineError, Problem
from engine.values import INT_MAX, INT_MIN, clip, shown, typed
from engine.files.reading import (DEFAULT_MAX_BYTES, ReadError, decode_utf8, file_signature, max_file_bytes,  # noqa: F401
                      read_bytes, read_snapshot)  # (re-exported: callers read files through this module)

try:  # libyaml's parser is several times faster; both produce the same events and marks
    from yaml import CSafeLoader as _Loader
except ImportError:  # pragma: no cover - PyYAML built without libyaml
    from yaml import SafeLoader as _Loader

MAX_DEPTH = 64
MAX_NODES = 50_000
MAX_NUMBER_CHARS = 64

_STR = "tag:yaml.org,2002:str"
_INT = "tag:yaml.org,2002:int"
_FLOAT = "tag:yaml.org,2002:float"
_BOOL = "tag:yaml.org,2002:bool"
_NULL = "tag:yaml.org,2002:null"
_MAP = "tag:yaml.org,2002:map"
_SEQ = "tag:yaml.org,2002:seq"
# plain data only; anything else (python/object, binary, set, omap, merge ...) is refused
_SCALAR_TAGS = {_STR, _INT, _FLOAT, _BOOL, _NULL}
_NOT_ALLOWED = ("only plain data (strings, numbers, booleans, null, lists, mappings)")

_resolver = yaml.resolver.Resolver()
_constructor = yaml.constructor.SafeConstructor()

Path = tuple  # a path into the data: keys and list indices


@dataclass
class Document:
    """Parsed file: plain `data`, where each node sits, and the identity of the bytes."""

    data: object
    file: str  # display name used in messages
    sha256: str
    positions: dict = field(default_factory=dict)  # path -> (line, col) of the value
    key_positions: dict = field(default_factory=dict)  # path -> (line, col) of the mapping key

    def pos(self, path: Path, key: bool = False) -> tuple[int, int]:
        """Position of `path`, or of its nearest ancestor that has one (1-based)."""
        table = self.key_positions if key else self.positions
        path = tuple(path)
        while path:
            if path in table:
                return table[path]
            if key and path in self.positions:
                return self.positions[path]
            path = path[:-1]
        return self.positions.get((), (1, 1))

    def problem(self, code: str, message: str, path: Path = (), key: bool = False, hint: str = "") -> Problem:
        line, col = self.pos(path, key)
        return Problem(code, message, self.file, line, col, hint)


# -- YAML ------------------------------------------------------------------------------------------
class _Refused(EngineError):
    """A scalar that is not plain data: (code, message)."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


def parse_yaml(text: str, display: str, sha256: str = "", _loader=_Loader) -> Document:
    """Compose YAML `text` into a Document of plain data, or raise ReadError with every problem
    found before parsing had to stop."""
    try:
        return _parse_yaml(text, display, sha256, _loader)
    except _ScannerDepthLimit:
        # libyaml 0.2.6+ refuses 1000 nested flow levels while scanning ahead, before this composer
        # sees level 65; the pure-Python parser scans lazily, so the error (E108) and its position
        # are the same whichever libyaml is installed
        return _parse_yaml(text, display, sha256, yaml.SafeLoader)


class _ScannerDepthLimit(EngineError):
    pass


def _parse_yaml(text: str, display: str, sha256: str, loader) -> Document:
    doc = Document(None, display, sha256)
    problems: list[Problem] = []
    stack: list[list] = []  # frames: [container, path, pending_key, key_marks]
    documents = 0
    nodes = 0

    def mark_of(e) -> tuple[int, int]:
        return (e.start_mark.line + 1, e.start_mark.column + 1)

    def fail(code: str, message: str, e) -> None:
        line, col = mark_of(e)
        problems.append(Problem(code, message, display, line, col))

    def attach(value, e) -> tuple:
        """Place a composed node into its parent; returns the node's path (None when refused)."""
        if not stack:
            doc.data = value
            doc.positions[()] = mark_of(e)
            return ()
        frame = stack[-1]
        container, path = frame[0], frame[1]
        if isinstance(container, list):
            child = path + (len(container),)
            container.append(value)
            doc.positions[child] = mark_of(e)
            return child
        if frame[2] is _NO_KEY:  # this node is a key
            if not isinstance(value, str) or isinstance(value, bool):
                fail("E111",
                     f"mapping keys must be plain strings, got {typed(value)} "
                     "(quote it)", e)
                frame[2] = _BAD_KEY
                return None
            if value in frame[3]:
                first = frame[3][value]
                fail("E105", f"duplicate key {shown(value)} (first at line {first[0]})", e)
                frame[2] = _BAD_KEY
                return None
            frame[3][value] = mark_of(e)
            frame[2] = value
            return None
        key = frame[2]
        frame[2] = _NO_KEY
        if key is _BAD_KEY:
            return None
        child = path + (key,)
        container[key] = value
        doc.positions[child] = mark_of(e)
        doc.key_positions[child] = frame[3][key]
        return child

    try:
        for e in yaml.parse(text, Loader=loader):
            if isinstance(e, ev.DocumentStartEvent):
                documents += 1
                if documents > 1:
                    fail("E110", "more than one YAML document in the file", e)
                    break
                continue
            if isinstance(e, (ev.StreamStartEvent, ev.StreamEndEvent, ev.DocumentEndEvent)):
                continue
            if isinstance(e, ev.AliasEvent):
                fail("E107", f"alias '*{clip(e.anchor)}' is not allowed (anchors and aliases are refused)", e)
                break
            if getattr(e, "anchor", None):
                fail("E107", f"anchor '&{clip(e.anchor)}' is not allowed (anchors and aliases are refused)", e)
                break
            if isinstance(e, (ev.ScalarEvent, ev.SequenceStartEvent, ev.MappingStartEvent)):
                nodes += 1
                if nodes > MAX_NODES:
                    fail("E113", f"more than {MAX_NODES} values in the document", e)
                    break
            if isinstance(e, ev.ScalarEvent):
                try:
                    value = _scalar(e)
                except _Refused as exc:
                    fail(exc.code, exc.message, e)
                    break
                attach(value, e)
            elif isinstance(e, (ev.SequenceStartEvent, ev.MappingStartEvent)):
                is_map = isinstance(e, ev.MappingStartEvent)
                if e.tag not in (None, "!", _MAP if is_map else _SEQ):
                    fail("E106", f"tag '{_tag_text(e.tag)}' is not allowed on a "
                                 f"{'mapping' if is_map else 'list'}: {_NOT_ALLOWED}", e)
                    break
                if len(stack) >= MAX_DEPTH:
                    fail("E108", f"nesting deeper than {MAX_DEPTH} levels", e)
                    break
                if stack and isinstance(stack[-1][0], dict) and stack[-1][2] is _NO_KEY:
                    fail("E111", "mapping keys must be plain strings, got a "
                                 f"{'mapping' if is_map else 'list'} (complex keys are not allowed)", e)
                    break
                container = {} if is_map else []
                path = attach(container, e)
                stack.append([container, path if path is not None else (), _NO_KEY, {}])
            elif isinstance(e, (ev.SequenceEndEvent, ev.MappingEndEvent)):
                stack.pop()
    except yaml.MarkedYAMLError as exc:
        if loader is not yaml.SafeLoader and "maximum nesting depth" in str(exc.problem):
            raise _ScannerDepthLimit() from None
        mark = exc.problem_mark or exc.context_mark
        line, col = (mark.line + 1, mark.column + 1) if mark else (0, 0)
        what = " ".join(x for x in (exc.context, exc.problem) if x)
        if mark and _char_at(text, mark.line, mark.column) == "\t":
            what += " (a tab: YAML indents with spaces only)"
        problems.append(Problem("E104", f"YAML syntax: {what}", display, line, col))
    except yaml.reader.ReaderError as exc:  # a control character or similar in the text
        before = text[: exc.position]
        line, col = before.count("\n") + 1, exc.position - (before.rfind("\n") + 1) + 1
        char = exc.character if isinstance(exc.character, str) else chr(exc.character)
        problems.append(Problem("E104", f"YAML syntax: unacceptable character #x{ord(char):04x}: "
                                        f"{exc.reason}", display, line, col))
    except yaml.YAMLError as exc:
        problems.append(Problem("E104", f"YAML syntax: {clip(str(exc), 200)}", display, 1, 1))
    except RecursionError:  # defensive: the composer above does not recurse
        problems.append(Problem("E108", f"nesting deeper than {MAX_DEPTH} levels", display, 1, 1))
    if problems:
        raise ReadError(problems)
    return doc


def _char_at(text: str, line: int, column: int) -> str:
    lines = text.split("\n", line + 1)
    return lines[line][column: column + 1] if line < len(lines) else ""


class _Marker:
    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


_NO_KEY = _Marker("<no key>")
_BAD_KEY = _Marker("<refused key>")

_NUMBERS = {_INT: "an integer", _FLOAT: "a number"}
_TYPE_WORDS = {_INT: "!!int", _FLOAT: "!!float", _BOOL: "!!bool", _NULL: "!!null"}


def _scalar(e: ev.ScalarEvent):
    """The plain value of a scalar event; raises _Refused for anything that is not plain data."""
    if e.tag in (None, "!"):
        plain, _ = e.implicit
        if not plain:
            return e.value  # quoted: a string, whatever it looks like
        if len(e.value) > MAX_NUMBER_CHARS:
            return _long_plain(e.value)
        tag = _resolver.resolve(yaml.ScalarNode, e.value, (True, False))
    else:
        tag = e.tag
        # an explicit type tag only confirms what the text already is (!!int 12, !!str 12);
        # PyYAML would otherwise build odd values (!!null x -> None) or fail inside (!!bool maybe)
        implicit_tag = _resolver.resolve(yaml.ScalarNode, e.value, (True, False)) \
            if tag in _TYPE_WORDS else tag
        if implicit_tag != tag and not (tag == _FLOAT and implicit_tag == _INT):
            raise _Refused("E104", f"{_TYPE_WORDS[tag]} {shown(e.value)}: the text is not a valid "
                                   f"{_TYPE_WORDS[tag][2:]}")
    if tag == "tag:yaml.org,2002:timestamp":
        return e.value  # a date-looking word stays the text the author wrote
    if tag == "tag:yaml.org,2002:merge":
        raise _Refused("E106", "merge keys ('<<') are not allowed: write the keys out "
                               "(quote '<<' for a key of that name)")
    if tag == "tag:yaml.org,2002:value":
        raise _Refused("E106", "'=' is YAML's value key, not allowed (quote it for the text '=')")
    if tag not in _SCALAR_TAGS:
        raise _Refused("E106", f"tag '{_tag_text(tag)}' is not allowed: {_NOT_ALLOWED}")
    if tag in _NUMBERS and len(e.value) > MAX_NUMBER_CHARS:
        raise _Refused("E112", f"{_NUMBERS[tag]} written with {len(e.value)} characters; numbers are "
                               f"limited to {MAX_NUMBER_CHARS} characters")
    node = yaml.ScalarNode(tag, e.value, e.start_mark, e.end_mark, e.style)
    try:
        value = _constructor.construct_object(node, deep=True)
    except Exception:  # PyYAML's constructors raise ValueError, KeyError, IndexError ...
        raise _Refused("E104", f"{shown(e.value)} is not a valid {tag.rsplit(':', 1)[-1]}") from None
    _check_number(value, e.value)
    return value


def _long_plain(text: str) -> str:
    """A plain scalar too long to be a number: its text, or E112 when YAML would read a number.
    Only int and float resolve for text this long; their base-60 forms are told apart here, by
    splitting, because PyYAML's regex for them costs memory in proportion to the text."""
    if ":" in text:
        head, *middle, last = text.split(":")
        numeric = bool(all(_BASE60_PART.fullmatch(p) for p in middle) and (
            (_BASE60_INT_HEAD.fullmatch(head) and _BASE60_PART.fullmatch(last))
            or (_BASE60_FLOAT_HEAD.fullmatch(head) and _BASE60_FLOAT_LAST.fullmatch(last))))
        tag = _INT if numeric else _STR
    else:
        tag = _resolver.resolve(yaml.ScalarNode, text, (True, False))
    if tag in _NUMBERS:
        raise _Refused("E112", f"{_NUMBERS[tag]} written with {len(text)} characters; numbers are "
                               f"limited to {MAX_NUMBER_CHARS} characters")
    return text


# YAML 1.1's base-60 numbers (190:20:30, 190:20:30.15), part by part
_BASE60_INT_HEAD = re.compile(r"[-+]?[1-9][0-9_]*")
_BASE60_FLOAT_HEAD = re.compile(r"[-+]?[0-9][0-9_]*")
_BASE60_PART = re.compile(r"[0-5]?[0-9]")
_BASE60_FLOAT_LAST = re.compile(r"[0-5]?[0-9]\.[0-9_]*")


def _tag_text(tag: str) -> str:
    """A tag as it is usually written: !!python/object/apply:os.system, not its long form."""
    return clip("!!" + tag[len("tag:yaml.org,2002:"):] if tag.startswith("tag:yaml.org,2002:") else tag)


def _check_number(value, text: str) -> None:
    if isinstance(value, bool):
        return
    if isinstance(value, int) and not INT_MIN <= value <= INT_MAX:
        raise _Refused("E112", f"integer {clip(text, 40)} does not fit in 64 bits")
    if isinstance(value, float) and not math.isfinite(value):
        raise _Refused("E112", f"{clip(text, 40)} is not a finite number (NaN and infinities are not "
                               "allowed)")


# -- JSON ------------------------------------------------------------------------------------------
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
            doc.key_positions[(key,)] = _text_position(text, m.start())
            doc.positions[(key,)] = _text_position(text, value_at)


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
        line, col = _text_position(text, m.start()) if m else (0, 0)
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
        return _text_position(text, hits[1]) if len(hits) == 2 else (0, 0)
    m = re.search(r"(?<![\w.+-])" + re.escape(value) + r"(?![\w.])", _blank_strings(text))
    return _text_position(text, m.start()) if m else (0, 0)


def _json_too_deep(text: str) -> tuple[int, int]:
    depth = 0
    for m in re.finditer(r"[\[\]{}]", _blank_strings(text)):
        depth += 1 if m.group() in "[{" else -1
        if depth > MAX_DEPTH:
            return _text_position(text, m.start())
    return (1, 1)


def _text_position(text: str, index: int) -> tuple[int, int]:
    before = text[:index]
    return before.count("\n") + 1, index - (before.rfind("\n") + 1) + 1


# -- files -----------------------------------------------------------------------------------------
def load_document(path: str, display: str | None = None, max_bytes: int | None = None,
                  regular_only: bool = True) -> Document:
    """Read, decode and parse one file (JSON by its .json suffix, YAML otherwise)."""
    display = display or path
    if max_bytes is None:
        max_bytes = max_file_bytes()
    data = read_bytes(path, display, max_bytes, regular_only)
    digest = hashlib.sha256(data).hexdigest()
    text = decode_utf8(data, display)
    if path.endswith(".json"):
        return parse_json(text, display, digest)
    return parse_yaml(text, display, digest)
