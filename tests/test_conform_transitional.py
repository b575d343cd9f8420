"""`hisparse conform` for the transitional releases (SGLang 0.5.15, 0.5.15.post1, 0.5.16, 0.5.17,
0.5.18: the DSA passes of srt/arg_groups/overrides.py run from ServerArgs methods).

- case_of (policy config -> Case) on stratified samples of the @5, @6 and @7 domains, read back
  with the launch-command reader; the shared stand-ins (machine.helper_functions and
  PatchedHelpers): everywhere.
- The driver: only where one of those releases is installed (`make conform-env SGLANG=0.5.17`,
  then `ENVS/sglang-0.5.17/bin/python -m pytest tests/test_conform_transitional.py`):
  hand-picked cases whose expected values were read from each release's source (file:line in the
  comments), the `where` line checked against the installed file, the process left as found, and
  a stratified sample against the version that models the release, with no difference.
"""
from __future__ import annotations

import json
import linecache
import os
import sys
import types

import pytest

import engine
from engine.sglang import config_from_launch
from engine.sglang.conform import drivers, transitional
from engine.sglang.conform import sample as sampling
from engine.sglang.conform.cases import case_of
from engine.sglang.conform.machine import PatchedHelpers, helper_functions, platform_facts
from tests.sglang_release import INSTALLED, require
from engine.sglang.conform.protocol import Case

VERSIONS = {"dsa-backends@5": "0.5.16", "dsa-backends@6": "0.5.17", "dsa-backends@7": "0.5.18"}
HUB = {"DeepseekV32ForCausalLM": "deepseek-ai/DeepSeek-V3.2", "DeepseekV3ForCausalLM": "deepseek-ai/DeepSeek-V3",
       "GlmMoeDsaForCausalLM": "zai-org/GLM-5"}


# -- case_of, read back ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def longcat(tmp_path_factory):
    folder = tmp_path_factory.mktemp("models") / "LongCat-Flash"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"architectures": ["LongcatFlashForCausalLM"],
                                                    "index_topk": 2048}))
    return str(folder)


@pytest.mark.parametrize("ref", list(VERSIONS))
def test_case_of_round_trips_a_stratified_sample(ref, longcat):
    policy = engine.load_policy(ref)
    axes = sampling.axes(policy, None)
    configs = sampling.stratified(axes, 600, 5)
    paths = dict(HUB, LongcatFlashForCausalLM=longcat)
    seen = {}
    for config in configs:
        case = case_of(policy, config)
        tokens = list(case.argv) + ["--model-path", paths[case.architecture]]
        back, _ = config_from_launch(policy, tokens)
        back = policy.complete(policy.normalize(back))
        back.update(platform=case.platform, sm_major=case.capability[0])
        if not config["dsa_model"] and "model_family" in config:
            back["model_family"] = config["model_family"]  # a non-DSA model has no family
        assert back == config
        seen.setdefault(case, config)
    families = {c.architecture for c in seen}
    assert families == set(paths) - ({"LongcatFlashForCausalLM", "GlmMoeDsaForCausalLM"}
                                     if "model_family" not in policy.inputs else set())


# -- the shared stand-ins ------------------------------------------------------------------------
@pytest.mark.parametrize("platform, capability", [("cuda", (9, 0)), ("cuda", (10, 0)), ("cuda", (12, 1)),
                                                  ("hip", (9, 4))])
def test_helper_answers_are_the_platform_facts(platform, capability):
    facts, helpers = platform_facts(platform, capability), helper_functions(platform, capability)
    answer = {name: fn() for name, fn in helpers.items()}
    assert answer["is_hip"] is facts["is_hip"] and answer["is_cuda"] is facts["is_cuda"]
    assert answer["is_sm100_supported"] is facts["is_sm100"] and answer["is_sm120_supported"] is facts["is_sm120"]
    assert answer["is_blackwell_supported"] is facts["is_blackwell"]
    assert answer["get_device_capability"] == capability == facts["device_capability"]
    assert answer["get_device_sm"] == capability[0] * 10 + capability[1]
    assert answer["get_device_name"].startswith("AMD" if platform == "hip" else "NVIDIA")
    assert all(getattr(fn, "platform_fact", False) for fn in helpers.values())


