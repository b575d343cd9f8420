"""dsa-backends@1 and @2 agree with SGLang (the transcription in sglang_reference.py) on every
config of the reference's input domain, and the bulk evaluator agrees with evaluate."""
import pytest

import engine
from tests.helpers import assert_bulk_equals_evaluate
from tests.oracles.sglang_reference import domain as reference_domain, route
from engine.analysis import domain

DOMAIN = list(reference_domain())


def test_domain_is_the_reference_domain():
    assert len(DOMAIN) == 12288
    for version in (1, 2):
        policy = engine.load_policy(f"dsa-backends@{version}")
        assert domain.config_count(policy) == 12288
        ours = {tuple(sorted(c.items())) for c in domain.configs(policy)}
        assert ours == {tuple(sorted(c.items())) for c in DOMAIN}


@pytest.mark.parametrize("version", [1, 2])
def test_every_config_matches_sglang(version):
    policy = engine.load_policy(f"dsa-backends@{version}")
    mismatches = []
    accepted = rejected = 0
    for config in DOMAIN:
        want = route(version, **config)
        d = policy.evaluate(config)
        if want["error"] is not None:
            rejected += 1
            got = (d.violations[0].message if not d.ok else None, d.log)
            if got != (want["error"], want["logs"]):
                mismatches.append((config, "error", (want["error"], want["logs"]), got))
            continue
        accepted += 1
        got = (d.ok, d.config["kv_cache_dtype"], d.backends["prefill"], d.backends["decode"], d.log)
        expect = (True, want["kv_cache_dtype"], want["prefill"], want["decode"], want["logs"])
        if got != expect:
            mismatches.append((config, "decision", expect, got))
    assert not mismatches, f"{len(mismatches)} mismatches, first: {mismatches[:3]}"
    assert accepted and rejected  # both outcomes are exercised


@pytest.mark.parametrize("version", [1, 2])
def test_bulk_evaluator_equals_evaluate(version):
    policy = engine.load_policy(f"dsa-backends@{version}")
    assert assert_bulk_equals_evaluate(policy, DOMAIN) == len(DOMAIN)


# -- dsa-backends@8 (SGLang 0.5.20) ---------------------------------------------------------------
# Checked against SGLang 0.5.20's own code by `hisparse conform` where that release is installed
# (tests/test_conform_releases.py), and here by its test cases read from that code
# (policies/dsa-backends/tests/v8.yaml); what stays here is that both evaluators agree on it,
# sources and whole violations included (tests/test_domain.py compares the outcomes on every config).
V8 = "dsa-backends@8"


@pytest.mark.parametrize("every", [pytest.param(7, marks=pytest.mark.whole), 61])
def test_v8_bulk_evaluator_equals_evaluate_on_a_slice(every):
    policy = engine.load_policy(V8)
    configs = [config for i, config in enumerate(domain.configs(policy)) if not i % every]
    assert assert_bulk_equals_evaluate(policy, configs) == -(-domain.config_count(policy) // every)
