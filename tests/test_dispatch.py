"""run_backend: backend names, providers, results."""
import math

import pytest
import torch

from kernels_bridge import (BACKENDS, ProviderUnavailable, ValidationError, flashmla,
                            quantize_kv_fp8, run_backend, sparse_decode_fp8, sparse_prefill)
from kernels_bridge.dispatch import PROVIDERS, AttentionResult, select_provider
import tests.oracles.fake_flash_mla as fake_flash_mla

BF16, I32 = torch.bfloat16, torch.int32


@pytest.fixture
def no_flash_mla(monkeypatch):
    """This machine as the suite expects it: flash_mla absent."""
    flashmla.reset_probe()
    monkeypatch.setattr(flashmla, "_probe", None)
    monkeypatch.setitem(__import__("sys").modules, "flash_mla", None)
    yield
    flashmla.reset_probe()


def prefill_args(h_q=128, s_q=4, s_kv=700, topk=256, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(s_q, h_q, 576, generator=g).to(BF16)
    kv = torch.randn(s_kv, 1, 576, generator=g).to(BF16)
    idx = torch.randint(-3, s_kv + 3, (s_q, 1, topk), generator=g).to(I32)
    return q, kv, idx


def decode_args(h_q=64, b=3, s_q=1, nb=6, bs=64, topk=128, seed=1):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, s_q, h_q, 576, generator=g).to(BF16)
    cache = quantize_kv_fp8(torch.randn(nb * bs, 576, generator=g).to(BF16))
    idx = torch.randint(-1, nb * bs, (b, s_q, topk), generator=g).to(I32)
    return q, cache.view(nb, bs, 1, 656), idx


def test_public_names():
    assert BACKENDS == ("flashmla_sparse", "flashmla_kv")
    assert PROVIDERS == ("auto", "reference", "flashmla")
    assert AttentionResult._fields == ("out", "lse", "max_logits", "provider")


def test_sparse_backend_runs_the_reference_here(no_flash_mla):
    q, kv, idx = prefill_args()
    sink = torch.randn(128)
    lengths = torch.tensor([256, 0, 17, 200], dtype=I32)
    got = run_backend("flashmla_sparse", q, kv, idx, sm_scale=0.08, attn_sink=sink,
                      topk_length=lengths)
    want = sparse_prefill(q, kv, idx, 0.08, attn_sink=sink, topk_length=lengths)
    assert isinstance(got, AttentionResult) and got.provider == "reference"
    assert torch.equal(got.out, want[0]) and torch.equal(got.max_logits, want[1])
    assert torch.equal(got.lse, want[2])
    assert torch.all(got.lse[1] == math.inf)


def test_kv_backend_runs_the_reference_here(no_flash_mla):
    q, cache, idx = decode_args()
    got = run_backend("flashmla_kv", q, cache, idx, softmax_scale=0.05)
    want = sparse_decode_fp8(q, cache, idx, softmax_scale=0.05)
    assert got.provider == "reference" and got.max_logits is None
    assert torch.equal(got.out, want[0]) and torch.equal(got.lse, want[1])
    assert got.lse.shape == (3, 64, 1)


def test_forced_reference_and_unavailable_flashmla(no_flash_mla):
    q, cache, idx = decode_args()
    assert run_backend("flashmla_kv", q, cache, idx, provider="reference").provider == \
        "reference"
    with pytest.raises(ProviderUnavailable) as info:
        run_backend("flashmla_kv", q, cache, idx, provider="flashmla")
    assert "flash_mla does not import" in info.value.reason
    assert info.value.status["usable"] is False
    assert isinstance(info.value, RuntimeError)


def test_select_provider_says_why(no_flash_mla):
    for backend in BACKENDS:
        provider, reason = select_provider(backend, torch.device("cpu"))
        assert provider == "reference" and "flash_mla does not import" in reason
        assert select_provider(backend, None, "reference") == \
            ("reference", "provider='reference' was requested")
    with pytest.raises(ValidationError, match="did you mean 'flashmla_kv'"):
        select_provider("flashmla_vk", None)


@pytest.mark.parametrize("flavour", fake_flash_mla.FLAVOURS)
def test_auto_prefers_flashmla_when_usable(monkeypatch, flavour):
    fake_flash_mla.install(monkeypatch, flavour)
    q, cache, idx = decode_args()
    assert run_backend("flashmla_kv", q, cache, idx).provider == "flashmla"
    assert run_backend("flashmla_kv", q, cache, idx, provider="reference").provider == \
        "reference"
    q, kv, pidx = prefill_args()
    sink = torch.zeros(128)
    chosen = run_backend("flashmla_sparse", q, kv, pidx, sm_scale=0.1, attn_sink=sink).provider
    assert chosen == ("reference" if flavour == "upstream-log2-lse" else "flashmla")


def test_validation_precedes_provider_choice(monkeypatch):
    """A bad argument is a ValidationError even when FlashMLA is unusable or forced."""
    monkeypatch.setitem(__import__("sys").modules, "flash_mla", None)
    flashmla.reset_probe()
    q, cache, idx = decode_args()
    with pytest.raises(ValidationError):
        run_backend("flashmla_kv", q, cache, idx.long(), provider="flashmla")
    flashmla.reset_probe()


def test_results_do_not_depend_on_the_provider_spelling(no_flash_mla):
    q, kv, idx = prefill_args(h_q=64, topk=128)
    auto = run_backend("flashmla_sparse", q, kv, idx, sm_scale=0.1)
    ref = run_backend("flashmla_sparse", q, kv, idx, sm_scale=0.1, provider="reference")
    assert all(torch.equal(a, b) for a, b in zip(auto[:3], ref[:3], strict=True))


def test_scale_may_be_any_real_number(no_flash_mla):
    q, kv, idx = prefill_args(h_q=64, topk=128)
    import numpy as np
    a = run_backend("flashmla_sparse", q, kv, idx, sm_scale=np.float32(0.125))
    b = run_backend("flashmla_sparse", q, kv, idx, sm_scale=1 / 8)
    assert torch.equal(a.out, b.out)
