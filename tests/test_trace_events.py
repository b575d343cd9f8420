"""The interpreter reports trace events (engine/language/interpreter.py's Event) and words
nothing: engine/explain groups the events into steps and words them. Without a tracer no event is
made."""
import ast

import pytest

import engine
from engine.cli.decision_text import explanation_text
from engine.explain.trace import Trace
from engine.language import interpreter
from tests.helpers import ROOT, load_text
from engine.analysis import domain

TEXT = """
policy: traced
version: 1
description: Trace events.
inputs:
  size: {type: int, values: [1, 2, 3], default: 1}
  fast: {type: bool, default: false}
backends: {a: A, b: B}
phases:
  main: {input: main_backend}
resolve:
  rules:
    - name: grow
      when: {size: 1}
      require: {size: 1}
      message: never
      set: {size: 2}
      log: "grown to {size}"
defaults:
  rules:
    - name: fast-a
      when: {fast: true}
      set: {main: a}
    - name: any-b
      set: {main: b}
checks:
  rules:
    - name: small
      require: {size: {"<=": 2}}
      message: "too big: {size}"
"""


@pytest.fixture
def policy(tmp_path):
    return load_text(tmp_path, TEXT)


def test_an_evaluation_without_a_tracer_makes_no_event(monkeypatch, policy):
    def refuse(*args, **kwargs):
        raise AssertionError("an event was made without a tracer")

    monkeypatch.setattr(interpreter, "Event", refuse)
    for ref in ("dsa-backends@10", "dsv4-backends@13", "minimax-m3-backends@3"):
        shipped = engine.load_policy(ref)
        for config in list(domain.configs(shipped))[:200]:
            shipped.evaluate(config)
    assert policy.evaluate({"size": 3}).error == "too big: 3"
    with pytest.raises(AssertionError, match="without a tracer"):  # the patch is where events are made
        policy.trace({})


def test_the_events_carry_what_was_read_and_done(policy):
    d, events = policy.trace({"fast": True})
    ops = [(e.op, e.rule.name if e.rule else e.stage) for e in events]
    assert ops == [("start", None), ("stage", "resolve"), ("rule", "grow"), ("require", "grow"),
                   ("set", "grow"), ("log", "grow"), ("stage", "defaults"), ("matches", "defaults"),
                   ("rule", "fast-a"), ("chosen", "fast-a"), ("fill", "fast-a"), ("stage", "checks"),
                   ("rule", "small"), ("require", "small")]
    by_op = {e.op: e for e in events}
    assert by_op["start"].value == {"main": False} and by_op["start"].env["size"] == 1
    assert (by_op["set"].name, by_op["set"].value) == ("size", 2)
    assert by_op["require"].env["size"] == 2 and by_op["require"].holds  # the check read the rewritten size
    assert [r.name for r in by_op["matches"].value] == ["fast-a", "any-b"]
    assert (by_op["fill"].phase, by_op["fill"].value) == ("main", "a")
    assert d.log == ["grown to 2"] and d.backends == {"main": "a"}


def test_a_trace_fed_live_equals_one_fed_the_events(policy):
    live = Trace()
    policy.evaluate({"size": 3, "main_backend": "b"}, tracer=live)
    kept = Trace(policy.trace({"size": 3, "main_backend": "b"})[1])
    view = [[(s.stage, s.rule and s.rule.name, s.holds, s.violated, s.chosen, s.why, s.outcome) for s in t.steps]
            for t in (live, kept)]
    assert view[0] == view[1]
    assert [s.outcome for s in kept.steps if s.rule is not None and s.holds] == ["main stays b (user)", "violated"]


def test_a_requirement_is_worded_on_the_values_it_was_read_on(policy):
    """grow requires size 1 and then sets it to 2: its requirement held, and explain says so."""
    d, events = policy.trace({})
    text = explanation_text(d, events)
    assert "   - grow (line 13): applied: size == 1 (yes); size == 1 (yes)\n" in text
    assert "       requirement holds; size = 2; log: grown to 2\n" in text


def test_the_interpreter_holds_no_english():
    """Its strings, docstrings aside, are names (ops, stages, fields), never words for a reader."""
    path = f"{ROOT}/engine/language/interpreter.py"
    tree = ast.parse(open(path, encoding="utf-8").read())
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef)) and node.body
                  and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    strings = [node.value for node in ast.walk(tree) if isinstance(node, ast.Constant)
               and isinstance(node.value, str) and id(node) not in docstrings]
    assert strings and all(s.isidentifier() for s in strings), strings
