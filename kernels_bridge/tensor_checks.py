"""Checks that a tensor can be read or written at all, shared by every public function of the
bridge: a dense (strided) tensor whose storage holds its shape, and, for an output written in
place, one autograd does not track.

Torch does not check these itself before its kernels touch memory: a tensor built with `set_` over
a storage smaller than its shape is written past the storage's end, one whose storage was freed
(`untyped_storage().resize_(0)`) fails deep inside an op with an internal message, and a nested
tensor answers `.shape` with "Internal error". Each check here raises the caller's error class
with the argument's name and shape instead."""
from __future__ import annotations

from typing import Type

import torch

from kernels_bridge.errors import ValidationError, describe

__all__ = ["check_readable", "check_writable", "storage_bytes_needed"]


def storage_bytes_needed(t: torch.Tensor) -> int:
    """Bytes of storage, from its start, that `t`'s offset, sizes and strides reach."""
    if t.numel() == 0:
        return 0
    last = t.storage_offset() + sum((size - 1) * stride for size, stride in zip(t.shape, t.stride()))
    return (last + 1) * t.element_size()


def check_readable(t: torch.Tensor, name: str, error: Type[ValidationError] = ValidationError) -> None:
    """`t` (already known to be a tensor) is dense, has data and a storage that holds its shape."""
    if t.is_nested:
        raise error(f"{name}: {describe(t)} (a ragged, nested tensor); expected a dense tensor of one "
                    f"shape", argument=name)
    if t.layout != torch.strided:
        raise error(f"{name}: a {t.layout} tensor; expected a dense (torch.strided) tensor", argument=name)
    if t.is_meta:
        raise error(f"{name}: {describe(t)} has no data (a meta tensor)", argument=name)
    need = storage_bytes_needed(t)
    have = t.untyped_storage().nbytes()
    if need > have:
        freed = " (its storage was freed or resized)" if have == 0 else ""
        raise error(f"{name}: {describe(t)}, strides {tuple(t.stride())}, storage offset {t.storage_offset()} "
                    f"reaches {need} bytes of a storage of {have}{freed}; expected a storage that holds "
                    f"the tensor", argument=name)


def check_writable(t: torch.Tensor, name: str, error: Type[ValidationError] = ValidationError) -> None:
    """`t` can be read (check_readable) and written in place without bypassing autograd."""
    check_readable(t, name, error)
    if t.requires_grad:
        raise error(f"{name}: {describe(t)} requires grad; expected a tensor autograd does not track "
                    f"(it is written in place)", argument=name)
