"""Backend name -> kernel: validate, pick a provider, run.

Backends are SGLang's NSA attention backend names the bridge can run:
- `flashmla_sparse`: sparse attention over a BF16 KV buffer (`flash_mla_sparse_fwd`);
- `flashmla_kv`: sparse attention over the paged FP8 656-byte cache (`flash_mla_with_kvcache`).
Providers: `flashmla` (the GPU kernels), `reference` (the torch reference kernels, any device) and
`auto` (FlashMLA when it can run these tensors, else the reference).
"""
from __future__ import annotations

import difflib
from typing import NamedTuple, Optional, Tuple

import torch

from kernels_bridge import flashmla; from kernels_bridge import reference
from kernels_bridge.errors import RoutingRejected, ValidationError, describe, shown
from kernels_bridge.resources import format_bytes, memory_budget
from kernels_bridge.fp8 import D_QK, FP8_ROW_BYTES, PACKED_DTYPES
from kernels_bridge.validate import D_V, check_d_v, check_decode, check_prefill

__all__ = ["BACKENDS", "PROVIDERS", "AttentionResult", "attend", "cache_dtype_of", "run_backend",
           "select_provider"]

from kernels_bridge.backends import BACKENDS  # noqa: E402  (torch-free, for the CLI)

PROVIDERS = ("auto", "reference", "flashmla")


class AttentionResult(NamedTuple):
    """What a backend returns, in FlashMLA's conventions (natural-log statistics).

    flashmla_sparse: out bf16 [s_q, h_q, 512], lse f32 [s_q, h_q], max_logits f32 [s_q, h_q].
    flashmla_kv: out bf16 [b, s_q, h_q, 512], lse f32 [b, h_q, s_q], max_logits None.
    provider: "flashmla" or "reference", whichever ran.
    """
    out: torch.Tensor
    lse: torch.Tensor
    max_logits: Optional[torch.Tensor]
    provider: str


def run_backend(backend: str, q: torch.Tensor, kv_cache: torch.Tensor, indices: torch.Tensor, *,
                sm_scale: Optional[float] = None, softmax_scale: Optional[float] = None,
                attn_sink: Optional[torch.Tensor] = None,
                topk_length: Optional[torch.Tensor] = None, provider: str = "auto",
                d_v: int = D_V, check_finite: bool = False,
                seq_lens: Optional[torch.Tensor] = None) -> AttentionResult:
    """Run one attention backend on validated arguments.

    flashmla_sparse: q bf16 [s_q, h_q, 576], kv_cache bf16 [s_kv, 1, 576], indices int32
      [s_q, 1, topk]; sm_scale required; topk_length int32 [s_q] optional.
    flashmla_kv: q bf16 [b, s_q, h_q, 576], kv_cache uint8/int8/float8_e4m3fn
      [num_blocks, block_size, 1, 656], indices int32 [b, s_q, topk] flat rows or -1;
      softmax_scale optional (1/sqrt(576); SGLang passes the model's, see `model_config`); no
      topk_length (FlashMLA's V3.2 decode has none); seq_lens int [b] optional, each request's
      length: FlashMLA's scheduling metadata is built from min(seq_len, topk), as SGLang builds it
      (default topk; the reference ignores it).
    Both: attn_sink f32 [h_q] optional; d_v 512; check_finite=True rejects NaN/inf in q.
    provider: "auto" | "reference" | "flashmla" (ProviderUnavailable with the reason when
    FlashMLA cannot run these tensors).
    Every check runs before any kernel; a bad argument raises ValidationError.
    """
    _check_choice("backend", backend, BACKENDS, "the bridge provides")
    _check_choice("provider", provider, PROVIDERS, "providers are")
    if backend == "flashmla_sparse":
        if seq_lens is not None:
            raise ValidationError("seq_lens: flashmla_sparse takes no seq_lens (its scheduling has no "
                                  f"metadata); got {describe(seq_lens)}", argument="seq_lens")
        return _run_sparse(q, kv_cache, indices, sm_scale, softmax_scale, attn_sink,
                           topk_length, provider, d_v, check_finite)
    return _run_kv(q, kv_cache, indices, sm_scale, softmax_scale, attn_sink, topk_length,
                   provider, d_v, check_finite, seq_lens)


