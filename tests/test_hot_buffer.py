"""Tests of kernels_bridge.hot_buffer.HotBuffer: residency invariants, SGLang's LRU order, stats,
errors without side effects, lifecycle, and a property test against the plain-Python LRU model
(tests/oracles/lru_model.py), which must agree slot for slot and byte for byte."""
from __future__ import annotations

import random

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kernels_bridge.hot_buffer import HotBuffer, HotBufferError, HotBufferStats
from tests.oracles.lru_model import LRUModel

KINDS = ["bf16", "fp8"]


# ---------------------------------------------------------------------------------- helpers
def make_pool(kind: str, num_requests: int, max_seq_len: int, seed: int = 0) -> torch.Tensor:
    """Random rows. BF16 rows are random bit patterns, NaNs and infinities included, so only an
    exact byte copy keeps them equal."""
    g = torch.Generator().manual_seed(seed)
    if kind == "fp8":
        return torch.randint(0, 256, (num_requests, max_seq_len, 656), dtype=torch.uint8, generator=g)
    bits = torch.randint(-(2**15), 2**15, (num_requests, max_seq_len, 576), dtype=torch.int16, generator=g)
    return bits.view(torch.bfloat16)


def rewrite_rows(pool: torch.Tensor, r: int, start: int, seed: int) -> None:
    """New content for host rows pool[r, start:] (the request's tokens there changed)."""
    raw = pool[r, start:].view(torch.uint8)
    raw.copy_(torch.randint(0, 256, raw.shape, dtype=torch.uint8, generator=torch.Generator().manual_seed(seed)))


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)


def t64(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64)


def translate(hb: HotBuffer, req_ids, seq_lens, positions) -> torch.Tensor:
    pos = torch.tensor(positions, dtype=torch.int64).view(len(req_ids), -1)
    out = hb.translate(t64(req_ids), t64(seq_lens), pos)
    check_translation(hb, req_ids, seq_lens, pos, out)
    check_residency(hb)
    return out


def stats_tuple(s: HotBufferStats):
    return (s.steps, s.hits, s.misses, s.rows_copied, s.bytes_copied)


def check_translation(hb: HotBuffer, req_ids, seq_lens, pos: torch.Tensor, out: torch.Tensor) -> None:
    """The contract of one translate's result."""
    assert out.dtype == torch.int32 and out.shape == pos.shape and out.device == hb.buffer.device
    W, B = hb.rows_per_request, hb.buffer_size
    for i, (r, L) in enumerate(zip(list(req_ids), list(seq_lens))):
        r, L = int(r), int(L)
        p, o = pos[i].long(), out[i].long()
        pad = p == -1
        assert (o[pad] == -1).all(), "padding must stay -1"
        v, ov = p[~pad], o[~pad]
        assert ((ov >= r * W) & (ov <= r * W + B)).all(), "a row outside the request's region"
        assert torch.equal(as_bytes(hb.buffer[ov]), as_bytes(hb.host_pool[r, v])), "stale bytes"
        pairs = set(zip(v.tolist(), ov.tolist()))
        assert len(pairs) == len(set(v.tolist())) == len(set(ov.tolist())), "not a bijection"
        if L > B:
            assert (ov[v == L - 1] == r * W + B).all(), "newest token not in the reserved slot"
            assert (ov[v != L - 1] < r * W + B).all()
            assert torch.equal(as_bytes(hb.buffer[r * W + B]), as_bytes(hb.host_pool[r, L - 1]))
        else:
            assert torch.equal(ov, r * W + v), "a short request maps positions straight through"


def check_residency(hb: HotBuffer) -> None:
    """Every resident row holds its host row's bytes; the two maps are exact inverses."""
    W, B, S = hb.rows_per_request, hb.buffer_size, hb.max_seq_len
    pos_slot = hb._pos_slot[:-1].view(hb.num_requests, S).long()
    assert int(hb._pos_slot[-1]) == -1, "the sink must stay -1"
    for r in range(hb.num_requests):
        sp = hb.slot_positions(r)
        slots = torch.nonzero(sp[:B] >= 0).squeeze(1)
        assert torch.equal(as_bytes(hb.buffer[r * W + slots]), as_bytes(hb.host_pool[r, sp[slots]]))
        if sp[B] >= 0:
            assert torch.equal(as_bytes(hb.buffer[r * W + B]), as_bytes(hb.host_pool[r, sp[B]]))
        resident = torch.nonzero(pos_slot[r] >= 0).squeeze(1)
        assert resident.numel() == slots.numel()
        assert torch.equal(sp[pos_slot[r, resident]], resident)
        assert sorted(hb.lru_order(r).tolist()) == list(range(B)), "LRU order is a permutation"


