"""A parsed document checked against a shipped JSON Schema (the policy language's, or its test
files'), each error mapped back to the YAML position of the offending node. The shape only: what
the names and values mean is the language's (engine/language/parts.py)."""
from __future__ import annotations

import functools
import json
import os
import re

from engine.errors import Problem
from engine.values import shown
from engine.suggest import did_you_mean
from engine.files.document import Document

_validators: dict = {}


def validator(name: str = "policy"):
    """The validator of a shipped schema: "policy" (the language) or "tests" (policy test files)."""
    if name not in _validators:
        from engine.errors import import_required
        from engine.files.shipped import shipped_policy_dir

        # imported on first use (the slowest import of a load); missing: what to install
        jsonschema = import_required("jsonschema", "jsonschema")

        with open(os.path.join(shipped_policy_dir(), "schema", f"{name}.schema.json"), encoding="utf-8") as fh:
            schema = json.load(fh)
        # an integer is an int, never a float that happens to be whole: `version: 1.0` or
        # `minimum: 9.0` is a mistake to report, not a number to round (JSON Schema would accept it)
        types = jsonschema.Draft202012Validator.TYPE_CHECKER.redefine(
            "integer", lambda checker, x: isinstance(x, int) and not isinstance(x, bool))
        cls = jsonschema.validators.extend(jsonschema.Draft202012Validator, {"pattern": _pattern},
                                           type_checker=types)
        _validators[name] = cls(schema)
    return _validators[name]


def _pattern(validator, pattern, instance, schema):
    """JSON Schema's `pattern` with ECMA-262 anchors. jsonschema runs patterns with Python's re,
    where `$` also matches before a final newline: "bf16\n" would pass "^[a-z0-9]+$", and names
    end up in generated source and messages."""
    if validator.is_type(instance, "string") and not _ecma(pattern).search(instance):
        from jsonschema.exceptions import ValidationError

        yield ValidationError(f"{instance!r} does not match {pattern!r}")


@functools.lru_cache(maxsize=None)
def _ecma(pattern: str) -> re.Pattern:
    """`pattern` compiled with every `$` outside a character class meaning end of text (\\Z)."""
    out, i, in_class = [], 0, False
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            out.append(pattern[i: i + 2])
            i += 2
            continue
        if c == "[" and not in_class:
            in_class = True
        elif c == "]" and in_class:
            in_class = False
        out.append("\\Z" if c == "$" and not in_class else c)
        i += 1
    return re.compile("".join(out))


def schema_problems(doc: Document, name: str = "policy", code: str = "E201") -> list[Problem]:
    """Every schema violation of the document, each at the position of the offending node."""
    best: dict = {}  # (line, col) -> (schema depth, order, problem): one message per node
    for order, err in enumerate(validator(name).iter_errors(doc.data)):
        depth = len(err.absolute_schema_path)  # deeper = the more specific rule that failed
        for p in _explain(doc, err):
            if code != "E201":
                p = Problem(code, p.message, p.file, p.line, p.col, p.hint)
            key = (p.line, p.col)
            if key not in best or depth > best[key][0]:
                best[key] = (depth, order, p)
    return [p for _, _, p in sorted(best.values(), key=lambda x: x[1])]


def _where(path) -> str:
    return ".".join(str(p) for p in path) or "the document"


def _explain(doc: Document, err) -> list[Problem]:
    path = tuple(err.absolute_path)
    v = err.validator
    if v == "additionalProperties" and isinstance(err.instance, dict):
        allowed = list(err.schema.get("properties", {}))
        extras = [k for k in err.instance if k not in allowed]
        return [doc.problem("E201", f"unknown key {shown(k)} in {_where(path)}", path + (k,), key=True,
                            hint=did_you_mean(k, allowed) if allowed else "")
                for k in extras]
    if v == "required":
        missing = err.message.split("'")[1] if "'" in err.message else err.message
        return [doc.problem("E201", f"{_where(path)} is missing the required key '{missing}'", path,
                            key=bool(path))]
    if v == "dependentRequired":
        return [doc.problem("E201", f"in {_where(path)}: {err.message}", path, key=bool(path))]
    if v == "oneOf" and path and path[0] == "checks" and isinstance(err.instance, dict):
        both = "require" in err.instance and "allowed" in err.instance
        text = ("a check takes either 'require' or 'allowed', not both" if both
                else "a check needs 'require' or 'allowed'")
        return [doc.problem("E201", f"{_where(path)}: {text}", path, key=True)]
    if v == "anyOf" and len(path) == 3 and path[0] == "resolve" and isinstance(err.instance, dict):
        return [doc.problem("E201", f"{_where(path)}: a resolve rule needs set, log or require", path, key=True)]
    if v == "anyOf" and path == ("upstream",) and isinstance(err.instance, dict):
        return [doc.problem("E201", "upstream needs one of releases, commit or pr: what it models", path,
                            key=True)]
    if v in ("anyOf", "oneOf") and err.context:
        return _explain(doc, _best(err.context))
    if v == "not" and isinstance(err.instance, dict) and "type" in err.instance:
        return [doc.problem("E201", f"{_where(path)}: a {err.instance['type']} input takes no "
                            "values/minimum/maximum here", path, key=True)]
    if v == "pattern":
        return [doc.problem("E201", f"{_where(path)}: {shown(err.instance)} is not a valid name here "
                            f"(pattern {err.validator_value})", path)]
    hint = ""
    if v == "type" and isinstance(err.instance, float) and "integer" in str(err.validator_value) \
            and err.instance.is_integer():
        hint = f"write {int(err.instance)}: a whole number written with a decimal point is a float"
    return [doc.problem("E201", f"{_where(path)}: {_short(err.message)}", path, hint=hint)]


def _best(errors):
    """The most specific of the alternatives' errors: the deepest, a structural one over a type
    mismatch (an operator object with a typo beats "is not a string")."""
    return max(errors, key=lambda e: (len(e.absolute_path), e.validator != "type"))


def _short(message: str, limit: int = 200) -> str:
    return message if len(message) <= limit else message[: limit - 3] + "..."
