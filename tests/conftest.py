import os

import pytest


def _cuda_and_flashmla() -> bool:
    try:
        import torch
    except Exception:
        return False
    if not torch.cuda.is_available():
        return False
    try:
        import flash_mla  # noqa: F401
    except (ImportError, OSError):
        return False
    return True


def pytest_collection_modifyitems(config, items):
    gpu_ok = None
    long_runs = os.environ.get("HISPARSE_LONG") == "1"
    for item in items:
        if "gpu" in item.keywords:
            if gpu_ok is None:
                gpu_ok = _cuda_and_flashmla()
            if not gpu_ok:
                item.add_marker(pytest.mark.skip(reason="needs CUDA and the flash_mla package"))
        if "slow" in item.keywords and not long_runs:
            item.add_marker(pytest.mark.skip(reason="long run: set HISPARSE_LONG=1"))
