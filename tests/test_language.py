"""The policy language's features, each with an expected outcome, on small policies; the compiled
evaluator and the interpreter must agree on every config of each policy's domain."""
import json

import pytest

import engine
from engine.explain.trace import Trace
from tests.helpers import assert_bulk_equals_evaluate, assert_probe_counts_like_traces, load_text, run_cli
from engine.analysis import domain

FEATURES = """
policy: features
version: 1
description: Exercises every construct of the language.
inputs:
  mode: {type: enum, values: [a, b, c], default: a}
  level: {type: int, values: [1, 5, 9], default: 5, minimum: 0, maximum: 100}
  cap: {type: int, values: [3, 7], default: 3}
  flag: {type: bool, default: false}
  note: {type: enum, values: [x, y], default: null, nullable: true}
backends:
  k1: one
  k2: two
  k3: three
phases:
  first: {input: first_backend, flags: [--first-backend, --old-first-backend]}
  second: {input: second_backend}
resolve:
  when: {not: {mode: c}}
  rules:
    - name: pin-first
      when: {all: [{flag: true}, {level: {">": 8}}]}
      set: {first_backend: k3}
      log: "pinned {first} at level {level!r} for {mode!r}"
    - name: guard
      when: {level: {"<": {input: cap}}}
      require: {note: {set: true}}
      message: "level {level} below cap {cap} needs a note (note={note})"
    - name: rewrite-and-check
      when: {mode: b}
      require: {level: {"!=": 1}}
      message: "b needs a level other than 1"
      set: {mode: a}
      log: "b became {mode}"
defaults:
  rules:
    - name: by-note
      when: {note: {in: [x]}, level: {">=": 5, "<=": 9}}
      set: {first: k1, second: k2}
      log: "note {note}: {first}/{second}"
    - name: fallback
      set: {first: k2, second: k2}
tables:
  nested:
    key: mode
    rows:
      a:
        key: flag
        rows: {"true": [k1, k3], "false": [k2]}
      b: []
    otherwise:
      key: level
      rows: {"9": [k3]}
      otherwise: [k1, k2, k3]
checks:
  rules:
    - name: nested-table
      for_each: phase
      when: {backend: {set: true}, phase: {"!=": second}}
      allowed: nested
      message: "{phase}={backend} not in {allowed} / {allowed:tuple} / {allowed:csv} / {allowed:or}"
    - name: not-in
      for_each: phase
      when: {backend: {not_in: [k2]}}
      require: {any: [{user_set: {first: true}}, {flag: true}]}
      message: "{phase} got {backend} without user choice"
"""


def line_of(text: str) -> int:
    return next(i for i, line in enumerate(FEATURES.splitlines(), 1) if text in line)


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    return load_text(tmp_path_factory.mktemp("lang"), FEATURES)


def test_bulk_evaluator_equals_evaluate_on_whole_domain(policy):
    assert assert_bulk_equals_evaluate(policy) == domain.config_count(policy) == 3 * 3 * 2 * 2 * 3 * 4 * 4


def test_resolve_set_log_and_sources(policy):
    d = policy.evaluate({"flag": True, "level": 9, "note": "x"})
    assert d.backends == {"first": "k3", "second": "k2"}
    assert d.sources == {"first": "pin-first", "second": "by-note"}
    assert d.log == ["pinned k3 at level 9 for 'a'", "note x: k3/k2"]


def test_require_with_input_reference_stops(policy):
    d = policy.evaluate({"level": 1, "cap": 3})
    assert not d.ok
    assert [v.to_dict() for v in d.violations] == [{
        "check": "guard", "message": "level 1 below cap 3 needs a note (note=None)",
        "location": f"{policy.file}:{line_of('- name: guard')}", "stage": "resolve", "raises": "ValueError"}]
    assert d.backends == {"first": None, "second": None}  # stopped before defaults
    assert policy.evaluate({"level": 1, "cap": 3, "note": "y"}).ok


def test_require_is_checked_before_set(policy):
    d = policy.evaluate({"mode": "b", "level": 1, "note": "x"})
    assert d.error == "b needs a level other than 1"
    assert d.config["mode"] == "b"  # the set of the failing rule did not happen
    d = policy.evaluate({"mode": "b", "level": 5, "note": "x"})
    assert d.config["mode"] == "a" and "b became a" in d.log


def test_stage_condition(policy):
    d = policy.evaluate({"mode": "c", "flag": True, "level": 9})
    assert d.sources["first"] == "fallback"  # resolve did not run for mode c


