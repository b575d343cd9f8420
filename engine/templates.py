"""Message and log templates: `{field}`, `{field!r}` and, for backend sets, `{allowed:FORMAT}`.

Values render as SGLang's f-strings render them (str(); None as None, booleans as True/False), so
messages match SGLang's byte for byte. A backend set renders as SGLang renders `sorted(set)`:
`['flashmla_kv', 'flashmla_sparse']`; formats: list (that, the default), tuple, csv, or.
"""
from __future__ import annotations

import string
from dataclasses import dataclass

SET_FORMATS = ("", "list", "tuple", "csv", "or")


@dataclass(frozen=True)
class Field:
    name: str
    spec: str = ""
    conversion: str = ""


@dataclass(frozen=True)
class Template:
    text: str
    parts: tuple  # str literals and Field placeholders, in order

    @property
    def fields(self) -> tuple:
        return tuple(p for p in self.parts if isinstance(p, Field))

    def render(self, ctx: dict) -> str:
        out = []
        for part in self.parts:
            if isinstance(part, str):
                out.append(part)
            else:
                value = ctx[part.name]
                out.append(render_set(value, part.spec) if part.spec or isinstance(value, frozenset)
                           else (repr(value) if part.conversion == "r" else str(value)))
        return "".join(out)

    def fstring(self, names: dict) -> str:
        """Python source of an f-string rendering this template over local variables `names`
        (field -> variable name; set-valued fields must name a pre-rendered string variable)."""
        chunks = []
        for part in self.parts:
            if isinstance(part, str):
                chunks.append(part.replace("{", "{{").replace("}", "}}"))
            else:
                var = names[(part.name, part.spec)] if (part.name, part.spec) in names else names[part.name]
                if isinstance(var, Literal):  # a value known when compiling: inline its text
                    text = repr(var.value) if part.conversion == "r" else str(var.value)
                    chunks.append(text.replace("{", "{{").replace("}", "}}"))
                else:
                    chunks.append("{" + var + ("!r" if part.conversion == "r" else "") + "}")
        return "f" + repr("".join(chunks))


@dataclass(frozen=True)
class Literal:
    """A field whose value is known when compiling (e.g. {phase} in an unrolled per-phase check)."""

    value: object


class TemplateSyntaxError(ValueError):
    pass


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


def render_set(values, spec: str = "") -> str:
    items = sorted(values)
    if spec in ("", "list"):
        return repr(items)
    if spec == "tuple":
        return repr(tuple(items))
    if spec == "csv":
        return ", ".join(items)
    if spec == "or":
        return " or ".join(items)
    raise ValueError(f"unknown set format {spec!r}")
