"""The GPU a case runs on, told to SGLang on a machine without one.

SGLang 0.5.19 and later read the machine two ways: through their platform context
(`get_platform().is_hip`, `.is_sm100`, ...), which they let a caller set with
`override_platform(**facts)`, and by calling `torch.cuda.get_device_capability()` itself in the
DSA steps. `platform_facts` gives every fact the context knows, consistent with one (platform,
capability); `faked_gpu` sets them and patches the two torch.cuda functions SGLang calls, for the
duration of one case.

Earlier releases have no platform context: their code calls helper functions (`is_hip()`,
`is_sm100_supported()`, `get_device_sm()`, ...) that each module imported by name.
`helper_functions` answers them from the same `platform_facts`, and `PatchedHelpers` replaces
them, for one case, in every loaded `sglang` module that holds them."""
from __future__ import annotations

import os
import sys
from contextlib import contextmanager

PLATFORMS = ("cuda", "hip", "npu")


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
        "is_hip": platform == "hip",
        "is_npu": platform == "npu",
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

    from engine.sglang.hook_targets import platform_fact_names

    return platform_fact_names(context)


@contextmanager
def faked_gpu(platform: str, capability):
    """Within: SGLang's platform facts describe this GPU, `torch.cuda.is_available()` is True
    (SGLang's device lookup needs an accelerator), `torch.cuda.get_device_capability()` returns
    `capability` and `get_device_name()` a name for it, and the helpers SGLang caches or binds
    by name answer for it (`cached_helpers`). Everything is put back on exit."""
    import torch

    from sglang.srt.runtime_context import override_platform

    facts = platform_facts(platform, capability, known_facts())
    cap = tuple(int(x) for x in capability)
    cuda = torch.cuda
    saved = cuda.is_available, cuda.get_device_capability, cuda.get_device_name
    cuda.is_available = lambda: True
    cuda.get_device_capability = lambda device=None: cap
    name = device_name("hip" if platform == "hip" else "cuda", cap)
    cuda.get_device_name = lambda device=None: name  # DCP launches ask for the MNNVL fabric (0.5.20 on)
    try:
        with override_platform(**facts), cached_helpers(platform, cap):
            yield facts
    finally:
        cuda.is_available, cuda.get_device_capability, cuda.get_device_name = saved


# the module of DeepSeek-V4's unified-KV gate, whose `is_unified_kv_triton()` caches its first
# answer (functools.lru_cache): cleared before and after each case
UNIFIED_KV_GATES = ("sglang.srt.layers.attention.dsv4.unified_kv_kernels.env_gate",  # 0.5.14-0.5.15.post1
                    "sglang.kernels.ops.attention.dsv4.unified_kv_kernels.env_gate",  # 0.5.16-0.5.22
                    "sglang.srt.layers.attention.dsv4.unified_kv_gate")  # 0.5.23
# modules SGLang imports lazily on the DeepSeek-V4 path: imported before any case, so none binds a
# case's stand-in while it is imported during that case
LAZY_V4 = UNIFIED_KV_GATES + ("sglang.srt.arg_groups.deepseek_v4_hook", "sglang.srt.arg_groups.hisparse_hook")


def import_lazy_modules() -> None:
    import importlib

    for name in LAZY_V4:
        try:
            importlib.import_module(name)
        except ImportError:  # not in this release
            pass


def _stand_in(value):
    def fact(*args, **kwargs):
        return value

    fact.platform_fact = True  # how a stand-in a module bound during a case is recognised
    return fact


