"""SGLang's swap-in kernel (`load_cache_to_device_buffer_kernel`, `hisparse.cuh`) in whole-batch
tensor passes: every request of a call at once, no Python loop over requests or tokens.

Per request, as the kernel does it:

* short (seq_len <= B): position p is in slot p. Entry i maps to its slot when i < min(seq_len,
  top_k) and it is not -1; every other entry is -1. Nothing is copied; the LRU order stays.
* long (seq_len > B): the newest token (seq_len - 1) maps to the reserved slot B, a hit. A slot is
  hit when its token is asked for; the entry it serves is the last one asking for that position
  (the kernel's hash keeps the last index), and where two slots hold the asked token, the one
  later in LRU order serves it (the kernel's threads race there; this is its thread order). Every
  other valid entry is a miss, a repeated position's other entries included: the i-th miss, in
  entry order, takes the i-th least-recently-used slot that was not hit. -1 is padding: -1 out
  (SGLang 0.5.17+ leaves the entry as the output buffer held it before).
  New LRU order: the evictables left over (old order), then the slots counted as filled, then the
  hits (old order). The release decides that count: 0.5.23 (0.5.21+) the misses, all copied;
  0.5.12 (up to 0.5.20) top_k - hit slots - (1 if the newest token is asked). With padding or
  repeats that differs from the misses: only the first `count` misses are copied (the others are
  recorded in their slots over stale rows), and copies past the misses come from the kernel's
  stale scratch (another entry's position, copied here; or the word before the request's host
  table, counted but not copied) into slots still recorded as holding their tokens.
* a step whose misses (or counted misses) outnumber the slots not hit, which only repeated
  positions can cause, makes the kernel index outside the request's rows: refused.

On the CPU the cost is memory traffic, so the passes keep int32 values and turn masks into
arithmetic (a select is a multiplication by a 0/1 mask, a sign test a shift by 31): int64 values,
comparisons writing bool and `torch.where` run several times slower.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from kernels_bridge.hot_buffer_checks import HotBufferError
from kernels_bridge.hot_buffer_state import SLOT_BITS, State

__all__ = ["Pass", "short_pass", "long_pass"]

I32, I64 = torch.int32, torch.int64


class Pass(NamedTuple):
    """One pass's result: out int32 [g, k] buffer rows; src, dst int64 [c] the rows to copy host
    -> device; and the counts (lookups: valid entries served; misses: entries that missed;
    copies: rows the kernel copies, uncopyable ones included)."""
    out: torch.Tensor
    src: torch.Tensor
    dst: torch.Tensor
    lookups: int
    misses: int
    copies: int


def short_pass(st: State, rid: torch.Tensor, lens: torch.Tensor, pos: torch.Tensor) -> Pass:
    """seq_len <= B: slot = position, for the first min(seq_len, top_k) entries."""
    k = pos.shape[1]
    served = (pos >= 0) & (torch.arange(k, device=pos.device) < lens[:, None])
    out = torch.where(served, pos + (rid * st.W).to(I32)[:, None], -1).to(I32)
    none = torch.empty(0, dtype=I64, device=pos.device)
    return Pass(out, none, none, int(served.sum()), 0, 0)


class _Lookup(NamedTuple):
    """The read-only half of a long pass (values int32 unless said)."""
    flat: torch.Tensor       # int64 [g, k] flat host row each candidate entry asks for, its dump otherwise
    cand: torch.Tensor       # [g, k] 1 for a valid entry that does not ask for the newest token
    is_newest: torch.Tensor  # [g, k] 1 where the entry asks for the newest token
    words: torch.Tensor      # int64 [g, B] the old LRU order, packed with the slots' host rows
    hit: torch.Tensor        # [g, B] 1 where the slot at that LRU position is hit
    hits_upto: torch.Tensor  # [g, B] hits at or before each LRU position
    served: torch.Tensor     # [g, k] the slot serving each entry, -1 for none
    miss: torch.Tensor       # [g, k] 1 for a miss
    misses_upto: torch.Tensor  # [g, k] misses at or before each entry
    real: torch.Tensor       # int64 [g] misses
    n_hit: torch.Tensor      # int64 [g] hit slots
    filled: torch.Tensor     # int64 [g] slots counted as filled (the release's total_misses)


def _rows(t: torch.Tensor, rid: torch.Tensor, whole: bool) -> torch.Tensor:
    return t if whole else t.index_select(0, rid)


def _hash(st: State, rid, lens, pos):
    """The kernel's hash: entry_of[flat host row] = column + 1 of the last entry asking for it;
    an entry asking for no host row writes its own dump. Returns (flat int64, cand, is_newest
    int32 [g, k])."""
    g, k = pos.shape
    is_newest = (pos == (lens - 1).to(I32)[:, None]).to(I32)
    cand = torch.bitwise_right_shift(pos, 31).add_(1).sub_(is_newest)  # 1: a valid, not newest entry
    col = torch.arange(k, dtype=I32, device=pos.device)
    # (pos + r * S - dumps - c) * cand + dumps + c: the host row, or the dump of column c
    flat = torch.add(pos, (rid * st.S - st.dumps).to(I32)[:, None]).sub_(col).mul_(cand).add_(col + st.dumps).long()
    column = (col + 1).expand(g, k).reshape(-1)
    st.entry_of.index_copy_(0, flat.view(-1), column)
    # a position asked twice keeps the last asking entry (index_copy_ leaves the winner open);
    # every other entry's row is its own, so reading the columns back tells
    if not bool(torch.equal(st.entry_of.index_select(0, flat.view(-1)), column)):
        st.entry_of.scatter_reduce_(0, flat.view(-1), column, reduce="amax", include_self=True)
    return flat, cand, is_newest


def _serving(g: int, k: int, words: torch.Tensor, entry: torch.Tensor, n_hits: int) -> torch.Tensor:
    """served int32 [g, k]: for each entry, the slot whose token it asked for, -1 for none; the
    later in LRU order where two slots hold it. Each row scatters into k + 1 columns, column 0
    taking the slots not asked for."""
    dev, B = words.device, words.shape[1]
    target = torch.add(entry, torch.arange(0, g * (k + 1), k + 1, dtype=I32, device=dev)[:, None]).long()
    slots = words.to(I32)  # the low half of each word: its slot
    served = torch.full((g, k + 1), -1, dtype=I32, device=dev)
    served.view(-1).scatter_(0, target.view(-1), slots.view(-1))
    served = served[:, 1:]
    if int(torch.bitwise_right_shift(served, 31).sum()) != n_hits - g * k:  # a token in two slots: the later serves
        at = torch.arange(B, device=dev).expand(g, B).reshape(-1)
        last = torch.full((g * (k + 1),), -1, dtype=I64, device=dev).scatter_reduce_(
            0, target.view(-1), at, reduce="amax", include_self=True).view(g, k + 1)[:, 1:]
        return torch.where(last >= 0, slots.gather(1, last.clamp(min=0)), -1).to(I32)
    return served


def _lookup(st: State, rid, lens, pos, whole: bool) -> _Lookup:
    g, k = pos.shape
    flat, cand, is_newest = _hash(st, rid, lens, pos)
    words = _rows(st.words, rid, whole)
    held = torch.bitwise_right_shift(words, SLOT_BITS)  # each slot's host row, in LRU order
    entry = st.entry_of.index_select(0, held.view(-1)).view(words.shape)
    hit = entry.clamp(max=1)
    hits_upto = torch.cumsum(hit, 1, dtype=I32)
    n_hit = hits_upto[:, -1].long()
    served = _serving(g, k, words, entry, int(n_hit.sum()))
    miss = torch.bitwise_right_shift(served, 31).neg_().mul_(cand)  # 1: a candidate nobody serves
    misses_upto = torch.cumsum(miss, 1, dtype=I32)
    real = misses_upto[:, -1].long() if k else torch.zeros(g, dtype=I64, device=pos.device)
    if st.release == "0.5.12":
        filled = k - n_hit - is_newest.amax(1).long() if k else -n_hit
    else:
        filled = real
    return _Lookup(flat, cand, is_newest, words, hit, hits_upto, served, miss, misses_upto, real, n_hit, filled)


def _check_room(st: State, rid: torch.Tensor, lk: _Lookup) -> None:
    """Refuse a step that makes the kernel write outside the request's rows."""
    evictable = st.B - lk.n_hit
    bad = (lk.real > evictable) | (lk.filled > evictable) | (lk.filled < 0)
    if bool(bad.any()):
        i = int(bad.nonzero()[0, 0])
        raise HotBufferError(
            f"positions: row {i} (request {int(rid[i])}) has {int(lk.real[i])} misses (SGLang {st.release}'s "
            f"kernel counts {int(lk.filled[i])}) against {int(evictable[i])} slots not hit: repeated "
            f"positions have filled the buffer with copies of one token, and SGLang's kernel would write "
            f"outside the request's rows here", argument="positions")


