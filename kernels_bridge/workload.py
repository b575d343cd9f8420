"""A synthetic DSA decode workload, end to end: the policy picks the decode backend, the host pool is
built in that backend's row layout, and every step runs top-k -> hot buffer -> bridge -> kernel.
`hisparse attend` is its command line.

The workload: `requests` requests, each with `context` tokens of KV (random, per-channel scaled
like real activations) and growing by one token per step. Every step each request's indexer
"picks" `top_k` positions: a `locality` share of the previous step's picks is kept, the rest are
fresh positions. Accuracy is measured against a dense BF16 attention over the same picked tokens,
computed in float64 straight from the BF16 KV (not through the hot buffer or the FP8 rows).
"""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field

import torch

from kernels_bridge.dispatch import attend
from kernels_bridge.fp8 import BF16_ROW_BYTES, D_QK, FP8_ROW_BYTES, quantize_kv_fp8
from kernels_bridge.hot_buffer import HotBuffer
from kernels_bridge.layout import PAGE_SIZE as PAGE
from kernels_bridge.resources import memory_available, memory_budget, resolve_device
from kernels_bridge.validate import D_V
from kernels_bridge.workload_spec import BUILD_CHUNK, Workload


@dataclass
class StepTimes:
    translate: list = field(default_factory=list)
    kernel: list = field(default_factory=list)
    total: list = field(default_factory=list)


def _kv(requests: int, length: int, gen: torch.Generator, built=None) -> torch.Tensor:
    """BF16 KV rows [requests, length, 576], per-channel scaled as real activations are. Built
    request by request, BUILD_CHUNK tokens at a time, so no float32 copy of the whole cache ever
    exists; `built(rows)` after each chunk."""
    channel = torch.exp(torch.randn(D_QK, generator=gen) * 0.5)
    kv = torch.empty(requests, length, D_QK, dtype=torch.bfloat16)
    for r in range(requests):
        for at in range(0, length, BUILD_CHUNK):
            n = min(BUILD_CHUNK, length - at)
            kv[r, at:at + n] = torch.randn(n, D_QK, generator=gen) * channel
            if built is not None:
                built(n)
    return kv


def _pool(kv: torch.Tensor, fp8: bool, built=None) -> torch.Tensor:
    """Host rows in the backend's layout: the BF16 rows themselves, or FP8 656-byte rows
    (quantized BUILD_CHUNK rows at a time to keep the scratch small; `built(rows)` after each)."""
    if not fp8:
        return kv
    pool = torch.empty(*kv.shape[:2], FP8_ROW_BYTES, dtype=torch.uint8)
    for r in range(kv.shape[0]):
        for at in range(0, kv.shape[1], BUILD_CHUNK):
            n = min(BUILD_CHUNK, kv.shape[1] - at)
            pool[r, at:at + n] = quantize_kv_fp8(kv[r, at:at + n])
            if built is not None:
                built(n)
    return pool


def _next_picks(prev: torch.Tensor | None, seq_lens: torch.Tensor, top_k: int, locality: float,
                gen: torch.Generator) -> torch.Tensor:
    """int64 [R, top_k] distinct positions < seq_len per request: `locality` of `prev` kept (the
    ones still valid), the rest fresh, sampled without replacement by random keys. A request
    shorter than top_k gets every position, padded with -1, as SGLang's indexer gives it."""
    r = seq_lens.shape[0]
    span = int(seq_lens.max())
    keys = torch.rand(r, span, generator=gen)
    if span < top_k:  # room for the padding
        keys = torch.cat([keys, torch.full((r, top_k - span), 2.0)], dim=1)
    keys[torch.arange(keys.shape[1]).unsqueeze(0) >= seq_lens.unsqueeze(1)] = 2.0  # never pick past seq_len
    keep = 0 if prev is None else int(round(locality * top_k))
    if keep:
        kept = prev[:, torch.randperm(top_k, generator=gen)[:keep]]
        keys.scatter_(1, kept.clamp(min=0), -1.0)  # kept positions sort first (padding: position 0)
    picked = keys.topk(top_k, dim=1, largest=False)
    return picked.indices.masked_fill(picked.values >= 2.0, -1)


def _dense_reference(q: torch.Tensor, kv: torch.Tensor, picks: torch.Tensor, scale: float) -> torch.Tensor:
    """float64 attention of q [R, h, 576] over the BF16 rows kv[r, picks[r]] -> [R, h, 512];
    -1 picks (padding) take no part."""
    valid = picks >= 0
    rows = torch.gather(kv, 1, picks.clamp(min=0).unsqueeze(-1).expand(-1, -1, D_QK)).double()  # [R, k, 576]
    logits = torch.einsum("rhd,rkd->rhk", q.double(), rows) * scale
    logits = logits.masked_fill(~valid.unsqueeze(1), float("-inf"))
    return torch.einsum("rhk,rkd->rhd", torch.softmax(logits, dim=-1), rows[..., :D_V])


