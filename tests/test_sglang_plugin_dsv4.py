"""The SGLang plugin on DeepSeek-V4 launches (engine/sglang/dsv4_hooks.py), in-process against
SGLang 0.5.23's own code: registered by its entry point, applied by SGLang's HookRegistry.

- With the shipped policies of the release (`sglang==0.5.23`), V4 and V4.1 launches come out as
  SGLang's own code makes them: accepted and refused alike, with the same messages, exception
  types, KV dtype, resolved fields and log lines, over a stratified sample of the V4 family's
  declared domain.
- An edited copy routes the launch: the KV-dtype default and what `--dsv4-attn-backend auto`
  becomes are the policy's. An edit the plugin cannot enforce (a rule of SGLang's own code it does
  not replace) stops the launch naming the difference.
- Each replaced function, called by itself as SGLang calls it, answers as SGLang's own.

Skipped where SGLang 0.5.23 is not importable (`make install` installs it)."""
from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest

import engine
from tests.helpers import plugin_active

FAMILY = "dsv4-backends"
RELEASE_REF = "sglang==0.5.23"


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
    shipped = engine.load_policy(f"{FAMILY}@13")
    text = open(shipped.file, encoding="utf-8").read()
    for old, new in edits:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    folder = tmp_path / FAMILY
    folder.mkdir(exist_ok=True)
    path = folder / "v13.yaml"
    path.write_text(text, encoding="utf-8")
    return str(path)


def _case(policy, **config):
    from engine.sglang.conform.cases import case_of

    return case_of(policy, policy.complete(config))


def test_the_shipped_policies_drive_v4_launches_as_sglangs_own_code(sglang_0523, monkeypatch):
    from engine.sglang.conform.cases import case_of
    from engine.sglang.conform.sample import configs_of

    policy = engine.load_policy(f"{FAMILY}@13")
    configs, _ = configs_of(policy, n=400, seed=5)
    cases = list(dict.fromkeys(case_of(policy, c) for c in configs))
    native = [sglang_0523.run_case(c) for c in cases]
    with plugin_active(monkeypatch, RELEASE_REF):
        routed = [sglang_0523.run_case(c) for c in cases]
    assert sum(r.ok for r in native) > 50 and sum(not r.ok for r in native) > 50
    assert sum(bool(r.log) for r in native) > 50
    for case, a, b in zip(cases, native, routed):
        assert (b.ok, b.error_type, b.message, b.log) == (a.ok, a.error_type, a.message, a.log), case
        assert (b.kv_cache_dtype, b.values) == (a.kv_cache_dtype, a.values), case


def test_an_edited_policy_routes_the_kv_dtype_and_the_auto_backend(sglang_0523, monkeypatch, tmp_path):
    """V4.1 on SM100 at TP 8: SGLang's own auto is flashmla; the copy says flashmla_mega. A
    DeepSeek-V4 launch without a dtype: SGLang's FP8, the copy's BF16 (and its own line)."""
    policy = engine.load_policy(f"{FAMILY}@13")
    edited = _edited(tmp_path, [
        ("        not:\n          disaggregation_mode: \"null\"\n          enable_prefill_cp: false\n"
         "          tp_size: {\">=\": {product: [2, {input: attn_dp_size}, {input: attn_cp_size}]}}\n", ""),
        ("      when: {kv_cache_dtype: auto}\n      set: {kv_cache_dtype: fp8_e4m3}",
         "      when: {kv_cache_dtype: auto}\n      set: {kv_cache_dtype: bfloat16}"),
    ])
    v41 = _case(policy, model_family="deepseek_v41", sm_major=10, tp_size=8, kv_cache_dtype="fp8_e4m3")
    v4 = _case(policy)
    native = [sglang_0523.run_case(c) for c in (v41, v4)]
    with plugin_active(monkeypatch, edited):
        routed = [sglang_0523.run_case(c) for c in (v41, v4)]
    assert dict(native[0].values)["dsv4_attn_backend"] == "flashmla"
    assert routed[0].ok and dict(routed[0].values)["dsv4_attn_backend"] == "flashmla_mega"
    assert native[1].kv_cache_dtype == "fp8_e4m3" and routed[1].ok and routed[1].kv_cache_dtype == "bfloat16"
    assert list(routed[1].log) == ["Setting KV cache dtype to bfloat16 for DeepseekV4ForCausalLM.",
                             "Setting max_running_requests to 256 for DeepseekV4ForCausalLM."]


