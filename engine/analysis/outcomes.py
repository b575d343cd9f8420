"""Comparing decisions: outcomes, the change classes of `diff` and `replay`, and the minimisation
that turns thousands of changed configs into a few patterns a person can read."""
from __future__ import annotations

import itertools
from dataclasses import dataclass

from engine.analysis.domain import coords, size, strides
from engine.values import show as _show

CLASSES = ("newly_accepted", "newly_rejected", "backend_changed", "message_changed", "log_changed", "scope_changed")


@dataclass(frozen=True)
class Outcome:
    """What a policy made of a config, in comparable form."""

    status: str  # ok | rejected | error (the config was invalid for that policy)
    values: tuple  # ((input, resolved value), ...) of the non-phase inputs
    backends: tuple  # ((phase, backend), ...)
    log: tuple
    message: str | None  # first violation's message, or the config error
    check: str | None  # first violation's rule name, or the config error's code
    scope: object = None  # why the config is out of the version's scope (None: in scope; ...: unknown)

    @property
    def accepted(self) -> bool:
        return self.status == "ok"


def outcome_of(decision) -> Outcome:
    p = decision.policy
    values = tuple((name, value) for name, value in zip(p.input_names, decision.values)
                   if p.inputs[name].phase is None)
    backends = tuple(decision.backends.items())
    why = None if decision.in_scope else decision.out_of_scope["why"]
    if not decision.ok:
        return Outcome("rejected", values, backends, tuple(decision.log), decision.error, decision.failed_check, why)
    return Outcome("ok", values, backends, tuple(decision.log), None, None, why)


def outcome_of_error(exc) -> Outcome:
    first = exc.problems[0]
    return Outcome("error", (), (), (), first.message, first.code)


def outcome_of_record(d: dict) -> Outcome:
    """From a decision's JSON form (as recorded by --record)."""
    backends = tuple((d.get("backends") or {}).items())
    # phase keys stay among the values: classify compares only inputs both sides resolved
    na = set(d.get("not_applicable") or ()) if isinstance(d.get("not_applicable"), list) else set()
    values = tuple((k, v) for k, v in d.items() if k not in _DECISION_KEYS and k not in na)
    viol = d.get("violations") or []
    # a record from before decisions carried their scope: unknown (...), never compared
    scope = d.get("out_of_scope") if d.get("in_scope") is False else None
    why = ... if "in_scope" not in d else (None if d["in_scope"] is not False else
                                           str(scope.get("why")) if isinstance(scope, dict) else "?")
    if d.get("ok"):
        return Outcome("ok", values, backends, tuple(d.get("log") or ()), None, None, why)
    first = viol[0] if viol else {"message": None, "check": None}
    return Outcome("rejected", values, backends, tuple(d.get("log") or ()), first.get("message"), first.get("check"),
                   why)


_DECISION_KEYS = {"ok", "violations", "log", "sources", "policy", "backends", "line", "error", "in_scope",
                  "out_of_scope", "not_applicable", "incapable"}


def classify(a: Outcome, b: Outcome) -> tuple[str | None, tuple]:
    """(change class or None when the outcomes agree, a key grouping alike changes)."""
    if not a.accepted and b.accepted:
        return "newly_accepted", (a.check,)
    if a.accepted and not b.accepted:
        return "newly_rejected", (b.check,)
    if a.accepted:  # both accept
        av, bv = dict(a.values), dict(b.values)
        changed = tuple((k, av[k], bv[k]) for k in av if k in bv and av[k] != bv[k])
        ab, bb = dict(a.backends), dict(b.backends)
        changed += tuple((ph, ab.get(ph), bb.get(ph)) for ph in dict.fromkeys(list(ab) + list(bb))
                         if ab.get(ph) != bb.get(ph))
        if changed:
            return "backend_changed", changed
        if a.log != b.log:
            return "log_changed", ()
    elif a.message != b.message:
        return "message_changed", (a.check, b.check)
    if a.scope != b.scope and ... not in (a.scope, b.scope):  # the same answer, but one side does
        # not model upstream's verdict
        return "scope_changed", (a.scope, b.scope)
    return None, ()


def describe(cls: str, key: tuple) -> str:
    if cls == "newly_accepted":
        return f"now accepted (was rejected by {key[0]})"
    if cls == "newly_rejected":
        return f"now rejected by {key[0]}"
    if cls == "backend_changed":
        return "; ".join(f"{name} {_show(x)} -> {_show(y)}" for name, x, y in key)
    if cls == "message_changed":
        return f"rejected with another message ({key[0]} -> {key[1]})" if key[0] != key[1] else \
            f"rejected by {key[0]} with another message"
    if cls == "scope_changed":
        return ("now out of scope: " + key[1] if key[1] is not None else "now in scope (was out: " + key[0] + ")")
    return "accepted alike, different log lines"


