"""`hisparse diff A B`: the exact impact of changing policy A to policy B.

Both policies are evaluated on every config of the union of their declared domains (every input
of either policy, with the union of both declared value lists; integer inputs take their
representative values). An input one policy does not declare is not given to it; a value outside
a policy's domain is a config error for that policy, which counts as a rejection. Every config
whose outcome differs is classified (compare.CLASSES), and alike changes are grouped and reduced to
a few patterns over the inputs that matter.

The work is organised around what each policy reads (domain.py): the configs of each policy's own
axes fall into classes its rules cannot tell apart (classes.py), each policy is evaluated in bulk
once per combination of a class's values on the inputs its outcome shows, and its outcomes are
interned; a config of the union is then a pair of outcome numbers, classified once per distinct
pair, and each group of changed configs is a bit set that compare.cover reduces to patterns."""
from __future__ import annotations

import collections
import itertools

import engine.analysis.domain as domain
from engine.analysis.classes import Classes
from engine.analysis.domain import PROGRESS_EVERY, check_size, parse_where
from engine.analysis.outcomes import (CLASSES, Outcome, axis_masks, classify, cover, cube_json, cube_text, describe,
                                      domain_changes, example, factor, key_outcome, mask_of, outcome_of_error)
from engine.errors import ConfigError, Problem
from engine.values import show, shown


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


def restrict(a, b, axes: list[Axis], where: list[str]) -> dict:
    """Apply NAME=VALUE restrictions (values typed as the declaring policy types them) to the
    union axes; returns the fixed values by axis name."""
    fixed = {}
    for item in where or []:
        name = item.partition("=")[0].strip()
        for policy, side in ((a, "a_name"), (b, "b_name")):
            key = policy.canonical_key(name)
            axis = next((ax for ax in axes if getattr(ax, side) == key), None) if key else None
            if axis is not None:
                value = parse_where(policy, [f"{key}={item.partition('=')[2]}"])[key]
                if axis.name in fixed and fixed[axis.name] != value:  # never a silent last-wins
                    raise ConfigError([Problem("C501", f"--where {axis.name} is given twice ({show(fixed[axis.name])}, "
                                                       f"{show(value)}): one value per input",
                                               hint="leave the input out to cover all its values")])
                axis.values = [value]
                fixed[axis.name] = value
                break
        else:
            from engine.suggest import did_you_mean

            raise ConfigError([Problem("C501", f"--where {shown(item)}: no input {shown(name)} in either policy",
                                       hint=did_you_mean(name, [ax.name for ax in axes]))])
    return fixed


