"""`hisparse conform` for the releases before the resolution pipeline (SGLang 0.5.11 to 0.5.14).

- case_of (policy config -> Case) over the whole v1 to v4 domains: everywhere, checked by reading
  the argv back with engine.sglang.config_from_launch (the launch-command reader).
- The 0.5.11 HiSparse-block extraction and the check for renamed fields: everywhere, on stand-ins.
- The drivers: only where that release is installed (`make conform-env SGLANG=X`, then run this
  file with that environment's bin/python); hand-picked cases whose expected values were read
  from the release's source (file:line in each case), and the `where` line checked against the
  installed file.
"""
from __future__ import annotations

import importlib.util
import linecache
import os
import textwrap

import pytest

import engine
from engine.sglang.conform import drivers
from engine.sglang.conform.cases import case_of
from tests.sglang_release import INSTALLED, require
from engine.sglang.conform.protocol import Case
from engine.sglang import config_from_launch
from engine.analysis import domain

FAMILY = "dsa-backends"
MODEL_PATHS = {"DeepseekV32ForCausalLM": "deepseek-ai/DeepSeek-V3.2", "DeepseekV3ForCausalLM": "deepseek-ai/DeepSeek-V3",
               "GlmMoeDsaForCausalLM": "zai-org/GLM-5"}


# -- case_of, read back ------------------------------------------------------------------------
def _read_back(policy, case: Case) -> dict:
    """The config engine's launch-command reader gets from the case's argv and model."""
    tokens = list(case.argv) + ["--model-path", MODEL_PATHS[case.architecture]]
    config, _ = config_from_launch(policy, tokens)
    config = policy.complete(policy.normalize(config))  # keys come back as typed
    config["platform"] = case.platform
    config["sm_major"] = case.capability[0]
    return config


@pytest.mark.parametrize("ref", [pytest.param(f"{FAMILY}@{n}", marks=pytest.mark.whole) for n in (1, 2, 3)]
                         + [f"{FAMILY}@4"])
def test_case_of_round_trips_the_whole_domain(ref):
    policy = engine.load_policy(ref)
    seen = set()
    for config in domain.configs(policy):
        case = case_of(policy, config)
        assert case.architecture in MODEL_PATHS  # a model the pre-pipeline drivers write
        assert _read_back(policy, case) == config
        seen.add(case)
    assert len(seen) == domain.config_count(policy)  # no two configs launch the same way


# -- the 0.5.11 block, on a stand-in module -----------------------------------------------------
_STAND_IN = '''
class ServerArgs:
    def check_server_args(self):
        raise RuntimeError("an earlier check ran")

        # Check hisparse
        if self.enable_hisparse:
            assert self.disable_radix_cache, "needs --disable-radix-cache"

        raise RuntimeError("a later check ran")
'''


def _stand_in(tmp_path, name, text):
    """The module `text`, imported from its file (sys.path and sys.modules untouched)."""
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(text))
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_hisparse_block_runs_only_that_statement_with_its_lines(tmp_path):
    from engine.sglang.conform.sglang_0511 import hisparse_block

    module = _stand_in(tmp_path, "fake_server_args", _STAND_IN)
    check = hisparse_block(module)
    sa = module.ServerArgs()
    sa.enable_hisparse, sa.disable_radix_cache = True, True
    assert check(sa) is None
    sa.disable_radix_cache = False
    with pytest.raises(AssertionError, match="needs --disable-radix-cache") as info:
        check(sa)
    frame = info.traceback[-1]
    assert frame.name == "check_server_args" and os.path.samefile(frame.path, module.__file__)
    assert linecache.getline(module.__file__, frame.lineno + 1).strip().startswith("assert self.disable")


def test_hisparse_block_refuses_a_source_without_exactly_one_mark(tmp_path):
    from engine.sglang.conform.sglang_0511 import hisparse_block

    module = _stand_in(tmp_path, "fake_server_args_2", _STAND_IN.replace("# Check hisparse", "# other"))
    with pytest.raises(RuntimeError, match="0 '# Check hisparse' statements"):
        hisparse_block(module)


