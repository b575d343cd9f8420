"""An independent transcription of SGLang's HiSparse swap-in: the CUDA kernel
`load_cache_to_device_buffer_kernel` and the coordinator code around it, written from SGLang's
source (not from kernels_bridge.HotBuffer), plain Python on lists and dicts.

Sources (the wheels of the releases named):
- the kernel: 0.5.12 `jit_kernel/csrc/hisparse.cuh`; 0.5.23 `kernels/jit/csrc/kvcacheio/hisparse.cuh`.
  Two generations of its long path matter here: up to 0.5.20 the number of misses it copies and
  re-ranks is `NUM_TOP_K - s_total_hits - s_newest_hit` ("0.5.12"); from 0.5.21 it is the count of
  entries its miss pass found ("0.5.23"). From 0.5.17 the kernel writes -1 for every output entry
  of a short request it does not map; before, the coordinator filled the output with -1 first:
  the same outputs.
- the coordinator (`srt/managers/hisparse_coordinator.py`, 0.5.23): `alloc_device_buffer` (normal
  admission after a prefill: slots 0..B-1 hold tokens 0..B-1, their KV written there by the
  prefill), `admit_request_direct` (disaggregated decode: a long request starts with every slot
  empty, a short one is preloaded from the host), `map_last_loc_to_buffer` /
  `_grow_device_buffers` (the newest token's KV is written by the forward pass at position
  min(seq_len - 1, B) of the request's buffer), `request_finished`.

The kernel is executed thread by thread, phase by phase, in thread-index order. Where CUDA leaves
an outcome to the race between threads, this transcription takes that order: a position asked
twice keeps, in the hash, the last entry that asked for it; a position held by two slots gets,
as its output, the slot visited last in LRU order. Where the kernel would index outside a
request's rows (more misses than evictable slots, which only repeated positions can cause),
`UndefinedBehaviour` is raised instead.

Memory model: request r's device rows are r * W + s for its slots s (W = B + page), its host rows
r * S + p for positions p, as kernels_bridge lays them out; KV rows are opaque objects copied by
reference (`device[loc] = host[src]`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional

WARP = 32
TOKEN_HIT = -1  # 0xFFFFFFFF as int32: the marker of a resolved entry
HASH_EMPTY = -1
RELEASES = ("0.5.12", "0.5.23")


class UndefinedBehaviour(Exception):
    """The kernel would read or write outside the request's rows here."""


def _knuth(key: int, size: int) -> int:
    return ((key & 0xFFFFFFFF) * 2654435761 & 0xFFFFFFFF) % size


@dataclass
class Copy:
    """One row the kernel moves host -> device: host row `src` (None where the kernel reads
    before the request's host table: an undefined row) into device row `dst`."""
    src: Optional[int]
    dst: int


@dataclass
class KernelResult:
    out: List[int]                 # the output entries the kernel wrote (None: not written)
    copies: List[Copy]
    hits: int = 0                  # hit slots (s_total_hits)
    misses: int = 0                # entries its miss pass found
    newest_hit: int = 0


def run_kernel(release: str, top_k_tokens: List[int], seq_len: int, buffer_tokens: List[int],
               buffer_locs: List[int], host_locs: List[int], lru: List[int], num_top_k: int,
               hot_buffer_size: int, out: List[Optional[int]]) -> KernelResult:
    """One CUDA block of load_cache_to_device_buffer_kernel (one request), thread by thread.

    buffer_tokens, buffer_locs: the request's rows of device_buffer_tokens / device_buffer_locs
    ([B + page]); host_locs: its row of host_cache_locs (host_locs[-1] reads the word before it,
    which the caller supplies as `host_locs_before`); lru: its lru_slots row [B]; out: its row
    of top_k_device_locs, written in place. buffer_tokens and lru are updated in place."""
    B, K = hot_buffer_size, num_top_k
    res = KernelResult(out=out, copies=[])
    if seq_len <= B:  # fast path: every position in its own slot, in order
        count = seq_len if seq_len < K else K
        for i in range(K):
            token = top_k_tokens[i]
            if i < count and token >= 0:
                out[i] = buffer_locs[token]
            elif release != "0.5.12":  # 0.5.17+: -1 written; before, the coordinator's fill
                out[i] = -1
        return res
    keys, vals, s_top = _insert_top_k(top_k_tokens, seq_len, buffer_locs, K, B, out, res)
    lru_out, hit_count = _hit_pass(keys, vals, s_top, buffer_tokens, buffer_locs, lru, B, out)
    res.hits = hit_count
    res.misses = _miss_pass(s_top, buffer_tokens, buffer_locs, lru_out, hit_count, K, B, out)
    total_misses = K - hit_count - res.newest_hit if release == "0.5.12" else res.misses
    _write_back_lru(lru, lru_out, total_misses, B - hit_count, B)
    for m in range(total_misses):  # each warp copies one miss; the scratch may be stale past `misses`
        token = s_top[m]
        evict_slot = lru_out[B - 1 - m]
        src = host_locs[token] if token >= 0 else None  # host_locs[-1]: the word before the row
        res.copies.append(Copy(src, buffer_locs[evict_slot]))
    return res


