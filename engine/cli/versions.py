"""`hisparse versions`: every SGLang release, the policy version that models it, and what
`hisparse conform` found when that version was run against that release (the saved reports of
docs/conformance/, named FAMILY-N-sglang-RELEASE.json, shipped in the wheel as engine/conformance/).
Also the labels `hisparse diff` gives a side named by release."""
from __future__ import annotations

import json
import os
import sys

from engine.sglang.registry import RELEASES

# every SGLang release from 0.5.11 on, .post releases listed on their own (PyPI)
SGLANG_RELEASES = tuple(r.version for r in RELEASES)


def reports_dir() -> str:
    """The saved reports: shipped next to the code in an installed copy (engine/conformance/,
    package data of the wheel), docs/conformance/ of the source tree otherwise."""
    engine_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # this is engine/cli/versions.py
    installed = os.path.join(engine_dir, "conformance")
    if os.path.isdir(installed):
        return installed
    return os.path.join(os.path.dirname(engine_dir), "docs", "conformance")


def saved_reports(folder: str | None = None) -> dict:
    """(FAMILY@N, release) -> the saved `hisparse conform --format json` report."""
    folder = folder or reports_dir()
    out = {}
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        if not name.endswith(".json"):
            continue
        try:
            with open(os.path.join(folder, name), encoding="utf-8") as fh:
                r = json.load(fh)
            key = (f"{r['policy']['family']}@{r['policy']['version']}", r["sglang"])
        except (OSError, ValueError, KeyError, TypeError):
            continue  # not a conform report
        out[key] = dict(r, file=name)
    return out


def modelled_releases(policy_dir: str | None = None) -> dict:
    """release -> [(ref, path, display)] of the versions under the policy folder that model it."""
    from engine.files.shipped import policy_root
    from engine.files.catalog import version_paths
    from engine.policy.loader import load_file
    from engine.files.releases import modelled

    return modelled(version_paths(policy_root(policy_dir)), load_file)


def rows(policy_dir: str | None = None, reports: str | None = None) -> list[dict]:
    """One row per release (SGLANG_RELEASES, then any other release a version lists) and family
    that models it (one row when none does): the version that models it (None: none does, or
    several versions of one family) and its saved report's figures (None: not run)."""
    from engine.sglang.registry import release_key

    from engine.files.reading import sha256

    table = modelled_releases(policy_dir)
    saved = saved_reports(reports)
    digests = {}  # ref -> the sha256 of its file now
    for entries in table.values():
        for ref, path, _ in entries:
            if ref not in digests:
                with open(path, "rb") as fh:
                    digests[ref] = sha256(fh.read()).hexdigest()
    out = []
    for release in sorted(set(SGLANG_RELEASES) | set(table), key=release_key):
        for refs in _by_family([ref for ref, _, _ in table.get(release, [])]):
            out.append(_row(release, refs, saved, digests))
    return out


def _by_family(refs: list) -> list[list]:
    """The versions that model one release, one list per family (each family routes its own class
    of models, so each has a row of its own), families in name order; [[]] when none does."""
    families: dict = {}
    for ref in refs:
        families.setdefault(ref.rpartition("@")[0], []).append(ref)
    return [families[f] for f in sorted(families)] or [[]]


def _row(release: str, refs: list, saved: dict, digests: dict) -> dict:
    """A release's row for the versions of one family that model it (one, unless that family is
    ambiguous: then no figures)."""
    ref = refs[0] if len(refs) == 1 else None
    r = saved.get((ref, release)) if ref else None
    row = {"release": release, "version": ref, "versions": refs, "conformance": None}
    if r is not None:
        c = r["counts"]
        row["conformance"] = {
            "configs": r["total"], "agree": c["agree"], "out_of_scope": c["out_of_scope"],
            "differ": c["differ"], "sample": r.get("sample"), "seconds": r.get("seconds"),
            "report": f"docs/conformance/{r['file']}",
            # whether the report was made on the file's current bytes (else an earlier revision of it)
            "current": r.get("policy", {}).get("sha256") == digests.get(ref)}
    return row