@contextmanager
def cached_helpers(platform: str, cap: tuple):
    """The platform helpers that the routing of DeepSeek-V4 and MiniMax-M3 reads beside SGLang's
    platform context, answering for one case wherever a loaded module holds them, and put back
    after it: `utils.common.is_sm100_supported` (lru-cached over torch; the V4 hooks import it by
    name when they run), `is_npu` and `is_gfx95_supported` (cached, bound by name at import), the
    NPU memory probe (no torch_npu here), `is_hip` of the unified-KV gate (whose answer is
    cached: cleared before and after) and `sglang.srt.utils.is_cuda` while the release's own
    `default_prefill_backend()` runs (only then: the whole-process helper gates sgl_kernel
    imports and the nvidia-smi memory probe)."""
    import sys

    common = sys.modules["sglang.srt.utils.common"]
    major = cap[0]
    answers = {"is_sm100_supported": platform == "cuda" and major == 10, "is_npu": platform == "npu",
               "is_gfx95_supported": platform == "hip" and tuple(cap) == (9, 5)}
    patches = []  # (module, name, value to put back)

    def put(module, name, value):
        patches.append((module, name, getattr(module, name)))
        setattr(module, name, value)

    originals = {n: getattr(common, n) for n in answers if hasattr(common, n)}
    for module_name, module in list(sys.modules.items()):
        if module_name.split(".")[0] != "sglang" or module is None:
            continue
        space = vars(module)
        for name, original in originals.items():
            bound = space.get(name)
            if bound is original or getattr(bound, "platform_fact", False):
                put(module, name, _stand_in(answers[name]))
                if bound is not original:  # a stand-in of an earlier case: the original after this one
                    patches[-1] = (module, name, original)
        if platform == "npu" and callable(space.get("get_npu_memory_capacity")):
            put(module, "get_npu_memory_capacity", _stand_in(65536))
    gates = [m for m in (sys.modules.get(n) for n in UNIFIED_KV_GATES) if m is not None]
    for gate in gates:
        put(gate, "is_hip", _stand_in(platform == "hip"))
        gate.is_unified_kv_triton.cache_clear()
    graphs = sys.modules.get("sglang.srt.model_executor.cuda_graph_config")
    if graphs is not None and hasattr(graphs, "default_prefill_backend"):
        original = graphs.default_prefill_backend
        utils = sys.modules["sglang.srt.utils"]

        def default_prefill_backend(*args, **kwargs):
            saved = utils.is_cuda
            utils.is_cuda = _stand_in(platform == "cuda")
            try:
                return original(*args, **kwargs)
            finally:
                utils.is_cuda = saved

        put(graphs, "default_prefill_backend", default_prefill_backend)
    try:
        yield
    finally:
        for module, name, value in reversed(patches):
            setattr(module, name, value)
        for gate in gates:
            gate.is_unified_kv_triton.cache_clear()


def device_name(platform: str, capability) -> str:
    """A GPU of this platform and compute capability, as torch.cuda.get_device_name names it."""
    if platform == "hip":
        return "AMD Instinct MI300X"
    return {9: "NVIDIA H200", 10: "NVIDIA B200", 12: "NVIDIA RTX PRO 6000"}.get(int(capability[0]),
                                                                                 "NVIDIA GPU")


# a GPU's memory in MiB, as SGLang's probes report it (nvidia-smi, amd-smi, torch_npu): an 80 GB
# Hopper, a B200, an RTX PRO 6000 Blackwell, an MI300X, an Ascend card of 64 GB
MEMORY_MIB = {("cuda", 9): 81559, ("cuda", 10): 183359, ("cuda", 12): 97887, ("hip", 9): 196592,
              ("npu", None): 65536}


def device_memory_mib(platform: str, capability) -> int:
    """The memory of the case's GPU (MiB); a CUDA capability not in MEMORY_MIB has an 80 GB
    card's."""
    major = int(capability[0])
    return MEMORY_MIB.get((platform, major)) or MEMORY_MIB.get((platform, None)) or MEMORY_MIB[
        ("hip", 9) if platform == "hip" else ("cuda", 9)]


# SGLang's device-memory probes (srt/utils/common.py), by platform; `get_device_memory_capacity`
# picks one with the (patched) platform helpers
MEMORY_PROBES = {"cuda": "get_nvgpu_memory_capacity", "hip": "get_amdgpu_memory_capacity",
                 "npu": "get_npu_memory_capacity"}


@contextmanager
def device_probes(platform: str, capability):
    """What a whole `ServerArgs.__post_init__` of a release before the pipeline asks the device
    beside the platform helpers (`PatchedHelpers`), answered for one case and put back after it:
    the memory probes (`MEMORY_PROBES`: nvidia-smi, amd-smi, torch_npu; the answer sets generic
    defaults such as chunked_prefill_size), wherever a loaded `sglang` module holds them, and the
    unified-KV gate's cached answer (cleared before and after)."""
    common = sys.modules["sglang.srt.utils.common"]
    mib = device_memory_mib(platform, capability)
    memory = _stand_in(mib if platform == "npu" else float(mib))  # as the probes return it
    originals = {getattr(common, n): n for n in MEMORY_PROBES.values() if hasattr(common, n)}
    patches = []
    for module_name, module in list(sys.modules.items()):
        if module_name.split(".")[0] != "sglang" or module is None:
            continue
        space = vars(module)
        for name in MEMORY_PROBES.values():
            bound = space.get(name)
            if bound is not None and (bound in originals or getattr(bound, "platform_fact", False)):
                # a stand-in that a module imported during an earlier case bound: the original after
                original = bound if bound in originals else getattr(common, name)
                patches.append((module, name, original))
                setattr(module, name, memory)
    gates = [m for m in (sys.modules.get(n) for n in UNIFIED_KV_GATES) if m is not None]
    for gate in gates:
        gate.is_unified_kv_triton.cache_clear()
    try:
        yield
    finally:
        for module, name, value in reversed(patches):
            setattr(module, name, value)
        for gate in gates:
            gate.is_unified_kv_triton.cache_clear()


