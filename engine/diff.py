"""`hisparse diff A B`: the exact impact of changing policy A to policy B.

Both policies are evaluated on every config of the union of their declared domains (every input
of either policy, with the union of both declared value lists; integer inputs take their
representative values). An input one policy does not declare is not given to it; a value outside
a policy's domain is a config error for that policy, which counts as a rejection. Every config
whose outcome differs is classified (compare.CLASSES), and alike changes are grouped and reduced to
a few patterns over the inputs that matter."""
from __future__ import annotations

import itertools

from .compare import (CLASSES, classify, cube_json, cube_text, describe, factor, minimize,
                      outcome_of, outcome_of_error)
from .errors import ConfigError


class Axis:
    """One input of the union domain: its name and what it is called in each policy."""

    def __init__(self, name, a_name, b_name, values):
        self.name, self.a_name, self.b_name, self.values = name, a_name, b_name, values


def union_axes(a, b) -> list[Axis]:
    axes: list[Axis] = []
    matched_b = set()
    for name, spec in a.inputs.items():
        b_name = _same_input(b, name, spec)
        values = list(spec.domain())
        if b_name is not None:
            matched_b.add(b_name)
            values += [v for v in b.inputs[b_name].domain() if not any(_eq(v, x) for x in values)]
        axes.append(Axis(name, name, b_name, values))
    for name, spec in b.inputs.items():
        if name not in matched_b:
            axes.append(Axis(name, None, name, list(spec.domain())))
    return axes


def _same_input(b, name, spec):
    """B's name for A's input `name`: the same name, or a spelling B accepts for it (a flag alias)."""
    hit = b.canonical_key(name)
    if hit is not None:
        return hit
    for flag in spec.flags:
        hit = b.canonical_key(flag[2:])
        if hit is not None:
            return hit
    return None


def _eq(x, y) -> bool:
    return x == y and type(x) is type(y)


def _outcome(policy, config):
    try:
        return outcome_of(policy.evaluate(config))
    except ConfigError as exc:
        return outcome_of_error(exc)


def diff(a, b, max_examples: int = 3) -> dict:
    """The JSON form of the diff (a contract): equivalent, total, counts, groups, examples."""
    axes = union_axes(a, b)
    a_axes = [(i, ax.a_name) for i, ax in enumerate(axes) if ax.a_name is not None]
    b_axes = [(i, ax.b_name) for i, ax in enumerate(axes) if ax.b_name is not None]
    counts = dict.fromkeys(CLASSES, 0)
    grouped: dict = {}
    total = 0
    a_eval, b_eval = a.evaluate, b.evaluate
    same_shape = a.input_names == b.input_names and a.phase_names == b.phase_names
    for combo in itertools.product(*(ax.values for ax in axes)):
        total += 1
        cfg_a = {name: combo[i] for i, name in a_axes}
        cfg_b = {name: combo[i] for i, name in b_axes}
        try:
            da = a_eval(cfg_a)
            db = b_eval(cfg_b)
            # the common case first: identical outcomes without building comparison objects
            if same_shape and not da._raw and not db._raw and da._values == db._values and da.log == db.log:
                continue
            oa, ob = outcome_of(da), outcome_of(db)
        except ConfigError:
            oa, ob = _outcome(a, cfg_a), _outcome(b, cfg_b)
        cls, key = classify(oa, ob)
        if cls is None:
            continue
        counts[cls] += 1
        entry = grouped.setdefault((cls, key), {"points": [], "examples": []})
        entry["points"].append(combo)
        if len(entry["examples"]) < max_examples:
            entry["examples"].append((combo, oa, ob))
    names = [ax.name for ax in axes]
    domains = [ax.values for ax in axes]
    groups = []
    for (cls, key), entry in sorted(grouped.items(), key=lambda kv: (CLASSES.index(kv[0][0]), -len(kv[1]["points"]))):
        cubes = minimize(entry["points"], domains)
        combo, oa, ob = entry["examples"][0]
        common, rests = factor(cubes, domains)
        groups.append({
            "class": cls,
            "change": describe(cls, key),
            "count": len(entry["points"]),
            "patterns": [cube_json(c, names, domains) for c in cubes],
            "where": cube_text(common, names, domains) if len(cubes) > 1 else "",
            "text": [cube_text(c, names, domains) for c in (rests if len(cubes) > 1 else cubes)],
            "example": _example(names, combo, oa, ob),
        })
    examples = [g["example"] for g in groups]
    return {
        "a": a.identity(), "b": b.identity(),
        "equivalent": not any(counts.values()),
        "total": total,
        "counts": counts,
        "groups": groups,
        "examples": examples,
    }


def _example(names, combo, oa, ob) -> dict:
    def side(o):
        out = {"status": o.status}
        if o.accepted:
            out["backends"] = dict(o.backends)
            out["log"] = list(o.log)
        else:
            out["check"], out["message"] = o.check, o.message
        return out

    return {"config": dict(zip(names, combo)), "a": side(oa), "b": side(ob)}


def diff_text(result: dict, markdown: bool = False) -> str:
    a, b = result["a"], result["b"]
    head = f"{a['family']}@{a['version']} -> {b['family']}@{b['version']}"
    changed = sum(result["counts"].values())
    lines = []
    if markdown:
        lines.append(f"### `{head}`: {changed} of {result['total']} configs change")
        lines.append("")
        lines.append("| class | configs |")
        lines.append("|---|---:|")
        lines += [f"| {cls} | {n} |" for cls, n in result["counts"].items()]
        for g in result["groups"]:
            lines.append("")
            where = f", where `{g['where']}`" if g["where"] else ""
            lines.append(f"**{g['class']}** ({g['count']}): {g['change']}{where}")
            lines.append("")
            lines += [f"- `{t}`" for t in g["text"]]
            lines.append(f"- e.g. {_example_text(g['class'], g['example'])}")
        return "\n".join(lines)
    if result["equivalent"]:
        return f"{head}: equivalent on all {result['total']} configs"
    lines.append(f"{head}: {changed} of {result['total']} configs change "
                 + "(" + ", ".join(f"{cls} {n}" for cls, n in result["counts"].items() if n) + ")")
    for g in result["groups"]:
        lines.append(f"{g['class']} {g['count']}: {g['change']}")
        if g["where"]:
            lines.append(f"  where {g['where']}:")
        lines += [f"    {t}" for t in g["text"]]
        lines.append(f"    e.g. {_example_text(g['class'], g['example'])}")
    return "\n".join(lines)


def _example_text(cls: str, ex: dict) -> str:
    if cls == "log_changed":
        a, b = ex["a"]["log"], ex["b"]["log"]
        i = next((k for k in range(max(len(a), len(b))) if (a[k:k + 1] != b[k:k + 1])), 0)
        return f"log {a[i] if i < len(a) else '(none)'!r}  =>  {b[i] if i < len(b) else '(none)'!r}"

    def side(s):
        if s["status"] == "ok":
            return "accepted " + " ".join(f"{k}={v}" for k, v in s["backends"].items())
        if s["status"] == "error":
            return f"invalid config ({s['check']}: {s['message']})"
        return f"rejected: {s['message']}"

    return f"{side(ex['a'])}  =>  {side(ex['b'])}"
