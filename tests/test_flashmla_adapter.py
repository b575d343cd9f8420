"""The FlashMLA adapter against a stand-in flash_mla of each API flavour."""
import importlib.abc
import json
import math
import subprocess
import sys

import pytest
import torch

from kernels_bridge.gpu_check import check
from kernels_bridge import (ProviderUnavailable, ValidationError, flashmla, flashmla_status,
                            quantize_kv_fp8, run_backend, sparse_decode_fp8, sparse_prefill)
import tests.oracles.fake_flash_mla as fake_flash_mla

BF16, I32 = torch.bfloat16, torch.int32


@pytest.fixture(params=fake_flash_mla.FLAVOURS)
def fake(request, monkeypatch):
    return fake_flash_mla.install(monkeypatch, request.param)


@pytest.fixture
def unprobed(monkeypatch):
    """A clean probe before and after (for tests that change what `import flash_mla` does)."""
    flashmla.reset_probe()
    monkeypatch.setattr(flashmla, "_probe", None)
    monkeypatch.setattr(flashmla, "_devices", {})
    yield
    flashmla.reset_probe()


def prefill_inputs(s_q=3, h_q=64, s_kv=500, topk=256, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(s_q, h_q, 576, generator=g).to(BF16)
    kv = torch.randn(s_kv, 1, 576, generator=g).to(BF16)
    idx = torch.randint(0, s_kv, (s_q, 1, topk), generator=g)
    idx[0] = -1                                   # a query with no valid index
    idx[1, 0, ::7] = s_kv + 3
    return q, kv, idx.to(I32)


def decode_inputs(b=2, s_q=1, h_q=128, nb=8, bs=64, topk=128, seed=1, dtype=torch.uint8):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, s_q, h_q, 576, generator=g).to(BF16)
    cache = quantize_kv_fp8(torch.randn(nb * bs, 576, generator=g).to(BF16))
    idx = torch.randint(0, nb * bs, (b, s_q, topk), generator=g)
    idx[..., ::5] = -1
    idx[-1, -1] = -1
    return q, cache.view(nb, bs, 1, 656).view(dtype), idx.to(I32)


def calls(mod, name):
    return [kw for n, kw in mod.calls if n == name]


EXPECTED = {
    "sgl-use-legacy": dict(use_legacy=True, kv_format=True, prefill_log2_lse=False,
                           sched_meta_object=True, attn_sink=True, topk_length=True,
                           legacy_kernels=True, v32_formats=True),
    "upstream-natural-lse": dict(use_legacy=False, kv_format=False, prefill_log2_lse=False,
                                 sched_meta_object=True, attn_sink=True, topk_length=True,
                                 legacy_kernels=None, v32_formats=True),
    "upstream-log2-lse": dict(use_legacy=False, kv_format=False, prefill_log2_lse=True,
                              sched_meta_object=False, attn_sink=False, topk_length=False,
                              legacy_kernels=None, v32_formats=True),
}


def test_flavour_detection(fake):
    flavour = flashmla.detect_flavour(fake)
    assert flavour.name == fake.flavour
    assert {k: v for k, v in flavour.as_dict().items() if k != "name"} == EXPECTED[fake.flavour]


def test_status_usable_with_fake_gpu(fake):
    status = flashmla_status(torch.device("cpu"))
    assert status["usable"] and status["reason"] is None
    assert status["flavour"]["name"] == fake.flavour and status["version"] == fake.__version__
    assert status["capability"] == [9, 0] and status["device_name"] == "Fake NVIDIA H200"
    json.dumps(status)


