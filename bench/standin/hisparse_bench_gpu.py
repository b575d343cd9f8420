"""Bench-only: the tests' GPU stand-in (tests/fixtures/sglang_standin/hisparse_test_gpu.py), as a
platform plugin of group `sglang.srt.platforms` (the dist-info beside this file), that never
imports hisparse-router. It exists only on the PYTHONPATH bench/plugin_bench.py gives the SGLang
processes it measures; it is never installed.

The tests' stand-in takes the conform driver's torchvision stub from the `engine` package, which
imports the engine; a process measured as SGLang without the plugin must not. Here the stub's file
is loaded by its path, under a name of its own, and the rest is the tests' stand-in's own code
(loaded by its path too): torch is told a CUDA GPU of capability $HISPARSE_TEST_GPU (default 9.0)
is present, SGLang's GPU-generation helpers say so with $HISPARSE_TEST_ARCH_HELPERS, and SGLang's
CUDA platform is picked. SGLang 0.5.21 and later only (they ask for their platform before they
look for a GPU or import torchvision)."""
import importlib.util
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STUB = os.path.join(ROOT, "engine", "sglang", "conform", "torchvision_stub.py")
TESTS_STANDIN = os.path.join(ROOT, "tests", "fixtures", "sglang_standin", "hisparse_test_gpu.py")


def _by_path(name: str, path: str):
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def activate():
    import torch
    import transformers.processing_utils  # noqa: F401  (decides that torchvision is absent before the stub exists)

    _by_path("hisparse_bench_torchvision_stub", STUB).install()
    standin = _by_path("hisparse_bench_test_gpu", TESTS_STANDIN)
    capability = tuple(int(x) for x in os.environ.get("HISPARSE_TEST_GPU", "9.0").split("."))
    torch.cuda.is_available = lambda: True
    torch.cuda.get_device_capability = lambda device=None: capability
    torch.cuda.get_device_name = lambda device=None: "hisparse bench GPU"
    torch.cuda.device_count = lambda: 1
    if os.environ.get("HISPARSE_TEST_ARCH_HELPERS"):
        standin.arch_helpers()
    return "sglang.srt.platforms.cuda.CudaSRTPlatform"
