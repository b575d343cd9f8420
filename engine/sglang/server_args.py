"""What routing any SGLang ServerArgs shares, for apply() on every generation (routing.py) and on
0.5.2x's own records (resolution.py): the attribute names an input may have, and what SGLang
raises for a refused config."""
from __future__ import annotations

from engine.errors import EngineError


class ServerArgsError(EngineError, TypeError):
    """apply() was given something it cannot read as a ServerArgs (None, a number), or a
    ServerArgs it cannot write (a read-only attribute): nothing was written."""


# rules SGLang checks with a bare `assert` (AssertionError); it refuses everything else with a
# ValueError
ASSERTED_RULES = frozenset({"dsa-dtype", "hisparse-dsa-model", "hisparse-radix-cache"})


def raise_refusal(decision):
    """Raise what SGLang raises for the decision's first violation."""
    first = decision.violations[0]
    raise (AssertionError if first.check in ASSERTED_RULES else ValueError)(decision.error)


def attr_names(policy, name: str) -> list[str]:
    """The attribute names an input may have on a ServerArgs: its name, then its flags', then its
    deprecated flags' (older SGLang objects)."""
    spec = policy.inputs[name]
    names = [name] + [f[2:].replace("-", "_") for f in tuple(spec.flags) + tuple(spec.deprecated)]
    return list(dict.fromkeys(names))
