import os
import tempfile

import pytest

# the compiled-policy cache of a test run lives in a temporary folder, never in the user's own
os.environ["HISPARSE_CACHE_DIR"] = tempfile.mkdtemp(prefix="hisparse-test-cache-")


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


# `make test-whole` (CI runs it): the whole-domain and per-release checks, which `make test` runs
# on samples and smaller domains of the same kind
WHOLE = os.environ.get("HISPARSE_WHOLE") == "1"


def pytest_collection_modifyitems(config, items):
    gpu_ok = None
    long_runs = os.environ.get("HISPARSE_LONG") == "1"
    for item in items:
        if "whole" in item.keywords and not WHOLE:
            item.add_marker(pytest.mark.skip(reason="make test-whole runs this (CI does); make test runs its kind on a sample or a smaller domain"))
        if "gpu" in item.keywords:
            if gpu_ok is None:
                gpu_ok = _cuda_and_flashmla()
            if not gpu_ok:
                item.add_marker(pytest.mark.skip(reason="needs CUDA and the flash_mla package"))
        if "slow" in item.keywords and not long_runs:
            item.add_marker(pytest.mark.skip(reason="long run: set HISPARSE_LONG=1"))


_FIGURES: list = []


@pytest.fixture
def figures():
    """Where a test records a measurement: (case, what, seconds, MiB, memory kind). Printed at
    the end of the run when HISPARSE_FIGURES=1."""
    return _FIGURES


def pytest_terminal_summary(terminalreporter):
    if not _FIGURES or os.environ.get("HISPARSE_FIGURES") != "1":
        return
    write = terminalreporter.write_line
    write("")
    write(f"{'case':32} {'door':18} {'time ms':>9} {'memory MiB':>11}  memory measured as")
    for case, what, seconds, mib, kind in _FIGURES:
        write(f"{case:32} {what:18} {seconds * 1000:9.1f} {mib:11.1f}  {kind}")


# run by tools/conform-releases.sh, with the release environment it names (the module's docstring)
collect_ignore = [] if os.environ.get("HISPARSE_PLUGIN_RELEASE_ENV") else ["test_sglang_plugin_releases.py"]
