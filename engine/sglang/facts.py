"""How each replaced SGLang function reads what it reads: the model, the platform, the GPU and the
record it judges, through the same names the release's own code looks up at call time (its
module's globals, the view it is given), so that SGLang's own mocks and overrides apply to the
policy as they apply to SGLang (`patch.object(overrides, "is_hip")`, `override_platform(...)`,
`patch("torch.cuda.get_device_capability")`).

A Reader names one way of each kind (engine/sglang/hook_targets.py says which a function of a
release uses); `Reader.read(...)` gives the values of one call, in SGLang's order, reading nothing
SGLang would not read before its own gate returns. Nothing here imports SGLang: it reads what the
calling function's globals hold."""
from __future__ import annotations

import sys

from engine.errors import EngineError
from engine.sglang.hook_targets import deepseek_family_archs, hisparse_hook_is_hip

_MODEL_CONFIG = "sglang.srt.configs.model_config"
_OVERRIDES = "sglang.srt.arg_groups.overrides"


class Outside(EngineError):
    """The call is not on the path the policy models (a gate of SGLang's own returns first)."""


# -- the model ------------------------------------------------------------------------------------
def hf_config_of(view, g: dict, how: str):
    """The Hugging Face config a pass reads: `model_config_of(view)` (0.5.19 on) or
    `view.get_model_config()` (0.5.15 to 0.5.18)."""
    config = g["model_config_of"](view) if how == "model_config_of" else view.get_model_config()
    return config.hf_config


def dsa_gate(hf_config, g: dict) -> str:
    """The DSA passes' own gate: the architecture in the module's DeepSeek family and
    `is_deepseek_dsa` (looked up where SGLang imports it from, at call time). Returns the
    architecture; raises Outside when the pass returns {} there."""
    arch = hf_config.architectures[0]
    if arch not in deepseek_family_archs(g):
        raise Outside("not a DeepSeek-family architecture")
    if not sys.modules[_MODEL_CONFIG].is_deepseek_dsa(hf_config):
        raise Outside("not a DSA model")
    return arch


# -- the platform ---------------------------------------------------------------------------------
def platform_of(g: dict, how: str, hip_how: str | None = None) -> str:
    """npu, xpu, hip or cuda, as the function tells them apart:
    - "get_platform": the runtime context's platform (0.5.19 on);
    - "is_functions": the module's own is_npu / is_xpu / is_hip (those it has);
    - "_is_hip": hisparse_hook's `_is_hip()` (0.5.14 to 0.5.18), which knows only ROCm.
    `hip_how` ("module.function"): where the path taken asks for ROCm instead (0.5.15-0.5.18's
    backend pass asks hisparse_hook._is_hip() in its HiSparse arm, its module's is_hip() elsewhere)."""
    if hip_how is not None:
        for name in ("npu", "xpu"):
            probe = g.get(f"is_{name}")
            if probe is not None and probe():
                return name
        module, _, function = hip_how.rpartition(".")
        return "hip" if getattr(sys.modules[module], function)() else "cuda"
    if how == "get_platform":
        p = g["get_platform"]()
        return "npu" if p.is_npu else "xpu" if p.is_xpu else "hip" if p.is_hip else "cuda"
    if how == "_is_hip":
        return "hip" if hisparse_hook_is_hip(g) else "cuda"
    for name in ("npu", "xpu", "hip"):
        probe = g.get(f"is_{name}")
        if probe is not None and probe():
            return name
    return "cuda"


def sm_major() -> int:
    """The GPU's major compute capability, as SGLang's DSA code reads it."""
    import torch

    return int(torch.cuda.get_device_capability()[0])


# -- the record a check reads ---------------------------------------------------------------------
def checked_view(server_args, g: dict, how: str):
    """What a HiSparse check reads its values from: `resolved_view(server_args)` (0.5.15 on; the
    hook module's own name, else the overrides module's, which 0.5.15 to 0.5.18 import inside the
    function), or the object itself (before)."""
    if how == "direct":
        return server_args
    resolved_view = g.get("resolved_view") or sys.modules[_OVERRIDES].resolved_view
    return resolved_view(server_args)


def read_fields(obj, names) -> dict:
    """{name: value} of the attributes `obj` has among `names` (a view answers what resolution
    has declared so far); a missing one is left out, to take the policy's default."""
    out = {}
    for name in names:
        try:
            out[name] = getattr(obj, name)
        except (AttributeError, KeyError):
            continue
    return out
