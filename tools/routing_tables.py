"""The routing tables the docs show, generated from the shipped policies (kept current by a test)."""
from __future__ import annotations

from engine.analysis.domain import parse_where
from engine.analysis.table import routing_rows
from engine.cli.reports import table_text


README_TABLES = (
    ("dsa-backends@2", ["dsa_model=true", "disable_radix_cache=true"]),
    ("dsa-backends@10", ["dsa_model=true", "disable_radix_cache=true", "hisparse_device_buffer_size=unset"]),
)


def readme_table() -> str:
    """The README's routing tables (kept current by a test)."""
    from engine.policy.loader import load_policy

    parts = []
    for ref, where in README_TABLES:
        policy = load_policy(ref)
        result = routing_rows(policy, parse_where(policy, where))
        cmd = f"hisparse table --policy {ref} " + " ".join(f"--where {w}" for w in where) + " --format markdown"
        parts.append(f"`{cmd}`\n\n" + table_text(policy, result, markdown=True))
    return "\n\n".join(parts)