# -- the drivers, where the release is installed -------------------------------------------------
V32, V3 = "DeepseekV32ForCausalLM", "DeepseekV3ForCausalLM"
H = ("--enable-hisparse", "--disable-radix-cache")
SET_BF16_SM9 = "Setting KV cache dtype to bfloat16 for DeepSeek DSA on SM9 device."
WARN_BACKEND = ("When specifying --nsa-prefill-backend or --nsa-decode-backend, you should also explicitly set "
                "--kv-cache-dtype (e.g., 'fp8_e4m3' or 'bfloat16'). DeepSeek V3.2 defaults to FP8 KV cache which "
                "may not be compatible with all backends.")
CHOICES = "'auto', 'fp8_e5m2', 'fp8_e4m3', 'bf16', 'bfloat16', 'fp4_e2m1'"


def S(kv, p, d):  # noqa: N802 - the log line of _set_default_nsa_backends
    return f"Set NSA backends for {kv} KV Cache: prefill={p}, decode={d}."


# (id, argv, architecture, platform, capability, expected). Shared by both releases: the DSA
# resolution is the same code (0.5.11 srt/server_args.py:1570-1645, 0.5.12 :1677-1749).
COMMON = [
    ("hopper-auto", (), V32, "cuda", (9, 0),
     dict(ok=True, kv="bfloat16", backends=("flashmla_sparse", "fa3"),
          log=(SET_BF16_SM9, S("bfloat16", "flashmla_sparse", "fa3")))),
    ("blackwell-auto", (), V32, "cuda", (10, 0),
     dict(ok=True, kv="fp8_e4m3", backends=("trtllm", "trtllm"),
          log=("Setting KV cache dtype to fp8_e4m3 for DeepSeek DSA on SM10 device.",
               S("fp8_e4m3", "trtllm", "trtllm")))),
    ("hopper-fp8", ("--kv-cache-dtype", "fp8_e4m3"), V32, "cuda", (9, 0),
     dict(ok=True, kv="fp8_e4m3", backends=("flashmla_kv", "flashmla_kv"),
          log=(S("fp8_e4m3", "flashmla_kv", "flashmla_kv"),))),
    ("hip-defaults", ("--kv-cache-dtype", "bf16"), V32, "hip", (9, 0),
     dict(ok=True, kv="bfloat16", backends=("tilelang", "tilelang"), log=(S("bfloat16", "tilelang", "tilelang"),))),
    ("hip-one-phase-set", ("--nsa-prefill-backend", "aiter"), V32, "hip", (9, 0),
     dict(ok=True, kv="bfloat16", backends=("aiter", "fa3"),
          log=(WARN_BACKEND, SET_BF16_SM9, S("bfloat16", "aiter", "fa3")))),
    ("dsa-dtype", ("--kv-cache-dtype", "fp8_e5m2"), V32, "cuda", (9, 0),
     dict(ok=False, kv="fp8_e5m2", backends=(None, None), log=(), stage="resolve", error_type="AssertionError",
          message="DeepSeek DSA only supports bf16/bfloat16 or fp8_e4m3 kv_cache_dtype",
          where="_set_default_nsa_kv_cache_dtype")),
    ("non-dsa-keeps-user-backend", ("--nsa-decode-backend", "fa3", "--kv-cache-dtype", "fp8_e5m2"), V3, "cuda", (9, 0),
     dict(ok=True, kv="fp8_e5m2", backends=(None, "fa3"), log=())),
    ("parser-choice", ("--kv-cache-dtype", "mxfp8"), V32, "cuda", (9, 0),
     dict(ok=False, stage="parser", error_type="SystemExit", kv=None, backends=(None, None), log=(), where=None,
          message=f"argument --kv-cache-dtype: invalid choice: 'mxfp8' (choose from {CHOICES})")),
    ("parser-dsa-flag", ("--dsa-prefill-backend", "flashmla_kv"), V32, "cuda", (9, 0),  # the rename is 0.5.13
     dict(ok=False, stage="parser", error_type="SystemExit", where=None,
          message="unrecognized arguments: --dsa-prefill-backend flashmla_kv")),
    ("radix-cache", ("--enable-hisparse",), V32, "cuda", (9, 0),
     dict(ok=False, stage="check", error_type="AssertionError",
          message="Hierarchical sparse attention currently requires --disable-radix-cache.")),
]

