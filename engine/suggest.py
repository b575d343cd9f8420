"""Did-you-mean for unknown names."""
from __future__ import annotations


def _fold(text: str) -> str:
    return text.lower().replace("-", "_")


def close_matches(name: str, candidates) -> list[str]:
    """Candidates the author probably meant: same name up to case and dashes; else those the name
    is a prefix of (fp8 -> fp8_e4m3, fp8_e5m2); else the closest by spelling."""
    candidates = [c for c in candidates if isinstance(c, str)]
    if not isinstance(name, str) or not name or not candidates:
        return []
    folded: dict[str, str] = {}
    for c in candidates:  # spellings equal up to dashes: offer the one styled like the name
        f = _fold(c)
        if f not in folded or (("-" in c) == ("-" in name) and ("-" in folded[f]) != ("-" in name)):
            folded[f] = c
    key = _fold(name)
    if key in folded:
        return [folded[key]]
    prefixed = [c for f, c in folded.items() if f.startswith(key)]
    if 0 < len(prefixed) <= 4:
        return prefixed
    if len(key) > 3 * max(len(f) for f in folded):
        return []  # nothing can reach the cutoff; difflib would still index the whole name
    import difflib  # only when there is a typo to explain: not on every start-up

    return [folded[h] for h in difflib.get_close_matches(key, list(folded), n=1, cutoff=0.6)]


def closest(name: str, candidates) -> str | None:
    hits = close_matches(name, candidates)
    return hits[0] if len(hits) == 1 else None


def did_you_mean(name: str, candidates, list_if_none: bool = True) -> str:
    """A hint: "did you mean 'X'?", or the valid names when nothing is close (unless asked not to)."""
    candidates = list(candidates)
    hits = [h for h in close_matches(name, candidates) if h != name]  # never the name itself back
    if len(hits) == 1:
        return f"did you mean '{hits[0]}'?"
    if hits:
        return "did you mean one of " + ", ".join(f"'{h}'" for h in hits) + "?"
    if list_if_none and len(candidates) <= 12:
        return "expected one of: " + ", ".join(str(c) for c in candidates)
    return ""


def edit_distance(a: str, b: str) -> int:
    """Levenshtein distance (for short names)."""
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1]


def near_miss(name: str, candidates) -> str | None:
    """A candidate `name` is most likely a typo of: at most two edits away (case and dashes
    aside). Stricter than did_you_mean: used to tell a typo from an unrelated name."""
    key = _fold(name)
    best = None
    for c in candidates:
        folded = _fold(c)
        if abs(len(folded) - len(key)) > 2:  # more than two edits apart: skip the quadratic distance
            continue
        d = edit_distance(key, folded)
        styled = ("-" in c) == ("-" in name)  # on a tie, the spelling styled like the name
        if d <= 2 and (best is None or (d, not styled) < best[0]):
            best = ((d, not styled), c)
    return best[1] if best else None


def unknown_key(key, names, input_names, file: str = "", hint: str = ""):
    """C501 for a config key no spelling in `names` matches: the nearest spelling, else the inputs
    it may mean. `hint` (e.g. a typographic dash) replaces the guess."""
    from engine.errors import Problem
    from engine.values import shown

    if not hint:
        near = (near_miss(key, names) or closest(key, names)) if isinstance(key, str) else None
        hint = f"did you mean '{near}'?" if near else did_you_mean(str(key), input_names)
    return Problem("C501", f"unknown config key {shown(key)}", file, hint=hint)
