"""An inert `torchvision` for importing SGLang on a CPU-only torch.

`sglang.srt.configs` imports a multimodal helper that imports torchvision at module level. The
only torchvision wheel for torch 2.13 links CUDA libraries a CPU torch lacks, so it cannot be
installed next to it; no DSA/HiSparse routing code calls torchvision. The stub answers every
`torchvision.*` import with an empty module whose attributes are more such modules (callable,
returning themselves). It is installed only when no working torchvision is importable, and only
after transformers has recorded that torchvision is absent, so transformers never picks a
torchvision code path because of it.

Without torchvision, transformers 5.x gives `AutoImageProcessor` as a placeholder that raises on
any attribute, and SGLang's config package calls `AutoImageProcessor.register(...)` at import
(SGLang 0.5.15 to 0.5.20 on transformers 5.12.1): where the placeholder is found, it becomes a
stand-in whose `register` does nothing (no routing code reads image processors)."""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types

_NAME = "torchvision"


class _Inert(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        sub = _Inert(f"{self.__name__}.{name}")
        setattr(self, name, sub)
        return sub

    def __call__(self, *args, **kwargs):
        return self


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        if name == _NAME or name.startswith(_NAME + "."):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        return _Inert(spec.name)

    def exec_module(self, module):
        module.__path__ = []
        module.__conform_stub__ = True


class NoImageProcessors:
    """Stands in for transformers' AutoImageProcessor, unavailable without torchvision."""

    @staticmethod
    def register(*args, **kwargs):
        return None


def _stand_in_image_processors() -> None:
    # importing processing_utils first matters: it replaces sys.modules["transformers"] once
    import transformers.processing_utils  # noqa: F401

    transformers = sys.modules["transformers"]
    try:
        transformers.AutoImageProcessor.register  # noqa: B018  (the placeholder raises here)
    except ImportError:
        transformers.AutoImageProcessor = NoImageProcessors


def installed() -> bool:
    return any(isinstance(f, _Finder) for f in sys.meta_path)


def install() -> bool:
    """Install the stub unless a working torchvision imports. True when the stub is in place."""
    if installed():
        return True
    if importlib.util.find_spec(_NAME) is not None:
        try:
            __import__(_NAME)
            return False  # a working torchvision: use it
        except Exception:  # e.g. "operator torchvision::nms does not exist" on a CPU torch
            for name in [n for n in sys.modules if n == _NAME or n.startswith(_NAME + ".")]:
                del sys.modules[name]
    from transformers.utils import import_utils

    # transformers caches these answers; ask before the stub exists so they stay False
    import_utils.is_torchvision_available()
    import_utils.is_torchvision_v2_available()
    sys.meta_path.insert(0, _Finder())
    _stand_in_image_processors()
    return True
