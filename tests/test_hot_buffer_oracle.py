"""The oracle (tests/oracles/sglang_hisparse.py, a transcription of SGLang's swap-in kernel and
coordinator) reproduces every expected value of SGLang's own kernel tests: 0.5.12's
`jit_kernel/tests/test_hisparse.py` (CUDA-only there; its four tests, the first for both seq_lens
dtypes, here for both kernel generations), and behaves as SGLang's coordinator does around it."""
from __future__ import annotations

import pytest

from tests.oracles.sglang_hisparse import RELEASES, Coordinator, UndefinedBehaviour, run_kernel

HOT_BUFFER_SIZE = 4
HOST_CACHE = [f"host row {i}" for i in range(16)]  # the test's host_cache: row i holds arange values


class Case:
    """The state _make_state builds: per request its device_buffer_locs and _tokens rows, LRU
    slots 0..3, host_cache_locs = arange(16), the device buffer holding each slot's host row."""

    def __init__(self, locs_rows, tokens_rows, newest_tokens):
        self.locs = [list(r) for r in locs_rows]
        self.tokens = [list(r) for r in tokens_rows]
        self.lru = [list(range(HOT_BUFFER_SIZE)) for _ in locs_rows]
        self.host_locs = list(range(16))
        self.device = {}
        for rid, newest in enumerate(newest_tokens):
            for slot, token in enumerate(tokens_rows[rid][:HOT_BUFFER_SIZE]):
                if token >= 0:
                    self.device[self.locs[rid][slot]] = HOST_CACHE[token]
            self.device[self.locs[rid][HOT_BUFFER_SIZE]] = HOST_CACHE[newest]

    def run(self, release, top_k_rows, seq_lens, num_real_reqs=None):
        """_run_kernel: the output pre-filled with -1, padded blocks (bid >= num_real_reqs) skipped."""
        out_rows = []
        for bid, (row, seq_len) in enumerate(zip(top_k_rows, seq_lens)):
            out = [-1] * len(row)
            if num_real_reqs is None or bid < num_real_reqs:
                res = run_kernel(release, row, seq_len, self.tokens[bid], self.locs[bid], self.host_locs,
                                 self.lru[bid], len(row), HOT_BUFFER_SIZE, out)
                for c in res.copies:
                    self.device[c.dst] = HOST_CACHE[c.src]
            out_rows.append(out)
        return out_rows


def long_case():
    # req 0: slots 0..3 hold tokens 1, 4, 2, 5 at locs 9, 7, 3, 5; the newest token 7 at loc 11
    return Case([[9, 7, 3, 5, 11]], [[1, 4, 2, 5, -1]], [7])


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize("seq_lens_dtype", ["int32", "int64"])  # the kernel's two instantiations
def test_fast_path(release, seq_lens_dtype):
    case = Case([[13, 9, 5, 1, 15]], [[10, 11, 12, 13, -1]], [0])
    before = (case.tokens[0][:], case.lru[0][:], dict(case.device))
    out = case.run(release, [[2, 0, 1]], [3])
    assert out == [[5, 13, 9]]
    assert (case.tokens[0], case.lru[0], case.device) == before


@pytest.mark.parametrize("release", RELEASES)
def test_hits_newest_and_updates_lru(release):
    case = long_case()
    assert case.run(release, [[4, 2, 7]], [8]) == [[7, 3, 11]]
    assert case.tokens == [[1, 4, 2, 5, -1]]
    assert case.lru == [[0, 3, 1, 2]]


@pytest.mark.parametrize("release", RELEASES)
def test_miss_uses_updated_lru_slot(release):
    case = long_case()
    case.run(release, [[4, 2]], [8])
    assert case.run(release, [[6]], [8]) == [[9]]
    assert case.tokens == [[6, 4, 2, 5, -1]]
    assert case.lru == [[3, 1, 2, 0]]
    assert case.device[9] == HOST_CACHE[6]


@pytest.mark.parametrize("release", RELEASES)
def test_batched_with_padding(release):
    case = Case([[9, 7, 3, 5, 11], [12, 10, 8, 6, 14], [15, 4, 2, 1, 13]],
                [[1, 4, 2, 5, -1], [0, 1, 2, 3, -1], [9, 8, 7, 6, -1]], [7, 4, 5])
    padded = (case.tokens[2][:], case.lru[2][:])
    out = case.run(release, [[4, 6, 7], [2, 1, 0], [9, 8, 7]], [8, 3, 8], num_real_reqs=2)
    assert out == [[7, 9, 11], [8, 10, 12], [-1, -1, -1]]
    assert case.tokens[:2] == [[6, 4, 2, 5, -1], [0, 1, 2, 3, -1]]
    assert case.lru[:2] == [[2, 3, 0, 1], [0, 1, 2, 3]]
    assert (case.tokens[2], case.lru[2]) == padded
    assert case.device[9] == HOST_CACHE[6]