def diff(a, b, max_examples: int = 3, where: list[str] | None = None, progress=None) -> dict:
    """The JSON form of the diff (a contract): equivalent, total, counts, groups, examples.
    `progress(done, total)`, when given, is called every PROGRESS_EVERY configs and at the end."""
    axes = union_axes(a, b)
    fixed = restrict(a, b, axes, where)
    if a.domain_parts or b.domain_parts:  # a domain of parts: its configs listed
        from engine.analysis.diff_parts import diff_parts

        return diff_parts(a, b, axes, fixed, max_examples, progress)
    sizes = [len(ax.values) for ax in axes]
    total = domain.size(sizes)
    check_size(total, f"the union domain of {a.ref} and {b.ref}", len(a.rule_meta) + len(b.rule_meta))
    with domain.no_gc():
        ids_a, outcomes_a, kept_a = _side(a, axes, "a_name", set(b.written))
        ids_b, outcomes_b, kept_b = _side(b, axes, "b_name", set(a.written))
        wide = len(outcomes_b)
        group_of: dict = {}  # outcome pair that changes -> its group's list of config numbers
        grouped: dict = {}  # (class, key) -> config numbers, in order
        scaled = [x * wide for x in ids_a]
        pairs = map(int.__add__, map(scaled.__getitem__, domain.projection(sizes, kept_a)),
                    iter(ids_b) if len(kept_b) == len(axes) else map(ids_b.__getitem__, domain.projection(sizes, kept_b)))
        pairs = _listed(pairs, total, progress)
        for pair in dict.fromkeys(pairs):  # each distinct pair once, in order of first config
            cls, key = classify(outcomes_a[pair // wide], outcomes_b[pair % wide])
            if cls is not None:
                group_of[pair] = grouped.setdefault((cls, key), [])
        for k in itertools.compress(itertools.count(), map(group_of.__contains__, pairs)):
            group_of[pairs[k]].append(k)
    if progress is not None:
        progress(total, total)
    counts = dict.fromkeys(CLASSES, 0)
    for (cls, _), points in grouped.items():
        counts[cls] += len(points)
    names = [ax.name for ax in axes]
    domains = [ax.values for ax in axes]
    groups = []

    def order(item):
        (cls, key), points = item
        # rule changes first, changes that come from a value one side does not accept last
        domain_only = any(isinstance(k, str) and k[:1] == "C" and k[1:].isdigit() for k in key)
        return (CLASSES.index(cls), domain_only, -len(points))

    proj_a, proj_b = _projector(sizes, kept_a), _projector(sizes, kept_b)
    masks = axis_masks(sizes)
    for (cls, key), points in sorted(grouped.items(), key=order):
        cubes = [tuple(frozenset(domains[i][v] for v in c) for i, c in enumerate(cube))
                 for cube in cover(mask_of(points, total), sizes, masks=masks)]
        k = points[0]
        combo = tuple(d[i] for d, i in zip(domains, domain.coords(k, sizes)))
        oa, ob = outcomes_a[ids_a[proj_a(k)]], outcomes_b[ids_b[proj_b(k)]]
        common, rests = factor(cubes, domains)
        groups.append({
            "class": cls,
            "change": describe(cls, key),
            "count": len(points),
            "patterns": [cube_json(c, names, domains) for c in cubes],
            "where": cube_text(common, names, domains, empty="") if len(cubes) > 1 else "",
            "text": [cube_text(c, names, domains) for c in (rests if len(cubes) > 1 else cubes)],
            "example": example(names, combo, oa, ob),
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


def _listed(items, total: int, progress) -> list:
    """`items` as a list, calling progress(done, total) after every PROGRESS_EVERY of them."""
    if progress is None:
        return list(items)
    out: list = []
    while True:
        block = list(itertools.islice(items, PROGRESS_EVERY))
        out += block
        if len(block) < PROGRESS_EVERY:
            return out
        progress(len(out), total)


def _side(policy, axes, side: str, other_written: set):
    """One policy's outcomes over the configs of its own axes (union values, union order):
    (outcome number per config, the outcomes, the axes). A config holding a value the policy
    does not accept gets the config error of its first such value; the others are evaluated in
    bulk. An outcome holds what can tell two policies' outcomes apart: the resolved values of
    the inputs this policy rewrites and the given values of those only the other one rewrites
    (this one keeps them), backends, log, first violation."""
    kept = [i for i, ax in enumerate(axes) if getattr(ax, side) is not None]
    names = [getattr(axes[i], side) for i in kept]
    specs = [policy.inputs[n] for n in names]
    values = [axes[i].values for i in kept]
    valid = [[j for j, v in enumerate(vals) if spec.accepts(v)] for vals, spec in zip(values, specs)]
    sizes = [len(v) for v in values]
    steps = domain.strides(sizes)
    kept_only = [n for n in policy.input_names if n in other_written and n not in policy.written]
    pos = [names.index(n) for n in policy.input_names]  # the policy's input order -> these axes
    number: dict = collections.defaultdict(itertools.count().__next__)  # outcome -> its number
    given = domain.reorder([policy.input_names.index(n) for n in kept_only])

    def evaluate(configs) -> list:
        """The outcome numbers of `configs` (valid, in the policy's input order)."""
        found: list = []
        if kept_only:  # rare: the other policy rewrites an input this one keeps
            configs, again = itertools.tee(configs)
            for chunk in domain.results(policy, configs):
                found.extend(number[r + (given(c),)] for r, c in zip(chunk, again))  # chunk first: zip stops there
        else:
            for chunk in domain.results(policy, configs):
                found.extend(map(number.__getitem__, chunk))
        return found

    ids = [0] * domain.size(sizes)
    lists = [[values[k][j] for j in valid[k]] for k in pos]
    leaves = Classes(policy, lists, lint=False, extra=kept_only).cubes(budget=domain.size(len(v) for v in lists))
    if leaves is None:  # the classes do not pay: every valid config, in order
        configs = map(domain.reorder(pos), itertools.product(*[[vals[j] for j in ok] for vals, ok in zip(values, valid)]))
        found = evaluate(configs)
        # the valid configs lie in runs (the axes after the last one with a refused value are whole)
        cut = max([i + 1 for i, ok in enumerate(valid) if len(ok) < sizes[i]], default=0)
        run = domain.size(sizes[cut:])
        for j, start in enumerate(domain.numbers(valid[:cut], steps[:cut])):
            ids[start:start + run] = found[j * run:(j + 1) * run]
    else:  # one config per combination of a class's values on the axes its outcome shows
        shown = [sorted(a for a in reads if len(cube[a]) > 1) for cube, reads in leaves]
        configs = itertools.chain.from_iterable(
            itertools.product(*[[vals[j] for j in s] if a in axes else [vals[s[0]]]
                                for a, (vals, s) in enumerate(zip(lists, cube))])
            for (cube, _), axes in zip(leaves, shown))
        found = evaluate(configs)
        at = 0
        for (cube, _), axes in zip(leaves, shown):
            count = domain.size(len(cube[a]) for a in axes)
            _fill(ids, cube, axes, found[at:at + count], [valid[k] for k in pos], [steps[k] for k in pos])
            at += count
    outcomes = [key_outcome(policy, key, kept_only) for key in number]
    # the rest: the first value (in axis order) the policy does not accept decides the error
    for axis, ok in enumerate(valid):
        block = domain.size(sizes[axis + 1:])
        for j in (j for j in range(sizes[axis]) if j not in ok):
            problem = policy.value_problem(specs[axis], names[axis], values[axis][j], "")
            outcomes.append(outcome_of_error(ConfigError([problem])))
            error = [len(outcomes) - 1] * block
            for start in domain.numbers(valid[:axis] + [[j]], steps[:axis + 1]):
                ids[start:start + block] = error
    return ids, outcomes, kept


def _fill(ids, cube, axes, found, valid, steps) -> None:
    """ids[number of each config of `cube`] = its outcome number: found[i] for the i-th combination
    (in order) of its values on `axes`, whatever its values on the others. valid: per axis, the
    index among all values of each valid one; steps: the config numbers' strides."""
    numbers = [0]
    for a, s in enumerate(cube):
        offset = [valid[a][j] * steps[a] for j in s]
        numbers = [x + o for x in numbers for o in offset] if len(s) > 1 else [x + offset[0] for x in numbers]
    if len(found) == 1:
        first = found[0]
        for k in numbers:
            ids[k] = first
        return
    if len(found) < len(numbers):  # some axes do not matter: each combination repeats
        found = _spread(found, [(len(s), a in axes) for a, s in enumerate(cube) if len(s) > 1])
    for k, x in zip(numbers, found):
        ids[k] = x


def _spread(found: list, axes: list[tuple[int, bool]]) -> list:
    """found (one item per combination of the values of the axes marked True, in order) spread
    over every combination of all `axes` ((size, marked) each, in order): unmarked axes repeat."""
    marked = [size for size, m in axes if m]
    inner = [domain.size(marked[i + 1:]) for i in range(len(marked))]  # strides over `found`
    whole = len(axes)  # from here on every axis is marked: a slice of found
    while whole and axes[whole - 1][1]:
        whole -= 1

    def build(i: int, k: int, start: int) -> list:  # axes i.., the k-th marked one next
        if i >= whole:
            return found[start:start + domain.size(marked[k:])]
        size, m = axes[i]
        if not m:
            return build(i + 1, k, start) * size
        out: list = []
        for v in range(size):
            out += build(i + 1, k + 1, start + v * inner[k])
        return out

    return build(0, 0, 0)


def _projector(sizes: list[int], kept: list[int]):
    """Config number of the union -> its number over the axes `kept`."""
    steps = domain.strides([sizes[i] for i in kept])

    def project(k: int) -> int:
        c = domain.coords(k, sizes)
        return sum(c[i] * s for i, s in zip(kept, steps))

    return project
