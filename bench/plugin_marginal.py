"""Run as a child process by bench/plugin_bench.py (not imported by it): the plugin's marginal CPU
time in one process, a figure far less noisy on a loaded machine than the difference of two
processes' times. One JSON line on stdout.

    python bench/plugin_marginal.py ARGV...

In this process: SGLang's start-up up to its routing decision without the plugin (as
bench/plugin_startup.py runs it; SGLANG_PLUGINS names only the GPU stand-in), its CPU time from
the process's start (`alone`); the same start-up once more, warm (`warm_alone`); then the plugin
loaded as SGLang loads it (SGLANG_PLUGINS naming it, HISPARSE_POLICY=installed, SGLang's
`load_plugins()` run again after resetting its once-per-process flag) and the start-up run with
its hooks (`warm_hooked`, which must log the plugin's line). The plugin's marginal CPU is what
`load_plugins()` took (loading the policies, importing what only it imports, registering its hooks,
SGLang applying them) plus `warm_hooked - warm_alone` (deciding by the policies); its share is
that over `alone`."""
from __future__ import annotations

import json
import logging
import os
import resource
import sys
import time

STANDIN_PLUGIN = "hisparse_bench_gpu"


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main(argv: list[str]) -> int:
    os.environ["SGLANG_PLUGINS"] = STANDIN_PLUGIN
    os.environ.pop("HISPARSE_POLICY", None)
    import sglang.srt.plugins as plugins
    from sglang.srt.server_args import prepare_server_args

    def startup():
        server_args = prepare_server_args(argv)
        server_args.resolve_once()
        server_args.check_server_args()

    plugins.load_plugins()
    startup()
    alone = _cpu()
    t0 = time.process_time()
    startup()
    warm_alone = time.process_time() - t0
    os.environ["SGLANG_PLUGINS"] = f"{STANDIN_PLUGIN},hisparse_router"
    os.environ["HISPARSE_POLICY"] = "installed"
    lines = []

    class Collect(logging.Handler):
        def emit(self, record):
            lines.append(record.getMessage())

    logging.getLogger("sglang").addHandler(Collect())  # (SGLang's basicConfig(force=True) clears the root's)
    plugins._plugins_loaded = False  # SGLang's once-per-process flag: load the plugins again
    t0 = time.process_time()
    plugins.load_plugins()
    load = time.process_time() - t0
    t0 = time.process_time()
    startup()
    warm_hooked = time.process_time() - t0
    decided = [line for line in lines if line.startswith("hisparse-router: ") and "decided by policy" in line]
    if not decided:
        print("the plugin did not decide", file=sys.stderr)
        return 1
    print(json.dumps({"alone": alone, "warm_alone": warm_alone, "load_plugins": load, "warm_hooked": warm_hooked,
                      "marginal": load + warm_hooked - warm_alone, "decided": decided}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
