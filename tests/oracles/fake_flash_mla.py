"""A stand-in `flash_mla` module for testing the adapter without a GPU.

It reproduces the public API flavours the adapter must tell apart, with their exact Python
signatures, and enforces what the real package enforces: every assert of its Python interface and
every check its C++ entry points and kernels make on the arguments the bridge can pass (dtypes,
shapes, strides, alignment, page block size, head counts per architecture, top-k multiples,
scheduler metadata), so that a test cannot pass where a GPU call would fail. An out-of-range
decode index is the out-of-bounds read it would be (OutOfBoundsRead). Results come from the
float64 oracle (tests/oracles/bridge_oracle.py: per-query numpy attention, the FP8 rows read byte
by byte), never from the bridge's own reference, in the flavour's own conventions (base-2
statistics for the 2025 builds).
Every call is recorded in `module.calls`.

Sources, cited by line below:
  SGL   sgl-flash-mla 1.0.0 (PyPI wheel): flash_mla/flash_mla_interface.py, flash_mla/_loader.py;
        SGL-SO: the TORCH_CHECK messages in its _C_legacy.abi3.so (C++ sources not shipped)
  UP26  deepseek-ai/FlashMLA@9241ae3 (2026-04-29; the kernels SGL froze as legacy):
        flash_mla/flash_mla_interface.py, csrc/api/sparse_{decode,fwd}.h, kernel asserts
  UP25  deepseek-ai/FlashMLA@1408756 (2025-10-01): flash_mla/flash_mla_interface.py,
        csrc/pybind.cpp, kernel asserts
  V41   deepinfer-flashmla 1.0.0 (PyPI sdist; FlashMLA 2026.09.30): flash_mla/flash_mla_interface.py,
        README.md ("removed support for the Hopper architecture and ... DeepSeek V3 / V3.2")

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

from kernels_bridge import flashmla  # only to fake its device probe (install)
from tests.oracles import bridge_oracle

FLAVOURS = ("sgl-use-legacy", "upstream-natural-lse", "upstream-log2-lse")  # serve V3.2
V41_ONLY = "upstream-v41-only"  # FlashMLA 2026.09.30+: detected, never usable for V3.2
LOG2E = 1.0 / math.log(2.0)
PACKED = (torch.float8_e4m3fn, torch.int8, torch.uint8)
V32_ROW = 512 + 64 * 2 + (512 // 128) * 4  # 656 (UP26 csrc/api/sparse_decode.h:291)
MODEL1_ROW = 448 + 64 * 2 + (448 // 64) * 1 + 1  # 584 (UP26 csrc/api/sparse_decode.h:294)
INT32_MAX = 2 ** 31 - 1


class KernelError(RuntimeError):
    """What TORCH_CHECK (or a Python assert of the interface) raises inside flash_mla."""


class OutOfBoundsRead(RuntimeError):
    """The kernel would read outside the cache (an illegal memory access on a GPU)."""


@dataclasses.dataclass
class SchedMeta:
    """FlashMLASchedMeta: empty until the first decode call fills it (SGL interface.py:9-37)."""
    have_initialized: bool = False
    config: Optional[tuple] = None


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise KernelError(msg)


def _last_dim_contiguous(name: str, t) -> None:
    if t is not None:
        _check(t.size(-1) == 1 or t.stride(-1) == 1, f"{name} must have contiguous last dimension")


def _contiguous(name: str, t) -> None:
    if t is not None:
        _check(t.is_contiguous(), f"{name} must be contiguous")


def _same_device(q, **tensors) -> None:
    for name, t in tensors.items():  # KU_CHECK_DEVICE: every tensor on the GPU (q's, here)
        if t is not None:
            _check(t.device == q.device, f"{name} must be on CUDA")


def _aligned16(name: str, t) -> None:
    _check(t.data_ptr() % 16 == 0, f"The base address of {name} must be 16B aligned")


def _arch(mod) -> str:
    major, minor = mod.capability
    if (major, minor) == (9, 0):
        return "sm90a"
    if major == 10:
        return "sm100f"
    return "other"


# ---- the sparse prefill kernels -----------------------------------------------------------

def _prefill_kernel_2026(mod, q, kv, indices, sm_scale, d_v, attn_sink, topk_length, legacy: bool):
    """UP26 csrc/api/sparse_fwd.h:112-197 and the kernels' asserts; SGL's legacy kernels are
    these (SGL-SO carries the same messages)."""
    if mod.flavour == "sgl-use-legacy" and not legacy:
        # SGL interface.py:291 "`d_qk` must be 512": the current kernels are V4.1's, on SM100f
        _check(q.shape[-1] == 512, "the current kernels take V4.1 (d_qk 512) only; 576 needs "
                                   "use_legacy=True")
        _check(_arch(mod) == "sm100f", "Sparse Attention Prefill Kernel (sparse_prefill_fwd) is only "
                                       "supported on SM100f architectures.")
    _check(_arch(mod) in ("sm90a", "sm100f"),
           "Sparse Attention Forward Kernel is only supported on SM90a and SM100f architectures.")  # :115
    _check(q.dim() == 3 and kv.dim() == 3 and indices.dim() == 3, "q, kv, indices must be 3-D")  # :117-119
    _check(attn_sink is None or attn_sink.dim() == 1, "attn_sink must be 1-D")  # :120
    _check(topk_length is None or topk_length.dim() == 1, "topk_length must be 1-D")  # :121
    s_q, h_q, d_qk = q.shape
    s_kv, h_kv, _ = kv.shape
    topk = indices.shape[-1]
    _check(d_qk in (576, 512), f"Invalid d_qk: {d_qk}")  # :131
    _check(d_v == 512, f"Invalid d_v{d_v}")  # :132
    _same_device(q, kv=kv, indices=indices, attn_sink=attn_sink, topk_length=topk_length)  # :134-138
    _check(q.dtype == torch.bfloat16 and kv.dtype == torch.bfloat16, "q, kv must be bfloat16")  # :140-141
    _check(indices.dtype == torch.int32, "indices must be int32")  # :142
    _check(attn_sink is None or attn_sink.dtype == torch.float32, "attn_sink must be float32")  # :143
    _check(topk_length is None or topk_length.dtype == torch.int32, "topk_length must be int32")  # :144
    _check(tuple(kv.shape) == (s_kv, h_kv, d_qk), "kv must have shape (s_kv, h_kv, d_qk)")  # :147
    _check(tuple(indices.shape) == (s_q, h_kv, topk), "indices must have shape (s_q, h_kv, topk)")  # :148
    _check(attn_sink is None or tuple(attn_sink.shape) == (h_q,), "attn_sink must have shape (h_q)")  # :149
    _check(topk_length is None or tuple(topk_length.shape) == (s_q,), "topk_length must have shape (s_q)")  # :150
    for name, t in (("q", q), ("kv", kv), ("indices", indices), ("attn_sink", attn_sink),
                    ("topk_length", topk_length)):
        _last_dim_contiguous(name, t)  # :152-156
    _check(h_q in (64, 128), f"Unsupported h_q: {h_q}")  # :197
    _check(h_kv == 1, "h_kv == 1")  # kernels: sm90/prefill/sparse/phase1.cuh:576
    if _arch(mod) == "sm90a":
        _check(topk > 0 and topk % 128 == 0, f"topk ({topk}) mod 2*B_TOPK (128) must be 0")  # phase1.cuh:577-578
    else:  # sm100/prefill/sparse/fwd/head{64,128}/phase1.cuh:586, :628 (B_TOPK 64 / 128)
        b_topk = 64 if h_q == 64 else 128
        _check(topk > 0 and topk % b_topk == 0, f"topk ({topk}) mod B_TOPK ({b_topk}) must be 0")
    return s_q, h_q


def _prefill_kernel_2025(mod, q, kv, indices, sm_scale, d_v):
    """UP25 csrc/pybind.cpp sparse_prefill_fwd (:383-457) and the kernels' asserts."""
    _check(_arch(mod) in ("sm90a", "sm100f"), "Sparse Attention Forward Kernel (sparse_prefill_fwd) is "
                                             "only supported on SM90 or SM100 architectures")  # :397
    _same_device(q, kv=kv, indices=indices)  # :399-401
    _check(q.dtype == torch.bfloat16 and kv.dtype == torch.bfloat16, "q, kv must be bfloat16")  # :403-404
    _check(indices.dtype == torch.int32, "indices must be int32")  # :405
    _check(q.dim() == 3 and kv.dim() == 3 and indices.dim() == 3, "q, kv, indices must be 3-D")
    s_q, h_q, d_qk = q.shape
    s_kv, h_kv, _ = kv.shape
    topk = indices.shape[-1]
    _check(tuple(kv.shape) == (s_kv, h_kv, d_qk), "kv must have shape (s_kv, h_kv, d_qk)")  # :415
    _check(tuple(indices.shape) == (s_q, h_kv, topk), "indices must have shape (s_q, h_kv, topk)")  # :416
    for name, t in (("q", q), ("kv", kv), ("indices", indices)):
        _check(t.stride(-1) == 1, f"{name}.stride(-1) == 1")  # :418-420
    _check(h_kv == 1, "h_kv == 1")  # sm90/prefill/sparse/fwd.cu:644, sm100/prefill/sparse/fwd.cu:706
    _check(d_qk == 576 and d_v == 512, "the 2025 kernels take d_qk 576, d_v 512")  # the only instantiation
    if _arch(mod) == "sm90a":  # sm90/prefill/sparse/fwd.cu:645-647 (B_TOPK 64, B_H 64)
        _check(topk > 0 and topk % 128 == 0, f"topk ({topk}) mod 2*B_TOPK (128) must be 0")
        _check(h_q % 64 == 0, "h_q % B_H == 0")
    else:  # sm100/prefill/sparse/fwd.cu:707-708 (B_TOPK 128, B_H 128)
        _check(topk % 128 == 0, f"topk ({topk}) mod B_TOPK (128) must be 0")
        _check(h_q == 128, f"h_q ({h_q}) == B_H (128)")
    return s_q, h_q


