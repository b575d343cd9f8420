"""The SGLang plugin on MiniMax-M3 launches (engine/sglang/m3_hooks.py), in-process against SGLang
0.5.23's own code: registered by its entry point, applied by SGLang's HookRegistry, the provider
replaced in SGLang's model-override registry.

- With the shipped policies of the release (`sglang==0.5.23`), M3 launches come out as SGLang's own
  code makes them: accepted and refused alike, with the same messages, exception types, resolved
  fields and log lines (WARNING and the provider's INFO lines), over a sample of the M3 family's
  declared domain.
- An edited copy routes the launch (M3 on Hopper with HiSparse on another attention backend). An
  edit the plugin cannot enforce (a rule of SGLang's own code it does not replace) stops the launch
  naming the difference.
- The provider, called by itself as SGLang's registry calls it, answers as SGLang's own: the same
  declarations, exceptions, log lines and environment writes.

Skipped where SGLang 0.5.23 is not importable (`make install` installs it)."""
from __future__ import annotations

import contextlib
import logging
import os
import sys
from types import SimpleNamespace

import pytest

import engine
from tests.helpers import plugin_active

FAMILY = "minimax-m3-backends"
RELEASE_REF = "sglang==0.5.23"
M3_MODULE = "sglang.srt.arg_groups.model_overrides.minimax_m3"
ARCHS = ("MiniMaxM3SparseForCausalLM", "MiniMaxM3SparseForConditionalGeneration")


@pytest.fixture(scope="module")
def sglang_0523():
    from engine.sglang.conform.drivers import installed_sglang

    version, reason = installed_sglang()
    if version != "0.5.23":
        pytest.skip(f"needs SGLang 0.5.23: {reason}")
    from engine.sglang.conform import pipeline as driver

    driver.import_sglang()
    driver.load()
    return driver


def _edited(tmp_path, edits) -> str:
    shipped = engine.load_policy(f"{FAMILY}@3")
    text = open(shipped.file, encoding="utf-8").read()
    for old, new in edits:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    folder = tmp_path / FAMILY
    folder.mkdir(exist_ok=True)
    path = folder / "v3.yaml"
    path.write_text(text, encoding="utf-8")
    return str(path)


# M3 on Hopper: trtllm_mha instead of fa3 (an attention backend SGLang allows there), page 64
TRTLLM_ON_HOPPER = [
    ("      when: {platform: cuda, sm_major: 9, attention_backend: null, prefill_attention_backend: null,\n"
     "             decode_attention_backend: null}\n      set: {attention_backend: fa3}",
     "      when: {platform: cuda, sm_major: 9, attention_backend: null, prefill_attention_backend: null,\n"
     "             decode_attention_backend: null}\n      set: {attention_backend: trtllm_mha}"),
]


def _case(policy, **config):
    from engine.sglang.conform.cases import case_of

    return case_of(policy, policy.complete(config))


@contextlib.contextmanager
def info_lines():
    """The provider's own log records at INFO and above (conform compares WARNING lines only)."""
    records = []
    handler = logging.Handler(logging.INFO)
    handler.emit = records.append
    log = logging.getLogger(M3_MODULE)
    level = log.level
    log.setLevel(logging.INFO)
    log.addHandler(handler)
    try:
        yield records
    finally:
        log.removeHandler(handler)
        log.setLevel(level)


def _lines(records) -> list:
    return [(r.levelname, r.funcName, r.getMessage()) for r in records if not r.getMessage().startswith("hisparse-router:")]


def _run(driver, case):
    with info_lines() as records:
        result = driver.run_case(case)
    return result, _lines(records)


def test_the_shipped_policies_drive_m3_launches_as_sglangs_own_code(sglang_0523, monkeypatch):
    from engine.sglang.conform.cases import case_of
    from engine.sglang.conform.sample import configs_of

    policy = engine.load_policy(f"{FAMILY}@3")
    configs, _ = configs_of(policy, n=300, seed=7)
    cases = list(dict.fromkeys(case_of(policy, c) for c in configs))
    native = [_run(sglang_0523, c) for c in cases]
    with plugin_active(monkeypatch, RELEASE_REF):
        routed = [_run(sglang_0523, c) for c in cases]
    assert sum(r.ok for r, _ in native) > 50 and sum(not r.ok for r, _ in native) > 30
    assert sum(bool(lines) for _, lines in native) > 50
    for case, (a, a_lines), (b, b_lines) in zip(cases, native, routed):
        assert (b.ok, b.error_type, b.message, b.log) == (a.ok, a.error_type, a.message, a.log), case
        assert (b.kv_cache_dtype, b.values) == (a.kv_cache_dtype, a.values), case
        assert b_lines == a_lines, case


