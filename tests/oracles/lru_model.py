"""A plain-Python, per-token model of HotBuffer's translation: the tests' oracle and the
benchmark's baseline.

Same constructor and ``translate`` as ``kernels_bridge.hot_buffer.HotBuffer`` and the same
semantics (SGLang's HiSparse swap-in), written the obvious way: per request a list ``slot_pos``
(slot -> position), a dict ``pos_slot`` (position -> slot) and a list ``lru`` (slots, least- to
most-recently used), one Python step per token and one row copy per copied token. Inputs may be
Python lists or tensors; the result is an int32 tensor like HotBuffer's.

* short request (seq_len <= buffer_size): slot = position, the whole prefix made resident;
* long request: the newest token in the reserved slot ``buffer_size``; hits keep their slots;
  misses, in order of first appearance, take the least-recently-used slots not hit; the new LRU
  order is [untouched slots] + [slots just filled, in miss order] + [hit slots, in old order].
"""
from __future__ import annotations

import torch


def _as_list(x):
    return x.tolist() if isinstance(x, torch.Tensor) else list(x)


class LRUModel:
    """Per-token LRU model. host_pool: ``[R, S, *row]`` tensor; buffer: ``[R * (B + P), *row]``."""

    def __init__(self, host_pool, buffer_size, device=None, page_size=64):
        if buffer_size < 1 or page_size < 1 or buffer_size % page_size:
            raise ValueError("buffer_size must be a positive multiple of page_size")
        self.host_pool = host_pool
        self.num_requests = host_pool.shape[0]
        self.max_seq_len = host_pool.shape[1]
        self.buffer_size = buffer_size
        self.page_size = page_size
        self.stride = buffer_size + page_size
        self.row_bytes = host_pool[0, 0].numel() * host_pool.element_size()
        self.buffer = torch.zeros(
            (self.num_requests * self.stride, *host_pool.shape[2:]),
            dtype=host_pool.dtype,
            device=device if device is not None else host_pool.device,
        )
        self.slot_pos = [[-1] * buffer_size for _ in range(self.num_requests)]
        self.pos_slot = [{} for _ in range(self.num_requests)]
        self.lru = [list(range(buffer_size)) for _ in range(self.num_requests)]
        self.newest = [-1] * self.num_requests
        self.reset_stats()

    def reset_stats(self):
        self.stats = {"steps": 0, "hits": 0, "misses": 0, "rows_copied": 0, "bytes_copied": 0}

    def free(self, req_id):
        self.slot_pos[req_id] = [-1] * self.buffer_size
        self.pos_slot[req_id] = {}
        self.lru[req_id] = list(range(self.buffer_size))
        self.newest[req_id] = -1

    def truncate(self, req_id, seq_len):
        self._forget_beyond(req_id, seq_len)

    def _forget_beyond(self, r, L):
        for slot, p in enumerate(self.slot_pos[r]):
            if p >= L:
                del self.pos_slot[r][p]
                self.slot_pos[r][slot] = -1
        if self.newest[r] >= L:
            self.newest[r] = -1

    def _copy(self, r, slot, p):
        self.buffer[r * self.stride + slot].copy_(self.host_pool[r, p])
        self.stats["rows_copied"] += 1
        self.stats["bytes_copied"] += self.row_bytes

    def _place(self, r, slot, p):
        """Put position p of request r into LRU slot `slot`, evicting its occupant."""
        old = self.slot_pos[r][slot]
        if old >= 0:
            del self.pos_slot[r][old]
        home = self.pos_slot[r].get(p)
        if home is not None:
            self.slot_pos[r][home] = -1
        self.slot_pos[r][slot] = p
        self.pos_slot[r][p] = slot
        self._copy(r, slot, p)

    def translate(self, req_ids, seq_lens, positions):
        """Returns int32 [n, top_k] flat buffer rows, -1 for padding."""
        if isinstance(positions, torch.Tensor):
            top_k = positions.shape[1]
        else:
            top_k = len(positions[0]) if len(positions) else 0
        req_ids, seq_lens = _as_list(req_ids), _as_list(seq_lens)
        positions = [_as_list(row) for row in positions]
        # validate everything before touching any state
        if len(set(req_ids)) != len(req_ids) or not (len(req_ids) == len(seq_lens) == len(positions)):
            raise ValueError("bad req_ids / lengths")
        if top_k > self.buffer_size:
            raise ValueError("top_k > buffer_size")
        for r, L, row in zip(req_ids, seq_lens, positions):
            if not 0 <= r < self.num_requests or not 1 <= L <= self.max_seq_len:
                raise ValueError("bad req_id or seq_len")
            if len(row) != top_k or any(p < -1 or p >= L for p in row):
                raise ValueError("bad positions")

        self.stats["steps"] += 1
        out = []
        for r, L, row in zip(req_ids, seq_lens, positions):
            self._forget_beyond(r, L)  # a rollback: positions >= L are gone
            base = r * self.stride
            if L <= self.buffer_size:
                out.append(self._short(r, L, row, base))
            else:
                out.append(self._long(r, L, row, base))
        return torch.tensor(out, dtype=torch.int32).view(len(req_ids), top_k)

    def _short(self, r, L, row, base):
        for p in set(p for p in row if p >= 0):
            if self.slot_pos[r][p] == p:
                self.stats["hits"] += 1
            else:
                self.stats["misses"] += 1
        for p in range(L):
            if self.slot_pos[r][p] != p:
                self._place(r, p, p)
        return [base + p if p >= 0 else -1 for p in row]

    def _long(self, r, L, row, base):
        newest = L - 1
        seen = set()
        hit_slots = set()
        misses = []
        for p in row:
            if p < 0 or p == newest or p in seen:
                continue
            seen.add(p)
            if p in self.pos_slot[r]:
                hit_slots.add(self.pos_slot[r][p])
                self.stats["hits"] += 1
            else:
                misses.append(p)
                self.stats["misses"] += 1
        evictable = [s for s in self.lru[r] if s not in hit_slots]
        hits_in_order = [s for s in self.lru[r] if s in hit_slots]
        for slot, p in zip(evictable, misses):
            self._place(r, slot, p)
        m = len(misses)
        self.lru[r] = evictable[m:] + evictable[:m] + hits_in_order

        if newest in row:
            self.stats["hits" if self.newest[r] == newest else "misses"] += 1
        if self.newest[r] != newest:
            self.newest[r] = newest
            self._copy(r, self.buffer_size, newest)

        result = []
        for p in row:
            if p < 0:
                result.append(-1)
            elif p == newest:
                result.append(base + self.buffer_size)
            else:
                result.append(base + self.pos_slot[r][p])
        return result

    def slot_positions(self, req_id):
        """[buffer_size + 1]: position per LRU slot, then the reserved slot's; -1 if empty."""
        return self.slot_pos[req_id] + [self.newest[req_id]]

    def lru_order(self, req_id):
        return list(self.lru[req_id])
