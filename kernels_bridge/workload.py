"""A synthetic DSA decode workload, end to end: the policy picks the decode backend, the host pool is
built in that backend's row layout, and every step runs top-k -> hot buffer -> bridge -> kernel.
`hisparse attend` is its command line.

The workload: `requests` requests, each with `context` tokens of KV (random, per-channel scaled
like real activations) and growing by one token per step. Every step each request's indexer
"picks" `top_k` positions: a `locality` share of the previous step's picks is kept, the rest are
fresh positions (the picks depend on the seed alone). The hot buffer does what SGLang's does
(`hot_buffer`: its admission, kernel release, the newest token on the device), and the report
gives SGLang's figures: hits, rows copied host -> device, new tokens written on the device, per
step and in total. Accuracy is measured at the model's softmax scale (`model_config`) against a
dense BF16 attention over the same picked tokens, computed in float64 straight from the BF16 KV
(not through the hot buffer or the FP8 rows). Without the kernel (`Workload.kernel` False) only
the hot buffer's books run: no KV is built.
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
from kernels_bridge.hot_buffer_report import StepSeries, hot_buffer_report
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
    steps)` as the steps run (once the run is past a second). With w.kernel False only the hot
    buffer's books run: no KV, no kernel, no accuracy."""
    backend = decision.backends.get("decode")
    device = _checked_device(w, backend, max_bytes, limit)
    if max_bytes is None:
        max_bytes, limit = memory_budget(device)
    fp8 = backend == "flashmla_kv"
    picks_gen = torch.Generator().manual_seed(w.seed)  # the picks depend on the seed alone, kernel or not
    if not w.kernel:
        spec = dict(draft_tokens=w.draft_tokens, top_k=w.top_k) if w.draft_tokens else {}
        hb = HotBuffer.counting(w.requests, w.kv_length, w.buffer, kv_format="fp8" if fp8 else "bf16", device=device,
                                page_size=PAGE, max_bytes=max_bytes, admission=w.admission, release=w.release, **spec)
        steps = _spec_steps if w.draft_tokens else _steps
        series = steps(w, hb, picks_gen, None, progress)[0]
        return _report(decision, w, device, hb, series, None, fp8)
    gen = torch.Generator().manual_seed(w.seed + 1)  # the KV and the queries
    built = _counter(build_progress, w.requests * w.kv_length * (2 if fp8 else 1))
    kv = _kv(w.requests, w.kv_length, gen, built)              # the BF16 truth
    pool = _pool(kv, fp8, built)                               # host rows in the backend's layout
    hb = HotBuffer(pool, w.buffer, device=device, page_size=PAGE, max_bytes=max_bytes, admission=w.admission,
                   release=w.release)
    kernel = _Kernel(decision, w, hb, kv, gen, fp8)
    series, times = _steps(w, hb, picks_gen, kernel, progress)
    return _report(decision, w, device, hb, series, kernel.summary(times, pool), fp8)


def _checked_device(w: Workload, backend, max_bytes, limit):
    """The workload checked against the kernels, the memory limit and what the device can hold."""
    w.check([backend])
    device = resolve_device(w.device, "--device")
    if max_bytes is None:
        max_bytes, limit = memory_budget(device)
    w.check([backend], max_bytes, limit)
    available, how = memory_available(device)
    w.check([backend], available, f"{how}; no limit raises it", raisable=False)
    return device


def _counter(progress, total):
    """progress(done, total) as rows are built, or None."""
    if progress is None:
        return None
    done = [0]

    def built(n):
        done[0] += n
        progress(done[0], total)
    return built


def _spec_steps(w: Workload, hb: HotBuffer, gen, kernel, progress):
    """Speculative decode steps (books only): each a verify of N drafts, draft i's picks drawn
    from draft i-1's (the first from the last step's last draft) with `locality`; each step then
    accepts 1..N drafts, uniformly at random."""
    series = StepSeries(hb)
    req_ids = torch.arange(w.requests)
    lens = torch.full((w.requests,), w.context, dtype=torch.int64)
    picks, started = None, time.perf_counter()
    for step in range(w.steps):
        rows = []
        for i in range(w.draft_tokens):
            if picks is not None:  # the last step's last draft saw drafts this step may not have
                picks = picks.masked_fill(picks > lens.unsqueeze(1) + i, -1)
            picks = _next_picks(picks, lens + i + 1, w.top_k, w.locality, gen)
            rows.append(picks)
        hb.translate(req_ids, lens, torch.stack(rows, dim=1))
        series.record(step=step + 1, seq_len=int(lens[0]))
        lens = lens + torch.randint(1, w.draft_tokens + 1, (w.requests,), generator=gen)
        if progress is not None and time.perf_counter() - started > 1.0:
            progress(step + 1, w.steps)
    return series, None


