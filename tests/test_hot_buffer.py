"""Tests of kernels_bridge.hot_buffer.HotBuffer: SGLang's coordinator and kernel around each step
(admission, the newest token on the device, the short phase, repeats and padding per release),
step for step against the independent transcription of SGLang's code (tests/oracles/
sglang_hisparse.py): outputs, slots, LRU orders, copies, device writes and the buffer's bytes;
errors without side effects; lifecycle; memory."""
from __future__ import annotations

import random

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kernels_bridge.hot_buffer import HotBuffer, HotBufferError, HotBufferStats
from kernels_bridge.layout import hot_buffer_parts
from tests.oracles.sglang_hisparse import Coordinator, UndefinedBehaviour

KINDS = ["bf16", "fp8"]
MODES = [(release, admission) for release in ("0.5.23", "0.5.12") for admission in ("normal", "disaggregated")]


# ---------------------------------------------------------------------------------- helpers
def make_pool(kind: str, num_requests: int, max_seq_len: int, seed: int = 0) -> torch.Tensor:
    """Random rows. BF16 rows are random bit patterns, NaNs and infinities included, so only an
    exact byte copy keeps them equal."""
    g = torch.Generator().manual_seed(seed)
    if kind == "fp8":
        return torch.randint(0, 256, (num_requests, max_seq_len, 656), dtype=torch.uint8, generator=g)
    bits = torch.randint(-(2**15), 2**15, (num_requests, max_seq_len, 576), dtype=torch.int16, generator=g)
    return bits.view(torch.bfloat16)


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)


def t64(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64)


def step(hb: HotBuffer, req_ids, seq_lens, positions) -> torch.Tensor:
    pos = torch.tensor(positions, dtype=torch.int64).view(len(req_ids), -1)
    return hb.translate(t64(req_ids), t64(seq_lens), pos)


class Twin:
    """A HotBuffer and the oracle's coordinator, driven together and compared after each step."""

    def __init__(self, pool, B, page, release="0.5.23", admission="normal"):
        self.pool = pool
        self.hb = HotBuffer(pool, B, page_size=page, release=release, admission=admission)
        R, S = pool.shape[:2]
        host = {r * S + p: as_bytes(pool[r, p]) for r in range(R) for p in range(S)}
        self.co = Coordinator(R, S, B, page, release=release, host=host)
        self.direct = admission == "disaggregated"
        self.live = set()
        self.lookups = 0

    def free(self, r):
        self.hb.free(r)
        self.co.finish(r)
        self.live.discard(r)

    def step(self, ids, lens, rows):
        for r, L in zip(ids, lens):
            if r not in self.live:
                self.co.admit(r, L - 1, direct=self.direct)
                self.live.add(r)
        try:
            want = self.co.step(ids, lens, rows)
        except UndefinedBehaviour:  # SGLang's kernel would leave the request's rows: refused
            with pytest.raises(HotBufferError, match="repeated positions"):
                step(self.hb, ids, lens, rows)
            return None
        got = step(self.hb, ids, lens, rows)
        B = self.hb.buffer_size
        for i, (L, row) in enumerate(zip(lens, rows)):
            served = [j for j, p in enumerate(row) if p >= 0 and (L > B or j < L)]
            self.lookups += len(served)
            g = got[i].tolist()
            assert [g[j] for j in served] == [want[i][j] for j in served], (i, row)
            assert all(g[j] == -1 for j in range(len(row)) if j not in served), "unserved entries are -1"
        self.assert_same()
        return got

    def assert_same(self):
        hb, co, B = self.hb, self.co, self.hb.buffer_size
        S = hb.max_seq_len
        for r in range(hb.num_requests):  # a token past max_seq_len can never be asked: empty here
            assert hb.slot_positions(r)[:B].tolist() == [t if t < S else -1 for t in co.reqs[r].tokens[:B]], r
            assert hb.lru_order(r).tolist() == co.reqs[r].lru, r
        s = hb.stats
        assert (s.rows_copied, s.rows_written, s.misses) == (co.copies, co.writes, co.misses)
        assert s.lookups == self.lookups and s.hits == s.lookups - s.misses
        for loc, kv in co.device.items():
            if isinstance(kv, torch.Tensor):  # a defined row (0.5.12 may copy one it cannot name)
                assert torch.equal(as_bytes(hb.buffer[loc]), kv), loc


