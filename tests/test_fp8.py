"""The 656-byte FP8 KV row, checked at byte level against an independent encoder."""
import math
import struct

import numpy as np
import pytest
import torch

from kernels_bridge import FP8_ROW_BYTES, ValidationError, dequantize_kv_fp8, quantize_kv_fp8
from kernels_bridge.fp8 import tile_scales
import tests.oracles.bridge_oracle as oracle

BF16_MAX = torch.finfo(torch.bfloat16).max


def realistic_kv(rows: int, seed: int = 0) -> torch.Tensor:
    """bf16 [rows, 576]: randn with per-channel magnitudes spanning several orders."""
    gen = torch.Generator().manual_seed(seed)
    channel = torch.exp(torch.randn(576, generator=gen) * 1.5)
    return (torch.randn(rows, 576, generator=gen) * channel).to(torch.bfloat16)


def scales_of(row: torch.Tensor):
    return struct.unpack("<4f", bytes(row[512:528].tolist()))


def test_row_size_and_layout():
    assert FP8_ROW_BYTES == 656 == 512 + 16 + 128
    kv = realistic_kv(6)
    packed = quantize_kv_fp8(kv)
    assert packed.dtype == torch.uint8 and packed.shape == (6, 656) and packed.is_contiguous()
    for i in range(6):
        values = kv[i].float().tolist()
        # scales at 512..527 read as little-endian float32, one per 128-dim tile
        want_scales = [max(abs(v) for v in values[t * 128:(t + 1) * 128]) for t in range(4)]
        for got, amax in zip(scales_of(packed[i]), want_scales, strict=True):
            assert got >= amax / 448 and (got < 2 * amax / 448 or got == 2.0 ** -13)
        # RoPE bytes are the bf16 bytes of dims 512..575, untouched
        rope = b"".join(struct.pack("<H", oracle.bf16_bits(v)) for v in values[512:])
        assert bytes(packed[i, 528:].tolist()) == rope


def test_bytes_match_independent_encoder():
    kv = realistic_kv(5, seed=3)
    kv[1, 128:256] = 0                        # an all-zero tile
    kv[2, :5] = torch.tensor([1e-30, -3e-38, 1e-39, 0.0, -0.0])  # tiny and subnormal values
    kv[3, 300] = 2.0 ** 100                   # one huge value flushes its tile's others to 0
    packed = quantize_kv_fp8(kv)
    for i in range(kv.shape[0]):
        want = oracle.pack_row(kv[i].float().tolist())
        got = bytes(packed[i].tolist())
        assert got == want, f"row {i}: first differing byte {_first_diff(got, want)}"


def test_every_bf16_amax_gets_the_smallest_power_of_two_scale():
    # all positive finite bf16 values as a tile's amax
    bits = torch.arange(1, 0x7F80, dtype=torch.int32).to(torch.int16)
    amax = bits.view(torch.bfloat16)
    tiles = torch.zeros(amax.numel(), 1, 128, dtype=torch.bfloat16)
    tiles[:, 0, 7] = amax
    got = tile_scales(tiles)[:, 0].double().numpy()
    raw = np.maximum(amax.float().numpy() / np.float32(448), np.float32(1e-4)).astype(np.float64)
    mant, exp = np.frexp(raw)
    want = np.where(mant == 0.5, np.ldexp(1.0, exp - 1), np.ldexp(1.0, exp))
    assert np.array_equal(got, want)


def test_scales_are_powers_of_two_and_zero_tile_gets_2_pow_minus_13():
    kv = realistic_kv(64, seed=5)
    kv[7, 384:512] = 0
    packed = quantize_kv_fp8(kv)
    scales = packed[:, 512:528].contiguous().view(torch.float32)
    mant, _ = np.frexp(scales.double().numpy())
    assert np.all(mant == 0.5)
    assert scales[7, 3].item() == 2.0 ** -13
    assert torch.all(packed[7, 384:512] == 0)


def test_round_trip_error_bound():
    """|deq - x| <= max(2**-4 |x|, 2**-10 s): half an e4m3 ulp (3 mantissa bits) in the normal
    range, half the subnormal spacing 2**-9 * s below it; the RoPE dims are exact."""
    kv = realistic_kv(512, seed=11)
    packed = quantize_kv_fp8(kv)
    back = dequantize_kv_fp8(packed)
    x, y = kv.double(), back.double()
    scales = packed[:, 512:528].contiguous().view(torch.float32).double()
    s = scales.repeat_interleave(128, dim=1)
    err = (y[:, :512] - x[:, :512]).abs()
    bound = torch.maximum(x[:, :512].abs() * 2.0 ** -4, s * 2.0 ** -10)
    assert torch.all(err <= bound)
    assert float((err / bound).max()) > 0.5        # the bound is tight, not vacuous
    assert torch.equal(back[:, 512:], kv[:, 512:])  # RoPE untouched