# -- minimisation ----------------------------------------------------------------------------
def minimize(points: list[tuple], domains: list[list], disjoint: bool = False) -> list[tuple]:
    """A short exact cover of `points` (value tuples) by cubes (tuples of frozensets, one per
    input): every point lies in some cube and every config a cube describes is one of the points,
    so a cube can be read as a rule ("these inputs have these values, the rest do not matter").
    See cover() for how; this form takes and gives values instead of value indices."""
    sizes = [len(d) for d in domains]
    index = [{v: i for i, v in enumerate(d)} for d in domains]
    steps = strides(sizes)
    numbers = {sum(index[i][v] * steps[i] for i, v in enumerate(p)) for p in points}
    cubes = cover(mask_of(numbers, size(sizes)), sizes, disjoint)
    return [tuple(frozenset(domains[i][v] for v in c) for i, c in enumerate(cube)) for cube in cubes]


def cover(points: int, sizes: list[int], disjoint: bool = False, masks: list | None = None) -> list[tuple]:
    """A short exact cover of a set of configs by cubes. Configs are numbered in mixed radix over
    axes of `sizes` (the last varies fastest); `points` has bit k set for each config k in the
    set (mask_of). A cube is a tuple of frozensets of value indices, one per axis.

    Each cube is grown greedily from the first config not yet covered, one value at a time, as
    long as it stays inside the points; axes that make no difference end up holding every value.
    Cubes may overlap, unless `disjoint` (then each config lies in exactly one cube), and a cube
    whose configs the others cover is dropped. Sets of configs are Python integers used as bit
    sets, so testing whether a slice of a cube lies inside the points is a few whole-word
    operations, not a walk over its configs. `masks`: axis_masks(sizes), when many sets of the
    same axes are covered."""
    n, total = len(sizes), size(sizes)
    full = (1 << total) - 1
    value_masks = masks or axis_masks(sizes)
    outside = full & ~points
    # values no point holds can never join a cube: skip them (and axes left with none)
    candidates = [[v for v in range(sizes[i]) if value_masks[i][v] & points] for i in range(n)]
    covered, remaining = 0, points
    cubes, masks = [], []
    while remaining:
        seed = (remaining & -remaining).bit_length() - 1
        sets = [{c} for c in coords(seed, sizes)]
        axis = [value_masks[i][next(iter(sets[i]))] for i in range(n)]
        bad = outside | covered if disjoint else outside
        grown = True
        while grown:
            grown = False
            after = [full] * (n + 1)  # after[i]: the cube's configs as far as axes i.. constrain them
            for i in range(n - 1, -1, -1):
                after[i] = after[i + 1] & axis[i]
            before = full
            for i in range(n):
                new = [v for v in candidates[i] if v not in sets[i]]
                if new:
                    # the configs a new value v of axis i would add are value_masks[i][v] & slice
                    slice_bad = before & after[i + 1] & bad
                    for v in new:
                        if not value_masks[i][v] & slice_bad:
                            sets[i].add(v)
                            axis[i] |= value_masks[i][v]
                            grown = True
                before &= axis[i]
        cube = before
        covered |= cube
        remaining &= ~cube
        cubes.append(tuple(frozenset(s) for s in sets))
        masks.append(cube)
    if not disjoint:  # drop cubes whose configs the others cover
        later = [0] * (len(masks) + 1)
        for i in range(len(masks) - 1, -1, -1):
            later[i] = later[i + 1] | masks[i]
        kept, kept_mask = [], 0
        for i, cube in enumerate(cubes):
            if masks[i] & ~(kept_mask | later[i + 1]):
                kept.append(cube)
                kept_mask |= masks[i]
        cubes = kept
    return sorted(cubes, key=lambda c: tuple(tuple(sorted(s)) for s in c))


