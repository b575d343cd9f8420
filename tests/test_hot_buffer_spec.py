"""Speculative decoding in the hot buffer (HotBuffer(draft_tokens=N, top_k=K)): step for step the
same outputs, copies, hits and CLOCK state as the independent transcription of SGLang 0.5.23's
`hisparse_spec.cuh` and its coordinator (tests/oracles/sglang_hisparse_spec.py), on generated
streams that go through every path of the commit kernel; and SGLang's refusals."""
from __future__ import annotations

import random
from collections import Counter

import pytest
import torch

from kernels_bridge.hot_buffer import HotBuffer, HotBufferError
from kernels_bridge.layout import hot_buffer_parts
from tests.oracles.sglang_hisparse_spec import SpecCoordinator

P = 64


def drifting(rng, state: dict, r: int, L: int, N: int, K: int, churn: float, far: float):
    """[N][K] top-k rows like an indexer's: each draft keeps most of the request's last picks and
    replaces a `churn` share, taking a `far` share of the new ones anywhere in the context, the
    rest among the last 3,000 positions; distinct positions, a little -1 padding now and then."""
    rows = []
    last = state.get(r, [])
    for i in range(N):
        n = L + i + 1
        keep = [p for p in last if p < n and rng.random() > churn][: K]
        picks = set(keep)
        picks.add(n - 1)
        while len(picks) < min(K, n):
            picks.add(rng.randrange(n) if rng.random() < far else rng.randrange(max(0, n - 3000), n))
        row = list(picks)[:K]
        rng.shuffle(row)
        row += [-1] * (K - len(row))
        if rng.random() < 0.25:
            for j in rng.sample(range(K), 8):
                row[j] = -1
        rows.append(row)
        last = [p for p in row if p >= 0]
    state[r] = last
    return rows


class SpecTwin:
    """A HotBuffer and the oracle run side by side; step() compares everything after each step."""

    def __init__(self, R, S, B, N, K, admission, pool=None):
        self.R, self.S, self.B, self.N, self.K = R, S, B, N, K
        if pool is None:
            self.hb = HotBuffer.counting(R, S, B, page_size=P, admission=admission, draft_tokens=N, top_k=K)
            host = None
        else:
            self.hb = HotBuffer(pool, B, page_size=P, admission=admission, draft_tokens=N, top_k=K)
            host = {r * S + p: ("kv", r, p) for r in range(R) for p in range(S)}
        self.orc = SpecCoordinator(R, S, B, P, N, K, host=host)
        self.direct = admission == "disaggregated"
        self.lens = {}
        self.paths = Counter()

    def step(self, lens: dict, rows: dict):
        """lens: {request: committed length}; rows: {request: [N][K]}."""
        rids = sorted(lens)
        before, copies_before = self.hb.stats, self.orc.copies
        for r in rids:
            if r not in self.lens:
                self.orc.admit(r, lens[r], direct=self.direct)
            elif lens[r] != self.lens[r]:
                self.orc.accept(r, lens[r] - self.lens[r])
            self.lens[r] = lens[r]
        preloaded = list(self.orc.preloaded)
        self.orc.preloaded.clear()
        want = self.orc.verify(rids, [rows[r] for r in rids])
        got = self.hb.translate(torch.tensor(rids), torch.tensor([lens[r] for r in rids]),
                                torch.tensor([rows[r] for r in rids], dtype=torch.int32))
        assert got.tolist() == want
        s = self.hb.stats
        results = self.orc.results
        assert s.lookups - before.lookups == sum(x.lookups for x in results)
        assert s.misses - before.misses == sum(x.misses for x in results)
        assert s.rows_copied - before.rows_copied == self.orc.copies - copies_before
        assert s.rows_written - before.rows_written == self.N * len(rids)
        for r, res in zip(rids, results):
            self._same_state(r)
            self.paths["union, misses" if res.union_clock and res.unique_misses else
                       "union" if res.union_clock else "approximate"] += 1
            self.paths["past the scratch"] += res.direct > 0
            self.paths["global probe"] += res.fallbacks > 0
        return got, preloaded + [c for res in results for c in res.copies]

    def _same_state(self, r):
        q, c = self.orc.reqs[r], self.hb.clock_state(r)
        assert c["tokens"].tolist() == q.tokens
        assert c["rows"].tolist() == q.locs
        assert c["scratch"].tolist() == q.scratch_locs
        assert c["ref"].tolist() == q.ref
        assert c["cursor"] == self.orc.ring.cursor(q.ring_state)
        assert c["epoch"] == (q.ring_state >> self.orc.ring.cursor_bits)
        assert self.hb.slot_positions(r).tolist() == q.tokens[: self.B + 1]

    def run(self, rng, steps, starts, churn, far, finish_at=None):
        picks, lens = {}, dict(starts)
        for t in range(steps):
            self.step(lens, {r: drifting(rng, picks, r, lens[r], self.N, self.K, churn, far) for r in lens})
            lens = {r: L + rng.randint(1, self.N) for r, L in lens.items()}
            if t == finish_at:  # request 0 finishes and comes back as a new one
                self.hb.free(0)
                self.orc.finish(0)
                del self.lens[0]
                picks.pop(0, None)
                lens[0] = starts[0] // 2 + 7


