"""`hisparse diff`: exact counts (checked against SGLang's own code and against direct
evaluation), patterns that describe exactly the changed configs, exit codes."""
import itertools
import json

import pytest

import engine
from engine.analysis.outcomes import CLASSES, minimize
from engine.analysis.diff import diff
from tests.helpers import NSA_ALIASES, load_text, minimal_text, run_cli
from tests.oracles.sglang_reference import domain as reference_domain, route
from engine.analysis import domain


def _oracle_class(a, b):
    """The change classes computed from SGLang's own routing (the transcription)."""
    if a["error"] and not b["error"]:
        return "newly_accepted"
    if not a["error"] and b["error"]:
        return "newly_rejected"
    if not a["error"]:
        if (a["kv_cache_dtype"], a["prefill"], a["decode"]) != (b["kv_cache_dtype"], b["prefill"], b["decode"]):
            return "backend_changed"
        return "log_changed" if a["logs"] != b["logs"] else None
    return "message_changed" if a["error"] != b["error"] else None


def test_v1_to_v2_counts_match_sglang():
    result = diff(engine.load_policy("dsa-backends@1"), engine.load_policy("dsa-backends@2"))
    expected = dict.fromkeys(CLASSES, 0)
    for config in reference_domain():
        cls = _oracle_class(route(1, **config), route(2, **config))
        if cls:
            expected[cls] += 1
    assert result["total"] == 12288
    assert result["counts"] == expected
    assert sum(expected.values()) > 0 and not result["equivalent"]
    assert sum(g["count"] for g in result["groups"]) == sum(expected.values())


def _matches(config, pattern):
    for name, test in pattern.items():
        value = config[name]
        if isinstance(test, dict):
            op, arg = next(iter(test.items()))
            ok = {"in": value in arg, "not_in": value not in arg, "!=": value != arg}[op]
        else:
            ok = value == test and type(value) is type(test)
        if not ok:
            return False
    return True


def test_patterns_describe_exactly_the_changed_configs():
    a, b = engine.load_policy("dsa-backends@1"), engine.load_policy("dsa-backends@2")
    result = diff(a, b)
    for group in result["groups"]:
        hits = 0
        for config in domain.configs(a):
            inside = any(_matches(config, p) for p in group["patterns"])
            da, db = a.evaluate(config), b.evaluate(config)
            if inside:
                hits += 1
                if group["class"] == "newly_accepted":
                    assert not da.ok and db.ok
                elif group["class"] == "message_changed":
                    assert not da.ok and not db.ok and da.error != db.error
                elif group["class"] == "log_changed":
                    assert da.ok and db.ok and da.log != db.log and da.backends == db.backends
        assert hits == group["count"], group["change"]


def test_identical_policies_are_equivalent(capsys):
    code, out, _ = run_cli(capsys, "diff", "dsa-backends@2", "dsa-backends@2")
    assert code == 0
    # both sides are one version: each is labelled by its file too
    assert out.strip() == ("dsa-backends@2 (policies/dsa-backends/v2.yaml) -> dsa-backends@2 "
                           "(policies/dsa-backends/v2.yaml): equivalent on all 12288 configs")


def test_cli_formats_and_exit_codes(capsys):
    code, out, _ = run_cli(capsys, "diff", "dsa-backends@1", "dsa-backends@2", "--format", "json")
    assert code == 1
    result = json.loads(out)
    assert set(result) >= {"equivalent", "total", "counts", "groups", "examples"}
    assert result["equivalent"] is False
    code, out, _ = run_cli(capsys, "diff", "dsa-backends@1", "dsa-backends@2", "--format", "markdown")
    assert code == 1 and out.startswith("### `dsa-backends@1 -> dsa-backends@2`")
    code, out, _ = run_cli(capsys, "diff", "dsa-backends@1", "dsa-backends@2")
    assert len(out.splitlines()) < 40  # a person reads groups, not thousands of configs
    code, _, err = run_cli(capsys, "diff", "dsa-backends@1", "nope@1")
    assert code == 2 and "R601" in err


def test_union_domain_and_config_errors(tmp_path):
    """B adds an input and a value: A is evaluated without the new input, and the new value is a
    config error for A (counted as a rejection there)."""
    a = load_text(tmp_path, minimal_text(), "a.yaml")
    text_b = (minimal_text()
              .replace("values: [bfloat16, fp8_e4m3]", "values: [bfloat16, fp8_e4m3, mxfp8]")
              .replace("          fp8_e4m3: [flashmla_kv]\n", "          fp8_e4m3: [flashmla_kv]\n          mxfp8: [flashmla_kv]\n")
              .replace("  sm_major:\n", "  strict:\n    type: bool\n    default: false\n  sm_major:\n"))
    b = load_text(tmp_path, text_b, "b.yaml")
    result = diff(a, b)
    # domain: 3 dtypes x 2 sm x 2 strict x 3 decode choices
    assert result["total"] == 3 * 2 * 2 * 3
    # mxfp8 is invalid for A: those configs are newly accepted unless B rejects them
    newly = [g for g in result["groups"] if g["class"] == "newly_accepted"]
    assert newly and newly[0]["example"]["a"]["status"] == "error"
    assert newly[0]["example"]["a"]["check"] == "C502"
    # mxfp8 with decode=flashmla_kv, any sm x strict (unset decode gets flashmla_sparse, which B refuses)
    assert result["counts"]["newly_accepted"] == 4


