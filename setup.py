"""The one compiled part: the bridge's C helpers (the hot buffer's CPU bookkeeping, FP8 row
unpacking), which kernels_bridge/native.py loads with ctypes. Optional: without a C compiler the
install goes on, and the bridge keeps its tensor code (same answers, slower on the CPU).
Everything else is in pyproject.toml."""
from setuptools import Extension, setup

SOURCES = ["kernels_bridge/native_module.c", "kernels_bridge/hot_buffer_lru.c", "kernels_bridge/fp8_unpack.c"]

setup(ext_modules=[Extension("kernels_bridge._native", SOURCES, extra_compile_args=["-O3"], optional=True)])
