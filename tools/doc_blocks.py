"""Generated parts of the README and docs/*.md, kept true by a test: `python -m tools.doc_blocks` rewrites
every block between `<!-- BEGIN name -->` and `<!-- END name -->` markers in every page that has
one (`python -m tools.doc_blocks PAGE ...`: those pages only; `--check`: exit 1 naming the stale ones,
writing nothing)."""
from __future__ import annotations

import json
import os
import re
import sys

from engine.errors import CODES


def codes_table() -> str:
    rows = ["| code | name | meaning |", "|---|---|---|"]
    rows += [f"| {code} | {slug} | {text} |" for code, (slug, text) in CODES.items()]
    return "\n".join(rows)


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFORMANCE = os.path.join(ROOT, "docs", "conformance")


def conformance_table() -> str:
    """One row per saved `hisparse conform --format json` report in docs/conformance/."""
    rows = ["| policy | models | run against | configs | agree | out of scope | differ | run time |",
            "|---|---|---|---:|---:|---:|---:|---:|"]
    notes = []
    for name in sorted(os.listdir(CONFORMANCE)) if os.path.isdir(CONFORMANCE) else []:
        if not name.endswith(".json"):
            continue
        with open(os.path.join(CONFORMANCE, name), encoding="utf-8") as fh:
            r = json.load(fh)
        ref = f"{r['policy']['family']}@{r['policy']['version']}"
        c = r["counts"]
        scope = f"{r['total']:,}" + (f" (sample, seed {r['sample']['seed']})" if r.get("sample") else "")
        minutes = f"{r['seconds'] / 60:.0f} min" if r["seconds"] >= 120 else f"{r['seconds']:.0f} s"
        rows.append(f"| `{ref}` | {r['policy']['upstream']} | SGLang {r['sglang']} | {scope} | {c['agree']:,} | "
                    f"{c['out_of_scope']:,} | {c['differ']:,} | {minutes}"
                    + (f" on {r['workers']} workers" if r.get("workers") else "") + " |")
        shown = r["groups"][:6]
        for g in shown:
            notes.append(f"- `{ref}` vs SGLang {r['sglang']}, {g['count']:,} configs: {g['change']}"
                         + (f" (where `{g['where']}`)" if g["where"] else
                            f" (`{g['text'][0]}`)" if len(g["text"]) == 1 else ""))
        if len(r["groups"]) > len(shown):
            notes.append(f"- `{ref}` vs SGLang {r['sglang']}: {len(r['groups']) - len(shown)} smaller groups, "
                         f"{sum(g['count'] for g in r['groups'][len(shown):]):,} configs "
                         f"(docs/conformance/{name} lists them all)")
    return "\n".join(rows + ([""] + notes if notes else []))


def _reports() -> dict:
    """policy reference -> the saved `hisparse conform --format json` report of it."""
    out = {}
    for name in sorted(os.listdir(CONFORMANCE)) if os.path.isdir(CONFORMANCE) else []:
        if name.endswith(".json"):
            with open(os.path.join(CONFORMANCE, name), encoding="utf-8") as fh:
                r = json.load(fh)
            out[f"{r['policy']['family']}@{r['policy']['version']}"] = r
    return out


def versions_table() -> str:
    """Every SGLang release: the version that models it and what `hisparse conform` found against
    that release (its saved report in docs/conformance/, else "not run"); `hisparse versions`."""
    from engine.cli.versions import markdown_table, rows

    return markdown_table(rows(reports=CONFORMANCE))


def install_sizes() -> str:
    """What `make run` and `make test` install from a fresh clone, as measured (bench/results/install.json)."""
    path = os.path.join(ROOT, "bench", "results", "install.json")
    with open(path, encoding="utf-8") as fh:
        r = json.load(fh)
    run, test = r["make_run"], r["make_test_adds"]

    def mb(mib):
        return f"{mib / 1024:.2f} GB" if mib >= 1024 else f"{mib} MB"

    def largest(d):
        return ", ".join(f"{name} {mb(size)}" for name, size in d.items())

    return (f"From a fresh clone `make run` installed {mb(run['venv_mib'])} into `.venv` ({largest(run['largest'])}, "
            f"the CPU build) "
            f"in {run['cpu_seconds']:.0f} s of CPU ({run['wall_seconds'] // 60} min {run['wall_seconds'] % 60} s "
            f"of wall time); `make test` then added {mb(test['venv_mib'] - run['venv_mib'])} "
            f"({largest(test['largest'])}) in {test['cpu_seconds']:.0f} s of CPU. {r['machine']}; how: "
            f"bench/results/install.json.")


