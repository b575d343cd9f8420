"""GPU check of the kernel bridge: FlashMLA through the bridge vs the reference kernels.

On a CUDA machine (SM90 or SM100) with the `sgl-flash-mla` wheel and a CUDA build of torch:

    python -m kernels_bridge.gpu_check [--out FILE] [--quick]   (the bench runs it: python -m bench.gpu_check)

For both backends on DeepSeek-V3.2 shapes (h_q 64 and 128, top-k 2048, several batch sizes) it
checks FlashMLA's outputs against the reference with FlashMLA's own tolerances (an element passes
if abs_err < abs_tol or rel_err < rel_tol; a cosine check; inf/NaN positions must match), measures
the bridge's per-call overhead against a direct flash_mla call (CUDA events, warm-up, median) and
the achieved TFLOPS (FLOPs = 2 * b * s_q * h_q * topk * (576 + 512)). Decode caches have every row
no index names filled with NaN bytes, as FlashMLA's own test does. One JSON summary goes to stdout
(and to --out). Exit status 1 when a tolerance fails; on a machine without CUDA or flash_mla it
prints {"skipped": true, "reason": ...} and exits 0. Runs in well under 5 minutes.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional

import torch

from kernels_bridge.errors import describe
from kernels_bridge.fp8 import D_QK
from kernels_bridge.validate import D_V, INT32_MAX

# name -> (abs_tol, rel_tol, cos_diff_tol), as FlashMLA's tests use them
TOLERANCES = {
    "prefill_out": (8e-4, 3.01 / 128, 7e-6),
    "prefill_max_logits": (1e-6, 2.01 / 65536, 1e-7),
    "prefill_lse": (1e-6, 2.01 / 65536, 1e-7),
    "decode_out": (1e-3, 2.01 / 128, 5e-6),
    "decode_lse": (1e-6, 8.01 / 65536, 1e-7),
}
TOPK = 2048
# FlashMLA's published peaks on H800 SXM5 (deepseek-ai/FlashMLA README): the anchors the achieved
# TFLOPS are reported next to; written into every result, so the docs take them from there
PUBLISHED_TFLOPS = {"sparse_prefill": 640, "sparse_decode_fp8": 410, "gpu": "H800 SXM5"}


def allclose_report(name: str, ans: torch.Tensor, ref: torch.Tensor, abs_tol: float,
                    rel_tol: float, cos_tol: float = 1e-7) -> dict:
    """FlashMLA's closeness test (tests/kernelkit/compare.py), as data.

    inf, -inf and NaN must sit at the same positions in both (then count as equal); every other
    element passes if |a - r| < abs_tol or |a - r| / (|r| + 1e-6) < rel_tol; and the cosine
    difference 1 - 2 sum(a r) / (sum(a^2) + sum(r^2)), in float64, must be <= cos_tol.
    Returns {name, passed, anomalies_match, failed, total, max_abs_err, max_rel_err, cos_diff}.
    """
    if tuple(ans.shape) != tuple(ref.shape):
        return {"name": name, "passed": False,
                "error": f"shapes differ: {describe(ans)} vs {describe(ref)}"}
    a = ans.detach().float().clone()
    r = ref.detach().float().clone().to(a.device)
    anomalies_match = True
    for kind in ("inf", "-inf", "nan"):
        ma = torch.isnan(a) if kind == "nan" else a == float(kind)
        mr = torch.isnan(r) if kind == "nan" else r == float(kind)
        anomalies_match &= bool(torch.equal(ma, mr))
        a[ma], r[mr] = 0.0, 0.0
    a64, r64 = a.double(), r.double()
    ref_sq, ans_sq = float((r64 * r64).sum()), float((a64 * a64).sum())
    cos_diff = 0.0 if ref_sq < 1e-12 else 1.0 - 2.0 * float((a64 * r64).sum()) / (ref_sq + ans_sq)
    abs_err = (a - r).abs()
    rel_err = abs_err / (r.abs() + 1e-6)
    ok = (abs_err < abs_tol) | (rel_err < rel_tol)
    failed = int((~ok).sum())
    return {
        "name": name,
        "passed": anomalies_match and failed == 0 and abs(cos_diff) <= cos_tol,
        "anomalies_match": anomalies_match,
        "failed": failed,
        "total": ok.numel(),
        "max_abs_err": float(abs_err.max()) if abs_err.numel() else 0.0,
        "max_rel_err": float(rel_err.max()) if rel_err.numel() else 0.0,
        "cos_diff": cos_diff,
    }


def check(name: str, ans: torch.Tensor, ref: torch.Tensor) -> dict:
    return allclose_report(name, ans, ref, *TOLERANCES[name])


def sparse_flops(b: int, s_q: int, h_q: int, topk: int) -> float:
    return 2.0 * b * s_q * h_q * topk * (D_QK + D_V)


def median_us(fn: Callable[[], object], iters: int, warmup: int, device: torch.device) -> float:
    """Median latency of one call in microseconds. On CUDA the queue is drained before each call
    and CUDA events bracket it, so host-side work (validation, syncs) is counted; elsewhere (the
    CPU smoke run) a wall clock does the same."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        if device.type != "cuda":
            start_s = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start_s) * 1e6)
            continue
        torch.cuda.synchronize(device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0)
    return statistics.median(times)


