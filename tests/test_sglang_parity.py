"""nsa-backends@1 and @2 agree with SGLang (the transcription in sglang_reference.py) on every
config of the reference's input domain, and the compiled evaluator agrees with the interpreter."""
import pytest

import engine
from sglang_reference import domain, route

DOMAIN = list(domain())


def test_domain_is_the_reference_domain():
    assert len(DOMAIN) == 12288
    for version in (1, 2):
        policy = engine.load_policy(f"nsa-backends@{version}")
        assert policy.domain_size() == 12288
        ours = {tuple(sorted(c.items())) for c in policy.domain()}
        assert ours == {tuple(sorted(c.items())) for c in DOMAIN}


@pytest.mark.parametrize("version", [1, 2])
def test_every_config_matches_sglang(version):
    policy = engine.load_policy(f"nsa-backends@{version}")
    mismatches = []
    accepted = rejected = 0
    for config in DOMAIN:
        want = route(version, **config)
        d = policy.evaluate(config)
        if want["error"] is not None:
            rejected += 1
            got = d.violations[0].message if not d.ok else None
            if got != want["error"]:
                mismatches.append((config, "error", want["error"], got))
            continue
        accepted += 1
        got = (d.ok, d.config["kv_cache_dtype"], d.backends["prefill"], d.backends["decode"], d.log)
        expect = (True, want["kv_cache_dtype"], want["prefill"], want["decode"], want["logs"])
        if got != expect:
            mismatches.append((config, "decision", expect, got))
    assert not mismatches, f"{len(mismatches)} mismatches, first: {mismatches[:3]}"
    assert accepted and rejected  # both outcomes are exercised


@pytest.mark.parametrize("version", [1, 2])
def test_compiled_evaluator_equals_interpreter(version):
    policy = engine.load_policy(f"nsa-backends@{version}")
    for config in DOMAIN:
        fast, slow = policy.evaluate(config), policy.interpret(config)
        assert fast.outcome() == slow.outcome(), config
        assert fast.sources == slow.sources, config
        assert [v.to_dict() for v in fast.violations] == [v.to_dict() for v in slow.violations], config