# 0.5.11, srt/server_args.py: _set_default_nsa_backends :1598-1613, "# Check hisparse" :6883-6912
HISPARSE_V1 = "HiSparse enabled: using flashmla_sparse NSA backends (prefill={}, decode={})."
R0511 = COMMON + [
    ("hisparse-bf16", H, V32, "cuda", (9, 0),
     dict(ok=True, kv="bfloat16", backends=("flashmla_sparse", "flashmla_sparse"),
          log=(SET_BF16_SM9, HISPARSE_V1.format("flashmla_sparse", "flashmla_sparse")))),
    ("hisparse-fp8-refused", H + ("--kv-cache-dtype", "fp8_e4m3"), V32, "cuda", (9, 0),
     dict(ok=False, kv="fp8_e4m3", backends=("flashmla_sparse", "flashmla_sparse"), stage="check",
          log=(HISPARSE_V1.format("flashmla_sparse", "flashmla_sparse"),), error_type="ValueError",
          message="HiSparse requires bfloat16 KV cache, but got --kv-cache-dtype=fp8_e4m3. "
                  "Please use --kv-cache-dtype=bfloat16.", where="srt/server_args.py:6909 check_server_args")),
    ("hisparse-backend", H + ("--nsa-decode-backend", "fa3", "--kv-cache-dtype", "bfloat16"), V32, "cuda", (9, 0),
     dict(ok=False, kv="bfloat16", backends=("flashmla_sparse", "fa3"), error_type="ValueError",
          message="HiSparse requires flashmla_sparse NSA decode backend, but got --nsa-decode-backend=fa3. "
                  "Please use --nsa-decode-backend=flashmla_sparse or omit it.",
          where="srt/server_args.py:6902 check_server_args")),
    ("hisparse-non-dsa", H, V3, "cuda", (10, 0),
     dict(ok=False, kv="auto", backends=(None, None), log=(), stage="check", error_type="AssertionError",
          message="--enable-hisparse is only supported for DSA (DeepSeek Sparse Attention) models now"
                  "(e.g., DeepSeek V3.2, GLM-5). ", where="srt/server_args.py:6888 check_server_args")),
]

# 0.5.12, srt/arg_groups/hisparse_hook.py: defaults :23-47, validate_hisparse :50-94
HISPARSE_V2 = "HiSparse enabled ({}): using NSA backends prefill={}, decode={}."
R0512 = COMMON + [
    ("hisparse-bf16", H, V32, "cuda", (9, 0),
     dict(ok=True, kv="bfloat16", backends=("flashmla_sparse", "flashmla_sparse"),
          log=(SET_BF16_SM9, HISPARSE_V2.format("bfloat16", "flashmla_sparse", "flashmla_sparse")))),
    ("hisparse-fp8", H + ("--kv-cache-dtype", "fp8_e4m3"), V32, "cuda", (9, 0),
     dict(ok=True, kv="fp8_e4m3", backends=("flashmla_kv", "flashmla_kv"),
          log=(HISPARSE_V2.format("fp8_e4m3", "flashmla_kv", "flashmla_kv"),))),
    ("hisparse-fp8-sparse-refused", H + ("--kv-cache-dtype", "fp8_e4m3", "--nsa-decode-backend", "flashmla_sparse"),
     V32, "cuda", (10, 0),
     dict(ok=False, kv="fp8_e4m3", backends=("flashmla_kv", "flashmla_sparse"), stage="check", error_type="ValueError",
          log=(HISPARSE_V2.format("fp8_e4m3", "flashmla_kv", "flashmla_sparse"),),
          message="HiSparse with --kv-cache-dtype=fp8_e4m3 requires --nsa-decode-backend in ['flashmla_kv'], "
                  "but got flashmla_sparse.", where="srt/arg_groups/hisparse_hook.py:91 validate_hisparse")),
    ("hisparse-non-dsa", H, V3, "cuda", (10, 0),
     dict(ok=False, kv="auto", backends=(None, None), log=(), stage="check", error_type="AssertionError",
          message="--enable-hisparse is only supported for DSA (DeepSeek Sparse Attention) models "
                  "(e.g., DeepSeek V3.2, GLM-5) and DeepSeek V4 now. ",
          where="srt/arg_groups/hisparse_hook.py:61 validate_hisparse")),
]

