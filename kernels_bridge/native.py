"""The hot buffer's compiled CPU bookkeeping (hot_buffer_lru.c), loaded with ctypes.

`pip install` builds hot_buffer_lru.c into kernels_bridge/_hot_buffer_lru*.so when a C compiler
is there (an optional extension: without one the install goes on). Where the library is missing
or does not load, HotBuffer keeps its tensor bookkeeping, which gives the same answers; `hisparse
doctor` says which one runs.
"""
from __future__ import annotations

import ctypes
import importlib.util
import os
from typing import Optional

MODULE = "kernels_bridge._hot_buffer_lru"
_P, _I64, _INT = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int

_loaded: Optional[object] = None
_reason = ""


def _load():
    """The library, its functions typed; None (and _reason set) where it is not there."""
    global _loaded, _reason
    if _loaded is not None or _reason:
        return _loaded
    if os.environ.get("HISPARSE_NO_NATIVE"):
        _reason = "switched off by HISPARSE_NO_NATIVE"
        return None
    spec = importlib.util.find_spec(MODULE)  # finds the built file without importing it
    if spec is None or not spec.origin:
        _reason = "not built (no C compiler or Python headers when the package was installed)"
        return None
    try:
        lib = ctypes.CDLL(spec.origin)
        translate, check = lib.hb_translate_long, lib.hb_check
    except (OSError, AttributeError) as exc:
        _reason = f"{spec.origin} did not load: {exc}"
        return None
    translate.restype, check.restype = _I64, _INT
    translate.argtypes = [_I64] * 6 + [_P] * 4 + [_INT] + [_P] * 14
    check.argtypes = [_I64] * 5 + [_P] * 3 + [_INT] + [_P] * 5
    _loaded = lib
    return lib


def translate_long():
    """The C function hb_translate_long, or None (then `reason()` says why)."""
    lib = _load()
    return lib and lib.hb_translate_long


def check_arguments():
    """The C function hb_check, or None (then `reason()` says why)."""
    lib = _load()
    return lib and lib.hb_check


def reason() -> str:
    """Why the compiled bookkeeping is not used; "" when it is."""
    _load()
    return _reason
