"""FP8 decode against BF16 on realistic inputs: the figures of the FP8 vs BF16 table in docs/bridge.md,
which bench/accuracy_bench.py measures and tests/test_reference.py bounds (one definition for
both). They depend only on the seeds."""
from __future__ import annotations

import torch

from kernels_bridge.fp8 import quantize_kv_fp8
from kernels_bridge.model_config import V32_SOFTMAX_SCALE as V32_SCALE  # SGLang's layer.scaling
from kernels_bridge.reference import sparse_decode_fp8, sparse_prefill


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _kv(rows, seed):
    """bf16 [rows, 576]: randn with per-channel magnitudes exp(N(0, 0.5)), like real latent KV."""
    g = _gen(seed)
    channel = torch.exp(torch.randn(576, generator=g) * 0.5)
    return (torch.randn(rows, 576, generator=g) * channel).to(torch.bfloat16)


def _indices(b, topk, rows, seed):
    """int32 [b, 1, topk] of rows, a tenth -1, the last four repeating the first four."""
    g = _gen(seed)
    idx = torch.randint(0, rows, (b, 1, topk), generator=g)
    idx[torch.rand(b, 1, topk, generator=g) < 0.1] = -1
    idx[..., -4:] = idx[..., :4]
    return idx.to(torch.int32)


def fp8_vs_bf16_figures(q_scale, seed=0, b=4, h_q=128, topk=2048, rows=8192, scale_mode="sglang"):
    """Decode over the FP8 cache vs prefill over the same BF16 rows, same picked tokens.

    kv: randn with per-channel magnitudes exp(N(0, 0.5)), FP8 rows with `scale_mode`'s scales
    (SGLang's raw amax/448 by default, as its server writes them); q: randn * q_scale;
    DeepSeek-V3.2's softmax scale, as SGLang computes it. Returns a dict: logit_std (of the BF16
    logits: how peaked attention is), cosine similarity of the outputs, max |err| / max |ref|,
    max |lse difference|.
    """
    kv = _kv(rows, seed)
    q = (torch.randn(b, 1, h_q, 576, generator=_gen(seed + 1)) * q_scale).to(torch.bfloat16)
    idx = _indices(b, topk, rows, seed + 2)
    cache = quantize_kv_fp8(kv, scale_mode=scale_mode).view(rows // 64, 64, 1, 656)
    fp8_out, fp8_lse = sparse_decode_fp8(q, cache, idx, softmax_scale=V32_SCALE)
    bf16_out, _, bf16_lse = sparse_prefill(q.view(b, h_q, 576), kv.view(rows, 1, 576),
                                           idx.view(b, 1, topk), V32_SCALE)
    logits = torch.einsum("bhd,bkd->bhk", q.view(b, h_q, 576).float(),
                          kv[idx.view(b, topk).long()].float()) * V32_SCALE
    a, r = fp8_out.view(b, h_q, 512).double(), bf16_out.double()
    return {
        "logit_std": float(logits.std()),
        "cosine": float((a * r).sum() / (a.norm() * r.norm())),
        "max_err_over_peak": float((a - r).abs().max()) / float(r.abs().max()),
        "max_lse_diff": float((fp8_lse.view(b, h_q) - bf16_lse).abs().max()),
    }
