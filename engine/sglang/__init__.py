"""The SGLang integration: what the user gave (flags, config files, launch commands), which model a
path names, `apply()` on SGLang's own ServerArgs, and `conform` against the installed SGLang.

    from engine.sglang import apply, config_from_launch
"""
from __future__ import annotations

# public name -> the module that defines it
_PUBLIC = {
    "apply": "routing", "resolution_step": "routing",
    "raise_refusal": "server_args", "ServerArgsError": "server_args",
    "config_from_launch": "launch", "launch_args": "launch", "launch_layers": "launch",
    "read_model": "models", "model_is_dsa": "models",
}
__all__ = list(_PUBLIC)


def __getattr__(name: str):
    # imported on first use: the modules of this package that every command reads (layers, given, models)
    # must not pay for the launch reader or apply()
    module = _PUBLIC.get(name)
    if module is not None:
        import importlib

        value = getattr(importlib.import_module(f"engine.sglang.{module}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'engine.sglang' has no attribute {name!r}")
