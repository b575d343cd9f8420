"""What a policy version file says of itself (family, version, models, the releases it models),
read from its checked document, as the on-disk cache holds it, without building its rules: how a
release reference (releases.py) finds its version among every version file."""
from __future__ import annotations


class Upstream:
    """The releases a version models (upstream.releases), as a head gives them."""

    __slots__ = ("releases",)

    def __init__(self, releases: tuple):
        self.releases = releases


class Head:
    """What a policy file says of itself, as its Policy gives it: family, version, models and
    upstream (upstream.releases only; None without an upstream section)."""

    __slots__ = ("family", "version", "models", "upstream")

    def __init__(self, family, version, models, upstream):
        self.family, self.version, self.models, self.upstream = family, version, models, upstream


def head_of(data, default_models: tuple) -> Head | None:
    """The head of a checked document's data, as the language reads it (`default_models`: a file
    without `models`); None for data of another shape (then the file is loaded whole)."""
    try:
        up = data.get("upstream")
        models = tuple(data["models"]) if "models" in data else default_models
        head = Head(data["policy"], data["version"], models,
                    None if "upstream" not in data else Upstream(tuple(up.get("releases") or ())))
    except (AttributeError, KeyError, TypeError):
        return None
    if not (isinstance(head.family, str) and isinstance(head.version, int) and all(isinstance(m, str) for m in models)
            and (head.upstream is None or all(isinstance(r, str) for r in head.upstream.releases))):
        return None
    return head
