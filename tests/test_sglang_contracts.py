"""Each function the plugin replaces keeps its contract when called by itself: SGLang's own
function and the plugin's replacement (on the release's shipped version) give the same return
value, exception type and text, log lines and written fields, for argument objects that carry
only the fields the function reads, on CUDA and ROCm, Hopper and Blackwell, DSA and other models
(tests/sglang_contract_probe.py, run in the release's own Python).

This is the contract test of releases 0.5.11 to 0.5.14, which have no unit tests of their own for
these functions, and an addition to SGLang's own tests for the later ones
(tests/test_sglang_own_tests.py). Which SGLang: the release environment HISPARSE_PLUGIN_RELEASE_ENV
names (tools/conform-releases.sh), else the installed one."""
from __future__ import annotations

import json
import os
import subprocess

from tests.helpers import ROOT
from tests.sglang_release import release_environment

PROBE = os.path.join(ROOT, "tests", "sglang_contract_probe.py")


def test_every_replaced_function_called_alone_answers_as_sglangs_own(tmp_path_factory):
    python, env, release = release_environment(tmp_path_factory)
    proc = subprocess.run([python, "-W", "ignore", PROBE], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=900)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("PROBE ")]
    assert proc.returncode == 0 and lines, proc.stdout[-2000:] + proc.stderr[-4000:]
    report = json.loads(lines[-1][len("PROBE "):])
    from engine.sglang.hook_targets import family_of

    family = family_of(release)
    called = {t for t in family.replace if not t.endswith(".check_server_args")}
    assert report["release"] == release and set(report["calls"]) == called, report["calls"]
    assert all(n >= 90 for n in report["calls"].values()), report["calls"]
    assert report["differ"] == 0, json.dumps(report["first_differences"], indent=1)
