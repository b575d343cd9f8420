"""Shared pieces of the benchmarks: timing side by side, machine facts, result files.

The machines these run on are shared and noisy, so every goal is either a ratio of two things
measured in the same run, interleaved (A, B, A, B, ...), with the median of several repeats, or a
CPU time: the work is single-threaded (torch is pinned to THREADS threads), and CPU time, unlike
wall time, does not grow while other processes hold the cores. Wall times are recorded beside.
`--quick` results go to bench/results-quick/ (git-ignored), never over the full run's."""
from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "bench", "results")  # committed; the README's figures come from here
# --quick runs write here instead (git-ignored), so a quick run never replaces committed figures
QUICK_RESULTS = os.path.join(ROOT, "bench", "results-quick")
THREADS = 1  # torch threads for every kernel figure: under load torch's default is 5-14x slower
_output = RESULTS


def use_output(quick: bool) -> str:
    """Send this run's results, plots and summary to bench/results-quick/ for --quick."""
    global _output
    _output = QUICK_RESULTS if quick else RESULTS
    return _output


def output_dir() -> str:
    return _output


def out_dir(quick: bool) -> str:
    return QUICK_RESULTS if quick else output_dir()


def pin_threads() -> int:
    import torch

    torch.set_num_threads(THREADS)
    return torch.get_num_threads()


def interleaved(fns: dict, repeats: int, number: int = 1, clock=time.process_time) -> dict:
    """Median seconds per call of each function, measured in alternation (CPU time by default)."""
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = clock()
            for _ in range(number):
                fn()
            times[name].append((clock() - t0) / number)
    return {name: statistics.median(ts) for name, ts in times.items()}


def child_env(**extra) -> dict:
    """The environment of a measured child process: bytecode is written and read as after an
    install (PYTHONDONTWRITEBYTECODE, set to anything, would make every import compile)."""
    env = dict(os.environ, **extra)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def run_process(argv: list[str], env=None) -> tuple[float, float]:
    """(wall seconds, CPU seconds: user + system) of a child process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, env=env)
    elapsed = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"{argv} failed: {proc.stderr[-500:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return elapsed, cpu


def processes(cmds: dict, repeats: int, env=None) -> dict:
    """name -> {"wall": median s, "cpu": median s} of each command, run in alternation."""
    for argv in cmds.values():  # once each first: file cache, bytecode, the policy cache
        run_process(argv, env)
    runs = {name: [] for name in cmds}
    for _ in range(repeats):
        for name, argv in cmds.items():
            runs[name].append(run_process(argv, env))
    return {name: {"wall": statistics.median(w for w, _ in rs), "cpu": statistics.median(c for _, c in rs)}
            for name, rs in runs.items()}


def machine() -> dict:
    info = {"python": sys.version.split()[0], "platform": platform.platform(), "machine": platform.machine(),
            "cpus": os.cpu_count()}
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    info["cpu"] = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        import torch

        info["torch"] = torch.__version__
        info["torch_threads"] = torch.get_num_threads()  # as the benchmarks pinned it
        info["load_average"] = [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None
        info["cuda"] = bool(torch.cuda.is_available())
    except ImportError:
        info["torch"] = None
    return info


def goal(value: float, target: float, kind: str, unit: str = "") -> dict:
    """A figure against its goal; kind: 'max' (value <= target) or 'min' (value >= target)."""
    met = value <= target if kind == "max" else value >= target
    return {"value": round(value, 4), "goal": f"{'<=' if kind == 'max' else '>='} {target}{unit}", "met": met}


def write_result(name: str, figures: dict, goals: dict, quick: bool, notes: list | None = None) -> str:
    folder = out_dir(quick)
    os.makedirs(folder, exist_ok=True)
    out = {"name": name, "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
           "quick": quick, "machine": machine(), "figures": figures, "goals": goals, "notes": notes or []}
    path = os.path.join(folder, f"{name}.json")
    with open(path, "w") as fh:
        json.dump(out, fh, indent=2)
        fh.write("\n")
    return path
