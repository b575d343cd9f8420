"""Driver for the SGLang releases before the resolution pipeline (0.5.11 to 0.5.14): runs the
release's own argument parser, DSA routing and HiSparse check on one `Case` and reports what it did.
A case of another model class (DeepSeek-V4, MiniMax-M3) runs the whole start-up instead (`launch`):
its routing is spread over `__post_init__`.

The releases differ in names, which a driver module gives as `Names`: 0.5.11 to 0.5.12.post1 keep
the backends in `nsa_prefill_backend` / `nsa_decode_backend` and route in
`_set_default_nsa_kv_cache_dtype` / `_set_default_nsa_backends`; 0.5.13 to 0.5.14 renamed them
`dsa_*` and log the `--nsa-*` aliases' deprecation notice (`print_deprecated_warning`,
`srt/arg_groups/argparse_actions.py`). `load()` refuses a release whose ServerArgs lacks a field or
method the names say (a rename), so a backend is never read back as a silent None.

What runs, per case, all of it the installed release's code:
1. the parser of `ServerArgs.add_cli_args` (built once, `prog="sglang serve"` as `prepare_server_args`),
   on `case.argv + ["--model-path", DIR]`; an argparse error is caught at `parser.error` (its text);
2. `ServerArgs.from_cli_args(namespace)` with `__post_init__` skipped: `__post_init__` downloads, probes
   devices and fills hundreds of defaults that routing does not read. Of it the driver keeps the
   effects `_handle_model_specific_adjustments` reads: `--quantization unquant` becomes None and
   sets `_quantization_explicitly_unset` (else False); and from 0.5.14, whose non-DSA DeepSeek
   branch reads `cuda_graph_config.prefill.backend`, the release's own `_parse_cuda_graph_config()`
   (flags to a CudaGraphConfig; it reads no device);
3. `sa._handle_model_specific_adjustments()`: the DSA dtype resolution and backend defaults
   (`_set_default_{nsa,dsa}_kv_cache_dtype`, `_set_default_{nsa,dsa}_backends`);
4. the HiSparse check: a per-release callable (see `sglang_0511`, `sglang_0512`, `sglang_0513`).

Platform facts are patched for the duration of a case, where they are looked up
(`machine.PatchedHelpers`):
- `torch.cuda.get_device_capability` -> `case.capability`, `torch.cuda.is_available` -> True,
  `torch.cuda.get_device_name` -> a name for the platform and capability;
- SGLang's helpers, in every loaded `sglang.*` module that holds them by name (`srt.server_args`,
  `srt.utils`, `srt.utils.common`, ...): is_hip, is_cuda, is_cuda_alike, is_npu, is_xpu, is_hpu,
  is_musa, is_mps, is_cpu, is_sm90_supported, is_sm100_supported, is_sm120_supported,
  is_blackwell_supported / is_blackwell, is_hopper_with_cuda_12_3, is_ampere_with_cuda_12_3,
  get_device_sm, get_device_capability, get_device_name. The `_supported` helpers also ask for a
  CUDA toolkit >= 12.3 / 12.8: taken as present on CUDA.
`os.environ` is restored after each case (the DSA branch sets
SGLANG_NSA_PREFILL_DENSE_ATTN_KV_LEN_THRESHOLD).

Import-time preparation (`load`), for a CPU machine without the release's GPU stack (the
environment: `tools/sglang-env.sh`; triton there is the real package: `srt/utils/common.py` imports
it, and SGLang's own macOS stand-in breaks torch.compile's decorators at import):
- `torchvision`: the inert stub all drivers share (`torchvision_stub.py`; only
  `srt/utils/common.py`'s `decode_jpeg` import needs it); the PyPI torchvision wheels link CUDA
  libraries a CPU torch lacks;
- `transformers.AutoImageProcessor`: without torchvision transformers 5.6.0 gives a placeholder that
  raises on `.register`, which `srt/configs/*` call at import to register image processors; a stand-in
  whose `register` does nothing (no routing code reads image processors);
- the modules the DSA branch imports lazily are imported before any platform patch, or their
  module-level `if is_cuda(): from sgl_kernel import ...` would fire.
"""
from __future__ import annotations

import importlib
import warnings

from engine.sglang import hook_targets
from engine.sglang.conform import launch, startup, torchvision_stub
from engine.sglang.conform.machine import PatchedHelpers
from engine.sglang.conform.model_folders import ModelFolders
from engine.sglang.conform.protocol import Case, Result


class Names:
    """What a release calls the routing's parts: the ServerArgs fields holding the (prefill,
    decode) backends, the ServerArgs methods that route (checked to exist at load), and the
    functions whose WARNING records are the routing log lines."""

    def __init__(self, fields: tuple, methods: tuple, log_functions: tuple):
        self.fields = fields
        self.methods = methods
        self.log_functions = frozenset(methods + log_functions)


# 0.5.11 to 0.5.12.post1
NSA = Names(("nsa_prefill_backend", "nsa_decode_backend"),
            ("_set_default_nsa_kv_cache_dtype", "_set_default_nsa_backends"),
            ("apply_hisparse_nsa_backend_defaults",))
# 0.5.13 to 0.5.14: the notice of a deprecated --nsa-* alias comes from the parser
DSA = Names(("dsa_prefill_backend", "dsa_decode_backend"),
            ("_set_default_dsa_kv_cache_dtype", "_set_default_dsa_backends"),
            ("apply_hisparse_dsa_backend_defaults", "print_deprecated_warning"))

