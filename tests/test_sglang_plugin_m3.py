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
from tests.sglang_m3_release_probe import PLATFORMS, PROVIDER_CASES, call_provider as _call, \
    provider_answers, provider_args as _args

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
    for var in ("SGLANG_DISABLE_M3_FP8_ATTN_GEMM", "SGLANG_M3_ALLOW_CUSTOM_AR", "USE_ROCM_AITER_ROPE_BACKEND"):
        monkeypatch.delenv(var, raising=False)
    with faked_gpu(platform, cap):
        native = provider_answers(original, platform, hf)
        with plugin_active(monkeypatch, RELEASE_REF):
            replaced = module._minimax_m3_overrides
            assert replaced is not original
            routed = provider_answers(replaced, platform, hf)
    for (fields, env), a, b in zip(PROVIDER_CASES, native, routed):
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



# -- real launches: `python -m sglang.launch_server` with the GPU stand-in (tests/test_sglang_plugin.py) ----

def _launch(argv, gpu="9.0", **env):
    """(exit code, SGLang's log messages, all output) of a real launch that stops after routing."""
    import re
    import subprocess

    from tests.test_sglang_plugin import _clean_env, _pythonpath

    env = _clean_env(PYTHONPATH=_pythonpath(), HISPARSE_TEST_GPU=gpu, HISPARSE_TEST_ARCH_HELPERS="1", **env)
    proc = subprocess.run([sys.executable, "-m", "sglang.launch_server", *argv], env=env, capture_output=True,
                          text=True, timeout=600, cwd=os.path.dirname(os.path.dirname(__file__)))
    out = proc.stdout + proc.stderr
    return proc.returncode, [m.group(1) for m in re.finditer(r"^\[[^\]]*\] (.*)$", out, re.M)], out


@pytest.fixture(scope="module")
def m3_model(tmp_path_factory):
    from engine.sglang.conform.drivers import installed_sglang

    if installed_sglang()[0] != "0.5.23":
        pytest.skip("needs SGLang 0.5.23")
    from engine.sglang.conform.model_folders import ModelFolders

    return ModelFolders(str(tmp_path_factory.mktemp("m3models"))).path("MiniMaxM3SparseForCausalLM")


HOPPER_FA3 = ("MiniMax-M3 on Hopper: attention_backend=fa3, page_size=128 (MSA is SM100-only; sparse attention "
              "runs on the Triton path).")
HISPARSE = ["--enable-hisparse", "--disable-radix-cache"]


def test_a_real_m3_hisparse_launch_on_hopper_is_routed_by_the_shipped_policy(m3_model, tmp_path):
    """SM90, HiSparse: fa3 with page size 128, as SGLang's own launch (the same lines), decided by
    the policy (its line, its record)."""
    import json

    policy = engine.load_policy(f"{FAMILY}@3")
    code, native, out = _launch(["--model-path", m3_model, *HISPARSE])
    assert code == 1 and "No module named 'uvicorn'" in out and HOPPER_FA3 in native, out[-3000:]
    record = tmp_path / "decisions.jsonl"
    code, lines, out = _launch(["--model-path", m3_model, *HISPARSE], HISPARSE_POLICY=RELEASE_REF,
                               HISPARSE_RECORD=str(record))
    assert code == 1 and "No module named 'uvicorn'" in out, out[-3000:]  # routed, then stopped
    at = lines.index(HOPPER_FA3)
    assert lines[at + 1] == f"hisparse-router: MiniMax-M3 routing decided by policy {FAMILY}@3 sha256={policy.sha256[:12]}"
    assert [line for line in lines if not line.startswith(("hisparse-router:", "kill_process_tree"))] == \
        [line for line in native if not line.startswith("kill_process_tree")]
    (entry,) = [json.loads(line) for line in record.read_text(encoding="utf-8").splitlines()]
    decision = entry["decision"]
    assert decision["ok"] and decision["policy"]["family"] == FAMILY
    assert decision["backends"]["attention"] == "fa3" and decision["page_size"] == 128