# ---------------------------------------------------------------------------------- layout
@pytest.mark.parametrize("kind", KINDS)
def test_layout_and_paged_view(kind):
    pool = make_pool(kind, 3, 40)
    hb = HotBuffer(pool, buffer_size=8, page_size=4)
    row = 656 if kind == "fp8" else 576
    assert (hb.kv_format, hb.row_bytes, hb.rows_per_request) == (kind, 656 if kind == "fp8" else 1152, 12)
    assert (hb.admission, hb.release) == ("normal", "0.5.23")
    assert hb.buffer.shape == (3 * 12, row) and hb.buffer.dtype == pool.dtype
    assert not as_bytes(hb.buffer).any(), "rows never written are zero"
    assert hb.host_pool is pool, "a CPU host pool is kept by reference"
    assert hb.row_range(1) == range(12, 24)
    view = hb.paged_view()
    assert view.data_ptr() == hb.buffer.data_ptr()
    assert view.shape == ((9, 4, 1, 656) if kind == "fp8" else (36, 1, 576))


def test_lazy_export():
    import kernels_bridge

    assert kernels_bridge.HotBuffer is HotBuffer


@pytest.mark.parametrize("make, kwargs, words", [
    (lambda: torch.zeros(2, 8, 100, dtype=torch.uint8), {}, "host_pool: shape (2, 8, 100)"),
    (lambda: torch.zeros(2, 8, 656, dtype=torch.float8_e4m3fn), {}, "view an FP8 cache as bytes"),
    (lambda: torch.zeros(2, 8, 656, dtype=torch.uint8)[:, ::2], {}, "not contiguous"),
    (lambda: [[0]], {}, "host_pool: expected a torch.Tensor"),
    (lambda: torch.zeros(2, 8, 656, dtype=torch.uint8), {"buffer_size": 6}, "multiple of page_size 4"),
    (lambda: torch.zeros(2, 8, 656, dtype=torch.uint8), {"buffer_size": 0}, "buffer_size: got 0"),
    (lambda: torch.zeros(2, 8, 656, dtype=torch.uint8), {"buffer_size": True}, "buffer_size: got True"),
    (lambda: torch.zeros(2, 8, 656, dtype=torch.uint8), {"admission": "warm"}, "admission: got 'warm'"),
    (lambda: torch.zeros(2, 8, 656, dtype=torch.uint8), {"release": "0.5.17"}, "release: got '0.5.17'"),
    (lambda: torch.zeros(2, 8, 656, dtype=torch.uint8), {"max_bytes": float("nan")}, "max_bytes"),
])
def test_constructor_errors(make, kwargs, words):
    args = {"buffer_size": 8, "page_size": 4, **kwargs}
    with pytest.raises(HotBufferError, match=words.replace("(", r"\(").replace(")", r"\)")):
        HotBuffer(make(), args.pop("buffer_size"), **args)


# ---------------------------------------------------------------------------------- SGLang's steps
def test_normal_admission_starts_warm_and_the_newest_token_is_never_copied():
    """A prefill of B tokens leaves them in slots 0..B-1: the long steps that follow hit them; each
    step's new token is written on the device into the reserved slot and counted a hit."""
    pool = make_pool("fp8", 1, 200)
    hb = HotBuffer(pool, 64, page_size=16)
    out = step(hb, [0], [65], [list(range(0, 64, 2)) + [64]])
    assert out[0].tolist() == list(range(0, 64, 2)) + [64]
    assert hb.stats == HotBufferStats(steps=1, lookups=33, hits=33, misses=0, rows_copied=0, bytes_copied=0,
                                      rows_written=1)
    assert torch.equal(hb.buffer[:64], pool[0, :64]) and torch.equal(hb.buffer[64], pool[0, 64])
    step(hb, [0], [66], [[65, 64] + list(range(30))])  # 64 left the reserved slot: a miss
    s = hb.stats
    assert (s.misses, s.rows_copied, s.rows_written) == (1, 1, 2)
    assert torch.equal(hb.buffer[64], pool[0, 65])


