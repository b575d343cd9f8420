"""Driver for SGLang 0.5.23: one Case through SGLang's own start-up code, on a CPU machine.

The steps, in SGLang's start-up order (`launch_server.py`, `srt/entrypoints/engine.py`):
1. parser: the argparse parser of `ServerArgs.add_cli_args` (built once per process), then the
   body of `prepare_server_args` (--config merge, parse, `ServerArgs.from_cli_args`) without its
   `logging.basicConfig(force=True)`, which would reconfigure the caller's logging;
2. resolve: `ServerArgs.resolve_once()` (the ~90-step resolution pipeline, DSA steps included);
3. check: `ServerArgs.check_server_args()` (HiSparse validation among the others);
4. hisparse_config, HiSparse only: `parse_hisparse_config()`, which the model runner calls at
   start, reading `--hisparse-config` through the published context (`publish(role=
   "scheduler")`, then the context is put back with `restore_context(snapshot_context())`).

What is faked, and why (also in docs/conform.md, "What conform fakes"):
- the model: a folder with only a config.json written by transformers' config class for the
  architecture (`models.py`); no weights, no tokenizer (no routing code reads them);
- the GPU: SGLang's own `override_platform(...)` with every platform fact consistent with the
  case's platform and capability (`machine.platform_facts`);
- `torch.cuda.get_device_capability()` -> the case's capability: the DSA steps call it directly,
  and a CPU torch raises "Torch not compiled with CUDA enabled";
- `torch.cuda.is_available()` -> True: resolution asks `get_device()` for an accelerator and
  stops with "No accelerator ... is available" otherwise;
- torchvision: an inert stub (`torchvision_stub.py`), because no torchvision wheel loads next to
  a CPU torch and only multimodal code imports it.
Nothing of SGLang's behaviour is patched. One speed-up, which changes no result:
`msgspec.structs.fields(ServerArgs)` is answered from its first answer (`_FieldsMemo`): msgspec
re-evaluates every field's annotation on each call. Each case gets a fresh ServerArgs; after it,
os.environ (the DSA step sets SGLANG_DSA_PREFILL_DENSE_ATTN_KV_LEN_THRESHOLD), the two torch.cuda
functions, the platform facts and the runtime context are put back. For the life of the process
the "sglang" logger is at WARNING with a capturing handler; it does not propagate during a case.
Warnings (`warnings.warn`) are not shown during SGLang's import and cases.

Log lines: the WARNING records of `sglang.*` loggers whose emitting function is in
`ROUTING_FUNCTIONS`, in order, including those emitted before a raise."""
from __future__ import annotations

import argparse
import logging
import os
import warnings

from engine.errors import EngineError
from engine.sglang.conform.protocol import Case, Result

VERSION = "0.5.23"

# the DSA / HiSparse routing functions of 0.5.23 whose warnings are the routing log
ROUTING_FUNCTIONS = frozenset({
    "_dsa_kv_cache_dtype_default",  # srt/arg_groups/overrides.py
    "_dsa_split_backend_resolution",
    "_check_dsa_backend_constraints",
    "_check_tilelang_dsa_fp8_kv",
    "_hisparse_validation",
    "validate_hisparse",  # srt/arg_groups/hisparse_hook.py
    "validate_hisparse_dsa_backend",
    "validate_hisparse_kv_cache_dtype",
    "validate_hisparse_feature_combos",
    "_hisparse_default_backend",
    "_hisparse_allowed_backends",
    "_parse_sparse_config",  # srt/mem_cache/sparsity/factory.py
    "parse_hisparse_config",
})

# cases run at load time for each architecture, so that the imports SGLang makes lazily inside
# resolution (the HiSparse path, the mamba-cache path of GLM-5.3-Flash, ROCm) happen before the
# workers fork: (argv, platform, capability)
_WARM_UP = (
    (("--enable-hisparse", "--disable-radix-cache", "--kv-cache-dtype", "fp8_e4m3"), "cuda", (9, 0)),
    ((), "cuda", (10, 0)),
    ((), "hip", (9, 4)),
)


class _ParserExit(EngineError):
    """argparse's error(): the message it would print after "error: "."""


