"""Engine figures, each against its side-by-side baseline: a warm decision vs a flat hand-written
if/else, a cold `hisparse evaluate` process vs `python -c pass`, the first policy load of a fresh
process, `hisparse check policies/`, `hisparse diff` v9 -> v10, the same analyses on a synthetic
policy of about a million configs, and the size of the evaluation core."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

from bench.common import ROOT, child_env, goal, interleaved, processes, write_result
from engine.analysis import domain

PY = sys.executable
CLI = [PY, "-m", "kernels_bridge.cli"]  # `hisparse`, as the console script starts it


def decision_cost(quick: bool) -> tuple[dict, dict]:
    """A warm single decision (policy.evaluate: the interpreter, every config of the v2 domain in
    turn) against bench/flat_v2.py, which produces the same outputs as one flat if/else; and the
    bulk evaluator's cost per config over the same domain."""
    import engine
    from bench.flat_v2 import decide

    policy = engine.load_policy("dsa-backends@2")
    configs = list(domain.configs(policy))
    rows = [tuple(c.values()) for c in configs]
    n = len(policy.rule_list)
    probe = policy.probe(False)

    def loop(fn):
        def run():
            for c in configs:
                fn(c)
        return run

    def bulk():
        probe(rows, [].append, [0] * n, [0] * n)

    t = interleaved({"policy": loop(policy.evaluate), "flat": loop(decide), "bulk": bulk}, repeats=3 if quick else 11)
    per = {k: v / len(configs) * 1e6 for k, v in t.items()}
    figures = {"configs": len(configs), **{f"{k}_us_per_decision": round(v, 3) for k, v in per.items()},
               "ratio": round(per["policy"] / per["flat"], 3), "bulk_ratio": round(per["bulk"] / per["flat"], 3)}
    return figures, {"warm_decision_us": goal(per["policy"], 100.0, "max", " us")}


def _first_load_argv(ref: str) -> list[str]:
    probe = ("import time; t = time.process_time(); import engine; engine.load_policy(%r); "
             "print(time.process_time() - t)" % ref)
    return [PY, "-c", probe]


def startup(quick: bool, cache_dir: str) -> tuple[dict, dict]:
    """A cold `hisparse evaluate` process against `python -c pass` and `python -c 'import yaml'`
    in the same environment (CPU time of each process, medians of interleaved runs; importing yaml
    and jsonschema beside, what a load without the cache imports); the first load in a fresh process (import + load, measured
    inside it), from the cached document and without it."""
    env = child_env(HISPARSE_CACHE_DIR=cache_dir)
    ours = CLI + ["evaluate", "--enable-hisparse", "--kv-cache-dtype", "fp8_e4m3", "--disable-radix-cache",
                  "--format", "json"]
    t = processes({"evaluate": ours, "baseline": [PY, "-c", "import yaml, jsonschema"],
                   "yaml": [PY, "-c", "import yaml"], "python": [PY, "-c", "pass"]}, 5 if quick else 15, env)
    ratio = t["evaluate"]["cpu"] / t["python"]["cpu"]
    yaml_ratio = t["evaluate"]["cpu"] / t["yaml"]["cpu"]
    loads = {}
    for name, extra in (("cached", {}), ("uncached", {"HISPARSE_NO_CACHE": "1"})):
        e = dict(env, **extra)
        samples = [float(subprocess.run(_first_load_argv("dsa-backends@8"), capture_output=True, text=True,
                                        cwd=ROOT, env=e, check=True).stdout) for _ in range(5 if quick else 15)]
        loads[name] = sorted(samples)[len(samples) // 2] * 1e3
    probe = ("import sys; from kernels_bridge.cli import main; main(['evaluate', '--format', 'json']); "
             "print('TORCH', 'torch' in sys.modules)")
    out = subprocess.run([PY, "-c", probe], capture_output=True, text=True, cwd=ROOT, env=env).stdout
    torch_loaded = "TORCH True" in out
    figures = {"evaluate_cpu_ms": round(t["evaluate"]["cpu"] * 1e3, 1),
               "baseline_cpu_ms": round(t["baseline"]["cpu"] * 1e3, 1),
               "python_cpu_ms": round(t["python"]["cpu"] * 1e3, 1),
               "yaml_cpu_ms": round(t["yaml"]["cpu"] * 1e3, 1), "yaml_ratio": round(yaml_ratio, 3),
               "evaluate_wall_ms": round(t["evaluate"]["wall"] * 1e3, 1),
               "baseline_wall_ms": round(t["baseline"]["wall"] * 1e3, 1),
               "python_wall_ms": round(t["python"]["wall"] * 1e3, 1),
               "ratio": round(ratio, 3), "wall_ratio": round(t["evaluate"]["wall"] / t["python"]["wall"], 3),
               "first_load_cached_ms": round(loads["cached"], 2), "first_load_uncached_ms": round(loads["uncached"], 2),
               "torch_imported": torch_loaded}
    goals = {"cold_start_ratio": goal(ratio, 2.0, "max", "x"),
             "cold_start_vs_yaml": goal(yaml_ratio, 1.25, "max", "x"),
             "first_load_ms": goal(loads["cached"], 20, "max", " ms"),
             "torch_never_imported": {"value": not torch_loaded, "goal": "true", "met": not torch_loaded}}
    return figures, goals


def large_policy(folder: str) -> str:
    """dsa-backends@8 with two top-k values: 836,352 configs."""
    with open(os.path.join(ROOT, "policies", "dsa-backends", "v8.yaml"), encoding="utf-8") as fh:
        text = fh.read()
    wider = text.replace("    values: [2048]\n    default: 2048\n", "    values: [1024, 2048]\n    default: 2048\n")
    assert wider != text, "dsa-backends@8 no longer declares hisparse_top_k as values: [2048]"
    text = wider
    path = os.path.join(folder, "large.yaml")
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text)
    return path


