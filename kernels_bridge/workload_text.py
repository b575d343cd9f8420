"""`hisparse attend`'s text reports: a workload run, runs side by side (--compare), a trace replay."""
from __future__ import annotations

from kernels_bridge.hot_buffer_report import hot_buffer_line

__all__ = ["report_text", "compare_text", "trace_text"]


def _policy_line(r: dict) -> str:
    p = r["policy"]
    provider = f", provider {r['provider']}" if r.get("provider") else ", no kernel run"
    return (f"policy {p['family']}@{p['version']}: decode backend {r['decision']['decode_backend']} "
            f"({r['decision']['kv_cache_dtype']} KV cache; {r['decision']['source']}){provider}")


def _workload_line(w: dict) -> str:
    return (f"workload: {w['requests']} requests x {w['context']} tokens, {w['heads']} heads, top-k {w['top_k']}, "
            f"hot buffer {w['buffer_size']} slots, {w['steps']} steps, locality {w['locality']}, seed {w['seed']}, "
            f"{w['device']}, {w['threads']} thread{'s' if w['threads'] != 1 else ''}")


def _memory_line(r: dict) -> str:
    mem, hbuf = r["memory"], r["hot_buffer"]
    pool = f", host pool {mem['host_pool_bytes'] / 1e6:.1f} MB" if mem.get("host_pool_bytes") is not None else ""
    return (f"memory: {mem['kv_bytes_per_token']} KV bytes per token (BF16: {mem['bf16_bytes_per_token']}), "
            f"hot buffer {hbuf['buffer_bytes'] / 1e6:.2f} MB ({hbuf['buffer_bytes_per_request'] / 1e6:.2f} MB per "
            f"request){pool}")


def report_text(r: dict) -> str:
    """One run: the decision, the workload, latency, the hot buffer, memory, accuracy."""
    lines = [_policy_line(r), _workload_line(r["workload"])]
    lat, acc = r.get("latency_ms"), r.get("accuracy")
    if lat:
        lines += ["latency per step (ms)    median      p90",
                  *(f"  {k:<22}{lat[k]['median']:>8.2f} {lat[k]['p90']:>8.2f}" for k in ("translate", "kernel", "total"))]
    lines += [hot_buffer_line(r["hot_buffer"]), _memory_line(r)]
    if acc:
        lines.append(f"accuracy vs dense BF16 over the same tokens (softmax scale {acc['softmax_scale']:g}): "
                     f"cosine min {acc['cosine_min']:.6f} (mean {acc['cosine_mean']:.6f}), max abs error "
                     f"{acc['max_abs_error']:.3g} ({acc['max_abs_error_relative']:.2%} of the largest output)")
    return "\n".join(lines)


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
        row("hot buffer hit rate", lambda r: f"{100 * r['hot_buffer']['hit_rate']:.2f}%"),
        row("copied host -> device (rows)", lambda r: f"{r['hot_buffer']['rows_copied']:,}"),
        row("cosine min vs float64", lambda r: f"{r['accuracy']['cosine_min']:.6f}"),
        row("  mean", lambda r: f"{r['accuracy']['cosine_mean']:.6f}"),
        row("max abs error", lambda r: f"{r['accuracy']['max_abs_error']:.3g}"),
        row("  of the largest output", lambda r: f"{r['accuracy']['max_abs_error_relative']:.2%}"),
        f"accuracy: against dense attention in float64 over the same picked tokens of the BF16 KV, at the "
        f"model's softmax scale {runs[0]['accuracy']['softmax_scale']:g}",
    ]
    return "\n".join(lines)


def trace_text(r: dict) -> str:
    """A trace replay: what SGLang's hot buffer did on it, in total (the per-step series is in the
    JSON report)."""
    t, h = r["trace"], r["hot_buffer"]
    return "\n".join([
        _policy_line(r),
        f"trace: {t['file']}, {t['steps']} steps, {t['requests_admitted']} requests (ids below {t['num_requests']}), "
        f"top-k {t['top_k']}, longest {t['max_seq_len']:,} tokens, hot buffer {t['buffer_size']} slots",
        hot_buffer_line(h),
        f"worst step: line {t['worst_line']}, {t['worst_rows_copied']:,} rows copied; --format json gives every step",
    ])
