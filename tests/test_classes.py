"""The classes that lint and diff evaluate one config of (engine/analysis/classes.py): they partition
the domain exactly, and the configs of a class are alike for the interpreter (the language's
definition, independent of the walk and of the bulk evaluator): the same rules tried, held,
chosen and violated, the same scope, and, where the lint reads them, the same backends and
capability verdicts; for diff, the same outcome once the inputs the class shows agree. The
analyses give the same answers when the walk is refused and every config is evaluated."""
import itertools

import pytest

import engine
from engine.analysis import classes as classes_mod, domain
from engine.analysis.capability import can_run, known_gap
from engine.analysis.classes import Classes
from engine.analysis.diff import diff
from engine.analysis.lint import _admitting_check, _gates, lint
from engine.analysis.outcomes import outcome_of
from engine.explain.trace import Trace
from engine.language import interpreter as interpret
from tests.helpers import FIXTURES

VERSIONS = [f"dsa-backends@{v}" for v in engine.list_families()["dsa-backends"]]


def _walk(policy, lint_mode: bool):
    domains = [policy.inputs[n].domain() for n in policy.input_names]
    gates, reads = _gates(policy)
    admitting = (lambda ph, backend, env: _admitting_check(policy, gates, ph, backend, env),
                 reads | {spec.input for spec in policy.phases.values()})
    leaves = Classes(policy, domains, lint_mode, admitting=admitting).cubes(budget=10 ** 9)
    return domains, leaves


def _config(domains, index) -> dict:
    return [d[i] for d, i in zip(domains, index)]


def _corners(cube):
    """The first config of a cube, and for each axis with more values, that config with the axis
    at its last value, and the config with every axis at its last value."""
    first = [s[0] for s in cube]
    yield first
    for a, s in enumerate(cube):
        if len(s) > 1:
            yield first[:a] + [s[-1]] + first[a + 1:]
    if any(len(s) > 1 for s in cube):
        yield [s[-1] for s in cube]


def _lint_view(policy, config: dict):
    """What the lint reads of one config, from the interpreter."""
    trace = Trace()
    d = interpret.run(policy, config, config, trace)
    steps = tuple((s.stage, s.rule.name if s.rule else None, s.holds, s.phase, s.violated, s.chosen)
                  for s in trace.steps)
    view = (steps, tuple(r.name for r in trace.default_matches), tuple((v.check, v.phase) for v in d.violations),
            tuple(d.sources.items()), d.in_scope)
    if d.ok and d.in_scope:  # the capability scan reads these only on accepted configs in scope
        env = dict(zip(policy.input_names, d.values))
        user = {ph: src == "user" for ph, src in d.sources.items()}
        gates, _ = _gates(policy)
        verdicts = []
        for ph, backend in d.backends.items():
            cap = policy.capabilities.get(backend)
            if cap is not None:
                gap = known_gap(cap, ph, env, user)
                admit = _admitting_check(policy, gates, ph, backend, env) if user[ph] else None
                verdicts.append((ph, can_run(cap, ph, env, user), gap.text if gap else None,
                                 admit.name if admit else None))
        view += (tuple(d.backends.items()), tuple(verdicts))
    return view


def _partitions(domains, leaves) -> bool:
    sizes = [len(d) for d in domains]
    steps = domain.strides(sizes)
    seen = bytearray(domain.size(sizes))
    for cube, _ in leaves:
        for k in domain.numbers([list(s) for s in cube], steps):
            seen[k] += 1
    return set(seen) == {1}


