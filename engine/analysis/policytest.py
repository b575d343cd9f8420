"""`hisparse test`: policy test cases and rule coverage.

A test file (`policies/<family>/tests/v<N>.yaml`, schema `policies/schema/tests.schema.json`)
holds cases: a config and what the policy must decide. Cases run through the interpreter, whose
trace gives rule coverage. A rule counts as covered when a case shows it doing its job:
- a resolve rule that rewrites or logs: it applied; a resolve requirement: it failed (stopped);
- a default rule: it was the one chosen;
- a check: it was violated (for per-phase checks, in any phase).
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from engine.errors import ConfigError, PolicyError, Problem
from engine.explain.trace import Trace
from engine.files.schema import schema_problems
from engine.suggest import did_you_mean
from engine.files.load import load_document
from engine.files.reading import ReadError

_TEST_FILE = re.compile(r"^v(\d+)\.ya?ml$")


@dataclass
class CaseResult:
    name: str
    line: int
    passed: bool
    mismatches: list = field(default_factory=list)  # [(what, expected, actual)]


@dataclass
class FileResult:
    file: str
    policy: object
    cases: list
    covered: set

    @property
    def failed(self) -> list:
        return [c for c in self.cases if not c.passed]


def test_files(paths: list[str], policy_dir: str) -> list[str]:
    if not paths:
        paths = [policy_dir]
    out = []
    for path in paths:
        if os.path.isdir(path):
            for folder, dirs, files in os.walk(path):
                dirs.sort()
                if os.path.basename(folder) == "tests":
                    out += [os.path.join(folder, f) for f in sorted(files) if _TEST_FILE.match(f)]
        else:
            out.append(path)
    return out


def load_cases(path: str, policy_dir: str | None = None, display: str | None = None):
    """(policy, document) of a test file; raises PolicyError with every problem of the file."""
    from engine.files.catalog import looks_like_path
    from engine.policy.loader import load_policy

    display = display or path
    try:
        doc = load_document(path, display)
    except ReadError as exc:
        raise PolicyError(exc.problems) from None
    if not isinstance(doc.data, dict):
        raise PolicyError([doc.problem("T701", "a test file is a mapping with 'cases'", ())])
    problems = schema_problems(doc, "tests", "T701")
    if problems:
        raise PolicyError(problems)
    ref = doc.data.get("policy")
    if ref is None:
        m = _TEST_FILE.match(os.path.basename(path))
        family = os.path.basename(os.path.dirname(os.path.dirname(os.path.abspath(path))))
        if not m or os.path.basename(os.path.dirname(os.path.abspath(path))) != "tests":
            raise PolicyError([doc.problem("T701", "no 'policy' key and the file is not at "
                                                   "<family>/tests/v<N>.yaml", ())])
        policy_path = os.path.join(os.path.dirname(os.path.dirname(path)), f"v{m.group(1)}.yaml")
        policy_display = os.path.join(os.path.dirname(os.path.dirname(display)), f"v{m.group(1)}.yaml")
        from engine.policy.loader import load_file

        policy = load_file(policy_path, policy_display) if os.path.exists(policy_path) else \
            load_policy(f"{family}@{m.group(1)}", policy_dir)
    elif looks_like_path(ref):  # a path in a test file is relative to that file
        policy = load_policy(os.path.join(os.path.dirname(path), os.path.expanduser(ref)))
    else:
        policy = load_policy(ref, policy_dir)
    _check_names(policy, doc)
    return policy, doc


def _check_names(policy, doc) -> None:
    problems = []
    rules = [r.name for r in policy.rule_list]
    for i, case in enumerate(doc.data["cases"]):
        exp = case["expect"]
        base = ("cases", i, "expect")
        for key in ("backends", "sources"):
            for phase in exp.get(key, {}):
                if phase not in policy.phases:
                    problems.append(doc.problem("T702", f"unknown phase '{phase}'", base + (key, phase), key=True,
                                                hint=did_you_mean(phase, policy.phases)))
        names = ([exp["rejected_by"]] if "rejected_by" in exp else []) + list(exp.get("violations", []))
        for name in names:
            if name not in rules:
                problems.append(doc.problem("T702", f"unknown rule '{name}'", base, hint=did_you_mean(name, rules)))
        for key in exp.get("config", {}):
            if policy.canonical_key(key) is None:
                problems.append(doc.problem("T702", f"unknown input '{key}'", base + ("config", key), key=True,
                                            hint=did_you_mean(key, policy.input_names)))
    if problems:
        raise PolicyError(problems)


def run_file(path: str, policy_dir: str | None = None, display: str | None = None) -> FileResult:
    policy, doc = load_cases(path, policy_dir, display)
    results = []
    covered: set = set()
    for i, case in enumerate(doc.data["cases"]):
        line = doc.pos(("cases", i))[0]
        results.append(_run_case(policy, case, line, covered))
    return FileResult(display or path, policy, results, covered)


def _run_case(policy, case: dict, line: int, covered: set) -> CaseResult:
    exp = case["expect"]
    res = CaseResult(case["name"], line, True)

    def check(what, expected, actual):
        if expected != actual:
            res.passed = False
            res.mismatches.append((what, expected, actual))

    try:
        decision, events = policy.trace(case["config"])
    except ConfigError as exc:
        first = exc.problems[0]
        if exp.get("error") != first.code:
            res.passed = False
            res.mismatches.append(("error", exp.get("error"), str(first)))
        return res
    if "error" in exp:
        check("error", exp["error"], None)
    for step in Trace(events).steps:
        r = step.rule
        if r is None:
            continue
        if (r.stage == "resolve" and r.require is None and step.holds) or step.chosen or step.violated:
            covered.add(r.name)
    expect_ok = exp.get("ok", not any(k in exp for k in ("rejected_by", "message", "violations", "error")))
    check("ok", expect_ok, decision.ok)
    if "backends" in exp:
        check("backends", exp["backends"], {ph: decision.backends[ph] for ph in exp["backends"]})
    if "sources" in exp:
        check("sources", exp["sources"], {ph: decision.sources[ph] for ph in exp["sources"]})
    if "config" in exp:
        want = {policy.canonical_key(k): v for k, v in exp["config"].items()}
        check("config", want, {k: decision.config[k] for k in want})
    if "log" in exp:
        check("log", exp["log"], decision.log)
    first = decision.violations[0] if decision.violations else None
    if "rejected_by" in exp:
        check("rejected_by", exp["rejected_by"], first.check if first else None)
    if "message" in exp:
        check("message", exp["message"], first.message if first else None)
    if "violations" in exp:
        check("violations", exp["violations"], [v.check for v in decision.violations])
    return res


def coverage(result: FileResult) -> tuple[int, int, list]:
    rules = result.policy.rule_list
    missing = [r for r in rules if r.name not in result.covered]
    return len(rules) - len(missing), len(rules), missing


def what_covers(rule) -> str:
    if rule.stage == "resolve":
        return "stop evaluation" if rule.require is not None else "apply"
    if rule.stage == "defaults":
        return "be chosen"
    return "be violated"


def report_json(results: list[FileResult]) -> dict:
    files = []
    for fr in results:
        done, total, missing = coverage(fr)
        files.append({
            "file": fr.file, "policy": fr.policy.identity(),
            "cases": len(fr.cases), "passed": len(fr.cases) - len(fr.failed),
            "failures": [{"name": c.name, "line": c.line,
                          "mismatches": [{"what": w, "expected": e, "actual": a} for w, e, a in c.mismatches]}
                         for c in fr.failed],
            "coverage": {"covered": done, "total": total,
                         "percent": round(100.0 * done / total, 2) if total else 100.0,
                         "missing": [r.name for r in missing]},
        })
    return {"ok": all(not f["failures"] for f in files), "files": files}


def run(paths: list[str], policy_dir: str | None = None) -> tuple[list[FileResult], list[Problem]]:
    from engine.files.shipped import policy_root
    from engine.files.catalog import display_dir

    root = policy_root(policy_dir)
    files = test_files(paths, root)
    results, problems = [], []
    for path in files:
        display = path
        if not paths:
            display = os.path.join(display_dir(root), os.path.relpath(path, root))
        try:
            results.append(run_file(path, policy_dir, display))
        except PolicyError as exc:
            problems += exc.problems
    if not files:
        problems.append(Problem("T701", "no policy test files found (<family>/tests/v<N>.yaml)",
                                ", ".join(paths) if paths else display_dir(root)))
    return results, problems
