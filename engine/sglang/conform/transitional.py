"""Driver for the transitional SGLang releases 0.5.15, 0.5.15.post1, 0.5.16, 0.5.17 and 0.5.18:
`ServerArgs` is still a dataclass whose `__post_init__` runs the start-up handlers, but the DSA
routing lives in `srt/arg_groups/overrides.py` as passes (`_dsa_kv_cache_dtype_default`,
`_dsa_split_backend_resolution`) that `ServerArgs._set_default_dsa_kv_cache_dtype` /
`_set_default_dsa_backends` run at their old slot with `run_post_process_pass`. A pass never
writes the fields: its values are recorded in `server_args._resolved_overrides` and read through
`resolved_view(server_args)` until `__post_init__` ends (`materialize_declarations`).

What runs, per case, all of it the installed release's code:
1. parser: the parser of `ServerArgs.add_cli_args` (built once, `prog="sglang serve"` as
   `prepare_server_args`) on `case.argv + ["--model-path", DIR]`; an argparse error is caught at
   `parser.error`. The `--nsa-*` deprecated aliases log their notice here;
2. resolve: `ServerArgs.from_cli_args` with `__post_init__` skipped (it probes devices and GPU
   memory and fills defaults routing does not read), the empty declaration stash `__post_init__`
   sets first, the CUDA graph config parsed from its flags (the non-DSA DeepSeek branch reads it),
   then `_handle_model_specific_adjustments()`: the DSA passes;
3. check: `run_post_process_pass(sa, _hisparse_validation)`, the statement `check_server_args`
   runs at its "# Check hisparse" slot (the rest of check_server_args reads `__post_init__`'s
   defaults);
4. hisparse_config, HiSparse only: `parse_hisparse_config(sa)`, which the model runner calls at
   start (`--hisparse-config`'s top_k, device_buffer_size and swap_in_block_size checks).
`kv_cache_dtype` and the backends are read through `resolved_view`, also after a raise.

The steps are the pre-pipeline driver's (`prepipeline.Driver`) with these releases' additions
(`Transitional`). The GPU is told through `machine.PatchedHelpers` (the releases have no platform
context), the model is a `model_folders` folder, torchvision is `torchvision_stub`: the stand-ins
every driver shares."""
from __future__ import annotations

from engine.sglang import hook_targets, registry
from engine.sglang.conform.prepipeline import Driver, Names

VERSIONS = registry.driven_by(__name__)
VERSION = VERSIONS[-1]  # the newest release this driver runs

# the functions whose WARNING records are the routing log: the deprecated-alias notice of the
# parser (srt/arg_groups/argparse_actions.py), the DSA passes and the HiSparse checks
ROUTING_FUNCTIONS = frozenset({
    "print_deprecated_warning",  # srt/arg_groups/argparse_actions.py
    "_dsa_kv_cache_dtype_default",  # srt/arg_groups/overrides.py
    "_dsa_split_backend_resolution",
    "_check_tilelang_dsa_fp8_kv",  # 0.5.17 and later
    "_hisparse_validation",
    "validate_hisparse",  # srt/arg_groups/hisparse_hook.py
    "validate_hisparse_dsa_backend",
    "validate_hisparse_kv_cache_dtype",
    "_hisparse_default_backend",
    "_hisparse_allowed_backends",
    "_parse_sparse_config",  # srt/mem_cache/sparsity/factory.py
    "parse_hisparse_config",
})

# modules the DSA branch and the checks import inside functions: imported before any platform
# patch, or their module-level `if is_cuda(): from sgl_kernel import ...` would fire
LAZY = ("sglang.srt.configs.model_config", "sglang.srt.arg_groups.overrides",
        "sglang.srt.arg_groups.hisparse_hook", "sglang.srt.arg_groups.argparse_actions",
        "sglang.srt.mem_cache.sparsity.factory")


class Transitional(Driver):
    """The pre-pipeline driver's steps, with what these releases add: the declaration stash, the
    HiSparse pass and --hisparse-config parse as the checks, the values read through
    `resolved_view`."""

    def import_sglang(self):
        server_args = super().import_sglang()
        from sglang.srt.arg_groups import overrides
        from sglang.srt.mem_cache.sparsity.factory import parse_hisparse_config

        self.resolved_view = overrides.resolved_view
        self.run_pass = overrides.run_post_process_pass
        self.hisparse_validation = hook_targets.hisparse_validation(overrides)
        self.parse_hisparse_config = parse_hisparse_config
        return server_args

    def begin(self, sa) -> None:
        hook_targets.begin_declarations(sa)  # the first statement of __post_init__

    def checks(self, sa):
        yield "check", lambda: self.run_pass(sa, self.hisparse_validation)
        if sa.enable_hisparse:
            yield "hisparse_config", lambda: self.parse_hisparse_config(sa)

    def read(self, sa):
        view = self.resolved_view(sa)
        return view.kv_cache_dtype, (view.dsa_prefill_backend, view.dsa_decode_backend)


# the passes route; their functions (ROUTING_FUNCTIONS), not the ServerArgs methods, log
NAMES = Names(("dsa_prefill_backend", "dsa_decode_backend"), (), tuple(sorted(ROUTING_FUNCTIONS)))
WARM_UP_ARCHITECTURES = ("DeepseekV32ForCausalLM", "DeepseekV3ForCausalLM")
_driver = Transitional(VERSIONS, None, LAZY, NAMES, warm_up=WARM_UP_ARCHITECTURES)


# the driver protocol (drivers.py): module functions bound to the driver
import_sglang = _driver.import_sglang  # import the release with the stand-ins (raises what the import raised)
load = _driver.load  # import it, build its parser, run the warm-up cases (once per process)
run_case = _driver.run_case
