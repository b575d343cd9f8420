"""Accuracy figures: FP8 decode against the BF16 kernel over the same rows, at DeepSeek-V3.2's
softmax scale, with SGLang's FP8 scales (the table of docs/bridge.md, generated from
bench/results/accuracy.json) and FlashMLA's beside. Not a timing: the figures depend only on the
seeds, so a shared machine measures them as well as an idle one."""
from __future__ import annotations

import sys

from bench.common import write_result

Q_SCALES = (0.25, 0.5, 1.0)
SEEDS = (0, 1, 2)


def run(quick: bool) -> str:
    from kernels_bridge.accuracy import V32_SCALE, fp8_vs_bf16_figures  # the same measurement the test bounds

    seeds = SEEDS[:1] if quick else SEEDS
    figures = {"setup": {"h_q": 128, "topk": 2048, "batch": 4, "seeds": list(seeds),
                         "kv": "randn scaled per channel by exp(N(0, 0.5))",
                         "softmax_scale": round(V32_SCALE, 6), "softmax_scale_of": "DeepSeek-V3.2, as SGLang computes it",
                         "scale_mode": "sglang"},
               "fp8_vs_bf16": {}, "fp8_vs_bf16_flashmla_scales": {}}
    for mode, key in (("sglang", "fp8_vs_bf16"), ("flashmla", "fp8_vs_bf16_flashmla_scales")):
        for q_scale in Q_SCALES:
            runs = [fp8_vs_bf16_figures(q_scale, seed=seed, scale_mode=mode) for seed in seeds]
            figures[key][str(q_scale)] = {k: [round(r[k], 6) for r in runs] for k in runs[0]}
    return write_result("accuracy", figures, {}, quick)


if __name__ == "__main__":
    print(run("--quick" in sys.argv))