def test_disaggregated_admission_starts_cold_and_preloads_a_short_request():
    pool = make_pool("bf16", 2, 300)
    hb = HotBuffer(pool, 128, page_size=64, admission="disaggregated")
    step(hb, [0, 1], [201, 100], [list(range(64)), list(range(64))])
    s = hb.stats
    assert s.misses == 64  # the long request: every slot empty
    assert s.rows_copied == 64 + 99  # and the short one preloaded (its 100th token written on the device)
    assert s.rows_written == 2
    assert torch.equal(as_bytes(hb.buffer[192:192 + 100]), as_bytes(pool[1, :100]))


def test_short_requests_copy_nothing_and_ignore_entries_past_their_length():
    hb = HotBuffer(make_pool("fp8", 1, 100), 64, page_size=16)
    out = step(hb, [0], [5], [[4, 0, -1, 3, 2, 1]])
    assert out[0].tolist() == [4, 0, -1, 3, 2, -1]  # entry 5 is past seq_len 5: the kernel skips it
    assert (hb.stats.lookups, hb.stats.misses, hb.stats.rows_copied) == (4, 0, 0)


@pytest.mark.parametrize("release", ["0.5.23", "0.5.12"])
def test_a_repeated_position_takes_a_slot_each_time_it_misses(release):
    pool = make_pool("fp8", 1, 300)
    hb = HotBuffer(pool, 64, page_size=16, release=release)
    out = step(hb, [0], [200], [[150, 150, 151, 1]])
    assert hb.stats.misses == 3 and hb.stats.rows_copied == 3
    a, b = out[0, 0].item(), out[0, 1].item()
    assert a != b and torch.equal(hb.buffer[a], hb.buffer[b]) and torch.equal(hb.buffer[a], pool[0, 150])
    assert hb.slot_positions(0).tolist().count(150) == 2


def test_padding_in_a_long_request_is_skipped_by_0_5_23_and_overcopied_by_0_5_12():
    new, old = (HotBuffer(make_pool("fp8", 1, 300), 64, page_size=16, release=r) for r in ("0.5.23", "0.5.12"))
    for hb in (new, old):
        out = step(hb, [0], [200], [[150, -1, -1, 151]])
        assert out[0, 1:3].tolist() == [-1, -1]
    assert (new.stats.misses, new.stats.rows_copied) == (2, 2)
    assert (old.stats.misses, old.stats.rows_copied) == (2, 4)  # top_k - hits - newest = 4


def test_a_request_never_shrinks_until_freed():
    pool = make_pool("fp8", 2, 300)
    hb = HotBuffer(pool, 64, page_size=16)
    step(hb, [0], [200], [[1, 2]])
    with pytest.raises(HotBufferError, match=r"seq_lens: element 0 \(request 0\) is 150, below its previous 200"):
        step(hb, [0], [150], [[1, 2]])
    hb.free(0)
    assert hb.slot_positions(0).tolist() == [-1] * 65 and hb.lru_order(0).tolist() == list(range(64))
    step(hb, [0], [150], [[1, 2]])  # admitted anew: warm again
    assert hb.stats.misses == 0


