"""The MiniMax-M3 family (policies/minimax-m3-backends/) and what the engine needed for it: conform
compares a family's prefill and decode on its own fields (prefill_attention_backend,
decode_attention_backend), not on the DSA ones; a rule may say SGLang raises RuntimeError (its KV4
platform checks); an input read only by a leaves_out `when` (or an `applies`) is not unused (L405);
and the policy side of conform (launches, comparison) on M3 configs, without SGLang."""
import dataclasses
import glob
import os
import re

import pytest

import engine
from engine.analysis.lint import lint
from engine.sglang.conform import cases, report
from engine.sglang.conform.protocol import Result
from engine.sglang.server_args import raise_refusal
from tests.helpers import ROOT, load_text, minimal_text, run_cli
from engine.analysis import domain

FAMILY = "minimax-m3-backends"
VERSIONS = {1: "0.5.21", 2: "0.5.22", 3: "0.5.23"}
WHEELS = os.path.expanduser("~/.cache/hisparse/sglang-envs/wheels")


def policy(version=3):
    return engine.load_policy(f"{FAMILY}@{version}")


def as_result(p, decision, case) -> Result:
    """What SGLang reports when it does what the decision says: the DSA fields unset (an M3 launch
    never sets them), the fields the case reads as the decision has them."""
    values = tuple((f, decision.config[f]) for f in case.reads)
    return Result(decision.ok, decision.error, decision.config["kv_cache_dtype"], (None, None),
                  tuple(decision.log), "done" if decision.ok else "resolve", None,
                  None if decision.ok else decision.violations[0].raises, values)


def compare_one(p, config, result=None):
    config = p.complete(config)
    case = cases.case_of(p, config)
    result = result or as_result(p, p.evaluate(config), case)
    return report.compare(p, [config], [case], [result], sampled=True)


# -- the engine ------------------------------------------------------------------------------------
def test_prefill_and_decode_are_compared_on_the_familys_own_fields():
    p = policy()
    config = {"sm_major": 12, "kv_cache_dtype": "nvfp4"}
    d = p.evaluate(config)
    assert d.ok and d.backends == {"attention": "flashinfer", "prefill": "flashinfer", "decode": "trtllm_mha"}
    case = cases.case_of(p, p.complete(config))
    assert {"attention_backend", "prefill_attention_backend", "decode_attention_backend", "page_size",
            "prefill_kv_cache_dequant_dtype", "moe_runner_backend"} <= set(case.reads)
    assert compare_one(p, config)["counts"]["agree"] == 1  # the DSA fields (None, None) are not read
    right = as_result(p, d, case)
    values = tuple((f, "trtllm_mha" if f == "prefill_attention_backend" else v) for f, v in right.values)
    got = compare_one(p, config, dataclasses.replace(right, values=values))
    (group,) = got["groups"]
    assert group["fields"] == ["backends"] and group["change"] == "prefill flashinfer (policy) vs trtllm_mha (SGLang)"
    values = tuple((f, 128 if f == "page_size" else v) for f, v in right.values)
    (group,) = compare_one(p, config, dataclasses.replace(right, values=values))["groups"]
    assert group["fields"] == ["values"] and group["change"] == "page_size 64 (policy) vs 128 (SGLang)"


def test_a_rule_may_say_sglang_raises_runtime_error():
    p = policy()
    d = p.evaluate({"platform": "hip", "kv_cache_dtype": "fp4_mx_block16"})
    assert not d.ok and d.error == "KV4 is not tested on non-CUDA platforms."
    assert d.violations[0].raises == "RuntimeError"
    with pytest.raises(RuntimeError, match="KV4 is not tested"):
        raise_refusal(d)
    config = {"platform": "hip", "kv_cache_dtype": "fp4_mx_block16"}
    assert compare_one(p, config)["counts"]["agree"] == 1
    case = cases.case_of(p, p.complete(config))
    other = dataclasses.replace(as_result(p, d, case), error_type="ValueError")
    (group,) = compare_one(p, config, other)["groups"]
    assert group["fields"] == ["exception"]


def test_runtime_error_is_a_schema_value_and_nothing_else_new(tmp_path):
    text = minimal_text().replace("resolve:\n  rules: []", """resolve:
  rules:
    - name: no-fp8
      raises: RuntimeError
      require: {kv_cache_dtype: bfloat16}
      message: no FP8 here""")
    d = load_text(tmp_path, text).evaluate({"kv_cache_dtype": "fp8_e4m3"})
    assert d.violations[0].raises == "RuntimeError"
    with pytest.raises(engine.PolicyError, match="raises"):
        load_text(tmp_path, text.replace("RuntimeError", "TypeError"), "other.yaml")


LEFT_OUT = minimal_text().replace("description: A small valid policy the bad fixtures are derived from.", """\
description: An input that only says which configs are out of scope.
upstream:
  project: sglang
  releases: [0.5.23]
  note: a test
  leaves_out:
    - where: srt/arg_groups/speculative_hook.py
      why: speculative decoding
      when: {speculative_algorithm: {set: true}}""").replace("inputs:\n", """inputs:
  speculative_algorithm: {type: str, values: [EAGLE], default: null, nullable: true}
""")