def helper_functions(platform: str, capability) -> dict:
    """SGLang's platform helper name -> the function it is replaced with for one case, from
    `platform_facts`. The helpers ending in `_supported` also ask for a CUDA toolkit >= 12.3 /
    12.8: taken as present on CUDA, as in `platform_facts`."""
    f = platform_facts(platform, capability)
    cuda, hip, major = f["is_cuda"], f["is_hip"], f["device_capability"][0]
    values = {
        "is_hip": hip, "is_cuda": cuda, "is_cuda_alike": cuda or hip,
        "is_npu": f["is_npu"], "is_xpu": f["is_xpu"], "is_hpu": False, "is_musa": f["is_musa"],
        "is_mps": f["is_mps"], "is_cpu": False,
        "is_sm90_supported": f["is_sm90"], "is_sm100_supported": f["is_sm100"],
        "is_sm120_supported": f["is_sm120"],
        "is_blackwell_supported": f["is_blackwell"], "is_blackwell": f["is_blackwell"],
        "is_hopper_with_cuda_12_3": f["is_hopper_with_cuda_12_3"],
        "is_ampere_with_cuda_12_3": cuda and major == 8,
        "get_device_sm": f["device_sm"], "get_device_capability": f["device_capability"],
        "get_device_name": device_name(platform, capability),
    }

    def const(value):
        def fact(*args, **kwargs):
            return value

        fact.platform_fact = True  # how a module imported during a case is recognised
        return fact

    return {name: const(value) for name, value in values.items()}


class PatchedHelpers:
    """Where each platform helper is looked up in the loaded `sglang` modules (found once, after
    the release is imported) and, per case, the helpers and torch.cuda's
    get_device_capability / is_available / get_device_name answering for the case's GPU.
    `os.environ` is put back after each case too (SGLang's DSA step writes to it)."""

    def __init__(self):
        import torch

        common = vars(sys.modules["sglang.srt.utils.common"])
        self.originals = {name: common[name] for name in helper_functions("cuda", (9, 0))
                          if name in common}
        self.sites = []  # (module, attribute)
        self.modules = len(sys.modules)
        for module_name, module in list(sys.modules.items()):
            if module_name.split(".")[0] == "sglang" and module is not None:
                space = vars(module)
                self.sites += [(module, n) for n, f in self.originals.items() if space.get(n) is f]
        self.torch_cuda = torch.cuda

    def _adopt_new_modules(self):
        """A module first imported during a case bound the case's helpers: give it the originals
        and patch it like the others from now on."""
        self.modules = len(sys.modules)
        for module_name, module in list(sys.modules.items()):
            if module_name.split(".")[0] != "sglang" or module is None:
                continue
            for name, original in self.originals.items():
                if getattr(vars(module).get(name), "platform_fact", False):
                    setattr(module, name, original)
                    self.sites.append((module, name))

    @contextmanager
    def case(self, platform: str, capability):
        helpers = helper_functions(platform, capability)
        cuda = self.torch_cuda
        torch_facts = {"get_device_capability": helpers["get_device_capability"],
                       "is_available": lambda: True, "get_device_name": helpers["get_device_name"]}
        saved = [(m, n, getattr(m, n)) for m, n in self.sites]
        saved += [(cuda, n, getattr(cuda, n)) for n in torch_facts]
        env = dict(os.environ)
        try:
            for module, name in self.sites:
                setattr(module, name, helpers[name])
            for name, fn in torch_facts.items():
                setattr(cuda, name, fn)
            yield
        finally:
            for module, name, value in saved:
                setattr(module, name, value)
            if len(sys.modules) != self.modules:
                self._adopt_new_modules()
            if os.environ != env:
                os.environ.clear()
                os.environ.update(env)
