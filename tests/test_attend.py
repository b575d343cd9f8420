"""attend(): the bridge runs the backend the policy chose, and refuses what the policy refuses
before any work."""
import json

import pytest
import torch

import engine
import kernels_bridge
from kernels_bridge import RoutingRejected, ValidationError, attend, quantize_kv_fp8, run_backend
from kernels_bridge import reference
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
    want = run_backend("flashmla_kv", q, cache, idx)
    assert got.provider == "reference"
    assert torch.equal(got.out, want.out) and torch.equal(got.lse, want.lse)


def test_bf16_rows_run_flashmla_sparse_for_prefill():
    q, kv, idx = _prefill_inputs()
    got = attend(dict(HISPARSE, kv_cache_dtype="bfloat16"), q, kv, idx, phase="prefill",
                 policy="dsa-backends@2", sm_scale=0.1)
    want = run_backend("flashmla_sparse", q, kv, idx, sm_scale=0.1)
    assert torch.equal(got.out, want.out)


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


def test_doctor_cli(capsys):
    code, out, _ = run_cli(capsys, "doctor")
    assert code == 0
    assert "flashmla_kv" in out and "reference" in out
    code, out, _ = run_cli(capsys, "doctor", "--format", "json")
    report = json.loads(out)
    for backend in kernels_bridge.BACKENDS:
        provider, _ = kernels_bridge.select_provider(backend, None)
        assert report["backends"][backend]["provider"] == provider
    if not report["flash_mla"]["usable"]:  # e.g. here: no CUDA; the reason is always given
        assert report["flash_mla"]["reason"] and report["backends"]["flashmla_kv"]["provider"] == "reference"


def test_threads_option_sets_and_reports_torch_threads(capsys):
    import torch

    before = torch.get_num_threads()
    try:
        code, out, _ = run_cli(capsys, "attend", "--requests", "1", "--context", "256", "--hisparse-top-k", "128",
                               "--hisparse-device-buffer-size", "128", "--steps", "1", "--threads", "1", "--format", "json")
        assert code == 0
        assert json.loads(out)["workload"]["threads"] == 1 and torch.get_num_threads() == 1
        code, _, err = run_cli(capsys, "attend", "--threads", "0")
        assert code == 2 and "--threads 0" in err
    finally:
        torch.set_num_threads(before)