def test_prefill_through_flashmla_matches_reference(fake):
    q, kv, idx = prefill_inputs()
    got = run_backend("flashmla_sparse", q, kv, idx, sm_scale=0.07, provider="flashmla")
    ref = sparse_prefill(q, kv, idx, 0.07)
    assert got.provider == "flashmla"
    assert check("prefill_out", got.out, ref[0])["passed"]
    # base-2 statistics of the 2025 builds come back in natural log, +inf / -inf conventions kept
    assert check("prefill_max_logits", got.max_logits, ref[1])["passed"]
    assert check("prefill_lse", got.lse, ref[2])["passed"]
    assert torch.all(got.lse[0] == math.inf) and torch.all(got.max_logits[0] == -math.inf)
    call = calls(fake, "flash_mla_sparse_fwd")[-1]
    assert call["q"][0] == (3, 64, 576) and call["indices"][1] == I32
    assert call["sm_scale"] == 0.07 and call["d_v"] == 512
    assert call.get("use_legacy", False) is EXPECTED[fake.flavour]["use_legacy"]
    if fake.flavour == "sgl-use-legacy":
        assert call["return_log2_lse"] is None          # natural-log statistics asked for


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.float8_e4m3fn])
def test_decode_through_flashmla_matches_reference(fake, dtype):
    q, cache, idx = decode_inputs(dtype=dtype)
    got = run_backend("flashmla_kv", q, cache, idx, provider="flashmla")
    ref = sparse_decode_fp8(q, cache, idx)
    assert got.provider == "flashmla" and got.max_logits is None
    assert got.lse.shape == (2, 128, 1)
    assert check("decode_out", got.out, ref[0])["passed"]
    assert check("decode_lse", got.lse, ref[1])["passed"]
    assert torch.all(got.lse[-1, :, -1] == math.inf)


def test_decode_call_sequence_matches_sglang(fake):
    q, cache, idx = decode_inputs(b=3, s_q=2, h_q=64, topk=192)
    run_backend("flashmla_kv", q, cache, idx, softmax_scale=0.05, provider="flashmla")
    (meta,) = calls(fake, "get_mla_metadata")
    seqlens, q_tokens, h_k, h_q, is_fp8, topk = meta["args"]
    assert seqlens.dtype == I32 and seqlens.tolist() == [192] * 3
    assert (q_tokens, h_k, h_q, is_fp8, topk) == (2 * 64, 1, 64, True, 192)
    (call,) = calls(fake, "flash_mla_with_kvcache")
    assert call["block_table"][:2] == ((3, 0), I32)
    assert call["cache_seqlens"][:2] == ((3,), I32)
    assert call["k_cache"][:2] == ((8, 64, 1, 656), torch.float8_e4m3fn)
    assert call["q"][:2] == ((3, 2, 64, 576), BF16)
    assert call["indices"][:2] == ((3, 2, 192), I32)
    assert call["head_dim_v"] == 512 and call["softmax_scale"] == 0.05
    assert call["causal"] is False and call["is_fp8_kvcache"] is True
    if fake.flavour == "upstream-log2-lse":
        assert call["num_splits"][:2] == ((4,), I32)      # the tensor get_mla_metadata made
    else:
        assert call["num_splits"] is None and call["tile_scheduler_metadata"] == "SchedMeta"
    if fake.flavour == "sgl-use-legacy":
        assert call["use_legacy"] is True and call["kv_format"] == "V32"


def test_scheduling_metadata_uses_each_requests_length_capped_at_topk(fake):
    """SGLang's DSA backend builds FlashMLA's metadata from min(seq_len, topk) per request
    (compute_dsa_seqlens, then get_mla_metadata) and passes the same lengths to the kernel."""
    q, cache, idx = decode_inputs(b=3, topk=192)
    run_backend("flashmla_kv", q, cache, idx, provider="flashmla", seq_lens=torch.tensor([100, 5000, 192]))
    (meta,) = calls(fake, "get_mla_metadata")
    assert meta["args"][0].dtype == I32 and meta["args"][0].tolist() == [100, 192, 192]
    assert calls(fake, "flash_mla_with_kvcache")[-1]["cache_seqlens"][:2] == ((3,), I32)