def select_provider(backend: str, device: Optional[torch.device], provider: str = "auto", *,
                    attn_sink: bool = False, topk_length: bool = False, h_q: Optional[int] = None,
                    block_size: Optional[int] = None) -> Tuple[str, str]:
    """Which provider runs `backend` on `device` (None: the default CUDA device), and why.

    Returns ("flashmla" | "reference", reason: every reason FlashMLA cannot run, joined by "; ").
    provider="flashmla" raises ProviderUnavailable (its `reasons` list them) when FlashMLA cannot
    run; provider="reference" always gives the reference.
    """
    _check_choice("backend", backend, BACKENDS, "the bridge provides")
    _check_choice("provider", provider, PROVIDERS, "providers are")
    if provider == "reference":
        return "reference", "provider='reference' was requested"
    reasons = flashmla.unusable_reasons(device, backend=backend, attn_sink=attn_sink,
                                        topk_length=topk_length, h_q=h_q, block_size=block_size)
    if not reasons:
        return "flashmla", "flash_mla imports and supports this device and these arguments"
    if provider == "flashmla":
        raise flashmla.cannot_run(backend, reasons, device)
    return "reference", "; ".join(reasons)


def _run_sparse(q, kv, indices, sm_scale, softmax_scale, attn_sink, topk_length, provider, d_v,
                check_finite) -> AttentionResult:
    if softmax_scale is not None:
        raise ValidationError("softmax_scale: flashmla_sparse takes its scale as sm_scale; got "
                              f"softmax_scale={shown(softmax_scale)}", argument="softmax_scale")
    if sm_scale is None:
        raise ValidationError("sm_scale: flashmla_sparse requires sm_scale (a finite real "
                              "number; SGLang passes the layer's scaling); got None",
                              argument="sm_scale")
    shape = check_prefill(q, kv, indices, sm_scale, d_v, attn_sink, topk_length,
                          check_finite=check_finite)
    chosen, _ = select_provider("flashmla_sparse", q.device, provider,
                                attn_sink=attn_sink is not None,
                                topk_length=topk_length is not None, h_q=shape.h_q)
    if shape.empty:  # no query: empty outputs, no kernel of any provider
        stats = q.new_empty(0, shape.h_q, dtype=torch.float32)
        return AttentionResult(q.new_empty(0, shape.h_q, D_V), stats, stats.clone(), chosen)
    _check_output_memory(q, shape.s_q, shape.h_q)
    if chosen == "flashmla":
        out, max_logits, lse = flashmla.prefill_call(q, kv, indices, sm_scale, attn_sink,
                                                     topk_length)
    else:
        out, max_logits, lse = reference.prefill_compute(q, kv, indices, sm_scale, attn_sink,
                                                         topk_length)
    return AttentionResult(out, lse, max_logits, chosen)


def _run_kv(q, k_cache, indices, sm_scale, softmax_scale, attn_sink, topk_length, provider, d_v,
            check_finite, seq_lens=None) -> AttentionResult:
    if sm_scale is not None:
        raise ValidationError("sm_scale: flashmla_kv takes its scale as softmax_scale "
                              f"(default 1/sqrt(576)); got sm_scale={shown(sm_scale)}",
                              argument="sm_scale")
    if topk_length is not None:
        raise ValidationError(
            "topk_length: flashmla_kv does not take topk_length (FlashMLA's V3.2 FP8 decode "
            f"kernel has no dynamic top-k length); mark unused slots with -1; got "
            f"{describe(topk_length)}", argument="topk_length")
    check_d_v(d_v)
    shape = check_decode(q, k_cache, indices, softmax_scale, attn_sink, check_finite=check_finite,
                         seq_lens=seq_lens)
    chosen, _ = select_provider("flashmla_kv", q.device, provider,
                                attn_sink=attn_sink is not None, h_q=shape.h_q,
                                block_size=shape.block_size)
    if shape.empty:  # no request or no query: empty outputs, no kernel of any provider
        b, s_q, h_q = shape.b, shape.s_q, shape.h_q
        return AttentionResult(q.new_empty(b, s_q, h_q, D_V),
                               q.new_empty(b, s_q, h_q, dtype=torch.float32).transpose(1, 2), None, chosen)
    _check_output_memory(q, shape.b * shape.s_q, shape.h_q)
    if chosen == "flashmla":
        out, lse = flashmla.decode_call(q, k_cache, indices, softmax_scale, attn_sink, seq_lens)
    else:
        out, lse = reference.decode_compute(q, k_cache, indices, softmax_scale, attn_sink)
    return AttentionResult(out, lse, None, chosen)


def _check_output_memory(q: torch.Tensor, queries: int, h_q: int) -> None:
    """Refuse, before any kernel, a call whose outputs alone (BF16 [queries, h_q, 512] and the f32
    statistics) would not fit in the memory budget of q's device: a q expanded to a million
    queries costs nothing, its output 131 GB."""
    need = queries * h_q * (D_V * 2 + 2 * 4)
    limit, source = memory_budget(q.device)
    if need > limit:
        raise ValidationError(f"q: {queries} queries x {h_q} heads need {format_bytes(need)} of outputs on "
                              f"{q.device}; the limit is {format_bytes(limit)} ({source}); split the call",
                              argument="q")


