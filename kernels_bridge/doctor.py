"""What the bridge can run on this machine, and why: `doctor_report()` and `render_doctor()`.

The report never raises: a machine without CUDA or flash_mla is a normal answer, and any probe
that fails records its error text instead.
"""
from __future__ import annotations

import platform
from typing import Callable

import torch

from kernels_bridge import flashmla
from kernels_bridge.dispatch import BACKENDS, select_provider

__all__ = ["doctor_report", "render_doctor"]


def doctor_report() -> dict:
    """A JSON-serialisable dict describing the bridge's environment.

    Keys: python, platform, torch {version, cuda, cuda_available, device_count},
    device {name, capability, index} or None, flash_mla {imports, version, error (the import
    error text), flavour, usable, reasons (every reason it is not usable), reason (them joined),
    probe_error (only when probing itself failed)}, backends {name: {provider, reason}} (what
    provider="auto" picks here, and why).
    """
    status = _guard(lambda: flashmla.flashmla_status(), {})
    flash_mla = {
        "imports": status.get("import_error") is None if "error" not in status else None,
        "version": status.get("version"),
        "error": status.get("import_error"),
        "flavour": status.get("flavour"),
        "usable": bool(status.get("usable")),
        "reasons": list(status.get("reasons") or []),
        "reason": status.get("reason"),
    }
    if "error" in status:
        flash_mla["probe_error"] = status["error"]
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        # torch imported, so the reference kernels run: the bridge is usable (FlashMLA or not)
        "bridge": {"usable": True, "reason": None},
        "torch": _guard(_torch_facts, {"version": getattr(torch, "__version__", None)}),
        "numpy": _numpy_facts(),
        "device": _guard(_device_facts, None),
        "flash_mla": flash_mla,
        "backends": {name: _guard(lambda name=name: _auto_choice(name),
                                  {"provider": "reference", "reason": None})
                     for name in BACKENDS},
    }


def render_doctor(report: dict) -> str:
    """Human-readable text of a doctor_report() dict."""
    t = report.get("torch", {})
    dev = report.get("device")
    fm = report.get("flash_mla", {})
    lines = [
        "kernel bridge doctor",
        f"  python     {report.get('python')} ({report.get('platform')})",
        f"  torch      {t.get('version')} (CUDA build: {t.get('cuda') or 'none'}; "
        f"CUDA available: {'yes' if t.get('cuda_available') else 'no'}; "
        f"devices: {t.get('device_count', 0)})",
    ]
    np_facts = report.get("numpy") or {}
    if np_facts.get("version"):
        lines.append(f"  numpy      {np_facts['version']}")
    else:
        lines.append(f"  numpy      does not import ({np_facts.get('error')}): torch warns at import "
                     "without it; `pip install numpy`")
    if dev:
        cap = dev.get("capability") or ["?", "?"]
        lines.append(f"  device     cuda:{dev.get('index')} {dev.get('name')} "
                     f"(compute capability {cap[0]}.{cap[1]})")
    else:
        lines.append("  device     no CUDA device")
    if fm.get("probe_error"):
        lines.append(f"  flash_mla  probe failed: {fm['probe_error']}")
    elif fm.get("imports"):
        flavour = (fm.get("flavour") or {}).get("name", "?")
        lines.append(f"  flash_mla  {fm.get('version') or 'unknown version'}, API flavour "
                     f"{flavour}")
    else:
        lines.append(f"  flash_mla  does not import: {fm.get('error')}")
    reasons = fm.get("reasons") or [fm.get("reason")]
    if fm.get("usable"):
        lines.append("  FlashMLA   usable")
    elif len(reasons) == 1:
        lines.append(f"  FlashMLA   not usable: {reasons[0]}")
    else:  # every reason, one a line
        lines.append(f"  FlashMLA   not usable, {len(reasons)} reasons:")
        lines += [f"             - {reason}" for reason in reasons]
    lines.append("backends (provider='auto' here)")
    width = max(len(name) for name in report.get("backends", {"": None}))
    for name, choice in report.get("backends", {}).items():
        why = choice.get("reason") or f"probe failed ({choice.get('error')})"
        lines.append(f"  {name:<{width}}  {choice.get('provider')}: {why}")
    return "\n".join(lines)


def _guard(probe: Callable, fallback):
    """Run a probe; on any error return the fallback with the error text (the report never
    raises)."""
    try:
        return probe()
    except Exception as exc:  # noqa: BLE001 - a report about a broken machine must still render
        if isinstance(fallback, dict):
            return {**fallback, "error": f"{type(exc).__name__}: {exc}"}
        return fallback


def _numpy_facts() -> dict:
    try:
        import numpy
    except ImportError as exc:
        return {"version": None, "error": f"{type(exc).__name__}: {exc}"}
    return {"version": numpy.__version__, "error": None}


def _torch_facts() -> dict:
    available = torch.cuda.is_available()
    return {
        "version": torch.__version__,
        "cuda": torch.version.cuda,
        "cuda_available": available,
        "device_count": torch.cuda.device_count() if available else 0,
    }


def _device_facts():
    if not torch.cuda.is_available():
        return None
    index = torch.cuda.current_device()
    return {"index": index, "name": torch.cuda.get_device_name(index),
            "capability": list(torch.cuda.get_device_capability(index))}


def _auto_choice(backend: str) -> dict:
    provider, reason = select_provider(backend, None, "auto")
    return {"provider": provider, "reason": reason}
