"""The arguments of a HotBuffer, checked before anything is allocated or changed: every refusal is
a HotBufferError naming the argument, what it got and what was expected."""
from __future__ import annotations

import numbers
import operator
from typing import NamedTuple

import torch

from kernels_bridge.errors import ValidationError, describe, shown
from kernels_bridge.layout import ADMISSIONS, BF16_ROW_BYTES, D_QK, FP8_ROW_BYTES, KERNEL_RELEASES as RELEASES
from kernels_bridge.tensor_checks import check_readable
from kernels_bridge.validate import INT32_MAX

__all__ = ["HotBufferError", "ROW_LAYOUTS", "ADMISSIONS", "RELEASES", "Batch", "check_host_pool", "check_size",
           "check_choice", "check_max_bytes", "check_batch", "check_ids_lens", "check_req_ids",
           "INT_DTYPES"]

# KV row layouts the hot buffer carries: dtype -> (row shape, name). A copy is a plain row copy.
ROW_LAYOUTS = {
    torch.bfloat16: ((D_QK,), "bf16"),  # 512 NoPE + 64 RoPE dims, 1152 bytes
    torch.uint8: ((FP8_ROW_BYTES,), "fp8"),  # V3.2 FP8 row: 512 fp8 + 4 f32 scales + 64 bf16, 656 bytes
}
ROW_BYTES = {"bf16": BF16_ROW_BYTES, "fp8": FP8_ROW_BYTES}
INT_DTYPES = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)
_POOL = "[num_requests, max_seq_len, 576] bfloat16 or [num_requests, max_seq_len, 656] uint8"


class HotBufferError(ValidationError):
    """An argument of :class:`HotBuffer` is invalid; the message names it, what it got and what
    was expected. Raised before any state changes. A ValidationError, so a BridgeError and a
    ValueError."""


class Batch(NamedTuple):
    """A translate's arguments, checked: rid, lens int64 [n] and pos int32 [n, k], on the
    buffer's device."""
    rid: torch.Tensor
    lens: torch.Tensor
    pos: torch.Tensor


def check_host_pool(host_pool) -> tuple:
    """(row shape, kind) of a usable host pool."""
    if not isinstance(host_pool, torch.Tensor):
        raise HotBufferError(f"host_pool: expected a torch.Tensor {_POOL}, got {describe(host_pool)}",
                             argument="host_pool")
    check_readable(host_pool, "host_pool", HotBufferError)
    layout = ROW_LAYOUTS.get(host_pool.dtype)
    if layout is None:
        hint = (" (view an FP8 cache as bytes: .view(torch.uint8))"
                if host_pool.dtype in (torch.float8_e4m3fn, torch.int8) else "")
        raise HotBufferError(f"host_pool: {describe(host_pool)}; expected {_POOL}{hint}", argument="host_pool")
    row_shape, kind = layout
    if host_pool.dim() != 2 + len(row_shape) or tuple(host_pool.shape[2:]) != row_shape:
        raise HotBufferError(f"host_pool: {describe(host_pool)}; expected {_POOL}", argument="host_pool")
    if host_pool.shape[0] < 1 or host_pool.shape[1] < 1:
        raise HotBufferError(f"host_pool: {describe(host_pool)}; expected num_requests >= 1 and "
                             f"max_seq_len >= 1", argument="host_pool")
    if host_pool.device.type != "cpu":
        raise HotBufferError(f"host_pool: {describe(host_pool)}; expected a CPU tensor (the host pool)",
                             argument="host_pool")
    if not host_pool.is_contiguous():
        raise HotBufferError(f"host_pool: {describe(host_pool)} is not contiguous; expected a contiguous "
                             f"tensor (rows are copied by flat index)", argument="host_pool")
    return row_shape, kind


def check_size(name: str, value) -> int:
    """A positive whole number (bool refused)."""
    try:
        ok = not isinstance(value, bool) and operator.index(value) >= 1
    except TypeError:
        ok = False
    if not ok:
        raise HotBufferError(f"{name}: got {shown(value)}; expected an int >= 1", argument=name)
    return operator.index(value)