def snapshot(hb: HotBuffer):
    return (
        hb.buffer.clone(),
        hb._pos_slot.clone(),
        [hb.slot_positions(r) for r in range(hb.num_requests)],
        [hb.lru_order(r) for r in range(hb.num_requests)],
        hb._seq_len.clone(),
        hb.stats,
    )


def assert_same_snapshot(a, b) -> None:
    assert torch.equal(as_bytes(a[0]), as_bytes(b[0]))
    assert torch.equal(a[1], b[1])
    assert all(torch.equal(x, y) for x, y in zip(a[2], b[2]))
    assert all(torch.equal(x, y) for x, y in zip(a[3], b[3]))
    assert torch.equal(a[4], b[4])
    assert a[5] == b[5]


def assert_agrees(hb: HotBuffer, model: LRUModel) -> None:
    assert torch.equal(as_bytes(hb.buffer), as_bytes(model.buffer))
    for r in range(hb.num_requests):
        assert hb.slot_positions(r).tolist() == model.slot_positions(r)
        assert hb.lru_order(r).tolist() == model.lru_order(r)
    assert stats_tuple(hb.stats) == tuple(model.stats.values())


# ---------------------------------------------------------------------------------- layout
@pytest.mark.parametrize("kind", KINDS)
def test_layout_and_paged_view(kind):
    pool = make_pool(kind, 3, 40)
    hb = HotBuffer(pool, buffer_size=8, page_size=4)
    row = 656 if kind == "fp8" else 576
    assert hb.kv_format == kind
    assert hb.row_bytes == (656 if kind == "fp8" else 1152)
    assert hb.rows_per_request == 12
    assert hb.buffer.shape == (3 * 12, row) and hb.buffer.dtype == pool.dtype
    assert not as_bytes(hb.buffer).any(), "rows never loaded are zero"
    assert hb.host_pool is pool, "a CPU host pool is kept by reference"
    assert hb.row_range(1) == range(12, 24)
    view = hb.paged_view()
    assert view.data_ptr() == hb.buffer.data_ptr()
    if kind == "fp8":
        assert view.shape == (9, 4, 1, 656) and view.dtype == torch.uint8
    else:
        assert view.shape == (36, 1, 576) and view.dtype == torch.bfloat16
    # the flat index a translate returns addresses the same row in the paged view
    out = translate(hb, [2], [20], [[5, 19, -1]])
    for flat, p in zip(out[0, :2].tolist(), (5, 19)):
        if kind == "fp8":
            got = view[flat // 4, flat % 4, 0]
        else:
            got = view[flat, 0]
        assert torch.equal(as_bytes(got), as_bytes(pool[2, p]))


def test_lazy_export():
    import kernels_bridge

    assert kernels_bridge.HotBuffer is HotBuffer
    assert issubclass(HotBufferError, ValueError)


@pytest.mark.parametrize(
    "make, kwargs, words",
    [
        (lambda: [[0] * 576], {}, ["host_pool", "torch.Tensor"]),
        (lambda: torch.zeros(2, 8, 576), {}, ["host_pool", "float32", "bfloat16"]),
        (lambda: torch.zeros(2, 8, 656, dtype=torch.float8_e4m3fn), {}, ["host_pool", "torch.uint8"]),
        (lambda: torch.zeros(2, 8, 656, dtype=torch.bfloat16), {}, ["host_pool", "(2, 8, 656)", "576"]),
        (lambda: torch.zeros(2, 8, 576, dtype=torch.uint8), {}, ["host_pool", "656"]),
        (lambda: torch.zeros(8, 656, dtype=torch.uint8), {}, ["host_pool", "(8, 656)"]),
        (lambda: torch.zeros(0, 8, 656, dtype=torch.uint8), {}, ["host_pool", "num_requests >= 1"]),
        (lambda: torch.zeros(8, 2, 656, dtype=torch.uint8).transpose(0, 1), {}, ["host_pool", "contiguous"]),
        (lambda: torch.zeros(2, 8, 656, dtype=torch.uint8), {"buffer_size": 0}, ["buffer_size", ">= 1"]),
        (lambda: torch.zeros(2, 8, 656, dtype=torch.uint8), {"buffer_size": True}, ["buffer_size"]),
        (lambda: torch.zeros(2, 8, 656, dtype=torch.uint8), {"buffer_size": 4.0}, ["buffer_size"]),
        (lambda: torch.zeros(2, 8, 656, dtype=torch.uint8), {"page_size": 0}, ["page_size", ">= 1"]),
        (lambda: torch.zeros(2, 8, 656, dtype=torch.uint8), {"buffer_size": 96}, ["buffer_size", "multiple of page_size 64"]),
        (lambda: torch.zeros(2, 8, 656, dtype=torch.uint8), {"device": "no-such-device"}, ["device"]),
    ],
)
def test_constructor_errors(make, kwargs, words):
    args = {"buffer_size": 64, "page_size": 64, **kwargs}
    with pytest.raises(HotBufferError) as err:
        HotBuffer(make(), **args)
    for w in words:
        assert w in str(err.value)


def test_constructor_accepts_integral_sizes():
    import numpy as np

    hb = HotBuffer(make_pool("fp8", 1, 8), buffer_size=np.int64(4), page_size=np.int32(2))
    assert hb.buffer_size == 4 and hb.page_size == 2 and hb.buffer.shape == (6, 656)


# ---------------------------------------------------------------------------------- semantics
@pytest.mark.parametrize("kind", KINDS)
def test_short_request_maps_straight_through_and_fills_its_prefix(kind):
    hb = HotBuffer(make_pool(kind, 2, 40), buffer_size=16, page_size=4)
    out = translate(hb, [1], [10], [[3, 0, 9, -1, 3]])
    assert out.tolist() == [[23, 20, 29, -1, 23]]
    # the whole prefix 0..9 is resident in its own slots, as SGLang's short requests are
    assert hb.slot_positions(1).tolist() == list(range(10)) + [-1] * 7
    assert hb.lru_order(1).tolist() == list(range(16)), "the short path leaves the LRU order"
    assert stats_tuple(hb.stats) == (1, 0, 3, 10, 10 * hb.row_bytes)
    translate(hb, [1], [10], [[3, 0, 9, -1, 3]])
    assert stats_tuple(hb.stats) == (2, 3, 3, 10, 10 * hb.row_bytes)
    # decode: one new token, one new row
    translate(hb, [1], [11], [[10, 2, -1, -1, -1]])
    assert stats_tuple(hb.stats) == (3, 4, 4, 11, 11 * hb.row_bytes)


def _sglang_case():
    """SGLang's kernel test baseline (jit_kernel/tests/test_hisparse.py), rebuilt through the
    API: buffer_size 4, page_size 1, a request whose short phase left tokens 0..3 in slots 0..3."""
    hb = HotBuffer(make_pool("fp8", 2, 16), buffer_size=4, page_size=1)
    translate(hb, [0, 1], [4, 4], [[0, 1, 2, 3], [0, 1, 2, 3]])
    return hb


def test_sglang_hits_and_newest_refresh_the_lru_order():
    hb = _sglang_case()
    out = translate(hb, [0], [8], [[1, 2, 7]])
    assert out.tolist() == [[1, 2, 4]]  # hits keep slots 1 and 2; the newest is in slot 4
    assert hb.lru_order(0).tolist() == [0, 3, 1, 2]  # as SGLang: hits move to the MRU tail


def test_sglang_miss_takes_the_lru_head():
    hb = _sglang_case()
    translate(hb, [0], [8], [[1, 2]])
    out = translate(hb, [0], [8], [[6]])
    assert out.tolist() == [[0]]
    assert hb.slot_positions(0).tolist() == [6, 1, 2, 3, 7]
    assert hb.lru_order(0).tolist() == [3, 1, 2, 0]


def test_sglang_batched_hit_miss_newest_with_a_short_neighbour():
    hb = _sglang_case()
    out = translate(hb, [0, 1], [8, 3], [[1, 6, 7], [2, 1, 0]])
    assert out.tolist() == [[1, 0, 4], [7, 6, 5]]
    # remaining evictables [2, 3], then the miss's slot [0], then the hit [1]
    assert hb.lru_order(0).tolist() == [2, 3, 0, 1]
    assert hb.lru_order(1).tolist() == [0, 1, 2, 3]


def test_misses_take_lru_slots_in_order_and_hits_stay():
    B = 8
    hb = HotBuffer(make_pool("fp8", 1, 64), buffer_size=B, page_size=B)
    translate(hb, [0], [40], [[10, 11, 12, 13, 14, 15, 16, 17]])  # cold: slots 0..7 in order
    assert hb.slot_positions(0).tolist()[:B] == [10, 11, 12, 13, 14, 15, 16, 17]
    assert hb.lru_order(0).tolist() == list(range(B))
    # hits 11 and 14; misses 30, 31, 32 go to the three least-recently-used other slots 0, 2, 3
    out = translate(hb, [0], [40], [[30, 14, 31, 11, 32, -1, -1, -1]])
    assert out[0, :5].tolist() == [0, 4, 2, 1, 3]
    assert hb.lru_order(0).tolist() == [5, 6, 7, 0, 2, 3, 1, 4]
    assert stats_tuple(hb.stats)[1:4] == (2, 8 + 3, 8 + 1 + 3)  # the newest is unchanged


@pytest.mark.parametrize("kind", KINDS)
def test_same_topk_twice_copies_nothing(kind):
    hb = HotBuffer(make_pool(kind, 3, 64), buffer_size=16, page_size=8)
    ids, lens = [0, 2, 1], [50, 9, 17]
    pos = [[49, 3, 40, 3, -1, 0], [8, 0, 1, -1, -1, -1], [2, 16, 15, 14, 7, 1]]
    translate(hb, ids, lens, pos)
    before = hb.stats
    again = translate(hb, ids, lens, pos)
    after = hb.stats
    assert after.rows_copied == before.rows_copied and after.bytes_copied == before.bytes_copied
    assert after.misses == before.misses
    assert after.hits - before.hits == 4 + 3 + 6  # distinct valid positions per row
    assert torch.equal(again, translate(hb, ids, lens, pos))


def test_duplicates_share_one_slot_and_count_once():
    hb = HotBuffer(make_pool("bf16", 1, 64), buffer_size=8, page_size=4)
    out = translate(hb, [0], [30], [[5, 29, 5, 7, 29, 7, 5, -1]])
    o = out[0].tolist()
    assert o[0] == o[2] == o[6] and o[3] == o[5] and o[1] == o[4] == 8 and o[7] == -1
    assert (o[0], o[3]) == (0, 1), "misses take slots in order of first appearance"
    assert stats_tuple(hb.stats)[1:4] == (0, 3, 3)  # 5, 7 and the newest, each copied once
    translate(hb, [0], [30], [[7, 7, 9, 9, 9, 5, 5, 5]])
    assert stats_tuple(hb.stats)[1:4] == (2, 4, 4)


@pytest.mark.parametrize("kind", KINDS)
def test_newest_token_is_copied_into_the_reserved_slot_each_decode_step(kind):
    B = 8
    hb = HotBuffer(make_pool(kind, 2, 64), buffer_size=B, page_size=4)
    translate(hb, [1], [20], [[1, 2, 3, 4]])
    base = hb.stats
    for step, L in enumerate(range(21, 30), start=1):
        translate(hb, [1], [L], [[1, 2, 3, 4]])  # the newest is not asked for
        s = hb.stats
        assert (s.hits - base.hits, s.misses - base.misses) == (4 * step, 0)
        assert s.rows_copied - base.rows_copied == step, "exactly the new newest token per step"
        assert hb.slot_positions(1).tolist()[B] == L - 1
    # the previous newest token is not resident in an LRU slot: asking for it is a miss
    translate(hb, [1], [29], [[27]])
    assert hb.stats.misses == base.misses + 1


def test_short_to_long_keeps_the_prefix_resident():
    B = 16
    hb = HotBuffer(make_pool("fp8", 1, 64), buffer_size=B, page_size=4)
    translate(hb, [0], [B], [list(range(0, B, 2))])  # short: positions 0..15 resident in order
    rows = hb.stats.rows_copied
    out = translate(hb, [0], [B + 1], [[15, 0, 7, B, -1, 3, 1, 2]])
    assert out[0].tolist() == [15, 0, 7, B, -1, 3, 1, 2]  # identity slots, newest -> slot B
    assert hb.stats.rows_copied == rows + 1  # only the newest token moved


@pytest.mark.parametrize("kind", KINDS)
def test_rollback_forgets_rows_that_the_host_rewrites(kind):
    B = 8
    pool = make_pool(kind, 1, 64)
    hb = HotBuffer(pool, buffer_size=B, page_size=4)
    translate(hb, [0], [40], [[30, 35, 38, 39, 10]])
    assert {30, 35, 38, 10} <= set(hb.slot_positions(0).tolist()[:B])
    # speculative tokens 32.. rejected: the next translate sees seq_len 33, row 32 is new
    rewrite_rows(pool, 0, 32, seed=5)
    translate(hb, [0], [33], [[10, 32, 30]])
    sp = hb.slot_positions(0).tolist()
    assert 35 not in sp and 38 not in sp and sp[B] == 32
    rewrite_rows(pool, 0, 33, seed=6)
    translate(hb, [0], [40], [[35, 38, 39, 10]])  # misses again, with the new bytes (checked)
    # rows rewritten before a translate sees the shorter length: truncate first
    hb.truncate(0, 20)
    rewrite_rows(pool, 0, 20, seed=7)
    assert max(hb.slot_positions(0).tolist()) < 20
    translate(hb, [0], [40], [[35, 38, 39, 10, 21]])
    # a short rollback rebuilds the in-order prefix from the (rewritten) host rows
    rewrite_rows(pool, 0, 4, seed=8)
    translate(hb, [0], [6], [[5, 4, 0]])
    assert hb.slot_positions(0).tolist()[:6] == list(range(6))
    for bad in ((0, -1), (0, 65), (1, 3), (0, 2.0)):
        with pytest.raises(HotBufferError):
            hb.truncate(*bad)


def test_free_makes_a_region_reusable():
    B = 8
    pool = make_pool("fp8", 2, 64)
    hb = HotBuffer(pool, buffer_size=B, page_size=4)
    translate(hb, [0, 1], [40, 30], [[1, 2, 39, 3], [4, 5, 6, 29]])
    translate(hb, [0, 1], [41, 31], [[1, 2, 40, 3], [4, 5, 6, 30]])
    region1 = hb.buffer[hb.row_range(1).start : hb.row_range(1).stop].clone()
    sp1, lru1 = hb.slot_positions(1), hb.lru_order(1)
    hb.free(0)
    assert hb.slot_positions(0).tolist() == [-1] * (B + 1)
    assert hb.lru_order(0).tolist() == list(range(B))
    rewrite_rows(pool, 0, 0, seed=9)  # a new request takes slot 0 of the pool
    before = hb.stats
    translate(hb, [0], [35], [[1, 2, 34, 3]])
    s = hb.stats
    assert (s.hits - before.hits, s.misses - before.misses) == (0, 4), "starts cold"
    assert torch.equal(hb.buffer[hb.row_range(1).start : hb.row_range(1).stop], region1)
    assert torch.equal(hb.slot_positions(1), sp1) and torch.equal(hb.lru_order(1), lru1)
    hb.free([0, 1])
    hb.free(torch.tensor([1], dtype=torch.int32))
    hb.free([])
    assert all(hb.slot_positions(r).tolist() == [-1] * (B + 1) for r in (0, 1))
    check_residency(hb)
    for bad in (2, -1, [0, 5], "0", 1.0, torch.tensor([0.0])):
        with pytest.raises(HotBufferError, match="req_id"):
            hb.free(bad)


def test_reset_and_reset_stats():
    hb = HotBuffer(make_pool("fp8", 2, 32), buffer_size=4, page_size=2)
    translate(hb, [0, 1], [20, 3], [[1, 2], [0, 2]])
    hb.reset_stats()
    assert hb.stats == HotBufferStats()
    assert hb.stats.hit_rate == 0.0
    translate(hb, [0, 1], [20, 3], [[1, 2], [0, 2]])
    assert hb.stats.hit_rate == 1.0
    hb.reset()
    assert hb.stats == HotBufferStats()
    assert hb.slot_positions(0).tolist() == [-1] * 5


def test_empty_batch_and_empty_topk():
    hb = HotBuffer(make_pool("fp8", 2, 32), buffer_size=4, page_size=2)
    out = hb.translate(t64([]), t64([]), torch.zeros((0, 3), dtype=torch.int64))
    assert out.shape == (0, 3) and out.dtype == torch.int32
    out = hb.translate(t64([1]), t64([20]), torch.zeros((1, 0), dtype=torch.int64))
    assert out.shape == (1, 0)
    # even with no positions asked, the newest token of a long request is made resident
    assert hb.slot_positions(1).tolist()[4] == 19
    assert stats_tuple(hb.stats)[:4] == (2, 0, 0, 1)


@pytest.mark.parametrize("dtype", [torch.int16, torch.int32, torch.int64])
def test_integer_input_dtypes_agree(dtype):
    ids, lens, pos = [1, 0], [50, 7], [[49, 3, -1, 12], [6, 0, 0, -1]]
    ref = HotBuffer(make_pool("fp8", 2, 64), buffer_size=8, page_size=4)
    hb = HotBuffer(make_pool("fp8", 2, 64), buffer_size=8, page_size=4)
    a = ref.translate(t64(ids), t64(lens), t64(pos))
    b = hb.translate(
        torch.tensor(ids, dtype=dtype), torch.tensor(lens, dtype=dtype), torch.tensor(pos, dtype=dtype)
    )
    assert torch.equal(a, b)
    assert torch.equal(as_bytes(ref.buffer), as_bytes(hb.buffer))


def test_wide_slot_table_matches_the_model():
    """buffer_size >= 2**15 switches the position -> slot table to int32."""
    B, page = 2**15, 64
    pool = make_pool("fp8", 1, B + 100)
    hb, model = HotBuffer(pool, B, page_size=page), LRUModel(pool, B, page_size=page)
    assert hb._pos_slot.dtype == torch.int32
    rng = random.Random(3)
    for L in (B + 10, B + 11, B + 50):
        pos = [[rng.randrange(L) for _ in range(64)] + [-1]]
        assert torch.equal(hb.translate(t64([0]), t64([L]), t64(pos)), model.translate([0], [L], pos))
    assert_agrees(hb, model)


# ---------------------------------------------------------------------------------- errors
def _error_cases(R=3, S=40, B=8):
    ok_ids, ok_lens, ok_pos = t64([0, 2]), t64([30, 5]), t64([[1, 29, -1], [4, 0, -1]])
    i32 = torch.int32
    return [
        ("req_ids", dict(req_ids=[0, 2])),
        ("req_ids", dict(req_ids=torch.tensor([0.0, 2.0]))),
        ("req_ids", dict(req_ids=torch.tensor([True, False]))),
        ("req_ids", dict(req_ids=t64([[0, 2]]))),
        ("req_ids", dict(req_ids=t64([0, R]))),
        ("req_ids", dict(req_ids=t64([-1, 2]))),
        ("req_ids", dict(req_ids=t64([2, 2]))),
        ("seq_lens", dict(seq_lens=t64([30]))),
        ("seq_lens", dict(seq_lens=t64([30, 0]))),
        ("seq_lens", dict(seq_lens=t64([S + 1, 5]))),
        ("seq_lens", dict(seq_lens=torch.tensor([30.0, 5.0]))),
        ("positions", dict(positions=t64([1, 29, -1]))),
        ("positions", dict(positions=t64([[1, 29, -1]]))),
        ("positions", dict(positions=t64([[1, 30, -1], [4, 0, -1]]))),  # == its seq_len
        ("positions", dict(positions=t64([[1, 29, -1], [4, 5, -1]]))),
        ("positions", dict(positions=t64([[1, 29, -2], [4, 0, -1]]))),
        ("positions", dict(positions=torch.zeros((2, B + 1), dtype=i32))),  # top_k > buffer_size
        ("positions", dict(positions=ok_pos.double())),
        ("positions", dict(positions=t64([[1, 2**40, -1], [4, 0, -1]]))),  # not wrapped by int32
    ], (ok_ids, ok_lens, ok_pos)


@pytest.mark.parametrize("case", range(len(_error_cases()[0])))
@pytest.mark.parametrize("kind", KINDS)
def test_errors_raise_before_any_state_change(case, kind):
    (name, bad), (ok_ids, ok_lens, ok_pos) = _error_cases()[0][case], _error_cases()[1]
    hb = HotBuffer(make_pool(kind, 3, 40), buffer_size=8, page_size=4)
    translate(hb, [0, 2, 1], [29, 4, 12], [[1, 28, 5], [3, 0, -1], [11, 2, 2]])
    before = snapshot(hb)
    args = dict(req_ids=ok_ids, seq_lens=ok_lens, positions=ok_pos)
    args.update(bad)
    with pytest.raises(HotBufferError) as err:
        hb.translate(**args)
    assert str(err.value).startswith(name), err.value
    assert_same_snapshot(before, snapshot(hb))
    # and the buffer still works
    translate(hb, [0, 2], [30, 5], [[1, 29, -1], [4, 0, -1]])


def test_error_messages_name_the_offender():
    hb = HotBuffer(make_pool("fp8", 3, 40), buffer_size=8, page_size=4)
    with pytest.raises(HotBufferError, match=r"positions: \[1, 1\] \(request 2\) is 5; .*seq_len 5"):
        hb.translate(t64([0, 2]), t64([30, 5]), t64([[1, 29], [4, 5]]))
    with pytest.raises(HotBufferError, match=r"top_k <= buffer_size 8"):
        hb.translate(t64([0]), t64([30]), torch.zeros((1, 9), dtype=torch.int64))
    with pytest.raises(HotBufferError, match=r"request 2 appears more than once"):
        hb.translate(t64([2, 2]), t64([30, 5]), t64([[1], [4]]))
    with pytest.raises(HotBufferError, match=r"seq_lens: element 1 \(request 2\) is 41; .*40"):
        hb.translate(t64([0, 2]), t64([30, 41]), t64([[1], [4]]))
    with pytest.raises(HotBufferError, match=r"seq_lens: shape \(1,\), dtype torch.int64, device cpu; expected \[2\]"):
        hb.translate(t64([0, 2]), t64([30]), t64([[1], [4]]))


# ---------------------------------------------------------------------------------- model
def _run_against_model(data, kind: str, max_steps: int) -> None:
    draw = data.draw
    R = draw(st.integers(1, 4), label="num_requests")
    page = draw(st.sampled_from([1, 2, 4]), label="page_size")
    B = page * draw(st.integers(1, 4), label="pages")
    S = draw(st.integers(1, 3 * B + 3), label="max_seq_len")
    top_k = draw(st.integers(0, B), label="top_k")
    pool = make_pool(kind, R, S, seed=draw(st.integers(0, 2**16)))
    hb, model = HotBuffer(pool, B, page_size=page), LRUModel(pool, B, page_size=page)
    lens = [draw(st.integers(1, S)) for _ in range(R)]
    prev = [[] for _ in range(R)]
    for step in range(draw(st.integers(1, max_steps), label="steps")):
        ids = draw(st.lists(st.integers(0, R - 1), min_size=1, max_size=R, unique=True))
        for r in ids:
            event = draw(
                st.sampled_from(["decode", "decode", "decode", "stay", "jump", "rollback", "truncate", "free"])
            )
            if event == "decode":
                lens[r] = min(S, lens[r] + draw(st.integers(1, 2)))
            elif event == "jump":
                lens[r] = draw(st.integers(lens[r], S))
            elif event == "rollback":
                lens[r] = draw(st.integers(1, lens[r]))
                rewrite_rows(pool, r, lens[r], seed=step * 31 + r)
            elif event == "truncate":
                cut = draw(st.integers(0, lens[r]))
                hb.truncate(r, cut)
                model.truncate(r, cut)
                rewrite_rows(pool, r, cut, seed=step * 41 + r)
                lens[r] = draw(st.integers(max(cut, 1), S))
            elif event == "free":
                lens[r] = draw(st.integers(1, S))
                rewrite_rows(pool, r, 0, seed=step * 37 + r)
                hb.free(r)
                model.free(r)
                prev[r] = []
        rows = []
        for r in ids:
            L, row = lens[r], []
            old = [p for p in prev[r] if 0 <= p < L]
            for _ in range(top_k):
                how = draw(st.sampled_from(["prev", "prev", "random", "pad", "newest", "dup"]))
                if how == "prev" and old:
                    row.append(draw(st.sampled_from(old)))
                elif how == "pad":
                    row.append(-1)
                elif how == "newest":
                    row.append(L - 1)
                elif how == "dup" and row:
                    row.append(draw(st.sampled_from(row)))
                else:
                    row.append(draw(st.integers(0, L - 1)))
            rows.append(row)
            prev[r] = row
        sl = [lens[r] for r in ids]
        got = translate(hb, ids, sl, rows)
        want = model.translate(ids, sl, rows)
        assert torch.equal(got, want), (step, ids, sl, rows)
        assert_agrees(hb, model)


@pytest.mark.parametrize("kind", KINDS)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_matches_the_lru_model(kind, data):
    """Exact agreement: SGLang's LRU order is a strict total order, so slot choice is fully
    determined and both implementations must pick the same slots, not just the same set."""
    _run_against_model(data, kind, max_steps=8)


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_matches_the_lru_model_long(kind, data):
    _run_against_model(data, kind, max_steps=20)


@pytest.mark.parametrize("kind", KINDS)
def test_matches_the_model_on_a_decode_stream(kind):
    """A realistic stream at a moderate size: locality between steps, ~30 % fresh positions,
    decode growth, short and long requests mixed."""
    R, B, K, S = 8, 256, 128, 1200
    pool = make_pool(kind, R, S, seed=1)
    hb, model = HotBuffer(pool, B, page_size=64), LRUModel(pool, B, page_size=64)
    rng = random.Random(7)
    lens = [rng.choice([40, 200, 255, 600, 900]) for _ in range(R)]
    prev = [[] for _ in range(R)]
    for _ in range(12):
        ids = sorted(rng.sample(range(R), rng.randint(1, R)))
        rows = []
        for r in ids:
            lens[r] += 1
            L = lens[r]
            keep = [p for p in prev[r] if p >= 0][: int(0.7 * K)]
            fresh = [rng.randrange(L) for _ in range(K - len(keep))]
            row = keep + fresh
            rng.shuffle(row)
            row = row[: min(K, L)] + [-1] * (K - min(K, L))
            rows.append(row)
            prev[r] = row
        sl = [lens[r] for r in ids]
        got = translate(hb, ids, sl, rows)
        assert torch.equal(got, model.translate(ids, sl, rows))
    assert_agrees(hb, model)
    assert hb.stats.hits > 0 and hb.stats.misses > 0


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("aligned", [True, False])
def test_copy_paths_agree(kind, aligned):
    """Word-wise and byte-wise copies, one staging chunk or many: the same bytes land."""
    R, S, B = 3, 300, 32
    pool = make_pool(kind, R, S, seed=4)
    if not aligned:  # the same rows at a storage offset that rules out int64 words
        raw = torch.empty(pool.numel() + 1, dtype=pool.dtype)
        raw[1:].copy_(pool.view(-1))
        pool = raw[1:].view(pool.shape)
    hb, model = HotBuffer(pool, B, page_size=8), LRUModel(pool, B, page_size=8)
    assert (hb._copy_src.dtype == torch.int64) == aligned
    hb._staging_rows = 7  # force several chunks through one small staging block
    rng = random.Random(11)
    for L in range(60, 70):
        lens = [L, L - 50]  # one long request, one short
        rows = [[rng.randrange(n) for _ in range(24)] for n in lens]
        got = translate(hb, [0, 2], lens, rows)
        assert torch.equal(got, model.translate([0, 2], lens, rows))
    assert_agrees(hb, model)


@pytest.mark.parametrize("which", ["req_ids", "seq_lens", "positions"])
def test_tensors_without_data_or_on_another_device_are_refused(which):
    """A meta tensor (no data) or a sparse one is a HotBufferError naming it, before any change."""
    hb = HotBuffer(make_pool("fp8", 2, 200), buffer_size=64)
    args = {"req_ids": torch.tensor([0]), "seq_lens": torch.tensor([100]),
            "positions": torch.arange(8, dtype=torch.int64).unsqueeze(0)}
    before = (hb.buffer.clone(), hb.stats)
    for bad in (args[which].to("meta"), args[which].to_sparse()):
        with pytest.raises(HotBufferError, match=which):
            hb.translate(**dict(args, **{which: bad}))
    assert torch.equal(hb.buffer, before[0]) and hb.stats == before[1]
    strided = torch.arange(16, dtype=torch.int64).unsqueeze(0)[:, ::2]  # non-contiguous is fine
    assert torch.equal(hb.translate(args["req_ids"], args["seq_lens"], strided),
                       hb.translate(args["req_ids"], args["seq_lens"], strided.contiguous()))


def test_sizes_past_the_memory_limit_are_refused_before_allocating(monkeypatch):
    """buffer_size 2**22 would take gigabytes: the bytes are computed and checked first."""
    pool = torch.zeros(2, 64, 656, dtype=torch.uint8)
    allocated = []
    real_zeros = torch.zeros
    monkeypatch.setattr(torch, "zeros", lambda *a, **k: allocated.append(a) or real_zeros(*a, **k))
    with pytest.raises(HotBufferError, match=r"buffer_size: 4194304 slots x 2 requests need 6\.1 GiB.*"
                                             r"the limit is 1\.0 GiB \(max_bytes\)"):
        HotBuffer(pool, buffer_size=2**22, max_bytes=1 << 30)
    assert allocated == []
    monkeypatch.setenv("HISPARSE_MEMORY_LIMIT", "64M")
    with pytest.raises(HotBufferError, match="HISPARSE_MEMORY_LIMIT"):
        HotBuffer(pool, buffer_size=2**22)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
@pytest.mark.parametrize("device, text", [("cuda", "CUDA is not available"), ("cuda:3", "CUDA is not available"),
                                          ("warp", "is not a device name"), ("meta", "cpu and cuda devices only")])
def test_a_device_that_cannot_hold_the_buffer_is_named(device, text):
    pool = torch.zeros(1, 64, 656, dtype=torch.uint8)
    with pytest.raises(HotBufferError, match=text):
        HotBuffer(pool, buffer_size=64, device=device)
