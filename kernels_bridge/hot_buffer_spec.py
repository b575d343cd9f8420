"""SGLang 0.5.23's speculative hot buffer (MTP / EAGLE): the CLOCK swap-in of `hisparse_spec.cuh`
and the coordinator's verify and commit around it, for a HotBuffer made with ``draft_tokens``.

With speculative decoding every decode step is a target verify of N draft tokens (2..4), and
SGLang sends it to a separate kernel pair, not the LRU one (`hot_buffer_kernel`):

* before the step (``prepare_verify``) the drafts, positions L .. L+N-1 (L the committed length),
  are written by the verify forward into the extra page's slots B+1 .. B+N: device writes;
* the indexer gives one top-k per draft, ``[N, top_k]``; draft i sees seq_len L + i + 1;
* gather: every occurrence resolves to the extra page (a position among the page's tokens, no
  older than seq_len - page_size), else to the hot slot holding it (a hit), else it is a miss; each
  distinct missed position takes the next row of the request's *scratch* (``scratch_capacity``
  device rows of its own, numbered by first occurrence) and is copied there host -> device; an
  occurrence past the scratch gets -1 for now;
* commit: the misses are admitted into the hot slots. When misses + distinct hot slots hit fit in
  the buffer (the "union" CLOCK), miss u samples up to 6 slots of its partition (cursor + u + j *
  misses) and takes the one not referenced this step with the oldest reference epoch; otherwise
  (approximate admission) the reference epochs are cleared, the last draft's hits re-marked and
  the first ``budget`` misses the last draft asks for admitted, each taking the first unmarked slot
  of a multiplicative-hash walk. A partition with no free slot falls back to a hash-ordered probe
  of every slot. An admitted miss swaps rows with its victim (scratch row into the slot, the
  victim's row becomes scratch): no copy. A miss past the scratch is copied host -> device straight
  into its victim's row, and its occurrences get that row (-1 when no victim is found);
* the cursor advances by min(misses, B); each step is a new epoch;
* after the step (``commit_accept_tokens``, applied here at the request's next translate, from its
  seq_len growth 1..N): the accepted drafts below B move on the device to their own slots, the
  last accepted one to slot B.

The kernel leaves the order of concurrent threads to the hardware (which warp claims a miss
first, CAS races on the CLOCK bits); this model takes thread-index order, as the independent
transcription it is checked against (``tests/oracles/sglang_hisparse_spec.py``) does. Positions are
found through a sorted index of the slots, not SGLang's cuckoo hash, which finds the same slot
(a position is held by at most one slot).
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from kernels_bridge.hot_buffer_checks import HotBufferError, INT_DTYPES
from kernels_bridge.errors import describe
from kernels_bridge.layout import spec_scratch_rows
from kernels_bridge.tensor_checks import check_readable

__all__ = ["SpecState", "SpecPass", "scratch_capacity", "check_spec_sizes", "check_spec_batch", "spec_step",
           "DRAFT_TOKENS", "MIN_SPEC_TOP_K", "MAX_OCCURRENCES"]

DRAFT_TOKENS = (2, 3, 4)
MIN_SPEC_TOP_K = 1024
MAX_OCCURRENCES = 8192
KNUTH = 2654435761
U32 = 0xFFFFFFFF
SAMPLES = 6
COMMIT_THREADS = 512
I64 = torch.int64


scratch_capacity = spec_scratch_rows  # rows per request: min(N * top_k, max(1024, N * top_k - buffer_size))


def check_spec_sizes(draft_tokens, top_k, buffer_size: int, page_size: int, num_requests: int) -> tuple:
    """SGLang's refusals of a speculative configuration, as HotBufferErrors; returns (N, top_k)."""
    if isinstance(draft_tokens, bool) or not isinstance(draft_tokens, int) or draft_tokens not in DRAFT_TOKENS:
        raise HotBufferError(f"draft_tokens: got {draft_tokens!r}; expected 2, 3 or 4 (SGLang's speculative "
                             f"hot buffer takes 2-4 draft tokens)", argument="draft_tokens")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < MIN_SPEC_TOP_K:
        raise HotBufferError(f"top_k: got {top_k!r}; expected an int >= {MIN_SPEC_TOP_K} (SGLang's speculative "
                             f"hot buffer requires it)", argument="top_k")
    if draft_tokens * top_k > MAX_OCCURRENCES:
        raise HotBufferError(f"top_k: {draft_tokens} draft tokens x top_k {top_k} = {draft_tokens * top_k} "
                             f"occurrences; SGLang's speculative hot buffer takes at most {MAX_OCCURRENCES}",
                             argument="top_k")
    if top_k > buffer_size:
        raise HotBufferError(f"top_k: {top_k} is above buffer_size {buffer_size}", argument="top_k")
    if draft_tokens > page_size - 1:
        raise HotBufferError(f"draft_tokens: {draft_tokens} verify slots do not fit the extra page's "
                             f"{page_size - 1}", argument="draft_tokens")
    if num_requests > buffer_size:
        raise HotBufferError(f"num_requests: {num_requests} is above buffer_size {buffer_size}; SGLang's "
                             f"speculative hot buffer refuses more request slots than buffer slots",
                             argument="num_requests")
    return draft_tokens, top_k