def check_choice(name: str, value, choices) -> str:
    if not isinstance(value, str) or value not in choices:
        raise HotBufferError(f"{name}: got {shown(value)}; expected one of {', '.join(choices)}", argument=name)
    return value


def check_max_bytes(max_bytes) -> None:
    # NaN compares false with everything (it would skip the budget); '1G' is not a size here
    if max_bytes is not None and (isinstance(max_bytes, bool) or not isinstance(max_bytes, numbers.Integral)
                                  or max_bytes < 1):
        raise HotBufferError(f"max_bytes: expected a positive whole number of bytes, got {shown(max_bytes)} "
                             f"({type(max_bytes).__name__})", argument="max_bytes")


def _int_tensor(name: str, t, ndim: int, shape_doc: str, device: torch.device) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise HotBufferError(f"{name}: got {describe(t)}; expected an integer torch.Tensor {shape_doc}", argument=name)
    check_readable(t, name, HotBufferError)  # nested, sparse, meta, freed or short storage
    if t.dtype not in INT_DTYPES:
        raise HotBufferError(f"{name}: {describe(t)}; expected an integer tensor {shape_doc}", argument=name)
    if t.dim() != ndim:
        raise HotBufferError(f"{name}: {describe(t)}; expected {ndim}-D {shape_doc}", argument=name)
    if t.device.type not in ("cpu", device.type):
        raise HotBufferError(f"{name}: {describe(t)}; expected a tensor on the CPU or {device}", argument=name)
    return t.to(device)


def check_req_ids(req_ids, num_requests: int) -> torch.Tensor:
    """An int or ints [n] (a tensor or a sequence) in [0, num_requests), as int64 [n] on the CPU."""
    if isinstance(req_ids, int) and not isinstance(req_ids, bool):
        req_ids = [req_ids]
    if isinstance(req_ids, torch.Tensor):
        check_readable(req_ids, "req_ids", HotBufferError)
        if req_ids.dtype not in INT_DTYPES or req_ids.dim() > 1:
            raise HotBufferError(f"req_ids: {describe(req_ids)}; expected an int or an integer tensor [n]",
                                 argument="req_ids")
        rid = req_ids.reshape(-1).to("cpu", torch.int64)
    else:
        try:
            items = list(req_ids)
        except TypeError:
            raise HotBufferError(f"req_ids: got {shown(req_ids)}; expected an int or a sequence of ints",
                                 argument="req_ids") from None
        for v in items:
            if isinstance(v, bool) or not isinstance(v, int):
                raise HotBufferError(f"req_ids: got {shown(v)}; expected ints in [0, {num_requests})",
                                     argument="req_ids")
        rid = torch.tensor(items, dtype=torch.int64)
    bad = (rid < 0) | (rid >= num_requests)
    if bool(bad.any()):
        i = int(bad.nonzero()[0, 0])
        raise HotBufferError(f"req_ids: element {i} is {int(rid[i])}; expected ids in [0, {num_requests})",
                             argument="req_ids")
    return rid


