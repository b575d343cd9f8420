"""`python -m bench.conform_bench [--workers 0 1 2] [--profile]`: what one config costs through
the SGLang 0.5.23 conform driver, and where the time goes.

Runs a 768-config grid (4 architectures x cuda/hip x SM 9.0/10.0/12.0 x 4 KV dtypes x HiSparse
off/on x 4 prefill backends) through `run_cases` for each worker count and prints wall and CPU
milliseconds per config (CPU: the parent's and the workers', so a loaded machine shows in wall
time only). --profile: cProfile of one config, by SGLang stage."""
from __future__ import annotations

import argparse
import cProfile
import itertools
import os
import pstats
import time


def grid():
    from engine.conform.protocol import Case

    archs = ("DeepseekV32ForCausalLM", "GlmMoeDsaForCausalLM", "Glm5NextForConditionalGeneration",
             "DeepseekV3ForCausalLM")
    out = []
    for arch, plat, cap, kv, hisparse, prefill in itertools.product(
            archs, ("cuda", "hip"), ((9, 0), (10, 0), (12, 0)),
            ("auto", "fp8_e4m3", "bfloat16", "nvfp4"), (False, True),
            (None, "flashmla_kv", "tilelang", "triton")):
        argv = ["--kv-cache-dtype", kv]
        if hisparse:
            argv += ["--enable-hisparse", "--disable-radix-cache"]
        if prefill:
            argv += ["--dsa-prefill-backend", prefill]
        out.append(Case(argv=tuple(argv), architecture=arch, platform=plat, capability=cap))
    return out


def profile(driver) -> None:
    from engine.conform.protocol import Case

    case = Case(argv=("--kv-cache-dtype", "bfloat16"), architecture="DeepseekV32ForCausalLM",
                platform="cuda", capability=(10, 0))
    prof = cProfile.Profile(time.process_time)  # CPU time: a loaded machine does not inflate it
    prof.enable()
    for _ in range(100):
        driver.run_case(case)
    prof.disable()
    stats = pstats.Stats(prof)
    total = sum(v[2] for v in stats.stats.values())  # tottime of everything
    cum = {f"{os.path.basename(k[0])}:{k[2]}": v[3] for k, v in stats.stats.items()}
    print(f"CPU profile of one config ({case.architecture}, SM100, bfloat16), 100 runs:")
    for label, key in (("parser (parse_args + from_cli_args)", "sglang_0523.py:_parse"),
                       ("resolve_once (the pipeline)", "server_args.py:resolve_once"),
                       ("  of which the DSA steps", "model_hook.py:handle_model_specific_adjustments"),
                       ("  of which ModelConfig", "model_config.py:from_server_args"),
                       ("check_server_args", "server_args.py:check_server_args")):
        if key in cum:
            print(f"  {label:40} {1000 * cum[key] / 100:6.2f} ms")
    print(f"  {'total (profiled)':40} {1000 * total / 100:6.2f} ms")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.conform_bench")
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args(argv)
    from engine.conform import runner, sglang_0523

    start = time.perf_counter()
    sglang_0523.load()
    print(f"load (import SGLang + warm-up): {time.perf_counter() - start:.1f} s")
    cases = grid()
    for workers in args.workers:
        t0, c0 = time.perf_counter(), os.times()
        runner.run_cases(sglang_0523, cases, workers=workers)
        wall, c1 = time.perf_counter() - t0, os.times()
        cpu = (c1.user - c0.user) + (c1.system - c0.system) + (c1.children_user - c0.children_user) \
            + (c1.children_system - c0.children_system)
        print(f"workers={workers}: {len(cases)} configs in {wall:.2f} s: "
              f"{1000 * wall / len(cases):.2f} ms/config wall, {1000 * cpu / len(cases):.2f} ms CPU")
    if args.profile:
        profile(sglang_0523)


if __name__ == "__main__":
    main()
