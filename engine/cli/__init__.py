"""`hisparse`: the command line, and every text an operator reads (decisions, explanations, output)."""
from __future__ import annotations


def main(argv=None) -> int:
    from engine.cli.commands import main as run

    return run(argv)