def test_slots_filled_by_repeats_are_refused_before_the_kernel_would_leave_the_request():
    """A position asked twice per step adds a slot holding it each step; once hits on those
    slots leave fewer evictable slots than misses, SGLang's kernel writes outside the request's
    rows: refused, nothing changed."""
    hb = HotBuffer(make_pool("fp8", 1, 300), 8, page_size=8)
    for _ in range(7):
        step(hb, [0], [200], [[150] * 2 + [-1] * 6])
    assert hb.slot_positions(0)[:8].tolist().count(150) == 8
    before = (hb.buffer.clone(), hb.slot_positions(0), hb.lru_order(0), hb.stats)
    with pytest.raises(HotBufferError, match="repeated positions"):
        step(hb, [0], [201], [[150, 1, 2, 3, 4, 5, 6, 7]])
    assert torch.equal(hb.buffer, before[0]) and torch.equal(hb.slot_positions(0), before[1])
    assert torch.equal(hb.lru_order(0), before[2]) and hb.stats == before[3]
    step(hb, [0], [201], [[1, 2]])  # and it still works


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64])
def test_every_integer_dtype_gives_the_same_rows(dtype):
    rows = [[3, 100, 7], [0, 1, 2]] if dtype != torch.uint8 else [[3, 100, 7], [0, 1, 2]]
    want = step(HotBuffer(make_pool("fp8", 2, 300), 64, page_size=16), [0, 1], [120, 10], rows)
    hb = HotBuffer(make_pool("fp8", 2, 300), 64, page_size=16)
    got = hb.translate(torch.tensor([0, 1], dtype=dtype), torch.tensor([120, 10], dtype=dtype),
                       torch.tensor(rows, dtype=dtype))
    assert torch.equal(got, want)


def test_a_counting_hot_buffer_keeps_the_same_books_without_rows():
    pool = make_pool("fp8", 3, 400)
    full = HotBuffer(pool, 64, page_size=16)
    books = HotBuffer.counting(3, 400, 64, page_size=16)
    assert books.buffer is None and books.host_pool is None and books.kv_format == "fp8"
    rng = random.Random(5)
    lens = [70, 200, 30]
    for _ in range(10):
        lens = [L + rng.randint(0, 2) for L in lens]
        rows = [[rng.randrange(L) for _ in range(32)] for L in lens]
        assert torch.equal(step(full, [0, 1, 2], lens, rows), step(books, [0, 1, 2], lens, rows))
    assert full.stats == books.stats and full.stats.misses > 0
    with pytest.raises(HotBufferError, match="counting"):
        books.paged_view()


# ---------------------------------------------------------------------------------- errors
def _error_cases(R=3, S=40, B=8):
    ok_ids, ok_lens, ok_pos = t64([0, 2]), t64([30, 5]), t64([[1, 29, -1], [4, 0, -1]])
    i32 = torch.int32
    freed = t64([[1, 29, -1], [4, 0, -1]])
    freed.untyped_storage().resize_(0)
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
        ("seq_lens", dict(seq_lens=t64([28, 5]))),  # below request 0's last
        ("positions", dict(positions=t64([1, 29, -1]))),
        ("positions", dict(positions=t64([[1, 29, -1]]))),
        ("positions", dict(positions=t64([[1, 30, -1], [4, 0, -1]]))),  # == its seq_len
        ("positions", dict(positions=t64([[1, 29, -1], [4, 5, -1]]))),
        ("positions", dict(positions=t64([[1, 29, -2], [4, 0, -1]]))),
        ("positions", dict(positions=torch.zeros((2, B + 1), dtype=i32))),  # top_k > buffer_size
        ("positions", dict(positions=ok_pos.double())),
        ("positions", dict(positions=t64([[1, 2**40, -1], [4, 0, -1]]))),  # not wrapped by int32
        ("positions", dict(positions=freed)),
        ("positions", dict(positions=torch.nested.nested_tensor([t64([1, 29]), t64([4, 0, -1])]))),
    ], (ok_ids, ok_lens, ok_pos)


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
@pytest.mark.parametrize("case", range(len(_error_cases()[0])))
def test_errors_raise_before_any_state_change(case):
    (name, bad), (ok_ids, ok_lens, ok_pos) = _error_cases()[0][case], _error_cases()[1]
    hb = HotBuffer(make_pool("fp8", 3, 40), buffer_size=8, page_size=4)
    step(hb, [0, 2, 1], [29, 4, 12], [[1, 28, 5], [3, 0, -1], [11, 2, 2]])
    before = (hb.buffer.clone(), [(hb.slot_positions(r), hb.lru_order(r)) for r in range(3)], hb.stats)
    args = dict(req_ids=ok_ids, seq_lens=ok_lens, positions=ok_pos)
    args.update(bad)
    with pytest.raises(HotBufferError) as err:
        hb.translate(**args)
    assert str(err.value).startswith(name + ":"), err.value
    assert torch.equal(hb.buffer, before[0]) and hb.stats == before[2]
    assert all(torch.equal(a, c) and torch.equal(b, d) for (a, b), (c, d) in
               zip(before[1], [(hb.slot_positions(r), hb.lru_order(r)) for r in range(3)]))
    step(hb, [0, 2], [30, 5], [[1, 29, -1], [4, 0, -1]])  # and the buffer still works


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