def _new_order(st: State, lk: _Lookup) -> torch.Tensor:
    """The new LRU order (evictables left over, filled, hits), int64 [g, B] words. The evictable
    of rank e goes to e - filled, or wraps to evictable - filled + e when e < filled; the hit of
    rank h to evictable + h."""
    evictable = (st.B - lk.n_hit).to(I32)[:, None]
    filled = lk.filled.to(I32)[:, None]
    rank = torch.arange(st.B, dtype=I32, device=lk.words.device).sub(filled).sub_(lk.hits_upto)  # e - filled
    rank.add_(torch.bitwise_right_shift(rank, 31).bitwise_and_(evictable))
    dest = lk.hits_upto.add(evictable - 1).sub_(rank).mul_(lk.hit).add_(rank).long()
    return torch.empty_like(lk.words).scatter_(1, dest, lk.words)


def _compact(mask_upto: torch.Tensor, mask: torch.Tensor, total: int) -> torch.Tensor:
    """int64 [total]: the flat indices where mask is 1, in order (cheaper than nonzero): each
    marked entry goes to its running count - 1, the rest to a dump."""
    g, k = mask.shape
    offsets = torch.cumsum(mask_upto[:, -1], 0, dtype=I32) - mask_upto[:, -1]
    to = (mask_upto + offsets[:, None] - 1 - total).mul_(mask).add_(total).long()
    out = torch.empty(total + 1, dtype=I64, device=mask.device)
    return out.scatter_(0, to.view(-1), torch.arange(g * k, device=mask.device))[:total]


