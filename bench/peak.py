"""`python -m bench.peak MODULE ARGS...`: run a module as __main__ and report its peak resident
memory on stderr as `PEAK_RSS_BYTES n`.

The peak is read from /proc/self/status (VmHWM), which belongs to this process image alone: the
rusage of a child also counts the parent's pages it held between fork and exec."""
from __future__ import annotations

import runpy
import sys


def vm_hwm() -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def main() -> None:
    module, args = sys.argv[1], sys.argv[2:]
    sys.argv = [module] + args
    code = 0
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    sys.stdout.flush()
    print(f"PEAK_RSS_BYTES {vm_hwm()}", file=sys.stderr)
    sys.exit(code)


if __name__ == "__main__":
    main()
