"""FP8 656-byte rows to bf16 or float32 values, fast and bit for bit as defined:
value = bf16(float32(code) * scale), whatever the scale (FlashMLA's powers of two or SGLang's raw
amax / 448); float32 outputs hold the same bf16 values widened.

The half-precision path (the CPU, every scale below 2**119 in magnitude or NaN or inf, no NaN code
in the block, denormals kept): an e4m3 byte's sign and 7 magnitude bits, moved into a float16's
sign bit and the low bits of its exponent and top of its mantissa, read as the code's value times
2**-8 (exponent bias 15 against e4m3's 7), subnormal codes included (they land on float16's
subnormals, which widen exactly). Widened to float32 and multiplied by s * 2**8 (exact: a
power-of-two multiple of a float32 that stays finite), that gives the real number code * s rounded
once to float32: the same bits as float32(code) * s. Rows go through it CHUNK_ROWS at a time, so
the scratch stays in the cache: widen, shift, mask, widen to float32, scale, round to bf16 on the
way out.

The table path (everything else: a block holding a NaN code, a huge scale, flushed denormals, other
devices than the CPU): a look-up in the 256-entry table of code values (torch's own float8_e4m3fn ->
float32 conversion of each byte, which element by element takes several ns) times the scale, in
float32.
"""
from __future__ import annotations

import threading

import torch

from kernels_bridge.layout import D_NOPE, NUM_TILES, ROPE_AT, SCALES_AT, TILE

__all__ = ["unpack_rows", "CHUNK_ROWS", "TABLE_ROWS"]

CHUNK_ROWS = 256   # rows the half-precision path unpacks at a time: its scratch stays in the cache
TABLE_ROWS = 256   # rows a table look-up unpacks at a time: indices and values stay in the cache
HALF_BIAS = 2.0 ** 8  # a float16 read of the moved bits is the code's value times 2**-8
_TO_HALF = 1 << 7  # moves an e4m3 byte's 7 magnitude bits to the top of a float16's mantissa
_SIGN_AND_MAGNITUDE = -0x4080  # 0xBF80 as int16: the sign and those 7 bits
_CODE_VALUES: dict = {}
_SCRATCH = threading.local()  # per thread: reused scratch blocks (a fresh 256 KB block page-faults)
_SUBNORMAL = torch.tensor([2.0 ** -140])  # a float32 subnormal


def unpack_rows(raw: torch.Tensor, out: torch.Tensor) -> None:
    """raw: uint8 [n, 656]; out: float32 or bf16 [n, 576] on raw's device, written with the
    dequantized rows."""
    n = raw.shape[0]
    if n == 0:
        return
    rope = raw[:, ROPE_AT:]
    try:  # the bf16 RoPE dims read in place where the row stride allows it
        rope = rope.view(torch.bfloat16)
    except RuntimeError:
        rope = rope.contiguous().view(torch.bfloat16)
    out[:, D_NOPE:].copy_(rope)
    scales = raw[:, SCALES_AT:ROPE_AT].contiguous().view(torch.float32)  # [n, 4]
    # float32 output keeps the bf16 rounding, a no-op only where every product is bf16-exact
    rounds = out.dtype == torch.float32 and not _bf16_exact(scales)
    factors = scales * HALF_BIAS
    if raw.device.type != "cpu" or not _half_path_takes(scales, factors):
        _by_table(raw, scales, out, 0, n)
        return
    codes = raw[:, :D_NOPE]
    signed = codes.view(torch.int8)
    nan_anywhere = _has_nan_code(codes)  # one look at every code: then only its blocks
    for lo in range(0, n, CHUNK_ROWS):
        hi = min(n, lo + CHUNK_ROWS)
        if nan_anywhere and _has_nan_code(codes[lo:hi]):
            _by_table(raw, scales, out, lo, hi)
        else:
            _by_half(signed[lo:hi], factors[lo:hi], out[lo:hi, :D_NOPE], rounds)


def _bf16_exact(scales: torch.Tensor) -> bool:
    """Whether code * s is a bf16 value for every code and scale: s is 0 or a power of two
    2**-124 .. 2**119 (a code's lowest bit times s stays above bf16's smallest subnormal 2**-133,
    and 448 * s below its largest value)."""
    bits = scales.abs().view(torch.int32)  # the sign bit cleared
    exponent = bits >> 23
    return bool((((bits & 0x7FFFFF) == 0) & (((exponent >= 3) & (exponent <= 246)) | (bits == 0))).all())


