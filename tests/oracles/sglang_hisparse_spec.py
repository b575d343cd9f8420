"""An independent transcription of SGLang 0.5.23's speculative HiSparse swap-in: the two CUDA
kernels of `kernels/jit/csrc/kvcacheio/hisparse_spec.cuh`
(`load_cache_to_device_buffer_spec_gather_kernel`, `load_cache_to_device_buffer_spec_commit_kernel`;
the file is the same from 0.5.19 to 0.5.23, and the coordinator calls it from 0.5.22, whose
`HiSparseSpecSwapManager` is 0.5.23's) and the coordinator code around them
(`srt/managers/hisparse_coordinator.py`: `HiSparseSpecSwapManager.reset`, `invalidate_cache`,
`prepare_verify`, `commit_accept_tokens`, `swap_in`; `alloc_device_buffer`,
`admit_request_direct`, `request_finished`), written from SGLang's source, not from
kernels_bridge. Plain Python on lists, one request (one CUDA block) at a time.

What SGLang does with speculative decoding (MTP / EAGLE, `num_draft_tokens` N in 2..4, top_k
K >= 1024, N * K <= 8192): every decode step is a target verify of N draft tokens. Before it,
`prepare_verify` binds the drafts (positions L .. L+N-1, L the committed length) to the extra
page's slots B+1 .. B+N. The indexer gives one top-k per draft, [N, K]; draft i's sequence length
is L + i + 1 (`dsa_seqlens_expanded`). The gather kernel resolves every occurrence (the extra
page, then the hot cache: slot `token` when it holds it, else the cuckoo ring hash); each
distinct miss claims a scratch row (`scratch_locs`, a per-request pool of device rows) and is
copied host -> scratch. The commit kernel then admits the misses into the hot buffer with a CLOCK
policy (per-slot reference epochs, a cursor): a victim slot's row and the scratch row swap places
(a rotation, no copy). Misses past the scratch capacity are copied straight into their victim's
row. After the step, `commit_accept_tokens` moves the accepted drafts on the device: positions
below B into their own slot, the last accepted one into slot B.

Where CUDA leaves an outcome to the race between threads (the order in which warps claim a
miss's scratch index, atomics on the CLOCK bits and the ring hash), this transcription runs the
threads one after another in index order: occurrence order in the gather, thread order in each
pass of the commit.

Memory model as in sglang_hisparse.py: request r's host rows are r * S + p; its device rows are
r * RW + s for slots s < B + page, and r * RW + B + page + j for its scratch row j (RW the rows
one request owns). KV rows are opaque objects moved by reference.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional

U32 = 0xFFFFFFFF
KNUTH = 2654435761
HASH_EMPTY_I64 = -1
HASH_DELETED = -2
COMPACT_HASH_MASK = (1 << 13) - 1
COMPACT_APPROX_CLAIM_FLAG = 1 << 29
COMPACT_APPROX_ADMIT_FLAG = 1 << 30
APPROX_ADMISSION_STEPS = 1
CLOCK_VICTIM_SAMPLES = 6
HASH_DEGRADED_FLAG = 1 << 31
SCRATCH_EPOCH_MASK = HASH_DEGRADED_FLAG - 1
COMMIT_BLOCK = 512            # the commit kernel's threads
MIN_SCRATCH_CAPACITY = 1024   # HiSparseSpecSwapManager
MAX_OCCURRENCES = 8192
UNSET = None                  # a scratch-table word never written (metadata rows start at -1)


def scratch_capacity(num_draft_tokens: int, top_k: int, buffer_size: int) -> int:
    """HiSparseSpecSwapManager.__init__'s scratch_capacity."""
    workspace = num_draft_tokens * top_k
    return min(workspace, max(MIN_SCRATCH_CAPACITY, workspace - buffer_size))


def ring_hash_size(buffer_size: int) -> int:
    return 1 << max(1, (2 * buffer_size - 1).bit_length())


def _ceil_log2(value: int) -> int:
    bits, cap = 0, 1
    while cap < value:
        cap <<= 1
        bits += 1
    return bits


