"""A pytest plugin (`pytest -p tests.hide_sglang`) that runs the suite as on a machine without
SGLang, though one is installed: `import sglang` (and its submodules) fails as a missing module
does, and its package metadata is not found. Used by tests/test_without_sglang.py."""
from __future__ import annotations

import importlib.abc
import importlib.metadata
import sys


def _hidden(name: str) -> bool:
    return name.lower().replace("_", "-") == "sglang"


class _NoSGLang(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "sglang" or name.startswith("sglang."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


def _wrap(real):
    def lookup(name, *args, **kwargs):
        if isinstance(name, str) and _hidden(name):
            raise importlib.metadata.PackageNotFoundError(name)
        return real(name, *args, **kwargs)
    return lookup


for _name in ("version", "distribution", "metadata"):
    setattr(importlib.metadata, _name, _wrap(getattr(importlib.metadata, _name)))
sys.meta_path.insert(0, _NoSGLang())
for _loaded in [m for m in sys.modules if m == "sglang" or m.startswith("sglang.")]:
    del sys.modules[_loaded]
