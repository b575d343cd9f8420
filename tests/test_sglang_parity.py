"""dsa-backends@1 and @2 agree with SGLang (the transcription in sglang_reference.py) on every
config of the reference's input domain, and the compiled evaluator agrees with the interpreter."""
import pytest

import engine
from tests.oracles.sglang_reference import domain, route

DOMAIN = list(domain())


def test_domain_is_the_reference_domain():
    assert len(DOMAIN) == 12288
    for version in (1, 2):
        policy = engine.load_policy(f"dsa-backends@{version}")
        assert policy.domain_size() == 12288
        ours = {tuple(sorted(c.items())) for c in policy.domain()}
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
def test_compiled_evaluator_equals_interpreter(version):
    policy = engine.load_policy(f"dsa-backends@{version}")
    for config in DOMAIN:
        fast, slow = policy.evaluate(config), policy.interpret(config)
        assert fast.outcome() == slow.outcome(), config
        assert fast.sources == slow.sources, config
        assert [v.to_dict() for v in fast.violations] == [v.to_dict() for v in slow.violations], config


# -- version 3: the latest upstream (tests/oracles/sglang_latest_reference.py) ---------------------------
import itertools  # noqa: E402

import tests.oracles.sglang_latest_reference as latest  # noqa: E402

V3_KEYS = ("dsa_model", "enable_hisparse", "kv_cache_dtype", "platform", "sm_major", "disable_radix_cache",
           "dsa_prefill_backend", "dsa_decode_backend")


def _v3_config(c, family_for_other="deepseek_v32"):
    """The oracle's config as the policy's inputs: model_family is only read for DSA models, so a
    non-DSA ("other") model takes either value; --hisparse-config fields become inputs when given
    (host_to_device_ratio is checked by nobody)."""
    out = {k: c[k] for k in V3_KEYS}
    out["model_family"] = c["model_family"] if c["model_family"] != "other" else family_for_other
    if c["top_k"] is not None:
        out["hisparse_top_k"] = c["top_k"]
    if c["device_buffer_size"] is not None:
        out["hisparse_device_buffer_size"] = c["device_buffer_size"]
    return out


def _agree(decision, want):
    if want["error"] is not None:  # the lines logged before the raise, and no other
        return (decision.error, decision.log) == (want["error"], want["logs"])
    got = (decision.ok, decision.config["kv_cache_dtype"], decision.backends["prefill"],
           decision.backends["decode"], decision.log)
    return got == (True, want["kv_cache_dtype"], want["prefill"], want["decode"], want["logs"])


def test_v3_matches_the_latest_upstream_on_its_whole_domain():
    policy = engine.load_policy("dsa-backends@8")
    mismatches, total, rejected = [], 0, 0
    for c in latest.domain():
        total += 1
        want = latest.route(**c)
        rejected += want["error"] is not None
        families = ("deepseek_v32", "glm5") if c["model_family"] == "other" else ("deepseek_v32",)
        for family in families:
            d = policy.evaluate(_v3_config(c, family))
            if not _agree(d, want):
                mismatches.append((c, want, d))
    assert total == 165888 and 0 < rejected < total
    assert not mismatches, f"{len(mismatches)} mismatches, first: {mismatches[:2]}"


def test_v3_deprecated_nsa_spellings_log_like_upstream():
    policy = engine.load_policy("dsa-backends@8")
    n = 0
    for kv, platform, sm, hisparse, prefill, decode in itertools.product(
            latest.KV_CACHE_DTYPES, latest.PLATFORMS, latest.SM_MAJORS, (False, True), latest.CHOICES,
            latest.CHOICES):
        c = dict(kv_cache_dtype=kv, platform=platform, sm_major=sm, enable_hisparse=hisparse,
                 disable_radix_cache=True, nsa_prefill_backend=prefill, nsa_decode_backend=decode)
        want = latest.route(**c)
        d = policy.evaluate({k: v for k, v in c.items() if v is not None})
        assert _agree(d, want), (c, want, d.error, d.log)
        n += 1
    assert n == 8 * 2 * 3 * 2 * 12 * 12


def test_v3_compiled_equals_interpreter_on_a_slice():
    policy = engine.load_policy("dsa-backends@8")
    for i, config in enumerate(policy.domain()):
        if i % 7:  # a seventh of the 331,776 configs keeps this quick
            continue
        fast, slow = policy.evaluate(config), policy.interpret(config)
        assert fast.outcome() == slow.outcome() and fast.sources == slow.sources, config
