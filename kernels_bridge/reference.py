"""Reference sparse-attention kernels in torch, with FlashMLA's signatures and semantics.

They run wherever torch runs (CPU, or CUDA tensors without FlashMLA) and reproduce what FlashMLA's
`tests/ref.py` computes:
- gather the rows named by the valid indices; logits P = (q . k) * scale in float32 over all 576
  dims; invalid positions get -inf; lse = logsumexp(P) (natural log); max_logits = max(P) (after
  the scale); out = softmax(P) @ V, V being the first 512 dims of each row;
- attn_sink [h_q]: out *= 1 / (1 + exp(sink - lse)); lse and max_logits unchanged;
- a query with no valid index: out 0, lse +inf, max_logits -inf.

The work is vectorised over queries, heads and top-k (gather + batched matmul). Top-k is processed
in chunks merged with an online softmax, and queries in blocks, so scratch memory stays near
`WORKSPACE_BYTES` whatever the top-k and batch. Only gathered rows are read (and, for the FP8 cache,
dequantized), so rows no index names may hold anything, NaN included.
"""
from __future__ import annotations

import math
from typing import Callable, Optional, Tuple

import torch

from kernels_bridge.errors import ValidationError, shown
from kernels_bridge.fp8 import D_QK, FP8_ROW_BYTES, dequantize_kv_fp8_f32
from kernels_bridge.validate import D_V, check_decode, check_prefill

__all__ = ["sparse_prefill", "sparse_decode_fp8", "prefill_compute", "decode_compute",
           "DEFAULT_CHUNK", "WORKSPACE_BYTES"]

DEFAULT_CHUNK = 512              # top-k entries per online-softmax step
WORKSPACE_BYTES = 256 * 2 ** 20  # float32 scratch per query block, approximately

RowGather = Callable[[torch.Tensor], torch.Tensor]  # int64 [n] -> float32 [n, 576]


