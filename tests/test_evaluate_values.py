"""Evaluating configs as given: a decision cannot be changed by whoever holds one, and no config is
answered with the decision of a different config (values of other types, enum members, other
spellings, other keys, hostile values, other mappings)."""
import enum
from collections import OrderedDict

import pytest

import engine
from tests.helpers import NSA_ALIASES


@pytest.fixture
def v2():
    return engine.load_policy("dsa-backends@2")


def test_partial_and_complete_configs_decide_alike_and_keep_their_input(v2):
    a = v2.evaluate({"enable_hisparse": True})
    b = v2.evaluate({"enable_hisparse": True, "kv_cache_dtype": "auto"})
    assert a == b and a.to_dict() == b.to_dict()  # the same decision; only the input as given differs
    assert dict(a.input) == {"enable_hisparse": True}
    assert dict(b.input) == {"enable_hisparse": True, "kv_cache_dtype": "auto"}


def test_a_decision_cannot_be_changed(v2):
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
    assert d.to_dict() == before
    again = v2.evaluate(config)
    assert again == d and again.to_dict() == before


@pytest.mark.parametrize("name, good, bad", [
    ("dsa_model", True, 1), ("dsa_model", False, 0), ("dsa_model", True, 1.0),
    ("sm_major", 1, True), ("sm_major", 9, 9.0), ("disable_radix_cache", True, 1),
])
def test_equal_values_of_other_types_are_refused(v2, name, good, bad):
    v2.evaluate({name: good})
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


def test_other_spellings_and_unknown_keys_are_told_apart():
    v3 = engine.load_policy(NSA_ALIASES)  # a policy with deprecated spellings
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


def test_dict_subclasses_and_mappings_decide_as_dicts(v2):
    plain = v2.evaluate({"enable_hisparse": True})
    assert v2.evaluate(OrderedDict(enable_hisparse=True)) == plain
    assert v2.evaluate(OrderedDict(enable_hisparse=True)).to_dict() == plain.to_dict()