def test_patched_helpers_answer_for_the_case_and_put_everything_back(monkeypatch):
    """On stand-in `sglang` modules: every module holding a helper by name answers for the case's
    GPU inside it, the originals come back after it, os.environ too, and a module first imported
    during a case is given the originals and patched from then on."""
    import torch

    def is_hip():
        return "original"

    common = types.ModuleType("sglang.srt.utils.common")
    common.is_hip = is_hip
    user = types.ModuleType("sglang.srt.user")
    user.is_hip = is_hip
    for module in (common, user):
        monkeypatch.setitem(sys.modules, module.__name__, module)
    patched = PatchedHelpers()
    capability = torch.cuda.get_device_capability
    late = types.ModuleType("sglang.srt.late")
    with patched.case("hip", (9, 4)):
        assert common.is_hip() is True and user.is_hip() is True
        assert torch.cuda.get_device_capability() == (9, 4) and torch.cuda.is_available()
        os.environ["HISPARSE_TEST_CASE_ENV"] = "set by a case"
        late.is_hip = user.is_hip  # as `from ... import is_hip` binds it while the case runs
        monkeypatch.setitem(sys.modules, late.__name__, late)
    assert common.is_hip is is_hip and user.is_hip is is_hip and late.is_hip is is_hip
    assert torch.cuda.get_device_capability is capability
    assert "HISPARSE_TEST_CASE_ENV" not in os.environ
    with patched.case("cuda", (10, 0)):
        assert late.is_hip() is False
    assert late.is_hip is is_hip


def test_every_transitional_release_has_this_driver():
    for version in transitional.VERSIONS:
        assert drivers.DRIVERS[version] == "engine.sglang.conform.transitional"


def test_the_driver_refuses_an_unknown_platform_before_importing_sglang():
    with pytest.raises(ValueError, match="platform 'npu': this driver runs cuda or hip"):
        transitional.run_case(Case((), "DeepseekV32ForCausalLM", "npu", (9, 0)))


# -- the driver, where a transitional release is installed ---------------------------------------
V32, V3, GLM, LONGCAT = ("DeepseekV32ForCausalLM", "DeepseekV3ForCausalLM", "GlmMoeDsaForCausalLM",
                         "LongcatFlashForCausalLM")
H = ("--enable-hisparse", "--disable-radix-cache")
SET_BF16_SM9 = "Setting KV cache dtype to bfloat16 for DeepSeek DSA on SM9 device."
WARN = ("When specifying --dsa-prefill-backend or --dsa-decode-backend, you should also explicitly set "
        "--kv-cache-dtype (e.g., 'fp8_e4m3' or 'bfloat16'). DeepSeek V3.2 defaults to FP8 KV cache which "
        "may not be compatible with all backends.")
TILELANG = ("The tilelang DSA prefill/decode kernels only support an fp8_e4m3 KV cache on ROCm/HIP; on CUDA "
            "they require a bfloat16 KV cache. Use --kv-cache-dtype bfloat16 with the tilelang backend, or keep "
            "--kv-cache-dtype fp8_e4m3 and pick an fp8-capable DSA backend (flashmla_kv on Hopper, trtllm on "
            "Blackwell).")


def S(kv, p, d):  # noqa: N802 - the log line of _dsa_split_backend_resolution
    return f"Set DSA backends for {kv} KV Cache: prefill={p}, decode={d}."


def notice(phase):  # srt/arg_groups/argparse_actions.py: DeprecatedAliasStoreAction, print_deprecated_warning
    return (f"\x1b[1;33m'--nsa-{phase}-backend' is deprecated and will be removed in a future release. "
            f"Use '--dsa-{phase}-backend' instead.\x1b[0m")


def hisparse_fp8(p, d):
    return f"HiSparse enabled (fp8_e4m3): using DSA backends prefill={p}, decode={d}."


