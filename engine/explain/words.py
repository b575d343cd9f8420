"""Conditions, operands and capabilities as the engine's messages, tables and explanations word
them: `words(cond)` a phrase ("kv_cache_dtype in [fp8_e4m3] and platform == cuda"), `tests(cond,
env, user_set)` each test with whether it holds on a config, as explain lists them."""
from __future__ import annotations

from engine.language.conditions import All, Any, InputRef, Not, Product, Test, TrueCond, UserSet
from engine.values import show

_OPS = {"in": "in", "not_in": "not in", "lower_in": "in lower case in"}


def operand(value) -> str:
    """A comparison operand or a computed `set` value: an input's name, a product or quotient
    written out, or the constant as a word."""
    if isinstance(value, InputRef):
        return value.name
    return value.words() if isinstance(value, Product) else show(value)


def _test(t: Test) -> str:
    if t.op == "set":
        return f"{t.input} is {'set' if t.operand else 'unset'}"
    if t.op in _OPS:
        listed = ", ".join(show(v) for v in sorted(t.operand, key=repr))
        return f"{t.input} {_OPS[t.op]} [{listed}]"
    if t.op == "multiple_of":
        return f"{t.input} is a multiple of {operand(t.operand)}"
    return f"{t.input} {t.op} {operand(t.operand)}"


def _grouped(cond) -> str:
    """An item of an `all`: an `any` whose own items hold an `and` in parentheses."""
    text = words(cond)
    return f"({text})" if isinstance(cond, Any) and " and " in text else text


_WORDS = {
    TrueCond: lambda c: "always",
    Test: _test,
    UserSet: lambda c: f"{c.phase} backend {'set' if c.expected else 'not set'} by the user",
    All: lambda c: " and ".join(_grouped(item) for item in c.items),
    Any: lambda c: "any of (" + "; ".join(words(item) for item in c.items) + ")",
    Not: lambda c: f"not ({words(c.item)})",
}


def words(cond) -> str:
    return _WORDS[type(cond)](cond)


def tests(cond, env: dict, user_set: dict) -> list[tuple[bool, str]]:
    """(holds, words) per test of `cond` on a config: the items of an `all` one by one, any other
    condition as one test; none for a condition that always holds."""
    if isinstance(cond, TrueCond):
        return []
    if type(cond) is All:
        return [x for item in cond.items for x in tests(item, env, user_set)]
    return [(cond.eval(env, user_set), words(cond))]


def capability_words(cap, phase: str) -> str:
    """Where a backend runs in `phase` (a policy's `capabilities`), for a problem or a refusal."""
    conds = [words(e.when) for e in cap.runs if phase in e.phases]
    if not conds:
        return f"{cap.backend} does not run the {phase} phase"
    return f"{cap.backend} runs {phase} only where " + " or ".join(f"({c})" for c in conds)
