"""Run inside a release's environment (tests/test_sglang_plugin_m3.py starts it): the conform
driver's launch path over a sample of the release's MiniMax-M3 family version, natively and with
the plugin on the shipped policies (`sglang==RELEASE`), comparing acceptance, exception type and
text, resolved fields, routing lines and the MiniMax-M3 provider's INFO lines; and the provider
called by itself (the calls tests/test_sglang_plugin_m3.py makes on 0.5.23, defined here), natively
and replaced. Prints one JSON object. No pytest: the release environments do not have it."""
from __future__ import annotations

import json
import logging
import os
import sys

PROVIDER_MODULE = "sglang.srt.arg_groups.model_overrides.minimax_m3"


class _Env:
    """What tests.helpers.plugin_active needs of pytest's monkeypatch."""

    def setenv(self, name, value):
        os.environ[name] = value

    def delenv(self, name, raising=True):
        os.environ.pop(name, None)


# -- the provider called by itself, as SGLang's registry calls it -----------------------------------

def provider_args(**fields):
    """What the provider reads of a ServerArgs, as a plain object (SGLang's tests pass such)."""
    from types import SimpleNamespace

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
# each call with no switch, and with each of the provider's environment switches
PROVIDER_CASES = [(c, env) for c in CALLS for env in ({}, {"SGLANG_DISABLE_M3_FP8_ATTN_GEMM": "1"},
                                                       {"SGLANG_M3_ALLOW_CUSTOM_AR": "true"})]


def call_provider(fn, args, hf):
    """(return or exception, log records at INFO and above, environment variables it wrote) of one
    call; the environment is put back."""
    records = []
    handler = logging.Handler(logging.INFO)
    handler.emit = records.append
    log = logging.getLogger(PROVIDER_MODULE)
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


def provider_answers(fn, platform, hf) -> list:
    """call_provider over PROVIDER_CASES on `platform` (its GPU faked by the caller)."""
    out = []
    for fields, env in PROVIDER_CASES:
        os.environ.update(env)
        try:
            out.append(call_provider(fn, provider_args(**fields, device="npu" if platform == "npu" else "cuda"), hf))
        finally:
            for k in env:
                os.environ.pop(k, None)
    return out


def alone(release) -> dict:
    """The provider called by itself on every platform and architecture, natively and replaced."""
    from types import SimpleNamespace

    from engine.sglang.conform.machine import faked_gpu
    from tests.helpers import plugin_active

    module = sys.modules[PROVIDER_MODULE]
    original = module._minimax_m3_overrides
    calls, differ = 0, []
    for var in ("SGLANG_DISABLE_M3_FP8_ATTN_GEMM", "SGLANG_M3_ALLOW_CUSTOM_AR", "USE_ROCM_AITER_ROPE_BACKEND"):
        os.environ.pop(var, None)
    for arch in ("MiniMaxM3SparseForCausalLM", "MiniMaxM3SparseForConditionalGeneration"):
        hf = SimpleNamespace(architectures=[arch], quantization_config=None)
        for platform, cap in PLATFORMS:
            with faked_gpu(platform, cap):
                native = provider_answers(original, platform, hf)
                with plugin_active(_Env(), f"sglang=={release}"):
                    routed = provider_answers(module._minimax_m3_overrides, platform, hf)
            calls += len(native)
            differ += [{"call": [arch, platform, list(cap), fields, env], "native": repr(a), "plugin": repr(b)}
                       for (fields, env), a, b in zip(PROVIDER_CASES, native, routed) if a != b]
    return {"alone_calls": calls, "alone_differ": len(differ), "alone_first_differences": differ[:3]}


def main(sample: int, seed: int) -> dict:
    from engine.sglang.policy_sets import load_policy_set
    from engine.sglang.conform import pipeline as driver
    from engine.sglang.conform.cases import case_of
    from engine.sglang.conform.sample import configs_of
    from engine.sglang.registry import installed_release
    from tests.helpers import plugin_active

    release = installed_release()
    driver.import_sglang()
    driver.load()
    policy = load_policy_set(f"sglang=={release}").for_class("minimax_m3")
    configs, _ = configs_of(policy, n=sample, seed=seed)
    cases = list(dict.fromkeys(case_of(policy, c) for c in configs))

    def run(case):
        records = []
        handler = logging.Handler(logging.INFO)
        handler.emit = records.append
        log = logging.getLogger(PROVIDER_MODULE)
        level = log.level
        log.setLevel(logging.INFO)
        log.addHandler(handler)
        try:
            r = driver.run_case(case)
        finally:
            log.removeHandler(handler)
            log.setLevel(level)
        lines = [(x.levelname, x.getMessage()) for x in records if not x.getMessage().startswith("hisparse-router:")]
        return [r.ok, r.error_type, r.message, list(r.log), [list(v) for v in r.values], lines]

    native = [run(c) for c in cases]
    with plugin_active(_Env(), f"sglang=={release}"):
        module = sys.modules[PROVIDER_MODULE]
        replaced = getattr(module._minimax_m3_overrides, "__wrapped__", None) is not None
        routed = [run(c) for c in cases]
    differ = [{"case": repr(c), "native": a, "plugin": b} for c, a, b in zip(cases, native, routed) if a != b]
    return {"release": release, "policy": policy.ref, "replaced": replaced, "cases": len(cases),
            "accepted": sum(a[0] for a in native), "with_provider_lines": sum(bool(a[5]) for a in native),
            "differ": len(differ), "first_differences": differ[:3], **alone(release)}


if __name__ == "__main__":
    print(json.dumps(main(int(sys.argv[1]), int(sys.argv[2]))))