class Ring:
    """PackedRingState<B>: epoch and CLOCK cursor in one int32."""

    def __init__(self, B: int):
        self.B = B
        self.cursor_bits = _ceil_log2(B)
        self.epoch_bits = min(32 - self.cursor_bits, 23)
        self.cursor_mask = (1 << self.cursor_bits) - 1
        self.epoch_mask = (1 << self.epoch_bits) - 1

    def next_epoch(self, packed: int) -> int:
        epoch = (((packed & U32) >> self.cursor_bits) + 1) & self.epoch_mask
        return 1 if epoch == 0 else epoch

    def cursor(self, packed: int) -> int:
        return ((packed & U32) & self.cursor_mask) % self.B

    def pack(self, epoch: int, cursor: int) -> int:
        return ((epoch << self.cursor_bits) | (cursor & self.cursor_mask)) & U32


def _hash_slot(key: int, size: int) -> int:
    h = ((key & U32) * KNUTH) & U32
    return h & (size - 1) if size & (size - 1) == 0 else h % size


def _next_hash_slot(slot: int, size: int) -> int:
    nxt = (slot + 1) & U32
    return nxt & (size - 1) if size & (size - 1) == 0 else nxt % size


def _ring_slot(key: int, size: int) -> int:
    return (((key & U32) * KNUTH) & U32) & (size - 1)


def _ring_slot_secondary(key: int, size: int) -> int:
    h = key & U32
    h ^= h >> 16
    h = (h * 0x7FEB352D) & U32
    h ^= h >> 15
    h = (h * 0x846CA68B) & U32
    h ^= h >> 16
    return h & (size - 1)


def _pack(token: int, slot: int) -> int:
    return (slot << 32) | (token & U32)


def _tok(packed: int) -> int:
    t = packed & U32
    return t - (1 << 32) if t & 0x80000000 else t


def _slot(packed: int) -> int:
    return (packed >> 32) & U32


@dataclass
class SpecRequest:
    """One request's rows of every table the kernels read (one layer)."""
    tokens: List[int]        # req_device_buffer_tokens [B + page]
    locs: List[int]          # req_device_buffer_token_locs [B + page]
    to_device: List[int]     # req_to_device_buffer [B + page]
    keys: List[int]          # cache_index[r, 0] (ring hash, primary)
    vals: List[int]          # cache_index[r, 1] (secondary)
    ring_state: int          # cache_policy[0, r]
    ref: List[int]           # cache_policy[r + 1] [B]
    scratch_locs: List[int]  # req_to_scratch[r] [C]
    table: List[Optional[tuple]]    # scratch metadata: (epoch, token) per hash position [T]
    indices: List[Optional[tuple]]  # (epoch, value) per hash position [T]
    compact: List[int]              # compact hash positions (and flags) by unique index [T]
    miss_count: int = 0      # counters[0] (the last call's misses)
    work_count: int = 0      # counters[1]
    union_hit_count: int = 0  # counters[2]
    generation: int = 0      # counters[3]: scratch epoch | degraded flag
    seq_len: int = 0         # committed length


@dataclass
class SpecResult:
    """One request's call: out [N][K] device rows (-1 unresolved), copies (host row, device row)
    in the order the kernels make them, and the counts."""
    out: List[List[int]]
    copies: List[tuple] = field(default_factory=list)
    lookups: int = 0         # valid occurrences (0 <= token < that draft's seq_len)
    misses: int = 0          # occurrences neither in the extra page nor in the hot cache
    unique_misses: int = 0   # the gather's work_count
    union_hits: int = 0      # distinct hot slots hit
    union_clock: bool = True
    fallbacks: int = 0       # victims the global probe found
    direct: int = 0          # misses past the scratch


