"""How values read in messages, tables and explanations: unset for null, true/false for booleans."""
from __future__ import annotations


def show(value) -> str:
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
