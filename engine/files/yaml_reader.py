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

import math
import re

from engine.errors import EngineError, Problem, import_required
from engine.files.document import MAX_DEPTH, MAX_NODES, MAX_NUMBER_CHARS, Document
from engine.values import INT_MAX, INT_MIN, clip, shown, typed
from engine.files.reading import ReadError, line_col

yaml = import_required("yaml", "PyYAML")  # MissingDependency says what to install
ev = import_required("yaml.events", "PyYAML")

try:  # libyaml's parser is several times faster; both produce the same events and marks
    from yaml import CSafeLoader as _Loader
except ImportError:  # pragma: no cover - PyYAML built without libyaml
    from yaml import SafeLoader as _Loader


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
    composer = _Composer(display, sha256)
    try:
        for e in yaml.parse(text, Loader=loader):
            if not composer.add(e):
                break
    except yaml.MarkedYAMLError as exc:
        if loader is not yaml.SafeLoader and "maximum nesting depth" in str(exc.problem):
            raise _ScannerDepthLimit() from None
        composer.problems.append(_syntax_problem(exc, text, display))
    except yaml.reader.ReaderError as exc:  # a control character or similar in the text
        composer.problems.append(_character_problem(exc, text, display))
    except yaml.YAMLError as exc:
        composer.problems.append(Problem("E104", f"YAML syntax: {clip(str(exc), 200)}", display, 1, 1))
    except RecursionError:  # defensive: the composer above does not recurse
        composer.problems.append(Problem("E108", f"nesting deeper than {MAX_DEPTH} levels", display, 1, 1))
    if composer.problems:
        raise ReadError(composer.problems)
    return composer.doc


def _mark_of(e) -> tuple[int, int]:
    return (e.start_mark.line + 1, e.start_mark.column + 1)


class _Composer:
    """One Document composed from YAML events as they come: each node attached to its parent, its
    position kept, every problem recorded with its line:col. `add` returns False at a problem that
    ends the reading (the ones that do not, a bad or duplicate key, are recorded and the reading
    goes on)."""

    def __init__(self, display: str, sha256: str):
        self.doc = Document(None, display, sha256)
        self.display = display
        self.problems: list[Problem] = []
        self.stack: list[list] = []  # frames: [container, path, pending_key, key_marks]
        self.documents = 0
        self.nodes = 0

    def note(self, code: str, message: str, e) -> None:
        line, col = _mark_of(e)
        self.problems.append(Problem(code, message, self.display, line, col))

    def stop(self, code: str, message: str, e) -> bool:
        """A problem that ends the reading: recorded; False, for `add` to return."""
        self.note(code, message, e)
        return False

    def add(self, e) -> bool:
        """Take one event; False when the reading must stop."""
        if isinstance(e, ev.DocumentStartEvent):
            self.documents += 1
            return self.documents == 1 or self.stop("E110", "more than one YAML document in the file", e)
        if isinstance(e, (ev.StreamStartEvent, ev.StreamEndEvent, ev.DocumentEndEvent)):
            return True
        if isinstance(e, ev.AliasEvent):
            return self.stop("E107", f"alias '*{clip(e.anchor)}' is not allowed "
                                     "(anchors and aliases are refused)", e)
        if getattr(e, "anchor", None):
            return self.stop("E107", f"anchor '&{clip(e.anchor)}' is not allowed "
                                     "(anchors and aliases are refused)", e)
        if isinstance(e, ev.ScalarEvent):
            return self.counted(e) and self.scalar(e)
        if isinstance(e, (ev.SequenceStartEvent, ev.MappingStartEvent)):
            return self.counted(e) and self.open(e)
        if isinstance(e, (ev.SequenceEndEvent, ev.MappingEndEvent)):
            self.stack.pop()
        return True

    def counted(self, e) -> bool:
        """One more value; False past MAX_NODES."""
        self.nodes += 1
        return self.nodes <= MAX_NODES or self.stop("E113", f"more than {MAX_NODES} values in the document", e)

    def scalar(self, e) -> bool:
        try:
            value = _scalar(e)
        except _Refused as exc:
            return self.stop(exc.code, exc.message, e)
        self.attach(value, e)
        return True

    def open(self, e) -> bool:
        """A list or mapping starts: checked, attached, and the parent of what follows."""
        is_map = isinstance(e, ev.MappingStartEvent)
        what = "mapping" if is_map else "list"
        if e.tag not in (None, "!", _MAP if is_map else _SEQ):
            return self.stop("E106", f"tag '{_tag_text(e.tag)}' is not allowed on a {what}: {_NOT_ALLOWED}", e)
        if len(self.stack) >= MAX_DEPTH:
            return self.stop("E108", f"nesting deeper than {MAX_DEPTH} levels", e)
        if self.stack and isinstance(self.stack[-1][0], dict) and self.stack[-1][2] is _NO_KEY:
            return self.stop("E111", f"mapping keys must be plain strings, got a {what} "
                                     "(complex keys are not allowed)", e)
        container = {} if is_map else []
        path = self.attach(container, e)
        self.stack.append([container, path if path is not None else (), _NO_KEY, {}])
        return True

    def attach(self, value, e) -> tuple | None:
        """Place a composed node into its parent; returns the node's path (None for a key, or a
        node refused)."""
        doc = self.doc
        if not self.stack:
            doc.data = value
            doc.positions[()] = _mark_of(e)
            return ()
        frame = self.stack[-1]
        container, path = frame[0], frame[1]
        if isinstance(container, list):
            child = path + (len(container),)
            container.append(value)
            doc.positions[child] = _mark_of(e)
            return child
        if frame[2] is _NO_KEY:  # this node is a key
            self.key(frame, value, e)
            return None
        key = frame[2]
        frame[2] = _NO_KEY
        if key is _BAD_KEY:
            return None
        child = path + (key,)
        container[key] = value
        doc.positions[child] = _mark_of(e)
        doc.key_positions[child] = frame[3][key]
        return child

    def key(self, frame: list, value, e) -> None:
        """A mapping's next key: kept as the frame's pending key, or _BAD_KEY (its value is then
        dropped) when it is not a string or repeats one."""
        if not isinstance(value, str) or isinstance(value, bool):
            self.note("E111", f"mapping keys must be plain strings, got {typed(value)} (quote it)", e)
            frame[2] = _BAD_KEY
        elif value in frame[3]:
            first = frame[3][value]
            self.note("E105", f"duplicate key {shown(value)} (first at line {first[0]})", e)
            frame[2] = _BAD_KEY
        else:
            frame[3][value] = _mark_of(e)
            frame[2] = value


def _syntax_problem(exc, text: str, display: str) -> Problem:
    """A YAML syntax error at its mark, a tab there named."""
    mark = exc.problem_mark or exc.context_mark
    line, col = (mark.line + 1, mark.column + 1) if mark else (0, 0)
    what = " ".join(x for x in (exc.context, exc.problem) if x)
    if mark and _char_at(text, mark.line, mark.column) == "\t":
        what += " (a tab: YAML indents with spaces only)"
    return Problem("E104", f"YAML syntax: {what}", display, line, col)


def _character_problem(exc, text: str, display: str) -> Problem:
    line, col = line_col(text, exc.position)
    char = exc.character if isinstance(exc.character, str) else chr(exc.character)
    return Problem("E104", f"YAML syntax: unacceptable character #x{ord(char):04x}: {exc.reason}",
                   display, line, col)


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
