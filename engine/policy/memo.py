"""Memoised evaluation: one read-only Decision per distinct config, shared by every caller.

A server asks about the same few configs again and again, and a decision is a pure function of
the config, so `Policy.evaluate` looks the config up before evaluating it. The key is the
config's length and, per input, the value given (or a marker for a missing key) and its exact
class, so a hit needs only the key's construction and one dict look-up:
- the class makes 1, 1.0 and True different keys (1 == True == 1.0 in Python, but only True is a
  boolean and only 1 an integer); a str subclass (an enum member) is a different key too;
- only configs that are plain dicts with canonical keys and values of the exact plain types are
  stored, and for those the length equals the number of inputs given: a config with any other
  key (a flag spelling, a typo) has a longer length than its values account for, so its key can
  never equal a stored one;
- a value that cannot be hashed, or whose comparison raises, goes to the ordinary path, which says
  what is wrong with it.
The table holds at most MEMO_SIZE decisions per policy and starts again when full.
"""
from __future__ import annotations

from types import MappingProxyType

MEMO_SIZE = 16384


class _Missing:
    __slots__ = ()

    def __repr__(self):
        return "<missing>"


_M = _Missing()
_PLAIN = frozenset({str, int, bool, type(None), _Missing})


def memoised(policy, slow):
    """The memoised evaluate(config) of `policy`, falling back to `slow` (the compiled evaluator)."""
    memo: dict = {}
    names = policy.input_names
    keys = frozenset(names)
    n = len(names)

    def miss(cfg, key):
        d = slow(cfg)
        if cfg.keys() <= keys and all(c in _PLAIN for c in key[n + 1:]):
            if len(memo) >= MEMO_SIZE:
                memo.clear()
            d = memo.setdefault(key, d.with_input(MappingProxyType(dict(cfg))))
        return d

    got = [f"x{i} = get({name!r}, _M)" for i, name in enumerate(names)]
    key = ", ".join(["len(cfg)"] + [f"x{i}" for i in range(n)] + [f"x{i}.__class__" for i in range(n)])
    source = "\n".join([
        "def evaluate(cfg):",
        "    if cfg.__class__ is dict:",
        "        get = cfg.get",
        *(f"        {line}" for line in got),
        f"        key = ({key},)",
        "        try:",
        "            hit = memo_get(key)",
        "        except Exception:  # unhashable, or a comparison that raises: the slow path explains",
        "            return slow(cfg)",
        "        if hit is not None:",
        "            return hit",
        "        return miss(cfg, key)",
        "    return slow(cfg)",
    ])
    namespace = {"_M": _M, "memo_get": memo.get, "slow": slow, "miss": miss}
    exec(compile(source, f"<memo {policy.family}@{policy.version}>", "exec"), namespace)
    evaluate = namespace["evaluate"]
    evaluate.memo = memo  # for tests and diagnostics
    evaluate.__doc__ = type(policy).evaluate.__doc__
    return evaluate