def check_batch(req_ids, seq_lens, positions, *, num_requests: int, max_seq_len: int, buffer_size: int,
                last_lens: torch.Tensor, device: torch.device) -> Batch:
    """A translate's arguments: distinct request ids, lengths 1..max_seq_len never below a live
    request's last one, positions -1 or below their length, top_k <= buffer_size. One host read
    for every range check; the details are computed on the error path only."""
    rid = _int_tensor("req_ids", req_ids, 1, "[n]", device).long()
    n = rid.shape[0]
    lens = _int_tensor("seq_lens", seq_lens, 1, f"[n] with n = {n}", device).long()
    if lens.shape[0] != n:
        raise HotBufferError(f"seq_lens: {describe(seq_lens)}; expected [{n}] (one per req_id)", argument="seq_lens")
    pos = _int_tensor("positions", positions, 2, f"[n, top_k] with n = {n}", device)
    if pos.shape[0] != n:
        raise HotBufferError(f"positions: {describe(positions)}; expected [{n}, top_k] (one row per req_id)",
                             argument="positions")
    top_k = pos.shape[1]
    if top_k > buffer_size:
        raise HotBufferError(f"positions: {describe(positions)}; expected top_k <= buffer_size {buffer_size}",
                             argument="positions")
    pos = pos.long() if pos.dtype == torch.uint8 else pos  # uint8 has no -1: widen before comparing
    if n and top_k:
        low, high = torch.aminmax(pos.view(-1))
        bad_pos = (low < -1) | (pos.amax(1).long() >= lens).any()
    else:
        bad_pos = torch.zeros((), dtype=torch.bool, device=device)
    _check_ids_lens(rid, lens, num_requests, max_seq_len, last_lens, bad_pos)
    if bool(bad_pos):
        p64 = pos.long()
        i, j = ((p64 < -1) | (p64 >= lens[:, None])).nonzero()[0].tolist()
        raise HotBufferError(f"positions: [{i}, {j}] (request {int(rid[i])}) is {int(p64[i, j])}; expected -1 "
                             f"(padding) or 0 <= position < seq_len {int(lens[i])}", argument="positions")
    return Batch(rid, lens, pos.to(torch.int32))


def check_ids_lens(req_ids, seq_lens, *, num_requests: int, max_seq_len: int, last_lens: torch.Tensor,
                   device: torch.device):
    """req_ids and seq_lens as check_batch takes them; returns (rid, lens) int64 [n]."""
    rid = _int_tensor("req_ids", req_ids, 1, "[n]", device).long()
    n = rid.shape[0]
    lens = _int_tensor("seq_lens", seq_lens, 1, f"[n] with n = {n}", device).long()
    if lens.shape[0] != n:
        raise HotBufferError(f"seq_lens: {describe(seq_lens)}; expected [{n}] (one per req_id)", argument="seq_lens")
    _check_ids_lens(rid, lens, num_requests, max_seq_len, last_lens, torch.zeros((), dtype=torch.bool))
    return rid, lens


def _check_ids_lens(rid, lens, num_requests: int, max_seq_len: int, last_lens, bad_pos) -> None:
    """Distinct ids in range, lengths in range and never below the request's last one; bad_pos
    joins the one host read."""
    bad_rid = (rid < 0) | (rid >= num_requests)
    safe = rid.clamp(0, num_requests - 1)
    srt = torch.sort(rid).values
    dup = srt[1:] == srt[:-1]
    bad_len = (lens < 1) | (lens > max_seq_len)
    shrunk = lens < last_lens.index_select(0, safe)
    flags = torch.stack([bad_rid.any(), dup.any(), bad_len.any(), shrunk.any(), bad_pos.to(rid.device)]).tolist()
    if flags[0]:
        i = int(bad_rid.nonzero()[0, 0])
        raise HotBufferError(f"req_ids: element {i} is {int(rid[i])}; expected ids in [0, {num_requests})",
                             argument="req_ids")
    if flags[1]:
        raise HotBufferError(f"req_ids: request {int(srt[1:][dup][0])} appears more than once; expected distinct "
                             f"requests per call", argument="req_ids")
    if flags[2]:
        i = int(bad_len.nonzero()[0, 0])
        raise HotBufferError(f"seq_lens: element {i} (request {int(rid[i])}) is {int(lens[i])}; expected "
                             f"1 <= seq_len <= max_seq_len {max_seq_len}", argument="seq_lens")
    if flags[3]:
        i = int(shrunk.nonzero()[0, 0])
        raise HotBufferError(f"seq_lens: element {i} (request {int(rid[i])}) is {int(lens[i])}, below its "
                             f"previous {int(last_lens[rid[i]])}; SGLang's decode never shortens a request "
                             f"(free() it to start again)", argument="seq_lens")
