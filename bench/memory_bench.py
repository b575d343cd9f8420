"""Memory figures: KV bytes per token (BF16 vs FP8 rows, from real tensors), hot-buffer bytes per
request, and the peak resident memory of `hisparse attend` at 32k context x 8 requests (a child
process, measured by the kernel's accounting)."""
from __future__ import annotations

import subprocess
import sys

import torch

from bench.common import ROOT, goal, write_result


def bytes_per_token() -> dict:
    from kernels_bridge import quantize_kv_fp8

    kv = torch.randn(1000, 576).to(torch.bfloat16)
    fp8 = quantize_kv_fp8(kv)
    bf16_b = kv.numel() * kv.element_size() // 1000
    fp8_b = fp8.numel() * fp8.element_size() // 1000
    return {"bf16": bf16_b, "fp8": fp8_b, "fp8_saving": round(1 - fp8_b / bf16_b, 4)}


def hot_buffer_bytes(buffer_size: int = 4096, page: int = 64) -> dict:
    from kernels_bridge import HotBuffer

    out = {}
    for name, pool in (("fp8", torch.zeros(1, buffer_size + 2, 656, dtype=torch.uint8)),
                       ("bf16", torch.zeros(1, buffer_size + 2, 576, dtype=torch.bfloat16))):
        hb = HotBuffer(pool, buffer_size, page_size=page)
        out[name] = hb.buffer.numel() * hb.buffer.element_size()
    return {"buffer_size": buffer_size, "per_request_bytes": out}


def _child_peak(module_args: list[str]) -> tuple[int, str]:
    """(peak resident bytes, stdout) of `python -m MODULE ARGS` run through bench.peak."""
    proc = subprocess.run([sys.executable, "-m", "bench.peak", *module_args], cwd=ROOT, capture_output=True,
                          text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(module_args[:3])} failed: {proc.stderr[-500:]}")
    peak = next(int(line.split()[1]) for line in proc.stderr.splitlines() if line.startswith("PEAK_RSS_BYTES"))
    return peak, proc.stdout


def attend_peak_rss(quick: bool) -> dict:
    import json

    steps = "2" if quick else "6"
    args = ["kernels_bridge.cli", "attend", "--kv-cache-dtype", "fp8_e4m3", "--requests", "8", "--context", "32768",
            "--hisparse-top-k", "2048", "--hisparse-device-buffer-size", "4096", "--steps", steps, "--threads", "1",
            "--format", "json"]
    peak, out = _child_peak(args)
    report = json.loads(out)
    baseline, _ = _child_peak(["kernels_bridge.cli", "doctor", "--format", "json"])  # python + torch + the bridge
    return {"argv": "hisparse " + " ".join(args[1:]), "peak_rss_bytes": peak, "baseline_rss_bytes": baseline,
            "host_pool_bytes": report["memory"]["host_pool_bytes"],
            "bf16_truth_bytes": 8 * (32768 + int(steps)) * 1152,
            "hot_buffer_bytes": report["hot_buffer"]["buffer_bytes"]}


def run(quick: bool) -> str:
    per_token = bytes_per_token()
    hb = hot_buffer_bytes()
    rss = attend_peak_rss(quick)
    figures = {"kv_bytes_per_token": per_token, "hot_buffer": hb, "attend_32k_x8": rss}
    goals = {"fp8_row_bytes": {"value": per_token["fp8"], "goal": "== 656 (V3.2 layout)", "met": per_token["fp8"] == 656}}
    return write_result("memory", figures, goals, quick)


if __name__ == "__main__":
    print(run("--quick" in sys.argv))
