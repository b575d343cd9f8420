"""SGLang's own FP8 KV writer, run on the CPU: `python tests/oracles/sglang_fp8_writer.py IN OUT`
reads bf16 KV rows [n, 576] (torch.save) from IN, quantizes them with SGLang's Triton kernel
(`sglang.kernels.ops.quantization.dsa_quant_k_cache.quantize_k_cache_separate`, the function the
server's memory pool calls) under Triton's interpreter, and saves the 656-byte rows to OUT.

Triton's interpreter runs the kernel's float32 arithmetic in numpy (IEEE division, as the bridge's
writer does), but its software float conversions are not exact: bf16 -> float32 misreads
subnormals and float32 -> e4m3 rounding drops the carry into the exponent (7.98 becomes 4.0). Both
are replaced here by torch's exact conversions (bf16 -> float32 is exact; float32 -> e4m3fn rounds
to nearest even, as the GPU's cvt.rn.satfinite does), so the bytes are the kernel's arithmetic
and nothing else. Must run in its own process: TRITON_INTERPRET is read when triton is imported.
"""
from __future__ import annotations

import os
import sys

os.environ["TRITON_INTERPRET"] = "1"

import numpy as np  # noqa: E402
import torch  # noqa: E402
import triton.language as tl  # noqa: E402
import triton.runtime.interpreter as interpreter  # noqa: E402

_TORCH = {tl.float32: torch.float32, tl.bfloat16: torch.bfloat16, tl.float8e4nv: torch.float8_e4m3fn}
_STORED = {tl.float32: np.float32, tl.bfloat16: np.uint16, tl.float8e4nv: np.uint8}  # how numpy holds them
_BITS = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float8_e4m3fn: torch.uint8}
_inexact = interpreter._convert_float


def _exact_convert(data, src, dst, rounding_mode):
    if src not in _TORCH or dst not in _TORCH:
        return _inexact(data, src, dst, rounding_mode)
    values = torch.from_numpy(np.ascontiguousarray(data).view(_STORED[src]).copy())
    if src != tl.float32:
        values = values.view(_TORCH[src])
    converted = values.to(_TORCH[dst])
    return converted.view(_BITS[converted.dtype]).numpy()


def main(src: str, dst: str) -> None:
    interpreter._convert_float = _exact_convert
    from sglang.kernels.ops.quantization.dsa_quant_k_cache import quantize_k_cache_separate

    kv = torch.load(src)
    nope, rope = quantize_k_cache_separate(kv[:, :512], kv[:, 512:])
    rows = torch.cat([nope.reshape(kv.shape[0], -1), rope.reshape(kv.shape[0], -1)], dim=1)
    torch.save(rows.contiguous(), dst)


if __name__ == "__main__":
    main(*sys.argv[1:3])