def test_a_real_m3_launch_is_refused_with_sglangs_text_and_an_edited_policy_routes_it(m3_model, tmp_path):
    """SM90, HiSparse, an NVFP4 KV cache: SGLang refuses the override's fa3 for NVFP4 prefill, with and
    without the plugin, in the same words; the copy that routes Hopper to trtllm_mha changes the
    launch: NVFP4 then resolves to native prefill, which SGLang refuses off SM100."""
    argv = ["--model-path", m3_model, *HISPARSE, "--kv-cache-dtype", "nvfp4"]
    refusal = "ValueError: NVFP4 prefill supports an FP8 E4M3 workspace or native NVFP4, but backend 'fa3' provides neither."
    code, native, out = _launch(argv)
    assert code == 1 and refusal in out and HOPPER_FA3 in native, out[-3000:]
    code, lines, out = _launch(argv, HISPARSE_POLICY=RELEASE_REF)
    assert code == 1 and refusal in out and HOPPER_FA3 in lines, out[-3000:]
    edited = _edited(tmp_path, TRTLLM_ON_HOPPER)
    code, lines, out = _launch(argv, HISPARSE_POLICY=edited)
    assert code == 1 and ("ValueError: Native NVFP4 prefill currently requires SM100; use "
                          "--prefill-kv-cache-dequant-dtype=fp8_e4m3 on this platform.") in out, out[-3000:]
    assert ("MiniMax-M3 on Hopper: attention_backend=trtllm_mha, page_size=None (MSA is SM100-only; sparse "
            "attention runs on the Triton path).") in lines
    code, lines, out = _launch(["--model-path", m3_model, *HISPARSE], HISPARSE_POLICY=edited)
    assert code == 1 and "No module named 'uvicorn'" in out, out[-3000:]  # accepted: trtllm_mha, page 64
    assert "TensorRT-LLM MHA only supports page_size of 16, 32, 64 or 128, changing page_size from None to 64." in lines


def test_a_real_launch_an_edit_the_plugin_cannot_enforce_stops(m3_model, tmp_path):
    edited = _edited(tmp_path, [("      require: {disable_radix_cache: true}\n",
                                 "      require: {disable_radix_cache: {in: [true, false]}}\n")])
    code, lines, out = _launch(["--model-path", m3_model, "--enable-hisparse"], HISPARSE_POLICY=edited)
    assert code == 1 and "NotEnforceable: hisparse-router:" in out, out[-3000:]
    assert ("the policy accepts it, SGLang's code refuses it ('Hierarchical sparse attention currently requires "
            "--disable-radix-cache.')") in out


# -- 0.5.21 and 0.5.22, in their environments (tools/sglang-env.sh), where they are built ------------

