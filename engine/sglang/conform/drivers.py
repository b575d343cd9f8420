"""Which driver runs the installed SGLang.

A driver is a module with:
- `VERSION`: the SGLang release it runs, e.g. "0.5.23";
- `import_sglang()`: import what it needs from SGLang, raising what the import raised;
- `load()`: import and prepare (parser, model folders, warm-up), once per process, idempotent;
  the runner calls it in the parent before forking workers, so they share the imports;
- `run_case(case) -> Result` (`protocol.py`).

`DRIVERS` maps an SGLang version to its driver's module name; a driver for another release is
added there (or by `DRIVERS[version] = "package.module"` from the module that provides it)."""
from __future__ import annotations

import importlib
import importlib.metadata

from engine.errors import EngineError

DRIVERS: dict[str, str] = {
    "0.5.11": "engine.sglang.conform.sglang_0511",  # environments: tools/sglang-env.sh (docs/conform.md)
    "0.5.12": "engine.sglang.conform.sglang_0512",
    "0.5.12.post1": "engine.sglang.conform.sglang_0512",
    "0.5.13": "engine.sglang.conform.sglang_0513",
    "0.5.13.post1": "engine.sglang.conform.sglang_0513",
    "0.5.14": "engine.sglang.conform.sglang_0513",
    "0.5.15": "engine.sglang.conform.transitional",
    "0.5.15.post1": "engine.sglang.conform.transitional",
    "0.5.16": "engine.sglang.conform.transitional",
    "0.5.17": "engine.sglang.conform.transitional",
    "0.5.18": "engine.sglang.conform.transitional",
    "0.5.23": "engine.sglang.conform.sglang_0523",
}

INSTALL_HINT = ("install it with `pip install torch==2.13.0 'hisparse-router[conform]'` (the CPU torch and "
                "the light dependencies SGLang's start-up code imports, pinned), then "
                "`pip install --no-deps sglang==0.5.23` (its own requirements would pull a CUDA torch; "
                "Python 3.11+)")


class UnknownVersion(EngineError, ValueError):
    """No driver for this SGLang version."""


def known_versions() -> list[str]:
    def key(v):
        return tuple(int(p) if p.isdigit() else p for p in v.replace("-", ".").split("."))
    return sorted(DRIVERS, key=key)


def driver_for(version: str):
    """The driver module for an SGLang version. Raises UnknownVersion naming the known ones."""
    name = DRIVERS.get(version)
    if name is None:
        raise UnknownVersion(f"no conform driver for SGLang {version}; drivers exist for "
                             + ", ".join(known_versions()))
    return importlib.import_module(name)


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


def installed_sglang() -> tuple[str | None, str]:
    """(version, reason): the installed SGLang's version (from its package metadata) and a
    sentence about it; (None, why and what to install) when it is missing or cannot be
    imported. Importing costs SGLang's import time (5-8 s) once per process."""
    try:
        version = importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return None, f"SGLang is not installed in this Python: {INSTALL_HINT}"
    name = DRIVERS.get(version)
    try:
        if name is None:
            importlib.import_module("sglang")
        else:
            importlib.import_module(name).import_sglang()
    except Exception as exc:  # any import failure is a reason, never a traceback
        text = str(exc).strip() or type(exc).__name__
        return None, (f"SGLang {version} is installed but cannot be imported "
                      f"({type(exc).__name__}: {text}); {INSTALL_HINT}")
    if name is None:
        return version, (f"SGLang {version} imports, but no conform driver runs it (drivers: "
                         + ", ".join(known_versions()) + ")")
    return version, f"SGLang {version} imports; driver {name}"
