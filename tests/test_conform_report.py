"""The policy side of `hisparse conform`, without SGLang: translation to launches, stratified
samples, and the comparison and its groups, fed with results that are known."""
import dataclasses
import json
import os
import subprocess
import sys

import pytest

import engine
from engine.sglang.conform import cases, report, sample
from engine.sglang.conform.protocol import Result
from engine.cli.reports import conform_text
from engine.analysis import domain

V4 = engine.load_policy("dsa-backends@10")


def as_result(decision) -> Result:
    """What SGLang would report if it did exactly what the decision says."""
    b = decision.backends
    return Result(decision.ok, decision.error, decision.config["kv_cache_dtype"], (b["prefill"], b["decode"]),
                  tuple(decision.log), "done" if decision.ok else "check", None,
                  None if decision.ok else decision.violations[0].raises)


def test_case_of_spells_what_an_operator_types():
    config = V4.complete({"enable_hisparse": True, "kv_cache_dtype": "fp8_e4m3", "disable_radix_cache": True,
                          "sm_major": 10, "dsa_decode_backend": "flashmla_kv", "hisparse_device_buffer_size": 1024})
    case = cases.case_of(V4, config)
    assert case.argv == ("--enable-hisparse", "--kv-cache-dtype", "fp8_e4m3", "--disable-radix-cache",
                         "--dsa-decode-backend", "flashmla_kv", "--hisparse-config", '{"device_buffer_size":1024}')
    assert (case.architecture, case.platform, case.capability) == ("DeepseekV32ForCausalLM", "cuda", (10, 0))
    assert json.loads(case.argv[-1]) == {"device_buffer_size": 1024}


@pytest.mark.parametrize("dsa,family,arch", [
    (True, "deepseek_v32", "DeepseekV32ForCausalLM"), (True, "glm5", "GlmMoeDsaForCausalLM"),
    (True, "glm5_next", "Glm5NextForConditionalGeneration"), (False, "glm5", "DeepseekV3ForCausalLM")])
def test_models_by_architecture(dsa, family, arch):
    case = cases.case_of(V4, V4.complete({"dsa_model": dsa, "model_family": family}))
    assert case.architecture == arch and case.argv == ()


def test_older_versions_use_their_own_flags():
    v2 = engine.load_policy("dsa-backends@2")
    case = cases.case_of(v2, v2.complete({"nsa_prefill_backend": "flashmla_kv", "platform": "hip"}))
    assert case.argv == ("--nsa-prefill-backend", "flashmla_kv") and case.platform == "hip"


def test_stratified_sample_holds_every_value_and_is_repeatable():
    ax = sample.axes(V4)
    first = sample.stratified(ax, 500, seed=3)
    assert first == sample.stratified(ax, 500, seed=3)
    assert first != sample.stratified(ax, 500, seed=4)
    assert len({sample.index_of(ax, c) for c in first}) == 500
    for name, values in ax:
        seen = {(type(c[name]), c[name]) for c in first}
        assert seen == {(type(v), v) for v in values}, name


def test_sample_index_round_trip_and_fixed_inputs():
    ax = sample.axes(V4, {"platform": "hip", "sm_major": 12})
    assert sample.size(ax) == domain.config_count(V4) // 8
    for i in (0, 1, 777, sample.size(ax) - 1):
        c = sample.config_at(ax, i)
        assert sample.index_of(ax, c) == i and c["platform"] == "hip" and c["sm_major"] == 12


def _slice():
    return list(sample.whole(sample.axes(V4, {"hisparse_device_buffer_size": None, "sm_major": 9,
                                              "platform": "cuda", "dsa_model": True})))


def test_identical_results_agree():
    configs = _slice()
    got = report.compare(V4, configs, [cases.case_of(V4, c) for c in configs],
                         [as_result(V4.evaluate(c)) for c in configs], sampled=False)
    assert got["conformant"] and got["counts"] == {"agree": len(configs), "differ": 0, "out_of_scope": 0}


