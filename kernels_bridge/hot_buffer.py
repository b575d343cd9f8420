"""HiSparse hot buffer: a per-request device cache of KV rows fed from a host pool.

HiSparse keeps the full KV cache of every request in host memory and gives each request a
fixed-size region of device rows, the *hot buffer*. Every decode step the sparse indexer picks
``top_k`` token positions per request; :meth:`HotBuffer.translate` makes those rows resident
(copying only what is missing, host -> device) and returns flat row indices into
:attr:`HotBuffer.buffer`, which FlashMLA's sparse kernels consume as they are. The semantics are
those of SGLang's HiSparse swap-in kernel (``jit_kernel/csrc/hisparse.cuh``,
``load_cache_to_device_buffer_kernel``) and coordinator (``managers/hisparse_coordinator.py``);
one :class:`HotBuffer` models one layer's KV cache.

Notation: ``R`` = num_requests, ``S`` = max_seq_len, ``B`` = buffer_size, ``P`` = page_size,
``W = B + P`` rows per request, ``row`` = ``[576]`` bfloat16 or ``[656]`` uint8 (FP8 V3.2 row).

Data structures
---------------
``host_pool``    ``[R, S, *row]`` on the CPU (pinned when the buffer is on CUDA): row ``[r, p]``
                 is the KV of token position ``p`` of request ``r``. Treated as append-only while
                 a request lives: rows below a request's ``seq_len`` must not change.
``buffer``       ``[R * W, *row]`` on the device. Request ``r`` owns rows ``r*W .. r*W + W - 1``;
                 its local slots ``0 .. B-1`` are LRU-managed, slot ``B`` is reserved for the
                 newest token (position ``seq_len - 1``), slots ``B+1 .. W-1`` pad the region to
                 whole pages so that the buffer views as FlashMLA's paged cache. Rows never
                 loaded are zero.
``_slot_row``    int32 ``[R, B]``: flat host row ``r * S + p`` of the position held by each LRU
                 slot, the sink index ``R * S`` (below) if empty: an eviction clears the
                 occupant's ``_pos_slot`` entry with no arithmetic, an empty slot's lands on
                 the sink.
``_pos_slot``    int16 (CPU, B < 2**15) or int32 ``[R * S + 1]``: the inverse map, flat index
                 ``r * S + p`` -> LRU slot holding that position, -1 if none; the last entry is
                 a sink that stays -1, so masked lookups and writes need no branches.
                 ``_slot_row`` and ``_pos_slot`` are always exact inverses on their resident
                 entries: a hit test is one gather, an eviction two scatters.
``_lru``         ``[R, B]``: each request's LRU slots ordered least- to most-recently used
                 (SGLang's ``lru_slots``), a strict total order; eviction takes from the front.
                 int64 for the tensor code (an index), else the dtype of ``_pos_slot``.
``_newest_pos``  int64 ``[R]``: position held by the reserved slot, -1 if none.
``_seq_len``     int64 ``[R]``: the last seq_len seen, to notice a rollback cheaply.

Translation, per request. Long requests' bookkeeping runs in C on the CPU where
``hot_buffer_lru.c`` was built (``native.py``), one request at a time; elsewhere, and for short
requests, all requests of a call are processed together with batched tensor ops (no Python loop
over requests or tokens). Both give the same answers:

* ``seq_len <= B`` (short): slot = position. As in SGLang, where a short request's whole prefix
  lives in its buffer in order (prefill writes it, decode appends in place), every position
  ``0 .. seq_len-1`` is made resident in its own slot; rows not yet there are copied from the
  host. The LRU order is left untouched, as in SGLang's fast path, so a request that grows
  past ``B`` starts its long phase with positions ``0 .. B-1`` resident in slots ``0 .. B-1``.
* ``seq_len > B`` (long): the newest token maps to the reserved slot (copied there whenever the
  newest position changed, requested or not). Every other requested position that is resident
  keeps its slot (a hit). The misses, taken in order of first appearance in the row, take the
  least-recently-used slots not hit this step, the i-th miss the i-th such slot; only they are
  copied. The new LRU order is SGLang's: untouched slots first (in their old order), then the
  slots just filled (in miss order), then the slots hit (in their old order).
* ``-1`` is padding and maps to ``-1``; duplicates of a position map to its one slot.
* A ``seq_len`` below the previous one (a speculative rollback) forgets the positions at and
  beyond it first: their host rows are about to be rewritten. :meth:`HotBuffer.truncate` does
  the same explicitly; :meth:`HotBuffer.free` forgets a whole request.

Every argument is validated before any state changes, so a translate either applies fully or
raises :class:`HotBufferError` and leaves the buffer, the maps and the statistics as they were.

All the copies of one translate are one gather from the host pool into a reused staging buffer
(pinned for CUDA) and one scatter into the buffer per staging chunk of at most 8 MiB, moving
rows as int64 words. A ``HotBuffer`` is not thread-safe, and its data-dependent shapes keep it
out of CUDA graphs.
"""
from __future__ import annotations

import numbers
import operator
from dataclasses import dataclass
from typing import Iterable, Optional, Union

import torch

from kernels_bridge.errors import ValidationError, describe, shown
from kernels_bridge.fp8 import D_QK, FP8_ROW_BYTES
from kernels_bridge.layout import STAGING_BYTES, hot_buffer_bytes, slot_bytes
from kernels_bridge.resources import format_bytes, memory_budget, resolve_device
from kernels_bridge.validate import INT32_MAX

__all__ = ["HotBuffer", "HotBufferError", "HotBufferStats", "ROW_LAYOUTS"]

