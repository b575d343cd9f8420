"""Did-you-mean for unknown names."""
from __future__ import annotations

import difflib


def closest(name: str, candidates) -> str | None:
    candidates = [c for c in candidates if isinstance(c, str)]
    if not isinstance(name, str) or not candidates:
        return None
    folded = {c.lower().replace("-", "_"): c for c in candidates}
    key = name.lower().replace("-", "_")
    if key in folded:  # same name up to case and dash/underscore
        return folded[key]
    hits = difflib.get_close_matches(key, list(folded), n=1, cutoff=0.6)
    return folded[hits[0]] if hits else None


def did_you_mean(name: str, candidates) -> str:
    """A hint: 'did you mean X?' or the list of valid names when nothing is close."""
    candidates = list(candidates)
    hit = closest(name, candidates)
    if hit is not None:
        return f"did you mean '{hit}'?"
    if len(candidates) <= 12:
        return "expected one of: " + ", ".join(str(c) for c in candidates)
    return ""
