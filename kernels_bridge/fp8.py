"""The DeepSeek-V3.2 FP8 KV-cache row: 576 bf16 values packed into 656 bytes.

| bytes    | content                                                          |
|----------|------------------------------------------------------------------|
| 0..511   | 512 x float8_e4m3fn: NoPE dims 0..511 (also V), quantized        |
| 512..527 | 4 x float32 scales, little-endian; scale i covers dims 128i..128i+127 |
| 528..655 | 64 x bfloat16: RoPE dims 512..575, copied unquantized            |

Two ways to choose a tile's scale, both with the same layout (`scale_mode`):

- ``"sglang"`` (the default): what SGLang's server writes (`memory_pool.py` -> the Triton kernel
  `_quantize_k_cache_fast_kernel` of `dsa_quant_k_cache.py`), step for step in float32:
  y = float32(x); s = max |y| / 448; inv = 1 / s; code = float8_e4m3fn(clamp(y * inv, -448, 448)),
  round to nearest even. The scale is the raw amax / 448. An all-zero tile gets s = 0, inv = inf
  and y * inv = NaN, which the clamp turns into -448 (PTX max.f32 returns its non-NaN operand):
  codes 0xFE, dequantized to -0.0. Below an amax of 448 * 2**-128, 1 / s overflows to inf and
  every nonzero code saturates to +-448 (real activations never come near). The division here is
  IEEE's; Triton on a GPU divides with
  div.full.f32 (within 2 ulp), so a GPU-written scale can differ from this one in its last bit.
- ``"flashmla"``: FlashMLA's `tests/quant.py`, bit-identical to the rows its tests feed its
  kernels: s = amax / 448 in float32, then s = 2 ** ceil(log2(max(s, 1e-4))) (a power of two; an
  all-zero tile gets 2**-13); code = float8_e4m3fn(float32(x) / s). For bf16 inputs this is
  exactly the smallest power of two >= max(amax / 448, 1e-4) (the tests check every bf16 amax).
  A tile whose amax exceeds about 1.94 * 2**127 (near bf16's maximum) gets s = 2**120 and a code
  of 256, and 256 * 2**120 = 2**128 overflows to inf on dequantization, as in FlashMLA's
  reference; real KV activations never come near.

Dequantized value = bf16(float32(code) * s), whatever the mode (`fp8_unpack` says how it is
computed fast and bit-exactly). Round-trip bound, either mode (SGLang's above the saturation just
described): |dequantize(quantize(x)) - x| <= max(2**-4 * |x|, 2**-10 * s) + 2**-8 * |x| for every
element x of a tile with scale s (e4m3 keeps 3 mantissa bits: half an ulp is 2**-4 relative in the
normal range; below 2**-6 * s the codes are subnormal with spacing 2**-9 * s; the last term covers
the final bf16 rounding, zero for powers of two). The RoPE dims round-trip exactly.
"""
from __future__ import annotations

import torch

from kernels_bridge.errors import ValidationError, describe, shown
from kernels_bridge.fp8_unpack import unpack_rows
from kernels_bridge.layout import (BF16_ROW_BYTES, D_NOPE, D_QK, D_ROPE, FP8_ROW_BYTES,  # noqa: F401
                                    NUM_TILES, ROPE_AT, SCALE_BYTES, SCALES_AT, TILE)  # exported here too
from kernels_bridge.tensor_checks import check_readable, check_writable

__all__ = ["FP8_ROW_BYTES", "SCALE_MODES", "quantize_kv_fp8", "dequantize_kv_fp8", "dequantize_kv_fp8_f32"]

FP8_MAX = 448.0
SCALE_FLOOR = 1e-4    # FlashMLA's FP8_AMAX_MARGIN: keeps an all-zero tile's scale at 2**-13
SCALE_MODES = ("sglang", "flashmla")

PACKED_DTYPES = (torch.uint8, torch.int8, torch.float8_e4m3fn)


def tile_scales(nope: torch.Tensor) -> torch.Tensor:
    """Per-tile power-of-two scales, computed as FlashMLA's quantizer does.

    nope: bf16 [..., 4, 128]. Returns float32 [..., 4].
    """
    amax = nope.abs().amax(dim=-1).float()  # bf16 max is exact; widen afterwards like upstream
    raw = amax / FP8_MAX
    return torch.pow(2, raw.clamp_min(SCALE_FLOOR).log2().ceil()).to(torch.float32)


