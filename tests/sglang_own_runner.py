"""Run inside an SGLang release's Python by tests/test_sglang_own_tests.py (not a test module
itself): SGLang's own unit tests of the functions the plugin replaces, as SGLang's CI runs them,
with SGLang's own plugin loader run first.

    python tests/sglang_own_runner.py FOLDER OUT.json

FOLDER holds SGLang's test modules (test_*.py) beside the loader they share
(../conftest_plugin_loader.py: torchvision stand-in, then `sglang.srt.plugins.load_plugins()`);
the caller puts FOLDER and its parent on PYTHONPATH, as they import by those names.
Whether the plugin acts is up to HISPARSE_POLICY, as in a real launch. The tests are
unittest.TestCase classes; each one's outcome ("passed", or "failed: ..." / "error: ..." with the
exception's last line, or "skipped") and the suite's run time (wall and CPU) go to OUT.json.

`sglang.test.test_utils` imports the `datasets` package for its benchmark helpers, which none of
these tests use: where `datasets` is not installed an inert module stands in for it, in every
run alike (with and without the plugin)."""
from __future__ import annotations

import importlib.util
import io
import json
import os
import sys
import time
import types
import unittest


def _datasets_standin() -> None:
    if importlib.util.find_spec("datasets") is not None:
        return
    module = types.ModuleType("datasets")

    def load_dataset(*args, **kwargs):
        raise RuntimeError("the datasets package is not installed (an inert stand-in answered its import)")

    module.load_dataset = load_dataset
    sys.modules["datasets"] = module


def _ids(suite) -> list:
    out = []
    for test in suite:
        out.extend(_ids(test) if isinstance(test, unittest.TestSuite) else [test.id()])
    return out


CHAINED = ("\nDuring handling of the above exception, another exception occurred:\n",
           "\nThe above exception was the direct cause of the following exception:\n")


def _exception(text: str) -> str:
    """The exceptions of a formatted traceback, each as its type and whole message on one line,
    the last raised first (SGLang's CustomTestCase retries a failing test, then raises its own
    exception over the test's)."""
    for marker in CHAINED:
        text = text.replace(marker, "\x00")
    parts = []
    for section in text.split("\x00"):
        lines = section.rstrip().splitlines()
        frames = [i for i, line in enumerate(lines) if line.startswith("  File ")]
        start = frames[-1] + 1 if frames else 0
        while start < len(lines) and lines[start].startswith(" "):
            start += 1
        parts.append(" ".join(line.strip() for line in lines[start:] if line.strip())[:1000])
    return " <- ".join(reversed(parts))


def main(folder: str, out_path: str) -> None:
    _datasets_standin()
    import conftest_plugin_loader  # noqa: F401  (SGLang's load_plugins(), before the tests import)

    suite = unittest.TestSuite()
    loader = unittest.TestLoader()
    for name in sorted(os.listdir(folder)):
        if name.startswith("test_") and name.endswith(".py"):
            suite.addTests(loader.loadTestsFromName(name[:-3]))
    ids = _ids(suite)
    start, cpu = time.perf_counter(), time.process_time()
    result = unittest.TextTestRunner(stream=io.StringIO(), verbosity=0).run(suite)
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    outcomes = dict.fromkeys(ids, "passed")
    for kind, items in (("failed", result.failures), ("error", result.errors)):
        for test, text in items:
            outcomes[test.id()] = f"{kind}: {_exception(text)}"
    for test, _ in result.skipped:
        outcomes[test.id()] = "skipped"
    with open(out_path, "w", encoding="utf-8") as fh:
        json.dump({"outcomes": outcomes, "seconds": seconds, "cpu_seconds": cpu,
                   "policy": os.environ.get("HISPARSE_POLICY")}, fh, indent=1)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
