"""run_backend: backend names, providers, results."""
import math

import pytest
import torch

from kernels_bridge import (BACKENDS, ProviderUnavailable, ValidationError, flashmla,
                            quantize_kv_fp8, run_backend)
from kernels_bridge.dispatch import PROVIDERS, AttentionResult, select_provider
from kernels_bridge.gpu_check import check
import tests.oracles.bridge_oracle as oracle
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


def _shipped_backend_names():
    """Every backend name the shipped default policy can route a phase to (policy data)."""
    import engine

    policy = engine.load_policy("dsa-backends")
    return {v for spec in policy.inputs.values() if spec.phase for v in spec.values}


def test_the_bridge_runs_exactly_its_backends_of_the_policys_domain(no_flash_mla):
    """Every backend a shipped policy can choose either runs here (it is one of BACKENDS) or is
    refused by name before any work; BACKENDS names nothing the policy cannot choose."""
    names = _shipped_backend_names()
    assert set(BACKENDS) <= names
    q, kv, pidx = prefill_args(h_q=64, s_q=2, topk=128)
    dq, cache, didx = decode_args(b=1)
    ran = set()
    for name in sorted(names):
        try:
            if "kv" in name:
                result = run_backend(name, dq, cache, didx)
            else:
                result = run_backend(name, q, kv, pidx, sm_scale=0.1)
        except ValidationError as exc:
            assert f"unknown backend {name!r}" in str(exc) and "the bridge provides" in str(exc)
            continue
        ran.add(name)
        assert result.provider == "reference"
    assert ran == set(BACKENDS)


def test_results_come_back_by_name_in_flashmla_conventions(no_flash_mla):
    """AttentionResult's fields hold what FlashMLA returns: out, lse, max_logits (prefill only)
    and the provider; unpacking follows that order."""
    q, kv, idx = prefill_args(h_q=64, s_q=2, topk=128)
    out, lse, max_logits, provider = run_backend("flashmla_sparse", q, kv, idx, sm_scale=0.1)
    assert out.shape == (2, 64, 512) and out.dtype == BF16
    assert lse.shape == max_logits.shape == (2, 64) and lse.dtype == torch.float32
    assert provider == "reference" and bool((lse >= max_logits).all())   # lse >= max, always
    dq, cache, didx = decode_args(b=2)
    got = run_backend("flashmla_kv", dq, cache, didx)
    assert got.out.shape == (2, 1, 64, 512) and got.lse.shape == (2, 64, 1) and got.max_logits is None


def test_every_provider_is_accepted_and_nothing_else(no_flash_mla):
    q, cache, idx = decode_args(b=1)
    here = {"auto": "reference", "reference": "reference", "flashmla": ProviderUnavailable}
    for provider in PROVIDERS:  # a provider added without saying what it does here: KeyError
        if here[provider] is ProviderUnavailable:
            with pytest.raises(ProviderUnavailable):
                run_backend("flashmla_kv", q, cache, idx, provider=provider)
        else:
            assert run_backend("flashmla_kv", q, cache, idx, provider=provider).provider == here[provider]
    with pytest.raises(ValidationError, match="unknown provider 'flashml'.*did you mean 'flashmla'"):
        run_backend("flashmla_kv", q, cache, idx, provider="flashml")


def test_sparse_backend_runs_the_reference_here(no_flash_mla):
    q, kv, idx = prefill_args()
    sink = torch.randn(128)
    lengths = torch.tensor([256, 0, 17, 200], dtype=I32)
    got = run_backend("flashmla_sparse", q, kv, idx, sm_scale=0.08, attn_sink=sink,
                      topk_length=lengths)
    out, mx, lse = oracle.prefill_oracle(q, kv, idx, 0.08, attn_sink=sink, topk_length=lengths)
    assert isinstance(got, AttentionResult) and got.provider == "reference"
    assert check("prefill_out", got.out, torch.from_numpy(out))["passed"]
    assert check("prefill_max_logits", got.max_logits, torch.from_numpy(mx))["passed"]
    assert check("prefill_lse", got.lse, torch.from_numpy(lse))["passed"]
    assert torch.all(got.lse[1] == math.inf)


def test_kv_backend_runs_the_reference_here(no_flash_mla):
    q, cache, idx = decode_args()
    got = run_backend("flashmla_kv", q, cache, idx, softmax_scale=0.05)
    out, lse = oracle.decode_oracle(q, cache, idx, softmax_scale=0.05)
    assert got.provider == "reference" and got.max_logits is None
    assert check("decode_out", got.out, torch.from_numpy(out))["passed"]
    assert check("decode_lse", got.lse, torch.from_numpy(lse))["passed"]
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


@pytest.mark.parametrize("usable", [True, False])
def test_auto_runs_flashmla_exactly_when_it_is_usable(monkeypatch, usable):
    """provider="auto" follows what flashmla reports: a stand-in kernel whose result is marked
    runs when nothing stands in the way; otherwise the reference runs, and its result is the
    float64 oracle's (not the marked one)."""
    marker = 7.0

    def kernel(q, kv, indices, sm_scale, attn_sink, topk_length):
        s_q, h_q = q.shape[:2]
        stats = torch.full((s_q, h_q), marker)
        return torch.full((s_q, h_q, 512), marker, dtype=BF16), stats, stats.clone()

    monkeypatch.setattr(flashmla, "unusable_reasons", lambda *a, **k: [] if usable else ["no GPU here"])
    monkeypatch.setattr(flashmla, "prefill_call", kernel)
    q, kv, idx = prefill_args(h_q=64, s_q=2, topk=128)
    got = run_backend("flashmla_sparse", q, kv, idx, sm_scale=0.1)
    assert got.provider == ("flashmla" if usable else "reference")
    assert bool((got.out == marker).all()) is usable
    if not usable:
        out, mx, lse = oracle.prefill_oracle(q, kv, idx, 0.1)
        assert check("prefill_out", got.out, torch.from_numpy(out))["passed"]
        assert check("prefill_lse", got.lse, torch.from_numpy(lse))["passed"]
        assert select_provider("flashmla_sparse", None) == ("reference", "no GPU here")


def test_scale_may_be_any_real_number(no_flash_mla):
    q, kv, idx = prefill_args(h_q=64, topk=128)
    import numpy as np
    a = run_backend("flashmla_sparse", q, kv, idx, sm_scale=np.float32(0.125))
    b = run_backend("flashmla_sparse", q, kv, idx, sm_scale=1 / 8)
    assert torch.equal(a.out, b.out)
