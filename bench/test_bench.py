"""The bench's own checks, beside the code they check (tests/ never imports bench; pytest collects
both folders): the decision-cost benchmark's flat baseline decides exactly what dsa-backends@2
decides, so the comparison measures the cost of the same work; a quick run never writes over the
committed results."""
import os

import engine
from bench.common import ROOT
from bench.flat_v2 import decide
from engine.analysis import domain


def read(name):
    with open(os.path.join(ROOT, name), encoding="utf-8") as fh:
        return fh.read()


def test_flat_baseline_equals_the_policy_on_the_whole_v2_domain():
    policy = engine.load_policy("dsa-backends@2")
    configs = list(domain.configs(policy))
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
    policy = engine.load_policy("dsa-backends@2")
    d = policy.evaluate({})
    assert decide({}) == (d.ok, d.config["kv_cache_dtype"], d.backends["prefill"], d.backends["decode"],
                          (), tuple(d.log))


def test_a_quick_bench_never_writes_the_committed_results(tmp_path, monkeypatch):
    """`make bench-quick` (python -m bench --quick) writes bench/results-quick/, which git ignores;
    the README's figures come from bench/results/, which only a full run replaces."""
    from bench import common

    committed, quick = tmp_path / "results", tmp_path / "results-quick"
    monkeypatch.setattr(common, "_output", common._output)  # put back after the test
    monkeypatch.setattr(common, "RESULTS", str(committed))
    monkeypatch.setattr(common, "QUICK_RESULTS", str(quick))
    common.use_output(True)
    try:
        path = common.write_result("engine", {"x": 1}, {}, quick=True)
        assert path == str(quick / "engine.json") and not committed.exists()
        assert common.output_dir() == str(quick)
    finally:
        common.use_output(False)
    assert common.write_result("engine", {"x": 1}, {}, quick=True).startswith(str(quick))
    assert "bench/results-quick/" in read(".gitignore").split()
    assert "bench --quick" in read("Makefile")
