"""The DeepSeek-V3.2 FP8 KV-cache row: 576 bf16 values packed into 656 bytes.

| bytes    | content                                                          |
|----------|------------------------------------------------------------------|
| 0..511   | 512 x float8_e4m3fn: NoPE dims 0..511 (also V), quantized        |
| 512..527 | 4 x float32 scales, little-endian; scale i covers dims 128i..128i+127 |
| 528..655 | 64 x bfloat16: RoPE dims 512..575, copied unquantized            |

Numerics follow FlashMLA's `tests/quant.py` step for step, so rows written here are bit-identical to
the ones FlashMLA's tests feed its kernels:
- amax = max |x| over the 128-dim tile, taken in bf16 (exact), then widened to float32;
- s = amax / 448 in float32; s = 2 ** ceil(log2(max(s, 1e-4))) with float32 `log2`, so every
  scale is a power of two and an all-zero tile gets 2**-13. For bf16 inputs this is exactly the
  smallest power of two >= max(amax / 448, 1e-4): amax / 448 never falls within a float32 ulp
  above a power of two without equalling it (the tests check every bf16 amax);
- code = float8_e4m3fn(float32(x) / s) (round to nearest even; torch's cast saturates at 448);
- dequantized value = bf16(float32(code) * s).
With power-of-two scales, dequantization is exact up to the final bf16 rounding, which is itself
exact unless the product overflows: a tile whose amax exceeds about 1.94 * 2**127 (near bf16's
maximum) gets s = 2**120 and a code of 256, and 256 * 2**120 = 2**128 overflows to inf. FlashMLA's
reference quantizer behaves the same; real KV activations never come near.

Round-trip bound: |dequantize(quantize(x)) - x| <= max(2**-4 * |x|, 2**-10 * s) for every element x
of a tile with scale s (e4m3 keeps 3 mantissa bits: half an ulp is 2**-4 relative in the normal
range; below 2**-6 * s the codes are subnormal with spacing 2**-9 * s). The RoPE dims round-trip
exactly.
"""
from __future__ import annotations

import torch

from kernels_bridge.errors import ValidationError, describe
from kernels_bridge.layout import (BF16_ROW_BYTES, D_NOPE, D_QK, D_ROPE, FP8_ROW_BYTES,  # noqa: F401
                                    NUM_TILES, SCALE_BYTES, TILE)  # the row layout, exported here too

__all__ = ["FP8_ROW_BYTES", "quantize_kv_fp8", "dequantize_kv_fp8", "dequantize_kv_fp8_f32"]

FP8_MAX = 448.0
SCALE_FLOOR = 1e-4    # FlashMLA's FP8_AMAX_MARGIN: keeps an all-zero tile's scale at 2**-13

# byte offsets inside a row
SCALES_AT = D_NOPE            # 512
ROPE_AT = D_NOPE + SCALE_BYTES  # 528

PACKED_DTYPES = (torch.uint8, torch.int8, torch.float8_e4m3fn)


def tile_scales(nope: torch.Tensor) -> torch.Tensor:
    """Per-tile power-of-two scales, computed as FlashMLA's quantizer does.

    nope: bf16 [..., 4, 128]. Returns float32 [..., 4].
    """
    amax = nope.abs().amax(dim=-1).float()  # bf16 max is exact; widen afterwards like upstream
    raw = amax / FP8_MAX
    return torch.pow(2, raw.clamp_min(SCALE_FLOOR).log2().ceil()).to(torch.float32)


def quantize_kv_fp8(kv: torch.Tensor) -> torch.Tensor:
    """Pack bf16 KV rows into 656-byte FP8 rows.

    kv: bf16 [..., 576] (any leading shape, any device, any strides).
    Returns uint8 [..., 656], contiguous, on kv's device.
    """
    if not isinstance(kv, torch.Tensor) or kv.dtype != torch.bfloat16 or kv.dim() < 1 \
            or kv.shape[-1] != D_QK:
        raise ValidationError(
            f"kv: expected a bfloat16 tensor [..., {D_QK}] to quantize; got {describe(kv)}",
            argument="kv")
    lead = kv.shape[:-1]
    nope = kv[..., :D_NOPE].reshape(*lead, NUM_TILES, TILE)
    scales = tile_scales(nope)  # [..., 4]
    codes = (nope.float() / scales.unsqueeze(-1)).to(torch.float8_e4m3fn)
    row = torch.empty(*lead, FP8_ROW_BYTES, dtype=torch.uint8, device=kv.device)
    row[..., :D_NOPE] = codes.reshape(*lead, D_NOPE).view(torch.uint8)
    row[..., SCALES_AT:ROPE_AT] = _bytes_of(scales)
    row[..., ROPE_AT:] = _bytes_of(kv[..., D_NOPE:])
    return row