@pytest.mark.parametrize("ref", VERSIONS)
def test_the_lint_classes_partition_the_domain_into_configs_alike(ref):
    policy = engine.load_policy(ref)
    domains, leaves = _walk(policy, True)
    assert _partitions(domains, leaves)
    assert len(leaves) < domain.config_count(policy) // 2  # what makes them worth having
    firsts = [tuple(s[0] for s in cube) for cube, _ in leaves]
    assert firsts == sorted(firsts)  # in domain order of their first configs
    step = max(1, len(leaves) // 150)  # every class of the small versions' domains, a spread of the large
    checked = 0
    for cube, _ in leaves[::step]:
        corners = [dict(zip(policy.input_names, _config(domains, c))) for c in _corners(cube)]
        first = _lint_view(policy, corners[0])
        for config in corners[1:]:
            assert _lint_view(policy, config) == first, (corners[0], config)
            checked += 1
    assert checked


@pytest.mark.parametrize("ref", VERSIONS)
def test_the_diff_classes_hold_one_outcome_per_combination_of_what_they_show(ref):
    policy = engine.load_policy(ref)
    domains, leaves = _walk(policy, False)
    assert _partitions(domains, leaves)
    step = max(1, len(leaves) // 150)
    checked = 0
    for cube, shown in leaves[::step]:
        first = [s[0] for s in cube]
        for corner in _corners(cube):
            # the config with the class's first values on every axis it does not show
            held = [corner[a] if a in shown else first[a] for a in range(len(cube))]
            got, want = (_shown_outcome(policy, _config(domains, c)) for c in (corner, held))
            assert got == want, corner
            checked += 1
    assert checked


def _shown_outcome(policy, values):
    """An outcome as diff holds it: of the inputs, only the values of those the rules rewrite."""
    o = outcome_of(policy.evaluate(dict(zip(policy.input_names, values))))
    return (o.status, tuple(kv for kv in o.values if kv[0] in policy.written), o.backends, o.log, o.message,
            o.check, o.scope)


def _no_classes(monkeypatch):
    monkeypatch.setattr(classes_mod.Classes, "cubes", lambda self, budget: None)


@pytest.mark.parametrize("source", ["dsa-backends@3", "dsa-backends@5", "L401", "L402", "L403", "L407"])
def test_lint_is_the_same_without_classes(source, monkeypatch):
    import os

    if source.startswith("dsa"):
        policy = engine.load_policy(source)
    else:
        name = next(f for f in os.listdir(os.path.join(FIXTURES, "policies")) if f.startswith(f"lint-{source}"))
        policy = engine.load_policy(os.path.join(FIXTURES, "policies", name))
    with_classes = lint(policy)
    _no_classes(monkeypatch)
    assert lint(policy) == with_classes
    if source.startswith("L"):
        assert any(p.code == source for p in with_classes[0])


@pytest.mark.parametrize("pair", [("dsa-backends@1", "dsa-backends@2"), ("dsa-backends@4", "dsa-backends@5"),
                                  ("dsa-backends@5", "dsa-backends@3")])
def test_diff_is_the_same_without_classes(pair, monkeypatch):
    a, b = (engine.load_policy(r) for r in pair)
    with_classes = diff(a, b)
    _no_classes(monkeypatch)
    assert diff(a, b) == with_classes
    assert not with_classes["equivalent"]


def test_a_walk_past_its_budget_gives_up():
    policy = engine.load_policy("dsa-backends@2")
    domains = [policy.inputs[n].domain() for n in policy.input_names]
    walk = Classes(policy, domains, lint=False)
    assert walk.cubes(budget=100) is None
    configs, weights = domain.classes(engine.load_policy("dsa-backends@2"))
    assert sum(weights) == domain.config_count(policy)
    assert list(itertools.islice(configs, 1)) == [tuple(d[0] for d in domains)]


GAP_BY_USER = """
policy: gap
version: 1
description: A known gap that holds only where the user set the other phase, on an input only it reads.
inputs:
  wide: {type: bool, default: false}
  pad: {type: int, values: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16], default: 1}
backends: {x: X, y: Y}
phases:
  p: {input: p_backend}
  q: {input: q_backend}
resolve: {rules: []}
defaults:
  rules:
    - {name: both, set: {p: x, q: y}, log: "p={p} q={q} pad={pad}"}
checks: {rules: []}
capabilities:
  x:
    source: a kernel for q only.
    runs:
      - phases: [q]
    known_gaps:
      - phases: [p]
        when: {wide: true, user_set: {q: true}}
        why: the user's q leaves p to a default that cannot run it on wide configs
  y:
    source: a kernel for both.
    runs:
      - phases: [p, q]
"""


def test_a_known_gap_reading_who_set_a_phase_splits_the_classes(tmp_path, monkeypatch):
    from tests.helpers import load_text

    policy = load_text(tmp_path, GAP_BY_USER)
    problems, notes = lint(policy)
    # p is routed to x by the default wherever the user left it unset: a gap where the user set q on
    # a wide config (2 q values x 16 pads), a problem elsewhere, first at wide=false
    assert [p.code for p in problems] == ["L405", "L407"]  # no rule reads wide: only the capability does
    assert "wide=false" in problems[1].message
    assert len(notes) == 1 and notes[0].endswith(
        ": known gap, routes to a backend that cannot run them (x p 32): the user's q leaves p to a default "
        "that cannot run it on wide configs"), notes
    _no_classes(monkeypatch)
    assert lint(policy) == (problems, notes)
