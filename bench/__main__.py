"""`python -m bench [--quick] [--only NAME ...]`: run the benchmarks, write bench/results/<name>.json
(every figure, the machine, versions, date), PNG plots, and bench/results/summary.md. With
--quick, smaller sizes and fewer repeats, written to bench/results-quick/ (git-ignored): the
committed results, which the README's figures are generated from, change only with a full run."""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

from bench.common import THREADS, out_dir, pin_threads, use_output

SUITES = ("engine", "plugin", "kernels", "hotbuffer", "memory", "accuracy", "gpu")


def _run_suite(name: str, quick: bool) -> str:
    if name == "engine":
        from bench import engine_bench as m
    elif name == "kernels":
        from bench import kernels_bench as m
    elif name == "hotbuffer":
        from bench import hotbuf_bench as m
    elif name == "memory":
        from bench import memory_bench as m
    elif name == "accuracy":
        from bench import accuracy_bench as m
    elif name == "plugin":
        from bench import plugin_bench as m
    else:
        return _gpu(quick)
    return m.run(quick)


def _gpu(quick: bool) -> str:
    """The GPU check where CUDA and flash_mla are present; elsewhere a result saying why not."""
    import subprocess

    from bench.common import ROOT, write_result

    args = [sys.executable, "-m", "bench.gpu_check"] + (["--quick"] if quick else [])
    proc = subprocess.run(args, cwd=ROOT, capture_output=True, text=True)
    try:
        report = json.loads(proc.stdout) if proc.stdout.strip() else {"error": proc.stderr[-2000:]}
    except json.JSONDecodeError:
        report = {"error": proc.stdout[-2000:] + proc.stderr[-2000:]}
    return write_result("gpu", report, {}, quick, notes=[] if not report.get("skipped") else
                        [f"not run here: {report.get('reason', 'no CUDA device or flash_mla')}"])


def summary(quick: bool = False) -> str:
    lines = ["# Benchmark summary", "", f"torch pinned to {THREADS} thread(s); engine figures are CPU times "
             "of single-threaded work (wall times are in the JSON files).", ""]
    for name in SUITES:
        path = os.path.join(out_dir(quick), f"{name}.json")
        if not os.path.exists(path):
            continue
        with open(path) as fh:
            r = json.load(fh)
        m = r["machine"]
        load = f", load average {m['load_average']}" if m.get("load_average") else ""  # older runs lack it
        lines.append(f"## {name} ({r['date']}{', quick' if r['quick'] else ''}; {m.get('cpu', m['machine'])}, "
                     f"{m['cpus']} CPUs{load}, Python {m['python']}, "
                     f"torch {m.get('torch')}, {m.get('torch_threads')} thread(s))")
        lines.append("")
        if r["goals"]:
            lines.append("| figure | value | goal | met |")
            lines.append("|---|---:|---|---|")
            for k, g in r["goals"].items():
                lines.append(f"| {k} | {g['value']} | {g['goal']} | {'yes' if g['met'] else '**no**'} |")
            lines.append("")
        for note in r.get("notes", []):
            lines.append(f"- {note}")
        lines.append("")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench")
    parser.add_argument("--quick", action="store_true", help="smaller sizes and fewer repeats (under a minute)")
    parser.add_argument("--only", nargs="+", choices=SUITES, help="run only these suites")
    ns = parser.parse_args(argv)
    use_output(ns.quick)
    pin_threads()
    for name in ns.only or SUITES:
        t0 = time.perf_counter()
        path = _run_suite(name, ns.quick)
        print(f"{name}: {path} ({time.perf_counter() - t0:.1f} s)", file=sys.stderr)
    text = summary(ns.quick)
    os.makedirs(out_dir(ns.quick), exist_ok=True)
    with open(os.path.join(out_dir(ns.quick), "summary.md"), "w") as fh:
        fh.write(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
