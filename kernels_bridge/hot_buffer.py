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
``_slot_pos``    int64 ``[R, B]``: position held by each LRU slot, -1 if empty.
``_pos_slot``    int32 ``[R, S]``: the inverse map, LRU slot holding each position, -1 if none.
                 ``_slot_pos`` and ``_pos_slot`` are always exact inverses on their resident
                 entries, so a hit test is one gather and an eviction is two scatters.
``_lru``         int64 ``[R, B]``: each request's LRU slots ordered least- to most-recently used
                 (SGLang's ``lru_slots``), a strict total order; eviction takes from the front.
``_newest_pos``  int64 ``[R]``: position held by the reserved slot, -1 if none.

Translation, per request (all requests of a call are processed together with batched tensor
ops; there is no Python loop over requests or tokens):

* ``seq_len <= B`` (short): slot = position. Like SGLang, where a short request's whole prefix
  lives in its buffer in order (prefill writes it, decode appends in place), every position
  ``0 .. seq_len-1`` is made resident in its own slot; rows not yet there are copied from the
  host. The LRU order is left untouched, as in SGLang's fast path.
* ``seq_len > B`` (long): the newest token maps to the reserved slot (copied there whenever the
  newest position changed, requested or not). Every other requested position that is resident
  keeps its slot (a hit). The misses, taken in order of first appearance in the row, take the
  least-recently-used slots not hit this step, the i-th miss the i-th such slot; only they are
  copied. The new LRU order is SGLang's: untouched slots first (in their old order), then the
  slots just filled (in miss order), then the slots hit (in their old order).
* ``-1`` is padding and maps to ``-1``; duplicates of a position map to its one slot.

Every argument is validated before any state changes, so a translate either applies fully or
raises :class:`HotBufferError` and leaves the buffer, the maps and the statistics as they were.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Union

import torch

__all__ = ["HotBuffer", "HotBufferError", "HotBufferStats", "ROW_LAYOUTS"]

# KV row layouts the hot buffer carries: dtype -> (row shape, name). A copy is a plain row copy.
ROW_LAYOUTS = {
    torch.bfloat16: ((576,), "bf16"),  # 512 NoPE + 64 RoPE dims, 1152 bytes
    torch.uint8: ((656,), "fp8"),  # V3.2 FP8 row: 512 fp8 + 4 f32 scales + 64 bf16, 656 bytes
}

_INT_DTYPES = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)
_INT32_MAX = 2**31 - 1


class HotBufferError(ValueError):
    """An argument of :class:`HotBuffer` is invalid; the message names it, what it got and what
    was expected. Raised before any state changes."""


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