def _steps(w: Workload, hb: HotBuffer, gen, kernel, progress):
    """The decode steps: top-k -> translate (-> the kernel); the per-step series and the times."""
    series = StepSeries(hb)
    req_ids = torch.arange(w.requests)
    times = StepTimes()
    picks = None
    started = time.perf_counter()
    for step in range(w.steps):
        seq_lens = torch.full((w.requests,), w.context + step + 1, dtype=torch.int64)
        picks = _next_picks(picks, seq_lens, w.top_k, w.locality, gen)
        t0 = time.perf_counter()
        rows = hb.translate(req_ids, seq_lens, picks)          # int32 [R, top_k] buffer rows
        t1 = time.perf_counter()
        series.record(step=step + 1, seq_len=int(seq_lens[0]))
        times.translate.append(t1 - t0)
        if kernel is not None:
            kernel.step(seq_lens, picks, rows, times)
        if progress is not None and time.perf_counter() - started > 1.0:
            progress(step + 1, w.steps)
    return series, times


class _Kernel:
    """The kernel side of a step: the policy's backend on the hot buffer's rows, against dense
    float64 attention over the same picked tokens."""

    def __init__(self, decision, w: Workload, hb: HotBuffer, kv, gen, fp8: bool):
        self.decision, self.w, self.hb, self.kv, self.gen, self.fp8 = decision, w, hb, kv, gen, fp8
        self.cache = hb.paged_view()                           # FP8 [pages, 64, 1, 656] / BF16 [rows, 1, 576]
        self.cos, self.max_err, self.max_ref, self.provider = [], 0.0, 0.0, None

    def step(self, seq_lens, picks, rows, times: StepTimes) -> None:
        w, device = self.w, self.hb.device
        q = (torch.randn(w.requests, w.heads, D_QK, generator=self.gen) * 0.25).to(torch.bfloat16)
        t1 = time.perf_counter()
        if self.fp8:
            res = attend(self.decision, q.unsqueeze(1).to(device), self.cache, rows.unsqueeze(1),
                         softmax_scale=w.softmax_scale, provider=w.provider, seq_lens=seq_lens)
            out = res.out[:, 0]
        else:
            res = attend(self.decision, q.to(device), self.cache, rows.unsqueeze(1), sm_scale=w.softmax_scale,
                         provider=w.provider)
            out = res.out
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t2 = time.perf_counter()
        self.provider = res.provider
        times.kernel.append(t2 - t1)
        times.total.append(times.translate[-1] + t2 - t1)
        ref = _dense_reference(q, self.kv, picks, w.softmax_scale)
        got = out.double().cpu()
        self.cos.append(float(torch.nn.functional.cosine_similarity(got.flatten(1), ref.flatten(1)).min()))
        self.max_err = max(self.max_err, float((got - ref).abs().max()))
        self.max_ref = max(self.max_ref, float(ref.abs().max()))

    def summary(self, times: StepTimes, pool) -> dict:
        return {
            "provider": self.provider,
            "latency_ms": {k: _summary(getattr(times, k)) for k in ("translate", "kernel", "total")},
            "host_pool_bytes": pool.numel() * pool.element_size(),
            "accuracy": {"vs": "dense BF16 attention over the same picked tokens (float64)",
                         "softmax_scale": round(self.w.softmax_scale, 6),
                         "cosine_min": round(min(self.cos), 6), "cosine_mean": round(statistics.fmean(self.cos), 6),
                         "max_abs_error": float(f"{self.max_err:.4g}"),
                         "max_abs_error_relative": float(f"{self.max_err / self.max_ref:.4g}") if self.max_ref else 0.0},
        }


def _report(decision, w: Workload, device, hb: HotBuffer, series, kernel, fp8: bool) -> dict:
    row_bytes = FP8_ROW_BYTES if fp8 else BF16_ROW_BYTES
    hbuf = hot_buffer_report(hb, series)
    hbuf.update(buffer_bytes=w.requests * hb.rows_per_request * row_bytes,
                buffer_bytes_per_request=hb.rows_per_request * row_bytes)
    return {
        "policy": decision.policy.identity(),
        "decision": {"ok": decision.ok, "decode_backend": decision.backends.get("decode"),
                     "kv_cache_dtype": decision.config.get("kv_cache_dtype"), "source": decision.sources.get("decode")},
        "provider": kernel["provider"] if kernel else None,
        "workload": {"requests": w.requests, "context": w.context, "heads": w.heads, "top_k": w.top_k,
                     "buffer_size": w.buffer, "steps": w.steps, "locality": w.locality, "seed": w.seed,
                     "device": str(device), "threads": torch.get_num_threads(), "kernel": w.kernel,
                     "draft_tokens": w.draft_tokens},
        "latency_ms": kernel["latency_ms"] if kernel else None,
        "hot_buffer": hbuf,
        "memory": {"kv_bytes_per_token": row_bytes, "bf16_bytes_per_token": BF16_ROW_BYTES,
                   "host_pool_bytes": kernel["host_pool_bytes"] if kernel else None},
        "accuracy": kernel["accuracy"] if kernel else None,
    }


def _summary(xs: list) -> dict:
    ms = sorted(x * 1e3 for x in xs)
    p90 = ms[min(len(ms) - 1, math.ceil(0.9 * len(ms)) - 1)]
    return {"median": round(statistics.median(ms), 3), "p90": round(p90, 3), "max": round(ms[-1], 3)}


