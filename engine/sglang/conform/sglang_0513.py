"""Driver for SGLang 0.5.13, 0.5.13.post1 and 0.5.14: the pre-pipeline routing with NSA renamed
DSA. The fields are `dsa_prefill_backend` / `dsa_decode_backend`, the routing methods
`_set_default_dsa_kv_cache_dtype` / `_set_default_dsa_backends`, and the parser keeps `--nsa-*` as
deprecated aliases (`DeprecatedAliasStoreAction`, srt/arg_groups/argparse_actions.py), whose
notice `print_deprecated_warning` logs through the "sglang" logger: it is a routing log line here.
0.5.14 adds HiSparse on ROCm inside the same functions (hisparse_hook.py); the steps and their
order are 0.5.13's. See `prepipeline` for what runs and what is patched."""
from __future__ import annotations

from engine.sglang import registry
from engine.sglang.conform.prepipeline import DSA, Driver
from engine.sglang.conform.sglang_0512 import hisparse_check

VERSIONS = registry.driven_by(__name__)
VERSION = VERSIONS[0]

# imported inside _handle_model_specific_adjustments and _set_default_dsa_backends
LAZY = ("sglang.srt.configs.model_config", "sglang.srt.arg_groups.hisparse_hook",
        "sglang.srt.layers.attention.dsa.utils", "sglang.srt.arg_groups.argparse_actions")
_driver = Driver(VERSIONS, hisparse_check, LAZY, DSA)


# the driver protocol (drivers.py): module functions bound to this release's driver
import_sglang = _driver.import_sglang  # import the release with the stand-ins (raises what the import raised)
load = _driver.load  # import it, build its parser and the model folders (once per process)
run_case = _driver.run_case
