"""Time the test targets as a user runs them and record it (bench/results/tests.json), for the
README's figures (`python -m tools.doc_blocks` renders them): `python -m tools.test_times [test]
[test-whole]` runs each target's pytest command (the Makefile's) and keeps pytest's own seconds,
the tests run, and the load of the machine while it ran."""
from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "bench", "results", "tests.json")
# each target's pytest command, as the Makefile runs it
TARGETS = {"test": (["-n", "auto"], {}), "test-whole": (["-n", "auto", "-m", "whole"], {"HISPARSE_WHOLE": "1"})}


def run(target: str) -> dict:
    args, env = TARGETS[target]
    start, load = time.monotonic(), os.getloadavg()[0]
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rf", "-p", "no:cacheprovider", *args], cwd=ROOT,
                          env=dict(os.environ, **env), capture_output=True, text=True)
    wall = time.monotonic() - start
    summary = proc.stdout.strip().splitlines()[-1]
    seconds = re.search(r" in ([\d.]+)s", summary)
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|deselected|errors?)", summary)}
    failed = [line.split(" ", 2)[1] for line in proc.stdout.splitlines() if line.startswith(("FAILED ", "ERROR "))]
    return {"exit_code": proc.returncode, "pytest_seconds": float(seconds.group(1)) if seconds else None,
            "failed_tests": failed,
            "wall_seconds": round(wall, 1), "counts": counts, "load_average_before": round(load, 2),
            "load_average_after": round(os.getloadavg()[0], 2)}


def main(argv=None) -> int:
    targets = (argv if argv is not None else sys.argv[1:]) or list(TARGETS)
    try:
        with open(RESULTS, encoding="utf-8") as fh:
            results = json.load(fh)
    except FileNotFoundError:
        results = {}
    results["how"] = ("python -m tools.test_times: each target's pytest command as the Makefile runs it, "
                      "timed by pytest itself")
    results["machine"] = f"{os.cpu_count()} CPUs, Python {platform.python_version()}"
    for target in targets:
        results[target] = run(target)
        print(f"make {target}: {results[target]}")
    with open(RESULTS, "w", encoding="utf-8") as fh:
        json.dump(results, fh, indent=1)
        fh.write("\n")
    return 0 if all(results[t]["exit_code"] == 0 for t in targets) else 1


if __name__ == "__main__":
    sys.exit(main())
