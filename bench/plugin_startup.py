"""Run as a child process by bench/plugin_bench.py (not imported by it): SGLang's own start-up of
`python -m sglang.launch_server ARGV...`, up to the routing decision and no further, then one JSON
line on stdout.

    python bench/plugin_startup.py ARGV...

What it runs is SGLang's launcher's own sequence: `load_plugins()` (SGLang's plugin loader: the
entry points of group `sglang.srt.plugins`, filtered by SGLANG_PLUGINS, then the hooks applied),
`prepare_server_args(argv)` (the parser, ServerArgs construction), `resolve_once()` (the resolution
pipeline, where the routing passes run) and `check_server_args()`. Whether the plugin acts is up
to the environment, as in a real launch (HISPARSE_POLICY; SGLANG_PLUGINS). The JSON line holds the
routing's outcome (so the parent can check that both runs decided the same), the process's CPU
time (user + system) at that point, and its thread counts."""
from __future__ import annotations

import json
import os
import resource
import sys
import time


def _threads() -> int:
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Threads:"):
                    return int(line.split()[1])
    except OSError:
        pass
    import threading

    return threading.active_count()


def main(argv: list[str]) -> int:
    wall0 = time.perf_counter()
    from sglang.srt.plugins import load_plugins
    from sglang.srt.server_args import prepare_server_args

    load_plugins()
    outcome: dict = {}
    try:
        server_args = prepare_server_args(argv)
        server_args.resolve_once()
        server_args.check_server_args()
    except Exception as exc:  # a refusal is a routing outcome too
        outcome["refused"] = f"{type(exc).__name__}: {exc}"
    else:
        from sglang.srt.arg_groups.overrides import resolving_view

        view = resolving_view(server_args)
        for field in ("kv_cache_dtype", "attention_backend", "dsa_prefill_backend", "dsa_decode_backend",
                      "dsv4_attn_backend", "page_size"):
            outcome[field] = str(getattr(view, field, None))
    usage = resource.getrusage(resource.RUSAGE_SELF)
    import torch

    print(json.dumps({
        "outcome": outcome,
        "cpu": usage.ru_utime + usage.ru_stime,
        "wall": time.perf_counter() - wall0,
        "threads": _threads(),
        "torch_threads": torch.get_num_threads(),
        "plugin_modules": sorted(m for m in sys.modules if m.split(".")[0] == "engine"),
    }))
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
