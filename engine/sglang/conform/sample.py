"""Which configs `conform` runs: the whole declared domain, or a stratified sample of it.

A sample of N configs (seeded, so a run can be repeated) holds every value of every input at
least once: the first configs cycle through each input's values, the rest are drawn uniformly
from the remaining domain without repetition."""
from __future__ import annotations

import random


def axes(policy, fixed: dict | None = None) -> list[tuple[str, list]]:
    """(input, values) per input, in declaration order; `fixed` narrows inputs to one value."""
    fixed = fixed or {}
    return [(name, [fixed[name]] if name in fixed else spec.domain()) for name, spec in policy.inputs.items()]


def size(ax: list[tuple[str, list]]) -> int:
    n = 1
    for _, values in ax:
        n *= len(values)
    return n


def config_at(ax: list[tuple[str, list]], index: int) -> dict:
    """The config at `index` of the domain's product order (the last input varies fastest)."""
    out = {}
    for name, values in reversed(ax):
        index, k = divmod(index, len(values))
        out[name] = values[k]
    return dict(reversed(list(out.items())))


def index_of(ax: list[tuple[str, list]], config: dict) -> int:
    index = 0
    for name, values in ax:
        index = index * len(values) + _position(values, config[name])
    return index


def _position(values: list, value) -> int:
    for k, v in enumerate(values):
        if v == value and type(v) is type(value):
            return k
    raise ValueError(value)


def whole(ax: list[tuple[str, list]]):
    for i in range(size(ax)):
        yield config_at(ax, i)


def stratified(ax: list[tuple[str, list]], n: int, seed: int) -> list[dict]:
    """`n` distinct configs (all of them when the domain is smaller), every value of every input
    among them, in domain order."""
    total = size(ax)
    if n >= total:
        return list(whole(ax))
    rng = random.Random(seed)
    chosen: set[int] = set()
    widest = max(len(values) for _, values in ax)
    orders = [rng.sample(range(len(values)), len(values)) for _, values in ax]
    for k in range(min(widest, n)):  # config k takes the k-th value (shuffled) of every input
        index = 0
        for (name, values), order in zip(ax, orders):
            index = index * len(values) + order[k % len(values)]
        chosen.add(index)
    while len(chosen) < n:
        chosen.add(rng.randrange(total))
    return [config_at(ax, i) for i in sorted(chosen)]