def run(decision, w: Workload, progress=None, max_bytes: int | None = None, limit: str = "--max-memory",
        build_progress=None) -> dict:
    """Run the workload with the decode backend `decision` chose; returns the report (a dict).
    The workload is checked first, its memory included (against `max_bytes`, whose origin
    `limit` names; default resources.memory_budget of its device), so nothing is allocated for a
    run that cannot fit. `build_progress(done, total)` as the KV rows are made, `progress(step,
    steps)` as the steps run (once the run is past a second)."""
    backend = decision.backends.get("decode")
    w.check([backend])
    device = resolve_device(w.device, "--device")
    if max_bytes is None:
        max_bytes, limit = memory_budget(device)
    w.check([backend], max_bytes, limit)
    available, how = memory_available(device)
    w.check([backend], available, f"{how}; no limit raises it", raisable=False)
    fp8 = backend == "flashmla_kv"
    gen = torch.Generator().manual_seed(w.seed)
    max_len = w.context + w.steps
    built = None
    if build_progress is not None:
        total, done = w.requests * max_len * (2 if fp8 else 1), [0]

        def built(n):
            done[0] += n
            build_progress(done[0], total)
    kv = _kv(w.requests, max_len, gen, built)                  # the BF16 truth
    pool = _pool(kv, fp8, built)                               # host rows in the backend's layout
    hb = HotBuffer(pool, w.buffer, device=device, page_size=PAGE, max_bytes=max_bytes)
    cache = hb.paged_view()                                    # FP8 [pages, 64, 1, 656] / BF16 [rows, 1, 576]
    req_ids = torch.arange(w.requests)
    times = StepTimes()
    cos, max_err, max_ref = [], 0.0, 0.0
    picks = None
    provider = None
    started = time.perf_counter()
    for step in range(w.steps):
        seq_lens = torch.full((w.requests,), w.context + step + 1, dtype=torch.int64)
        picks = _next_picks(picks, seq_lens, w.top_k, w.locality, gen)
        q = (torch.randn(w.requests, w.heads, D_QK, generator=gen) * 0.25).to(torch.bfloat16)
        t0 = time.perf_counter()
        rows = hb.translate(req_ids, seq_lens, picks)          # int32 [R, top_k] buffer rows
        t1 = time.perf_counter()
        if fp8:
            res = attend(decision, q.unsqueeze(1).to(device), cache, rows.unsqueeze(1),
                         softmax_scale=w.softmax_scale, provider=w.provider, seq_lens=seq_lens)
            out = res.out[:, 0]
        else:
            res = attend(decision, q.to(device), cache, rows.unsqueeze(1), sm_scale=w.softmax_scale,
                         provider=w.provider)
            out = res.out
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t2 = time.perf_counter()
        provider = res.provider
        times.translate.append(t1 - t0)
        times.kernel.append(t2 - t1)
        times.total.append(t2 - t0)
        ref = _dense_reference(q, kv, picks, w.softmax_scale)
        got = out.double().cpu()
        cos.append(float(torch.nn.functional.cosine_similarity(got.flatten(1), ref.flatten(1)).min()))
        max_err = max(max_err, float((got - ref).abs().max()))
        max_ref = max(max_ref, float(ref.abs().max()))
        if progress is not None and time.perf_counter() - started > 1.0:
            progress(step + 1, w.steps)
    stats = hb.stats
    row_bytes = FP8_ROW_BYTES if fp8 else BF16_ROW_BYTES
    return {
        "policy": decision.policy.identity(),
        "decision": {"ok": decision.ok, "decode_backend": backend, "kv_cache_dtype": decision.config.get("kv_cache_dtype"),
                     "source": decision.sources.get("decode")},
        "provider": provider,
        "workload": {"requests": w.requests, "context": w.context, "heads": w.heads, "top_k": w.top_k,
                     "buffer_size": w.buffer, "steps": w.steps, "locality": w.locality, "seed": w.seed,
                     "device": str(device), "threads": torch.get_num_threads()},
        "latency_ms": {k: _summary(getattr(times, k)) for k in ("translate", "kernel", "total")},
        "hot_buffer": {"hit_rate": round(stats.hit_rate, 4), "hits": stats.hits, "misses": stats.misses,
                       "rows_copied_per_step": round(stats.rows_copied / stats.steps, 1),
                       "bytes_copied_per_step": round(stats.bytes_copied / stats.steps, 1),
                       "buffer_bytes": hb.buffer.numel() * hb.buffer.element_size(),
                       "buffer_bytes_per_request": hb.rows_per_request * row_bytes},
        "memory": {"kv_bytes_per_token": row_bytes, "bf16_bytes_per_token": BF16_ROW_BYTES,
                   "host_pool_bytes": pool.numel() * pool.element_size()},
        "accuracy": {"vs": "dense BF16 attention over the same picked tokens (float64)",
                     "cosine_min": round(min(cos), 6), "cosine_mean": round(statistics.fmean(cos), 6),
                     "max_abs_error": float(f"{max_err:.4g}"),
                     "max_abs_error_relative": float(f"{max_err / max_ref:.4g}") if max_ref else 0.0},
    }