def dequantize_kv_fp8(packed: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """Unpack 656-byte FP8 rows into bf16 KV rows.

    packed: uint8, int8 or float8_e4m3fn [..., 656] (any leading shape; a view of the cache is
    fine). out: None, or a contiguous bf16 tensor [..., 576] of packed's leading shape on its
    device, written in place (a caller that dequantizes every step reuses one). Returns bf16
    [..., 576], contiguous, on packed's device (`out` when given).
    """
    if not isinstance(packed, torch.Tensor) or packed.dtype not in PACKED_DTYPES \
            or packed.dim() < 1 or packed.shape[-1] != FP8_ROW_BYTES:
        raise ValidationError(
            f"packed: expected a uint8, int8 or float8_e4m3fn tensor [..., {FP8_ROW_BYTES}] of "
            f"FP8 KV rows; got {describe(packed)}", argument="packed")
    raw = packed.view(torch.uint8)  # same item size: a free reinterpretation
    lead = raw.shape[:-1]
    if out is None:
        out = torch.empty(*lead, D_QK, dtype=torch.bfloat16, device=packed.device)
    elif not isinstance(out, torch.Tensor) or out.dtype != torch.bfloat16 or out.shape != (*lead, D_QK) \
            or out.device != packed.device or not out.is_contiguous():
        raise ValidationError(
            f"out: expected a contiguous bfloat16 tensor {list(lead) + [D_QK]} on {packed.device}; "
            f"got {describe(out)}", argument="out")
    _unpack(raw.reshape(-1, FP8_ROW_BYTES), out.view(-1, D_QK))  # the bf16 cast happens as it is written
    return out


def dequantize_kv_fp8_f32(rows: torch.Tensor) -> torch.Tensor:
    """Unpack FP8 rows straight to float32, for kernels that compute in float32.

    rows: uint8 [n, 656]. Returns float32 [n, 576] holding exactly the values of
    `dequantize_kv_fp8(rows).float()`: a code times a power-of-two scale is exact in float32 and
    representable in bf16 (see the module docstring), so skipping the bf16 round trip changes no
    bit; it saves a pass over the rows."""
    out = torch.empty(rows.shape[0], D_QK, dtype=torch.float32, device=rows.device)
    _unpack(rows, out)
    return out


ROWS_PER_STEP = 256  # rows a table look-up unpacks at a time: indices and values stay in the cache
EXPONENT_ROWS = 1024  # rows the exponent path unpacks at a time: its bits stay in the cache
_CODE_VALUES: dict = {}

# The exponent path (see _unpack_by_exponent), per output dtype: (integer view of the output,
# the factor that shifts an e4m3 byte's 7 magnitude bits to the top of the mantissa, the mask
# that keeps them and the sign, the exponent of 2**120 added to a scale's float32 bits).
_EXPONENT_PATH = {
    torch.bfloat16: (torch.int16, 1 << 4, -0x7810, 120 << 7),   # mask 0x87F0
    torch.float32: (torch.int32, 1 << 20, -0x78100000, 120 << 23),  # mask 0x87F00000
}
_SCALE_EXPONENTS = (1, 127 + 7)  # biased float32 exponents of the scales the exponent path takes


def _code_values(device) -> torch.Tensor:
    """float32 [256]: the value of every e4m3 code byte, by torch's own conversion (NaN for the
    two NaN codes), so a table look-up gives exactly the bits the conversion gives."""
    table = _CODE_VALUES.get(device)
    if table is None:
        table = torch.arange(256, dtype=torch.uint8, device=device).view(torch.float8_e4m3fn).float()
        _CODE_VALUES[device] = table
    return table


def _unpack(raw: torch.Tensor, out: torch.Tensor) -> None:
    """raw: uint8 [n, 656]; out: float32 or bf16 [n, 576], written with the dequantized rows.

    On the CPU, rows whose scales allow it take the exponent path (_unpack_by_exponent); the
    rest, and other devices, a look-up in the 256-entry table of code values: torch converts
    float8_e4m3fn to float32 one element at a time (about 10 ns each on a CPU), the table
    (index_select over int32 indices) gives the same floats several times faster."""
    n = raw.shape[0]
    if n == 0:
        return
    rope = raw[:, ROPE_AT:]
    try:  # the bf16 RoPE dims read in place where the row stride allows it
        rope = rope.view(torch.bfloat16)
    except RuntimeError:
        rope = rope.contiguous().view(torch.bfloat16)
    out[:, D_NOPE:].copy_(rope)
    if raw.device.type == "cpu" and _unpack_by_exponent(raw, out):
        return
    _unpack_by_table(raw, out, 0, n)


def _unpack_by_table(raw: torch.Tensor, out: torch.Tensor, start: int, stop: int) -> None:
    """The NoPE dims of rows start..stop by the table of code values, a block at a time through
    two reused buffers."""
    table = _code_values(raw.device)
    step = min(stop - start, ROWS_PER_STEP)
    index = torch.empty(step, D_NOPE, dtype=torch.int32, device=raw.device)
    values = torch.empty(step * D_NOPE, dtype=torch.float32, device=raw.device)
    for lo in range(start, stop, step):
        hi = min(stop, lo + step)
        m = hi - lo
        block = raw[lo:hi]
        index[:m].copy_(block[:, :D_NOPE])
        torch.index_select(table, 0, index[:m].view(-1), out=values[: m * D_NOPE])
        scales = block[:, SCALES_AT:ROPE_AT].contiguous().view(torch.float32)  # [m, 4]
        # scaled in place while contiguous (a broadcasting product into the strided output is
        # several times slower), then copied (and for bf16 rounded) into the rows
        values[: m * D_NOPE].view(m * NUM_TILES, TILE).mul_(scales.view(m * NUM_TILES, 1))
        out[lo:hi, :D_NOPE].copy_(values[: m * D_NOPE].view(m, D_NOPE))


def _unpack_by_exponent(raw: torch.Tensor, out: torch.Tensor) -> bool:
    """The NoPE dims without a table, in four vectorised passes, when every scale is a power of
    two 2**e with -126 <= e <= 7 (FlashMLA's quantizer writes 2**-13 .. 2**7 for any |x| up to
    57,344); returns False, writing nothing, otherwise.

    An e4m3 byte's sign and 7 magnitude bits, moved into a float's sign bit and the low bits of
    its exponent and top of its mantissa, read as the code's value times 2**-120 (exponent bias
    127 against e4m3's 7), subnormal codes included (they land on the float's subnormals).
    Multiplying that by 2**(e + 120), a normal float, gives the same real number as code * 2**e,
    rounded once: the same bits as the table's float32(code) * scale and its bf16 rounding.
    Blocks holding a NaN code (none in a cache the quantizer wrote) go by the table instead; so
    does everything when denormals are flushed (torch.set_flush_denormal)."""
    bits_dtype, shift, mask, bias = _EXPONENT_PATH[out.dtype]
    scale_bits = raw[:, SCALES_AT:ROPE_AT].contiguous().view(torch.int32)  # [n, 4]
    magnitude = scale_bits & torch.iinfo(torch.int32).max  # the bits but the sign
    low, high = torch.aminmax(magnitude)
    low, high, fraction = torch.stack([low, high, (magnitude & 0x7FFFFF).amax()]).tolist()
    lowest, highest = _SCALE_EXPONENTS
    if low < lowest << 23 or high > highest << 23 or fraction or not _denormals_kept():
        return False
    if out.dtype == torch.bfloat16:  # 2**(e + 120) in bf16: the top half of its float32 bits
        factors = ((scale_bits >> 16) + bias).to(torch.int16).view(torch.bfloat16)
    else:
        factors = (scale_bits + bias).view(torch.float32)
    n = raw.shape[0]
    step = min(n, EXPONENT_ROWS)
    codes = raw[:, :D_NOPE]
    signed = codes.view(torch.int8)
    bits = out.view(bits_dtype)
    for lo in range(0, n, step):
        hi = min(n, lo + step)
        m = hi - lo
        if _has_nan_code(codes[lo:hi]):  # read once for this, the block stays in the cache
            _unpack_by_table(raw, out, lo, hi)
            continue
        nope = bits[lo:hi, :D_NOPE]
        nope.copy_(signed[lo:hi]).mul_(shift)  # sign-extended: the sign fills the bits above
        nope.bitwise_and_(mask)  # keep the sign and the 7 magnitude bits
        out[lo:hi, :D_NOPE].view(m, NUM_TILES, TILE).mul_(factors[lo:hi].view(m, NUM_TILES, 1))
    return True


def _has_nan_code(codes: torch.Tensor) -> bool:
    """Whether uint8 codes hold a NaN code, 0x7F or 0xFF: the greatest byte as int8, as uint8."""
    return int(codes.view(torch.int8).amax()) == 0x7F or int(codes.amax()) == 0xFF


_SUBNORMAL = torch.tensor([2.0 ** -140])  # a float32 subnormal


def _denormals_kept() -> bool:
    """False when the CPU flushes subnormal floats to zero (torch.set_flush_denormal(True))."""
    return torch.mul(_SUBNORMAL, 2.0).item() != 0.0


def _bytes_of(x: torch.Tensor) -> torch.Tensor:
    """The little-endian bytes of x's last dim: [..., n] of itemsize k -> uint8 [..., n * k]."""
    return x.contiguous().view(torch.uint8)