def test_nested_table_and_set_formats(policy):
    d = policy.evaluate({"mode": "c", "level": 9, "first_backend": "k1"})
    assert d.error == ("first=k1 not in ['k3'] / ('k3',) / k3 / k3")
    d = policy.evaluate({"mode": "c", "level": 5, "first_backend": "k1"})
    assert d.ok
    d = policy.evaluate({"mode": "a", "flag": True, "first_backend": "k2", "level": 5})
    assert d.error == ("first=k2 not in ['k1', 'k3'] / ('k1', 'k3') / k1, k3 / k1 or k3")


def test_empty_row_rejects_everything(policy):
    d = policy.evaluate({"mode": "b", "level": 5, "note": "x", "first_backend": "k2"})
    # mode b is rewritten to a by resolve, so the table reads mode a; flag false -> [k2]
    assert d.ok


def test_per_phase_require_and_user_set(policy):
    d = policy.evaluate({"note": "x", "level": 9})  # defaults k1/k2, nobody set first
    assert [(v.check, v.phase) for v in d.violations] == [("nested-table", "first"), ("not-in", "first")]
    assert policy.evaluate({"note": "x", "level": 9, "flag": True, "first_backend": "k3"}).ok


def test_flag_aliases_as_config_keys(policy):
    d = policy.evaluate({"old-first-backend": "k2", "level": 5})
    assert d.backends["first"] == "k2" and d.sources["first"] == "user"
    assert d.to_dict()["old_first_backend"] == "k2"  # alias keys mirror the phase in JSON


def test_int_bounds(policy):
    with pytest.raises(engine.ConfigError) as exc:
        policy.evaluate({"level": 101})
    assert exc.value.problems[0].code == "C502"
    assert "<= 100" in exc.value.problems[0].message


def test_explain_mentions_every_rule(policy):
    d, events = policy.trace({"note": "x", "level": 9})
    trace = Trace(events)
    names = {s.rule.name for s in trace.steps if s.rule is not None}
    # every rule is tried except the defaults after the one chosen
    assert names == {r.name for r in policy.rule_list} - {"fallback"}
    chosen = [s.rule.name for s in trace.steps if s.chosen]
    assert chosen == ["by-note"]


DEPRECATED = """
policy: dep
version: 1
description: Deprecated spellings.
inputs:
  size: {type: int, values: [1, 2], default: 1, deprecated_flags: {--old-size: {log: "'--old-size' is deprecated"}}}
backends: {a: A, b: B}
phases:
  main:
    input: main_backend
    deprecated_flags: {--legacy-backend: {log: "'--legacy-backend' is deprecated; use '--main-backend'"}}
resolve: {rules: []}
defaults:
  rules:
    - {name: small, when: {size: 1}, set: {main: a}, log: "size {size}: {main}"}
    - {name: big, set: {main: b}}
checks: {rules: []}
"""


def test_deprecated_spellings_log_first_in_the_order_given(tmp_path):
    policy = load_text(tmp_path, DEPRECATED)
    d = policy.evaluate({"legacy-backend": "b", "old_size": 1})
    assert d.backends == {"main": "b"} and d.sources == {"main": "user"}
    # as upstream's parser logs them: in the order typed, whatever the spelling's dashes, then the rules'
    assert d.log == ["'--legacy-backend' is deprecated; use '--main-backend'", "'--old-size' is deprecated",
                     "size 1: b"]
    assert policy.trace({"legacy-backend": "b", "old_size": 1})[0].log == d.log  # traced alike
    swapped = policy.evaluate({"old_size": 1, "legacy-backend": "b"})
    assert swapped.log == [d.log[1], d.log[0], d.log[2]]
    assert policy.trace({"old_size": 1, "legacy-backend": "b"})[0].log == swapped.log
    # the canonical spelling next to the deprecated one, with the same value: one notice
    assert policy.evaluate({"main_backend": "b", "legacy_backend": "b"}).log == \
        [d.log[0]] + policy.evaluate({"main_backend": "b"}).log
    assert policy.evaluate({"main_backend": "b", "size": 1}).log == ["size 1: b"]
    assert d.to_dict()["legacy_backend"] == "b"  # the old key mirrors the phase in JSON
    with pytest.raises(engine.ConfigError, match="both set 'main_backend'"):
        policy.evaluate({"legacy_backend": "a", "main_backend": "b"})