def test_an_input_read_only_by_a_scope_condition_is_not_unused(tmp_path):
    p = load_text(tmp_path, LEFT_OUT)
    assert not p.evaluate({"speculative_algorithm": "EAGLE"}).in_scope
    assert [x.code for x in lint(p)[0]] == []
    unread = LEFT_OUT.replace("      when: {speculative_algorithm: {set: true}}\n", "")
    assert [x.code for x in lint(load_text(tmp_path, unread, "unread.yaml"))[0]] == ["L405"]
    applies = unread.replace("default: null, nullable: true}",
                             "default: null, nullable: true}\n  other: {type: bool, default: false, "
                             "applies: {speculative_algorithm: null}}")
    codes = [x.code for x in lint(load_text(tmp_path, applies, "applies.yaml"))[0]]
    assert codes == ["L405"]  # other is read by no one; speculative_algorithm by other's applies


# -- the family ------------------------------------------------------------------------------------
def test_one_version_per_release_routing_minimax_m3_only():
    assert sorted(engine.list_families()[FAMILY]) == [1, 2, 3]
    for version, release in VERSIONS.items():
        p = policy(version)
        assert p.upstream.releases == (release,) or list(p.upstream.releases) == [release]
        assert p.models == ("minimax_m3",) or list(p.models) == ["minimax_m3"]


def test_check_reports_no_problem(capsys):
    code, out, _ = run_cli(capsys, "check", os.path.join(ROOT, "policies", FAMILY))
    assert code == 0 and "0 problem(s)" in out, out


def test_the_policy_tests_pass(capsys):
    for version in VERSIONS:
        path = os.path.join(ROOT, "policies", FAMILY, "tests", f"v{version}.yaml")
        code, out, err = run_cli(capsys, "test", path)
        assert code == 0, out + err


@pytest.mark.parametrize("config, argv, env, platform", [
    ({}, (), (("SGLANG_DISABLE_M3_FP8_ATTN_GEMM", "False"),), "cuda"),
    ({"platform": "npu", "attention_backend": "fa3", "page_size": 256}, ("--page-size", "256", "--attention-backend", "fa3"),
     (("SGLANG_DISABLE_M3_FP8_ATTN_GEMM", "False"),), "npu"),
    ({"sm_major": 10, "kv_cache_dtype": "fp8_e4m3", "sglang_disable_m3_fp8_attn_gemm": True},
     ("--kv-cache-dtype", "fp8_e4m3"), (("SGLANG_DISABLE_M3_FP8_ATTN_GEMM", "True"),), "cuda"),
    ({"platform": "hip", "sglang_aiter_kv_cache_layout": "vectorized_5d"}, (),
     (("SGLANG_AITER_KV_CACHE_LAYOUT", "vectorized_5d"), ("SGLANG_DISABLE_M3_FP8_ATTN_GEMM", "False")), "hip"),
    ({"enable_hisparse": True, "disable_radix_cache": True, "hisparse_swap_in_block_size": 0},
     ("--enable-hisparse", "--disable-radix-cache", "--hisparse-config", '{"swap_in_block_size":0}'),
     (("SGLANG_DISABLE_M3_FP8_ATTN_GEMM", "False"),), "cuda"),
])
def test_a_config_is_the_launch_an_operator_types(config, argv, env, platform):
    p = policy()
    case = cases.case_of(p, p.complete(config))
    assert case.argv == argv and case.env == env and case.platform == platform
    assert case.architecture == "MiniMaxM3SparseForCausalLM" and case.routing == "minimax_m3"


def test_sm_major_means_nothing_off_cuda():
    p = policy()
    assert "sm_major" in p.evaluate({"platform": "hip"}).not_applicable
    assert "sm_major" not in p.evaluate({"platform": "cuda"}).not_applicable


@pytest.mark.parametrize("version", sorted(VERSIONS))
def test_what_is_left_out_is_out_of_scope(version):
    p = policy(version)
    for config in ({"speculative_algorithm": "EAGLE"}, {"enable_deterministic_inference": True},
                   {"quantization": "fp8"}, {"moe_runner_backend": "flashinfer_trtllm"},
                   {"sglang_skip_softmax_prefill_threshold_scale_factor": "0.5"}, {"ep_size": 8}):
        assert not p.evaluate(config).in_scope, config
    assert all(p.evaluate(c).in_scope for c in domain.configs(p))


def _cited(text):
    """(path, function or None) of each sglang source file a policy file names: srt/... paths,
    with the function in parentheses or after a colon."""
    for m in re.finditer(r"(srt/[\w/]+\.py)(?::(\w+)|\s*\(([^)]*)\))?", text):
        funcs = [m.group(2)] if m.group(2) else re.findall(r"\b_?[a-z][a-z0-9_]+\b", m.group(3) or "")
        yield m.group(1), [f for f in funcs if f not in ("from", "the", "order", "of")]


@pytest.mark.parametrize("version", sorted(VERSIONS))
def test_cited_sglang_code_is_in_the_wheel_of_the_release(version):
    """Every sglang file a version cites, and each function named with it, is in that release's
    wheel (unpacked under ~/.cache/hisparse/sglang-envs/wheels/<release>/sglang)."""
    root = os.path.join(WHEELS, VERSIONS[version], "sglang")
    if not os.path.isdir(root):
        pytest.skip(f"no unpacked SGLang {VERSIONS[version]} wheel here")
    missing = []
    for path in [os.path.join(ROOT, "policies", FAMILY, f"v{version}.yaml"),
                 os.path.join(ROOT, "policies", FAMILY, "tests", f"v{version}.yaml")]:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
        for file, funcs in _cited(text):
            source = os.path.join(root, file)
            if not os.path.isfile(source):
                missing.append(f"{os.path.basename(path)}: {file}")
                continue
            with open(source, encoding="utf-8") as fh:
                code = fh.read()
            missing += [f"{os.path.basename(path)}: {file}:{f}" for f in funcs if f"def {f}(" not in code]
    assert not missing, missing
