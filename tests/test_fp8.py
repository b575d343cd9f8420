"""The 656-byte FP8 KV row, checked at byte level against an independent encoder."""
import math
import os
import struct

import numpy as np
import pytest
import torch

from kernels_bridge import FP8_ROW_BYTES, ValidationError, dequantize_kv_fp8, quantize_kv_fp8
from kernels_bridge.fp8 import dequantize_kv_fp8_f32, tile_scales
import tests.oracles.bridge_oracle as oracle

BF16_MAX = torch.finfo(torch.bfloat16).max


def realistic_kv(rows: int, seed: int = 0) -> torch.Tensor:
    """bf16 [rows, 576]: randn with per-channel magnitudes spanning several orders."""
    gen = torch.Generator().manual_seed(seed)
    channel = torch.exp(torch.randn(576, generator=gen) * 1.5)
    return (torch.randn(rows, 576, generator=gen) * channel).to(torch.bfloat16)


def scales_of(row: torch.Tensor):
    return struct.unpack("<4f", bytes(row[512:528].tolist()))


@pytest.mark.parametrize("mode", ["sglang", "flashmla"])
def test_row_size_and_layout(mode):
    assert FP8_ROW_BYTES == 656 == 512 + 16 + 128
    kv = realistic_kv(6)
    packed = quantize_kv_fp8(kv, scale_mode=mode)
    assert packed.dtype == torch.uint8 and packed.shape == (6, 656) and packed.is_contiguous()
    for i in range(6):
        values = kv[i].float().tolist()
        # scales at 512..527 read as little-endian float32, one per 128-dim tile
        want_scales = [max(abs(v) for v in values[t * 128:(t + 1) * 128]) for t in range(4)]
        for got, amax in zip(scales_of(packed[i]), want_scales, strict=True):
            if mode == "sglang":  # the raw amax / 448, in float32
                assert got == float(np.float32(amax) / np.float32(448))
            else:
                assert got >= amax / 448 and (got < 2 * amax / 448 or got == 2.0 ** -13)
        # RoPE bytes are the bf16 bytes of dims 512..575, untouched
        rope = b"".join(struct.pack("<H", oracle.bf16_bits(v)) for v in values[512:])
        assert bytes(packed[i, 528:].tolist()) == rope


def test_sglang_is_the_default_scale_mode():
    kv = realistic_kv(4, seed=1)
    assert torch.equal(quantize_kv_fp8(kv), quantize_kv_fp8(kv, scale_mode="sglang"))
    assert not torch.equal(quantize_kv_fp8(kv), quantize_kv_fp8(kv, scale_mode="flashmla"))


@pytest.mark.parametrize("mode", ["sglang", "flashmla"])
def test_bytes_match_independent_encoder(mode):
    kv = realistic_kv(5, seed=3)
    kv[1, 128:256] = 0                        # an all-zero tile
    kv[2, :5] = torch.tensor([1e-30, -3e-38, 1e-39, 0.0, -0.0])  # tiny and subnormal values
    kv[3, 300] = 2.0 ** 100                   # one huge value flushes its tile's others to 0
    kv[4, 400:512] = 1e-39                    # a tile of subnormals: SGLang's 1 / s overflows
    packed = quantize_kv_fp8(kv, scale_mode=mode)
    for i in range(kv.shape[0]):
        want = oracle.pack_row(kv[i].float().tolist(), scale_mode=mode)
        got = bytes(packed[i].tolist())
        assert got == want, f"row {i}: first differing byte {_first_diff(got, want)}"


def test_sglang_all_zero_tile_gets_scale_zero_and_codes_that_dequantize_to_zero():
    """0 / 448 = 0, 1 / 0 = inf, 0 * inf = NaN, which SGLang's clamp turns into -448 (0xFE)."""
    kv = realistic_kv(2, seed=6)
    kv[1, 256:384] = 0
    packed = quantize_kv_fp8(kv)
    assert scales_of(packed[1])[2] == 0.0
    assert torch.all(packed[1, 256:384] == 0xFE)
    back = dequantize_kv_fp8(packed)[1, 256:384]
    assert torch.all(back == 0) and torch.all(torch.signbit(back.float()))


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


