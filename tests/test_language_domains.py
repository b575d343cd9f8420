"""What the model families of DeepSeek-V4 and MiniMax-M3 need of the language, on a small policy
written here: `str` inputs (any string; representative values), inputs that are environment
variables (`env:`), `multiple_of` tests, `{product: [...]}` operands, and a declared domain made of
parts (`domain.parts`). For each: what it means (the bulk evaluator agrees with evaluate on the
whole declared domain and beyond it), the errors a file gets, and what check, diff, table and the
conform sample make of a domain of parts."""
import itertools
import json

import pytest

import engine
from engine.sglang.conform import sample
from tests.helpers import assert_bulk_equals_evaluate, bulk_decisions, load_text, run_cli
from engine.analysis import domain

TEXT = """
policy: ext
version: 1
description: Extensions for the V4 and M3 families.
inputs:
  algo: {type: str, values: [EAGLE, DSPARK], default: null, nullable: true}
  layout: {type: str, values: [v4, v41], default: null, nullable: true, env: SGLANG_DSV4_KV_LAYOUT}
  tp: {type: int, values: [1, 8], default: 1, minimum: 1}
  dp: {type: int, values: [1, 8], default: 1, minimum: 1}
  chunk: {type: int, values: [8192, 1000], default: 8192}
  page: {type: int, values: [256, 64], default: 256, minimum: 1}
domain:
  parts:
    - name: parallel
      inputs: {tp: all, dp: all}
    - name: speculative
      inputs: {algo: all, tp: [1]}
    - name: pages
      inputs: {chunk: all, page: all, layout: [v41]}
backends: {a: A, b: B}
phases:
  attn: {input: attn_backend}
resolve:
  rules:
    - name: algo
      when: {algo: {set: true}}
      require: {algo: {in: [EAGLE, DSPARK]}}
      message: "Only EAGLE and DSPARK are supported, got {algo}"
defaults:
  rules:
    - name: tensor-parallel
      when: {tp: {">=": {product: [2, {input: dp}]}}}
      set: {attn: a}
      log: "attention TP above 1 with layout {layout}: {attn}"
    - name: other
      set: {attn: b}
checks:
  rules:
    - name: chunk
      require: {chunk: {multiple_of: {input: page}}}
      message: chunked_prefill_size must be divisible by page_size
"""


@pytest.fixture
def policy(tmp_path):
    return load_text(tmp_path, TEXT)


def test_a_str_input_takes_any_string_and_an_env_input_is_named(policy):
    spec = policy.inputs["algo"]
    assert spec.accepts("NEXTN") and spec.accepts("eagle") and not spec.accepts(3) and spec.accepts(None)
    assert spec.domain() == ["EAGLE", "DSPARK", None]
    assert policy.inputs["layout"].env == "SGLANG_DSV4_KV_LAYOUT" and policy.inputs["algo"].env is None
    d = policy.evaluate({"algo": "NEXTN"})
    assert not d.ok and d.error == "Only EAGLE and DSPARK are supported, got NEXTN"
    with pytest.raises(engine.ConfigError, match="algo: expected a string"):
        policy.evaluate({"algo": 7})


@pytest.mark.parametrize("tp, dp, attn", [(1, 1, "b"), (2, 1, "a"), (8, 8, "b"), (16, 8, "a"), (15, 8, "b"),
                                          (8, 4, "a"), (7, 4, "b")])
def test_a_product_operand_compares_with_a_product_of_inputs(policy, tp, dp, attn):
    assert policy.evaluate({"tp": tp, "dp": dp}).backends == {"attn": attn}


@pytest.mark.parametrize("chunk, page, ok", [(8192, 256, True), (1000, 256, False), (768, 256, True),
                                             (1000, 8, True), (-256, 256, True), (0, 256, True)])
def test_multiple_of_is_an_integer_multiple(policy, chunk, page, ok):
    assert policy.evaluate({"chunk": chunk, "page": page}).ok is ok


