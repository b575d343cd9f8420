"""What every driver does around SGLang's start-up code, whatever the release: the parser that
raises instead of exiting, one case's side effects kept in (routing log captured, os.environ put
back, warnings not shown), a ServerArgs built without `__post_init__` (the releases before the
pipeline), where a raise came from, the warm-up cases, and the Result.

Nothing here imports SGLang: a driver passes in what it imported."""
from __future__ import annotations

import argparse
import logging
import os
import warnings

from engine.sglang.conform.protocol import Case, Result, is_routing_record
from engine.sglang.registry import installed_release  # noqa: F401  (the drivers' name for it)

PLATFORMS = ("cuda", "hip")

# cases run at load time for each architecture, so that the imports SGLang makes lazily inside
# resolution (the HiSparse path, ROCm, Blackwell, the mamba-cache path of GLM-5.3-Flash) happen
# before the workers fork: (argv, platform, capability)
WARM_UP = (
    (("--enable-hisparse", "--disable-radix-cache", "--kv-cache-dtype", "fp8_e4m3"), "cuda", (9, 0)),
    ((), "cuda", (10, 0)),
    ((), "hip", (9, 4)),
)




def warm_up(run_case, architectures) -> None:
    for architecture in architectures:
        for argv, platform, capability in WARM_UP:
            run_case(Case(argv, architecture, platform, capability))


def check_platform(case: Case) -> None:
    """A case no driver can set up raises ValueError (it is not a result of SGLang's)."""
    if case.platform not in PLATFORMS:
        raise ValueError(f"platform {case.platform!r}: this driver runs cuda or hip")


# -- the parser ----------------------------------------------------------------------------------
class ParserError(SystemExit):
    """argparse's error, caught at `parser.error` (which would print usage and exit 2)."""

    def __init__(self, message: str):
        super().__init__(2)
        self.message = message

    def __str__(self) -> str:
        return self.message


class ReleaseParser(argparse.ArgumentParser):
    """SGLang's parser, unchanged, except that an error (or an exit: --help, --version) raises
    ParserError instead of printing and exiting."""

    def error(self, message):
        raise ParserError(message)

    def exit(self, status=0, message=None):
        raise ParserError(message or "")

    def _print_message(self, message, file=None):
        pass  # --help and --version text is not wanted in a conformance run


def release_parser(server_args_class) -> ReleaseParser:
    """The release's own `sglang serve` parser (ServerArgs.add_cli_args, `prog` as
    `prepare_server_args` has it)."""
    parser = ReleaseParser(prog="sglang serve")
    server_args_class.add_cli_args(parser)
    return parser


def before_post_init(server_args_class, namespace):
    """`ServerArgs.from_cli_args(namespace)`, built but its `__post_init__` not yet run (a
    dataclass runs it last in `__init__`): the caller runs it, so the object is there to read
    also when it raises, or keeps only what routing reads of it (`without_post_init`)."""
    post_init = server_args_class.__post_init__
    server_args_class.__post_init__ = lambda self: None
    try:
        return server_args_class.from_cli_args(namespace)
    finally:
        server_args_class.__post_init__ = post_init


def without_post_init(server_args_class, namespace):
    """`ServerArgs.from_cli_args(namespace)` with `__post_init__` skipped (it downloads, probes
    devices and fills hundreds of defaults routing does not read), keeping the effects the routing
    reads: `--quantization unquant` becomes None and sets `_quantization_explicitly_unset`, and,
    where the release has it, its own `_parse_cuda_graph_config()` (flags to a CudaGraphConfig; it
    reads no device), which the non-DSA DeepSeek branch reads from 0.5.14."""
    from engine.sglang.hook_targets import post_init_effects

    sa = before_post_init(server_args_class, namespace)
    post_init_effects(sa)
    return sa