def test_a_host_pool_freed_after_construction_is_named():
    pool = make_pool("fp8", 1, 100)
    hb = HotBuffer(pool, 64, page_size=16)
    pool.untyped_storage().resize_(0)
    with pytest.raises(HotBufferError, match="host_pool: .*storage was freed"):
        step(hb, [0], [90], [[1, 2]])


@pytest.mark.parametrize("which", ["req_ids", "seq_lens", "positions"])
def test_tensors_without_data_are_refused(which):
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


# ---------------------------------------------------------------------------------- the oracle
def _events(draw, twin, lens, S, R):
    ids = draw(st.lists(st.integers(0, R - 1), min_size=1, max_size=R, unique=True))
    for r in ids:
        event = draw(st.sampled_from(["decode", "decode", "decode", "stay", "jump", "free"]))
        if event == "decode":
            lens[r] = min(S, lens[r] + 1)
        elif event == "jump":
            lens[r] = draw(st.integers(lens[r], S))
        elif event == "free":
            twin.free(r)
            lens[r] = draw(st.integers(1, S))
    return ids


def _row(draw, L, top_k, old):
    row = []
    for _ in range(top_k):
        how = draw(st.sampled_from(["prev", "prev", "random", "random", "pad", "newest", "dup"]))
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
    return row


def _run_against_the_oracle(data, kind: str, max_steps: int) -> None:
    draw = data.draw
    release, admission = draw(st.sampled_from(MODES), label="release, admission")
    R = draw(st.integers(1, 3), label="num_requests")
    page = draw(st.sampled_from([1, 2, 4]), label="page_size")
    B = page * draw(st.integers(1, 4), label="pages")
    S = draw(st.integers(2, 3 * B + 3), label="max_seq_len")
    top_k = draw(st.integers(1, B), label="top_k")  # SGLang's kernel is built for top_k >= 1
    twin = Twin(make_pool(kind, R, S, seed=draw(st.integers(0, 2**16))), B, page, release, admission)
    lens = [draw(st.integers(1, S)) for _ in range(R)]
    prev = [[] for _ in range(R)]
    for _ in range(draw(st.integers(1, max_steps), label="steps")):
        ids = _events(draw, twin, lens, S, R)
        rows = [_row(draw, lens[r], top_k, [p for p in prev[r] if 0 <= p < lens[r]]) for r in ids]
        for r, row in zip(ids, rows):
            prev[r] = row
        if twin.step(ids, [lens[r] for r in ids], rows) is None:  # repeats cornered the kernel
            return


@pytest.mark.parametrize("kind", KINDS)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_agrees_with_sglangs_code_step_for_step(kind, data):
    """Random streams (both releases, both admissions; decode, jumps, frees, repeats, padding,
    the newest token) against the transcription of SGLang's kernel and coordinator: the same
    outputs wherever SGLang writes them, slots, LRU orders, copies, device writes and bytes."""
    _run_against_the_oracle(data, kind, max_steps=8)


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_agrees_with_sglangs_code_long(kind, data):
    _run_against_the_oracle(data, kind, max_steps=20)


