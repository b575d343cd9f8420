"""Which driver runs the installed SGLang.

A driver is a module with:
- `VERSION`: the (newest) SGLang release it runs, e.g. "0.5.23";
- `import_sglang()`: import what it needs from SGLang, raising what the import raised;
- `load()`: import and prepare (parser, model folders, warm-up), once per process, idempotent;
  the runner calls it in the parent before forking workers, so they share the imports;
- `run_case(case) -> Result` (`protocol.py`).

One driver runs a family of releases whose start-up code has the same shape. `DRIVERS` maps every
release a driver was checked on, .post releases listed on their own, to its module (one line each);
a driver for another release is added there (or by `DRIVERS[version] = "package.module"` from the
module that provides it). A release newer than every one listed runs with the newest release's
driver, and says so; if that driver cannot run it, the reason names what moved.

SGLang 0.5.12.post1 to 0.5.20 import torchvision in `sglang/__init__`: the torchvision stand-in is
put in place before anything here imports SGLang, the version probe included."""
from __future__ import annotations

import importlib

from engine.errors import EngineError
from engine.sglang import registry
from engine.sglang.registry import installed_release

PIPELINE = "engine.sglang.conform.pipeline"  # the resolve_once pipeline releases

# every release a driver was checked on -> its module (engine/sglang/registry.py holds the table)
DRIVERS: dict[str, str] = {r.version: r.driver for r in registry.RELEASES}

# the project's own release (the `conform` extra pins what its start-up code imports)
OWN_RELEASE = registry.OWN


def install_hint(release: str | None) -> str:
    """How to install SGLang `release` (None: not installed at all) for conform, as pip commands a
    wheel user can run."""
    if release is None or release == OWN_RELEASE:
        return (f"install it with `pip install torch==2.13.0 'hisparse-router[conform]'` (the CPU torch and "
                f"the light dependencies SGLang's start-up code imports, pinned), then "
                f"`pip install --no-deps sglang=={OWN_RELEASE}` (its own requirements would pull a CUDA torch; "
                f"Python 3.11+)")
    return (f"install it in a Python 3.11 venv with pip: `pip install torch==2.13.0`, the light dependencies "
            f"SGLang {release}'s start-up code imports with `pip install --no-deps` (pinned per transformers "
            f"version in the source's tools/pins/), then `pip install --no-deps sglang=={release}`; in a "
            f"checkout, `make conform-env SGLANG={release}` does all of it")


class UnknownVersion(EngineError, ValueError):
    """No driver for this SGLang version."""


release_key = registry.release_key


def known_versions() -> list[str]:
    return sorted(DRIVERS, key=release_key)


def newest() -> str:
    return known_versions()[-1]


def is_newer(version: str) -> bool:
    """A release after every one a driver was checked on."""
    key = registry.version_key(version)
    return key is not None and key > registry.version_key(newest())


def module_name(version: str) -> str:
    """The driver module's name for a release: its own, or the newest driver for a newer one.
    Raises UnknownVersion naming the known releases."""
    name = DRIVERS.get(version)
    if name is None and is_newer(version):
        name = DRIVERS[newest()]
    if name is None and registry.release(version) is not None:  # between two known releases
        name = registry.release(version).driver
    if name is None:
        raise UnknownVersion(f"no conform driver for SGLang {version}; drivers exist for "
                             + ", ".join(known_versions()))
    return name


def note(version: str) -> str | None:
    """What to say about the driver a release runs with: None for a release it was checked on."""
    if version in DRIVERS:
        return None
    if is_newer(version):
        return (f"SGLang {version} is newer than every release a conform driver was checked on "
                f"(newest: {newest()}): running the newest driver, {DRIVERS[newest()]}")
    row = registry.release(version)
    if row is None:
        return None
    return (f"SGLang {version} is not a release a conform driver was checked on: running the driver of "
            f"SGLang {row.version}, {row.driver}")


def driver_for(version: str):
    """The driver module for an SGLang version (the newest driver for a newer release). Raises
    UnknownVersion naming the known ones."""
    return importlib.import_module(module_name(version))


def resolve(driver):
    """A driver module from a module, a version ("0.5.23"), a module name, or None (the
    installed SGLang's)."""
    if driver is None:
        version, reason = installed_sglang()
        if version is None:
            raise RuntimeError(reason)
        return driver_for(version)
    if isinstance(driver, str):
        if driver in DRIVERS:
            return driver_for(driver)
        if "." in driver and not driver[0].isdigit():
            return importlib.import_module(driver)
        return driver_for(driver)
    if not callable(getattr(driver, "run_case", None)):
        raise TypeError(f"not a conform driver (no run_case): {driver!r}")
    return driver


def stand_ins() -> None:
    """The torchvision stand-in, before SGLang's first import (0.5.12.post1-0.5.20 import
    torchvision in `sglang/__init__`). Without torch or transformers there is nothing to stand in
    for: the import then fails on what is really missing."""
    try:
        import engine.sglang.conform.torchvision_stub as torchvision_stub

        torchvision_stub.install()
    except ImportError:
        pass


def installed_sglang() -> tuple[str | None, str]:
    """(version, reason): the installed SGLang's version (from its package metadata) and a
    sentence about it; (None, why and what to install) when it is missing, cannot be imported, or
    is a newer release the newest driver cannot run (naming what moved). Importing costs SGLang's
    import time (5-8 s) once per process."""
    version = installed_release()
    if version is None:
        return None, f"SGLang is not installed in this Python: {install_hint(None)}"
    try:
        name = module_name(version)
    except UnknownVersion:
        name = None
    try:
        if name is None:
            stand_ins()
            importlib.import_module("sglang")
        else:
            importlib.import_module(name).import_sglang()
    except Exception as exc:  # any import failure is a reason, never a traceback
        text = str(exc).strip() or type(exc).__name__
        if name is not None and version not in DRIVERS and type(exc).__name__ == "Moved":
            return None, (f"SGLang {version} is newer than every release a conform driver was "
                          f"checked on (newest: {newest()}), and the newest driver, {name}, cannot "
                          f"run it: {text}")
        return None, (f"SGLang {version} is installed but cannot be imported "
                      f"({type(exc).__name__}: {text}); {install_hint(version)}")
    if name is None:
        return version, (f"SGLang {version} imports, but no conform driver runs it (drivers: "
                         + ", ".join(known_versions()) + ")")
    return version, note(version) or f"SGLang {version} imports; driver {name}"
