"""Independent, deliberately plain computations the bridge is checked against.

Nothing here uses kernels_bridge: the FP8 row is built and read byte by byte with `struct` and a
hand-written e4m3 codec, and attention is a per-query float64 loop in numpy. Slow on purpose;
use small shapes.
"""
from __future__ import annotations

import math
import struct
from typing import List, Optional, Sequence, Tuple

import numpy as np
import torch

FP8_MAX = 448.0


# ---- float8 e4m3fn, by its definition ---------------------------------------------------------

def e4m3_value(code: int) -> float:
    """Value of an e4m3fn byte: 1 sign bit, 4 exponent bits (bias 7), 3 mantissa bits; S.1111.111
    is NaN; there are no infinities."""
    sign = -1.0 if code & 0x80 else 1.0
    exp, man = (code >> 3) & 0xF, code & 0x7
    if exp == 0xF and man == 0x7:
        return math.nan
    if exp == 0:
        return sign * man * 2.0 ** -9
    return sign * (1.0 + man / 8.0) * 2.0 ** (exp - 7)


_POSITIVE = [(e4m3_value(c), c) for c in range(0x7F)]  # 0 .. 448, increasing with the code


def e4m3_encode(x: float) -> int:
    """Round to the nearest e4m3fn value, ties to the even code, saturating at +-448 (torch's
    cast)."""
    if math.isnan(x):
        return 0x7F
    sign = 0x80 if (x < 0 or (x == 0 and math.copysign(1.0, x) < 0)) else 0
    mag = abs(x)
    if mag >= FP8_MAX:
        return sign | 0x7E
    best = min(_POSITIVE, key=lambda vc: (abs(vc[0] - mag), vc[1] & 1))
    return sign | best[1]


def e4m3_table() -> np.ndarray:
    """float64 [256]: the value of every byte."""
    return np.array([e4m3_value(c) for c in range(256)], dtype=np.float64)


# ---- the 656-byte row, byte by byte -----------------------------------------------------------

def bf16_bits(value: float) -> int:
    """The 16 bits of a bf16-exact float: the top half of its float32 pattern."""
    return struct.unpack("<I", struct.pack("<f", value))[0] >> 16


def pack_row(values: Sequence[float], scale_mode: str = "sglang") -> bytes:
    """Quantize 576 bf16-exact floats into the 656-byte V3.2 row, one element at a time.

    "sglang" (SGLang's Triton writer, dsa_quant_k_cache.py, in float32): s = amax / 448,
    inv = 1 / s, code = e4m3(clamp(v * inv, -448, 448)), a NaN product (0 * inf) clamped to -448.
    "flashmla" (FlashMLA's tests/quant.py): s = amax / 448 (float32 arithmetic), then the smallest
    power of two >= max(s, 1e-4), found exactly with frexp (the bridge follows FlashMLA's float32
    log2; the two agree except within a float32 ulp above a power of two); code = e4m3(v / s).
    """
    assert len(values) == 576
    codes: List[int] = []
    scales: List[float] = []
    for tile in range(4):
        chunk = [float(v) for v in values[tile * 128:(tile + 1) * 128]]
        amax = max(abs(v) for v in chunk)
        raw = np.float32(amax) / np.float32(FP8_MAX)
        if scale_mode == "sglang":
            with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
                inv = np.float32(1.0) / raw
                products = [np.float32(v) * inv for v in chunk]
            scales.append(float(raw))
            codes.extend(e4m3_encode(-FP8_MAX if math.isnan(p) else max(-FP8_MAX, min(FP8_MAX, float(p))))
                         for p in products)
            continue
        raw = max(float(raw), float(np.float32(1e-4)))
        mant, exp = math.frexp(raw)       # raw = mant * 2**exp, 0.5 <= mant < 1
        scale = 2.0 ** (exp - 1) if mant == 0.5 else 2.0 ** exp
        scales.append(scale)
        codes.extend(e4m3_encode(float(np.float32(v) / np.float32(scale))) for v in chunk)
    rope = b"".join(struct.pack("<H", bf16_bits(float(v))) for v in values[512:])
    return bytes(codes) + struct.pack("<4f", *scales) + rope


