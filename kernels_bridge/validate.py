"""Argument checks run before any kernel, identical for every provider.

The CPU reference accepts exactly what FlashMLA's kernels accept, so a call that runs here runs on
the GPU, and a call FlashMLA would fault on (an out-of-range decode index is read out of bounds)
is stopped here with a message that names the argument, its shape, dtype and device, and what was
expected.

Rules (FlashMLA's `csrc/api/sparse_{fwd,decode}.h` checks, plus the ones its kernels rely on):
- dtypes: q bf16; prefill kv bf16; decode k_cache uint8, int8 or float8_e4m3fn with 656-byte
  rows; indices int32 exactly; attn_sink float32; topk_length int32.
- shapes: prefill q [s_q, h_q, 576], kv [s_kv, 1, 576], indices [s_q, 1, topk];
  decode q [b, s_q, h_q, 576], k_cache [num_blocks, block_size, 1, 656], indices [b, s_q, topk];
  h_q 64 or 128 (the head counts FlashMLA instantiates; pad heads like SGLang does); one KV head;
  d_v 512; attn_sink [h_q]; topk_length [s_q].
- top-k: prefill a positive multiple of 128 (safe on SM90 and SM100 at both head counts), decode
  a positive multiple of 64 (the decode kernels' B_TOPK). Top-k 0 is rejected: give a query
  without candidates a row of -1 instead.
- empty batches (s_q == 0, or b == 0 for decode) are valid and give empty outputs without running
  a kernel (FlashMLA itself rejects b == 0). An empty kv / k_cache (no rows) is rejected.
- layout: last dim contiguous for q, kv, k_cache and indices; every row of a cache block packed
  (k_cache.stride(1) == 656, whatever the block size: FlashMLA checks it unconditionally); the
  cache's block stride a whole number of 656-byte rows and at most 2**31 - 1 rows in all (SM100's
  TMA map); attn_sink and topk_length contiguous; q, kv and k_cache base addresses 16-byte
  aligned (TMA); the outer strides of indices multiples of 8 elements (32 bytes); every stride
  below 2**31 (the kernels keep strides in int32).
- what only some FlashMLA builds refuse (the 2025 builds' page block size of 64 for decode and
  128 heads for SM100 prefill; builds without the V3.2 formats) is not a validation error: the
  adapter reports those builds as unable to run the call (ProviderUnavailable, or the reference
  under provider="auto"), so a call that validates runs on any provider that is selected.
- one device for every tensor, a device with data (meta tensors have none: their values cannot
  be checked, nor computed on); dense tensors only (torch.strided layout).
- values: decode indices are -1 or a row of the cache, 0 <= i < num_blocks * block_size (only -1
  is skipped; anything else is read); prefill indices may hold anything (< 0 or >= s_kv is
  masked). topk_length within [0, topk]. attn_sink free of NaN (+-inf is meaningful). The scale
  a finite real number.
- NaN/inf in q is not looked for by default (it costs a pass over q, and a NaN only spoils the
  outputs of its own query and head, as in FlashMLA); `check_finite=True` rejects it up front.

Checking decode indices costs one reduction over `indices` and, on a GPU, one host sync.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Iterable, Sequence

import torch

from kernels_bridge.errors import ValidationError, describe
from kernels_bridge.fp8 import D_QK, FP8_ROW_BYTES, PACKED_DTYPES
from kernels_bridge.layout import D_V, DECODE_TOPK_MULTIPLE, HEAD_COUNTS, PREFILL_TOPK_MULTIPLE
from kernels_bridge.tensor_checks import check_readable

__all__ = [
    "D_QK", "D_V", "HEAD_COUNTS", "PREFILL_TOPK_MULTIPLE", "DECODE_TOPK_MULTIPLE",
    "PrefillShape", "DecodeShape", "check_prefill", "check_decode", "check_scale", "check_d_v",
]

BASE_ALIGN_BYTES = 16
INDEX_STRIDE_ELEMS = 8  # 32 bytes of int32
INT32_MAX = 2 ** 31 - 1  # strides and row numbers the kernels keep in int32 (the hot buffer too)


@dataclass(frozen=True)
class PrefillShape:
    """Sizes of a validated sparse-prefill call."""
    s_q: int
    h_q: int
    s_kv: int
    topk: int

    @property
    def empty(self) -> bool:
        return self.s_q == 0


@dataclass(frozen=True)
class DecodeShape:
    """Sizes of a validated FP8 sparse-decode call."""
    b: int
    s_q: int
    h_q: int
    num_blocks: int
    block_size: int
    topk: int

    @property
    def rows(self) -> int:
        """Rows in the cache: valid flat indices are 0..rows-1."""
        return self.num_blocks * self.block_size

    @property
    def empty(self) -> bool:
        return self.b == 0 or self.s_q == 0


def check_prefill(q, kv, indices, sm_scale, d_v=D_V, attn_sink=None, topk_length=None, *,
                  check_finite: bool = False) -> PrefillShape:
    """Validate a `flash_mla_sparse_fwd` call; raise ValidationError on the first bad argument.

    q: bf16 [s_q, h_q, 576]; kv: bf16 [s_kv, 1, 576]; indices: int32 [s_q, 1, topk];
    attn_sink: f32 [h_q] or None; topk_length: int32 [s_q] or None.
    """
    want_q = f"bfloat16 [s_q, h_q, {D_QK}] with h_q in {HEAD_COUNTS}"
    _dtype("q", q, (torch.bfloat16,), want_q)
    _rank("q", q, 3, want_q)
    s_q, h_q, d_qk = q.shape
    if d_qk != D_QK or h_q not in HEAD_COUNTS:
        _fail("q", q, want_q)
    want_kv = f"bfloat16 [s_kv, 1, {D_QK}] with s_kv >= 1"
    _dtype("kv", kv, (torch.bfloat16,), want_kv)
    _rank("kv", kv, 3, want_kv)
    s_kv = kv.shape[0]
    if s_kv < 1 or kv.shape[1] != 1 or kv.shape[2] != D_QK:
        _fail("kv", kv, want_kv)
    want_idx = (f"int32 [s_q={s_q}, 1, topk] with topk a positive multiple of "
                f"{PREFILL_TOPK_MULTIPLE}")
    _dtype("indices", indices, (torch.int32,), want_idx)
    _rank("indices", indices, 3, want_idx)
    topk = indices.shape[2]
    if indices.shape[0] != s_q or indices.shape[1] != 1 or topk < 1 \
            or topk % PREFILL_TOPK_MULTIPLE:
        _fail("indices", indices, want_idx)
    check_scale("sm_scale", sm_scale, required=True)
    check_d_v(d_v)
    _check_sink(attn_sink, h_q)
    if topk_length is not None:
        want_len = f"int32 [s_q={s_q}], contiguous, values in [0, topk={topk}]"
        _dtype("topk_length", topk_length, (torch.int32,), want_len)
        if tuple(topk_length.shape) != (s_q,):
            _fail("topk_length", topk_length, want_len)
    _same_device(q, kv=kv, indices=indices, attn_sink=attn_sink, topk_length=topk_length)
    _has_data(q=q)
    _last_dim_contiguous(q=q, kv=kv, indices=indices)
    _contiguous_1d(attn_sink=attn_sink, topk_length=topk_length)
    _aligned(q=q, kv=kv)
    _index_strides(indices)
    _strides_fit(q=q, kv=kv, indices=indices)
    _sink_values(attn_sink)
    if topk_length is not None and s_q:
        lo, hi = int(topk_length.min()), int(topk_length.max())
        if lo < 0 or hi > topk:
            raise ValidationError(
                f"topk_length: expected values in [0, topk={topk}]; got min {lo}, max {hi} "
                f"({describe(topk_length)})", argument="topk_length")
    if check_finite:
        _finite("q", q)
    return PrefillShape(s_q, h_q, s_kv, topk)


def check_decode(q, k_cache, indices, softmax_scale=None, attn_sink=None, *,
                 check_finite: bool = False, seq_lens=None) -> DecodeShape:
    """Validate a sparse FP8 `flash_mla_with_kvcache` call; raise ValidationError on the first
    bad argument.

    q: bf16 [b, s_q, h_q, 576]; k_cache: uint8/int8/float8_e4m3fn [num_blocks, block_size, 1, 656];
    indices: int32 [b, s_q, topk] of flat rows (block * block_size + offset) or -1;
    attn_sink: f32 [h_q] or None; seq_lens: an integer tensor [b] of lengths >= 1, or None.
    """
    want_q = f"bfloat16 [b, s_q, h_q, {D_QK}] with h_q in {HEAD_COUNTS}"
    _dtype("q", q, (torch.bfloat16,), want_q)
    _rank("q", q, 4, want_q)
    b, s_q, h_q, d_qk = q.shape
    if d_qk != D_QK or h_q not in HEAD_COUNTS:
        _fail("q", q, want_q)
    want_cache = (f"uint8, int8 or float8_e4m3fn [num_blocks, block_size, 1, {FP8_ROW_BYTES}] "
                  f"(656-byte FP8 rows) with num_blocks, block_size >= 1")
    _dtype("k_cache", k_cache, PACKED_DTYPES, want_cache)
    _rank("k_cache", k_cache, 4, want_cache)
    num_blocks, block_size, h_kv, row_bytes = k_cache.shape
    if num_blocks < 1 or block_size < 1 or h_kv != 1 or row_bytes != FP8_ROW_BYTES:
        _fail("k_cache", k_cache, want_cache)
    want_idx = (f"int32 [b={b}, s_q={s_q}, topk] with topk a positive multiple of "
                f"{DECODE_TOPK_MULTIPLE}")
    _dtype("indices", indices, (torch.int32,), want_idx)
    _rank("indices", indices, 3, want_idx)
    topk = indices.shape[2]
    if indices.shape[0] != b or indices.shape[1] != s_q or topk < 1 \
            or topk % DECODE_TOPK_MULTIPLE:
        _fail("indices", indices, want_idx)
    check_scale("softmax_scale", softmax_scale, required=False)
    _check_sink(attn_sink, h_q)
    _same_device(q, k_cache=k_cache, indices=indices, attn_sink=attn_sink)
    _has_data(q=q)
    _last_dim_contiguous(q=q, k_cache=k_cache, indices=indices)
    # FlashMLA checks the row stride whatever the block size, a block of one row included
    # (deepseek-ai/FlashMLA@9241ae3 csrc/api/sparse_decode.h:301, @1408756 csrc/pybind.cpp:255)
    if k_cache.stride(1) != FP8_ROW_BYTES:
        raise ValidationError(
            f"k_cache: expected each cache block's rows packed (stride(1) == {FP8_ROW_BYTES}, for "
            f"every block size); got strides {tuple(k_cache.stride())} ({describe(k_cache)})",
            argument="k_cache")
    # SM100 reads the cache through a TMA map of 656-byte rows: the block stride must be a whole
    # number of rows, and the cache at most 2**31 of them (csrc/sm100/decode/head64/kernel.cuh:912,
    # config.h:41 TMA_K_STRIDE; sgl-flash-mla 1.0.0 checks num_blocks * stride(0) / 656 <= INT32_MAX)
    if k_cache.stride(0) % FP8_ROW_BYTES:
        raise ValidationError(
            f"k_cache: expected the block stride (stride(0) = {k_cache.stride(0)} bytes) to be a "
            f"multiple of {FP8_ROW_BYTES} bytes (whole rows); pad the blocks by whole rows "
            f"({describe(k_cache)})", argument="k_cache")
    if num_blocks * (k_cache.stride(0) // FP8_ROW_BYTES) > INT32_MAX:
        raise ValidationError(
            f"k_cache: expected num_blocks * stride(0) / {FP8_ROW_BYTES} <= 2**31 - 1 (FlashMLA "
            f"addresses rows with int32); got {num_blocks} blocks of stride {k_cache.stride(0)} "
            f"({describe(k_cache)})", argument="k_cache")
    _contiguous_1d(attn_sink=attn_sink)
    _aligned(q=q, k_cache=k_cache)
    _index_strides(indices)
    _strides_fit(q=q, k_cache=k_cache, indices=indices)
    _sink_values(attn_sink)
    shape = DecodeShape(b, s_q, h_q, num_blocks, block_size, topk)
    _check_seq_lens(seq_lens, q)
    _decode_index_range(indices, shape.rows)
    if check_finite:
        _finite("q", q)
    return shape


def check_scale(name: str, value, *, required: bool) -> None:
    """A softmax scale is a finite real number (None allowed when not required)."""
    if value is None and not required:
        return
    try:  # float() of an int past 1e308 raises OverflowError: not finite either
        finite = not isinstance(value, bool) and isinstance(value, numbers.Real) and math.isfinite(float(value))
    except (OverflowError, ValueError, TypeError):
        finite = False
    if not finite:
        need = "a finite real number" if required else "None or a finite real number"
        raise ValidationError(f"{name}: expected {need}; got {describe(value)}", argument=name)


def check_d_v(d_v) -> None:
    """The value head dim is 512, the only one FlashMLA's sparse kernels support."""
    if isinstance(d_v, bool) or not isinstance(d_v, numbers.Integral) or int(d_v) != D_V:
        raise ValidationError(f"d_v: expected {D_V} (the only value FlashMLA supports); "
                              f"got {describe(d_v)}", argument="d_v")


