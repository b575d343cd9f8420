"""The GPU a case runs on, told to SGLang (0.5.19 to 0.5.23) on a machine without one.

SGLang reads the machine two ways: through its platform context (`get_platform().is_hip`,
`.is_sm100`, ...), which it lets a caller set with `override_platform(**facts)`, and by calling
`torch.cuda.get_device_capability()` itself in the DSA steps. `platform_facts` gives every fact
the context knows, consistent with one (platform, capability); `faked_gpu` sets them and patches
the two torch.cuda functions SGLang calls, for the duration of one case."""
from __future__ import annotations

from contextlib import contextmanager

PLATFORMS = ("cuda", "hip")


def platform_facts(platform: str, capability, known=None) -> dict:
    """Every fact of 0.5.23's `_PLATFORM_PROBES` / `_PLATFORM_VALUES` for this GPU, or, with
    `known` (the fact names a release's platform context knows), exactly those: 0.5.19-0.5.21 know
    neither is_mps nor is_sm110. A known fact this function cannot give raises ValueError naming
    it: SGLang would read it from this machine, which has no GPU.

    CUDA is taken to be 12.8 or newer (the Hopper and Blackwell probes also check the toolkit)
    with FlashInfer installed, as a CUDA install of SGLang has it; ROCm has no SM facts and no
    FlashInfer. No AMX (a CPU-inference feature)."""
    if platform not in PLATFORMS:
        raise ValueError(f"unknown platform {platform!r}; expected one of {', '.join(PLATFORMS)}")
    major, minor = (int(x) for x in capability)
    cuda = platform == "cuda"
    facts = {
        "is_cuda": cuda,
        "is_hip": not cuda,
        "is_npu": False,
        "is_xpu": False,
        "is_musa": False,
        "is_mps": False,
        "is_sm90": cuda and major == 9,
        "is_sm100": cuda and major == 10,
        "is_sm100_or_sm110": cuda and major in (10, 11),
        "is_sm110": cuda and major == 11,
        "is_sm120": cuda and major == 12,
        "is_blackwell": cuda and major in (10, 11, 12),
        "is_hopper_with_cuda_12_3": cuda and major == 9,
        "has_amx": False,
        "has_flashinfer": cuda,
        "device_sm": major * 10 + minor,
        "device_capability": (major, minor),
    }
    if known is None:
        return facts
    unknown = sorted(set(known) - set(facts))
    if unknown:
        raise ValueError("SGLang's platform context knows facts no stand-in gives: " + ", ".join(unknown))
    return {name: value for name, value in facts.items() if name in known}


def known_facts() -> frozenset:
    """The fact names the installed SGLang's platform context knows (`override_platform` refuses
    any other)."""
    import sglang.srt.runtime_context as context

    return frozenset(context._PLATFORM_PROBES) | frozenset(context._PLATFORM_VALUES)


@contextmanager
def faked_gpu(platform: str, capability):
    """Within: SGLang's platform facts describe this GPU, `torch.cuda.is_available()` is True
    (SGLang's device lookup needs an accelerator) and `torch.cuda.get_device_capability()`
    returns `capability`. Everything is put back on exit."""
    import torch

    from sglang.srt.runtime_context import override_platform

    facts = platform_facts(platform, capability, known_facts())
    cap = tuple(int(x) for x in capability)
    saved = torch.cuda.is_available, torch.cuda.get_device_capability
    torch.cuda.is_available = lambda: True
    torch.cuda.get_device_capability = lambda device=None: cap
    try:
        with override_platform(**facts):
            yield facts
    finally:
        torch.cuda.is_available, torch.cuda.get_device_capability = saved
