"""`hisparse policies export DIR`: a copy of the shipped policies (every version of every family,
their test cases and the schema) to edit, from a checkout or an installed wheel alike. The copy is
staged in a temporary folder and moved into place, so DIR is either complete or as it was (absent,
or empty); an existing DIR that is not empty is never written into."""
from __future__ import annotations

import os

from engine.cli.options import OK, Parser, UsageError
from engine.files.shipped import shipped_policy_dir
from engine.values import shown


def shipped_files() -> list[str]:
    """The shipped policy folder's files, relative to it: <family>/v<N>.yaml,
    <family>/tests/v<N>.yaml and schema/*.json."""
    root = shipped_policy_dir()
    found = []
    for base, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith((".", "__")))
        for name in sorted(files):
            if name.endswith((".yaml", ".json")):
                found.append(os.path.relpath(os.path.join(base, name), root))
    return found


def export(dest: str) -> list[str]:
    """Copy the shipped policies into `dest`, a new folder or an empty one; the files written,
    relative to it. Raises UsageError when dest exists and is not empty, or the copy fails
    (nothing is left). The copy is staged, then moved into place: a new folder is the staging
    folder renamed (made next to it); an existing empty one keeps its own mode and owner and is
    written into (staged inside it), so its parent need not be writable."""
    what = f"hisparse policies export: {shown(dest)}"
    if os.path.lexists(dest) and not (os.path.isdir(dest) and not os.path.islink(dest) and not os.listdir(dest)):
        raise UsageError(f"{what} exists and is not an empty folder: name a new one (nothing was written)")
    into = os.path.isdir(dest)
    place = dest if into else os.path.dirname(os.path.abspath(dest))
    files = shipped_files()
    import shutil  # only for an export: not on every command's start-up

    staging = _staging(place, what)
    moved: list[str] = []
    try:
        for rel in files:
            os.makedirs(os.path.join(staging, os.path.dirname(rel)), exist_ok=True)
            shutil.copyfile(os.path.join(shipped_policy_dir(), rel), os.path.join(staging, rel))
        if into:
            for name in sorted(os.listdir(staging)):
                os.rename(os.path.join(staging, name), os.path.join(dest, name))
                moved.append(name)
            os.rmdir(staging)
        else:
            os.rename(staging, dest)
    except OSError as exc:
        shutil.rmtree(staging, ignore_errors=True)
        for name in moved:  # the folder is left empty, as it was
            shutil.rmtree(os.path.join(dest, name), ignore_errors=True)
        raise UsageError(f"{what}: {exc.strerror or exc} (nothing was written)") from None
    return files


def _staging(place: str, what: str) -> str:
    """A folder of the user's (the umask's mode, not mkdtemp's private one) in `place`."""
    import tempfile

    try:
        staging = tempfile.mkdtemp(prefix=".policies-export-", dir=place)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(staging, 0o777 & ~umask)
    except OSError as exc:
        raise UsageError(f"{what}: cannot write in {place}: {exc.strerror or exc}") from None
    return staging


def cmd_policies(argv) -> int:
    parser = Parser(prog="hisparse policies",
                    description="The shipped policy files. export DIR: copy every version of every family, "
                                "their test cases and the schema into the new folder DIR, to edit, check, "
                                "test and diff (use it by name with --policy-dir DIR).")
    parser.add_argument("action", choices=("export",), help="export: copy the shipped policies")
    parser.add_argument("folder", metavar="DIR", help="a new (or empty) folder")
    ns = parser.parse_args(argv)
    files = export(ns.folder)
    from engine.files.catalog import list_families

    families = list_families(ns.folder)
    listed = "; ".join(f"{family} versions {', '.join(map(str, versions))}" for family, versions in families.items())
    print(f"exported {len(files)} files to {ns.folder}: {listed}, with their test cases and the schema")
    return OK
