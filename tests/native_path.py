"""The hot buffer's two bookkeepings of long requests, for tests: an autouse fixture that runs a
test module once on each (`from tests.native_path import bookkeeping`), and `tensor_path()`, a
context in which new HotBuffers use the tensor code."""
from __future__ import annotations

import contextlib
import shutil

import pytest

from kernels_bridge import native

PATHS = ["C", "tensors"]


def require_c() -> None:
    """Fail where a C compiler exists but the C bookkeeping did not load (a broken build must not
    pass as "skipped"); skip only where there is no compiler to build it with."""
    if native.translate_long() is not None:
        return
    if shutil.which("cc") or shutil.which("gcc"):
        pytest.fail(f"the hot buffer's C bookkeeping is not loaded: {native.reason()}; "
                    f"reinstall the package (`make install`) to build it")
    pytest.skip(f"no C compiler here, so no C bookkeeping: {native.reason()}")


@contextlib.contextmanager
def tensor_path():
    """HotBuffers made inside use the tensor code, as where the C file was not built."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(native, "translate_long", lambda: None)
        mp.setattr(native, "check_arguments", lambda: None)
        yield


@pytest.fixture(autouse=True, params=PATHS)
def bookkeeping(request):
    """Run the test once with each bookkeeping; the HotBuffers it makes pick theirs at construction."""
    if request.param == "C":
        require_c()
        yield "C"
    else:
        with tensor_path():
            yield "tensors"