# every release: overrides.py _dsa_kv_cache_dtype_default and _dsa_split_backend_resolution (0.5.15
# :1052/:1100, 0.5.16 :1204/:1252, 0.5.17 :1507/:1578, 0.5.18 :1595/:1666); hisparse_hook.py
# validate_hisparse (:81, 0.5.18 :80); factory.py _parse_sparse_config :61
COMMON = [
    ("hopper-auto", (), V32, "cuda", (9, 0),
     dict(ok=True, kv="bfloat16", backends=("flashmla_sparse", "fa3"), log=(SET_BF16_SM9, S("bfloat16", "flashmla_sparse", "fa3")))),
    ("aliases-in-the-order-typed", ("--nsa-decode-backend", "fa3", "--nsa-prefill-backend", "flashmla_sparse"), V32, "cuda", (9, 0),
     dict(ok=True, kv="bfloat16", backends=("flashmla_sparse", "fa3"),
          log=(notice("decode"), notice("prefill"), WARN, SET_BF16_SM9, S("bfloat16", "flashmla_sparse", "fa3")))),
    ("dsa-dtype", ("--kv-cache-dtype", "fp8_e5m2"), V32, "cuda", (9, 0),
     dict(ok=False, kv="fp8_e5m2", backends=(None, None), log=(), stage="resolve", error_type="AssertionError",
          message="DeepSeek DSA only supports bf16/bfloat16 or fp8_e4m3 kv_cache_dtype", where="_dsa_kv_cache_dtype_default")),
    ("hisparse-rocm-tilelang", H + ("--kv-cache-dtype", "fp8_e4m3"), GLM, "hip", (9, 4),
     dict(ok=True, kv="fp8_e4m3", backends=("tilelang", "tilelang"), log=(hisparse_fp8("tilelang", "tilelang"),))),
    ("hisparse-non-dsa", H, V3, "cuda", (9, 0),
     dict(ok=False, kv="auto", backends=(None, None), log=(), stage="check", error_type="AssertionError",
          message="--enable-hisparse is only supported for DSA (DeepSeek Sparse Attention) models "
                  "(e.g., DeepSeek V3.2, GLM-5) and DeepSeek V4 now. ", where="validate_hisparse")),
    ("hisparse-buffer", H + ("--kv-cache-dtype", "fp8_e4m3", "--hisparse-config", '{"device_buffer_size":1024}'), V32, "cuda", (9, 0),
     dict(ok=False, kv="fp8_e4m3", backends=("flashmla_kv", "flashmla_kv"), stage="hisparse_config", error_type="ValueError",
          log=(hisparse_fp8("flashmla_kv", "flashmla_kv"),),
          message="device_buffer_size (1024) must be no smaller than top_k (2048)", where="_parse_sparse_config")),
    ("swap-in-block-size", H + ("--kv-cache-dtype", "bfloat16", "--hisparse-config", '{"swap_in_block_size":0}'), V32, "cuda", (9, 0),
     dict(ok=False, stage="hisparse_config", error_type="ValueError",
          message="swap_in_block_size (0) must be in the range [1, 1024]", where="_parse_sparse_config")),
    ("non-dsa-keeps-its-flags", ("--dsa-decode-backend", "fa3", "--kv-cache-dtype", "fp8_e5m2"), V3, "cuda", (10, 0),
     dict(ok=True, kv="fp8_e5m2", backends=(None, "fa3"), log=())),
]
GLM_SM12 = ("--kv-cache-dtype", "fp8_e4m3")
HISPARSE_FLASHINFER = H + ("--kv-cache-dtype", "fp8_e4m3", "--dsa-decode-backend", "flashinfer_sparse_mla")
TILELANG_FP8 = ("--kv-cache-dtype", "fp8_e4m3", "--dsa-decode-backend", "tilelang")
CHOICES_0515 = "'flashmla_sparse', 'flashmla_kv', 'flashmla_auto', 'fa3', 'tilelang', 'aiter', 'trtllm'"
CHOICES_0516 = "'flashmla_sparse', 'flashmla_sparse_q8', 'flashmla_kv', 'flashmla_auto', 'fa3', 'tilelang', 'aiter', 'trtllm'"


