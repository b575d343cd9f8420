"""From a built wheel, without the checkout: every module of the source tree is in it, every
command runs on the shipped policies (a package left out of pyproject's list, engine.explain,
made evaluate an internal error), and `hisparse versions` prints the README's table, from the
saved conform reports the wheel ships (engine/conformance/); before they were shipped it said
"not run" for every release."""
import glob
import os
import re
import subprocess
import sys
import zipfile

import pytest

from tests.helpers import ROOT


@pytest.fixture(scope="module")
def wheel_site(tmp_path_factory):
    """The built wheel's files, unpacked as an install would place them."""
    import shutil

    out = tmp_path_factory.mktemp("wheel")
    source = out / "source"  # a clean copy: no build folder of an earlier build leaks into the wheel
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(".git", ".venv", "build", "*.egg-info",
                                                                 "__pycache__", ".pytest_cache", "*.so"))
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                           "-w", str(out), str(source)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    [wheel] = glob.glob(str(out / "*.whl"))
    site = out / "site"
    zipfile.ZipFile(wheel).extractall(site)
    return str(site)


# the checkout's editable install answers imports the wheel cannot (a module the wheel lacks would
# be found in the checkout): its finder leaves sys.meta_path before the wheel's code is imported
WHEEL_ONLY = ("import runpy, sys; sys.meta_path[:] = [f for f in sys.meta_path if not "
              "getattr(f, '__module__', '').startswith('__editable__')]; sys.argv[0] = 'hisparse'; "
              "runpy.run_module('kernels_bridge.cli', run_name='__main__', alter_sys=True)")


def _run(site, cwd, *argv):
    env = {k: v for k, v in os.environ.items() if not k.startswith("HISPARSE_")}
    env["PYTHONPATH"] = site
    return subprocess.run([sys.executable, "-c", WHEEL_ONLY, *argv], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def test_the_wheel_ships_every_saved_report(wheel_site):
    saved = sorted(os.path.basename(p) for p in glob.glob(os.path.join(ROOT, "docs", "conformance", "*.json")))
    shipped = sorted(os.listdir(os.path.join(wheel_site, "engine", "conformance")))
    assert saved and [f for f in shipped if f.endswith(".json")] == saved


def test_versions_from_the_wheel_prints_the_readme_table(wheel_site, tmp_path):
    probe = _run(wheel_site, str(tmp_path), "versions", "--format", "markdown")
    assert probe.returncode == 0, probe.stderr
    readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    block = re.search(r"<!-- BEGIN versions -->\n(.*?)\n<!-- END versions -->", readme, re.S).group(1)
    assert probe.stdout.strip() == block.strip()
    assert "not run" not in probe.stdout
    text = _run(wheel_site, str(tmp_path), "versions")
    assert text.returncode == 0 and "not run" not in text.stdout + text.stderr
    where = subprocess.run([sys.executable, "-c", "import engine; print(engine.__file__)"], cwd=str(tmp_path),
                           env=dict(os.environ, PYTHONPATH=wheel_site), capture_output=True, text=True)
    assert where.stdout.strip().startswith(wheel_site)  # the wheel's engine ran, not the checkout's


def test_a_launch_command_is_held_to_the_releases_flags_from_the_wheel(wheel_site, tmp_path):
    """The release flag table ships as package data: a launch flag SGLang 0.5.13 lacks is refused
    from an installed wheel as from the checkout."""
    proc = _run(wheel_site, str(tmp_path), "evaluate", "--policy", "sglang==0.5.13", "--", "python", "-m",
                "sglang.launch_server", "--model-path", "deepseek-ai/DeepSeek-V4", "--enable-prefill-cp")
    assert proc.returncode == 2, proc.stderr
    assert "'--enable-prefill-cp': SGLang 0.5.13, 0.5.13.post1's parser refuses it" in proc.stderr
    assert "internal error" not in proc.stderr


def _modules(top: str) -> set:
    """The .py files under top's engine/ and kernels_bridge/, relative to top."""
    out = set()
    for package in ("engine", "kernels_bridge"):
        for folder, dirs, files in os.walk(os.path.join(top, package)):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            out.update(os.path.relpath(os.path.join(folder, f), top) for f in files if f.endswith(".py"))
    return out


def test_the_wheel_holds_every_module_of_the_source_tree(wheel_site):
    source = _modules(ROOT)
    assert "engine/explain/words.py" in source  # the package once left out
    assert source - _modules(wheel_site) == set()


SETTING = ("--enable-hisparse", "--kv-cache-dtype", "fp8_e4m3", "--disable-radix-cache")


@pytest.mark.parametrize("argv, code, said", [
    (("evaluate",) + SETTING, 0, "prefill: flashmla_kv"),
    (("explain",) + SETTING, 0, "Policy dsa-backends@"),
    (("check",), 0, "0 problem(s)"),
    (("table", "--policy", "dsa-backends@1"), 0, "Routing table of dsa-backends@1"),
    (("test",), 0, "cases passed"),
    (("diff", "dsa-backends@1", "dsa-backends@2"), 1, "dsa-backends@1 -> dsa-backends@2"),
    (("attend", "--no-kernel", "--trace", "TRACE"), 0, "hit rate"),  # the checkout's example trace
    (("policies", "export", "OUT"), 0, "exported"),
], ids=lambda v: v[0] if isinstance(v, tuple) else None)
def test_every_command_runs_from_the_wheel(wheel_site, tmp_path, argv, code, said):
    given = {"OUT": str(tmp_path / "out"), "TRACE": os.path.join(ROOT, "examples", "decode-trace.jsonl")}
    argv = [given.get(a, a) for a in argv]
    proc = _run(wheel_site, str(tmp_path), *argv)
    assert proc.returncode == code, proc.stderr[-2000:]
    assert said in proc.stdout and "internal error" not in proc.stderr


def test_a_recorded_decision_replays_from_the_wheel(wheel_site, tmp_path):
    record = str(tmp_path / "r.jsonl")
    made = _run(wheel_site, str(tmp_path), "evaluate", "--record", record, *SETTING)
    assert made.returncode == 0, made.stderr
    replayed = _run(wheel_site, str(tmp_path), "replay", "--policy", "dsa-backends@1", record)
    # dsa-backends@1 (SGLang 0.5.11) took HiSparse with a BF16 KV cache only
    assert replayed.returncode == 1, replayed.stderr
    assert "1 of 1 recorded decisions would change (newly_rejected 1)" in replayed.stdout