class _Parser(argparse.ArgumentParser):
    """SGLang's parser, unchanged, except that an error is raised instead of printed + exit 2."""

    def error(self, message):
        raise _ParserExit(message)

    def exit(self, status=0, message=None):
        raise _ParserExit(message or "")

    def _print_message(self, message, file=None):
        pass  # --help and --version text is not wanted in a conformance run


class _State:
    def __init__(self):
        import torch  # noqa: F401  (before transformers decides what is installed)
        import transformers  # noqa: F401

        import engine.sglang.conform.torchvision_stub as torchvision_stub
        from engine.sglang.conform.model_folders import ModelFolders

        self.torchvision_stubbed = torchvision_stub.install()
        from sglang.srt.arg_groups.overrides import resolution_result
        from sglang.srt.mem_cache.sparsity.factory import parse_hisparse_config
        from sglang.srt.runtime_context import publish, restore_context, snapshot_context
        from sglang.srt.server_args import ServerArgs

        import sglang

        self.ServerArgs = ServerArgs
        self.resolution_result = resolution_result
        self.parse_hisparse_config = parse_hisparse_config
        self.publish, self.snapshot, self.restore = publish, snapshot_context, restore_context
        self.package_dir = os.path.dirname(os.path.abspath(sglang.__file__)) + os.sep
        self.parser = _Parser(prog="sglang serve")
        ServerArgs.add_cli_args(self.parser)
        self.models = ModelFolders()
        self.capture = _install_capture()
        self.fields = _FieldsMemo(ServerArgs)
        self.fields.enable()


class _FieldsMemo:
    """`msgspec.structs.fields(ServerArgs)` answered from its first answer.

    SGLang calls it twice per config (`from_cli_args` and the pipeline's raw-input snapshot, via
    `arg_utils.record_fields`), and msgspec re-evaluates the type annotations of all 546 fields
    each time: half of a config's cost. The answer is a tuple computed from the class alone,
    which never changes after import, so the memo changes no result (tests compare the two);
    every other class goes to msgspec as before."""

    def __init__(self, cls):
        import msgspec.structs

        self.module, self.cls = msgspec.structs, cls
        self.original = msgspec.structs.fields
        self.answer = self.original(cls)

    def fields(self, cls):
        return self.answer if cls is self.cls else self.original(cls)

    def enable(self, on: bool = True) -> None:
        self.module.fields = self.fields if on else self.original


_STATE: _State | None = None


def import_sglang() -> None:
    """Import the SGLang modules the driver runs (5-8 s, once per process). Raises ImportError
    (or what SGLang's import raised) when it cannot."""
    global _STATE
    if _STATE is None:
        with warnings.catch_warnings():
            # import-time notices of a CPU machine ("Only CUDA ... support AWQ currently", a
            # missing requests charset module): not about routing
            warnings.simplefilter("ignore")
            _STATE = _State()


def load() -> None:
    """Import SGLang and run the warm-up cases (`_WARM_UP`, for each architecture), so that the
    imports SGLang makes lazily happen once, in the process that forks the workers. Idempotent."""
    import_sglang()
    if getattr(_STATE, "warm", False):
        return
    from engine.sglang.conform.model_folders import ARCHITECTURES

    for arch in ARCHITECTURES:
        for argv, platform, capability in _WARM_UP:
            run_case(Case(argv=argv, architecture=arch, platform=platform, capability=capability))
    _STATE.warm = True


