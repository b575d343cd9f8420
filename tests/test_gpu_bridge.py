"""kernels_bridge/gpu_check.py (also run as bench/gpu_check.py) and the real FlashMLA kernels.

The `gpu` tests run only where CUDA and flash_mla are present (tests/conftest.py skips them
elsewhere); the rest prove the check script here: its skip path, its tolerance test, and its whole
pipeline against the stand-in flash_mla on CPU tensors.
"""
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kernels_bridge import gpu_check
from kernels_bridge.gpu_check import allclose_report
from kernels_bridge import flashmla, quantize_kv_fp8, run_backend
import tests.oracles.fake_flash_mla as fake_flash_mla

ROOT = Path(__file__).resolve().parent.parent


# ---- the check script on a machine without a GPU ----------------------------------------------

@pytest.mark.skipif(torch.cuda.is_available(), reason="the skip path needs a machine without CUDA")
@pytest.mark.parametrize("how", ["script", "module", "bridge"])
def test_gpu_check_skips_cleanly_here(tmp_path, how):
    out = tmp_path / "summary.json"
    cmd = {"script": [sys.executable, "bench/gpu_check.py"], "module": [sys.executable, "-m", "bench.gpu_check"],
           "bridge": [sys.executable, "-m", "kernels_bridge.gpu_check"]}[how] + ["--out", str(out)]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["skipped"] is True and summary["passed"] is None
    assert summary["reason"]
    assert summary["doctor"]["backends"]["flashmla_kv"]["provider"] == "reference"
    assert json.loads(out.read_text()) == summary


TINY_PLAN = [
    ("prefill", (64, 3, 3000), {"iters": 2}),
    ("prefill", (128, 2, 2500), {"sink": True, "topk_length": True}),
    ("decode", (64, 2), {"iters": 2, "min_rows": 64 * 64}),
    ("decode", (128, 1, 2), {"sink": True, "min_rows": 64 * 64}),
]


@pytest.mark.parametrize("flavour", ["sgl-use-legacy", "upstream-log2-lse"])
def test_gpu_check_pipeline_against_the_stand_in(monkeypatch, flavour):
    fake_flash_mla.install(monkeypatch, flavour)
    summary = gpu_check.run(device="cpu", plan=TINY_PLAN)
    json.dumps(summary, default=str)
    assert summary["skipped"] is False and summary["errors"] == []
    assert summary["passed"] is True, summary
    assert summary["fp8_parity"]["passed"]
    skipped = 2 if flavour == "upstream-log2-lse" else 0    # no attn_sink / topk_length there
    assert len(summary["not_run"]) == skipped
    assert len(summary["cases"]) == len(TINY_PLAN) - skipped
    for case in summary["cases"]:
        assert all(c["passed"] for c in case["checks"])
    timed = [c for c in summary["cases"] if "bridge_us" in c]
    assert {c["backend"] for c in timed} == {"flashmla_sparse", "flashmla_kv"}
    for case in timed:
        assert case["bridge_us"] > 0 and case["direct_us"] > 0 and case["tflops_direct"] > 0
    assert set(summary["summary"]) == {"flashmla_sparse", "flashmla_kv"}


def test_gpu_check_fails_on_a_wrong_kernel(monkeypatch):
    mod = fake_flash_mla.install(monkeypatch, "sgl-use-legacy")
    real = mod.flash_mla_with_kvcache

    def off_by_a_bit(*args, **kwargs):
        out, lse = real(*args, **kwargs)
        return out * 1.05, lse
    off_by_a_bit.__signature__ = __import__("inspect").signature(real)
    monkeypatch.setattr(mod, "flash_mla_with_kvcache", off_by_a_bit)
    summary = gpu_check.run(device="cpu", plan=[TINY_PLAN[2]])
    assert summary["passed"] is False
    (case,) = summary["cases"]
    assert [c["passed"] for c in case["checks"]] == [False, True]
    monkeypatch.setattr(gpu_check, "run", lambda quick=False: summary)
    assert gpu_check.main([]) == 1