def _summary(xs: list) -> dict:
    ms = sorted(x * 1e3 for x in xs)
    p90 = ms[min(len(ms) - 1, math.ceil(0.9 * len(ms)) - 1)]
    return {"median": round(statistics.median(ms), 3), "p90": round(p90, 3), "max": round(ms[-1], 3)}


def report_text(r: dict) -> str:
    w, lat, hbuf, mem, acc = r["workload"], r["latency_ms"], r["hot_buffer"], r["memory"], r["accuracy"]
    p = r["policy"]
    lines = [
        f"policy {p['family']}@{p['version']}: decode backend {r['decision']['decode_backend']} "
        f"({r['decision']['kv_cache_dtype']} KV cache; {r['decision']['source']}), provider {r['provider']}",
        _workload_line(w),
        "latency per step (ms)    median      p90",
        *(f"  {k:<22}{lat[k]['median']:>8.2f} {lat[k]['p90']:>8.2f}" for k in ("translate", "kernel", "total")),
        f"hot buffer: hit rate {hbuf['hit_rate']:.1%}, {hbuf['rows_copied_per_step']:.0f} rows "
        f"({hbuf['bytes_copied_per_step'] / 1e6:.2f} MB) copied per step",
        f"memory: {mem['kv_bytes_per_token']} KV bytes per token (BF16: {mem['bf16_bytes_per_token']}), "
        f"hot buffer {hbuf['buffer_bytes'] / 1e6:.2f} MB ({hbuf['buffer_bytes_per_request'] / 1e6:.2f} MB per request), "
        f"host pool {mem['host_pool_bytes'] / 1e6:.1f} MB",
        f"accuracy vs dense BF16 over the same tokens: cosine min {acc['cosine_min']:.6f} "
        f"(mean {acc['cosine_mean']:.6f}), max abs error {acc['max_abs_error']:.3g} "
        f"({acc['max_abs_error_relative']:.2%} of the largest output)",
    ]
    return "\n".join(lines)


def _workload_line(w: dict) -> str:
    return (f"workload: {w['requests']} requests x {w['context']} tokens, {w['heads']} heads, top-k {w['top_k']}, "
            f"hot buffer {w['buffer_size']} slots, {w['steps']} steps, locality {w['locality']}, seed {w['seed']}, "
            f"{w['device']}, {w['threads']} thread{'s' if w['threads'] != 1 else ''}")


def compare_text(reports: dict) -> str:
    """`hisparse attend --compare`: the reports of one workload run on each KV cache dtype (the
    keys), side by side."""
    runs = list(reports.values())
    p = runs[0]["policy"]

    def row(label, cell):
        return f"  {label:<32}" + "".join(f"{cell(r):<18}" for r in runs).rstrip()

    def ms(part, stat):
        return lambda r: f"{r['latency_ms'][part][stat]:.2f}"

    lines = [
        f"policy {p['family']}@{p['version']}: one workload on {len(runs)} KV caches, side by side",
        _workload_line(runs[0]["workload"]),
        row("", lambda r: r["decision"]["kv_cache_dtype"]),
        row("decode backend", lambda r: r["decision"]["decode_backend"]),
        row("provider", lambda r: r["provider"]),
        row("latency per step, median (ms)", ms("total", "median")),
        row("  p90", ms("total", "p90")),
        row("  translate, median", ms("translate", "median")),
        row("  kernel, median", ms("kernel", "median")),
        row("KV bytes per token", lambda r: str(r["memory"]["kv_bytes_per_token"])),
        row("hot buffer (MB)", lambda r: f"{r['hot_buffer']['buffer_bytes'] / 1e6:.2f}"),
        row("host pool (MB)", lambda r: f"{r['memory']['host_pool_bytes'] / 1e6:.1f}"),
        row("hot buffer hit rate", lambda r: f"{r['hot_buffer']['hit_rate']:.1%}"),
        row("copied per step (MB)", lambda r: f"{r['hot_buffer']['bytes_copied_per_step'] / 1e6:.2f}"),
        row("cosine min vs float64", lambda r: f"{r['accuracy']['cosine_min']:.6f}"),
        row("  mean", lambda r: f"{r['accuracy']['cosine_mean']:.6f}"),
        row("max abs error", lambda r: f"{r['accuracy']['max_abs_error']:.3g}"),
        row("  of the largest output", lambda r: f"{r['accuracy']['max_abs_error_relative']:.2%}"),
        "accuracy: against dense attention in float64 over the same picked tokens of the BF16 KV",
    ]
    return "\n".join(lines)
