"""Kernel bridge: runs the attention backend a policy chose.

FP8 656-byte KV rows (`fp8`), exact CPU reference kernels (`reference`), the FlashMLA adapter
(`flashmla`), validation and dispatch by backend name (`validate`, `dispatch`), HiSparse's hot
buffer (`hot_buffer`), the `hisparse attend` and `doctor` commands (`cli`) and the GPU check of
FlashMLA against the reference (`gpu_check`). Everything here needs torch but the plain sizes (`layout`) and
attend's workload checks (`workload_spec`), which run before torch is imported; names are resolved lazily
so that `import kernels_bridge` stays cheap until a name is used.
"""
from __future__ import annotations

import importlib

# public name -> module that defines it
_EXPORTS = {
    "quantize_kv_fp8": "fp8",
    "dequantize_kv_fp8": "fp8",
    "FP8_ROW_BYTES": "fp8",
    "sparse_prefill": "reference",
    "sparse_decode_fp8": "reference",
    "BridgeError": "errors",
    "ValidationError": "errors",
    "ProviderUnavailable": "errors",
    "RoutingRejected": "errors",
    "run_backend": "dispatch",
    "attend": "dispatch",
    "BACKENDS": "dispatch",
    "PROVIDERS": "dispatch",
    "AttentionResult": "dispatch",
    "select_provider": "dispatch",
    "cache_dtype_of": "dispatch",
    "flashmla_status": "flashmla",
    "doctor_report": "doctor",
    "render_doctor": "doctor",
    "HotBuffer": "hot_buffer",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'kernels_bridge' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__():
    return __all__
