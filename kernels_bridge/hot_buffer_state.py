"""The translation state of a HotBuffer, as SGLang's coordinator keeps it for one layer, held as
whole-batch tensors on the buffer's device.

``R`` = num_requests, ``S`` = max_seq_len, ``B`` = buffer_size, ``P`` = page_size, ``W = B + P``.

``words``     int64 ``[R, B]``: each request's slots, least- to most-recently used (SGLang's
              ``lru_slots``), each packed with the token it holds (SGLang's
              ``req_device_buffer_tokens``, read in LRU order): ``host_row << 32 | slot``, the host
              row being the flat ``r * S + p``, or ``empty = R * S + B`` where the slot holds
              nothing. Two slots may hold one token (a position asked twice in a step takes two
              slots, as in SGLang). Packed, one scatter reorders both and the lookup reads the
              tokens in LRU order with a shift, not a gather.
``newest``    int64 ``[R]``: the position whose row the reserved slot ``B`` holds, -1 if none.
``seq_len``   int64 ``[R]``: the last seq_len translated; 0 for a request not admitted yet.
``entry_of``  int32 ``[R * S + B + 1]``: scratch, all zero between steps: during a step, the
              column + 1 of the last top-k entry asking for each flat host row (SGLang's
              shared-memory hash from token to top-k index). ``R * S + c`` is entry c's own dump
              when it asks for no host row (padding, the newest token); ``empty`` is never written.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["State", "SLOT_BITS"]

SLOT_BITS = 32  # a word's low half: its slot, read back by a cast to int32


@dataclass
class State:
    R: int
    S: int
    B: int
    P: int
    device: torch.device
    release: str
    words: torch.Tensor = None
    newest: torch.Tensor = None
    seq_len: torch.Tensor = None
    entry_of: torch.Tensor = None

    def __post_init__(self):
        dev = self.device
        self.words = self._packed(torch.full((self.R, self.B), self.empty, dtype=torch.int64, device=dev))
        self.newest = torch.full((self.R,), -1, dtype=torch.int64, device=dev)
        self.seq_len = torch.zeros(self.R, dtype=torch.int64, device=dev)
        self.entry_of = torch.zeros(self.R * self.S + self.B + 1, dtype=torch.int32, device=dev)

    @property
    def W(self) -> int:
        return self.B + self.P

    @property
    def dumps(self) -> int:
        """The first of the entries' dumps in entry_of."""
        return self.R * self.S

    @property
    def empty(self) -> int:
        """The host row an empty slot holds."""
        return self.R * self.S + self.B

    def _packed(self, rows: torch.Tensor) -> torch.Tensor:
        """rows int64 [n, B], the host row of slots 0..B-1 -> words in LRU order 0..B-1."""
        return torch.bitwise_left_shift(rows, SLOT_BITS).bitwise_or_(torch.arange(self.B, device=rows.device))

    def fill(self, rid: torch.Tensor, rows: torch.Tensor) -> None:
        """The requests' slots hold rows (int64 [n, B], by slot), in LRU order 0..B-1."""
        self.words[rid] = self._packed(rows)

    def forget(self, rid: torch.Tensor) -> None:
        """SGLang's request_finished: the requests' slots empty, their LRU order reset, not admitted."""
        self.fill(rid, torch.full((rid.numel(), self.B), self.empty, dtype=torch.int64, device=self.device))
        self.newest[rid] = -1
        self.seq_len[rid] = 0

    def lru(self, r: int) -> torch.Tensor:
        """int64 [B]: request r's slots, least- to most-recently used."""
        return self.words[r].to(torch.int32).long()

    def slot_rows(self, r: int) -> torch.Tensor:
        """int64 [B]: the host row each slot of request r holds, `empty` where none."""
        words = self.words[r]
        rows = torch.empty(self.B, dtype=torch.int64, device=words.device)
        return rows.index_copy_(0, words.to(torch.int32).long(), torch.bitwise_right_shift(words, SLOT_BITS))

    def tensors(self) -> dict:
        """Every tensor the state holds (for the memory accounting)."""
        return {"words": self.words, "newest": self.newest, "seq_len": self.seq_len, "entry_of": self.entry_of}
