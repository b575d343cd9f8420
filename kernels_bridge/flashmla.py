"""Adapter over the `flash_mla` package (PyPI `sgl-flash-mla`; upstream FlashMLA builds too).

`flash_mla` is imported once, lazily, on first need; ImportError and OSError (what a CPU-only torch
raises, libc10_cuda.so being absent) are caught and kept as the reason it is unusable. Importing
`kernels_bridge` never imports it.

Which API the installed package speaks is detected once from its signatures (`Flavour`):
- `sgl-use-legacy` (sgl-flash-mla 1.x): every entry point takes `use_legacy`; the V3.2 formats
  (576-dim q, 656-byte rows) and SM90 live in the legacy kernels, so calls pass use_legacy=True,
  and decode passes kv_format="V32" so the kernel checks the row format it detects. Statistics
  are natural-log.
- `upstream-natural-lse` (deepseek-ai/FlashMLA, Jan-2026 to Sep-2026): no flag; attn_sink and
  topk_length exist; natural-log statistics.
- `upstream-log2-lse` (Sep/Oct-2025 builds): sparse prefill has neither attn_sink nor topk_length
  and returns max_logits and lse in base 2, which the adapter converts to natural log (and a query
  with no valid index to lse +inf); decode metadata comes as tensors from get_mla_metadata. These
  builds take only a page block size of 64 for decode (deepseek-ai/FlashMLA@1408756
  csrc/pybind.cpp:236 "Currently page_block_size must be 64"), and their SM100 sparse prefill
  only 128 heads (csrc/sm100/prefill/sparse/fwd.cu:708, B_H = 128).
- `upstream-v41-only` (deepseek-ai/FlashMLA 2026.09.30 and later, e.g. PyPI deepinfer-flashmla
  1.0.0): decode takes `enable_batch_invariant` and no `use_legacy` (sgl-flash-mla 1.0.0
  flash_mla_interface.py:250-253 calls it "a 2026.09.30 feature"). That release dropped SM90 and
  the V3.2 formats (its README; its flash_mla_interface.py: head_dim "must be 512"), so it is
  detected only to be refused with that reason, never selected.
Outputs always follow the reference's conventions: natural-log lse (and max_logits), decode lse
[b, h_q, s_q].

FlashMLA is usable for a call only when it imports, the build has the V3.2 kernels, the tensors
are on a CUDA device of compute capability 9.0 (SM90) or 10.x with x in {0, 3} (SM100 family),
the build takes the call's shape (the 2025 limits above) and supports the optional arguments.
"""
from __future__ import annotations

import inspect
import math
import threading
from dataclasses import asdict, dataclass
from typing import List, Optional, Tuple

import torch

from kernels_bridge.errors import ProviderUnavailable
from kernels_bridge.fp8 import D_QK
from kernels_bridge.validate import D_V, check_decode, check_prefill

__all__ = ["Flavour", "flashmla_status", "detect_flavour", "reset_probe", "unusable_reasons",
           "sparse_prefill_flashmla", "sparse_decode_fp8_flashmla", "SUPPORTED_CAPABILITIES"]

SUPPORTED_CAPABILITIES = {
    (9, 0): "SM90 (Hopper)",
    (10, 0): "SM100 (Blackwell)",
    (10, 3): "SM103 (Blackwell Ultra)",
}
V32_KV_FORMAT = "V32"
LN2 = math.log(2.0)


@dataclass(frozen=True)
class Flavour:
    """What the installed flash_mla API needs and returns."""
    name: str
    use_legacy: bool          # pass use_legacy=True: the V3.2 kernels are the legacy ones
    kv_format: bool           # decode accepts kv_format (the adapter passes "V32")
    prefill_log2_lse: bool    # sparse prefill returns max_logits and lse in base 2
    sched_meta_object: bool   # get_mla_metadata() returns an object filled by the first call
    attn_sink: bool           # both kernels take attn_sink
    topk_length: bool         # sparse prefill takes topk_length
    legacy_kernels: Optional[bool]  # has_legacy(), when the package has the notion
    v32_formats: bool = True  # the build has the V3.2 formats (576-dim q, 656-byte rows) and SM90

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class _Probe:
    module: object
    error: Optional[str]
    flavour: Optional[Flavour]
    version: Optional[str]


_lock = threading.Lock()
_probe: Optional[_Probe] = None
_devices: dict = {}


def reset_probe() -> None:
    """Forget the cached import, flavour and device facts (after installing flash_mla; tests)."""
    global _probe
    with _lock:
        _probe = None
        _devices.clear()


