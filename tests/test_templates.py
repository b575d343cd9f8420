"""Templates: the bulk evaluator and evaluate render every form the language allows
the same way, and that way is Python's f-string applied to the field's object (the value, or for
a backend set the object its format names)."""
import pytest

from engine.language.templates import parse_template, render_field
from tests.helpers import bulk_decisions, load_text
from engine.analysis import domain

CONVERSIONS = ("", "!s", "!r")
SET_FORMATS = ("", ":list", ":tuple", ":csv", ":or")
# every kind of value field: bool, enum, int, nullable int (unset = None), a phase's backend
# (unset before the defaults), and in per-phase checks {phase} (known when compiling) and {backend}
VALUE_FIELDS = ("flag", "kind", "n", "cap", "decode", "prefill")
PHASE_FIELDS = ("phase", "backend")

POLICY = """policy: forms
version: 1
description: Every template form, in every stage.
inputs:
  flag: {type: bool, default: false}
  kind: {type: enum, values: [plain, many, x.y], default: plain}
  n: {type: int, values: [0, -3, 12], default: 0}
  cap: {type: int, values: [7], default: null, nullable: true}
backends:
  a_kv: a.
  b_sparse: b.
  "c": c.
phases:
  prefill: {input: prefill_backend}
  decode: {input: decode_backend}
resolve:
  rules:
    - name: say
      log: "R {VALUES}"
defaults:
  rules:
    - name: pick
      when: {flag: true}
      set: {prefill: a_kv, decode: b_sparse}
      log: "D {VALUES}"
checks:
  rules:
    - name: values
      require: {n: {">": 100}}
      message: "C {VALUES}"
    - name: sets
      for_each: phase
      allowed:
        key: kind
        rows:
          plain: [c]
          many: [a_kv, b_sparse, c]
        otherwise: []
      message: "S {{literal}} {PHASES} {SETS}"
"""


def placeholders(names, forms):
    return " ".join(f"{name}={{{name}{form}}}" for name in names for form in forms)


def policy(tmp_path):
    text = (POLICY.replace("{VALUES}", placeholders(VALUE_FIELDS, CONVERSIONS))
            .replace("{PHASES}", placeholders(VALUE_FIELDS + PHASE_FIELDS, CONVERSIONS))
            .replace("{SETS}", placeholders(("allowed",), [c + f for c in CONVERSIONS for f in SET_FORMATS])))
    return load_text(tmp_path, text, "forms/v1.yaml")


def test_every_form_renders_alike_in_both_evaluators(tmp_path):
    p = policy(tmp_path)
    forms = {(f.name, f.spec, f.conversion) for r in p.rule_list for t in (r.log, r.message) if t
             for f in t.fields}
    assert len(forms) == len(VALUE_FIELDS) * 2 + len(PHASE_FIELDS) * 2 + 2 * len(SET_FORMATS)  # !s == ""
    configs = list(domain.configs(p))
    for config, compiled in zip(configs, bulk_decisions(p, configs)):
        interpreted = p.evaluate(config)
        assert compiled.log == interpreted.log, config
        assert [v.message for v in compiled.violations] == [v.message for v in interpreted.violations], config
    assert len(configs) == 2 * 3 * 3 * 2 * 4 * 4


def expected_piece(value, conversion):
    return repr(value) if conversion == "!r" else str(value)


def test_the_text_is_pythons_fstring_of_the_object(tmp_path):
    p = policy(tmp_path)
    d = p.evaluate({"flag": True, "kind": "many", "n": -3, "prefill_backend": "b_sparse"})
    env = {"flag": True, "kind": "many", "n": -3, "cap": None}
    before = dict(env, prefill="b_sparse", decode=None)
    assert d.log[0] == "R " + " ".join(f"{k}={expected_piece(before[k], c)}" for k in VALUE_FIELDS
                                       for c in CONVERSIONS)
    after = dict(env, prefill="b_sparse", decode="b_sparse")
    assert d.log[1] == "D " + " ".join(f"{k}={expected_piece(after[k], c)}" for k in VALUE_FIELDS
                                       for c in CONVERSIONS)
    d = p.evaluate({"kind": "plain", "decode_backend": "a_kv"})  # decode a_kv is not in [c]
    message = [v.message for v in d.violations if v.phase == "decode"][0]
    objects = {"": ["c"], ":list": ["c"], ":tuple": ("c",), ":csv": "c", ":or": "c"}
    assert message.endswith(" ".join(f"allowed={expected_piece(objects[f], c)}" for c in CONVERSIONS
                                     for f in SET_FORMATS))
    assert "allowed=['c'] allowed=['c'] allowed=('c',) allowed=c allowed=c" in message
    assert "allowed=('c',) allowed='c' allowed='c'" in message  # !r of the tuple, of the text
    assert "phase=decode phase=decode phase='decode' backend=a_kv backend=a_kv backend='a_kv'" in message
    assert message.startswith("S {literal} ")
    d = p.evaluate({"kind": "x.y"})  # otherwise: [] renders as an empty list, or empty text
    message = [v.message for v in d.violations if v.phase == "prefill"][0]
    assert "kind=x.y kind=x.y kind='x.y'" in message and "allowed=[] " in message and "allowed=''" in message


@pytest.mark.parametrize("value, spec, conversion, text", [
    (frozenset({"b", "a"}), "", "", "['a', 'b']"), (frozenset({"b", "a"}), "", "r", "['a', 'b']"),
    (frozenset({"b", "a"}), "csv", "r", "'a, b'"), (frozenset({"b", "a"}), "or", "", "a or b"),
    (frozenset({"b", "a"}), "tuple", "", "('a', 'b')"), (None, "", "", "None"), (True, "", "r", "True"),
    ("x", "", "r", "'x'"), (5, "", "", "5"),
])
def test_render_field(value, spec, conversion, text):
    assert render_field(value, spec, conversion) == text


def test_parse_keeps_conversion_and_spec():
    t = parse_template("{allowed!r:csv} {x!s} {{}}")
    assert [(f.name, f.spec, f.conversion) for f in t.fields] == [("allowed", "csv", "r"), ("x", "", "")]
    assert "".join(p for p in t.parts if isinstance(p, str)) == "  {}"
