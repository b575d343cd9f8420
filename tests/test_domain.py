"""Whole-domain analyses in bulk (engine/analysis/domain.py) equal config-by-config evaluation: the
bulk evaluator's outcomes, diff's counts, groups, patterns and examples, and the deep lint,
over whole domains; on the shipped policies and on synthetic ones that exercise every path
(values one side refuses, inputs one side lacks, inputs only one side rewrites, checks placed
at defaults, a phase accepting fewer backends than the policy declares)."""
import itertools

import pytest

import engine
from engine.analysis.outcomes import classify, describe, outcome_of, outcome_of_error
from engine.analysis.diff import diff, restrict, union_axes
from engine.analysis.lint import lint
from engine.files.catalog import list_families
from tests.helpers import NSA_ALIASES, load_text
from engine.analysis import domain

# every shipped version, each on its whole declared domain (2.3 M configs in all): the bulk
# evaluator is generated code, and a sample could miss the one combination a generator bug hits.
# The versions with more than 100,000 configs run whole in `make test-whole` (CI), and on a
# stratified sample in `make test`.
SHIPPED = [f"dsa-backends@{v}" for v in list_families()["dsa-backends"]]
LARGE = [ref for ref in SHIPPED if domain.config_count(engine.load_policy(ref)) > 100_000]
WHOLE = pytest.mark.whole

SYN_A = """
policy: syn
version: 1
description: synthetic A
inputs:
  mode: {type: enum, values: [a, b, c], default: a}
  level: {type: int, values: [1, 2, 3], default: 1}
  legacy: {type: bool, default: false}
  size: {type: int, values: [8, 16], default: 8}
backends: {x: X, y: Y, z: Z}
phases:
  p: {input: p_backend}
  q: {input: q_backend}
resolve:
  rules:
    - name: mode-c-pins-level
      when: {mode: c}
      set: {level: 3}
      log: "mode c pins level {level}"
defaults:
  rules:
    - name: legacy
      when: {legacy: true}
      set: {p: x, q: x}
      log: "legacy {p} {q}"
    - name: mode-a
      when: {mode: a}
      set: {p: y, q: z}
      log: "defaults {p} {q} at {level}"
    - name: rest
      set: {p: z, q: z}
checks:
  rules:
    - name: phase-backends
      for_each: phase
      when: {backend: {set: true}}
      allowed:
        key: mode
        rows: {a: [x, y], b: [y, z]}
        otherwise: [x, y, z]
      message: "{phase} {backend} not in {allowed} ({mode}, {level})"
    - name: b-size
      when: {mode: b}
      require: {size: {">=": 16}}
      message: "b needs size 16, got {size}"
"""

SYN_B = """
policy: syn
version: 2
description: synthetic B
inputs:
  mode: {type: enum, values: [a, b, d], default: a}
  level: {type: int, values: [1, 2], default: 1, maximum: 2}
  size: {type: int, values: [8, 16], default: 8}
  fast: {type: bool, default: false}
backends: {x: X, y: Y, z: Z}
phases:
  p: {input: p_backend}
  q: {input: q_backend}
resolve:
  rules:
    - name: fast-size
      when: {fast: true}
      set: {size: 16}
      log: "fast: size {size}"
defaults:
  rules:
    - name: mode-a
      when: {mode: a}
      set: {p: y, q: z}
      log: "defaults {p} {q} at {level}"
    - name: rest
      set: {p: z, q: y}
checks:
  rules:
    - name: phase-backends
      for_each: phase
      when: {backend: {set: true}}
      allowed:
        key: mode
        rows: {a: [x, y], d: [x]}
        otherwise: [y, z]
      message: "{phase} {backend} not in {allowed} ({mode}, {level})"
    - name: b-size
      when: {mode: b}
      require: {size: {">=": 16}}
      message: "b needs size 16, got {size}"
"""