def parser_choice(choices):
    return dict(ok=False, stage="parser", error_type="SystemExit", where=None, backends=(None, None), log=(),
                message=f"argument --dsa-decode-backend: invalid choice: 'flashinfer_sparse_mla' (choose from {choices})")


# 0.5.15: LongcatFlash is not in _DEEPSEEK_FAMILY_ARCHS (overrides.py:1165) nor is_deepseek_dsa
R0515 = COMMON + [
    ("longcat-not-dsa", (), LONGCAT, "cuda", (9, 0), dict(ok=True, kv="auto", backends=(None, None), log=())),
    ("glm-sm12-no-route", GLM_SM12, GLM, "cuda", (12, 0),
     dict(ok=True, backends=("trtllm", "trtllm"), log=(S("fp8_e4m3", "trtllm", "trtllm"),))),
    ("tilelang-fp8-accepted", TILELANG_FP8, V32, "cuda", (9, 0),
     dict(ok=True, backends=("flashmla_kv", "tilelang"), log=(S("fp8_e4m3", "flashmla_kv", "tilelang"),))),
    ("no-flashinfer-choice", HISPARSE_FLASHINFER, V32, "cuda", (9, 0), parser_choice(CHOICES_0515)),
]
# 0.5.16: LongcatFlash joins both lists (overrides.py:1317, model_config.py:105); flashmla_sparse_q8
R0516 = COMMON + [
    ("longcat-dsa", (), LONGCAT, "cuda", (9, 0),
     dict(ok=True, kv="bfloat16", backends=("flashmla_sparse", "fa3"), log=(SET_BF16_SM9, S("bfloat16", "flashmla_sparse", "fa3")))),
    ("glm-sm12-no-route", GLM_SM12, GLM, "cuda", (12, 0),
     dict(ok=True, backends=("trtllm", "trtllm"), log=(S("fp8_e4m3", "trtllm", "trtllm"),))),
    ("tilelang-fp8-accepted", TILELANG_FP8, V32, "cuda", (9, 0),
     dict(ok=True, backends=("flashmla_kv", "tilelang"), log=(S("fp8_e4m3", "flashmla_kv", "tilelang"),))),
    ("no-flashinfer-choice", HISPARSE_FLASHINFER, V32, "cuda", (9, 0), parser_choice(CHOICES_0516)),
]
# 0.5.17: the GLM SM12x arm (overrides.py:1600-1617) and _check_tilelang_dsa_fp8_kv (:1554, raised :1568)
GLM_ROUTE = dict(ok=True, backends=("flashinfer_sparse_mla", "flashinfer_sparse_mla"),
                 log=("Set DSA backends for GLM FP8 KV Cache on SM120/SM121: prefill=flashinfer_sparse_mla, "
                      "decode=flashinfer_sparse_mla.",))
TILELANG_REFUSED = dict(ok=False, backends=(None, "tilelang"), log=(), stage="resolve", error_type="ValueError",
                        message=TILELANG, where="_check_tilelang_dsa_fp8_kv")