# 0.5.13 (and 0.5.13.post1, the same code): NSA renamed DSA. srt/server_args.py
# _set_default_dsa_kv_cache_dtype :1728-1754, _set_default_dsa_backends :1756-1800, the --nsa-*
# aliases :5744/:5762 (DeprecatedAliasStoreAction: argparse_actions.py print_deprecated_warning);
# srt/arg_groups/hisparse_hook.py as 0.5.12's with DSA in the texts
def D(kv, p, d):  # noqa: N802 - the log line of _set_default_dsa_backends
    return f"Set DSA backends for {kv} KV Cache: prefill={p}, decode={d}."


def NOTICE(phase):  # noqa: N802 - the deprecated alias's notice, in ANSI yellow
    return (f"\x1b[1;33m'--nsa-{phase}-backend' is deprecated and will be removed in a future release. "
            f"Use '--dsa-{phase}-backend' instead.\x1b[0m")


WARN_DSA = WARN_BACKEND.replace("--nsa-", "--dsa-")
HISPARSE_G3 = "HiSparse enabled ({}): using DSA backends prefill={}, decode={}."
NON_DSA = ("--enable-hisparse is only supported for DSA (DeepSeek Sparse Attention) models "
           "(e.g., DeepSeek V3.2, GLM-5) and DeepSeek V4 now. ")
DSA_COMMON = [
    ("hopper-auto", (), V32, "cuda", (9, 0),
     dict(ok=True, kv="bfloat16", backends=("flashmla_sparse", "fa3"),
          log=(SET_BF16_SM9, D("bfloat16", "flashmla_sparse", "fa3")))),
    ("blackwell-auto", (), V32, "cuda", (10, 0),
     dict(ok=True, kv="fp8_e4m3", backends=("trtllm", "trtllm"),
          log=("Setting KV cache dtype to fp8_e4m3 for DeepSeek DSA on SM10 device.", D("fp8_e4m3", "trtllm", "trtllm")))),
    ("aliases-log-in-the-order-typed", ("--nsa-decode-backend", "fa3", "--nsa-prefill-backend", "aiter"), V32, "hip", (9, 0),
     dict(ok=True, kv="bfloat16", backends=("aiter", "fa3"),
          log=(NOTICE("decode"), NOTICE("prefill"), WARN_DSA, SET_BF16_SM9, D("bfloat16", "aiter", "fa3")))),
    ("dsa-flag", ("--dsa-prefill-backend", "flashmla_kv", "--kv-cache-dtype", "fp8_e4m3"), V32, "cuda", (9, 0),
     dict(ok=True, kv="fp8_e4m3", backends=("flashmla_kv", "flashmla_kv"),
          log=(D("fp8_e4m3", "flashmla_kv", "flashmla_kv"),))),
    ("dsa-dtype", ("--kv-cache-dtype", "fp8_e5m2"), V32, "cuda", (9, 0),
     dict(ok=False, kv="fp8_e5m2", backends=(None, None), log=(), stage="resolve", error_type="AssertionError",
          message="DeepSeek DSA only supports bf16/bfloat16 or fp8_e4m3 kv_cache_dtype",
          where="_set_default_dsa_kv_cache_dtype")),
    ("hisparse-non-dsa", H, V3, "cuda", (10, 0),
     dict(ok=False, kv="auto", backends=(None, None), log=(), stage="check", error_type="AssertionError",
          message=NON_DSA, where="validate_hisparse")),
    ("hisparse-fp8", H + ("--kv-cache-dtype", "fp8_e4m3"), V32, "cuda", (9, 0),
     dict(ok=True, kv="fp8_e4m3", backends=("flashmla_kv", "flashmla_kv"),
          log=(HISPARSE_G3.format("fp8_e4m3", "flashmla_kv", "flashmla_kv"),))),
]
R0513 = DSA_COMMON + [
    ("hisparse-hip-is-flashmla", H, V32, "hip", (9, 4),  # ROCm HiSparse is 0.5.14
     dict(ok=True, kv="bfloat16", backends=("flashmla_sparse", "flashmla_sparse"),
          log=(SET_BF16_SM9, HISPARSE_G3.format("bfloat16", "flashmla_sparse", "flashmla_sparse")))),
    ("hisparse-alias-refused", H + ("--kv-cache-dtype", "fp8_e4m3", "--nsa-decode-backend", "flashmla_sparse"),
     V32, "cuda", (10, 0),
     dict(ok=False, kv="fp8_e4m3", backends=("flashmla_kv", "flashmla_sparse"), stage="check", error_type="ValueError",
          log=(NOTICE("decode"), HISPARSE_G3.format("fp8_e4m3", "flashmla_kv", "flashmla_sparse")),
          message="HiSparse with --kv-cache-dtype=fp8_e4m3 requires --dsa-decode-backend in ['flashmla_kv'], "
                  "but got flashmla_sparse.", where="srt/arg_groups/hisparse_hook.py:91 validate_hisparse")),
]
# 0.5.14: HiSparse on ROCm (srt/arg_groups/hisparse_hook.py _hisparse_default_backend :26,
# _hisparse_allowed_backends :32, validate_hisparse_dsa_backend :65-79)
R0514 = DSA_COMMON + [
    ("hisparse-hip-is-tilelang", H + ("--kv-cache-dtype", "fp8_e4m3"), V32, "hip", (9, 4),
     dict(ok=True, kv="fp8_e4m3", backends=("tilelang", "tilelang"),
          log=(HISPARSE_G3.format("fp8_e4m3", "tilelang", "tilelang"),))),
    ("hisparse-hip-refuses-cuda-backend", H + ("--kv-cache-dtype", "bfloat16", "--dsa-prefill-backend", "flashmla_sparse"),
     V32, "hip", (9, 4),
     dict(ok=False, kv="bfloat16", backends=("flashmla_sparse", "tilelang"), stage="check", error_type="ValueError",
          log=(HISPARSE_G3.format("bfloat16", "flashmla_sparse", "tilelang"),),
          message="HiSparse supports DSA prefill backend(s) ['aiter', 'tilelang'] on this platform with "
                  "--kv-cache-dtype=bfloat16, but got --dsa-prefill-backend=flashmla_sparse. Please use "
                  "--dsa-prefill-backend=tilelang or omit it.",
          where="srt/arg_groups/hisparse_hook.py:71 validate_hisparse_dsa_backend")),
]