# checks at defaults (a failure stops evaluation before the chosen default's log line; whole-
# config and per-phase), and phase q accepting only y and z
SYN_C = """
policy: syn
version: 3
description: synthetic C
inputs:
  mode: {type: enum, values: [a, b, c], default: a}
  level: {type: int, values: [1, 2, 3], default: 1}
  legacy: {type: bool, default: false}
  size: {type: int, values: [8, 16], default: 8}
backends: {x: X, y: Y, z: Z}
phases:
  p: {input: p_backend}
  q: {input: q_backend, backends: [y, z]}
resolve:
  rules:
    - name: mode-c-pins-level
      when: {mode: c}
      set: {level: 3}
      log: "mode c pins level {level}"
defaults:
  rules:
    - name: legacy
      when: {legacy: true}
      set: {p: x, q: y}
      log: "legacy {p} {q}"
    - name: mode-a
      when: {mode: a}
      set: {p: y, q: z}
      log: "defaults {p} {q} at {level}"
    - name: rest
      set: {p: z, q: y}
      log: "rest {p} {q}"
checks:
  rules:
    - name: x-needs-level
      at: defaults
      when: {p_backend: x}
      require: {level: {">=": 2}}
      message: "p x needs level 2, got {level}"
    - name: z-needs-size
      at: defaults
      for_each: phase
      when: {backend: z}
      require: {size: 16}
      message: "{phase} {backend} needs size 16 ({mode})"
    - name: phase-backends
      for_each: phase
      when: {backend: {set: true}}
      allowed:
        key: mode
        rows: {a: [x, y, z], b: [y, z]}
        otherwise: [x, y]
      message: "{phase} {backend} not in {allowed} ({mode}, {level})"
    - name: b-size
      when: {mode: b}
      require: {size: {">=": 16}}
      message: "b needs size 16, got {size}"
"""


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    folder = tmp_path_factory.mktemp("syn")
    return load_text(folder, SYN_A, "a.yaml"), load_text(folder, SYN_B, "b.yaml"), load_text(folder, SYN_C, "c.yaml")


def test_the_at_defaults_fixture_stops_before_the_default_log(synthetic):
    c = synthetic[2]
    assert c.phases["q"].backends == ("y", "z") and c.inputs["q_backend"].domain() == ["y", "z", None]
    assert {r.name: r.at for r in c.stages["checks"].rules}["x-needs-level"] == "defaults"
    d = c.evaluate({"legacy": True})  # x-needs-level fails at defaults: no log line, no later check
    assert [v.check for v in d.violations] == ["x-needs-level"] and d.log == []
    d = c.evaluate({"legacy": True, "level": 2, "mode": "b"})  # at defaults passes; later ones run
    assert d.log == ["legacy x y"] and [v.check for v in d.violations] == ["phase-backends", "b-size"]


@pytest.mark.parametrize("ref", [pytest.param(r, marks=WHOLE) if r in LARGE else r for r in SHIPPED] + ["syn-c"])
def test_bulk_outcomes_equal_evaluate_on_the_whole_domain(ref, synthetic):
    _assert_bulk_outcomes(ref, synthetic)


@pytest.mark.parametrize("ref", LARGE)
def test_bulk_outcomes_equal_evaluate_on_a_stratified_sample(ref, synthetic):
    """make test's share of the whole-domain check above: every value of every input appears."""
    from engine.sglang.conform.sample import axes, stratified

    policy = engine.load_policy(ref)
    _assert_bulk_outcomes(ref, synthetic, stratified(axes(policy), 4000, 1))


def _assert_bulk_outcomes(ref, synthetic, configs=None):
    policy = synthetic[2] if ref == "syn-c" else engine.load_policy(ref)
    configs = list(domain.configs(policy)) if configs is None else configs
    bulk = [r for chunk in domain.results(policy, [tuple(c.values()) for c in configs]) for r in chunk]
    assert len(bulk) == len(configs)
    for config, (values, log, first, scope) in zip(configs, bulk):
        d = policy.evaluate(config)
        want = tuple(d.config[n] for n in policy.written) + tuple(d.backends.values())
        assert (values, log, first) == (want, tuple(d.log), d._raw[0] if d._raw else None), config
        assert (scope is None) == d.in_scope, config
    if ref == "syn-c":  # and the counting probe gives every violation, log line and source
        full = [r for chunk in domain.results(policy, [tuple(c.values()) for c in configs], [0] * 8, [0] * 8)
                for r in chunk]
        for config, (values, sources, log, viol, scope) in zip(configs, full):
            d = policy.evaluate(config)  # the reference semantics (the interpreter)
            assert (values, sources, tuple(log), tuple(viol), scope is None) == \
                (tuple(d.config.values()), tuple(d.sources.values()), tuple(d.log), d._raw, d.in_scope), config


def _axes(a, b, where=None):
    axes = union_axes(a, b)
    restrict(a, b, axes, where)
    return axes


