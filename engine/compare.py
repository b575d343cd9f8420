"""Comparing decisions: outcomes, the change classes of `diff` and `replay`, and the minimisation
that turns thousands of changed configs into a few patterns a person can read."""
from __future__ import annotations

import itertools
from dataclasses import dataclass

from .text import show as _show

CLASSES = ("newly_accepted", "newly_rejected", "backend_changed", "message_changed", "log_changed")


@dataclass(frozen=True)
class Outcome:
    """What a policy made of a config, in comparable form."""

    status: str  # ok | rejected | error (the config was invalid for that policy)
    values: tuple  # ((input, resolved value), ...) of the non-phase inputs
    backends: tuple  # ((phase, backend), ...)
    log: tuple
    message: str | None  # first violation's message, or the config error
    check: str | None  # first violation's rule name, or the config error's code

    @property
    def accepted(self) -> bool:
        return self.status == "ok"


def outcome_of(decision) -> Outcome:
    p = decision.policy
    values = tuple((name, value) for name, value in zip(p.input_names, decision._values)
                   if p.inputs[name].phase is None)
    backends = tuple(decision.backends.items())
    raw = decision._raw
    if raw:
        return Outcome("rejected", values, backends, tuple(decision.log), raw[0][2], p.rule_meta[raw[0][0]][0])
    return Outcome("ok", values, backends, tuple(decision.log), None, None)


def outcome_of_error(exc) -> Outcome:
    first = exc.problems[0]
    return Outcome("error", (), (), (), first.message, first.code)


def outcome_of_record(d: dict) -> Outcome:
    """From a decision's JSON form (as recorded by --record)."""
    backends = tuple((d.get("backends") or {}).items())
    # phase keys stay among the values: classify compares only inputs both sides resolved
    values = tuple((k, v) for k, v in d.items() if k not in _DECISION_KEYS)
    viol = d.get("violations") or []
    if d.get("ok"):
        return Outcome("ok", values, backends, tuple(d.get("log") or ()), None, None)
    first = viol[0] if viol else {"message": None, "check": None}
    return Outcome("rejected", values, backends, tuple(d.get("log") or ()), first.get("message"), first.get("check"))


_DECISION_KEYS = {"ok", "violations", "log", "sources", "policy", "backends", "line", "error"}


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
        return None, ()
    if a.message != b.message:
        return "message_changed", (a.check, b.check)
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
    return "accepted alike, different log lines"


# -- minimisation ----------------------------------------------------------------------------
def minimize(points: list[tuple], domains: list[list], disjoint: bool = False) -> list[tuple]:
    """A short exact cover of `points` (value tuples) by cubes (tuples of frozensets, one per
    input): every point lies in some cube and every config a cube describes is one of the points,
    so a cube can be read as a rule ("these inputs have these values, the rest do not matter").
    Each cube is grown greedily from a point not yet covered, one value at a time, as long as it
    stays inside the points; inputs that make no difference end up holding their whole domain.
    Cubes may overlap, unless `disjoint` (then each point lies in exactly one cube)."""
    inside = set(points)
    covered: set = set()
    cubes = []
    n = len(domains)
    for seed in points:
        if seed in covered:
            continue
        cube = [frozenset((v,)) for v in seed]
        grown = True
        while grown:
            grown = False
            for i in range(n):
                for v in domains[i]:
                    if v in cube[i]:
                        continue
                    trial = cube[:i] + [cube[i] | {v}] + cube[i + 1:]
                    # only the new slice needs checking: the rest is inside already
                    slice_ = trial[:i] + [frozenset((v,))] + trial[i + 1:]
                    if all(p in inside and not (disjoint and p in covered)
                           for p in itertools.product(*slice_)):
                        cube = trial
                        grown = True
        covered.update(itertools.product(*cube))
        cubes.append(tuple(cube))
    if disjoint:
        kept = cubes
    else:  # drop cubes whose points the others cover
        kept = []
        for i, cube in enumerate(cubes):
            others = kept + cubes[i + 1:]
            mine = set(itertools.product(*cube))
            if not all(any(all(p[k] in c[k] for k in range(n)) for c in others) for p in mine):
                kept.append(cube)
    order = {i: {v: k for k, v in enumerate(d)} for i, d in enumerate(domains)}
    return sorted(kept, key=lambda c: tuple(sorted(order[i].get(v, 0) for v in s) for i, s in enumerate(c)))


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