def _check_choice(what: str, value, choices, phrase: str) -> None:
    if isinstance(value, str) and value in choices:
        return
    hint = ""
    if isinstance(value, str):
        close = difflib.get_close_matches(value, choices, n=1, cutoff=0.6)
        if close:
            hint = f"; did you mean {close[0]!r}?"
    raise ValidationError(f"{what}: unknown {what} {shown(value)}; {phrase} "
                          f"{', '.join(repr(c) for c in choices)}{hint}", argument=what)


# -- by the policy's decision -------------------------------------------------------------------
def cache_dtype_of(kv_cache: torch.Tensor) -> Optional[str]:
    """The KV cache dtype a tensor's rows hold: "fp8_e4m3" for 656-byte FP8 rows, "bfloat16" for
    576-wide BF16 rows, None for anything else (validation then names what is wrong)."""
    if not isinstance(kv_cache, torch.Tensor) or kv_cache.dim() == 0:
        return None
    last = kv_cache.shape[-1]
    if kv_cache.dtype in PACKED_DTYPES and last == FP8_ROW_BYTES:
        return "fp8_e4m3"
    if kv_cache.dtype == torch.bfloat16 and last == D_QK:
        return "bfloat16"
    return None


def attend(decision_or_config, q: torch.Tensor, kv_cache: torch.Tensor, indices: torch.Tensor, *,
           phase: str = "decode", policy=None, **kwargs) -> AttentionResult:
    """Run the backend the routing policy chose for `phase`.

    `decision_or_config` is an engine Decision, or a config mapping evaluated with `policy`
    (default: the shipped default policy). A config that does not say `kv_cache_dtype` takes it
    from the cache's rows (656-byte FP8 rows -> fp8_e4m3, BF16 rows -> bfloat16), so the policy
    sees the pairing that would really run: BF16 rows with flashmla_kv under HiSparse fail here,
    with the policy's message, before any work. Other keyword arguments go to run_backend.

    Raises RoutingRejected (the policy rejects the config; `.decision` has every violation),
    ValidationError (a bad config, with the engine's problems in `.problems`; the rows disagree
    with the decided dtype; a phase the policy does not have; a backend the bridge cannot run; a
    bad tensor), all before any work. A policy that cannot be loaded raises engine.PolicyError."""
    import engine

    for name, value in (("q", q), ("kv_cache", kv_cache)):
        if not isinstance(value, torch.Tensor):
            raise ValidationError(f"{name}: expected a torch.Tensor; got {describe(value)}", argument=name)
    if isinstance(decision_or_config, engine.Decision):
        decision = decision_or_config
    else:
        pol = engine.load_policy(policy if policy is not None else _default_policy())
        try:
            config = pol.normalize(decision_or_config)
        except engine.ConfigError as exc:
            error = ValidationError(f"config: {exc}", argument="config")
            error.problems = exc.problems
            raise error from None
        rows = cache_dtype_of(kv_cache)
        if "kv_cache_dtype" in pol.inputs and "kv_cache_dtype" not in config and rows is not None:
            config["kv_cache_dtype"] = rows
        decision = pol.evaluate(config)
    if not decision.ok:
        raise RoutingRejected(decision.error, decision)
    backends = decision.backends
    if phase not in backends:
        raise ValidationError(f"phase: the policy has no phase {shown(phase)}; its phases are "
                              f"{', '.join(repr(p) for p in backends)}", argument="phase")
    backend = backends[phase]
    if backend is None:
        raise RoutingRejected(f"the policy chose no {phase} backend for this config (sources: "
                              f"{decision.sources}); is it a DSA model?", decision)
    if backend not in BACKENDS:
        raise ValidationError(f"backend: the policy chose {shown(backend)} for {phase}; the bridge runs "
                              f"{', '.join(repr(b) for b in BACKENDS)}", argument="backend")
    decided = decision.config.get("kv_cache_dtype")
    rows = cache_dtype_of(kv_cache)
    if decided is not None and rows is not None and decided != rows:
        raise ValidationError(f"kv_cache: holds {rows} rows ({describe(kv_cache)}) but the policy decided "
                              f"for a {decided} KV cache", argument="kv_cache")
    return run_backend(backend, q, kv_cache, indices, **kwargs)


def _default_policy() -> str:
    from engine.files.shipped import default_policy_ref

    return default_policy_ref()