def _direct_diff(a, b, where=None):
    """diff's classes, computed config by config through evaluate: (class, change) -> configs."""
    axes = _axes(a, b, where)
    groups: dict = {}
    errors: dict = {}  # the values a config error is about -> its outcome (did-you-mean is slow)
    for combo in itertools.product(*(ax.values for ax in axes)):
        outcomes = []
        for policy, side in ((a, "a_name"), (b, "b_name")):
            cfg = {getattr(ax, side): v for ax, v in zip(axes, combo) if getattr(ax, side) is not None}
            refused = tuple((k, v) for k, v in cfg.items() if not policy.inputs[k].accepts(v))
            if refused and (side, refused) in errors:
                outcomes.append(errors[(side, refused)])
                continue
            try:
                outcomes.append(outcome_of(policy.evaluate(cfg)))
            except engine.ConfigError as exc:
                outcomes.append(errors.setdefault((side, refused), outcome_of_error(exc)))
        cls, key = classify(*outcomes)
        if cls is not None:
            groups.setdefault((cls, describe(cls, key)), []).append(dict(zip((ax.name for ax in axes), combo)))
    return groups


def _cells(pattern, axes) -> set:
    """The configs a pattern describes (JSON form: value, in, not_in, !=; absent = any)."""
    choices = []
    for ax in axes:
        test = pattern.get(ax.name, {"not_in": []})
        if not isinstance(test, dict):
            test = {"in": [test]}
        (op, arg), = test.items()
        arg = [arg] if op == "!=" else arg
        same = [v for v in ax.values if any(v == x and type(v) is type(x) for x in arg)]
        choices.append(same if op == "in" else [v for v in ax.values if v not in same])
    return set(itertools.product(*choices))


def _assert_same(result, direct, a, b, where=None):
    """Counts, changes, examples and patterns (an exact cover of each group) as direct evaluation."""
    axes = _axes(a, b, where)
    assert result["total"] == len(list(itertools.product(*(ax.values for ax in axes))))
    assert sorted((g["class"], g["change"], g["count"]) for g in result["groups"]) == \
        sorted((cls, change, len(configs)) for (cls, change), configs in direct.items())
    for g in result["groups"]:
        configs = direct[(g["class"], g["change"])]
        assert g["example"]["config"] == configs[0]  # the first changed config, in domain order
        covered = set().union(*(_cells(p, axes) for p in g["patterns"]))
        assert covered == {tuple(c.values()) for c in configs}, g["change"]


@pytest.mark.parametrize("pair", [("a", "b"), ("b", "a"), ("a", "a"), ("a", "c"), ("c", "b")])
def test_diff_of_synthetic_policies_equals_direct_evaluation(synthetic, pair):
    a, b = (synthetic["abc".index(side)] for side in pair)
    direct = _direct_diff(a, b)
    _assert_same(diff(a, b), direct, a, b)
    if pair != ("a", "a"):
        classes = {cls for cls, _ in direct}
        assert {"newly_accepted", "newly_rejected", "backend_changed", "message_changed"} <= classes


@pytest.mark.parametrize("where, total", [
    pytest.param(None, 373248, marks=WHOLE),
    (["enable_hisparse=true", "disable_radix_cache=true", "platform=cuda", "sm_major=10"], 15552)])
def test_diff_v2_to_v3_equals_direct_evaluation(where, total):
    a, b = engine.load_policy("dsa-backends@2"), engine.load_policy(NSA_ALIASES)
    result = diff(a, b, where=where)
    assert result["total"] == total
    _assert_same(result, _direct_diff(a, b, where), a, b, where)