# ---- helpers: each raises ValidationError naming the argument --------------------------------

def _fail(name: str, x, expected: str):
    raise ValidationError(f"{name}: expected {expected}; got {describe(x)}", argument=name)


def _dtype(name: str, x, dtypes: Sequence[torch.dtype], expected: str) -> None:
    if not isinstance(x, torch.Tensor) or x.dtype not in dtypes:
        _fail(name, x, expected)
    if x.layout != torch.strided:  # a sparse or nested tensor has no strides to check or read
        raise ValidationError(f"{name}: expected a dense tensor (layout torch.strided); got layout "
                              f"{x.layout} ({describe(x)})", argument=name)
    if not x.is_meta:  # a meta tensor is named by _has_data; anything else must hold its shape
        check_readable(x, name)


def _check_seq_lens(seq_lens, q: torch.Tensor) -> None:
    """seq_lens: None, or an integer tensor [b] of lengths >= 1 on q's device or the CPU."""
    if seq_lens is None:
        return
    b = q.shape[0]
    want = f"an integer tensor [b={b}] of sequence lengths >= 1, on {q.device} or the CPU"
    _dtype("seq_lens", seq_lens, (torch.int16, torch.int32, torch.int64), want)
    if tuple(seq_lens.shape) != (b,) or seq_lens.device.type not in ("cpu", q.device.type):
        _fail("seq_lens", seq_lens, want)
    if b and int(seq_lens.min()) < 1:
        raise ValidationError(f"seq_lens: expected lengths >= 1; got min {int(seq_lens.min())} "
                              f"({describe(seq_lens)})", argument="seq_lens")


