"""The translation state of a HotBuffer, as SGLang's coordinator keeps it for one layer, held as
whole-batch tensors on the buffer's device.

``R`` = num_requests, ``S`` = max_seq_len, ``B`` = buffer_size, ``P`` = page_size, ``W = B + P``.

``slot_row``  int32 ``[R, B]``: the flat host row ``r * S + p`` of the token each LRU slot holds
              (SGLang's ``req_device_buffer_tokens``), ``sink = R * S`` where empty. Two slots
              may hold one token (a position asked twice in a step takes two slots, as in SGLang).
``lru``       int64 ``[R, B]``: each request's slots, least- to most-recently used (SGLang's
              ``lru_slots``).
``newest``    int64 ``[R]``: the position whose row the reserved slot ``B`` holds, -1 if none.
``seq_len``   int64 ``[R]``: the last seq_len translated; 0 for a request not admitted yet.
``entry_of``  int32 ``[R * S + 1]``: scratch, all zero between steps: during a step, the column
              + 1 of the last top-k entry asking for each flat host row (SGLang's shared-memory
              hash from token to top-k index).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["State"]


@dataclass
class State:
    R: int
    S: int
    B: int
    P: int
    device: torch.device
    release: str
    slot_row: torch.Tensor = None
    lru: torch.Tensor = None
    newest: torch.Tensor = None
    seq_len: torch.Tensor = None
    entry_of: torch.Tensor = None

    def __post_init__(self):
        dev = self.device
        self.slot_row = torch.full((self.R, self.B), self.sink, dtype=torch.int32, device=dev)
        self.lru = torch.arange(self.B, device=dev).repeat(self.R, 1)
        self.newest = torch.full((self.R,), -1, dtype=torch.int64, device=dev)
        self.seq_len = torch.zeros(self.R, dtype=torch.int64, device=dev)
        self.entry_of = torch.zeros(self.R * self.S + 1, dtype=torch.int32, device=dev)

    @property
    def W(self) -> int:
        return self.B + self.P

    @property
    def sink(self) -> int:
        return self.R * self.S

    def forget(self, rid: torch.Tensor) -> None:
        """SGLang's request_finished: the requests' slots empty, their LRU order reset, not admitted."""
        self.slot_row[rid] = self.sink
        self.lru[rid] = torch.arange(self.B, device=self.device)
        self.newest[rid] = -1
        self.seq_len[rid] = 0

    def tensors(self) -> dict:
        """Every tensor the state holds (for the memory accounting)."""
        return {"slot_row": self.slot_row, "lru": self.lru, "newest": self.newest, "seq_len": self.seq_len,
                "entry_of": self.entry_of}