@pytest.mark.parametrize("source", ["flags", "launch"])
def test_deprecated_notices_follow_the_order_typed(capsys, tmp_path, source):
    """hisparse's own flags and a launch command log the notices in the order typed, as SGLang's
    parser does; the canonical spellings log none."""
    load_text(tmp_path, DEPRECATED)
    path = str(tmp_path / "policy.yaml")
    old, legacy = "'--old-size' is deprecated", "'--legacy-backend' is deprecated; use '--main-backend'"
    for args, notices in ((["--old-size", "1", "--legacy-backend", "b"], [old, legacy]),
                          (["--legacy-backend", "b", "--old-size", "1"], [legacy, old]),
                          (["--main-backend", "b", "--size", "1"], [])):
        argv = args if source == "flags" else ["--", "python", "-m", "sglang.launch_server"] + args
        code, out, _ = run_cli(capsys, "evaluate", "--policy", path, "--format", "json", *argv)
        assert code == 0, out
        assert json.loads(out)["log"] == notices + ["size 1: b"]


def test_a_deprecated_notice_is_declared_as_log(tmp_path):
    """The notice is {log: TEXT}: a bare string is a schema error at its place; a field in it is
    E306 (the parser logs it before anything is resolved)."""
    bare = DEPRECATED.replace('{--old-size: {log: "\'--old-size\' is deprecated"}}', '{--old-size: "old"}')
    assert bare != DEPRECATED
    with pytest.raises(engine.PolicyError) as exc:
        load_text(tmp_path, bare)
    assert [p.code for p in exc.value.problems] == ["E201"] and exc.value.problems[0].line == 6
    field = DEPRECATED.replace("'--old-size' is deprecated", "'--old-size' is deprecated ({size})")
    with pytest.raises(engine.PolicyError) as exc:
        load_text(tmp_path, field)
    assert [p.code for p in exc.value.problems] == ["E306"] and exc.value.problems[0].line == 6


def test_deprecated_flag_that_is_also_a_flag_is_refused(tmp_path):
    text = DEPRECATED.replace("deprecated_flags: {--old-size:", "flags: [--old-size], deprecated_flags: {--old-size:")
    with pytest.raises(engine.PolicyError) as exc:
        load_text(tmp_path, text)
    assert [p.code for p in exc.value.problems] == ["E307"]


@pytest.mark.parametrize("ref, every", [("dsa-backends@1", 11), ("dsa-backends@2", 11),
                                        pytest.param("dsa-backends@8", 11, marks=pytest.mark.whole),
                                        pytest.param("dsa-backends@10", 11, marks=pytest.mark.whole),
                                        ("dsa-backends@8", 97), ("dsa-backends@10", 97)])
def test_instrumented_evaluator_counts_like_the_interpreter(ref, every):
    """The lint's compiled probe counts the same rule hits as the interpreter's traces, on every
    `every`-th config (every 11th of the large domains in make test-whole)."""
    assert_probe_counts_like_traces(engine.load_policy(ref), every=every)


def test_an_unconditional_default_ends_the_defaults(tmp_path):
    """Rules after a default without `when` never run. The bulk evaluator emitted `elif`
    after that `else:` (a SyntaxError at load); found by tests/test_fuzz.py deleting a line."""
    text = DEPRECATED.replace("- {name: small, when: {size: 1}, set: {main: a}, log: \"size {size}: {main}\"}",
                              "- {name: first, set: {main: a}}\n    - {name: small, when: {size: 1}, set: {main: b}}")
    policy = load_text(tmp_path, text)
    assert assert_bulk_equals_evaluate(policy) == domain.config_count(policy)
    assert policy.evaluate({"size": 1}).sources == {"main": "first"}
    from engine.analysis.lint import lint

    assert sorted(p.code for p in lint(policy)[0]) == ["L401", "L401"]


def test_a_deprecated_flag_log_with_a_field_is_a_load_error(tmp_path):
    """Deprecated-flag log lines are plain text; a field in one was reported and then rendered
    anyway, raising KeyError out of load_policy. Found by tests/test_fuzz.py swapping values."""
    text = DEPRECATED.replace("\"'--old-size' is deprecated\"", "\"'--old-size' is deprecated ({size})\"")
    with pytest.raises(engine.PolicyError) as exc:
        load_text(tmp_path, text)
    (problem,) = exc.value.problems
    assert problem.code == "E306" and "'{size}' is not known here" in problem.message