# ---- inputs -----------------------------------------------------------------------------------

def make_kv(rows: int, gen: torch.Generator, device) -> torch.Tensor:
    """bf16 [rows, 576] with per-channel magnitudes, like real latent KV."""
    channel = torch.exp(torch.randn(D_QK, generator=gen, device=device) * 0.5)
    return (torch.randn(rows, D_QK, generator=gen, device=device) * channel).to(torch.bfloat16)


def make_q(shape, gen, device) -> torch.Tensor:
    return (torch.randn(*shape, D_QK, generator=gen, device=device) / 4).to(torch.bfloat16)


def pick_indices(shape, rows: int, gen, device, invalid_frac: float, invalid_value=-1,
                 lonely: int = 0) -> torch.Tensor:
    """int32 `shape` (last dim top-k) of rows in [0, rows), a fraction set invalid, and the
    first `lonely` rows (over the leading dims) entirely invalid."""
    idx = torch.randint(0, rows, shape, generator=gen, device=device, dtype=torch.int64)
    drop = torch.rand(shape, generator=gen, device=device) < invalid_frac
    idx = torch.where(drop, torch.full_like(idx, invalid_value), idx)
    flat = idx.view(-1, shape[-1])
    flat[:lonely] = invalid_value
    return idx.to(torch.int32)


# ---- direct flash_mla calls, as SGLang issues them (the overhead baseline) ----------------------

def direct_prefill(module, flavour: dict, q, kv, indices, sm_scale):
    extra = {"use_legacy": True} if flavour["use_legacy"] else {}
    return module.flash_mla_sparse_fwd(q=q, kv=kv, indices=indices, sm_scale=sm_scale, d_v=D_V,
                                       **extra)


def direct_decode(module, flavour: dict, q, cache_fp8, indices, scale):
    b, s_q, h_q, _ = q.shape
    topk = indices.shape[-1]
    seqlens = torch.full((b,), topk, dtype=torch.int32, device=q.device)
    sched, splits = module.get_mla_metadata(seqlens, s_q * h_q, 1, h_q, True, topk)
    extra = {"use_legacy": True} if flavour["use_legacy"] else {}
    if flavour["kv_format"]:
        extra["kv_format"] = "V32"
    return module.flash_mla_with_kvcache(
        q=q, k_cache=cache_fp8, block_table=torch.empty((b, 0), dtype=torch.int32,
                                                        device=q.device),
        cache_seqlens=seqlens, head_dim_v=D_V, tile_scheduler_metadata=sched,
        num_splits=splits, softmax_scale=scale, causal=False, is_fp8_kvcache=True,
        indices=indices, **extra)


# ---- cases --------------------------------------------------------------------------------------

