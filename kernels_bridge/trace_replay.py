"""`hisparse attend --trace FILE`: a checked decode trace (`trace`) replayed through a HotBuffer
that keeps SGLang's books without rows, giving SGLang's hit rate, rows copied host -> device and
new tokens written on the device, per step and in total. No KV, no kernel: the trace carries
neither."""
from __future__ import annotations

import time

from kernels_bridge.hot_buffer import HotBuffer, HotBufferError
from kernels_bridge.hot_buffer_report import StepSeries, hot_buffer_report
from kernels_bridge.layout import PAGE_SIZE
from kernels_bridge.trace import TraceError, TraceInfo, steps

__all__ = ["replay"]


def replay(decision, info: TraceInfo, buffer_size: int, *, admission: str = "normal", release: str = "0.5.23",
           device: str = "cpu", max_bytes=None, progress=None, draft_tokens: int = 0) -> dict:
    """Run every step of a trace scan() accepted; returns the report (a dict). Raises TraceError
    (with the line) where SGLang's kernel could not take a step, and HotBufferError where the
    trace's sizes need more memory than the limit."""
    fp8 = decision.backends.get("decode") == "flashmla_kv"
    spec = dict(draft_tokens=draft_tokens, top_k=info.top_k) if draft_tokens else {}
    try:
        hb = HotBuffer.counting(info.num_requests, info.max_seq_len, buffer_size, kv_format="fp8" if fp8 else "bf16",
                                device=device, page_size=PAGE_SIZE, max_bytes=max_bytes, admission=admission,
                                release=release, **spec)
    except HotBufferError as exc:
        if exc.argument in ("draft_tokens", "top_k", "release", "num_requests"):
            raise TraceError(f"{info.path}: {exc}", argument="trace") from None
        raise TraceError(f"{info.path}: request ids below {info.num_requests} and seq_lens up to "
                         f"{info.max_seq_len:,} are too many positions to keep the books of: {exc}",
                         argument="trace") from None
    series = StepSeries(hb)
    started = time.perf_counter()
    for done, step in enumerate(steps(info.path, info.top_k, draft_tokens), 1):
        try:
            hb.translate(step.req_ids, step.seq_lens, step.positions)
        except HotBufferError as exc:
            raise TraceError(f"{info.path}:{step.line}: {exc}", argument="trace") from None
        series.record(line=step.line, requests=int(step.req_ids.numel()))
        if step.finished:
            hb.free(step.finished)
        if progress is not None and time.perf_counter() - started > 1.0:  # a run past a second says so
            progress(done, info.steps)
    worst = max(series.steps, key=lambda s: s["rows_copied"])
    return {
        "policy": decision.policy.identity(),
        "decision": {"ok": decision.ok, "decode_backend": decision.backends.get("decode"),
                     "kv_cache_dtype": decision.config.get("kv_cache_dtype"), "source": decision.sources.get("decode")},
        "provider": None,
        "trace": {"file": info.path, "steps": info.steps, "num_requests": info.num_requests,
                  "requests_admitted": info.admitted, "top_k": info.top_k, "max_seq_len": info.max_seq_len,
                  "buffer_size": buffer_size, "draft_tokens": draft_tokens, "worst_line": worst["line"], "worst_rows_copied": worst["rows_copied"]},
        "hot_buffer": hot_buffer_report(hb, series),
    }
