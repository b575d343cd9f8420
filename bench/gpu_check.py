"""`python -m bench.gpu_check [--out FILE] [--quick]` (or `python bench/gpu_check.py ...` in an
installed checkout): the kernel bridge's GPU check, kernels_bridge/gpu_check.py, which `python -m
bench` runs for bench/results/gpu.json. The check is part of the bridge, so an installed copy
without bench/ has it too (`python -m kernels_bridge.gpu_check`)."""
import sys

from kernels_bridge.gpu_check import main

if __name__ == "__main__":
    sys.exit(main())
