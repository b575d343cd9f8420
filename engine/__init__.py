"""hisparse-router policy engine: load versioned YAML routing policies, evaluate server configs,
explain and compare decisions. Pure Python: never imports torch.

    >>> import engine
    >>> policy = engine.load_policy("dsa-backends@2")
    >>> d = engine.evaluate(policy, {"enable_hisparse": True, "kv_cache_dtype": "fp8_e4m3",
    ...                              "disable_radix_cache": True})
    >>> d.ok, d.backends
    (True, {'prefill': 'flashmla_kv', 'decode': 'flashmla_kv'})
"""
from __future__ import annotations

from collections.abc import Mapping

from engine.language.decision import Decision, Violation
from engine.errors import CODES, ConfigError, HisparseError, PolicyError, Problem
from engine.files.catalog import list_families
from engine.policy.loader import load_policy
from engine.policy.policy import Policy
from engine.version import __version__  # noqa: F401  (engine.__version__)

__all__ = [
    "CODES", "ConfigError", "Decision", "HisparseError", "Policy", "PolicyError", "PolicyStore", "Problem",
    "Violation", "evaluate", "list_families", "load_policy",
]


def evaluate(policy, config: Mapping) -> Decision:
    """Evaluate `config` against `policy` (a Policy or a reference such as "dsa-backends@2")."""
    return load_policy(policy).evaluate(config)


def __getattr__(name: str):
    # PolicyStore (threads, logging) is imported on first use: a one-shot `hisparse evaluate`
    # never needs it, and start-up time counts there
    if name == "PolicyStore":
        from engine.serving.store import PolicyStore

        globals()[name] = PolicyStore
        return PolicyStore
    raise AttributeError(f"module 'engine' has no attribute {name!r}")
