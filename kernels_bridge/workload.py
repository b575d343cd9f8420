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

from kernels_bridge.dispatch import BACKENDS, attend
from kernels_bridge.errors import ValidationError, shown
from engine.language.inputs import INT_MAX
from kernels_bridge.fp8 import BF16_ROW_BYTES, D_QK, FP8_ROW_BYTES, quantize_kv_fp8
from kernels_bridge.hot_buffer import HotBuffer
from kernels_bridge.resources import format_bytes, memory_available, memory_budget, resolve_device
from kernels_bridge.validate import D_V, DECODE_TOPK_MULTIPLE, HEAD_COUNTS, PREFILL_TOPK_MULTIPLE

PAGE = 64


# The workload's knobs are SGLang's --hisparse-config names, with SGLang's defaults: top_k 2048,
# device_buffer_size 2 * top_k. Messages name the flags `hisparse attend` spells them with.
TOP_K_FLAG, BUFFER_FLAG = "--hisparse-top-k", "--hisparse-device-buffer-size"
DEFAULT_TOP_K = 2048
MAX_SEED = INT_MAX  # --seed is read as a 64-bit integer, as every integer flag
PART_NAMES = {"--requests x --context": "KV", f"--requests x {BUFFER_FLAG}": "hot buffer",
              f"--requests x {TOP_K_FLAG}": "per-step scratch"}


@dataclass
class Workload:
    requests: int = 4
    context: int = 4096
    heads: int = 128
    top_k: int = DEFAULT_TOP_K
    buffer_size: int = 2 * DEFAULT_TOP_K
    steps: int = 8
    locality: float = 0.7
    seed: int = 0
    provider: str = "auto"
    device: str = "cpu"
    softmax_scale: float = D_QK ** -0.5

    def check(self, max_bytes: int | None = None, budget: str = "max_bytes", raisable: bool = True) -> None:
        """Refuse a workload the kernels or the hot buffer would refuse, or one that needs more
        than `max_bytes` (host and device together), before building anything. `raisable`:
        whether --max-memory could raise that limit (not past what the machine can hold)."""
        problems = []
        if self.requests < 1:
            problems.append(f"--requests {self.requests}: at least 1")
        if self.heads not in HEAD_COUNTS:
            problems.append(f"--heads {self.heads}: FlashMLA supports {' or '.join(map(str, HEAD_COUNTS))}")
        if self.top_k < 1:
            problems.append(f"{TOP_K_FLAG} {self.top_k}: at least 1")
        if self.buffer_size % PAGE or self.buffer_size < self.top_k:
            problems.append(f"{BUFFER_FLAG} {self.buffer_size}: a multiple of {PAGE} and at least "
                            f"{TOP_K_FLAG} ({self.top_k})")
        if self.context < self.top_k:
            problems.append(f"--context {self.context}: at least {TOP_K_FLAG} ({self.top_k})")
        if self.steps < 1:
            problems.append(f"--steps {self.steps}: at least 1")
        if not 0.0 <= self.locality <= 1.0:
            problems.append(f"--locality {self.locality}: a share between 0 and 1")
        if not 0 <= self.seed <= MAX_SEED:
            problems.append(f"--seed {self.seed}: between 0 and 2**63 - 1")
        if problems:
            raise ValidationError("; ".join(problems), argument="workload")
        if max_bytes is not None:
            parts = self.bytes_needed()
            need = sum(parts.values())
            if need > max_bytes:
                flags, _ = max(parts.items(), key=lambda kv: kv[1])
                shown = ", ".join(f"{PART_NAMES[k]} {format_bytes(v)}" for k, v in parts.items() if v)
                raise ValidationError(
                    f"{flags}: this workload needs {format_bytes(need)} ({shown}); the limit is "
                    f"{format_bytes(max_bytes)} ({budget}); make it smaller"
                    + (", or raise the limit with --max-memory" if raisable else ""), argument="workload")

    def bytes_needed(self) -> dict:
        """Bytes the run allocates, by the flag that drives each part: the KV of every request
        (the BF16 truth, the FP8 rows and their scratch) grows with --requests and --context
        (+ --steps), the hot buffer with the buffer size, a step's picks and reference with the
        top-k. An upper bound: FP8 rows are counted whatever the backend."""
        length = self.context + self.steps
        row = max(FP8_ROW_BYTES, BF16_ROW_BYTES)
        kv = self.requests * length * (BF16_ROW_BYTES + FP8_ROW_BYTES)
        kv_scratch = length * D_QK * 4 * 3  # one request's float32 randn, product, quantize scratch
        picks = self.requests * length * (4 + 1 + 8) * 2  # random keys, mask, sort indices
        hb = HotBuffer.bytes_needed(self.requests, length, self.buffer_size, PAGE, row, self.device)
        reference = self.requests * self.top_k * D_QK * 8 * 3 + self.requests * self.heads * self.top_k * 8 * 3
        return {"--requests x --context": kv + kv_scratch + picks, f"--requests x {BUFFER_FLAG}": hb,
                f"--requests x {TOP_K_FLAG}": reference}


