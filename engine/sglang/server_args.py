"""What routing any SGLang ServerArgs shares, for apply() on every generation (routing.py) and on
0.5.2x's own records (resolution.py): the attribute names an input may have, and what SGLang
raises for a refused config."""
from __future__ import annotations

from engine.errors import EngineError


class ServerArgsError(EngineError, TypeError):
    """apply() was given something it cannot read as a ServerArgs (None, a number), or a
    ServerArgs it cannot write (a read-only attribute): nothing was written."""


def raise_refusal(decision, violation=None):
    """Raise what SGLang raises for a violation of the decision (default: its first): the
    exception its rule names (`raises`: AssertionError for SGLang's bare asserts, RuntimeError
    where SGLang raises one, else ValueError)."""
    v = violation or decision.violations[0]
    raise _EXCEPTIONS.get(v.raises, ValueError)(v.message)


_EXCEPTIONS = {"AssertionError": AssertionError, "RuntimeError": RuntimeError, "ValueError": ValueError}


def attr_names(policy, name: str) -> list[str]:
    """The attribute names an input may have on a ServerArgs: its name, then its flags', then its
    deprecated flags' (older SGLang objects)."""
    spec = policy.inputs[name]
    names = [name] + [f[2:].replace("-", "_") for f in tuple(spec.flags) + tuple(spec.deprecated)]
    return list(dict.fromkeys(names))