def test_another_exception_type_is_a_difference_in_exception_only():
    configs = _slice()
    results = [as_result(V4.evaluate(c)) for c in configs]
    flipped = {"AssertionError": "ValueError", "ValueError": "AssertionError"}
    asserted = [i for i, r in enumerate(results) if r.error_type == "AssertionError"]
    assert asserted  # the slice holds configs whose rule raises AssertionError (policy data: raises)
    for i in asserted:
        results[i] = dataclasses.replace(results[i], error_type=flipped[results[i].error_type])
    got = report.compare(V4, configs, [cases.case_of(V4, c) for c in configs], results, sampled=False)
    assert not got["conformant"] and got["counts"]["differ"] == len(asserted)
    assert got["fields"]["exception"] == len(asserted) and sum(got["fields"].values()) == len(asserted)
    (group,) = got["groups"]
    assert group["fields"] == ["exception"] and group["example"]["sglang"]["exception"] == "ValueError"
    assert group["example"]["policy"]["exception"] == "AssertionError"


def test_differences_are_grouped_into_exact_patterns():
    configs = _slice()
    results = []
    for c in configs:
        r = as_result(V4.evaluate(c))
        if c["model_family"] == "glm5" and c["kv_cache_dtype"] == "bfloat16" and r.ok:
            r = Result(True, None, r.kv_cache_dtype, r.backends, r.log + ("an extra line",), "done")
        results.append(r)
    got = report.compare(V4, configs, [cases.case_of(V4, c) for c in configs], results, sampled=False)
    changed = [c for c, r in zip(configs, results) if r.log and r.log[-1] == "an extra line"]
    assert got["counts"]["differ"] == len(changed) > 0 and got["fields"]["log"] == len(changed)
    (group,) = got["groups"]
    assert group["count"] == len(changed) and "SGLang logs more lines" in group["change"]
    # every pattern matches only changed configs, and every changed config matches a pattern
    def matches(pattern, c):
        for k, v in pattern.items():
            if isinstance(v, dict):
                op, vals = next(iter(v.items()))
                ok = (c[k] in vals) if op == "in" else (c[k] not in vals) if op == "not_in" else c[k] != vals
            else:
                ok = c[k] == v
            if not ok:
                return False
        return True
    assert all(any(matches(p, c) for p in group["patterns"]) for c in changed)
    assert not any(matches(p, c) for p in group["patterns"] for c in configs if c not in changed)
    assert group["example"]["sglang"]["log"][-1] == "an extra line"


def test_rejections_compare_message_and_log_not_backends():
    c = V4.complete({"kv_cache_dtype": "bfloat16", "dsa_prefill_backend": "triton"})
    d = V4.evaluate(c)
    assert not d.ok and d.log == []  # the check at defaults stops before "Set DSA backends ..."
    other_backends = Result(False, d.error, "bfloat16", ("triton", None), (), "resolve", None, "ValueError")
    got = report.compare(V4, [c], [cases.case_of(V4, c)], [other_backends], sampled=False)
    assert got["conformant"]
    logged = Result(False, d.error, "bfloat16", ("triton", "fa3"),
                    ("Set DSA backends for bfloat16 KV Cache: prefill=triton, decode=fa3.",), "resolve", None,
                    "ValueError")
    got = report.compare(V4, [c], [cases.case_of(V4, c)], [logged], sampled=False)
    assert not got["conformant"] and got["fields"]["log"] == 1 and got["fields"]["message"] == 0


def test_a_left_out_place_is_out_of_scope_not_a_difference():
    c = V4.complete({"dsa_model": False, "kv_cache_dtype": "mxfp8"})
    assert V4.evaluate(c).ok
    r = Result(False, "--kv-cache-dtype mxfp8 requires an SM100+ (Blackwell) GPU", None, (None, None), (), "resolve",
               "srt/arg_groups/kv_cache_hook.py:107 handle_mxfp8_kv_cache_compatibility", "ValueError")
    got = report.compare(V4, [c], [cases.case_of(V4, c)], [r], sampled=False)
    assert got["conformant"] and got["counts"]["out_of_scope"] == 1
    assert got["out_of_scope"][0]["at"] == "kv_cache_hook.py:handle_mxfp8_kv_cache_compatibility"
    elsewhere = Result(False, "boom", None, (None, None), (), "check", "srt/arg_groups/other.py:1 f", "ValueError")
    assert not report.compare(V4, [c], [cases.case_of(V4, c)], [elsewhere], sampled=False)["conformant"]