def test_times() -> str:
    """How long each test target's pytest takes, as measured (bench/results/tests.json)."""
    with open(os.path.join(ROOT, "bench", "results", "tests.json"), encoding="utf-8") as fh:
        r = json.load(fh)

    def took(t):
        s = round(t["pytest_seconds"])
        return f"{s // 60} min {s % 60} s"

    test, whole = r["test"], r["test-whole"]
    return (f"`make test` ran {test['counts']['passed']:,} tests in {took(test)} of pytest; `make test-whole` "
            f"(what `make test` runs on samples and smaller domains, whole; CI runs both) "
            f"{whole['counts']['passed']:,} in {took(whole)}. {r['machine']}, load average "
            f"{test['load_average_before']:g} before; how: bench/results/tests.json.")


def blocks() -> dict:
    """name -> generated markdown. Further generators register here (e.g. the routing table)."""
    from engine.sglang.models import models_table

    out = {"error-codes": codes_table, "model-paths": models_table, "conformance": conformance_table,
           "versions": versions_table, "install": install_sizes, "test-times": test_times}
    try:
        from tools.routing_tables import readme_table
    except ImportError:  # pragma: no cover - the table module is optional during bootstrap
        pass
    else:
        out["routing-table"] = readme_table
    try:  # in the source tree only: the benchmark results live beside the code, not in the package
        from bench.report import performance_notes, performance_table
    except ImportError:
        pass
    else:
        out["performance"] = performance_table
        out["performance-notes"] = performance_notes
        from bench.report import accuracy_table, headline, plugin_own_tests, plugin_startup

        out["accuracy"] = accuracy_table
        out["plugin-startup"] = plugin_startup
        out["plugin-own-tests"] = plugin_own_tests
        out["headline"] = headline
    return out


_BLOCK = re.compile(r"(<!-- BEGIN (?P<name>[a-z-]+) -->\n)(?P<body>.*?)(<!-- END (?P=name) -->)", re.S)


def render(text: str) -> str:
    gens = blocks()

    def sub(m):
        gen = gens.get(m.group("name"))
        if gen is None:
            return m.group(0)
        return m.group(1) + gen().rstrip("\n") + "\n" + m.group(4)

    return _BLOCK.sub(sub, text)


def stale_blocks(text: str) -> list[str]:
    """Names of generated blocks whose text differs from what the generators produce now."""
    gens = blocks()
    return [m.group("name") for m in _BLOCK.finditer(text)
            if m.group("name") in gens and m.group("body").rstrip("\n") != gens[m.group("name")]().rstrip("\n")]


def unknown_blocks(text: str) -> list[str]:
    """Names of marked blocks no generator produces (a misspelt name would never be rewritten)."""
    gens = blocks()
    return [m.group("name") for m in _BLOCK.finditer(text) if m.group("name") not in gens]


def pages(root: str = ROOT) -> list[str]:
    """The README and every docs page, relative to root: the pages the documentation is made of."""
    docs = os.path.join(root, "docs")
    return ["README.md"] + sorted(os.path.join("docs", n) for n in os.listdir(docs) if n.endswith(".md"))


def generated_pages(root: str = ROOT) -> list[str]:
    """The pages holding at least one generated block."""
    found = []
    for page in pages(root):
        with open(os.path.join(root, page), encoding="utf-8") as fh:
            if _BLOCK.search(fh.read()):
                found.append(page)
    return found


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    check = "--check" in argv
    paths = [a for a in argv if a != "--check"] or [os.path.join(ROOT, p) for p in generated_pages()]
    stale = []
    for path in paths:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
        if check:
            stale += [f"{path}: {name}" for name in stale_blocks(text)]
            continue
        new = render(text)
        if new != text:
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(new)
            print(f"updated {os.path.relpath(path)}")
    for line in stale:
        print(f"stale: {line} (run `python -m tools.doc_blocks`)", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
