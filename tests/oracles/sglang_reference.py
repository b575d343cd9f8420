"""An independent, hand-written transcription of SGLang's DSA (NSA) backend routing, written from
the behaviour of sgl-project/sglang's server_args.py at PR #23013 as released in 0.5.12 (version 2:
the PR's routing, with 0.5.12's text for a non-DSA model) and at its parent (version 1). It is the oracle the policies are tested against. It shares no code with the engine.
"""
from __future__ import annotations

import itertools

DTYPES = ("auto", "bf16", "bfloat16", "fp8_e4m3", "fp8_e5m2", "fp4_e2m1")
BACKENDS = ("flashmla_sparse", "flashmla_kv", "flashmla_auto", "fa3", "tilelang", "aiter", "trtllm")
CHOICES = (None,) + BACKENDS

WARN_BACKEND_WITHOUT_DTYPE = (
    "When specifying --nsa-prefill-backend or --nsa-decode-backend, you should also explicitly set "
    "--kv-cache-dtype (e.g., 'fp8_e4m3' or 'bfloat16'). DeepSeek V3.2 defaults to FP8 KV cache "
    "which may not be compatible with all backends."
)


class ServerArgs:
    """The attributes of SGLang's ServerArgs that the routing reads and writes."""

    def __init__(self, dsa_model=True, enable_hisparse=False, kv_cache_dtype="auto", platform="cuda",
                 sm_major=9, disable_radix_cache=False, nsa_prefill_backend=None, nsa_decode_backend=None):
        self.dsa_model = dsa_model
        self.enable_hisparse = enable_hisparse
        self.kv_cache_dtype = kv_cache_dtype
        self.platform = platform
        self.sm_major = sm_major
        self.disable_radix_cache = disable_radix_cache
        self.nsa_prefill_backend = nsa_prefill_backend
        self.nsa_decode_backend = nsa_decode_backend
        self.logs: list[str] = []


def _set_default_nsa_backends(args: ServerArgs, kv_cache_dtype: str, major: int, version: int) -> None:
    user_set_prefill = args.nsa_prefill_backend is not None
    user_set_decode = args.nsa_decode_backend is not None

    if args.enable_hisparse:
        if version >= 2:
            default = "flashmla_kv" if kv_cache_dtype == "fp8_e4m3" else "flashmla_sparse"
        else:
            default = "flashmla_sparse"
        if not user_set_prefill:
            args.nsa_prefill_backend = default
        if not user_set_decode:
            args.nsa_decode_backend = default
        if version >= 2:
            args.logs.append(
                f"HiSparse enabled ({kv_cache_dtype}): using NSA backends "
                f"prefill={args.nsa_prefill_backend}, decode={args.nsa_decode_backend}."
            )
        else:
            args.logs.append(
                f"HiSparse enabled: using flashmla_sparse NSA backends "
                f"(prefill={args.nsa_prefill_backend}, decode={args.nsa_decode_backend})."
            )
        return

    if args.platform == "hip" and not user_set_prefill and not user_set_decode:
        prefill, decode = "tilelang", "tilelang"
    elif kv_cache_dtype == "fp8_e4m3" and major >= 10:
        prefill, decode = "trtllm", "trtllm"
    elif kv_cache_dtype == "fp8_e4m3":
        prefill, decode = "flashmla_kv", "flashmla_kv"
    elif major >= 10:
        prefill, decode = "flashmla_sparse", "trtllm"
    else:
        prefill, decode = "flashmla_sparse", "fa3"
    if not user_set_prefill:
        args.nsa_prefill_backend = prefill
    if not user_set_decode:
        args.nsa_decode_backend = decode
    args.logs.append(
        f"Set NSA backends for {kv_cache_dtype} KV Cache: "
        f"prefill={args.nsa_prefill_backend}, decode={args.nsa_decode_backend}."
    )