def quantize_kv_fp8(kv: torch.Tensor, scale_mode: str = "sglang") -> torch.Tensor:
    """Pack bf16 KV rows into 656-byte FP8 rows.

    kv: bf16 [..., 576] (any leading shape, any device, any strides). scale_mode: ``"sglang"``
    (raw amax / 448 scales, as SGLang's server writes them) or ``"flashmla"`` (FlashMLA's
    power-of-two scales). Returns uint8 [..., 656], contiguous, on kv's device.
    """
    if not isinstance(kv, torch.Tensor):
        raise ValidationError(f"kv: expected a bfloat16 tensor [..., {D_QK}] to quantize; got {describe(kv)}",
                              argument="kv")
    check_readable(kv, "kv")
    if kv.dtype != torch.bfloat16 or kv.dim() < 1 or kv.shape[-1] != D_QK:
        raise ValidationError(f"kv: expected a bfloat16 tensor [..., {D_QK}] to quantize; got {describe(kv)}",
                              argument="kv")
    if scale_mode not in SCALE_MODES:
        raise ValidationError(f"scale_mode: got {shown(scale_mode)}; expected one of {', '.join(SCALE_MODES)}",
                              argument="scale_mode")
    lead = kv.shape[:-1]
    nope = kv[..., :D_NOPE].reshape(*lead, NUM_TILES, TILE)
    if scale_mode == "flashmla":
        scales = tile_scales(nope)  # [..., 4]
        codes = (nope.float() / scales.unsqueeze(-1)).to(torch.float8_e4m3fn)
    else:
        y = nope.float()
        scales = y.abs().amax(dim=-1) / FP8_MAX
        scaled = y * (1.0 / scales).unsqueeze(-1)
        codes = scaled.nan_to_num_(nan=-FP8_MAX).clamp_(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    row = torch.empty(*lead, FP8_ROW_BYTES, dtype=torch.uint8, device=kv.device)
    row[..., :D_NOPE] = codes.reshape(*lead, D_NOPE).view(torch.uint8)
    row[..., SCALES_AT:ROPE_AT] = _bytes_of(scales)
    row[..., ROPE_AT:] = _bytes_of(kv[..., D_NOPE:])
    return row


def dequantize_kv_fp8(packed: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """Unpack 656-byte FP8 rows into bf16 KV rows.

    packed: uint8, int8 or float8_e4m3fn [..., 656] (any leading shape; a view of the cache is
    fine), with either scale mode's scales. out: None, or a contiguous bf16 tensor [..., 576] of
    packed's leading shape on its device, not requiring grad, written in place (a caller that
    dequantizes every step reuses one). Returns bf16 [..., 576], contiguous, on packed's device
    (`out` when given).
    """
    raw = _packed_bytes(packed, "packed")
    lead = raw.shape[:-1]
    if out is None:
        out = torch.empty(*lead, D_QK, dtype=torch.bfloat16, device=packed.device)
    else:
        if not isinstance(out, torch.Tensor) or out.dtype != torch.bfloat16 or out.layout != torch.strided \
                or out.is_nested or out.shape != (*lead, D_QK) or out.device != packed.device \
                or not out.is_contiguous():
            raise ValidationError(
                f"out: expected a contiguous bfloat16 tensor {list(lead) + [D_QK]} on {packed.device}; "
                f"got {describe(out)}", argument="out")
        check_writable(out, "out")
    unpack_rows(raw.reshape(-1, FP8_ROW_BYTES), out.view(-1, D_QK))
    return out


def dequantize_kv_fp8_f32(rows: torch.Tensor) -> torch.Tensor:
    """Unpack FP8 rows straight to float32, for kernels that compute in float32.

    rows: uint8, int8 or float8_e4m3fn [..., 656], checked as `dequantize_kv_fp8` checks
    `packed`. Returns float32 [..., 576] holding exactly the values of
    `dequantize_kv_fp8(rows).float()` (the bf16 rounding included), a pass cheaper."""
    raw = _packed_bytes(rows, "rows")
    out = torch.empty(*raw.shape[:-1], D_QK, dtype=torch.float32, device=rows.device)
    unpack_rows(raw.reshape(-1, FP8_ROW_BYTES), out.view(-1, D_QK))
    return out


def _packed_bytes(packed, name: str) -> torch.Tensor:
    """`packed` as uint8 [..., 656] after every check a read of it needs."""
    expected = f"a uint8, int8 or float8_e4m3fn tensor [..., {FP8_ROW_BYTES}] of FP8 KV rows"
    if not isinstance(packed, torch.Tensor):
        raise ValidationError(f"{name}: expected {expected}; got {describe(packed)}", argument=name)
    check_readable(packed, name)
    if packed.dtype not in PACKED_DTYPES or packed.dim() < 1 or packed.shape[-1] != FP8_ROW_BYTES:
        raise ValidationError(f"{name}: expected {expected}; got {describe(packed)}", argument=name)
    return packed.view(torch.uint8)  # same item size: a free reinterpretation


def _bytes_of(x: torch.Tensor) -> torch.Tensor:
    """The little-endian bytes of x's last dim: [..., n] of itemsize k -> uint8 [..., n * k]."""
    return x.contiguous().view(torch.uint8)