# KV row layouts the hot buffer carries: dtype -> (row shape, name). A copy is a plain row copy.
ROW_LAYOUTS = {
    torch.bfloat16: ((D_QK,), "bf16"),  # 512 NoPE + 64 RoPE dims, 1152 bytes
    torch.uint8: ((FP8_ROW_BYTES,), "fp8"),  # V3.2 FP8 row: 512 fp8 + 4 f32 scales + 64 bf16, 656 bytes
}

_INT_DTYPES = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)
_STAGING_BYTES = STAGING_BYTES


class HotBufferError(ValidationError):
    """An argument of :class:`HotBuffer` is invalid; the message names it, what it got and what
    was expected. Raised before any state changes. A ValidationError, so a BridgeError and a
    ValueError."""


@dataclass(frozen=True)
class HotBufferStats:
    """Cumulative counters of a :class:`HotBuffer` since creation or :meth:`HotBuffer.reset_stats`.

    ``hits`` and ``misses`` count distinct valid positions per request per translate (a position
    requested twice in one row counts once; padding never counts), the newest token of a long
    request included: a hit was resident before the call, a miss was copied by it.
    ``rows_copied`` counts every host -> device row copy: the misses plus the rows copied without
    being requested (the rest of a short request's prefix, a newest token outside the top-k).
    """

    steps: int = 0
    hits: int = 0
    misses: int = 0
    rows_copied: int = 0
    bytes_copied: int = 0

    @property
    def hit_rate(self) -> float:
        """hits / (hits + misses); 0.0 before any lookup."""
        total = self.hits + self.misses
        return self.hits / total if total else 0.0


IntArg = Union[int, Iterable[int], torch.Tensor]


def _slot_dtype(device: torch.device, buffer_size: int) -> torch.dtype:
    """The dtype of the position -> slot map (layout.slot_bytes says which)."""
    return torch.int16 if slot_bytes(device.type, buffer_size) == 2 else torch.int32


