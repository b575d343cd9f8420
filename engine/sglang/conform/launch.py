"""A whole launch's start-up on a release before the resolution pipeline (0.5.11 to 0.5.18), for
the model classes other than DSA (DeepSeek-V4, MiniMax-M3): what `sglang serve` runs before the
model runner starts, all of it the installed release's code.

The DSA cases of these drivers run a slice of start-up (`prepipeline`, `transitional`). The other
classes' routing is spread over `__post_init__` and reads what it fills: for DeepSeek-V4 the legacy
context-parallel flags are mapped before the model adjustments, the generic page-size snaps and the
context-parallel "mutually exclusive" check come after them, then the speculative checks; the MegaMoE
budget reads the chunked-prefill default the GPU's memory sets. So it runs whole, in SGLang's order:
1. parser: the release's parser on `--model-path DIR`, the case's argv and, on NPU, `--device npu`
   (as `prepare_server_args`, which only parses and builds);
2. resolve: `ServerArgs.from_cli_args`, its `__post_init__` run right after the object is built (as
   the dataclass `__init__` runs it last), so the fields can be read also after a raise;
3. check: `check_server_args()` (HiSparse validation among the others);
4. hisparse_config, HiSparse on: `parse_hisparse_config(sa)`, which the model runner calls first.

Faked, where a CPU machine cannot answer: the platform helpers (`machine.PatchedHelpers`), the
device-memory probes and the unified-KV gate's cached answer (`machine.device_probes`). The case's
`env` is set for the launch; `os.environ` is put back after it (start-up writes SGLANG_* variables).

Read back: the KV dtype, the DSA backend pair and the case's `reads` as resolved: once `__post_init__`
has materialized the passes' declarations (0.5.15 on) the fields, before that (a raise midway)
through `resolved_view`. Log: the WARNING records of the class's routing functions (`registry.ROUTING`),
including those written before a raise."""
from __future__ import annotations

import importlib
import os

from engine.sglang import hook_targets, registry
from engine.sglang.conform import machine, startup
from engine.sglang.conform.protocol import Case, Result

# modules start-up imports inside functions on these classes' paths: imported at load, before the
# platform helpers are found, so that they are patched like the others, and before any case patches
# them: the DSpark path (0.5.16 on) reaches srt/layers/sampler.py, whose `if is_cuda():` imports
# flashinfer, which a CPU machine lacks
LAZY = (*machine.LAZY_V4, "sglang.srt.arg_groups.speculative_hook", "sglang.srt.arg_groups.pd_disaggregation_hook",
        "sglang.srt.mem_cache.sparsity.factory", "sglang.srt.speculative.dspark_components.dspark_config")
# the model classes other than DSA whose start-up runs at load (startup.WARM_UP), so that what it
# imports lazily is imported once, in the process that forks the workers
WARM_UP = (("DeepseekV4ForCausalLM", "dsv4"),)


def import_lazy_modules() -> None:
    for name in LAZY:
        try:
            importlib.import_module(name)
        except ImportError:  # not in this release
            pass


def warm_up(run_case) -> None:
    for architecture, routing in WARM_UP:
        for argv, platform, capability in startup.WARM_UP:
            run_case(Case(argv, architecture, platform, capability, routing=routing))


def run(driver, case: Case) -> Result:
    """The release's start-up on `case` (a model class other than DSA), with `driver`'s parser,
    model folders, platform helpers and log capture."""
    if case.platform not in machine.PLATFORMS:
        raise ValueError(f"platform {case.platform!r}: this driver runs {', '.join(machine.PLATFORMS)}")
    driver.load()
    model = driver.models.path(case.architecture, case.model_extra)
    argv = ["--model-path", model, *case.argv] + (["--device", "npu"] if case.platform == "npu" else [])
    capability = tuple(case.capability)
    sa, stage, error = None, "parser", None
    with startup.Isolated(driver.capture) as iso:
        os.environ.update(case.env)  # put back with the rest by Isolated
        try:
            namespace = driver.parser.parse_args(argv)
            stage = "resolve"
            with driver.platform.case(case.platform, capability), machine.device_probes(case.platform, capability):
                sa = startup.before_post_init(driver.sa_module.ServerArgs, namespace)
                sa.__post_init__()
                stage = "check"
                sa.check_server_args()
                if sa.enable_hisparse:
                    stage = "hisparse_config"
                    from sglang.srt.mem_cache.sparsity.factory import parse_hisparse_config

                    parse_hisparse_config(sa)
        except (Exception, SystemExit) as exc:  # SGLang's own error (argparse's: ParserError)
            error = exc
        kv, backends, values = None, (None, None), ()
        if sa is not None:
            view = resolved(sa)
            kv, backends = view.kv_cache_dtype, tuple(getattr(view, f) for f in driver.names.fields)
            values = tuple((f, startup.plain(getattr(view, f))) for f in case.reads)
    routing = registry.ROUTING[case.routing]
    return startup.result(error, stage, kv, backends, startup.lines_for(iso.lines, routing.functions, routing.deprecated),
                          driver.package_dir, {"sglang": driver.version, "values": values})


def resolved(sa):
    """The ServerArgs as resolved: itself, or, while `__post_init__`'s passes have declarations not
    yet materialized (0.5.15 on, a raise midway), `resolved_view` of it."""
    if hook_targets.declarations_pending(sa):
        from sglang.srt.arg_groups.overrides import resolved_view

        return resolved_view(sa)
    return sa