# ---- the sparse FP8 decode kernels ----------------------------------------------------------

def _decode_kernel_2026(mod, q, k_cache, indices, topk_length, attn_sink, head_dim_v,
                        legacy: bool, kv_format):
    """UP26 csrc/api/sparse_decode.h sparse_attn_decode_interface (:186-378) and the V3.2
    kernels' asserts; SGL's legacy kernels are these plus what SGL-SO adds."""
    if mod.flavour == "sgl-use-legacy" and not legacy:
        # SGL interface.py:113-114 ("head_dim must be 512"), :149-154: the current kernels take
        # the V4.1 formats (528/288-byte rows) only, on SM100f (SGL-SO: "Unsupported
        # bytes_per_token for d_qk=512")
        _check(q.shape[-1] == 512 and k_cache.shape[-1] in (528, 288),
               "the current kernels take V4.1 formats only; V3.2 needs use_legacy=True")
        _check(_arch(mod) == "sm100f", "Sparse Attention Decode Kernel (sparse_decode_fwd) is only "
                                       "supported on SM100f architectures.")
    _check(q.dim() == 4 and k_cache.dim() == 4 and indices.dim() == 3, "q, kv: 4-D; indices: 3-D")  # :203-205
    b, s_q, h_q, d_qk = q.shape
    num_blocks, block_size, h_kv, row = k_cache.shape
    topk = indices.shape[-1]
    _check(b > 0 and s_q > 0 and h_q > 0, "Expected batch_size > 0")  # :231-233
    _check(h_kv == 1, "Currently only MQA (i.e. h_kv == 1) is supported for sparse decoding")  # :234
    _check(d_qk in (576, 512), "Only head_size_k == 576 or 512 is supported for sparse decoding")  # :235
    _check(head_dim_v == 512, "Only head_size_v == 512 is supported for sparse decoding")  # :236
    _check(topk > 0, "topk > 0")  # :237
    _same_device(q, kv=k_cache, indices=indices, topk_length=topk_length, attn_sink=attn_sink)  # :247-256
    _check(q.dtype == torch.bfloat16, "q must be bfloat16")  # :259
    _check(k_cache.dtype in PACKED, "key must have dtype fp8_e4m3fn, int8 or uint8")  # :260
    _check(indices.dtype == torch.int32, "indices must be int32")  # :264
    _check(topk_length is None or topk_length.dtype == torch.int32, "topk_length must be int32")  # :265
    _check(attn_sink is None or attn_sink.dtype == torch.float32, "attn_sink must be float32")  # :266
    for name, t in (("q", q), ("kv", k_cache), ("indices", indices)):
        _last_dim_contiguous(name, t)  # :273-275
    _contiguous("topk_length", topk_length)  # :276
    _contiguous("attn_sink", attn_sink)  # :277
    bytes_per_token = V32_ROW if d_qk == 576 else MODEL1_ROW  # :289-297
    _check(tuple(k_cache.shape) == (num_blocks, block_size, h_kv, bytes_per_token),
           "kv must have shape (num_blocks, page_block_size, h_kv, bytes_per_token)")  # :299
    _check(k_cache.stride(1) == bytes_per_token,  # :301, whatever the block size
           "The whole block must be contiguous when is_fp8_cache is True for kv cache")
    _check(tuple(indices.shape) == (b, s_q, topk), "indices must have shape (b, s_q, topk)")  # :306
    _check(topk_length is None or tuple(topk_length.shape) == (b,), "topk_length must have shape (b)")  # :307
    _check(attn_sink is None or tuple(attn_sink.shape) == (h_q,), "attn_sink must have shape (h_q)")  # :308
    _check(h_q in (64, 128), f"Unsupported h_q: {h_q}")  # :333
    if mod.flavour == "sgl-use-legacy":
        # SGL-SO: "Unknown kv_format: ", ". Expected one of V32, V32_NO_ROPE, V4, V41, V41_FP4",
        # "Expected model_type == *kv_format_hint"; the bytes_per_token of V3.2 say V32
        if kv_format is not None:
            _check(kv_format in ("V32", "V32_NO_ROPE", "V4", "V41", "V41_FP4"),
                   f"Unknown kv_format: {kv_format}. Expected one of V32, V32_NO_ROPE, V4, V41, V41_FP4")
            _check(kv_format == "V32", f"Expected model_type == *kv_format_hint ({kv_format})")
        # SGL-SO: "(uint64_t)num_blocks * (uint64_t)(block_stride_bytes / TMA_K_STRIDE) <= INT32_MAX"
        _check(num_blocks * (k_cache.stride(0) // V32_ROW) <= INT32_MAX,
               "num_blocks * (block_stride_bytes / TMA_K_STRIDE) <= INT32_MAX")
        _aligned16("kv", k_cache)  # SGL-SO: "The base address of %skv (%p) must be 16B aligned"
    arch = _arch(mod)
    _check(arch in ("sm90a", "sm100f"), "Unsupported architecture for sparse decode fwd")  # :377
    if arch == "sm90a":  # csrc/sm90/decode/sparse_fp8/splitkv_mla.cuh:688-701 (V3.2)
        _check(topk % 64 == 0, f"topk ({topk}) % TOPK_BLOCK_SIZE (64) == 0")
        _check(topk_length is None, "V3.2 does not support dynamic topk length")
        _check(k_cache.stride(1) == V32_ROW, "params.stride_kv_row == 656")
    else:  # csrc/sm100/decode/head64/kernel.cuh:859, :911-912 (TMA_K_STRIDE 656, config.h:41)
        _check(topk % 64 == 0, f"topk ({topk}) mod B_TOPK (64) must be 0")
        _aligned16("k_ptr", k_cache)
        _check(k_cache.stride(0) % V32_ROW == 0, f"k_cache.stride(0) ({k_cache.stride(0)}) must be a "
                                                 f"multiple of {V32_ROW}. Padding might be necessary")
    return b, s_q, h_q, block_size, topk


def _decode_kernel_2025(mod, q, k_cache, block_table, cache_seqlens, head_dim_v, sched, num_splits,
                        indices):
    """UP25 csrc/pybind.cpp fwd_kvcache_mla (:170-262), is_fp8 and sparse, and the kernels'
    asserts."""
    _check(_arch(mod) in ("sm90a", "sm100f"), "Only SM90 and SM100 are supported")  # :189
    _check(q.dtype in (torch.bfloat16, torch.float16), "q must be bfloat16 or half")  # :193
    _check(k_cache.dtype in PACKED, "key must have dtype fp8_e4m3fn or int8 or uint8")  # :198
    _check(cache_seqlens.dtype == torch.int32, "seqlens_k must have dtype int32")  # :200
    _check(block_table.dtype == torch.int32, "block_table must have dtype torch.int32")  # :201
    _check(isinstance(sched, torch.Tensor) and sched.dtype == torch.int32,
           "tile_scheduler_metadata must have dtype int32")  # :202
    _check(isinstance(num_splits, torch.Tensor) and num_splits.dtype == torch.int32,
           "num_splits must have dtype int32")  # :203
    _check(indices.dtype == torch.int32, "indices must have dtype int32")  # :204
    _same_device(q, kcache=k_cache, seqlens_k=cache_seqlens, block_table=block_table,
                 tile_scheduler_metadata=sched, num_splits=num_splits, indices=indices)  # :207-213
    _check(q.stride(-1) == 1, "q must have contiguous last dimension")  # :216
    _check(k_cache.stride(-1) == 1, "kcache must have contiguous last dimension")  # :217
    _contiguous("seqlens_k", cache_seqlens)  # :218
    _check(block_table.stride(-1) == 1, "block_table must have contiguous last dimension")  # :219
    _contiguous("tile_scheduler_metadata", sched)  # :220
    _contiguous("num_splits", num_splits)  # :221
    _check(indices.stride(-1) == 1, "indices must have contiguous last dimension")  # :222
    _check(q.dim() == 4 and k_cache.dim() == 4 and indices.dim() == 3 and block_table.dim() == 2,
           "bad ranks")
    b, s_q, h_q, d_qk = q.shape
    num_blocks, block_size, h_kv, row = k_cache.shape
    topk = indices.shape[-1]
    _check(d_qk == 576, "Only head_size_k == 576 is supported")  # :229
    _check(head_dim_v == 512, "Only head_size_v == 576 is supported")  # :230 (sic)
    _check(block_size == 64, "Currently page_block_size must be 64")  # :236
    _check(b > 0, "batch size must be positive")  # :237
    _check(h_q % h_kv == 0, "Number of heads in key/value must divide number of heads in query")  # :238
    _check(tuple(k_cache.shape) == (num_blocks, block_size, h_kv, V32_ROW),
           "kcache must have shape (num_blocks, page_block_size, num_heads_k, bytes_per_token)")  # :253
    _check(h_kv == 1, "Currently the number of k heads must be 1 when is_fp8_kvcache is True")  # :254
    _check(k_cache.stride(1) == V32_ROW, "The whole block must be contiguous when is_fp8_cache is True")  # :255
    _check(tuple(cache_seqlens.shape) == (b,), "seqlens_k must have shape (batch_size)")  # :257
    _check(block_table.shape[0] == b, "block_table must have shape (batch_size, max_num_blocks_per_seq)")  # :258
    _check(sched.dim() == 2 and sched.shape[1] == 8, "tile_scheduler_metadata.size(1) == "
                                                     "TileSchedulerMetaDataSize")  # :259, params.h:51
    _check(tuple(num_splits.shape) == (b + 1,), "num_splits must have shape (batch_size+1)")  # :260
    _check(tuple(indices.shape) == (b, s_q, topk), "indices must have shape (batch_size, seqlen_q_ori, topk)")  # :261
    if _arch(mod) == "sm90a":
        _check(q.dtype == torch.bfloat16, "Sparse FP8 MLA only supports BFloat16 on SM90")  # :334
    # sm90/decode/sparse_fp8/splitkv_mla.cu:546-547, sm100/decode/sparse_fp8/splitkv_mla.cu:545-546
    _check(topk % 64 == 0, f"topk ({topk}) % 64 == 0")
    _check(h_q in (64, 128), f"Unsupported h_q: {h_q}")
    return b, s_q, h_q, block_size, topk


def _sched_config(sched: SchedMeta, config: tuple) -> None:
    """SGL interface.py:215-248 / UP26 :120-149 / V41 :150-174: the first call fills the
    metadata; a later call must have the same shapes."""
    if sched.have_initialized:
        _check(sched.config == config, "Your input arguments are inconsistent with sched_meta.")
    sched.have_initialized, sched.config = True, config


def _out_of_bounds(k_cache, indices) -> None:
    """SGL interface.py:139-141: only -1 is skipped; any other out-of-range value is read."""
    rows = k_cache.shape[0] * k_cache.shape[1]
    bad = (indices != -1) & ((indices < 0) | (indices >= rows))
    if bool(bad.any()):
        raise OutOfBoundsRead(f"{int(bad.sum())} indices outside 0..{rows - 1}")


def _prefill_result(q, kv, indices, sm_scale, attn_sink, topk_length, log2: bool):
    """The kernel's outputs, from the float64 oracle (not the bridge's reference): out bf16,
    statistics float32, as the kernels write them."""
    out, max_logits, lse = bridge_oracle.prefill_oracle(q, kv, indices, sm_scale, attn_sink, topk_length)
    out, max_logits, lse = (torch.from_numpy(a) for a in (out, max_logits, lse))
    if log2:  # the 2025 kernels: base-2 statistics, -inf lse where no index is valid
        lse = torch.where(lse == math.inf, -math.inf, lse * LOG2E)
        max_logits = max_logits * LOG2E
    return out.to(torch.bfloat16), max_logits.float(), lse.float()


def _decode_result(mod, q, k_cache, indices, softmax_scale, attn_sink):
    """The kernel's outputs, from the float64 oracle reading the 656-byte rows byte by byte:
    out bf16 [b, s_q, h_q, 512], lse float32 [b, h_q, s_q] as a transposed view of a
    [b, s_q, h_q] tensor (FlashMLA's layout)."""
    scale = q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale
    out, lse = bridge_oracle.decode_oracle(q, k_cache, indices, scale, attn_sink)
    lse = torch.from_numpy(lse).float().transpose(1, 2).contiguous().transpose(1, 2)
    if mod.flavour == "upstream-log2-lse":
        lse = torch.where(lse == math.inf, -math.inf, lse)
    return torch.from_numpy(out).to(torch.bfloat16), lse


def build(flavour: str, *, has_legacy: bool = True, capability=(9, 0)) -> types.ModuleType:
    """A fresh fake flash_mla module speaking `flavour` (one of FLAVOURS, or V41_ONLY), whose
    kernels behave as on a GPU of compute `capability`."""
    if flavour not in FLAVOURS + (V41_ONLY,):
        raise ValueError(flavour)
    mod = types.ModuleType("flash_mla")
    mod.flavour = flavour
    mod.capability = tuple(capability)
    mod.calls = []
    mod.__version__ = {"sgl-use-legacy": "1.0.0", "upstream-natural-lse": "1.0.0+2026.01",
                       "upstream-log2-lse": "1.0.0+2025.09", V41_ONLY: "1.0.0+2026.09.30"}[flavour]
    mod.FlashMLASchedMeta = SchedMeta
    {"sgl-use-legacy": lambda: _define_sgl(mod, has_legacy),
     "upstream-natural-lse": lambda: _define_upstream_2026(mod),
     "upstream-log2-lse": lambda: _define_upstream_2025(mod),
     V41_ONLY: lambda: _define_upstream_v41(mod)}[flavour]()
    return mod


def _record(mod, name, **kwargs):
    mod.calls.append((name, kwargs))


def _define_sgl(mod, has_legacy):
    def get_ops(use_legacy):  # SGL _loader.py get_ops
        if use_legacy and not has_legacy:
            raise RuntimeError("The legacy FlashMLA kernels (SM90, and the V3.2 / V3.2-no-RoPE / V4 KV "
                               "cache formats) are not available: this wheel was built with "
                               "FLASH_MLA_BUILD_LEGACY=0.")

    def get_mla_metadata(*args, **kwargs):  # SGL interface.py:40-53
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
        _check(isinstance(tile_scheduler_metadata, SchedMeta),
               "tile_scheduler_metadata must be of type FlashMLASchedMeta")  # :163
        _check(num_splits is None, "num_splits must be None")  # :164
        get_ops(use_legacy)  # :165
        if is_fp8_kvcache is None:  # :166-170
            is_fp8_kvcache = indices is not None
        _check(indices is not None, "the fake serves sparse decoding only (the bridge never decodes dense)")
        _check(not causal, "causal must be False when sparse attention is enabled")  # :206
        _check(is_fp8_kvcache, "is_fp8_kvcache must be True, since only sparse attention with a "
                               "quantized KV cache is supported")  # :207
        _check(extra_k_cache is None and extra_indices_in_kvcache is None,
               "the fake serves no extra KV cache (the bridge never passes one)")
        _sched_config(tile_scheduler_metadata, (q.shape[0], q.shape[1], q.shape[2], k_cache.shape[1],
                                                k_cache.shape[2], causal, is_fp8_kvcache,
                                                enable_batch_invariant, indices.shape[-1]))  # :215-248
        if use_legacy:
            _check(not enable_batch_invariant, "enable_batch_invariant is a 2026.09.30 feature and only "
                                               "exists on the current kernels")  # :250-253
        else:
            _check(kv_format is None, "kv_format only applies to the legacy kernels")  # :261-264
        _decode_kernel_2026(mod, q, k_cache, indices, topk_length, attn_sink, head_dim_v,
                            use_legacy, kv_format)
        _out_of_bounds(k_cache, indices)
        return _decode_result(mod, q, k_cache, indices, softmax_scale, attn_sink)

    def flash_mla_sparse_fwd(q, kv, indices, sm_scale, d_v=512, attn_sink=None,
                             topk_length=None, use_legacy=False, return_log2_lse=None):
        _record(mod, "flash_mla_sparse_fwd", **_summary(locals()))
        get_ops(use_legacy)  # :317
        if not use_legacy:
            _check(return_log2_lse is not True, "return_log2_lse=True is a legacy-kernel feature")  # :318-323
        _check(isinstance(sm_scale, float), "sm_scale must be a float")  # the op schema's `float`
        _prefill_kernel_2026(mod, q, kv, indices, sm_scale, d_v, attn_sink, topk_length, use_legacy)
        out, mx, lse = _prefill_result(q, kv, indices, sm_scale, attn_sink, topk_length,
                                       log2=return_log2_lse is True)  # :330-333
        if return_log2_lse is False:
            return out, None, None
        return out, mx, lse

    mod.get_mla_metadata = get_mla_metadata
    mod.get_mla_decoding_metadata = get_mla_decoding_metadata
    mod.flash_mla_with_kvcache = flash_mla_with_kvcache
    mod.flash_mla_sparse_fwd = flash_mla_sparse_fwd
    mod.has_legacy = lambda: has_legacy


def _define_upstream_2026(mod):
    def get_mla_metadata(*args, **kwargs):  # UP26 interface.py:37-50
        _record(mod, "get_mla_metadata", args=args, kwargs=kwargs)
        return SchedMeta(), None

    def flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, head_dim_v,
                               tile_scheduler_metadata, num_splits=None, softmax_scale=None,
                               causal=False, is_fp8_kvcache=False, indices=None, attn_sink=None,
                               extra_k_cache=None, extra_indices_in_kvcache=None,
                               topk_length=None, extra_topk_length=None):
        _record(mod, "flash_mla_with_kvcache", **_summary(locals()))
        _check(isinstance(tile_scheduler_metadata, SchedMeta),
               "tile_scheduler_metadata must be of type FlashMLASchedMeta")  # :106
        _check(num_splits is None, "num_splits must be None")  # :107
        _check(indices is not None, "the fake serves sparse decoding only (the bridge never decodes dense)")
        _check(not causal, "causal must be False when indices_in_kvcache is not None")  # :118
        _check(extra_k_cache is None and extra_indices_in_kvcache is None,
               "the fake serves no extra KV cache (the bridge never passes one)")
        _sched_config(tile_scheduler_metadata, (q.shape[0], q.shape[1], q.shape[2], k_cache.shape[1],
                                                k_cache.shape[2], causal, is_fp8_kvcache,
                                                indices.shape[-1]))  # :120-149
        _check(is_fp8_kvcache, "is_fp8_kvcache must be True when sparse attention is enabled")  # :154
        _decode_kernel_2026(mod, q, k_cache, indices, topk_length, attn_sink, head_dim_v, False, None)
        _out_of_bounds(k_cache, indices)
        return _decode_result(mod, q, k_cache, indices, softmax_scale, attn_sink)

    def flash_mla_sparse_fwd(q, kv, indices, sm_scale, d_v=512, attn_sink=None,
                             topk_length=None):
        _record(mod, "flash_mla_sparse_fwd", **_summary(locals()))
        _check(isinstance(sm_scale, float), "sm_scale must be a float")
        _prefill_kernel_2026(mod, q, kv, indices, sm_scale, d_v, attn_sink, topk_length, False)
        return _prefill_result(q, kv, indices, sm_scale, attn_sink, topk_length, False)

    mod.get_mla_metadata = get_mla_metadata
    mod.flash_mla_with_kvcache = flash_mla_with_kvcache
    mod.flash_mla_sparse_fwd = flash_mla_sparse_fwd