def test_report_text_names_both_sides():
    c = V4.complete({"kv_cache_dtype": "bfloat16"})
    d = V4.evaluate(c)
    r = Result(True, None, "bfloat16", ("flashmla_sparse", "trtllm"), tuple(d.log), "done")
    got = report.compare(V4, [c], [cases.case_of(V4, c)], [r], sampled=True)
    got.update(policy=V4.identity(), sglang="0.5.23", warning=None, where={}, domain_size=domain.config_count(V4),
               sample={"n": 1, "seed": 0})
    text = conform_text(got)
    assert "0 of 1 configs agree, 1 differ (backends 1)" in text
    assert "decode fa3 (policy) vs trtllm (SGLang)" in text
    assert "policy: accepted kv_cache_dtype=bfloat16 prefill=flashmla_sparse decode=fa3" in text
    assert "SGLang: accepted kv_cache_dtype=bfloat16 prefill=flashmla_sparse decode=trtllm" in text
    assert conform_text(got, markdown=True).startswith("### dsa-backends@10 vs SGLang 0.5.23")


def test_conform_exits_2_naming_what_to_install_without_sglang():
    # a Python whose path cannot see SGLang: the report says why and what to install
    env = dict(os.environ, PYTHONNOUSERSITE="1")
    code = ("import sys; sys.modules['sglang'] = None; import importlib.metadata as m; "
            "m.version = lambda name: (_ for _ in ()).throw(m.PackageNotFoundError(name)); "
            "from engine.cli.commands import main; sys.exit(main(['conform', '--sample', '20']))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 2
    assert "SGLang is not installed" in proc.stderr and "pip install --no-deps sglang==0.5.23" in proc.stderr


def test_a_non_dsa_config_runs_on_an_mla_and_an_mha_model():
    dsa = V4.complete({"kv_cache_dtype": "bfloat16"})
    other = V4.complete({"dsa_model": False, "kv_cache_dtype": "mxfp8"})
    assert [c.architecture for c in cases.cases_of(V4, dsa)] == ["DeepseekV32ForCausalLM"]
    launches = cases.cases_of(V4, other)
    assert [c.architecture for c in launches] == ["DeepseekV3ForCausalLM", "LlamaForCausalLM"]
    assert len({c.argv for c in launches}) == 1


def _refused(where):
    return Result(False, "refused", None, (None, None), (), "resolve", where, "RuntimeError")


@pytest.mark.parametrize("mha, counts", [
    # the MHA model refused at a place the version leaves out, for a config the decision says is out of scope
    (_refused("srt/arg_groups/kv_cache_hook.py:31 handle_mxfp8_kv_cache_compatibility"),
     {"agree": 0, "differ": 0, "out_of_scope": 1}),
    # ... and refused anywhere else: a difference, shown on the MHA model's launch
    (_refused("srt/arg_groups/other_hook.py:9 some_gate"), {"agree": 0, "differ": 1, "out_of_scope": 0})])
def test_a_config_counts_once_and_each_model_kind_is_compared(mha, counts):
    config = V4.complete({"dsa_model": False, "kv_cache_dtype": "mxfp8"})
    launches = cases.cases_of(V4, config)
    agreeing = as_result(V4.evaluate(config))
    got = report.compare(V4, [config], [launches], [(agreeing, mha)], sampled=False)
    assert got["counts"] == counts and got["total"] == 1
    example = (got["groups"] or got["out_of_scope"])[0]["example"]
    assert example["architecture"] == "LlamaForCausalLM"
    both = report.compare(V4, [config], [launches], [(agreeing, agreeing)], sampled=False)
    assert both["counts"] == {"agree": 1, "differ": 0, "out_of_scope": 0}
