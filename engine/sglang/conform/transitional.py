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

The GPU is told through `machine.PatchedHelpers` (the releases have no platform context), the
model is a `model_folders` folder, torchvision is `torchvision_stub`: the stand-ins every driver
shares."""
from __future__ import annotations

import importlib
import warnings

from engine.sglang.conform import startup
from engine.sglang.conform.protocol import Case, Result

VERSIONS = ("0.5.15", "0.5.15.post1", "0.5.16", "0.5.17", "0.5.18")
VERSION = VERSIONS[-1]  # the newest release this driver runs; `version()` is the installed one

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


class _Release:
    """The installed release, imported and prepared once per process (forked workers share it)."""

    def __init__(self):
        import torch  # noqa: F401  (before transformers decides what is installed)
        import transformers  # noqa: F401

        import engine.sglang.conform.torchvision_stub as torchvision_stub
        from engine.sglang.conform.machine import PatchedHelpers
        from engine.sglang.conform.model_folders import ModelFolders

        from engine.sglang.conform.drivers import installed_release

        self.version = installed_release()
        if self.version not in VERSIONS:
            raise RuntimeError(f"this driver runs SGLang {', '.join(VERSIONS)}; the installed SGLang "
                               f"is {self.version or 'absent'}")
        with warnings.catch_warnings():  # "only CUDA supports ..." from a CPU machine at import
            warnings.simplefilter("ignore")
            self.torchvision_stubbed = torchvision_stub.install()
            import sglang.srt.server_args as server_args

            for name in LAZY:
                importlib.import_module(name)
        from sglang.srt.arg_groups import overrides
        from sglang.srt.mem_cache.sparsity.factory import parse_hisparse_config

        self.ServerArgs = server_args.ServerArgs
        self.resolved_view = overrides.resolved_view
        self.run_pass = overrides.run_post_process_pass
        self.hisparse_validation = overrides._hisparse_validation
        self.parse_hisparse_config = parse_hisparse_config
        self.package_dir = startup.package_dir()
        self.parser = startup.release_parser(self.ServerArgs)
        self.capture = startup.LogCapture(ROUTING_FUNCTIONS)
        self.models = ModelFolders()
        self.platform = PatchedHelpers()


_RELEASE: _Release | None = None


def import_sglang() -> None:
    """Import the installed release with the stand-ins. Raises RuntimeError when it is not one
    this driver runs, and what SGLang's import raised."""
    global _RELEASE
    if _RELEASE is None:
        _RELEASE = _Release()


def version() -> str:
    """The installed release this driver runs (imports it)."""
    import_sglang()
    return _RELEASE.version


WARM_UP_ARCHITECTURES = ("DeepseekV32ForCausalLM", "DeepseekV3ForCausalLM")


def load() -> None:
    """Import, build the parser, run the warm-up cases: once per process. Idempotent."""
    import_sglang()
    if getattr(_RELEASE, "warm", False):
        return
    startup.warm_up(run_case, WARM_UP_ARCHITECTURES)
    _RELEASE.warm = True


def run_case(case: Case) -> Result:
    """What the installed release does with `case`. A case that cannot be set up (an architecture
    without a model folder, a platform other than cuda/hip) raises ValueError."""
    startup.check_platform(case)
    import_sglang()
    rel = _RELEASE
    model = rel.models.path(case.architecture, case.model_extra)
    sa, stage, error = None, "parser", None
    with startup.Isolated(rel.capture) as iso:
        try:
            namespace = rel.parser.parse_args(list(case.argv) + ["--model-path", model])
            stage = "resolve"
            sa = startup.without_post_init(rel.ServerArgs, namespace)
            sa._resolved_overrides = []  # the first statement of __post_init__
            with rel.platform.case(case.platform, tuple(case.capability)):
                sa._handle_model_specific_adjustments()
                stage = "check"
                rel.run_pass(sa, rel.hisparse_validation)
                if sa.enable_hisparse:
                    stage = "hisparse_config"
                    rel.parse_hisparse_config(sa)
        except (Exception, SystemExit) as exc:  # SGLang's own error (argparse's: ParserError)
            error = exc
        kv = backends = None
        if sa is not None:
            view = rel.resolved_view(sa)
            kv, backends = view.kv_cache_dtype, (view.dsa_prefill_backend, view.dsa_decode_backend)
    return startup.result(error, stage, kv, backends or (None, None), iso.lines, rel.package_dir,
                          {"sglang": rel.version})
