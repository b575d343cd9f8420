"""Where the shipped policies are: next to the code in an installed copy (engine/policies/), at
the top of the source tree otherwise (policies/)."""
from __future__ import annotations

import os

# the engine package folder (this module is engine/files/shipped.py)
_HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def shipped_policy_dir() -> str:
    installed = os.path.join(_HERE, "policies")
    if os.path.isdir(os.path.join(installed, "schema")):
        return installed
    return os.path.join(os.path.dirname(_HERE), "policies")


def default_policy_dir() -> str:
    """HISPARSE_POLICY_DIR when set, else the shipped policies."""
    return _env("HISPARSE_POLICY_DIR", "folder") or shipped_policy_dir()


def policy_root(given: str | None) -> str:
    """The policy folder a command uses: the one given, else the default; an empty one is an
    error (an empty --policy-dir must not quietly mean the shipped policies)."""
    if given is None:
        return default_policy_dir()
    if not isinstance(given, str) or not given.strip():
        from engine.errors import PolicyError, Problem
        from engine.values import shown

        raise PolicyError([Problem("R602", f"the policy folder is empty ({shown(given)}): it must name a folder",
                                   hint="leave the option out for the default")])
    return given


DEFAULT_POLICY = "dsa-backends"


def default_policy_ref() -> str:
    """The policy used when none is named: $HISPARSE_POLICY, else the newest dsa-backends."""
    return _env("HISPARSE_POLICY", "policy reference") or DEFAULT_POLICY


def policy_ref(given: str | None) -> str:
    """The reference a command uses: the one given (even an empty one, which the loader then
    refuses), else the default."""
    return given if given is not None else default_policy_ref()


def _env(name: str, what: str) -> str | None:
    """An environment setting; set but empty (or blank) is an error, never a silent default."""
    value = os.environ.get(name)
    if value is not None and not value.strip():
        from engine.errors import PolicyError, Problem

        raise PolicyError([Problem("R602", f"{name} is set but empty: it must name a {what}",
                                   hint=f"unset {name} for the default")])
    return value