def _insert_top_k(top_k_tokens, seq_len, buffer_locs, K, B, out, res):
    """The newest token to its reserved slot; every other entry into the shared-memory hash
    (thread order: a repeated key keeps the last index). Returns (keys, vals, s_top)."""
    hash_size = 2 * K
    keys, vals = [HASH_EMPTY] * hash_size, [0] * hash_size
    s_top = [0] * K
    newest_slot, newest_token = B, seq_len - 1
    for i in range(K):
        token = top_k_tokens[i]
        if token == newest_token:
            s_top[i] = TOKEN_HIT
            out[i] = buffer_locs[newest_slot]
            res.newest_hit = 1
            continue
        h = _knuth(token, hash_size)
        while True:
            old = keys[h]
            if old == HASH_EMPTY:
                keys[h] = token  # atomicCAS(EMPTY -> token); -1 leaves the slot empty
                vals[h] = i
                break
            if old == token:
                vals[h] = i
                break
            h = (h + 1) % hash_size
        s_top[i] = token
    return keys, vals, s_top


def _probe(keys, vals, token) -> int:
    """The top-k index the hash holds for token, -1 if none."""
    h = _knuth(token, len(keys))
    while True:
        k = keys[h]
        if k == token:
            return vals[h]
        if k == HASH_EMPTY:
            return -1
        h = (h + 1) % len(keys)


def _hit_pass(keys, vals, s_top, buffer_tokens, buffer_locs, lru, B, out):
    """Over the LRU order: hits grow forward in lru_out, evictables backward. Returns (lru_out,
    hit count)."""
    lru_out = [0] * B
    hit_count = evict_count = 0
    hit_writes = []
    for j in range(B):
        slot = lru[j]
        token = buffer_tokens[slot] if slot >= 0 else -1
        found = _probe(keys, vals, token) if token >= 0 else -1
        if found >= 0:
            hit_writes.append((found, slot))
            lru_out[hit_count] = slot
            hit_count += 1
        else:
            lru_out[B - 1 - evict_count] = slot
            evict_count += 1
    for found, slot in hit_writes:  # the last slot in LRU order writes last
        s_top[found] = TOKEN_HIT
        out[found] = buffer_locs[slot]
    return lru_out, hit_count


def _miss_pass(s_top, buffer_tokens, buffer_locs, lru_out, hit_count, K, B, out) -> int:
    """The misses in index order take the evictables in LRU order; returns the misses."""
    misses = 0
    for i in range(K):
        if s_top[i] == TOKEN_HIT:
            continue
        token = s_top[i]
        if misses >= B - hit_count:
            raise UndefinedBehaviour(f"miss {misses} has no evictable slot ({B - hit_count} evictable)")
        evict_slot = lru_out[B - 1 - misses]
        s_top[misses] = token  # compacted: misses' offsets never pass their own index
        out[i] = buffer_locs[evict_slot]
        buffer_tokens[evict_slot] = token
        misses += 1
    return misses


def _write_back_lru(lru, lru_out, total_misses, total_evictable, B) -> None:
    """The new LRU order: evictables not filled, the filled ones, then the hits."""
    if total_misses > total_evictable or total_misses < 0:
        raise UndefinedBehaviour(f"{total_misses} misses against {total_evictable} evictable slots: the "
                                 f"LRU write-back leaves the request's row")
    new_lru = list(lru)
    for i in range(B):
        if i < total_misses:
            new_lru[total_evictable - total_misses + i] = lru_out[B - 1 - i]
        elif i < total_evictable:
            new_lru[i - total_misses] = lru_out[B - 1 - i]
        else:
            new_lru[i] = lru_out[i - total_evictable]
    lru[:] = new_lru


@dataclass
class Request:
    """The coordinator's rows for one request (one layer)."""
    tokens: List[int]              # req_device_buffer_tokens[layer, r] [B + page]
    locs: List[int]                # req_device_buffer_token_locs[layer, r] [B + page]
    lru: List[int]                 # lru_slots[layer, r] [B]
    to_device: List[int]           # req_to_device_buffer[r] [B + page]: 0 until allocated
    seq_len: int = 0               # the last decode's seq_len (the prefill's length at admission)


