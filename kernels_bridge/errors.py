"""Errors raised by the kernel bridge.

Every error is a `BridgeError`; each also derives from the builtin a caller would naturally catch
(`ValueError` for bad input, `RuntimeError` for a missing provider), so code written against the
builtins keeps working.
"""
from __future__ import annotations

from typing import Any, Optional

from engine.values import clip

__all__ = ["BridgeError", "ValidationError", "ProviderUnavailable", "RoutingRejected"]


def shown(value: Any) -> str:
    """How a message quotes a Python argument: repr() (the bridge is called from Python, so None
    and True are spelled as Python spells them), clipped as the engine clips (engine.values.clip).
    Never raises: a failing repr must not hide the error being reported."""
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - ValueError (int digits limit), RecursionError, a bad __repr__
        text = f"<a {type(value).__name__}>"
    return clip(text)


def describe(value: Any) -> str:
    """How error messages show an argument: a tensor's shape, dtype and device, else its type.
    A nested tensor, whose .shape raises, is shown by its sizes' count and dtype."""
    try:
        shape = getattr(value, "shape", None)
    except RuntimeError:  # a nested (ragged) tensor has no single shape
        return f"a nested tensor of {value.size(0)} tensors, dtype {value.dtype}, device {value.device}"
    dtype = getattr(value, "dtype", None)
    if shape is not None and dtype is not None:
        return f"shape {tuple(shape)}, dtype {dtype}, device {getattr(value, 'device', '?')}"
    if value is None:
        return "None"
    return f"a {type(value).__name__} ({shown(value)})"


class BridgeError(Exception):
    """Base class of every error the bridge raises on purpose."""


class ValidationError(BridgeError, ValueError):
    """An argument cannot be given to the kernels; raised before any kernel runs.

    `argument` names the offending argument (``"q"``, ``"indices"``, ...) when there is one; the
    message names it too, with the tensor's shape, dtype and device and what was expected.
    """

    def __init__(self, message: str, *, argument: Optional[str] = None):
        super().__init__(message)
        self.argument = argument


class ProviderUnavailable(BridgeError, RuntimeError):
    """A provider (FlashMLA) cannot run here.

    `reasons` lists every reason (the import error text, no CUDA, the device's architecture, a
    feature this flash_mla build lacks), `reason` is the whole message; `status` is
    `flashmla_status()`'s dict when known.
    """

    def __init__(self, reason: str, *, status: Optional[dict] = None, reasons: Optional[list] = None):
        super().__init__(reason)
        self.reason = reason
        self.reasons = list(reasons) if reasons is not None else [reason]
        self.status = status


class RoutingRejected(BridgeError, ValueError):
    """The routing policy rejected the requested configuration.

    `decision` is the policy engine's decision object (whatever evaluated the configuration), kept
    so a caller can report every violation, not only the message.
    """

    def __init__(self, message: str, decision: Any = None):
        super().__init__(message)
        self.decision = decision