class SpecCoordinator:
    """SGLang's speculative HiSparse for one layer: requests 0..R-1, buffer B, page P, N drafts,
    top-k K. host: {host row: KV}; device: {device row: KV}."""

    def __init__(self, num_requests: int, max_seq_len: int, buffer_size: int, page_size: int,
                 num_draft_tokens: int, top_k: int, host: Optional[Dict[int, object]] = None):
        if not 2 <= num_draft_tokens <= 4 or top_k < 1024:
            raise ValueError("HiSparse spec swap requires 2-4 draft tokens and top_k >= 1024.")
        if num_draft_tokens * top_k > MAX_OCCURRENCES:
            raise ValueError("HiSparse spec swap supports at most 8192 occurrences.")
        if num_requests > buffer_size:
            raise ValueError("HiSparse spec request capacity must not exceed device_buffer_size.")
        if num_draft_tokens > page_size - 1:
            raise ValueError("HiSparse spec needs its verify slots in the extra page.")
        self.R, self.S, self.B, self.P = num_requests, max_seq_len, buffer_size, page_size
        self.N, self.K = num_draft_tokens, top_k
        self.T = num_draft_tokens * top_k
        self.W = buffer_size + page_size
        self.C = scratch_capacity(num_draft_tokens, top_k, buffer_size)
        self.RW = self.W + -(-self.C // page_size) * page_size
        self.H = ring_hash_size(buffer_size)
        self.ring = Ring(buffer_size)
        self.host = host if host is not None else {}
        self.device: Dict[int, object] = {}
        self.reqs = [self._empty(r) for r in range(num_requests)]
        self.copies = 0
        self.writes = 0
        self.results: List[SpecResult] = []
        self.preloaded: List[tuple] = []  # admission preloads (host row, device row), in order

    def _empty(self, r: int) -> SpecRequest:
        return SpecRequest(tokens=[-1] * self.W, locs=[-1] * self.W, to_device=[0] * self.W,
                           keys=[-1] * self.H, vals=[-1] * self.H, ring_state=0, ref=[0] * self.B,
                           scratch_locs=[0] * self.C, table=[UNSET] * self.T, indices=[UNSET] * self.T,
                           compact=[-1] * self.T)

    # -- the coordinator ------------------------------------------------------------------------
    def admit(self, r: int, prefill_len: int, direct: bool = False) -> None:
        """alloc_device_buffer (spec enabled: the whole padded buffer), allocate_scratch, reset;
        then for a disaggregated decode admission, admit_request_direct's preload or cold start."""
        req = self.reqs[r]
        B = self.B
        for s in range(self.W):
            req.to_device[s] = req.locs[s] = r * self.RW + s
        req.tokens[:B] = list(range(B))
        req.scratch_locs = [r * self.RW + self.W + j for j in range(self.C)]
        # reset(): the ring hash holds tokens 0..B-1 in slots 0..B-1; CLOCK, counters, metadata cleared
        req.keys, req.vals = [-1] * self.H, [-1] * self.H
        for t in range(B):
            req.keys[_ring_slot(t, self.H)] = _pack(t, t)
        req.ring_state, req.ref = 0, [0] * B
        req.miss_count = req.work_count = req.union_hit_count = req.generation = 0
        req.table, req.indices, req.compact = [UNSET] * self.T, [UNSET] * self.T, [-1] * self.T
        if not direct:  # the prefill wrote its tokens' KV in its own rows
            for p in range(min(prefill_len, B)):
                self.device[req.to_device[p]] = self.host.get(r * self.S + p)
        elif prefill_len <= B:  # _preload_to_device_buffer
            for p in range(prefill_len):
                self.device[req.to_device[p]] = self.host.get(r * self.S + p)
                self.copies += 1
                self.preloaded.append((r * self.S + p, req.to_device[p]))
        else:  # every slot empty, the hash invalidated
            req.tokens[:B] = [-1] * B
            req.keys, req.vals = [-1] * self.H, [-1] * self.H
        req.seq_len = prefill_len

    def finish(self, r: int) -> None:
        self.reqs[r] = self._empty(r)

    def accept(self, r: int, accepted: int) -> None:
        """commit_accept_tokens for request r, `accepted` drafts of the last verify (1..N): the
        accepted positions below B move to their own slot, the last accepted one to slot B; the
        rest stay only in the host pool."""
        req = self.reqs[r]
        L, B = req.seq_len, self.B
        for i in range(accepted):
            p = L + i
            source = req.to_device[B + 1 + i]
            if p < B or i == accepted - 1:
                pos = min(p, B)
                dest = req.to_device[pos]
                self.device[dest] = self.device.get(source)
                req.tokens[pos] = p
                req.locs[pos] = dest
        req.seq_len = L + accepted

    def verify(self, req_ids: List[int], top_k: List[List[List[int]]]) -> List[List[List[int]]]:
        """prepare_verify (the drafts written in the extra page, as the verify forward does), then
        the gather and commit kernels for every request; returns each request's out [N][K]."""
        self.results = []
        outs = []
        for r, rows in zip(req_ids, top_k):
            req = self.reqs[r]
            L = req.seq_len
            for i in range(self.N):
                slot = self.B + 1 + i
                req.tokens[slot] = L + i
                req.locs[slot] = req.to_device[slot]
                self.device[req.to_device[slot]] = self.host.get(r * self.S + L + i)
                self.writes += 1
            flat = [t for row in rows for t in row]
            seq_lens = [L + i + 1 for i in range(self.N)]
            res = self._kernels(r, req, flat, seq_lens)
            for src, dst in res.copies:
                self.device[dst] = self.host.get(src)
            self.copies += len(res.copies)
            self.results.append(res)
            outs.append(res.out)
        return outs

    # -- the kernels ----------------------------------------------------------------------------
    def _extra_page(self, req: SpecRequest, token: int, seq_len: int) -> int:
        """try_get_extra_page_device_loc: the loc, or -1."""
        slot = -1
        if token >= seq_len - self.P:
            for cand in range(self.B, self.B + self.P):
                if req.tokens[cand] == token:
                    slot = cand
                    break
        if slot < self.B or slot >= self.B + self.P:
            return -1
        loc = req.locs[slot]
        return loc if loc >= 0 else -1

    def _ring_lookup(self, req: SpecRequest, token: int, degraded: bool) -> int:
        if token < 0:
            return -1
        for table, slot_of in ((req.keys, _ring_slot), (req.vals, _ring_slot_secondary)):
            entry = table[slot_of(token, self.H)]
            if entry >= 0 and _tok(entry) == token:
                s = _slot(entry)
                if s < self.B and req.tokens[s] == token:
                    return s
        if degraded:
            for s in range(self.B):
                if req.tokens[s] == token:
                    return s
        return -1

    def _hot_lookup(self, req: SpecRequest, token: int, degraded: bool) -> int:
        if 0 <= token < self.B and req.tokens[token] == token:
            return token
        return self._ring_lookup(req, token, degraded)

    def _ring_insert(self, req: SpecRequest, token: int, slot: int) -> int:
        if token < 0:
            return -1
        packed = _pack(token, slot)
        p, s = _ring_slot(token, self.H), _ring_slot_secondary(token, self.H)
        old = req.keys[p]
        if old >= 0 and _tok(old) == token:
            req.keys[p] = packed
            return p
        if old < 0:
            req.keys[p] = packed
            return p
        old = req.vals[s]
        if old >= 0 and _tok(old) == token:
            req.vals[s] = packed
            return s
        if old < 0:
            req.vals[s] = packed
            return s
        current, use_secondary = packed, False
        for _ in range(64):
            t = _tok(current)
            table = req.vals if use_secondary else req.keys
            at = _ring_slot_secondary(t, self.H) if use_secondary else _ring_slot(t, self.H)
            displaced = table[at]
            table[at] = current
            if displaced < 0 or _tok(displaced) == t:
                return at
            current, use_secondary = displaced, not use_secondary
        return -1

    def _ring_erase(self, req: SpecRequest, token: int, slot: int) -> None:
        if token < 0:
            return
        expected = _pack(token, slot)
        p = _ring_slot(token, self.H)
        if req.keys[p] == expected:
            req.keys[p] = HASH_DELETED
            return
        s = _ring_slot_secondary(token, self.H)
        if req.vals[s] == expected:
            req.vals[s] = HASH_DELETED

    def _kernels(self, r: int, req: SpecRequest, flat: List[int], seq_lens: List[int]) -> SpecResult:
        res = SpecResult(out=[])
        out = self._gather(r, req, flat, seq_lens, res)
        self._commit(r, req, flat, out, res)
        res.out = [out[i * self.K:(i + 1) * self.K] for i in range(self.N)]
        return res

    def _gather(self, r, req: SpecRequest, flat, seq_lens, res: SpecResult) -> List[int]:
        T, K = self.T, self.K
        cache_epoch = self.ring.next_epoch(req.ring_state)
        degraded = bool(req.generation & HASH_DEGRADED_FLAG)
        nxt = (req.generation & SCRATCH_EPOCH_MASK) + 1
        scratch_epoch = 1 if nxt > SCRATCH_EPOCH_MASK else nxt
        out = [-1] * T
        for occ in range(T):
            token = flat[occ]
            seq_len = seq_lens[occ // K]
            loc, cache_slot = -1, -1
            if not 0 <= token < seq_len:
                out[occ] = -1
                continue
            res.lookups += 1
            direct = self._extra_page(req, token, seq_len)
            if direct >= 0:
                out[occ] = direct
                continue
            cache_slot = self._hot_lookup(req, token, degraded)
            if cache_slot >= 0:
                loc = req.locs[cache_slot]
                if req.ref[cache_slot] != cache_epoch:
                    req.union_hit_count += 1
                req.ref[cache_slot] = cache_epoch
            else:
                res.misses += 1
                src = r * self.S + token
                hash_pos = _hash_slot(token, T)
                for _ in range(T):
                    old = req.table[hash_pos]
                    if old is UNSET or old[0] != scratch_epoch:  # claim it
                        req.table[hash_pos] = (scratch_epoch, token)
                        unique_idx = req.work_count
                        req.work_count += 1
                        req.compact[unique_idx] = hash_pos
                        req.indices[hash_pos] = (scratch_epoch, unique_idx)
                        if unique_idx < self.C:
                            loc = req.scratch_locs[unique_idx]
                            if loc >= 0:
                                res.copies.append((src, loc))
                        break
                    if old[1] == token:
                        unique_idx = req.indices[hash_pos][1]
                        if unique_idx < self.C:
                            loc = req.scratch_locs[unique_idx]
                        break
                    hash_pos = _next_hash_slot(hash_pos, T)
            out[occ] = loc
        return out

    def _scratch_union_lookup(self, req: SpecRequest, scratch_epoch: int, token: int) -> int:
        T = self.T
        hash_pos = _hash_slot(token, T)
        for _ in range(T):
            packed = req.table[hash_pos]
            if packed is UNSET or packed[0] != scratch_epoch:
                return -1
            if packed[1] == token:
                entry = req.indices[hash_pos]
                return entry[1] if entry is not UNSET and entry[0] == scratch_epoch else -1
            hash_pos = _next_hash_slot(hash_pos, T)
        return -1

    def _commit(self, r, req: SpecRequest, flat, out, res: SpecResult) -> None:
        B, C, T, K = self.B, self.C, self.T, self.K
        ring = self.ring
        cache_epoch = ring.next_epoch(req.ring_state)
        clock_cursor = ring.cursor(req.ring_state)
        degraded = bool(req.generation & HASH_DEGRADED_FLAG)
        nxt = (req.generation & SCRATCH_EPOCH_MASK) + 1
        scratch_epoch = 1 if nxt > SCRATCH_EPOCH_MASK else nxt
        miss_count, union_hit_count = req.work_count, req.union_hit_count
        res.unique_misses, res.union_hits = miss_count, union_hit_count
        overflow = miss_count > C
        res.direct = max(0, miss_count - C)
        iterations = (miss_count + COMMIT_BLOCK - 1) // COMMIT_BLOCK
        lock_free = iterations == 1
        use_union = miss_count + union_hit_count <= B
        res.union_clock = use_union
        mandatory = miss_count - C if overflow else 0
        budget = 0 if use_union else (max(0, B - union_hit_count - mandatory) if overflow else B)
        hash_degraded = degraded
        if not use_union:  # approximate admission: keep the last draft's working set
            if not overflow:
                req.ref = [0] * B
            req.union_hit_count = 0
            start = (self.N - APPROX_ADMISSION_STEPS) * K if self.N > APPROX_ADMISSION_STEPS else 0
            for occ in range(start, T):
                token = flat[occ]
                if token < 0:
                    continue
                slot = self._hot_lookup(req, token, hash_degraded)
                if slot >= 0:
                    req.ref[slot] = cache_epoch
                    continue
                u = self._scratch_union_lookup(req, scratch_epoch, token)
                if 0 <= u < C:
                    old = req.compact[u]
                    req.compact[u] = old | COMPACT_APPROX_CLAIM_FLAG
                    if not old & COMPACT_APPROX_CLAIM_FLAG:
                        ordinal = req.union_hit_count
                        req.union_hit_count += 1
                        if ordinal < budget:
                            req.compact[u] |= COMPACT_APPROX_ADMIT_FLAG
        for iteration in range(iterations):
            threads = range(iteration * COMMIT_BLOCK, min((iteration + 1) * COMMIT_BLOCK, miss_count))
            work = {}
            for idx in threads:  # victim selection (disjoint partitions)
                work[idx] = self._select(req, idx, miss_count, use_union, lock_free, overflow, scratch_epoch,
                                         cache_epoch, clock_cursor)
            for idx in threads:  # the rare global probe, after the barrier
                w = work[idx]
                if (w["direct"] or w["rotate"]) and w["victim"] < 0:
                    res.fallbacks += 1
                    start = ((clock_cursor + ((idx * KNUTH) & U32)) & U32) % B
                    for attempt in range(B):
                        cand = ((start + ((attempt * KNUTH) & U32)) & U32) % B
                        if req.ref[cand] == cache_epoch:
                            continue
                        req.ref[cand] = cache_epoch
                        w["victim"] = cand
                        break
            for idx in threads:  # apply, then the warp's copies
                hash_degraded = self._apply(r, req, work[idx], scratch_epoch, cache_epoch, res) or hash_degraded
        if overflow:  # resolve the occurrences of the misses past the scratch
            for occ in range(T):
                if out[occ] >= 0 or flat[occ] < 0:
                    continue
                token = flat[occ]
                hash_pos = _hash_slot(token, T)
                for _ in range(T):
                    packed = req.table[hash_pos]
                    if packed is UNSET or packed[0] != scratch_epoch:
                        break
                    if packed[1] == token:
                        entry = req.indices[hash_pos]
                        if entry is not UNSET and entry[0] == scratch_epoch and entry[1] != U32:
                            out[occ] = entry[1]
                        break
                    hash_pos = _next_hash_slot(hash_pos, T)
        req.miss_count = miss_count
        req.work_count = 0
        req.union_hit_count = 0
        req.generation = scratch_epoch | (HASH_DEGRADED_FLAG if hash_degraded else 0)
        next_cursor = (clock_cursor + min(miss_count, B)) % B if miss_count > 0 else clock_cursor
        req.ring_state = ring.pack(cache_epoch, next_cursor)

    def _select(self, req, idx, miss_count, use_union, lock_free, overflow, scratch_epoch, cache_epoch, cursor):
        B, C = self.B, self.C
        w = {"idx": idx, "victim": -1, "direct": False, "rotate": False, "token": -1, "unique": -1, "hash_pos": -1}
        entry = req.compact[idx]
        hash_pos = entry & COMPACT_HASH_MASK
        packed, index_entry = req.table[hash_pos], req.indices[hash_pos]
        if packed is UNSET or index_entry is UNSET or packed[0] != scratch_epoch or index_entry[0] != scratch_epoch:
            return w
        token, unique = packed[1], index_entry[1]
        direct = overflow and unique >= C
        admitted = not use_union and bool(entry & COMPACT_APPROX_ADMIT_FLAG)
        rotate = unique < C and (use_union or admitted)
        w.update(token=token, unique=unique, hash_pos=hash_pos, direct=direct, rotate=rotate)
        if not (direct or rotate):
            return w
        victim = -1
        if use_union:
            oldest = 0
            partition = (B - 1 - idx) // miss_count + 1
            samples = min(partition, CLOCK_VICTIM_SAMPLES)
            for sample in range(samples):
                linear = idx + (sample * partition // samples) * miss_count
                cand = (cursor + linear) % B
                ref = req.ref[cand]
                if ref == cache_epoch:
                    continue
                age = (cache_epoch - ref) & self.ring.epoch_mask
                if victim < 0 or age > oldest:
                    victim, oldest = cand, age
            if victim >= 0:
                req.ref[victim] = cache_epoch
        else:
            count = miss_count - C if direct else miss_count
            ordinal = unique - C if direct else unique
            linear = ordinal
            while linear < B:
                cand = (((linear * KNUTH) & U32) + cache_epoch) & U32
                cand %= B
                linear += count
                if req.ref[cand] == cache_epoch:
                    continue
                req.ref[cand] = cache_epoch  # lock-free single pass or a won CAS: the same in order
                victim = cand
                break
        w["victim"] = victim
        return w

    def _apply(self, r, req: SpecRequest, w, scratch_epoch, cache_epoch, res: SpecResult) -> bool:
        """One commit thread's update; True if the ring hash degraded."""
        victim, token = w["victim"], w["token"]
        if not (w["direct"] or w["rotate"]):
            return False
        if victim < 0:
            if w["direct"]:
                req.indices[w["hash_pos"]] = (scratch_epoch, U32)
            return False
        old_loc = req.locs[victim]
        new_loc = old_loc if w["direct"] else req.scratch_locs[w["unique"]]
        if new_loc < 0 or old_loc < 0:
            return False
        old_token = req.tokens[victim]
        req.tokens[victim] = token
        req.ref[victim] = cache_epoch
        if w["rotate"]:
            req.locs[victim] = new_loc
            req.scratch_locs[w["unique"]] = old_loc
        else:
            req.indices[w["hash_pos"]] = (scratch_epoch, old_loc)
            src = r * self.S + token
            res.copies.append((src, old_loc))
        self._ring_erase(req, old_token, victim)
        return self._ring_insert(req, token, victim) < 0
