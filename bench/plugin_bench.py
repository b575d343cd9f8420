"""The SGLang plugin's cost, measured side by side with SGLang alone in the same run (the installed
SGLang, 0.5.23 with `make install`):

- SGLang's own unit tests of the functions the plugin replaces (tests/sglang_own_runner.py on the
  folder HISPARSE_SGLANG_TESTS names, else ../shared/sglang-tests): the suite's time without the
  plugin and with it on the shipped policy, each run a fresh process, in alternation; the figure is
  the median of the paired ratios of the suite's own time (SGLang's import before it is the same
  work in both), the process CPU times beside it. Goal: at most 1.10.

Without SGLang or SGLang's tests the result says why, and sets no figure."""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile

from bench.common import ROOT, child_env, goal, write_result

RUNNER = os.path.join(ROOT, "tests", "sglang_own_runner.py")


def _own_tests_folder() -> str | None:
    from engine.sglang import registry

    release = registry.installed_release()
    row = registry.release(release) if release else None
    root = os.environ.get("HISPARSE_SGLANG_TESTS") or os.path.join(os.path.dirname(ROOT), "shared", "sglang-tests")
    if row is None or row.own_tests is None or not os.path.isdir(os.path.join(root, row.own_tests)):
        return None
    return os.path.join(root, row.own_tests)


def _suite_run(folder: str, policy: str | None) -> tuple[float, float, dict]:
    """(the suite's own seconds, the process's CPU seconds, outcomes) of one run."""
    import resource

    env = child_env()
    for key in [k for k in env if k.startswith(("HISPARSE_", "SGLANG_"))]:
        del env[key]
    if policy:
        env["HISPARSE_POLICY"] = policy
    # SGLang's test modules and its plugin-loader conftest import by their folder's names
    env["PYTHONPATH"] = os.pathsep.join([folder, os.path.dirname(folder)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "out.json")
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        proc = subprocess.run([sys.executable, "-W", "ignore", RUNNER, folder, out], cwd=tmp, env=env,
                              capture_output=True, text=True)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if proc.returncode != 0:
            raise RuntimeError(f"SGLang's own tests did not run: {proc.stderr[-1000:]}")
        with open(out, encoding="utf-8") as fh:
            result = json.load(fh)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return result["seconds"], cpu, result["outcomes"]


def own_tests(quick: bool) -> tuple[dict, dict, list]:
    folder = _own_tests_folder()
    if folder is None:
        return {}, {}, ["SGLang's own tests not run: no installed SGLang with unit tests of these functions, or "
                        "no folder of SGLang's tests (HISPARSE_SGLANG_TESTS)"]
    from engine.sglang.registry import installed_release

    policy = f"sglang=={installed_release()}"
    repeats = 3 if quick else 7
    runs = {"without": [], "with": []}
    outcomes = {}
    for _ in range(repeats):
        for name, ref in (("without", None), ("with", policy)):
            suite, cpu, outcomes[name] = _suite_run(folder, ref)
            runs[name].append((suite, cpu))
    if outcomes["with"] != outcomes["without"]:
        raise RuntimeError("SGLang's own tests give other results with the plugin: tests/test_sglang_own_tests.py")
    ratios = [w[0] / max(o[0], 1e-9) for o, w in zip(runs["without"], runs["with"])]
    figures = {
        "own_tests": {
            "release": installed_release(), "folder": os.path.basename(folder), "repeats": repeats,
            "tests": len(outcomes["without"]),
            "passed": sum(o == "passed" for o in outcomes["without"].values()),
            "failing_without_the_plugin_too": sorted(t for t, o in outcomes["without"].items() if o != "passed"),
            "suite_seconds": {k: round(statistics.median(s for s, _ in v), 4) for k, v in runs.items()},
            "process_cpu_seconds": {k: round(statistics.median(c for _, c in v), 3) for k, v in runs.items()},
            "suite_ratio_median": round(statistics.median(ratios), 4),
            "process_cpu_ratio": round(statistics.median(c for _, c in runs["with"])
                                       / statistics.median(c for _, c in runs["without"]), 4),
        }
    }
    goals = {"own_tests_suite_ratio": goal(figures["own_tests"]["suite_ratio_median"], 1.10, "max", "x")}
    return figures, goals, []


def run(quick: bool) -> str:
    figures, goals, notes = own_tests(quick)
    return write_result("plugin", figures, goals, quick, notes)