def configs_cell(conf: dict) -> str:
    n = f"{conf['configs']:,}"
    n += f" (sample, seed {conf['sample']['seed']})" if conf.get("sample") else ""
    return n + ("" if conf.get("current", True) else " (an earlier revision of the file)")


def version_cell(row: dict) -> str:
    if row["version"]:
        return row["version"]
    return " or ".join(row["versions"]) if row["versions"] else "none"


def markdown_table(rows_: list[dict]) -> str:
    """The README's table: release, version, configs, agree, out of scope, differ."""
    lines = ["| release | version | configs | agree | out of scope | differ |",
             "|---|---|---:|---:|---:|---:|"]
    for row in rows_:
        version = f"`{row['version']}`" if row["version"] else version_cell(row)
        conf = row["conformance"]
        if conf is None:
            lines.append(f"| {row['release']} | {version} | not run | | | |")
        else:
            lines.append(f"| {row['release']} | {version} | {configs_cell(conf)} | {conf['agree']:,} | "
                         f"{conf['out_of_scope']:,} | {conf['differ']:,} |")
    return "\n".join(lines)


def text_table(rows_: list[dict]) -> str:
    head = ("release", "version", "configs", "agree", "out of scope", "differ", "run time")
    body = []
    for row in rows_:
        conf = row["conformance"]
        if conf is None:
            body.append((row["release"], version_cell(row), "not run", "", "", "", ""))
            continue
        seconds = conf.get("seconds")
        took = "" if seconds is None else f"{seconds / 60:.0f} min" if seconds >= 120 else f"{seconds:.0f} s"
        body.append((row["release"], version_cell(row), configs_cell(conf), f"{conf['agree']:,}",
                     f"{conf['out_of_scope']:,}", f"{conf['differ']:,}", took))
    widths = [max(len(r[i]) for r in [head] + body) for i in range(len(head))]
    fmt = lambda r: "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip()  # noqa: E731
    return "\n".join([fmt(head)] + [fmt(r) for r in body])


def side_labels(a_ref: str, b_ref: str, a, b) -> tuple[str | None, str | None]:
    """How `hisparse diff` names its sides: a side given by release (sglang==X, installed) is
    "sglang==X (FAMILY@N)"; when both sides are the same version, each also names its file."""
    from engine.files.releases import INSTALLED, PREFIX, installed_release, is_release_ref

    def release_of(ref):
        if ref == INSTALLED:
            return f"{PREFIX}{installed_release()}"
        return ref.strip()

    same = (a.family, a.version) == (b.family, b.version)
    labels = []
    for ref, policy in ((a_ref, a), (b_ref, b)):
        name = f"{policy.family}@{policy.version}"
        if is_release_ref(ref.strip()):
            labels.append(f"{release_of(ref)} ({name}, {policy.file})" if same else f"{release_of(ref)} ({name})")
        elif same:
            labels.append(f"{name} ({policy.file})")
        else:
            labels.append(None)
    return labels[0], labels[1]


def cmd_versions(argv) -> int:
    from engine.cli.options import OK, Parser, add_policy_options, emit_json

    parser = Parser(prog="hisparse versions",
                    description="Every SGLang release, the policy version that models it (use it with "
                                "--policy sglang==RELEASE), and what `hisparse conform` found against that "
                                "release's own code (the saved reports of docs/conformance/).")
    add_policy_options(parser, with_ref=False)
    parser.add_argument("--policy-dir", metavar="DIR",
                        help="folder of policy families (default: $HISPARSE_POLICY_DIR or the shipped policies)")
    parser.add_argument("--format", choices=("text", "json", "markdown"), default="text")
    ns = parser.parse_args(argv)
    found = rows(ns.policy_dir)
    if ns.format == "json":
        emit_json({"releases": found})
    elif ns.format == "markdown":
        print(markdown_table(found))
    else:
        print(text_table(found))
        missing = sum(r["conformance"] is None for r in found)
        if missing:
            print(f"not run: no saved conform report of that version against that release "
                  f"({missing} of {len(found)})", file=sys.stderr)
    return OK
