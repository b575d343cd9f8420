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
from .errors import ConfigError, Problem
from .text import show as _show


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


def _invalid_values(policy, axes, side: str) -> dict:
    """(axis index, value) -> the config-error outcome of giving `policy` that value, for the
    values of the union domain the policy does not accept; computed once per value, not per
    config."""
    out = {}
    for i, ax in enumerate(axes):
        name = ax.a_name if side == "a" else ax.b_name
        if name is None:
            continue
        spec = policy.inputs[name]
        for v in ax.values:
            if not spec.accepts(v):
                out[(i, v)] = outcome_of_error(ConfigError([policy._value_problem(spec, name, v, "")]))
    return out


def restrict(a, b, axes: list[Axis], where: list[str]) -> dict:
    """Apply NAME=VALUE restrictions (values typed as the declaring policy types them) to the
    union axes; returns the fixed values by axis name."""
    from .table import parse_where

    fixed = {}
    for item in where or []:
        name = item.partition("=")[0].strip()
        for policy, side in ((a, "a_name"), (b, "b_name")):
            key = policy.canonical_key(name)
            axis = next((ax for ax in axes if getattr(ax, side) == key), None) if key else None
            if axis is not None:
                value = parse_where(policy, [f"{key}={item.partition('=')[2]}"])[key]
                axis.values = [value]
                fixed[axis.name] = value
                break
        else:
            from .suggest import did_you_mean

            raise ConfigError([Problem("C501", f"--where {item!r}: no input {name!r} in either policy",
                                       hint=did_you_mean(name, [ax.name for ax in axes]))])
    return fixed


MAX_CONFIGS = 2_000_000  # a policy file must not be able to make diff run for hours


PROGRESS_EVERY = 16384  # configs between two progress calls of a whole-domain operation


def check_size(size: int, what: str) -> None:
    if size > MAX_CONFIGS:
        raise ConfigError([Problem("C506", f"{what} has {size:,} configs, more than the {MAX_CONFIGS:,} a "
                                   "whole-domain operation enumerates", hint="restrict it with --where NAME=VALUE")])


def diff(a, b, max_examples: int = 3, where: list[str] | None = None, progress=None) -> dict:
    """The JSON form of the diff (a contract): equivalent, total, counts, groups, examples.
    `progress(done, total)`, when given, is called every PROGRESS_EVERY configs and at the end."""
    axes = union_axes(a, b)
    fixed = restrict(a, b, axes, where)
    size = 1
    for ax in axes:
        size *= len(ax.values)
    check_size(size, f"the union domain of {a.ref} and {b.ref}")
    a_axes = [(i, ax.a_name) for i, ax in enumerate(axes) if ax.a_name is not None]
    b_axes = [(i, ax.b_name) for i, ax in enumerate(axes) if ax.b_name is not None]
    counts = dict.fromkeys(CLASSES, 0)
    grouped: dict = {}
    total = 0
    a_eval, b_eval = a.evaluate, b.evaluate
    same_shape = a.input_names == b.input_names and a.phase_names == b.phase_names
    bad_a, bad_b = _invalid_values(a, axes, "a"), _invalid_values(b, axes, "b")
    a_checks = [(i, v) for (i, v) in bad_a]
    b_checks = [(i, v) for (i, v) in bad_b]
    for combo in itertools.product(*(ax.values for ax in axes)):
        total += 1
        if progress is not None and not total % PROGRESS_EVERY:
            progress(total, size)
        ea = next((bad_a[k] for k in a_checks if _eq(combo[k[0]], k[1])), None) if a_checks else None
        eb = next((bad_b[k] for k in b_checks if _eq(combo[k[0]], k[1])), None) if b_checks else None
        da = a_eval({name: combo[i] for i, name in a_axes}) if ea is None else None
        db = b_eval({name: combo[i] for i, name in b_axes}) if eb is None else None
        # the common case first: identical outcomes without building comparison objects
        if same_shape and da is not None and db is not None and not da._raw and not db._raw \
                and da._values == db._values and da.log == db.log:
            continue
        oa = ea if da is None else outcome_of(da)
        ob = eb if db is None else outcome_of(db)
        cls, key = classify(oa, ob)
        if cls is None:
            continue
        counts[cls] += 1
        entry = grouped.setdefault((cls, key), {"points": [], "examples": []})
        entry["points"].append(combo)
        if len(entry["examples"]) < max_examples:
            entry["examples"].append((combo, oa, ob))
    if progress is not None:
        progress(size, size)
    names = [ax.name for ax in axes]
    domains = [ax.values for ax in axes]
    groups = []
    def order(item):
        (cls, key), entry = item
        # rule changes first, changes that come from a value one side does not accept last
        domain_only = any(isinstance(k, str) and k[:1] == "C" and k[1:].isdigit() for k in key)
        return (CLASSES.index(cls), domain_only, -len(entry["points"]))

    for (cls, key), entry in sorted(grouped.items(), key=order):
        cubes = minimize(entry["points"], domains)
        combo, oa, ob = entry["examples"][0]
        common, rests = factor(cubes, domains)
        groups.append({
            "class": cls,
            "change": describe(cls, key),
            "count": len(entry["points"]),
            "patterns": [cube_json(c, names, domains) for c in cubes],
            "where": cube_text(common, names, domains, empty="") if len(cubes) > 1 else "",
            "text": [cube_text(c, names, domains) for c in (rests if len(cubes) > 1 else cubes)],
            "example": _example(names, combo, oa, ob),
        })
    examples = [g["example"] for g in groups]
    return {
        "a": a.identity(), "b": b.identity(),
        "where": fixed,
        "domain": domain_changes(a, b, axes),
        "equivalent": not any(counts.values()),
        "total": total,
        "counts": counts,
        "groups": groups,
        "examples": examples,
    }


