"""Engine figures: decision cost vs SGLang's if/else, policy load, cold CLI start, full diff."""
from __future__ import annotations

import os
import statistics
import sys

from bench.common import ROOT, goal, interleaved, run_process, write_result

sys.path.insert(0, os.path.join(ROOT, "tests"))


def decision_cost(quick: bool) -> tuple[dict, dict]:
    import engine
    from sglang_reference import domain, route

    policy = engine.load_policy("nsa-backends@2")
    configs = list(domain())
    evaluate = policy.evaluate

    def ours():
        for c in configs:
            evaluate(c)

    def ifelse():
        for c in configs:
            route(2, **c)

    t = interleaved({"policy": ours, "ifelse": ifelse}, repeats=3 if quick else 9)
    per = {k: v / len(configs) * 1e6 for k, v in t.items()}
    ratio = per["policy"] / per["ifelse"]
    figures = {"configs": len(configs), "policy_us_per_decision": round(per["policy"], 3),
               "ifelse_us_per_decision": round(per["ifelse"], 3), "ratio": round(ratio, 3)}
    return figures, {"decision_cost_ratio": goal(ratio, 1.5, "max", "x")}


def policy_load(quick: bool) -> tuple[dict, dict]:
    import time

    from engine.lint import lint
    from engine.loader import compile_bytes, list_families, load_file, resolve_ref

    figures, goals = {}, {}
    refs = [f"{fam}@{v}" for fam, vs in list_families().items() for v in vs]
    n = 5 if quick else 25
    for ref in refs:
        path, display = resolve_ref(ref)
        with open(path, "rb") as fh:
            data = fh.read()
        import hashlib

        digest = hashlib.sha256(data).hexdigest()
        compile_bytes(data, display, digest, path)  # builds the schema validator once
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            compile_bytes(data, display, digest, path)
            times.append(time.perf_counter() - t0)
        load_ms = statistics.median(times) * 1e3
        load_file(path, display)
        cached = []
        for _ in range(n * 4):
            t0 = time.perf_counter()
            load_file(path, display)
            cached.append(time.perf_counter() - t0)
        cached_ms = statistics.median(cached) * 1e3
        policy = load_file(path, display)
        t0 = time.perf_counter()
        lint(policy)
        lint_ms = (time.perf_counter() - t0) * 1e3
        figures[ref] = {"load_ms": round(load_ms, 3), "cached_load_ms": round(cached_ms, 4),
                        "deep_lint_ms": round(lint_ms, 1), "bytes": len(data)}
        goals[f"load_{ref}"] = goal(load_ms, 50, "max", " ms")
        goals[f"cached_load_{ref}"] = goal(cached_ms, 1, "max", " ms")
    return figures, goals


def cold_start(quick: bool) -> tuple[dict, dict]:
    py = sys.executable
    ours = [py, "-m", "engine.cli", "evaluate", "--enable-hisparse", "--kv-cache-dtype", "fp8_e4m3",
            "--disable-radix-cache", "--format", "json"]
    base = [py, "-c", "import yaml, jsonschema"]
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="0")
    run_process(ours, env), run_process(base, env)  # warm the file cache and bytecode
    a, b = [], []
    for _ in range(5 if quick else 15):
        a.append(run_process(ours, env))
        b.append(run_process(base, env))
    ours_ms, base_ms = statistics.median(a) * 1e3, statistics.median(b) * 1e3
    probe = ("import sys; from engine.cli import main; main(['evaluate', '--format', 'json']); "
             "print('TORCH', 'torch' in sys.modules)")
    import subprocess

    out = subprocess.run([py, "-c", probe], capture_output=True, text=True, cwd=ROOT).stdout
    torch_loaded = "TORCH True" in out
    figures = {"hisparse_evaluate_ms": round(ours_ms, 1), "import_yaml_jsonschema_ms": round(base_ms, 1),
               "ratio": round(ours_ms / base_ms, 3), "torch_imported": torch_loaded}
    goals = {"cold_start_ratio": goal(ours_ms / base_ms, 1.5, "max", "x"),
             "torch_never_imported": {"value": not torch_loaded, "goal": "true", "met": not torch_loaded}}
    return figures, goals


def full_diff(quick: bool) -> tuple[dict, dict]:
    import time

    import engine
    from engine.diff import diff

    a, b = engine.load_policy("nsa-backends@1"), engine.load_policy("nsa-backends@2")
    times = []
    for _ in range(3 if quick else 7):
        t0 = time.perf_counter()
        result = diff(a, b)
        times.append(time.perf_counter() - t0)
    in_process = statistics.median(times)
    proc = statistics.median(run_process([sys.executable, "-m", "engine.cli", "diff", "nsa-backends@1",
                                          "nsa-backends@2", "--format", "json"]) for _ in range(3))
    figures = {"configs": result["total"], "evaluations": 2 * result["total"],
               "in_process_s": round(in_process, 3), "process_s": round(proc, 3)}
    c = engine.load_policy("nsa-backends@3")  # the largest union domain the shipped policies have
    t0 = time.perf_counter()
    big = diff(b, c)
    figures["v2_v3"] = {"configs": big["total"], "in_process_s": round(time.perf_counter() - t0, 2)}
    return figures, {"diff_seconds": goal(proc, 1.0, "max", " s")}


def run(quick: bool) -> str:
    figures, goals = {}, {}
    for name, fn in (("decision_cost", decision_cost), ("policy_load", policy_load),
                     ("cold_start", cold_start), ("diff", full_diff)):
        f, g = fn(quick)
        figures[name] = f
        goals.update(g)
    return write_result("engine", figures, goals, quick)


if __name__ == "__main__":
    print(run("--quick" in sys.argv))
