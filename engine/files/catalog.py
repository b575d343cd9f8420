"""Where a policy reference points: the families and versions under a policy folder (FAMILY,
FAMILY@N, v<N>.yaml files), whether a reference names a file, and how messages name a folder.
Release references (sglang==X, installed) and retired ones are releases.py's."""
from __future__ import annotations

import os
import re

import engine.files.releases as releases
from engine.errors import PolicyError, Problem
from engine.files.shipped import default_policy_dir, placement, policy_root, shipped_policy_dir
from engine.values import clip, parse_int, shown

_REF = re.compile(r"(?P<family>[a-z][a-z0-9]*(?:-[a-z0-9]+)*)(?:@(?P<version>[0-9]+))?")
VERSION_FILE = re.compile(r"v([0-9]+)\.yaml")  # matched whole (fullmatch): v<N>.yaml, N in ASCII digits


def looks_like_path(ref: str) -> bool:
    """Whether a reference names a file. Only its spelling decides, never what happens to exist:
    a file named `dsa-backends` in the working directory must not replace the shipped policy."""
    return (os.sep in ref or "/" in ref or (os.altsep or "/") in ref
            or ref.endswith((".yaml", ".yml", ".json")) or ref.startswith((".", "~")))


def resolve_ref(ref: str, policy_dir: str | None = None) -> tuple[str, str]:
    """(path, display name) of the file a FAMILY or FAMILY@N reference names."""
    m = _REF.fullmatch(ref)
    if not m:
        raise PolicyError([Problem("R602", f"bad policy reference {shown(ref)}: expected FAMILY, FAMILY@N "
                                   "(e.g. dsa-backends@2), sglang==X, installed or a path to a .yaml file")])
    root = policy_root(policy_dir)
    family, version = m.group("family"), m.group("version")
    families = list_families(root)
    if family not in families:
        from engine.suggest import did_you_mean

        gone = releases.retired(family, version, root)
        if gone is not None:
            raise PolicyError([gone])
        raise PolicyError([Problem("R601", f"no policy family '{family}' in {display_dir(root)}",
                                   hint=did_you_mean(family, families))])
    versions = families[family]
    if version is None:
        number = max(versions)
    else:
        number = parse_int(version)  # None for a number too long to be a version
        if number not in versions:
            listed = ", ".join(f"{family}@{v}" for v in sorted(versions))
            raise PolicyError([Problem("R601", f"no version {clip(version)} of '{family}'",
                                       hint=f"available: {listed}")])
    names = version_files(os.path.join(root, family))[number]
    folder = os.path.join(display_dir(root), family)
    if len(names) > 1:
        raise PolicyError([duplicate_version(family, number, names, folder)])
    return os.path.join(root, family, names[0]), os.path.join(folder, names[0])


def version_files(folder: str) -> dict[int, list[str]]:
    """version -> the names of the files that say they are that version (v<N>.yaml; v1.yaml and
    v001.yaml both say 1), sorted. Raises OSError when the folder cannot be listed."""
    out: dict[int, list[str]] = {}
    for name in os.listdir(folder):
        m = VERSION_FILE.fullmatch(name)
        if m:
            out.setdefault(int(m.group(1)), []).append(name)
    return {v: sorted(names) for v, names in out.items()}


def misplaced(file: str, family: str, version: int) -> list[tuple[str, str]]:
    """A file named v<N>.yaml inside a folder must be version N of the family of that name (E312):
    (message, the key it is about) for each way the policy at `file` is not."""
    parent, base = placement(file)
    match = re.fullmatch(r"v(\d+)\.ya?ml", base)
    if not match or parent in ("", "tests"):
        return []
    out = []
    if int(match.group(1)) != version:
        out.append((f"version {version} in a file named {base}", "version"))
    if parent != family and re.fullmatch(r"[a-z][a-z0-9-]*", parent):
        out.append((f"family '{family}' in a folder named '{parent}'", "policy"))
    return out


def duplicate_version(family: str, version: int, names, folder: str, file: str = "") -> Problem:
    return Problem("E313", f"version {version} of '{family}' has {len(names)} files: "
                   + ", ".join(os.path.join(folder, n) for n in names), file,
                   hint="keep one file per version, named v<N>.yaml")


def list_families(root: str | None = None) -> dict[str, list[int]]:
    """family -> sorted versions found under a policy folder."""
    root = root or default_policy_dir()
    out: dict[str, list[int]] = {}
    try:
        names = sorted(os.listdir(root))
    except OSError:
        return out
    for name in names:
        folder = os.path.join(root, name)
        if name == "schema" or not os.path.isdir(folder):
            continue
        try:
            versions = sorted(version_files(folder))
        except OSError:
            continue
        if versions:
            out[name] = versions
    return out


def version_paths(root: str):
    """(FAMILY@N, path, display) of every version file under a policy folder."""
    for family, versions in list_families(root).items():
        files = version_files(os.path.join(root, family))
        for number in versions:
            for name in files[number]:
                yield f"{family}@{number}", os.path.join(root, family, name), os.path.join(display_dir(root), family, name)


def display_dir(root: str) -> str:
    """How messages name a policy folder: as given, except the shipped one, named where it really
    is (relative to the working directory inside it, as `policies` in a checkout; else absolute,
    as an installed copy), so a location in a message is a file that exists."""
    shipped = os.path.abspath(shipped_policy_dir())
    if os.path.abspath(root) != shipped:
        return root
    try:
        relative = os.path.relpath(shipped)
    except (OSError, ValueError):  # no working directory, or another drive
        return shipped
    return shipped if relative == os.pardir or relative.startswith(os.pardir + os.sep) else relative
