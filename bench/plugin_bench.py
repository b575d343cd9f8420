"""The SGLang plugin's cost, measured side by side with SGLang alone in the same run (the installed
SGLang, 0.5.23 with `make install`):

- Start-up: SGLang's own start-up of a launch up to its routing decision (bench/plugin_startup.py:
  SGLang's plugin loader, `prepare_server_args`, `resolve_once`, `check_server_args`, as
  `python -m sglang.launch_server` runs them), for a DeepSeek-V3.2 (DSA) and a DeepSeek-V4 model
  folder (the conform drivers' config.json folders, engine/sglang/conform/model_folders.py), each
  a fresh process, in three forms run in alternation: SGLang alone (SGLANG_PLUGINS does not name
  the plugin, so its entry point is never loaded), the plugin installed but inert (no
  HISPARSE_POLICY), and the plugin on every family (HISPARSE_POLICY=installed: dsa-backends,
  dsv4-backends and minimax-m3-backends, the set `load_policy_set` gives). The figure is the
  median, over the interleaved repeats, of the ratio of the process's CPU time (user + system,
  from the parent's rusage of its children) with the plugin to SGLang alone's. The children run
  with one thread for every pool (START_THREADS), on a GPU stand-in (bench/standin/, which never
  imports the plugin), with the engine's policy cache in a folder of their own, warmed by one
  run of each form first (what every launch after the first one on a machine finds). Both forms
  must reach the same routing, and the plugin's run must say it decided. Goal: at most 1.05.
  Beside it, the plugin's marginal CPU in one process (bench/plugin_marginal.py: SGLang's start-up
  alone, then the plugin loaded and the start-up routed by it), a figure far less noisy than the
  difference of two processes on a loaded machine: its share of SGLang's start-up alone.
- SGLang's own unit tests of the functions the plugin replaces (tests/sglang_own_runner.py on the
  folder HISPARSE_SGLANG_TESTS names, else ../shared/sglang-tests): the suite's time without the
  plugin and with it on the shipped policy, each run a fresh process, in alternation; the figure is
  the median of the paired ratios of the suite's own CPU time (SGLang's import before it is the same
  work in both; the plugin does no I/O, so its cost is CPU, and a process's CPU time is less
  exposed than its wall time to the other load of a shared machine), with the suite's wall time
  and the processes' CPU times beside it. Goal: at most 1.10.

Without SGLang or SGLang's tests the result says why, and sets no figure."""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile

from bench.common import ROOT, child_env, goal, write_result

RUNNER = os.path.join(ROOT, "tests", "sglang_own_runner.py")


def _own_tests_folder() -> str | None:
    from engine.sglang import registry

    release = registry.installed_release()
    row = registry.release(release) if release else None
    root = os.environ.get("HISPARSE_SGLANG_TESTS") or os.path.join(os.path.dirname(ROOT), "shared", "sglang-tests")
    if row is None or row.own_tests is None or not os.path.isdir(os.path.join(root, row.own_tests)):
        return None
    return os.path.join(root, row.own_tests)