R0517 = COMMON + [
    ("longcat-dsa", (), LONGCAT, "cuda", (10, 0), dict(ok=True, kv="fp8_e4m3", backends=("trtllm", "trtllm"))),
    ("glm-sm12-route", GLM_SM12, GLM, "cuda", (12, 0), GLM_ROUTE),
    ("tilelang-fp8-refused", TILELANG_FP8, V32, "cuda", (9, 0), TILELANG_REFUSED),
    ("hisparse-fp8-flashinfer-refused", HISPARSE_FLASHINFER, V32, "cuda", (9, 0),
     dict(ok=False, stage="check", error_type="ValueError", log=(hisparse_fp8("flashmla_kv", "flashinfer_sparse_mla"),),
          message="HiSparse supports DSA decode backend(s) ['flashmla_kv'] on this platform with --kv-cache-dtype=fp8_e4m3, "
                  "but got --dsa-decode-backend=flashinfer_sparse_mla. Please use --dsa-decode-backend=flashmla_kv or omit it.",
          where="validate_hisparse_dsa_backend")),
]
# 0.5.18: HISPARSE_CUDA_DSA_BACKENDS_BY_DTYPE (hisparse_hook.py:11) adds flashinfer_sparse_mla for FP8
R0518 = COMMON + [
    ("longcat-dsa", (), LONGCAT, "cuda", (10, 0), dict(ok=True, kv="fp8_e4m3", backends=("trtllm", "trtllm"))),
    ("glm-sm12-route", GLM_SM12, GLM, "cuda", (12, 0), GLM_ROUTE),
    ("tilelang-fp8-refused", TILELANG_FP8, V32, "cuda", (9, 0), TILELANG_REFUSED),
    ("hisparse-fp8-flashinfer", HISPARSE_FLASHINFER, V32, "cuda", (9, 0),
     dict(ok=True, backends=("flashmla_kv", "flashinfer_sparse_mla"), log=(hisparse_fp8("flashmla_kv", "flashinfer_sparse_mla"),))),
]
RELEASES = {"0.5.15": R0515, "0.5.15.post1": R0515, "0.5.16": R0516, "0.5.17": R0517, "0.5.18": R0518}
PARAMS = [pytest.param(v, c, id=f"{v}-{c[0]}") for v, cases in RELEASES.items() for c in cases]


def _driver(version=None):
    require(version or transitional.VERSIONS)
    module = drivers.driver_for(INSTALLED)  # as `hisparse conform` finds it
    assert module is transitional
    module.load()
    return module


@pytest.mark.parametrize("version,spec", PARAMS)
def test_driver_hand_picked_cases(version, spec):
    driver = _driver(version)
    _, argv, architecture, platform, capability, want = spec
    r = driver.run_case(Case(argv, architecture, platform, capability))
    got = dict(ok=r.ok, kv=r.kv_cache_dtype, backends=r.backends, log=r.log, stage=r.stage,
               error_type=r.error_type, message=r.message, where=r.where and r.where.split(" ")[-1])
    want = dict(want)
    want.setdefault("stage", "done" if want["ok"] else "check")
    if want["ok"]:
        want.update(message=None, where=None, error_type=None)
    assert {k: got[k] for k in want} == want
    assert r.extra == {"sglang": version}
    if r.where:  # the line named is a raise or assert of the installed source
        path, _, rest = r.where.partition(":")
        root = os.path.dirname(sys.modules["sglang"].__file__)
        line = linecache.getline(os.path.join(root, path), int(rest.split(" ")[0]))
        assert line.strip().startswith(("assert", "raise")), (r.where, line)


def test_driver_leaves_the_process_as_it_found_it():
    driver = _driver()
    import torch

    import sglang.srt.arg_groups.overrides as overrides
    import sglang.srt.server_args as server_args

    before = (server_args.is_hip, overrides.is_hip, torch.cuda.get_device_capability, torch.cuda.is_available)
    env = dict(os.environ)
    r = driver.run_case(Case(("--kv-cache-dtype", "bf16"), GLM, "hip", (10, 0)))
    assert r.ok and r.backends == ("tilelang", "tilelang")
    assert (server_args.is_hip, overrides.is_hip, torch.cuda.get_device_capability, torch.cuda.is_available) == before
    assert dict(os.environ) == env  # the DSA branch set SGLANG_DSA_PREFILL_DENSE_ATTN_KV_LEN_THRESHOLD


def test_the_modelling_version_agrees_on_a_sample():
    _driver()
    from engine.cli.versions import modelled_releases
    from engine.sglang.conform import conform

    found = modelled_releases().get(INSTALLED)
    assert any(ref.startswith("dsa-backends@") for ref, _, _ in found or ()), \
        f"no dsa-backends version lists SGLang {INSTALLED}"
    for ref, _, _ in found:  # every family's version (DSA, and DeepSeek-V4 from 0.5.16)
        report = conform(engine.load_policy(ref), sample=300, seed=23, workers=0)
        assert report["total"] == 300 and report["counts"]["differ"] == 0, (ref, report["differences"][:3])


