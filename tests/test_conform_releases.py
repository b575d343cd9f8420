"""The pipeline driver on the SGLang release installed where the tests run (0.5.19 to 0.5.23), and
`hisparse conform` without --policy there. Expected values are read from each release's code (file
and line in each test). Skipped, naming the setup, where no pipeline release is installed; the
driver's release-independent parts are tested in test_conform_dispatch.py.

Setup for release X (Python 3.11): `make conform-env SGLANG=X`, or an environment with the light
pins of docs/conform.md and the release's unpacked wheel first on PYTHONPATH."""
import json
import subprocess
import sys

import pytest

from engine.sglang.registry import release_key
from engine.sglang.conform import drivers, pipeline
from engine.sglang.conform.protocol import Case
from tests.sglang_release import require

RELEASE = require(pipeline.RELEASES)

V32, V3 = "DeepseekV32ForCausalLM", "DeepseekV3ForCausalLM"
H = ("--enable-hisparse", "--disable-radix-cache")


def at_least(release: str) -> bool:
    return release_key(RELEASE) >= release_key(release)


@pytest.fixture(scope="module")
def driver():
    version, reason = drivers.installed_sglang()
    assert version == RELEASE, reason
    pipeline.load()
    return pipeline


def run(driver, argv, architecture=V32, platform="cuda", capability=(9, 0)):
    return driver.run_case(Case(tuple(argv), architecture, platform, capability))


def test_the_release_is_read_from_its_own_code(driver):
    import dataclasses

    from engine.sglang.conform.machine import known_facts

    # override_platform knows is_mps and is_sm110 from 0.5.22 (srt/runtime_context.py _PLATFORM_PROBES)
    assert ({"is_mps", "is_sm110"} <= known_facts()) == at_least("0.5.22")
    # ServerArgs: a dataclass in 0.5.19 (srt/server_args.py:356), a msgspec Struct from 0.5.20
    assert dataclasses.is_dataclass(driver._STATE.ServerArgs) == (RELEASE == "0.5.19")
    assert (driver._STATE.fields is None) == (RELEASE == "0.5.19")


def test_nsa_spellings(driver):
    r = run(driver, ["--nsa-prefill-backend", "fa3", "--kv-cache-dtype", "bfloat16"])
    if at_least("0.5.20"):  # removed from the parser
        assert (r.ok, r.stage, r.message) == (False, "parser", "unrecognized arguments: --nsa-prefill-backend fa3")
    else:  # 0.5.19: a deprecated alias, its notice logged first (srt/arg_groups/argparse_actions.py:110)
        assert r.ok and r.backends == ("fa3", "fa3")
        assert r.log[0] == ("\033[1;33m'--nsa-prefill-backend' is deprecated and will be removed in a "
                            "future release. Use '--dsa-prefill-backend' instead.\033[0m")


def test_fp4_e2m1(driver):
    r = run(driver, ["--kv-cache-dtype", "fp4_e2m1"])
    assert not r.ok
    if at_least("0.5.21"):  # no longer a choice (srt/arg_groups/fields/model.py)
        assert r.stage == "parser" and "invalid choice: 'fp4_e2m1'" in r.message
    else:  # the DSA dtype assert (0.5.20 srt/arg_groups/overrides.py:612)
        assert (r.stage, r.error_type) == ("resolve", "AssertionError")
        assert r.message == "DeepSeek DSA only supports bf16/bfloat16 or fp8_e4m3 kv_cache_dtype"


def test_tilelang_with_fp8_on_cuda(driver):
    r = run(driver, ["--kv-cache-dtype", "fp8_e4m3", "--dsa-prefill-backend", "tilelang",
                     "--dsa-decode-backend", "tilelang"])
    if at_least("0.5.22"):  # tilelang/tilelang with FP8 on SM >= 8.9 is accepted
        assert r.ok and r.backends == ("tilelang", "tilelang")
        return
    assert not r.ok and r.log == ()
    if RELEASE == "0.5.19":  # _check_tilelang_dsa_fp8_kv (overrides.py:660)
        assert r.message.endswith("Use --kv-cache-dtype bfloat16 with the tilelang backend, or keep "
                                  "--kv-cache-dtype fp8_e4m3 and pick an fp8-capable DSA backend "
                                  "(flashmla_kv on Hopper, trtllm on Blackwell).")
    else:  # _check_dsa_backend_constraints (0.5.20 overrides.py:641, 0.5.21 :544)
        assert r.message.startswith("The tilelang DSA prefill/decode kernels only support an fp8_e4m3 "
                                    "KV cache on ROCm/HIP; on CUDA they require a bfloat16 KV cache. "
                                    "Use --kv-cache-dtype bfloat16, or keep")


def test_rocm_defaults(driver):
    r = run(driver, ["--kv-cache-dtype", "bfloat16"], platform="hip", capability=(9, 4))
    # 0.5.20 defaults each unset phase to triton on ROCm (overrides.py:_dsa_split_backend_resolution)
    assert r.ok and r.backends == (("triton", "triton") if at_least("0.5.20") else ("tilelang", "tilelang"))


def test_hisparse_model_assertion(driver):
    r = run(driver, H, architecture=V3)
    assert (r.ok, r.stage, r.error_type) == (False, "check", "AssertionError")
    tail = ", DeepSeek V4, and MiniMax M3 now. " if at_least("0.5.21") else " and DeepSeek V4 now. "
    assert r.message == ("--enable-hisparse is only supported for DSA (DeepSeek Sparse Attention) "
                         "models (e.g., DeepSeek V3.2, GLM-5)" + tail)


@pytest.mark.parametrize("n", [pytest.param(1000, marks=pytest.mark.whole), 300])
def test_conform_without_policy_runs_the_installed_release_version(n):
    """The whole path an operator takes: the versions that model the installed release (one per
    family), said on stderr, each agree on a stratified sample (of 1,000 configs in make test-whole)."""
    from engine.cli.versions import modelled_releases

    table = modelled_releases()
    assert RELEASE in table, f"no shipped policy version models SGLang {RELEASE}"
    refs = sorted(ref for ref, _, _ in table[RELEASE])
    families = [ref.rpartition("@")[0] for ref in refs]
    assert len(set(families)) == len(refs) and "dsa-backends" in families  # one version per family
    proc = subprocess.run([sys.executable, "-m", "engine.cli", "conform", "--sample", str(n), "--seed", "11",
                           "--format", "json"], capture_output=True, text=True, timeout=1800)
    named = ", ".join(refs)
    said = f"the version{'s' if len(refs) > 1 else ''} that model{'' if len(refs) > 1 else 's'} the installed SGLang"
    assert f"no --policy: {named}, {said} {RELEASE}" in proc.stderr, proc.stderr
    out = json.loads(proc.stdout)
    reports = out["reports"] if len(refs) > 1 else [out]
    assert proc.returncode == 0 and out["conformant"], json.dumps([r["groups"][:2] for r in reports], indent=1)
    assert sorted(f"{r['policy']['family']}@{r['policy']['version']}" for r in reports) == refs
    for report in reports:
        assert report["counts"]["differ"] == 0 and report["sglang"] == RELEASE and report["warning"] is None
        assert report["total"] == min(n, report["domain_size"])
