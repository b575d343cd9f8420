"""A stand-in `flash_mla` module for testing the adapter without a GPU.

It reproduces the three public API flavours the adapter must handle, with their exact Python
signatures, enforces the argument checks FlashMLA's interface and C++ entry points make (dtypes,
shapes, int32, strides, `use_legacy`, top-k multiples, scheduler metadata), treats an out-of-range
decode index as the out-of-bounds read it would be, and computes with the bridge's reference in the
flavour's own conventions (base-2 statistics for the 2025 builds). Every call is recorded in
`module.calls` so tests can check the call sequence.

    mod = install(monkeypatch, "sgl-use-legacy")   # in sys.modules, device probe faked as SM90
"""
from __future__ import annotations

import dataclasses
import inspect
import math
import sys
import types
from typing import Optional

import torch

from kernels_bridge import flashmla, reference

FLAVOURS = ("sgl-use-legacy", "upstream-natural-lse", "upstream-log2-lse")
LOG2E = 1.0 / math.log(2.0)
PACKED = (torch.float8_e4m3fn, torch.int8, torch.uint8)


class KernelError(RuntimeError):
    """What TORCH_CHECK raises inside flash_mla."""


class OutOfBoundsRead(RuntimeError):
    """The kernel would read outside the cache (an illegal memory access on a GPU)."""


@dataclasses.dataclass
class SchedMeta:
    """FlashMLASchedMeta: empty until the first decode call fills it."""
    have_initialized: bool = False
    config: Optional[tuple] = None


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise KernelError(msg)


def _last_dim_contiguous(name: str, t: torch.Tensor) -> None:
    _check(t.size(-1) == 1 or t.stride(-1) == 1, f"{name} must have contiguous last dimension")


def _check_sink(attn_sink, h_q):
    if attn_sink is not None:
        _check(attn_sink.dtype == torch.float32, "attn_sink must be float32")
        _check(tuple(attn_sink.shape) == (h_q,), "attn_sink must be [h_q]")
        _check(attn_sink.is_contiguous(), "attn_sink must be contiguous")


def _check_prefill(mod, q, kv, indices, sm_scale, d_v, attn_sink, topk_length, legacy: bool):
    _check(isinstance(sm_scale, float), "sm_scale must be a float")
    _check(q.dim() == 3 and kv.dim() == 3 and indices.dim() == 3, "q, kv, indices must be 3-D")
    s_q, h_q, d_qk = q.shape
    s_kv, h_kv, _ = kv.shape
    topk = indices.shape[2]
    _check(s_q > 0, "the fake refuses an empty launch: the bridge must not issue one")
    _check(d_qk in (576, 512), f"Invalid d_qk: {d_qk}")
    if mod.flavour == "sgl-use-legacy" and not legacy:
        _check(d_qk == 512, "the current kernels take V4.1 (d_qk 512) only; 576 needs "
                            "use_legacy=True")
    _check(d_v == 512, f"Invalid d_v{d_v}")
    _check(q.dtype == torch.bfloat16 and kv.dtype == torch.bfloat16, "q, kv must be bfloat16")
    _check(indices.dtype == torch.int32, "indices must be int32")
    _check(h_q in (64, 128), f"Unsupported h_q: {h_q}")
    _check(h_kv == 1 and tuple(kv.shape) == (s_kv, 1, d_qk), "kv must be [s_kv, 1, d_qk]")
    _check(tuple(indices.shape) == (s_q, 1, topk), "indices must be [s_q, h_kv, topk]")
    _check(topk > 0 and topk % 128 == 0, f"topk ({topk}) mod B_TOPK (128) must be 0")
    for name, t in (("q", q), ("kv", kv), ("indices", indices)):
        _last_dim_contiguous(name, t)
        _check(t.device == q.device, f"{name} on another device")
    _check_sink(attn_sink, h_q)
    if topk_length is not None:
        _check(topk_length.dtype == torch.int32 and tuple(topk_length.shape) == (s_q,),
               "topk_length must be int32 [s_q]")
    return s_q, h_q