@pytest.mark.parametrize("seed", range(5))
def test_minimize_is_an_exact_cover(seed):
    import random

    rng = random.Random(seed)
    domains = [[0, 1, 2], [True, False], ["a", "b", "c", "d"], [None, 1]]
    every = list(itertools.product(*domains))
    points = [p for p in every if rng.random() < 0.4]
    cubes = minimize(points, domains)
    covered = set()
    for cube in cubes:
        cells = set(itertools.product(*cube))
        assert cells <= set(points)
        covered |= cells
    assert covered == set(points)
    assert len(cubes) <= len(points)


def test_where_restricts_the_domain(capsys):
    a, b = engine.load_policy("dsa-backends@2"), engine.load_policy(NSA_ALIASES)
    result = diff(a, b, where=["enable_hisparse=true", "platform=cuda", "hisparse_device_buffer_size=unset"])
    assert result["where"] == {"enable_hisparse": True, "platform": "cuda", "hisparse_device_buffer_size": None}
    full = diff(a, b)
    assert result["total"] * 2 * 2 * 3 == full["total"]  # hisparse x platform x buffer sizes
    for group in result["groups"]:
        assert group["example"]["config"]["enable_hisparse"] is True
    # GLM-5 on SM12 under HiSparse moved from flashmla_kv to flashinfer_sparse_mla
    moved = [g for g in result["groups"] if g["class"] == "backend_changed"]
    assert moved and all("flashinfer_sparse_mla" in g["change"] for g in moved)
    code, out, _ = run_cli(capsys, "diff", "dsa-backends@2", NSA_ALIASES, "--where", "enable_hisparse=true")
    assert code == 1 and out.startswith("dsa-backends@2 -> nsa-aliases@3 where enable_hisparse=true:")
    code, _, err = run_cli(capsys, "diff", "dsa-backends@2", NSA_ALIASES, "--where", "hisparse=true")
    assert code == 2 and "C501" in err


def _status(policy, config):
    """(accepted, decision or None) of a union-domain config for one policy."""
    cfg = {policy.canonical_key(k): v for k, v in config.items() if policy.canonical_key(k)}
    try:
        d = policy.evaluate(cfg)
    except engine.ConfigError:
        return False, None
    return d.ok, d


def test_v2_to_v3_groups_agree_with_direct_evaluation():
    """Each group's example, evaluated directly on both policies, shows the group's class."""
    a, b = engine.load_policy("dsa-backends@2"), engine.load_policy(NSA_ALIASES)
    result = diff(a, b, where=["dsa_model=true", "enable_hisparse=true"])
    assert result["groups"]
    for group in result["groups"]:
        config = group["example"]["config"]
        (a_ok, da), (b_ok, db) = _status(a, config), _status(b, config)
        cls = group["class"]
        if cls == "newly_accepted":
            assert not a_ok and b_ok
        elif cls == "newly_rejected":
            assert a_ok and not b_ok
        elif cls == "backend_changed":
            assert a_ok and b_ok and (da.backends != db.backends or
                                      da.config["kv_cache_dtype"] != db.config["kv_cache_dtype"])
        elif cls == "message_changed":
            assert not a_ok and not b_ok
        else:
            assert a_ok and b_ok and da.backends == db.backends and da.log != db.log


def test_whole_domain_operations_refuse_an_enormous_domain(capsys, tmp_path, monkeypatch):
    """A policy file cannot make diff or table run for hours: past the limit, exit 2 with a hint."""
    import engine.analysis.domain as d

    monkeypatch.setattr(d, "MAX_CONFIGS", 5000)
    code, _, err = run_cli(capsys, "diff", "dsa-backends@1", "dsa-backends@2")
    assert code == 2 and "C506" in err and "12,288 configs" in err and "--where" in err
    code, _, err = run_cli(capsys, "diff", "dsa-backends@1", "dsa-backends@2", "--where", "dsa_model=true",
                           "--where", "enable_hisparse=true")
    assert code == 1  # restricted to 3,072 configs: runs
    monkeypatch.setattr(d, "MAX_CONFIGS", 2000)  # the v2 table evaluates 192 rows x 15
    code, _, err = run_cli(capsys, "table", "--policy", "dsa-backends@2")
    assert code == 2 and "C506" in err and "2,880 configs" in err