def detect_flavour(module) -> Flavour:
    """Classify a flash_mla module's API from its signatures (never calls a kernel)."""
    sparse = inspect.signature(module.flash_mla_sparse_fwd).parameters
    decode = inspect.signature(module.flash_mla_with_kvcache).parameters
    metadata = inspect.signature(module.get_mla_metadata).parameters
    use_legacy = "use_legacy" in sparse and "use_legacy" in decode
    natural = use_legacy or "return_log2_lse" in sparse or "attn_sink" in sparse
    # 2026.09.30 added enable_batch_invariant and dropped V3.2: without use_legacy there is no way
    # back to the V3.2 kernels
    v41_only = not use_legacy and "enable_batch_invariant" in decode
    sched_object = any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in metadata.values())
    has_legacy = getattr(module, "has_legacy", None)
    legacy_kernels = bool(has_legacy()) if callable(has_legacy) else None
    if use_legacy:
        name = "sgl-use-legacy"
    elif v41_only:
        name = "upstream-v41-only"
    elif natural:
        name = "upstream-natural-lse"
    else:
        name = "upstream-log2-lse"
    return Flavour(
        name=name,
        use_legacy=use_legacy,
        kv_format=use_legacy and "kv_format" in decode,
        prefill_log2_lse=not natural,
        sched_meta_object=sched_object,
        attn_sink="attn_sink" in sparse and "attn_sink" in decode,
        topk_length="topk_length" in sparse,
        legacy_kernels=legacy_kernels,
        v32_formats=not v41_only,
    )


def _load() -> _Probe:
    global _probe
    probe = _probe
    if probe is None:
        with _lock:
            if _probe is None:
                _probe = _import_flash_mla()
            probe = _probe
    return probe


def _import_flash_mla() -> _Probe:
    try:
        import flash_mla as module
    except (ImportError, OSError) as exc:
        return _Probe(None, f"{type(exc).__name__}: {exc}", None, None)
    except Exception as exc:  # a broken build may fail in torch.ops.load_library with anything
        return _Probe(None, f"{type(exc).__name__}: {exc}", None, None)
    try:
        flavour = detect_flavour(module)
    except (AttributeError, TypeError, ValueError) as exc:
        return _Probe(None, f"unrecognised flash_mla API ({type(exc).__name__}: {exc})",
                      None, None)
    return _Probe(module, None, flavour, getattr(module, "__version__", None))


def _default_device() -> Optional[torch.device]:
    """The device FlashMLA would run on when the caller names none."""
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return None


def _device_info(device: torch.device) -> Optional[dict]:
    """Name and compute capability of a CUDA device; None for any other device.

    Module-level on purpose: tests replace it to present CPU tensors as a supported GPU.
    """
    if device.type != "cuda":
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()
    return {"index": index, "name": torch.cuda.get_device_name(index),
            "capability": tuple(torch.cuda.get_device_capability(index))}


def _cached_device_info(device: torch.device) -> Optional[dict]:
    key = (device.type, device.index)
    if key not in _devices:
        _devices[key] = _device_info(device)
    return _devices[key]


def _no_device_reason() -> str:
    if torch.version.cuda is None:
        return f"CUDA is not available: torch {torch.__version__} is a CPU-only build"
    return (f"CUDA is not available: torch {torch.__version__} (CUDA {torch.version.cuda}) "
            f"sees no GPU")


def unusable_reasons(device: Optional[torch.device] = None, *, backend: Optional[str] = None,
                     attn_sink: bool = False, topk_length: bool = False,
                     h_q: Optional[int] = None, block_size: Optional[int] = None) -> List[str]:
    """Every reason FlashMLA cannot run a call on `device` (None: the default CUDA device), in the
    order they are checked; empty when it can.

    The package, the device and the build's limits are each checked whatever the others say, so
    a machine without flash_mla and without a GPU hears of both. What a missing module leaves
    unknown (its flavour's limits) and what a missing device leaves unknown (its capability) is
    not guessed.
    backend: "flashmla_sparse" or "flashmla_kv" when the call's arguments matter; attn_sink,
    topk_length: whether the call passes them; h_q, block_size: its head count and (decode) page
    block size, which some builds limit.
    """
    reasons = []
    probe = _load()
    flavour = probe.flavour
    if probe.module is None:
        reasons.append(f"flash_mla does not import ({probe.error})")
    elif not flavour.v32_formats:
        reasons.append(f"this flash_mla build ({flavour.name}: FlashMLA 2026.09.30 or later) dropped "
                       "SM90 and the DeepSeek-V3.2 formats (576-dim q, 656-byte FP8 rows); install "
                       "sgl-flash-mla, which keeps them behind use_legacy")
    if device is None:
        device = _default_device()
    cap = None
    if device is None:
        reasons.append(_no_device_reason())
    else:
        info = _cached_device_info(torch.device(device))
        if info is None:
            reasons.append(f"the tensors are on {device}; FlashMLA runs on CUDA devices only")
        else:
            cap = tuple(info["capability"])
            if cap not in SUPPORTED_CAPABILITIES:
                reasons.append(f"{device} ({info['name']}) has compute capability {cap[0]}.{cap[1]}; "
                               "FlashMLA's sparse kernels need SM90 (9.0) or SM100 (10.0, 10.3)")
    if probe.module is None or not flavour.v32_formats:
        return reasons  # no build to ask about its limits
    if flavour.use_legacy and flavour.legacy_kernels is False:
        reasons.append("this flash_mla build has no legacy kernels (built with FLASH_MLA_BUILD_LEGACY=0), "
                       "and the DeepSeek-V3.2 formats live there")
    if flavour.prefill_log2_lse and backend == "flashmla_kv" and block_size not in (None, 64):
        reasons.append(f"this flash_mla build ({flavour.name}, 2025) takes only a page block size of 64 "
                       f"for decode; the cache has block_size {block_size}")
    if flavour.prefill_log2_lse and backend == "flashmla_sparse" and cap is not None and cap[0] == 10 \
            and h_q not in (None, 128):
        reasons.append(f"this flash_mla build ({flavour.name}, 2025) runs sparse prefill on SM100 with "
                       f"128 heads only; the call has h_q {h_q}")
    if attn_sink and not flavour.attn_sink:
        reasons.append(f"this flash_mla build ({flavour.name}) does not take attn_sink")
    if topk_length and backend == "flashmla_sparse" and not flavour.topk_length:
        reasons.append(f"this flash_mla build ({flavour.name}) does not take topk_length")
    return reasons