@pytest.mark.parametrize("magnitude", [2.0 ** 120, 1e20, 1.0, 1e-6, 1e-30, 1e-38])
def test_extreme_magnitudes_round_trip_within_bound(magnitude):
    kv = (realistic_kv(8, seed=17).float() / 8 * magnitude).to(torch.bfloat16)
    back = dequantize_kv_fp8(quantize_kv_fp8(kv)).double()
    x = kv.double()
    scales = quantize_kv_fp8(kv)[:, 512:528].contiguous().view(torch.float32).double()
    bound = torch.maximum(x[:, :512].abs() * 2.0 ** -4,
                          scales.repeat_interleave(128, dim=1) * 2.0 ** -10)
    assert torch.all(torch.isfinite(back))
    assert torch.all((back[:, :512] - x[:, :512]).abs() <= bound)


def test_bf16_max_overflows_on_dequantize_like_flashmla():
    # amax ~ 2**128 gives s = 2**120 and a code of 256: 256 * 2**120 overflows to inf. FlashMLA's
    # quantizer does the same; the largest value that survives is 240 * 2**120.
    kv = torch.zeros(2, 576, dtype=torch.bfloat16)
    kv[0, 0] = BF16_MAX
    kv[1, 0] = 240 * 2.0 ** 120
    back = dequantize_kv_fp8(quantize_kv_fp8(kv))
    assert back[0, 0].item() == math.inf
    assert back[1, 0].item() == 240 * 2.0 ** 120
    assert torch.all(back[:, 1:] == 0)


def test_subnormal_inputs_quantize_to_zero_codes():
    tiny = torch.full((1, 576), 1e-39, dtype=torch.bfloat16)   # bf16 subnormal
    packed = quantize_kv_fp8(tiny)
    assert torch.all(packed[0, :512] == 0)
    assert scales_of(packed[0]) == (2.0 ** -13,) * 4
    assert torch.equal(dequantize_kv_fp8(packed)[0, 512:], tiny[0, 512:])


@pytest.mark.parametrize("view", [torch.uint8, torch.int8, torch.float8_e4m3fn])
def test_dequantize_accepts_byte_views(view):
    kv = realistic_kv(10, seed=2)
    packed = quantize_kv_fp8(kv)
    assert torch.equal(dequantize_kv_fp8(packed.view(view)), dequantize_kv_fp8(packed))


@pytest.mark.parametrize("lead", [(), (7,), (2, 3, 4), (3, 64, 1), (0,), (2, 0)])
def test_any_leading_shape(lead):
    n = int(np.prod(lead)) if lead else 1
    kv = realistic_kv(max(n, 1), seed=4)[:n].reshape(*lead, 576)
    packed = quantize_kv_fp8(kv)
    assert packed.shape == (*lead, 656)
    flat = quantize_kv_fp8(kv.reshape(-1, 576))
    assert torch.equal(packed.reshape(-1, 656), flat)
    back = dequantize_kv_fp8(packed)
    assert back.shape == (*lead, 576) and back.dtype == torch.bfloat16
    assert torch.equal(back.reshape(-1, 576), dequantize_kv_fp8(flat))


def test_non_contiguous_inputs():
    kv = realistic_kv(12, seed=8)
    strided = torch.empty(12, 2, 576, dtype=torch.bfloat16)
    strided[:, 1] = kv
    view = strided[:, 1]
    assert not view.is_contiguous()
    assert torch.equal(quantize_kv_fp8(view), quantize_kv_fp8(kv))
    packed = quantize_kv_fp8(kv)
    holder = torch.zeros(12, 700, dtype=torch.uint8)
    holder[:, :656] = packed
    assert torch.equal(dequantize_kv_fp8(holder[:, :656]), dequantize_kv_fp8(packed))


def test_dequantize_matches_independent_numpy_decoder():
    kv = realistic_kv(40, seed=9)
    packed = quantize_kv_fp8(kv)
    want = oracle.dequantize_rows_np(packed.numpy())
    assert np.array_equal(dequantize_kv_fp8(packed).double().numpy(), want)
    values, scales = oracle.unpack_row(bytes(packed[0].tolist()))
    assert values == dequantize_kv_fp8(packed)[0].double().tolist()
    assert tuple(scales) == scales_of(packed[0])


@pytest.mark.parametrize("bad,fragment", [
    (torch.zeros(4, 512, dtype=torch.bfloat16), "shape (4, 512)"),
    (torch.zeros(4, 576, dtype=torch.float32), "dtype torch.float32"),
    (torch.zeros(4, 576, dtype=torch.float16), "dtype torch.float16"),
    ([0.0] * 576, "a list"),
])
def test_quantize_rejects_bad_input(bad, fragment):
    with pytest.raises(ValidationError) as info:
        quantize_kv_fp8(bad)
    assert info.value.argument == "kv"
    assert fragment in str(info.value) and "576" in str(info.value)