def _check_decode(mod, q, k_cache, block_table, cache_seqlens, head_dim_v, sched, num_splits,
                  causal, is_fp8_kvcache, indices, attn_sink, topk_length, legacy, kv_format):
    _check(indices is not None, "the fake serves sparse decoding only")
    _check(not causal, "causal must be False when sparse attention is enabled")
    _check(is_fp8_kvcache, "is_fp8_kvcache must be True")
    _check(q.dim() == 4 and k_cache.dim() == 4 and indices.dim() == 3, "bad ranks")
    b, s_q, h_q, d_qk = q.shape
    num_blocks, block_size, h_kv, row = k_cache.shape
    topk = indices.shape[-1]
    _check(b > 0 and s_q > 0, "Expected batch_size > 0")
    _check(q.dtype == torch.bfloat16, "q must be bfloat16")
    _check(k_cache.dtype in PACKED, "key must have dtype fp8_e4m3fn, int8 or uint8")
    _check(indices.dtype == torch.int32, "indices must be int32")
    _check(d_qk == 576 and row == 656, "V3.2 layout expected: d_qk 576, 656-byte rows")
    if mod.flavour == "sgl-use-legacy":
        _check(legacy, "the current kernels take V4.1 formats only; V3.2 needs use_legacy=True")
        _check(kv_format in (None, "V32"), f"Expected model_type == *kv_format_hint ({kv_format})")
    _check(h_q in (64, 128), f"Unsupported h_q: {h_q}")
    _check(h_kv == 1, "Currently only MQA (i.e. h_kv == 1) is supported")
    _check(head_dim_v == 512, "Only head_size_v == 512 is supported")
    _check(topk > 0 and topk % 64 == 0, f"topk ({topk}) mod B_TOPK (64) must be 0")
    _check(tuple(indices.shape) == (b, s_q, topk), "indices must be [b, s_q, topk]")
    _check(k_cache.stride(1) == 656 or block_size == 1,
           "The whole block must be contiguous when is_fp8_cache is True for kv cache")
    for name, t in (("q", q), ("k_cache", k_cache), ("indices", indices)):
        _last_dim_contiguous(name, t)
        _check(t.device == q.device, f"{name} on another device")
    _check(indices.stride(0) % 8 == 0 or b == 1, "indices.stride(0) must be 32B aligned")
    _check(block_table is not None and block_table.dtype == torch.int32
           and block_table.dim() == 2 and block_table.shape[0] == b,
           "block_table must be int32 [b, *]")
    _check(cache_seqlens is not None and cache_seqlens.dtype == torch.int32
           and tuple(cache_seqlens.shape) == (b,), "cache_seqlens must be int32 [b]")
    _check_sink(attn_sink, h_q)
    if mod.flavour == "sgl-use-legacy":
        _check(topk_length is None, "V3.2 does not support dynamic topk length")
    if mod.flavour == "upstream-log2-lse":
        _check(isinstance(sched, torch.Tensor) and sched.dtype == torch.int32,
               "tile_scheduler_metadata must be an int32 tensor")
        _check(isinstance(num_splits, torch.Tensor) and num_splits.dtype == torch.int32
               and tuple(num_splits.shape) == (b + 1,), "num_splits must be int32 [b+1]")
    else:
        _check(isinstance(sched, SchedMeta), "tile_scheduler_metadata must be FlashMLASchedMeta")
        _check(num_splits is None, "num_splits must be None")
        config = (b, s_q, h_q, block_size, topk)
        if sched.have_initialized:
            _check(sched.config == config, "inputs inconsistent with sched_meta")
        sched.have_initialized, sched.config = True, config
    rows = num_blocks * block_size
    bad = (indices != -1) & ((indices < 0) | (indices >= rows))
    if bool(bad.any()):
        raise OutOfBoundsRead(f"{int(bad.sum())} indices outside 0..{rows - 1}")
    return b, s_q, h_q


def _prefill_result(mod, q, kv, indices, sm_scale, attn_sink, topk_length, log2: bool):
    out, max_logits, lse = reference.prefill_compute(q, kv, indices, sm_scale, attn_sink,
                                                     topk_length)
    if log2:  # the 2025 kernels: base-2 statistics, -inf lse where no index is valid
        lse = torch.where(lse == math.inf, -math.inf, lse * LOG2E)
        max_logits = max_logits * LOG2E
    return out, max_logits, lse


def _decode_result(mod, q, k_cache, indices, softmax_scale, attn_sink):
    scale = q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale
    out, lse = reference.decode_compute(q, k_cache, indices, scale, attn_sink)
    if mod.flavour == "upstream-log2-lse":
        lse = torch.where(lse == math.inf, -math.inf, lse)
    return out, lse


