"""Which configs `conform` runs: the whole declared domain, or a stratified sample of it.

A sample of N configs (seeded, so a run can be repeated) holds every value of every input at
least once: the first configs cycle through each input's values, the rest are drawn uniformly
from the remaining domain without repetition."""
from __future__ import annotations

import random

from engine.analysis import domain


def configs_of(policy, fixed: dict | None = None, n: int | None = None, seed: int = 0) -> tuple[list, int]:
    """(configs to run, the size of the domain they come from): the declared domain (narrowed by
    `fixed`), or a stratified sample of `n` of it. A domain of parts (domain.parts) is listed; a
    product is addressed by index, never listed whole for a sample."""
    if policy.domain_parts:
        fixed = fixed or {}
        listed = [c for c in domain.configs(policy, fixed and {k: [v] for k, v in fixed.items()})]
        if n is not None and n < len(listed):
            return stratified_list(listed, n, seed), len(listed)
        return listed, len(listed)
    ax = axes(policy, fixed)
    total = size(ax)
    if n is not None and n < total:
        return stratified(ax, n, seed), total
    return list(whole(ax)), total


def stratified_list(configs: list[dict], n: int, seed: int) -> list[dict]:
    """`n` of `configs`, every value of every input among them where `n` allows (greedily: the
    config holding the most values not yet held, the first such), the rest drawn at random; in
    their order."""
    rng = random.Random(seed)
    held = [{(k, type(v), v) for k, v in config.items()} for config in configs]
    chosen: set[int] = set()
    seen: set = set()
    while len(chosen) < n:
        best, gain = None, 0
        for i, values in enumerate(held):
            new = len(values - seen)
            if new > gain:
                best, gain = i, new
        if best is None:
            break
        chosen.add(best)
        seen |= held[best]
    rest = [i for i in range(len(configs)) if i not in chosen]
    chosen.update(rng.sample(rest, n - len(chosen)))
    return [configs[i] for i in sorted(chosen)]


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