@pytest.mark.parametrize("bad,fragment", [
    (torch.zeros(4, 655, dtype=torch.uint8), "shape (4, 655)"),
    (torch.zeros(4, 656, dtype=torch.bfloat16), "dtype torch.bfloat16"),
    (torch.zeros(4, 656, dtype=torch.int16), "dtype torch.int16"),
])
def test_dequantize_rejects_bad_input(bad, fragment):
    with pytest.raises(ValidationError) as info:
        dequantize_kv_fp8(bad)
    assert info.value.argument == "packed"
    assert fragment in str(info.value) and "656" in str(info.value)
    assert isinstance(info.value, ValueError)


def _first_diff(a: bytes, b: bytes):
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)


def test_float32_dequantize_equals_bf16_dequantize_bit_for_bit():
    """The reference kernels dequantize straight to float32; that must change no value: both
    paths give exactly what the independent numpy decoder gives."""
    from kernels_bridge.fp8 import dequantize_kv_fp8_f32

    g = torch.Generator().manual_seed(7)
    kv = torch.randn(300, 576, generator=g) * torch.exp(torch.randn(300, 1, generator=g) * 4)
    kv[0] = 0.0                                   # an all-zero row
    kv[1, :128] = 1e-30                           # subnormal codes
    kv[2, 128:256] = torch.finfo(torch.bfloat16).max / 2
    rows = quantize_kv_fp8(kv.to(torch.bfloat16))
    want = torch.from_numpy(oracle.dequantize_rows_np(rows.numpy())).float()  # independent decoder
    got = dequantize_kv_fp8_f32(rows)
    assert got.dtype == torch.float32 and got.shape == (300, 576)
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))
    assert torch.equal(got.view(torch.int32), dequantize_kv_fp8(rows).float().view(torch.int32))


@pytest.mark.parametrize("rows", [1, 255, 256, 257, 1000])
def test_table_lookup_dequantize_equals_torch_conversion_bit_for_bit(rows):
    """The look-up table gives exactly what torch's float8 -> float32 conversion gives, for every
    code byte (NaN codes included), every tile, any number of rows (one, a block, several
    blocks and a remainder) and through a strided view of a cache."""
    from kernels_bridge import fp8

    g = torch.Generator().manual_seed(rows)
    holder = torch.randint(0, 256, (rows, 700), dtype=torch.uint8, generator=g)
    packed = holder[:, :656]                                      # rows with a gap between them
    codes = packed[:, :512].clone()
    codes.view(-1)[: min(256, codes.numel())] = torch.arange(min(256, codes.numel()), dtype=torch.uint8)
    packed[:, :512] = codes
    exponents = torch.randint(-20, 20, (rows, 4), generator=g).float()
    packed[:, 512:528] = torch.pow(2.0, exponents).contiguous().view(torch.uint8).view(rows, 16)
    packed[:, 528:] = torch.randn(rows, 64, generator=g).to(torch.bfloat16).view(torch.uint8).view(rows, 128)
    scales = packed[:, 512:528].contiguous().view(torch.float32)
    values = (codes.view(torch.float8_e4m3fn).float().view(rows, 4, 128) * scales.unsqueeze(-1)).view(rows, 512)
    want32 = torch.cat([values, packed[:, 528:].contiguous().view(torch.bfloat16).float()], dim=1)
    got32 = fp8.dequantize_kv_fp8_f32(packed)
    assert torch.equal(got32.view(torch.int32), want32.view(torch.int32))
    got16 = dequantize_kv_fp8(packed)
    assert torch.equal(got16.view(torch.int16), want32.to(torch.bfloat16).view(torch.int16))


def test_dequantize_into_a_given_output():
    """out= is written in place with exactly the bits of a fresh result (checked against the
    independent numpy decoder), and a wrong out is refused before anything is written."""
    g = torch.Generator().manual_seed(11)
    rows = quantize_kv_fp8(torch.randn(3, 5, 576, generator=g).to(torch.bfloat16))
    out = torch.full((3, 5, 576), 7.0, dtype=torch.bfloat16)
    assert dequantize_kv_fp8(rows, out=out) is out
    want = torch.from_numpy(oracle.dequantize_rows_np(rows.view(-1, 656).numpy())).to(torch.bfloat16)
    assert torch.equal(out.view(-1, 576).view(torch.int16), want.view(torch.int16))
    for bad, fragment in ((torch.empty(3, 5, 576), "bfloat16"), (torch.empty(15, 576, dtype=torch.bfloat16), "[3, 5, 576]"),
                          (torch.empty(3, 5, 1152, dtype=torch.bfloat16)[..., ::2], "contiguous"), ("x", "str")):
        before = out.clone()
        with pytest.raises(ValidationError, match="out: expected") as info:
            dequantize_kv_fp8(rows, out=bad)
        assert fragment in str(info.value) and torch.equal(out, before)