def test_an_edit_of_sglangs_own_code_stops_the_launch_naming_it(sglang_0523, monkeypatch, tmp_path):
    """The copy drops the trtllm HiSparse gate, which lives in SGLang's own apply_deepseek_v4_defaults
    (not replaced): the launch stops, saying what differs; one it decides as SGLang runs."""
    policy = engine.load_policy(f"{FAMILY}@13")
    edited = _edited(tmp_path, [("      require: {enable_hisparse: false}\n      message: --dsv4-attn-backend trtllm "
                                 "does not support enable_hisparse.",
                                 "      require: {enable_hisparse: {in: [false, true]}}\n      message: "
                                 "--dsv4-attn-backend trtllm does not support enable_hisparse.")])
    gate = _case(policy, sm_major=10, dsv4_attn_backend="trtllm", enable_hisparse=True, disable_radix_cache=True)
    plain = _case(policy, sm_major=10, dsv4_attn_backend="trtllm")
    with plugin_active(monkeypatch, edited):
        stopped, ran = sglang_0523.run_case(gate), sglang_0523.run_case(plain)
    assert not stopped.ok and stopped.error_type == "NotEnforceable"
    assert "decides this DeepSeek-V4 launch otherwise than SGLang 0.5.23's own code" in stopped.message
    assert "the policy accepts it, SGLang's code refuses it ('--dsv4-attn-backend trtllm does not support " \
           "enable_hisparse.')" in stopped.message
    assert ran.ok and dict(ran.values)["dsv4_attn_backend"] == "trtllm"


@pytest.mark.parametrize("kv, device", [(kv, d) for kv in ("auto", "fp8_e4m3", "bfloat16", "bf16", "fp8_e5m2",
                                                            "nvfp4") for d in ("cuda", "npu")])
def test_the_kv_pass_alone_answers_as_sglangs(sglang_0523, monkeypatch, kv, device):
    """`_deepseek_v4_kv_cache_dtype(view)` called by itself (a plain object, as a unit test passes):
    the same return, exception type and text, and log lines, with and without the plugin."""
    import logging

    from sglang.srt.arg_groups import deepseek_v4_hook, overrides

    hf = SimpleNamespace(architectures=["DeepseekV4ForCausalLM"], model_type="deepseek_v4")
    view = SimpleNamespace(kv_cache_dtype=kv, device=device)
    monkeypatch.setattr(overrides, "model_config_of", lambda v: SimpleNamespace(hf_config=hf))

    def call(fn):
        records = []
        handler = logging.Handler()
        handler.emit = records.append
        logging.getLogger(overrides.__name__).addHandler(handler)
        try:
            return ("ok", fn(view)), [r.getMessage() for r in records]
        except Exception as exc:  # the exception is compared
            return (type(exc).__name__, str(exc)), [r.getMessage() for r in records]
        finally:
            logging.getLogger(overrides.__name__).removeHandler(handler)

    original = overrides._deepseek_v4_kv_cache_dtype
    native = call(original)
    with plugin_active(monkeypatch, RELEASE_REF):
        replaced = overrides._deepseek_v4_kv_cache_dtype
        assert replaced is not original and deepseek_v4_hook._deepseek_v4_kv_cache_dtype is not original
        routed = call(replaced)
    assert routed == native
    hf.architectures = ["DeepseekV4ForCausalLMNextN"]  # not the V4 step's architecture: {} for both
    with plugin_active(monkeypatch, RELEASE_REF):
        assert call(overrides._deepseek_v4_kv_cache_dtype) == (("ok", {}), [])


@pytest.mark.parametrize("model_type, major, tp, layout", [
    ("deepseek_v41", 10, 1, None), ("deepseek_v41", 10, 8, None), ("deepseek_v41", 10, 1, "v4"),
    ("deepseek_v41", 9, 1, None), ("deepseek_v4", 10, 1, None), ("deepseek_v41", 10, 1, "V41_new")])
def test_the_auto_backend_alone_answers_as_sglangs(sglang_0523, monkeypatch, model_type, major, tp, layout):
    from engine.sglang.conform.machine import faked_gpu
    from sglang.srt.arg_groups import deepseek_v4_hook

    hf = SimpleNamespace(architectures=["DeepseekV4ForCausalLM"], model_type=model_type)
    monkeypatch.setattr(deepseek_v4_hook, "model_config_of", lambda v: SimpleNamespace(hf_config=hf))
    monkeypatch.setattr(deepseek_v4_hook, "resolving_view", lambda s: s)
    monkeypatch.setattr(deepseek_v4_hook, "resolved_view", lambda s: s, raising=False)
    if layout is None:
        monkeypatch.delenv("SGLANG_DSV4_KV_LAYOUT", raising=False)
    else:
        monkeypatch.setenv("SGLANG_DSV4_KV_LAYOUT", layout)
    args = SimpleNamespace(device="cuda", kv_cache_dtype="fp8_e4m3", disaggregation_mode="null",
                           enable_prefill_cp=False, tp_size=tp, attn_dp_size=1, attn_cp_size=1,
                           dsv4_attn_backend="auto")
    with faked_gpu("cuda", (major, 0)):
        native = deepseek_v4_hook._default_dsv4_attention_backend(args)
        with plugin_active(monkeypatch, RELEASE_REF):
            routed = deepseek_v4_hook._default_dsv4_attention_backend(args)
    assert routed == native
    assert native == ("flashmla_mega" if (model_type, major, tp) == ("deepseek_v41", 10, 1)
                      and (layout or "v41").lower() in ("v41", "v41_new") else "flashmla")