def build(flavour: str, *, has_legacy: bool = True) -> types.ModuleType:
    """A fresh fake flash_mla module speaking `flavour` (one of FLAVOURS)."""
    if flavour not in FLAVOURS:
        raise ValueError(flavour)
    mod = types.ModuleType("flash_mla")
    mod.flavour = flavour
    mod.calls = []
    mod.__version__ = {"sgl-use-legacy": "1.0.0", "upstream-natural-lse": "1.0.0+2026.01",
                       "upstream-log2-lse": "1.0.0+2025.09"}[flavour]
    mod.FlashMLASchedMeta = SchedMeta
    if flavour == "sgl-use-legacy":
        _define_sgl(mod, has_legacy)
    elif flavour == "upstream-natural-lse":
        _define_upstream_2026(mod)
    else:
        _define_upstream_2025(mod)
    return mod


def _record(mod, name, **kwargs):
    mod.calls.append((name, kwargs))


def _define_sgl(mod, has_legacy):
    def get_ops(use_legacy):
        if use_legacy and not has_legacy:
            raise RuntimeError("The legacy FlashMLA kernels are not available: this wheel was "
                               "built with FLASH_MLA_BUILD_LEGACY=0.")

    def get_mla_metadata(*args, **kwargs):
        _record(mod, "get_mla_metadata", args=args, kwargs=kwargs)
        return SchedMeta(), None

    def get_mla_decoding_metadata(seqlens_k, num_q_tokens_per_head_k, h_k, h_q=None,
                                  is_fp8_kvcache=False, topk=None, use_legacy=False):
        raise AssertionError("the adapter does not hoist the scheduler")

    def flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, head_dim_v,
                               tile_scheduler_metadata, num_splits=None, softmax_scale=None,
                               causal=False, is_fp8_kvcache=None, indices=None, attn_sink=None,
                               extra_k_cache=None, extra_indices_in_kvcache=None,
                               topk_length=None, extra_topk_length=None,
                               enable_batch_invariant=False, use_legacy=False, kv_format=None,
                               descale_q=None, descale_k=None):
        _record(mod, "flash_mla_with_kvcache", **_summary(locals()))
        get_ops(use_legacy)
        if is_fp8_kvcache is None:
            is_fp8_kvcache = indices is not None
        _check(not (use_legacy and enable_batch_invariant), "batch invariance is not legacy")
        _check(use_legacy or kv_format is None, "kv_format only applies to the legacy kernels")
        _check_decode(mod, q, k_cache, block_table, cache_seqlens, head_dim_v,
                      tile_scheduler_metadata, num_splits, causal, is_fp8_kvcache, indices,
                      attn_sink, topk_length, use_legacy, kv_format)
        return _decode_result(mod, q, k_cache, indices, softmax_scale, attn_sink)

    def flash_mla_sparse_fwd(q, kv, indices, sm_scale, d_v=512, attn_sink=None,
                             topk_length=None, use_legacy=False, return_log2_lse=None):
        _record(mod, "flash_mla_sparse_fwd", **_summary(locals()))
        get_ops(use_legacy)
        _check(use_legacy or return_log2_lse is not True, "return_log2_lse=True is legacy-only")
        _check_prefill(mod, q, kv, indices, sm_scale, d_v, attn_sink, topk_length, use_legacy)
        out, mx, lse = _prefill_result(mod, q, kv, indices, sm_scale, attn_sink, topk_length,
                                       log2=return_log2_lse is True)
        if return_log2_lse is False:
            return out, None, None
        return out, mx, lse

    mod.get_mla_metadata = get_mla_metadata
    mod.get_mla_decoding_metadata = get_mla_decoding_metadata
    mod.flash_mla_with_kvcache = flash_mla_with_kvcache
    mod.flash_mla_sparse_fwd = flash_mla_sparse_fwd
    mod.has_legacy = lambda: has_legacy