def _rank(name: str, x: torch.Tensor, ndim: int, expected: str) -> None:
    if x.dim() != ndim:
        _fail(name, x, expected)


def _check_sink(attn_sink, h_q: int) -> None:
    if attn_sink is None:
        return
    want = f"float32 [h_q={h_q}], contiguous, no NaN (+-inf allowed)"
    _dtype("attn_sink", attn_sink, (torch.float32,), want)
    if tuple(attn_sink.shape) != (h_q,):
        _fail("attn_sink", attn_sink, want)


def _sink_values(attn_sink) -> None:
    """NaN has no meaning as a sink logit (+-inf do: no sink, or a zeroed head)."""
    if attn_sink is not None and bool(torch.isnan(attn_sink).any()):
        raise ValidationError(f"attn_sink: expected no NaN; got {describe(attn_sink)} holding "
                              f"{int(torch.isnan(attn_sink).sum())} NaN", argument="attn_sink")


def _present(tensors: dict) -> Iterable:
    return ((n, t) for n, t in tensors.items() if t is not None)


def _same_device(q: torch.Tensor, **others) -> None:
    for name, t in _present(others):
        if t.device != q.device:
            raise ValidationError(
                f"{name}: expected on q's device {q.device} (every tensor on one device); "
                f"got {describe(t)}", argument=name)


