"""`hisparse`: the command line, and every text an operator reads (decisions, explanations, output).
The engine's own commands; the kernel bridge adds attend and doctor (kernels_bridge/cli.py, where
the `hisparse` console script starts)."""
from __future__ import annotations


def main(argv=None) -> int:
    from engine.cli.commands import main as run

    return run(argv)
