"""How values read in messages, tables and explanations, in one convention: booleans are true and
false everywhere (the policy language's spelling); `show` gives a value as a word (unset for null,
for tables, explanations and config listings), `shown` quotes a value read from a file, a config
or a flag in a message (null, true, 'text', clipped), `kind` names its type (a boolean, a mapping),
`typed` both. Also the one escaping every text output goes through, integers parsed from text
with a bound, and the one spelling of an integer key."""
from __future__ import annotations

import re


def show(value) -> str:
    """A value as a word: unset for null, true/false, else str() (enum names print bare), its line
    breaks escaped (one_line)."""
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "true" if value else "false"
    return one_line(str(value))


# Every character that ends a line somewhere: a terminal (\n, \v, \f), Python's str.splitlines
# (\x1c-\x1e, \x85), a log viewer or editor (\u2028, \u2029). A field of text output (a model
# path, a config key or value, a policy message, a file path) holding one could print a line of
# its own that reads like a verdict, so fields are rendered through one_line.
_BREAKS = re.compile("[\n\r\v\f\x1c-\x1e\x85\u2028\u2029]")


def one_line(text: str) -> str:
    """`text` as one line: every line break in it shown as an escape (\\n, \\x0d, \\x1c,
    \\u2028), as escape() shows the other controls."""
    if not isinstance(text, str):
        text = str(text)
    return _BREAKS.sub(lambda m: "\\n" if m.group(0) == "\n" else _escape_char(m), text)


def clip(text: str, limit: int | None = 80) -> str:
    """`text` cut to about `limit` characters for a message: a key or value from a hostile file
    can be a megabyte long, and a message must stay one readable line. None: the whole text."""
    if limit is None or len(text) <= limit:
        return text
    return f"{text[: limit - 3]}... ({len(text)} characters)"


def shown(value, limit: int | None = 80) -> str:
    """A value from a file, a config or a flag as a message quotes it: null, true and false as the
    policy language writes them, anything else by repr() ('fa3', 10, ['a']), clipped (see clip).
    Never raises: an API caller's value may be an integer too long to print or nested too deep
    for repr."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    try:
        text = repr(value)
    except Exception:  # ValueError (int digits limit), RecursionError, a failing __repr__
        text = (f"<an integer of {value.bit_length()} bits>" if isinstance(value, int)
                else f"<a {type(value).__name__}>")
    return clip(text, limit)


_KINDS = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list",
          dict: "a mapping", type(None): "null"}


def kind(value) -> str:
    """The type of a value as messages name it: a boolean, an integer, a number, a string, a list,
    a mapping, null; else the Python type (a bytes)."""
    return _KINDS.get(type(value)) or f"a {type(value).__name__}"


def typed(value, limit: int | None = 80) -> str:
    """kind and value together, as in "got a boolean true" (null alone: "got null")."""
    return "null" if value is None else f"{kind(value)} {shown(value, limit)}"


# Characters a terminal acts on instead of showing: C0 controls but newline and tab, DEL, C1
# controls, and the bidirectional overrides and isolates (they reorder what is shown). A policy
# message, a config key or a model path holding one could redraw the line (CR), recolour it
# (ESC) or print a fake verdict, so text output shows them as escapes.
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def _escape_char(m: re.Match) -> str:
    code = ord(m.group(0))
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def escape(text: str) -> str:
    """`text` with every terminal control character shown as a backslash escape (\\x1b, \\r,
    \\x9b, \\u202e); newline and tab are kept. The CLI writes all its text output through this."""
    return _UNSAFE.sub(_escape_char, text)


def escape_json(text: str) -> str:
    """A JSON document's text with the controls json.dumps(ensure_ascii=False) leaves raw (DEL,
    C1, bidi controls; C0 is already escaped) written as \\u escapes: the same JSON value."""
    return _UNSAFE.sub(lambda m: f"\\u{ord(m.group(0)):04x}", text)


INT_MIN, INT_MAX = -(2 ** 63), 2 ** 63 - 1  # the range of an int input (and of integers in files)
MAX_INT_DIGITS = 20  # 64-bit values have at most 19 digits; anything longer is refused unread
_INT = re.compile(r"[+-]?[0-9]+")


# an integer written the one way a key is: ASCII digits, no leading zero, an optional minus (re's
# \d would take any Unicode digit, and int() also takes blanks, '+', '_' and leading zeros: '010'
# and '１０' both 10)
CANONICAL_INT = re.compile(r"0|-?[1-9][0-9]{0,18}")


def int_meant(text: str) -> int | None:
    """The integer another spelling of one means to int() ('010', ' 10', '1_0', '１０'), for a
    hint, or None when it is no integer at all."""
    if len(text) > 64:
        return None
    try:
        return int(text)
    except ValueError:
        return None


def parse_int(text: str) -> int | None:
    """The integer written in `text` (decimal, optional sign, surrounding blanks allowed), or None
    when it is not one or has more than MAX_INT_DIGITS digits (int() of a 5000-digit text raises
    ValueError past Python's digit limit, and costs quadratic time below it)."""
    if not isinstance(text, str):
        return None
    text = text.strip()
    if len(text) > MAX_INT_DIGITS + 1 or not _INT.fullmatch(text):
        return None
    return int(text)
