"""Devices and memory the bridge may use, checked before anything is allocated.

`resolve_device` turns a device name into a torch.device the bridge can run on, or raises naming
what is wrong (a missing CUDA, a device index past the last GPU, a device type the bridge does not
run on). `memory_budget` is the documented limit a workload is checked against before its first
allocation: half of what this process can still take (the smaller of the machine's available
memory and what RLIMIT_AS leaves), or half of a GPU's free memory; HISPARSE_MEMORY_LIMIT (bytes,
or with a K/M/G/T suffix) replaces the computed figure. torch is imported only where a device is
looked at, so a CPU workload is sized before it is."""
from __future__ import annotations

import os
import re
from typing import Optional, Tuple

from kernels_bridge.errors import ValidationError, shown

__all__ = ["resolve_device", "memory_budget", "memory_available", "parse_size", "format_bytes", "MEMORY_FRACTION"]

MEMORY_FRACTION = 0.5
_SIZE = re.compile(r"\s*([0-9]{1,15}(?:\.[0-9]{1,6})?)\s*([kmgt]?)i?b?\s*", re.I)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def resolve_device(device, argument: str = "device", error=ValidationError) -> "torch.device":
    """The torch.device `device` names, when the bridge can put tensors there (the CPU, or a CUDA
    device that exists); else `error` naming the argument and why."""
    import torch

    if isinstance(device, torch.device):
        dev = device
    else:
        try:
            dev = torch.device(device)
        except (RuntimeError, TypeError, ValueError) as exc:
            raise error(f"{argument}: {shown(device)} is not a device name (cpu, cuda, cuda:N): "
                        f"{exc}", argument=argument) from None
    if dev.type == "cpu":
        return dev
    if dev.type != "cuda":
        raise error(f"{argument}: {dev}: the bridge runs on cpu and cuda devices only", argument=argument)
    if not torch.cuda.is_available():
        why = ("torch is a CPU-only build" if torch.version.cuda is None
               else f"torch (CUDA {torch.version.cuda}) sees no GPU")
        raise error(f"{argument}: {dev}: CUDA is not available here ({why}); use cpu", argument=argument)
    count = torch.cuda.device_count()
    if dev.index is not None and dev.index >= count:
        raise error(f"{argument}: {dev}: there is no such GPU (this machine has {count}: "
                    f"cuda:0..cuda:{count - 1})", argument=argument)
    return dev


def memory_budget(device=None) -> Tuple[int, str]:
    """(bytes a workload may allocate on `device` (a torch.device or a name), how the figure was
    found)."""
    override = os.environ.get("HISPARSE_MEMORY_LIMIT")
    if override:
        size = parse_size(override)
        if size is not None:
            return size, "HISPARSE_MEMORY_LIMIT"
    if device is not None and str(device).startswith("cuda"):
        import torch

        free, _ = torch.cuda.mem_get_info(torch.device(device))
        return int(free * MEMORY_FRACTION), f"half of the free memory of {device}"
    available = _host_available()
    return int(available * MEMORY_FRACTION), "half of the memory this process can still take"


def memory_available(device=None) -> Tuple[int, str]:
    """(bytes that can still be allocated on `device` at all, how the figure was found): a limit
    raised with --max-memory or HISPARSE_MEMORY_LIMIT never goes past it, so a workload the
    machine cannot hold is refused before the allocator fails half-way."""
    if device is not None and str(device).startswith("cuda"):
        import torch

        free, _ = torch.cuda.mem_get_info(torch.device(device))
        return int(free), f"the free memory of {device}"
    return _host_available(), "the memory this process can still take"


def _host_available() -> int:
    """What this process can still allocate on the host: the machine's available memory, capped
    by what RLIMIT_AS leaves above the address space already mapped."""
    available = None
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    available = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError):
        pass
    if available is None:
        try:
            available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (AttributeError, ValueError, OSError):
            available = 1 << 30  # unknown: assume a modest machine
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
        if soft != resource.RLIM_INFINITY:
            available = min(available, max(0, soft - _mapped_bytes()))
    except (ImportError, OSError, ValueError):
        pass
    return available


def _mapped_bytes() -> int:
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0


def parse_size(text: str) -> Optional[int]:
    """Bytes written as 1073741824, 512M, 8G, 1.5GiB ...; None when it is not a size."""
    m = _SIZE.fullmatch(text or "")
    if not m:
        return None
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def format_bytes(n: int) -> str:
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} bytes"
