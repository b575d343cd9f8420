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
    from engine.sglang.conform.protocol import Case

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


def profile(driver, runs: int = 200) -> None:
    """Stage CPU times of one config (timed directly: cProfile's own cost would swamp them),
    then the functions that take the most time under cProfile, as shares."""
    from engine.sglang.conform.machine import faked_gpu
    from engine.sglang.conform.protocol import Case

    case = Case(argv=("--kv-cache-dtype", "bfloat16"), architecture="DeepseekV32ForCausalLM",
                platform="cuda", capability=(10, 0))
    argv = ["--model-path", driver._STATE.models.path(case.architecture), *case.argv]
    stages = {"parser": 0.0, "resolve_once": 0.0, "check_server_args": 0.0, "driver around": 0.0}
    clock = time.process_time
    for _ in range(runs):
        t0 = clock()
        with driver._Isolated(), faked_gpu(case.platform, case.capability):
            t1 = clock()
            args = driver._parse(list(argv))
            t2 = clock()
            args.resolve_once()
            t3 = clock()
            args.check_server_args()
            t4 = clock()
        t5 = clock()
        for key, dt in zip(stages, (t2 - t1, t3 - t2, t4 - t3, (t1 - t0) + (t5 - t4))):
            stages[key] += dt
    total = sum(stages.values())
    print(f"CPU per stage, one config ({case.architecture}, SM100, bfloat16), {runs} runs:")
    for key, value in stages.items():
        print(f"  {key:20} {1000 * value / runs:6.2f} ms  {100 * value / total:4.0f}%")
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(50):
        driver.run_case(case)
    prof.disable()
    stats = pstats.Stats(prof)
    whole = sum(v[2] for v in stats.stats.values())
    top = sorted(stats.stats.items(), key=lambda kv: -kv[1][2])[:6]
    print("functions with the most own time (cProfile shares):")
    for (path, line, name), v in top:
        print(f"  {100 * v[2] / whole:4.0f}%  {name} ({os.path.basename(path)}:{line})")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.conform_bench")
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args(argv)
    from engine.sglang.conform import runner, pipeline

    start = time.perf_counter()
    pipeline.load()
    print(f"load (import SGLang + warm-up): {time.perf_counter() - start:.1f} s")
    cases = grid()
    for workers in args.workers:
        t0, c0 = time.perf_counter(), os.times()
        runner.run_cases(pipeline, cases, workers=workers)
        wall, c1 = time.perf_counter() - t0, os.times()
        cpu = (c1.user - c0.user) + (c1.system - c0.system) + (c1.children_user - c0.children_user) \
            + (c1.children_system - c0.children_system)
        print(f"workers={workers}: {len(cases)} configs in {wall:.2f} s: "
              f"{1000 * wall / len(cases):.2f} ms/config wall, {1000 * cpu / len(cases):.2f} ms CPU")
    if args.profile:
        profile(pipeline)


if __name__ == "__main__":
    main()