@pytest.mark.parametrize("release, admission", MODES)
def test_agrees_with_sglangs_code_on_a_decode_stream(release, admission):
    """A realistic stream at a moderate size: locality between steps, fresh positions, decode
    growth from short into long, requests of several lengths."""
    R, B, K, S = 6, 256, 128, 1200
    twin = Twin(make_pool("fp8", R, S, seed=1), B, 64, release, admission)
    rng = random.Random(7)
    lens = [rng.choice([40, 200, 255, 600, 900]) for _ in range(R)]
    prev = [[] for _ in range(R)]
    for _ in range(10):
        ids = sorted(rng.sample(range(R), rng.randint(1, R)))
        rows = []
        for r in ids:
            lens[r] += 1
            L = lens[r]
            keep = [p for p in prev[r] if p >= 0][: int(0.7 * K)]
            fresh = rng.sample(range(L), min(L, K))
            row = list(dict.fromkeys(keep + fresh))[: min(K, L)]  # distinct, as the indexer gives
            rng.shuffle(row)
            rows.append(row + [-1] * (K - len(row)))
            prev[r] = row
        twin.step(ids, [lens[r] for r in ids], rows)
    assert twin.hb.stats.hits > 0 and twin.hb.stats.misses > 0


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
    twin = Twin(pool, B, 8)
    assert (twin.hb._rows.words[0].dtype == torch.int64) == aligned
    twin.hb._rows._staging_rows = 7  # force several chunks through one small staging block
    rng = random.Random(11)
    for L in range(60, 70):
        lens = [L, L - 50]  # one long request, one short
        twin.step([0, 2], lens, [rng.sample(range(n), min(n, 24)) + [-1] * max(0, 24 - n) for n in lens])


# ---------------------------------------------------------------------------------- memory
def test_the_memory_formula_is_what_a_hot_buffer_holds():
    """layout.hot_buffer_parts: the rows, the state and the staging are exactly what a HotBuffer
    holds; a step of every request at top-k = buffer_size stays within the "step" part."""
    R, S, B, P = 4, 600, 256, 64
    hb = HotBuffer(make_pool("fp8", R, S), B, page_size=P)
    parts = hot_buffer_parts(R, S, B, P, 656)
    held = {name: t.numel() * t.element_size() for name, t in hb._state.tensors().items()}
    assert hb.buffer.numel() == parts["rows"]
    assert sum(held.values()) == parts["state"]
    rng = random.Random(2)
    rows = [rng.sample(range(500), B) for _ in range(R)]
    with torch.profiler.profile(profile_memory=True) as prof:
        step(hb, list(range(R)), [500] * R, rows)
    live = peak = 0  # every allocation and release the step made, in order
    for event in sorted(prof.events(), key=lambda e: e.time_range.start):
        live += event.self_cpu_memory_usage
        peak = max(peak, live)
    assert 0 < hb.allocated_bytes() - parts["rows"] - parts["state"] <= parts["staging"]
    assert peak <= parts["step"] + parts["staging"], (peak, parts)


def test_sizes_past_the_memory_limit_are_refused_before_allocating(monkeypatch):
    """buffer_size 2**22 would take gigabytes: the bytes are computed and checked first."""
    pool = torch.zeros(2, 64, 656, dtype=torch.uint8)
    allocated = []
    real_zeros = torch.zeros
    monkeypatch.setattr(torch, "zeros", lambda *a, **k: allocated.append(a) or real_zeros(*a, **k))
    with pytest.raises(HotBufferError, match=r"buffer_size: 4194304 slots x 2 requests need .* GiB.*"
                                             r"the limit is 1\.0 GiB \(max_bytes\)"):
        HotBuffer(pool, buffer_size=2**22, max_bytes=1 << 30)
    assert allocated == []
    monkeypatch.setenv("HISPARSE_MEMORY_LIMIT", "64M")
    with pytest.raises(HotBufferError, match="HISPARSE_MEMORY_LIMIT"):
        HotBuffer(pool, buffer_size=2**22)
    with pytest.raises(HotBufferError, match="HISPARSE_MEMORY_LIMIT"):
        HotBuffer.counting(2, 10**8, 64)  # the position map of 2 x 10**8 positions


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
@pytest.mark.parametrize("device, text", [("cuda", "CUDA is not available"), ("cuda:3", "CUDA is not available"),
                                          ("warp", "is not a device name"), ("meta", "cpu and cuda devices only")])
def test_a_device_that_cannot_hold_the_buffer_is_named(device, text):
    pool = torch.zeros(1, 64, 656, dtype=torch.uint8)
    with pytest.raises(HotBufferError, match=text):
        HotBuffer(pool, buffer_size=64, device=device)