def analyses(quick: bool, cache_dir: str, folder: str) -> tuple[dict, dict]:
    """Whole-domain commands as processes (CPU time): deep lint of every shipped version together
    and of the largest (v10) alone, diff v2
    -> v10 (SGLang 0.5.21 -> 0.5.23) and v1 -> v2, and on the synthetic large policy its lint and
    its diff from v8."""
    import engine

    env = child_env(HISPARSE_CACHE_DIR=cache_dir)
    large = large_policy(folder)
    size = domain.config_count(engine.load_policy(large))
    cmds = {"check": CLI + ["check", "policies/"],
            "check_v10": CLI + ["check", "policies/dsa-backends/v10.yaml"],  # the largest domain
            "diff_v9_v10": CLI + ["diff", "dsa-backends@9", "dsa-backends@10", "--format", "json"],
            "diff_v1_v2": CLI + ["diff", "dsa-backends@1", "dsa-backends@2", "--format", "json"],
            "check_large": CLI + ["check", large],
            "diff_v8_large": CLI + ["diff", "dsa-backends@8", large, "--format", "json"]}
    t = processes(cmds, 2 if quick else 5, env)
    # the same without the cache: every file parsed and schema-checked first
    cold = processes({f"{name}_uncached": cmds[name] for name in ("check", "diff_v9_v10")}, 2 if quick else 3,
                     dict(env, HISPARSE_NO_CACHE="1"))
    figures = {name: {"cpu_s": round(v["cpu"], 3), "wall_s": round(v["wall"], 3)}
               for name, v in {**t, **cold}.items()}
    figures["large_configs"] = size
    figures["check_files"] = sum(len(v) for v in engine.list_families().values())  # what check policies/ read
    out = subprocess.run(cmds["diff_v9_v10"], capture_output=True, text=True, cwd=ROOT, env=env)
    figures["diff_v9_v10_configs"] = json.loads(out.stdout)["total"]  # the configs both sides evaluated
    goals = {"check_seconds": goal(t["check"]["cpu"], 1.0, "max", " s"),
             "diff_seconds": goal(t["diff_v9_v10"]["cpu"], 1.0, "max", " s")}
    return figures, goals


# code kept out of the evaluation core, in engine/: finding policy files, the cache of checked
# documents, the schema check, a version file's head, policies and traces in words, the declared
# domain's enumeration. Its lines are reported beside the core's count, so that the count cannot
# shrink by moving code unseen
BESIDE_CORE = ("files/catalog.py", "files/releases.py", "files/cache.py", "files/schema.py", "files/heads.py",
               "explain/__init__.py", "explain/trace.py", "explain/words.py", "analysis/domain.py")


def core_lines() -> dict:
    """Lines of the evaluation core (engine/language and engine/policy), per package, and of the
    modules of engine/ that hold what was kept out of it (BESIDE_CORE), with their names."""
    def lines(folder, names):
        return sum(sum(1 for _ in open(os.path.join(folder, f), encoding="utf-8")) for f in names)

    out = {}
    for package in ("language", "policy"):
        folder = os.path.join(ROOT, "engine", package)
        out[package] = lines(folder, sorted(f for f in os.listdir(folder) if f.endswith(".py")))
    out["total"] = out["language"] + out["policy"]
    out["files_side"] = lines(os.path.join(ROOT, "engine"), BESIDE_CORE)
    out["files_side_modules"] = [f"engine/{name}" for name in BESIDE_CORE]
    return out


def run(quick: bool) -> str:
    figures, goals = {}, {}
    before = os.environ.get("HISPARSE_CACHE_DIR")
    with tempfile.TemporaryDirectory(prefix="hisparse-bench-") as tmp:
        cache_dir = os.environ["HISPARSE_CACHE_DIR"] = os.path.join(tmp, "cache")  # not the user's cache
        try:
            for name, fn in (("decision_cost", lambda q: decision_cost(q)),
                             ("startup", lambda q: startup(q, cache_dir)),
                             ("analyses", lambda q: analyses(q, cache_dir, tmp))):
                f, g = fn(quick)
                figures[name] = f
                goals.update(g)
            figures["core_lines"] = core_lines()
        finally:
            if before is None:
                os.environ.pop("HISPARSE_CACHE_DIR", None)
            else:
                os.environ["HISPARSE_CACHE_DIR"] = before
    return write_result("engine", figures, goals, quick)


if __name__ == "__main__":
    print(run("--quick" in sys.argv))
