"""Hot-buffer figures: HotBuffer.translate against its copy floor, at 64 requests x top-k 2048 x
buffer 4096 with 30 % misses, and ms per step vs batch.

The floor is the copy a translate cannot avoid: the same rows it moved (the kernel's copies and the
new tokens' rows), moved the cheapest way torch has (one gather from the host pool and one scatter
into the buffer, as 8-byte words). Each step's rows are recorded from the translate itself and
then moved again, timed (CPU time, one thread) right after it; before each of the two a large
buffer is written, so that neither finds the rows in the cache. The ratio is the median of the
steps' ratios (paired, as a slow stretch of the machine weighs on both of a step's timings); the
ratio of the medians is recorded beside. The HotBuffer runs its torch code, the one path."""
from __future__ import annotations

import statistics
import sys
import time

import torch

from bench.common import goal, pin_threads, write_result
from bench.plots import line_plot

TOP_K, BUFFER, CONTEXT, MISS = 2048, 4096, 8192, 0.30
FLUSH_BYTES = 256 << 20  # written between measurements: more than any CPU cache


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


def against_floor(requests: int, steps: int, warm: int, row_dtype=torch.uint8) -> dict:
    """translate vs its floor."""
    from kernels_bridge import HotBuffer

    g = torch.Generator().manual_seed(1)
    shape = (requests, CONTEXT + warm + steps + 1, 656 if row_dtype == torch.uint8 else 576)
    pool = torch.randint(0, 255, shape, dtype=torch.uint8, generator=g) if row_dtype == torch.uint8 \
        else torch.randn(shape, generator=g).to(torch.bfloat16)
    hb = HotBuffer(pool, BUFFER)
    copied = []
    real_copy = hb._rows.copy
    in_copy = [0.0]  # CPU time translate spends in its row copy (the rest is SGLang's bookkeeping)

    def recording_copy(src, dst):  # the rows this step moves, for the floor
        # kept, not cloned (a clone would be timed as translate's): the floor reads them before
        # the next translate, the only thing that reuses their memory
        copied.append((src, dst))
        t = time.process_time()
        real_copy(src, dst)
        in_copy[0] += time.process_time() - t

    hb._rows.copy = recording_copy
    words_src, words_dst = hb._rows.words  # the pool's and the buffer's rows as int64 words
    assert words_src.dtype == torch.int64
    ids = torch.arange(requests)
    staging = torch.empty(0, words_src.shape[1], dtype=torch.int64)  # reused, as translate reuses its own
    flush = torch.zeros(FLUSH_BYTES // 8, dtype=torch.int64)
    ours, floor, copies = [], [], []
    for i, (seq, pos) in enumerate(_sequence(requests, warm + steps)):
        if i == warm:  # steady state from here: count only the measured steps
            hb.reset_stats()
        flush.add_(1)  # both start with the rows out of the cache (the floor would find them warm)
        t0 = time.process_time()
        copied.clear()
        in_copy[0] = 0.0
        hb.translate(ids, seq, pos)
        t1 = time.process_time()
        src, dst = torch.cat([c[0] for c in copied]), torch.cat([c[1] for c in copied])
        if staging.shape[0] < src.numel():
            staging = torch.empty(src.numel(), words_src.shape[1], dtype=torch.int64)
        flush.add_(1)
        t2 = time.process_time()
        rows = torch.index_select(words_src, 0, src, out=staging[: src.numel()])
        words_dst.index_copy_(0, dst, rows)
        t3 = time.process_time()
        if i >= warm:
            ours.append(t1 - t0)
            floor.append(t3 - t2)
            copies.append(in_copy[0])
    s = hb.stats
    return {"requests": requests, "steps": steps, "bookkeeping": "tensors",
            "translate_ms": round(statistics.median(ours) * 1e3, 3),
            "floor_ms": round(statistics.median(floor) * 1e3, 3),
            # translate's own row copy (the floor's two operations) and the rest, SGLang's bookkeeping
            "copy_in_translate_ms": round(statistics.median(copies) * 1e3, 3),
            "bookkeeping_ms": round(statistics.median(a - c for a, c in zip(ours, copies)) * 1e3, 3),
            # paired: each step's translate against the floor timed right after it, so that a
            # slow stretch of the machine weighs on both sides of a ratio
            "ratio": round(statistics.median(a / b for a, b in zip(ours, floor)), 3),
            "ratio_of_medians": round(statistics.median(ours) / statistics.median(floor), 3),
            "miss_rate": round(s.misses / s.lookups, 4),
            "rows_copied_per_step": round(s.rows_copied / s.steps, 1),
            "bytes_copied_per_step": round(s.bytes_copied / s.steps)}


def run(quick: bool) -> str:
    threads = pin_threads()
    torch.manual_seed(0)
    main = against_floor(64, 3 if quick else 9, 2)
    bf16 = against_floor(64, 2 if quick else 5, 2, torch.bfloat16)
    batches = (8, 32, 64) if quick else (8, 16, 32, 64)
    curve = {b: against_floor(b, 2 if quick else 9, 2) for b in batches}
    line_plot("hotbuffer_vs_batch", "translate vs its copy floor: top-k 2048, buffer 4096, 30 % misses (FP8 rows)",
              "requests", "ms per step (CPU)", list(batches),
              {"HotBuffer.translate": [curve[b]["translate_ms"] for b in batches],
               "copy floor (gather + scatter)": [curve[b]["floor_ms"] for b in batches]}, quick=quick)
    figures = {"fp8": main, "bf16": bf16, "vs_batch": {str(b): v for b, v in curve.items()}, "threads": threads}
    goals = {"translate_vs_copy_floor": goal(main["ratio"], 1.5, "max", "x")}
    return write_result("hotbuffer", figures, goals, quick)


if __name__ == "__main__":
    print(run("--quick" in sys.argv))
