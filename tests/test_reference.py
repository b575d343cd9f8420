"""The reference kernels against a float64 per-query oracle, with FlashMLA's tolerances."""
import math

import numpy as np
import pytest
import torch

from kernels_bridge.gpu_check import allclose_report, check
from kernels_bridge import quantize_kv_fp8, reference, sparse_decode_fp8, sparse_prefill
from kernels_bridge.accuracy import fp8_vs_bf16_figures
import tests.oracles.bridge_oracle as oracle

INT32_MIN, INT32_MAX = -2 ** 31, 2 ** 31 - 1
V32_SCALE = 192 ** -0.5 * (0.1 * math.log(40) + 1) ** 2  # DeepSeek-V3.2's softmax scale


def gen(seed):
    return torch.Generator().manual_seed(seed)


def make_q(shape, seed):
    return torch.randn(*shape, 576, generator=gen(seed)).to(torch.bfloat16)


def make_kv(rows, seed):
    g = gen(seed)
    channel = torch.exp(torch.randn(576, generator=g) * 0.5)
    return (torch.randn(rows, 576, generator=g) * channel).to(torch.bfloat16)


def prefill_indices(s_q, topk, s_kv, seed, lonely=(0,)):
    """int32 [s_q, 1, topk]: mostly valid, with every kind of invalid entry and duplicates."""
    g = gen(seed)
    idx = torch.randint(0, s_kv, (s_q, topk), generator=g)
    junk = torch.tensor([-1, -2, -1000, s_kv, s_kv + 7, INT32_MIN, INT32_MAX])
    spots = torch.randint(0, topk, (s_q, 24), generator=g)
    idx.scatter_(1, spots, junk[torch.randint(0, len(junk), (s_q, 24), generator=g)])
    idx[:, topk // 2: topk // 2 + 5] = idx[:, :5]             # duplicates count twice
    for i in lonely:
        idx[i] = junk[torch.randint(0, len(junk), (topk,), generator=g)]
    return idx.to(torch.int32).unsqueeze(1)


def decode_indices(b, s_q, topk, rows, seed, lonely=True):
    g = gen(seed)
    idx = torch.randint(0, rows, (b, s_q, topk), generator=g)
    idx[torch.rand(b, s_q, topk, generator=g) < 0.1] = -1
    idx[..., -4:] = idx[..., :4]                             # duplicates
    if lonely:
        idx[0, -1] = -1                                      # a query with nothing to attend
    return idx.to(torch.int32)


def poison_unused(cache, indices):
    """Fill every row no index names (row 0 included, which masked slots address) with 0xFF:
    NaN codes and NaN scales."""
    flat = cache.view(-1, 656)
    used = torch.zeros(flat.shape[0], dtype=torch.bool)
    used[indices[indices >= 0].long()] = True
    flat[~used] = 0xFF
    return cache


def assert_close(name, ans, want):
    report = check(name, ans, torch.as_tensor(want))
    assert report["passed"], report


# ---- prefill ----------------------------------------------------------------------------------

@pytest.mark.parametrize("h_q", [64, 128])
@pytest.mark.parametrize("topk", [128, 512, 2048])
def test_prefill_matches_oracle(h_q, topk):
    s_q, s_kv = (3, 700) if topk < 2048 else (2, 2500)
    q, kv = make_q((s_q, h_q), topk + h_q), make_kv(s_kv, topk).view(s_kv, 1, 576)
    idx = prefill_indices(s_q, topk, s_kv, seed=h_q)
    out, mx, lse = sparse_prefill(q, kv, idx, V32_SCALE)
    want = oracle.prefill_oracle(q, kv, idx, V32_SCALE)
    assert out.dtype == torch.bfloat16 and out.shape == (s_q, h_q, 512)
    assert mx.dtype == lse.dtype == torch.float32 and lse.shape == (s_q, h_q)
    assert_close("prefill_out", out, want[0])
    assert_close("prefill_max_logits", mx, want[1])
    assert_close("prefill_lse", lse, want[2])
    # query 0 has no valid index: out 0, lse +inf, max_logits -inf
    assert torch.all(out[0] == 0)
    assert torch.all(lse[0] == math.inf) and torch.all(mx[0] == -math.inf)
    assert torch.all(torch.isfinite(lse[1:]))


def test_prefill_attn_sink_including_infinities():
    s_q, h_q, topk, s_kv = 3, 64, 256, 600
    q, kv = make_q((s_q, h_q), 1), make_kv(s_kv, 2).view(s_kv, 1, 576)
    idx = prefill_indices(s_q, topk, s_kv, seed=3)
    sink = torch.randn(h_q, generator=gen(4)) * 3
    sink[0], sink[1] = math.inf, -math.inf
    out, mx, lse = sparse_prefill(q, kv, idx, V32_SCALE, attn_sink=sink)
    plain = sparse_prefill(q, kv, idx, V32_SCALE)
    with np.errstate(over="ignore"):
        want = oracle.prefill_oracle(q, kv, idx, V32_SCALE, attn_sink=sink)
    assert_close("prefill_out", out, want[0])
    assert torch.equal(lse, plain[2]) and torch.equal(mx, plain[1])   # sink leaves them alone
    assert torch.all(out[1:, 0] == 0)                                  # +inf sink zeroes a head
    assert torch.equal(out[:, 1], plain[0][:, 1])                      # -inf sink: no effect
    assert torch.all(out[0] == 0)


def test_prefill_topk_length():
    s_q, h_q, topk, s_kv = 5, 128, 384, 900
    q, kv = make_q((s_q, h_q), 5), make_kv(s_kv, 6).view(s_kv, 1, 576)
    idx = prefill_indices(s_q, topk, s_kv, seed=7, lonely=())
    lengths = torch.tensor([0, topk, 1, 200, 383], dtype=torch.int32)
    out, mx, lse = sparse_prefill(q, kv, idx, V32_SCALE, topk_length=lengths)
    want = oracle.prefill_oracle(q, kv, idx, V32_SCALE, topk_length=lengths)
    assert_close("prefill_out", out, want[0])
    assert_close("prefill_lse", lse, want[2])
    assert_close("prefill_max_logits", mx, want[1])
    assert torch.all(lse[0] == math.inf) and torch.all(out[0] == 0)


def test_prefill_never_reads_unused_rows():
    s_q, h_q, topk, s_kv = 3, 64, 128, 400
    q, kv = make_q((s_q, h_q), 8), make_kv(s_kv, 9).view(s_kv, 1, 576)
    idx = prefill_indices(s_q, topk, s_kv, seed=10)
    idx[idx == 0] = 1                       # row 0 unused: masked slots must not leak it
    want = oracle.prefill_oracle(q, kv, idx, V32_SCALE)
    used = torch.zeros(s_kv, dtype=torch.bool)
    flat = idx.flatten().long()
    used[flat[(flat >= 0) & (flat < s_kv)]] = True
    poisoned = kv.clone()
    poisoned[~used] = math.nan
    out, mx, lse = sparse_prefill(q, poisoned, idx, V32_SCALE)
    assert torch.all(torch.isfinite(out)) and torch.all(torch.isfinite(mx[1:]))
    assert_close("prefill_out", out, want[0])
    assert_close("prefill_lse", lse, want[2])


def test_chunks_and_query_blocks_agree(monkeypatch):
    s_q, h_q, topk, s_kv = 4, 64, 1024, 2000
    q, kv = make_q((s_q, h_q), 11), make_kv(s_kv, 12).view(s_kv, 1, 576)
    idx = prefill_indices(s_q, topk, s_kv, seed=13)
    whole = sparse_prefill(q, kv, idx, V32_SCALE, chunk=topk)
    small = sparse_prefill(q, kv, idx, V32_SCALE, chunk=64)
    monkeypatch.setattr(reference, "WORKSPACE_BYTES", 1)     # one query per block
    single = sparse_prefill(q, kv, idx, V32_SCALE, chunk=100)
    for other in (small, single):
        assert allclose_report("out", other[0], whole[0], 1e-3, 1 / 128, 1e-6)["passed"]
        assert torch.equal(other[1], whole[1])                 # the max is order-independent
        assert allclose_report("lse", other[2], whole[2], 1e-5, 1e-6)["passed"]


def test_query_block_size_bounds_scratch(monkeypatch):
    """Queries go through the kernel in blocks whose scratch fits WORKSPACE_BYTES: observed on
    the blocks the kernel really runs, with a lower bound of what each query must hold (its
    gathered rows, [chunk, 576] float32, and its logits, [h, chunk] float32), not a copy of the
    sizing formula. Every query is covered once, in order, and the blocks are not needlessly
    small (at least half what the bound allows)."""
    seen = []
    real = reference._attend_block

    def spy(q, idx, valid, gather, scale, chunk):
        seen.append((q.shape[0], chunk))
        return real(q, idx, valid, gather, scale, chunk)

    budget = 8 * 2 ** 20
    monkeypatch.setattr(reference, "_attend_block", spy)
    monkeypatch.setattr(reference, "WORKSPACE_BYTES", budget)
    s_q, h_q, topk, s_kv = 40, 64, 256, 600
    q, kv = make_q((s_q, h_q), 21), make_kv(s_kv, 22).view(s_kv, 1, 576)
    idx = prefill_indices(s_q, topk, s_kv, seed=23)
    got = sparse_prefill(q, kv, idx, V32_SCALE)
    assert sum(n for n, _ in seen) == s_q and len(seen) > 1
    must_hold = lambda chunk: 4 * (chunk * 576 + h_q * chunk)
    for n, chunk in seen:
        assert n * must_hold(chunk) <= budget
    assert seen[0][0] * 2 * must_hold(seen[0][1]) > budget
    want = oracle.prefill_oracle(q, kv, idx, V32_SCALE)
    assert_close("prefill_out", got[0], want[0])


# ---- decode -----------------------------------------------------------------------------------

@pytest.mark.parametrize("h_q", [64, 128])
@pytest.mark.parametrize("topk,block_size", [(64, 64), (576, 61), (2048, 64)])
def test_decode_matches_oracle(h_q, topk, block_size):
    b, s_q = 2, 2
    num_blocks = math.ceil(3 * topk / block_size)
    rows = num_blocks * block_size
    cache = quantize_kv_fp8(make_kv(rows, topk)).view(num_blocks, block_size, 1, 656)
    q = make_q((b, s_q, h_q), h_q + topk)
    idx = decode_indices(b, s_q, topk, rows, seed=topk)
    want = oracle.decode_oracle(q, cache, idx)
    poison_unused(cache, idx)
    out, lse = sparse_decode_fp8(q, cache, idx)
    assert out.shape == (b, s_q, h_q, 512) and out.dtype == torch.bfloat16
    assert lse.shape == (b, h_q, s_q) and lse.dtype == torch.float32
    assert_close("decode_out", out, want[0])
    assert_close("decode_lse", lse, want[1])
    assert torch.all(out[0, -1] == 0) and torch.all(lse[0, :, -1] == math.inf)
    assert torch.all(torch.isfinite(out))


def test_decode_attn_sink():
    b, s_q, h_q, topk, bs = 2, 1, 128, 128, 64
    cache = quantize_kv_fp8(make_kv(8 * bs, 20)).view(8, bs, 1, 656)
    q = make_q((b, s_q, h_q), 21)
    idx = decode_indices(b, s_q, topk, 8 * bs, seed=22)
    sink = torch.randn(h_q, generator=gen(23)) * 2
    sink[5] = math.inf
    out, lse = sparse_decode_fp8(q, cache, idx, attn_sink=sink)
    with np.errstate(over="ignore"):
        want = oracle.decode_oracle(q, cache, idx, attn_sink=sink)
    assert_close("decode_out", out, want[0])
    assert_close("decode_lse", lse, want[1])
    assert torch.all(out[1, 0, 5] == 0)


def test_decode_only_dequantizes_picked_rows(monkeypatch):
    b, s_q, h_q, topk, bs = 2, 1, 64, 128, 64
    cache = quantize_kv_fp8(make_kv(64 * bs, 30)).view(64, bs, 1, 656)
    q = make_q((b, s_q, h_q), 31)
    idx = decode_indices(b, s_q, topk, 64 * bs, seed=32, lonely=False)
    seen = []
    real = reference.dequantize_kv_fp8_f32
    monkeypatch.setattr(reference, "dequantize_kv_fp8_f32",
                        lambda rows: seen.append(rows.shape[0]) or real(rows))
    sparse_decode_fp8(q, cache, idx)
    assert sum(seen) == b * s_q * topk < 64 * bs


@pytest.mark.parametrize("view", [torch.int8, torch.float8_e4m3fn])
def test_decode_cache_views_and_padded_blocks(view):
    b, s_q, h_q, topk, bs, nb = 1, 2, 64, 128, 32, 12
    cache = quantize_kv_fp8(make_kv(nb * bs, 40)).view(nb, bs, 1, 656)
    q = make_q((b, s_q, h_q), 41)
    idx = decode_indices(b, s_q, topk, nb * bs, seed=42)
    base = sparse_decode_fp8(q, cache, idx)
    viewed = sparse_decode_fp8(q, cache.view(view), idx)
    padded_store = torch.full((nb, bs + 3, 1, 656), 0xFF, dtype=torch.uint8)
    padded_store[:, :bs] = cache
    padded = padded_store[:, :bs]                   # block stride (bs + 3) * 656 bytes
    assert not padded.is_contiguous()
    strided = sparse_decode_fp8(q, padded, idx)
    for other in (viewed, strided):
        assert torch.equal(other[0], base[0]) and torch.equal(other[1], base[1])


def test_decode_default_scale_is_one_over_sqrt_576():
    cache = quantize_kv_fp8(make_kv(4 * 64, 50)).view(4, 64, 1, 656)
    q = make_q((1, 1, 64), 51)
    idx = decode_indices(1, 1, 64, 256, seed=52, lonely=False)
    default = sparse_decode_fp8(q, cache, idx)
    explicit = sparse_decode_fp8(q, cache, idx, softmax_scale=576 ** -0.5)
    other = sparse_decode_fp8(q, cache, idx, softmax_scale=0.1)
    assert torch.equal(default[0], explicit[0]) and torch.equal(default[1], explicit[1])
    assert not torch.equal(default[1], other[1])


def test_decode_lse_is_flashmla_transposed_view():
    cache = quantize_kv_fp8(make_kv(2 * 64, 60)).view(2, 64, 1, 656)
    q = make_q((3, 2, 64), 61)
    _, lse = sparse_decode_fp8(q, cache, decode_indices(3, 2, 64, 128, seed=62))
    assert lse.shape == (3, 64, 2) and lse.stride() == (128, 1, 64)


def test_empty_batches_give_empty_outputs():
    kv = make_kv(10, 70).view(10, 1, 576)
    out, mx, lse = sparse_prefill(torch.empty(0, 64, 576, dtype=torch.bfloat16), kv,
                                  torch.empty(0, 1, 128, dtype=torch.int32), 0.1)
    assert out.shape == (0, 64, 512) and mx.shape == lse.shape == (0, 64)
    cache = quantize_kv_fp8(make_kv(64, 71)).view(1, 64, 1, 656)
    for b, s_q in ((0, 1), (2, 0)):
        out, lse = sparse_decode_fp8(torch.empty(b, s_q, 128, 576, dtype=torch.bfloat16), cache,
                                     torch.empty(b, s_q, 64, dtype=torch.int32))
        assert out.shape == (b, s_q, 128, 512) and lse.shape == (b, 128, s_q)


# ---- FP8 vs BF16 accuracy ---------------------------------------------------------------------

@pytest.mark.parametrize("scale_mode", ["sglang", "flashmla"])
@pytest.mark.parametrize("q_scale,min_cos,max_err,max_lse", [
    (0.25, 0.9995, 0.05, 0.03),   # logits std ~1: diffuse attention
    (1.0, 0.995, 0.3, 1.0),       # logits std ~4: sharply peaked attention
])
def test_fp8_decode_close_to_bf16_on_realistic_inputs(q_scale, min_cos, max_err, max_lse, scale_mode):
    fig = fp8_vs_bf16_figures(q_scale, scale_mode=scale_mode)
    print(f"FP8 vs BF16 (h_q 128, top-k 2048, q scale {q_scale}, {scale_mode} scales): " +
          ", ".join(f"{k} {v:.5f}" for k, v in fig.items()))
    assert fig["cosine"] > min_cos
    assert 0 < fig["max_err_over_peak"] < max_err
    assert 0 < fig["max_lse_diff"] < max_lse


# ---- non-finite q and strided inputs: documented behaviour ---------------------------------

@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_non_finite_q_spoils_only_its_query_and_head(bad):
    """Not looked for by default (check_finite=True refuses it up front): a NaN or inf in q[i, h]
    makes only that query's head non-finite, as in FlashMLA; every other output is unchanged."""
    s_kv = 300
    kv = make_kv(s_kv, 80).view(s_kv, 1, 576)
    q = make_q((4, 64), 81)
    idx = prefill_indices(4, 128, s_kv, 82, lonely=())
    clean = sparse_prefill(q, kv, idx, 0.05)
    q[2, 7, 100] = bad
    dirty = sparse_prefill(q, kv, idx, 0.05)
    spoiled = torch.zeros(4, 64, dtype=torch.bool)
    spoiled[2, 7] = True
    for a, b in zip(clean, dirty):  # out, max_logits, lse
        rows_a, rows_b = a.reshape(4, 64, -1).float(), b.reshape(4, 64, -1).float()
        assert torch.equal(rows_a[~spoiled], rows_b[~spoiled])
    assert not torch.isfinite(dirty[0][2, 7].float()).all()
    cache = quantize_kv_fp8(make_kv(256, 83)).view(4, 64, 1, 656)
    qd = make_q((2, 1, 64), 84)
    di = decode_indices(2, 1, 64, 256, 85, lonely=False)
    out_clean, lse_clean = sparse_decode_fp8(qd, cache, di)
    qd[1, 0, 5, 0] = bad
    out_dirty, lse_dirty = sparse_decode_fp8(qd, cache, di)
    keep = torch.ones(2, 1, 64, dtype=torch.bool)
    keep[1, 0, 5] = False
    assert torch.equal(out_clean[keep], out_dirty[keep])
    assert torch.equal(lse_clean.transpose(1, 2)[keep], lse_dirty.transpose(1, 2)[keep])
    assert not torch.isfinite(out_dirty[1, 0, 5].float()).all()


def test_strided_outer_dims_are_accepted_and_read_correctly():
    """Only the last dim must be contiguous: q, kv and indices sliced along outer dims (every
    other query, every other row) give exactly what their contiguous copies give."""
    s_kv = 600
    kv_all = make_kv(s_kv, 90).view(s_kv // 2, 2, 576)[:, :1]      # every other row, [300, 1, 576]
    q_all = make_q((8, 64), 91)[::2]                               # every other query
    idx_all = torch.cat([prefill_indices(4, 128, s_kv // 2, 92, lonely=())] * 2, dim=1)[:, :1]
    assert not q_all.is_contiguous() and not kv_all.is_contiguous() and not idx_all.is_contiguous()
    got = sparse_prefill(q_all, kv_all, idx_all, 0.05)
    want = sparse_prefill(q_all.contiguous(), kv_all.contiguous(), idx_all.contiguous(), 0.05)
    for a, b in zip(got, want):
        assert torch.equal(a, b)
