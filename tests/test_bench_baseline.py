"""The decision-cost benchmark's flat baseline decides exactly what nsa-backends@2 decides, so
the comparison measures the cost of the same work."""
import engine
from bench.flat_v2 import decide


def test_flat_baseline_equals_the_policy_on_the_whole_v2_domain():
    policy = engine.load_policy("nsa-backends@2")
    configs = list(policy.domain())
    assert len(configs) == 12288
    outcomes = set()
    for config in configs:
        d = policy.evaluate(config)
        want = (d.ok, d.config["kv_cache_dtype"], d.backends["prefill"], d.backends["decode"],
                tuple(v.message for v in d.violations), tuple(d.log))
        assert decide(config) == want, config
        outcomes.add(want)
    assert len(outcomes) > 500  # the domain exercises many distinct outcomes, not one


def test_flat_baseline_reads_missing_inputs_as_the_policy_defaults():
    policy = engine.load_policy("nsa-backends@2")
    d = policy.evaluate({})
    assert decide({}) == (d.ok, d.config["kv_cache_dtype"], d.backends["prefill"], d.backends["decode"],
                          (), tuple(d.log))