@pytest.mark.parametrize("seq_lens, fragment", [
    (torch.tensor([100, 0, 3]), "lengths >= 1"),
    (torch.tensor([100, 3]), "shape (2,)"),
    (torch.tensor([1.0, 2.0, 3.0]), "dtype torch.float32"),
    ([100, 5, 3], "a list"),
])
def test_bad_seq_lens_are_named_before_any_kernel(fake, seq_lens, fragment):
    q, cache, idx = decode_inputs(b=3, topk=192)
    with pytest.raises(ValidationError) as info:
        run_backend("flashmla_kv", q, cache, idx, provider="flashmla", seq_lens=seq_lens)
    assert info.value.argument == "seq_lens" and fragment in str(info.value)
    assert calls(fake, "flash_mla_with_kvcache") == []


def test_default_decode_scale_is_passed_explicitly(fake):
    q, cache, idx = decode_inputs()
    run_backend("flashmla_kv", q, cache, idx, provider="flashmla")
    assert calls(fake, "flash_mla_with_kvcache")[-1]["softmax_scale"] == 576 ** -0.5


def test_optional_arguments_follow_the_flavour(fake):
    q, kv, idx = prefill_inputs(h_q=128)
    sink = torch.randn(128)
    lengths = torch.tensor([0, 100, 256], dtype=I32)
    if fake.flavour == "upstream-log2-lse":
        with pytest.raises(ProviderUnavailable, match="does not take attn_sink"):
            run_backend("flashmla_sparse", q, kv, idx, sm_scale=0.1, attn_sink=sink,
                        provider="flashmla")
        with pytest.raises(ProviderUnavailable, match="does not take topk_length"):
            run_backend("flashmla_sparse", q, kv, idx, sm_scale=0.1, topk_length=lengths,
                        provider="flashmla")
        auto = run_backend("flashmla_sparse", q, kv, idx, sm_scale=0.1, attn_sink=sink)
        assert auto.provider == "reference"
        return
    got = run_backend("flashmla_sparse", q, kv, idx, sm_scale=0.1, attn_sink=sink,
                      topk_length=lengths, provider="flashmla")
    ref = sparse_prefill(q, kv, idx, 0.1, attn_sink=sink, topk_length=lengths)
    assert check("prefill_out", got.out, ref[0])["passed"]
    assert check("prefill_lse", got.lse, ref[2])["passed"]
    dq, cache, didx = decode_inputs()
    got = run_backend("flashmla_kv", dq, cache, didx, attn_sink=sink, provider="flashmla")
    ref = sparse_decode_fp8(dq, cache, didx, attn_sink=sink)
    assert check("decode_out", got.out, ref[0])["passed"]


def test_empty_batches_never_reach_the_kernel(fake):
    q = torch.empty(0, 64, 576, dtype=BF16)
    kv = torch.randn(10, 1, 576).to(BF16)
    got = run_backend("flashmla_sparse", q, kv, torch.empty(0, 1, 128, dtype=I32),
                      sm_scale=0.1, provider="flashmla")
    assert got.out.shape == (0, 64, 512) and got.lse.shape == (0, 64)
    _, cache, _ = decode_inputs()
    got = run_backend("flashmla_kv", torch.empty(0, 1, 128, 576, dtype=BF16), cache,
                      torch.empty(0, 1, 64, dtype=I32), provider="flashmla")
    assert got.out.shape == (0, 1, 128, 512) and got.lse.shape == (0, 128, 1)
    assert fake.calls == []


def test_out_of_range_decode_index_stopped_before_the_kernel(fake):
    q, cache, idx = decode_inputs()
    idx[0, 0, 3] = 8 * 64
    with pytest.raises(ValidationError, match="neither -1 nor a cache row"):
        run_backend("flashmla_kv", q, cache, idx, provider="flashmla")
    assert calls(fake, "flash_mla_with_kvcache") == []
    # the stand-in would have "read out of bounds": the check above is what prevents it
    with pytest.raises(fake_flash_mla.OutOfBoundsRead):
        flashmla.decode_call(q, cache, idx)


def test_public_adapter_functions_validate(fake):
    q, kv, idx = prefill_inputs()
    with pytest.raises(ValidationError):
        flashmla.sparse_prefill_flashmla(q, kv, idx.long(), 0.1)
    out, mx, lse = flashmla.sparse_prefill_flashmla(q, kv, idx, 0.1)
    assert out.shape == (3, 64, 512) and lse.shape == mx.shape == (3, 64)
    dq, cache, didx = decode_inputs()
    out, lse = flashmla.sparse_decode_fp8_flashmla(dq, cache, didx)
    assert out.shape == (2, 1, 128, 512) and lse.shape == (2, 128, 1)