def _half_path_takes(scales: torch.Tensor, factors: torch.Tensor) -> bool:
    """Every s * 2**8 is exact (only a finite scale of 2**120 or more overflows: then it is
    infinite where the scale is not), and subnormal floats are kept (the float16 of a subnormal
    code is one)."""
    if bool(torch.isinf(factors).any()) and bool((torch.isinf(factors) & ~torch.isinf(scales)).any()):
        return False
    return _denormals_kept()


def _by_half(signed: torch.Tensor, factors: torch.Tensor, out: torch.Tensor, rounds: bool) -> None:
    """One chunk by the half-precision path: signed int8 [m, 512] codes, factors float32 [m, 4]
    (s * 2**8), out [m, 512] (a view of the output rows), rounded to bf16 values when float32
    output must hold them (`rounds`)."""
    m = signed.shape[0]
    half, values = _scratch("half", m, torch.int16), _scratch("values", m, torch.float32)
    half.copy_(signed).mul_(_TO_HALF)  # sign-extended: the sign fills the bits above
    half.bitwise_and_(_SIGN_AND_MAGNITUDE)
    values.copy_(half.view(torch.float16))
    values.view(m, NUM_TILES, TILE).mul_(factors.view(m, NUM_TILES, 1))
    out.copy_(_scratch("rounded", m, torch.bfloat16).copy_(values) if rounds else values)


def _by_table(raw: torch.Tensor, scales: torch.Tensor, out: torch.Tensor, start: int, stop: int) -> None:
    """The NoPE dims of rows start..stop by the table of code values, a block at a time through
    reused buffers (a float32 output is rounded to bf16 values on the way: this path also takes
    NaN codes and scales, whose bits only the bf16 conversion gives)."""
    table = _code_values(raw.device)
    step = min(stop - start, TABLE_ROWS)
    index = torch.empty(step, D_NOPE, dtype=torch.int32, device=raw.device)
    values = torch.empty(step, D_NOPE, dtype=torch.float32, device=raw.device)
    rounded = torch.empty(step, D_NOPE, dtype=torch.bfloat16, device=raw.device) \
        if out.dtype == torch.float32 else None
    for lo in range(start, stop, step):
        hi = min(stop, lo + step)
        m = hi - lo
        index[:m].copy_(raw[lo:hi, :D_NOPE])
        torch.index_select(table, 0, index[:m].view(-1), out=values[:m].view(-1))
        # scaled in place while contiguous, then copied (and for bf16 rounded) into the rows
        values[:m].view(m, NUM_TILES, TILE).mul_(scales[lo:hi].view(m, NUM_TILES, 1))
        out[lo:hi, :D_NOPE].copy_(values[:m] if rounded is None else rounded[:m].copy_(values[:m]))


def _scratch(name: str, rows: int, dtype: torch.dtype) -> torch.Tensor:
    """A CPU [rows, 512] block of `dtype` kept between calls of this thread (at most CHUNK_ROWS
    rows)."""
    blocks = getattr(_SCRATCH, "blocks", None)
    if blocks is None:
        blocks = _SCRATCH.blocks = {}
    block = blocks.get(name)
    if block is None:
        block = blocks[name] = torch.empty(CHUNK_ROWS, D_NOPE, dtype=dtype)
    return block[:rows]


def _code_values(device) -> torch.Tensor:
    """float32 [256]: the value of every e4m3 code byte, by torch's own conversion (NaN for the
    two NaN codes), so a table look-up gives exactly the bits the conversion gives."""
    table = _CODE_VALUES.get(device)
    if table is None:
        table = torch.arange(256, dtype=torch.uint8, device=device).view(torch.float8_e4m3fn).float()
        _CODE_VALUES[device] = table
    return table


def _has_nan_code(codes: torch.Tensor) -> bool:
    """Whether uint8 codes hold a NaN code, 0x7F or 0xFF: the greatest byte as int8, as uint8."""
    return int(codes.view(torch.int8).amax()) == 0x7F or int(codes.amax()) == 0xFF


def _denormals_kept() -> bool:
    """False when the CPU flushes subnormal floats to zero (torch.set_flush_denormal(True))."""
    return torch.mul(_SUBNORMAL, 2.0).item() != 0.0
