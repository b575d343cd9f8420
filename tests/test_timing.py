"""No test asserts a speed: a comparison of a wall-clock reading (time.perf_counter,
time.monotonic, time.time) with a bound fails on a loaded machine, so none appears in an assert.
Waits that poll a condition with a deadline (a hang guard) are fine; work is bounded by CPU time
(time.process_time, resource.getrusage), sizes and counts."""
import ast
import os

from tests.helpers import ROOT, python_files

WALL = {"perf_counter", "monotonic", "time", "perf_counter_ns", "monotonic_ns", "time_ns"}


def _reads_wall_clock(node) -> bool:
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in WALL
               and isinstance(n.func.value, ast.Name) and n.func.value.id == "time" for n in ast.walk(node))


def _asserts_on_wall_clock(path) -> list[str]:
    with open(path, encoding="utf-8") as fh:
        tree = ast.parse(fh.read(), path)
    # names bound from a wall-clock reading (start = time.perf_counter(); elapsed = ... - start)
    tainted = set()
    for _ in range(3):
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and (_reads_wall_clock(node.value) or any(
                    isinstance(n, ast.Name) and n.id in tainted for n in ast.walk(node.value))):
                tainted.update(t.id for t in node.targets if isinstance(t, ast.Name))
    bad = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assert) and (_reads_wall_clock(node.test) or any(
                isinstance(n, ast.Name) and n.id in tainted for n in ast.walk(node.test))):
            bad.append(f"{os.path.relpath(path, ROOT)}:{node.lineno}")
    return bad


def test_no_test_asserts_on_a_wall_clock():
    bad = [where for path in python_files("tests", "bench") for where in _asserts_on_wall_clock(path)]
    assert bad == []


def test_the_checker_finds_one(tmp_path):
    sample = tmp_path / "t.py"
    sample.write_text("import time\nstart = time.perf_counter()\nwork()\nelapsed = time.perf_counter() - start\n"
                      "assert elapsed < 5\nassert time.monotonic() - start < 5\nok = time.process_time()\n"
                      "assert ok < 5\n")
    assert [w.rsplit(":", 1)[1] for w in _asserts_on_wall_clock(str(sample))] == ["5", "6"]
