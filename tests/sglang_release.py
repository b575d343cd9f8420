"""Whether a test that runs SGLang's own code can run here: one rule for every test file.

- The release the test runs is installed: the test runs (a driver that then fails, fails it).
- Another release is installed (a release environment of `make conform-env`, or the project's own
  release where the test is for an older one): the test skips, naming the release it needs and
  how to get its environment. `make conform-releases` (CI) runs conform on every release's
  environment.
- No SGLang, one that cannot be imported, or a missing module the conform extra installs: under
  CI (`CI` set), where `make install` installs SGLang 0.5.23 and its light pins, the test fails
  with the reason; elsewhere it skips with it.
"""
from __future__ import annotations

import functools
import importlib.util
import os

import pytest

from engine.sglang.conform import drivers

INSTALLED = drivers.installed_release()  # package metadata only: nothing is imported
OWN = drivers.OWN_RELEASE
SETUP = "set its environment up with `make conform-env SGLANG=X` (docs/conform.md)"


def _missing(reason: str):
    """SGLang (or what it needs) is not here: a failure under CI, a skip elsewhere."""
    if os.environ.get("CI"):
        pytest.fail(f"under CI SGLang {OWN} must be installed (make install): {reason}", pytrace=False)
    pytest.skip(reason, allow_module_level=True)  # also where a module calls require() at import


@functools.cache
def _imported() -> tuple:
    return drivers.installed_sglang()  # imports the release: seconds, once per process


def require(releases, *, imported: bool = False) -> str:
    """The installed release, when it is one of `releases` (a release or several); otherwise skip
    or fail as the module says. imported: also import it through its driver, and treat a release
    that cannot be imported as missing."""
    releases = (releases,) if isinstance(releases, str) else tuple(releases)
    if INSTALLED is None:
        _missing(f"SGLang is not installed here: {drivers.install_hint(None)}")
    if INSTALLED not in releases:
        if OWN in releases:  # the release `make install` installs: CI has it
            _missing(f"needs SGLang {OWN} (make install); SGLang {INSTALLED} is installed here")
        pytest.skip(f"needs SGLang {' or '.join(releases)}; SGLang {INSTALLED} is installed here: "
                    + SETUP.replace("X", releases[-1]), allow_module_level=True)
    if imported:
        version, reason = _imported()
        if version is None:
            _missing(reason)
    return INSTALLED


def require_modules(*names: str) -> None:
    """Modules `make install` installs (torch, the conform extra): missing is a failure under CI."""
    for name in names:
        if importlib.util.find_spec(name) is None:
            _missing(f"needs {name}: `make install`")


RELEASE_ENV = "HISPARSE_PLUGIN_RELEASE_ENV"


def release_launcher(folder: str) -> tuple[str, str, str]:
    """(base python, the release's unpacked wheel, release) of a release environment
    ENVS/sglang-X of tools/sglang-env.sh (its bin/python is a launcher naming both)."""
    import re

    launcher = open(os.path.join(folder, "bin", "python"), encoding="utf-8").read()
    wheel = re.search(r'PYTHONPATH="([^:"]+):', launcher)
    python = re.search(r'exec "([^"]+)"', launcher)
    assert wheel and python, f"{folder}/bin/python is not a launcher of tools/sglang-env.sh"
    return python.group(1), wheel.group(1), os.path.basename(folder.rstrip("/")).removeprefix("sglang-")


def entry_point_folder(folder) -> str:
    """A folder holding a dist-info that declares the plugin's `sglang.srt.plugins` entry point
    as pyproject.toml does, for a Python where hisparse-router is not installed."""
    import tomllib

    from tests.helpers import ROOT

    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        group = tomllib.load(f)["project"]["entry-points"]["sglang.srt.plugins"]
    dist = os.path.join(str(folder), "hisparse_router-0.dist-info")
    os.makedirs(dist, exist_ok=True)
    with open(os.path.join(dist, "METADATA"), "w", encoding="utf-8") as f:
        f.write("Metadata-Version: 2.1\nName: hisparse-router\nVersion: 0\n")
    with open(os.path.join(dist, "entry_points.txt"), "w", encoding="utf-8") as f:
        f.write("[sglang.srt.plugins]\n" + "".join(f"{k} = {v}\n" for k, v in group.items()))
    return str(folder)


def release_environment(tmp_path_factory) -> tuple[str, dict, str]:
    """(python, environment, release) to run SGLang in a fresh process with the plugin's entry
    point declared: the release environment RELEASE_ENV names, else this Python's installed
    SGLang (missing: a failure under CI, a skip elsewhere). The environment has no HISPARSE_* or
    SGLANG_* variable of the caller's."""
    import importlib.metadata
    import sys

    from tests.helpers import ROOT

    env = {k: v for k, v in os.environ.items() if not k.startswith(("HISPARSE_", "SGLANG_"))}
    folder = os.environ.get(RELEASE_ENV)
    if folder:
        python, wheel, release = release_launcher(folder)
        entry = entry_point_folder(tmp_path_factory.mktemp("entry-point"))
        env["PYTHONPATH"] = os.pathsep.join([entry, ROOT, wheel])
        return python, env, release
    if INSTALLED is None:
        _missing(f"SGLang is not installed here: {drivers.install_hint(None)}")
    paths = [ROOT]
    declared = importlib.metadata.entry_points(group="sglang.srt.plugins")
    if not any(ep.name == "hisparse_router" for ep in declared):
        paths.insert(0, entry_point_folder(tmp_path_factory.mktemp("entry-point")))
    env["PYTHONPATH"] = os.pathsep.join(paths + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return sys.executable, env, INSTALLED
