"""Driver for the SGLang releases whose start-up runs the `resolve_once` resolution pipeline:
0.5.19 to 0.5.23. One Case through the installed release's own start-up code, on a CPU machine.

The steps, in SGLang's start-up order (`launch_server.py`, `srt/entrypoints/engine.py`):
1. parser: the argparse parser of `ServerArgs.add_cli_args` (built once per process), then the
   release's own `prepare_server_args`, compiled from its installed source with two statements
   changed (`_prepare_function`): the parser is the one built once, and its
   `logging.basicConfig(force=True)`, which would reconfigure the caller's logging, is left out. So
   whatever a release does there (0.5.20 adds the --radix-eviction-policy marker and the
   launch command, 0.5.21 redacts the watermark key) is the release's code, with its line numbers;
2. resolve: `ServerArgs.resolve_once()` (the resolution pipeline, DSA steps included);
3. check: `ServerArgs.check_server_args()` (HiSparse validation among the others);
4. hisparse_config, HiSparse only: `parse_hisparse_config()`, which the model runner calls at
   start, reading `--hisparse-config` through the published context (`publish(role=
   "scheduler")`, then the context is put back with `restore_context(snapshot_context())`).

What differs between these releases and is read from the installed one, not from a version table:
- the platform facts `override_platform` knows (`_PLATFORM_PROBES` / `_PLATFORM_VALUES`; is_mps and
  is_sm110 only from 0.5.22): `machine.platform_facts` gives exactly those;
- `prepare_server_args` (above);
- ServerArgs: a dataclass in 0.5.19, a msgspec Struct from 0.5.20 (the fields memo, below, is for
  the Struct only).
A release that has moved something this driver needs (a newer one) is refused at import with
`Moved`, naming it, rather than run wrongly.

What is faked, and why (also in docs/conform.md, "What conform fakes"):
- the model: a folder with only a config.json written by transformers' config class for the
  architecture (`model_folders.py`); no weights, no tokenizer (no routing code reads them);
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

import os
import warnings

from engine.sglang import registry
from engine.errors import EngineError
from engine.sglang.conform import startup
from engine.sglang.conform.protocol import Case, Result

# the releases this driver was checked on, oldest first; VERSION is the newest
RELEASES = registry.driven_by(__name__)
VERSION = RELEASES[-1]

# the DSA / HiSparse routing functions of these releases whose warnings are the routing log
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
    "print_deprecated_warning",  # srt/arg_groups/argparse_actions.py: 0.5.19's --nsa-* notice
})

class Moved(EngineError, ImportError):
    """The installed SGLang lacks something this driver runs (a newer release moved it): the
    message names it."""


# what the driver imports from SGLang, as (module, name): a release without one is refused
NEEDED = (
    ("sglang.srt.server_args", "ServerArgs"),
    ("sglang.srt.server_args", "prepare_server_args"),
    ("sglang.srt.arg_groups.overrides", "resolution_result"),
    ("sglang.srt.mem_cache.sparsity.factory", "parse_hisparse_config"),
    ("sglang.srt.runtime_context", "publish"),
    ("sglang.srt.runtime_context", "restore_context"),
    ("sglang.srt.runtime_context", "snapshot_context"),
    ("sglang.srt.runtime_context", "override_platform"),
)
# the ServerArgs fields a Result reads (renamed before, in 0.5.13: nsa_* -> dsa_*)
FIELDS = ("kv_cache_dtype", "dsa_prefill_backend", "dsa_decode_backend", "enable_hisparse")


def _needed() -> dict:
    """name -> object for each of NEEDED. Raises Moved naming every one that is missing."""
    import importlib

    found, missing = {}, []
    for module_name, name in NEEDED:
        try:
            found[name] = getattr(importlib.import_module(module_name), name)
        except ModuleNotFoundError as exc:
            if exc.name is None or not module_name.startswith(exc.name):
                raise  # a dependency of SGLang is missing: that is the environment, not a move
            missing.append(f"{module_name} (no such module)")
        except AttributeError:
            missing.append(f"{module_name}.{name}")
    if missing:
        raise Moved("SGLang no longer has " + ", ".join(missing))
    return found


def _prepare_function(prepare_server_args, parser):
    """The release's `prepare_server_args`, compiled from its installed source with the file name
    and line numbers of the release, in its module's globals, with two statements changed: the
    `parser = argparse.ArgumentParser(...)` / `ServerArgs.add_cli_args(parser)` pair becomes the
    parser built once (`parser`), and the `logging.basicConfig(...)` call is left out. Raises
    Moved when the function no longer has exactly one of each."""
    import ast
    import inspect
    import sys
    import textwrap

    lines, first = inspect.getsourcelines(prepare_server_args)
    filename = inspect.getsourcefile(prepare_server_args)
    tree = ast.parse(textwrap.dedent("".join(lines)))
    definition = tree.body[0]

    def call_of(stmt, name):
        value = stmt.value if isinstance(stmt, (ast.Expr, ast.Assign)) else None
        return (isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute)
                and value.func.attr == name)

    body, seen = [], {"ArgumentParser": 0, "add_cli_args": 0, "basicConfig": 0}
    for stmt in definition.body:
        if isinstance(stmt, ast.Assign) and call_of(stmt, "ArgumentParser"):
            seen["ArgumentParser"] += 1
            stmt.value = ast.copy_location(ast.Name("__conform_parser__", ast.Load()), stmt.value)
        elif isinstance(stmt, ast.Expr) and call_of(stmt, "add_cli_args"):
            seen["add_cli_args"] += 1
            continue
        elif isinstance(stmt, ast.Expr) and call_of(stmt, "basicConfig"):
            seen["basicConfig"] += 1
            continue
        body.append(stmt)
    odd = [f"{n} x{c}" for n, c in seen.items() if c != 1]
    if odd:
        raise Moved(f"{filename}: prepare_server_args no longer builds its parser and logging as "
                    f"this driver expects (statements found: {', '.join(odd)})")
    definition.body = body
    definition.decorator_list = []
    ast.fix_missing_locations(tree)
    ast.increment_lineno(tree, first - 1)
    space = dict(vars(sys.modules[prepare_server_args.__module__]), __conform_parser__=parser)
    exec(compile(tree, filename, "exec"), space)
    return space[definition.name]


def _is_struct(cls) -> bool:
    try:
        import msgspec
    except ImportError:
        return False
    return isinstance(cls, type) and issubclass(cls, msgspec.Struct)


class _State:
    def __init__(self):
        import torch  # noqa: F401  (before transformers decides what is installed)
        import transformers  # noqa: F401

        import engine.sglang.conform.torchvision_stub as torchvision_stub
        from engine.sglang.conform.model_folders import ModelFolders

        self.torchvision_stubbed = torchvision_stub.install()
        found = _needed()
        ServerArgs = found["ServerArgs"]
        self.ServerArgs = ServerArgs
        self.resolution_result = found["resolution_result"]
        self.parse_hisparse_config = found["parse_hisparse_config"]
        self.publish, self.snapshot = found["publish"], found["snapshot_context"]
        self.restore = found["restore_context"]
        self.package_dir = startup.package_dir()
        self.parser = startup.release_parser(ServerArgs)
        self.prepare = _prepare_function(found["prepare_server_args"], self.parser)
        self.fields = _FieldsMemo(ServerArgs) if _is_struct(ServerArgs) else None
        if self.fields is None:
            import dataclasses

            names = {f.name for f in dataclasses.fields(ServerArgs)}
        else:
            names = {f.name for f in self.fields.answer}
        gone = [f for f in FIELDS if f not in names]
        if gone:
            raise Moved("SGLang's ServerArgs no longer has the field(s) " + ", ".join(gone))
        from engine.sglang.conform.machine import known_facts, platform_facts

        try:
            platform_facts("cuda", (9, 0), known_facts())
        except (ValueError, AttributeError) as exc:
            raise Moved(str(exc)) from None
        self.models = ModelFolders()
        self.capture = startup.every_class_capture(ROUTING_FUNCTIONS)
        from engine.sglang.conform.machine import import_lazy_modules

        import_lazy_modules()
        if self.fields is not None:
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
    """Import SGLang and run the warm-up cases (`startup.WARM_UP`, for each architecture), so that the
    imports SGLang makes lazily happen once, in the process that forks the workers. Idempotent."""
    import_sglang()
    if getattr(_STATE, "warm", False):
        return
    from engine.sglang.conform.model_folders import ARCHITECTURES

    startup.warm_up(run_case, ARCHITECTURES)
    _STATE.warm = True


def _parse(argv: list[str]):
    """The release's `prepare_server_args` on the parser built once, without its
    logging.basicConfig call (`_prepare_function`)."""
    return _STATE.prepare(list(argv))


def _hisparse_config(server_args) -> None:
    st = _STATE
    saved = st.snapshot()
    try:
        st.publish(server_args, role="scheduler")
        st.parse_hisparse_config()
    finally:
        st.restore(saved)


def run_case(case: Case) -> Result:
    """Run one case; never raises for what SGLang does with it (a bad architecture or platform
    is a ValueError: the case cannot be run at all)."""
    from engine.sglang.conform.machine import faked_gpu

    import_sglang()
    st = _STATE
    model = st.models.path(case.architecture, case.model_extra)
    argv = ["--model-path", model, *case.argv] + (["--device", "npu"] if case.platform == "npu" else [])
    server_args = None
    stage = "parser"
    error = None
    with startup.Isolated(st.capture) as iso, faked_gpu(case.platform, case.capability):
        os.environ.update(case.env)  # put back with the rest by Isolated
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
        kv, prefill, decode, values = None, None, None, ()
        if server_args is not None:
            kv, prefill, decode = (st.resolution_result(server_args, f) for f in
                                   ("kv_cache_dtype", "dsa_prefill_backend", "dsa_decode_backend"))
            values = tuple((f, startup.plain(st.resolution_result(server_args, f))) for f in case.reads)
    return startup.result(error, stage, kv, (prefill, decode), _routing_lines(iso.lines, case), st.package_dir,
                          {"values": values})


def _routing_lines(lines, case) -> list[str]:
    """The routing lines of the case's model class, of those captured for every class."""
    if case.routing == "dsa":
        return startup.lines_for(lines, ROUTING_FUNCTIONS)
    routing = registry.ROUTING[case.routing]
    return startup.lines_for(lines, routing.functions, routing.deprecated)