def test_the_declared_domain_is_the_union_of_its_parts_once_each(policy):
    configs = list(domain.configs(policy))
    keys = [tuple(sorted(c.items(), key=lambda kv: kv[0])) for c in configs]
    # 4 (tp x dp) + 2 (the algos but None, whose config the first part holds) + 4 (chunk x page, layout v41)
    assert len(keys) == len(set(keys)) == domain.config_count(policy) == 10
    assert {c["tp"] for c in configs} == {1, 8} and {c["algo"] for c in configs} == {None, "EAGLE", "DSPARK"}
    assert all(c["layout"] is None or (c["layout"] == "v41" and c["tp"] == 1) for c in configs)
    # the bulk evaluator decides as evaluate on the declared domain and off it (values no part names)
    assert_bulk_equals_evaluate(policy)
    off = [dict(configs[0], tp=tp, dp=dp, algo=algo, chunk=chunk) for tp, dp, algo, chunk in
           [(16, 8, "NEXTN", 1000), (3, 1, None, 512), (24, 4, "DSPARK", 8192)]]
    assert_bulk_equals_evaluate(policy, off)
    assert [b.backends["attn"] for b in bulk_decisions(policy, off)] == [None, "a", "a"]  # NEXTN: refused first


def test_a_domain_of_parts_is_checked_by_name_and_value(tmp_path):
    bad = TEXT.replace("inputs: {tp: all, dp: all}", "inputs: {tp: all, dpp: all}").replace(
        "layout: [v41]", "layout: [v41, 5]")
    with pytest.raises(engine.PolicyError) as exc:
        load_text(tmp_path, bad)
    text = "\n".join(str(p) for p in exc.value.problems)
    assert "E301: unknown input 'dpp'" in text and "did you mean 'dp'" in text
    assert "E308: an integer 5 does not fit 'layout', which is a string" in text


def test_check_diff_and_table_read_a_domain_of_parts(tmp_path, policy, capsys):
    folder = tmp_path / "two" / "ext"
    folder.mkdir(parents=True)
    (folder / "v1.yaml").write_text(TEXT, encoding="utf-8")
    (folder / "v2.yaml").write_text(TEXT.replace("version: 1", "version: 2").replace(
        "set: {attn: a}", "set: {attn: b}").replace("tp: [1]", "tp: [1, 8]"), encoding="utf-8")
    code, out, err = run_cli(capsys, "diff", str(folder / "v1.yaml"), str(folder / "v2.yaml"), "--format", "json")
    report = json.loads(out)
    assert code == 1 and report["total"] == domain.config_count(policy) + 2  # v2's part adds tp 8 with each algo
    (group,) = report["groups"]
    assert group["class"] == "backend_changed" and group["count"] == 3  # tp 8, dp 1 in both parts
    assert group["example"]["config"]["tp"] == 8 and group["example"]["config"]["dp"] == 1
    code, out, _ = run_cli(capsys, "table", "--policy", str(folder / "v1.yaml"), "--format", "json")
    rows = json.loads(out)["rows"]
    assert code == 0 and any(r["rejected"] == "chunked_prefill_size must be divisible by page_size" for r in rows)
    assert sum(1 for r in rows if r["defaults"] == {"attn": "a"}) >= 1


def test_the_conform_sample_of_a_domain_of_parts_holds_every_value(policy):
    every, total = sample.configs_of(policy)
    assert total == len(every) == domain.config_count(policy)
    few, total = sample.configs_of(policy, n=6, seed=1)
    assert total == domain.config_count(policy) and len(few) == 6 and all(c in every for c in few)
    for name in ("tp", "algo", "chunk", "layout"):
        assert {c[name] for c in few} == {c[name] for c in every}, name
    assert sample.configs_of(policy, n=6, seed=1)[0] == few
    narrowed, total = sample.configs_of(policy, {"tp": 8})
    assert narrowed and all(c["tp"] == 8 for c in narrowed) and total == len(narrowed)