def sparse_prefill(q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor, sm_scale: float,
                   d_v: int = D_V, attn_sink: Optional[torch.Tensor] = None,
                   topk_length: Optional[torch.Tensor] = None, *, check_finite: bool = False,
                   chunk: int = DEFAULT_CHUNK) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sparse attention over a BF16 KV buffer, as `flash_mla_sparse_fwd`.

    q: bf16 [s_q, h_q, 576]; kv: bf16 [s_kv, 1, 576]; indices: int32 [s_q, 1, topk], an entry < 0 or
    >= s_kv is masked out; sm_scale: float (required); d_v: 512; attn_sink: f32 [h_q] or None;
    topk_length: int32 [s_q] or None (query i uses only its first topk_length[i] entries).
    Returns (out bf16 [s_q, h_q, 512], max_logits f32 [s_q, h_q], lse f32 [s_q, h_q]), natural log.
    Arguments are validated first (validate.check_prefill); ValidationError on a bad one.
    """
    check_prefill(q, kv, indices, sm_scale, d_v, attn_sink, topk_length,
                  check_finite=check_finite)
    return prefill_compute(q, kv, indices, sm_scale, attn_sink, topk_length, chunk=chunk)


def sparse_decode_fp8(q: torch.Tensor, k_cache: torch.Tensor, indices: torch.Tensor,
                      softmax_scale: Optional[float] = None,
                      attn_sink: Optional[torch.Tensor] = None, *, check_finite: bool = False,
                      chunk: int = DEFAULT_CHUNK) -> Tuple[torch.Tensor, torch.Tensor]:
    """Sparse attention over the paged FP8 cache, as `flash_mla_with_kvcache` in sparse FP8 mode.

    q: bf16 [b, s_q, h_q, 576]; k_cache: uint8/int8/float8_e4m3fn [num_blocks, block_size, 1, 656];
    indices: int32 [b, s_q, topk], flat rows (block * block_size + offset), -1 = unused;
    softmax_scale: float or None (1/sqrt(576)); attn_sink: f32 [h_q] or None.
    Returns (out bf16 [b, s_q, h_q, 512], lse f32 [b, h_q, s_q]): lse is a transposed view of a
    [b, s_q, h_q] tensor, as FlashMLA returns it; natural log.
    Arguments are validated first (validate.check_decode); an index other than -1 outside the
    cache is a ValidationError, since FlashMLA would read it.
    """
    check_decode(q, k_cache, indices, softmax_scale, attn_sink, check_finite=check_finite)
    return decode_compute(q, k_cache, indices, softmax_scale, attn_sink, chunk=chunk)


def prefill_compute(q, kv, indices, sm_scale, attn_sink=None, topk_length=None, *,
                    chunk: int = DEFAULT_CHUNK):
    """`sparse_prefill` without validation: arguments already passed check_prefill."""
    topk = indices.shape[2]
    idx = indices[:, 0, :]
    valid = (idx >= 0) & (idx < kv.shape[0])
    if topk_length is not None:
        positions = torch.arange(topk, device=idx.device)
        valid &= positions.unsqueeze(0) < topk_length.unsqueeze(1).to(positions.dtype)
    rows = kv[:, 0, :]
    return _sparse_attention(q, idx, valid, lambda flat: rows.index_select(0, flat).float(),
                             float(sm_scale), attn_sink, chunk)


def decode_compute(q, k_cache, indices, softmax_scale=None, attn_sink=None, *,
                   chunk: int = DEFAULT_CHUNK):
    """`sparse_decode_fp8` without validation: arguments already passed check_decode."""
    b, s_q, h_q, d_qk = q.shape
    topk = indices.shape[2]
    scale = d_qk ** -0.5 if softmax_scale is None else float(softmax_scale)
    cache = k_cache.view(torch.uint8)  # [num_blocks, block_size, 1, 656]
    block_size = cache.shape[1]
    flat_rows = cache.view(-1, FP8_ROW_BYTES) if cache.is_contiguous() else None

    def gather(flat: torch.Tensor) -> torch.Tensor:
        # Only the picked rows are read and dequantized. A padded block stride is addressed as
        # (block, offset), so it never forces a copy of the cache.
        if flat_rows is not None:
            picked = flat_rows.index_select(0, flat)
        else:
            picked = cache[flat // block_size, flat % block_size, 0]
        return dequantize_kv_fp8_f32(picked)

    idx = indices.reshape(b * s_q, topk)
    out, _, lse = _sparse_attention(q.reshape(b * s_q, h_q, d_qk), idx, idx != -1, gather,
                                    scale, attn_sink, chunk)
    return out.view(b, s_q, h_q, D_V), lse.view(b, s_q, h_q).transpose(1, 2)


def _sparse_attention(q: torch.Tensor, idx: torch.Tensor, valid: torch.Tensor,
                      gather: RowGather, scale: float, attn_sink: Optional[torch.Tensor],
                      chunk: int):
    """The shared kernel.

    q: bf16 [n, h, 576]; idx: int [n, topk]; valid: bool [n, topk];
    gather: int64 [m] -> f32 [m, 576].
    Returns (out bf16 [n, h, 512], max_logits f32 [n, h], lse f32 [n, h]).
    """
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
        raise ValidationError(f"chunk: expected a positive int; got {shown(chunk)}", argument="chunk")
    n, h, _ = q.shape
    topk = idx.shape[1]
    chunk = min(chunk, max(topk, 1))
    out = torch.empty(n, h, D_V, dtype=torch.bfloat16, device=q.device)
    max_logits = torch.empty(n, h, dtype=torch.float32, device=q.device)
    lse = torch.empty(n, h, dtype=torch.float32, device=q.device)
    block = _query_block(h, chunk)
    for lo in range(0, n, block):
        hi = min(n, lo + block)
        o, m, l_ = _attend_block(q[lo:hi], idx[lo:hi], valid[lo:hi], gather, scale, chunk)
        out[lo:hi], max_logits[lo:hi], lse[lo:hi] = _finish(o, m, l_, attn_sink)
    return out, max_logits, lse


def _query_block(h: int, chunk: int) -> int:
    """Queries per block so that one block's float32 scratch stays near WORKSPACE_BYTES."""
    per_query = 4 * (chunk * D_QK + 2 * h * chunk + h * (D_QK + 2 * D_V))
    return max(1, WORKSPACE_BYTES // per_query)


def _attend_block(q, idx, valid, gather, scale, chunk):
    """Online softmax over top-k chunks for one block of queries.

    q: bf16 [n, h, 576]; idx: int [n, topk]; valid: bool [n, topk].
    Returns (acc f32 [n, h, 512] unnormalised, running max f32 [n, h], running sum f32 [n, h]).
    """
    n, h, d = q.shape
    qf = q.float()
    run_max = torch.full((n, h), -math.inf, dtype=torch.float32, device=q.device)
    run_sum = torch.zeros(n, h, dtype=torch.float32, device=q.device)
    acc = torch.zeros(n, h, D_V, dtype=torch.float32, device=q.device)
    for lo in range(0, idx.shape[1], chunk):
        ok = valid[:, lo:lo + chunk]
        if not bool(ok.any()):
            continue
        every = bool(ok.all())
        flat = (idx[:, lo:lo + chunk] if every else torch.where(ok, idx[:, lo:lo + chunk], 0)).long().reshape(-1)
        rows = gather(flat).view(n, -1, d)
        if not every:  # masked slots read row 0; zero them so a NaN there cannot leak via 0 * NaN
            rows.masked_fill_(~ok.unsqueeze(-1), 0.0)
        logits = torch.bmm(qf, rows.transpose(1, 2)).mul_(scale)         # [n, h, c]
        if not every:
            logits.masked_fill_(~ok.unsqueeze(1), -math.inf)
        new_max = torch.maximum(run_max, logits.amax(dim=-1))
        # A row with nothing valid yet keeps max -inf; subtract 0 there to avoid -inf - -inf.
        base = torch.where(new_max == -math.inf, 0.0, new_max)
        probs = logits.sub_(base.unsqueeze(-1)).exp_()  # in place: one [n, h, c] buffer per chunk
        rescale = torch.exp(run_max - base)
        run_sum = run_sum * rescale + probs.sum(dim=-1)
        acc = acc * rescale.unsqueeze(-1) + torch.bmm(probs, rows[..., :D_V])
        run_max = new_max
    return acc, run_max, run_sum


def _finish(acc, run_max, run_sum, attn_sink):
    """Normalise one block and apply FlashMLA's conventions.

    Returns (out bf16 [n, h, 512], max_logits f32 [n, h], lse f32 [n, h]).
    """
    lonely = run_max == -math.inf                  # no valid index for this query
    safe_sum = torch.where(lonely, 1.0, run_sum)
    lse = torch.where(lonely, math.inf, run_max + torch.log(safe_sum))
    out = acc / safe_sum.unsqueeze(-1)
    if attn_sink is not None:
        out = out * torch.sigmoid(lse - attn_sink.to(lse.device)).unsqueeze(-1)
    out = torch.where(lonely.unsqueeze(-1), 0.0, out)
    return out.to(torch.bfloat16), run_max, lse