def mask_of(numbers, total: int) -> int:
    """The bit set of config numbers (each in range(total))."""
    bits = bytearray((total + 7) // 8)
    for k in numbers:
        bits[k >> 3] |= 1 << (k & 7)
    return int.from_bytes(bits, "little")


def axis_masks(sizes: list[int]) -> list[list[int]]:
    """Per axis and value index, the bit set of the configs holding that value."""
    total, steps = size(sizes), strides(sizes)
    return [[_axis_mask(steps[i], sizes[i], v, total) for v in range(sizes[i])] for i in range(len(sizes))]


def _axis_mask(step: int, size: int, value: int, total: int) -> int:
    """The configs whose value index on an axis (of `size` values, numbers advancing by `step`)
    is `value`: a run of `step` ones every step * size bits, built by doubling."""
    period = step * size
    block, width, count = ((1 << step) - 1) << (value * step), period, total // period
    out = shift = 0
    while count:
        if count & 1:
            out |= block << shift
            shift += width
        block |= block << width
        width *= 2
        count >>= 1
    return out


def factor(cubes: list[tuple], domains: list[list]) -> tuple[tuple, list[tuple]]:
    """(the terms every cube shares, each cube without them): a group's common conditions are
    printed once."""
    n = len(domains)
    full = tuple(frozenset(d) for d in domains)
    common = tuple(cubes[0][i] if all(c[i] == cubes[0][i] for c in cubes) else full[i] for i in range(n))
    rests = [tuple(full[i] if common[i] != full[i] else c[i] for i in range(n)) for c in cubes]
    return common, rests


def cube_terms(cube: tuple, names: list, domains: list[list]) -> list[tuple[str, list | None, str]]:
    """(input, values, operator) per input that matters in a cube: operator is "=" for one value,
    "in" for a subset, "not in" when the complement is shorter; inputs holding their whole domain
    are left out."""
    terms = []
    for name, values, domain in zip(names, cube, domains):
        if len(values) == len(domain):
            continue
        ordered = [v for v in domain if v in values]
        if len(ordered) == 1:
            terms.append((name, ordered, "="))
        else:
            rest = [v for v in domain if v not in values]
            if len(rest) < len(ordered):
                terms.append((name, rest, "not in") if len(rest) > 1 else (name, rest, "!="))
            else:
                terms.append((name, ordered, "in"))
    return terms


def cube_text(cube: tuple, names: list, domains: list[list], empty: str = "(every config)") -> str:
    parts = []
    for name, values, op in cube_terms(cube, names, domains):
        if op in ("=", "!="):
            parts.append(f"{name}{op}{_show(values[0])}")
        else:
            parts.append(f"{name} {op} [{', '.join(_show(v) for v in values)}]")
    return " ".join(parts) or empty


def cube_json(cube: tuple, names: list, domains: list[list]) -> dict:
    out = {}
    for name, values, op in cube_terms(cube, names, domains):
        if op == "=":
            out[name] = values[0]
        elif op == "in":
            out[name] = {"in": values}
        elif op == "!=":
            out[name] = {"!=": values[0]}
        else:
            out[name] = {"not_in": values}
    return out


def pattern_lines(group: dict, max_patterns: int) -> list[str]:
    """A reduced group in text: its shared terms, then at most `max_patterns` patterns."""
    lines = [f"  where {group['where']}:"] if group["where"] else []
    lines += [f"    {t}" for t in group["text"][:max_patterns]]
    if len(group["text"]) > max_patterns:
        lines.append(f"    ... {len(group['text']) - max_patterns} more patterns (--format json lists all)")
    return lines


def minimize_known(points: list[tuple], known: set, domains: list[list]) -> list[tuple]:
    """As minimize, for a set of configs that is not a whole product (a sample, a domain of parts):
    a cube may also hold configs outside `known`, but no config of `known` that fell in another
    group. Patterns then say what `known` supports."""
    inside = set(points)
    covered: set = set()
    cubes = []
    for seed in points:
        if seed in covered:
            continue
        cube = [frozenset((v,)) for v in seed]
        grown = True
        while grown:
            grown = False
            for i, domain in enumerate(domains):
                for v in domain:
                    if v in cube[i]:
                        continue
                    slice_ = cube[:i] + [frozenset((v,))] + cube[i + 1:]
                    if all(p in inside or p not in known for p in _known_in(slice_, known)):
                        cube[i] = cube[i] | {v}
                        grown = True
        covered.update(p for p in inside if all(p[k] in cube[k] for k in range(len(cube))))
        cubes.append(tuple(cube))
    return cubes


def _known_in(cube, known):
    """The run configs inside a cube (iterating the smaller of the two)."""
    n = 1
    for s in cube:
        n *= len(s)
    if n <= len(known):
        return (p for p in itertools.product(*cube) if p in known)
    return (p for p in known if all(p[k] in cube[k] for k in range(len(cube))))


def key_outcome(policy, key, kept_only) -> Outcome:
    """The outcome an interned evaluation key stands for (diff's bulk keys)."""
    values, log, first, scope = key[:4]
    n = len(policy.written)
    resolved = tuple(zip(policy.written, values[:n])) + (tuple(zip(kept_only, key[4])) if kept_only else ())
    status, message, check = ("ok", None, None) if first is None else \
        ("rejected", first[2], policy.rule_meta[first[0]][0])
    why = None if scope is None else policy.upstream.leaves_out[scope][1]
    return Outcome(status, resolved, tuple(zip(policy.phase_names, values[n:])), log, message, check, why)


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


def example(names, combo, oa, ob) -> dict:
    """A changed config and both sides' outcomes, as diff reports it."""
    def side(o):
        out = {"status": o.status}
        if o.accepted:
            out["backends"] = dict(o.backends)
            out["log"] = list(o.log)
        else:
            out["check"], out["message"] = o.check, o.message
        if o.scope is not None:
            out["out_of_scope"] = o.scope
        return out

    return {"config": dict(zip(names, combo)), "a": side(oa), "b": side(ob)}