def long_pass(st: State, rid: torch.Tensor, lens: torch.Tensor, pos: torch.Tensor) -> Pass:
    """seq_len > B: the LRU swap-in. Refuses (HotBufferError, nothing changed) a step the kernel
    cannot take."""
    g, k = pos.shape
    if k == 0:  # nothing asked (SGLang's kernel is never built for top_k 0)
        none = torch.empty(0, dtype=I64, device=pos.device)
        return Pass(torch.empty((g, 0), dtype=I32, device=pos.device), none, none, 0, 0, 0)
    whole = g == st.R and bool(torch.equal(rid, torch.arange(st.R, device=rid.device)))
    lk = _lookup(st, rid, lens, pos, whole)
    try:
        _check_room(st, rid, lk)
    finally:
        st.entry_of.index_fill_(0, lk.flat.view(-1), 0)  # the scratch is all zero between steps
    new = _new_order(st, lk)
    at, row, slot = _place_misses(st, lk, new)
    if whole:
        st.words = new
    else:
        st.words.index_copy_(0, rid, new)
    r = rid[row]
    src, dst = lk.flat.view(-1).index_select(0, at), r * st.W + slot
    if st.release == "0.5.12":  # only the first `filled` misses are copied, and maybe stale rows
        copied = lk.misses_upto.view(-1).index_select(0, at).long() <= lk.filled[row]
        src, dst = _stale_copies(st, lk, rid, new, src[copied], dst[copied])
    # output: the serving slot; a miss's new slot (served is -1 there); B for the newest (-1 + B + 1)
    out = lk.served.contiguous()
    out.view(-1).index_add_(0, at, (slot + 1).to(I32))
    out.add_(lk.is_newest * (st.B + 1))
    out.add_(torch.bitwise_right_shift(out, 31).add_(1).mul_((rid * st.W).to(I32)[:, None]))
    lookups = int((pos >= 0).sum())
    return Pass(out, src, dst, lookups, int(at.numel()), int(lk.filled.sum()))


def _place_misses(st: State, lk: _Lookup, new: torch.Tensor):
    """Record each miss's token in its slot of the new order; returns (at: the misses' flat entry
    indices, in entry order; row: their rows in the pass; slot: the slots they take), int64 [m].
    The i-th miss of a row takes the i-th evictable of the old order, which the new order holds at
    i - filled, or evictable - filled + i when i < filled (both releases)."""
    g, k = lk.served.shape
    B = st.B
    at = _compact(lk.misses_upto, lk.miss, int(lk.real.sum()))
    row = torch.bitwise_right_shift(at, k.bit_length() - 1) if k & (k - 1) == 0 else at // k
    place = lk.misses_upto.view(-1).index_select(0, at).long().sub_(1).sub_(lk.filled.index_select(0, row))
    place.add_(torch.bitwise_right_shift(place, 63).bitwise_and_((B - lk.n_hit).index_select(0, row)))
    place.add_(row * B)
    slot = new.view(-1).index_select(0, place).to(I32).long()
    host = lk.flat.view(-1).index_select(0, at)
    new.view(-1).index_copy_(0, place, torch.bitwise_left_shift(host, SLOT_BITS).bitwise_or_(slot))
    return at, row, slot


def _stale_copies(st: State, lk: _Lookup, rid, new, src, dst):
    """0.5.12's copies past the misses: copy m (misses <= m < filled) reads its scratch entry m,
    which still holds entry m's position if entry m was a miss (else the -1 marker: the word
    before the request's host table, not copied here), into the evictable of rank m (at
    evictable - filled + m of the new order)."""
    col = torch.arange(lk.served.shape[1], device=src.device)
    stale = (col >= lk.real[:, None]) & (col < lk.filled[:, None]) & lk.miss.bool()
    if not bool(stale.any()):
        return src, dst
    r, c = stale.nonzero(as_tuple=True)
    slot = new[r, st.B - lk.n_hit[r] - lk.filled[r] + c].to(I32).long()
    return torch.cat([src, lk.flat[r, c]]), torch.cat([dst, rid[r] * st.W + slot])
