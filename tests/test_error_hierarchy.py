"""One exception hierarchy per package: every exception class defined anywhere in engine/ derives
from engine.errors.EngineError, every one in kernels_bridge/ from kernels_bridge.errors.BridgeError.
Every module is imported and scanned, so a new exception class cannot slip in beside the root."""
import importlib
import importlib.util
import inspect
import pkgutil

import pytest

from engine.errors import EngineError, HisparseError

PACKAGES = {"engine": "engine.errors.EngineError", "kernels_bridge": "kernels_bridge.errors.BridgeError"}
# classes that may not derive from their package's root, each with the reason
OUTSIDE_ROOT = {
    # stands in for argparse's exit inside SGLang 0.5.11/0.5.12's own parsing code, where an
    # `except Exception` must not catch it, as it would not catch the real SystemExit
    "engine.sglang.conform.startup.ParserError",
    # the timer of an in-process conform run: it interrupts SGLang's own code, whose `except
    # Exception` must not swallow it; it never leaves the runner (it becomes CaseTimedOut)
    "engine.sglang.conform.runner._Alarm",
}


def _modules(package: str):
    root = importlib.import_module(package)
    yield root
    for info in pkgutil.walk_packages(root.__path__, package + "."):
        if info.name.rsplit(".", 1)[-1] == "__main__":  # runs the CLI when imported
            continue
        yield importlib.import_module(info.name)


def _exception_classes(module):
    for _, obj in vars(module).items():
        if inspect.isclass(obj) and issubclass(obj, BaseException) and obj.__module__ == module.__name__:
            yield obj
        if inspect.isclass(obj) and obj.__module__ == module.__name__:  # nested classes too
            for inner in vars(obj).values():
                if inspect.isclass(inner) and issubclass(inner, BaseException):
                    yield inner


def _root(dotted: str):
    module, name = dotted.rsplit(".", 1)
    return getattr(importlib.import_module(module), name)


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_every_exception_derives_from_the_package_root(package):
    root = _root(PACKAGES[package])
    found, stray = [], []
    for module in _modules(package):
        for cls in _exception_classes(module):
            found.append(cls)
            if not issubclass(cls, root) and f"{module.__name__}.{cls.__qualname__}" not in OUTSIDE_ROOT:
                stray.append(f"{module.__name__}.{cls.__qualname__}")
    assert root in found  # the scan reaches the module that defines the root
    assert len(found) > 3
    assert not stray, f"exception classes outside {PACKAGES[package]}: {stray}"


def test_the_allowed_exceptions_exist_and_need_it():
    from engine.sglang.conform.startup import ParserError

    from engine.sglang.conform.runner import _Alarm

    assert OUTSIDE_ROOT == {f"{c.__module__}.{c.__qualname__}" for c in (ParserError, _Alarm)}
    assert issubclass(ParserError, SystemExit) and not issubclass(ParserError, Exception)
    assert issubclass(_Alarm, BaseException) and not issubclass(_Alarm, Exception)


def test_the_scan_sees_a_stray_class(tmp_path):
    """The scan reports a class that does not derive from the root (it could fail)."""
    path = tmp_path / "strayed.py"
    path.write_text("class Oops(ValueError):\n    pass\n")
    spec = importlib.util.spec_from_file_location("strayed", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    classes = list(_exception_classes(module))
    assert [c.__name__ for c in classes] == ["Oops"] and not issubclass(classes[0], EngineError)


def test_builtin_bases_callers_rely_on_are_kept():
    from engine.cli.options import UsageError
    from engine.cli.output import OutputError
    from engine.errors import ConfigError, PolicyError
    from engine.language.templates import TemplateSyntaxError
    from engine.sglang.conform import SGLangUnavailable
    from engine.sglang.conform.drivers import UnknownVersion
    from engine.sglang.conform.runner import DriverError, WorkerCrashed
    from kernels_bridge.errors import BridgeError, ProviderUnavailable, RoutingRejected, ValidationError
    from kernels_bridge.hot_buffer import HotBufferError

    assert issubclass(ConfigError, ValueError) and issubclass(PolicyError, HisparseError)
    assert issubclass(TemplateSyntaxError, ValueError) and issubclass(UnknownVersion, ValueError)
    assert issubclass(WorkerCrashed, RuntimeError) and issubclass(DriverError, RuntimeError)
    # the CLI picks exit codes per class: usage, output and conform errors are not HisparseErrors
    for cls in (UsageError, OutputError, SGLangUnavailable):
        assert issubclass(cls, EngineError) and not issubclass(cls, HisparseError)
    assert issubclass(HotBufferError, ValidationError) and issubclass(HotBufferError, ValueError)
    assert issubclass(ValidationError, ValueError) and issubclass(RoutingRejected, ValueError)
    assert issubclass(ProviderUnavailable, RuntimeError) and issubclass(ProviderUnavailable, BridgeError)