def _define_upstream_2026(mod):
    def get_mla_metadata(*args, **kwargs):
        _record(mod, "get_mla_metadata", args=args, kwargs=kwargs)
        return SchedMeta(), None

    def flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, head_dim_v,
                               tile_scheduler_metadata, num_splits=None, softmax_scale=None,
                               causal=False, is_fp8_kvcache=False, indices=None, attn_sink=None,
                               extra_k_cache=None, extra_indices_in_kvcache=None,
                               topk_length=None, extra_topk_length=None):
        _record(mod, "flash_mla_with_kvcache", **_summary(locals()))
        _check_decode(mod, q, k_cache, block_table, cache_seqlens, head_dim_v,
                      tile_scheduler_metadata, num_splits, causal, is_fp8_kvcache, indices,
                      attn_sink, topk_length, False, None)
        return _decode_result(mod, q, k_cache, indices, softmax_scale, attn_sink)

    def flash_mla_sparse_fwd(q, kv, indices, sm_scale, d_v=512, attn_sink=None,
                             topk_length=None):
        _record(mod, "flash_mla_sparse_fwd", **_summary(locals()))
        _check_prefill(mod, q, kv, indices, sm_scale, d_v, attn_sink, topk_length, False)
        return _prefill_result(mod, q, kv, indices, sm_scale, attn_sink, topk_length, False)

    mod.get_mla_metadata = get_mla_metadata
    mod.flash_mla_with_kvcache = flash_mla_with_kvcache
    mod.flash_mla_sparse_fwd = flash_mla_sparse_fwd


def _define_upstream_2025(mod):
    def get_mla_metadata(cache_seqlens, num_q_tokens_per_head_k, num_heads_k, num_heads_q=None,
                         is_fp8_kvcache=False, topk=None):
        _record(mod, "get_mla_metadata", args=(cache_seqlens, num_q_tokens_per_head_k,
                                               num_heads_k, num_heads_q, is_fp8_kvcache, topk),
                kwargs={})
        _check(cache_seqlens.dtype == torch.int32 and cache_seqlens.dim() == 1,
               "seqlens_k must be int32 [b]")
        b = cache_seqlens.shape[0]
        return (torch.zeros(8, 8, dtype=torch.int32, device=cache_seqlens.device),
                torch.zeros(b + 1, dtype=torch.int32, device=cache_seqlens.device))

    def flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, head_dim_v,
                               tile_scheduler_metadata, num_splits, softmax_scale=None,
                               causal=False, is_fp8_kvcache=False, indices=None):
        _record(mod, "flash_mla_with_kvcache", **_summary(locals()))
        _check_decode(mod, q, k_cache, block_table, cache_seqlens, head_dim_v,
                      tile_scheduler_metadata, num_splits, causal, is_fp8_kvcache, indices,
                      None, None, False, None)
        return _decode_result(mod, q, k_cache, indices, softmax_scale, None)

    def flash_mla_sparse_fwd(q, kv, indices, sm_scale, d_v=512):
        _record(mod, "flash_mla_sparse_fwd", **_summary(locals()))
        _check_prefill(mod, q, kv, indices, sm_scale, d_v, None, None, False)
        return _prefill_result(mod, q, kv, indices, sm_scale, None, None, True)

    mod.get_mla_metadata = get_mla_metadata
    mod.flash_mla_with_kvcache = flash_mla_with_kvcache
    mod.flash_mla_sparse_fwd = flash_mla_sparse_fwd


_CLOSURE_NAMES = {"mod", "get_ops", "has_legacy"}  # free variables locals() also reports


def _summary(arguments: dict) -> dict:
    """What a call received: tensors as (shape, dtype, strides), everything else as is."""
    out = {}
    for key, value in arguments.items():
        if key in _CLOSURE_NAMES:
            continue
        if isinstance(value, torch.Tensor):
            out[key] = (tuple(value.shape), value.dtype, tuple(value.stride()))
        elif isinstance(value, (SchedMeta, types.ModuleType)) or inspect.isfunction(value):
            out[key] = type(value).__name__
        else:
            out[key] = value
    return out


def fake_device_info(capability=(9, 0), name="Fake NVIDIA H200"):
    """A replacement for flashmla._device_info that presents every device as a CUDA GPU."""
    def info(device):
        return {"index": 0, "name": name, "capability": tuple(capability)}
    return info


def install(monkeypatch, flavour: str, *, capability=(9, 0), has_legacy: bool = True):
    """Put a fake flash_mla in sys.modules and make the adapter treat CPU tensors as a GPU of
    `capability`; undone by monkeypatch. Returns the fake module."""
    mod = build(flavour, has_legacy=has_legacy)
    monkeypatch.setitem(sys.modules, "flash_mla", mod)
    monkeypatch.setattr(flashmla, "_device_info", fake_device_info(capability))
    flashmla.reset_probe()
    return mod