def test_the_provider_is_replaced_in_sglangs_registry(sglang_0523, monkeypatch):
    from sglang.srt.arg_groups import model_override_base
    from sglang.srt.arg_groups.overrides import collect_model_override_declarations

    original = sys.modules[M3_MODULE]._minimax_m3_overrides
    with plugin_active(monkeypatch, RELEASE_REF):
        for arch in ARCHS:
            (entry,) = [fn for fn in model_override_base._MODEL_OVERRIDE_FNS[arch]
                        if getattr(fn, "__wrapped__", None) is original]
            assert entry.__qualname__ == "_minimax_m3_overrides" and original not in \
                model_override_base._MODEL_OVERRIDE_FNS[arch]
        calls = []
        module = sys.modules[M3_MODULE]
        replaced = module._minimax_m3_overrides
        module._minimax_m3_overrides = lambda *a: calls.append(a) or replaced(*a)
        args = _args(attention_backend=None)
        hf = SimpleNamespace(architectures=[ARCHS[0]], quantization_config=None)
        from engine.sglang.conform.machine import faked_gpu

        try:
            with faked_gpu("cuda", (9, 0)):
                assert collect_model_override_declarations(ARCHS[0], args, hf) == [
                    ("_minimax_m3_overrides", {"attention_backend": "fa3", "page_size": 128,
                                               "moe_runner_backend": "triton"})]
        finally:
            module._minimax_m3_overrides = replaced
        assert len(calls) == 1  # the registry called the module's (replaced) function
    assert original in model_override_base._MODEL_OVERRIDE_FNS[ARCHS[0]]


def test_an_edited_policy_routes_m3_on_hopper_with_hisparse(sglang_0523, monkeypatch, tmp_path):
    """M3 on SM90 with HiSparse: SGLang's own fa3 page 128; the copy's trtllm_mha, whose unset page
    size SGLang's own TensorRT-LLM MHA step then sets to 64 with its line; the provider's Hopper line
    says what it declared."""
    policy = engine.load_policy(f"{FAMILY}@3")
    edited = _edited(tmp_path, TRTLLM_ON_HOPPER)
    case = _case(policy, enable_hisparse=True, disable_radix_cache=True)
    native = _run(sglang_0523, case)
    with plugin_active(monkeypatch, edited):
        routed = _run(sglang_0523, case)
    assert native[0].ok and dict(native[0].values)["attention_backend"] == "fa3"
    assert dict(native[0].values)["page_size"] == 128
    assert routed[0].ok, routed[0].message
    assert dict(routed[0].values)["attention_backend"] == "trtllm_mha"
    assert dict(routed[0].values)["page_size"] == 64
    assert ("INFO", "_minimax_m3_overrides", "MiniMax-M3 on Hopper: attention_backend=trtllm_mha, page_size=None "
            "(MSA is SM100-only; sparse attention runs on the Triton path).") in routed[1]
    assert routed[0].log == ("TensorRT-LLM MHA only supports page_size of 16, 32, 64 or 128, changing page_size "
                             "from None to 64.",)


def test_an_edit_of_sglangs_own_code_stops_the_launch_naming_it(sglang_0523, monkeypatch, tmp_path):
    """The copy drops the radix-cache check, which lives in SGLang's own validate_hisparse (not
    replaced): the launch stops saying what differs; a launch it decides as SGLang runs."""
    policy = engine.load_policy(f"{FAMILY}@3")
    edited = _edited(tmp_path, [("      require: {disable_radix_cache: true}\n",
                                 "      require: {disable_radix_cache: {in: [true, false]}}\n")])
    radix = _case(policy, enable_hisparse=True)
    plain = _case(policy, enable_hisparse=True, disable_radix_cache=True)
    with plugin_active(monkeypatch, edited):
        stopped, ran = sglang_0523.run_case(radix), sglang_0523.run_case(plain)
    assert not stopped.ok and stopped.error_type == "NotEnforceable"
    assert "decides this MiniMax-M3 launch otherwise than SGLang 0.5.23's own code" in stopped.message
    assert ("the policy accepts it, SGLang's code refuses it ('Hierarchical sparse attention currently requires "
            "--disable-radix-cache.')") in stopped.message
    assert ran.ok and dict(ran.values)["attention_backend"] == "fa3"


# -- the provider called by itself -----------------------------------------------------------------

def _args(**fields):
    """What the provider reads of a ServerArgs, as a plain object (SGLang's tests pass such)."""
    base = dict(attention_backend=None, prefill_attention_backend=None, decode_attention_backend=None,
                page_size=None, kv_cache_dtype="auto", quantization=None, _quantization_explicitly_unset=False,
                moe_runner_backend="auto", moe_a2a_backend="none", ep_size=1, enable_aiter_allreduce_fusion=False,
                speculative_algorithm=None, device="cuda", enable_hisparse=False, disable_radix_cache=False,
                enable_deterministic_inference=False, prefill_kv_cache_dequant_dtype="auto",
                enable_mixed_chunk=False)
    base.update(fields)
    return SimpleNamespace(**base)