@dataclass
class StepTimes:
    translate: list = field(default_factory=list)
    kernel: list = field(default_factory=list)
    total: list = field(default_factory=list)


def _kv(requests: int, length: int, gen: torch.Generator) -> torch.Tensor:
    """BF16 KV rows [requests, length, 576], per-channel scaled as real activations are. Built
    request by request, so no float32 copy of the whole cache ever exists."""
    channel = torch.exp(torch.randn(D_QK, generator=gen) * 0.5)
    kv = torch.empty(requests, length, D_QK, dtype=torch.bfloat16)
    for r in range(requests):
        kv[r] = torch.randn(length, D_QK, generator=gen) * channel
    return kv


def _pool(kv: torch.Tensor, fp8: bool) -> torch.Tensor:
    """Host rows in the backend's layout: the BF16 rows themselves, or FP8 656-byte rows
    (quantized request by request to keep the scratch small)."""
    if not fp8:
        return kv
    pool = torch.empty(*kv.shape[:2], FP8_ROW_BYTES, dtype=torch.uint8)
    for r in range(kv.shape[0]):
        pool[r] = quantize_kv_fp8(kv[r])
    return pool


def _next_picks(prev: torch.Tensor | None, seq_lens: torch.Tensor, top_k: int, locality: float,
                gen: torch.Generator) -> torch.Tensor:
    """int64 [R, top_k] distinct positions < seq_len per request: `locality` of `prev` kept (the
    ones still valid), the rest fresh, sampled without replacement by random keys."""
    r = seq_lens.shape[0]
    span = int(seq_lens.max())
    keys = torch.rand(r, span, generator=gen)
    keys[torch.arange(span).unsqueeze(0) >= seq_lens.unsqueeze(1)] = 2.0  # never pick past seq_len
    keep = 0 if prev is None else int(round(locality * top_k))
    if keep:
        kept = prev[:, torch.randperm(top_k, generator=gen)[:keep]]
        keys.scatter_(1, kept, -1.0)  # kept positions sort first
    return keys.topk(top_k, dim=1, largest=False).indices


def _dense_reference(q: torch.Tensor, kv: torch.Tensor, picks: torch.Tensor, scale: float) -> torch.Tensor:
    """float64 attention of q [R, h, 576] over the BF16 rows kv[r, picks[r]] -> [R, h, 512]."""
    rows = torch.gather(kv, 1, picks.unsqueeze(-1).expand(-1, -1, D_QK)).double()  # [R, k, 576]
    logits = torch.einsum("rhd,rkd->rhk", q.double(), rows) * scale
    return torch.einsum("rhk,rkd->rhd", torch.softmax(logits, dim=-1), rows[..., :D_V])


def run(decision, w: Workload, progress=None, max_bytes: int | None = None) -> dict:
    """Run the workload with the decode backend `decision` chose; returns the report (a dict).
    The workload is checked first, its memory included (against `max_bytes`, default
    resources.memory_budget of its device), so nothing is allocated for a run that cannot fit."""
    w.check()
    device = resolve_device(w.device, "--device")
    budget = "max_bytes"
    if max_bytes is None:
        max_bytes, budget = memory_budget(device)
    w.check(max_bytes, budget)
    available, how = memory_available(device)
    w.check(available, f"{how}; no limit raises it", raisable=False)
    backend = decision.backends.get("decode")
    if backend not in BACKENDS:
        raise ValidationError(f"backend: the policy chose {shown(backend)} for decode; the bridge runs "
                              f"{', '.join(repr(b) for b in BACKENDS)}", argument="backend")
    fp8 = backend == "flashmla_kv"
    multiple = DECODE_TOPK_MULTIPLE if fp8 else PREFILL_TOPK_MULTIPLE
    if w.top_k % multiple:
        raise ValidationError(f"{TOP_K_FLAG} {w.top_k}: {backend} needs a multiple of {multiple}",
                              argument="top_k")
    gen = torch.Generator().manual_seed(w.seed)
    max_len = w.context + w.steps
    kv = _kv(w.requests, max_len, gen)                          # the BF16 truth
    pool = _pool(kv, fp8)                                      # host rows in the backend's layout
    hb = HotBuffer(pool, w.buffer_size, device=device, page_size=PAGE, max_bytes=max_bytes)
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
                         softmax_scale=w.softmax_scale, provider=w.provider)
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
                     "buffer_size": w.buffer_size, "steps": w.steps, "locality": w.locality, "seed": w.seed,
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
        f"workload: {w['requests']} requests x {w['context']} tokens, {w['heads']} heads, top-k {w['top_k']}, "
        f"hot buffer {w['buffer_size']} slots, {w['steps']} steps, locality {w['locality']}, seed {w['seed']}, "
        f"{w['device']}, {w['threads']} thread{'s' if w['threads'] != 1 else ''}",
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
