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
    error (an empty --policy-dir must not quietly mean the shipped policies), and so is one that
    does not exist or is not a folder (said as such, not as a family missing from it)."""
    from engine.errors import PolicyError, Problem

    if given is None:
        root = default_policy_dir()
    elif not isinstance(given, str) or not given.strip():
        from engine.values import shown

        raise PolicyError([Problem("R602", f"the policy folder is empty ({shown(given)}): it must name a folder",
                                   hint="leave the option out for the default")])
    else:
        root = given
    if not os.path.isdir(root):
        what = "is a file, not a folder" if os.path.exists(root) else "does not exist"
        source = "--policy-dir" if given is not None else "$HISPARSE_POLICY_DIR"
        raise PolicyError([Problem("R601", f"the policy folder {what}", root,
                                   hint=f"{source} names a folder of policy families (<family>/v<N>.yaml)")])
    return root


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


def placement(file: str) -> tuple[str, str]:
    """(folder name, file name) of where a policy file sits, as the identity check (E312) reads
    them: the folder resolved against the current directory, so `v4.yaml` means another place
    from another directory. The compiled-policy caches key on it, since the check's verdict does."""
    return os.path.basename(os.path.dirname(os.path.abspath(file))), os.path.basename(file)