PLATFORMS = [("cuda", (9, 0)), ("cuda", (10, 0)), ("cuda", (12, 0)), ("cuda", (8, 0)), ("hip", (9, 4)), ("npu", (9, 0))]
CALLS = [
    {}, {"kv_cache_dtype": "fp8_e4m3"}, {"kv_cache_dtype": "fp8_e5m2"}, {"kv_cache_dtype": "bf16"},
    {"attention_backend": "fa3"}, {"attention_backend": "trtllm_mha", "kv_cache_dtype": "fp8_e4m3"},
    {"decode_attention_backend": "trtllm_mha"}, {"page_size": 64}, {"moe_runner_backend": "deep_gemm"},
    {"moe_runner_backend": "triton"}, {"attention_backend": "tokenspeed_mla"},  # not the policy's: SGLang's own
    {"quantization": "fp8"},  # out of the policy's scope: SGLang's own
    {"ep_size": 8, "enable_aiter_allreduce_fusion": True},
]


def _call(fn, args, hf):
    records = []
    handler = logging.Handler(logging.INFO)
    handler.emit = records.append
    log = logging.getLogger(M3_MODULE)
    level = log.level
    log.setLevel(logging.INFO)
    log.addHandler(handler)
    env = dict(os.environ)
    try:
        out = ("ok", fn(args, hf))
    except Exception as exc:  # the exception is compared
        out = (type(exc).__name__, str(exc))
    finally:
        log.removeHandler(handler)
        log.setLevel(level)
        written = {k: v for k, v in os.environ.items() if env.get(k) != v}
        os.environ.clear()
        os.environ.update(env)
    return out, [(r.levelname, r.getMessage()) for r in records], written


@pytest.mark.parametrize("platform, cap", PLATFORMS)
@pytest.mark.parametrize("arch", ARCHS)
def test_the_provider_alone_answers_as_sglangs(sglang_0523, monkeypatch, platform, cap, arch):
    """`_minimax_m3_overrides(server_args, hf_config)` called by itself with a plain object, on
    every platform: the same declarations, exception, log lines (levels and texts) and
    environment writes as SGLang's own, with both environment switches."""
    from engine.sglang.conform.machine import faked_gpu

    module = sys.modules[M3_MODULE]
    original = module._minimax_m3_overrides
    hf = SimpleNamespace(architectures=[arch], quantization_config=None)
    cases = [(c, env) for c in CALLS for env in ({}, {"SGLANG_DISABLE_M3_FP8_ATTN_GEMM": "1"},
                                                  {"SGLANG_M3_ALLOW_CUSTOM_AR": "true"})]
    for var in ("SGLANG_DISABLE_M3_FP8_ATTN_GEMM", "SGLANG_M3_ALLOW_CUSTOM_AR", "USE_ROCM_AITER_ROPE_BACKEND"):
        monkeypatch.delenv(var, raising=False)

    def answers(fn):
        out = []
        for fields, env in cases:
            os.environ.update(env)
            try:
                out.append(_call(fn, _args(**fields, device="npu" if platform == "npu" else "cuda"), hf))
            finally:
                for k in env:
                    os.environ.pop(k, None)
        return out

    with faked_gpu(platform, cap):
        native = answers(original)
        with plugin_active(monkeypatch, RELEASE_REF):
            replaced = module._minimax_m3_overrides
            assert replaced is not original
            routed = answers(replaced)
    for (fields, env), a, b in zip(cases, native, routed):
        assert b == a, (fields, env)
    assert any(lines for _, lines, _ in native) or platform in ("hip", "npu") or cap[0] in (8, 12)


def test_a_quantized_checkpoint_is_sglangs_own(sglang_0523, monkeypatch):
    """The policy models BF16 weights: for a quantized checkpoint SGLang's own provider answers."""
    from engine.sglang.conform.machine import faked_gpu

    module = sys.modules[M3_MODULE]
    original = module._minimax_m3_overrides
    hf = SimpleNamespace(architectures=[ARCHS[0]], quantization_config={"quant_method": "mxfp8"})
    with faked_gpu("cuda", (10, 0)):
        native = _call(original, _args(), hf)
        with plugin_active(monkeypatch, RELEASE_REF):
            routed = _call(module._minimax_m3_overrides, _args(), hf)
    assert routed == native and native[0][1]["moe_runner_backend"] == "deep_gemm"


def test_an_edited_policy_decides_the_provider_alone(sglang_0523, monkeypatch, tmp_path):
    from engine.sglang.conform.machine import faked_gpu

    module = sys.modules[M3_MODULE]
    hf = SimpleNamespace(architectures=[ARCHS[0]], quantization_config=None)
    with faked_gpu("cuda", (9, 0)), plugin_active(monkeypatch, _edited(tmp_path, TRTLLM_ON_HOPPER)):
        out, lines, _ = _call(module._minimax_m3_overrides, _args(), hf)
    assert out == ("ok", {"attention_backend": "trtllm_mha", "moe_runner_backend": "triton"})
    assert lines == [("INFO", "MiniMax-M3 on Hopper: attention_backend=trtllm_mha, page_size=None (MSA is "
                              "SM100-only; sparse attention runs on the Triton path).")]