def unpack_row(row: bytes) -> Tuple[List[float], List[float]]:
    """Read a 656-byte row: (576 dequantized values as float64, the 4 scales): each NoPE value
    is bf16(float32(code) * scale), rounded here by hand."""
    assert len(row) == 656
    scales = list(struct.unpack("<4f", row[512:528]))
    nope = [bf16_round(float(np.float32(e4m3_value(row[i])) * np.float32(scales[i // 128])))
            for i in range(512)]
    rope = [struct.unpack("<f", struct.pack("<I", h << 16))[0]
            for h in struct.unpack("<64H", row[528:656])]
    return nope + rope, scales


def bf16_round(value: float) -> float:
    """A float32 value rounded to bf16, to nearest, ties to even (NaN stays NaN)."""
    if math.isnan(value):
        return value
    bits = struct.unpack("<I", struct.pack("<f", value))[0]
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return struct.unpack("<f", struct.pack("<I", bits & 0xFFFFFFFF))[0]


def dequantize_rows_np(rows: np.ndarray) -> np.ndarray:
    """uint8 [n, 656] -> float64 [n, 576], vectorised over rows with numpy only: the NoPE values
    are float32(code) * float32(scale), rounded to bf16 (to nearest even) with integer arithmetic
    on their float32 bits."""
    table = e4m3_table().astype(np.float32)
    codes = table[rows[:, :512]]
    scales = rows[:, 512:528].copy().view("<f4")      # [n, 4]
    with np.errstate(over="ignore", invalid="ignore"):
        products = (codes * np.repeat(scales, 128, axis=1)).astype(np.float32)
    bits = products.view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).astype(np.uint32).view(np.float32)
    nope = np.where(np.isnan(products), products, rounded).astype(np.float64)
    rope_bits = rows[:, 528:656].copy().view("<u2").astype(np.uint32) << 16
    rope = rope_bits.view("<f4").astype(np.float64)
    return np.concatenate([nope, rope], axis=1)


# ---- attention, one query at a time in float64 -----------------------------------------------

def _attend(q: np.ndarray, keys: np.ndarray, scale: float, sink: Optional[np.ndarray]):
    """q [h, 576], keys [m, 576] (m may be 0) -> out [h, 512], max_logits [h], lse [h]."""
    h = q.shape[0]
    if keys.shape[0] == 0:
        return np.zeros((h, 512)), np.full(h, -np.inf), np.full(h, np.inf)
    logits = (q @ keys.T) * scale                          # [h, m]
    mx = logits.max(axis=1)
    weights = np.exp(logits - mx[:, None])
    total = weights.sum(axis=1)
    lse = mx + np.log(total)
    out = (weights / total[:, None]) @ keys[:, :512]
    if sink is not None:
        out = out * (1.0 / (1.0 + np.exp(sink - lse)))[:, None]
    return out, mx, lse


def _f64(t: torch.Tensor) -> np.ndarray:
    return t.detach().to(torch.float64).cpu().numpy()


def prefill_oracle(q, kv, indices, sm_scale, attn_sink=None, topk_length=None):
    """Sparse prefill in float64. Returns (out [s_q, h, 512], max_logits [s_q, h], lse [s_q, h])."""
    qn, kvn = _f64(q), _f64(kv[:, 0, :])
    idx = indices[:, 0, :].cpu().numpy().astype(np.int64)
    sink = None if attn_sink is None else _f64(attn_sink)
    s_q, h = qn.shape[:2]
    out, mx, lse = np.zeros((s_q, h, 512)), np.zeros((s_q, h)), np.zeros((s_q, h))
    for i in range(s_q):
        row = idx[i] if topk_length is None else idx[i][:int(topk_length[i])]
        picked = [int(j) for j in row if 0 <= j < kvn.shape[0]]
        out[i], mx[i], lse[i] = _attend(qn[i], kvn[picked], sm_scale, sink)
    return out, mx, lse


def decode_oracle(q, k_cache, indices, softmax_scale=None, attn_sink=None):
    """Sparse FP8 decode in float64 over the dequantized picked rows.
    Returns (out [b, s_q, h, 512], lse [b, h, s_q])."""
    b, s_q, h, d = q.shape
    scale = d ** -0.5 if softmax_scale is None else softmax_scale
    rows = k_cache.view(torch.uint8).reshape(-1, 656).cpu().numpy()
    qn = _f64(q)
    idx = indices.cpu().numpy().astype(np.int64)
    sink = None if attn_sink is None else _f64(attn_sink)
    out, lse = np.zeros((b, s_q, h, 512)), np.zeros((b, h, s_q))
    for i in range(b):
        for j in range(s_q):
            picked = [int(r) for r in idx[i, j] if r != -1]
            keys = dequantize_rows_np(rows[picked]) if picked else np.zeros((0, 576))
            out[i, j], _, lse[i, :, j] = _attend(qn[i, j], keys, scale, sink)
    return out, lse
