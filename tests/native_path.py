"""The bridge's two ways on the CPU, for tests: with its C helpers and with its tensor code only.
An autouse fixture runs a test module once on each (`from tests.native_path import cpu_path`);
`tensor_path()` is a context in which the C helpers are not there."""
from __future__ import annotations

import contextlib
import shutil

import pytest

from kernels_bridge import native

PATHS = ["C", "tensors"]


def require_c() -> None:
    """Fail where a C compiler exists but the C helpers did not load (a broken build must not pass
    as "skipped"); skip only where there is no compiler to build them with."""
    if native.translate_long() is not None:
        return
    if shutil.which("cc") or shutil.which("gcc"):
        pytest.fail(f"the bridge's C helpers are not loaded: {native.reason()}; "
                    f"reinstall the package (`make install`) to build it")
    pytest.skip(f"no C compiler here, so no C helpers: {native.reason()}")


@contextlib.contextmanager
def tensor_path():
    """Inside, the bridge runs as where the C helpers were not built: HotBuffers made here and
    every FP8 unpacking use the tensor code."""
    with pytest.MonkeyPatch.context() as mp:
        for name in ("translate_long", "check_arguments", "unpack_fp8"):
            mp.setattr(native, name, lambda: None)
        yield


@pytest.fixture(autouse=True, params=PATHS)
def cpu_path(request):
    """Run the test once with the C helpers and once without (a HotBuffer picks its bookkeeping
    when it is made)."""
    if request.param == "C":
        require_c()
        yield "C"
    else:
        with tensor_path():
            yield "tensors"