# the architectures of the shipped versions' cases: their model folders are written at load,
# before the workers fork
ARCHITECTURES = ("DeepseekV32ForCausalLM", "DeepseekV3ForCausalLM", "GlmMoeDsaForCausalLM", "LlamaForCausalLM")


# -- the driver ----------------------------------------------------------------------------------
class Driver:
    """Runs Cases on one installed pre-pipeline SGLang release, one of `versions`.

    `check_factory(server_args_module)` returns the release's HiSparse check, a callable on a
    ServerArgs; `lazy` names the modules the DSA branch and the check import inside functions;
    `names` what the release calls the routing's fields and functions; `warm_up` the architectures
    whose warm-up cases (startup.WARM_UP) run at load. A later release's driver overrides `begin`,
    `checks` and `read` (transitional.py)."""

    def __init__(self, versions, check_factory, lazy: tuple, names: Names = NSA, warm_up: tuple = ()):
        self.versions = (versions,) if isinstance(versions, str) else tuple(versions)
        self.version = self.versions[0]  # the installed one, once imported
        self.check_factory = check_factory
        self.lazy = lazy
        self.names = names
        self.warm_up = warm_up
        self.ready = False

    def import_sglang(self):
        """Import the release (with the stand-ins); its server_args module. Raises RuntimeError
        when another release (or none) is installed, and what the import raised."""
        installed = startup.installed_release()
        if installed not in self.versions:
            raise RuntimeError(f"this driver runs SGLang {' or '.join(self.versions)}; the installed "
                               f"SGLang is {installed or 'absent'}")
        self.version = installed
        with warnings.catch_warnings():  # "only CUDA supports ..." from a CPU machine at import
            warnings.simplefilter("ignore")
            import torch  # noqa: F401  (before transformers decides what is installed)
            import transformers  # noqa: F401

            torchvision_stub.install()
            import sglang.srt.server_args as server_args

            for name in self.lazy:
                importlib.import_module(name)
        return server_args

    def load(self) -> None:
        """Import, build the parser, write the model folders: once per process. Forked workers
        share all of it."""
        if self.ready:
            return
        server_args = self.import_sglang()
        missing = renamed(server_args.ServerArgs, self.names)
        if missing:
            raise RuntimeError(f"SGLang {self.version}'s ServerArgs has no {', '.join(missing)}: renamed in "
                               "this release; this driver cannot read its routing")
        self.sa_module = server_args
        self.package_dir = startup.package_dir()
        self.parser = startup.release_parser(server_args.ServerArgs)
        self.capture = startup.every_class_capture(self.names.log_functions)
        launch.import_lazy_modules()  # before PatchedHelpers finds where the helpers are bound
        self.check = self.check_factory(server_args) if self.check_factory else None
        self.models = ModelFolders()
        for architecture in ARCHITECTURES:
            self.models.path(architecture)
        self.platform = PatchedHelpers()
        self.ready = True
        startup.warm_up(self.run_case, self.warm_up)
        launch.warm_up(self.run_case)

    def begin(self, sa) -> None:
        """What `__post_init__` does first that the routing reads: nothing before 0.5.15."""

    def checks(self, sa):
        """The steps after the routing, in order, as (stage, step)."""
        yield "check", lambda: self.check(sa)

    def read(self, sa):
        """(kv_cache_dtype, (prefill, decode)) as the release resolved them. The fields were
        checked at load: a rename is an error there, never a None here."""
        return sa.kv_cache_dtype, tuple(getattr(sa, f) for f in self.names.fields)

    def run_case(self, case: Case) -> Result:
        """What the release does with `case`. A case this driver cannot set up (an architecture
        it has no model for, a platform other than cuda/hip, or npu for a class other than DSA)
        raises ValueError. A class other than DSA runs the whole start-up (`launch`)."""
        if case.routing != "dsa":
            return launch.run(self, case)
        startup.check_platform(case)
        self.load()
        model = self.models.path(case.architecture, case.model_extra)
        sa, stage, error = None, "parser", None
        with startup.Isolated(self.capture) as iso:
            try:
                namespace = self.parser.parse_args(list(case.argv) + ["--model-path", model])
                stage = "resolve"
                sa = startup.without_post_init(self.sa_module.ServerArgs, namespace)
                self.begin(sa)
                with self.platform.case(case.platform, tuple(case.capability)):
                    hook_targets.handle_model_specific_adjustments(sa)
                    for stage, step in self.checks(sa):
                        step()
            except (Exception, SystemExit) as exc:  # SGLang's own error (argparse's: ParserError)
                error = exc
            kv, backends = (None, (None, None)) if sa is None else self.read(sa)
        return startup.result(error, stage, kv, backends, startup.lines_for(iso.lines, self.names.log_functions),
                              self.package_dir, {"sglang": self.version})


def renamed(server_args_class, names: Names) -> list[str]:
    """The fields and methods `names` says that the ServerArgs class lacks ("field x", "method y")."""
    import dataclasses

    fields = {f.name for f in dataclasses.fields(server_args_class)} if dataclasses.is_dataclass(
        server_args_class) else set(getattr(server_args_class, "__annotations__", {}))
    return ([f"field {f}" for f in names.fields if f not in fields]
            + [f"method {m}" for m in names.methods if not callable(getattr(server_args_class, m, None))])
