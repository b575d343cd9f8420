"""Message and log templates: `{field}`, `{field!r}` and, for backend sets, `{allowed:FORMAT}`.

Values render as SGLang's f-strings render them (str(); None as None, booleans as True/False), so
messages match SGLang's byte for byte. A backend set renders as SGLang renders `sorted(set)`:
`['flashmla_kv', 'flashmla_sparse']`; formats: list (that, the default), tuple, csv, or. The
format picks the object (the sorted list, the tuple, the joined text) and the conversion applies
to it as in an f-string: `{allowed!r:csv}` is `'a, b'`, `{allowed!r}` is `['a', 'b']`.

`render_field` is the one definition; the interpreter calls it for every field, the compiled
evaluator for every field whose value is known when compiling (sets, `{phase}`), and renders the
others with f-string placeholders that are equal to it for the plain values configs hold.
"""
from __future__ import annotations

import string

from engine.errors import EngineError
from engine.language.record import Frozen

SET_FORMATS = ("", "list", "tuple", "csv", "or")


class Field(Frozen):
    FIELDS = ("name", "spec", "conversion")
    __slots__ = FIELDS
    DEFAULTS = {"spec": "", "conversion": ""}


class Template(Frozen):
    FIELDS = ("text", "parts")  # parts: str literals and Field placeholders, in order
    __slots__ = FIELDS

    fields = property(lambda self: tuple(p for p in self.parts if isinstance(p, Field)))

    def render(self, ctx: dict) -> str:
        return "".join([p if isinstance(p, str) else render_field(ctx[p.name], p.spec, p.conversion)
                        for p in self.parts])

    def fstring(self, names: dict) -> str:
        """Python source of an f-string rendering this template over local variables `names`
        (field -> variable name). A set-valued field is looked up as (field, spec, conversion)
        and must name a variable holding its text as render_field gives it."""
        chunks = []
        for part in self.parts:
            if isinstance(part, str):
                chunks.append(part.replace("{", "{{").replace("}", "}}"))
            elif part.astuple() in names:  # (name, spec, conversion): already rendered text, placed as is
                chunks.append("{" + names[part.astuple()] + "}")
            elif isinstance(names[part.name], Literal):  # a value known when compiling: inline its text
                text = render_field(names[part.name].value, part.spec, part.conversion)
                chunks.append(text.replace("{", "{{").replace("}", "}}"))
            else:
                chunks.append("{" + names[part.name] + ("!r" if part.conversion == "r" else "") + "}")
        return "f" + repr("".join(chunks))


class Literal(Frozen):
    """A field whose value is known when compiling (e.g. {phase} in an unrolled per-phase check)."""

    FIELDS = ("value",)
    __slots__ = FIELDS


class TemplateSyntaxError(EngineError, ValueError):
    """A message or log template whose placeholders do not parse."""


def parse_template(text: str) -> Template:
    parts: list = []
    try:
        parsed = list(string.Formatter().parse(text))
    except ValueError as exc:
        raise TemplateSyntaxError(f"bad placeholder syntax: {exc} (write {{{{ and }}}} for literal braces)") from None
    for literal, name, spec, conversion in parsed:
        if literal:
            parts.append(literal)
        if name is None:
            continue
        if not name or not name.isidentifier():
            raise TemplateSyntaxError(f"placeholder {{{name}}} is not a field name")
        if conversion not in (None, "r", "s"):
            raise TemplateSyntaxError(f"placeholder {{{name}!{conversion}}}: only !r and !s are allowed")
        if spec and "{" in spec:
            raise TemplateSyntaxError(f"placeholder {{{name}:{spec}}}: nested fields are not allowed")
        parts.append(Field(name, spec or "", conversion if conversion == "r" else ""))
    return Template(text, tuple(parts))


def render_field(value, spec: str = "", conversion: str = "") -> str:
    """The text of one template field: a backend set (frozenset) as the object its format names
    (SGLang's sorted list by default, a tuple, or joined text), any other value as itself; then
    repr() for `!r`, else str(), as an f-string does."""
    if isinstance(value, frozenset):
        items = sorted(value)
        if spec not in SET_FORMATS:
            raise ValueError(f"unknown set format {spec!r}")
        value = {"tuple": tuple(items), "csv": ", ".join(items), "or": " or ".join(items)}.get(spec, items)
    elif spec:
        raise ValueError(f"only backend sets take a format, got {spec!r}")
    return repr(value) if conversion == "r" else str(value)