def test_flashmla_scales_are_powers_of_two_and_zero_tile_gets_2_pow_minus_13():
    kv = realistic_kv(64, seed=5)
    kv[7, 384:512] = 0
    packed = quantize_kv_fp8(kv, scale_mode="flashmla")
    scales = packed[:, 512:528].contiguous().view(torch.float32)
    mant, _ = np.frexp(scales.double().numpy())
    assert np.all(mant == 0.5)
    assert scales[7, 3].item() == 2.0 ** -13
    assert torch.all(packed[7, 384:512] == 0)


def _bound(x: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
    """max(2**-4 |x|, 2**-10 s) + 2**-8 |x| per NoPE element: half an e4m3 ulp (3 mantissa bits)
    in the normal range, half the subnormal spacing 2**-9 * s below it, and the final bf16
    rounding of code * s (zero for power-of-two scales)."""
    s = packed[:, 512:528].contiguous().view(torch.float32).double().repeat_interleave(128, dim=1)
    nope = x[:, :512].abs()
    return torch.maximum(nope * 2.0 ** -4, s * 2.0 ** -10) + nope * 2.0 ** -8


@pytest.mark.parametrize("mode", ["sglang", "flashmla"])
def test_round_trip_error_bound(mode):
    """The RoPE dims are exact; the NoPE dims within the bound, which is tight."""
    kv = realistic_kv(512, seed=11)
    packed = quantize_kv_fp8(kv, scale_mode=mode)
    back = dequantize_kv_fp8(packed)
    x, y = kv.double(), back.double()
    err = (y[:, :512] - x[:, :512]).abs()
    bound = _bound(x, packed)
    assert torch.all(err <= bound)
    assert float((err / bound).max()) > 0.5        # the bound is tight, not vacuous
    assert torch.equal(back[:, 512:], kv[:, 512:])  # RoPE untouched


@pytest.mark.parametrize("mode, magnitude", [(mode, m) for mode in ("sglang", "flashmla")
                                             for m in (2.0 ** 120, 1e20, 1.0, 1e-6, 1e-30)]
                         + [("flashmla", 1e-38)])
def test_extreme_magnitudes_round_trip_within_bound(magnitude, mode):
    kv = (realistic_kv(8, seed=17).float() / 8 * magnitude).to(torch.bfloat16)
    packed = quantize_kv_fp8(kv, scale_mode=mode)
    back = dequantize_kv_fp8(packed).double()
    x = kv.double()
    assert torch.all(torch.isfinite(back))
    assert torch.all((back[:, :512] - x[:, :512]).abs() <= _bound(x, packed))


def test_bf16_max_overflows_on_dequantize_like_flashmla():
    # amax ~ 2**128 gives s = 2**120 and a code of 256: 256 * 2**120 overflows to inf. FlashMLA's
    # quantizer does the same; the largest value that survives is 240 * 2**120.
    kv = torch.zeros(2, 576, dtype=torch.bfloat16)
    kv[0, 0] = BF16_MAX
    kv[1, 0] = 240 * 2.0 ** 120
    back = dequantize_kv_fp8(quantize_kv_fp8(kv, scale_mode="flashmla"))
    assert back[0, 0].item() == math.inf
    assert back[1, 0].item() == 240 * 2.0 ** 120
    assert torch.all(back[:, 1:] == 0)


def test_bf16_max_survives_sglang_scales():
    """SGLang's raw scale keeps the largest bf16 finite: 448 * (max / 448) rounds back to max."""
    kv = torch.zeros(1, 576, dtype=torch.bfloat16)
    kv[0, 0] = BF16_MAX
    back = dequantize_kv_fp8(quantize_kv_fp8(kv))
    assert back[0, 0].item() == BF16_MAX


def test_sglang_saturates_a_tile_whose_inverse_scale_overflows():
    """Below an amax of 448 * 2**-128, SGLang's 1 / s is inf: every nonzero element's code
    saturates to +-448 and dequantizes to +-amax (real activations never come near)."""
    kv = torch.zeros(1, 576, dtype=torch.bfloat16)
    kv[0, :3] = torch.tensor([4e-38, -1e-38, 1e-39])
    back = dequantize_kv_fp8(quantize_kv_fp8(kv))
    amax = kv[0, 0].item()
    assert back[0, :3].tolist() == [amax, -amax, amax] and torch.all(back[0, 3:128] <= 0)


def test_flashmla_subnormal_inputs_quantize_to_zero_codes():
    tiny = torch.full((1, 576), 1e-39, dtype=torch.bfloat16)   # bf16 subnormal
    packed = quantize_kv_fp8(tiny, scale_mode="flashmla")
    assert torch.all(packed[0, :512] == 0)
    assert scales_of(packed[0]) == (2.0 ** -13,) * 4
    assert torch.equal(dequantize_kv_fp8(packed)[0, 512:], tiny[0, 512:])


def test_sglang_subnormal_inputs_keep_their_value():
    """A tile of bf16 subnormals gets a float32 subnormal scale; 1 / s overflows to inf, so every
    code saturates to 448, and 448 * s gives the input back."""
    tiny = torch.full((1, 576), 1e-39, dtype=torch.bfloat16)
    packed = quantize_kv_fp8(tiny)
    assert torch.all(packed[0, :512] == 0x7E)
    assert torch.equal(dequantize_kv_fp8(packed), tiny)


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
    values = values.to(torch.bfloat16).float()  # float32 output holds the bf16 values
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

    want = _by_torch(rows).to(torch.bfloat16)  # float32 output holds the bf16 values too
    assert torch.equal(fp8.dequantize_kv_fp8_f32(rows).view(torch.int32), want.float().view(torch.int32))
    assert torch.equal(dequantize_kv_fp8(rows).view(torch.int16), want.view(torch.int16))


@pytest.mark.parametrize("scale", [2.0 ** -149, 2.0 ** -126, 3.1e-37, 2.0 ** -13, 0.0123, 1.0, 2.0 ** 7,
                                   0.7 * 2.0 ** 119, 2.0 ** 120, 1.5 * 2.0 ** 127, math.inf, math.nan, 0.0])
def test_every_code_at_the_edges_of_the_half_path(scale, monkeypatch):
    """Every non-NaN code byte, at scales +-s, powers of two or raw (SGLang's): every finite
    |s| < 2**120, inf, NaN and 0 go by the code's bits moved into a float16 and multiplied by
    s * 2**8 (the table is not touched), larger ones by the table; both give torch's float8 ->
    float32 conversion times the scale, bit for bit, in float32 and in bf16 (subnormal scales
    give subnormal products, rounded once either way)."""
    from kernels_bridge import fp8_unpack

    usable = torch.tensor([b for b in range(256) if b & 0x7F != 0x7F], dtype=torch.uint8)
    codes = usable.repeat(9)[: 4 * 512].view(4, 512)
    scales = torch.tensor([scale, -scale]).repeat(8).view(4, 4)
    if not (math.isfinite(scale) and abs(scale) >= 2.0 ** 120):
        def no_table(*args):
            raise AssertionError("this scale takes the half-precision path")
        monkeypatch.setattr(fp8_unpack, "_by_table", no_table)
    _assert_same_bits(_rows_of(codes, scales))


def test_a_block_with_a_nan_code_goes_by_the_table(monkeypatch):
    """NaN codes keep the table's bits; only the block of rows holding one takes the table."""
    from kernels_bridge import fp8_unpack

    block = fp8_unpack.CHUNK_ROWS
    n = 2 * block + 5
    g = torch.Generator().manual_seed(5)
    codes = torch.randint(0, 256, (n, 512), dtype=torch.uint8, generator=g)
    codes[(codes & 0x7F) == 0x7F] = 0x11
    codes[block + 3, 100] = 0xFF  # in the second block only
    scales = torch.rand(n, 4, generator=g) * 3
    spans = []
    real = fp8_unpack._by_table
    monkeypatch.setattr(fp8_unpack, "_by_table",
                        lambda raw, sc, out, lo, hi: spans.append((lo, hi)) or real(raw, sc, out, lo, hi))
    _assert_same_bits(_rows_of(codes, scales))
    assert spans == [(block, 2 * block)] * 2  # the float32 and the bf16 call


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


def test_bytes_equal_sglangs_own_writer(tmp_path):
    """SGLang 0.5.23's Triton writer (the function its memory pool calls), run by Triton's CPU
    interpreter in a process of its own (tests/oracles/sglang_fp8_writer.py), writes exactly the
    bytes quantize_kv_fp8 writes: normal rows, an all-zero tile, subnormal tiles, a huge value,
    an infinity."""
    import subprocess
    import sys

    from tests.sglang_release import require, require_modules

    require("0.5.23")
    require_modules("triton")
    g = torch.Generator().manual_seed(0)
    kv = (torch.randn(64, 576, generator=g) * torch.exp(torch.randn(576, generator=g) * 2)).to(torch.bfloat16)
    kv[3, :128] = 0
    kv[5, 128:256] = 1e-39
    kv[6, 256] = 3e38
    kv[7, 300] = math.inf
    torch.save(kv, tmp_path / "kv.pt")
    script = os.path.join(os.path.dirname(oracle.__file__), "sglang_fp8_writer.py")
    done = subprocess.run([sys.executable, script, str(tmp_path / "kv.pt"), str(tmp_path / "rows.pt")],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    theirs = torch.load(tmp_path / "rows.pt")
    ours = quantize_kv_fp8(kv)
    assert theirs.dtype == torch.uint8 and theirs.shape == ours.shape
    assert torch.equal(theirs, ours), f"{int((theirs != ours).sum())} bytes differ"


def _too_small(shape, dtype, nbytes):
    """A tensor of `shape` whose storage was shrunk to `nbytes` afterwards (torch keeps the shape
    and reads or writes past the storage's end)."""
    t = torch.zeros(shape, dtype=dtype)
    t.untyped_storage().resize_(nbytes)
    return t


def _freed(t):
    t = t.clone()
    t.untyped_storage().resize_(0)
    return t


def _nested(t):
    return torch.nested.nested_tensor([t[:2], t[:3]])


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
@pytest.mark.parametrize("call, argument, fragment", [
    (lambda kv, rows: quantize_kv_fp8(_freed(kv)), "kv", "storage was freed"),
    (lambda kv, rows: quantize_kv_fp8(_too_small((8, 576), torch.bfloat16, 4096)), "kv", "of a storage of 4096"),
    (lambda kv, rows: quantize_kv_fp8(_nested(kv)), "kv", "nested"),
    (lambda kv, rows: quantize_kv_fp8(kv, scale_mode="power-of-two"), "scale_mode", "sglang, flashmla"),
    (lambda kv, rows: dequantize_kv_fp8(_freed(rows)), "packed", "storage was freed"),
    (lambda kv, rows: dequantize_kv_fp8(_nested(rows)), "packed", "nested"),
    (lambda kv, rows: dequantize_kv_fp8(rows, out=_too_small((8, 576), torch.bfloat16, 4096)), "out",
     "9216 bytes of a storage of 4096"),
    (lambda kv, rows: dequantize_kv_fp8(rows, out=_too_small((8, 576), torch.bfloat16, 0)), "out", "freed"),
    (lambda kv, rows: dequantize_kv_fp8(rows, out=torch.zeros(8, 576, dtype=torch.bfloat16, requires_grad=True)),
     "out", "requires grad"),
    (lambda kv, rows: dequantize_kv_fp8_f32(rows.view(-1)[:8]), "rows", "shape (8,)"),
    (lambda kv, rows: dequantize_kv_fp8_f32(kv), "rows", "dtype torch.bfloat16"),
    (lambda kv, rows: dequantize_kv_fp8_f32(_freed(rows)), "rows", "storage was freed"),
    (lambda kv, rows: dequantize_kv_fp8_f32(_too_small((8, 656), torch.uint8, 100)), "rows", "of a storage of 100"),
])
def test_tensors_the_functions_cannot_read_or_write_are_refused_by_name(call, argument, fragment):
    """Freed or short storage (read or written past its end by torch itself), nested tensors
    (torch answers .shape with "Internal error"), an out= tracked by autograd and an unknown scale
    mode: a ValidationError naming the argument, before anything is read or written."""
    kv = realistic_kv(8, seed=21)
    rows = quantize_kv_fp8(kv)
    with pytest.raises(ValidationError) as info:
        call(kv, rows)
    assert info.value.argument == argument and f"{argument}: " in str(info.value)
    assert fragment in str(info.value)
