"""From a built wheel, without the checkout: `hisparse versions` prints the README's table, from
the saved conform reports the wheel ships (engine/conformance/); before they were shipped it said
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
    """The built wheel's files, unpacked as an install would place them (its C helpers included)."""
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


def _run(site, cwd, *argv):
    env = {k: v for k, v in os.environ.items() if not k.startswith("HISPARSE_")}
    env["PYTHONPATH"] = site
    return subprocess.run([sys.executable, "-m", "kernels_bridge.cli", *argv], cwd=cwd, env=env,
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