class SpecPass(NamedTuple):
    """One step of the requests: out int32 [n, N, K]; src, dst int64 [c] rows copied host ->
    device (gather's, then the commit's); moves_src, moves_dst int64 [m] device rows written
    before the kernels (prefill, drafts, accepted drafts) from the host rows standing for them;
    and the counts."""
    out: torch.Tensor
    src: torch.Tensor
    dst: torch.Tensor
    moves_src: torch.Tensor
    moves_dst: torch.Tensor
    lookups: int
    misses: int
    copies: int
    written: int


class SpecState:
    """The per-request tables of SGLang's speculative swap for one layer, on the CPU (the step
    runs request by request, as the kernel's blocks do). R requests, S max_seq_len, B slots,
    P page, N drafts, K top-k, C scratch rows, RW rows per request (W = B + P, then C padded to
    pages).

    tokens int64 [R, W]: the position each slot holds (-1 none); locs int64 [R, W]: the device row
    of each slot; scratch int64 [R, C]: the request's scratch rows; ref int64 [R, B]: each slot's
    reference epoch; epoch, cursor int64 [R]: the CLOCK state; seq_len int64 [R]: the committed
    length (0: not admitted)."""

    def __init__(self, R: int, S: int, B: int, P: int, N: int, K: int):
        self.R, self.S, self.B, self.P, self.N, self.K = R, S, B, P, N, K
        self.W = B + P
        self.C = scratch_capacity(N, K, B)
        self.RW = self.W + -(-self.C // P) * P
        bits = (B - 1).bit_length()  # PackedRingState's CURSOR_BITS
        self.epoch_mask = (1 << min(32 - bits, 23)) - 1
        self.tokens = torch.full((R, self.W), -1, dtype=I64)
        self.locs = torch.full((R, self.W), -1, dtype=I64)
        self.scratch = torch.zeros((R, self.C), dtype=I64)
        self.ref = torch.zeros((R, B), dtype=I64)
        self.epoch = torch.zeros(R, dtype=I64)
        self.cursor = torch.zeros(R, dtype=I64)
        self.seq_len = torch.zeros(R, dtype=I64)

    def tensors(self) -> dict:
        return {"tokens": self.tokens, "locs": self.locs, "scratch": self.scratch, "ref": self.ref,
                "epoch": self.epoch, "cursor": self.cursor, "seq_len": self.seq_len}

    def forget(self, rid: torch.Tensor) -> None:
        """request_finished: every table of the requests cleared."""
        rid = rid.cpu()
        self.tokens[rid] = -1
        self.locs[rid] = -1
        self.scratch[rid] = 0
        self.ref[rid] = 0
        self.epoch[rid] = 0
        self.cursor[rid] = 0
        self.seq_len[rid] = 0

    def admit(self, r: int, prefill: int, admission: str) -> tuple:
        """alloc_device_buffer (the whole padded buffer), reset, and for a disaggregated admission
        the preload or the cold start. Returns (prefill moves src, dst, preloaded rows src, dst)."""
        B, base = self.B, r * self.RW
        self.locs[r] = base + torch.arange(self.W)
        self.tokens[r] = -1
        self.tokens[r, :B] = torch.arange(B)
        self.scratch[r] = base + self.W + torch.arange(self.C)
        self.ref[r] = 0
        self.epoch[r] = self.cursor[r] = 0
        self.seq_len[r] = prefill
        n = min(prefill, B)
        rows = torch.arange(n, dtype=I64)
        none = torch.empty(0, dtype=I64)
        if admission == "normal":
            return r * self.S + rows, base + rows, none, none
        if prefill <= B:
            return none, none, r * self.S + rows, base + rows
        self.tokens[r, :B] = -1
        return none, none, none, none

    def accept(self, r: int, accepted: int) -> tuple:
        """commit_accept_tokens: returns the device moves (verify rows -> their slots) as host
        rows standing for them and device rows."""
        L, B, base = int(self.seq_len[r]), self.B, r * self.RW
        i = torch.arange(accepted, dtype=I64)
        p = L + i
        keep = (p < B) | (i == accepted - 1)
        pos = p[keep].clamp(max=B)
        self.tokens[r, pos] = p[keep]
        self.locs[r, pos] = base + pos
        self.seq_len[r] = L + accepted
        return r * self.S + p[keep], base + pos


def check_spec_batch(req_ids, seq_lens, positions, st: SpecState, rid: torch.Tensor, lens: torch.Tensor):
    """positions: integer [n, N, K], each draft i's positions -1 or below seq_len + i + 1; a
    request already admitted grows by 1..N committed tokens (the drafts its last step accepted);
    seq_len + N <= max_seq_len. rid, lens: the checked req_ids and seq_lens. Returns int64 pos."""
    n, N, K = rid.shape[0], st.N, st.K
    doc = f"[n, draft_tokens, top_k] = [{n}, {N}, {K}]"
    if not isinstance(positions, torch.Tensor):
        raise HotBufferError(f"positions: got {describe(positions)}; expected an integer torch.Tensor {doc}",
                             argument="positions")
    check_readable(positions, "positions", HotBufferError)
    if positions.dtype not in INT_DTYPES or tuple(positions.shape) != (n, N, K):
        raise HotBufferError(f"positions: {describe(positions)}; expected an integer tensor {doc}",
                             argument="positions")
    pos = positions.to("cpu").long()
    lens, rid = lens.cpu(), rid.cpu()
    over = lens + N > st.S
    if bool(over.any()):
        i = int(over.nonzero()[0, 0])
        raise HotBufferError(f"seq_lens: element {i} (request {int(rid[i])}) is {int(lens[i])}; its {N} drafts "
                             f"need seq_len + {N} <= max_seq_len {st.S}", argument="seq_lens")
    last = st.seq_len.index_select(0, rid)
    grow = lens - last
    bad = (last > 0) & ((grow < 1) | (grow > N))
    if bool(bad.any()):
        i = int(bad.nonzero()[0, 0])
        raise HotBufferError(f"seq_lens: element {i} (request {int(rid[i])}) is {int(lens[i])} after "
                             f"{int(last[i])}; a speculative step commits 1..{N} drafts", argument="seq_lens")
    limit = lens[:, None, None] + 1 + torch.arange(N)[None, :, None]
    wrong = (pos < -1) | (pos >= limit)
    if bool(wrong.any()):
        i, j, k = wrong.nonzero()[0].tolist()
        raise HotBufferError(f"positions: [{i}, {j}, {k}] (request {int(rid[i])}) is {int(pos[i, j, k])}; "
                             f"expected -1 or 0 <= position < {int(limit[i, j, 0])} (draft {j} of a request "
                             f"of committed length {int(lens[i])})", argument="positions")
    return pos


def _hot_slots(tokens_b: torch.Tensor, flat: torch.Tensor) -> torch.Tensor:
    """The hot slot (0..B-1) holding each position, -1 where none."""
    B = tokens_b.shape[0]
    direct = (flat >= 0) & (flat < B)
    direct &= tokens_b.index_select(0, flat.clamp(0, B - 1)) == flat
    srt, order = torch.sort(tokens_b, stable=True)
    at = torch.searchsorted(srt, flat).clamp(max=B - 1)
    found = (srt.index_select(0, at) == flat) & (flat >= 0)
    return torch.where(direct, flat, torch.where(found, order.index_select(0, at), -1))


def _extra_page(st: SpecState, r: int, flat: torch.Tensor, seq: torch.Tensor) -> torch.Tensor:
    """try_get_extra_page_device_loc: the device row of each occurrence found in the extra page
    (the first slot of the page holding it), -1 elsewhere."""
    page = st.tokens[r, st.B:]
    match = (flat[:, None] == page[None, :]) & (flat >= seq - st.P)[:, None] & (flat >= 0)[:, None]
    first = match.to(torch.int8).argmax(1)
    loc = st.locs[r, st.B:].index_select(0, first)
    return torch.where(match.any(1) & (loc >= 0), loc, -1)


def _unique_misses(flat: torch.Tensor, miss: torch.Tensor):
    """(tokens int64 [M] in first-occurrence order, each occurrence's index among them)."""
    at = miss.nonzero().squeeze(1)
    uniq, inverse = torch.unique(flat.index_select(0, at), return_inverse=True)
    first = torch.full((uniq.numel(),), flat.numel(), dtype=I64).scatter_reduce_(0, inverse, at, "amin")
    order = torch.argsort(first)
    rank = torch.empty_like(order)
    rank[order] = torch.arange(order.numel())
    u_of = torch.full_like(flat, -1)
    u_of[at] = rank.index_select(0, inverse)
    return uniq.index_select(0, order), u_of


def _gather(st: SpecState, r: int, L: int, flat: torch.Tensor, epoch: int):
    """The gather kernel: out, hot slot per occurrence, unique misses, their index per
    occurrence, the number of distinct hot slots newly referenced, lookups, misses."""
    N, K = st.N, st.K
    seq = L + 1 + torch.arange(N, dtype=I64).repeat_interleave(K)
    valid = (flat >= 0) & (flat < seq)
    extra = _extra_page(st, r, flat, seq)
    hot = torch.where(valid & (extra < 0), _hot_slots(st.tokens[r, :st.B], flat), -1)
    hit = hot >= 0
    miss = valid & (extra < 0) & ~hit
    slots = torch.unique(hot[hit])
    union = int((st.ref[r].index_select(0, slots) != epoch).sum())
    st.ref[r, slots] = epoch
    uniq, u_of = _unique_misses(flat, miss)
    scratch = st.scratch[r]
    out = torch.where(extra >= 0, extra, -1)
    out = torch.where(hit, st.locs[r].index_select(0, hot.clamp(min=0)), out)
    in_scratch = miss & (u_of < st.C)
    out = torch.where(in_scratch, scratch.index_select(0, u_of.clamp(0, st.C - 1)), out)
    return out, uniq, u_of, union, int(valid.sum()), int(miss.sum())


def _union_victims(st: SpecState, r: int, idx: torch.Tensor, M: int, cursor: int, epoch: int) -> torch.Tensor:
    """Union CLOCK for misses idx (one commit pass): the oldest unreferenced of up to 6 samples of
    each partition; -1 where the partition has none. Marks the victims."""
    B = st.B
    part = (B - 1 - idx) // M + 1
    count = part.clamp(max=SAMPLES)
    s = torch.arange(SAMPLES, dtype=I64)
    cand = (cursor + idx[:, None] + (s[None, :] * part[:, None] // count[:, None]) * M) % B
    ref = st.ref[r].index_select(0, cand.view(-1)).view(cand.shape)
    free = (s[None, :] < count[:, None]) & (ref != epoch)
    age = torch.where(free, (epoch - ref) & st.epoch_mask, -1)
    best = age.argmax(1)
    victim = torch.where(age.amax(1) >= 0, cand.gather(1, best[:, None]).squeeze(1), -1)
    st.ref[r, victim[victim >= 0]] = epoch
    return victim


def _walk_victim(ref: list, ordinal: int, count: int, epoch: int, B: int) -> int:
    """Approximate admission: the first unmarked slot of the walk (linear * KNUTH + epoch) % B."""
    linear = ordinal
    while linear < B:
        cand = ((((linear * KNUTH) & U32) + epoch) & U32) % B
        linear += count
        if ref[cand] != epoch:
            ref[cand] = epoch
            return cand
    return -1


def _probe_victim(ref: list, idx: int, cursor: int, epoch: int, B: int) -> int:
    """The global fallback probe of a miss whose partition had no free slot."""
    start = ((cursor + ((idx * KNUTH) & U32)) & U32) % B
    for attempt in range(B):
        cand = ((start + ((attempt * KNUTH) & U32)) & U32) % B
        if ref[cand] != epoch:
            ref[cand] = epoch
            return cand
    return -1


def _admitted(st: SpecState, r: int, flat: torch.Tensor, u_of: torch.Tensor, M: int, union: int, epoch: int):
    """Approximate admission's marks and choice: [M] bool, the misses admitted (u < C, among the
    first `budget` distinct misses the last draft asks for, in occurrence order)."""
    B, C, K = st.B, st.C, st.K
    overflow = M > C
    budget = max(0, B - union - (M - C)) if overflow else B
    if not overflow:
        st.ref[r] = 0
    last = flat[(st.N - 1) * K:]
    hot = _hot_slots(st.tokens[r, :B], last)
    st.ref[r, hot[hot >= 0]] = epoch
    u = u_of[(st.N - 1) * K:]
    u = u[(hot < 0) & (u >= 0) & (u < C)]
    admitted = torch.zeros(M, dtype=torch.bool)
    if u.numel():
        seen = torch.zeros(M, dtype=torch.bool)
        firsts = []
        for v in u.tolist():  # claim order: the last draft's occurrences in order
            if not seen[v]:
                seen[v] = True
                firsts.append(v)
        admitted[torch.tensor(firsts[:budget], dtype=I64)] = True
    return admitted


def _victims(st: SpecState, r: int, flat, u_of, M: int, union: int, epoch: int, cursor: int):
    """The commit kernel's victim per miss (int64 [M], -1 none), pass by pass of 512 threads."""
    B, C = st.B, st.C
    victim = torch.full((M,), -1, dtype=I64)
    use_union = M + union <= B
    takes = torch.ones(M, dtype=torch.bool) if use_union else _admitted(st, r, flat, u_of, M, union, epoch)
    takes |= torch.arange(M) >= C  # a miss past the scratch always looks for a victim
    for start in range(0, M, COMMIT_THREADS):
        idx = torch.arange(start, min(M, start + COMMIT_THREADS), dtype=I64)
        idx = idx[takes[idx]]
        if not idx.numel():
            continue
        if use_union:
            victim[idx] = _union_victims(st, r, idx, M, cursor, epoch)
            ref = None
        else:
            ref = st.ref[r].tolist()
            for u in idx.tolist():
                direct = u >= C
                victim[u] = _walk_victim(ref, u - C if direct else u, M - C if direct else M, epoch, B)
        left = idx[victim[idx] < 0]
        if left.numel():
            ref = st.ref[r].tolist() if ref is None else ref
            for u in left.tolist():
                victim[u] = _probe_victim(ref, u, cursor, epoch, B)
        if ref is not None:
            st.ref[r] = torch.tensor(ref, dtype=I64)
    return victim


def _commit(st: SpecState, r: int, flat, out, uniq, u_of, union: int, epoch: int):
    """The commit kernel: victims, rotations, the copies of misses past the scratch; returns
    those copies (src, dst)."""
    B, C, M = st.B, st.C, uniq.numel()
    cursor = int(st.cursor[r])
    victim = _victims(st, r, flat, u_of, M, union, epoch, cursor) if M else torch.empty(0, dtype=I64)
    got = (victim >= 0).nonzero().squeeze(1)
    v = victim.index_select(0, got)
    old = st.locs[r].index_select(0, v)
    st.tokens[r, v] = uniq.index_select(0, got)
    st.ref[r, v] = epoch
    rot = got < C
    st.locs[r, v[rot]] = st.scratch[r].index_select(0, got[rot])
    st.scratch[r, got[rot]] = old[rot]
    direct = ~rot
    resolved = torch.full((M,), -1, dtype=I64)
    resolved[got[direct]] = old[direct]
    over = u_of >= C
    if bool(over.any()):
        out[over] = resolved.index_select(0, u_of[over])
    st.epoch[r] = epoch
    if M:
        st.cursor[r] = (cursor + min(M, B)) % B
    return r * st.S + uniq.index_select(0, got[direct]), old[direct]


def spec_step(st: SpecState, rid: torch.Tensor, lens: torch.Tensor, pos: torch.Tensor, admission: str) -> SpecPass:
    """One speculative step of the requests (validated: rid, lens int64 [n], pos int64 [n, N, K])."""
    n = rid.shape[0]
    out = torch.full((n, st.N * st.K), -1, dtype=I64)
    src, dst, msrc, mdst = [], [], [], []
    lookups = misses = written = 0
    for i, (r, L) in enumerate(zip(rid.tolist(), lens.tolist())):
        last = int(st.seq_len[r])
        if last == 0:
            a, b, c, d = st.admit(r, L, admission)
            msrc.append(a)
            mdst.append(b)
            src.append(c)
            dst.append(d)
        else:
            a, b = st.accept(r, L - last)
            msrc.append(a)
            mdst.append(b)
        drafts = torch.arange(st.N, dtype=I64)
        st.tokens[r, st.B + 1 + drafts] = L + drafts
        st.locs[r, st.B + 1 + drafts] = r * st.RW + st.B + 1 + drafts
        msrc.append(r * st.S + L + drafts)
        mdst.append(r * st.RW + st.B + 1 + drafts)
        written += st.N
        flat = pos[i].reshape(-1)
        epoch = (int(st.epoch[r]) + 1) & st.epoch_mask or 1
        o, uniq, u_of, union, lk, ms = _gather(st, r, L, flat, epoch)
        M = min(uniq.numel(), st.C)
        src.append(r * st.S + uniq[:M])
        dst.append(st.scratch[r, :M].clone())
        c_src, c_dst = _commit(st, r, flat, o, uniq, u_of, union, epoch)
        src.append(c_src)
        dst.append(c_dst)
        out[i] = o
        lookups, misses = lookups + lk, misses + ms
    cat = lambda parts: torch.cat(parts) if parts else torch.empty(0, dtype=I64)  # noqa: E731
    s, d = cat(src), cat(dst)
    return SpecPass(out.view(n, st.N, st.K).to(torch.int32), s, d, cat(msrc), cat(mdst), lookups, misses,
                    int(s.numel()), written)
