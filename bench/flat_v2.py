"""The decision-cost baseline: dsa-backends@2 written by hand as one flat if/else, producing the
same outputs as `Policy.evaluate` (ok, resolved dtype, backends, every violation's message in
order, log lines), with none of a policy's generality (no input checks, no sources, no Decision
object). bench/test_bench.py checks that it equals the policy on the whole v2 domain."""
from __future__ import annotations

WARN_BACKEND_WITHOUT_DTYPE = (
    "When specifying --nsa-prefill-backend or --nsa-decode-backend, you should also explicitly set "
    "--kv-cache-dtype (e.g., 'fp8_e4m3' or 'bfloat16'). DeepSeek V3.2 defaults to FP8 KV cache "
    "which may not be compatible with all backends.")
DSA_DTYPE = "DeepSeek DSA only supports bf16/bfloat16 or fp8_e4m3 kv_cache_dtype"
NOT_DSA = ("--enable-hisparse is only supported for DSA (DeepSeek Sparse Attention) models "
           "(e.g., DeepSeek V3.2, GLM-5) and DeepSeek V4 now. ")
RADIX = "Hierarchical sparse attention currently requires --disable-radix-cache."
ALLOWED = {"bfloat16": ("flashmla_sparse",), "fp8_e4m3": ("flashmla_kv",)}
EITHER = ("flashmla_kv", "flashmla_sparse")


def decide(cfg: dict) -> tuple:
    """(ok, kv_cache_dtype, prefill, decode, messages, log) for a config of v2's inputs."""
    get = cfg.get
    dsa = get("dsa_model", True)
    hisparse = get("enable_hisparse", False)
    dtype = get("kv_cache_dtype", "auto")
    sm = get("sm_major", 9)
    prefill = get("nsa_prefill_backend")
    decode = get("nsa_decode_backend")
    log = []
    if dsa:
        if dtype == "auto":
            if prefill is not None or decode is not None:
                log.append(WARN_BACKEND_WITHOUT_DTYPE)
            dtype = "fp8_e4m3" if sm >= 10 else "bfloat16"
            log.append(f"Setting KV cache dtype to {dtype} for DeepSeek DSA on SM{sm} device.")
        elif dtype == "bf16":
            dtype = "bfloat16"
        if dtype != "bfloat16" and dtype != "fp8_e4m3":
            return False, dtype, prefill, decode, (DSA_DTYPE,), tuple(log)
        if hisparse:
            p = d = "flashmla_kv" if dtype == "fp8_e4m3" else "flashmla_sparse"
            head, mid = "HiSparse enabled (", "): using NSA backends prefill="
        else:
            head, mid = "Set NSA backends for ", " KV Cache: prefill="
            if get("platform", "cuda") == "hip" and prefill is None and decode is None:
                p = d = "tilelang"
            elif dtype == "fp8_e4m3":
                p = d = "trtllm" if sm >= 10 else "flashmla_kv"
            elif sm >= 10:
                p, d = "flashmla_sparse", "trtllm"
            else:
                p, d = "flashmla_sparse", "fa3"
        if prefill is None:
            prefill = p
        if decode is None:
            decode = d
        log.append(f"{head}{dtype}{mid}{prefill}, decode={decode}.")
    messages = []
    if hisparse:
        if not dsa:
            messages.append(NOT_DSA)
        if not get("disable_radix_cache", False):
            messages.append(RADIX)
        if dtype != "bfloat16" and dtype != "auto" and dtype != "fp8_e4m3":
            messages.append(f"HiSparse requires bfloat16 or fp8_e4m3 KV cache, but got --kv-cache-dtype={dtype}. "
                            "Please use --kv-cache-dtype=bfloat16 or fp8_e4m3.")
        allowed = ALLOWED.get(dtype, EITHER)
        for phase, backend in (("prefill", prefill), ("decode", decode)):
            if backend is not None and backend not in allowed:
                messages.append(f"HiSparse with --kv-cache-dtype={dtype} requires --nsa-{phase}-backend in "
                                f"{list(allowed)}, but got {backend}.")
    return not messages, dtype, prefill, decode, tuple(messages), tuple(log)