# -- DeepSeek-V4: the whole start-up (launch.py), where a transitional release is installed --------
V4 = "DeepseekV4ForCausalLM"
V4_READS = ("attention_backend", "page_size", "kv_cache_dtype", "chunked_prefill_size")
MUTEX = ("--enable-prefill-context-parallel and --enable-nsa-prefill-context-parallel are mutually exclusive. Use "
         "--enable-nsa-prefill-context-parallel for DeepSeek V3.2 (NSA) models and --enable-prefill-context-parallel "
         "for MLA-based models (DeepSeek V3/R1, Kimi K2.5) or MHA/GQA-based models.")
# srt/server_args.py:_handle_context_parallelism raises MUTEX at these lines; 0.5.18's
# validate_deepseek_v4_cp clears the legacy field, so the launch passes
MUTEX_LINE = {"0.5.15": 4838, "0.5.15.post1": 4838, "0.5.16": 5544, "0.5.17": 6328}


def _v4(driver, argv=(), platform="cuda", capability=(9, 0)):
    return driver.run_case(Case(tuple(argv), V4, platform, capability, reads=V4_READS, routing="dsv4"))


def test_a_deepseek_v4_case_runs_the_whole_start_up():
    """__post_init__ runs whole: chunked_prefill_size is the default an 80 GB Hopper's memory sets
    (8192), read by nothing in the DSA slice; the V4 log lines are the class's own."""
    driver = _driver()
    r = _v4(driver)
    assert r.ok and r.kv_cache_dtype == "fp8_e4m3"
    assert dict(r.values) == {"attention_backend": "dsv4", "page_size": 256, "kv_cache_dtype": "fp8_e4m3",
                              "chunked_prefill_size": 8192}
    assert r.log == ("Setting KV cache dtype to fp8_e4m3 for DeepseekV4ForCausalLM.",
                     "Setting max_running_requests to 256 for DeepseekV4ForCausalLM.")
    npu = _v4(driver, platform="npu")  # --device npu: page 128, BF16 KV, memory from the NPU probe
    assert npu.ok and dict(npu.values)["page_size"] == 128 and npu.kv_cache_dtype == "bfloat16"


def test_deepseek_v4_prefill_cp_meets_the_generic_context_parallel_check():
    """--enable-prefill-cp is mapped by _handle_legacy_cp_arguments before the V4 step and checked by
    _handle_context_parallelism after it: steps the DSA slice never runs."""
    driver = _driver()
    r = _v4(driver, ("--enable-prefill-cp", "--cp-strategy", "interleave", "--tp-size", "8"))
    if INSTALLED in MUTEX_LINE:
        assert (r.ok, r.stage, r.error_type, r.message) == (False, "resolve", "ValueError", MUTEX)
        assert r.where == f"srt/server_args.py:{MUTEX_LINE[INSTALLED]} _handle_context_parallelism"
        assert r.log[-1] == ("Enable Context Parallel for DeepSeekV4, dp_size=1, moe_dense_tp_size=1, "
                             "attn_cp_size=8, ep_size=1, tp_size=8")
    else:
        assert r.ok and dict(r.values)["attention_backend"] == "dsv4"
    named = _v4(driver, ("--enable-prefill-cp", "--cp-strategy", "interleave", "--tp-size", "8",
                         "--attention-backend", "dsv4"))
    assert named.ok  # dsv4 named: the legacy DSA field instead, no conflict


def test_a_deepseek_v4_case_leaves_the_process_as_it_found_it():
    driver = _driver()
    import sglang.srt.server_args as server_args
    import sglang.srt.utils.common as common

    before = (server_args.get_device_memory_capacity, common.get_nvgpu_memory_capacity,
              common.get_amdgpu_memory_capacity, server_args.is_hip)
    env = dict(os.environ)
    for platform, capability in (("hip", (9, 4)), ("npu", (9, 0)), ("cuda", (12, 0))):
        _v4(driver, ("--enable-hisparse", "--disable-radix-cache"), platform, capability)
    assert (server_args.get_device_memory_capacity, common.get_nvgpu_memory_capacity,
            common.get_amdgpu_memory_capacity, server_args.is_hip) == before
    assert dict(os.environ) == env  # the V4 step writes SGLANG_OPT_* variables on ROCm and SM120