def flashmla_status(device=None) -> dict:
    """Whether FlashMLA can run here, and everything that decides it (JSON-serialisable).

    device: a torch.device / str, or None for the default CUDA device.
    Keys: usable, reasons (every reason it cannot, empty when usable), reason (them joined by
    "; ", None when usable), import_error, version, flavour (dict or None),
    torch, torch_cuda, cuda_available, device, device_name, capability ([major, minor] or None).
    """
    probe = _load()
    dev = torch.device(device) if device is not None else _default_device()
    info = None
    if dev is not None:
        try:
            info = _cached_device_info(dev)
        except (RuntimeError, AssertionError, ValueError) as exc:  # e.g. a bad device index
            return _status(probe, dev, None, [f"cannot query {dev}: {exc}"])
    return _status(probe, dev, info, unusable_reasons(dev))


def _status(probe: _Probe, dev, info, reasons: List[str]) -> dict:
    return {
        "usable": not reasons,
        "reasons": reasons,
        "reason": "; ".join(reasons) or None,
        "import_error": probe.error,
        "version": probe.version,
        "flavour": probe.flavour.as_dict() if probe.flavour else None,
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
        "device": str(dev) if dev is not None else None,
        "device_name": info["name"] if info else None,
        "capability": list(info["capability"]) if info else None,
    }


def cannot_run(backend: str, reasons: List[str], device) -> ProviderUnavailable:
    """The error of a call FlashMLA cannot run, with every reason."""
    return ProviderUnavailable(f"FlashMLA cannot run {backend}: {'; '.join(reasons)}",
                               status=flashmla_status(device), reasons=reasons)


def _require(device: torch.device, backend: str, *, attn_sink: bool, topk_length: bool,
             h_q: Optional[int] = None, block_size: Optional[int] = None):
    reasons = unusable_reasons(device, backend=backend, attn_sink=attn_sink,
                               topk_length=topk_length, h_q=h_q, block_size=block_size)
    if reasons:
        raise cannot_run(backend, reasons, device)
    probe = _load()
    return probe.module, probe.flavour


# ---- the two kernels --------------------------------------------------------------------------

def sparse_prefill_flashmla(q, kv, indices, sm_scale, d_v=D_V, attn_sink=None, topk_length=None):
    """`flash_mla_sparse_fwd`, validated and normalised to the reference's conventions.

    q: bf16 [s_q, h_q, 576]; kv: bf16 [s_kv, 1, 576]; indices: int32 [s_q, 1, topk];
    sm_scale: float; d_v: 512; attn_sink: f32 [h_q] or None; topk_length: int32 [s_q] or None.
    Returns (out bf16 [s_q, h_q, 512], max_logits f32 [s_q, h_q], lse f32 [s_q, h_q]), natural log.
    Raises ValidationError, or ProviderUnavailable when FlashMLA cannot run these tensors.
    """
    check_prefill(q, kv, indices, sm_scale, d_v, attn_sink, topk_length)
    return prefill_call(q, kv, indices, sm_scale, attn_sink, topk_length)