def test_the_stand_in_enforces_use_legacy(monkeypatch):
    """The sgl flavour's current kernels refuse V3.2 shapes: forgetting use_legacy fails."""
    mod = fake_flash_mla.install(monkeypatch, "sgl-use-legacy")
    flavour = flashmla.detect_flavour(mod)
    monkeypatch.setattr(flashmla, "_load", lambda: flashmla._Probe(
        mod, None, flashmla.Flavour(**{**flavour.as_dict(), "use_legacy": False,
                                       "kv_format": False}), "1.0.0"))
    q, kv, idx = prefill_inputs()
    with pytest.raises(fake_flash_mla.KernelError, match="use_legacy"):
        run_backend("flashmla_sparse", q, kv, idx, sm_scale=0.1, provider="flashmla")
    dq, cache, didx = decode_inputs()
    with pytest.raises(fake_flash_mla.KernelError, match="use_legacy"):
        run_backend("flashmla_kv", dq, cache, didx, provider="flashmla")


def test_build_without_legacy_kernels_is_unusable(monkeypatch):
    fake_flash_mla.install(monkeypatch, "sgl-use-legacy", has_legacy=False)
    status = flashmla_status("cpu")
    assert not status["usable"] and "legacy kernels" in status["reason"]
    q, cache, idx = decode_inputs()
    assert run_backend("flashmla_kv", q, cache, idx).provider == "reference"


@pytest.mark.parametrize("capability,usable", [
    ((9, 0), True), ((10, 0), True), ((10, 3), True),
    ((8, 0), False), ((8, 9), False), ((12, 0), False), ((9, 1), False)])
def test_architecture_gate(monkeypatch, capability, usable):
    fake_flash_mla.install(monkeypatch, "sgl-use-legacy", capability=capability)
    status = flashmla_status("cpu")
    assert status["usable"] is usable
    q, kv, idx = prefill_inputs()
    if usable:
        assert run_backend("flashmla_sparse", q, kv, idx, sm_scale=0.1).provider == "flashmla"
        return
    assert f"compute capability {capability[0]}.{capability[1]}" in status["reason"]
    assert "SM90" in status["reason"] and "SM100" in status["reason"]
    with pytest.raises(ProviderUnavailable) as info:
        run_backend("flashmla_sparse", q, kv, idx, sm_scale=0.1, provider="flashmla")
    assert "compute capability" in info.value.reason and info.value.status["usable"] is False
    assert run_backend("flashmla_sparse", q, kv, idx, sm_scale=0.1).provider == "reference"


def test_cpu_tensors_without_the_probe_override(monkeypatch, unprobed):
    monkeypatch.setitem(sys.modules, "flash_mla", fake_flash_mla.build("sgl-use-legacy"))
    status = flashmla_status("cpu")
    assert not status["usable"] and "FlashMLA runs on CUDA devices only" in status["reason"]
    if not torch.cuda.is_available():
        assert "CUDA is not available" in flashmla_status()["reason"]
    q, kv, idx = prefill_inputs()
    with pytest.raises(ProviderUnavailable, match="tensors are on cpu"):
        run_backend("flashmla_sparse", q, kv, idx, sm_scale=0.1, provider="flashmla")


def test_import_error_text_is_the_reason(monkeypatch, unprobed):
    monkeypatch.setitem(sys.modules, "flash_mla", None)     # makes `import flash_mla` fail
    status = flashmla_status()
    assert not status["usable"]
    assert status["import_error"].startswith("ModuleNotFoundError: import of flash_mla halted")
    q, cache, idx = decode_inputs()
    with pytest.raises(ProviderUnavailable) as info:
        run_backend("flashmla_kv", q, cache, idx, provider="flashmla")
    assert "flash_mla does not import (ModuleNotFoundError" in str(info.value)
    assert run_backend("flashmla_kv", q, cache, idx).provider == "reference"


