"""What `hisparse attend` reports of a HotBuffer: SGLang's figures for the run (hits, rows copied
host -> device, new tokens written on the device), in total and step by step."""
from __future__ import annotations

from typing import List

from kernels_bridge.hot_buffer import HotBuffer, HotBufferStats

__all__ = ["StepSeries", "hot_buffer_report", "hot_buffer_line"]

COUNTS = ("lookups", "hits", "misses", "rows_copied", "rows_written")


class StepSeries:
    """Each step's share of a HotBuffer's statistics: record() after every translate."""

    def __init__(self, hb: HotBuffer):
        self.hb, self.last, self.steps = hb, hb.stats, []  # type: HotBuffer, HotBufferStats, List[dict]

    def record(self, **about) -> None:
        now = self.hb.stats
        self.steps.append({**about, **{name: getattr(now, name) - getattr(self.last, name) for name in COUNTS}})
        self.last = now


def hot_buffer_report(hb: HotBuffer, series: StepSeries) -> dict:
    """The totals, per step on average, and the per-step series."""
    s = hb.stats
    steps = max(s.steps, 1)
    return {"admission": hb.admission, "release": hb.release, "draft_tokens": hb.draft_tokens, "steps": s.steps,
            "lookups": s.lookups, "hits": s.hits, "misses": s.misses, "hit_rate": round(s.hit_rate, 6),
            "rows_copied": s.rows_copied, "rows_copied_per_step": round(s.rows_copied / steps, 2),
            "bytes_copied": s.bytes_copied, "bytes_copied_per_step": round(s.bytes_copied / steps, 1),
            "rows_written": s.rows_written, "per_step": series.steps}


def hot_buffer_line(h: dict) -> str:
    """One line of text: what SGLang would copy and write for the run."""
    kernel = (f"SGLang {h['release']} speculative CLOCK kernel, {h['draft_tokens']} draft tokens"
              if h.get("draft_tokens") else f"SGLang {h['release']} kernel")
    written = "draft tokens" if h.get("draft_tokens") else "new tokens"
    return (f"hot buffer ({kernel}, {h['admission']} admission): hit rate "
            f"{100 * h['hit_rate']:.2f}%, {h['rows_copied']:,} rows copied host -> device in {h['steps']} steps "
            f"({h['rows_copied_per_step']:g} a step, {h['bytes_copied'] / 1e6:.2f} MB), "
            f"{h['rows_written']:,} {written} written on the device")