def prefill_case(module, flavour, dev, h_q, s_q, s_kv, *, sink=False, topk_length=False,
                 invalid_frac=0.05, timing=True, iters=20) -> dict:
    from kernels_bridge import run_backend
    gen = torch.Generator(device=dev).manual_seed(1000 + h_q + s_q + s_kv)
    q = make_q((s_q, h_q), gen, dev)
    kv = make_kv(s_kv, gen, dev).view(s_kv, 1, D_QK)
    # invalid entries of every kind the prefill kernel masks: -1, other negatives, >= s_kv
    idx = pick_indices((s_q, 1, TOPK), s_kv, gen, dev, invalid_frac, lonely=2)
    idx[:, :, 1::97] = s_kv
    idx[:, :, 3::101] = -7
    idx[:, :, 5::103] = INT32_MAX
    idx[:, :, 7::107] = -INT32_MAX - 1
    attn_sink = (torch.randn(h_q, generator=gen, device=dev) if sink else None)
    lengths = (torch.randint(0, TOPK + 1, (s_q,), generator=gen, device=dev, dtype=torch.int32)
               if topk_length else None)
    scale = D_QK ** -0.5
    kwargs = dict(sm_scale=scale, attn_sink=attn_sink, topk_length=lengths)
    got = run_backend("flashmla_sparse", q, kv, idx, provider="flashmla", **kwargs)
    ref = run_backend("flashmla_sparse", q, kv, idx, provider="reference", **kwargs)
    checks = [check("prefill_out", got.out, ref.out),
              check("prefill_max_logits", got.max_logits, ref.max_logits),
              check("prefill_lse", got.lse, ref.lse)]
    result = {"backend": "flashmla_sparse", "h_q": h_q, "b": 1, "s_q": s_q, "s_kv": s_kv,
              "topk": TOPK, "attn_sink": sink, "topk_length": topk_length, "checks": checks,
              "passed": all(c["passed"] for c in checks)}
    if timing and not sink and not topk_length:
        warmup = _warmup(iters)
        bridge = median_us(lambda: run_backend("flashmla_sparse", q, kv, idx,
                                               provider="flashmla", sm_scale=scale),
                           iters, warmup, dev)
        direct = median_us(lambda: direct_prefill(module, flavour, q, kv, idx, scale),
                           iters, warmup, dev)
        result.update(_timing(bridge, direct, sparse_flops(1, s_q, h_q, TOPK)))
    return result


