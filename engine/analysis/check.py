"""`hisparse check`: every problem of every policy file under the given paths."""
from __future__ import annotations

import os
import re

from engine.errors import PolicyError, Problem
from engine.files.shipped import default_policy_dir

_POLICY_FILE = re.compile(r"v([0-9]+)\.ya?ml")  # matched whole
_SKIP_DIRS = {"schema", "tests", "__pycache__"}


def policy_files(paths: list[str]) -> tuple[list[tuple[str, str]], list[Problem]]:
    """(path, display) of each policy file under `paths` (files as given; folders searched for
    <family>/v<N>.yaml), and problems for paths that do not exist."""
    found: list[tuple[str, str]] = []
    problems: list[Problem] = []
    if not paths:
        root = default_policy_dir()
        from engine.files.catalog import display_dir

        shown = display_dir(root)
        for path in _walk(root):
            found.append((path, os.path.join(shown, os.path.relpath(path, root))))
        return found, problems
    for given in paths:
        if os.path.isdir(given):
            inside = [(p, p) for p in _walk(given)]
            if not inside:
                problems.append(Problem("E101", "a folder without policy files (<family>/v<N>.yaml)", given))
            found.extend(inside)
        elif os.path.exists(given) or os.path.islink(given):
            found.append((given, given))
        else:
            problems.append(Problem("E101", "cannot read file: no such file or directory", given))
    return found, problems


def _walk(root: str):
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS and not d.startswith("."))
        for name in sorted(files):
            if _POLICY_FILE.fullmatch(name):
                yield os.path.join(folder, name)


def check_file(path: str, display: str | None = None, deep: bool = True, notes: list | None = None) -> list[Problem]:
    from engine.policy.loader import load_file

    try:
        policy = load_file(path, display or path)
    except PolicyError as exc:
        return exc.problems
    if not deep:
        return []
    from engine.analysis.lint import lint

    problems, more = lint(policy)
    if notes is not None:
        notes.extend(more)
    return problems


def check_paths(paths: list[str], deep: bool = True, notes: list | None = None) -> list[tuple[str, list[Problem]]]:
    files, missing = policy_files(paths)
    twins = _duplicate_versions(files)
    results = [(display, twins.get(display, []) + check_file(path, display, deep, notes)) for path, display in files]
    results += [(p.file, [p]) for p in missing]
    return results


def _duplicate_versions(files) -> dict[str, list[Problem]]:
    """display -> E313 for every file that names the same version as another file of its folder
    (v1.yaml and v001.yaml, v1.yaml and v1.yml): which one is version 1 would be a guess."""
    from engine.files.catalog import duplicate_version

    groups: dict = {}
    for path, display in files:
        m = _POLICY_FILE.fullmatch(os.path.basename(path))
        folder = os.path.dirname(os.path.abspath(path))
        groups.setdefault((folder, int(m.group(1)) if m else None), []).append(display)
    out: dict[str, list[Problem]] = {}
    for (folder, version), shown in groups.items():
        if version is None or len(set(shown)) < 2:
            continue
        names = sorted(os.path.basename(d) for d in set(shown))
        for display in set(shown):
            out[display] = [duplicate_version(os.path.basename(folder), version, names,
                                              os.path.dirname(display), display)]
    return out