RELEASES = {"0.5.11": ("sglang_0511", R0511), "0.5.12": ("sglang_0512", R0512),
            "0.5.12.post1": ("sglang_0512", R0512), "0.5.13": ("sglang_0513", R0513),
            "0.5.13.post1": ("sglang_0513", R0513), "0.5.14": ("sglang_0513", R0514)}
PARAMS = [pytest.param(v, c, id=f"{v}-{c[0]}") for v, (_, cases) in RELEASES.items() for c in cases]


def _driver(version):
    require(version)
    module = drivers.driver_for(version)  # as `hisparse conform` finds it
    assert module.__name__ == f"engine.sglang.conform.{RELEASES[version][0]}"
    module.load()
    return module


@pytest.mark.parametrize("version,spec", PARAMS)
def test_driver_hand_picked_cases(version, spec):
    driver = _driver(version)
    _, argv, architecture, platform, capability, want = spec
    r = driver.run_case(Case(argv, architecture, platform, capability))
    got = dict(ok=r.ok, kv=r.kv_cache_dtype, backends=r.backends, log=r.log, stage=r.stage,
               error_type=r.error_type, message=r.message, where=r.where)
    want = dict(want)
    want.setdefault("stage", "done" if want["ok"] else "check")
    if want["ok"]:
        want.update(message=None, where=None, error_type=None)
    if want.get("where") and " " not in want["where"]:  # only the function named: check that part
        got["where"] = r.where and r.where.split(" ")[-1]
    assert {k: got[k] for k in want} == want
    if r.where:  # the line named is the raise or assert of the installed source
        path, _, rest = r.where.partition(":")
        line = linecache.getline(os.path.join(driver._driver.package_dir, path), int(rest.split(" ")[0]))
        assert line.strip().startswith(("assert", "raise")), (r.where, line)


@pytest.mark.parametrize("version", list(RELEASES))
def test_driver_leaves_the_process_as_it_found_it(version):
    driver = _driver(version)
    import torch

    import sglang.srt.server_args as server_args
    import sglang.srt.utils as utils

    before = (server_args.is_hip, utils.is_hip, torch.cuda.get_device_capability, torch.cuda.is_available)
    env = dict(os.environ)
    r = driver.run_case(Case(("--kv-cache-dtype", "bf16"), "GlmMoeDsaForCausalLM", "hip", (10, 0)))
    assert r.ok and r.backends == ("tilelang", "tilelang")
    assert (server_args.is_hip, utils.is_hip, torch.cuda.get_device_capability, torch.cuda.is_available) == before
    assert dict(os.environ) == env  # the DSA branch set SGLANG_NSA_PREFILL_DENSE_ATTN_KV_LEN_THRESHOLD


