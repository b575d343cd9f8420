"""Driver for SGLang 0.5.12 and 0.5.12.post1: PR #23013's HiSparse routing in
`srt/arg_groups/hisparse_hook.py` (the two releases ship the same routing code: server_args.py's DSA
methods at the same lines, hisparse_hook.py byte for byte). See `prepipeline` for what runs and
what is patched.

The HiSparse check is the release's own entry point, `hisparse_hook.validate_hisparse(sa)` (which
`ServerArgs.check_server_args` calls; the rest of check_server_args is not run: it reads defaults that
`__post_init__` fills)."""
from __future__ import annotations

from engine.sglang import registry
from engine.sglang.conform.prepipeline import NSA, Driver

VERSIONS = registry.driven_by(__name__)
VERSION = VERSIONS[0]


def hisparse_check(server_args):
    """hisparse_hook.validate_hisparse: the check of every release from 0.5.12 to 0.5.14."""
    from sglang.srt.arg_groups.hisparse_hook import validate_hisparse

    return validate_hisparse


# imported inside _handle_model_specific_adjustments and _set_default_nsa_backends
LAZY = ("sglang.srt.configs.model_config", "sglang.srt.arg_groups.hisparse_hook",
        "sglang.srt.layers.attention.nsa.utils")
_driver = Driver(VERSIONS, hisparse_check, LAZY, NSA)


# the driver protocol (drivers.py): module functions bound to this release's driver
import_sglang = _driver.import_sglang  # import SGLang 0.5.12[.post1] with the stand-ins (raises what the import raised)
load = _driver.load  # import it, build its parser and the model folders (once per process)
run_case = _driver.run_case
