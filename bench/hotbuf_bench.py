"""Hot-buffer figures: HotBuffer.translate against the plain-Python per-token LRU model doing the
same work (tests/lru_model.py), in lockstep on the same top-k sequence (each step timed for both,
alternately), at 64 requests x top-k 2048 x buffer 4096 with 30 % misses; and ms per step vs
batch."""
from __future__ import annotations

import os
import statistics
import sys
import time

import torch

from bench.common import ROOT, goal, write_result
from bench.plots import line_plot

sys.path.insert(0, os.path.join(ROOT, "tests"))

TOP_K, BUFFER, CONTEXT, MISS = 2048, 4096, 8192, 0.30


def _sequence(requests: int, steps: int, seed: int = 0):
    """Per step: (seq_lens, positions): MISS of the top-k are positions never picked before (so
    they miss), the rest are kept from the previous step (so they hit)."""
    g = torch.Generator().manual_seed(seed)
    keep = int(round((1 - MISS) * TOP_K))
    seq = torch.full((requests,), CONTEXT, dtype=torch.int64)
    span = CONTEXT + steps
    seen = torch.zeros(requests, span, dtype=torch.bool)
    pos = torch.rand(requests, CONTEXT - 1, generator=g).topk(TOP_K, dim=1).indices
    seen.scatter_(1, pos, True)
    out = []
    for _ in range(steps):
        seq = seq + 1
        kept = pos[:, torch.randperm(TOP_K, generator=g)[:keep]]
        keys = torch.rand(requests, int(seq[0]) - 1, generator=g)
        keys[seen[:, : keys.shape[1]]] = -1.0       # picked before: not a fresh miss
        keys.scatter_(1, kept, 2.0)                 # kept positions rank first
        pos = keys.topk(TOP_K, dim=1).indices       # never the newest token: it has its own slot
        seen.scatter_(1, pos, True)
        out.append((seq.clone(), pos))
    return out


def lockstep(requests: int, steps: int, warm: int, row_dtype=torch.uint8) -> dict:
    from lru_model import LRUModel

    from kernels_bridge import HotBuffer

    g = torch.Generator().manual_seed(1)
    shape = (requests, CONTEXT + warm + steps + 1, 656 if row_dtype == torch.uint8 else 576)
    pool = torch.randint(0, 255, shape, dtype=torch.uint8, generator=g) if row_dtype == torch.uint8 \
        else torch.randn(shape, generator=g).to(torch.bfloat16)
    hb, model = HotBuffer(pool, BUFFER), LRUModel(pool, BUFFER)
    ids = torch.arange(requests)
    ours, theirs = [], []
    for i, (seq, pos) in enumerate(_sequence(requests, warm + steps)):
        if i == warm:  # steady state from here: count only the measured steps
            hb.reset_stats()
        t0 = time.perf_counter()
        a = hb.translate(ids, seq, pos)
        t1 = time.perf_counter()
        b = model.translate(ids, seq, pos)
        t2 = time.perf_counter()
        if not torch.equal(a, b):  # same work, same answer: otherwise the comparison means nothing
            raise AssertionError(f"HotBuffer and the LRU model disagree at step {i}")
        if i >= warm:
            ours.append(t1 - t0)
            theirs.append(t2 - t1)
    s = hb.stats
    return {"requests": requests, "steps": steps, "hotbuffer_ms": round(statistics.median(ours) * 1e3, 3),
            "model_ms": round(statistics.median(theirs) * 1e3, 2),
            "ratio": round(statistics.median(theirs) / statistics.median(ours), 2),
            "miss_rate": round(s.misses / (s.hits + s.misses), 4),
            "rows_copied_per_step": round(s.rows_copied / s.steps, 1),
            "bytes_copied_per_step": round(s.bytes_copied / s.steps)}


def run(quick: bool) -> str:
    torch.manual_seed(0)
    main = lockstep(64, 3 if quick else 8, 2)
    bf16 = lockstep(64, 2 if quick else 5, 2, torch.bfloat16)
    batches = (8, 32, 64) if quick else (8, 16, 32, 64)
    curve = {b: lockstep(b, 2 if quick else 4, 2) for b in batches}
    line_plot("hotbuffer_vs_batch", "translate: top-k 2048, buffer 4096, 30 % misses (FP8 rows)", "requests",
              "ms per step", list(batches), {"HotBuffer": [curve[b]["hotbuffer_ms"] for b in batches],
                                             "plain-Python LRU": [curve[b]["model_ms"] for b in batches]})
    figures = {"fp8": main, "bf16": bf16, "vs_batch": {str(b): v for b, v in curve.items()}}
    goals = {"translate_vs_python_lru": goal(main["ratio"], 50, "min", "x")}
    return write_result("hotbuffer", figures, goals, quick)


if __name__ == "__main__":
    print(run("--quick" in sys.argv))