def decode_case(module, flavour, dev, h_q, b, s_q=1, *, sink=False, timing=True, iters=50,
                min_rows=65536) -> dict:
    from kernels_bridge import quantize_kv_fp8, run_backend
    from kernels_bridge.validate import check_decode
    gen = torch.Generator(device=dev).manual_seed(2000 + h_q + b + s_q)
    block = 64
    rows = max(min_rows, 4 * b * TOPK)
    cache = quantize_kv_fp8(make_kv(rows, gen, dev)).view(rows // block, block, 1, 656)
    q = make_q((b, s_q, h_q), gen, dev)
    idx = pick_indices((b, s_q, TOPK), rows, gen, dev, 0.05, lonely=1 if b * s_q > 1 else 0)
    used = torch.zeros(rows, dtype=torch.bool, device=dev)
    used[idx[idx >= 0].long()] = True
    cache.view(rows, 656)[~used] = 0xFF  # NaN codes and NaN scales in every unused row
    attn_sink = (torch.randn(h_q, generator=gen, device=dev) if sink else None)
    got = run_backend("flashmla_kv", q, cache, idx, provider="flashmla", attn_sink=attn_sink)
    ref = run_backend("flashmla_kv", q, cache, idx, provider="reference", attn_sink=attn_sink)
    checks = [check("decode_out", got.out, ref.out), check("decode_lse", got.lse, ref.lse)]
    result = {"backend": "flashmla_kv", "h_q": h_q, "b": b, "s_q": s_q, "topk": TOPK,
              "cache_rows": rows, "block_size": block, "attn_sink": sink, "checks": checks,
              "passed": all(c["passed"] for c in checks)}
    if timing and not sink:
        scale = D_QK ** -0.5
        cache_fp8 = cache.view(torch.float8_e4m3fn)
        warmup = _warmup(iters)
        bridge = median_us(lambda: run_backend("flashmla_kv", q, cache, idx,
                                               provider="flashmla"), iters, warmup, dev)
        direct = median_us(lambda: direct_decode(module, flavour, q, cache_fp8, idx, scale),
                           iters, warmup, dev)
        validation = median_us(lambda: check_decode(q, cache, idx), iters, warmup, dev)
        result.update(_timing(bridge, direct, sparse_flops(b, s_q, h_q, TOPK)))
        result["validation_us"] = validation
    return result


def _warmup(iters: int) -> int:
    return max(1, min(5, iters // 4))


def _timing(bridge_us: float, direct_us: float, flops: float) -> dict:
    return {"bridge_us": bridge_us, "direct_us": direct_us,
            "overhead_us": bridge_us - direct_us,
            "tflops_direct": flops / (direct_us * 1e-6) / 1e12,
            "tflops_bridge": flops / (bridge_us * 1e-6) / 1e12}


def fp8_parity(dev: torch.device) -> dict:
    """quantize_kv_fp8 on the device writes the same bytes as on the CPU."""
    from kernels_bridge import quantize_kv_fp8
    gen = torch.Generator().manual_seed(7)
    kv = (torch.randn(4096, D_QK, generator=gen) * torch.exp(torch.randn(D_QK, generator=gen)))
    kv = kv.to(torch.bfloat16)
    cpu = quantize_kv_fp8(kv)
    gpu = quantize_kv_fp8(kv.to(dev)).cpu()
    mismatched = int((cpu != gpu).any(dim=-1).sum())
    return {"name": "fp8_cpu_vs_gpu_bytes", "passed": mismatched == 0, "rows": kv.shape[0],
            "mismatched_rows": mismatched}


# ---- driver -------------------------------------------------------------------------------------

def skipped_summary(reason: str) -> dict:
    from kernels_bridge.doctor import doctor_report
    return {"skipped": True, "passed": None, "reason": reason, "doctor": doctor_report(),
            "published_tflops": PUBLISHED_TFLOPS}


def run(quick: bool = False, device=None, plan=None) -> dict:
    """Run the check; `device` defaults to the current CUDA device, `plan` to the full (or
    --quick) case list of (kind, args, kwargs)."""
    from kernels_bridge import flashmla_status
    from kernels_bridge.doctor import doctor_report
    if device is None and torch.cuda.is_available():
        device = torch.device("cuda", torch.cuda.current_device())
    status = flashmla_status(device)
    if not status["usable"]:
        return skipped_summary(status["reason"])
    import flash_mla
    dev = torch.device(device)
    flavour = status["flavour"]
    started = time.perf_counter()
    torch.backends.cuda.matmul.allow_tf32 = False  # the reference accumulates in true float32
    cases: List[dict] = []
    errors: List[dict] = []
    not_run: List[dict] = []
    for kind, args, kwargs in (plan if plan is not None else _plan(quick)):
        missing = [name for name, key in (("attn_sink", "sink"), ("topk_length", "topk_length"))
                   if kwargs.get(key) and not flavour[name]]
        if missing:  # an older flash_mla build without these arguments
            not_run.append({"case": [kind, list(args), kwargs],
                            "reason": f"this flash_mla build has no {', '.join(missing)}"})
            continue
        try:
            fn = prefill_case if kind == "prefill" else decode_case
            cases.append(fn(flash_mla, flavour, dev, *args, **kwargs))
        except Exception as exc:  # noqa: BLE001 - report every case, fail at the end
            errors.append({"case": [kind, list(args), kwargs],
                           "error": f"{type(exc).__name__}: {exc}"})
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    parity = _guarded(lambda: fp8_parity(dev), errors)
    passed = not errors and all(c["passed"] for c in cases) and bool(parity and parity["passed"])
    return {
        "skipped": False,
        "passed": passed,
        "runtime_s": round(time.perf_counter() - started, 1),
        "environment": doctor_report(),
        "tolerances": {k: list(v) for k, v in TOLERANCES.items()},
        "published_tflops": PUBLISHED_TFLOPS,
        "fp8_parity": parity,
        "cases": cases,
        "errors": errors,
        "not_run": not_run,
        "summary": _summarise(cases),
    }


def _plan(quick: bool):
    prefill = [("prefill", (128, 1024, 32768), {}), ("prefill", (64, 1024, 32768), {}),
               ("prefill", (128, 256, 8192), {"sink": True, "topk_length": True}),
               ("prefill", (64, 128, 1500), {"invalid_frac": 0.3})]
    decode = [("decode", (h, b), {}) for h in (128, 64) for b in (1, 16, 64, 128)]
    decode += [("decode", (128, 32, 2), {}), ("decode", (128, 16), {"sink": True}),
               ("decode", (64, 16), {"sink": True})]
    if quick:
        prefill = prefill[:1] + prefill[2:3]
        decode = [d for d in decode if d[1][1] in (16,)]
    return prefill + decode


def _guarded(fn, errors: list) -> Optional[dict]:
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001
        errors.append({"case": "fp8_parity", "error": f"{type(exc).__name__}: {exc}"})
        return None


def _summarise(cases: List[dict]) -> Dict[str, dict]:
    out = {}
    for backend in ("flashmla_sparse", "flashmla_kv"):
        timed = [c for c in cases if c["backend"] == backend and "bridge_us" in c]
        if not timed:
            continue
        out[backend] = {
            "median_overhead_us": statistics.median(c["overhead_us"] for c in timed),
            "max_tflops_direct": max(c["tflops_direct"] for c in timed),
            "max_tflops_bridge": max(c["tflops_bridge"] for c in timed),
            "cases_passed": sum(c["passed"] for c in cases if c["backend"] == backend),
            "cases": sum(1 for c in cases if c["backend"] == backend),
        }
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="also write the JSON summary here")
    parser.add_argument("--quick", action="store_true", help="fewer cases (about a minute)")
    args = parser.parse_args(argv)
    summary = run(quick=args.quick)
    text = json.dumps(summary, indent=2, default=str)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return 0 if summary["skipped"] or summary["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