def sparse_decode_fp8_flashmla(q, k_cache, indices, softmax_scale=None, attn_sink=None, seq_lens=None):
    """Sparse FP8 `flash_mla_with_kvcache`, validated, called the way SGLang calls it.

    q: bf16 [b, s_q, h_q, 576]; k_cache: uint8/int8/float8_e4m3fn [num_blocks, block_size, 1, 656];
    indices: int32 [b, s_q, topk] flat rows or -1; softmax_scale: float or None (1/sqrt(576));
    attn_sink: f32 [h_q] or None; seq_lens: int [b] or None (each request's length, for the
    scheduling metadata; None: topk).
    Returns (out bf16 [b, s_q, h_q, 512], lse f32 [b, h_q, s_q]), natural log.
    Raises ValidationError, or ProviderUnavailable when FlashMLA cannot run these tensors.
    """
    check_decode(q, k_cache, indices, softmax_scale, attn_sink, seq_lens=seq_lens)
    return decode_call(q, k_cache, indices, softmax_scale, attn_sink, seq_lens)


def prefill_call(q, kv, indices, sm_scale, attn_sink=None, topk_length=None):
    """The prefill call for arguments that already passed check_prefill."""
    module, flavour = _require(q.device, "flashmla_sparse", attn_sink=attn_sink is not None,
                               topk_length=topk_length is not None, h_q=q.shape[1])
    s_q, h_q = q.shape[0], q.shape[1]
    if s_q == 0:  # nothing to launch
        return (q.new_empty(0, h_q, D_V), q.new_empty(0, h_q, dtype=torch.float32),
                q.new_empty(0, h_q, dtype=torch.float32))
    extra = {}
    if flavour.use_legacy:
        extra["use_legacy"] = True
    if attn_sink is not None:
        extra["attn_sink"] = attn_sink
    if topk_length is not None:
        extra["topk_length"] = topk_length
    out, max_logits, lse = module.flash_mla_sparse_fwd(
        q=q, kv=kv, indices=indices, sm_scale=float(sm_scale), d_v=D_V, **extra)
    if flavour.prefill_log2_lse:
        max_logits, lse = _natural_from_log2(max_logits, lse)
    return out, max_logits, lse


def decode_call(q, k_cache, indices, softmax_scale=None, attn_sink=None, seq_lens=None):
    """The decode call for arguments that already passed check_decode. The scheduling metadata
    is SGLang's (dsa_backend.py: `compute_dsa_seqlens` then `get_mla_metadata`): each request
    attends to min(seq_len, topk) rows."""
    module, flavour = _require(q.device, "flashmla_kv", attn_sink=attn_sink is not None,
                               topk_length=False, h_q=q.shape[2], block_size=k_cache.shape[1])
    b, s_q, h_q, _ = q.shape
    topk = indices.shape[-1]
    if b == 0 or s_q == 0:  # FlashMLA rejects b == 0; nothing to launch either way
        return (q.new_empty(b, s_q, h_q, D_V),
                q.new_empty(b, s_q, h_q, dtype=torch.float32).transpose(1, 2))
    scale = D_QK ** -0.5 if softmax_scale is None else float(softmax_scale)
    cache = k_cache if k_cache.dtype == torch.float8_e4m3fn else k_cache.view(torch.float8_e4m3fn)
    # Sparse decode attends to at most topk rows per request, which is what the scheduler needs.
    if seq_lens is None:
        cache_seqlens = torch.full((b,), topk, dtype=torch.int32, device=q.device)
    else:
        cache_seqlens = seq_lens.to(device=q.device, dtype=torch.int32).clamp(max=topk).contiguous()
    block_table = torch.empty((b, 0), dtype=torch.int32, device=q.device)  # unused when sparse
    sched, num_splits = module.get_mla_metadata(cache_seqlens, s_q * h_q, 1, h_q, True, topk)
    extra = {}
    if flavour.use_legacy:
        extra["use_legacy"] = True
    if flavour.kv_format:
        extra["kv_format"] = V32_KV_FORMAT
    if attn_sink is not None:
        extra["attn_sink"] = attn_sink
    out, lse = module.flash_mla_with_kvcache(
        q=q, k_cache=cache, block_table=block_table, cache_seqlens=cache_seqlens,
        head_dim_v=D_V, tile_scheduler_metadata=sched, num_splits=num_splits,
        softmax_scale=scale, causal=False, is_fp8_kvcache=True, indices=indices, **extra)
    if not flavour.sched_meta_object:  # older builds: keep the no-valid-index convention
        lse = torch.where(lse == -math.inf, math.inf, lse)
    return out, lse


def _natural_from_log2(max_logits: torch.Tensor,
                       lse: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Base-2 statistics of old builds -> natural log; no valid index -> lse +inf."""
    lse = lse * LN2
    return max_logits * LN2, torch.where(lse == -math.inf, math.inf, lse)