def _rows_of(codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """uint8 [n, 656]: codes uint8 [n, 512], scales float32 [n, 4], random bf16 RoPE dims."""
    n = codes.shape[0]
    rows = torch.empty(n, 656, dtype=torch.uint8)
    rows[:, :512] = codes
    rows[:, 512:528] = scales.contiguous().view(torch.uint8).view(n, 16)
    rope = torch.randn(n, 64, generator=torch.Generator().manual_seed(n)).to(torch.bfloat16)
    rows[:, 528:] = rope.view(torch.uint8).view(n, 128)
    return rows


def _by_torch(rows: torch.Tensor) -> torch.Tensor:
    """float32 [n, 576]: torch's own float8 -> float32 conversion times the float32 scale."""
    n = rows.shape[0]
    scales = rows[:, 512:528].contiguous().view(torch.float32)
    values = rows[:, :512].contiguous().view(torch.float8_e4m3fn).float().view(n, 4, 128) * scales.unsqueeze(-1)
    return torch.cat([values.view(n, 512), rows[:, 528:].contiguous().view(torch.bfloat16).float()], dim=1)


def _assert_same_bits(rows: torch.Tensor) -> None:
    from kernels_bridge import fp8

    want = _by_torch(rows)
    assert torch.equal(fp8.dequantize_kv_fp8_f32(rows).view(torch.int32), want.view(torch.int32))
    assert torch.equal(dequantize_kv_fp8(rows).view(torch.int16), want.to(torch.bfloat16).view(torch.int16))


@pytest.mark.parametrize("exponent", [-126, -125, -13, 0, 7, 8, 120])
def test_every_code_at_the_edges_of_the_exponent_path(exponent, monkeypatch):
    """Every non-NaN code byte, at scales 2**e and -2**e: e from -126 to 7 go by the code's bits
    moved into a float and multiplied by 2**(e + 120) (the table is not touched), e >= 8 by the
    table; both give torch's float8 -> float32 conversion times the scale, bit for bit, in float32
    and in bf16 (at e = -126 subnormal codes give subnormal products, rounded once either way)."""
    from kernels_bridge import fp8

    usable = torch.tensor([b for b in range(256) if b & 0x7F != 0x7F], dtype=torch.uint8)
    codes = usable.repeat(9)[: 4 * 512].view(4, 512)
    scales = torch.tensor([2.0 ** exponent, -(2.0 ** exponent)]).repeat(8).view(4, 4)
    if -126 <= exponent <= 7:
        def no_table(*args):
            raise AssertionError("scales 2**-126 .. 2**7 take the exponent path")
        monkeypatch.setattr(fp8, "_unpack_by_table", no_table)
    _assert_same_bits(_rows_of(codes, scales))


def test_a_block_with_a_nan_code_goes_by_the_table(monkeypatch):
    """NaN codes keep the table's bits; only the block of rows holding one takes the table."""
    from kernels_bridge import fp8

    n = 2 * fp8.EXPONENT_ROWS + 5
    g = torch.Generator().manual_seed(5)
    codes = torch.randint(0, 256, (n, 512), dtype=torch.uint8, generator=g)
    codes[(codes & 0x7F) == 0x7F] = 0x11
    codes[fp8.EXPONENT_ROWS + 3, 100] = 0xFF  # in the second block only
    scales = torch.pow(2.0, torch.randint(-20, 8, (n, 4), generator=g).float())
    spans = []
    real = fp8._unpack_by_table
    monkeypatch.setattr(fp8, "_unpack_by_table", lambda raw, out, lo, hi: spans.append((lo, hi)) or real(raw, out, lo, hi))
    _assert_same_bits(_rows_of(codes, scales))
    assert spans == [(fp8.EXPONENT_ROWS, 2 * fp8.EXPONENT_ROWS)] * 2  # the float32 and the bf16 call


def test_flushed_denormals_take_the_table():
    """With denormals flushed, a subnormal code read as a float's bits would be read as zero: the
    table, whose values are normal floats, is used instead and the result does not change."""
    codes = torch.arange(512, dtype=torch.int64).remainder(8).to(torch.uint8).view(1, 512)  # 0 and subnormals
    rows = _rows_of(codes, torch.ones(1, 4))
    want = _by_torch(rows)
    assert (want[0, 1:8] != 0).all()
    if not torch.set_flush_denormal(True):
        pytest.skip("this CPU cannot flush denormals")
    try:
        got = dequantize_kv_fp8(rows)
    finally:
        torch.set_flush_denormal(False)
    assert torch.equal(got.view(torch.int16), want.to(torch.bfloat16).view(torch.int16))