def test_gpu_check_reports_kernel_errors(monkeypatch):
    fake_flash_mla.install(monkeypatch, "sgl-use-legacy")
    summary = gpu_check.run(device="cpu", plan=[("decode", (32, 2), {"min_rows": 4096})])
    assert summary["passed"] is False and "ValidationError" in summary["errors"][0]["error"]


# ---- FlashMLA's closeness test, as the check applies it ---------------------------------------

def test_allclose_passes_within_tolerance():
    ref = torch.randn(64, 512)
    ans = (ref * (1 + 2 ** -9)).to(torch.bfloat16)
    assert allclose_report("out", ans, ref, 1e-3, 2.01 / 128, 5e-6)["passed"]


def test_allclose_needs_abs_or_rel():
    ref = torch.tensor([1.0, 1e-4, 100.0])
    ok = allclose_report("x", ref + torch.tensor([0.01, 5e-4, 0.5]), ref, 1e-3, 0.02, 1e-2)
    assert ok["passed"]                            # rel, abs, rel
    bad = allclose_report("x", ref + torch.tensor([0.0, 0.0, 5.0]), ref, 1e-3, 0.02, 1)
    assert not bad["passed"] and bad["failed"] == 1


def test_allclose_requires_matching_anomalies():
    ref = torch.tensor([1.0, math.inf, -math.inf, math.nan])
    assert allclose_report("lse", ref.clone(), ref, 1e-6, 1e-6)["passed"]
    moved = torch.tensor([math.inf, 1.0, -math.inf, math.nan])
    report = allclose_report("lse", moved, ref, 1e-6, 1e-6)
    assert not report["passed"] and not report["anomalies_match"]


def test_allclose_cosine_check():
    ref = torch.randn(1000)
    noisy = ref + torch.randn(1000) * 0.01        # every element within abs_tol 0.1
    report = allclose_report("out", noisy, ref, 0.1, 0.0, 1e-6)
    assert report["failed"] == 0 and report["cos_diff"] > 1e-6 and not report["passed"]


# ---- on a GPU with flash_mla ------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("h_q", [64, 128])
def test_flashmla_matches_reference_on_gpu(h_q):
    flashmla.reset_probe()
    dev = torch.device("cuda")
    torch.backends.cuda.matmul.allow_tf32 = False
    g = torch.Generator(device=dev).manual_seed(h_q)
    q = (torch.randn(64, h_q, 576, generator=g, device=dev) / 4).to(torch.bfloat16)
    kv = torch.randn(4096, 1, 576, generator=g, device=dev).to(torch.bfloat16)
    idx = torch.randint(-4, 4100, (64, 1, 2048), generator=g, device=dev).to(torch.int32)
    got = run_backend("flashmla_sparse", q, kv, idx, sm_scale=576 ** -0.5, provider="flashmla")
    ref = run_backend("flashmla_sparse", q, kv, idx, sm_scale=576 ** -0.5, provider="reference")
    assert gpu_check.check("prefill_out", got.out, ref.out)["passed"]
    assert gpu_check.check("prefill_lse", got.lse, ref.lse)["passed"]
    assert gpu_check.check("prefill_max_logits", got.max_logits, ref.max_logits)["passed"]
    cache = quantize_kv_fp8(kv[:, 0]).view(64, 64, 1, 656)
    dq = q[:8].view(8, 1, h_q, 576)
    didx = torch.where(idx[:8, 0] >= 4096, -1, idx[:8, 0].clamp_min(-1)).view(8, 1, 2048)
    got = run_backend("flashmla_kv", dq, cache, didx, provider="flashmla")
    ref = run_backend("flashmla_kv", dq, cache, didx, provider="reference")
    assert gpu_check.check("decode_out", got.out, ref.out)["passed"]
    assert gpu_check.check("decode_lse", got.lse, ref.lse)["passed"]


@pytest.mark.gpu
@pytest.mark.slow
def test_gpu_check_quick_run_passes():
    flashmla.reset_probe()
    summary = gpu_check.run(quick=True)
    assert summary["skipped"] is False and summary["passed"] is True, summary["errors"]