# -- where the two generations differ ------------------------------------------------------------

def _padded_long(release):
    case = long_case()
    out = [5, 5, 5]  # what the output row held before (0.5.23 leaves padding entries alone)
    res = run_kernel(release, [4, -1, 6], 8, case.tokens[0], case.locs[0], case.host_locs, case.lru[0], 3,
                     HOT_BUFFER_SIZE, out)
    return case, out, res


def test_padding_in_a_long_request_0_5_23_counts_one_miss_and_leaves_its_output():
    case, out, res = _padded_long("0.5.23")
    assert (res.hits, res.misses) == (1, 1) and [(c.src, c.dst) for c in res.copies] == [(6, 9)]
    assert out == [7, 5, 9]  # the -1 entry is not written
    assert case.lru == [[2, 3, 0, 1]]


def test_padding_in_a_long_request_0_5_12_copies_a_row_it_does_not_track():
    """0.5.12 copies K - hits - newest = 2 rows: the miss, and a second one from its scratch past
    the misses (entry 1, the -1 marker: the word before the request's host table) into the next
    evictable slot, whose token entry still names token 2; its LRU write-back moves two slots."""
    case, out, res = _padded_long("0.5.12")
    assert [(c.src, c.dst) for c in res.copies] == [(6, 9), (None, 3)]
    assert case.tokens == [[6, 4, 2, 5, -1]]
    assert case.lru == [[3, 0, 2, 1]]


@pytest.mark.parametrize("release", RELEASES)
def test_a_repeated_missed_position_takes_two_slots(release):
    case = long_case()
    res = run_kernel(release, [6, 6, 4], 8, case.tokens[0], case.locs[0], case.host_locs, case.lru[0], 3,
                     HOT_BUFFER_SIZE, [-1] * 3)
    assert res.misses == 2 and [c.src for c in res.copies] == [6, 6]
    assert case.tokens == [[6, 4, 6, 5, -1]]


def test_more_misses_than_evictable_slots_is_undefined():
    case = long_case()
    case.tokens[0][:4] = [6, 6, 6, 6]  # four slots holding one token (repeats do this)
    with pytest.raises(UndefinedBehaviour):
        run_kernel("0.5.23", [6, 1, 2], 8, case.tokens[0], case.locs[0], case.host_locs, case.lru[0], 3,
                   HOT_BUFFER_SIZE, [-1] * 3)


# -- the coordinator ----------------------------------------------------------------------------

@pytest.mark.parametrize("release", RELEASES)
def test_normal_admission_starts_warm(release):
    """After a prefill of B tokens, the first long step finds them all in the buffer: only the
    newest token's row is written, on the device, and nothing is copied."""
    host = {p: f"kv {p}" for p in range(300)}
    co = Coordinator(1, 300, 128, page_size=64, release=release, host=host)
    co.admit(0, 128)
    out = co.step([0], [129], [list(range(0, 129, 2))])
    assert co.copies == 0 and co.writes == 1
    assert out[0][-1] == 128 and out[0][:-1] == list(range(0, 128, 2))
    assert co.device[128] == "kv 128" and co.device[10] == "kv 10"


@pytest.mark.parametrize("release", RELEASES)
def test_direct_admission_of_a_long_request_starts_cold(release):
    host = {p: f"kv {p}" for p in range(300)}
    co = Coordinator(1, 300, 128, page_size=64, release=release, host=host)
    co.admit(0, 200, direct=True)
    co.step([0], [201], [list(range(0, 64))])
    assert co.copies == 64 and co.results[0].misses == 64 and co.writes == 1


@pytest.mark.parametrize("release", RELEASES)
def test_direct_admission_of_a_short_request_preloads_it(release):
    host = {p: f"kv {p}" for p in range(300)}
    co = Coordinator(1, 300, 128, page_size=64, release=release, host=host)
    co.admit(0, 100, direct=True)
    assert co.copies == 100
    out = co.step([0], [101], [list(range(64))])
    assert co.copies == 100 and out == [list(range(64))] and co.device[100] == "kv 100"