class _Capture(logging.Handler):
    """The routing log of the case being run (installed once, on the "sglang" logger)."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.lines: list[str] | None = None  # None between cases

    def emit(self, record):
        if (self.lines is not None and record.levelno == logging.WARNING
                and record.funcName in ROUTING_FUNCTIONS):
            self.lines.append(record.getMessage())


def _install_capture() -> _Capture:
    """A handler on the "sglang" logger, for the life of the process, and the logger's level set to
    WARNING whatever the host configured, so the routing records are made. Set once:
    `Logger.setLevel` clears every logger's cache, ~1 ms with SGLang's hundreds of loggers. While
    a case runs the logger does not propagate, so the host's handlers print nothing of SGLang's."""
    capture = _Capture()
    sglang_logger = logging.getLogger("sglang")
    sglang_logger.setLevel(logging.WARNING)
    sglang_logger.addHandler(capture)
    return capture


_ENV_DATA = getattr(os.environ, "_data", None)  # CPython's raw mapping: a cheap snapshot


class _Isolated:
    """One case's side effects kept in: its log captured, os.environ put back, warnings (a CPU
    machine's "Triton is not supported on current platform") not shown."""

    def __enter__(self):
        self.env = dict(_ENV_DATA) if _ENV_DATA is not None else dict(os.environ)
        self.lines = _STATE.capture.lines = []
        self.logger = logging.getLogger("sglang")
        self.propagate, self.logger.propagate = self.logger.propagate, False
        self.warnings = warnings.catch_warnings()
        self.warnings.__enter__()
        warnings.simplefilter("ignore")
        return self

    def __exit__(self, *exc):
        _STATE.capture.lines = None
        self.logger.propagate = self.propagate
        self.warnings.__exit__(*exc)
        now = _ENV_DATA if _ENV_DATA is not None else os.environ
        if now != self.env:  # put back through os.environ, so the process environment follows
            decode = os.fsdecode if _ENV_DATA is not None else str
            for key in [k for k in now if k not in self.env]:
                del os.environ[decode(key)]
            for key, value in self.env.items():
                if now.get(key) != value:
                    os.environ[decode(key)] = decode(value)
        return False


def _parse(argv: list[str]):
    """`prepare_server_args` (srt/server_args.py) on the parser built once, without the
    logging.basicConfig call."""
    st = _STATE
    if "--config" in argv:
        from sglang.srt.utils.server_args_config_parser import ConfigArgumentMerger

        argv = ConfigArgumentMerger(st.parser).merge_config_with_args(argv)
    radix_eviction_policy_explicitly_set = any(
        arg == "--radix-eviction-policy" or arg.startswith("--radix-eviction-policy=")
        for arg in argv)
    raw_args = st.parser.parse_args(argv)
    raw_args._radix_eviction_policy_explicitly_set = radix_eviction_policy_explicitly_set
    server_args = st.ServerArgs.from_cli_args(raw_args)
    from sglang.srt.sampling.watermarking.core import redact_watermark_command_line

    server_args._launch_command = redact_watermark_command_line(argv, raw_args.watermark_config)
    return server_args


def _hisparse_config(server_args) -> None:
    st = _STATE
    saved = st.snapshot()
    try:
        st.publish(server_args, role="scheduler")
        st.parse_hisparse_config()
    finally:
        st.restore(saved)


def _where(exc: BaseException) -> str | None:
    """The innermost frame inside the sglang package: "srt/arg_groups/x.py:LINE function"."""
    prefix = _STATE.package_dir
    found = None
    tb = exc.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        if code.co_filename.startswith(prefix):
            found = f"{code.co_filename[len(prefix):]}:{tb.tb_lineno} {code.co_name}"
        tb = tb.tb_next
    return found


def run_case(case: Case) -> Result:
    """Run one case; never raises for what SGLang does with it (a bad architecture or platform
    is a ValueError: the case cannot be run at all)."""
    from engine.sglang.conform.machine import faked_gpu

    import_sglang()
    st = _STATE
    model = st.models.path(case.architecture, case.model_extra)
    argv = ["--model-path", model, *case.argv]
    server_args = None
    stage = "parser"
    error = None
    with _Isolated() as iso, faked_gpu(case.platform, case.capability):
        try:
            server_args = _parse(argv)
            stage = "resolve"
            server_args.resolve_once()
            stage = "check"
            server_args.check_server_args()
            if st.resolution_result(server_args, "enable_hisparse"):
                stage = "hisparse_config"
                _hisparse_config(server_args)
            stage = "done"
        except (Exception, SystemExit) as exc:  # KeyboardInterrupt goes on up
            error = exc
        kv, prefill, decode = None, None, None
        if server_args is not None:
            kv, prefill, decode = (st.resolution_result(server_args, f) for f in
                                   ("kv_cache_dtype", "dsa_prefill_backend", "dsa_decode_backend"))
    log = tuple(iso.lines)
    if error is None:
        return Result(ok=True, message=None, kv_cache_dtype=kv, backends=(prefill, decode),
                      log=log, stage="done")
    parser_error = isinstance(error, _ParserExit)
    return Result(ok=False, message=str(error), kv_cache_dtype=kv, backends=(prefill, decode),
                  log=log, stage=stage, where=_where(error),
                  error_type="SystemExit" if parser_error else type(error).__name__)