def _define_upstream_2025(mod):
    def get_mla_metadata(cache_seqlens, num_q_tokens_per_head_k, num_heads_k, num_heads_q=None,
                         is_fp8_kvcache=False, topk=None):  # UP25 interface.py:7-28
        _record(mod, "get_mla_metadata", args=(cache_seqlens, num_q_tokens_per_head_k,
                                               num_heads_k, num_heads_q, is_fp8_kvcache, topk),
                kwargs={})
        # UP25 csrc/pybind.cpp get_mla_decoding_metadata :123-145
        _contiguous("seqlens_k", cache_seqlens)
        _check(cache_seqlens.dtype == torch.int32, "seqlens_k.dtype() == torch::kInt32")  # :134
        if topk is not None:
            _check(num_heads_q is not None, "num_heads_q must be provided when topk is provided")  # :136
        _check(_arch(mod) in ("sm90a", "sm100f"), "Only SM90 and SM100 are supported")  # :145
        b = cache_seqlens.shape[0]
        return (torch.zeros(8, 8, dtype=torch.int32, device=cache_seqlens.device),
                torch.zeros(b + 1, dtype=torch.int32, device=cache_seqlens.device))

    def flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, head_dim_v,
                               tile_scheduler_metadata, num_splits, softmax_scale=None,
                               causal=False, is_fp8_kvcache=False, indices=None):
        _record(mod, "flash_mla_with_kvcache", **_summary(locals()))
        _check(indices is not None, "the fake serves sparse decoding only (the bridge never decodes dense)")
        _check(causal is False, "causal must be `false` if sparse attention is enabled.")  # interface.py:64-65
        _check(is_fp8_kvcache, "the 2025 kernels decode a sparse cache only as FP8")  # pybind.cpp:334-341
        _decode_kernel_2025(mod, q, k_cache, block_table, cache_seqlens, head_dim_v,
                            tile_scheduler_metadata, num_splits, indices)
        _out_of_bounds(k_cache, indices)
        return _decode_result(mod, q, k_cache, indices, softmax_scale, None)

    def flash_mla_sparse_fwd(q, kv, indices, sm_scale, d_v=512):  # interface.py:82-109
        _record(mod, "flash_mla_sparse_fwd", **_summary(locals()))
        _check(isinstance(sm_scale, float), "sm_scale must be a float")
        _prefill_kernel_2025(mod, q, kv, indices, sm_scale, d_v)
        return _prefill_result(q, kv, indices, sm_scale, None, None, True)

    mod.get_mla_metadata = get_mla_metadata
    mod.flash_mla_with_kvcache = flash_mla_with_kvcache
    mod.flash_mla_sparse_fwd = flash_mla_sparse_fwd


