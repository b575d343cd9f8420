"""Where the shipped policies are: next to the code in an installed copy (engine/policies/), at
the top of the source tree otherwise (policies/)."""
from __future__ import annotations

import os

_HERE = os.path.dirname(os.path.abspath(__file__))


def shipped_policy_dir() -> str:
    installed = os.path.join(_HERE, "policies")
    if os.path.isdir(os.path.join(installed, "schema")):
        return installed
    return os.path.join(os.path.dirname(_HERE), "policies")


def default_policy_dir() -> str:
    """HISPARSE_POLICY_DIR when set, else the shipped policies."""
    return os.environ.get("HISPARSE_POLICY_DIR") or shipped_policy_dir()


DEFAULT_POLICY = "nsa-backends"


def default_policy_ref() -> str:
    """The policy used when none is named: $HISPARSE_POLICY, else the newest nsa-backends."""
    return os.environ.get("HISPARSE_POLICY") or DEFAULT_POLICY