def _has_data(q: torch.Tensor) -> None:
    """Every tensor is on q's device (checked before); that device must hold data."""
    if q.device.type == "meta":
        raise ValidationError(f"q: expected tensors with data on a real device (CPU or CUDA); got "
                              f"{describe(q)}: a meta tensor has no values to check or attend over",
                              argument="q")


def _last_dim_contiguous(**tensors) -> None:
    for name, t in _present(tensors):
        if t.shape[-1] > 1 and t.stride(-1) != 1:
            raise ValidationError(
                f"{name}: expected the last dim contiguous (stride(-1) == 1); got strides "
                f"{tuple(t.stride())} ({describe(t)})", argument=name)


def _contiguous_1d(**tensors) -> None:
    for name, t in _present(tensors):
        if not t.is_contiguous():
            raise ValidationError(f"{name}: expected a contiguous tensor; got strides "
                                  f"{tuple(t.stride())} ({describe(t)})", argument=name)


def _aligned(**tensors) -> None:
    for name, t in _present(tensors):
        if t.numel() and t.data_ptr() % BASE_ALIGN_BYTES:
            raise ValidationError(
                f"{name}: expected a base address aligned to {BASE_ALIGN_BYTES} bytes (TMA); got "
                f"an address {t.data_ptr() % BASE_ALIGN_BYTES} bytes past a boundary "
                f"({describe(t)}); copy it with .contiguous() or slice on aligned rows",
                argument=name)


