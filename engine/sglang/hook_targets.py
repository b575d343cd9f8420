"""Where SGLang keeps its DSA routing, per release: the functions the plugin replaces
(engine/serving/sglang_plugin.py) and the resolution entry point its guard runs before.

Each target was read in the release's wheel. A release this table does not know is driven by
the newest family when every target of that family exists in it, and refused otherwise: the
policy must never seem to decide while SGLang's own code routes."""
from __future__ import annotations

import re

# the role of each replaced function (a PolicyRouting factory, engine/sglang/routing_hooks.py)
DTYPE, BACKENDS, BACKEND_CHECK = "dtype_pass", "backend_pass", "backend_check"


class HookFamily:
    """The releases that keep their routing in the same functions."""

    def __init__(self, name: str, first: tuple, last: tuple | None, replace: dict, guard: str):
        self.name = name
        self.first, self.last = first, last  # the releases it covers (last None: and later)
        self.replace = replace  # dotted target -> role
        self.guard = guard  # the resolution entry point: the guard checks the hooks before it runs

    def targets(self) -> list[str]:
        return [*self.replace, self.guard]


# SGLang 0.5.19 to 0.5.23: resolution passes `fn(view) -> {field: value}` in
# arg_groups/overrides.py, run by arg_groups/model_hook.py inside ServerArgs.resolve_once(); the
# HiSparse check in arg_groups/hisparse_hook.py, run from check_server_args.
PIPELINE = HookFamily(
    "resolution pipeline (0.5.19 and later)", (0, 5, 19), None,
    {
        "sglang.srt.arg_groups.overrides._dsa_kv_cache_dtype_default": DTYPE,
        "sglang.srt.arg_groups.overrides._dsa_split_backend_resolution": BACKENDS,
        "sglang.srt.arg_groups.hisparse_hook.validate_hisparse_dsa_backend": BACKEND_CHECK,
    },
    "sglang.srt.arg_groups.pipeline.run_resolution_pipeline",
)

# SGLang 0.5.15 to 0.5.18: the same passes in arg_groups/overrides.py, called from
# ServerArgs._set_default_dsa_kv_cache_dtype / _set_default_dsa_backends (function-local imports,
# so the patched module attribute is what runs) inside _handle_model_specific_adjustments, from
# __post_init__; the HiSparse check from check_server_args through
# ServerArgs._validate_hisparse_dsa_backend.
PASSES_IN_METHODS = HookFamily(
    "passes called from ServerArgs methods (0.5.15 to 0.5.18)", (0, 5, 15), (0, 5, 18),
    dict(PIPELINE.replace),
    "sglang.srt.server_args.ServerArgs._handle_model_specific_adjustments",
)

FAMILIES = (PASSES_IN_METHODS, PIPELINE)


def release_tuple(release: str) -> tuple:
    """(0, 5, 23) of "0.5.23" or "0.5.12.post1"; () when it is not a version."""
    m = re.match(r"(\d+)\.(\d+)\.(\d+)", release or "")
    return tuple(int(x) for x in m.groups()) if m else ()


def family_of(release: str) -> HookFamily | None:
    """The family covering the release; for a release newer than every family, the newest."""
    at = release_tuple(release)
    if not at:
        return None
    for family in FAMILIES:
        if at >= family.first and (family.last is None or at <= family.last):
            return family
    return None