def _describe(t: torch.Tensor) -> str:
    return f"shape {list(t.shape)} dtype {str(t.dtype).replace('torch.', '')}"


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
    """

    def __init__(
        self,
        host_pool: torch.Tensor,
        buffer_size: int,
        device: Union[str, torch.device, None] = None,
        page_size: int = 64,
    ) -> None:
        if not isinstance(host_pool, torch.Tensor):
            raise HotBufferError(
                f"host_pool: expected a torch.Tensor [num_requests, max_seq_len, 576] bfloat16 "
                f"or [num_requests, max_seq_len, 656] uint8, got {type(host_pool).__name__}"
            )
        layout = ROW_LAYOUTS.get(host_pool.dtype)
        expected = "[num_requests, max_seq_len, 576] bfloat16 or [num_requests, max_seq_len, 656] uint8"
        if layout is None:
            hint = (
                " (view an FP8 cache as bytes: .view(torch.uint8))"
                if host_pool.dtype in (torch.float8_e4m3fn, torch.int8)
                else ""
            )
            raise HotBufferError(f"host_pool: {_describe(host_pool)}; expected {expected}{hint}")
        row_shape, kind = layout
        if host_pool.dim() != 2 + len(row_shape) or tuple(host_pool.shape[2:]) != row_shape:
            raise HotBufferError(f"host_pool: {_describe(host_pool)}; expected {expected}")
        if host_pool.shape[0] < 1 or host_pool.shape[1] < 1:
            raise HotBufferError(
                f"host_pool: {_describe(host_pool)}; expected num_requests >= 1 and max_seq_len >= 1"
            )
        if host_pool.device.type != "cpu":
            raise HotBufferError(
                f"host_pool: on device {host_pool.device}; expected a CPU tensor (the host pool)"
            )
        if not host_pool.is_contiguous():
            raise HotBufferError(
                f"host_pool: {_describe(host_pool)} is not contiguous; expected a contiguous tensor "
                f"(rows are copied by flat index)"
            )
        for name, value in (("buffer_size", buffer_size), ("page_size", page_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise HotBufferError(f"{name}: got {value!r}; expected an int >= 1")
        if buffer_size % page_size:
            raise HotBufferError(
                f"buffer_size: got {buffer_size}; expected a multiple of page_size {page_size} "
                f"so that every request's region is page-aligned for the paged view"
            )
        try:
            dev = torch.device(device) if device is not None else host_pool.device
        except (RuntimeError, TypeError) as exc:
            raise HotBufferError(f"device: got {device!r}; expected a torch device ({exc})") from None

        num_requests, max_seq_len = int(host_pool.shape[0]), int(host_pool.shape[1])
        rows_per_request = buffer_size + page_size
        if num_requests * rows_per_request > _INT32_MAX:
            raise HotBufferError(
                f"num_requests * (buffer_size + page_size) = {num_requests * rows_per_request}; "
                f"expected <= {_INT32_MAX} (translated rows are int32)"
            )
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

        self.buffer = torch.zeros(
            (num_requests * rows_per_request, *row_shape), dtype=host_pool.dtype, device=dev
        )
        self._slot_pos = torch.full((num_requests, buffer_size), -1, dtype=torch.int64, device=dev)
        self._pos_slot = torch.full((num_requests, max_seq_len), -1, dtype=torch.int32, device=dev)
        self._lru_init = torch.arange(buffer_size, dtype=torch.int64, device=dev)
        self._lru = self._lru_init.repeat(num_requests, 1)
        self._newest_pos = torch.full((num_requests,), -1, dtype=torch.int64, device=dev)
        self._stats = [0, 0, 0, 0, 0]  # steps, hits, misses, rows, bytes

    # ------------------------------------------------------------------ properties
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
            return self.buffer.view(-1, self._page_size, 1, self._row_shape[0])
        return self.buffer.view(-1, 1, self._row_shape[0])

    def slot_positions(self, req_id: int) -> torch.Tensor:
        """int64 ``[buffer_size + 1]``: the position held by each LRU slot of ``req_id`` and, last,
        by its reserved slot; -1 where empty. A copy."""
        r = self._check_req_scalar(req_id)
        return torch.cat([self._slot_pos[r], self._newest_pos[r : r + 1]]).cpu()

    def lru_order(self, req_id: int) -> torch.Tensor:
        """int64 ``[buffer_size]``: the LRU slots of ``req_id``, least- to most-recently used
        (eviction takes from the front). A copy."""
        r = self._check_req_scalar(req_id)
        return self._lru[r].cpu()

    # ------------------------------------------------------------------ lifecycle
    def free(self, req_ids: IntArg) -> None:
        """Forget the residency of the given requests (SGLang's ``request_finished``): their slots
        become empty, their LRU order returns to ``0 .. buffer_size-1`` and the next translate of
        each starts cold, so the region can serve a new request whose rows are now in
        ``host_pool[r]``. Buffer bytes are left as they are (never read before being rewritten).

        Args:
            req_ids: an int, or int ``[n]`` (tensor or sequence) of distinct-or-repeated ids.
        """
        rid = self._check_req_list(req_ids)
        if rid.numel() == 0:
            return
        rid = rid.to(self._device)
        self._slot_pos[rid] = -1
        self._pos_slot[rid] = -1
        self._lru[rid] = self._lru_init
        self._newest_pos[rid] = -1

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
        rid, lens, pos = self._validate(req_ids, seq_lens, positions)
        return self._apply(rid, lens, pos)

    # ------------------------------------------------------------------ validation
    def _check_req_scalar(self, req_id) -> int:
        if isinstance(req_id, torch.Tensor) and req_id.numel() == 1 and req_id.dtype in _INT_DTYPES:
            req_id = int(req_id)
        if isinstance(req_id, bool) or not isinstance(req_id, int):
            raise HotBufferError(f"req_id: got {req_id!r}; expected an int in [0, {self._num_requests})")
        if not 0 <= req_id < self._num_requests:
            raise HotBufferError(f"req_id: got {req_id}; expected an int in [0, {self._num_requests})")
        return req_id

    def _check_req_list(self, req_ids) -> torch.Tensor:
        if isinstance(req_ids, int) and not isinstance(req_ids, bool):
            return torch.tensor([self._check_req_scalar(req_ids)])
        if isinstance(req_ids, torch.Tensor):
            if req_ids.dtype not in _INT_DTYPES or req_ids.dim() > 1:
                raise HotBufferError(
                    f"req_ids: {_describe(req_ids)}; expected an int or an integer tensor [n]"
                )
            rid = req_ids.reshape(-1).to("cpu", torch.int64)
        else:
            try:
                items = list(req_ids)
            except TypeError:
                raise HotBufferError(
                    f"req_ids: got {req_ids!r}; expected an int or a sequence of ints"
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
                f"{name}: got {type(t).__name__}; expected an integer torch.Tensor {shape_doc}"
            )
        if t.dtype not in _INT_DTYPES:
            raise HotBufferError(f"{name}: {_describe(t)}; expected an integer tensor {shape_doc}")
        if t.dim() != ndim:
            raise HotBufferError(f"{name}: {_describe(t)}; expected {ndim}-D {shape_doc}")
        return t.to(self._device, torch.int64)

    def _validate(self, req_ids, seq_lens, positions):
        rid = self._int_tensor("req_ids", req_ids, 1, "[n]")
        n = rid.shape[0]
        lens = self._int_tensor("seq_lens", seq_lens, 1, f"[n] with n = {n}")
        if lens.shape[0] != n:
            raise HotBufferError(
                f"seq_lens: {_describe(seq_lens)}; expected [{n}] (one per req_id)"
            )
        pos = self._int_tensor("positions", positions, 2, f"[n, top_k] with n = {n}")
        if pos.shape[0] != n:
            raise HotBufferError(
                f"positions: {_describe(positions)}; expected [{n}, top_k] (one row per req_id)"
            )
        top_k = pos.shape[1]
        if top_k > self._buffer_size:
            raise HotBufferError(
                f"positions: {_describe(positions)}; expected top_k <= buffer_size "
                f"{self._buffer_size}"
            )
        if n == 0:
            return rid, lens, pos
        # All range checks in one host sync; details are computed only on the error path.
        bad_rid = (rid < 0) | (rid >= self._num_requests)
        srt = torch.sort(rid).values
        dup = srt[1:] == srt[:-1]
        bad_len = (lens < 1) | (lens > self._max_seq_len)
        low = pos < -1
        high = pos >= lens[:, None]
        flags = torch.stack([bad_rid.any(), dup.any(), bad_len.any(), low.any(), high.any()])
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
            i, j = (low | high).nonzero()[0].tolist()
            raise HotBufferError(
                f"positions: [{i}, {j}] (request {int(rid[i])}) is {int(pos[i, j])}; expected -1 "
                f"(padding) or 0 <= position < seq_len {int(lens[i])}"
            )
        return rid, lens, pos

    # ------------------------------------------------------------------ the work
    def _apply(self, rid: torch.Tensor, lens: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """Translate validated inputs (int64 on the device: rid [n], lens [n], pos [n, k])."""
        n, top_k = pos.shape
        out = torch.full((n, top_k), -1, dtype=torch.int32, device=self._device)
        self._stats[0] += 1
        if n == 0:
            return out
        self._forget_beyond(rid, lens)
        short = lens <= self._buffer_size
        srcs, dsts, counts = [], [], []
        for mask, fn in ((short, self._translate_short), (~short, self._translate_long)):
            rows = mask.nonzero().squeeze(1)
            if rows.numel():
                res, src, dst, hits, misses = fn(rid[rows], lens[rows], pos[rows])
                out[rows] = res
                srcs.append(src)
                dsts.append(dst)
                counts += [hits, misses]
        src = torch.cat(srcs)
        dst = torch.cat(dsts)
        hm = torch.stack(counts).view(-1, 2).sum(0).tolist()  # one sync for the counters
        self._copy_rows(src, dst)
        self._stats[1] += hm[0]
        self._stats[2] += hm[1]
        self._stats[3] += src.numel()
        self._stats[4] += src.numel() * self._row_bytes
        return out

    def _forget_beyond(self, rid: torch.Tensor, lens: torch.Tensor) -> None:
        """Drop residency of positions >= seq_len (after a rollback their host rows change)."""
        sp = self._slot_pos[rid]  # [n, B]
        stale = sp >= lens[:, None]
        if bool(stale.any()):
            i, s = stale.nonzero(as_tuple=True)
            self._pos_slot[rid[i], sp[i, s]] = -1
            self._slot_pos[rid[i], s] = -1
        newest = self._newest_pos[rid]
        self._newest_pos[rid] = torch.where(newest >= lens, -1, newest)

    def _translate_short(self, rid, lens, pos):
        """seq_len <= B: slot = position; make the whole prefix resident in order.

        rid, lens int64 [m]; pos int64 [m, k]. Returns (out int32 [m, k], src int64 [c] host rows,
        dst int64 [c] buffer rows, hits, misses as 0-d tensors).
        """
        m = rid.shape[0]
        B = self._buffer_size
        slots = self._lru_init  # arange(B)
        sp = self._slot_pos[rid]  # [m, B]
        resident = sp == slots
        valid = pos >= 0
        # requested[j, s]: position s is asked for by request j (positions < seq_len <= B)
        requested = torch.zeros((m, B + 1), dtype=torch.bool, device=self._device)
        requested.scatter_(1, torch.where(valid, pos, B), True)
        requested = requested[:, :B]
        hits = (requested & resident).sum()
        misses = (requested & ~resident).sum()

        fill = (slots < lens[:, None]) & ~resident
        j, s = fill.nonzero(as_tuple=True)
        r = rid[j]
        occupant = sp[j, s]  # position now in slot s (to be evicted), or -1
        home = self._pos_slot[r, s].long()  # slot now holding position s elsewhere, or -1
        o = occupant >= 0
        self._pos_slot[r[o], occupant[o]] = -1
        h = home >= 0
        self._slot_pos[r[h], home[h]] = -1
        # set last: a filled slot may be another fill's old home, a filled position an occupant
        self._slot_pos[r, s] = s
        self._pos_slot[r, s] = s.to(torch.int32)

        base = rid[:, None] * self._stride
        out = torch.where(valid, base + pos, -1).to(torch.int32)
        return out, r * self._max_seq_len + s, r * self._stride + s, hits, misses

    def _translate_long(self, rid, lens, pos):
        """seq_len > B: LRU over slots 0..B-1, newest token in the reserved slot B.

        rid, lens int64 [g]; pos int64 [g, k]. Returns as :meth:`_translate_short`.
        """
        g, top_k = pos.shape
        B, S = self._buffer_size, self._max_seq_len
        dev = self._device
        pos_slot = self._pos_slot.view(-1)  # flat [R * S], index r * S + p

        newest = lens - 1
        valid = pos >= 0
        is_newest = pos == newest[:, None]
        cand = valid & ~is_newest  # positions served by the LRU slots
        flat = rid[:, None] * S + pos.clamp(min=0)  # [g, k]
        cur = pos_slot[flat].long()  # slot holding each position, -1 if not resident
        hit = cand & (cur >= 0)
        miss = cand & (cur < 0)

        # First occurrence of each missed position (row order ranks the misses, as SGLang's
        # kernel does; a duplicate shares the first's slot). The missed positions' entries of
        # _pos_slot are -1 and are all overwritten by their new slot below, so they serve as the
        # scratch of an amin-scatter of column indices.
        m_flat = flat[miss]
        m_col = torch.arange(top_k, device=dev, dtype=torch.int32).expand(g, top_k)[miss]
        pos_slot.scatter_reduce_(0, m_flat, m_col, reduce="amin", include_self=False)
        first_miss = torch.zeros_like(miss)
        first_miss[miss] = pos_slot[m_flat] == m_col
        n_miss = first_miss.sum(1)  # [g]

        # needed[j, s]: LRU slot s is hit this step (column B absorbs the non-hits)
        needed = torch.zeros((g, B + 1), dtype=torch.bool, device=dev)
        needed.scatter_(1, torch.where(hit, cur, B), True)
        needed = needed[:, :B]
        n_hit_slots = needed.sum(1)  # distinct hits
        n_evictable = B - n_hit_slots  # >= n_miss since distinct candidates <= top_k <= B

        lru = self._lru[rid]  # [g, B] slots, LRU first
        hit_in_order = needed.gather(1, lru)
        evictable = ~hit_in_order
        ev_rank = evictable.cumsum(1) - 1  # rank among evictable slots, LRU first
        hit_rank = hit_in_order.cumsum(1) - 1
        # evict_list[j, i]: the i-th least-recently-used evictable slot (column B absorbs hits)
        evict_list = torch.empty((g, B + 1), dtype=torch.int64, device=dev)
        evict_list.scatter_(1, torch.where(evictable, ev_rank, B), lru)
        miss_rank = first_miss.cumsum(1) - 1
        target = evict_list.gather(1, miss_rank.clamp(min=0))  # [g, k], meaningful at first_miss

        j, c = first_miss.nonzero(as_tuple=True)
        r = rid[j]
        slot = target[j, c]
        p = pos[j, c]
        occupant = self._slot_pos[r, slot]
        o = occupant >= 0
        pos_slot[r[o] * S + occupant[o]] = -1
        self._slot_pos[r, slot] = p
        pos_slot[r * S + p] = slot.to(torch.int32)

        # New LRU order: stale evictables, then the slots just filled (miss order), then hits.
        nm = n_miss[:, None]
        ne = n_evictable[:, None]
        dest = torch.where(
            evictable,
            torch.where(ev_rank >= nm, ev_rank - nm, ne - nm + ev_rank),
            ne + hit_rank,
        )
        self._lru[rid] = torch.empty_like(lru).scatter_(1, dest, lru)

        # The reserved slot always holds the newest token.
        refresh = self._newest_pos[rid] != newest
        self._newest_pos[rid] = newest
        newest_asked = is_newest.any(1)
        hits = n_hit_slots.sum() + (newest_asked & ~refresh).sum()
        misses = n_miss.sum() + (newest_asked & refresh).sum()
        rr = rid[refresh]
        src = torch.cat([r * S + p, rr * S + newest[refresh]])
        dst = torch.cat([r * self._stride + slot, rr * self._stride + B])

        base = rid[:, None] * self._stride
        slot_now = pos_slot[flat].long()
        out = torch.where(cand, base + slot_now, torch.where(is_newest, base + B, -1))
        return out.to(torch.int32), src, dst, hits, misses

    def _copy_rows(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """buffer[dst[i]] = host_rows[src[i]] for all i, as one gather and one scatter.

        src: int64 [c] flat host rows (r * max_seq_len + p); dst: int64 [c] distinct buffer rows.
        """
        if src.numel() == 0:
            return
        src = src.cpu()
        if self._device.type == "cpu":
            rows = self._host_rows.index_select(0, src)
        else:
            # Gather into pinned memory so the host -> device copy is a DMA; the caching host
            # allocator keeps the staging block alive until that copy has finished.
            staging = torch.empty(
                (src.numel(), *self._row_shape),
                dtype=self._host_rows.dtype,
                pin_memory=self._device.type == "cuda",
            )
            torch.index_select(self._host_rows, 0, src, out=staging)
            rows = staging.to(self._device, non_blocking=True)
        self.buffer.index_copy_(0, dst, rows)
