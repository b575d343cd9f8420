"""Computed values: a resolve rule's `set` may take another input's value, a product or a quotient
(`{quotient: [...]}`, Python's floor division left to right), and comparisons may take a quotient.
SGLang computes such values at launch (DeepSeek-V4's context parallelism declares
attn_cp_size = tp_size // attn_dp_size and logs it). The interpreter, the compiled evaluator, the
lint's counting evaluator and the whole-domain classes all agree, and a file that cannot mean what
it says is refused with the field named."""
import itertools

import pytest

import engine
from engine.analysis.classes import Classes
from engine.analysis.domain import size
from tests.helpers import assert_bulk_equals_evaluate, assert_probe_counts_like_traces, load_text, run_cli
from engine.analysis import domain

TEXT = """
policy: computed
version: 1
description: Computed values.
inputs:
  tp_size: {type: int, values: [1, 2, 8, 16], default: 1, minimum: 1}
  attn_dp_size: {type: int, values: [1, 2, 4], default: 1, minimum: 1}
  attn_cp_size: {type: int, values: [1, 2], default: 1, minimum: 1}
  dp_size: {type: int, values: [1, 2], default: 1, minimum: 1}
  enable_prefill_cp: {type: bool, default: false}
  draft_tp: {type: int, values: [1], default: null, nullable: true, minimum: 1}
backends: {flashmla: F, mega: M}
phases:
  attention: {input: dsv4_attn_backend}
resolve:
  rules:
    - name: cp-declarations
      when: {enable_prefill_cp: true}
      set:
        attn_cp_size: {quotient: [{input: tp_size}, {input: attn_dp_size}]}
        dp_size: 1
      log: "Enable Context Parallel, dp_size={dp_size}, attn_dp_size={attn_dp_size}, attn_cp_size={attn_cp_size}, tp_size={tp_size}"
    - name: draft-follows
      when: {draft_tp: null}
      set: {draft_tp: {input: tp_size}}
defaults:
  rules:
    - name: attention-tp-above-cp
      when: {attn_cp_size: {"<": {quotient: [{input: tp_size}, {input: attn_dp_size}]}}}
      set: {attention: flashmla}
    - name: otherwise
      set: {attention: mega}
checks:
  rules:
    - name: single-machine
      when: {enable_prefill_cp: true}
      require: {attn_cp_size: {"<=": 8}}
      raises: AssertionError
      message: Context parallel only supports single machine (attn_cp_size {attn_cp_size} > 8).
"""


@pytest.fixture
def policy(tmp_path):
    return load_text(tmp_path, TEXT)


@pytest.mark.parametrize("tp, adp, cp, want", [
    (8, 1, True, 8), (8, 2, True, 4), (16, 4, True, 4), (7, 2, True, 3), (8, 3, True, 2), (8, 2, False, 1)])
def test_a_quotient_sets_a_value_that_logs_and_checks_see(policy, tp, adp, cp, want):
    d = policy.evaluate({"tp_size": tp, "attn_dp_size": adp, "enable_prefill_cp": cp, "dp_size": 2})
    assert d.config["attn_cp_size"] == want and d.config["dp_size"] == (1 if cp else 2)
    assert d.config["draft_tp"] == tp  # {input: NAME} copies another input's current value
    if cp:
        assert d.log == [f"Enable Context Parallel, dp_size=1, attn_dp_size={adp}, attn_cp_size={want}, tp_size={tp}"]
    assert d.ok is (want <= 8)


def test_a_value_set_by_an_earlier_rule_is_what_a_later_computation_reads(policy):
    # tp 16, attn DP 1, CP: attn_cp_size 16 (then the check refuses it), which covers tp // attn DP;
    # without CP it is 1, which does not
    d = policy.evaluate({"tp_size": 16, "enable_prefill_cp": True})
    assert (d.ok, d.error) == (False, "Context parallel only supports single machine (attn_cp_size 16 > 8).")
    assert d.backends == {"attention": "mega"}  # 16 < 16 // 1 is false
    assert policy.evaluate({"tp_size": 16}).backends == {"attention": "flashmla"}
    assert policy.evaluate({"tp_size": 16, "attn_dp_size": 16}).backends == {"attention": "mega"}


