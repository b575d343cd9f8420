"""References that are not FAMILY@N: by the SGLang release a version models (`sglang==0.5.18`,
`installed`), and the retired references of policies/retired.yaml."""
from __future__ import annotations

import os

from engine.errors import PolicyError, Problem
from engine.values import shown

PREFIX = "sglang=="
INSTALLED = "installed"


def is_release_ref(ref: str) -> bool:
    return ref == INSTALLED or ref.startswith(PREFIX)


def installed_release() -> str:
    """The installed SGLang's version, from its package metadata (SGLang is not imported).
    Raises PolicyError when SGLang is not installed."""
    from engine.sglang.registry import installed_release as installed

    release = installed()
    if release is None:
        raise PolicyError([Problem("R604", "--policy installed: SGLang is not installed in this Python",
                                   hint="name the release instead (--policy sglang==X) or a FAMILY@N")])
    return release


def modelled(files, load) -> dict[str, list[tuple[str, str, str]]]:
    """release -> [(ref, path, display)] of every version file (`files`: (ref, path, display)
    triples; `load(path, display)` gives its Policy) whose upstream lists it."""
    out: dict[str, list[tuple[str, str, str]]] = {}
    for ref, path, display in files:
        up = load(path, display).upstream
        for release in (up.releases if up else ()):
            out.setdefault(release, []).append((ref, path, display))
    return out



def resolve(ref: str, files, load) -> tuple[str, str]:
    """(path, display) of the version that models the release `ref` names, among `files` (see
    modelled). Each family models a release with at most one version; where several families
    model it (each routes its own class of models), the one policy a release names is the version
    of the family that routes the default class (DSA: what a model nothing tells about gets,
    engine/sglang/policy_sets.py), as `load_policy_set(ref).choose(None)` gives. Exit 2 (PolicyError)
    when no version does, or when more than one version of a family (or several families, none
    routing the default class) do, listing them."""
    release = installed_release() if ref == INSTALLED else ref[len(PREFIX):].strip()
    table = modelled(files, load)
    found = table.get(release, [])
    if len(found) > 1:  # one version per family: as one policy, the family that routes DSA models
        families = {load(path, display).family for _, path, display in found}
        if len(families) == len(found):
            found = [f for f in found if "dsa" in load(f[1], f[2]).models] or found
    if len(found) == 1:
        return found[0][1], found[0][2]
    from engine.sglang.registry import release_key  # the one parser of release strings

    listed = ", ".join(sorted(table, key=release_key)) or "none"
    if not found:
        what = f"SGLang {shown(release)}" + (" (installed)" if ref == INSTALLED else "")
        raise PolicyError([Problem("R601", f"no policy version models {what}",
                                   hint=f"modelled releases: {listed}")])
    raise PolicyError([Problem("R603", f"{len(found)} policy versions model SGLang {release}: "
                               + ", ".join(f"{r} ({d})" for r, _, d in found),
                               hint="name one as FAMILY@N")])


def retired(family: str, version: str | None, root: str) -> Problem | None:
    """The problem for a retired reference (policies/retired.yaml), or None."""
    from engine.files.load import load_document
    from engine.files.reading import ReadError
    from engine.files.shipped import shipped_policy_dir

    path = os.path.join(shipped_policy_dir(), "retired.yaml")
    if not os.path.isfile(path):
        return None
    try:
        table = load_document(path, "policies/retired.yaml").data or {}
    except ReadError as exc:
        raise PolicyError(exc.problems) from None
    entry = table.get(family)
    if not isinstance(entry, dict):
        return None
    versions = entry.get("versions") or {}
    head = f"'{family}' is retired: {' '.join(str(entry.get('note', '')).split())}"
    if version is None:
        newest = versions.get(max(versions, key=int)) if versions else None
        now = newest.get("now") if isinstance(newest, dict) else None
        return Problem("R605", head, hint=f"its newest version is now {now}" if now else None)
    item = versions.get(str(int(version))) if version.isdigit() else None
    if not isinstance(item, dict):
        return Problem("R605", head)
    note = " ".join(str(item.get("note", "")).split())
    now = item.get("now")
    if now:
        return Problem("R605", f"{family}@{version} is retired: it is now {now}; {note}",
                       hint=f"use --policy {now}")
    return Problem("R605", f"{family}@{version} is retired: {note}")
