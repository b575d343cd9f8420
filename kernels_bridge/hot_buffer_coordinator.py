"""What SGLang's coordinator does around the swap-in kernel (`srt/managers/hisparse_coordinator.py`):
it admits a request and writes each decode step's new token on the device. Nothing here is a
host -> device copy but the disaggregated admission of a short request, which SGLang preloads.

- Normal admission (`alloc_device_buffer`, after the request's own prefill): the prefill's device
  rows become the buffer, so slots 0..B-1 hold tokens 0..B-1 (those the prefill had; the rest are
  written as the request grows) and the LRU order is 0..B-1: the request starts warm.
- Disaggregated-decode admission (`admit_request_direct`, the prefill's KV arrived in host
  memory): a short request (prefill <= B tokens) is preloaded from the host into slots 0..n-1; a
  long one starts with every slot empty, so every first lookup misses.
- Each decode step's new token (position seq_len - 1) has its KV written by the forward pass at
  buffer position min(seq_len - 1, B): its own slot while the request is short, the reserved slot
  B once it is long (`map_last_loc_to_buffer`). A translate several tokens ahead of the last one
  stands for the steps in between: each of their tokens was written the same way.

A request's first translate admits it, with a prefill of seq_len - 1 tokens.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from kernels_bridge.hot_buffer_state import State

__all__ = ["Moves", "Writes", "admit_and_write"]


class Moves(NamedTuple):
    """Rows to move into the buffer: int64 [c] flat host rows and buffer rows."""
    src: torch.Tensor
    dst: torch.Tensor


class Writes(NamedTuple):
    """One step's rows before the kernel runs, in the order they are written: `prefilled` (a
    normal admission's prefill rows, the extra page's included), `preloaded` (a disaggregated
    short request's rows: host -> device copies), `placed` (every new token: written on the
    device, no host copy), and the counts."""
    prefilled: Moves
    preloaded: Moves
    placed: Moves
    tokens_written: int   # new tokens written on the device (one per decode step stood for)
    rows_preloaded: int


def _ranges(rid: torch.Tensor, start: torch.Tensor, stop: torch.Tensor, S: int, W: int) -> Moves:
    """Positions start[i] .. stop[i] - 1 of request rid[i] into slots of the same number."""
    length = (stop - start).clamp(min=0)
    total = int(length.sum())
    if total == 0:
        empty = torch.empty(0, dtype=torch.int64, device=rid.device)
        return Moves(empty, empty)
    which = torch.repeat_interleave(torch.arange(rid.shape[0], device=rid.device), length)
    first = torch.cumsum(length, 0) - length
    pos = start[which] + torch.arange(total, device=rid.device) - first[which]
    r = rid[which]
    return Moves(r * S + pos, r * W + pos)


def _cat(*moves: Moves) -> Moves:
    return Moves(torch.cat([m.src for m in moves]), torch.cat([m.dst for m in moves]))


def admit_and_write(st: State, rid: torch.Tensor, lens: torch.Tensor, admission: str) -> Writes:
    """Admit the requests seen for the first time, then write every new token; updates the
    state (words, newest, seq_len) and returns the rows to move."""
    B, S, W = st.B, st.S, st.W
    last = st.seq_len.index_select(0, rid)
    fresh = last == 0
    prefill = torch.where(fresh, lens - 1, last)  # tokens already in place before this step
    none = torch.empty(0, dtype=torch.int64, device=rid.device)
    placed, prefilled, preloaded = [Moves(none, none)], Moves(none, none), Moves(none, none)
    if bool(fresh.any()):
        fresh_rid = rid[fresh]
        n0 = prefill[fresh]
        # tokens 0..B-1 in slots 0..B-1 (positions past max_seq_len can never be asked: empty)
        slots = torch.arange(B, device=rid.device)
        rows = torch.where(slots < S, (fresh_rid * S)[:, None] + slots, st.empty)
        st.newest[fresh_rid] = -1
        if admission == "normal":  # the prefill's own rows, B + P of them at most
            prefilled = _ranges(fresh_rid, torch.zeros_like(n0), n0.clamp(max=W), S, W)
        else:
            short = n0 <= B
            preloaded = _ranges(fresh_rid[short], torch.zeros_like(n0[short]), n0[short], S, W)
            rows[~short] = st.empty  # every slot empty
        st.fill(fresh_rid, rows)
    # the new tokens: their own slots while short, the reserved slot B once long
    placed.append(_ranges(rid, prefill.clamp(max=B), lens.clamp(max=B), S, W))
    newest = lens - 1
    long_now = (newest >= B) & (st.newest.index_select(0, rid) != newest)
    if bool(long_now.any()):
        r = rid[long_now]
        placed.append(Moves(r * S + newest[long_now], r * W + B))
        st.newest[r] = newest[long_now]
    st.seq_len.index_copy_(0, rid, lens)
    return Writes(prefilled, preloaded, _cat(*placed), int((lens - prefill).sum()), int(preloaded.src.numel()))