STREAMS = {
    # name: (buffer, drafts, top_k, starts, churn, far, steps) and the commit paths the stream must reach
    "long and short, drifting": ((2048, 2, 1024, {0: 2600, 1: 1500}, 0.2, 0.5, 8), {"union, misses"}),
    "three drafts, odd buffer": ((1088, 3, 1024, {0: 5000, 1: 1100, 2: 900}, 0.05, 0.3, 6),
                                 {"union, misses", "approximate", "global probe"}),
    "two drafts past the scratch": ((1024, 2, 1024, {0: 9000, 1: 4000}, 0.9, 0.9, 4),
                                    {"approximate", "past the scratch", "global probe"}),
    "union past the scratch": ((4096, 4, 1024, {0: 8000, 3: 20000}, 0.6, 0.95, 5),
                               {"union, misses", "past the scratch", "global probe"}),
}


@pytest.mark.parametrize("admission", ["normal", "disaggregated"])
@pytest.mark.parametrize("name", list(STREAMS))
def test_the_hot_buffer_is_sglangs_clock_step_for_step(name, admission):
    (B, N, K, starts, churn, far, steps), paths = STREAMS[name]
    twin = SpecTwin(max(starts) + 1, 24000, B, N, K, admission)
    twin.run(random.Random(7), steps, starts, churn, far, finish_at=steps // 2)
    reached = {p for p, n in twin.paths.items() if n}
    assert paths <= reached, twin.paths


def test_rows_hold_the_positions_asked_for():
    """With rows: every row translate returns holds the KV of the position asked for, after
    rotations between slots and scratch, copies past the scratch and accepted drafts."""
    R, S, B, N, K = 2, 9100, 1024, 2, 1024
    pool = torch.randint(0, 256, (R, S, 656), dtype=torch.uint8, generator=torch.Generator().manual_seed(3))
    twin = SpecTwin(R, S, B, N, K, "normal", pool=pool)
    rng, picks, lens = random.Random(5), {}, {0: 8000, 1: 1020}
    for _ in range(5):
        rows = {r: drifting(rng, picks, r, lens[r], N, K, 0.9, 0.9) for r in lens}
        out, copies = twin.step(lens, rows)
        for i, r in enumerate(sorted(lens)):
            pos = torch.tensor(rows[r])
            served = (pos >= 0) & (out[i] >= 0)
            assert bool(served[pos >= 0].float().mean() > 0.99)
            assert torch.equal(twin.hb.buffer[out[i][served].long()], pool[r][pos[served].long()])
            assert all(twin.orc.device[int(row)] == ("kv", r, int(p))
                       for row, p in zip(out[i][served][:200], pos[served][:200]))
        lens = {r: L + rng.randint(1, N) for r, L in lens.items()}
    assert twin.paths["past the scratch"] and twin.paths["approximate"], twin.paths


def test_a_warm_short_request_copies_nothing_and_hits_everything():
    """Normal admission: while the committed length is within the buffer, every position is in its
    own slot or among the drafts: no miss, no copy; the drafts are device writes."""
    hb = HotBuffer.counting(1, 5000, 2048, draft_tokens=2, top_k=1024)
    rng, picks = random.Random(0), {}
    for L in (1200, 1201, 1203, 1205):
        hb.translate(torch.tensor([0]), torch.tensor([L]), torch.tensor([drifting(rng, picks, 0, L, 2, 1024, .2, .5)]))
    s = hb.stats
    assert (s.misses, s.rows_copied, s.rows_written) == (0, 0, 8) and s.hits == s.lookups > 7000


def test_the_memory_formula_holds_the_scratch_and_the_clock():
    R, S, B, N, K = 3, 3000, 1024, 3, 1024
    hb = HotBuffer(torch.zeros(R, S, 656, dtype=torch.uint8), B, page_size=P, draft_tokens=N, top_k=K)
    parts = hot_buffer_parts(R, S, B, P, 656, N, K)
    assert hb.rows_per_request == B + P + 2048 and hb.buffer.shape[0] == R * hb.rows_per_request
    assert hb.buffer.numel() == parts["rows"]
    held = sum(t.numel() * t.element_size() for t in list(hb._state.tensors().values())
               + list(hb._spec.tensors().values()))
    assert held == parts["state"]
    assert HotBuffer.bytes_needed(R, S, B, P, 656, None, N, K) == sum(parts.values())


@pytest.mark.parametrize("kwargs, text", [
    (dict(draft_tokens=1, top_k=1024), "draft_tokens: got 1; expected 2, 3 or 4"),
    (dict(draft_tokens=5, top_k=1024), "draft_tokens: got 5"),
    (dict(draft_tokens=True, top_k=1024), "draft_tokens: got True"),
    (dict(draft_tokens=2), "top_k: got None; expected an int >= 1024"),
    (dict(draft_tokens=2, top_k=512), "top_k: got 512"),
    (dict(draft_tokens=3, top_k=4096), "12288 occurrences; SGLang's speculative hot buffer takes at most 8192"),
    (dict(draft_tokens=2, top_k=4096), "top_k: 4096 is above buffer_size 2048"),
    (dict(top_k=1024), "top_k: got 1024; it sizes the speculative scratch"),
    (dict(draft_tokens=2, top_k=1024, release="0.5.12"), "release: 0.5.12; speculative decoding is modelled"),
])
def test_sglangs_refusals_of_a_speculative_buffer(kwargs, text):
    with pytest.raises(HotBufferError, match=text):
        HotBuffer.counting(2, 4000, 2048, **kwargs)


def test_more_requests_than_slots_and_drafts_past_the_page_are_refused():
    with pytest.raises(HotBufferError, match="num_requests: 1025 is above buffer_size 1024"):
        HotBuffer.counting(1025, 10, 1024, draft_tokens=2, top_k=1024)
    with pytest.raises(HotBufferError, match="3 verify slots do not fit the extra page's 1"):
        HotBuffer.counting(1, 10, 1024, page_size=2, draft_tokens=3, top_k=1024)


def test_bad_speculative_steps_are_refused_before_any_change():
    hb = HotBuffer.counting(2, 3000, 1024, draft_tokens=2, top_k=1024)
    ok = torch.full((1, 2, 1024), -1)
    ok[0, :, 0] = 5
    hb.translate(torch.tensor([0]), torch.tensor([1500]), ok)
    state, stats = hb.clock_state(0), hb.stats
    bad = [
        (torch.tensor([1500]), torch.full((1, 1024), -1), r"positions: .*\[1, 2, 1024\]"),
        (torch.tensor([1500]), torch.full((1, 3, 1024), -1), r"expected an integer tensor \[n, draft_tokens"),
        (torch.tensor([1500]), ok.float(), "expected an integer tensor"),
        (torch.tensor([1500]), ok, "is 1500 after 1500; a speculative step commits 1..2 drafts"),
        (torch.tensor([1503]), ok, "is 1503 after 1500"),
        (torch.tensor([1400]), ok, "below its previous 1500"),
        (torch.tensor([2999]), ok, r"its 2 drafts need seq_len \+ 2 <= max_seq_len 3000"),
    ]
    for lens, pos, text in bad:
        with pytest.raises(HotBufferError, match=text):
            hb.translate(torch.tensor([0]), lens, pos)
    far = ok.clone()
    far[0, 0, 1] = 1502  # draft 0 sees seq_len 1502: positions up to 1501
    with pytest.raises(HotBufferError, match=r"positions: \[0, 0, 1\] \(request 0\) is 1502; expected -1 or "
                                             r"0 <= position < 1502 \(draft 0"):
        hb.translate(torch.tensor([0]), torch.tensor([1501]), far)
    after = hb.clock_state(0)
    assert all(torch.equal(after[k], state[k]) if isinstance(state[k], torch.Tensor) else after[k] == state[k]
               for k in state)
    assert hb.stats == stats
    with pytest.raises(HotBufferError, match="keeps a CLOCK, not an LRU order"):
        hb.lru_order(0)
    with pytest.raises(HotBufferError, match="has no draft tokens"):
        HotBuffer.counting(1, 10, 64).clock_state(0)


@pytest.mark.parametrize("also_asked, victim", [([], 0), ([0], 170), ([0, 170, 341], 512)])
def test_one_miss_takes_the_oldest_sampled_slot_by_a_rotation(also_asked, victim):
    """Read off hisparse_spec.cuh: one miss (position 1200 of a warm request of 1500, buffer 1024)
    claims scratch row 0 and is copied there; the union CLOCK samples slots cursor + j * 1024 // 6
    (0, 170, 341, 512, ...), skips those referenced this step, and takes the first of the oldest;
    the victim slot and scratch row 0 swap rows; the cursor moves by one miss."""
    B, W = 1024, 1024 + P
    rows = [[1200] + also_asked + [-1] * (1023 - len(also_asked))] * 2
    for run in ("oracle", "hot buffer"):
        if run == "oracle":
            orc = SpecCoordinator(1, 3000, B, P, 2, 1024)
            orc.admit(0, 1500)
            out = orc.verify([0], [rows])[0]
            copies = orc.results[0].copies
            q = orc.reqs[0]
            tokens, locs, scratch0, cursor = q.tokens, q.locs, q.scratch_locs[0], orc.ring.cursor(q.ring_state)
        else:
            hb = HotBuffer.counting(1, 3000, B, page_size=P, draft_tokens=2, top_k=1024)
            out = hb.translate(torch.tensor([0]), torch.tensor([1500]), torch.tensor([rows]))[0].tolist()
            c = hb.clock_state(0)
            tokens, locs, scratch0, cursor = c["tokens"].tolist(), c["rows"].tolist(), int(c["scratch"][0]), c["cursor"]
            copies = [(1200, W)] if hb.stats.rows_copied == 1 else None
        assert copies == [(1200, W)]  # host row 1200 into scratch row 0
        assert out[0][0] == out[1][0] == W
        assert [out[0][1 + i] for i in range(len(also_asked))] == also_asked  # hits in their own rows
        assert tokens[victim] == 1200 and locs[victim] == W and scratch0 == victim
        assert cursor == 1
