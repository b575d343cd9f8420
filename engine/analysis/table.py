"""`hisparse table`: the routing table a policy implies.

For every combination of the policy's non-phase inputs (platform, arch, dtype, HiSparse, ...):
the backend each phase gets when the user leaves it unset, and the backends a user may set for
each phase (set alone, the other phases left to the defaults) that the policy accepts. Rows with
the same outcome are merged over the inputs that make no difference to it."""
from __future__ import annotations

import itertools

import engine.analysis.domain as domain
from engine.analysis.domain import PROGRESS_EVERY, check_size
from engine.analysis.outcomes import cube_terms, minimize, minimize_known
from engine.explain.words import words as cond_words


def routing_rows(policy, fixed: dict | None = None, progress=None) -> dict:
    """{"axes": [...], "rows": [{"when": {...}, "outcome": {...}, "count": n}]}; `progress(done,
    total)` as for diff()."""
    fixed = fixed or {}
    axes = [n for n, s in policy.inputs.items() if s.phase is None and n not in fixed]
    domains = [policy.inputs[n].domain() for n in axes]
    combos = _combos(policy, axes, domains, fixed)
    size = len(combos) if isinstance(combos, list) else 1
    if not isinstance(combos, list):
        for d in domains:
            size *= len(d)
    # each row is evaluated once with the phases unset and once per backend each phase accepts
    tries = sum(len(policy.inputs[spec.input].values) for spec in policy.phases.values())
    check_size(size * (1 + tries), f"the routing table of {policy.ref}", len(policy.rule_meta))
    groups = _outcome_groups(policy, fixed, axes, lambda: combos if isinstance(combos, list)
                             else itertools.product(*domains), size, progress)
    known = set(combos) if isinstance(combos, list) else None
    phases = list(policy.phases)
    rows = [row for key in sorted(groups, key=lambda k: k[3] is not None)  # the rows the version models first
            for row in _rows(key, groups[key], known, axes, domains, phases)]
    return {"policy": policy.identity(), "upstream": _upstream_json(policy), "fixed": fixed, "axes": axes,
            "rows": rows}


def _outcome_groups(policy, fixed: dict, axes: list, row_values, size: int, progress) -> dict:
    """(defaults, rejected, allowed, why out of scope) -> the rows (values of `axes`) with that
    outcome, in the order first met. `row_values()` iterates the rows; each is evaluated, in bulk,
    with the phases as fixed (or unset), then with each backend a phase accepts set alone."""
    names = policy.input_names
    template = [fixed.get(n, policy.inputs[n].default) for n in names]
    where = [names.index(n) for n in axes]
    slots = [(names.index(spec.input), policy.inputs[spec.input].values) for spec in policy.phases.values()]

    def configs():
        for combo in row_values():
            values = list(template)
            for i, v in zip(where, combo):
                values[i] = v
            yield tuple(values)
            for i, backends in slots:
                for b in backends:
                    values[i] = b
                    yield tuple(values)
                values[i] = template[i]


    per_row = 1 + sum(len(backends) for _, backends in slots)
    flat = itertools.chain.from_iterable(domain.results(policy, configs()))
    groups: dict = {}
    for done, combo in enumerate(row_values(), 1):
        if progress is not None and not done % (PROGRESS_EVERY // 16):
            progress(done, size)
        key = _outcome(policy, list(itertools.islice(flat, per_row)), slots)
        groups.setdefault(key, []).append(combo)
    if progress is not None:
        progress(size, size)
    return groups


def _outcome(policy, got: list, slots: list) -> tuple:
    """One row's outcome from its compact results (rewritten values + backends, log, first
    violation, leaves_out entry or None): the row as given, then each backend tried per phase."""
    values, _, first, scope = got[0]
    if first is None:
        defaults, rejected = values[len(policy.written):], None
    else:
        defaults, rejected = None, first[2]
    allowed, at = [], 1
    for _, backends in slots:
        allowed.append(tuple(b for j, b in enumerate(backends) if got[at + j][2] is None))
        at += len(backends)
    why = None if scope is None else policy.upstream.leaves_out[scope][1]
    return defaults, rejected, tuple(allowed), why


def _rows(key: tuple, members: list, known: set | None, axes: list, domains: list, phases: list) -> list:
    """The table's rows of one outcome: its rows described by cubes (inside the declared domain's
    rows, `known`, when it has parts)."""
    defaults, rejected, allowed, why = key
    cubes = (minimize_known(members, known, domains) if known is not None
             else minimize(members, domains, disjoint=True))
    return [{
        "when": {name: values for name, values, op in _terms(cube, axes, domains)},
        "defaults": dict(zip(phases, defaults)) if defaults else None,
        "rejected": rejected,
        "allowed": {ph: list(a) for ph, a in zip(phases, allowed)},
        "in_scope": why is None,
        **({"out_of_scope": why} if why is not None else {}),
    } for cube in cubes]


def _combos(policy, axes, domains, fixed):
    """The rows' input values: with domain parts, those of the declared domain's configs (with the
    fixed inputs' values), in domain order, once each; else None (every combination)."""
    if not policy.domain_parts:
        return None
    out: dict = {}
    for config in domain.configs(policy):
        if all(config.get(n) == v for n, v in fixed.items()):
            out.setdefault(tuple(config[n] for n in axes), None)
    return list(out)


def _upstream_json(policy) -> dict | None:
    up = policy.upstream
    if up is None:
        return None
    out = {k: v for k, v in (("project", up.project), ("releases", list(up.releases) or None),
                              ("commit", up.commit), ("pr", up.pr)) if v is not None}
    out["note"] = up.note
    if up.leaves_out:
        words = {index: cond_words(cond) for index, cond in policy.scope}
        out["leaves_out"] = [dict({"where": w, "why": y}, **({"when": words[i]} if i in words else {}))
                             for i, (w, y, _) in enumerate(up.leaves_out)]
    return out


def _terms(cube, axes, domains):
    out = []
    for name, values, op in cube_terms(cube, axes, domains):
        if op in ("not in", "!="):
            axis = domains[axes.index(name)]
            values = [v for v in axis if v not in values]
        out.append((name, values, op))
    return out

