"""`hisparse table`: rows that partition the domain and agree with direct evaluation."""
import itertools
import json

import pytest

import engine
from engine.analysis.domain import parse_where
from engine.analysis.table import routing_rows
from tests.helpers import run_cli


def _inside(config, when):
    return all(config[name] in values for name, values in when.items())


@pytest.mark.parametrize("ref, where", [
    ("dsa-backends@2", ["dsa_model=true", "disable_radix_cache=true"]),
    ("dsa-backends@1", []),
    ("dsa-backends@10", ["dsa_model=true", "disable_radix_cache=true", "hisparse_device_buffer_size=unset"]),
    ("syn-c", []),  # checks at defaults, a phase accepting fewer backends
    ("syn-c", ["p_backend=x"]),
])
def test_rows_partition_the_domain_and_match_evaluation(ref, where, tmp_path):
    if ref == "syn-c":
        from tests.helpers import load_text
        from tests.test_domain import SYN_C

        policy = load_text(tmp_path, SYN_C)
    else:
        policy = engine.load_policy(ref)
    fixed = parse_where(policy, where)
    result = routing_rows(policy, fixed)
    axes = result["axes"]
    domains = [policy.inputs[a].domain() for a in axes]
    for combo in itertools.product(*domains):
        config = dict(fixed, **dict(zip(axes, combo)))
        rows = [r for r in result["rows"] if _inside(config, r["when"])]
        assert len(rows) == 1, config  # every config is in exactly one row
        row = rows[0]
        d = policy.evaluate(config)
        if d.ok:
            assert row["defaults"] == d.backends and row["rejected"] is None
        else:
            assert row["rejected"] == d.error
        for phase, spec in policy.phases.items():
            # every backend the policy declares: one the phase does not accept is a config error
            allowed = []
            for b in policy.backends:
                try:
                    if policy.evaluate(dict(config, **{spec.input: b})).ok:
                        allowed.append(b)
                except engine.ConfigError:
                    assert b not in spec.backends
            assert row["allowed"][phase] == allowed


def test_hisparse_rows_of_v2():
    policy = engine.load_policy("dsa-backends@2")
    result = routing_rows(policy, parse_where(policy, ["dsa_model=true", "disable_radix_cache=true",
                                                       "enable_hisparse=true", "platform=cuda", "sm_major=9"]))
    by_dtype = {}
    for r in result["rows"]:
        for dtype in r["when"].get("kv_cache_dtype", policy.inputs["kv_cache_dtype"].values):
            by_dtype[dtype] = r
    assert by_dtype["fp8_e4m3"]["defaults"] == {"prefill": "flashmla_kv", "decode": "flashmla_kv"}
    assert by_dtype["fp8_e4m3"]["allowed"] == {"prefill": ["flashmla_kv"], "decode": ["flashmla_kv"]}
    assert by_dtype["bfloat16"]["defaults"] == {"prefill": "flashmla_sparse", "decode": "flashmla_sparse"}
    assert by_dtype["fp8_e5m2"]["rejected"].startswith("DeepSeek DSA only supports")


def test_cli(capsys):
    code, out, _ = run_cli(capsys, "table", "--policy", "dsa-backends@2", "--where", "dsa_model=true",
                           "--format", "markdown")
    assert code == 0 and "| enable_hisparse |" in out
    code, out, _ = run_cli(capsys, "table", "--policy", "dsa-backends@2", "--format", "json")
    assert json.loads(out)["rows"]
    code, _, err = run_cli(capsys, "table", "--where", "dsa_modle=true")
    assert code == 2 and "did you mean 'dsa_model'?" in err
    code, _, err = run_cli(capsys, "table", "--where", "sm_major=x")
    assert code == 2 and "C503" in err


@pytest.mark.parametrize("ref", ["dsa-backends@4", "dsa-backends@10"])
def test_rows_in_scope_come_first_and_the_rest_are_marked(ref, capsys):
    policy = engine.load_policy(ref)
    where = ["disable_radix_cache=true", "kv_cache_dtype=bfloat16"] + (
        ["hisparse_device_buffer_size=unset", "sm_major=9"] if ref.endswith("@10") else [])
    rows = routing_rows(policy, parse_where(policy, where))["rows"]
    scopes = [r["in_scope"] for r in rows]
    assert scopes[0] and not scopes[-1] and scopes == sorted(scopes, reverse=True), scopes
    code, out, _ = run_cli(capsys, "table", "--policy", ref, *[f"--where={w}" for w in where])
    blocks = out.split("\n\n")[1:]
    marked = ["  out of scope (" in b for b in blocks if not b.startswith("out (")]
    assert code == 0 and not marked[0] and marked[-1] and marked == sorted(marked), marked