@pytest.mark.parametrize("where, total", [
    pytest.param(["dsa_model=true", "disable_radix_cache=true"], 179712, marks=WHOLE),  # a quarter of the union
    (["dsa_model=true", "disable_radix_cache=true", "enable_hisparse=true", "platform=cuda"], 179712 // 4)])
def test_diff_v3_to_v4_equals_direct_evaluation(where, total):
    a, b = engine.load_policy(NSA_ALIASES), engine.load_policy("dsa-backends@10")
    result = diff(a, b, where=where)
    assert result["total"] == total
    _assert_same(result, _direct_diff(a, b, where), a, b, where)


def _direct_lint_codes(policy):
    """L401-L403 from interpreter traces of every config (the definition)."""
    from engine.explain.trace import Trace
    from engine.language import interpreter as interpret

    held, chosen, contradiction = set(), set(), {}
    defaults = {r.name for r in policy.stages["defaults"].rules}
    reads = _phases_read(policy)
    for config in domain.configs(policy):
        trace = Trace()
        d = interpret.run(policy, config, config, trace)
        for step in trace.steps:
            if step.rule is not None and step.holds and step.rule.stage != "defaults":
                held.add(step.rule.name)
            if step.chosen:
                chosen.add(step.rule.name)
        held.update(r.name for r in trace.default_matches)
        for src in _blamed(d, reads):
            if src in defaults:
                contradiction.setdefault(src, config)
    out = {("L402", r.name) for r in policy.rule_list if r.name not in held}
    out |= {("L401", r.name) for r in policy.stages["defaults"].rules if r.name in held and r.name not in chosen}
    return out | {("L403", name) for name in contradiction}, contradiction


def _phases_read(policy) -> dict:
    """Check name -> the phases a check without for_each reads (L403 blames the default that
    filled all of them)."""
    by_input = {spec.input: ph for ph, spec in policy.phases.items()}
    out = {}
    for rule in policy.stages["checks"].rules:
        if not rule.for_each_phase:
            names = rule.when.inputs() | (rule.require.inputs() if rule.require is not None else set())
            out[rule.name] = {by_input[n] for n in names if n in by_input}
    return out


def _blamed(d, reads):
    """Per violation of a decision, the default it counts against (or None)."""
    for v in d.violations:
        if v.phase is not None:
            yield d.sources[v.phase]
        elif v.stage in ("checks", "defaults") and reads.get(v.check):  # defaults: a check at defaults
            filled = {d.sources[ph] for ph in reads[v.check]}
            yield filled.pop() if len(filled) == 1 else None


@WHOLE  # make test: test_lint_equals_direct_evaluation below, on smaller domains
def test_lint_of_v10_equals_direct_evaluation():
    """L403 on v10's whole domain through evaluate; L401/L402 from interpreter traces of every 97th
    config (a trace costs about 120 us: all 479,232 would add a minute): what the sample sees held
    or chosen is never reported as dead or shadowed. The whole-domain L401/L402 comparison runs on
    v1, v2 and the synthetic policies below."""
    from engine.explain.trace import Trace
    from engine.language import interpreter as interpret

    policy = engine.load_policy("dsa-backends@10")
    problems, _ = lint(policy)
    found = {(p.code, p.message.split("'")[1]): p.message for p in problems}
    defaults = {r.name for r in policy.stages["defaults"].rules}
    reads = _phases_read(policy)
    contradiction = {}
    for config in domain.configs(policy):
        for src in _blamed(policy.evaluate(config), reads):
            if src in defaults:
                contradiction.setdefault(src, config)
    assert {name for code, name in found if code == "L403"} == set(contradiction)
    for name, config in contradiction.items():
        assert " ".join(f"{k}={engine.values.show(v)}" for k, v in config.items()) in found[("L403", name)]
    for k, config in enumerate(domain.configs(policy)):
        if k % 97:
            continue
        trace = Trace()
        interpret.run(policy, config, config, trace)
        for step in trace.steps:
            if step.rule is not None and step.holds and step.rule.stage != "defaults":
                assert ("L402", step.rule.name) not in found
            if step.chosen:
                assert ("L401", step.rule.name) not in found and ("L402", step.rule.name) not in found


@pytest.mark.parametrize("source", ["dsa-backends@1", "dsa-backends@2", "syn-a", "syn-b", "syn-c",
                                    "L401", "L402", "L403"])
def test_lint_equals_direct_evaluation(source, synthetic, tmp_path):
    import os

    from tests.helpers import FIXTURES

    if source.startswith("dsa-backends"):
        policy = engine.load_policy(source)
    elif source.startswith("syn"):
        policy = synthetic["abc".index(source[-1])]
    else:
        name = next(f for f in os.listdir(os.path.join(FIXTURES, "policies")) if f.startswith(f"lint-{source}"))
        policy = engine.load_policy(os.path.join(FIXTURES, "policies", name))
    problems, _ = lint(policy)
    want, examples = _direct_lint_codes(policy)
    got = set()
    for p in problems:
        if p.code in ("L401", "L402", "L403"):
            got.add((p.code, p.message.split("'")[1]))
    assert got == want
    for p in problems:
        if p.code == "L403":  # the counterexample is the first in domain order
            config = examples[p.message.split("'")[1]]
            assert " ".join(f"{k}={engine.values.show(v)}" for k, v in config.items()) in p.message
    if source.startswith("L"):
        assert want  # each fixture triggers its finding
    if source == "syn-c":  # a whole-config check at defaults blames the default that filled p
        assert {("L403", "legacy"), ("L403", "mode-a"), ("L403", "rest")} <= want


def test_a_probe_that_loses_configs_is_an_error(monkeypatch):
    policy = engine.load_policy("dsa-backends@1")
    real = policy.probe(False)
    monkeypatch.setitem(policy._probes, False, lambda configs, sink, held, chosen: real(configs[:-1], sink, held, chosen))
    with pytest.raises(RuntimeError, match="results for"):
        list(domain.results(policy, [tuple(c.values()) for c in domain.configs(policy)]))