# -- real launches: `python -m sglang.launch_server` with the GPU stand-in (tests/test_sglang_plugin.py) ----

def _launch(argv, gpu="9.0", **env):
    """(exit code, SGLang's log messages, all output) of a real launch that stops after routing."""
    import os
    import re
    import subprocess

    from tests.test_sglang_plugin import _clean_env, _pythonpath

    env = _clean_env(PYTHONPATH=_pythonpath(), HISPARSE_TEST_GPU=gpu, HISPARSE_TEST_ARCH_HELPERS="1", **env)
    proc = subprocess.run([sys.executable, "-m", "sglang.launch_server", *argv], env=env, capture_output=True,
                          text=True, timeout=600, cwd=os.path.dirname(os.path.dirname(__file__)))
    out = proc.stdout + proc.stderr
    return proc.returncode, [m.group(1) for m in re.finditer(r"^\[[^\]]*\] (.*)$", out, re.M)], out


@pytest.fixture(scope="module")
def v4_models(tmp_path_factory):
    from engine.sglang.conform.drivers import installed_sglang

    if installed_sglang()[0] != "0.5.23":
        pytest.skip("needs SGLang 0.5.23")
    from engine.sglang.conform.model_folders import ModelFolders

    folders = ModelFolders(str(tmp_path_factory.mktemp("v4models")))
    return {"v4": folders.path("DeepseekV4ForCausalLM"),
            "v41": folders.path("DeepseekV41ForCausalLM", (("model_type", "deepseek_v41"),))}


def test_a_real_v4_hisparse_launch_is_routed_by_the_shipped_policies(v4_models):
    policy = engine.load_policy(f"{FAMILY}@13")
    code, lines, out = _launch(["--model-path", v4_models["v4"], "--enable-hisparse", "--disable-radix-cache"],
                               HISPARSE_POLICY=RELEASE_REF)
    assert "Use dsv4 attention backend for DeepseekV4ForCausalLM, setting page_size to 256." in lines, out[-3000:]
    at = lines.index("Setting KV cache dtype to fp8_e4m3 for DeepseekV4ForCausalLM.")
    assert lines[at + 1:at + 3] == [
        f"hisparse-router: DeepSeek-V4 routing decided by policy {FAMILY}@13 sha256={policy.sha256[:12]}",
        "Setting max_running_requests to 256 for DeepseekV4ForCausalLM."]
    assert code == 1 and "No module named 'uvicorn'" in out  # routed and checked, then stopped


def test_a_real_v41_launch_is_refused_with_sglangs_text_and_an_edited_policy_routes_tp8(v4_models, tmp_path):
    code, lines, out = _launch(["--model-path", v4_models["v41"], "--enable-hisparse", "--disable-radix-cache"],
                               gpu="10.0", HISPARSE_POLICY=RELEASE_REF)
    assert code == 1 and ("ValueError: DeepSeek-V4.1 does not support HiSparse yet; disable it to serve this "
                          "model.") in out, out[-3000:]
    edited = _edited(tmp_path, [
        ("        not:\n          disaggregation_mode: \"null\"\n          enable_prefill_cp: false\n"
         "          tp_size: {\">=\": {product: [2, {input: attn_dp_size}, {input: attn_cp_size}]}}\n", "")])
    record = tmp_path / "decisions.jsonl"
    code, lines, out = _launch(["--model-path", v4_models["v41"], "--tp-size", "8"], gpu="10.0",
                               HISPARSE_POLICY=edited, HISPARSE_RECORD=str(record))
    assert code == 1 and "No module named 'uvicorn'" in out, out[-3000:]  # accepted: flashmla_mega at TP 8
    import json

    (entry,) = [json.loads(line) for line in record.read_text(encoding="utf-8").splitlines()]
    assert entry["decision"]["backends"]["dsv4_attention"] == "flashmla_mega"
    assert entry["decision"]["tp_size"] == 8 and entry["decision"]["model_family"] == "deepseek_v41"