LOWER = """
policy: lower
version: 1
description: A case-insensitive string test.
inputs:
  layout: {type: str, values: [v41, V41, v4], default: null, nullable: true, env: SGLANG_DSV4_KV_LAYOUT}
backends: {mega: M, flashmla: F}
phases:
  attn: {input: attn_backend}
resolve:
  rules: []
defaults:
  rules:
    - name: v41-layout
      when:
        any:
          - {layout: null}
          - {layout: {lower_in: [auto, v41, v41_new]}}
      set: {attn: mega}
    - name: other
      set: {attn: flashmla}
checks:
  rules: []
"""


@pytest.mark.parametrize("layout, attn", [(None, "mega"), ("v41", "mega"), ("V41", "mega"), ("AuTo", "mega"),
                                          ("v41_NEW", "mega"), ("v4", "flashmla"), ("", "flashmla"),
                                          ("v41 ", "flashmla")])
def test_lower_in_compares_the_lower_case_form_as_sglang_does(tmp_path, layout, attn):
    policy = load_text(tmp_path, LOWER)
    assert policy.evaluate({"layout": layout}).backends == {"attn": attn}
    assert_bulk_equals_evaluate(policy, [{"layout": layout, "attn_backend": None}])


def test_lower_in_takes_lower_case_strings_of_a_str_input(tmp_path):
    bad = LOWER.replace("lower_in: [auto, v41, v41_new]", "lower_in: [Auto, v41]").replace(
        "{layout: null}", "{attn_backend: {lower_in: [mega]}}")
    with pytest.raises(engine.PolicyError) as exc:
        load_text(tmp_path, bad)
    text = "\n".join(str(p) for p in exc.value.problems)
    assert "E308: 'Auto' is not lower case, so lower_in never matches it" in text
    assert "E308: lower_in compares strings but 'attn_backend' is enum" in text


def _union_once(policy):
    """The declared domain in its simplest form: each part's product in order, a config kept
    when no earlier part's product holds it (values compared with their types)."""
    names, seen, out = policy.input_names, [], []
    for cube in domain.cubes(policy):
        for combo in itertools.product(*cube):
            if not any(all((type(v), v) in part[i] for i, v in enumerate(combo)) for part in seen):
                out.append(dict(zip(names, combo)))
        seen.append([{(type(v), v) for v in values} for values in cube])
    return out


@pytest.mark.parametrize("ref", [f"{f}@{v}" for f, vs in engine.list_families().items() for v in vs
                                 if f != "dsa-backends"])
def test_every_shipped_domain_of_parts_is_enumerated_and_counted_as_the_union_once_each(ref):
    policy = engine.load_policy(ref)
    assert policy.domain_parts  # the V4 and M3 families declare their domains as parts
    want = _union_once(policy)
    assert list(domain.configs(policy)) == want  # the same configs, in the same order
    assert domain.config_count(policy) == len(want)


def test_new_configs_of_a_part_stream_in_order_at_any_depth():
    """A part's new configs come depth first without recursion (5,000 inputs), in product order,
    and without building the part's product (the first configs of 8 million, in bounded memory)."""
    import tracemalloc

    deep = [[0]] * 4999 + [[0, 1]]
    masks = [[1]] * 4999 + [[1, 0]]  # an earlier part holds every config but the last value's
    assert list(domain._new_combos(deep, masks, 1)) == [(0,) * 4999 + (1,)]
    cube = [list(range(200))] * 3
    bits = [[0] + [1] * 199] * 3  # an earlier part holds every config without a 0
    want = [c for c in itertools.islice(itertools.product(*cube), 60_000) if 0 in c][:20]
    tracemalloc.start()
    got = list(itertools.islice(domain._new_combos(cube, [bits[0]] * 3, 1), 20))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert got == want and peak < 1 << 20
