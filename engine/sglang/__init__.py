"""The SGLang integration: what the user gave (flags, config files, launch commands), which model a
path names, `apply()` on SGLang's own ServerArgs, and `conform` against the installed SGLang.

    from engine.sglang import apply, config_from_launch
"""
from __future__ import annotations

_PUBLIC = ("apply", "config_from_launch", "launch_args", "launch_layers", "raise_refusal",
           "resolution_step", "model_family", "model_inputs", "model_is_dsa", "ASSERTED_RULES")
__all__ = list(_PUBLIC)


def __getattr__(name: str):
    # the adapter is imported on first use: the modules of this package that every command reads
    # (given, models) must not pay for it
    if name in _PUBLIC:
        from engine.sglang import adapter

        value = getattr(adapter, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'engine.sglang' has no attribute {name!r}")
