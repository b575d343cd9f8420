"""The bridge's C helpers, loaded with ctypes: the hot buffer's CPU bookkeeping (hot_buffer_lru.c)
and FP8 row unpacking (fp8_unpack.c).

`pip install` builds them into kernels_bridge/_native*.so when a C compiler is there (an optional
extension: without one the install goes on). Where the library is missing, does not load, or
HISPARSE_NO_NATIVE is set, the bridge keeps its tensor code, which gives the same answers, more
slowly; `hisparse doctor` says which runs, and why.
"""
from __future__ import annotations

import ctypes
import importlib.util
import os
from typing import Optional

MODULE = "kernels_bridge._native"
_P, _I64, _INT = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int

# name -> (return type, argument types)
_SIGNATURES = {
    "hb_translate_long": (_I64, [_I64] * 6 + [_P] * 4 + [_INT] + [_P] * 14),
    "hb_check": (_INT, [_I64] * 5 + [_P] * 3 + [_INT] + [_P] * 5),
    "hb_unpack_fp8": (_I64, [_I64, _P, _I64, _P, _INT]),
}

_loaded: Optional[ctypes.CDLL] = None
_reason = ""


def _load() -> Optional[ctypes.CDLL]:
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
        for name, (restype, argtypes) in _SIGNATURES.items():
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = restype, argtypes
    except (OSError, AttributeError) as exc:
        _reason = f"{spec.origin} did not load: {exc}"
        return None
    _loaded = lib
    return lib


def _function(name: str):
    lib = _load()
    return getattr(lib, name) if lib is not None else None


def translate_long():
    """hb_translate_long (a HotBuffer's long requests), or None (then `reason()` says why)."""
    return _function("hb_translate_long")


def check_arguments():
    """hb_check (a translate's arguments), or None."""
    return _function("hb_check")


def unpack_fp8():
    """hb_unpack_fp8 (FP8 rows to bf16 or float32), or None."""
    return _function("hb_unpack_fp8")


def reason() -> str:
    """Why the C helpers are not used; "" when they are."""
    _load()
    return _reason