def domain_changes(a, b, axes) -> dict:
    """What each policy accepts that the other does not: inputs and values."""
    out = {"inputs_added": [ax.name for ax in axes if ax.a_name is None],
           "inputs_removed": [ax.name for ax in axes if ax.b_name is None], "values": {}}
    for ax in axes:
        if ax.a_name is None or ax.b_name is None:
            continue
        sa, sb = a.inputs[ax.a_name], b.inputs[ax.b_name]
        added = [v for v in ax.values if sb.accepts(v) and not sa.accepts(v)]
        removed = [v for v in ax.values if sa.accepts(v) and not sb.accepts(v)]
        if added or removed:
            out["values"][ax.name] = {"added": added, "removed": removed}
    return out


def _domain_text(d: dict) -> str:
    parts = []
    for name, ch in d["values"].items():
        parts.append(f"{name} " + " ".join([f"+{v}" for v in ch["added"]] + [f"-{v}" for v in ch["removed"]]))
    if d["inputs_added"]:
        parts.append("new inputs " + ", ".join(d["inputs_added"]))
    if d["inputs_removed"]:
        parts.append("inputs removed " + ", ".join(d["inputs_removed"]))
    return "; ".join(parts)


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


def diff_text(result: dict, markdown: bool = False, max_patterns: int = 4) -> str:
    a, b = result["a"], result["b"]
    head = f"{a['family']}@{a['version']} -> {b['family']}@{b['version']}"
    if result.get("where"):
        head += " where " + " ".join(f"{k}={_show(v)}" for k, v in result["where"].items())
    changed = sum(result["counts"].values())
    lines = []
    if markdown:
        lines.append(f"### `{head}`: {changed} of {result['total']} configs change")
        lines.append("")
        lines.append("| class | configs |")
        lines.append("|---|---:|")
        lines += [f"| {cls} | {n} |" for cls, n in result["counts"].items()]
        if _domain_text(result["domain"]):
            lines += ["", f"Domain: {_domain_text(result['domain'])}"]
        for g in result["groups"]:
            lines.append("")
            where = f", where `{g['where']}`" if g["where"] else ""
            lines.append(f"**{g['class']}** ({g['count']}): {g['change']}{where}")
            lines.append("")
            lines += [f"- `{t}`" for t in g["text"][:max_patterns]]
            if len(g["text"]) > max_patterns:
                lines.append(f"- ... {len(g['text']) - max_patterns} more patterns (`--format json` lists all)")
            lines.append(f"- e.g. {_example_text(g['class'], g['example'])}")
        return "\n".join(lines)
    if result["equivalent"]:
        return f"{head}: equivalent on all {result['total']} configs"
    lines.append(f"{head}: {changed} of {result['total']} configs change "
                 + "(" + ", ".join(f"{cls} {n}" for cls, n in result["counts"].items() if n) + ")")
    if _domain_text(result["domain"]):
        lines.append(f"domain: {_domain_text(result['domain'])}")
    for g in result["groups"]:
        lines.append(f"{g['class']} {g['count']}: {g['change']}")
        if g["where"]:
            lines.append(f"  where {g['where']}:")
        lines += [f"    {t}" for t in g["text"][:max_patterns]]
        if len(g["text"]) > max_patterns:
            lines.append(f"    ... {len(g['text']) - max_patterns} more patterns (--format json lists all)")
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
