"""The README's Performance table, generated from bench/results/*.json (kept current by a test)."""
from __future__ import annotations

import json
import os

from bench.common import RESULTS

LABELS = {
    "decision_cost_ratio": ("engine.evaluate vs SGLang's if/else (v2, 12,288 configs)", "x time"),
    "load_nsa-backends@3": ("policy load: parse + schema + names + compile (v3)", "ms"),
    "cached_load_nsa-backends@3": ("repeated load of an unchanged file (v3)", "ms"),
    "cold_start_ratio": ("cold `hisparse evaluate` vs `python -c 'import yaml, jsonschema'`", "x time"),
    "torch_never_imported": ("`hisparse evaluate` never imports torch", ""),
    "diff_seconds": ("`hisparse diff` v1 -> v2, whole domain, as a process", "s"),
    "decode_vs_matmul_b1": ("reference FP8 decode GFLOP/s / float32 matmul GFLOP/s, b=1", "ratio"),
    "decode_vs_matmul_b8": ("reference FP8 decode GFLOP/s / float32 matmul GFLOP/s, b=8", "ratio"),
    "prefill_vs_matmul_b1": ("reference BF16 prefill GFLOP/s / float32 matmul GFLOP/s, s_q=1", "ratio"),
    "prefill_vs_matmul_b8": ("reference BF16 prefill GFLOP/s / float32 matmul GFLOP/s, s_q=8", "ratio"),
    "dequant_gather_vs_clone": ("FP8 gather + dequantise throughput / torch.clone of the same bytes", "ratio"),
    "translate_vs_python_lru": ("HotBuffer.translate vs plain-Python per-token LRU (64 req, top-k 2048)", "x faster"),
}


def _load(name: str) -> dict | None:
    path = os.path.join(RESULTS, f"{name}.json")
    if not os.path.exists(path):
        return None
    with open(path) as fh:
        return json.load(fh)


def performance_table() -> str:
    rows = ["| figure | measured | goal | met |", "|---|---:|---|---|"]
    machine = None
    for name in ("engine", "kernels", "hotbuffer"):
        r = _load(name)
        if r is None:
            continue
        machine = machine or r["machine"]
        for key, g in r["goals"].items():
            if key not in LABELS:
                continue
            label, unit = LABELS[key]
            value = g["value"]
            shown = ("yes" if value else "no") if isinstance(value, bool) else f"{value:g} {unit}".strip()
            rows.append(f"| {label} | {shown} | {g['goal']} | {'yes' if g['met'] else '**no**'} |")
    if machine:
        rows.append("")
        rows.append(f"Machine: {machine.get('cpu', machine['machine'])}, {machine['cpus']} CPUs, "
                    f"Python {machine['python']}, torch {machine.get('torch')} ({machine.get('torch_threads')} threads).")
    return "\n".join(rows)
