"""Memoised evaluation: a hit returns a decision equal to a fresh evaluation, shared decisions
cannot be changed by whoever holds one, and no config is ever answered with the decision of a
different config (other types, other spellings, other keys)."""
import enum
from collections import OrderedDict

import pytest

import engine
from engine.policy import memo


@pytest.fixture
def v2():
    policy = engine.load_policy("dsa-backends@2")
    policy.evaluate.memo.clear()
    return policy


def _fresh(policy, config):
    return policy._evaluate(dict(config))  # the compiled evaluator, without the memo


def test_hits_equal_fresh_evaluation_on_the_whole_domain(v2):
    configs = list(v2.domain())
    first = [v2.evaluate(c) for c in configs]
    assert len(v2.evaluate.memo) == len(configs)
    for config, d in zip(configs, first):
        again = v2.evaluate(dict(config))
        assert again is d  # served from the table
        assert again == _fresh(v2, config) == v2.interpret(config)
        assert again.to_dict() == _fresh(v2, config).to_dict()


def test_partial_configs_are_memoised_apart_from_complete_ones(v2):
    a = v2.evaluate({"enable_hisparse": True})
    b = v2.evaluate({"enable_hisparse": True, "kv_cache_dtype": "auto"})
    assert a is not b and a == b  # same decision, different keys: the input as given differs
    assert dict(a.input) == {"enable_hisparse": True}
    assert dict(b.input) == {"enable_hisparse": True, "kv_cache_dtype": "auto"}


def test_a_shared_decision_cannot_be_changed(v2):
    config = {"enable_hisparse": True, "kv_cache_dtype": "fp8_e4m3", "nsa_decode_backend": "flashmla_sparse"}
    d = v2.evaluate(config)
    before = d.to_dict()
    for name in ("ok", "log", "config", "backends", "sources", "violations", "error", "policy", "input"):
        with pytest.raises(AttributeError):
            setattr(d, name, None)
    d.log.append("x")
    d.config["kv_cache_dtype"] = "x"
    d.backends["decode"] = "x"
    d.sources["decode"] = "x"
    d.violations.clear()
    with pytest.raises(TypeError):
        d.input["kv_cache_dtype"] = "x"
    config["kv_cache_dtype"] = "bfloat16"  # the caller's own dict: the shared decision kept a copy
    again = v2.evaluate({"enable_hisparse": True, "kv_cache_dtype": "fp8_e4m3",
                         "nsa_decode_backend": "flashmla_sparse"})
    assert again is d and d.to_dict() == before
    assert d.input["kv_cache_dtype"] == "fp8_e4m3"


@pytest.mark.parametrize("name, good, bad", [
    ("dsa_model", True, 1), ("dsa_model", False, 0), ("dsa_model", True, 1.0),
    ("sm_major", 1, True), ("sm_major", 9, 9.0), ("disable_radix_cache", True, 1),
])
def test_equal_values_of_other_types_are_not_hits(v2, name, good, bad):
    v2.evaluate({name: good})  # memoised
    with pytest.raises(engine.ConfigError) as err:
        v2.evaluate({name: bad})
    assert err.value.problems[0].code == "C503"


def test_enum_members_get_the_decision_of_their_value(v2):
    class Dtype(str, enum.Enum):
        FP8 = "fp8_e4m3"

    class Major(enum.IntEnum):
        BLACKWELL = 10

    plain = v2.evaluate({"kv_cache_dtype": "fp8_e4m3", "sm_major": 10})
    member = v2.evaluate({"kv_cache_dtype": Dtype.FP8, "sm_major": Major.BLACKWELL})
    assert member == plain and member.config["kv_cache_dtype"].__class__ is str
    assert v2.evaluate({"kv_cache_dtype": Dtype.FP8, "sm_major": Major.BLACKWELL}) == plain


def test_other_spellings_and_unknown_keys_never_hit():
    v3 = engine.load_policy("dsa-backends@8")
    canonical = v3.evaluate({"dsa_decode_backend": "flashmla_kv"})
    deprecated = v3.evaluate({"nsa_decode_backend": "flashmla_kv"})  # same length, another key
    assert deprecated.log[0].startswith("'--nsa-decode-backend' is deprecated")
    assert not canonical.log[0].startswith("'--nsa-decode-backend'")
    assert v3.evaluate({"nsa_decode_backend": "flashmla_kv"}).log == deprecated.log
    assert v3.evaluate({"dsa-decode-backend": "flashmla_kv"}) == canonical
    v3.evaluate({"kv_cache_dtype": "auto"})
    for bad in ({"kv_cache_dtyp": "auto"}, {"kv_cache_dtype": "auto", "bogus": 1}, {"bogus": None}):
        with pytest.raises(engine.ConfigError) as err:
            v3.evaluate(bad)
        assert err.value.problems[0].code == "C501"


def test_unhashable_and_hostile_values_get_the_ordinary_errors(v2):
    with pytest.raises(engine.ConfigError) as err:
        v2.evaluate({"kv_cache_dtype": ["fp8_e4m3"]})
    assert err.value.problems[0].code == "C503"

    class Liar:
        def __hash__(self):
            return hash("auto")

        def __eq__(self, other):
            raise RuntimeError("no comparisons")

    v2.evaluate({"kv_cache_dtype": "auto"})
    with pytest.raises(engine.ConfigError):
        v2.evaluate({"kv_cache_dtype": Liar()})


def test_dict_subclasses_and_mappings_take_the_ordinary_path(v2):
    plain = v2.evaluate({"enable_hisparse": True})
    assert v2.evaluate(OrderedDict(enable_hisparse=True)) == plain
    assert len(v2.evaluate.memo) == 1


def test_the_table_is_bounded(v2, monkeypatch):
    monkeypatch.setattr(memo, "MEMO_SIZE", 8)
    for major in range(20):
        d = v2.evaluate({"sm_major": major})
        assert len(v2.evaluate.memo) <= 8
        assert d.config["sm_major"] == major and d == _fresh(v2, {"sm_major": major})
