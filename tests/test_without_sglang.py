"""The suite on a machine without SGLang (tests/hide_sglang.py hides the installed one): every
test file collects, and the tests that need SGLang skip, naming why, instead of failing to collect."""
import glob
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _pytest(*args):
    env = {k: v for k, v in os.environ.items() if k != "CI"}  # under CI a missing SGLang is a failure
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "tests.hide_sglang", "-p", "no:cacheprovider",
                           *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)


def _summary(out: str) -> str:
    return out.strip().splitlines()[-1]


def test_sglang_is_hidden_from_the_child():
    probe = subprocess.run([sys.executable, "-c", "import tests.hide_sglang\n"
                            "from engine.sglang.conform import drivers\n"
                            "print(drivers.installed_release())\n"
                            "try:\n    import sglang.srt.server_args\nexcept ModuleNotFoundError as e:\n    print('missing', e.name)"],
                           cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert probe.stdout.split() == ["None", "missing", "sglang"], probe.stdout + probe.stderr


def test_the_whole_suite_collects_without_sglang():
    proc = _pytest("-q", "--collect-only")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and re.fullmatch(r"\d+ tests collected in .*", _summary(out)), out[-3000:]


def _asking(at_import: bool) -> list[str]:
    """The test files that ask tests/sglang_release.py for SGLang (at_import: at module level)."""
    out = []
    for path in sorted(glob.glob(os.path.join(ROOT, "tests", "test_*.py"))):
        text = open(path, encoding="utf-8").read()
        if not re.search(r"^(from|import) tests\.sglang_release\b", text, re.M) \
                or path.endswith("test_sglang_plugin_releases.py"):  # a release environment's own run
            continue
        if not at_import or re.search(r"^(\w+ = )?require\(", text, re.M):
            out.append(os.path.relpath(path, ROOT))
    return out


@pytest.mark.parametrize("at_import", [True, pytest.param(False, marks=pytest.mark.whole)])
def test_the_tests_that_need_sglang_skip_without_it(at_import):
    """The files that ask for SGLang at import (make test), or every file that asks for it at all
    (make test-whole), run: what needs SGLang skips naming why, the rest passes."""
    files = _asking(at_import) + (["tests/test_sglang_release.py"] if at_import else [])
    assert len(files) >= 5
    proc = _pytest("-q", "-rs", *files)
    out = proc.stdout + proc.stderr
    summary = _summary(out)
    assert proc.returncode == 0 and re.fullmatch(r"\d+ passed, \d+ skipped in .*", summary), out[-3000:]
    assert re.search(r"SKIPPED \[\d+\] .*SGLang is not installed here", out), out[-3000:]
