"""The one compiled part: the hot buffer's CPU bookkeeping in C, which kernels_bridge/native.py
loads with ctypes. Optional: without a C compiler the install goes on, and HotBuffer keeps its
tensor code (same answers, slower on the CPU). Everything else is in pyproject.toml."""
from setuptools import Extension, setup

setup(ext_modules=[Extension("kernels_bridge._hot_buffer_lru", ["kernels_bridge/hot_buffer_lru.c"],
                             extra_compile_args=["-O3"], optional=True)])