# -- one case's side effects ---------------------------------------------------------------------
class LogCapture(logging.Handler):
    """The routing log of the case being run: the WARNING records of `functions`
    (protocol.is_routing_record), as (function, text). Installed on the "sglang" logger once per
    process, with the logger's level set to WARNING whatever the host configured, so the records
    are made. Set once: `Logger.setLevel` clears every logger's cache, ~1 ms with SGLang's
    hundreds of loggers."""

    def __init__(self, functions, deprecated=("--nsa-",)):
        super().__init__(logging.WARNING)
        self.functions, self.deprecated = frozenset(functions), tuple(deprecated)
        self.lines: list[tuple] | None = None  # None between cases
        logger = logging.getLogger("sglang")
        logger.setLevel(logging.WARNING)
        logger.addHandler(self)

    def emit(self, record):
        if self.lines is not None and is_routing_record(record, self.functions, self.deprecated):
            self.lines.append((record.funcName, record.getMessage()))


def every_class_capture(dsa_functions) -> LogCapture:
    """A LogCapture of the DSA routing functions a driver names and of every other model class's
    (registry.ROUTING); a case keeps its own class's lines (`lines_for`)."""
    from engine.sglang import registry

    every = set(dsa_functions).union(*(r.functions for r in registry.ROUTING.values()))
    parts = {"--nsa-", *(d for r in registry.ROUTING.values() for d in r.deprecated)}
    return LogCapture(every, tuple(sorted(parts)))


def lines_for(lines, functions, deprecated=("--nsa-",)) -> list[str]:
    """The texts of the captured (function, text) lines that are routing lines of `functions`
    (a model class's routing, where a driver captures several classes' at once)."""
    return [text for func, text in lines if func in functions
            and (func != "print_deprecated_warning" or any(d in text for d in deprecated))]


_ENV_DATA = getattr(os.environ, "_data", None)  # CPython's raw mapping: a cheap snapshot


class Isolated:
    """One case's side effects kept in: its log captured (`.lines`; the "sglang" logger does not
    propagate meanwhile, so the host's handlers print nothing of SGLang's), os.environ put back
    (the DSA step writes SGLANG_{NSA,DSA}_PREFILL_DENSE_ATTN_KV_LEN_THRESHOLD), warnings (a CPU
    machine's "Triton is not supported on current platform") not shown."""

    def __init__(self, capture: LogCapture):
        self.capture = capture

    def __enter__(self):
        self.env = dict(_ENV_DATA) if _ENV_DATA is not None else dict(os.environ)
        self.lines = self.capture.lines = []
        self.logger = logging.getLogger("sglang")
        self.propagate, self.logger.propagate = self.logger.propagate, False
        self.warnings = warnings.catch_warnings()
        self.warnings.__enter__()
        warnings.simplefilter("ignore")
        return self

    def __exit__(self, *exc):
        self.capture.lines = None
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


# -- the result ----------------------------------------------------------------------------------
def where_raised(exc: BaseException, package_dir: str) -> str | None:
    """The innermost frame inside the sglang package (`package_dir`, ending in a separator):
    "srt/arg_groups/x.py:LINE function"."""
    found = None
    tb = exc.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        if code.co_filename.startswith(package_dir):
            found = f"{code.co_filename[len(package_dir):].replace(os.sep, '/')}:{tb.tb_lineno} {code.co_name}"
        tb = tb.tb_next
    return found


def package_dir() -> str:
    """The imported sglang package's folder, ending in a separator."""
    import sys

    return os.path.dirname(os.path.abspath(sys.modules["sglang"].__file__)) + os.sep


def plain(value):
    """A resolved field as a plain value (an enum member: its value)."""
    value = getattr(value, "value", value)
    return value if value is None or isinstance(value, (str, int, float, bool)) else repr(value)


def result(error, stage: str, kv, backends, lines, package: str, extra=None) -> Result:
    """The Result of a case that ended at `stage` (with `error`, or None when it ran to its end)."""
    log = tuple(line if isinstance(line, str) else line[1] for line in lines)
    values = tuple((extra or {}).pop("values", ()))
    if error is None:
        return Result(ok=True, message=None, kv_cache_dtype=kv, backends=backends, log=log,
                      stage="done", values=values, extra=extra or {})
    return Result(ok=False, message=str(error), kv_cache_dtype=kv, backends=backends, log=log,
                  stage=stage, where=where_raised(error, package),
                  error_type="SystemExit" if isinstance(error, ParserError) else type(error).__name__,
                  values=values, extra=extra or {})
