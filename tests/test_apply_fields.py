"""engine.sglang.apply reads what it is given or refuses it, and writes all or nothing: a mapping
of SGLang's attribute names is read (and written back) like a ServerArgs; None or a scalar is a
ServerArgsError (a TypeError) before anything is read; an object with any field it cannot write
(a read-only property, a frozen dataclass, __slots__ without the name, a failing setter) is left
exactly as it was."""
import dataclasses
import types

import pytest

from engine.sglang import ServerArgsError, apply

FP8_HISPARSE = {"kv_cache_dtype": "fp8_e4m3", "enable_hisparse": True, "disable_radix_cache": True,
                "dsa_prefill_backend": None, "dsa_decode_backend": None}


@pytest.mark.parametrize("target", [None, 5, 2.5, "server_args", b"x", [], ()])
def test_what_is_not_a_server_args_is_refused(target):
    with pytest.raises(ServerArgsError, match="a mapping of its attribute names, got") as info:
        apply(target)
    assert isinstance(info.value, TypeError)


def test_a_mapping_is_read_and_written_back():
    args = dict(FP8_HISPARSE)
    decision = apply(args)
    assert decision.ok and decision.config["kv_cache_dtype"] == "fp8_e4m3"
    assert args["dsa_decode_backend"] == "flashmla_kv" and args["dsa_prefill_backend"] == "flashmla_kv"
    refused = dict(FP8_HISPARSE, disable_radix_cache=False)
    with pytest.raises(AssertionError, match="disable-radix-cache"):  # read, so refused as SGLang does
        apply(refused)
    assert refused == dict(FP8_HISPARSE, disable_radix_cache=False)
    bf16 = {"kv_cache_dtype": "bfloat16", "enable_hisparse": True, "disable_radix_cache": True,
            "dsa_decode_backend": "flashmla_kv"}
    with pytest.raises(ValueError):  # the mapping decides, not the policy's defaults
        apply(bf16)


def test_a_read_only_mapping_is_read_and_refused_for_writing():
    view = types.MappingProxyType(dict(FP8_HISPARSE))
    with pytest.raises(ServerArgsError, match="read-only mapping"):
        apply(view)
    assert dict(view) == FP8_HISPARSE


class ReadOnlyDecode:
    def __init__(self):
        for k, v in FP8_HISPARSE.items():
            if k != "dsa_decode_backend":
                setattr(self, k, v)

    @property
    def dsa_decode_backend(self):
        return None


@dataclasses.dataclass(frozen=True)
class Frozen:
    kv_cache_dtype: str = "fp8_e4m3"
    enable_hisparse: bool = True
    disable_radix_cache: bool = True
    dsa_prefill_backend: str | None = None
    dsa_decode_backend: str | None = None


class FailingSetter:
    def __init__(self):
        self.__dict__.update(FP8_HISPARSE)

    def __setattr__(self, name, value):
        if name == "dsa_prefill_backend" and value is not None:
            raise RuntimeError("refused by a validator")
        object.__setattr__(self, name, value)


@pytest.mark.parametrize("make", [ReadOnlyDecode, Frozen, FailingSetter])
def test_nothing_is_written_unless_everything_can_be(make):
    target = make()
    before = {k: getattr(target, k) for k in FP8_HISPARSE}
    with pytest.raises(ServerArgsError, match="nothing was written"):
        apply(target)
    assert {k: getattr(target, k) for k in FP8_HISPARSE} == before


def _policy_file(tmp_path, text: str) -> str:
    path = tmp_path / "edited.yaml"
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_the_exception_raised_is_the_rules_raises_not_its_name(tmp_path):
    """`raises` is policy data: renaming the radix-cache check keeps its AssertionError, and
    taking `raises` away makes the same check a ValueError."""
    import engine

    shipped = open(engine.load_policy("dsa-backends").path, encoding="utf-8").read()
    assert "    - name: hisparse-radix-cache\n      raises: AssertionError" in shipped
    renamed = shipped.replace("- name: hisparse-radix-cache\n", "- name: radix-cache-renamed\n", 1)
    refused = dict(FP8_HISPARSE, disable_radix_cache=False)
    with pytest.raises(AssertionError, match="disable-radix-cache"):
        apply(dict(refused), _policy_file(tmp_path, renamed))
    plain = shipped.replace("    - name: hisparse-radix-cache\n      raises: AssertionError  # a bare assert in SGLang\n",
                            "    - name: hisparse-radix-cache\n", 1)
    assert plain != shipped
    with pytest.raises(ValueError, match="disable-radix-cache") as info:
        apply(dict(refused), _policy_file(tmp_path, plain))
    assert not isinstance(info.value, AssertionError)
    decision = engine.load_policy(_policy_file(tmp_path, plain)).evaluate(refused)
    assert decision.violations[0].raises == "ValueError" and decision.to_dict()["violations"][0]["raises"] == "ValueError"


def test_raises_needs_a_rule_that_can_refuse(tmp_path):
    import engine

    shipped = open(engine.load_policy("dsa-backends").path, encoding="utf-8").read()
    bad = shipped.replace("    - name: auto-dtype-fp8\n", "    - name: auto-dtype-fp8\n      raises: AssertionError\n", 1)
    assert bad != shipped
    with pytest.raises(engine.PolicyError) as info:
        engine.load_policy(_policy_file(tmp_path, bad))
    assert "raises" in str(info.value)
    wrong = shipped.replace("raises: AssertionError  # a bare assert in SGLang", "raises: KeyError", 1)
    with pytest.raises(engine.PolicyError) as info:
        engine.load_policy(_policy_file(tmp_path, wrong))
    assert "raises" in str(info.value) and "KeyError" in str(info.value)
