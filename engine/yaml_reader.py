"""Safe reading of policy and config files, keeping the position of every node.

PyYAML's own loaders build objects recursively, expand aliases and, for unsafe loaders, run code.
Here the event stream is composed iteratively into plain data (dict, list, str, int, float, bool,
None), so nothing but data is ever built, nesting is bounded, anchors and aliases are refused (no
alias bombs), duplicate keys are caught, and a map of path -> (line, col) lets every later problem
(schema, names, values) point at its file:line:col.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field

import yaml
from yaml import events as ev

from .errors import HisparseError, Problem

try:  # libyaml's parser is several times faster; both produce the same events and marks
    from yaml import CSafeLoader as _Loader
except ImportError:  # pragma: no cover - PyYAML built without libyaml
    from yaml import SafeLoader as _Loader

DEFAULT_MAX_BYTES = 1 << 20
MAX_DEPTH = 64

_STR = "tag:yaml.org,2002:str"
# plain data only; anything else (python/object, binary, set, timestamp as a type ...) is refused
_SCALAR_TAGS = {
    _STR,
    "tag:yaml.org,2002:int",
    "tag:yaml.org,2002:float",
    "tag:yaml.org,2002:bool",
    "tag:yaml.org,2002:null",
}
_COLLECTION_TAGS = {None, "!", "tag:yaml.org,2002:map", "tag:yaml.org,2002:seq"}

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


class ReadError(HisparseError):
    """A file could not be read or parsed (the caller re-raises as PolicyError or ConfigError)."""


def read_bytes(path: str, display: str, max_bytes: int = DEFAULT_MAX_BYTES) -> bytes:
    """The file's bytes, refusing directories, unreadable files and files over `max_bytes`."""
    try:
        if os.path.isdir(path):
            raise IsADirectoryError("is a directory")
        with open(path, "rb") as fh:
            data = fh.read(max_bytes + 1)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise ReadError([Problem("E101", f"cannot read file: {reason}", display)]) from None
    if len(data) > max_bytes:
        raise ReadError(
            [Problem("E102", f"file is larger than the limit of {max_bytes} bytes", display,
                     hint="raise the limit with HISPARSE_MAX_FILE_BYTES if this file is genuine")]
        )
    return data


def decode_utf8(data: bytes, display: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        before = data[: exc.start]
        line = before.count(b"\n") + 1
        col = exc.start - (before.rfind(b"\n") + 1) + 1
        raise ReadError(
            [Problem("E103", f"not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})",
                     display, line, col)]
        ) from None


def parse_yaml(text: str, display: str, sha256: str = "") -> Document:
    """Compose YAML `text` into a Document of plain data, or raise ReadError with every problem
    found before parsing had to stop."""
    doc = Document(None, display, sha256)
    problems: list[Problem] = []
    stack: list[list] = []  # frames: [container, path, pending_key, key_marks]
    documents = 0

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
                     f"mapping keys must be plain strings, got {type(value).__name__} {value!r} "
                     "(quote it)", e)
                frame[2] = _BAD_KEY
                return None
            if value in frame[3]:
                first = frame[3][value]
                fail("E105", f"duplicate key '{value}' (first at line {first[0]})", e)
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
        for e in yaml.parse(text, Loader=_Loader):
            if isinstance(e, ev.DocumentStartEvent):
                documents += 1
                if documents > 1:
                    fail("E110", "more than one YAML document in the file", e)
                    break
                continue
            if isinstance(e, (ev.StreamStartEvent, ev.StreamEndEvent, ev.DocumentEndEvent)):
                continue
            if isinstance(e, ev.AliasEvent):
                fail("E107", f"alias '*{e.anchor}' is not allowed (anchors and aliases are refused)", e)
                break
            if getattr(e, "anchor", None):
                fail("E107", f"anchor '&{e.anchor}' is not allowed (anchors and aliases are refused)", e)
                break
            if isinstance(e, ev.ScalarEvent):
                value = _scalar(e)
                if value is _REFUSED:
                    fail("E106", f"tag '{e.tag}' is not allowed: only plain data (strings, numbers, "
                                 "booleans, null, lists, mappings)", e)
                    break
                attach(value, e)
            elif isinstance(e, (ev.SequenceStartEvent, ev.MappingStartEvent)):
                if e.tag not in _COLLECTION_TAGS:
                    fail("E106", f"tag '{e.tag}' is not allowed: only plain data (strings, numbers, "
                                 "booleans, null, lists, mappings)", e)
                    break
                if len(stack) >= MAX_DEPTH:
                    fail("E108", f"nesting deeper than {MAX_DEPTH} levels", e)
                    break
                is_map = isinstance(e, ev.MappingStartEvent)
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
        problems.append(Problem("E104", f"YAML syntax: {exc}", display, 1, 1))
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
_REFUSED = _Marker("<refused>")


def _scalar(e: ev.ScalarEvent):
    if e.tag in (None, "!"):
        plain, _ = e.implicit
        tag = _resolver.resolve(yaml.ScalarNode, e.value, (plain, False)) if plain else _STR
    else:
        tag = e.tag
    if tag == "tag:yaml.org,2002:timestamp":
        return e.value  # a date-looking word stays the text the author wrote
    if tag not in _SCALAR_TAGS:
        return _REFUSED
    node = yaml.ScalarNode(tag, e.value, e.start_mark, e.end_mark, e.style)
    try:
        return _constructor.construct_object(node, deep=True)
    except (yaml.YAMLError, ValueError):
        return _REFUSED


def parse_json(text: str, display: str, sha256: str = "") -> Document:
    """JSON with duplicate keys refused; positions only for the whole document."""

    def pairs(items):
        out = {}
        for k, v in items:
            if k in out:
                raise ValueError(f"duplicate key '{k}'")
            out[k] = v
        return out

    try:
        data = json.loads(text, object_pairs_hook=pairs)
    except json.JSONDecodeError as exc:
        raise ReadError([Problem("E104", f"JSON syntax: {exc.msg}", display, exc.lineno, exc.colno)]) from None
    except ValueError as exc:
        raise ReadError([Problem("E105", str(exc), display, 1, 1)]) from None
    except RecursionError:
        raise ReadError([Problem("E108", "nesting too deep", display, 1, 1)]) from None
    doc = Document(data, display, sha256)
    doc.positions[()] = (1, 1)
    return doc


def load_document(path: str, display: str | None = None, max_bytes: int | None = None) -> Document:
    """Read, decode and parse one file (JSON by its .json suffix, YAML otherwise)."""
    display = display or path
    if max_bytes is None:
        max_bytes = max_file_bytes()
    data = read_bytes(path, display, max_bytes)
    digest = hashlib.sha256(data).hexdigest()
    text = decode_utf8(data, display)
    if path.endswith(".json"):
        return parse_json(text, display, digest)
    return parse_yaml(text, display, digest)


def max_file_bytes() -> int:
    raw = os.environ.get("HISPARSE_MAX_FILE_BYTES")
    if raw and raw.isdigit() and int(raw) > 0:
        return int(raw)
    return DEFAULT_MAX_BYTES