def test_every_evaluator_agrees_on_and_off_the_domain(policy):
    assert assert_bulk_equals_evaluate(policy) == domain.config_count(policy)
    off = [dict(tp_size=tp, attn_dp_size=adp, attn_cp_size=acp, dp_size=1, enable_prefill_cp=cp, draft_tp=None)
           for tp, adp, acp, cp in itertools.product([3, 24, 1], [5, 1], [3, 1], [False, True])]
    assert_bulk_equals_evaluate(policy, off)
    assert_probe_counts_like_traces(policy)


def test_each_class_of_the_domain_follows_one_path(policy):
    """The whole-domain analyses evaluate one config per class. A class may differ only on the axes
    whose values its outcome shows (`reads`): every config must decide as the class's first config
    with those axes taken from it, computed values included."""
    domains = [policy.inputs[n].domain() for n in policy.input_names]
    cubes = Classes(policy, domains, lint=False).cubes(budget=10 ** 6)
    assert cubes is not None and sum(size(len(s) for s in c) for c, _ in cubes) == domain.config_count(policy)
    assert len(cubes) < domain.config_count(policy)  # the walk did group configs
    names = policy.input_names
    for cube, reads in cubes:
        first = [d[s[0]] for d, s in zip(domains, cube)]
        for idx in itertools.product(*cube):
            config = dict(zip(names, (d[i] for d, i in zip(domains, idx))))
            stand_in = dict(zip(names, (config[n] if a in reads else first[a] for a, n in enumerate(names))))
            got, want = policy.evaluate(config), policy.evaluate(stand_in)
            assert (got.ok, got.log, got.error, got.backends, got.config["attn_cp_size"], got.config["draft_tp"]) == \
                (want.ok, want.log, want.error, want.backends, want.config["attn_cp_size"], want.config["draft_tp"]), config


@pytest.mark.parametrize("edit, problem", [
    ("attn_cp_size: {quotient: [{input: tp_size}, {input: attn_dp_size}]}",
     "E308: 'dp_size' is computed from tp_size, which this rule also sets"),
    ("attn_cp_size: {quotient: [{input: tp_size}, {input: draft_tp}]}",
     "E308: 'attn_cp_size' is never unset (not nullable), but tp_size // draft_tp can be"),
    ("attn_cp_size: {quotient: [{input: tp_size}, 0]}",
     "E308: 'attn_cp_size' is never unset (not nullable), but tp_size // 0 can be"),
    ("attn_cp_size: {quotient: [{input: tp_size}, {input: enable_prefill_cp}]}",
     "E308: a product multiplies integers, but 'enable_prefill_cp' is bool"),
    ("attn_cp_size: {input: enable_prefill_cp}",
     "E308: 'attn_cp_size' (int) compared with 'enable_prefill_cp' (bool)"),
    ("attn_cp_size: {quotient: [{input: tp_sise}, 2]}", "E301: unknown input 'tp_sise'"),
])
def test_a_computed_value_that_cannot_hold_is_refused_with_its_field(tmp_path, edit, problem):
    text = TEXT.replace("attn_cp_size: {quotient: [{input: tp_size}, {input: attn_dp_size}]}", edit)
    if "this rule also sets" in problem:
        text = text.replace("dp_size: 1\n", "dp_size: 1\n        tp_size: 8\n").replace(
            edit, "attn_cp_size: 2\n        dp_size: {quotient: [{input: tp_size}, 2]}").replace(
            "        dp_size: 1\n", "", 1)
    with pytest.raises(engine.PolicyError) as exc:
        load_text(tmp_path, text)
    shown = "\n".join(str(p) for p in exc.value.problems)
    assert problem in shown and ":" in shown.split("E3")[0]  # file:line:column first


def test_check_lints_a_computed_value_as_a_read_and_explain_shows_it(tmp_path, policy, capsys):
    path = tmp_path / "computed.yaml"
    path.write_text(TEXT, encoding="utf-8")
    code, out, _ = run_cli(capsys, "check", str(path))
    assert code == 0 and "0 problem(s)" in out  # attn_dp_size is read by the quotient (no L405)
    code, out, _ = run_cli(capsys, "explain", "--policy", str(path), "--enable-prefill-cp", "--tp-size", "8",
                           "--attn-dp-size", "2")
    assert code == 0 and "attn_cp_size = tp_size // attn_dp_size = 4" in out
