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