def _define_upstream_v41(mod):
    """FlashMLA 2026.09.30 (V41 interface.py): SM100 only, V4.1 formats only (d_qk 512, 528-byte
    FP8 rows): every V3.2 call the bridge could make is refused."""
    def get_mla_metadata(*args, **kwargs):  # :43-56
        _record(mod, "get_mla_metadata", args=args, kwargs=kwargs)
        return SchedMeta(), None

    def flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, head_dim_v,
                               tile_scheduler_metadata, num_splits=None, softmax_scale=None,
                               causal=False, is_fp8_kvcache=True, indices=None, attn_sink=None,
                               extra_k_cache=None, extra_indices_in_kvcache=None,
                               topk_length=None, extra_topk_length=None,
                               enable_batch_invariant=False):
        _record(mod, "flash_mla_with_kvcache", **_summary(locals()))
        _check(isinstance(tile_scheduler_metadata, SchedMeta),
               "tile_scheduler_metadata must be of type FlashMLASchedMeta")  # :128
        _check(num_splits is None, "num_splits must be None")  # :129
        _check(indices is not None, "Sparse attention is required: `indices` must be provided")  # :131
        _check(not causal, "causal must be False when sparse attention is enabled")  # :132
        _check(is_fp8_kvcache, "is_fp8_kvcache must be True")  # :133
        _check(_arch(mod) == "sm100f", "Sparse Attention Decode Kernel (sparse_decode_fwd) is only "
                                       "supported on SM100f architectures.")  # README: no Hopper
        _check(q.shape[-1] == 512 and k_cache.shape[-1] in (528, 288),
               "head_dim must be 512 and the cache V4.1 (528 bytes per token)")  # :80-81, :115-119
        raise AssertionError("unreachable for the V3.2 shapes the bridge passes")

    def flash_mla_sparse_fwd(q, kv, indices, sm_scale, d_v=512, attn_sink=None, topk_length=None):
        _record(mod, "flash_mla_sparse_fwd", **_summary(locals()))
        _check(_arch(mod) == "sm100f", "Sparse Attention Prefill Kernel (sparse_prefill_fwd) is only "
                                       "supported on SM100f architectures.")
        _check(q.shape[-1] == 512, "`d_qk` must be 512")  # :200
        raise AssertionError("unreachable for the V3.2 shapes the bridge passes")

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
    mod = build(flavour, has_legacy=has_legacy, capability=capability)
    monkeypatch.setitem(sys.modules, "flash_mla", mod)
    monkeypatch.setattr(flashmla, "_device_info", fake_device_info(capability))
    # the adapter's caches of the import and of device facts are put back too: a probe of the
    # fake must not outlive the test (a later test would see a fake GPU)
    monkeypatch.setattr(flashmla, "_probe", None)
    monkeypatch.setattr(flashmla, "_devices", {})
    return mod