def _suite_run(folder: str, policy: str | None) -> tuple[tuple[float, float], float, dict]:
    """((the suite's own wall, its CPU seconds), the process's CPU seconds, outcomes) of one run."""
    import resource

    env = child_env()
    for key in [k for k in env if k.startswith(("HISPARSE_", "SGLANG_"))]:
        del env[key]
    if policy:
        env["HISPARSE_POLICY"] = policy
    # SGLang's test modules and its plugin-loader conftest import by their folder's names
    env["PYTHONPATH"] = os.pathsep.join([folder, os.path.dirname(folder)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "out.json")
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        proc = subprocess.run([sys.executable, "-W", "ignore", RUNNER, folder, out], cwd=tmp, env=env,
                              capture_output=True, text=True)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if proc.returncode != 0:
            raise RuntimeError(f"SGLang's own tests did not run: {proc.stderr[-1000:]}")
        with open(out, encoding="utf-8") as fh:
            result = json.load(fh)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return (result["seconds"], result["cpu_seconds"]), cpu, result["outcomes"]


def own_tests(quick: bool) -> tuple[dict, dict, list]:
    folder = _own_tests_folder()
    if folder is None:
        return {}, {}, ["SGLang's own tests not run: no installed SGLang with unit tests of these functions, or "
                        "no folder of SGLang's tests (HISPARSE_SGLANG_TESTS)"]
    from engine.sglang.registry import installed_release

    policy = f"sglang=={installed_release()}"
    repeats = 3 if quick else 11
    runs = {"without": [], "with": []}
    outcomes = {}
    for _ in range(repeats):
        for name, ref in (("without", None), ("with", policy)):
            suite, cpu, outcomes[name] = _suite_run(folder, ref)
            runs[name].append((suite, cpu))
    if outcomes["with"] != outcomes["without"]:
        raise RuntimeError("SGLang's own tests give other results with the plugin: tests/test_sglang_own_tests.py")
    def paired(i: int) -> float:  # the median of the with/without ratios of suite figure i, run by run
        return statistics.median(w[0][i] / max(o[0][i], 1e-9) for o, w in zip(runs["without"], runs["with"]))

    figures = {
        "own_tests": {
            "release": installed_release(), "folder": os.path.basename(folder), "repeats": repeats,
            "tests": len(outcomes["without"]),
            "passed": sum(o == "passed" for o in outcomes["without"].values()),
            "failing_without_the_plugin_too": sorted(t for t, o in outcomes["without"].items() if o != "passed"),
            "suite_seconds": {k: round(statistics.median(s[0] for s, _ in v), 4) for k, v in runs.items()},
            "suite_cpu_seconds": {k: round(statistics.median(s[1] for s, _ in v), 4) for k, v in runs.items()},
            "process_cpu_seconds": {k: round(statistics.median(c for _, c in v), 3) for k, v in runs.items()},
            "suite_ratio_median": round(paired(0), 4),
            "suite_cpu_ratio_median": round(paired(1), 4),
            "process_cpu_ratio": round(statistics.median(c for _, c in runs["with"])
                                       / statistics.median(c for _, c in runs["without"]), 4),
        }
    }
    goals = {"own_tests_suite_ratio": goal(figures["own_tests"]["suite_cpu_ratio_median"], 1.10, "max", "x")}
    return figures, goals, []

STARTUP = os.path.join(ROOT, "bench", "plugin_startup.py")
STANDIN = os.path.join(ROOT, "bench", "standin")
# one thread for every pool a child may start (torch's intra-op pool, OpenMP, BLAS, tokenizers)
START_THREADS = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
                 "NUMEXPR_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
STANDIN_PLUGIN = "hisparse_bench_gpu"  # bench/standin's platform plugin (SGLANG_PLUGINS filters it too)
FORMS = {  # name -> (SGLANG_PLUGINS, HISPARSE_POLICY)
    "sglang": (STANDIN_PLUGIN, None),
    "inert": (f"{STANDIN_PLUGIN},hisparse_router", None),
    "plugin": (f"{STANDIN_PLUGIN},hisparse_router", "installed"),
}
# model -> (conform model folder's architecture, launch arguments after --model-path)
LAUNCHES = {
    "DeepSeek-V3.2 (DSA)": ("DeepseekV32ForCausalLM", ["--enable-hisparse", "--disable-radix-cache",
                                                       "--kv-cache-dtype", "fp8_e4m3"]),
    "DeepSeek-V4": ("DeepseekV4ForCausalLM", ["--enable-hisparse", "--disable-radix-cache"]),
}
DECIDED = "hisparse-router: "  # the plugin's identifying line: "... routing decided by policy ..."


def _startup_env(form: str, cache: str) -> dict:
    plugins, policy = FORMS[form]
    env = child_env()
    for key in [k for k in env if k.startswith(("HISPARSE_", "SGLANG_"))]:
        del env[key]
    env.update(START_THREADS, PYTHONPATH=os.pathsep.join([STANDIN, ROOT]), SGLANG_PLUGINS=plugins,
               HISPARSE_TEST_GPU="9.0", HISPARSE_TEST_ARCH_HELPERS="1", HISPARSE_CACHE_DIR=cache)
    if policy:
        env["HISPARSE_POLICY"] = policy
    return env


def _startup_run(argv: list[str], env: dict) -> dict:
    """One child: its CPU seconds (user + system, the parent's rusage of it), wall seconds, and
    what it reported (the routing outcome, its CPU time at the routing decision, its threads)."""
    import resource
    import time

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, STARTUP, *argv], cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"the start-up child failed ({proc.returncode}): {proc.stderr[-2000:]}")
    report = json.loads(lines[-1])
    report.update(process_cpu=(after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
                  process_wall=wall, decided=[line.split("] ", 1)[-1] for line in proc.stderr.splitlines()
                                              if DECIDED in line and "decided by policy" in line])
    return report


def startup(quick: bool, repeats: int | None = None) -> tuple[dict, dict, list]:
    from engine.sglang.registry import installed_release

    release = installed_release()
    if release is None:
        return {}, {}, ["plugin start-up not measured: SGLang is not installed"]
    from engine.sglang.conform.model_folders import ModelFolders

    repeats = repeats or (3 if quick else 7)
    figures: dict = {}
    ratios_all = []
    with tempfile.TemporaryDirectory(prefix="hisparse-plugin-bench-") as tmp:
        folders = ModelFolders(os.path.join(tmp, "models"))
        os.makedirs(folders.root)
        cache = os.path.join(tmp, "cache")
        envs = {form: _startup_env(form, cache) for form in FORMS}
        for model, (architecture, args) in LAUNCHES.items():
            argv = ["--model-path", folders.path(architecture), *args]
            first = {form: _startup_run(argv, env) for form, env in envs.items()}  # warm: bytecode, files, cache
            runs = {form: [] for form in FORMS}
            for _ in range(repeats):
                for form, env in envs.items():
                    runs[form].append(_startup_run(argv, env))
            for form, rs in runs.items():
                for r in rs + [first[form]]:
                    if r["outcome"] != first["sglang"]["outcome"]:
                        raise RuntimeError(f"{model}: the {form} start-up routed otherwise than SGLang alone: "
                                           f"{r['outcome']} against {first['sglang']['outcome']}")
                    if bool(r["decided"]) != (form == "plugin") or r["plugin_modules"] and form == "sglang":
                        raise RuntimeError(f"{model}: the {form} start-up did not run as that form: "
                                           f"{r['decided']} {r['plugin_modules'][:5]}")
            pair = {form: [r["process_cpu"] / s["process_cpu"] for r, s in zip(runs[form], runs["sglang"])]
                    for form in ("inert", "plugin")}
            ratios_all += pair["plugin"]
            median = statistics.median
            figures[model] = {
                "argv": [a if a != argv[1] else f"<{architecture} config.json folder>" for a in argv],
                "routing": first["sglang"]["outcome"],
                "plugin_line": first["plugin"]["decided"],
                "process_cpu_seconds": {f: round(median(r["process_cpu"] for r in rs), 3) for f, rs in runs.items()},
                "cpu_seconds_at_routing": {f: round(median(r["cpu"] for r in rs), 3) for f, rs in runs.items()},
                "wall_seconds": {f: round(median(r["process_wall"] for r in rs), 3) for f, rs in runs.items()},
                "cpu_ratio_median": {f: round(median(v), 4) for f, v in pair.items()},
                "cpu_ratios": {f: [round(x, 4) for x in v] for f, v in pair.items()},
                "threads_at_routing": sorted({r["threads"] for rs in runs.values() for r in rs}),
                "torch_threads": sorted({r["torch_threads"] for rs in runs.values() for r in rs}),
            }
    figures = {"startup": {
        "release": release, "repeats": repeats, "forms": {f: {"SGLANG_PLUGINS": p, "HISPARSE_POLICY": pol}
                                                          for f, (p, pol) in FORMS.items()},
        "thread_env": START_THREADS, "models": figures,
        "cpu_ratio_median": round(statistics.median(ratios_all), 4),
    }}
    goals = {"startup_cpu_ratio": goal(figures["startup"]["cpu_ratio_median"], 1.05, "max", "x")}
    return figures, goals, []


MARGINAL = os.path.join(ROOT, "bench", "plugin_marginal.py")


def marginal(quick: bool, repeats: int | None = None) -> dict:
    """The plugin's marginal CPU in one process (bench/plugin_marginal.py), per model: medians of
    `repeats` children, and its share of SGLang's start-up alone."""
    repeats = repeats or (2 if quick else 5)
    out = {}
    with tempfile.TemporaryDirectory(prefix="hisparse-plugin-bench-") as tmp:
        from engine.sglang.conform.model_folders import ModelFolders

        folders = ModelFolders(os.path.join(tmp, "models"))
        os.makedirs(folders.root)
        env = _startup_env("sglang", os.path.join(tmp, "cache"))
        for model, (architecture, args) in LAUNCHES.items():
            argv = ["--model-path", folders.path(architecture), *args]
            runs = []
            for k in range(repeats + 1):  # the first fills the policy cache
                proc = subprocess.run([sys.executable, MARGINAL, *argv], cwd=ROOT, env=env, capture_output=True,
                                      text=True)
                lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
                if proc.returncode != 0 or not lines:
                    raise RuntimeError(f"the marginal child failed ({proc.returncode}): {proc.stderr[-2000:]}")
                if k:
                    runs.append(json.loads(lines[-1]))
            median = statistics.median
            out[model] = {key: round(median(r[key] for r in runs), 4)
                          for key in ("alone", "warm_alone", "load_plugins", "warm_hooked", "marginal")}
            out[model]["share"] = round(median(r["marginal"] / r["alone"] for r in runs), 4)
            out[model]["plugin_line"] = runs[0]["decided"]
    return {"repeats": repeats, "models": out,
            "share_median": round(statistics.median(m["share"] for m in out.values()), 4)}


def run(quick: bool) -> str:
    figures, goals, notes = startup(quick)
    if figures:
        figures["startup"]["marginal"] = marginal(quick)
    more = own_tests(quick)
    figures.update(more[0])
    goals.update(more[1])
    notes += more[2]
    return write_result("plugin", figures, goals, quick, notes)