def _index_strides(indices: torch.Tensor) -> None:
    for dim in range(indices.dim() - 1):
        if indices.shape[dim] > 1 and indices.stride(dim) % INDEX_STRIDE_ELEMS:
            raise ValidationError(
                f"indices: expected outer strides that are multiples of {INDEX_STRIDE_ELEMS} "
                f"elements (32 bytes); got strides {tuple(indices.stride())} "
                f"({describe(indices)})", argument="indices")


def _strides_fit(**tensors) -> None:
    for name, t in _present(tensors):
        if any(s > INT32_MAX for s in t.stride()):
            raise ValidationError(f"{name}: expected every stride below 2**31 elements; got "
                                  f"strides {tuple(t.stride())} ({describe(t)})", argument=name)


def _decode_index_range(indices: torch.Tensor, rows: int) -> None:
    """Every decode index is -1 or a cache row: the kernel reads any other value."""
    if indices.numel() == 0:
        return
    bad = (indices != -1) & ((indices < 0) | (indices >= rows))
    count = int(bad.sum())
    if count == 0:
        return
    first = tuple(int(i) for i in bad.nonzero()[0])
    value = int(indices[first])
    raise ValidationError(
        f"indices: {count} of {indices.numel()} entries are neither -1 nor a cache row; valid "
        f"rows are 0..{rows - 1} (num_blocks * block_size = {rows}); first bad entry "
        f"indices[{', '.join(map(str, first))}] = {value} ({describe(indices)}). FlashMLA's "
        f"decode kernel skips only -1 and reads any other value, out of bounds here; mark "
        f"unused slots with -1", argument="indices")


def _finite(name: str, x: torch.Tensor) -> None:
    bad = ~torch.isfinite(x)
    count = int(bad.sum())
    if count:
        first = tuple(int(i) for i in bad.nonzero()[0])
        raise ValidationError(
            f"{name}: expected finite values (check_finite=True); {count} entries are NaN or "
            f"inf, first at {name}[{', '.join(map(str, first))}] = {float(x[first])} "
            f"({describe(x)})", argument=name)

