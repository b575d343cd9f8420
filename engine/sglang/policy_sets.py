"""The policies one reference names, one per class of model they route, and the one a model gets.

`--policy` (and HISPARSE_POLICY) take one reference. A reference to one family or file
(`FAMILY`, `FAMILY@N`, a .yaml path) names one policy, which routes the classes its file declares
(`models:`; engine/sglang/registry.py MODEL_CLASSES). A reference that covers every family names
one version of each: a release (`sglang==X`, `installed`: the version of each family that models
it), a policy folder (a path to a folder: each family's newest version), or nothing (the default
folder's newest version of each family). A model path then picks the policy that routes its class
(engine/sglang/models.py); a model nothing tells about takes the policy that routes DSA models, as
it always has."""
from __future__ import annotations

import os

from engine.errors import PolicyError, Problem
from engine.policy.loader import load_file, load_head, load_policy
from engine.policy.policy import Policy

DEFAULT_CLASS = "dsa"  # the class of a model nothing tells about (the DSA family's dsa_model default)


class PolicySet:
    """Policies by the classes they route. `release`: the SGLang release the reference named
    (None: none); `covers_all`: the reference covers every family. Each is a Policy, or (its head
    or None, path, display): the head read when first asked for, the Policy loaded when chosen, so
    a command builds the rules of the one family it uses, not of every family the reference covers."""

    def __init__(self, policies, release: str | None = None, covers_all: bool = False, ref: str = ""):
        self._entries = list(policies)
        self.release, self.covers_all, self.ref = release, covers_all, ref

    @property
    def policies(self) -> list:
        return [self._policy(i) for i in range(len(self._entries))]

    def _head(self, i: int):
        """The entry's Policy or head, its head read from the file when first asked for."""
        entry = self._entries[i]
        if isinstance(entry, tuple) and entry[0] is None:
            entry = self._entries[i] = _entry(entry[1], entry[2])
        return _head(entry)

    def _policy(self, i: int) -> Policy:
        entry = self._entries[i]
        if isinstance(entry, tuple):
            entry = self._entries[i] = load_file(entry[1], entry[2])
        return entry

    def for_class(self, model_class: str | None) -> Policy | None:
        wanted = model_class or DEFAULT_CLASS
        for i in range(len(self._entries)):
            if wanted in self._head(i).models:
                return self._policy(i)
        if model_class is None and len(self._entries) == 1:
            return self._policy(0)  # one policy named: a model nothing tells about is its own
        return None

    def choose(self, model_path: str | None) -> tuple:
        """(the policy for the model a path names, the model as read: (path, Model), handed on
        so that it is not read again; None when no path was given or its config.json cannot be
        read). Raises PolicyError when no policy of the set routes its class."""
        if not model_path:
            return self.for_class(None) or self._policy(0), None
        from engine.errors import ConfigError
        from engine.sglang.models import CLASS_NAMES, identify

        try:
            model = identify(model_path)
        except ConfigError:  # the config.json's problem is reported where the config is read
            return self.for_class(None) or self._policy(0), None
        cls = model.model_class
        if cls is not None and model.since and self.release and _older(self.release, model.since):
            cls = "other"  # that release does not know the model: another model to it
        policy = self.for_class(cls)
        if policy is not None:
            return policy, (model_path, model)
        routes = "; ".join(f"{p.family}@{p.version} routes {', '.join(p.models)}" for p in self.policies)
        hint = ("name a version of the family that routes it (FAMILY@N), or a reference that covers every "
                "family: sglang==X, installed, or a policy folder")
        raise PolicyError([Problem("R606", f"{model_path} ({model.how}) is {CLASS_NAMES[cls]}, which "
                                   f"{self.ref or 'the policy'} does not route ({routes})", hint=hint)])


def _older(release: str, since: str) -> bool:
    from engine.sglang.registry import release_key

    return release_key(release) < release_key(since)


def load_policy_set(ref: str | None, policy_dir: str | None = None) -> PolicySet:
    """The policies `ref` names (see the module's docstring). Raises PolicyError."""
    from engine.files.catalog import list_families, looks_like_path, version_paths
    from engine.files.releases import INSTALLED, PREFIX, installed_release, is_release_ref, modelled
    from engine.files.shipped import default_policy_ref, policy_root

    if ref is None:
        ref = os.environ.get("HISPARSE_POLICY")
        if ref is None:  # every family of the default folder, newest versions
            root = policy_root(policy_dir)
            families = list_families(root)
            if not families:
                raise PolicyError([Problem("R601", "no policy family in the policy folder", root,
                                           hint="a policy folder holds <family>/v<N>.yaml files")])
            return PolicySet([_newest(f, policy_dir) for f in families], covers_all=True)
        ref = default_policy_ref()  # refuses an empty HISPARSE_POLICY
    # a folder of policies; a path named like a policy file is read as one (a folder there is E101)
    if isinstance(ref, str) and looks_like_path(ref) and os.path.isdir(os.path.expanduser(ref)) \
            and not ref.rstrip("/").lower().endswith((".yaml", ".yml", ".json")):
        root = os.path.expanduser(ref)
        policies = [_newest(family, root) for family in list_families(policy_root(root))]
        if not policies:
            raise PolicyError([Problem("R601", "no policy family in the folder", ref,
                                       hint="a policy folder holds <family>/v<N>.yaml files")])
        return PolicySet(policies, covers_all=True, ref=ref)
    if isinstance(ref, str) and is_release_ref(ref):
        release = installed_release() if ref == INSTALLED else ref[len(PREFIX):].strip()
        root = policy_root(policy_dir)
        found = modelled(version_paths(root), load_head).get(release, [])
        families: dict = {}
        for _, path, display in found:
            entry = _entry(path, display)
            families.setdefault(_head(entry).family, []).append(entry)
        if not families:
            load_policy(ref, policy_dir)  # raises R601 naming the modelled releases
        for family, versions in families.items():
            if len(versions) > 1:
                refs = [f"{family}@{_head(v).version}" for v in versions]
                load_policy(refs[0], policy_dir)
                raise PolicyError([Problem("R603", f"{len(versions)} versions of '{family}' model SGLang {release}: "
                                           + ", ".join(refs), hint="name one as FAMILY@N")])
        return PolicySet([v[0] for v in families.values()], release=release, covers_all=True, ref=ref)
    policy = load_policy(ref, policy_dir)
    return PolicySet([policy], release=_single_release(policy), ref=ref)


def _newest(family: str, policy_dir: str | None):
    """A family's newest version as a PolicySet entry: its file, its head read when the set is
    asked which class it routes, its rules built when it is chosen."""
    from engine.files.catalog import resolve_ref

    return (None, *resolve_ref(family, policy_dir))


def _entry(path: str, display: str):
    """The Policy this process loaded from the file, else its head (from the on-disk cache, or
    the Policy loaded: a file that does not load raises PolicyError here, as before) with the file."""
    head = load_head(path, display)
    return head if isinstance(head, Policy) else (head, path, display)


def _head(entry):
    return entry[0] if isinstance(entry, tuple) else entry


def _single_release(policy) -> str | None:
    releases = getattr(policy.upstream, "releases", None) or ()
    return releases[-1] if releases else None