class Coordinator:
    """SGLang's coordinator and kernel for one layer: requests 0..R-1 (req_pool_idx), buffer B,
    page P. host: {host row: KV}, each request's full KV at r * S + p; device: {device row: KV}."""

    def __init__(self, num_requests: int, max_seq_len: int, buffer_size: int, page_size: int = 64,
                 release: str = "0.5.23", host: Optional[Dict[int, object]] = None):
        assert release in RELEASES
        self.R, self.S, self.B, self.P = num_requests, max_seq_len, buffer_size, page_size
        self.W = buffer_size + page_size
        self.release = release
        self.host = host if host is not None else {}
        self.device: Dict[int, object] = {}
        self.reqs = [self._empty() for _ in range(num_requests)]
        self.out_rows: Dict[int, List[int]] = {}  # top_k_device_locs_buffer, by batch position
        self.copies = 0          # host -> device rows
        self.writes = 0          # rows the decode steps write on the device (their new token)
        self.misses = 0          # entries the kernel's miss passes found
        self.results: List[KernelResult] = []  # the last step's, per request

    def _empty(self) -> Request:
        return Request(tokens=[-1] * self.W, locs=[-1] * self.W, lru=list(range(self.B)), to_device=[0] * self.W)

    def _capacity(self, length: int) -> int:
        """alloc_device_buffer / _grow_device_buffers: whole pages up to B, then B + page."""
        cap = min(-(-length // self.P) * self.P, self.B)
        return self.W if cap == self.B else cap

    def _allocate(self, r: int, req: Request, cap: int) -> None:
        for s in range(cap):
            if req.to_device[s] == 0:
                req.to_device[s] = req.locs[s] = r * self.W + s

    # -- admission ------------------------------------------------------------------------------
    def admit(self, r: int, prefill_len: int, direct: bool = False) -> None:
        """A request whose prefill of `prefill_len` tokens is done: alloc_device_buffer (normal),
        or admit_request_direct (disaggregated decode: the KV arrived in host memory)."""
        req = self.reqs[r]
        B = self.B
        cap = self._capacity(prefill_len)
        self._allocate(r, req, cap)  # the prefill's own device rows: slot s holds token s
        req.tokens[:B] = list(range(B))
        if not direct:  # the prefill wrote its tokens' KV there
            for p in range(min(prefill_len, cap)):
                self.device[req.to_device[p]] = self.host.get(r * self.S + p)
        elif prefill_len <= B:  # _preload_to_device_buffer: every token from the host
            for p in range(prefill_len):
                self.device[req.to_device[p]] = self.host.get(r * self.S + p)
                self.copies += 1
        else:  # every slot empty: every lookup misses
            req.tokens[:B] = [-1] * B
        req.seq_len = prefill_len

    def finish(self, r: int) -> None:
        """request_finished: the tables reset."""
        self.reqs[r] = self._empty()

    # -- one decode step ------------------------------------------------------------------------
    def step(self, req_ids: List[int], seq_lens: List[int], top_k: List[List[int]]) -> List[List[Optional[int]]]:
        """map_last_loc_to_buffer (each new token's KV written on the device), then the kernel for
        every request of the batch; returns the output rows."""
        outs = []
        self.results = []
        for bid, (r, seq_len, row) in enumerate(zip(req_ids, seq_lens, top_k)):
            req = self.reqs[r]
            self._new_tokens(r, req, seq_len)
            kept = self.out_rows.get(bid)
            if self.release == "0.5.12" or kept is None or len(kept) != len(row):
                kept = [-1] * len(row)  # 0.5.12's coordinator fills -1 before each call
            out = list(kept)
            host_locs = [r * self.S + p for p in range(self.S)]
            res = run_kernel(self.release, row, seq_len, req.tokens, req.locs, host_locs, req.lru,
                             len(row), self.B, out)
            for c in res.copies:
                self.device[c.dst] = self.host.get(c.src) if c.src is not None else ("undefined",)
            self.copies += len(res.copies)
            self.misses += res.misses
            self.out_rows[bid] = out
            self.results.append(res)
            outs.append(list(out))
        return outs

    def _new_tokens(self, r: int, req: Request, seq_len: int) -> None:
        """Each decode step writes its token's KV at position min(seq_len - 1, B) of the buffer,
        growing it page by page while short; a call several tokens ahead stands for the steps in
        between, in order."""
        for length in range(req.seq_len + 1, seq_len + 1):
            if length <= self.B:
                self._allocate(r, req, self._capacity(length))
            reserved = min(length - 1, self.B)
            req.locs[self.B] = req.to_device[reserved]
            self.device[req.to_device[reserved]] = self.host.get(r * self.S + length - 1)
            self.writes += 1
        req.seq_len = max(req.seq_len, seq_len)