class HotBuffer:
    """HiSparse host pool + per-request device hot buffer + LRU translation of top-k positions.

    Args:
        host_pool: ``[num_requests, max_seq_len, 576]`` bfloat16 or ``[num_requests,
            max_seq_len, 656]`` uint8 (FP8 rows viewed as bytes), contiguous, on the CPU. Kept by
            reference; when ``device`` is CUDA and the tensor is not pinned, a pinned copy is
            made: write new tokens through :attr:`host_pool` then.
        buffer_size: LRU slots per request (SGLang's ``device_buffer_size``, default there
            ``2 * top_k``); a positive multiple of ``page_size``.
        device: device of :attr:`buffer` and of the translation state; default the host pool's.
        page_size: rows per page of the paged view (64 for FlashMLA); also the size of the extra
            page each request gets for its newest token.
        max_bytes: the most the buffer and its translation state may take on ``device``
            (default: ``resources.memory_budget``, half of what can still be allocated there);
            a larger request is refused before anything is allocated.
    """

    def __init__(
        self,
        host_pool: torch.Tensor,
        buffer_size: int,
        device: Union[str, torch.device, None] = None,
        page_size: int = 64,
        max_bytes: Optional[int] = None,
    ) -> None:
        if not isinstance(host_pool, torch.Tensor):
            raise HotBufferError(
                f"host_pool: expected a torch.Tensor [num_requests, max_seq_len, 576] bfloat16 "
                f"or [num_requests, max_seq_len, 656] uint8, got {describe(host_pool)}"
            )
        layout = ROW_LAYOUTS.get(host_pool.dtype)
        expected = "[num_requests, max_seq_len, 576] bfloat16 or [num_requests, max_seq_len, 656] uint8"
        if layout is None:
            hint = (
                " (view an FP8 cache as bytes: .view(torch.uint8))"
                if host_pool.dtype in (torch.float8_e4m3fn, torch.int8)
                else ""
            )
            raise HotBufferError(f"host_pool: {describe(host_pool)}; expected {expected}{hint}")
        row_shape, kind = layout
        if host_pool.dim() != 2 + len(row_shape) or tuple(host_pool.shape[2:]) != row_shape:
            raise HotBufferError(f"host_pool: {describe(host_pool)}; expected {expected}")
        if host_pool.shape[0] < 1 or host_pool.shape[1] < 1:
            raise HotBufferError(
                f"host_pool: {describe(host_pool)}; expected num_requests >= 1 and max_seq_len >= 1"
            )
        if host_pool.device.type != "cpu":
            raise HotBufferError(
                f"host_pool: {describe(host_pool)}; expected a CPU tensor (the host pool)"
            )
        if not host_pool.is_contiguous():
            raise HotBufferError(
                f"host_pool: {describe(host_pool)} is not contiguous; expected a contiguous tensor "
                f"(rows are copied by flat index)"
            )
        for name, value in (("buffer_size", buffer_size), ("page_size", page_size)):
            try:
                ok = not isinstance(value, bool) and operator.index(value) >= 1
            except TypeError:
                ok = False
            if not ok:
                raise HotBufferError(f"{name}: got {shown(value)}; expected an int >= 1")
        buffer_size, page_size = operator.index(buffer_size), operator.index(page_size)
        if buffer_size % page_size:
            raise HotBufferError(
                f"buffer_size: got {buffer_size}; expected a multiple of page_size {page_size} "
                f"so that every request's region is page-aligned for the paged view"
            )
        dev = resolve_device(device if device is not None else host_pool.device, "device",
                             HotBufferError)

        num_requests, max_seq_len = int(host_pool.shape[0]), int(host_pool.shape[1])
        rows_per_request = buffer_size + page_size
        if num_requests * max_seq_len >= INT32_MAX:
            raise HotBufferError(
                f"host_pool: {describe(host_pool)}; expected num_requests * max_seq_len < "
                f"{INT32_MAX} (positions are indexed as int32)"
            )
        if num_requests * rows_per_request > INT32_MAX:
            raise HotBufferError(
                f"num_requests * (buffer_size + page_size) = {num_requests * rows_per_request}; "
                f"expected <= {INT32_MAX} (translated rows are int32)"
            )
        need = self.bytes_needed(num_requests, max_seq_len, buffer_size, page_size,
                                 host_pool.element_size() * row_shape[0], dev)
        if max_bytes is not None and (isinstance(max_bytes, bool) or not isinstance(max_bytes, numbers.Integral)
                                      or max_bytes < 1):
            # NaN compares false with everything (it would skip the budget); '1G' is not a size here
            raise HotBufferError(f"max_bytes: expected a positive whole number of bytes, got {shown(max_bytes)} "
                                 f"({type(max_bytes).__name__})", argument="max_bytes")
        limit, source = (int(max_bytes), "max_bytes") if max_bytes is not None else memory_budget(dev)
        if need > limit:
            raise HotBufferError(
                f"buffer_size: {buffer_size} slots x {num_requests} requests need {format_bytes(need)} "
                f"on {dev} (buffer rows and translation state); the limit is {format_bytes(limit)} "
                f"({source})")
        if dev.type == "cuda" and not host_pool.is_pinned():
            host_pool = host_pool.pin_memory()

        self._host_pool = host_pool
        self._host_rows = host_pool.view(num_requests * max_seq_len, *row_shape)
        self._row_shape = row_shape
        self._kind = kind
        self._num_requests = num_requests
        self._max_seq_len = max_seq_len
        self._buffer_size = buffer_size
        self._page_size = page_size
        self._stride = rows_per_request
        self._device = dev
        self._row_bytes = host_pool.element_size() * row_shape[0]

        self._buffer = torch.zeros(
            (num_requests * rows_per_request, *row_shape), dtype=host_pool.dtype, device=dev
        )
        self._sink = num_requests * max_seq_len  # the trailing entry of _pos_slot, always -1
        self._slot_row = torch.full((num_requests, buffer_size), self._sink, dtype=torch.int32, device=dev)
        # flat, index r * S + p, plus one trailing sink entry that always reads -1. On the CPU
        # int16 (as SGLang's lru_slots) when slot numbers fit: half the bytes of the largest
        # table, so its random gathers hit the cache more; elsewhere int32 (portable atomics).
        self._slot_dtype = _slot_dtype(dev, buffer_size)
        self._pos_slot = torch.full(
            (num_requests * max_seq_len + 1,), -1, dtype=self._slot_dtype, device=dev
        )
        self._false = torch.zeros((), dtype=torch.bool, device=dev)
        self._lru_init = torch.arange(buffer_size, device=dev, dtype=torch.int64)
        self._lru = self._lru_init.repeat(num_requests, 1)
        self._newest_pos = torch.full((num_requests,), -1, dtype=torch.int64, device=dev)
        self._seq_len = torch.zeros((num_requests,), dtype=torch.int64, device=dev)
        self._stats = [0, 0, 0, 0, 0]  # steps, hits, misses, rows, bytes

        # Copies move whole int64 words when the rows allow it (exact, much faster than bytes).
        self._copy_src, self._copy_dst = self._host_rows, self._buffer
        if self._row_bytes % 8 == 0:
            try:
                self._copy_src = self._host_rows.view(torch.int64)
                self._copy_dst = self._buffer.view(torch.int64)
            except RuntimeError:  # a host pool at an unaligned storage offset: copy bytes
                self._copy_src, self._copy_dst = self._host_rows, self._buffer
        # Reused staging for the gathered rows: a fresh large allocation per call would cost
        # more in page faults than the copy itself. At most _STAGING_BYTES, copied in chunks.
        self._staging = None
        self._staging_rows = max(1, _STAGING_BYTES // self._row_bytes)
        self._copy_done = None  # CUDA event of the last host -> device copy from the staging
        # The LRU bookkeeping's [n, B] temporaries live here between steps (_scratch): a fresh
        # multi-megabyte tensor per step costs more in page faults than the arithmetic done in it.
        self._scratch: dict = {}
        self._scratch_views: dict = {}
        self._init_tensor_path()

    def _init_tensor_path(self) -> None:
        """The constants and the second LRU order only the tensor bookkeeping uses."""
        dev, cells = self._device, self._num_requests * self._buffer_size
        self._arange32 = self._lru_init.to(torch.int32)
        self._all_requests = torch.arange(self._num_requests, device=dev)
        self._lru_next = torch.empty_like(self._lru)  # a whole-batch step writes the new order here
        # Constant [R * B] vectors a step takes prefixes of: entry ids, the tags that test the
        # misses for repeats (entry id mod 2**15 for int16: distinct within a row, top_k <= B),
        # and the 1 a scatter writes (a tensor source scatters several times faster than a scalar).
        self._iota = torch.arange(cells, dtype=torch.int64, device=dev)
        tag_mask = 0x7FFF if self._slot_dtype == torch.int16 else INT32_MAX
        self._tags = (self._iota & tag_mask).to(self._slot_dtype)
        self._ones = torch.ones(cells, dtype=torch.int32, device=dev)

    @staticmethod
    def bytes_needed(num_requests: int, max_seq_len: int, buffer_size: int, page_size: int,
                     row_bytes: int, device=None) -> int:
        """Bytes a HotBuffer of these sizes allocates on its device: the rows, the slot/position
        maps and LRU order, the staging of a copy."""
        return hot_buffer_bytes(num_requests, max_seq_len, buffer_size, page_size, row_bytes,
                                torch.device(device or "cpu").type)

    # ------------------------------------------------------------------ properties
    @property
    def buffer(self) -> torch.Tensor:
        """The device rows ``[num_requests * (buffer_size + page_size), *row]``; request ``r``
        owns rows ``r * rows_per_request ..``, its reserved newest-token row is
        ``r * rows_per_request + buffer_size``. Rows never loaded are zero."""
        return self._buffer

    @property
    def host_pool(self) -> torch.Tensor:
        """The host pool ``[num_requests, max_seq_len, *row]`` this buffer copies from."""
        return self._host_pool

    @property
    def kv_format(self) -> str:
        """``"bf16"`` (576 bfloat16 per row) or ``"fp8"`` (656 bytes per row)."""
        return self._kind

    @property
    def num_requests(self) -> int:
        return self._num_requests

    @property
    def max_seq_len(self) -> int:
        return self._max_seq_len

    @property
    def buffer_size(self) -> int:
        return self._buffer_size

    @property
    def page_size(self) -> int:
        return self._page_size

    @property
    def rows_per_request(self) -> int:
        """``buffer_size + page_size``: the rows of one request's region."""
        return self._stride

    @property
    def row_bytes(self) -> int:
        """Bytes per KV row: 1152 (bf16) or 656 (fp8)."""
        return self._row_bytes

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def stats(self) -> HotBufferStats:
        """Cumulative :class:`HotBufferStats`."""
        return HotBufferStats(*self._stats)

    def reset_stats(self) -> None:
        """Zero the statistics; residency is kept."""
        self._stats = [0, 0, 0, 0, 0]

    def row_range(self, req_id: int) -> range:
        """Flat buffer rows owned by ``req_id``; its reserved newest-token row is
        ``row_range(r).start + buffer_size``."""
        r = self._check_req_scalar(req_id)
        return range(r * self._stride, (r + 1) * self._stride)

    def paged_view(self) -> torch.Tensor:
        """The buffer in the layout the FlashMLA sparse kernels read; shares storage.

        Returns:
            fp8: uint8 ``[num_pages, page_size, 1, 656]`` (flashmla_kv's paged k_cache; the flat
            row index ``page * page_size + offset`` is exactly what :meth:`translate` returns).
            bf16: bfloat16 ``[rows, 1, 576]`` (flashmla_sparse's kv).
        """
        if self._kind == "fp8":
            return self._buffer.view(-1, self._page_size, 1, self._row_shape[0])
        return self._buffer.view(-1, 1, self._row_shape[0])

    def slot_positions(self, req_id: int) -> torch.Tensor:
        """int64 ``[buffer_size + 1]``: the position held by each LRU slot of ``req_id`` and, last,
        by its reserved slot; -1 where empty. A copy."""
        r = self._check_req_scalar(req_id)
        rows = self._slot_row[r].long()
        pos = torch.where(rows == self._sink, -1, rows - r * self._max_seq_len)
        return torch.cat([pos, self._newest_pos[r : r + 1]]).cpu()

    def lru_order(self, req_id: int) -> torch.Tensor:
        """int64 ``[buffer_size]``: the LRU slots of ``req_id``, least- to most-recently used
        (eviction takes from the front). A copy."""
        r = self._check_req_scalar(req_id)
        return self._lru[r].to("cpu", torch.int64, copy=True)

    # ------------------------------------------------------------------ lifecycle
    def free(self, req_ids: IntArg) -> None:
        """Forget the residency of the given requests (SGLang's ``request_finished``): their slots
        become empty, their LRU order returns to ``0 .. buffer_size-1`` and the next translate of
        each starts cold, so the region can serve a new request whose rows are now in
        ``host_pool[r]``. Buffer bytes are left as they are (never read before being rewritten).

        Args:
            req_ids: an int, or ints ``[n]`` (an integer tensor or a sequence); repeats are
                harmless.
        """
        rid = self._check_req_list(req_ids)
        if rid.numel() == 0:
            return
        rid = rid.to(self._device)
        self._slot_row[rid] = self._sink
        self._pos_slot[:-1].view(self._num_requests, self._max_seq_len)[rid] = -1
        self._lru[rid] = self._lru_init
        self._newest_pos[rid] = -1
        self._seq_len[rid] = 0

    def truncate(self, req_id: int, seq_len: int) -> None:
        """Forget the positions ``>= seq_len`` of ``req_id`` (a speculative rollback), before the
        host rows there are rewritten. A translate at a smaller seq_len does the same by itself;
        call this when the rows change before the next translate sees the shorter length.

        Args:
            req_id: an int in ``[0, num_requests)``.
            seq_len: an int in ``[0, max_seq_len]``; 0 forgets every position.
        """
        r = self._check_req_scalar(req_id)
        if isinstance(seq_len, bool) or not isinstance(seq_len, int) or not (
            0 <= seq_len <= self._max_seq_len
        ):
            raise HotBufferError(
                f"seq_len: got {shown(seq_len)}; expected an int in [0, {self._max_seq_len}]"
            )
        rid = torch.tensor([r], device=self._device)
        lens = torch.tensor([seq_len], device=self._device)
        self._forget_beyond(rid, lens)
        self._seq_len[r] = min(int(self._seq_len[r]), seq_len)

    def reset(self) -> None:
        """Free every request and zero the statistics."""
        self.free(torch.arange(self._num_requests))
        self.reset_stats()

    # ------------------------------------------------------------------ translate
    def translate(
        self, req_ids: torch.Tensor, seq_lens: torch.Tensor, positions: torch.Tensor
    ) -> torch.Tensor:
        """Make the top-k rows resident and return their flat buffer rows.

        Args:
            req_ids: int ``[n]``, distinct request ids in ``[0, num_requests)``.
            seq_lens: int ``[n]``, current length of each request, ``1 <= seq_len <= max_seq_len``.
                It may shrink (a speculative rollback): positions ``>= seq_len`` are then
                forgotten, because their host rows will be rewritten.
            positions: int ``[n, top_k]``, request-local token positions, ``-1`` for padding,
                otherwise ``0 <= position < seq_len``; ``top_k <= buffer_size``.
            Any integer dtype, on the CPU or the buffer's device.

        Returns:
            int32 ``[n, top_k]`` on the buffer's device: the row of :attr:`buffer` holding each
            position (within the request's region), ``-1`` where the input was ``-1``.

        Raises:
            HotBufferError: before any state change, on a bad argument.
        """
        rid, lens, pos, row_max, facts = self._validate(req_ids, seq_lens, positions)
        return self._apply(rid, lens, pos, row_max, facts)

    # ------------------------------------------------------------------ validation
    def _check_req_scalar(self, req_id) -> int:
        if isinstance(req_id, torch.Tensor) and req_id.numel() == 1 and req_id.dtype in _INT_DTYPES:
            req_id = int(req_id)
        if isinstance(req_id, bool) or not isinstance(req_id, int):
            raise HotBufferError(f"req_id: got {shown(req_id)}; expected an int in [0, {self._num_requests})")
        if not 0 <= req_id < self._num_requests:
            raise HotBufferError(f"req_id: got {req_id}; expected an int in [0, {self._num_requests})")
        return req_id

    def _check_req_list(self, req_ids) -> torch.Tensor:
        if isinstance(req_ids, int) and not isinstance(req_ids, bool):
            return torch.tensor([self._check_req_scalar(req_ids)])
        if isinstance(req_ids, torch.Tensor):
            if req_ids.dtype not in _INT_DTYPES or req_ids.dim() > 1:
                raise HotBufferError(
                    f"req_ids: {describe(req_ids)}; expected an int or an integer tensor [n]"
                )
            rid = req_ids.reshape(-1).to("cpu", torch.int64)
        else:
            try:
                items = list(req_ids)
            except TypeError:
                raise HotBufferError(
                    f"req_ids: got {shown(req_ids)}; expected an int or a sequence of ints"
                ) from None
            for v in items:
                self._check_req_scalar(v)
            rid = torch.tensor(items, dtype=torch.int64)
        bad = (rid < 0) | (rid >= self._num_requests)
        if bool(bad.any()):
            i = int(bad.nonzero()[0, 0])
            raise HotBufferError(
                f"req_ids: element {i} is {int(rid[i])}; expected ids in [0, {self._num_requests})"
            )
        return rid

    def _int_tensor(self, name: str, t, ndim: int, shape_doc: str) -> torch.Tensor:
        if not isinstance(t, torch.Tensor):
            raise HotBufferError(
                f"{name}: got {describe(t)}; expected an integer torch.Tensor {shape_doc}"
            )
        if t.dtype not in _INT_DTYPES:
            raise HotBufferError(f"{name}: {describe(t)}; expected an integer tensor {shape_doc}")
        if t.dim() != ndim:
            raise HotBufferError(f"{name}: {describe(t)}; expected {ndim}-D {shape_doc}")
        if t.device.type not in ("cpu", self._device.type) or t.is_meta or t.layout != torch.strided:
            raise HotBufferError(
                f"{name}: {describe(t)}, layout {t.layout}; expected a dense tensor on the "
                f"CPU or {self._device}"
            )
        return t.to(self._device)

    def _validate(self, req_ids, seq_lens, positions):
        """Check everything a translate needs; returns rid int64 [n], lens int64 [n],
        pos int32 [n, k] on the device (int32 once its range is known to fit), the largest
        position of each row, int64 [n] (-1 for an empty top-k), and (short rows, a rollback)
        where the C check found them, else None."""
        rid = self._int_tensor("req_ids", req_ids, 1, "[n]")
        n = rid.shape[0]
        lens = self._int_tensor("seq_lens", seq_lens, 1, f"[n] with n = {n}")
        if lens.shape[0] != n:
            raise HotBufferError(
                f"seq_lens: {describe(seq_lens)}; expected [{n}] (one per req_id)"
            )
        pos = self._int_tensor("positions", positions, 2, f"[n, top_k] with n = {n}")
        if pos.shape[0] != n:
            raise HotBufferError(
                f"positions: {describe(positions)}; expected [{n}, top_k] (one row per req_id)"
            )
        top_k = pos.shape[1]
        if top_k > self._buffer_size:
            raise HotBufferError(
                f"positions: {describe(positions)}; expected top_k <= buffer_size "
                f"{self._buffer_size}"
            )
        rid, lens = rid.long(), lens.long()
        if n == 0 or top_k == 0:
            low = high = self._false
            row_max = torch.full((n,), -1, dtype=torch.int64, device=self._device)
        else:
            # a whole-tensor aminmax and a per-row amax: both several times cheaper than amin
            low = torch.aminmax(pos).min < -1
            row_max = pos.amax(1).long()  # also says which rows ask for their newest token
            high = (row_max >= lens).any()
        # All range checks in one host sync; details are computed only on the error path.
        bad_rid = (rid < 0) | (rid >= self._num_requests)
        srt = torch.sort(rid).values
        dup = srt[1:] == srt[:-1]
        bad_len = (lens < 1) | (lens > self._max_seq_len)
        flags = torch.stack([bad_rid.any(), dup.any(), bad_len.any(), low, high])
        f_rid, f_dup, f_len, f_low, f_high = flags.tolist()
        if f_rid:
            i = int(bad_rid.nonzero()[0, 0])
            raise HotBufferError(
                f"req_ids: element {i} is {int(rid[i])}; expected ids in [0, {self._num_requests})"
            )
        if f_dup:
            v = int(srt[1:][dup][0])
            raise HotBufferError(
                f"req_ids: request {v} appears more than once; expected distinct requests per call"
            )
        if f_len:
            i = int(bad_len.nonzero()[0, 0])
            raise HotBufferError(
                f"seq_lens: element {i} (request {int(rid[i])}) is {int(lens[i])}; expected "
                f"1 <= seq_len <= max_seq_len {self._max_seq_len}"
            )
        if f_low or f_high:
            p64 = pos.long()
            i, j = ((p64 < -1) | (p64 >= lens[:, None])).nonzero()[0].tolist()
            raise HotBufferError(
                f"positions: [{i}, {j}] (request {int(rid[i])}) is {int(p64[i, j])}; expected -1 "
                f"(padding) or 0 <= position < seq_len {int(lens[i])}"
            )
        return rid, lens, pos.to(torch.int32).contiguous(), row_max, None

    # ------------------------------------------------------------------ the work
    def _apply(self, rid: torch.Tensor, lens: torch.Tensor, pos: torch.Tensor,
               row_max: torch.Tensor, facts=None) -> torch.Tensor:
        """Translate validated inputs on the device: rid, lens, row_max int64 [n]; pos int32 [n, k];
        facts: (short rows, a rollback) where known."""
        n, top_k = pos.shape
        self._stats[0] += 1
        if n == 0:
            return torch.full((0, top_k), -1, dtype=torch.int32, device=self._device)
        if facts is None:
            last = self._seq_len.index_select(0, rid)
            facts = (None, bool((lens < last).any()))
        n_short, rollback = facts
        if rollback:
            self._forget_beyond(rid, lens)
        self._seq_len.index_copy_(0, rid, lens)

        if n_short is None:
            n_short = int((lens <= self._buffer_size).sum())
        if n_short in (0, n):  # one group: no splitting and merging
            fn = self._translate_short if n_short else self._translate_long_tensors
            out, src, dst, hits, misses = fn(rid, lens, pos, row_max)
        else:
            out = torch.empty((n, top_k), dtype=torch.int32, device=self._device)
            srcs, dsts, hits, misses = [], [], 0, 0
            short = lens <= self._buffer_size
            for rows, fn in (
                (short.nonzero().squeeze(1), self._translate_short),
                ((~short).nonzero().squeeze(1), self._translate_long_tensors),
            ):
                res, s, d, h, m = fn(rid[rows], lens[rows], pos[rows], row_max[rows])
                out[rows] = res
                srcs.append(s)
                dsts.append(d)
                hits, misses = hits + h, misses + m
            src, dst = torch.cat(srcs), torch.cat(dsts)
        if isinstance(hits, torch.Tensor):
            hits, misses = torch.stack([hits, misses]).tolist()  # one host read for both counters
        self._copy_rows(src, dst)
        self._stats[1] += hits
        self._stats[2] += misses
        self._stats[3] += src.numel()
        self._stats[4] += src.numel() * self._row_bytes
        return out

    def _forget_beyond(self, rid: torch.Tensor, lens: torch.Tensor) -> None:
        """Drop residency of positions >= seq_len (after a rollback their host rows change)."""
        rows = self._slot_row.index_select(0, rid).long()  # [n, B]
        stale = (rows >= (rid * self._max_seq_len + lens)[:, None]) & (rows != self._sink)
        i, s = stale.nonzero(as_tuple=True)
        self._pos_slot[rows[i, s]] = -1
        self._slot_row[rid[i], s] = self._sink
        newest = self._newest_pos[rid]
        self._newest_pos[rid] = torch.where(newest >= lens, -1, newest)

    def _translate_short(self, rid, lens, pos, row_max):
        """seq_len <= B: slot = position; make the whole prefix resident in order.

        rid, lens, row_max int64 [m] (row_max unused here); pos int32 [m, k]. Returns (out
        int32 [m, k], src int64 [c] flat host rows, dst int64 [c] buffer rows, hits, misses as
        0-d int64 tensors).
        """
        m = rid.shape[0]
        B, S = self._buffer_size, self._max_seq_len
        slots = self._lru_init  # arange(B)
        rows = self._slot_row.index_select(0, rid)  # [m, B]
        resident = rows == (rid * S)[:, None] + slots
        # requested[j, 1 + s]: position s is asked for (column 0 absorbs the padding)
        requested = torch.zeros((m, B + 1), dtype=torch.bool, device=self._device)
        requested.scatter_(1, (pos + 1).long(), True)
        requested = requested[:, 1:]
        hits = (requested & resident).sum()
        misses = (requested & ~resident).sum()

        fill = (slots < lens[:, None]) & ~resident
        j, s = fill.nonzero(as_tuple=True)
        r = rid[j]
        occupant = rows[j, s].long()  # host row now in slot s (to be evicted), or the sink
        wanted = r * S + s
        home = self._pos_slot[wanted].long()  # slot now holding position s elsewhere, or -1
        self._pos_slot[occupant] = -1  # the sink stays -1
        h = home >= 0
        self._slot_row[r[h], home[h]] = self._sink
        # set last: a filled slot may be another fill's old home, a filled position an occupant
        self._slot_row[r, s] = wanted.to(torch.int32)
        self._pos_slot[wanted] = s.to(self._slot_dtype)

        out = pos + (pos >= 0) * (rid * self._stride).to(torch.int32)[:, None]
        return out, r * S + s, r * self._stride + s, hits, misses

    def _translate_long_tensors(self, rid, lens, pos, row_max):
        """:meth:`_translate_long` in whole-batch tensor passes (other devices, or no C build).

        On the CPU the cost of this bookkeeping is memory traffic, so: every [g, k] and [g, B]
        temporary is scratch kept between steps, written with out= or in place (a fresh
        multi-megabyte tensor costs more in page faults than the arithmetic done in it); masks
        are int32 0/1 and selects multiplications by them, tests of a sign a shift by 31
        (comparisons writing bool and int64 arithmetic run several times slower); values turn
        int64 only where torch wants an index.
        """
        g, top_k = pos.shape
        n = g * top_k
        B, S, W = self._buffer_size, self._max_seq_len, self._stride
        i32, i64 = torch.int32, torch.int64
        ws = self._ws
        pos_slot = self._pos_slot  # [R * S + 1], index r * S + p; the last entry is a sink
        sink = self._sink
        whole = g == self._num_requests and bool(torch.equal(rid, self._all_requests))

        # Hit test: one gather of the slot of every candidate (not padding, not the newest
        # token, which has its own slot); everything else reads the sink's -1.
        newest = lens - 1
        is_newest = torch.eq(pos, newest.to(i32)[:, None], out=ws("is_newest", (g, top_k), i32))
        cand = torch.bitwise_right_shift(pos, 31, out=ws("cand", (g, top_k), i32))  # -1: padding
        cand.add_(1).sub_(is_newest)
        flat = torch.add(pos, (rid * S - sink).to(i32)[:, None], out=ws("flat", (g, top_k), i32))
        flat = flat.mul_(cand).add_(sink).view(-1)  # r * S + p for candidates, else the sink
        cur = ws("cur", (n,), i32).copy_(torch.index_select(pos_slot, 0, flat, out=ws("cur_raw", (n,), pos_slot.dtype)))
        miss = torch.bitwise_right_shift(cur, 31, out=ws("miss", (n,), i32))  # -1: no slot
        miss.mul_(cand.view(-1)).neg_()  # 1: a candidate without a slot (the sink reads -1)

        # The misses' entry ids in row-major order (row order ranks them, as in SGLang's
        # kernel), compacted by a running count and one scatter: cheaper than nonzero.
        count = torch.cumsum(miss, 0, dtype=i32, out=ws("count", (n,), i32))
        nm = int(count[-1]) if n else 0
        # misses per row from the running count at each row's end (a row sum of int32 is slow)
        ends = count.view(g, top_k)[:, -1].long() if n else torch.zeros(g, dtype=i64, device=self._device)
        count.sub_(nm + 1).mul_(miss).add_(nm)  # the i-th miss -> i, the rest -> nm (a dump)
        to = ws("index", (n,), i64).copy_(count)
        mi = ws("mi", (n + 1,), i64)[: nm + 1].scatter_(0, to, self._iota[:n])[:nm]
        m_flat32 = torch.index_select(flat, 0, mi)  # r * S + p, also the host row
        m_flat = m_flat32.long()

        # A missed position asked twice in a row takes one slot, at its first appearance. The
        # misses' _pos_slot entries are -1 and all get their slot below, so they serve as
        # scratch: tag each miss, read the tags back; all survive iff the positions are distinct.
        tags = self._tags[:nm]
        pos_slot.index_copy_(0, m_flat, tags)
        distinct = bool(torch.equal(pos_slot.index_select(0, m_flat), tags))
        if distinct:
            f_entry, f_flat, f_flat32 = mi, m_flat, m_flat32
            n_miss = torch.diff(ends, prepend=ends.new_zeros(1))  # int64 [g]
        else:  # first appearances: the least column per position (rows are distinct requests)
            m_col = (mi % top_k).to(pos_slot.dtype)  # top_k <= B fits the slot dtype
            pos_slot.scatter_reduce_(0, m_flat, m_col, reduce="amin", include_self=False)
            first = (pos_slot.index_select(0, m_flat) == m_col).nonzero().squeeze(1)
            f_entry, f_flat = mi.index_select(0, first), m_flat.index_select(0, first)
            f_flat32 = m_flat32.index_select(0, first)
            n_miss = torch.bincount(torch.div(f_entry, top_k, rounding_mode="floor"), minlength=g)
        if top_k & (top_k - 1):  # the row of each miss
            f_row = torch.div(f_entry, top_k, rounding_mode="floor")
        else:  # a power of two, as top-k usually is: a shift
            f_row = f_entry >> (top_k.bit_length() - 1)

        # needed[j, 1 + s]: slot s of row j is hit (column 0 absorbs the rest);
        # hit_in_order[j, t]: the t-th least-recently-used slot of row j is hit.
        needed = ws("needed", (g, B + 1), i32).zero_()
        at_slot = torch.add(cur, 1, out=to).view(g, top_k)  # the index buffer is free again
        needed.scatter_(1, at_slot, self._ones[:n].view(g, top_k))
        lru = self._lru if whole else torch.index_select(self._lru, 0, rid, out=ws("lru", (g, B), i64))
        hit_in_order = torch.gather(needed[:, 1:], 1, lru, out=ws("hit_in_order", (g, B), i32))
        hits_so_far = torch.cumsum(hit_in_order, 1, dtype=i32, out=ws("hits_so_far", (g, B), i32))
        n_hit = hits_so_far[:, -1:].clone()  # [g, 1]
        n_ev = B - n_hit  # >= misses, since distinct candidates <= top_k <= B

        # New LRU order (SGLang's): the evictables left over keep their order at the front, then
        # the slots just filled in miss order, then the hits in their old order. The i-th miss
        # takes the i-th least-recently-used evictable, so the filled slots are the first
        # evictables, rotated behind the rest: the evictable at t goes to (its rank - misses)
        # mod n_ev, its rank being t - hits_so_far; a hit goes to n_ev + its rank among the hits.
        stale = torch.sub(self._arange32, hits_so_far, out=ws("stale", (g, B), i32))
        stale.sub_(n_miss.to(i32)[:, None])
        wrap = torch.bitwise_right_shift(stale, 31, out=needed.view(-1)[: g * B].view(g, B))
        stale.add_(wrap.bitwise_and_(n_ev))  # -1 & n_ev: a filled slot goes behind the rest
        dest = hits_so_far.add_(n_ev - 1).sub_(stale).mul_(hit_in_order).add_(stale)
        lru_next = self._lru_next if whole else ws("lru_new", (g, B), i64)
        lru_next.scatter_(1, ws("dest", (g, B), i64).copy_(dest), lru)
        if whole:  # the new order was written beside the old one: swap, no copy
            self._lru, self._lru_next = self._lru_next, self._lru
        else:
            self._lru.index_copy_(0, rid, lru_next)

        # The filled slots now sit at columns n_ev - misses .. n_ev - 1 of their row, in miss
        # order: the i-th miss overall, of row j, reads column i + (n_ev - misses - misses
        # before row j) of row j.
        first_col = n_ev.squeeze(1) - n_miss - (n_miss.cumsum(0) - n_miss)
        at = (first_col + self._all_requests[:g] * B).index_select(0, f_row)
        at += self._iota[: f_entry.numel()]
        slot = lru_next.view(-1).index_select(0, at)  # [f]

        # Evict the occupants, place the misses.
        r = f_row if whole else rid.index_select(0, f_row)
        sr_idx = r * B + slot
        slot_row = self._slot_row.view(-1)
        pos_slot.index_fill_(0, slot_row.index_select(0, sr_idx).long(), -1)  # empty: the sink
        slot_row.index_copy_(0, sr_idx, f_flat32)
        slot32 = slot.to(i32)
        pos_slot.index_copy_(0, f_flat, slot32.to(pos_slot.dtype))

        # The reserved slot always holds the newest token.
        refresh = self._newest_pos.index_select(0, rid) != newest
        self._newest_pos.index_copy_(0, rid, newest)
        newest_asked = row_max == newest  # positions are below seq_len: asked iff the row's largest
        hits = n_hit.sum() + (newest_asked & ~refresh).sum()
        misses = n_miss.sum() + (newest_asked & refresh).sum()
        rr = rid[refresh]
        src = torch.cat([f_flat, rr * S + newest[refresh]])
        dst = torch.cat([r * W + slot, rr * W + B])

        # Output: hits keep the slot read above, misses (and their repeats) read their new one,
        # the newest token reads B (-1 + B + 1), padding stays -1; then the row's region.
        out = torch.add(cur.view(g, top_k), is_newest, alpha=B + 1)
        if distinct:
            out.view(-1).index_copy_(0, mi, slot32)
        else:
            out.view(-1).index_copy_(0, mi, pos_slot.index_select(0, m_flat).to(i32))
        region = torch.bitwise_right_shift(out, 31, out=cand).add_(1)  # 1: a row, 0: padding
        out.add_(region.mul_((rid * W).to(i32)[:, None]))
        return out, src, dst, hits, misses

    def _ws(self, name: str, shape: tuple, dtype: torch.dtype) -> torch.Tensor:
        """Scratch tensor `name` of `shape`, kept between steps (its contents are whatever the
        last step left). At most [num_requests, buffer_size + 1] each: bytes_needed counts them.
        The view of each (name, shape, dtype) is kept too: steps of one shape make no new views."""
        key = (name, shape, dtype)
        view = self._scratch_views.get(key)
        if view is not None:
            return view
        count = 1
        for n in shape:
            count *= n
        buf = self._scratch.get(name)
        if buf is None or buf.numel() < count or buf.dtype != dtype:
            buf = torch.empty(max(count, 1), dtype=dtype, device=self._device)
            self._scratch[name] = buf
            # views of the old block would keep it alive: drop them
            self._scratch_views = {k: v for k, v in self._scratch_views.items() if k[0] != name}
        if len(self._scratch_views) >= 256:  # many shapes seen: start over rather than grow
            self._scratch_views = {}
        view = self._scratch_views[key] = buf[:count].view(shape)
        return view

    def _copy_rows(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """buffer[dst[i]] = host_rows[src[i]] for all i: a gather into a staging buffer and one
        scatter per chunk of rows.

        src: int64 [c] flat host rows (r * max_seq_len + p); dst: int64 [c] distinct buffer rows.
        Rows move as int64 words where the layout allows (656 and 1152 bytes are whole words):
        an exact bit copy, several times faster than per-byte indexing.
        """
        total = src.numel()
        if total == 0:
            return
        src = src.cpu()
        chunk = min(total, self._staging_rows)
        if self._copy_done is not None:
            self._copy_done.synchronize()  # the last host -> device copy has read the staging
            self._copy_done = None
        if self._staging is None or self._staging.shape[0] < chunk:
            self._staging = None  # release the old block before allocating the larger one
            self._staging = torch.empty(
                (chunk, *self._copy_src.shape[1:]),
                dtype=self._copy_src.dtype,
                pin_memory=self._device.type == "cuda",
            )
        for start in range(0, total, chunk):
            stop = min(start + chunk, total)
            staging = self._staging[: stop - start]
            if self._copy_done is not None:
                self._copy_done.synchronize()
            torch.index_select(self._copy_src, 0, src[start:stop], out=staging)
            if self._device.type == "cpu":
                self._copy_dst.index_copy_(0, dst[start:stop], staging)
                continue
            rows = staging.to(self._device, non_blocking=True)
            self._copy_dst.index_copy_(0, dst[start:stop], rows)
            if self._device.type == "cuda":
                self._copy_done = torch.cuda.Event()
                self._copy_done.record()
