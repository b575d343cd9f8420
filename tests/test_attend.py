"""attend(): the bridge runs the backend the policy chose, and refuses what the policy refuses
before any work."""
import json
import sys

import pytest
import torch

import engine
import kernels_bridge
from kernels_bridge import RoutingRejected, ValidationError, attend, quantize_kv_fp8
from kernels_bridge import reference
from kernels_bridge.gpu_check import check
import tests.oracles.bridge_oracle as oracle
from tests.helpers import run_cli

HISPARSE = {"enable_hisparse": True, "disable_radix_cache": True}


def _decode_inputs(b=2, h=64, topk=128, blocks=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, 1, h, 576, generator=g).to(torch.bfloat16)
    kv = torch.randn(blocks * 64, 576, generator=g).to(torch.bfloat16)
    cache = quantize_kv_fp8(kv).view(blocks, 64, 1, 656)
    idx = torch.randint(0, blocks * 64, (b, 1, topk), generator=g, dtype=torch.int32)
    return q, cache, idx, kv


def _prefill_inputs(s_q=3, h=64, topk=128, s_kv=300, seed=1):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(s_q, h, 576, generator=g).to(torch.bfloat16)
    kv = torch.randn(s_kv, 1, 576, generator=g).to(torch.bfloat16)
    idx = torch.randint(0, s_kv, (s_q, 1, topk), generator=g, dtype=torch.int32)
    return q, kv, idx


@pytest.fixture
def no_kernels(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("a kernel ran")

    monkeypatch.setattr(reference, "decode_compute", boom)
    monkeypatch.setattr(reference, "prefill_compute", boom)


def test_fp8_rows_run_flashmla_kv():
    q, cache, idx, _ = _decode_inputs()
    got = attend(HISPARSE, q, cache, idx, policy="dsa-backends@2")
    out, lse = oracle.decode_oracle(q, cache, idx)  # flashmla_kv's semantics, computed independently
    assert got.provider == "reference" and got.max_logits is None  # flashmla_kv has no max_logits
    assert check("decode_out", got.out, torch.from_numpy(out))["passed"]
    assert check("decode_lse", got.lse, torch.from_numpy(lse))["passed"]


def test_bf16_rows_run_flashmla_sparse_for_prefill():
    q, kv, idx = _prefill_inputs()
    got = attend(dict(HISPARSE, kv_cache_dtype="bfloat16"), q, kv, idx, phase="prefill",
                 policy="dsa-backends@2", sm_scale=0.1)
    out, mx, lse = oracle.prefill_oracle(q, kv, idx, 0.1)  # flashmla_sparse's semantics
    assert check("prefill_out", got.out, torch.from_numpy(out))["passed"]
    assert check("prefill_max_logits", got.max_logits, torch.from_numpy(mx))["passed"]


def test_bf16_rows_into_flashmla_kv_fail_with_the_policys_message(no_kernels):
    q, kv, idx = _prefill_inputs()
    with pytest.raises(RoutingRejected) as exc:
        attend(dict(HISPARSE, nsa_decode_backend="flashmla_kv"), q, kv, idx, policy="dsa-backends@2")
    assert str(exc.value) == ("HiSparse with --kv-cache-dtype=bfloat16 requires --nsa-decode-backend in "
                              "['flashmla_sparse'], but got flashmla_kv.")
    assert exc.value.decision.violations[0].check == "hisparse-backend-dtype"
    # version 1 refuses FP8 under HiSparse altogether
    q, cache, idx, _ = _decode_inputs()
    with pytest.raises(RoutingRejected, match="HiSparse requires bfloat16 KV cache"):
        attend(HISPARSE, q, cache, idx, policy="dsa-backends@1")


def test_decision_and_rows_must_agree(no_kernels):
    q, kv, idx = _prefill_inputs()
    decision = engine.evaluate("dsa-backends@2", dict(HISPARSE, kv_cache_dtype="fp8_e4m3"))
    with pytest.raises(ValidationError, match="holds bfloat16 rows .* decided for a fp8_e4m3"):
        attend(decision, q, kv, idx, phase="prefill", sm_scale=0.1)
    with pytest.raises(ValidationError, match="holds bfloat16 rows"):
        attend(dict(HISPARSE, kv_cache_dtype="fp8_e4m3"), q, kv, idx, policy="dsa-backends@2")


def test_backends_the_bridge_cannot_run(no_kernels):
    q, cache, idx, _ = _decode_inputs()
    decision = engine.evaluate("dsa-backends@2", {"kv_cache_dtype": "fp8_e4m3", "sm_major": 10})
    assert decision.backends["decode"] == "trtllm"
    with pytest.raises(ValidationError, match="the policy chose 'trtllm' for decode; the bridge runs"):
        attend(decision, q, cache, idx)
    plain = engine.evaluate("dsa-backends@2", {"dsa_model": False})
    with pytest.raises(RoutingRejected, match="chose no decode backend"):
        attend(plain, q, cache, idx)
    with pytest.raises(ValidationError, match="no phase 'verify'"):
        attend(engine.evaluate("dsa-backends@2", HISPARSE), q, cache, idx, phase="verify")


def test_lazy_exports():
    assert kernels_bridge.attend is attend
    assert kernels_bridge.cache_dtype_of(torch.zeros(2, 656, dtype=torch.uint8)) == "fp8_e4m3"
    assert kernels_bridge.cache_dtype_of(torch.zeros(2, 576, dtype=torch.bfloat16)) == "bfloat16"
    assert kernels_bridge.cache_dtype_of(torch.zeros(2, 576)) is None


def test_doctor_cli(capsys, monkeypatch):
    """Without flash_mla (made unimportable here), the doctor says so for every backend and
    names the reference as the provider; the bridge itself is usable (exit 0)."""
    from kernels_bridge import flashmla

    flashmla.reset_probe()
    monkeypatch.setattr(flashmla, "_probe", None)
    monkeypatch.setitem(sys.modules, "flash_mla", None)
    code, out, _ = run_cli(capsys, "doctor")
    assert code == 0
    assert "flashmla_kv" in out and "flashmla_sparse" in out and "reference: flash_mla does not import" in out
    code, out, _ = run_cli(capsys, "doctor", "--format", "json")
    report = json.loads(out)
    assert code == 0 and report["bridge"]["usable"] is True
    assert report["flash_mla"]["usable"] is False and "flash_mla does not import" in report["flash_mla"]["reason"]
    assert {b: r["provider"] for b, r in report["backends"].items()} == {b: "reference" for b in kernels_bridge.BACKENDS}
    flashmla.reset_probe()


def test_threads_option_sets_and_reports_torch_threads(capsys):
    import torch

    before = torch.get_num_threads()
    try:
        code, out, _ = run_cli(capsys, "attend", "--requests", "1", "--context", "256", "--hisparse-top-k", "128",
                               "--hisparse-device-buffer-size", "128", "--steps", "1", "--threads", "1", "--format", "json")
        assert code == 0
        assert json.loads(out)["workload"]["threads"] == 1 and torch.get_num_threads() == 1
        code, _, err = run_cli(capsys, "attend", "--threads", "0")
        assert code == 2 and "--threads: invalid value: '0' (from 1 to" in err
    finally:
        torch.set_num_threads(before)