class _OSErrorFinder(importlib.abc.MetaPathFinder):
    """Imports of flash_mla fail the way they do on a CPU-only torch."""

    def find_spec(self, name, path=None, target=None):
        if name == "flash_mla":
            raise OSError("libc10_cuda.so: cannot open shared object file: No such file or "
                          "directory")
        return None


def test_oserror_on_import_is_caught(monkeypatch, unprobed):
    monkeypatch.delitem(sys.modules, "flash_mla", raising=False)
    monkeypatch.setattr(sys, "meta_path", [_OSErrorFinder(), *sys.meta_path])
    status = flashmla_status()
    assert status["import_error"].startswith("OSError: libc10_cuda.so")
    q, kv, idx = prefill_inputs()
    with pytest.raises(ProviderUnavailable, match="libc10_cuda.so"):
        run_backend("flashmla_sparse", q, kv, idx, sm_scale=0.1, provider="flashmla")


def test_unrecognised_module_is_reported(monkeypatch, unprobed):
    monkeypatch.setitem(sys.modules, "flash_mla", type(sys)("flash_mla"))
    status = flashmla_status()
    assert not status["usable"] and "unrecognised flash_mla API" in status["reason"]


def test_import_is_cached(monkeypatch):
    mod = fake_flash_mla.install(monkeypatch, "sgl-use-legacy")
    first = flashmla._load()
    monkeypatch.setitem(sys.modules, "flash_mla", fake_flash_mla.build("upstream-log2-lse"))
    assert flashmla._load() is first and flashmla_status("cpu")["flavour"]["name"] == mod.flavour
    flashmla.reset_probe()
    assert flashmla_status("cpu")["flavour"]["name"] == "upstream-log2-lse"