@pytest.mark.parametrize("release", ["0.5.21", "0.5.22"])
def test_the_shipped_policies_drive_m3_launches_of_older_releases_as_their_own_code(release):
    import json
    import re
    import subprocess

    from tests.helpers import ROOT

    envs = os.environ.get("HISPARSE_ENVS") or os.path.expanduser("~/.cache/hisparse/sglang-envs")
    launcher = os.path.join(envs, f"sglang-{release}", "bin", "python")
    if not os.path.exists(launcher):
        pytest.skip(f"no environment of SGLang {release} (tools/sglang-env.sh {release})")
    text = open(launcher, encoding="utf-8").read()
    wheel, python = re.search(r'PYTHONPATH="([^:"]+):', text), re.search(r'exec "([^"]+)"', text)
    assert wheel and python, f"{launcher} is not a launcher of tools/sglang-env.sh"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HISPARSE_", "SGLANG_"))}
    env["PYTHONPATH"] = os.pathsep.join([wheel.group(1), ROOT])
    proc = subprocess.run([python.group(1), os.path.join(ROOT, "tests", "sglang_m3_release_probe.py"), "200", "11"],
                          env=env, capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["release"] == release and report["replaced"], report
    assert report["accepted"] > 50 and report["cases"] - report["accepted"] > 30 and report["with_provider_lines"] > 50
    assert report["differ"] == 0, report["first_differences"]
    assert report["alone_calls"] == 2 * len(PLATFORMS) * len(PROVIDER_CASES)
    assert report["alone_differ"] == 0, report["alone_first_differences"]


# -- failing loudly --------------------------------------------------------------------------------

def test_a_moved_provider_or_registry_stops_the_launch_naming_it(sglang_0523, monkeypatch, capsys):
    from sglang.srt.arg_groups import model_override_base
    from sglang.srt.plugins.hook_registry import HookRegistry

    from engine.serving import sglang_plugin
    from engine.sglang import hook_targets

    family = hook_targets.CLASS_FAMILIES["minimax_m3"]["m3-provider"]
    (target,) = family.replace
    moved = target.replace("_minimax_m3_overrides", "_minimax_m3_overrides_moved")
    monkeypatch.setattr(family, "replace", {moved: hook_targets.PROVIDER})
    monkeypatch.setenv("HISPARSE_POLICY", f"{FAMILY}@3")
    with pytest.raises(SystemExit) as exc:
        sglang_plugin.register()
    err = capsys.readouterr().err
    assert exc.value.code == 1 and f"SGLang 0.5.23 has no {moved}" in err and err.count("\n") == 1
    monkeypatch.setattr(family, "replace", {target: hook_targets.PROVIDER})
    # the provider no longer registered for one architecture: stopped, nothing replaced
    fns = model_override_base._MODEL_OVERRIDE_FNS[ARCHS[1]]
    saved = list(fns)
    fns[:] = [fn for fn in fns if fn.__qualname__ != "_minimax_m3_overrides"]
    try:
        with pytest.raises(SystemExit) as exc:
            sglang_plugin.register()
    finally:
        fns[:] = saved
        HookRegistry.reset()
    err = capsys.readouterr().err
    assert exc.value.code == 1 and err.count("\n") == 1
    assert (f"SGLang 0.5.23's sglang.srt.arg_groups.model_override_base._MODEL_OVERRIDE_FNS does not hold {target} "
            f"for {ARCHS[1]} (found it 0 times)") in err


def test_a_registry_entry_that_is_no_longer_the_plugins_stops_resolution(sglang_0523, monkeypatch):
    from sglang.srt.arg_groups import model_override_base
    from sglang.srt.plugins.hook_registry import HookRegistry

    from engine.sglang.hook_targets import PIPELINE

    with plugin_active(monkeypatch, f"{FAMILY}@3"):
        guards = [h for _, h, _ in HookRegistry._hooks[PIPELINE.guard]]
        assert all(g() is None for g in guards)
        fns = model_override_base._MODEL_OVERRIDE_FNS[ARCHS[0]]
        (at,) = [i for i, fn in enumerate(fns) if fn.__qualname__ == "_minimax_m3_overrides"]
        fns[at] = fns[at].__wrapped__  # another party put SGLang's own provider back
        with pytest.raises(RuntimeError, match=r"SGLang's model-override registry no longer calls the replacement of "
                                               r"sglang\.srt\.arg_groups\.model_overrides\.minimax_m3\."
                                               r"_minimax_m3_overrides for MiniMaxM3SparseForCausalLM "
                                               r"\(SGLang 0\.5\.23\)"):
            for g in guards:
                g()


def test_a_launch_is_decided_once_and_recorded_once(sglang_0523, monkeypatch, tmp_path):
    """The provider called again on the same ServerArgs answers from the launch's decision: one
    record, the same declarations, the deciding line once."""
    import json

    from engine.sglang.conform.machine import faked_gpu
    from engine.sglang.conform.model_folders import ModelFolders

    (tmp_path / "models").mkdir()
    model = ModelFolders(str(tmp_path / "models")).path(ARCHS[0])
    record = tmp_path / "decisions.jsonl"
    hf = SimpleNamespace(architectures=[ARCHS[0]], quantization_config=None)
    with faked_gpu("cuda", (10, 0)), plugin_active(monkeypatch, RELEASE_REF, record=str(record)):
        server_args = sglang_0523._parse(["--model-path", model, "--kv-cache-dtype", "fp8_e4m3", *HISPARSE])
        server_args._quantization_explicitly_unset = False  # what resolution sets before the provider runs
        provider = sys.modules[M3_MODULE]._minimax_m3_overrides
        first, second = _call(provider, server_args, hf), _call(provider, server_args, hf)
    assert first[0] == second[0] == ("ok", {"attention_backend": "trtllm_mha", "page_size": 128,
                                            "moe_runner_backend": "triton"})
    assert [line for _, line in first[1]] == [
        "MiniMax-M3 on SM100: attention_backend=trtllm_mha, page_size=128, moe_runner_backend=auto.",
        "MiniMax-M3 fp8 attention GEMMs active (kv_cache_dtype fp8_e4m3 + trtllm_mha on SM100): fp8 main/index "
        "KV, fp8-cast q, fp8 sparse/MSA kernels. Set SGLANG_DISABLE_M3_FP8_ATTN_GEMM=1 to force the pre-fp8 "
        "numerics.",
        f"hisparse-router: MiniMax-M3 routing decided by policy {FAMILY}@3 sha256="
        f"{engine.load_policy(f'{FAMILY}@3').sha256[:12]}"]
    assert not any(line.startswith("hisparse-router:") for _, line in second[1])
    (entry,) = [json.loads(line) for line in record.read_text(encoding="utf-8").splitlines()]
    assert entry["decision"]["backends"]["attention"] == "trtllm_mha" and entry["decision"]["sm_major"] == 10