@pytest.mark.parametrize("version", list(RELEASES))
def test_driver_refuses_an_unknown_architecture(version):
    driver = _driver(version)
    # the model folders every driver shares (model_folders.py) know no such model
    with pytest.raises(ValueError, match="no model config for architecture 'Nope'; known: "):
        driver.run_case(Case((), "Nope", "cuda", (9, 0)))


def test_driver_refuses_an_unknown_platform():
    from engine.sglang.conform import sglang_0512

    with pytest.raises(ValueError, match="platform 'npu': this driver runs cuda or hip"):
        sglang_0512.run_case(Case((), V32, "npu", (9, 0)))  # before any import of SGLang


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("args,text", [((), "usage: "), (("0.5.9", "DIR"), "no SGLang release facts for '0.5.9'"),
                                       (("latest", "DIR"), "no SGLang release facts for 'latest'"),
                                       (("0.5.12", "INSIDE"), "is inside this checkout")])
def test_env_script_refuses_bad_usage(tmp_path, args, text):
    import subprocess

    script = os.path.join(ROOT, "tools", "sglang-env.sh")
    inside = os.path.join(ROOT, "build", "no-such-envs")
    args = tuple({"DIR": str(tmp_path / "env"), "INSIDE": inside}.get(a, a) for a in args)
    proc = subprocess.run(["bash", script, *args], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and text in proc.stderr
    assert not (tmp_path / "env").exists() and not os.path.exists(inside)  # nothing was created


@pytest.mark.parametrize("pins", sorted(os.listdir(os.path.join(ROOT, "tools", "pins"))))
def test_env_pins_are_exact_and_name_no_torch(pins):
    """One pin per package, name==version (installed with --no-deps: a range would drift), no torch
    (the CPU build is installed first, by itself)."""
    with open(os.path.join(ROOT, "tools", "pins", pins), encoding="utf-8") as fh:
        lines = [l.split("#")[0].strip() for l in fh]
    names = [l.split("==")[0].lower().replace("_", "-") for l in lines if l]
    assert all(l.count("==") == 1 for l in lines if l) and len(names) == len(set(names))
    assert "torch" not in names and pins.removeprefix("transformers-").removesuffix(".txt") in \
        [l.split("==")[1] for l in lines if l.lower().startswith("transformers==")]


def test_a_renamed_field_is_an_error_not_a_silent_none():
    """The 0.5.12 names on a 0.5.13 ServerArgs: every missing field and method is named (load()
    refuses the release with them) instead of backends read back as (None, None)."""
    import dataclasses

    from engine.sglang.conform.prepipeline import DSA, NSA, renamed

    @dataclasses.dataclass
    class ServerArgs:  # 0.5.13's names
        dsa_prefill_backend: str = None
        dsa_decode_backend: str = None

        def _set_default_dsa_kv_cache_dtype(self):
            pass

        def _set_default_dsa_backends(self):
            pass

    assert renamed(ServerArgs, DSA) == []
    assert renamed(ServerArgs, NSA) == ["field nsa_prefill_backend", "field nsa_decode_backend",
                                        "method _set_default_nsa_kv_cache_dtype", "method _set_default_nsa_backends"]


def test_the_installed_release_refuses_the_other_names():
    from engine.sglang.conform.prepipeline import DSA, NSA, Driver
    from engine.sglang.conform.sglang_0512 import hisparse_check

    installed = require(list(RELEASES))
    names, other = (NSA, DSA) if RELEASES[installed][0] in ("sglang_0511", "sglang_0512") else (DSA, NSA)
    with pytest.raises(RuntimeError, match=f"ServerArgs has no field {other.fields[0]}, field {other.fields[1]}"):
        Driver(installed, hisparse_check, (), other).load()


def test_driver_refuses_another_installed_release():
    from engine.sglang.conform.prepipeline import Driver

    installed = INSTALLED
    with pytest.raises(RuntimeError, match=f"runs SGLang 0.0.1; the installed SGLang is {installed or 'absent'}"):
        Driver("0.0.1", lambda module: None, ()).load()


# -- DeepSeek-V4: the whole start-up (launch.py) ------------------------------------------------
# Expected values read from each release's srt/arg_groups/deepseek_v4_hook.py (apply_deepseek_v4_defaults:
# page 256, max_running_requests 256, kv auto -> fp8_e4m3 and its assert; 0.5.12 alone refuses PD with
# pipeline parallelism) and hisparse_hook.py (0.5.14 checks an explicit DSA backend for V4 on CUDA)
V4 = "DeepseekV4ForCausalLM"
KV_LINE = "Setting KV cache dtype to fp8_e4m3 for DeepseekV4ForCausalLM."
MRR_LINE = "Setting max_running_requests to 256 for DeepseekV4ForCausalLM."
V4_CASES = {  # release -> {case: expected}; the log of a plain launch: max_running_requests first
    # before 0.5.14 (the dtype defaulted after it), then the dtype first
    "0.5.12": {"plain": dict(ok=True, log=(MRR_LINE, KV_LINE)),
               "bf16": dict(ok=False, stage="resolve", error_type="AssertionError",
                            message="bfloat16 is not supported for DeepseekV4ForCausalLM",
                            where="srt/arg_groups/deepseek_v4_hook.py:32 apply_deepseek_v4_defaults"),
               "pd-pp": dict(ok=False, stage="resolve", error_type="ValueError",
                             message="V4 PD disaggregation requires pp_size=1, got pp_size=2.",
                             where="srt/arg_groups/deepseek_v4_hook.py:57 apply_deepseek_v4_defaults"),
               "hisparse-backend": dict(ok=True)},
    "0.5.14": {"plain": dict(ok=True, log=(KV_LINE, MRR_LINE)),
               "bf16": dict(ok=True),
               "hisparse-backend": dict(
                   ok=False, stage="check", error_type="ValueError",
                   message="HiSparse supports DSA prefill backend(s) ['flashmla_kv'] on this platform with "
                           "--kv-cache-dtype=fp8_e4m3, but got --dsa-prefill-backend=flashmla_sparse. Please use "
                           "--dsa-prefill-backend=flashmla_kv or omit it.",
                   where="srt/arg_groups/hisparse_hook.py:71 validate_hisparse_dsa_backend")},
}
V4_CASES["0.5.12.post1"] = {**V4_CASES["0.5.12"], "pd-pp": dict(ok=True)}  # the PD/pp raise is gone
V4_CASES["0.5.13"] = V4_CASES["0.5.13.post1"] = V4_CASES["0.5.12.post1"]
V4_ARGV = {"plain": (), "bf16": ("--kv-cache-dtype", "bfloat16"),
           "pd-pp": ("--disaggregation-mode", "prefill", "--pp-size", "2", "--tp-size", "2"),
           "hisparse-backend": ("--enable-hisparse", "--disable-radix-cache", "--dsa-prefill-backend", "flashmla_sparse")}


@pytest.mark.parametrize("version,name", [(v, n) for v, cases in V4_CASES.items() for n in cases])
def test_deepseek_v4_runs_the_whole_start_up(version, name):
    driver = _driver(version)
    argv = V4_ARGV[name]
    if version.startswith("0.5.12") and name == "hisparse-backend":  # no --dsa-* flag yet
        argv = tuple(a.replace("--dsa-", "--nsa-") for a in argv)
    r = driver.run_case(Case(argv, V4, "cuda", (9, 0), reads=("attention_backend", "page_size"), routing="dsv4"))
    want = V4_CASES[version][name]
    got = dict(ok=r.ok, log=r.log, stage=r.stage, error_type=r.error_type, message=r.message, where=r.where)
    assert {k: got[k] for k in want} == want
    if r.ok:
        assert dict(r.values) == {"attention_backend": "dsv4", "page_size": 256}
    if r.where:  # the line named is the raise or assert of the installed source
        path, _, rest = r.where.partition(":")
        line = linecache.getline(os.path.join(driver._driver.package_dir, path), int(rest.split(" ")[0]))
        assert line.strip().startswith(("assert", "raise")), (r.where, line)


def test_deepseek_v4_is_no_model_of_0_5_11():
    driver = _driver("0.5.11")
    r = driver.run_case(Case((), V4, "cuda", (9, 0), routing="dsv4"))
    assert (r.ok, r.stage, r.error_type) == (False, "resolve", "ValueError")
    assert "model type `deepseek_v4` but Transformers does not recognize this architecture" in r.message