def test_importing_the_bridge_does_not_import_flash_mla():
    code = ("import sys, kernels_bridge as kb; kb.run_backend; kb.flashmla_status; "
            "kb.quantize_kv_fp8; kb.BACKENDS; print('flash_mla' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"


# ---- builds that cannot serve a call: refused by name, never selected --------------------------

def test_a_build_without_v32_is_detected_and_never_selected(monkeypatch):
    """FlashMLA 2026.09.30+ (deepinfer-flashmla 1.0.0) dropped SM90 and the V3.2 formats: its
    signature tells it apart, and it is reported unusable instead of failing in the kernel."""
    mod = fake_flash_mla.install(monkeypatch, fake_flash_mla.V41_ONLY, capability=(10, 0))
    flavour = flashmla.detect_flavour(mod)
    assert flavour.name == "upstream-v41-only" and flavour.v32_formats is False
    status = flashmla_status(torch.device("cpu"))
    assert not status["usable"] and "dropped SM90 and the DeepSeek-V3.2 formats" in status["reason"]
    dq, cache, didx = decode_inputs()
    q, kv, idx = prefill_inputs()
    with pytest.raises(ProviderUnavailable, match="sgl-flash-mla"):
        run_backend("flashmla_kv", dq, cache, didx, provider="flashmla")
    with pytest.raises(ProviderUnavailable, match="V3.2 formats"):
        run_backend("flashmla_sparse", q, kv, idx, sm_scale=0.1, provider="flashmla")
    assert run_backend("flashmla_kv", dq, cache, didx).provider == "reference"
    assert mod.calls == []
    with pytest.raises(fake_flash_mla.KernelError, match="512"):  # what a call would have met
        mod.flash_mla_sparse_fwd(q, kv, idx, 0.1)


def test_2025_builds_decode_only_page_blocks_of_64(monkeypatch):
    mod = fake_flash_mla.install(monkeypatch, "upstream-log2-lse")
    dq, cache, didx = decode_inputs(nb=32, bs=16)
    with pytest.raises(ProviderUnavailable, match="page block size of 64.*block_size 16"):
        run_backend("flashmla_kv", dq, cache, didx, provider="flashmla")
    assert run_backend("flashmla_kv", dq, cache, didx).provider == "reference"
    assert mod.calls == []
    sched, splits = mod.get_mla_metadata(torch.full((2,), 128, dtype=I32), 128, 1, 128, True, 128)
    with pytest.raises(fake_flash_mla.KernelError, match="page_block_size must be 64"):
        mod.flash_mla_with_kvcache(dq, cache.view(torch.float8_e4m3fn), torch.empty(2, 0, dtype=I32),
                                   torch.full((2,), 128, dtype=I32), 512, sched, splits,
                                   is_fp8_kvcache=True, indices=didx)
    dq, cache, didx = decode_inputs(nb=8, bs=64)
    assert run_backend("flashmla_kv", dq, cache, didx, provider="flashmla").provider == "flashmla"


def test_2025_builds_prefill_on_sm100_only_with_128_heads(monkeypatch):
    fake_flash_mla.install(monkeypatch, "upstream-log2-lse", capability=(10, 0))
    q, kv, idx = prefill_inputs(h_q=64)
    with pytest.raises(ProviderUnavailable, match="128 heads only; the call has h_q 64"):
        run_backend("flashmla_sparse", q, kv, idx, sm_scale=0.1, provider="flashmla")
    q, kv, idx = prefill_inputs(h_q=128)
    assert run_backend("flashmla_sparse", q, kv, idx, sm_scale=0.1).provider == "flashmla"


_ROWS = {}


def _cache_layout(nb, bs, row_pad, block_pad, seed=3):
    """FP8 rows [nb, bs, 1, 656] laid out with `row_pad` bytes after each row and `block_pad`
    after each block (a strided view into a larger buffer)."""
    if (nb * bs, seed) not in _ROWS:
        g = torch.Generator().manual_seed(seed)
        _ROWS[nb * bs, seed] = quantize_kv_fp8(torch.randn(nb * bs, 576, generator=g).to(BF16))
    rows = _ROWS[nb * bs, seed]
    row_stride = 656 + row_pad
    block_stride = bs * row_stride + block_pad
    buf = torch.zeros(nb * block_stride + 64, dtype=torch.uint8)
    view = buf.as_strided((nb, bs, 1, 656), (block_stride, row_stride, row_stride, 1))
    view.copy_(rows.view(nb, bs, 1, 656))
    return view


@pytest.mark.parametrize("flavour", fake_flash_mla.FLAVOURS)
@pytest.mark.parametrize("capability", [(9, 0), (10, 0)])
def test_what_validates_runs_wherever_flashmla_is_selected(monkeypatch, flavour, capability):
    """The stand-in enforces what the real builds enforce, so this is the property that keeps a
    CPU test honest: every call the bridge validates either runs on the selected flash_mla, or
    the adapter says beforehand why that build cannot run it (and auto falls back)."""
    fake_flash_mla.install(monkeypatch, flavour, capability=capability)
    ran = refused = 0
    g = torch.Generator().manual_seed(5)
    queries = {h: torch.randn(2, 1, h, 576, generator=g).to(BF16) for h in (64, 128)}
    idx = torch.randint(-1, 512, (2, 1, 64), generator=g).to(I32)
    for nb, bs in ((512, 1), (32, 16), (8, 64)):
        for row_pad in (0, 16):
            for block_pad in (0, 16, 656):
                for h_q in (64, 128):
                    cache = _cache_layout(nb, bs, row_pad, block_pad)
                    q = queries[h_q]
                    try:
                        result = run_backend("flashmla_kv", q, cache, idx)
                    except ValidationError:
                        refused += 1
                        continue
                    ran += 1
                    if result.provider == "reference":  # the adapter said why, before any call
                        with pytest.raises(ProviderUnavailable):
                            run_backend("flashmla_kv", q, cache, idx, provider="flashmla")
    assert ran and refused
    for h_q in (64, 128):  # prefill: what validates runs too
        q, kv, idx = prefill_inputs(h_q=h_q)
        result = run_backend("flashmla_sparse", q, kv, idx, sm_scale=0.1)
        assert result.provider in ("flashmla", "reference")


@pytest.mark.parametrize("flavour", fake_flash_mla.FLAVOURS)
def test_the_stand_in_refuses_a_padded_one_row_block_as_flashmla_does(flavour):
    """stride(1) is checked whatever the block size (UP26 csrc/api/sparse_decode.h:301, UP25
    csrc/pybind.cpp:255): validation refuses the layout, and so does the stand-in."""
    mod = fake_flash_mla.build(flavour)
    cache = _cache_layout(512, 1, 16, 0)
    q, _, idx = decode_inputs(nb=512, bs=1)
    with pytest.raises(ValidationError, match="for every block size"):
        run_backend("flashmla_kv", q, cache, idx, provider="reference")
    if flavour == "upstream-log2-lse":
        sched, splits = mod.get_mla_metadata(torch.full((2,), 128, dtype=I32), 128, 1, 128, True, 128)
        extra = dict(block_table=torch.empty(2, 0, dtype=I32), cache_seqlens=torch.full((2,), 128, dtype=I32),
                     tile_scheduler_metadata=sched, num_splits=splits)
    else:
        extra = dict(block_table=None, cache_seqlens=None, tile_scheduler_metadata=mod.get_mla_metadata()[0])
        if flavour == "sgl-use-legacy":
            extra["use_legacy"] = True
    with pytest.raises(fake_flash_mla.KernelError, match="page_block_size must be 64|whole block must be contiguous"):
        mod.flash_mla_with_kvcache(q, cache, head_dim_v=512, is_fp8_kvcache=True, indices=idx, **extra)


def test_sgl_kv_format_must_name_the_cache_format():
    mod = fake_flash_mla.build("sgl-use-legacy")
    q, cache, idx = decode_inputs()
    for bad, text in (("V3.2", "Unknown kv_format"), ("V41", "kv_format_hint")):
        with pytest.raises(fake_flash_mla.KernelError, match=text):
            mod.flash_mla_with_kvcache(q, cache, None, None, 512, mod.get_mla_metadata()[0],
                                       is_fp8_kvcache=True, indices=idx, use_legacy=True, kv_format=bad)


def test_every_reason_is_listed(monkeypatch):
    """A 2025 build on an SM100 device, asked for 64-head prefill with attn_sink and topk_length,
    has three reasons; all of them are reported, in the order they are checked, and the error of
    provider="flashmla" carries them all."""
    fake_flash_mla.install(monkeypatch, "upstream-log2-lse", capability=(10, 0))
    reasons = flashmla.unusable_reasons("cpu", backend="flashmla_sparse", attn_sink=True,
                                        topk_length=True, h_q=64)
    assert len(reasons) == 3
    assert "128 heads only" in reasons[0] and "h_q 64" in reasons[0]
    assert "does not take attn_sink" in reasons[1] and "does not take topk_length" in reasons[2]
    assert flashmla.unusable_reasons("cpu", backend="flashmla_sparse", h_q=128) == []
    q, kv, idx = prefill_inputs(h_q=64)
    sink = torch.zeros(64, dtype=torch.float32)
    with pytest.raises(ProviderUnavailable) as info:
        run_backend("flashmla_sparse", q, kv, idx, sm_scale=0.1, attn_sink=sink,
                    topk_length=torch.full((3,), 256, dtype=I32), provider="flashmla")
    assert info.value.reasons == reasons
    assert all(reason in info.value.reason for reason in reasons)


def test_no_module_and_no_device_are_both_reasons(monkeypatch, unprobed):
    monkeypatch.setitem(sys.modules, "flash_mla", None)
    monkeypatch.setattr(flashmla, "_default_device", lambda: None)  # a machine without a GPU
    status = flashmla_status()
    assert [r.split(" (")[0].split(":")[0] for r in status["reasons"]] == [
        "flash_mla does not import", "CUDA is not available"]
    assert status["reason"] == "; ".join(status["reasons"]) and not status["usable"]
    from kernels_bridge.doctor import doctor_report, render_doctor

    text = render_doctor(doctor_report())
    assert "not usable, 2 reasons:" in text
    for reason in status["reasons"]:
        assert f"             - {reason}" in text
