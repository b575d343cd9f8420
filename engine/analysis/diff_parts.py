"""`hisparse diff` where a declared domain is a union of parts (`domain.parts`): the configs of
both declared domains, listed once each over the union of both policies' inputs, each evaluated by
both policies, compared as diff.py compares a product, and each group of changes reduced to
patterns that hold no listed config of another group (outcomes.minimize_known).

A config of one policy gives an input only the other declares that input's default; a value
outside a policy's domain is that policy's config error, which counts as a rejection (as in
diff.py). Such domains are small (what a conformance run enumerates), so the configs are listed."""
from __future__ import annotations

import collections

import engine.analysis.domain as domain
from engine.analysis.domain import check_size
from engine.analysis.outcomes import CLASSES, classify, cube_json, cube_text, describe, factor, minimize_known, \
    outcome_of_error
from engine.errors import ConfigError


def configs_of(a, b, axes, fixed: dict) -> list[tuple]:
    """Every config of either declared domain over `axes` (union names and values), once each,
    narrowed by `fixed` (axis name -> value)."""
    out: dict = {}
    for policy, side, other, other_side in ((a, "a_name", b, "b_name"), (b, "b_name", a, "a_name")):
        where = {getattr(ax, side): [fixed[ax.name]] for ax in axes
                 if ax.name in fixed and getattr(ax, side) is not None}
        for config in domain.configs(policy, where):
            combo = []
            for ax in axes:
                name = getattr(ax, side)
                if name is not None:
                    combo.append(config[name])
                else:  # only the other policy declares it: its default
                    combo.append(fixed.get(ax.name, other.inputs[getattr(ax, other_side)].default))
            out.setdefault(tuple(combo), None)
    return list(out)


def outcomes(policy, axes, side: str, configs: list[tuple], other_written: set):
    """One policy's Outcome for each config (its own inputs only; a refused value: its error)."""
    from engine.analysis.outcomes import key_outcome

    kept = [i for i, ax in enumerate(axes) if getattr(ax, side) is not None]
    names = [getattr(axes[i], side) for i in kept]
    pos = [names.index(n) for n in policy.input_names]
    kept_only = [n for n in policy.input_names if n in other_written and n not in policy.written]
    given = domain.reorder([policy.input_names.index(n) for n in kept_only])
    out = [None] * len(configs)
    valid = []
    for k, combo in enumerate(configs):
        values = [combo[i] for i in kept]
        bad = next((j for j, n in enumerate(names) if not policy.inputs[n].accepts(values[j])), None)
        if bad is not None:
            problem = policy.value_problem(policy.inputs[names[bad]], names[bad], values[bad], "")
            out[k] = outcome_of_error(ConfigError([problem]))
        else:
            valid.append((k, tuple(values[p] for p in pos)))
    interned: dict = {}
    results = (r for chunk in domain.results(policy, (c for _, c in valid)) for r in chunk)
    for (k, config), r in zip(valid, results):
        key = r + ((given(config),) if kept_only else ())
        if key not in interned:
            interned[key] = key_outcome(policy, key, kept_only)
        out[k] = interned[key]
    return out


def diff_parts(a, b, axes, fixed: dict, max_examples: int, progress=None) -> dict:
    """The JSON form of diff.diff (the same contract) over listed configs."""
    from engine.analysis.outcomes import domain_changes, example

    configs = configs_of(a, b, axes, fixed)
    total = len(configs)
    check_size(total, f"the union domain of {a.ref} and {b.ref}", len(a.rule_meta) + len(b.rule_meta))
    with domain.no_gc():
        oa = outcomes(a, axes, "a_name", configs, set(b.written))
        ob = outcomes(b, axes, "b_name", configs, set(a.written))
    grouped: dict = collections.defaultdict(list)
    for k, (x, y) in enumerate(zip(oa, ob)):
        cls, key = classify(x, y)
        if cls is not None:
            grouped[(cls, key)].append(k)
    if progress is not None:
        progress(total, total)
    counts = dict.fromkeys(CLASSES, 0)
    for (cls, _), points in grouped.items():
        counts[cls] += len(points)
    names = [ax.name for ax in axes]
    domains = [ax.values for ax in axes]
    known = set(configs)
    groups = []

    def order(item):
        (cls, key), points = item
        domain_only = any(isinstance(k, str) and k[:1] == "C" and k[1:].isdigit() for k in key)
        return (CLASSES.index(cls), domain_only, -len(points))

    for (cls, key), points in sorted(grouped.items(), key=order):
        cubes = minimize_known([configs[k] for k in points], known, domains)
        common, rests = factor(cubes, domains)
        k = points[0]
        groups.append({
            "class": cls, "change": describe(cls, key), "count": len(points),
            "patterns": [cube_json(c, names, domains) for c in cubes],
            "where": cube_text(common, names, domains, empty="") if len(cubes) > 1 else "",
            "text": [cube_text(c, names, domains) for c in (rests if len(cubes) > 1 else cubes)],
            "example": example(names, configs[k], oa[k], ob[k]),
        })
    return {
        "a": a.identity(), "b": b.identity(), "where": fixed, "domain": domain_changes(a, b, axes),
        "equivalent": not any(counts.values()), "total": total, "counts": counts, "groups": groups,
        "examples": [g["example"] for g in groups],
    }