def _handle_dsa_model(args: ServerArgs, version: int) -> None:
    major = args.sm_major
    if (args.nsa_prefill_backend is not None or args.nsa_decode_backend is not None) and (
        args.kv_cache_dtype == "auto"
    ):
        args.logs.append(WARN_BACKEND_WITHOUT_DTYPE)
    if args.kv_cache_dtype == "auto":
        args.kv_cache_dtype = "fp8_e4m3" if major >= 10 else "bfloat16"
        args.logs.append(f"Setting KV cache dtype to {args.kv_cache_dtype} for DeepSeek DSA on SM{major} device.")
    if args.kv_cache_dtype == "bf16":
        args.kv_cache_dtype = "bfloat16"
    if args.kv_cache_dtype not in ("bfloat16", "fp8_e4m3"):
        raise ValueError("DeepSeek DSA only supports bf16/bfloat16 or fp8_e4m3 kv_cache_dtype")
    _set_default_nsa_backends(args, args.kv_cache_dtype, major, version)


def _check_hisparse(args: ServerArgs, version: int) -> None:
    if not args.dsa_model:
        if version >= 2:  # the release 0.5.12 (hisparse_hook.py:61-64), not the PR's merge commit
            raise ValueError(
                "--enable-hisparse is only supported for DSA (DeepSeek Sparse Attention) models "
                "(e.g., DeepSeek V3.2, GLM-5) and DeepSeek V4 now. "
            )
        raise ValueError(
            "--enable-hisparse is only supported for DSA (DeepSeek Sparse Attention) models now"
            "(e.g., DeepSeek V3.2, GLM-5). "
        )
    if not args.disable_radix_cache:
        raise ValueError("Hierarchical sparse attention currently requires --disable-radix-cache.")
    if version >= 2:
        if args.kv_cache_dtype not in ("bfloat16", "auto", "fp8_e4m3"):
            raise ValueError(
                f"HiSparse requires bfloat16 or fp8_e4m3 KV cache, "
                f"but got --kv-cache-dtype={args.kv_cache_dtype}. "
                f"Please use --kv-cache-dtype=bfloat16 or fp8_e4m3."
            )
        allowed = {"bfloat16": {"flashmla_sparse"}, "fp8_e4m3": {"flashmla_kv"}}.get(
            args.kv_cache_dtype, {"flashmla_sparse", "flashmla_kv"}
        )
        for attr, label in (("nsa_prefill_backend", "prefill"), ("nsa_decode_backend", "decode")):
            backend = getattr(args, attr)
            if backend is not None and backend not in allowed:
                raise ValueError(
                    f"HiSparse with --kv-cache-dtype={args.kv_cache_dtype} requires "
                    f"--nsa-{label}-backend in {sorted(allowed)}, but got {backend}."
                )
    else:
        for attr, label in (("nsa_prefill_backend", "prefill"), ("nsa_decode_backend", "decode")):
            backend = getattr(args, attr)
            if backend is not None and backend != "flashmla_sparse":
                raise ValueError(
                    f"HiSparse requires flashmla_sparse NSA {label} backend, but got "
                    f"--nsa-{label}-backend={backend}. Please use --nsa-{label}-backend=flashmla_sparse "
                    f"or omit it."
                )
        if args.kv_cache_dtype != "bfloat16":
            raise ValueError(
                f"HiSparse requires bfloat16 KV cache, but got --kv-cache-dtype={args.kv_cache_dtype}. "
                f"Please use --kv-cache-dtype=bfloat16."
            )


def route(version: int, **config) -> dict:
    """SGLang's two steps for one server config: {"error", "kv_cache_dtype", "prefill", "decode",
    "logs"}; error is the ValueError's message or None."""
    args = ServerArgs(**config)
    error = None
    try:
        if args.dsa_model:
            _handle_dsa_model(args, version)
        if args.enable_hisparse:
            _check_hisparse(args, version)
    except ValueError as exc:
        error = str(exc)
    return {"error": error, "kv_cache_dtype": args.kv_cache_dtype, "prefill": args.nsa_prefill_backend,
            "decode": args.nsa_decode_backend, "logs": args.logs}


def domain():
    """The 12,288 configs of the reference's input domain."""
    keys = ("dsa_model", "enable_hisparse", "kv_cache_dtype", "platform", "sm_major",
            "disable_radix_cache", "nsa_prefill_backend", "nsa_decode_backend")
    values = ((False, True), (False, True), DTYPES, ("cuda", "hip"), (9, 10), (False, True), CHOICES, CHOICES)
    for combo in itertools.product(*values):
        yield dict(zip(keys, combo))
